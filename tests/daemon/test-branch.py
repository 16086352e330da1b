#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
Branching a running sandbox, end to end on the real parts: a private
dbus-daemon, forkd, forkd-vmm on /dev/kvm and the test guest (the harness of
test-forkd.py). Guest RAM is checked through /proc/<pid>/mem of the VMMs: the
parent's scratch area is written before and after a branch, and children of
the branch must see exactly the first.

Environment: FORKD, FORKD_VMM, FORKD_TEST_GUEST.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("test_forkd", os.path.join(HERE, "test-forkd.py"))
tf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tf)

DEST, PATH, IFACE = tf.DEST, tf.PATH, tf.IFACE
SCRATCH = 16 << 20  # the test guest's scratch area starts at 16 MiB
# The test-branch-smp2 run gives every snapshot 2 vCPUs (forkd's FORKD_DEFAULT_VCPUS).
VCPUS = int(os.environ.get("FORKD_DEFAULT_VCPUS") or 1)
NO_SANDBOX = "org.forkd.Error.NoSuchSandbox"
EXISTS = "org.forkd.Error.SnapshotExists"
BUSY = "org.forkd.Error.Busy"
NOT_READY = "org.forkd.Error.NotReady"


def guest_mem(pid):
    """(fd of /proc/pid/mem, address of guest RAM) of a forked VMM."""
    with open(f"/proc/{pid}/maps") as f:
        start = next(int(line.split("-")[0], 16) for line in f if line.rstrip().endswith("/memory.bin"))
    return os.open(f"/proc/{pid}/mem", os.O_RDWR), start


def poke(pid, data, off=SCRATCH):
    fd, base = guest_mem(pid)
    try:
        os.pwrite(fd, data, base + off)
    finally:
        os.close(fd)


def peek(pid, n, off=SCRATCH):
    fd, base = guest_mem(pid)
    try:
        return os.pread(fd, n, base + off)
    finally:
        os.close(fd)


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def main():
    return tf.run_on_harness(run, "the system-bus policy, /proc/<pid>/mem of the VMMs")


