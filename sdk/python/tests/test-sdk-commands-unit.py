#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
The SDK's processes (Controller's process routes, Sandbox.commands and
Sandbox.pty) against a small HTTP server in this process (http.server, real
sockets, and a WebSocket server written here): the bytes on the wire for each
route, NDJSON delivered line by line before the body ends, gap, data_b64 and
exit lines, run() and background handles, the pty's WebSocket, arguments
refused before sending. TAP output.
"""

import base64
import hashlib
import json
import os
import struct
import sys
import threading
import time

import forkd
from forkd import (CommandExitException, CommandHandle, CommandResult, Controller, InvalidArgument, ProcessInfo,
                   PtySize, Sandbox)
from tap import Tap, check

WAIT = 5.0


from sdkserver import Server, raises


S = Server()


def ctl():
    return Controller(S.url, token="tok")


def chunked(h, status=200, close=False, headers=()):
    h.send_response(status)
    h.send_header("Content-Type", "application/x-ndjson")
    for name, value in headers:
        h.send_header(name, value)
    if close:
        h.send_header("Connection", "close")
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()


def chunk(h, data):
    h.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")
    h.wfile.flush()


def end_chunks(h):
    h.wfile.write(b"0\r\n\r\n")
    h.wfile.flush()


def nd(*objs):
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


def ndjson_reply(*parts, gates=(), headers=(), cut=False, waited=None):
    """An answer writing parts (bytes) as chunks; before part i+1 it waits for
    gates[i] (a threading.Event) and records (in waited) whether it was set in
    time. With cut, the connection is closed after the parts, without the body's
    end."""
    waited = [] if waited is None else waited

    def write(h):
        chunked(h, headers=headers, close=cut)
        for i, part in enumerate(parts):
            if i and i - 1 < len(gates):
                waited.append(gates[i - 1].wait(WAIT))
            chunk(h, part)
        if not cut:
            end_chunks(h)

    return write, waited


class Router:
    """Answers by (method, path): a dict of (method, path) -> reply (a tuple,
    or a function of the handler); anything else 404 "no route for"."""

    def __init__(self, routes):
        self.routes = routes

    def __call__(self, req):
        path = req["path"].split("?")[0]
        r = self.routes.get((req["method"], path))
        if r is None:
            return 404, "application/json", json.dumps({"error": f"no route for {path}"}).encode()
        return r(req) if callable(r) and not hasattr(r, "_writer") else r


def writer(fn):
    fn._writer = True
    return fn


def js(status, obj):
    return status, "application/json", json.dumps(obj).encode() if obj is not None else b""


# ---------------------------------------------------------------- WebSocket server side


def ws_accept(key):
    return base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()


def ws_frame(opcode, payload, fin=True):
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n < 65536:
        head += bytes([126]) + struct.pack("!H", n)
    else:
        head += bytes([127]) + struct.pack("!Q", n)
    return head + payload


def ws_send(h, opcode, payload, fin=True):
    h.wfile.write(ws_frame(opcode, payload, fin))
    h.wfile.flush()


def ws_recv(h):
    """(opcode, payload, masked) of the client's next frame."""
    b0, b1 = h.rfile.read(2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", h.rfile.read(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", h.rfile.read(8))[0]
    masked = bool(b1 & 0x80)
    key = h.rfile.read(4) if masked else b"\0\0\0\0"
    data = h.rfile.read(n)
    return b0 & 0x0F, bytes(c ^ key[i % 4] for i, c in enumerate(data)), masked


def tty_server(log, reason, script):
    """A tty route: the handshake, then script(h, log) speaks frames; the close
    frame (1000, reason) ends it."""
    @writer
    def serve(h):
        key = h.headers.get("Sec-WebSocket-Key", "")
        log.append(("handshake", dict(h.headers)))
        # the first output in the same write as the handshake's answer
        h.wfile.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                       f"Sec-WebSocket-Accept: {ws_accept(key)}\r\n\r\n").encode() + ws_frame(0x2, b"$ "))
        h.wfile.flush()
        script(h, log)
        ws_send(h, 0x8, struct.pack("!H", 1000) + reason.encode())
        try:
            op, payload, masked = ws_recv(h)
            log.append(("close", op, payload, masked))
        except (OSError, ValueError):
            log.append(("close", None))
    return serve


