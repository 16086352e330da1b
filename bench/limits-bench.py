#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
bench/limits: what cpu_limit and disk_rate hold, and what cpu_limit costs a
fork, through forkd over D-Bus (a private dbus-daemon, the real forkd with a
cgroup tree of its own, v2 or v1, forkd-vmm, the test guest of 64 MiB):

  cpu        a sandbox forked with cpu_limit 0.5 runs the guest's
             "spin 10000" (10 s of busy vCPU by the TSC); the CPU it used is
             its cgroup's cpu.stat usage_usec (v1: its VMM's utime and stime
             in /proc/PID/stat) over the call's wall time (cpu_used_cpus;
             target 0.45..0.55)
  disk       a sandbox forked with disk_rate {bandwidth 10 MiB/s (or
             --disk-rate-kib), burst 64 KiB} writes 10 s of that in 4 KiB
             requests ("disk_write 25600" at 10 MiB/s); bytes over wall time
             (disk_mib_per_s; target within 10% of the rate)
  neighbour  the Ping round trip of an idle sandbox (200 of them, p50 and
             p99) alone, then beside one spinning sandbox per host CPU, each
             with cpu_limit 0.5 (neighbour_capped_ms; against alone: the
             ratio, which the limit should keep near 1), then the same
             spinners without a limit (neighbour_uncapped_ms: what the
             limit saves)
  fork       Fork(tag, N) with cpu_limit 0.5 (a cgroup per child) and
             without, until the reply (every child answered), R rounds taking
             turns, medians (fork_cpu_limit_ms, fork_plain_ms, and their ratio)

With --json the last line of stdout is one JSON object. Needs root, cgroup v2
(or v1 with the memory and cpu hierarchies) and a usable /dev/kvm; bench/limits runs it in the test host (--emulated)
where there is none.
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import threading
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = 4096


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def median(xs):
    return round(statistics.median(xs), 3) if xs else None


