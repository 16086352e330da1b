#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The body of tools/demo (run that, not this: it installs and builds first)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

STATE = "/var/tmp/forkd-demo"
EMULATED = False


def logs():
    """The logs an error may point to: forkd's, forkd-rest's and each boot console."""
    found = []
    for d in (STATE, f"{STATE}/forkd/logs"):
        try:
            found += [f"{d}/{n}" for n in sorted(os.listdir(d)) if n.endswith(".log")]
        except OSError:
            pass
    return found


def die(msg):
    print(f"demo: {msg}", file=sys.stderr)
    paths = logs()
    if EMULATED:
        # The test host's disks are thrown away with it: the logs' ends come out here.
        for path in paths:
            with open(path, errors="replace") as f:
                tail = f.read().splitlines()[-25:]
            print(f"demo: --- last lines of {path} ---", file=sys.stderr)
            print("\n".join(tail), file=sys.stderr)
    elif paths:
        print("demo: the logs stay for you to read: " + ", ".join(paths), file=sys.stderr)
    sys.exit(1)


def forkctl(build, env, *args, timeout=600):
    p = subprocess.run([f"{build}/src/forkctl/forkctl", "--no-progress", "--json", *args], env=env,
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        die(f"forkctl {' '.join(args)}: {p.stderr.strip()}")
    return json.loads(p.stdout) if p.stdout.strip() else None


def size(n):
    return f"{n >> 20} MiB" if n >= 10 << 20 else f"{n >> 10} KiB"


def child_memory_kib(pid):
    """Private dirty memory plus page tables of one VMM process, in KiB."""
    priv = pte = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                priv = int(line.split()[1])
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmPTE:"):
                pte = int(line.split()[1])
    return priv + pte


def main():
    ap = argparse.ArgumentParser(prog="tools/demo")
    ap.add_argument("--top", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--emulated", action="store_true",
                    help="running inside the TCG test host: label every timing as emulated")
    args = ap.parse_args()
    global EMULATED
    EMULATED = args.emulated
    if not 1 <= args.n <= 1000:
        die("--n must be 1..1000")

    env = dict(os.environ, FORKD_BUILD_DIR=args.build, FORKD_STACK_NO_BUILD="1")
    stack_cmd = [f"{args.top}/tools/forkd-stack"]
    subprocess.run(stack_cmd + ["down", "--state-dir", STATE], env=env, capture_output=True)
    up = subprocess.run(stack_cmd + ["up", "--state-dir", STATE, "--port", "18890"], env=env,
                        capture_output=True, text=True)
    if up.returncode != 0:
        die("tools/forkd-stack up failed:\n" + up.stderr)
    stack = dict(line.split("=", 1) for line in up.stdout.splitlines() if "=" in line)
    env["FORKD_BUS_ADDRESS"] = stack["FORKD_BUS_ADDRESS"]
    guest = "Linux image" if stack["FORKD_GUEST_KERNEL"].endswith("vmlinuz") else "test guest (PVM host)"
    if EMULATED:
        print("demo: EMULATED: this runs in the test host, QEMU under TCG with nested SVM; every timing "
              "below is emulated (each instruction interpreted, ~100 us a VM exit), not forkd's speed")
    rows = []
    try:
        print(f"demo: default guest: {guest}: {stack['FORKD_GUEST_KERNEL']}")
        t0 = time.monotonic()
        forkctl(args.build, env, "snapshot", "create", "demo", "--kernel", stack["FORKD_GUEST_KERNEL"],
                "--rootfs", stack["FORKD_GUEST_ROOTFS"], "--boot-wait", "300")
        rows.append(("boot the guest and snapshot it", f"{(time.monotonic() - t0) * 1000:.0f} ms"))
        info = forkctl(args.build, env, "snapshot", "info", "demo")
        rows.append(("snapshot memory (logical / on disk)",
                     f"{size(info['memory_logical_bytes'])} / {size(info['memory_physical_bytes'])}"))

        print(f"demo: forking {args.n} sandboxes over D-Bus (the reply comes once every child answered)")
        t0 = time.monotonic()
        sandboxes = forkctl(args.build, env, "fork", "demo", "-n", str(args.n))["sandboxes"]
        fork_ms = (time.monotonic() - t0) * 1000
        rows.append((f"fork {args.n}, every child answered", f"{fork_ms:.0f} ms ({fork_ms / args.n:.2f} ms a child)"))

        answered, lat = 0, []
        for s in sandboxes:
            t0 = time.monotonic()
            r = forkctl(args.build, env, "ping", s["id"])
            lat.append((time.monotonic() - t0) * 1000)
            answered += bool(r and r.get("pong") is True)
        rows.append(("children that answered a ping afterwards", f"{answered} of {len(sandboxes)}"))
        rows.append(("forkctl ping, p50 (a process start included)", f"{statistics.median(lat):.1f} ms"))

        time.sleep(1)  # idle children
        mem = [child_memory_kib(s["pid"]) for s in sandboxes if os.path.exists(f"/proc/{s['pid']}")]
        if mem:
            rows.append(("host memory per idle child (private dirty + page tables)",
                         f"{statistics.mean(mem):.0f} KiB mean, {max(mem)} KiB max"))

        t0 = time.monotonic()
        forkctl(args.build, env, "kill", *[s["id"] for s in sandboxes])
        rows.append((f"terminate {len(sandboxes)}", f"{(time.monotonic() - t0) * 1000:.0f} ms"))
        forkctl(args.build, env, "snapshot", "rm", "demo")
    finally:
        if not args.keep:
            subprocess.run(stack_cmd + ["down", "--state-dir", STATE], env=env, capture_output=True)

    width = max(len(k) for k, _ in rows)
    print()
    if EMULATED:
        print("EMULATED figures (TCG test host, not real KVM): correctness, not speed")
    print(f"{'what'.ljust(width)}  {'measured (emulated)' if EMULATED else 'measured'}")
    print(f"{'-' * width}  {'-' * 24}")
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")
    if answered != len(sandboxes):
        die(f"only {answered} of {len(sandboxes)} sandboxes answered")


if __name__ == "__main__":
    main()