# ---------------------------------------------------------------- tests

P = "/v1/sandboxes/sb-1/processes"


def t_wire():
    c = ctl()
    S.json(201, {"pid": 42})
    check(c.start_process("sb-1", args=["ls", "-l"]) == {"pid": 42}, "start")
    r = S.last()
    check(r["method"] == "POST" and r["path"] == P and r["headers"]["Content-Type"] == "application/json" and
          r["headers"]["Authorization"] == "Bearer tok", r)
    check(r["body"] == b'{"args": ["ls", "-l"]}', r["body"])
    c.start_process("sb-1", cmd="echo hi", cwd="/root", env={"A": "1", "B": ""}, user="root", pty=(100, 30),
                    timeout_secs=0, stdin=False)
    check(S.last_body() == {"cmd": "echo hi", "cwd": "/root", "env": {"A": "1", "B": ""}, "user": "root",
                            "pty": {"cols": 100, "rows": 30}, "timeout_secs": 0, "stdin": False}, S.last_body())
    c.start_process("sb-1", cmd="sh", pty=PtySize(rows=24, cols=80))
    check(S.last_body()["pty"] == {"cols": 80, "rows": 24}, S.last_body())
    S.json(200, {"processes": []})
    check(c.list_processes("sb-1") == {"processes": []} and S.last()["method"] == "GET" and
          S.last()["path"] == P and S.last()["body"] == b"", S.last())
    S.json(200, {"written": 3})
    c.send_stdin("sb-1", 42, "abc")
    check(S.last()["path"] == P + "/42/stdin" and S.last_body() == {"data": "abc"}, S.last())
    c.send_stdin("sb-1", 42, b"\x00\xff", eof=True)
    check(S.last_body() == {"data_b64": "AP8=", "eof": True}, S.last_body())
    c.send_stdin("sb-1", 42, eof=True)
    check(S.last_body() == {"data_b64": "", "eof": True}, S.last_body())
    c.send_stdin("sb-1", 42, b"x" * 65536)
    check(len(base64.b64decode(S.last_body()["data_b64"])) == 65536, "64 KiB exactly goes")
    S.json(204, None)
    check(c.signal_process("sb-1", 42) is None, "204 is None")
    check(S.last()["path"] == P + "/42/signal" and S.last_body() == {"signal": "SIGTERM"}, S.last())
    for sig in ("TERM", 9, 64, "SIGRTMIN+3"):
        c.signal_process("sb-1", 42, sig)
        check(S.last_body() == {"signal": sig}, S.last_body())
    c.resize_pty("sb-1", 42, 1000, 1)
    check(S.last()["path"] == P + "/42/resize" and S.last_body() == {"cols": 1000, "rows": 1}, S.last())
    S.reply = lambda req: (200, "application/x-ndjson", nd({"exit_code": 0, "signal": None}))
    check(list(c.read_output("sb-1", 42)) == [{"exit_code": 0, "signal": None}], "read_output")
    r = S.last()
    check(r["method"] == "GET" and r["path"] == P + "/42/output?offset=0&follow=false" and
          r["headers"]["Accept"] == "application/x-ndjson", r)
    list(c.read_output("sb-1", 42, offset=7, follow=True))
    check(S.last()["path"] == P + "/42/output?offset=7&follow=true", S.last())
    got = list(c.exec_sandbox("sb-1", ["ls"], timeout_secs=5, stream=True))
    check(got == [{"exit_code": 0, "signal": None}], got)
    check(S.last()["path"] == "/v1/sandboxes/sb-1/exec" and
          S.last_body() == {"args": ["ls"], "timeout_secs": 5, "stream": True}, S.last())
    # the errors of the routes, as the other routes'
    S.json(404, {"error": "process not found"})
    e = raises(forkd.NotFound, c.read_output, "sb-1", 43)
    check(e.message == "process not found", e)
    S.json(400, {"error": "offset 9 is beyond the end of the output (3)"})
    raises(forkd.BadRequest, c.read_output, "sb-1", 43, offset=9)
    S.json(409, {"error": "sandbox is paused"})
    raises(forkd.Conflict, c.start_process, "sb-1", cmd="x")
    S.json(503, {"error": "too many streams"})
    raises(forkd.Unavailable, c.read_output, "sb-1", 43, follow=True)