class Bench:
    def __init__(self, args, tf):
        self.args, self.tf = args, tf
        self.h = tf.Harness()

    def setup(self):
        h = self.h
        disk = os.path.join(h.tmp, "disk.img")
        with open(disk, "wb") as f:
            f.truncate(256 << 20)
        h.setup_cgroups()
        if not h.cgroot or (h.cgroot.startswith("/sys/fs/cgroup/memory/") and not h.cpu_cgroot()):
            sys.exit("bench/limits: needs cgroup v2 with the memory and cpu controllers, or v1's memory and cpu "
                     "hierarchies")
        h.start_bus()
        h.start_forkd()
        h.m("CreateSnapshot", "sssuu", ["base", self.args.guest, disk, 64, 60], timeout=120)
        self.end(h.fork("base", 1))  # the template runs, as for every later fork

    def end(self, kids):
        for k in kids:
            self.h.m("TerminateSandbox", "s", [k["id"]])
        for k in kids:
            self.h.wait_removed(k["id"])

    def run_code(self, sid, code):
        out = json.loads(self.h.m("RunCode", "ssu", [sid, code, 600], timeout=660)[0])
        if out.get("error"):
            raise RuntimeError(f"{code}: {out}")

    def usage_usec(self, sid, pid):
        return self.tf.cgroupcpu.cpu_usec(self.h.cgroot, sid, pid)

    def cpu(self):
        s = self.h.fork("base", 1, {"cpu_limit": ("d", 0.5)})[0]
        try:
            u0, t0 = self.usage_usec(s["id"], s["pid"]), time.monotonic()
            self.run_code(s["id"], "spin 10000")
            used = (self.usage_usec(s["id"], s["pid"]) - u0) / 1e6
            wall = time.monotonic() - t0
        finally:
            self.end([s])
        return {"cpu_used_cpus": round(used / wall, 3), "cpu_wall_s": round(wall, 3)}

    def disk(self):
        rate = self.args.disk_rate_kib << 10
        blocks = 10 * rate // BLOCK
        s = self.h.fork("base", 1, {"disk_rate": ("a{st}", {"bandwidth": rate, "burst": 64 << 10})})[0]
        try:
            t0 = time.monotonic()
            self.run_code(s["id"], f"disk_write {blocks}")
            wall = time.monotonic() - t0
        finally:
            self.end([s])
        return {"disk_mib_per_s": round(blocks * BLOCK / wall / (1 << 20), 3), "disk_wall_s": round(wall, 3)}

    def pings(self, sid, n=200):
        times = []
        for _ in range(n):
            t0 = time.monotonic()
            self.h.m("Ping", "s", [sid])
            times.append((time.monotonic() - t0) * 1000)
        times.sort()
        return {"p50": round(times[n // 2], 3), "p99": round(times[n * 99 // 100], 3)}

    def neighbour(self):
        spinners = os.cpu_count() or 1
        nb = self.h.fork("base", 1)[0]
        r = {"neighbour_spinners": spinners}
        try:
            r["neighbour_alone_ms"] = self.pings(nb["id"])
            for key, opts in (("neighbour_capped_ms", {"cpu_limit": ("d", 0.5)}), ("neighbour_uncapped_ms", {})):
                kids = self.h.fork("base", spinners, opts)
                # each spinner's RunCode on a bus connection of its own: the harness's is not for threads
                errors = []

                def spin(sid):
                    try:
                        bus = self.tf.Bus(self.h.address)
                        out = json.loads(bus.call(self.tf.DEST, self.tf.PATH, self.tf.IFACE, "RunCode", "ssu",
                                                  [sid, "spin 5000", 60], 90)[0])
                        if out.get("error"):
                            errors.append(out)
                    except Exception as e:  # noqa: BLE001 -- reported below
                        errors.append(repr(e))

                threads = [threading.Thread(target=spin, args=(k["id"],)) for k in kids]
                for t in threads:
                    t.start()
                time.sleep(0.5)  # the spinners spinning
                r[key] = self.pings(nb["id"])
                for t in threads:
                    t.join()
                self.end(kids)
                if errors:
                    raise RuntimeError(f"a spinner failed: {errors[0]}")
        finally:
            self.end([nb])
        r["neighbour_capped_ratio"] = round(r["neighbour_capped_ms"]["p50"] / r["neighbour_alone_ms"]["p50"], 3)
        r["neighbour_uncapped_ratio"] = round(r["neighbour_uncapped_ms"]["p50"] / r["neighbour_alone_ms"]["p50"], 3)
        return r

    def fork(self, k):
        r = {}
        both = [("fork_cpu_limit_ms", {"cpu_limit": ("d", 0.5)}), ("fork_plain_ms", {})]
        for key, opts in both[k % 2:] + both[:k % 2]:
            t0 = time.monotonic()
            kids = self.h.m("Fork", "sua{sv}", ["base", self.args.n, opts], timeout=600)[0]
            r[key] = (time.monotonic() - t0) * 1000
            self.end(kids)
        return r


def main():
    ap = argparse.ArgumentParser(prog="bench/limits", description="bench/limits")
    ap.add_argument("--vmm", required=True)
    ap.add_argument("--forkd", required=True)
    ap.add_argument("--guest", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--disk-rate-kib", type=int, default=10240,
                    help="disk_rate of the disk part, KiB/s (default 10240; the guest writes 10 s of it): lower it "
                         "where the guest's own writes are slower than that, as under TCG")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--emulated", action="store_true", help="the figures come from the QEMU test host")
    args = ap.parse_args()
    if not 1 <= args.rounds <= 20 or not 1 <= args.n <= 1000 or not 4 <= args.disk_rate_kib <= 1 << 20:
        ap.error("--rounds must be 1..20, --n 1..1000, --disk-rate-kib 4..1048576")
    if os.geteuid() != 0:
        sys.exit("bench/limits: needs root (a private system bus, cgroups)")
    if args.emulated:
        print("bench/limits: EMULATED: in the QEMU test host (TCG, nested SVM): these are not forkd's speeds")
    tf = load("test_forkd", os.path.join(TOP, "tests/daemon/test-forkd.py"))
    tf.FORKD, tf.VMM, tf.GUEST = args.forkd, args.vmm, args.guest
    os.environ["FORKD_VMM"] = args.vmm
    b = Bench(args, tf)
    forks = []
    try:
        b.setup()
        cpu = b.cpu()
        disk = b.disk()
        neighbour = b.neighbour()
        for k in range(args.rounds):
            forks.append(b.fork(k))
    finally:
        b.h.cleanup()

    doc = {"rounds": args.rounds, "n": args.n, "emulated": args.emulated,
           "cgroup": "v1" if b.h.cpu_cgroot() else "v2", **cpu, **disk, **neighbour,
           "fork_cpu_limit_ms": median([r["fork_cpu_limit_ms"] for r in forks]),
           "fork_plain_ms": median([r["fork_plain_ms"] for r in forks])}
    doc["fork_cpu_limit_ratio"] = round(doc["fork_cpu_limit_ms"] / doc["fork_plain_ms"], 3)
    doc["cpu_ok"] = 0.45 <= doc["cpu_used_cpus"] <= 0.55
    want = args.disk_rate_kib / 1024
    doc["disk_rate_mib_per_s"] = round(want, 3)
    doc["disk_ok"] = 0.9 * want <= doc["disk_mib_per_s"] <= 1.1 * want
    doc["rounds_ms"] = forks

    print(f"bench/limits: test guest 64 MiB, cgroup {doc['cgroup']}; fork of {args.n}, {args.rounds} rounds "
          "taking turns, medians")
    for key, label, target in (
            ("cpu_used_cpus", "cpu_limit 0.5, spinning guest: CPUs used", "0.45..0.55"),
            ("cpu_wall_s", "  over (s)", ""),
            ("disk_mib_per_s", f"disk_rate {want:g} MiB/s, writing guest: MiB/s",
             f"{0.9 * want:.3g}..{1.1 * want:.3g}"),
            ("disk_wall_s", "  over (s)", ""),
            ("neighbour_alone_ms", "an idle sandbox's Ping alone, p50 / p99 (ms)", ""),
            ("neighbour_capped_ms", f"  beside {doc['neighbour_spinners']} spinners at cpu_limit 0.5 (ms)", ""),
            ("neighbour_capped_ratio", "    p50 / alone", "flat"),
            ("neighbour_uncapped_ms", f"  beside {doc['neighbour_spinners']} spinners, no limit (ms)", ""),
            ("neighbour_uncapped_ratio", "    p50 / alone", ""),
            ("fork_plain_ms", f"Fork of {args.n}, no limit (ms)", ""),
            ("fork_cpu_limit_ms", f"Fork of {args.n}, cpu_limit 0.5 (ms)", ""),
            ("fork_cpu_limit_ratio", "  / no limit", "")):
        v = doc[key]
        if isinstance(v, dict):
            v = f"{v['p50']} / {v['p99']}"
        print(f"{label:50} {v:>14} {target}")
    if args.json:
        print(json.dumps(doc, separators=(",", ":")))


if __name__ == "__main__":
    main()
