#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""forkd-rest's process routes (docs/rest-api.md, "Processes") against a stand-in for
forkd's process methods on a private bus (standin-procs.c), so that they run without
KVM or a guest (TAP): NDJSON with and without follow, a gap, bytes that are not UTF-8,
the exit line, reconnects at an offset, stdin, signals, resize, the WebSocket terminal
(echo, resize, ping, close, hostile frames), exec with "stream", 404 and 409 answers,
and the cap of 64 streams. The Linux guest's processes-rest part runs the same routes
against forkd and the real agent."""
import base64
import importlib.util
import os
import signal
import socket
import struct
import sys
import time

from restprocs import NdjsonStream, WebSocket, data_of
from tap import Tap, check

_spec = importlib.util.spec_from_file_location("test_rest", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                        "test-rest.py"))
tr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tr)
DBUS_DAEMON, REST, Client, Stack = tr.DBUS_DAEMON, tr.REST, tr.Client, tr.Stack

STANDIN = os.environ.get("FORKD_STANDIN_PROCS", "")
BASE = "/v1/sandboxes/sb-1/processes"
TERM, DONE = 100, 200
DONE_OUT = [{"gap": 4, "offset": 4}, {"stream": "stderr", "offset": 4, "data": "err\n"},
            {"stream": "stdout", "offset": 8, "data_b64": base64.b64encode(b"\xff\xfe\n").decode()},
            {"exit_code": 3, "signal": None}]


def t_start_list(c, st):
    r = c.expect(201, "POST", BASE, {"cmd": "sh -i", "pty": {"cols": 80, "rows": 24}, "env": {"A": "b"}})
    check(r.json == {"pid": TERM}, r)
    r = c.expect(200, "GET", BASE)
    check(r.json == {"processes": [{"pid": TERM, "args": ["sh", "-i"], "cwd": "/root", "pty": True, "running": True,
                                    "exit_code": None, "signal": None, "end_offset": 0,
                                    "started_at_unix": 1700000000}]}, r.json)
    r = c.expect(500, "POST", BASE, {"args": ["nope"]})
    check("No such file" in r.json["error"], r.json)
    r = c.expect(404, "POST", "/v1/sandboxes/sb-2/processes", {"args": ["true"]})
    check(r.json == {"error": "sandbox not found"}, r.json)
    c.expect(409, "GET", "/v1/sandboxes/sb-paused/processes")


def t_output_done(c, st):
    for q in ("", "?follow=true", "?follow=false&offset=0", "?follow=1"):
        s = NdjsonStream(st, "GET", f"{BASE}/{DONE}/output{q}")
        check(s.status == 200 and s.ctype == "application/x-ndjson", (q, s.status, s.ctype))
        got = s.all()
        s.close()
        check(got == DONE_OUT, (q, got))
    for q in ("?offset=8", "?offset=8&follow=true"):
        s = NdjsonStream(st, "GET", f"{BASE}/{DONE}/output{q}")
        got = s.all()
        s.close()
        check(got == DONE_OUT[2:], (q, got))
    s = NdjsonStream(st, "GET", f"{BASE}/{DONE}/output?offset=9")
    got = s.all()
    s.close()
    check(got == [{"stream": "stdout", "offset": 9, "data_b64": base64.b64encode(b"\xfe\n").decode()},
                  {"exit_code": 3, "signal": None}], got)
    for q in ("?offset=12", "?offset=12&follow=true"):
        r = c.expect(400, "GET", f"{BASE}/{DONE}/output{q}")
        check("beyond the end" in r.json["error"], r.json)
    for q in ("", "?follow=true"):
        r = c.expect(404, "GET", f"{BASE}/300/output{q}")
        check(r.json == {"error": "process not found"}, r.json)
        r = c.expect(404, "GET", f"/v1/sandboxes/sb-2/processes/{DONE}/output{q}")
        check(r.json == {"error": "sandbox not found"}, r.json)


def t_follow_live(c, st):
    c.expect(201, "POST", BASE, {"args": ["sh"]})
    s = NdjsonStream(st, "GET", f"{BASE}/{TERM}/output?follow=true")
    check(s.status == 200, s.status)
    for i in range(3):
        r = c.expect(200, "POST", f"{BASE}/{TERM}/stdin", {"data": f"line {i}\n"})
        check(r.json == {"written": 7}, r.json)
        o = s.next()
        check(o == {"stream": "stdout", "offset": 7 * i, "data": f"line {i}\n"}, (i, o))
    # a second reader from an offset, while it runs; bytes that are not UTF-8 by data_b64
    s2 = NdjsonStream(st, "GET", f"{BASE}/{TERM}/output?follow=true&offset=14")
    check(s2.next() == {"stream": "stdout", "offset": 14, "data": "line 2\n"}, s2.lines)
    r = c.expect(200, "POST", f"{BASE}/{TERM}/stdin", {"data_b64": base64.b64encode(b"\x80!").decode()})
    check(r.json == {"written": 2}, r.json)
    for x in (s, s2):
        o = x.next()
        check(o == {"stream": "stdout", "offset": 21, "data_b64": "gCE="}, o)
    c.expect(204, "POST", f"{BASE}/{TERM}/resize", {"cols": 132, "rows": 43})
    check(s.next() == {"stream": "stdout", "offset": 23, "data": "size 43 132\n"}, s.lines[-1:])
    c.expect(200, "POST", f"{BASE}/{TERM}/stdin", {"data": "", "eof": True})
    for x in (s, s2):
        rest = x.all()
        x.close()
        check(rest[-1] == {"exit_code": 0, "signal": None}, rest)
    # without follow, after the end: all of it and the exit line
    s = NdjsonStream(st, "GET", f"{BASE}/{TERM}/output")
    got = s.all()
    s.close()
    check(data_of(got) == b"line 0\nline 1\nline 2\n\x80!size 43 132\n" and got[-1] == {"exit_code": 0, "signal": None},
          got)
    r = c.expect(404, "POST", f"{BASE}/{TERM}/stdin", {"data": "x"})
    check(r.json == {"error": "process not found"}, r.json)


def t_signal(c, st):
    c.expect(201, "POST", BASE, {"args": ["sleep", "600"]})
    s = NdjsonStream(st, "GET", f"{BASE}/{TERM}/output?follow=true")
    c.expect(204, "POST", f"{BASE}/{TERM}/signal", {"signal": "SIGTERM"})
    got = s.all()
    s.close()
    check(got == [{"exit_code": None, "signal": 15}], got)
    r = c.expect(404, "POST", f"{BASE}/{TERM}/signal", {"signal": 9})
    check(r.json == {"error": "process not found"}, r.json)
    r = c.expect(200, "GET", BASE)
    check(r.json["processes"][0]["running"] is False and r.json["processes"][0]["signal"] == 15 and
          r.json["processes"][0]["exit_code"] is None, r.json)


def t_exec_stream(c, st):
    s = NdjsonStream(st, "POST", "/v1/sandboxes/sb-1/exec", {"args": ["cat"], "stream": True})
    check(s.status == 200 and s.ctype == "application/x-ndjson", s.status)
    # the answer names its process, to be followed again from an offset
    check(s.resp.getheader("Forkd-Process-Pid") == str(TERM), s.resp.getheaders())
    c.expect(200, "POST", f"{BASE}/{TERM}/stdin", {"data": "from exec\n", "eof": True})
    got = s.all()
    s.close()
    check(got == [{"stream": "stdout", "offset": 0, "data": "from exec\n"}, {"exit_code": 0, "signal": None}], got)
    r = c.expect(500, "POST", "/v1/sandboxes/sb-1/exec", {"args": ["nope"], "stream": True})
    check("No such file" in r.json["error"], r.json)
    r = c.expect(404, "POST", "/v1/sandboxes/sb-2/exec", {"args": ["true"], "stream": True})
    check(r.json == {"error": "sandbox not found"}, r.json)


def t_tty(c, st):
    c.expect(201, "POST", BASE, {"cmd": "sh -i", "pty": {"cols": 80, "rows": 24}})
    ws = WebSocket(st, f"{BASE}/{TERM}/tty")
    try:
        check(ws.status == 101 and ws.accept_ok, (ws.status, ws.headers))
        ws.send(0x2, b"echo $((6*7))\n")
        out, closed = ws.read_until(lambda b: b"\n" in b, 10)
        check(out == b"echo $((6*7))\n" and closed is None, (out, closed))
        ws.send(0x9, b"are you there")
        check(ws.recv() == (0xA, b"are you there"), "pong")
        ws.send(0x1, b'{"resize": [100, 30]}')
        out, closed = ws.read_until(lambda b: b"size 30 100\n" in b, 10)
        check(out == b"size 30 100\n", (out, closed))
        big = os.urandom(200000)  # over one stdin call: sent in chunks of 64 KiB, in order
        ws.send(0x2, big)
        out, closed = ws.read_until(lambda b: len(b) >= len(big), 20)
        check(out == big, (len(out), closed))
        c.expect(204, "POST", f"{BASE}/{TERM}/signal", {"signal": "KILL"})
        out, closed = ws.read_until(lambda b: False, 10)
        check(closed == struct.pack("!H", 1000) + b"signal 9", (out, closed))
    finally:
        ws.close()
    # a terminal of an exited process: its output, then the close at once
    ws = WebSocket(st, f"{BASE}/{DONE}/tty")
    try:
        check(ws.status == 101, ws.status)
        out, closed = ws.read_until(lambda b: False, 10)
        check(out == b"err\n\xff\xfe\n" and closed == struct.pack("!H", 1000) + b"exit_code 3", (out, closed))
    finally:
        ws.close()
    for path, status in ((f"{BASE}/300/tty", 404), ("/v1/sandboxes/sb-2/processes/1/tty", 404),
                         ("/v1/sandboxes/sb-paused/processes/1/tty", 409)):
        ws = WebSocket(st, path)
        ws.close()
        check(ws.status == status, (path, ws.status))


def t_tty_hostile(c, st):
    """Frames RFC 6455 refuses close the terminal with 1002 or 1009; the server goes on."""
    for frame, code in ((b"\x82\x01x", 1002),                                  # unmasked
                        (b"\xc2\x81abcdx", 1002),                               # RSV1
                        (b"\x83\x81abcdx", 1002),                               # opcode 3
                        (b"\x89\xfe\x00\x7eabcd" + b"x" * 126, 1002),           # long ping
                        (b"\x82\xff" + struct.pack("!Q", 2 << 20) + b"abcd", 1009),  # 2 MiB
                        (b"\x81\x82abcd" + bytes([0xc3 ^ 0x61, 0x28 ^ 0x62]), 1007)):  # not UTF-8
        c.expect(201, "POST", BASE, {"cmd": "sh -i", "pty": {"cols": 80, "rows": 24}})
        ws = WebSocket(st, f"{BASE}/{TERM}/tty")
        try:
            check(ws.status == 101, ws.status)
            ws.sock.sendall(frame)
            out, closed = ws.read_until(lambda b: False, 10)
            check(closed is not None and struct.unpack("!H", closed[:2])[0] == code, (frame[:4], closed))
        finally:
            ws.close()
    # a close from the client is echoed
    ws = WebSocket(st, f"{BASE}/{TERM}/tty")
    try:
        ws.send(0x8, struct.pack("!H", 1000) + b"bye")
        out, closed = ws.read_until(lambda b: False, 10)
        check(closed == struct.pack("!H", 1000), closed)
    finally:
        ws.close()
    c.expect(200, "GET", "/healthz", token=None)


def t_stream_cap(c, st):
    """64 streams and terminals at once; the 65th is 503, and a slot comes back when one ends."""
    c.expect(201, "POST", BASE, {"cmd": "sh -i"})
    streams = [NdjsonStream(st, "GET", f"{BASE}/{TERM}/output?follow=true") for _ in range(40)]
    terms = [WebSocket(st, f"{BASE}/{TERM}/tty") for _ in range(24)]
    try:
        check(all(s.status == 200 for s in streams) and all(w.status == 101 for w in terms),
              [s.status for s in streams] + [w.status for w in terms])
        r = c.expect(503, "GET", f"{BASE}/{DONE}/output")
        check(r.json == {"error": "too many streams"}, r.json)
        w = WebSocket(st, f"{BASE}/{TERM}/tty")
        w.close()
        check(w.status == 503, w.status)
        c.expect(503, "POST", "/v1/sandboxes/sb-1/exec", {"args": ["x"], "stream": True})
        c.expect(200, "GET", BASE)  # the other routes go on
        streams.pop().close()
        terms.pop().close()
        time.sleep(0.5)
        s = NdjsonStream(st, "GET", f"{BASE}/{DONE}/output")
        check(s.status == 200 and s.all() == DONE_OUT, s.lines)
        s.close()
    finally:
        for s in streams:
            s.close()
        for w in terms:
            w.close()
    time.sleep(0.5)
    s = NdjsonStream(st, "GET", f"{BASE}/{DONE}/output")
    check(s.status == 200, s.status)
    s.close()


def t_slow_reader(c, st):
    """A reader that does not read stalls only its own stream."""
    c.expect(201, "POST", BASE, {"cmd": "sh -i"})
    slow = socket.create_connection(("127.0.0.1", c.port))
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.sendall(f"GET {BASE}/{TERM}/output?follow=true HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    try:
        for _ in range(16):
            c.expect(200, "POST", f"{BASE}/{TERM}/stdin", {"data": "y" * 65536})
        s = NdjsonStream(st, "GET", f"{BASE}/{DONE}/output")
        check(s.all() == DONE_OUT, s.lines)
        s.close()
    finally:
        slow.close()


def main():
    tap = Tap()
    if not REST or not os.access(REST, os.X_OK) or not STANDIN:
        print("1..0 # SKIP forkd-rest or standin-procs not built")
        return 0
    if not DBUS_DAEMON:
        print("1..0 # SKIP dbus-daemon not installed")
        return 0
    stack = Stack()
    signal.signal(signal.SIGTERM, lambda *a: (stack.cleanup(), sys.exit(1)))
    try:
        stack.start_bus()
        standin = stack.spawn([STANDIN, stack.bus])
        time.sleep(0.3)
        if standin.poll() is not None:
            tap.bail("standin-procs did not start: " + stack.log_tail(standin))
        rest, port = stack.start_rest("--no-direct", "--max-calls", "256", "--connection-limit", "256")
        c = Client(port)
        st = {"FORKD_URL": f"http://127.0.0.1:{port}", "FORKD_TOKEN_FILE": stack.token_file()}
        for name, fn in (("start and list; errors of the guest, no sandbox, paused", t_start_list),
                         ("output of an exited process: gap, stderr, data_b64, exit line; offsets; 400; 404",
                          t_output_done),
                         ("follow while it runs: each line as it comes, two readers, resize, eof", t_follow_live),
                         ("signal: the exit line says the signal; then 404", t_signal),
                         ("exec with \"stream\": true", t_exec_stream),
                         ("the terminal: echo, ping, resize, 200 KB of stdin, close with the signal", t_tty),
                         ("the terminal refuses hostile frames with their close codes", t_tty_hostile),
                         ("at most 64 streams and terminals", t_stream_cap),
                         ("a reader that does not read stalls only its own stream", t_slow_reader)):
            tap.run(name, fn, c, st)
        stack.stop(rest)
        tap.ok(rest.returncode == 0, "forkd-rest exits 0 on SIGTERM", stack.log_tail(rest))
    finally:
        stack.cleanup()
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
