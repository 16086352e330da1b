#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
bench/fork on the product path: fork N children of the test guest through the
stack a user talks to, against the engine alone, in one run, taking turns
(--rounds R, default 5, the order rotated each round); medians over rounds.

  engine   forkd-vmm alone: bench/fork-bench --json, a process per round
           (its own cold boot and snapshot; the template's start is not timed)
  dbus     forkd's Fork(tag, N, {}) over the bus from bench/dbus-fork, a C
           client (sd-bus) connected first, timed until it read the whole reply,
           which comes once every child's agent answered; then TerminateSandbox
           for every id, sent at once on one connection, until every VMM
           process has exited
  rest     forkd-rest's POST /v1/sandboxes {snapshot_tag, n}, answered once every
           child answered; then DELETE /v1/sandboxes/:id, 16 connections at once,
           until every VMM process has exited
  net      (--network) Fork of a snapshot made with a NIC, network "egress": a
           namespace per child with its tap, veth and nft rules, taken from
           forkd's pool (forkd --netns-pool P, --netns-pool, default N; 0: no
           pool, forkd makes them in the fork); against the dbus fork of the same
           guest without NIC (no namespace), "nonet". With a pool, every round
           starts once it is full (so that no refill overlaps a timed fork), and
           the net round reads its memory once it is full again: the N namespaces
           made to replace those the fork took count as the fork's
  limit    (--memory-limit-mib M) Fork with memory_limit_mib M: a cgroup (or a
           systemd scope) per child; against the dbus fork without, "nolimit"
  vol      (--volumes) Fork of a snapshot made with one ro and one cow volume
           (VOLUME_MIB MiB ext4 files, made with mke2fs): each child reads the ro
           one shared and gets a private copy-on-write layer of the cow one;
           against the dbus fork of the same guest without volumes, "novol"