def t_arguments():
    c = ctl()
    S.json(200, {})
    n = len(S.requests)
    big = "a" * (128 * 1024)
    for call in (lambda: c.start_process("sb-1"), lambda: c.start_process("sb-1", args=["a"], cmd="a"),
                 lambda: c.start_process("sb-1", args="ls"), lambda: c.start_process("sb-1", args=[]),
                 lambda: c.start_process("sb-1", args=["x"] * 4097), lambda: c.start_process("sb-1", args=["a\0"]),
                 lambda: c.start_process("sb-1", args=[big]), lambda: c.start_process("sb-1", args=[1]),
                 lambda: c.start_process("sb-1", args=["a" * 65536, "b" * 65535]),
                 lambda: c.start_process("sb-1", cmd=big), lambda: c.start_process("sb-1", cmd="a\0b"),
                 lambda: c.start_process("sb-1", cmd="x", env={"A=B": "1"}),
                 lambda: c.start_process("sb-1", cmd="x", env={"": "1"}),
                 lambda: c.start_process("sb-1", cmd="x", env={"A": 1}),
                 lambda: c.start_process("sb-1", cmd="x", env={"A": "\0"}),
                 lambda: c.start_process("sb-1", cmd="x", env={f"K{i}": "" for i in range(1025)}),
                 lambda: c.start_process("sb-1", cmd="x", env={"A": big}),
                 lambda: c.start_process("sb-1", cmd="x", env=["A=1"]),
                 lambda: c.start_process("sb-1", cmd="x", pty=(0, 24)),
                 lambda: c.start_process("sb-1", cmd="x", pty=(80, 1001)),
                 lambda: c.start_process("sb-1", cmd="x", pty={"cols": 80}),
                 lambda: c.start_process("sb-1", cmd="x", pty=80),
                 lambda: c.start_process("sb-1", cmd="x", timeout_secs=86401),
                 lambda: c.start_process("sb-1", cmd="x", timeout_secs=-1),
                 lambda: c.start_process("sb-1", cmd="x", stdin="yes"),
                 lambda: c.start_process("sb-1", cmd="x", cwd=""),
                 lambda: c.start_process("sb-1", cmd="x", user=""),
                 lambda: c.start_process("sb/1", cmd="x"),
                 lambda: c.read_output("sb-1", 0), lambda: c.read_output("sb-1", 4194305),
                 lambda: c.read_output("sb-1", True), lambda: c.read_output("sb-1", "1"),
                 lambda: c.read_output("sb-1", 1, offset=-1), lambda: c.read_output("sb-1", 1, follow="yes"),
                 lambda: c.send_stdin("sb-1", 1, b"x" * 65537), lambda: c.send_stdin("sb-1", 1, "é" * 32769),
                 lambda: c.send_stdin("sb-1", 1, 5), lambda: c.send_stdin("sb-1", 1, "x", eof=1),
                 lambda: c.signal_process("sb-1", 1, 0), lambda: c.signal_process("sb-1", 1, 65),
                 lambda: c.signal_process("sb-1", 1, "kill me"), lambda: c.signal_process("sb-1", 1, ""),
                 lambda: c.signal_process("sb-1", 1, True),
                 lambda: c.resize_pty("sb-1", 1, 0, 24), lambda: c.resize_pty("sb-1", 1, 80, 1001),
                 lambda: c.open_tty("sb-1", 0), lambda: c.exec_sandbox("sb-1", ["ls"], stream="y")):
        raises(InvalidArgument, call)
    sb = Sandbox.connect("sb-1", controller=c)
    for call in (lambda: sb.commands.run(5), lambda: sb.commands.run("x", background=1),
                 lambda: sb.commands.run("x", timeout=86401), lambda: sb.commands.run("x", envs={"=": ""}),
                 lambda: sb.commands.kill(0), lambda: sb.commands.send_stdin(0, "x"),
                 lambda: sb.commands.send_stdin(1, 5), lambda: sb.commands.connect(-1),
                 lambda: sb.pty.create(PtySize(rows=0, cols=80)), lambda: sb.pty.create(size=(80,)),
                 lambda: sb.pty.resize(1, PtySize(rows=24, cols=1001)), lambda: sb.pty.send_stdin(1, 5)):
        raises(InvalidArgument, call)
    check(len(S.requests) == n, f"a refused argument sent {len(S.requests) - n} request(s)")
    # the limits themselves go
    S.json(201, {"pid": 1})
    c.start_process("sb-1", args=["a" * 65535, "b" * 65535])
    c.start_process("sb-1", cmd="x", env={f"K{i}": "" for i in range(1024)}, pty=(1, 1000), timeout_secs=86400)
    check(len(S.requests) == n + 2, "the limits are allowed")


