# SPDX-License-Identifier: LGPL-2.1-or-later
"""cpu_limit as the kernel holds it, for the tests and benchmarks that check it:
cgroup v2's cpu.max in a sandbox's cgroup under forkd's root, or, on cgroup v1,
cpu.cfs_quota_us in the sandbox's cgroup of the cpu hierarchy, which forkd's
cgroupfs backend makes beside the memory one (the same path under the cpu mount)."""

import os

V1_MEMORY = "/sys/fs/cgroup/memory/"
V1_CPU = "/sys/fs/cgroup/cpu/"


def cpu_root(cgroot):
    """cgroup v1: forkd's directory of sandbox cgroups in the cpu hierarchy for its
    --cgroup-root cgroot in the memory one; None on v2 or without a cpu hierarchy."""
    if not cgroot or not cgroot.startswith(V1_MEMORY) or not os.path.exists(V1_CPU + "cpu.cfs_quota_us"):
        return None
    return V1_CPU + cgroot[len(V1_MEMORY):]


def _read(*path):
    with open(os.path.join(*path)) as f:
        return f.read()


def cpu_max(cgroot, sid):
    """The sandbox's cpu limit as v2's cpu.max says it: [quota or "max", period]."""
    cpu = cpu_root(cgroot)
    if not cpu:
        return _read(cgroot, sid, "cpu.max").split()
    quota = _read(cpu, sid, "cpu.cfs_quota_us").strip()
    return ["max" if quota == "-1" else quota, _read(cpu, sid, "cpu.cfs_period_us").strip()]


def cpu_usec(cgroot, sid, pid):
    """The CPU time the sandbox used: v2 its cgroup's usage_usec, v1 its VMM pid's
    threads' (utime and stime of /proc/PID/stat; v1's cpu cgroup has no usage)."""
    if not cpu_root(cgroot):
        for line in _read(cgroot, sid, "cpu.stat").splitlines():
            k, v = line.split()
            if k == "usage_usec":
                return int(v)
        raise AssertionError("no usage_usec in cpu.stat")
    fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000000 // os.sysconf("SC_CLK_TCK")