def run(h):
    h.setup_cgroups()
    disk = os.path.join(h.tmp, "disk.img")
    with open(disk, "wb") as f:
        f.truncate(16 << 20)
    h.start_bus()
    # The frozen copy waits before it writes, so that a branch is reliably in flight.
    os.environ["FORKD_TEST_BRANCH_STALL_MS"] = "0"
    h.start_forkd()
    ctx = {}

    def branch(sid, tag="", mode="full", wait=True, timeout=60):
        return h.m("BranchSandbox", "sssb", [sid, tag, mode, wait], timeout=timeout)[0]

    def ping(sid):
        assert json.loads(h.m("Ping", "s", [sid])[0])["pong"], sid

    def aps_counting(*sids):
        """With several vCPUs: every AP of each sandbox runs on, its counter (the test
        guest's run_code "cpus") growing. Nothing to check with one vCPU."""
        if VCPUS < 2:
            return
        for sid in sids:
            def counters():
                return json.loads(json.loads(h.m("RunCode", "ssu", [sid, "cpus", 10])[0])["stdout"])
            first = counters()
            assert first["cpus"] == VCPUS and all(c > 0 for c in first["counters"][1:]), (sid, first)
            tf.wait_for(lambda: all(b > a for a, b in zip(first["counters"][1:], counters()["counters"][1:])), 30,
                        f"every AP of {sid} to go on counting")

    def terminate(*sandboxes):
        for k in sandboxes:
            h.m("TerminateSandbox", "s", [k["id"]])
            assert h.wait_removed(k["id"]) == "terminated", k["id"]

    def templates_gone():
        tf.wait_for(lambda: not [d for d in os.listdir("/proc") if d.isdigit() and comm(d) == "forkd-fork"], 10,
                    "the frozen templates to exit")

    def setup():
        assert h.m("CreateSnapshot", "sssuu", ["base", tf.GUEST, disk, 64, 30])[0]["vcpus"] == VCPUS
        p = h.fork("base", 1)[0]
        ctx["parent"] = p
        poke(p["pid"], b"before-branch")
        ping(p["id"])
        aps_counting(p["id"])
    h.check("a running sandbox of the test guest", setup)

    def full():
        p = ctx["parent"]
        t0 = time.monotonic()
        info = branch(p["id"], "b1")
        ctx["b1_wall"] = time.monotonic() - t0
        assert info["tag"] == "b1" and info["status"] == "ready", info
        assert info["branched_from"] == p["id"], info
        assert "pause_ms" in info and info["pause_us"] > 0 and info["pause_ms"] == (info["pause_us"] + 500) // 1000, info
        assert info["mem_size"] == 64 << 20 and info["generation"] == 1, info
        assert info["vcpus"] == VCPUS, info  # a branch keeps the source's vCPUs
        h.bus.wait_signal(lambda m, b: m == "SnapshotNew" and b[0] == "b1")
        # The listing and snapshot.json keep where it came from and its pause (REST API v1's SnapshotInfo).
        listed = {s["tag"]: s for s in h.m("ListSnapshots")[0]}
        assert {k: listed["b1"].get(k) for k in ("branched_from", "pause_ms", "pause_us")} == \
            {k: info[k] for k in ("branched_from", "pause_ms", "pause_us")}, (listed["b1"], info)
        assert "branched_from" not in listed["base"], listed["base"]
        with open(os.path.join(h.state, "snapshots", "b1", "snapshot.json")) as f:
            meta = json.load(f)
        assert meta["branched_from"] == p["id"] and meta["pause_us"] == info["pause_us"], meta
        assert meta["vcpus"] == VCPUS, meta
        # The source runs on with its state, and what it does now is its own.
        ping(p["id"])
        assert peek(p["pid"], 13) == b"before-branch"
        poke(p["pid"], b"after--branch")
        c = h.fork("b1", 2)
        for ch in c:
            ping(ch["id"])
            assert peek(ch["pid"], 13) == b"before-branch", peek(ch["pid"], 13)
        # A child's change is its own.
        poke(c[0]["pid"], b"child0-change")
        assert peek(c[1]["pid"], 13) == b"before-branch"
        assert peek(p["pid"], 13) == b"after--branch"
        ctx["b1_children"] = c
        aps_counting(p["id"], *[ch["id"] for ch in c])
        assert os.path.isfile(os.path.join(h.state, "snapshots/b1/snapshot.json"))
        # No copy of the disk: the branch's disk.img is the source snapshot's, hard-linked.
        snaps = os.path.join(h.state, "snapshots")
        assert os.stat(f"{snaps}/b1/disk.img").st_ino == os.stat(f"{snaps}/base/disk.img").st_ino
        assert not [n for n in os.listdir(os.path.join(h.state, "snapshots")) if ".tmp." in n]
    h.check("full branch: SnapshotInfo with branched_from, pause_ms, status; children see the state at the pause",
            full)

    def auto_tag_and_object():
        p = ctx["parent"]
        before = int(time.time())
        info = branch(p["id"])
        tag = info["tag"]
        prefix = f"branch-{p['id']}-"
        assert tag.startswith(prefix) and before <= int(tag[len(prefix):]) <= int(time.time()), tag
        # The sandbox object has the verb too.
        obj = tf.path_encode("/org/forkd/sandbox", p["id"])
        info = h.bus.call(DEST, obj, "org.forkd.Sandbox", "Branch", "ssb", ["b-obj", "live", True])[0]
        assert info["tag"] == "b-obj" and info["status"] == "ready" and info["branched_from"] == p["id"], info
        ctx["auto"] = tag
    h.check("auto tag branch-<id>-<unix-ts>; Sandbox.Branch on the object; live with wait", auto_tag_and_object)

    def errors():
        p = ctx["parent"]
        h.expect_error(NO_SANDBOX, "BranchSandbox", "sssb", ["sb-000000-0000", "x", "full", True])
        h.expect_error(tf.INVALID_ARGS, "BranchSandbox", "sssb", [p["id"], "bad/tag", "full", True])
        h.expect_error(tf.INVALID_ARGS, "BranchSandbox", "sssb", [p["id"], "x", "fast", True])
        h.expect_error(tf.INVALID_ARGS, "BranchSandbox", "sssb", [p["id"], "x", "full", False])
        h.expect_error(EXISTS, "BranchSandbox", "sssb", [p["id"], "b1", "full", True])
        h.expect_error(EXISTS, "BranchSandbox", "sssb", [p["id"], "base", "live", True])
        assert "b1" in [s["tag"] for s in h.m("ListSnapshots")[0]]
        ping(p["id"])
    h.check("errors: unknown sandbox, bad tag, bad mode, wait false without live, existing tag", errors)

    def chain():
        # branch of a branch of a branch
        src = ctx["b1_children"][1]
        for k, tag in enumerate(["bb2", "bb3", "bb4"]):
            poke(src["pid"], f"gen-{k}".encode(), SCRATCH + 4096)
            branch(src["id"], tag)
            src = h.fork(tag, 1)[0]
            ping(src["id"])
            assert peek(src["pid"], 13) == b"before-branch"
            assert peek(src["pid"], 5, SCRATCH + 4096) == f"gen-{k}".encode()
        ctx["chain_last"] = src
    h.check("a branch of a branch of a branch forks with every generation's state", chain)

    def outlives_source():
        p = ctx["parent"]
        terminate(p)
        c = h.fork("b1", 1)[0]
        ping(c["id"])
        assert peek(c["pid"], 13) == b"before-branch"
    h.check("a branch outlives its source sandbox", outlives_source)

    def restart():
        assert h.stop_forkd() == 0
        h.start_forkd()
        tags = {s["tag"] for s in h.m("ListSnapshots")[0]}
        assert {"b1", "bb2", "bb3", "bb4", "b-obj", ctx["auto"]} <= tags, tags
        h.stop_forkd(signal.SIGKILL)
        h.start_forkd()
        c = h.fork("bb4", 1)[0]
        ping(c["id"])
        assert peek(c["pid"], 5, SCRATCH + 4096) == b"gen-2"
        ctx["p2"] = c
    h.check("branches outlive a restart of forkd, kill -9 included", restart)

    def diff():
        p = h.fork("base", 1)[0]
        poke(p["pid"], b"diff-state-1!")
        info = branch(p["id"], "d1", "diff")
        assert info["parent_tag"] == "base" and len(info["parent_content_hash"]) == 64, info
        assert info["status"] == "ready" and info["branched_from"] == p["id"], info
        snaps = os.path.join(h.state, "snapshots")
        assert os.stat(f"{snaps}/d1/memory.bin").st_blocks * 512 < 4 << 20  # only what changed
        c = h.fork("d1", 1)[0]
        ping(c["id"])
        assert peek(c["pid"], 13) == b"diff-state-1!"
        poke(c["pid"], b"diff-state-2!", SCRATCH + 8192)
        info = branch(c["id"], "d2", "diff")
        assert info["parent_tag"] == "d1", info
        g = h.fork("d2", 2)
        for k in g:
            ping(k["id"])
            assert peek(k["pid"], 13) == b"diff-state-1!" and peek(k["pid"], 13, SCRATCH + 8192) == b"diff-state-2!"
        details = h.m("GetSnapshotInfo", "s", ["d1"])[0]
        assert details["dependents"] == ["d2"], details
        details = h.m("GetSnapshotInfo", "s", ["d2"])[0]
        assert details["ancestors"] == ["base", "d1"] and details["chain_depth"] == 2, details
        assert details["parent_content_hash"] == info["parent_content_hash"], details
        h.expect_error("org.forkd.Error.HasDependents", "DeleteSnapshot", "sbb", ["d1", False, False])
        terminate(p, c, *g)
    h.check("diff branch: parent_tag and parent_content_hash, only changed pages; a diff of a diff forks; "
            "its parent cannot be deleted", diff)

    def chain_ops():
        # After diff(): base <- d1 <- d2. REST API v1's DELETE with dependents, compact, and
        # its broken chains (an orphan, a re-snapshotted parent).
        snaps = os.path.join(h.state, "snapshots")
        HAS_DEPS, BROKEN = "org.forkd.Error.HasDependents", "org.forkd.Error.ChainBroken"
        msg = h.expect_error(HAS_DEPS, "DeleteSnapshot", "sbb", ["d1", False, False])
        assert msg == ("snapshot `d1` is the parent of 1 chained snapshot(s): [d2]; rerun with `?cascade=true` to "
                       "delete the whole subtree, or `?force=true` to orphan the children (they will fail to "
                       "restore)"), msg
        msg = h.expect_error(HAS_DEPS, "DeleteSnapshot", "sbb", ["base", False, False])
        assert "[" in msg and "d1" in msg and "b1" not in msg, msg
        h.expect_error(tf.INVALID_ARGS, "DeleteSnapshot", "sbb", ["d1", True, True])

        # compact: a flat snapshot of the head, the chain left as it is
        info = h.m("CompactSnapshot", "ss", ["d2", "d2-flat"], timeout=120)[0]
        assert info["tag"] == "d2-flat" and "parent_tag" not in info and info["mem_size"] == 64 << 20, info
        h.bus.wait_signal(lambda m, b: m == "SnapshotNew" and b[0] == "d2-flat")
        details = h.m("GetSnapshotInfo", "s", ["d2-flat"])[0]
        assert details["chain_depth"] == 0 and details["ancestors"] == [] and "parent_content_hash" not in details, \
            details
        assert details["vcpus"] == VCPUS, details
        assert not os.path.exists(f"{snaps}/d2-flat/memory.map")
        with open(f"{snaps}/d2-flat/snapshot.json") as f:
            meta = json.load(f)
        assert meta.get("parent_tag") is None and meta["tag"] == "d2-flat", meta
        assert not [n for n in os.listdir(snaps) if n.startswith(".compact-staging-")], os.listdir(snaps)
        k = h.fork("d2-flat", 1)[0]
        ping(k["id"])
        assert peek(k["pid"], 13) == b"diff-state-1!" and peek(k["pid"], 13, SCRATCH + 8192) == b"diff-state-2!"
        j = h.fork("d2", 1)[0]  # the chain still forks
        assert peek(j["pid"], 13) == b"diff-state-1!" and peek(j["pid"], 13, SCRATCH + 8192) == b"diff-state-2!"
        terminate(k, j)
        assert h.m("GetSnapshotInfo", "s", ["d2"])[0]["chain_depth"] == 2
        h.expect_error(EXISTS, "CompactSnapshot", "ss", ["d2", "base"])
        h.expect_error(EXISTS, "CompactSnapshot", "ss", ["d2", "d2-flat"])
        h.expect_error(tf.INVALID_ARGS, "CompactSnapshot", "ss", ["d2", "d2"])
        h.expect_error(tf.INVALID_ARGS, "CompactSnapshot", "ss", ["d2", "../evil"])
        h.expect_error(tf.INVALID_ARGS, "CompactSnapshot", "ss", ["d2", ".compact-staging-x"])
        h.expect_error(tf.INVALID_ARGS, "CompactSnapshot", "ss", ["d2", "x" * 65])
        h.expect_error("org.forkd.Error.NoSuchSnapshot", "CompactSnapshot", "ss", ["nope", "nope-flat"])

        # A compact that dies half way leaves only its staging directory, which the next start removes.
        h.stop_forkd()
        os.environ["FORKD_TEST_CRASH_COMPACT"] = "disk"
        try:
            h.start_forkd()
            h.expect_error("org.forkd.Error.Failed", "CompactSnapshot", "ss", ["d2", "d2-crash"])
        finally:
            del os.environ["FORKD_TEST_CRASH_COMPACT"]
        assert "d2-crash" not in {s["tag"] for s in h.m("ListSnapshots")[0]}
        assert not os.path.exists(f"{snaps}/d2-crash") and os.path.isdir(f"{snaps}/.compact-staging-d2-crash")
        h.stop_forkd()
        h.start_forkd()
        assert not [n for n in os.listdir(snaps) if "d2-crash" in n], os.listdir(snaps)

        # force: the parent goes, its child stays listed and fails to fork, naming the missing parent
        p = h.fork("base", 1)[0]
        poke(p["pid"], b"e-chain-one!!")
        branch(p["id"], "e1", "diff")
        c = h.fork("e1", 1)[0]
        poke(c["pid"], b"e-chain-two!!", SCRATCH + 8192)
        branch(c["id"], "e2", "diff")
        g = h.fork("e2", 1)[0]  # e2's template runs: the force delete must not leave it serving
        terminate(p, c, g)
        h.m("DeleteSnapshot", "sbb", ["e1", False, True])
        tags = {s["tag"] for s in h.m("ListSnapshots")[0]}
        assert "e1" not in tags and "e2" in tags and not os.path.exists(f"{snaps}/e1"), tags
        msg = h.expect_error(BROKEN, "Fork", "sua{sv}", ["e2", 1, {}])
        assert "chain `e2` references parent `e1`, which no longer exists" in msg, msg
        h.expect_error(BROKEN, "CompactSnapshot", "ss", ["e2", "e2-flat"])
        assert h.m("GetSnapshotInfo", "s", ["e2"])[0]["parent_tag"] == "e1"

        # a parent re-snapshotted under the same tag: REST API v1's 409
        p = h.fork("base", 1)[0]
        poke(p["pid"], b"another-e1!!!")
        branch(p["id"], "e1", "full")
        terminate(p)
        msg = h.expect_error(BROKEN, "Fork", "sua{sv}", ["e2", 1, {}])
        assert msg.startswith("chain `e2` references `e1` content `") and "`, but parent now has content `" in msg \
            and msg.endswith("rebuild with `forkctl snapshot diff --from e1`"), msg
        msg = h.expect_error(BROKEN, "CompactSnapshot", "ss", ["e2", "e2-flat"])
        assert "but parent now has content" in msg, msg
        assert not [n for n in os.listdir(snaps) if "e2-flat" in n], os.listdir(snaps)
        h.m("DeleteSnapshot", "sbb", ["e2", False, False])
        h.m("DeleteSnapshot", "sbb", ["e1", False, False])

        # cascade: the whole subtree, children first; the compacted copy is independent
        h.m("DeleteSnapshot", "sbb", ["d1", True, False])
        tags = {s["tag"] for s in h.m("ListSnapshots")[0]}
        assert not {"d1", "d2"} & tags and {"base", "d2-flat"} <= tags, tags
        assert not os.path.exists(f"{snaps}/d1") and not os.path.exists(f"{snaps}/d2")
        k = h.fork("d2-flat", 1)[0]
        assert peek(k["pid"], 13, SCRATCH + 8192) == b"diff-state-2!"
        terminate(k)
        templates_gone()
    h.check("chains: DELETE with dependents (409 naming them, cascade, force), compact (flat, staged, crash-safe, "
            "errors), an orphan and a re-snapshotted parent fail to fork with ChainBroken", chain_ops)

    def fork_running():
        p = h.fork("base", 1)[0]
        poke(p["pid"], b"parent-state!")
        kids, pause_us = h.m("ForkSandbox", "su", [p["id"], 3], timeout=60)
        assert len(kids) == 3 and 0 < pause_us < 1000000, (kids, pause_us)
        poke(p["pid"], b"parent-later!")
        for k in kids:
            assert k["state"] == "running" and k["snapshot_tag"] == "base", k
            ping(k["id"])
            assert peek(k["pid"], 13) == b"parent-state!", peek(k["pid"], 13)
        poke(kids[0]["pid"], b"kid0-changed!")
        assert peek(kids[1]["pid"], 13) == b"parent-state!"
        assert peek(p["pid"], 13) == b"parent-later!"
        aps_counting(p["id"], *[k["id"] for k in kids])
        # The Sandbox object has the verb too; a child of a child.
        obj = tf.path_encode("/org/forkd/sandbox", kids[0]["id"])
        grand, _ = h.bus.call(DEST, obj, "org.forkd.Sandbox", "Fork", "u", [1])
        assert peek(grand[0]["pid"], 13) == b"kid0-changed!"
        h.expect_error(tf.INVALID_ARGS, "ForkSandbox", "su", [p["id"], 0])
        h.expect_error(tf.INVALID_ARGS, "ForkSandbox", "su", [p["id"], 33])
        h.expect_error(NO_SANDBOX, "ForkSandbox", "su", ["sb-000000-0000", 1])
        # The children outlive their parent; the templates go with the last of their children.
        terminate(p)
        for k in kids + grand:
            ping(k["id"])
        terminate(*kids, *grand)
        templates_gone()
    h.check("ForkSandbox: n children with the parent's state at the pause, each its own; the parent runs on; "
            "errors; the templates go with their last child", fork_running)

    def limits():
        if not h.cgroot:
            raise AssertionError("no cgroup memory controller on this host")
        p = h.fork("base", 1, {"memory_limit_mib": ("u", 128)})[0]
        poke(p["pid"], b"limited-state")
        kids, _ = h.m("ForkSandbox", "su", [p["id"], 2], timeout=60)
        assert all(k["memory_limit_mib"] == 128 for k in kids), kids
        assert {k["id"] for k in kids} <= set(h.cgroup_children()), h.cgroup_children()
        info = branch(p["id"], "lim-b", "full")
        assert info["status"] == "ready"
        # The parent goes; its cgroup too (the template left it), and the children live on.
        terminate(p)
        tf.wait_for(lambda: p["id"] not in h.cgroup_children(), 10, "the parent's cgroup to go")
        for k in kids:
            ping(k["id"])
            assert peek(k["pid"], 13) == b"limited-state"
        terminate(*kids)
        tf.wait_for(lambda: not h.cgroup_children(), 10, "the children's cgroups to go")
    h.check("a sandbox with a memory limit: its fork children get the limit, the template and a branch writer leave "
            "its cgroup, which goes with it", limits)

    def merged():
        # MergeSandbox moves an id onto another VM, here one forked from a running
        # sandbox's frozen copy. BranchSandbox and ForkSandbox of that id go to that
        # VM's control channel; its exit event, record and cgroup go by the name the
        # VM was spawned under (vm_id), not by the id it serves now.
        records = os.path.join(h.state, "sandboxes")
        p = h.fork("base", 1, {"memory_limit_mib": ("u", 128)} if h.cgroot else None)[0]
        poke(p["pid"], b"merge-parent!")
        kid = h.m("ForkSandbox", "su", [p["id"], 1], timeout=60)[0][0]
        poke(kid["pid"], b"merge-winner!")
        info = h.m("MergeSandbox", "ss", [p["id"], kid["id"]], timeout=30)[0]
        assert info["id"] == p["id"] and info["pid"] == kid["pid"], info
        assert h.wait_removed(kid["id"]) == "merged"
        assert not comm(p["pid"]), "the old VM of the merged id is still there"
        with open(os.path.join(records, kid["id"] + ".json")) as f:
            rec = json.load(f)
        assert rec["id"] == p["id"] and rec["vm_id"] == kid["id"], rec
        assert not os.path.exists(os.path.join(records, p["id"] + ".json"))
        if h.cgroot:
            assert kid["id"] in h.cgroup_children()
            tf.wait_for(lambda: p["id"] not in h.cgroup_children(), 10, "the old VM's cgroup to go")
        ping(p["id"])
        info = branch(p["id"], "mg-b")
        assert info["branched_from"] == p["id"] and info["status"] == "ready", info
        c = h.fork("mg-b", 1)[0]
        assert peek(c["pid"], 13) == b"merge-winner!"
        grand = h.m("ForkSandbox", "su", [p["id"], 1], timeout=60)[0][0]
        assert peek(grand["pid"], 13) == b"merge-winner!"
        terminate(p)
        assert not comm(kid["pid"]), "the merged id's VM is still there"
        assert not os.path.exists(os.path.join(records, kid["id"] + ".json"))
        if h.cgroot:
            tf.wait_for(lambda: kid["id"] not in h.cgroup_children(), 10, "the merged VM's cgroup to go")
        for k in (c, grand):
            ping(k["id"])
        terminate(c, grand)
        templates_gone()
    h.check("a merged id on a VM forked from a running sandbox: branch and fork it; its record, cgroup and exit go "
            "by the VM's own name", merged)

    def in_flight():
        # Stalled frozen copies: in flight long enough to see the cap, the 409s and "writing".
        h.stop_forkd()
        os.environ["FORKD_TEST_BRANCH_STALL_MS"] = "1500"
        h.start_forkd(["--max-branches", "2"])
        try:
            p = h.fork("base", 1)[0]
            poke(p["pid"], b"live-no-wait!")
            info = branch(p["id"], "lv", "live", False)
            assert info["status"] == "writing" and info["tag"] == "lv" and info["branched_from"] == p["id"], info
            listed = {s["tag"]: s for s in h.m("ListSnapshots")[0]}
            assert listed["lv"]["status"] == "writing", listed["lv"]
            h.expect_error(NOT_READY, "Fork", "sua{sv}", ["lv", 1, {}])
            h.expect_error(EXISTS, "BranchSandbox", "sssb", [p["id"], "lv", "live", False])
            serial = h.bus.send(DEST, PATH, IFACE, "BranchSandbox", "sssb", [p["id"], "lv2", "full", True])
            tf.wait_for(lambda: "lv2" in {s["tag"] for s in h.m("ListSnapshots")[0]}, 10, "lv2 in flight")
            h.expect_error(BUSY, "BranchSandbox", "sssb", [p["id"], "lv3", "live", True])
            assert h.bus.wait_reply(serial, 30)[0]["status"] == "ready"
            tf.wait_for(lambda: {s["tag"]: s for s in h.m("ListSnapshots")[0]}["lv"]["status"] == "ready", 30,
                        "lv to be ready")
            c = h.fork("lv", 1)[0]
            assert peek(c["pid"], 13) == b"live-no-wait!"
            # A live branch without wait whose writer dies: listed as failed until deleted.
            info = branch(p["id"], "lv-fail", "live", False)
            assert info["status"] == "writing"
            writers = tf.wait_for(lambda: [int(d) for d in os.listdir("/proc") if d.isdigit() and
                                           comm(d) == "forkd-branch"], 5, "the forkd-branch process")
            for w in writers:
                os.kill(w, signal.SIGKILL)
            tf.wait_for(lambda: {s["tag"]: s for s in h.m("ListSnapshots")[0]}["lv-fail"]["status"] == "failed", 10,
                        "lv-fail to be failed")
            failed = {s["tag"]: s for s in h.m("ListSnapshots")[0]}["lv-fail"]
            assert failed["error"] and failed["branched_from"] == p["id"], failed
            h.expect_error("org.forkd.Error.NoSuchSnapshot", "Fork", "sua{sv}", ["lv-fail", 1, {}])
            h.m("DeleteSnapshot", "sbb", ["lv-fail", False, False])
            assert "lv-fail" not in {s["tag"] for s in h.m("ListSnapshots")[0]}
            assert not os.path.exists(os.path.join(h.state, "snapshots", "lv-fail"))
            assert not [n for n in os.listdir(os.path.join(h.state, "snapshots")) if n.startswith("lv-fail.tmp.")]
            # kill -9 of forkd while a branch is being written: the branch is not lost.
            branch(p["id"], "lv-kill", "live", False)
            # Once the writer has staged its directory (within a millisecond or so of the
            # reply), the restarted forkd adopts it; before that, the snapshot is registered
            # when it lands (see "lands" below).
            snaps = os.path.join(h.state, "snapshots")
            tf.wait_for(lambda: [n for n in os.listdir(snaps) if n.startswith("lv-kill.tmp.")], 5, "the staging dir")
            h.stop_forkd(signal.SIGKILL)
            os.environ["FORKD_TEST_BRANCH_STALL_MS"] = "0"
            h.start_forkd()
            # The restarted forkd found it still being written, and adopted it; on a
            # loaded machine the writer (stalled before the kill) may also have finished
            # while forkd started: then it is registered already.
            st = {s["tag"]: s for s in h.m("ListSnapshots")[0]}["lv-kill"]["status"]
            assert st in ("writing", "ready"), st
            if st == "writing":
                h.expect_error(NOT_READY, "Fork", "sua{sv}", ["lv-kill", 1, {}])
            tf.wait_for(lambda: {s["tag"]: s for s in h.m("ListSnapshots")[0]}.get("lv-kill", {}).get("status")
                        == "ready", 30, "the branch under way at kill -9 to be registered")
            c = h.fork("lv-kill", 1)[0]
            assert peek(c["pid"], 13) == b"live-no-wait!"
            # registered by the restarted forkd, from snapshot.json alone
            assert {s["tag"]: s for s in h.m("ListSnapshots")[0]}["lv-kill"]["branched_from"] == p["id"]
        finally:
            os.environ["FORKD_TEST_BRANCH_STALL_MS"] = "0"
    h.check("live with wait false: writing then ready or failed; 409 for its tag and forks of it; 503 at the cap; "
            "kill -9 of forkd mid-write loses nothing", in_flight)

    def failures():
        # What answers 500 over REST: a branch whose writer dies, and a VMM that does not
        # answer its control socket (stopped here) within --control-timeout-sec.
        h.stop_forkd()
        os.environ["FORKD_TEST_BRANCH_STALL_MS"] = "3000"
        h.start_forkd(["--control-timeout-sec", "2"])
        try:
            p, q = h.fork("base", 2)
            serial = h.bus.send(DEST, PATH, IFACE, "BranchSandbox", "sssb", [p["id"], "wf", "full", True])
            # its writer: the pid in the name of its staging directory, "wf.tmp.<pid>"
            snaps = os.path.join(h.state, "snapshots")
            staged = tf.wait_for(lambda: [n for n in os.listdir(snaps) if n.startswith("wf.tmp.")], 10,
                                 "the staging directory of the branch")
            writer = int(staged[0].rsplit(".", 1)[1])
            # forkd makes the directory and hands it over, so it can be there before the
            # writer has exec'd forkd-branch
            tf.wait_for(lambda: comm(writer) == "forkd-branch", 10, f"the writer {writer} to be forkd-branch")
            os.kill(writer, signal.SIGKILL)
            try:
                h.bus.wait_reply(serial, 30)
                raise AssertionError("a full branch whose writer was killed succeeded")
            except tf.DBusError as e:
                assert e.name == "org.forkd.Error.Failed" and "writing the snapshot exited" in e.message, (e.name, e.message)
            assert "wf" not in {s["tag"] for s in h.m("ListSnapshots")[0]}
            assert not [n for n in os.listdir(snaps) if n.startswith("wf")], os.listdir(snaps)
            ping(p["id"])
            # A stopped VMM: the fork and the branch fail after the timeout, and the
            # sandbox is killed (its VMM might still act on the request later).
            for k, member, sig, args in ((p, "ForkSandbox", "su", [p["id"], 1]),
                                         (q, "BranchSandbox", "sssb", [q["id"], "ws", "full", True])):
                os.kill(k["pid"], signal.SIGSTOP)
                t0 = time.monotonic()
                msg = h.expect_error("org.forkd.Error.Failed", member, sig, args)
                took = time.monotonic() - t0
                assert f"did not answer within 2 s" in msg and 1.5 < took < 20, (msg, took)
                h.wait_removed(k["id"])
                assert k["id"] not in h.sandboxes()
                tf.wait_for(lambda: not comm(k["pid"]), 10, "the stopped VMM to be killed")
            assert "ws" not in {s["tag"] for s in h.m("ListSnapshots")[0]}
        finally:
            os.environ["FORKD_TEST_BRANCH_STALL_MS"] = "0"
            h.stop_forkd()
            h.start_forkd()
    h.check("a full branch whose writer is killed fails and leaves nothing; a VMM that does not answer "
            "--control-timeout-sec fails the fork or branch and its sandbox is killed", failures)

    def lands():
        # A snapshot directory renamed into place by a writer forkd does not know (the writer
        # of a branch a killed forkd started, done before it staged anything or after the
        # restart's scan) is registered when it lands: here forkd-vmm's snapshot op.
        snaps = os.path.join(h.state, "snapshots")
        ctl = os.path.join(h.tmp, "outside.ctl")
        vm = subprocess.Popen([tf.VMM, "restore", "--snapshot", os.path.join(snaps, "base"), "--control-socket", ctl,
                               "--overlay-dir", h.tmp])
        try:
            import socket
            c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            tf.wait_for(lambda: os.path.exists(ctl), 10, "the control socket")
            c.connect(ctl)
            c.send(json.dumps({"op": "snapshot", "dir": os.path.join(snaps, "outside"), "tag": "outside"}).encode())
            assert json.loads(c.recv(4096))["ok"]
            c.send(b'{"op":"shutdown"}')
            c.recv(4096)
        finally:
            try:
                vm.wait(10)
            except subprocess.TimeoutExpired:
                vm.kill()
                vm.wait()
                raise
        h.bus.wait_signal(lambda m, b: m == "SnapshotNew" and b[0] == "outside", 10)
        k = h.fork("outside", 1)[0]
        ping(k["id"])
        terminate(k)
    h.check("a snapshot that lands in the snapshots directory from outside is registered", lands)

    h.check("no sanitizer report from forkd", h.assert_no_sanitizer_report)
    print(f"1..{h.n}")
    return 1 if h.failed else 0


if __name__ == "__main__":
    sys.exit(main())
