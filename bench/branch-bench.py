#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
bench/branch: branching and forking a running sandbox of the test guest
(256 MiB, 64 MiB written since its restore). p50 and p99 over --runs runs
(default 20) of:

  engine   forkd-vmm alone, on its control socket: the pause of a branch
           (full and diff; live is the same operation, answered earlier) and of
           a fork, and a fork into n = 1, 2, 5, 32 until every child answered
           ping on its agent socket;
  user     the same through forkd over D-Bus (a private dbus-daemon, the
           Python client of the tests): BranchSandbox full, diff and live
           (wall time of the call and the pause forkd-vmm measured), and
           ForkSandbox n = 1, 2, 5, 32 (wall time until the reply, which comes
           once every child answered, and the parent's pause); host memory
           per child of a running-sandbox fork, measured as bench/fork does
           (Private_Dirty + page tables of each idle child).

--vcpus N (1..32, default 1): every snapshot of the run has N vCPUs (the test
guest's APs counting on a 10 Hz timer), on both paths; run it with and without to
compare the pause with N vCPUs to the 1-vCPU pause ("vcpus" in the JSON).

With --json the last line of stdout is one JSON object; its headline keys
pause_ms_full, pause_ms_diff, pause_ms_live, fork5_ms, fork5_parent_pause_ms
are p50s of the user path (each also as *_p99), "engine" holds the rest.
Needs root and a usable /dev/kvm; bench/branch runs it in the test host
(--emulated, said on the first line and in the JSON) where there is none.
"""

import argparse
import array
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEM_MIB = 256
WRITTEN_MIB = 64


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def summary(xs):
    return {"p50": round(pct(xs, 50), 3), "p99": round(pct(xs, 99), 3), "n": len(xs)}


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def child_kib(pid):
    priv = pte = None
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                priv = int(line.split()[1])
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmPTE:"):
                pte = int(line.split()[1])
    return priv + pte


# ---------------------------------------------------------------- engine

def engine(args, ac, tmp):
    disk = os.path.join(tmp, "disk.img")
    with open(disk, "wb") as f:
        f.truncate(16 << 20)

    def start(name, vmm_args):
        ctl, agent = os.path.join(tmp, name + ".ctl"), os.path.join(tmp, name + ".agent")
        p = subprocess.Popen([args.vmm] + vmm_args + ["--control-socket", ctl, "--agent-socket", agent,
                                                      "--overlay-dir", tmp])
        c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for _ in range(1000):
            try:
                c.connect(ctl)
                break
            except OSError:
                time.sleep(0.005)
        for _ in range(1000):
            try:
                a = ac.Agent(agent)
                break
            except OSError:
                time.sleep(0.005)
        c.settimeout(60)
        return p, c, a

    def control(c, req, fd=None):
        data = json.dumps(req).encode()
        if fd is None:
            c.send(data)
        else:
            c.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        return json.loads(c.recv(65536))

    p, c, a = start("boot", ["boot", "--kernel", args.guest, "--disk", disk, "--mem-mib", str(MEM_MIB),
                                 "--vcpus", str(args.vcpus)])
    a.call("ping")
    base = os.path.join(tmp, "base")
    assert control(c, {"op": "snapshot", "dir": base, "tag": "base"})["ok"]
    control(c, {"op": "shutdown"})
    p.wait()

    p, c, a = start("src", ["restore", "--snapshot", base])
    # 64 MiB written since the restore, by the guest (scratch area from 16 MiB)
    t, r = a.call("mem_write", offset_pages=0, pages=WRITTEN_MIB * 256, pattern=0x5a5a5a5a)
    assert t == ac.RESP, r
    out = {}
    k = 0
    for mode in ("full", "diff"):
        pauses, walls = [], []
        for _ in range(args.runs):
            k += 1
            d = os.path.join(tmp, f"e{k}")
            x, y = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            req = {"op": "branch", "dir": d, "tag": f"e{k}", "mode": mode}
            if mode == "diff":
                req.update(parent_dir=base, parent_tag="base")
            t0 = time.monotonic()
            r = control(c, req, y.fileno())
            walls.append((time.monotonic() - t0) * 1000)
            y.close()
            assert r["ok"], r
            pauses.append(r["pause_us"] / 1000)
            x.settimeout(120)
            assert json.loads(x.recv(4096))["ok"]
            x.close()
            shutil.rmtree(d, ignore_errors=True)
        out[f"branch_{mode}_pause_ms"] = summary(pauses)
        out[f"branch_{mode}_control_ms"] = summary(walls)

    for n in args.fork_n:
        totals, pauses, kib = [], [], []
        for _ in range(args.runs if n <= 5 else max(3, args.runs // 4)):
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            ours.settimeout(60)
            pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(n)]
            ids = [f"c{i}" for i in range(n)]
            t0 = time.monotonic()
            r = control(c, {"op": "fork"}, theirs.fileno())
            theirs.close()
            assert r["ok"], r
            assert json.loads(ours.recv(65536))["event"] == "ready"
            req = json.dumps({"op": "spawn", "ids": ids, "with_control": False}).encode()
            ours.sendmsg([req], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                  array.array("i", [q[1].fileno() for q in pairs]))])
            for q in pairs:
                q[1].close()
            rep = json.loads(ours.recv(65536))
            assert rep["ok"], rep
            agents = []
            for q in pairs:
                ag = ac.Agent.__new__(ac.Agent)
                ag.s, ag.next_id, ag.buf = q[0], 1, b""
                q[0].settimeout(30)
                ag.send_raw(ag.frame(ac.REQ, 1, b'{"op":"ping"}'))
                agents.append(ag)
            for ag in agents:
                ag.recv_frame()
            totals.append((time.monotonic() - t0) * 1000)
            pauses.append(r["pause_us"] / 1000)
            if n == 5 or n == args.fork_n[-1]:
                kib += [child_kib(pid) for pid in rep["pids"]]
            ours.close()
            for q in pairs:
                q[0].close()
            time.sleep(0.05)
        out[f"fork{n}_ms"] = summary(totals)
        out[f"fork{n}_parent_pause_ms"] = summary(pauses)
        if kib:
            out[f"fork{n}_child_kib"] = round(statistics.mean(kib), 1)
    control(c, {"op": "shutdown"})
    p.wait()
    return out


# ---------------------------------------------------------------- user path

def user(args, tf, tmp):
    os.environ["FORKD"] = args.forkd
    os.environ["FORKD_VMM"] = args.vmm
    tf.FORKD, tf.VMM, tf.GUEST = args.forkd, args.vmm, args.guest
    h = tf.Harness()
    out = {}
    try:
        disk = os.path.join(h.tmp, "disk.img")
        with open(disk, "wb") as f:
            f.truncate(16 << 20)
        h.start_bus()
        h.start_forkd(["--max-branches", "64", "--default-vcpus", str(args.vcpus)])
        h.m("CreateSnapshot", "sssuu", ["base", args.guest, disk, MEM_MIB, 60], timeout=120)
        p = h.fork("base", 1)[0]
        # 64 MiB written since the restore: copy-on-write faults in the VMM, as the guest's would be.
        with open(f"/proc/{p['pid']}/maps") as f:
            start = next(int(line.split("-")[0], 16) for line in f if line.rstrip().endswith("/memory.bin"))
        fd = os.open(f"/proc/{p['pid']}/mem", os.O_RDWR)
        chunk = b"\x5a" * (1 << 20)
        for mib in range(16, 16 + WRITTEN_MIB):
            os.pwrite(fd, chunk, start + (mib << 20))
        os.close(fd)
        k = 0
        for mode in ("full", "diff", "live"):
            pauses, walls = [], []
            for _ in range(args.runs):
                k += 1
                tag = f"u{k}"
                t0 = time.monotonic()
                info = h.m("BranchSandbox", "sssb", [p["id"], tag, mode, True], timeout=120)[0]
                walls.append((time.monotonic() - t0) * 1000)
                pauses.append(info["pause_us"] / 1000)
                h.m("DeleteSnapshot", "sbb", [tag, False, False])
            out[f"branch_{mode}_pause_ms"] = summary(pauses)
            out[f"branch_{mode}_call_ms"] = summary(walls)
        # live without wait: the call returns as the source resumes
        walls = []
        for _ in range(args.runs):
            k += 1
            tag = f"u{k}"
            t0 = time.monotonic()
            info = h.m("BranchSandbox", "sssb", [p["id"], tag, "live", False], timeout=120)[0]
            walls.append((time.monotonic() - t0) * 1000)
            tf.wait_for(lambda tag=tag: {s["tag"]: s for s in h.m("ListSnapshots")[0]}[tag]["status"] == "ready",
                        60, tag)
            h.m("DeleteSnapshot", "sbb", [tag, False, False])
        out["branch_live_nowait_call_ms"] = summary(walls)
        for n in args.fork_n:
            totals, pauses, kib = [], [], []
            for _ in range(args.runs if n <= 5 else max(3, args.runs // 4)):
                t0 = time.monotonic()
                kids, pause_us = h.m("ForkSandbox", "su", [p["id"], n], timeout=120)
                totals.append((time.monotonic() - t0) * 1000)
                pauses.append(pause_us / 1000)
                kib += [child_kib(x["pid"]) for x in kids]
                for x in kids:
                    h.m("TerminateSandbox", "s", [x["id"]])
                for x in kids:
                    h.wait_removed(x["id"])
            out[f"fork{n}_ms"] = summary(totals)
            out[f"fork{n}_parent_pause_ms"] = summary(pauses)
            out[f"fork{n}_child_kib"] = round(statistics.mean(kib), 1)
    finally:
        h.cleanup()
    return out


def main():
    ap = argparse.ArgumentParser(description="bench/branch")
    ap.add_argument("--vmm", required=True)
    ap.add_argument("--forkd", required=True)
    ap.add_argument("--guest", required=True)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--emulated", action="store_true", help="the figures come from the QEMU test host")
    ap.add_argument("--fork-n", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 5, 32])
    ap.add_argument("--vcpus", type=int, default=1)
    args = ap.parse_args()
    if not 1 <= args.vcpus <= 32:
        sys.exit("bench/branch: --vcpus must be 1..32")
    if os.geteuid() != 0:
        sys.exit("bench/branch: needs root (a private system bus, /proc/<pid>/mem of the VMMs)")
    if args.runs < 1:
        sys.exit("bench/branch: --runs must be at least 1")
    if args.emulated:
        print("bench/branch: EMULATED: in the QEMU test host (TCG, nested SVM): these are not forkd's speeds")
    ac = load("agent_check", os.path.join(TOP, "tests/guest/agent-check.py"))
    tf = load("test_forkd", os.path.join(TOP, "tests/daemon/test-forkd.py"))
    tmp = tempfile.mkdtemp(prefix="forkd-bench-branch-")
    try:
        eng = engine(args, ac, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    usr = user(args, tf, None)

    rows = [("pause, branch full (user path)", usr["branch_full_pause_ms"]),
            ("pause, branch diff (user path)", usr["branch_diff_pause_ms"]),
            ("pause, branch live (user path)", usr["branch_live_pause_ms"]),
            ("BranchSandbox full, call", usr["branch_full_call_ms"]),
            ("BranchSandbox diff, call", usr["branch_diff_call_ms"]),
            ("BranchSandbox live wait, call", usr["branch_live_call_ms"]),
            ("BranchSandbox live no wait, call", usr["branch_live_nowait_call_ms"])]
    for n in args.fork_n:
        rows += [(f"ForkSandbox n={n}, all answered", usr[f"fork{n}_ms"]),
                 (f"ForkSandbox n={n}, parent pause", usr[f"fork{n}_parent_pause_ms"])]
    rows += [("engine: pause, branch full", eng["branch_full_pause_ms"]),
             ("engine: pause, branch diff", eng["branch_diff_pause_ms"])]
    for n in args.fork_n:
        rows += [(f"engine: fork n={n}, all answered", eng[f"fork{n}_ms"]),
                 (f"engine: fork n={n}, parent pause", eng[f"fork{n}_parent_pause_ms"])]
    print(f"vCPUs per snapshot: {args.vcpus}")
    print(f"{'figure (ms)':44} {'p50':>9} {'p99':>9} {'runs':>5}")
    for name, s in rows:
        print(f"{name:44} {s['p50']:9.3f} {s['p99']:9.3f} {s['n']:5}")
    for n in args.fork_n:
        print(f"{'host memory per child, fork n=' + str(n) + ' (KiB)':44} {usr[f'fork{n}_child_kib']:9.1f}")
    if args.json:
        doc = {
            "pause_ms_full": usr["branch_full_pause_ms"]["p50"],
            "pause_ms_full_p99": usr["branch_full_pause_ms"]["p99"],
            "pause_ms_diff": usr["branch_diff_pause_ms"]["p50"],
            "pause_ms_diff_p99": usr["branch_diff_pause_ms"]["p99"],
            "pause_ms_live": usr["branch_live_pause_ms"]["p50"],
            "pause_ms_live_p99": usr["branch_live_pause_ms"]["p99"],
            "fork5_ms": usr["fork5_ms"]["p50"] if "fork5_ms" in usr else None,
            "fork5_ms_p99": usr["fork5_ms"]["p99"] if "fork5_ms" in usr else None,
            "fork5_parent_pause_ms": usr["fork5_parent_pause_ms"]["p50"] if "fork5_ms" in usr else None,
            "fork5_parent_pause_ms_p99": usr["fork5_parent_pause_ms"]["p99"] if "fork5_ms" in usr else None,
            "runs": args.runs, "guest_mib": MEM_MIB, "written_mib": WRITTEN_MIB, "vcpus": args.vcpus,
            "emulated": args.emulated, "user": usr, "engine": eng,
        }
        print(json.dumps(doc, separators=(",", ":")))


if __name__ == "__main__":
    main()
