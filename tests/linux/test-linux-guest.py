#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The Linux guest on real KVM, through the whole stack (TAP).

Runs inside the test host (tests/host-vm/run), where /dev/kvm is real (nested SVM
under QEMU TCG), systemd is PID 1 and the system bus and polkitd run:

  tools/forkd-stack up        forkd on the system bus, forkd-rest, the Linux image
  POST /v1/snapshots          forkd's REST API v1 example request (no memory field;
                              boot_wait_secs longer for TCG): boot Debian's cloud
                              kernel to forkd-agent, snapshot it
  forkctl fork -n 3           three children from the template, each in a systemd scope

then each capability's part, in this order, on that one stack:

  linux-boot-fork.py    the boot and the fork above, each child's agent, isolation,
                        clocks, timeouts, memory limits, run_code, diff, merge, files
  linux-branch.py       fork and branch of a running sandbox
  linux-smp.py          a 2-vCPU snapshot: nproc in its children, a thread counting
                        on each CPU through a branch and a fork of a running sandbox
  linux-processes.py    background processes over D-Bus and forkctl: output followed
                        live, stdin, signals, a counter through a fork into 3
  linux-processes-rest.py
                        the same over forkd-rest: NDJSON output followed live and
                        at an offset, stdin, signals, the WebSocket terminal, exec
                        with "stream"
  linux-lifecycle.py    pause, resume, deadlines, idempotency, kill -9 of forkd
  linux-branch.py       the errors of branch and fork with something in flight
  linux-chain-pack.py   diff-snapshot chains, compact, pack and unpack, push and pull
  linux-boot-fork.py    a boot in 64 MiB that triple-faults
  linux-image.py        snapshots of OCI images (docker-archive, OCI layout) of a
                        Python image made from the Linux image's tree
  linux-net.py          networking: NICs, namespaces, exposed ports, cleanup
  linux-sdk.py          sdk/python/tests/test-sdk.py with the Linux guest

The parts before linux-net.py use the boot snapshot TAG (linux-chain-pack.py removes
it at its end): when the boot or the first fork fails, they do not run. Shared code
is tests/lib/linuxguest.py (PYTHONPATH: tests/lib). Timings are printed as TAP
comments: they are TCG figures (every instruction emulated, ~100 us a VM exit), not
the product's speed.

Usage: test-linux-guest.py --build DIR --image DIR [--parts NAME,...]

--parts (or $FORKD_LINUX_PARTS) runs only the parts named, after the boot and the
first fork, which always run: branch, smp, processes, processes-rest, lifecycle, branch-errors,
chain-pack, triple-fault, image, net, sdk. Everything runs without it.
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import time
import traceback

from linuxguest import LinuxStack, dump_logs
from tap import Tap

HERE = os.path.dirname(os.path.abspath(__file__))
# The parts --parts can choose, by their names in the TAP comments.
PARTS = {"fork and branch of a running sandbox": "branch", "two vCPUs": "smp", "pause and resume": "lifecycle",
         "branch and fork errors": "branch-errors", "chains and pack": "chain-pack", "triple fault": "triple-fault",
         "images": "image", "networking": "net", "sdk": "sdk", "processes": "processes",
         "processes over REST": "processes-rest"}


def part(name):
    """tests/linux/linux-NAME.py as a module."""
    spec = importlib.util.spec_from_file_location(f"linux_{name.replace('-', '_')}",
                                                  os.path.join(HERE, f"linux-{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--parts", default=os.environ.get("FORKD_LINUX_PARTS", ""))
    args = ap.parse_args()
    only = {x for x in args.parts.split(",") if x}
    unknown = only - set(PARTS.values())
    if unknown:
        ap.error(f"unknown parts {', '.join(sorted(unknown))} (parts: {', '.join(PARTS.values())})")
    top = os.path.dirname(os.path.dirname(HERE))
    build = os.path.abspath(args.build)
    boot, branch, lifecycle, chain_pack, image, net, sdk, smp, processes, processes_rest = (
        part(n) for n in ("boot-fork", "branch", "lifecycle", "chain-pack", "image", "net", "sdk", "smp",
                          "processes", "processes-rest"))
    t = Tap()

    t0 = time.monotonic()
    g = LinuxStack(t, top, build, args.image)
    fc, stack, state = g.fc, g.stack, g.state
    print(f"# part: the stack up, {time.monotonic() - t0:.0f} s", flush=True)

    def timed(name, fn, *a):
        """fn(*a), then a TAP comment with the part's wall time (under TCG: not the product's speed).
        A part that --parts leaves out is not run, and says so."""
        key = PARTS.get(name)
        if only and key and key not in only:
            print(f"# part: {name}, not run (--parts)", flush=True)
            return None
        start = time.monotonic()
        try:
            return fn(*a)
        finally:
            print(f"# part: {name}, {time.monotonic() - start:.0f} s", flush=True)
    try:
        body = timed("boot and fork", boot.boot_and_fork, t, fc, stack, args.image, state)
        if body is not None:
            timed("fork and branch of a running sandbox", branch.fork_and_branch_running, t, stack)
            timed("two vCPUs", smp.smp_linux, t, stack, body)
            timed("processes", processes.processes, t, fc, stack)
            timed("processes over REST", processes_rest.processes_rest, t, stack)
            timed("pause and resume", lifecycle.pause_resume_linux, t, stack, g.restart, state)
            timed("branch and fork errors", branch.branch_and_fork_errors, t, fc, stack, g.restart)
            timed("chains and pack", chain_pack.chains, t, fc, stack, state)  # ends with rm --cascade of TAG
            timed("triple fault", boot.triple_fault, t, stack, body)
        timed("images", image.images, t, fc, stack, build, args.image, state)
        timed("networking", net.networking, t, fc, stack, g.restart, state)
        timed("sdk", sdk.sdk_python, t, top, stack, args.image, g.env)
    except Exception:
        t.ok(False, "the test ran to its end", traceback.format_exc())
    finally:
        if t.failed:
            dump_logs(t, state)
        g.down()
        leftovers = subprocess.run(["pgrep", "-f", "forkd-vmm"], capture_output=True, text=True).stdout.split()
        t.ok(not leftovers, "forkd-stack down leaves no forkd-vmm behind", leftovers)
        print(f"# part: all, {time.monotonic() - t0:.0f} s", flush=True)
    sys.exit(t.done())


if __name__ == "__main__":
    main()