def t_streaming():
    """Each line reaches the caller while the body is still open."""
    c = ctl()
    seen = [threading.Event(), threading.Event()]
    write, waited = ndjson_reply(nd({"stream": "stdout", "offset": 0, "data": "one\n"}),
                                 nd({"stream": "stderr", "offset": 4, "data": "two\n"}),
                                 nd({"exit_code": 0, "signal": None}), gates=seen)
    S.reply = lambda req: write
    got = []
    stream = c.read_output("sb-1", 7, follow=True)
    for i, obj in enumerate(stream):
        got.append(obj)
        if i < 2:
            seen[i].set()
    check(waited == [True, True], f"the server did not see the client take each line before the next: {waited}")
    check(got == [{"stream": "stdout", "offset": 0, "data": "one\n"}, {"stream": "stderr", "offset": 4,
                                                                       "data": "two\n"},
                  {"exit_code": 0, "signal": None}], got)
    check(stream.ended and stream.closed, "the stream ended and is closed")
    # two lines in one chunk, one line over two chunks
    line = json.dumps({"stream": "stdout", "offset": 0, "data": "x" * 1000}).encode() + b"\n"
    S.reply = lambda req: ndjson_reply(nd({"gap": 5, "offset": 5}, {"gap": 1, "offset": 6}), line[:100],
                                       line[100:] + nd({"exit_code": None, "signal": 9}))[0]
    got = list(c.read_output("sb-1", 7))
    check(got == [{"gap": 5, "offset": 5}, {"gap": 1, "offset": 6}, json.loads(line),
                  {"exit_code": None, "signal": 9}], got)
    # a body that ends inside a line, a line that is not JSON
    S.reply = lambda req: ndjson_reply(nd({"gap": 1, "offset": 1}), b'{"stream": "std')[0]
    s = c.read_output("sb-1", 7)
    check(next(s) == {"gap": 1, "offset": 1}, "the first line")
    raises(forkd.ProtocolError, next, s)
    S.reply = lambda req: ndjson_reply(b"nope\n")[0]
    raises(forkd.ProtocolError, list, c.read_output("sb-1", 7))
    # close() from another thread ends a read blocked on a quiet stream
    block = threading.Event()

    for close in (False, True):
        @writer
        def quiet(h):
            chunked(h, close=close)
            chunk(h, nd({"stream": "stdout", "offset": 0, "data": "a"}))
            block.wait(WAIT)

        S.reply = lambda req: quiet
        s = c.read_output("sb-1", 7, follow=True)
        check(next(s)["data"] == "a", "first")
        threading.Timer(0.2, s.close).start()
        t0 = time.monotonic()
        check(list(s) == [] and time.monotonic() - t0 < 3, f"close() ended the blocked read (close {close})")
    block.set()


def proc_routes(pid, lines, gates=(), status=None, log=None):
    """start answers pid; output, and exec with "stream", answer lines (bytes
    parts, with gates), exec naming the pid in its header."""
    write, waited = ndjson_reply(*lines, gates=gates)
    write_exec, _ = ndjson_reply(*lines, gates=gates, headers=[("Forkd-Process-Pid", str(pid))], waited=waited)

    def output(req):
        if log is not None:
            log.append(req["path"])
        return write

    def exec_(req):
        if log is not None:
            log.append(req["path"])
        return write_exec

    routes = {("POST", P): js(201, {"pid": pid}), ("GET", f"{P}/{pid}/output"): output,
              ("POST", "/v1/sandboxes/sb-1/exec"): exec_}
    if status is not None:
        routes.update(status)
    return Router(routes), waited


