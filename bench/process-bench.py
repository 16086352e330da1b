#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
bench/process: background processes, through forkd-rest and D-Bus.

One sandbox of the test guest (--guest test, the default: 64 MiB, its built-in
programs, natively where /dev/kvm is usable) or of the tools/mkimage Linux guest
(--guest linux: REST API v1's example snapshot, Python programs):

  latency     a loop in the guest (the test guest's `ticker`, or `python3 -u`) prints
              --lines lines (default 1000), one every 2 ms, each holding the guest's
              wall clock in ns at its write.
              One run is followed over REST (GET .../output?follow=true, NDJSON), one
              through the Manager's OpenSandboxOutputStream (an fd of frames). Each
              chunk is stamped as it arrives; its latency is its arrival less the write
              time of the first line in it, less the guest's clock offset. The offset
              comes from the run_code round trip with the smallest RTT of 20 (the test
              guest's statement `clock`); the latency figures are good to half that RTT
              (reported). p50 and p99.
  throughput  one process writes --mib MiB (default 64): the test guest's `pipe`, 64 KiB a
              turn of its loop but never more than its log ahead of what the reader took
              (a writer into a pipe), or Python's 64 KiB writes; a REST client
              follows it and counts what it received until the exit line (bytes the
              ring dropped before the client got them come as gaps, counted apart):
              MB/s received.
  run         our SDK's commands.run("true") (E2B's surface; in the foreground one
              POST .../exec with "stream": true, read to its exit line) against POST
              /v1/sandboxes/:id/exec of the same command, {"args": ["/bin/sh", "-c",
              "true"]}, --runs of each (default 50), taking turns: p50s and their ratio.
              Also, apart: the same exec with "stream": true read by hand (no SDK), and
              exec of {"args": ["true"]} (no shell: the baseline before 2026-12-01; the
              Linux guest only).

Targets (the test guest natively, on real KVM): latency p50 at most 1 ms; throughput at
least 100 MB/s; run at most 1.2x exec. With --json the last line of stdout is one JSON
object. --emulated marks the figures as the QEMU test host's.
"""
import json
import os
import statistics
import time

from dbusmini import Bus  # tests/lib, and sdk/python below: on the PYTHONPATH bench/process sets
from linuxguest import (SPEC_SNAPSHOT_REQUEST, TAG, TCG_BOOT_WAIT_SECS, BenchFail, LinuxStack, bench_parser,
                        rest)
from procstream import EXIT, STDOUT, Stream
from restprocs import NdjsonStream

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXIT_LINE = {"exit_code": 0, "signal": None}

DEST, PATH, IFACE = "org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager"
# Each line one write(2), stamped just before it.
TICKER = ("import os, time\nfor i in range({n}):\n    os.write(1, b'%d %d\\n' % (time.time_ns(), i))\n"
          "    time.sleep(0.002)\n")
WRITER = "import os\nb = b'x' * 65536\nfor _ in range({n}):\n    os.write(1, b)\n"
TEST_TAG = "bench-process"


class Programs:
    """What each part runs in the guest: argv for POST .../processes, and the
    run_code that prints the guest's wall clock in ns."""

    def __init__(self, guest):
        self.test = guest == "test"

    def ticker(self, lines):
        return ["ticker", str(lines), "2"] if self.test else ["python3", "-u", "-c", TICKER.format(n=lines)]

    def writer(self, mib):
        return ["pipe", str(mib << 20)] if self.test else ["python3", "-u", "-c", WRITER.format(n=mib * 16)]

    def clock(self):
        return "clock" if self.test else "import time\nprint(time.time_ns())"


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else None


def clock_offset(stack, sid, progs):
    """(guest minus host ns, RTT ns) from the run_code round trip with the smallest RTT of 20."""
    best = None
    for _ in range(20):
        t0 = time.time_ns()
        status, r = rest(stack, "POST", f"/v1/sandboxes/{sid}/run_code", {"code": progs.clock()})
        t1 = time.time_ns()
        if status != 200:
            raise RuntimeError(f"run_code: {status} {r}")
        g = int(r["stdout"].strip())
        if best is None or t1 - t0 < best[1]:
            best = (g - (t0 + t1) // 2, t1 - t0)
    return best


def first_stamp(data):
    """The guest's write time of the first whole line in a chunk, or None."""
    for line in data.split(b"\n"):
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            return int(parts[0])
    return None


def start(stack, sid, args):
    status, r = rest(stack, "POST", f"/v1/sandboxes/{sid}/processes", {"args": args, "stdin": False})
    if status != 201:
        raise RuntimeError(f"POST processes: {status} {r}")
    return r["pid"]


def latency_rest(stack, sid, lines, offset, progs):
    pid = start(stack, sid, progs.ticker(lines))
    s = NdjsonStream(stack, "GET", f"/v1/sandboxes/{sid}/processes/{pid}/output?follow=true", timeout=600)
    out = []
    try:
        while True:
            line = s.resp.readline()
            if not line:
                break
            now = time.time_ns()
            o = json.loads(line)
            if "stream" in o:
                g = first_stamp(o.get("data", "").encode())
                if g is not None:
                    out.append((now - (g - offset)) / 1e6)
            elif "exit_code" in o:
                break
    finally:
        s.close()
    return out


def latency_dbus(stack, sid, lines, offset, progs):
    bus = Bus(stack["FORKD_BUS_ADDRESS"], unix_fds=True, timeout=120)
    pid = start(stack, sid, progs.ticker(lines))
    bus.call(DEST, PATH, IFACE, "OpenSandboxOutputStream", "sut", [sid, pid, 0])
    fds = bus.take_fds()
    for fd in fds[1:]:
        os.close(fd)
    s = Stream(fds[0])
    out, seen = [], 0
    try:
        while not s.closed:
            s.pump(lambda st: len(st.frames) > seen, 600)
            now = time.time_ns()
            for f in s.frames[seen:]:
                if f[1] == STDOUT:
                    g = first_stamp(f[3])
                    if g is not None:
                        out.append((now - (g - offset)) / 1e6)
            if any(f[1] == EXIT for f in s.frames[seen:]):
                break
            seen = len(s.frames)
    finally:
        s.close()
    return out


def throughput(stack, sid, mib, progs):
    pid = start(stack, sid, progs.writer(mib))
    s = NdjsonStream(stack, "GET", f"/v1/sandboxes/{sid}/processes/{pid}/output?follow=true", timeout=600)
    got = gaps = 0
    t0 = time.monotonic()
    try:
        while True:
            line = s.resp.readline()
            if not line:
                break
            o = json.loads(line)
            if "stream" in o:
                got += len(o.get("data", ""))
            elif "gap" in o:
                gaps += o["gap"]
            elif "exit_code" in o:
                break
    finally:
        s.close()
    took = time.monotonic() - t0
    return got, gaps, took


def run_vs_exec(stack, sid, runs, progs):
    from forkd import Sandbox  # the SDK of this checkout
    with open(stack["FORKD_TOKEN_FILE"]) as f:
        token = f.read().strip()
    sb = Sandbox.connect(sid, base_url=stack["FORKD_URL"], token=token)
    sh_true = ["/bin/sh", "-c", "true"]  # what commands.run("true") runs
    t = {"run": [], "exec": [], "exec_stream": [], "exec_argv": []}
    for _ in range(runs):
        t0 = time.monotonic()
        r = sb.commands.run("true")
        t["run"].append((time.monotonic() - t0) * 1000)
        if r.exit_code != 0:
            raise RuntimeError(f"commands.run('true'): {r}")
        for key, args in (("exec", sh_true), ("exec_argv", None if progs.test else ["true"])):
            if args is None:
                continue
            t0 = time.monotonic()
            status, r = rest(stack, "POST", f"/v1/sandboxes/{sid}/exec", {"args": args})
            t[key].append((time.monotonic() - t0) * 1000)
            if status != 200 or r.get("exit_code") != 0:
                raise RuntimeError(f"exec {args}: {status} {r}")
        t0 = time.monotonic()
        s = NdjsonStream(stack, "POST", f"/v1/sandboxes/{sid}/exec", {"args": sh_true, "stream": True})
        try:
            got = s.all() if s.status == 200 else None
        finally:
            s.close()
        t["exec_stream"].append((time.monotonic() - t0) * 1000)
        if not got or got[-1] != EXIT_LINE:
            raise RuntimeError(f"exec {sh_true} with stream: {s.status} {got}")
    return {k: statistics.median(v) if v else None for k, v in t.items()}


def main():
    ap = bench_parser("bench/process", __doc__)
    ap.add_argument("--lines", type=int, default=1000)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--guest", choices=("test", "linux"), default="test")
    a = ap.parse_args()
    if not 10 <= a.lines <= 100000 or not 1 <= a.mib <= 4096 or not 1 <= a.runs <= 1000:
        ap.error("--lines takes 10..100000, --mib 1..4096, --runs 1..1000")
    if (a.guest == "linux") != bool(a.image):
        ap.error("--image is the Linux guest's, and --guest linux needs it")
    progs = Programs(a.guest)

    g = None
    try:
        g = LinuxStack(BenchFail(), TOP, os.path.abspath(a.build), a.image)
        stack = g.stack
        if progs.test:
            tag = TEST_TAG
            body = {"tag": tag, "kernel": stack["FORKD_GUEST_KERNEL"], "rootfs": stack["FORKD_GUEST_ROOTFS"],
                    "mem_mib": 64}
        else:
            tag = TAG
            body = dict(SPEC_SNAPSHOT_REQUEST, kernel=stack["FORKD_GUEST_KERNEL"], rootfs=stack["FORKD_GUEST_ROOTFS"],
                        boot_wait_secs=TCG_BOOT_WAIT_SECS)
        status, doc = rest(stack, "POST", "/v1/snapshots", body, timeout=3600)
        if status != 201:
            raise RuntimeError(f"POST /v1/snapshots: {status} {doc}")
        status, kids = rest(stack, "POST", "/v1/sandboxes", {"snapshot_tag": tag})
        if status != 201:
            raise RuntimeError(f"POST /v1/sandboxes: {status} {kids}")
        sid = kids[0]["id"]
        offset, rtt = clock_offset(stack, sid, progs)
        lat_rest = latency_rest(stack, sid, a.lines, offset, progs)
        lat_dbus = latency_dbus(stack, sid, a.lines, offset, progs)
        got, gaps, took = throughput(stack, sid, a.mib, progs)
        runs = run_vs_exec(stack, sid, a.runs, progs)
        run_ms, exec_ms = runs["run"], runs["exec"]
        out = {
            "bench": "process", "guest": a.guest, "emulated": a.emulated, "lines": a.lines,
            "clock_rtt_ms": round(rtt / 1e6, 3),
            "latency_rest_ms_p50": round(pct(lat_rest, 0.5), 3), "latency_rest_ms_p99": round(pct(lat_rest, 0.99), 3),
            "latency_rest_chunks": len(lat_rest),
            "latency_dbus_ms_p50": round(pct(lat_dbus, 0.5), 3), "latency_dbus_ms_p99": round(pct(lat_dbus, 0.99), 3),
            "latency_dbus_chunks": len(lat_dbus),
            "throughput_mb_s": round(got / took / 1e6, 2), "throughput_bytes": got, "throughput_gap_bytes": gaps,
            "run_ms_p50": round(run_ms, 3), "exec_ms_p50": round(exec_ms, 3), "run_exec_ratio": round(run_ms / exec_ms, 3),
            "exec_stream_ms_p50": round(runs["exec_stream"], 3),
            "exec_argv_ms_p50": None if runs["exec_argv"] is None else round(runs["exec_argv"], 3),
        }
        em = (" (emulated: QEMU TCG)" if a.emulated else "") + f", the {a.guest} guest"
        print(f"first byte to the client, p50 / p99 over {a.lines} lines (clock good to {out['clock_rtt_ms'] / 2:.3f} "
              f"ms){em}:")
        print(f"  REST   {out['latency_rest_ms_p50']} / {out['latency_rest_ms_p99']} ms ({len(lat_rest)} chunks)")
        print(f"  D-Bus  {out['latency_dbus_ms_p50']} / {out['latency_dbus_ms_p99']} ms ({len(lat_dbus)} chunks)")
        print(f"throughput over REST: {out['throughput_mb_s']} MB/s ({got} bytes received, {gaps} dropped by the ring)")
        print(f"commands.run('true') {out['run_ms_p50']} ms against exec of /bin/sh -c true {out['exec_ms_p50']} ms: "
              f"{out['run_exec_ratio']}x; that exec with \"stream\" {out['exec_stream_ms_p50']} ms"
              + ("" if progs.test else f", exec of true {out['exec_argv_ms_p50']} ms"))
        if a.json:
            print(json.dumps(out))
    finally:
        if g:
            g.down()


if __name__ == "__main__":
    main()
