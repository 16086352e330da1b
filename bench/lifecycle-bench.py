#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
bench/lifecycle: pause, resume and fork of a paused sandbox through
forkd over D-Bus (a private dbus-daemon, the real forkd and forkd-vmm, the
test guest of --mem-mib MiB, default 256), --rounds R (default 5) taking
turns, medians:

  fork1      Fork(tag, 1) until the reply (its child answered): the baseline
             of a pause and a resume
  fork10     Fork(tag, 10) from the boot snapshot: the baseline of a fork of
             a paused sandbox (fork_baseline_ms)
  pause      two sandboxes that wrote --dirty-mib MiB (default 16) since their
             fork (through /proc/PID/mem of the VMM: copy-on-write faults, as
             the guest's own writes would be) are paused: PauseSandbox until
             the reply, which comes once the VMM is gone (pause_reply_ms); the
             guest's pause window as forkd-vmm measured it (pause_ms); the
             disk the paused state takes, forkd's snapshot directory with
             every file's allocated blocks (paused_disk_kib). The first is
             resumed at once: ResumeSandbox until the reply, its agent
             answered, its template started for it (resume_ready_ms); its RAM
             is checked to hold the pattern written before the pause. The
             second is forked, ForkSandbox(id, 10), twice: the first batch
             (fork_from_paused_ms, its template starts) and the second
             (fork_from_paused_warm_ms), every child checked likewise

Ratios: pause_reply_ratio and resume_ratio to fork1, fork_from_paused_ratio
(and _warm) to fork10. With --json the last line of stdout is one JSON object
(pause_ms, pause_reply_ms, resume_ready_ms, fork_from_paused_ms,
fork_baseline_ms, paused_disk_kib, emulated and the rest). Needs root and a
usable /dev/kvm; bench/lifecycle runs it in the test host (--emulated) where
there is none.
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATTERN_OFF = 16 << 20   # the test guest's scratch area
N_FORK = 10


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def guest_ram(pid):
    with open(f"/proc/{pid}/maps") as f:
        return next(int(line.split("-")[0], 16) for line in f if line.rstrip().endswith("/memory.bin"))


def dirty(pid, mib, pattern):
    """mib MiB written from the scratch area on, the pattern first."""
    base = guest_ram(pid)
    fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
    try:
        chunk = bytearray(b"\xa5" * (1 << 20))
        chunk[:len(pattern)] = pattern
        for k in range(mib):
            os.pwrite(fd, bytes(chunk), base + PATTERN_OFF + (k << 20))
    finally:
        os.close(fd)


def peek(pid, n):
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        return os.pread(fd, n, guest_ram(pid) + PATTERN_OFF)
    finally:
        os.close(fd)


def disk_kib(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total / 1024


def median(xs):
    return round(statistics.median(xs), 3) if xs else None


class Bench:
    def __init__(self, args, tf):
        self.args, self.tf = args, tf
        self.h = tf.Harness()
        self.snapdir = os.path.join(self.h.state, "snapshots")

    def timed(self, member, sig, args):
        t0 = time.monotonic()
        out = self.h.m(member, sig, args, timeout=300)
        return out, (time.monotonic() - t0) * 1000

    def end(self, kids):
        for k in kids:
            self.h.m("TerminateSandbox", "s", [k["id"]])
        for k in kids:
            self.h.wait_removed(k["id"])

    def setup(self):
        disk = os.path.join(self.h.tmp, "disk.img")
        with open(disk, "wb") as f:
            f.truncate(16 << 20)
        self.h.start_bus()
        self.h.start_forkd()
        self.h.m("CreateSnapshot", "sssuu", ["base", self.args.guest, disk, self.args.mem_mib, 60], timeout=120)
        self.end(self.h.fork("base", 1))  # the template runs, as for every later fork

    def fork1(self):
        (kids,), ms = self.timed("Fork", "sua{sv}", ["base", 1, {}])
        self.end(kids)
        return {"fork1_ms": ms}

    def fork10(self):
        (kids,), ms = self.timed("Fork", "sua{sv}", ["base", N_FORK, {}])
        self.end(kids)
        return {"fork_baseline_ms": ms}

    def paused_one(self):
        """A sandbox that dirtied --dirty-mib MiB, paused: (its id, its pattern, figures)."""
        h, r = self.h, {}
        s = h.fork("base", 1)[0]
        pattern = f"lifecycle-{s['id']}".encode()
        dirty(s["pid"], self.args.dirty_mib, pattern)
        (info,), r["pause_reply_ms"] = self.timed("PauseSandbox", "s", [s["id"]])
        assert info["status"] == "paused", info
        r["pause_ms"] = info["pause_us"] / 1000
        mine = [d for d in os.listdir(self.snapdir) if d.startswith(f"paused.{s['id']}.")]
        assert len(mine) == 1, mine
        r["paused_disk_kib"] = disk_kib(os.path.join(self.snapdir, mine[0]))
        return s["id"], pattern, r

    def pause(self):
        """Two paused sandboxes: one resumed at once (its template starts), one forked twice."""
        sid, pattern, a = self.paused_one()
        (info,), a["resume_ready_ms"] = self.timed("ResumeSandbox", "s", [sid])
        assert info["status"] == "running" and peek(info["pid"], len(pattern)) == pattern, info
        self.end([info])
        sid, pattern, b = self.paused_one()
        for key in ("fork_from_paused_ms", "fork_from_paused_warm_ms"):
            (kids, _), b[key] = self.timed("ForkSandbox", "su", [sid, N_FORK])
            assert all(peek(k["pid"], len(pattern)) == pattern for k in kids), "a child without the paused state"
            self.end(kids)
        self.h.m("TerminateSandbox", "s", [sid])
        self.h.wait_removed(sid)
        # both pauses count
        for key in ("pause_reply_ms", "pause_ms", "paused_disk_kib"):
            a[key] = [a[key], b[key]]
        a.update({k: v for k, v in b.items() if k.startswith("fork")})
        return a


def main():
    ap = argparse.ArgumentParser(prog="bench/lifecycle", description="bench/lifecycle")
    ap.add_argument("--vmm", required=True)
    ap.add_argument("--forkd", required=True)
    ap.add_argument("--guest", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mem-mib", type=int, default=256)
    ap.add_argument("--dirty-mib", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--emulated", action="store_true", help="the figures come from the QEMU test host")
    args = ap.parse_args()
    if not 1 <= args.rounds <= 50 or not 1 <= args.dirty_mib <= 1024 or not 64 <= args.mem_mib <= 3072:
        ap.error("--rounds must be 1..50, --dirty-mib 1..1024, --mem-mib 64..3072")
    if args.dirty_mib + 16 > args.mem_mib:
        ap.error("--dirty-mib must leave the guest's first 16 MiB alone (--mem-mib - 16 at most)")
    if os.geteuid() != 0:
        sys.exit("bench/lifecycle: needs root (a private system bus, /proc/<pid>/mem of the VMMs)")
    if args.emulated:
        print("bench/lifecycle: EMULATED: in the QEMU test host (TCG, nested SVM): these are not forkd's speeds")
    tf = load("test_forkd", os.path.join(TOP, "tests/daemon/test-forkd.py"))
    tf.FORKD, tf.VMM, tf.GUEST = args.forkd, args.vmm, args.guest
    os.environ["FORKD_VMM"] = args.vmm
    b = Bench(args, tf)
    rounds = {"fork1": [], "fork10": [], "pause": []}
    try:
        b.setup()
        modes = list(rounds)
        for k in range(args.rounds):
            for mode in modes[k % 3:] + modes[:k % 3]:
                rounds[mode].append(getattr(b, mode)())
    finally:
        b.h.cleanup()

    def med(mode, key):
        return median([x for r in rounds[mode] for x in (r[key] if isinstance(r[key], list) else [r[key]])])

    doc = {"rounds": args.rounds, "mem_mib": args.mem_mib, "dirty_mib": args.dirty_mib, "n_fork": N_FORK,
           "emulated": args.emulated, "fork1_ms": med("fork1", "fork1_ms"),
           "fork_baseline_ms": med("fork10", "fork_baseline_ms")}
    for key in ("pause_ms", "pause_reply_ms", "paused_disk_kib", "fork_from_paused_ms", "fork_from_paused_warm_ms",
                "resume_ready_ms"):
        doc[key] = med("pause", key)
    doc["pause_reply_ratio"] = round(doc["pause_reply_ms"] / doc["fork1_ms"], 3)
    doc["resume_ratio"] = round(doc["resume_ready_ms"] / doc["fork1_ms"], 3)
    doc["fork_from_paused_ratio"] = round(doc["fork_from_paused_ms"] / doc["fork_baseline_ms"], 3)
    doc["fork_from_paused_warm_ratio"] = round(doc["fork_from_paused_warm_ms"] / doc["fork_baseline_ms"], 3)
    doc["paused_disk_budget_kib"] = (args.dirty_mib + 1) * 1024
    doc["rounds_ms"] = {m: rounds[m] for m in rounds}

    print(f"bench/lifecycle: test guest {args.mem_mib} MiB, {args.dirty_mib} MiB dirtied before the pause, "
          f"{args.rounds} rounds taking turns, medians")
    for key, label, target in (
            ("fork1_ms", "Fork of 1, answered (ms)", ""),
            ("fork_baseline_ms", f"Fork of {N_FORK} from the boot snapshot (ms)", ""),
            ("pause_reply_ms", "PauseSandbox, reply once the VMM is gone (ms)", ""),
            ("pause_reply_ratio", "  / fork of 1", "<= 10"),
            ("pause_ms", "  guest pause window (ms)", "<= 10 native"),
            ("paused_disk_kib", "  disk of the paused state (KiB)", f"<= {doc['paused_disk_budget_kib']}"),
            ("resume_ready_ms", "ResumeSandbox, agent answered (ms)", ""),
            ("resume_ratio", "  / fork of 1", "<= 1.5"),
            ("fork_from_paused_ms", f"ForkSandbox {N_FORK} of the paused one, 1st batch (ms)", ""),
            ("fork_from_paused_ratio", f"  / fork of {N_FORK} from the boot snapshot", "<= 1.2"),
            ("fork_from_paused_warm_ms", f"ForkSandbox {N_FORK} of the paused one, 2nd batch (ms)", ""),
            ("fork_from_paused_warm_ratio", f"  / fork of {N_FORK} from the boot snapshot", "<= 1.2")):
        print(f"{label:58} {doc[key]:>10} {target}")
    if args.json:
        print(json.dumps(doc, separators=(",", ":")))


if __name__ == "__main__":
    main()