--list-usage: after each dbus fork of N (before its children are terminated),
GET /v1/sandboxes (every sandbox with its "usage": a few small /proc and cgroup
reads each in forkd) and GET /v1/sandboxes?usage=false (ListSandboxesEx without
it), LIST_REPEATS times each, alternating, each timed to the last byte of its
body (the client's JSON parsing left out); list_usage_ms and list_nousage_ms
are the medians, list_usage_ratio the one over the other.

nonet, nolimit and novol are the dbus measurement (the same call), run once a round.
Before the timed rounds (--guest test): sync(2) and a settling pause, then
--warmup W rounds (default 1) of every mode, untimed: the first round ran
slowest on every path (the kernel's caches for 100 VMs, the template's first
fork of that size), which a steady state, the targets' "warm template", is not.
The stack is its own: tools/forkd-stack up (FORKD_STACK_GUEST=test) in a
temporary state directory (its sandbox records on a tmpfs, as the unit's are in
/run/forkd), stopped on exit, error and signal. Every snapshot
boots the test guest with --mem-mib (as the engine's), and each is forked once
before the rounds so that its template is running, as the engine's is when
its clock starts.

Every fork measurement also gives host_kib_per_child: the drop in MemAvailable
plus the growth of Slab and PageTables (/proc/meminfo), read before the fork
and after it answered, each time 1 s later and with every CPU's free page
lists filled first (prime_page_lists()), divided by N. forkd_cpu_ms_per_child: forkd's
utime+stime (/proc/PID/stat) across the dbus Fork calls, per child.

--guest linux (--image DIR, the tools/mkimage Linux guest: python3 and numpy,
forkd-agent as PID 1) measures the D-Bus path with that guest instead, R rounds
(default 2) taking turns between:

  dbus     Fork(tag, N) as above (default N = 10), then per_child_kib, each
           child VMM's Private_Dirty + page tables (as fork-bench.c), and
           host_kib_per_child; then Eval "numpy.arange(1000).sum()" in every
           child at once (each answer checked: 499500) and both figures again
           (*_after_eval; the host figure still from the reading before the
           fork); then TerminateSandbox for every child
  boot     a cold boot: forkd-vmm boot of the same kernel, initramfs, root disk
           and memory as CreateSnapshot boots (its default command line, the
           agent on a socket pair, unconfined), timed from the process's start
           until the agent answered ping (after its "ready" event, as forkd
           waits), then killed

and reports ready_ratio_to_cold_boot, ready_ms / cold_boot_ms. Its stack takes
the image as its default guest (FORKD_GUEST_IMAGE), which needs real KVM.

With --json the last line of stdout is one JSON object. Needs root and a
usable /dev/kvm; bench/fork runs it in the test host (--emulated) where there
is none.
"""

import argparse
import importlib.util
import json
import mmap
import os
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from dbusmini import Bus, DBusError  # noqa: E402 (tests/lib, on the PYTHONPATH bench/fork sets)

DEST, PATH, IFACE = "org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager"
TAG, NET_TAG, VOL_TAG = "bench", "bench-net", "bench-vol"
VOLUME_MIB = 64         # --volumes: each volume's size
LIST_REPEATS = 15       # --list-usage: GETs of each kind per round
PRIME_MIB = 64          # as fork-bench.c's PRIME_BYTES
SETTLE_S = 1.0          # as fork-bench.c's SETTLE_USEC, before either reading of /proc/meminfo
DBUS_PENDING = 100       # TerminateSandbox calls in flight on one connection
FORK_TIMEOUT_S = 300    # one Fork of up to 1000 children, under TCG too
BOOT_WAIT_S = {"test": 60, "linux": 300}  # CreateSnapshot's boot_wait_secs (Linux under TCG: tens of seconds)
EVAL_CODE, EVAL_RESULT = "numpy.arange(1000).sum()", "499500"  # --guest linux, in every child
EVAL_TIMEOUT_S = 120
EXIT_TIMEOUT_S = 120    # terminate: every VMM gone
REST_CONNECTIONS = 16
NETNS_DIRS = ("/run/netns", "/run/forkd/netns")
POLICY = "/etc/dbus-1/system.d/org.forkd.Manager.conf"


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


soak = load("soak_bench", os.path.join(TOP, "bench/soak-bench.py"))
branch = load("branch_bench", os.path.join(TOP, "bench/branch-bench.py"))  # child_kib(), as fork-bench.c's
agent_check = load("agent_check", os.path.join(TOP, "tests/guest/agent-check.py"))


def prime_page_lists():
    """Fill the free page lists of every CPU we may run on: PRIME_MIB touched and freed on each.
    The kernel keeps freed pages in per-CPU lists (tens of MiB in the test host) that MemFree,
    and so MemAvailable, does not count, and serves allocations from them first: a fork fed
    from what the last teardown left there would look free. Filled before each reading, the
    lists hold about the same each time. As fork-bench.c's prime_page_lists()."""
    cpus = os.sched_getaffinity(0)
    try:
        for cpu in sorted(cpus):
            os.sched_setaffinity(0, {cpu})
            with mmap.mmap(-1, PRIME_MIB << 20) as m:
                m.madvise(mmap.MADV_NOHUGEPAGE)  # 4 KiB pages, the lists a fork draws on
                for off in range(0, len(m), mmap.PAGESIZE):
                    m[off] = 1
    finally:
        os.sched_setaffinity(0, cpus)


def meminfo():
    prime_page_lists()
    want = {"MemAvailable:": "avail", "Slab:": "slab", "PageTables:": "pagetables"}
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k = line.split()
            if k[0] in want:
                out[want[k[0]]] = int(k[1])
    return out


def settled_meminfo():
    """meminfo() once memory has settled: SETTLE_S from now (a teardown frees late; children
    fault in their first pages after they answered), as fork-bench.c does."""
    time.sleep(SETTLE_S)
    return meminfo()


def host_memory(before, after, n):
    """KiB per child: the drop in MemAvailable plus the growth of Slab and PageTables, and the three parts."""
    parts = {"avail_drop": (before["avail"] - after["avail"]) / n, "slab": (after["slab"] - before["slab"]) / n,
             "pagetables": (after["pagetables"] - before["pagetables"]) / n}
    return sum(parts.values()), parts


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def await_exit(pids, timeout):
    """Wait until every process in pids has exited (a zombie has): pidfds, bounded."""
    poll, fds = select.poll(), {}
    try:
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            fds[fd] = pid
            poll.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while fds:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(fds)} VMM processes still run after {timeout} s: {sorted(fds.values())}")
            for fd, _ in poll.poll(left * 1000):
                poll.unregister(fd)
                os.close(fd)
                del fds[fd]
    finally:
        for fd in fds:
            os.close(fd)


def netns_names():
    return {f"{d}/{x}" for d in NETNS_DIRS if os.path.isdir(d) for x in os.listdir(d) if x.startswith("forkd-child-")}


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def median(xs):
    return statistics.median(xs) if xs else None


class DeferSignals:
    """Hold SIGINT, SIGTERM and SIGHUP while the stack starts or stops, and act on them
    afterwards: tools/forkd-stack killed halfway would leave what it started unrecorded."""

    def __enter__(self):
        self.got = []
        self.old = {sig: signal.signal(sig, lambda n, _: self.got.append(n))
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def __exit__(self, *exc):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)
        if self.got:
            signal.raise_signal(self.got[0])
        return False


class Stack:
    """tools/forkd-stack up in a temporary state directory; down (and a check that
    nothing of it is left) on exit, whatever ends the run."""

    def __init__(self, build, emulated, image=None, forkd_args=()):
        """image: the Linux guest's directory, the stack's default guest; else the test guest."""
        self.build, self.emulated, self.image = build, emulated, image
        self.state = tempfile.mkdtemp(prefix="forkd-bench-fork-")
        self.env = dict(os.environ, FORKD_BUILD_DIR=build, FORKD_STACK_NO_BUILD="1")
        if forkd_args:
            self.env["FORKD_STACK_FORKD_ARGS"] = " ".join(forkd_args)
        if image:
            self.env.pop("FORKD_STACK_GUEST", None)
            self.env["FORKD_GUEST_IMAGE"] = image
        else:
            self.env["FORKD_STACK_GUEST"] = "test"
        self.policy_installed = False
        self.netns_before = netns_names()

    def __enter__(self):
        try:
            with DeferSignals():
                self.up()
            return self
        except BaseException:
            # A failed or interrupted up: stop whatever it started, as on exit.
            self.__exit__(*sys.exc_info())
            raise

    def up(self):
        # In the test host (thrown away afterwards), install the bus policy as a
        # package would, so that forkd owns its name on the real system bus, next to
        # systemd: its scope backend for memory limits talks to systemd there.
        if self.emulated and os.path.isdir("/run/systemd/system") and not os.path.exists(POLICY):
            shutil.copy(os.path.join(TOP, "dbus/org.forkd.Manager.conf"), POLICY)
            self.policy_installed = True
            subprocess.run(["busctl", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                            "ReloadConfig"], capture_output=True, timeout=30)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        up = subprocess.run([os.path.join(TOP, "tools/forkd-stack"), "up", "--state-dir", self.state, "--port",
                             str(port)], env=self.env, capture_output=True, text=True, timeout=180)
        if up.returncode != 0:
            raise RuntimeError(f"tools/forkd-stack up failed: {up.stderr[-2000:]}")
        self.vars = dict(line.split("=", 1) for line in up.stdout.splitlines() if "=" in line)
        if not self.vars.get("FORKD_URL"):
            raise RuntimeError("the stack has no forkd-rest (FORKD_URL is empty)")
        if self.image and self.vars.get("FORKD_GUEST_KERNEL") != os.path.join(self.image, "vmlinuz"):
            raise RuntimeError(f"the stack's guest is {self.vars.get('FORKD_GUEST_KERNEL')}, not the Linux image "
                               f"{self.image} (the Linux guest needs real KVM, not PVM)")
        with open(os.path.join(self.state, "forkd.pid")) as f:
            self.forkd_pid = int(f.read().split()[0])
        with open(self.vars["FORKD_TOKEN_FILE"]) as f:
            self.token = f.read().strip()
        return self

    def log(self):
        with open(os.path.join(self.state, "forkd.log"), errors="replace") as f:
            return f.read()

    def netns_ms(self):
        """How long forkd took to have the namespaces of its last fork, and how many of them it took
        from its pool, as it logged it: (ms, taken)."""
        made = re.findall(r"Made \d+ network namespace\(s\) in (\d+) ms(?:, (\d+) of them taken)?", self.log())
        return (int(made[-1][0]), int(made[-1][1] or 0)) if made else (None, None)

    def fork_stages(self):
        """forkd's own breakdown of its last answered fork, as it logged it: {stage: ms}, "total" too."""
        lines = re.findall(r"Forked \d+ sandbox\(es\) of .* in ([\d.]+) ms:(.*) \(ms[;)]", self.log())
        if not lines:
            return None
        total, parts = lines[-1]
        stages = {name.strip(): float(ms) for name, ms in (p.strip().rsplit(" ", 1) for p in parts.split(","))}
        stages["total"] = float(total)
        return stages

    def cgroup_backend(self):
        """What forkd said at start: "Memory limits: cgroupfs v2 under ...", "... systemd-scope (...)"."""
        log = self.log()
        m = re.search(r"Memory limits: (cgroupfs|systemd-scope|none)", log)
        return m.group(1) if m else ("none" if "Memory limits are not available" in log else "unknown")

    def __exit__(self, *exc):
        with DeferSignals():
            self.down(exc[0] is None)
        return False

    def down(self, clean):
        subprocess.run([os.path.join(TOP, "tools/forkd-stack"), "down", "--state-dir", self.state], env=self.env,
                       capture_output=True, timeout=120)
        if self.policy_installed:
            os.unlink(POLICY)
        shutil.rmtree(self.state, ignore_errors=True)
        # forkd's stop ends every sandbox and removes their namespaces: check it did.
        vmm = os.path.join(self.build, "src/vmm/forkd-vmm")
        try:
            wait_for(lambda: not soak.vmm_processes(vmm) and not netns_names() - self.netns_before, 30,
                     "the VMMs and namespaces of the stack to go")
        except TimeoutError:
            print(f"bench/fork: left behind after the stack stopped: {soak.vmm_processes(vmm)} forkd-vmm processes, "
                  f"namespaces {sorted(netns_names() - self.netns_before)}", file=sys.stderr)
            if clean:
                raise RuntimeError("the stack left processes or namespaces behind")


def quiesce():
    """Before the rounds: what a build or a checkout left dirty is written back now, not while a
    round is timed (a clean checkout's first run, right after its build, read 1.25 for D-Bus
    where the next two read 1.10 and 1.15)."""
    os.sync()
    time.sleep(SETTLE_S)


def engine(args):
    """One round on forkd-vmm alone: bench/fork-bench --json in a process of its own."""
    b = args.build
    cmd = [f"{b}/bench/fork-bench", "--vmm", f"{b}/src/vmm/forkd-vmm", "--guest", f"{b}/tests/guest/forkd-test-guest.elf",
           "--n", str(args.n), "--mem-mib", str(args.mem_mib), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"fork-bench failed ({p.returncode}): {p.stdout[-1000:]} {p.stderr[-1000:]}")
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    return {"ready_ms": doc["ready_ms"], "host_kib_per_child": doc["host_kib_per_child"],
            "per_child_kib": doc["per_child_kib"]}


class Bench:
    def __init__(self, args, stack):
        self.args, self.stack, self.n = args, stack, args.n
        self.bus = Bus(stack.vars["FORKD_BUS_ADDRESS"], unix_fds=True)
        self.local = threading.local()
        self.api = self.rest_api()
        self.forkd_ticks = 0  # forkd's CPU across the dbus forks
        self.forkd_children = 0

    def rest_api(self):
        return soak.Api(self.stack.vars["FORKD_URL"], self.stack.token, timeout=FORK_TIMEOUT_S)

    def m(self, member, sig="", args=(), timeout=60, fds=()):
        return self.bus.call(DEST, PATH, IFACE, member, sig, args, timeout=timeout, fds=fds)

    # ---- snapshots and their templates

    def snapshots(self, network, volumes=False):
        kernel, rootfs = self.stack.vars["FORKD_GUEST_KERNEL"], self.stack.vars["FORKD_GUEST_ROOTFS"]
        wait = BOOT_WAIT_S[self.args.guest]
        t0 = time.monotonic()
        self.m("CreateSnapshot", "sssuu", [TAG, kernel, rootfs, self.args.mem_mib, wait], timeout=wait + FORK_TIMEOUT_S)
        self.snapshot_ms = (time.monotonic() - t0) * 1000
        if network:
            fds = [os.open(kernel, os.O_RDONLY | os.O_CLOEXEC), os.open(rootfs, os.O_RDONLY | os.O_CLOEXEC)]
            try:
                info = self.m("CreateSnapshotFromFds", "shhuua{sv}",
                              [NET_TAG, 0, 1, self.args.mem_mib, 60, {"network": ("b", True)}],
                              timeout=FORK_TIMEOUT_S, fds=fds)[0]
            finally:
                for fd in fds:
                    os.close(fd)
            assert info.get("network") is True, info
        if volumes:
            self.volume_snapshot(kernel, rootfs)

    def volume_snapshot(self, kernel, rootfs):
        """VOL_TAG: the same guest with one ro and one cow volume, ext4 files of VOLUME_MIB."""
        d = tempfile.mkdtemp(prefix="forkd-bench-vol.")
        fds = [os.open(kernel, os.O_RDONLY | os.O_CLOEXEC), os.open(rootfs, os.O_RDONLY | os.O_CLOEXEC)]
        try:
            for name in ("ro", "cow"):
                path = os.path.join(d, f"{name}.ext4")
                with open(path, "wb") as f:
                    f.truncate(VOLUME_MIB << 20)
                subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", path], check=True, capture_output=True)
                fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
            opts = {"volumes": ("a(hss)", [(2, "/data", "ro"), (3, "/cache", "cow")])}
            info = self.m("CreateSnapshotFromFds", "shhuua{sv}", [VOL_TAG, 0, 1, self.args.mem_mib, 60, opts],
                          timeout=FORK_TIMEOUT_S, fds=fds)[0]
        finally:
            for fd in fds:
                os.close(fd)
            shutil.rmtree(d)  # the snapshot keeps its own copies
        assert [v["mode"] for v in info.get("volumes", [])] == ["ro", "cow"], info

    def warm(self, tag, options):
        """Fork one child of tag and end it: forkd starts the snapshot's template, which stays."""
        kids = self.m("Fork", "sua{sv}", [tag, 1, options], timeout=FORK_TIMEOUT_S)[0]
        self.terminate_dbus(kids)
        self.settle(kids)

    # ---- the paths: fork N (returns the SandboxInfos), terminate them

    def fork_dbus(self, tag, options):
        """Fork over D-Bus from bench/dbus-fork, a C client (sd-bus, as forkctl's), connected
        first: (the SandboxInfos, the ms from its call until it read the whole reply)."""
        cmd = [f"{self.args.build}/bench/dbus-fork", self.stack.vars["FORKD_BUS_ADDRESS"], tag, str(self.n)]
        for key, (sig, value) in options.items():
            cmd += [f"--{sig}", f"{key}={value}"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=FORK_TIMEOUT_S)
        if p.returncode != 0:
            raise RuntimeError(f"dbus-fork failed ({p.returncode}): {p.stderr.strip()[-1000:]}")
        doc = json.loads(p.stdout)
        return doc["kids"], doc["ms"]

    def fork_plain(self):
        t0 = cpu_ticks(self.stack.forkd_pid)
        kids, ms = self.fork_dbus(TAG, {})
        self.forkd_ticks += cpu_ticks(self.stack.forkd_pid) - t0
        self.forkd_children += len(kids)
        return kids, ms

    def fork_rest(self):
        status, kids = self.api.request("POST", "/v1/sandboxes", {"snapshot_tag": TAG, "n": self.n})
        if status != 201:
            raise RuntimeError(f"POST /v1/sandboxes: HTTP {status}: {kids}")
        return kids

    def terminate_dbus(self, kids):
        # At most DBUS_PENDING calls in flight: the bus refuses more pending replies
        # on one connection (dbus-daemon's max_replies_per_connection, 128 on the
        # system bus).
        for i in range(0, len(kids), DBUS_PENDING):
            serials = [self.bus.send(DEST, PATH, IFACE, "TerminateSandbox", "s", [k["id"]])
                       for k in kids[i:i + DBUS_PENDING]]
            for serial, r in self.bus.wait_replies(serials, EXIT_TIMEOUT_S).items():
                if isinstance(r, DBusError):
                    raise RuntimeError(f"TerminateSandbox: {r.name}: {r.message}")
        await_exit([k["pid"] for k in kids], EXIT_TIMEOUT_S)

    def terminate_rest(self, kids):
        errors = []

        def delete(share):
            api = self.rest_api()
            try:
                for k in share:
                    status, r = api.request("DELETE", f"/v1/sandboxes/{k['id']}")
                    if status != 204:
                        errors.append(f"DELETE {k['id']}: HTTP {status}: {r}")
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
            finally:
                api.close()

        threads = [threading.Thread(target=delete, args=(kids[i::REST_CONNECTIONS],))
                   for i in range(min(REST_CONNECTIONS, len(kids)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(EXIT_TIMEOUT_S)
        if errors or any(t.is_alive() for t in threads):
            raise RuntimeError(f"REST terminate: {errors[:3] or 'a DELETE did not answer'}")
        await_exit([k["pid"] for k in kids], EXIT_TIMEOUT_S)

    def settle(self, kids):
        """Until forkd has forgotten the children and their namespaces are gone. With a pool, which may
        have made the same names again since, until forkd has no namespace but the pool's, and that full."""
        ids = {k["id"] for k in kids}
        wait_for(lambda: not ids & {s["id"] for s in self.m("ListSandboxes")[0]}, 60, "forkd to drop the sandboxes")
        if self.args.netns_pool and any(k.get("netns") for k in kids):
            def only_pool():
                return (self.pool_ready() == self.args.netns_pool
                        and len(netns_names() - self.stack.netns_before) == 2 * self.args.netns_pool)
            wait_for(only_pool, 60, "the namespaces to go (forkd to have only its full pool)")
            return
        netns = {f"{d}/{k['netns']}" for k in kids if "netns" in k for d in NETNS_DIRS}
        wait_for(lambda: not any(os.path.exists(p) for p in netns), 60, "the namespaces to go")

    # ---- one measurement

    def pool_ready(self):
        """forkd's egress namespaces ready in its pool (forkd --netns-pool)."""
        pool = self.bus.call(DEST, PATH, "org.freedesktop.DBus.Properties", "Get", "ss", [IFACE, "NetnsPool"])[0]
        return pool.get("egress", 0)

    def pool_full(self):
        """With forkd --netns-pool: until its egress pool is full (no refill running)."""
        if self.args.netns_pool:
            wait_for(lambda: self.pool_ready() == self.args.netns_pool, 120, "forkd's namespace pool to be full")

    def measure(self, fork, terminate, check=None, more=None, refill=False):
        """more(kids, before): further figures (a dict) once host_kib_per_child is read.
        refill: the fork took from the namespace pool; read the memory once it is full again."""
        self.pool_full()
        before = settled_meminfo()
        t0 = time.monotonic()
        kids = fork()
        ready = (time.monotonic() - t0) * 1000
        if isinstance(kids, tuple):
            kids, ready = kids  # the client's own clock (bench/dbus-fork)
        stages = self.stack.fork_stages()
        if len(kids) != self.n:
            raise RuntimeError(f"asked for {self.n} children, got {len(kids)}")
        if check:
            check(kids)
        if refill:
            self.pool_full()
        host, parts = host_memory(before, settled_meminfo(), self.n)
        r = {"ready_ms": ready, "host_kib_per_child": host, "parts": parts, "stages": stages}
        if more:
            r.update(more(kids, before))
        t0 = time.monotonic()
        terminate(kids)
        r["terminate_ms"] = (time.monotonic() - t0) * 1000
        self.settle(kids)
        return r

    def measure_net(self):
        def has_netns(kids):
            assert all(k.get("netns") for k in kids), f"a child without namespace: {kids[0]}"
        r = self.measure(lambda: self.fork_dbus(NET_TAG, {"network": ("s", "egress")}), self.terminate_dbus,
                         has_netns, refill=True)
        r["netns_ms"], r["netns_pooled"] = self.stack.netns_ms()
        return r

    def list_usage(self, kids, before):
        """--list-usage: GET /v1/sandboxes with and without each sandbox's usage, alternating."""
        ids = {k["id"] for k in kids}
        times = {True: [], False: []}
        for _ in range(LIST_REPEATS):
            for usage in (True, False):
                t0 = time.monotonic()
                status, raw = self.api.request_raw("GET", "/v1/sandboxes" + ("" if usage else "?usage=false"))
                # to the body's last byte: what forkd and forkd-rest take, not this client's JSON parser
                times[usage].append((time.monotonic() - t0) * 1000)
                body = json.loads(raw)
                if status != 200:
                    raise RuntimeError(f"GET /v1/sandboxes (usage {usage}): HTTP {status}: {body}")
                mine = [s for s in body if s["id"] in ids]
                if len(mine) != len(ids) or any(("usage" in s) != usage for s in mine):
                    raise RuntimeError(f"GET /v1/sandboxes (usage {usage}): {len(mine)} of {len(ids)} children, "
                                       f"usage {'missing' if usage else 'present'}")
        return {"list_usage_ms": median(times[True]), "list_nousage_ms": median(times[False])}

    def run(self, mode):
        if mode == "engine":
            return engine(self.args)
        if mode == "dbus":
            return self.measure(self.fork_plain, self.terminate_dbus,
                                more=self.list_usage if self.args.list_usage else None)
        if mode == "rest":
            return self.measure(self.fork_rest, self.terminate_rest)
        if mode == "net":
            return self.measure_net()
        if mode == "vol":
            def has_volumes(kids):
                infos = {i["id"]: i for i in self.m("ListSandboxes", timeout=120)[0]}
                for k in kids:
                    got = [v["mode"] for v in infos[k["id"]].get("volumes", [])]
                    assert got == ["ro", "cow"], f"{k['id']} has the volumes {got}"
            return self.measure(lambda: self.fork_dbus(VOL_TAG, {}), self.terminate_dbus, has_volumes)
        limit = self.args.memory_limit_mib

        def limited(kids):
            assert all(k.get("memory_limit_mib") == limit for k in kids), f"a child without limit: {kids[0]}"
        return self.measure(lambda: self.fork_dbus(TAG, {"memory_limit_mib": ("u", limit)}), self.terminate_dbus,
                            limited)


def vmm_kib_per_child(kids):
    """per_child_kib: the mean over the children's VMM processes of Private_Dirty + page tables."""
    return statistics.fmean(branch.child_kib(k["pid"]) for k in kids)


class AgentOnFd(agent_check.Agent):
    """agent-check.py's client on a socket we already hold (a VMM's --agent-fd)."""

    def __init__(self, sock):
        self.s, self.next_id, self.buf = sock, 1, b""


def wait_agent_ready(sock, deadline):
    """Until the agent answered ping, as forkd's fka_wait_ready(): the guest's agent drops what came
    before it opened its port and then sends a "ready" event, after which the ping goes again."""
    agent = AgentOnFd(sock)

    def ping():
        agent.send_raw(agent.frame(agent_check.REQ, agent.next_id, b'{"op":"ping"}'))
        agent.next_id += 1
        return agent.next_id - 1

    newest = ping()
    while True:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        ftype, fid, obj = agent.recv_frame()
        if ftype == agent_check.EVENT and obj.get("op") == "ready":
            newest = ping()
        elif ftype != agent_check.EVENT and fid == newest:
            if ftype != agent_check.RESP:
                raise RuntimeError(f"the cold-booted agent refused ping: {obj}")
            return


class LinuxBench(Bench):
    """--guest linux: the D-Bus fork of the Linux guest with a ping and an Eval, and a cold boot."""

    def ping_and_eval(self, kids, before):
        """Fork's reply came once every child answered ping: the VMMs' own memory now; then Eval in
        every child at once, each answer checked, and the memory figures again."""
        r = {"per_child_kib": vmm_kib_per_child(kids)}
        t0 = time.monotonic()
        serials = {self.bus.send(DEST, PATH, IFACE, "Eval", "ss", [k["id"], EVAL_CODE]): k["id"] for k in kids}
        replies = self.bus.wait_replies(list(serials), EVAL_TIMEOUT_S)
        r["eval_ms"] = (time.monotonic() - t0) * 1000
        for serial, sid in serials.items():
            reply = replies[serial]
            if isinstance(reply, DBusError):
                raise RuntimeError(f"Eval in {sid}: {reply.name}: {reply.message}")
            answer = json.loads(reply[0])
            if answer.get("result") != EVAL_RESULT:
                raise RuntimeError(f"Eval {EVAL_CODE} in {sid} answered {answer}, not {EVAL_RESULT}")
        host, parts = host_memory(before, settled_meminfo(), self.n)
        r.update(per_child_kib_after_eval=vmm_kib_per_child(kids), host_kib_per_child_after_eval=host,
                 parts_after_eval=parts)
        return r

    def cold_boot(self):
        """ms from forkd-vmm's start until the agent answered ping, booting what CreateSnapshot boots."""
        kernel, rootfs = self.stack.vars["FORKD_GUEST_KERNEL"], self.stack.vars["FORKD_GUEST_ROOTFS"]
        work = tempfile.mkdtemp(prefix="cold-boot-", dir=self.stack.state)
        console = os.path.join(work, "console.log")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cmd = [os.path.join(self.args.build, "src/vmm/forkd-vmm"), "boot", "--kernel", kernel, "--disk", rootfs,
               "--mem-mib", str(self.args.mem_mib), f"--agent-fd={theirs.fileno()}", "--id", "bench-cold-boot",
               "--console-log", console, "--overlay-dir", work]
        vmm = None
        try:
            t0 = time.monotonic()
            vmm = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            theirs.close()
            try:
                wait_agent_ready(ours, t0 + BOOT_WAIT_S["linux"])
            except (OSError, EOFError) as e:
                with open(console, errors="replace") as f:
                    tail = f.read()[-1500:]
                raise RuntimeError(f"the cold boot's agent did not answer ping ({e!r}); its console: {tail}")
            return (time.monotonic() - t0) * 1000
        finally:
            theirs.close()
            ours.close()
            if vmm:
                vmm.kill()
                vmm.wait(timeout=30)
            shutil.rmtree(work, ignore_errors=True)

    def run(self, mode):
        if mode == "boot":
            return {"cold_boot_ms": self.cold_boot()}
        return self.measure(self.fork_plain, self.terminate_dbus, more=self.ping_and_eval)


def report_linux(args, rounds, bench):
    def med(mode, key):
        return round(median([r[key] for r in rounds[mode]]), 2)

    fork = rounds["dbus"]
    doc = {"guest": "linux", "n": args.n, "rounds": args.rounds, "mem_mib": args.mem_mib, "emulated": args.emulated,
           "ready_ms": med("dbus", "ready_ms"), "cold_boot_ms": med("boot", "cold_boot_ms")}
    doc["ready_ratio_to_cold_boot"] = round(doc["ready_ms"] / doc["cold_boot_ms"], 3)
    for key in ("per_child_kib", "host_kib_per_child", "per_child_kib_after_eval", "host_kib_per_child_after_eval",
                "eval_ms", "terminate_ms"):
        doc[key] = med("dbus", key)
    doc.update(eval=EVAL_CODE, eval_result=EVAL_RESULT, snapshot_create_ms=round(bench.snapshot_ms, 1),
               first_fork_ms=round(bench.first_fork_ms, 1),
               cold_boot="forkd-vmm boot of the snapshot's kernel, initramfs, disk and memory, unconfined: "
                         "from its start until the agent answered ping")
    doc["host_memory_parts_kib_per_child"] = {
        when: {k: round(median([r[key][k] for r in fork]), 1) for k in ("avail_drop", "slab", "pagetables")}
        for when, key in (("after_ping", "parts"), ("after_eval", "parts_after_eval"))}
    for key in ("ready_ms", "host_kib_per_child", "host_kib_per_child_after_eval", "per_child_kib"):
        doc[f"rounds_{key}"] = [round(r[key], 1) for r in fork]
    doc["rounds_cold_boot_ms"] = [round(r["cold_boot_ms"], 1) for r in rounds["boot"]]

    print(f"bench/fork --guest linux: n={args.n}, mem {args.mem_mib} MiB, {args.rounds} rounds taking turns, medians")
    for key, label in (("ready_ms", f"D-Bus Fork of {args.n}, every child answered ping (ms)"),
                       ("cold_boot_ms", "cold boot to the agent's first answer (ms)"),
                       ("ready_ratio_to_cold_boot", "fork of N / cold boot"),
                       ("per_child_kib", "VMM's own memory per child after ping (KiB)"),
                       ("host_kib_per_child", "whole host per child after ping (KiB)"),
                       ("eval_ms", f"Eval {EVAL_CODE} in every child (ms)"),
                       ("per_child_kib_after_eval", "VMM's own memory per child after eval (KiB)"),
                       ("host_kib_per_child_after_eval", "whole host per child after eval (KiB)"),
                       ("terminate_ms", "terminate N, every VMM gone (ms)"),
                       ("snapshot_create_ms", "CreateSnapshot: copy, boot, snapshot (ms)"),
                       ("first_fork_ms", "first fork of 1, starting the template (ms)")):
        print(f"{label:56} {doc[key]}")
    print(f"{'rounds: fork ready (ms)':56} {doc['rounds_ready_ms']}")
    print(f"{'rounds: cold boot (ms)':56} {doc['rounds_cold_boot_ms']}")
    if args.json:
        print(json.dumps(doc, separators=(",", ":")))


def report(args, modes, rounds, bench, backend):
    def med(mode, key):
        v = median([r[key] for r in rounds[mode]]) if mode in rounds else None
        return round(v, 2) if v is not None else None

    def ratio(a, b):
        return round(a / b, 3) if a is not None and b else None

    doc = {"n": args.n, "rounds": args.rounds, "mem_mib": args.mem_mib, "paths": args.path,
           "network": args.network, "memory_limit_mib": args.memory_limit_mib, "volumes": args.volumes,
           "vmm_uid_range": args.vmm_uid_range or "default", "emulated": args.emulated}
    plain_names = [x for x, on in (("dbus", "dbus" in args.path), ("nonet", args.network),
                                   ("nolimit", bool(args.memory_limit_mib)), ("novol", args.volumes)) if on]
    for mode in modes:
        for name in (plain_names if mode == "dbus" else [mode]):
            doc[f"{name}_ready_ms"] = med(mode, "ready_ms")
            doc[f"{name}_host_kib_per_child"] = med(mode, "host_kib_per_child")
            if mode != "engine":
                doc[f"{name}_terminate_ms"] = med(mode, "terminate_ms")
    if "engine" in modes:
        doc["per_child_kib"] = med("engine", "per_child_kib")
        doc["host_kib_per_child"] = doc["engine_host_kib_per_child"]
    for name in ("dbus", "rest"):
        if name in args.path:
            doc[f"{name}_ratio"] = ratio(doc[f"{name}_ready_ms"], doc.get("engine_ready_ms"))
    if "dbus" in args.path:
        doc["forkd_cpu_ms_per_child"] = round(bench.forkd_ticks * 1000 / os.sysconf("SC_CLK_TCK")
                                              / bench.forkd_children, 3)
    if args.network:
        doc["net_ratio"] = ratio(doc["net_ready_ms"], doc["nonet_ready_ms"])
        doc["net_namespaces_ms"] = median([r["netns_ms"] for r in rounds["net"] if r["netns_ms"] is not None])
        doc["net_pool"] = args.netns_pool
        doc["net_pooled_per_fork"] = median([r["netns_pooled"] for r in rounds["net"]
                                             if r["netns_pooled"] is not None])
    if args.memory_limit_mib:
        doc["limit_ratio"] = ratio(doc["limit_ready_ms"], doc["nolimit_ready_ms"])
    if args.volumes:
        doc["vol_ratio"] = ratio(doc["vol_ready_ms"], doc["novol_ready_ms"])
    if args.list_usage:
        doc["list_usage_ms"] = med("dbus", "list_usage_ms")
        doc["list_nousage_ms"] = med("dbus", "list_nousage_ms")
        doc["list_usage_ratio"] = ratio(doc["list_usage_ms"], doc["list_nousage_ms"])
    if backend:
        doc["cgroup_backend"] = backend
    doc["host_memory_parts_kib_per_child"] = {
        m: {k: round(median([r["parts"][k] for r in rounds[m]]), 1) for k in ("avail_drop", "slab", "pagetables")}
        for m in modes if m != "engine"}
    # forkd's own breakdown (its log): per stage, the median over the rounds
    for m in modes:
        have = [r["stages"] for r in rounds[m] if r.get("stages")]
        if have:
            doc[f"{m}_stages_ms"] = {k: round(median([st.get(k, 0.0) for st in have]), 2) for k in have[0]}
    doc["rounds_ready_ms"] = {m: [round(r["ready_ms"], 2) for r in rounds[m]] for m in modes}
    doc["rounds_host_kib_per_child"] = {m: [round(r["host_kib_per_child"], 1) for r in rounds[m]] for m in modes}

    what = {"engine": "engine (forkd-vmm alone)", "dbus": "D-Bus Fork (" + ", ".join(plain_names) + ")",
            "rest": "REST POST /v1/sandboxes", "net": "D-Bus Fork, NIC, egress",
            "limit": f"D-Bus Fork, memory_limit_mib {args.memory_limit_mib}",
            "vol": "D-Bus Fork, one ro + one cow volume"}
    print(f"bench/fork: n={args.n}, mem {args.mem_mib} MiB, {args.rounds} rounds taking turns, medians")
    print(f"{'':40} {'ready ms':>10} {'term. ms':>10} {'host KiB/child':>15}  rounds (ready ms)")
    for m in modes:
        term = "" if m == "engine" else f"{med(m, 'terminate_ms'):10.1f}"
        print(f"{what[m]:40} {med(m, 'ready_ms'):10.1f} {term:>10} {med(m, 'host_kib_per_child'):15.1f}  "
              + " ".join(f"{x:.1f}" for x in doc["rounds_ready_ms"][m]))
    for key, label in (("dbus_ratio", "D-Bus / engine, time to ready"), ("rest_ratio", "REST / engine, time to ready"),
                       ("net_ratio", "namespace / none, time to ready (target <= 1.5)"),
                       ("net_namespaces_ms", "of which forkd having the namespaces (ms, its log)"),
                       ("net_pool", "forkd --netns-pool"),
                       ("net_pooled_per_fork", "namespaces a fork took from the pool (median)"),
                       ("limit_ratio", "limit / none, time to ready"),
                       ("vol_ratio", "volumes / none, time to ready (target <= 1.2)"),
                       ("list_usage_ms", f"GET /v1/sandboxes of {args.n}, with usage (ms)"),
                       ("list_nousage_ms", f"GET /v1/sandboxes of {args.n}, ?usage=false (ms)"),
                       ("list_usage_ratio", "with usage / without, GET /v1/sandboxes"),
                       ("forkd_cpu_ms_per_child", "forkd CPU per forked child (ms)"),
                       ("per_child_kib", "engine: VMM's own memory per child (KiB)"),
                       ("cgroup_backend", "forkd's memory limit backend")):
        if doc.get(key) is not None:
            print(f"{label:48} {doc[key]}")
    for m in modes:
        if doc.get(f"{m}_stages_ms"):
            print(f"forkd's stages, {what[m]} (ms, its log):")
            print("  " + ", ".join(f"{k} {v}" for k, v in doc[f"{m}_stages_ms"].items()))
    if args.json:
        print(json.dumps(doc, separators=(",", ":")))


def main():
    ap = argparse.ArgumentParser(prog="bench/fork", description="bench/fork on the product path")
    ap.add_argument("--build", required=True)
    ap.add_argument("--guest", choices=("test", "linux"), default="test")
    ap.add_argument("--image", help="the Linux guest's directory (tools/mkimage), for --guest linux")
    ap.add_argument("--n", type=int, help="default 100, 10 with --guest linux")
    ap.add_argument("--mem-mib", type=int, help="default 64, 256 with --guest linux (forkd's default)")
    ap.add_argument("--rounds", type=int, help="default 5, 2 with --guest linux")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds before them (default 1; --guest test)")
    ap.add_argument("--path", type=lambda s: s.split(","))
    ap.add_argument("--network", action="store_true")
    ap.add_argument("--memory-limit-mib", type=int, default=0)
    ap.add_argument("--volumes", action="store_true", help="fork a snapshot with one ro and one cow volume")
    ap.add_argument("--list-usage", action="store_true",
                    help="after the dbus fork of N, time GET /v1/sandboxes with usage against ?usage=false")
    ap.add_argument("--vmm-uid-range", help="forkd --vmm-uid-range for the stack's forkd ('shared': the baseline)")
    ap.add_argument("--netns-pool", type=int, help="with --network: forkd --netns-pool P (default N; 0: none)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--emulated", action="store_true", help="the figures come from the QEMU test host")
    ap.add_argument("--confine", action="store_true")
    ap.add_argument("--check-args", action="store_true", help="check the arguments and exit (bench/fork, before "
                    "it starts the test host)")
    args = ap.parse_args()
    linux = args.guest == "linux"
    if linux and (args.path or args.network or args.memory_limit_mib or args.volumes or args.confine
                  or args.list_usage):
        ap.error("--guest linux measures the D-Bus fork only: leave out --path, --network, --memory-limit-mib, "
                 "--volumes, --list-usage and --confine")
    if linux and not args.image:
        ap.error("--guest linux needs --image DIR (tools/mkimage's output)")
    defaults = {"n": (100, 10), "mem_mib": (64, 256), "rounds": (5, 2), "path": (["engine"], ["dbus"])}
    for key, values in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, values[linux])
    if set(args.path) - {"engine", "dbus", "rest"} or len(set(args.path)) != len(args.path):
        ap.error("--path takes a comma list of engine, dbus, rest, each at most once")
    if not 1 <= args.n <= 1000 or not 1 <= args.rounds <= 20 or args.memory_limit_mib < 0:
        ap.error("--n must be 1..1000, --rounds 1..20, --memory-limit-mib positive")
    if not 0 <= args.warmup <= 5:
        ap.error("--warmup must be 0..5")
    if args.netns_pool is not None and not args.network:
        ap.error("--netns-pool goes with --network")
    if args.network and args.netns_pool is None:
        args.netns_pool = args.n
    if args.netns_pool is not None and not 0 <= args.netns_pool <= 1000:
        ap.error("--netns-pool must be 0..1000")
    if args.confine:
        ap.error("--confine runs on the engine alone: leave out --path, --network and --memory-limit-mib")
    if args.check_args:
        return
    if os.geteuid() != 0:
        sys.exit("bench/fork: the product path needs root (a stack of its own, the VMMs' pidfds)")
    if args.emulated:
        print("bench/fork: EMULATED: in the QEMU test host (TCG, nested SVM): these are not forkd's speeds")
    # forkd keeps two fds per sandbox, this driver a pidfd per child while terminating.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))

    modes = [m for m, on in (("engine", "engine" in args.path),
                             ("dbus", "dbus" in args.path or args.network or args.memory_limit_mib
                              or args.volumes or args.list_usage or args.vmm_uid_range),
                             ("rest", "rest" in args.path), ("net", args.network),
                             ("limit", args.memory_limit_mib), ("vol", args.volumes), ("boot", linux)) if on]
    rounds = {m: [] for m in modes}
    backend = None
    try:
        if modes == ["engine"]:
            bench = None
            quiesce()
            for _ in range(args.warmup):
                engine(args)
            for _ in range(args.rounds):
                rounds["engine"].append(engine(args))
        else:
            forkd_args = ["--netns-pool", str(args.netns_pool)] if args.netns_pool else []
            if args.vmm_uid_range:
                forkd_args += ["--vmm-uid-range", args.vmm_uid_range]
            with Stack(args.build, args.emulated, args.image if linux else None, forkd_args) as stack:
                backend = stack.cgroup_backend()
                bench = (LinuxBench if linux else Bench)(args, stack)
                bench.snapshots(args.network, args.volumes)
                t0 = time.monotonic()
                bench.warm(TAG, {})
                bench.first_fork_ms = (time.monotonic() - t0) * 1000
                if args.network:
                    bench.warm(NET_TAG, {"network": ("s", "egress")})
                if args.volumes:
                    bench.warm(VOL_TAG, {})
                if not linux:
                    quiesce()
                    for _ in range(args.warmup):
                        for mode in modes:
                            bench.run(mode)
                    bench.forkd_ticks = bench.forkd_children = 0
                for r in range(args.rounds):
                    k = r % len(modes)
                    for mode in modes[k:] + modes[:k]:
                        rounds[mode].append(bench.run(mode))
                bench.bus.close()
                bench.api.close()
    except (RuntimeError, AssertionError, TimeoutError, DBusError, OSError, subprocess.SubprocessError) as e:
        sys.exit(f"bench/fork: {e.name + ': ' + e.message if isinstance(e, DBusError) else e}")
    if linux:
        report_linux(args, rounds, bench)
    else:
        report(args, modes, rounds, bench, backend)


if __name__ == "__main__":
    main()