def t_run():
    c = ctl()
    sb = Sandbox.connect("sb-1", controller=c)
    gate = threading.Event()
    outs, errs, threads = [], [], []
    euro = "€".encode()
    router, waited = proc_routes(7, [
        nd({"stream": "stdout", "offset": 0, "data": "hello "}),
        # a character split over two chunks: base64 as the server sends it
        nd({"stream": "stdout", "offset": 6, "data_b64": base64.b64encode(b"w" + euro[:1]).decode()},
           {"stream": "stderr", "offset": 8, "data": "warn\n"},
           {"stream": "stdout", "offset": 13, "data_b64": base64.b64encode(euro[1:] + b"\n").decode()},
           {"exit_code": 0, "signal": None})], gates=[gate])

    def on_out(s):
        outs.append(s)
        threads.append(threading.current_thread().name)
        gate.set()

    S.reply = router
    before = len(S.requests)
    r = sb.commands.run("echo hello", on_stdout=on_out, on_stderr=errs.append)
    # in the foreground with no options: one request, exec with "stream"
    check(len(S.requests) == before + 1 and S.last()["method"] == "POST" and
          S.last()["path"] == "/v1/sandboxes/sb-1/exec", S.requests[before:])
    check(S.last_body() == {"args": ["/bin/sh", "-c", "echo hello"], "timeout_secs": 60, "stream": True},
          S.last()["body"])
    check(waited == [True], "on_stdout was called before the body ended")
    check(isinstance(r, CommandResult) and r.stdout == "hello w€\n" and r.stderr == "warn\n" and r.exit_code == 0 and
          r.error is None, r)
    check(outs == ["hello ", "w", "€\n"] and errs == ["warn\n"], (outs, errs))
    check(threads[0] == "forkd-process-7" and threads[0] != threading.current_thread().name, threads)
    # exit 1: CommandExitException with the fields; options on the wire
    router, _ = proc_routes(8, [nd({"stream": "stderr", "offset": 0, "data": "no\n"},
                                   {"exit_code": 1, "signal": None})])
    S.reply = router
    e = raises(CommandExitException, sb.commands.run, ["false"], envs={"A": "b"}, cwd="/tmp", timeout=5,
               user="nobody", stdin=True)
    check(json.loads(S.requests[-2]["body"]) == {"args": ["false"], "cwd": "/tmp", "env": {"A": "b"},
                                                 "user": "nobody", "timeout_secs": 5, "stdin": True},
          S.requests[-2]["body"])
    check(e.exit_code == 1 and e.stderr == "no\n" and e.stdout == "" and e.error == "exit code 1" and
          e.result.exit_code == 1 and isinstance(e, forkd.ForkdError), e)
    # killed by a signal, with a gap in the output
    router, _ = proc_routes(9, [nd({"gap": 100, "offset": 100}, {"stream": "stdout", "offset": 100, "data": "z"},
                                   {"exit_code": None, "signal": 9})])
    S.reply = router
    h = sb.commands.run("yes", background=True)
    e = raises(CommandExitException, h.wait)
    check(e.signal == 9 and e.exit_code == -9 and "signal 9" in e.error and e.stdout == "z" and h.dropped == 100, e)
    # an error of the output route reaches wait()
    S.reply = Router({("POST", P): js(201, {"pid": 10}),
                      ("GET", P + "/10/output"): js(404, {"error": "process not found"})})
    raises(forkd.NotFound, sb.commands.run, "x", envs={"A": "b"})
    # exec's stream broken off: followed again from its offset, by the pid it named
    log = []
    cut, _ = ndjson_reply(nd({"stream": "stdout", "offset": 0, "data": "one\n"}), cut=True,
                          headers=[("Forkd-Process-Pid", "12")])
    rest, _ = ndjson_reply(nd({"stream": "stdout", "offset": 4, "data": "two\n"}, {"exit_code": 0, "signal": None}))
    S.reply = Router({("POST", "/v1/sandboxes/sb-1/exec"): lambda req: cut,
                      ("GET", P + "/12/output"): lambda req: log.append(req["path"]) or rest})
    r = sb.commands.run("echo one; echo two", timeout=5)
    check(r.stdout == "one\ntwo\n" and log == [P + "/12/output?offset=4&follow=true"], (r, log))
    # ... and one that named no pid cannot be followed again
    cut, _ = ndjson_reply(nd({"stream": "stdout", "offset": 0, "data": "one\n"}), cut=True)
    S.reply = Router({("POST", "/v1/sandboxes/sb-1/exec"): lambda req: cut})
    e = raises(forkd.ProtocolError, sb.commands.run, "echo one", timeout=5)
    check("named no pid" in str(e), e)
    # a forkd-rest whose exec does not stream: its JSON answer, whole
    S.reply = Router({("POST", "/v1/sandboxes/sb-1/exec"):
                      js(200, {"stdout": "hi\n", "stderr": "", "exit_code": 0})})
    r = sb.commands.run("echo hi", timeout=5)
    check(r == CommandResult("hi\n", "", 0), r)


