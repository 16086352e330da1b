# SPDX-License-Identifier: LGPL-2.1-or-later
"""Several vCPUs in the Linux guest (part of test-linux-guest.py): a snapshot of
2 vCPUs (POST /v1/snapshots "vcpus": 2) forks 3 children that each see 2 CPUs
(nproc, os.sched_getaffinity); a running 2-vCPU sandbox with a thread pinned to
each CPU, counting, is branched and forked, and in every child both threads go on
counting."""
import json
import time

from linuxguest import rest

VCPUS = 2
# A thread pinned to each CPU, counting 20 times a second: the REPL's globals survive
# fork and branch. The threads sleep between counts: a thread that spun would keep its
# vCPU busy in every child for the rest of the test, and under TCG the test host's one
# CPU runs all of them.
START_COUNTERS = ("import os, threading, time\n"
                  "counts = [0] * os.cpu_count()\n"
                  "def spin(i):\n"
                  "    os.sched_setaffinity(0, {i})\n"
                  "    while True:\n"
                  "        counts[i] += 1\n"
                  "        time.sleep(0.05)\n"
                  "workers = [threading.Thread(target=spin, args=(i,), daemon=True) for i in range(os.cpu_count())]\n"
                  "for w in workers: w.start()\n")
SHOW_COUNTERS = "import json\nprint(json.dumps([counts, [w.is_alive() for w in workers]]))"


def smp_linux(t, stack, body):
    """body: the boot snapshot's request, whose kernel and root disk the 2-vCPU one reuses."""
    def run(sid, code):
        status, r = rest(stack, "POST", f"/v1/sandboxes/{sid}/run_code", {"code": code})
        return r.get("stdout") if status == 200 and isinstance(r, dict) and r.get("exit_code") == 0 else None

    def fork(tag, n):
        status, sbs = rest(stack, "POST", "/v1/sandboxes", {"snapshot_tag": tag, "n": n})
        return [s["id"] for s in sbs] if status == 201 and isinstance(sbs, list) else []

    def counting(sid):
        """Whether a thread counts on each CPU: every counter grows past its first
        reading (read again until it has, for up to 60 s)."""
        first = run(sid, SHOW_COUNTERS)
        if not first:
            return False
        c0, alive = json.loads(first)
        if len(c0) != VCPUS or not all(alive):
            return False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            later = run(sid, SHOW_COUNTERS)
            if not later:
                return False
            if all(b > a for a, b in zip(c0, json.loads(later)[0])):
                return True
            time.sleep(0.2)
        return False

    status, info = rest(stack, "POST", "/v1/snapshots", dict(body, tag="smp2", vcpus=VCPUS))
    if not t.ok(status == 201 and isinstance(info, dict) and info.get("vcpus") == VCPUS,
                "POST /v1/snapshots with \"vcpus\": 2: 201, SnapshotInfo vcpus 2", f"{status} {info}"):
        return
    kids = fork("smp2", 3)
    seen = {k: run(k, "import os\nprint(os.cpu_count(), len(os.sched_getaffinity(0)))") for k in kids}
    seen.update({k + " nproc": run(k, "import subprocess\nprint(subprocess.run(['nproc'], capture_output=True, "
                                      "text=True).stdout.strip())") for k in kids})
    t.ok(len(kids) == 3 and all(v in ("2 2\n", "2\n") for v in seen.values()),
         "3 children of the 2-vCPU snapshot: nproc 2, os.cpu_count() 2, sched_getaffinity of 2", seen)

    parent = kids[0]
    t.ok(run(parent, START_COUNTERS) is not None and counting(parent),
         "a thread pinned to each of the 2 CPUs counts in the running sandbox")
    status, info = rest(stack, "POST", f"/v1/sandboxes/{parent}/branch", {"mode": "full", "tag": "smp2-b"})
    t.ok(status == 201 and isinstance(info, dict) and info.get("vcpus") == VCPUS,
         "branch of the running 2-vCPU sandbox: 201, vcpus 2", f"{status} {info}")
    branch_kids = fork("smp2-b", 1) if status == 201 else []
    status, r = rest(stack, "POST", f"/v1/sandboxes/{parent}/fork", {"n": 2})
    fork_kids = r.get("children", []) if status == 200 and isinstance(r, dict) else []
    moving = {k: counting(k) for k in [parent] + branch_kids + fork_kids}
    t.ok(len(branch_kids) == 1 and len(fork_kids) == 2 and all(moving.values()),
         "after a branch and a fork of the running sandbox, both threads count on in the source, "
         "the branch's child and each child of the fork", moving)
    for sid in kids + branch_kids + fork_kids:
        rest(stack, "DELETE", f"/v1/sandboxes/{sid}")
    for tag in ("smp2-b", "smp2"):
        rest(stack, "DELETE", f"/v1/snapshots/{tag}")
