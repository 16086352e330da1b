# SPDX-License-Identifier: LGPL-2.1-or-later
"""Processes in the Linux guest over forkd-rest (part of test-linux-guest.py): the
routes of docs/rest-api.md, "Processes", against the real stack.

  - a `python3 -u -c` loop printing a line every 0.2 s, followed as NDJSON
    (`output?follow=true`): its lines in order, each arriving while it still runs,
    then the exit line;
  - a reconnect at an offset (follow and not): the rest of the output, no line twice;
  - cat: stdin as text and as base64 with eof, its output and exit;
  - SIGTERM by name: the exit line says signal 15, the pid is gone for signal;
  - the terminal over a WebSocket, with a client of Python's standard library only:
    `echo $((6*7))` shows 42, a resize shows in `stty size`, `exit` closes with 1000;
  - exec with "stream": true: stdout, stderr and the exit code as NDJSON;
  - a pid the guest does not know: 404; an offset beyond the end: 400;
  - a flood of output with eight streams that stall and one that reads on: forkd's and
    forkd-rest's peak memory grow by less than a quarter of what the guest printed, and
    the reader sees gaps where the ring overran.

It forks one sandbox of the boot snapshot (TAG) and deletes it at its end."""
import base64
import json
import os
import struct
import time

from linuxguest import TAG, rest
from restprocs import NdjsonStream, WebSocket, data_of

TICKS = 20  # 4 s at 0.2 s
TICKER = f"import time\nfor i in range({TICKS}):\n    print('tick', i, flush=True)\n    time.sleep(0.2)\n"
FLOOD = "import os\nb = b'x' * 65536\nwhile True:\n    os.write(1, b)\n"
FLOOD_BYTES = 32 << 20     # the guest's output the flood must reach while the streams stall
FLOOD_STALLED = 8          # streams that read one line, then nothing
FLOOD_GROWTH_KIB = 8 << 10  # what forkd's and forkd-rest's peak RSS may grow by


def processes_rest(t, stack):
    """The cases on one child of the boot snapshot (TAG), which the parts before left in place."""
    sid = None
    try:
        status, kids = rest(stack, "POST", "/v1/sandboxes", {"snapshot_tag": TAG})
        if not t.ok(status == 201 and isinstance(kids, list) and len(kids) == 1,
                    "processes over REST: one sandbox", f"{status} {kids}"):
            return
        sid = kids[0]["id"]
        base = f"/v1/sandboxes/{sid}/processes"
        _cases(t, stack, sid, base)
    finally:
        if sid:
            rest(stack, "DELETE", f"/v1/sandboxes/{sid}")


def _stack_pid(stack, name):
    """The pid forkd-stack recorded for name (forkd, rest) in its state directory."""
    with open(os.path.join(os.path.dirname(stack["FORKD_TOKEN_FILE"]), f"{name}.pid")) as f:
        return int(f.read().split()[0])


def _status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _flood(t, stack, base):
    """A process that prints 64 KiB writes as fast as it can; FLOOD_STALLED streams each
    read one line and stall, one reader reads on until the output passed FLOOD_BYTES."""
    try:
        pids = {name: _stack_pid(stack, name) for name in ("forkd", "rest")}
        hwm0 = {name: _status_kib(p, "VmHWM") for name, p in pids.items()}
    except (OSError, ValueError, IndexError) as e:
        t.ok(False, "flood: forkd's and forkd-rest's pids and memory", repr(e))
        return
    pid = _start(t, stack, base, {"args": ["python3", "-c", FLOOD], "stdin": False},
                 "a process that floods its output")
    if not pid:
        return
    streams = []
    try:
        for _ in range(FLOOD_STALLED):
            s = NdjsonStream(stack, "GET", f"{base}/{pid}/output?follow=true")
            s.resp.readline()  # one line, then this client stops reading
            streams.append(s)
        reader = NdjsonStream(stack, "GET", f"{base}/{pid}/output?follow=true")
        streams.append(reader)
        end, gaps, lines = 0, 0, 0
        deadline = time.monotonic() + 600
        while end < FLOOD_BYTES and time.monotonic() < deadline:
            line = reader.resp.readline()
            if not line:
                break
            o = json.loads(line)
            lines += 1
            if "gap" in o:
                gaps += 1
                end = max(end, o["offset"])
            elif "stream" in o:
                end = max(end, o["offset"] + len(o.get("data", "")))
        grown = {name: _status_kib(p, "VmHWM") - hwm0[name] for name, p in pids.items()}
        t.note(f"flood: the reader saw offset {end} in {lines} lines ({gaps} gaps); peak RSS grew by {grown} KiB")
        t.ok(end >= FLOOD_BYTES, f"flood: the output passed {FLOOD_BYTES >> 20} MiB while {FLOOD_STALLED} streams "
             "stalled", f"{end} bytes in {lines} lines")
        t.ok(all(g <= FLOOD_GROWTH_KIB for g in grown.values()),
             f"flood: forkd's and forkd-rest's peak RSS grew by at most {FLOOD_GROWTH_KIB >> 10} MiB",
             f"grown KiB {grown}, before {hwm0}")
        t.ok(gaps > 0, "flood: the reader, slower than the guest, got gap lines where the ring overran",
             f"{gaps} gaps")
    finally:
        rest(stack, "POST", f"{base}/{pid}/signal", {"signal": "KILL"})
        for s in streams:
            s.close()


