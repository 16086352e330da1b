#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
kill -9 anywhere, nothing lost: fault injection against the real parts (a
private dbus-daemon, forkd, forkd-vmm on /dev/kvm, the test guest, cgroupfs
under a private root; the harness of tests/daemon/test-forkd.py).

1. ITERATIONS times (default 100; --iterations, $FORKD_FAULT_ITERATIONS), an
   operation drawn in turn from snapshot create, fork of 100, branch of a
   running sandbox, delete, compact and unpack is started, forkd is killed
   with SIGKILL after a random delay (the seed is printed; --seed or
   $FORKD_FAULT_SEED repeats a run's choices, and its delays as fractions of
   each operation's uninterrupted duration, measured at the start) and
   restarted on the same state directory at once. Then: every acknowledged snapshot is listed and forks (so does
   every other listed one), an acknowledged delete stays deleted, no staging
   directory (".tmp.", ".compact-staging-", ".unpack-", ".deleted-") and no
   unlisted snapshot directory is left, no forkd-vmm runs outside the new
   forkd's process tree, no sb-* cgroup, sandbox record or overlay file
   belongs to no listed sandbox, /run/netns is as it was (forkd pins no
   namespace there) and every VMM is confined in a network namespace of its
   own rather than the host's, and every
   listed sandbox answers. With a chance of 30% the VMM writing a snapshot
   also dies at a stage (FORKD_TEST_CRASH_SNAPSHOT/_COMPACT), and of 25% the
   restarted forkd is killed again while it recovers. Semantics (forkd(8)): sandboxes die with forkd (their
   VMMs have PR_SET_PDEATHSIG) and the next forkd announces them removed with
   reason "daemon-restart"; a branch writer outlives forkd and the next forkd
   registers its snapshot once it is written.
2. A full disk: forkd on a small tmpfs state directory (mounted in a private
   mount namespace, unshare -m): create, branch and unpack that run out of
   space fail naming ENOSPC, leave nothing half-written, and succeed once
   space is freed.
3. A VMM killed with SIGKILL (a sandbox's, then a template's): its sandboxes
   are removed with SandboxRemoved "crashed", their cgroups, records and
   overlays go, and the snapshot forks again.
4. tools/forkd-stack up on a state directory whose forkd was killed starts
   forkd again and keeps the bus and forkd-rest that are still up.

Environment: FORKD, FORKD_VMM, FORKD_TEST_GUEST, FORKCTL, FORKD_SOURCE_ROOT,
FORKD_BUILD_DIR. TAP output.
"""

import argparse
import glob
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request

import dbusmini
from dbusmini import DBusError

HERE = os.path.dirname(os.path.abspath(__file__))
DAEMON_TESTS = os.path.join(os.path.dirname(HERE), "daemon")


def _load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(DAEMON_TESTS, file))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


tf = _load("test_forkd", "test-forkd.py")
tb = _load("test_branch", "test-branch.py")

FORKCTL = os.environ.get("FORKCTL")
SOURCE_ROOT = os.environ.get("FORKD_SOURCE_ROOT")
BUILD_DIR = os.environ.get("FORKD_BUILD_DIR")
DEST, PATH, IFACE = tf.DEST, tf.PATH, tf.IFACE
MEM_MIB = 64
OPS = ("create", "fork100", "branch", "delete", "compact", "unpack")
EXTRA_MAX = 4  # snapshots kept beyond base and link; older ones are deleted between iterations


def log(msg):
    print(f"# {msg}", flush=True)


def proc_parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
        return int(st[st.rindex(")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def descends_from(pid, ancestor):
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        pid = proc_parent(pid)
    return False


def call_many(bus, calls, timeout):
    """Send every (member, signature, args) to the Manager at once, then collect the
    replies: [(DBusError or None, body)] in order. (Bus.wait_reply drops the replies
    of other calls.) Signals are kept for Bus.wait_signal."""
    serials = [bus.send(DEST, PATH, IFACE, member, sig, args) for member, sig, args in calls]
    want = set(serials)
    got = {}
    deadline = time.monotonic() + timeout
    while want:
        m = bus._read_message(deadline)
        if m["type"] == dbusmini.SIGNAL:
            bus.signals.append((m["fields"].get(3), m["body"]))
            continue
        rs = m["fields"].get(5)
        if rs not in want:
            continue
        want.discard(rs)
        if m["type"] == dbusmini.ERROR:
            got[rs] = (DBusError(m["fields"].get(4), m["body"][0] if m["body"] else ""), None)
        else:
            got[rs] = (None, m["body"])
    return [got[s] for s in serials]


def staging_names(snapdir):
    return [n for n in os.listdir(snapdir)
            if n.startswith(".") or ".tmp." in n]


class Faults:
    def __init__(self, h, rng, scale):
        self.h = h
        self.rng = rng
        self.scale = scale
        self.snapdir = os.path.join(h.state, "snapshots")
        self.disk = os.path.join(h.tmp, "disk.img")
        self.bundle = os.path.join(h.tmp, "base.tar.zst")
        self.acked = set()      # snapshots acknowledged and not deleted since
        self.deleted = set()    # acknowledged deletes
        self.extra = []         # acknowledged snapshots beyond base and link, oldest first
        self.seq = 0
        self.phase = {"reap": 0.0, "prepare": 0.0, "kill": 0.0, "restart": 0.0, "checks": 0.0, "forks": 0.0}
        self.sandboxes_acked = []  # sandboxes of the forkd about to be killed that callers were told of
        self.duration = {}      # op -> seconds an uninterrupted run took
        self.counts = {op: {"during": 0, "after": 0} for op in OPS}

    def tag(self, prefix):
        self.seq += 1
        return f"{prefix}{self.seq}"

    def listed(self):
        return {s["tag"] for s in self.h.m("ListSnapshots")[0]}

    def forkctl(self, *args):
        return subprocess.Popen([FORKCTL, "--bus-address", self.h.address, "--no-progress", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # ---- set-up, outside any kill ----

    def setup(self):
        h = self.h
        with open(self.disk, "wb") as f:
            f.truncate(16 << 20)
        h.start_bus()
        h.start_forkd()
        h.m("CreateSnapshot", "sssuu", ["base", tf.GUEST, self.disk, MEM_MIB, 30], timeout=120)
        self.acked.add("base")
        p = h.fork("base", 1)[0]
        tb.poke(p["pid"], b"link-state")
        h.m("BranchSandbox", "sssb", [p["id"], "link", "diff", True], timeout=120)
        self.acked.add("link")
        h.m("TerminateSandbox", "s", [p["id"]])
        h.wait_removed(p["id"])
        fc = self.forkctl("pack", "--tag", "base", "--out", self.bundle)
        out, err = fc.communicate(timeout=120)
        assert fc.returncode == 0, f"forkctl pack: {err}"

    def ensure_victim(self):
        if not self.extra:
            t = self.tag("v")
            self.h.m("CreateSnapshot", "sssuu", [t, tf.GUEST, self.disk, MEM_MIB, 30], timeout=120)
            self.acked.add(t)
            self.extra.append(t)
        return self.extra[0]

    def trim(self):
        while len(self.extra) > EXTRA_MAX:
            t = self.extra.pop(0)
            self.h.m("DeleteSnapshot", "sbb", [t, False, False], timeout=60)
            self.acked.discard(t)

    # ---- one operation, killed ----

    def start_op(self, op):
        """Prepare (not killed) and start op. Returns (kind, handle, tag, extra)."""
        h = self.h
        if op == "create":
            t = self.tag("c")
            return "dbus", h.bus.send(DEST, PATH, IFACE, "CreateSnapshot", "sssuu",
                                      [t, tf.GUEST, self.disk, MEM_MIB, 30]), t
        if op == "fork100":
            return "dbus", h.bus.send(DEST, PATH, IFACE, "Fork", "sua{sv}",
                                      ["base", 100, {"memory_limit_mib": ("u", 48)} if h.cgroot else {}]), None
        if op == "branch":
            p = h.fork("base", 1)[0]
            self.sandboxes_acked.append(p["id"])
            tb.poke(p["pid"], f"branch-{self.seq}".encode())
            t = self.tag("b")
            mode = self.rng.choice(["full", "diff"])
            return "dbus", h.bus.send(DEST, PATH, IFACE, "BranchSandbox", "sssb", [p["id"], t, mode, True]), t
        if op == "delete":
            t = self.ensure_victim()
            return "dbus", h.bus.send(DEST, PATH, IFACE, "DeleteSnapshot", "sbb", [t, False, False]), t
        if op == "compact":
            t = self.tag("k")
            return "dbus", h.bus.send(DEST, PATH, IFACE, "CompactSnapshot", "ss", ["link", t]), t
        if op == "unpack":
            t = self.tag("u")
            return "forkctl", self.forkctl("unpack", self.bundle, "--tag", t), t
        raise AssertionError(op)

    def finish_op(self, kind, handle, timeout):
        """True: the operation was acknowledged (success reply); False: it failed or got no reply."""
        if kind == "dbus":
            try:
                body = self.h.bus.wait_reply(handle, timeout)
                if body and isinstance(body[0], list):  # Fork: the sandboxes
                    self.sandboxes_acked += [i["id"] for i in body[0]]
                return True
            except DBusError:
                return False
            except TimeoutError:
                return None
        try:
            handle.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return handle.returncode == 0

    def acknowledge(self, op, tag, ok):
        if not ok or tag is None:
            return
        if op == "delete":
            self.acked.discard(tag)
            self.deleted.add(tag)
            self.extra.remove(tag)
        else:
            self.acked.add(tag)
            self.extra.append(tag)

    def calibrate(self, op):
        """One uninterrupted run: how long the operation takes here (TCG is slower)."""
        kind, handle, tag = self.start_op(op)
        t0 = time.monotonic()
        ok = self.finish_op(kind, handle, 300)
        self.duration[op] = time.monotonic() - t0
        assert ok, f"{op} failed without a kill"
        self.acknowledge(op, tag, ok)
        self.h.terminate_all()
        log(f"{op}: {self.duration[op] * 1000:.0f} ms uninterrupted")

    def iteration(self, i, op):
        h = self.h
        crash = None
        if op in ("create", "branch", "compact") and self.rng.random() < 0.3:
            # The VMM writing the snapshot dies at a stage too, as a power cut would
            # (FORKD_TEST_CRASH_SNAPSHOT / _COMPACT); forkd is then killed as well.
            var = "FORKD_TEST_CRASH_COMPACT" if op == "compact" else "FORKD_TEST_CRASH_SNAPSHOT"
            stages = ("memory", "disk", "meta") if op == "compact" else ("memory", "vmstate", "disk", "meta",
                                                                          "rename")
            crash = (var, self.rng.choice(stages))
            os.environ[var] = crash[1]
            h.stop_forkd(signal.SIGKILL)
            h.start_forkd()
        stall = 0
        if op == "branch":
            # Sometimes a slow writer too: the kill then lands while the copy writes.
            stall = self.rng.choice([0, 0, int(300 * self.scale)])
            os.environ["FORKD_TEST_BRANCH_STALL_MS"] = str(stall)
        h.bus.signals.clear()
        self.sandboxes_acked = []
        tp = time.monotonic()
        kind, handle, tag = self.start_op(op)
        self.phase["prepare"] += time.monotonic() - tp
        # Up to 1.5 times the uninterrupted duration: about a third land after the reply.
        delay = self.rng.uniform(0, self.duration[op] * 1.5 + stall / 1000)
        t0 = time.monotonic()
        ok = self.finish_op(kind, handle, delay) if kind == "dbus" else None
        if kind == "forkctl":
            time.sleep(delay)
            if handle.poll() is not None:
                handle.communicate()
                ok = handle.returncode == 0
        landed = "during" if ok is None else "after"
        tk = time.monotonic()
        h.stop_forkd(signal.SIGKILL)
        self.phase["reap"] += time.monotonic() - tk
        if ok is None:
            # A reply sent just before the kill still counts: forkd promised.
            ok = self.finish_op(kind, handle, 10 * self.scale)
            if ok is None:
                if kind == "forkctl":
                    handle.kill()
                    handle.communicate()
                raise AssertionError(f"no answer to the {op} call within {10 * self.scale:.0f} s of forkd's death")
            if ok:
                landed = "after"
        self.counts[op][landed] += 1
        self.acknowledge(op, tag, ok)
        os.environ["FORKD_TEST_BRANCH_STALL_MS"] = "0"
        os.environ.pop("FORKD_TEST_CRASH_SNAPSHOT", None)
        os.environ.pop("FORKD_TEST_CRASH_COMPACT", None)
        again = ""
        if self.rng.random() < 0.25:
            # Killed again while it recovers.
            early = self.rng.uniform(0, 0.05 * self.scale)
            self.start_and_kill(early)
            again = f", killed again {early * 1000:.0f} ms into its restart"
        t1 = time.monotonic()
        self.phase["kill"] += t1 - tk
        h.start_forkd()
        t2 = time.monotonic()
        outcome = self.check_recovered(op, tag, ok)
        t3 = time.monotonic()
        self.phase["restart"] += t2 - t1
        self.phase["checks"] += t3 - t2
        return (f"{op} {tag or ''} killed after {delay * 1000:.0f} ms, {landed}, "
                f"{'acknowledged' if ok else 'not acknowledged'}{outcome}"
                f"{f', VMM crashed at {crash[1]}' if crash else ''}{again}")

    def start_and_kill(self, delay):
        h = self.h
        logf = open(os.path.join(h.tmp, f"forkd.{len(h.logs)}.log"), "w")
        h.logs.append(logf.name)
        args = [tf.FORKD, "--bus-address", h.address, "--state-dir", h.state]
        if h.cgroot:
            args += ["--cgroup-root", h.cgroot]
        p = subprocess.Popen(args, stdout=logf, stderr=logf, env=dict(os.environ, FORKD_VMM=tf.VMM))
        logf.close()
        time.sleep(delay)
        p.kill()
        p.wait()

    # ---- what must hold after a restart ----

    def vmm_outside(self):
        pid = self.h.forkd.pid
        return [p for p in tf.vmm_processes(self.h.tmp) if not descends_from(p, pid)]

    def check_recovered(self, op, tag, ok):
        h = self.h
        # VMMs die with forkd at once (PR_SET_PDEATHSIG, the end of their control
        # socket); only a branch writer ("forkd-branch") of the killed forkd may go
        # on writing for a while, and it finishes on its own.
        def orphans():
            return [p for p in self.vmm_outside() if tb.comm(p) != "forkd-branch"]
        try:
            tf.wait_for(lambda: not orphans(), 3 * self.scale, "VMMs to die with forkd")
        except AssertionError:
            raise AssertionError("forkd-vmm processes outlived forkd by 3 s: " +
                                 "; ".join(f"{p} {tb.comm(p)} {cmdline(p)}" for p in orphans()))
        tf.wait_for(lambda: not self.vmm_outside(), 60 * self.scale, "branch writers of the killed forkd to finish")
        tf.wait_for(lambda: not [n for n in os.listdir(self.snapdir) if ".tmp." in n], 30 * self.scale,
                    "branch writers to finish their staging directories")

        def settled():
            listed = self.listed()
            on_disk = set(os.listdir(self.snapdir))
            return listed == on_disk and not staging_names(self.snapdir)
        try:
            tf.wait_for(settled, 10 * self.scale, "the snapshot directory to match the registry")
        except AssertionError:
            raise AssertionError(f"listed {sorted(self.listed())}, on disk {sorted(os.listdir(self.snapdir))}")
        listed = self.listed()
        if op == "delete" and not ok and tag not in listed:
            # An unacknowledged delete may have happened.
            self.extra.remove(tag)
            self.acked.discard(tag)
        missing = self.acked - listed
        assert not missing, f"acknowledged snapshots lost: {sorted(missing)}"
        back = self.deleted & listed
        assert not back, f"acknowledged deletes came back: {sorted(back)}"
        outcome = ""
        if not ok and tag:
            outcome = f" ({tag} {'there' if tag in listed else 'not there'} after the restart)"
        # Unacknowledged results that are there anyway are kept and must be whole.
        for t in sorted(listed - self.acked):
            if t in self.deleted:
                continue
            self.acked.add(t)
            self.extra.append(t)
        # Sandboxes died with forkd and are announced removed, "daemon-restart",
        # also those of a forkd killed again during its restart.
        for sid in self.sandboxes_acked:
            try:
                reason = h.wait_removed(sid, 10 * self.scale)
            except TimeoutError:
                raise AssertionError(f"no SandboxRemoved for {sid} of the killed forkd "
                                     f"({len(self.sandboxes_acked)} acknowledged)")
            assert reason == "daemon-restart", (sid, reason)
        # The survivors (none are expected) are listed and answer.
        sbs = h.sandboxes()
        for sid in sbs:
            assert json.loads(h.m("Ping", "s", [sid])[0])["pong"], sid
        # Every listed snapshot forks and its child answers.
        t0 = time.monotonic()
        tags = sorted(self.listed())
        replies = []
        for k in range(0, len(tags), 4):  # forkd runs 4 long operations at once (--max-operations)
            replies += call_many(h.bus, [("Fork", "sua{sv}", [t, 1, {}]) for t in tags[k:k + 4]], 120 * self.scale)
        kids = []
        for t, (err, body) in zip(tags, replies):
            if err:
                raise AssertionError(f"listed snapshot {t} does not fork: {err.name}: {err.message}")
            kids.append(body[0][0]["id"])
        for sid, (err, body) in zip(kids, call_many(h.bus, [("Ping", "s", [k]) for k in kids], 30 * self.scale)):
            assert not err and json.loads(body[0])["pong"], (sid, err)
        live = list(h.sandboxes())
        for err, _ in call_many(h.bus, [("TerminateSandbox", "s", [sid]) for sid in live], 30 * self.scale):
            assert not err, err
        for sid in live:
            h.wait_removed(sid, 30 * self.scale)
        self.phase["forks"] += time.monotonic() - t0
        self.check_nothing_left()
        return outcome

    def check_nothing_left(self):
        h = self.h
        live = set(h.sandboxes())
        tf.wait_for(lambda: set(h.cgroup_children()) <= live, 20 * self.scale,
                    "cgroups of gone sandboxes to be removed")
        recs = {n[:-5] for n in os.listdir(os.path.join(h.state, "sandboxes")) if n.endswith(".json")}
        assert recs <= live, f"sandbox records without a sandbox: {sorted(recs - live)}"
        others = [n for n in os.listdir(os.path.join(h.state, "sandboxes")) if not n.endswith(".json")]
        assert not others, f"stray files in sandboxes/: {others}"
        if not live:
            ov = os.listdir(os.path.join(h.state, "overlays"))
            assert not ov, f"overlays left with no sandbox: {ov}"
        # forkd pins no network namespace of its own (per_child_netns joins those of
        # tools/netns-setup), and a confined VMM's own namespace (forkd-vmm(8),
        # CONFINEMENT) lives only as long as its processes: what could leak is a
        # namespace bound under /run/netns, or a VMM left in the host's network.
        assert netns_names() == NETNS_AT_START, \
            f"/run/netns changed: {sorted(netns_names() ^ NETNS_AT_START)}"
        host_ns = os.readlink("/proc/self/ns/net")
        for pid in tf.vmm_processes(h.tmp):
            try:
                ns = os.readlink(f"/proc/{pid}/ns/net")
            except OSError:
                continue
            assert ns != host_ns, f"forkd-vmm {pid} is in the host's network namespace (not confined)"
        outside = self.vmm_outside()
        assert not outside, f"forkd-vmm processes outside forkd's tree: {outside}"



def netns_names():
    try:
        return set(os.listdir("/run/netns"))
    except FileNotFoundError:
        return set()


NETNS_AT_START = netns_names()

# ---------------------------------------------------------------------------

def kill_loop(h, args, rng, scale):
    f = Faults(h, rng, scale)
    t_start = time.monotonic()
    f.setup()
    for op in OPS:
        f.calibrate(op)
    f.trim()
    h.check("set-up and one uninterrupted run of each operation", lambda: None)
    for i in range(args.iterations):
        op = OPS[i % len(OPS)]
        desc = {}

        def one(i=i, op=op):
            desc["d"] = f.iteration(i, op)
            f.trim()
        h.n += 1
        try:
            one()
            print(f"ok {h.n} - kill -9 #{i + 1}: {desc['d']}", flush=True)
        except Exception as e:  # noqa: BLE001
            h.failed += 1
            print(f"not ok {h.n} - kill -9 #{i + 1}: {op}", flush=True)
            import traceback
            for line in traceback.format_exception(type(e), e, e.__traceback__):
                for sub in line.rstrip().splitlines():
                    print(f"# {sub}")
            for logf in h.logs[-2:]:
                try:
                    with open(logf) as lf:
                        for line in lf.read().splitlines()[-20:]:
                            print(f"# {os.path.basename(logf)}: {line}")
                except OSError:
                    pass
            print(f"# seed {args.seed}; stopping the loop", file=sys.stderr)
            print(f"not ok - kill -9 #{i + 1} {op}: {e}", file=sys.stderr)
            break
    total = sum(c["during"] + c["after"] for c in f.counts.values())
    log(f"{total} kills in {time.monotonic() - t_start:.1f} s (seed {args.seed}):")
    for op in OPS:
        c = f.counts[op]
        log(f"  {op:8s} {c['during'] + c['after']:3d} kills, {c['during']:3d} during the operation, "
            f"{c['after']:3d} after its reply")
    log("  time in preparing operations {prepare:.1f} s, in killing {kill:.1f} s ({reap:.1f} s until forkd was reaped), in restarts {restart:.1f} s, in checks {checks:.1f} s (forking every listed snapshot "
        "{forks:.1f} s of it)".format(**f.phase))
    h.terminate_all()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=int(os.environ.get("FORKD_FAULT_ITERATIONS", "100")))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("FORKD_FAULT_SEED", "0")) or None)
    ap.add_argument("--only", default=os.environ.get("FORKD_FAULT_ONLY", ""),
                    help="comma-separated parts: kill,disk,vmm,stack (default all)")
    args = ap.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 1 << 31)
    if not tf.FORKD or not tf.VMM or not tf.GUEST or not FORKCTL:
        print("Bail out! FORKD, FORKD_VMM, FORKD_TEST_GUEST and FORKCTL must be set")
        return 1
    if not tf.kvm_usable():
        tf.skip("/dev/kvm is not usable")
    if os.geteuid() != 0:
        tf.skip("needs root (cgroups, the system-bus policy, mount namespaces)")
    parts = set(args.only.split(",")) if args.only else {"kill", "disk", "vmm", "stack"}
    # Under TCG (the test host) everything is slower: delays and timeouts scale, iterations do not.
    scale = float(os.environ.get("FORKD_FAULT_SCALE", "0") or 0) or (4.0 if not os.path.isdir("/sys/module/kvm_pvm")
                                                                      and is_emulated() else 1.0)
    log(f"seed {args.seed}, {args.iterations} iterations, time scale {scale}")
    rng = random.Random(args.seed)
    os.environ["FORKD_TEST_BRANCH_STALL_MS"] = "0"
    rc = 0
    if "kill" in parts:
        h = tf.Harness()
        try:
            h.setup_cgroups()
            kill_loop(h, args, rng, scale)
            h.check("forkd logged no sanitizer report", h.assert_no_sanitizer_report)
        finally:
            h.cleanup()
        rc |= 1 if h.failed else 0
        n = h.n
    else:
        n = 0
    import faults_more  # noqa: E402  (the other parts, beside this file)
    for part, fn in (("vmm", faults_more.vmm_kill), ("disk", faults_more.full_disk),
                     ("stack", faults_more.stack_restart)):
        if part not in parts:
            continue
        h = tf.Harness()
        h.n = n
        try:
            h.setup_cgroups()
            fn(h, scale)
            h.check(f"{part}: forkd logged no sanitizer report", h.assert_no_sanitizer_report)
        finally:
            h.cleanup()
        n = h.n
        rc |= 1 if h.failed else 0
    print(f"1..{n}")
    return rc


def is_emulated():
    try:
        with open("/proc/cpuinfo") as f:
            return "QEMU" in f.read()
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