def t_background():
    c = ctl()
    sb = Sandbox.connect("sb-1", controller=c)
    go = threading.Event()
    stdin_log = []

    def stdin(req):
        stdin_log.append(json.loads(req["body"]))
        return js(200, {"written": len(base64.b64decode(stdin_log[-1].get("data_b64", "")) or
                                       stdin_log[-1].get("data", "").encode())})

    router, waited = proc_routes(11, [nd({"stream": "stdout", "offset": 0, "data": "ready\n"}),
                                      nd({"stream": "stdout", "offset": 6, "data": "got it\n"},
                                         {"exit_code": 0, "signal": None})], gates=[go],
                                 status={("POST", P + "/11/stdin"): stdin,
                                         ("POST", P + "/11/signal"): (204, None, b"")})
    S.reply = router
    h = sb.commands.run("read x; echo got it", background=True, stdin=True)
    check(isinstance(h, CommandHandle) and h.pid == 11, h)
    it = iter(h)
    check(next(it) == ("ready\n", None, None), "the first triple")
    check(h.send_stdin("hi\n") is None and stdin_log[-1] == {"data": "hi\n"}, stdin_log)
    check(sb.commands.send_stdin(11, b"\x01" * 70000) == 70000, "split into 64 KiB pieces")
    check([len(base64.b64decode(x["data_b64"])) for x in stdin_log[1:]] == [65536, 4464], stdin_log[1:])
    sb.commands.close_stdin(11)
    check(stdin_log[-1] == {"data_b64": "", "eof": True}, stdin_log[-1])
    check(h.kill() is True and S.last()["path"] == P + "/11/signal" and S.last_body() == {"signal": 9}, S.last())
    go.set()
    r = h.wait()
    check(r.stdout == "ready\ngot it\n" and r.exit_code == 0 and h.exit_code == 0, r)
    check(list(it) == [("got it\n", None, None)], "the rest of the triples")
    check(list(h) == [("ready\n", None, None), ("got it\n", None, None)], "a new iteration from the start")
    # wait()'s callbacks get everything from the start, on the caller's thread
    got = []
    check(h.wait(on_stdout=got.append) == r and got == ["ready\n", "got it\n"], got)
    S.json(404, {"error": "process not found"})
    check(sb.commands.kill(11) is False and sb.pty.kill(11) is False, "kill of a gone process")
    # disconnect: the reader stops, the process runs on; connect follows it again from 0
    block = threading.Event()

    @writer
    def quiet(h):
        chunked(h)
        chunk(h, nd({"stream": "stdout", "offset": 0, "data": "tick\n"}))
        block.wait(WAIT)

    S.reply = Router({("GET", P + "/12/output"): lambda req: quiet})
    h = sb.commands.connect(12)
    check(next(iter(h)) == ("tick\n", None, None) and S.last()["path"] == P + "/12/output?offset=0&follow=true",
          S.last())
    n = len(S.requests)
    h.disconnect()
    check(not h._thread.is_alive() and h.exit_code is None, "the reader ended")
    raises(forkd.ForkdError, h.wait)
    check(len(S.requests) == n, "disconnect sent nothing (the process runs on)")
    block.set()
    # a body that ends without the exit line: followed again from where it stopped
    log = []
    parts = iter([nd({"stream": "stdout", "offset": 0, "data": "ab"}),
                  nd({"stream": "stdout", "offset": 2, "data": "c"}, {"exit_code": 3, "signal": None})])

    def again(req):
        log.append(req["path"])
        data = next(parts)
        return 200, "application/x-ndjson", data

    S.reply = Router({("GET", P + "/13/output"): again})
    e = raises(CommandExitException, sb.commands.connect(13).wait)
    check(e.exit_code == 3 and e.stdout == "abc", e)
    check(log == [P + "/13/output?offset=0&follow=true", P + "/13/output?offset=2&follow=true"], log)