def _start(t, stack, base, body, what):
    status, r = rest(stack, "POST", base, body)
    ok = t.ok(status == 201 and isinstance(r, dict) and isinstance(r.get("pid"), int) and r["pid"] > 0,
              f"POST processes: {what}", f"{status} {r}")
    return r["pid"] if ok else None


def _cases(t, stack, sid, base):
    # ---- a ticker followed live
    pid = _start(t, stack, base, {"args": ["python3", "-u", "-c", TICKER]}, "python3 -u ticker")
    if pid:
        s = NdjsonStream(stack, "GET", f"{base}/{pid}/output?follow=true")
        t.ok(s.status == 200 and s.ctype.startswith("application/x-ndjson"), "output?follow=true: 200 NDJSON",
             f"{s.status} {s.ctype}")
        objs = s.all()
        s.close()
        ticks = [o for o in objs if "stream" in o]
        text = data_of(objs, "stdout").decode()
        t.ok(text == "".join(f"tick {i}\n" for i in range(TICKS)), "the ticker's lines, in order, complete",
             text[-500:])
        t.ok(objs and objs[-1] == {"exit_code": 0, "signal": None}, "the last line is the exit line", objs[-3:])
        times = [tm for tm, o in s.lines if "stream" in o]
        t.ok(len(ticks) >= TICKS // 2 and times and s.lines[-1][0] - times[0] >= (TICKS // 2) * 0.2,
             "the lines came one by one while it ran, not all at its end",
             f"{len(ticks)} chunk lines over {s.lines[-1][0] - times[0] if times else 0:.2f} s")
        offs = [o["offset"] for o in ticks]
        t.ok(offs == sorted(offs) and offs and offs[0] == 0, "chunk offsets start at 0 and grow", offs[:10])

        # ---- a reconnect at an offset, without follow: the rest, then the exit line
        cut = len("".join(f"tick {i}\n" for i in range(3)))
        s = NdjsonStream(stack, "GET", f"{base}/{pid}/output?offset={cut}")
        objs = s.all()
        s.close()
        t.ok(data_of(objs).decode() == "".join(f"tick {i}\n" for i in range(3, TICKS)) and
             objs[-1] == {"exit_code": 0, "signal": None},
             f"output?offset={cut}: the output from tick 3 on, then the exit line", objs[:3] + objs[-2:])
        status, r = rest(stack, "GET", f"{base}/{pid}/output?offset={len(text) + 1}")
        t.ok(status == 400, "an offset beyond the end of the output: 400", f"{status} {r}")

    # ---- a reconnect while it runs, with follow: no byte twice, none missing
    pid = _start(t, stack, base, {"args": ["python3", "-u", "-c", TICKER]}, "a second ticker")
    if pid:
        s = NdjsonStream(stack, "GET", f"{base}/{pid}/output?follow=true")
        first = []
        while len(data_of(first).splitlines()) < 3:
            o = s.next()
            if o is None:
                break
            first.append(o)
        s.close()
        nxt = max((o["offset"] + len(data_of([o])) for o in first if "stream" in o), default=0)
        s = NdjsonStream(stack, "GET", f"{base}/{pid}/output?follow=true&offset={nxt}")
        rest_objs = s.all()
        s.close()
        whole = data_of(first) + data_of(rest_objs)
        t.ok(whole.decode() == "".join(f"tick {i}\n" for i in range(TICKS)) and
             rest_objs[-1] == {"exit_code": 0, "signal": None},
             f"follow again at offset {nxt} while it runs: the rest of the lines, none twice",
             whole.decode()[-300:])

    # ---- cat: stdin as text and as base64 with eof
    pid = _start(t, stack, base, {"args": ["cat"]}, "cat")
    if pid:
        status, r = rest(stack, "POST", f"{base}/{pid}/stdin", {"data": "hello\n"})
        t.ok(status == 200 and r == {"written": 6}, "stdin {data}: written 6", f"{status} {r}")
        status, r = rest(stack, "POST", f"{base}/{pid}/stdin",
                         {"data_b64": base64.b64encode(b"\xffbytes\n").decode(), "eof": True})
        t.ok(status == 200 and r == {"written": 7}, "stdin {data_b64, eof}: written 7", f"{status} {r}")
        s = NdjsonStream(stack, "GET", f"{base}/{pid}/output?follow=true")
        objs = s.all()
        s.close()
        t.ok(data_of(objs) == b"hello\n\xffbytes\n" and objs[-1] == {"exit_code": 0, "signal": None},
             "cat echoes both, ends at eof with exit 0; bytes that are not UTF-8 come as data_b64", objs)

    # ---- signal by name
    pid = _start(t, stack, base, {"args": ["sleep", "600"], "stdin": False}, "sleep 600")
    if pid:
        status, r = rest(stack, "GET", base)
        t.ok(status == 200 and any(p.get("pid") == pid and p.get("running") is True and p.get("exit_code") is None
                                   for p in (r or {}).get("processes", [])),
             "GET processes lists the sleep, running", f"{status} {r}")
        status, r = rest(stack, "POST", f"{base}/{pid}/signal", {"signal": "TERM"})
        t.ok(status == 204, "signal TERM: 204", f"{status} {r}")
        s = NdjsonStream(stack, "GET", f"{base}/{pid}/output?follow=true")
        objs = s.all()
        s.close()
        t.ok(objs and objs[-1] == {"exit_code": None, "signal": 15}, "its exit line: signal 15, exit_code null",
             objs)
        status, r = rest(stack, "POST", f"{base}/{pid}/signal", {"signal": 9})
        t.ok(status == 404 and r == {"error": "process not found"}, "signal to the exited process: 404",
             f"{status} {r}")
    status, r = rest(stack, "GET", f"{base}/4194304/output")
    t.ok(status == 404 and r == {"error": "process not found"}, "output of a pid the guest does not know: 404",
         f"{status} {r}")

    # ---- the terminal over a WebSocket
    pid = _start(t, stack, base, {"cmd": "exec sh -i", "pty": {"cols": 80, "rows": 24}}, "sh -i on a pty")
    if pid:
        ws = WebSocket(stack, f"{base}/{pid}/tty")
        try:
            t.ok(ws.status == 101 and ws.accept_ok, "tty: 101 with the right Sec-WebSocket-Accept",
                 f"{ws.status} {ws.headers}")
            ws.send(0x2, b"echo $((6*7))\n")
            out, closed = ws.read_until(lambda b: b"42" in b, 60)
            t.ok(b"42" in out, "tty: echo $((6*7)) shows 42", out[-300:])
            ws.send(0x1, json.dumps({"resize": [100, 30]}).encode())
            time.sleep(0.5)
            ws.send(0x2, b"stty size\n")
            out, closed = ws.read_until(lambda b: b"30 100" in b, 60)
            t.ok(b"30 100" in out, "tty: after {\"resize\": [100, 30]} stty size says 30 100", out[-300:])
            ws.send(0x9, b"hi")
            ws.send(0x2, b"exit\n")
            out, closed = ws.read_until(lambda b: False, 60)
            t.ok(closed is not None and closed[:2] == struct.pack("!H", 1000) and closed[2:] == b"exit_code 0",
                 "tty: exit closes with 1000 \"exit_code 0\"", f"{closed!r} {out[-200:]!r}")
        except (OSError, EOFError, ValueError) as e:
            t.ok(False, "tty: the WebSocket session ran to its end", repr(e))
        finally:
            ws.close()

    # ---- exec with "stream": true
    s = NdjsonStream(stack, "POST", f"/v1/sandboxes/{sid}/exec",
                     {"args": ["sh", "-c", "echo out; sleep 0.3; echo err >&2; exit 3"], "stream": True})
    objs = s.all() if s.status == 200 else []
    s.close()
    t.ok(s.status == 200 and data_of(objs, "stdout") == b"out\n" and data_of(objs, "stderr") == b"err\n" and
         objs[-1] == {"exit_code": 3, "signal": None},
         "exec with \"stream\": true: stdout, stderr and exit code 3 as NDJSON", f"{s.status} {objs}")

    # ---- a flood of output
    _flood(t, stack, base)
