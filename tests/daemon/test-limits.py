#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
cpu_limit, disk_rate and net_rate end to end: a private dbus-daemon, forkd
with a cgroupfs tree of the test's own, forkd-vmm on /dev/kvm and the test
guest (the harness of test-forkd.py).

A fork with each limit: SandboxInfo shows it, cpu_limit is the sandbox's
cgroup's cpu.max (cgroup v2) or cpu.cfs_quota_us and cpu.cfs_period_us in
its cgroup of the cpu hierarchy (v1, with FORKD_TEST_CGROUP=v1: skipped
where this machine has no v1 memory and cpu hierarchies); SetSandboxLimits (and the sandbox object's SetLimits)
changes them live; a bad value is InvalidArgs naming the field and changes
nothing; cpu_limit on a sandbox without a cgroup of its own is NotSupported.
Throttling itself, with generous bounds ("throttled at all"): the guest's
run_code "disk_write N" takes at least the time disk_rate allows for it, and
"spin MS" under cpu_limit uses less CPU time (v2: cpu.stat usage_usec; v1:
the VMM's utime and stime in /proc/PID/stat) than
wall time; SandboxInfo's usage says so too (throttled_usec "disk" and "cpu"
rise).

Environment: FORKD, FORKD_VMM, FORKD_TEST_GUEST.
"""

import importlib.util
import json
import os
import sys
import time

import cgroupcpu

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tf = load("test_forkd", "test-forkd.py")
INVALID = tf.INVALID_ARGS
NOT_SUPPORTED = "org.forkd.Error.NotSupported"


def rate(**kw):
    return ("a{st}", kw)


def main():
    return tf.run_on_harness(run, "cgroups, the system-bus policy")


def kernel_thread(pid):
    """Whether pid is a kernel thread (kthreadd's child)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.split() == ["PPid:", "2"] for line in f)
    except FileNotFoundError:
        return False


def cg_file(h, sid, name, root=None):
    with open(os.path.join(root or h.cgroot, sid, name)) as f:
        return f.read()


def cpu_max(h, sid):
    return cgroupcpu.cpu_max(h.cgroot, sid)


def cpu_procs(h, sid):
    """The processes of the sandbox's cgroup that holds its cpu limit."""
    return cg_file(h, sid, "cgroup.procs", h.cpu_cgroot()).split()


def run(h):
    disk = os.path.join(h.tmp, "disk.img")
    with open(disk, "wb") as f:
        f.truncate(64 << 20)
    h.setup_cgroups()
    v1 = os.environ.get("FORKD_TEST_CGROUP") == "v1"
    if v1 and not h.cpu_cgroot():
        print("1..0 # SKIP this machine has no cgroup v1 memory and cpu hierarchies (test-limits tries v2's)")
        return 0
    h.start_bus()
    h.start_forkd()
    v2 = bool(h.cgroot) and not h.cgroot.startswith("/sys/fs/cgroup/memory/")
    ctx = {}

    def throttled(sid):
        return h.m("GetSandbox", "s", [sid])[0]["usage"]["throttled_usec"]

    def run_code(sid, code, timeout=120):
        out = json.loads(h.m("RunCode", "ssu", [sid, code, timeout], timeout=timeout + 30)[0])
        assert not out.get("error"), out
        return out

    def setup():
        h.m("CreateSnapshot", "sssuu", ["base", tf.GUEST, disk, 64, 30])
    h.check("a snapshot of the test guest", setup)

    def fork_with_limits():
        if not v2 and not v1:
            raise AssertionError("no cgroup v2 tree of the test's own: cpu_limit needs one here")
        kids = h.fork("base", 2, {"cpu_limit": ("d", 0.5),
                                  "disk_rate": rate(bandwidth=1 << 20, ops=1000),
                                  "net_rate": rate(bandwidth=1 << 20, burst=2 << 20)})
        for k in kids:
            assert k["cpu_limit"] == 0.5, k
            assert k["disk_rate"] == {"bandwidth": 1 << 20, "ops": 1000}, k
            assert k["net_rate"] == {"bandwidth": 1 << 20, "burst": 2 << 20}, k
            assert cpu_max(h, k["id"]) == ["50000", "100000"], k
            # the VMM, and KVM's own kernel threads for its VM (kvm-nx-lpage-recovery), which join it
            procs = [q for q in cpu_procs(h, k["id"]) if not kernel_thread(q)]
            assert procs == [str(k["pid"])], (procs, k)
            assert json.loads(h.m("Ping", "s", [k["id"]])[0])["pong"]
        got = h.m("GetSandbox", "s", [kids[0]["id"]])[0]
        assert got["cpu_limit"] == 0.5 and got["disk_rate"]["bandwidth"] == 1 << 20, got
        ctx["kids"] = kids
    h.check("Fork with cpu_limit, disk_rate, net_rate: SandboxInfo shows them, cpu.max is 50000 100000, "
            "each child in its cgroup", fork_with_limits)

    def set_limits_live():
        sid = ctx["kids"][0]["id"]
        info = h.m("SetSandboxLimits", "sa{sv}", [sid, {"cpu_limit": ("d", 0.25)}])[0]
        assert info["cpu_limit"] == 0.25, info
        assert cpu_max(h, sid) == ["25000", "100000"]
        # sd_bus_path_encode(): every byte but [A-Za-z0-9] as _xx
        path = "/org/forkd/sandbox/" + "".join(ch if ch.isalnum() else f"_{ord(ch):02x}" for ch in sid)
        info = h.bus.call(tf.DEST, path, "org.forkd.Sandbox", "SetLimits", "a{sv}",
                          [{"disk_rate": rate(bandwidth=8 << 20), "net_rate": rate(bandwidth=0)}])[0]
        assert info["disk_rate"] == {"bandwidth": 8 << 20} and "net_rate" not in info, info
        info = h.m("SetSandboxLimits", "sa{sv}", [sid, {"cpu_limit": ("d", 0.0)}])[0]
        assert "cpu_limit" not in info, info
        assert cpu_max(h, sid)[0] == "max"
        h.m("SetSandboxLimits", "sa{sv}", [sid, {"cpu_limit": ("d", 1.0)}])
        assert cpu_max(h, sid) == ["100000", "100000"]
        assert json.loads(h.m("Ping", "s", [sid])[0])["pong"]
    h.check("SetSandboxLimits and the object's SetLimits change cpu.max and the rates live; 0 removes them",
            set_limits_live)

    def refused():
        sid = ctx["kids"][1]["id"]
        before = h.m("GetSandbox", "s", [sid])[0]
        for limits, field in (({"cpu_limit": ("d", 0.001)}, "cpu_limit"),
                              ({"cpu_limit": ("d", 2.0)}, "cpu_limit must be a number between 0.01 and 1"),
                              ({"cpu_limit": ("d", 0.3), "disk_rate": rate(bandwidth=100)}, "disk_rate.bandwidth"),
                              ({"net_rate": rate(ops=10**8)}, "net_rate.ops"),
                              ({"disk_rate": rate(burst=4096)}, "disk_rate.burst needs disk_rate.bandwidth"),
                              ({"disk_rate": rate()}, "disk_rate needs at least one"),
                              ({"disk_rate": rate(speed=1)}, "disk_rate takes only"),
                              ({"cpu_limit": ("u", 1)}, "cpu_limit"),
                              ({"memory_limit_mib": ("u", 1)}, "memory_limit_mib"),
                              ({"colour": ("s", "red")}, "Unknown limit"),
                              ({}, "No limit given")):
            msg = h.expect_error(INVALID, "SetSandboxLimits", "sa{sv}", [sid, limits])
            assert field in msg, (limits, msg)
        after = h.m("GetSandbox", "s", [sid])[0]
        assert {k: after.get(k) for k in ("cpu_limit", "disk_rate", "net_rate")} == \
               {k: before.get(k) for k in ("cpu_limit", "disk_rate", "net_rate")}, (before, after)
        assert cpu_max(h, sid) == ["50000", "100000"]
        h.expect_error("org.forkd.Error.NoSuchSandbox", "SetSandboxLimits", "sa{sv}",
                       ["sb-000000-0000", {"cpu_limit": ("d", 0.5)}])
        # Fork's checks: the snapshot has one vCPU
        msg = h.expect_error(INVALID, "Fork", "sua{sv}", ["base", 1, {"cpu_limit": ("d", 1.5)}])
        assert "cpu_limit must be a number between 0.01 and 1" in msg, msg
        msg = h.expect_error(INVALID, "Fork", "sua{sv}", ["base", 1, {"net_rate": rate(ops=0, bandwidth=1)}])
        assert "net_rate.bandwidth" in msg, msg
    h.check("bad values are InvalidArgs naming the field, and change nothing", refused)

    def no_cgroup():
        plain = h.fork("base", 1, {"disk_rate": rate(ops=50)})[0]
        assert plain["disk_rate"] == {"ops": 50} and "cpu_limit" not in plain, plain
        assert plain["id"] not in h.cgroup_children()
        msg = h.expect_error(NOT_SUPPORTED, "SetSandboxLimits", "sa{sv}", [plain["id"], {"cpu_limit": ("d", 0.5)}])
        assert "no cgroup of its own" in msg, msg
        info = h.m("SetSandboxLimits", "sa{sv}", [plain["id"], {"disk_rate": rate(ops=500)}])[0]
        assert info["disk_rate"] == {"ops": 500}, info
        ctx["plain"] = plain
    h.check("a sandbox without a cgroup of its own: its rates change, cpu_limit is NotSupported", no_cgroup)

    def disk_throttled():
        sid = ctx["plain"]["id"]
        # 256 requests of 4 KiB at 32 ops/s (the bucket holds 32): at least 7 s
        h.m("SetSandboxLimits", "sa{sv}", [sid, {"disk_rate": rate(ops=32)}])
        before = throttled(sid).get("disk", 0)
        t0 = time.monotonic()
        run_code(sid, "disk_write 256")
        slow = time.monotonic() - t0
        assert slow >= 6.0, f"256 writes at 32 ops/s took {slow:.2f}s"
        waited = (throttled(sid)["disk"] - before) / 1e6
        assert waited >= 3.0, f"usage says the writes waited {waited:.2f}s for disk_rate"
        # bandwidth: 2 MiB at 512 KiB/s (the bucket holds 512 KiB): at least 3 s
        h.m("SetSandboxLimits", "sa{sv}", [sid, {"disk_rate": rate(bandwidth=512 << 10)}])
        t0 = time.monotonic()
        run_code(sid, "disk_write 512")
        slow = time.monotonic() - t0
        assert slow >= 2.5, f"2 MiB at 512 KiB/s took {slow:.2f}s"
        # lifted: the same writes wait for no token (the throttled time stays where it was)
        h.m("SetSandboxLimits", "sa{sv}", [sid, {"disk_rate": rate(bandwidth=0)}])
        before = throttled(sid)["disk"]
        run_code(sid, "disk_write 256")
        after = throttled(sid)["disk"]
        assert after == before, f"writes without disk_rate waited {(after - before) / 1e6:.2f}s"
    h.check("disk_rate holds the guest's writes back (ops and bandwidth), and lets go once removed",
            disk_throttled)

    def cpu_throttled():
        sid = ctx["kids"][1]["id"]  # cpu_limit 0.5
        h.m("SetSandboxLimits", "sa{sv}", [sid, {"cpu_limit": ("d", 0.2)}])

        def usage():
            return cgroupcpu.cpu_usec(h.cgroot, sid, ctx["kids"][1]["pid"])
        u0, t0, th0 = usage(), time.monotonic(), throttled(sid).get("cpu", 0)
        # 3 s by the guest's clock, which under TCG can run ahead of ours: spin again
        # until 2.5 s of our wall time have passed (at most 5 times).
        for _ in range(5):
            run_code(sid, "spin 3000")
            if time.monotonic() - t0 >= 2.5:
                break
        used = (usage() - u0) / 1e6
        wall = time.monotonic() - t0
        assert wall >= 2.5 and used < 0.7 * wall, f"spun {wall:.2f}s of wall time on {used:.2f}s of CPU"
        th1 = throttled(sid).get("cpu", 0)
        assert th1 > th0, f"usage's throttled_usec cpu did not rise: {th0} -> {th1}"
    h.check("cpu_limit holds a spinning guest below its wall time (cpu.stat)", cpu_throttled)

    def pause_resume_keeps():
        sid = ctx["kids"][1]["id"]
        info = h.m("PauseSandbox", "s", [sid], timeout=120)[0]
        assert info["cpu_limit"] == 0.2 and info["disk_rate"]["bandwidth"] == 1 << 20, info
        info = h.m("SetSandboxLimits", "sa{sv}", [sid, {"cpu_limit": ("d", 0.75)}])[0]
        assert info["cpu_limit"] == 0.75 and info["status"] == "paused", info
        info = h.m("ResumeSandbox", "s", [sid], timeout=120)[0]
        assert info["cpu_limit"] == 0.75 and info["disk_rate"]["bandwidth"] == 1 << 20, info
        assert cpu_max(h, sid) == ["75000", "100000"]
        kids, _ = h.m("ForkSandboxEx", "sua{sv}", [sid, 1, {"disk_rate": rate(ops=5)}], timeout=120)
        assert kids[0]["cpu_limit"] == 0.75 and kids[0]["disk_rate"] == {"ops": 5}, kids
    h.check("pause keeps the limits, SetSandboxLimits changes a paused one's, resume and ForkSandboxEx apply them",
            pause_resume_keeps)

    h.terminate_all()
    h.check("no sanitizer report from forkd", h.assert_no_sanitizer_report)
    print(f"1..{h.n}", flush=True)
    return 1 if h.failed else 0


if __name__ == "__main__":
    sys.exit(main())
