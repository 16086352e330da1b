#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
Processes end to end with the real parts: HTTP against forkd-rest, a private
dbus-daemon, the real forkd with forkd-vmm and the test guest, whose agent keeps
a table of its built-in programs (tests/guest/procs.c: ticker, flood, pipe, cat,
sleep, echo, true, and run_code scripts) as the Linux agents keep real processes.
TAP output; the machinery (Stack, Client, Tap) is test-rest.py's.

What it shows: a process followed live, line by line, before it ends; a reconnect at
an offset gets exactly the bytes after it, an overrun of the guest's log a gap; cat
echoes stdin and ends at eof; SIGTERM to one leaves its sibling running; a sandbox
with a running counter forked into 3, each child's counter going on in a stream of
its own, one killed and the others not; exec with "stream"; the same process over
D-Bus (ReadSandboxOutput); hostile input refused with 400 and nothing started; and a
process that floods its output while its reader stalls keeps forkd's and
forkd-rest's memory flat. The terminal (pty, the WebSocket) needs the Linux guest
(tests/linux: processes and processes-rest).

Environment: as test-rest.py (tests/rest/meson.build).
"""

import importlib.util
import os
import sys
import threading
import time

from restprocs import NdjsonStream, data_of

_spec = importlib.util.spec_from_file_location("test_rest", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                         "test-rest.py"))
tr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tr)
check = tr.check

TAG = "procs"
RING = 256 << 10  # the test guest's log of each process (tests/guest/procs.c)


class Ctx:
    pass


def wait_for(cond, secs, what):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def stack_dict(c, stack):
    return {"FORKD_URL": f"http://127.0.0.1:{c.port}", "FORKD_TOKEN_FILE": stack.token_file()}


def fork1(c):
    r = c.expect(201, "POST", "/v1/sandboxes", {"snapshot_tag": TAG})
    return r.json[0]["id"]


def start(c, sid, args, **extra):
    r = c.expect(201, "POST", f"/v1/sandboxes/{sid}/processes", dict({"args": args}, **extra))
    check(set(r.json) == {"pid"} and isinstance(r.json["pid"], int) and r.json["pid"] > 1, r)
    return r.json["pid"]


def procs(c, sid):
    return {p["pid"]: p for p in c.expect(200, "GET", f"/v1/sandboxes/{sid}/processes").json["processes"]}


def output(c, stack, sid, pid, offset=0, follow=False):
    q = f"?offset={offset}" + ("&follow=true" if follow else "")
    s = NdjsonStream(stack_dict(c, stack), "GET", f"/v1/sandboxes/{sid}/processes/{pid}/output{q}", timeout=60)
    try:
        check(s.status == 200 and s.ctype.startswith("application/x-ndjson"), (s.status, s.ctype))
        return s.all(), s
    finally:
        s.close()


def rss_kib(p):
    with open(f"/proc/{p.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def t_setup(c, stack):
    rootfs = os.path.join(stack.tmp, "rootfs.img")
    with open(rootfs, "wb") as f:
        f.truncate(8 << 20)
    c.expect(201, "POST", "/v1/snapshots", {"tag": TAG, "kernel": tr.GUEST, "rootfs": rootfs, "mem_mib": 64,
                                             "boot_wait_secs": 10})
    Ctx.sid = fork1(c)


def t_follow_live(c, stack):
    sid = Ctx.sid
    pid = start(c, sid, ["ticker", "5", "300"], stdin=False)
    objs, s = output(c, stack, sid, pid, follow=True)
    lines = [(t, o) for t, o in s.lines if "stream" in o]
    text = data_of(objs).decode()
    check([ln.split()[1] for ln in text.splitlines()] == ["0", "1", "2", "3", "4"], text)
    check(objs[-1] == {"exit_code": 0, "signal": None}, objs[-1])
    # one by one, as they are printed: the lines printed after the client came arrive in
    # chunks of their own (the first chunk may hold those printed before), the last
    # about a second after the first
    check(len(lines) >= 3 and all(o["data"].count("\n") == 1 for _, o in lines[1:]) and
          lines[-1][0] - lines[0][0] > 0.5, [(round(t, 3), o) for t, o in lines])
    p = procs(c, sid)[pid]
    check(p["running"] is False and p["exit_code"] == 0 and p["signal"] is None and p["args"] == ["ticker", "5", "300"]
          and p["end_offset"] == len(text), p)


def t_offset_and_gap(c, stack):
    sid = Ctx.sid
    pid = start(c, sid, ["/bin/sh", "-c", "ticker 40 0"])
    whole = data_of(output(c, stack, sid, pid, follow=True)[0])
    check(len(whole.splitlines()) == 40, whole)
    for off in (0, 1, 17, len(whole) // 2, len(whole) - 1, len(whole)):
        objs, _ = output(c, stack, sid, pid, offset=off)
        check(data_of(objs) == whole[off:] and objs[-1] == {"exit_code": 0, "signal": None}, (off, objs[:2]))
        chunks = [o for o in objs if "stream" in o]
        check(not chunks or chunks[0]["offset"] == off, (off, chunks[:1]))
    r = c.req("GET", f"/v1/sandboxes/{sid}/processes/{pid}/output?offset={len(whole) + 1}")
    check(r.status == 400 and "beyond the end" in r.json["error"], r)
    # four times the log. A follower from 0 while it is written may fall behind more than
    # once: each time it is told how much it missed and where it goes on, and what it
    # missed and what it got add up to what was written.
    size = 4 * RING
    pid = start(c, sid, ["flood", str(size)])
    objs, _ = output(c, stack, sid, pid, follow=True)
    at = 0
    for o in objs[:-1]:
        if "gap" in o:
            check(o["gap"] > 0 and o["offset"] == at + o["gap"], (at, o))
            at = o["offset"]
        else:
            d = data_of([o])
            check(o["offset"] == at and d and d == b"x" * len(d), (at, o))
            at += len(d)
    check(at == size and any("gap" in o for o in objs) and objs[-1] == {"exit_code": 0, "signal": None},
          (at, objs[-1]))
    # once it has ended, a reader from 0 is told once what it missed, then gets the rest
    objs, _ = output(c, stack, sid, pid)
    gaps = [o for o in objs if "gap" in o]
    check(gaps == [{"gap": size - RING, "offset": size - RING}], gaps)
    d = data_of(objs)
    check(d == b"x" * RING and objs[-1] == {"exit_code": 0, "signal": None},
          (len(d), d[:20], d[-20:], [(o.get("offset"), len(data_of([o]))) for o in objs]))


def t_stdin_cat(c, stack):
    sid = Ctx.sid
    pid = start(c, sid, ["cat"])
    got = {}

    def follow():
        got["objs"] = output(c, stack, sid, pid, follow=True)[0]

    th = threading.Thread(target=follow)
    th.start()  # it reads from offset 0: what is written before it is in place is not lost
    check(c.expect(200, "POST", f"/v1/sandboxes/{sid}/processes/{pid}/stdin", {"data": "abc\n"}).json ==
          {"written": 4}, "stdin")
    c.expect(200, "POST", f"/v1/sandboxes/{sid}/processes/{pid}/stdin", {"data_b64": "ZGVmCg==", "eof": True})
    th.join(30)
    check(not th.is_alive(), "the follow ended at eof")
    check(data_of(got["objs"]) == b"abc\ndef\n" and got["objs"][-1] == {"exit_code": 0, "signal": None}, got)
    r = c.req("POST", f"/v1/sandboxes/{sid}/processes/{pid}/stdin", {"data": "late"})
    check(r.status == 404, r)


def t_signal_siblings(c, stack):
    sid = Ctx.sid
    a = start(c, sid, ["sleep", "600000"])
    b = start(c, sid, ["sleep", "600000"])
    c.expect(204, "POST", f"/v1/sandboxes/{sid}/processes/{a}/signal", {"signal": "SIGTERM"})
    p = procs(c, sid)
    check(p[a]["running"] is False and p[a]["signal"] == 15 and p[a]["exit_code"] is None, p[a])
    check(p[b]["running"] is True, p[b])
    objs, _ = output(c, stack, sid, a)
    check(objs == [{"exit_code": None, "signal": 15}], objs)
    # SIGWINCH is ignored, as by a process that does not catch it; SIGKILL by number
    c.expect(204, "POST", f"/v1/sandboxes/{sid}/processes/{b}/signal", {"signal": "WINCH"})
    check(procs(c, sid)[b]["running"] is True, "SIGWINCH ignored")
    c.expect(204, "POST", f"/v1/sandboxes/{sid}/processes/{b}/signal", {"signal": 9})
    check(procs(c, sid)[b]["signal"] == 9, procs(c, sid)[b])
    r = c.req("POST", f"/v1/sandboxes/{sid}/processes/{b}/signal", {"signal": "SIGTERM"})
    check(r.status == 404, r)


def t_fork_counter(c, stack):
    parent = fork1(c)
    pid = start(c, parent, ["ticker", "0", "50"], stdin=False)
    wait_for(lambda: procs(c, parent)[pid]["end_offset"] > 0, 10, "the counter's first line")
    r = c.expect(200, "POST", f"/v1/sandboxes/{parent}/fork", {"n": 3})
    kids = r.json["children"]
    check(len(kids) == 3, r)
    at = {}
    for k in kids:
        p = procs(c, k)
        check(pid in p and p[pid]["running"] is True, (k, p))
        at[k] = p[pid]["end_offset"]
    # each child's counter goes on: its stream grows past where the fork left it
    for k in kids:
        wait_for(lambda k=k: procs(c, k)[pid]["end_offset"] > at[k] + 100, 20, f"{k}'s counter to go on")
    c.expect(204, "POST", f"/v1/sandboxes/{kids[0]}/processes/{pid}/signal", {"signal": "SIGTERM"})
    check(procs(c, kids[0])[pid]["signal"] == 15, "the first child's counter killed")
    for k in kids[1:] + [parent]:
        check(procs(c, k)[pid]["running"] is True, f"{k}'s counter still runs")
    # the streams are the sandboxes' own: the lines after the fork differ in their clocks
    tails = []
    for k in kids[1:]:
        objs, _ = output(c, stack, k, pid, offset=at[k])
        tails.append(data_of(objs))
    check(tails[0] != tails[1], "two children printed the same bytes after the fork")
    for k in kids + [parent]:
        c.expect(204, "DELETE", f"/v1/sandboxes/{k}")


def t_exec_stream(c, stack):
    sid = Ctx.sid
    s = NdjsonStream(stack_dict(c, stack), "POST", f"/v1/sandboxes/{sid}/exec",
                     {"args": ["/bin/sh", "-c", "echo one two"], "stream": True})
    try:
        objs = s.all()
        pid = s.resp.getheader("Forkd-Process-Pid")
    finally:
        s.close()
    check(data_of(objs) == b"one two\n" and objs[-1] == {"exit_code": 0, "signal": None}, objs)
    check(pid is not None and int(pid) in procs(c, sid), pid)
    # a script that fails: its error on stderr, exit 1
    s = NdjsonStream(stack_dict(c, stack), "POST", f"/v1/sandboxes/{sid}/exec",
                     {"args": ["/bin/sh", "-c", "x = 1; nosuch"], "stream": True})
    try:
        objs = s.all()
    finally:
        s.close()
    check(data_of(objs, "stderr").startswith(b"SyntaxError") and objs[-1] == {"exit_code": 1, "signal": None}, objs)


def t_exec_stream_old_agent(c, stack):
    """An agent from before proc_start's "read" refuses it: forkd starts the process
    alone, then reads, and the client sees the same answer."""
    sid = fork1(c)
    r = c.expect(200, "POST", f"/v1/sandboxes/{sid}/run_code", {"code": "old_agent"})
    check(r.json["stdout"] == "proc_start refuses read\n", r.json)
    for args, want, code in ((["/bin/sh", "-c", "echo from an old agent"], b"from an old agent\n", 0),
                             (["ticker", "3", "100"], None, 0), (["/bin/sh", "-c", "nosuch"], None, 1)):
        s = NdjsonStream(stack_dict(c, stack), "POST", f"/v1/sandboxes/{sid}/exec", {"args": args, "stream": True})
        try:
            objs = s.all()
            pid = s.resp.getheader("Forkd-Process-Pid")
        finally:
            s.close()
        check(s.status == 200 and objs and objs[-1] == {"exit_code": code, "signal": None}, (args, objs))
        check(want is None or data_of(objs) == want, (args, objs))
        check(pid is not None and int(pid) in procs(c, sid), (args, pid))
    check(len(data_of(objs, "stderr")) > 0, "the script's error on stderr")
    c.expect(204, "DELETE", f"/v1/sandboxes/{sid}")


def t_dbus(c, stack):
    from dbusmini import Bus

    sid = Ctx.sid
    pid = start(c, sid, ["echo", "over", "the", "bus"])
    bus = Bus(stack.bus, timeout=30)
    reply = bus.call("org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager", "ReadSandboxOutput", "sutu",
                     [sid, pid, 0, 65536])
    chunks, next_offset, gap, exited, code, sig = reply
    check([(ch[0], ch[1], bytes(ch[2])) for ch in chunks] == [("stdout", 0, b"over the bus\n")] and
          next_offset == 13 and gap == 0 and exited is True and code == 0, reply)


def t_hostile(c, stack):
    sid = Ctx.sid
    before = procs(c, sid)
    base = f"/v1/sandboxes/{sid}/processes"
    for body, why in (
        ({"args": ["echo"] + ["x"] * 5000}, "args"),
        ({"args": ["echo", "y" * (200 << 10)]}, "args"),
        ({"args": ["echo"], "env": {"A": "b\u0000c"}}, "NUL"),
        ({"args": ["echo"], "env": {"A=B": "c"}}, "env"),
        ({"args": []}, "args"),
        ({"args": ["echo"], "cmd": "echo"}, "exactly one"),
        ({"args": ["ticker", "x", "y"]}, "bad arguments"),
        ({"args": ["echo"], "timeout_secs": 86401}, "timeout_secs"),
        ({"args": ["echo"], "pty": {"cols": 0, "rows": 24}}, "cols"),
    ):
        r = c.req("POST", base, body)
        check(r.status == 400 and why.lower() in r.json["error"].lower(), (str(body)[:80], r))
    # not hostile, but not started either: a program the guest does not have (the guest's
    # ENOENT, a 400 naming why, as for the Linux agents)
    r = c.req("POST", base, {"args": ["nosuch-program"]})
    check(r.status == 400 and "No such file" in r.json["error"], r)
    check(procs(c, sid) == before, "a refused start left a process")
    for path, body in ((f"{base}/999999/output", None), (f"{base}/999999/stdin", {"data": "x"}),
                       (f"{base}/999999/signal", {"signal": "TERM"})):
        r = c.req("POST" if body else "GET", path, body)
        check(r.status == 404 and "process not found" in r.json["error"], (path, r))
    for path in (f"{base}/0/output", f"{base}/abc/output", f"{base}/-1/output", f"{base}/99999999999/output"):
        r = c.req("GET", path)
        check(r.status == 400 and "invalid pid" in r.json["error"], (path, r))
    pid = start(c, sid, ["sleep", "600000"])
    r = c.req("POST", f"{base}/{pid}/signal", {"signal": "SIGFOO"})
    check(r.status == 400 and "unknown signal" in r.json["error"], r)
    r = c.req("POST", f"{base}/{pid}/signal", {"signal": 65})
    check(r.status == 400, r)
    r = c.req("POST", f"{base}/{pid}/resize", {"cols": 80, "rows": 24})
    check(r.status == 400, r)
    check(procs(c, sid)[pid]["running"] is True, "the refusals changed nothing")
    c.expect(204, "POST", f"{base}/{pid}/signal", {"signal": "KILL"})


def t_flood_memory(c, stack):
    """A process that prints 256 MiB as fast as it can while its reader takes a little and
    stalls: forkd and forkd-rest hold a bounded amount for the stream, never the flood."""
    sid = Ctx.sid
    rest = stack.rest_proc
    f0, r0 = rss_kib(stack.daemon), rss_kib(rest)
    pid = start(c, sid, ["flood", str(256 << 20)])
    s = NdjsonStream(stack_dict(c, stack), "GET", f"/v1/sandboxes/{sid}/processes/{pid}/output?follow=true",
                     timeout=60)
    try:
        s.next()  # a line, then nothing while the flood prints the rest
        wait_for(lambda: procs(c, sid)[pid]["end_offset"] == 256 << 20, 60, "the flood to print it all")
        f1, r1 = rss_kib(stack.daemon), rss_kib(rest)
        n = 0
        while s.next() is not None:
            n += 1
        objs = [o for _, o in s.lines]
    finally:
        s.close()
    check(f1 - f0 < 16 << 10 and r1 - r0 < 16 << 10, f"RSS grew by {f1 - f0} KiB (forkd), {r1 - r0} KiB (forkd-rest)")
    check(objs and objs[-1] == {"exit_code": 0, "signal": None}, objs[-1:])
    check(procs(c, sid)[pid]["end_offset"] == 256 << 20, procs(c, sid)[pid])


TESTS = [
    ("a snapshot of the test guest, a sandbox", t_setup),
    ("a ticker followed live: its lines in order, one by one, before it ends", t_follow_live),
    ("a reconnect at an offset gets exactly the bytes after it; an overrun of the log is a gap", t_offset_and_gap),
    ("cat echoes what is written to its stdin and ends at eof", t_stdin_cat),
    ("SIGTERM to one process leaves its sibling running", t_signal_siblings),
    ("a sandbox with a running counter forked into 3: each child's counter goes on in a stream of its own, "
     "one killed and the others not", t_fork_counter),
    ("exec with \"stream\": the process's output and its exit line, its pid in Forkd-Process-Pid", t_exec_stream),
    ("exec with \"stream\" on an agent that refuses proc_start's read: the start alone, then a read",
     t_exec_stream_old_agent),
    ("ReadSandboxOutput on D-Bus", t_dbus),
    ("hostile input: 400 and nothing started; 404 for a pid not in the table", t_hostile),
    ("a flood with a stalled reader: forkd and forkd-rest memory stays flat", t_flood_memory),
]

if __name__ == "__main__":
    sys.exit(tr.run_on_stack(TESTS, first=t_setup))
