#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
bench/chain: diff-snapshot chains of the test guest (256 MiB) through forkd over
D-Bus (a private dbus-daemon, the Python client of the tests) and forkctl:

  spawn    Fork(tag, 1) until the child answered, from the head of a chain of
           depth 0 to 3 (each link a diff branch of a sandbox of the link before,
           with 16 MiB written) and from its compacted flat equivalent
           (CompactSnapshot): the first fork (the template loads the chain and
           checks every parent_content_hash) and p50/p99 of the next --runs;
  disk     bytes on disk (st_blocks) of the three links against the three flat
           snapshots;
  pack     forkctl pack of the depth-3 chain and forkctl unpack of the bundle,
           against tar --zstd -c / -x of the same four directories, as
           throughput ratios (ours / tar's: above 1 is faster than tar).

With --json the last line of stdout is one JSON object; its headline keys are
spawn_ratio_depth3 (p50 from the depth-3 head / p50 from its flat equivalent),
pack_ratio and unpack_ratio. --emulated marks the figures as taken in the
QEMU test host (bench/chain runs there where /dev/kvm is not usable).
"""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEM_MIB = 256
STEP_MIB = 16
DEPTH = 3


def pct(xs, p):
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def summary(xs):
    return {"p50": round(pct(xs, 50), 3), "p99": round(pct(xs, 99), 3), "n": len(xs)}


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def du(path):
    """Bytes allocated on disk under path (st_blocks), hard links counted once."""
    seen, total = set(), 0
    for root, _, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def logical(path):
    return sum(os.lstat(os.path.join(r, n)).st_size for r, _, fs in os.walk(path) for n in fs)


def run(args, tf):
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
        h.start_forkd()
        snaps = os.path.join(h.state, "snapshots")
        h.m("CreateSnapshot", "sssuu", ["c0", args.guest, disk, MEM_MIB, 60], timeout=120)

        def terminate(sid):
            h.m("TerminateSandbox", "s", [sid])
            h.wait_removed(sid)

        # the chain: c0 (base), c1..c3 diff links, 16 MiB written in each step; f1..f3 flat
        for d in range(1, DEPTH + 1):
            p = h.fork(f"c{d - 1}", 1)[0]
            with open(f"/proc/{p['pid']}/maps") as f:
                start = next(int(line.split("-")[0], 16) for line in f if line.rstrip().endswith("memory.bin"))
            fd = os.open(f"/proc/{p['pid']}/mem", os.O_RDWR)
            chunk = bytes([0x40 + d]) * (1 << 20)
            for mib in range(16 + (d - 1) * STEP_MIB, 16 + d * STEP_MIB):
                os.pwrite(fd, chunk, start + (mib << 20))
            os.close(fd)
            info = h.m("BranchSandbox", "sssb", [p["id"], f"c{d}", "diff", True], timeout=120)[0]
            assert info.get("parent_tag") == f"c{d - 1}", info
            terminate(p["id"])
            h.m("CompactSnapshot", "ss", [f"c{d}", f"f{d}"], timeout=300)

        def spawn(tag):
            times = []
            for _ in range(args.runs + 1):
                t0 = time.monotonic()
                k = h.fork(tag, 1)[0]
                times.append((time.monotonic() - t0) * 1000)
                terminate(k["id"])
            return {"first_ms": round(times[0], 3), **summary(times[1:])}

        out["spawn"] = {tag: spawn(tag) for tag in ["c0"] + [f"{x}{d}" for d in range(1, DEPTH + 1) for x in "cf"]}
        out["spawn_ratio"] = {d: round(out["spawn"][f"c{d}"]["p50"] / out["spawn"][f"f{d}"]["p50"], 3)
                              for d in range(1, DEPTH + 1)}
        out["spawn_first_ratio_depth3"] = round(out["spawn"]["c3"]["first_ms"] / out["spawn"]["f3"]["first_ms"], 3)
        links = [os.path.join(snaps, f"c{d}") for d in range(1, DEPTH + 1)]
        flats = [os.path.join(snaps, f"f{d}") for d in range(1, DEPTH + 1)]
        out["disk"] = {"links_bytes": sum(du(x) for x in links), "flat_bytes": sum(du(x) for x in flats),
                       "base_bytes": du(os.path.join(snaps, "c0"))}

        # pack and unpack through forkctl, against tar --zstd of the same directories
        if args.forkctl:
            env = dict(os.environ, FORKD_BUS_ADDRESS=h.address)
            chain = [os.path.join(snaps, f"c{d}") for d in range(DEPTH + 1)]
            size = sum(logical(x) for x in chain)
            bundle, tarball = os.path.join(h.tmp, "chain.tar.zst"), os.path.join(h.tmp, "chain.tar")
            t0 = time.monotonic()
            subprocess.run([args.forkctl, "--no-progress", "pack", "--tag", f"c{DEPTH}", "--out", bundle],
                           env=env, check=True, capture_output=True)
            ours = time.monotonic() - t0
            t0 = time.monotonic()
            subprocess.run(["tar", "--zstd", "-cSf", tarball, "-C", snaps] + [f"c{d}" for d in range(DEPTH + 1)],
                           check=True)
            theirs = time.monotonic() - t0
            out["pack"] = {"ours_s": round(ours, 3), "tar_s": round(theirs, 3), "input_bytes": size,
                           "bundle_bytes": os.path.getsize(bundle), "tar_bytes": os.path.getsize(tarball)}
            for tag in ["f1", "f2", "f3"]:
                h.m("DeleteSnapshot", "sbb", [tag, False, False])
            h.m("DeleteSnapshot", "sbb", ["c0", True, False])
            t0 = time.monotonic()
            subprocess.run([args.forkctl, "--no-progress", "unpack", bundle], env=env, check=True, capture_output=True)
            ours = time.monotonic() - t0
            x = os.path.join(h.tmp, "untar")
            os.mkdir(x)
            t0 = time.monotonic()
            subprocess.run(["tar", "--zstd", "-xSf", tarball, "-C", x], check=True)
            theirs = time.monotonic() - t0
            k = h.fork(f"c{DEPTH}", 1)[0]
            terminate(k["id"])
            out["unpack"] = {"ours_s": round(ours, 3), "tar_s": round(theirs, 3)}
            out["pack_ratio"] = round(out["pack"]["tar_s"] / out["pack"]["ours_s"], 3)
            out["unpack_ratio"] = round(out["unpack"]["tar_s"] / out["unpack"]["ours_s"], 3)
    finally:
        h.cleanup()
    return out


def main():
    ap = argparse.ArgumentParser(description="bench/chain")
    ap.add_argument("--vmm", required=True)
    ap.add_argument("--forkd", required=True)
    ap.add_argument("--forkctl")
    ap.add_argument("--guest", required=True)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--emulated", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/chain: needs root (a private system bus, /proc/<pid>/mem of the VMMs)")
    if not 1 <= args.runs <= 1000:
        sys.exit("bench/chain: --runs must be from 1 to 1000")
    tf = load("test_forkd", os.path.join(TOP, "tests/daemon/test-forkd.py"))
    if args.emulated:
        print("bench/chain: EMULATED: in the QEMU test host (TCG, nested SVM): ratios hold, times do not")
    r = run(args, tf)
    print(f"{'spawn from (ms)':34} {'first':>9} {'p50':>9} {'p99':>9} {'runs':>5}")
    for tag, s in r["spawn"].items():
        what = "base (depth 0)" if tag == "c0" else (f"chain head, depth {tag[1]}" if tag[0] == "c"
                                                     else f"its flat equivalent ({tag})")
        print(f"{what:34} {s['first_ms']:9.3f} {s['p50']:9.3f} {s['p99']:9.3f} {s['n']:5}")
    for d, ratio in r["spawn_ratio"].items():
        print(f"spawn p50 ratio, depth {d} / flat: {ratio:.3f}")
    print(f"first spawn ratio, depth 3 / flat (chain load and hash checks): {r['spawn_first_ratio_depth3']:.3f}")
    dk = r["disk"]
    print(f"bytes on disk: three links {dk['links_bytes']}, three flat snapshots {dk['flat_bytes']} "
          f"({dk['links_bytes'] / dk['flat_bytes']:.3f}x), base {dk['base_bytes']}")
    if "pack" in r:
        p, u = r["pack"], r["unpack"]
        print(f"pack of the depth-3 chain ({p['input_bytes']} logical bytes): forkctl {p['ours_s']:.3f} s, "
              f"tar --zstd {p['tar_s']:.3f} s, throughput ratio {r['pack_ratio']:.3f}; "
              f"bundle {p['bundle_bytes']} bytes, tarball {p['tar_bytes']}")
        print(f"unpack: forkctl {u['ours_s']:.3f} s (digests checked, registered), tar --zstd -x {u['tar_s']:.3f} s, "
              f"throughput ratio {r['unpack_ratio']:.3f}")
    if args.json:
        doc = {"spawn_ratio_depth3": r["spawn_ratio"][DEPTH], "pack_ratio": r.get("pack_ratio"),
               "unpack_ratio": r.get("unpack_ratio"), "runs": args.runs, "guest_mib": MEM_MIB,
               "step_mib": STEP_MIB, "emulated": args.emulated, **{k: v for k, v in r.items()
                                                                   if k not in ("pack_ratio", "unpack_ratio")}}
        print(json.dumps(doc, separators=(",", ":")))


if __name__ == "__main__":
    main()