def t_list():
    c = ctl()
    sb = Sandbox.connect("sb-1", controller=c)
    S.json(200, {"processes": [
        {"pid": 5, "args": ["/bin/sh", "-c", "sleep 9"], "cwd": "/root", "pty": False, "running": True,
         "exit_code": None, "signal": None, "end_offset": 0, "started_at_unix": 1700000000},
        {"pid": 6, "args": ["ls"], "cwd": "/", "pty": True, "running": False, "exit_code": 0, "signal": None,
         "end_offset": 12, "started_at_unix": 1700000001}]})
    ps = sb.commands.list()
    check(S.last()["method"] == "GET" and S.last()["path"] == P, S.last())
    check(ps == [ProcessInfo(pid=5, cmd="/bin/sh", args=["-c", "sleep 9"], cwd="/root", envs={}, tag=None,
                             pty=False, running=True, exit_code=None, signal=None, end_offset=0,
                             started_at_unix=1700000000),
                 ProcessInfo(pid=6, cmd="ls", args=[], cwd="/", pty=True, running=False, exit_code=0,
                             end_offset=12, started_at_unix=1700000001)], ps)
    S.json(200, {"processes": [{"pid": "5"}]})
    raises(forkd.ProtocolError, sb.commands.list)


def t_pty():
    c = ctl()
    sb = Sandbox.connect("sb-1", controller=c)
    log = []
    data = []
    frames_read = threading.Event()

    def script(h, log):
        for _ in range(3):
            log.append(ws_recv(h))
        frames_read.set()
        ws_send(h, 0x2, b"hi\r\n")
        ws_send(h, 0x9, b"ping")              # answered with a pong
        log.append(ws_recv(h))
        ws_send(h, 0x2, b"frag", fin=False)     # one message in two frames
        ws_send(h, 0x0, b"ment")
        ws_send(h, 0x2, b"x" * 70000)           # a 64-bit length

    S.reply = Router({("POST", P): js(201, {"pid": 20}),
                      ("GET", P + "/20/tty"): tty_server(log, "exit_code 0", script)})
    h = sb.pty.create(PtySize(rows=30, cols=100), on_data=data.append, cwd="/root", envs={"TERM": "xterm"})
    body = json.loads(S.requests[-2]["body"])
    check(body == {"cmd": "if command -v bash >/dev/null 2>&1; then exec bash -i -l; else exec sh -i; fi", "cwd": "/root", "env": {"TERM": "xterm"},
                   "pty": {"cols": 100, "rows": 30}, "timeout_secs": 60, "stdin": True}, body)
    hs = log[0][1]
    check(S.last()["path"] == P + "/20/tty" and hs["Upgrade"] == "websocket" and hs["Connection"] == "Upgrade" and
          hs["Sec-WebSocket-Version"] == "13" and len(base64.b64decode(hs["Sec-WebSocket-Key"])) == 16 and
          hs["Authorization"] == "Bearer tok", hs)
    sb.pty.resize(20, PtySize(rows=40, cols=120))
    sb.pty.send_stdin(20, b"echo hi\n")
    h.send_stdin(b"\x03")
    check(frames_read.wait(WAIT), "the server read three frames")
    check(log[1] == (0x1, b'{"resize": [120, 40]}', True), log[1])
    check(log[2] == (0x2, b"echo hi\n", True), log[2])
    check(log[3] == (0x2, b"\x03", True), log[3])
    r = h.wait()
    check(log[4] == (0xA, b"ping", True), log[4])
    check(r.exit_code == 0 and r.stdout == "" and r.stderr == "", r)
    check(data == [b"$ ", b"hi\r\n", b"fragment", b"x" * 70000], [d[:20] for d in data])
    check(list(h)[:3] == [(None, None, b"$ "), (None, None, b"hi\r\n"), (None, None, b"fragment")], "triples")
    deadline = time.monotonic() + WAIT
    while len(log) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    check(log[5:] == [("close", 0x8, struct.pack("!H", 1000), True)], log[5:])
    # the process killed: the close reason says the signal
    log2 = []
    S.reply = Router({("POST", P): js(201, {"pid": 21}),
                      ("GET", P + "/21/tty"): tty_server(log2, "signal 9", lambda h, log: None)})
    h = sb.pty.create(PtySize(rows=24, cols=80))
    e = raises(CommandExitException, h.wait)
    check(e.signal == 9 and e.exit_code == -9, e)
    # without the handle's WebSocket: the REST routes
    S.json(200, {"written": 2})
    sb.pty.send_stdin(21, b"ls")
    check(S.last()["path"] == P + "/21/stdin" and S.last_body() == {"data_b64": "bHM="}, S.last())
    S.json(204, None)
    sb.pty.resize(21, PtySize(rows=10, cols=20))
    check(S.last()["path"] == P + "/21/resize" and S.last_body() == {"cols": 20, "rows": 10}, S.last())
    # a refused upgrade: the status's error, and the shell is killed
    S.reply = Router({("POST", P): js(201, {"pid": 22}),
                      ("GET", P + "/22/tty"): js(503, {"error": "too many streams"}),
                      ("POST", P + "/22/signal"): (204, None, b"")})
    e = raises(forkd.Unavailable, sb.pty.create, PtySize(rows=24, cols=80))
    check(e.message == "too many streams" and S.last()["path"] == P + "/22/signal" and
          S.last_body() == {"signal": 9}, S.last())
    # a server that answers 101 with the wrong accept
    @writer
    def bad(h):
        h.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      b"Sec-WebSocket-Accept: nope\r\n\r\n")
    S.reply = Router({("GET", P + "/23/tty"): bad})
    raises(forkd.ProtocolError, c.open_tty, "sb-1", 23)


def t_fallback():
    """A server (or a guest) without processes: run() uses the exec route."""
    c = ctl()
    sb = Sandbox.connect("sb-1", controller=c)
    ex = {"stdout": "hi\n", "stderr": "", "exit_code": 0}

    def exec_(req):
        if json.loads(req["body"]).get("stream"):
            return js(501, {"error": "the guest's agent runs no processes"})
        return js(200, ex)

    S.reply = Router({("POST", "/v1/sandboxes/sb-1/exec"): exec_})
    outs = []
    r = sb.commands.run("echo hi", on_stdout=outs.append, timeout=5)
    check(S.last_body() == {"args": ["sh", "-c", "echo hi"], "timeout_secs": 5} and outs == ["hi\n"], S.last())
    check(r == CommandResult("hi\n", "", 0), r)
    ex = {"stdout": "", "stderr": "err\n", "exit_code": 7}
    e = raises(CommandExitException, sb.commands.run, ["sh", "-c", "exit 7"])
    check(e.exit_code == 7 and e.stderr == "err\n", e)
    raises(forkd.NotFound, sb.commands.run, "x", background=True)
    S.json(500, {"error": "unknown op"})
    raises(forkd.ServerError, sb.commands.run, "x", cwd="/")


def main():
    tap = Tap()
    for name, fn in (
            ("each process route's bytes on the wire; its errors typed", t_wire),
            ("arguments past the guest agent's limits are refused before sending", t_arguments),
            ("NDJSON: each line delivered before the body ends; gaps, split lines, bad lines, close()", t_streaming),
            ("commands.run: callbacks on the handle's thread as lines come, data_b64, exit codes, signals",
             t_run),
            ("background handles: iteration, send_stdin, kill, wait, disconnect, connect, a stream resumed",
             t_background),
            ("commands.list: ProcessInfo", t_list),
            ("pty.create over a WebSocket: handshake, masked frames, resize, send_stdin, close status",
             t_pty),
            ("commands.run on a server without processes: the exec route", t_fallback)):
        tap.run(name, fn)
    print(f"1..{tap.n}", flush=True)
    S.httpd.shutdown()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
