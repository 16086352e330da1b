#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
Volumes (CreateSnapshotFromFds option "volumes") with the test guest: the D-Bus
checks, the snapshot directory's volume files and snapshot.json, SnapshotInfo
and SandboxInfo volumes, the one-holder rule of rw volumes (VolumeBusy for
n > 1 and a second holder, released when the holder ends or is paused) and a
branch that carries them. The test guest mounts nothing (forkd sends it no
mount_volumes); mounting is checked with the Linux guest. TAP output.
"""

import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("test_forkd", os.path.join(HERE, "test-forkd.py"))
tf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tf)

DEST, PATH, IFACE = tf.DEST, tf.PATH, tf.IFACE
VOLUME_BUSY = "org.forkd.Error.VolumeBusy"
MIB = 1 << 20


def main():
    return tf.run_on_harness(run, "cgroups, the system-bus policy")


def run(h):
    h.setup_cgroups()
    disk = os.path.join(h.tmp, "disk.img")
    with open(disk, "wb") as f:
        f.truncate(16 * MIB)
    vols = {}
    for name, size in (("ro", 2), ("cow", 3), ("rw", 4)):
        vols[name] = os.path.join(h.tmp, f"{name}.img")
        with open(vols[name], "wb") as f:
            f.write(name.encode() * 1024)
            f.truncate(size * MIB)
    h.start_bus()
    h.start_forkd()
    b = tf.Bus(h.address, unix_fds=True)

    def create(tag, volumes, modes=None):
        """volumes: [(path, guest_path, mode)]; each opened as its mode needs."""
        fds = [os.open(tf.GUEST, os.O_RDONLY), os.open(disk, os.O_RDONLY)]
        entries = []
        try:
            for path, guest, mode in volumes:
                flags = os.O_RDWR if mode == "rw" else os.O_RDONLY
                if modes and path in modes:
                    flags = modes[path]
                fds.append(os.open(path, flags))
                entries.append((len(fds) - 1, guest, mode))
            opts = {"volumes": ("a(hss)", entries)} if volumes else {}
            return b.call(DEST, PATH, IFACE, "CreateSnapshotFromFds", "shhuua{sv}", [tag, 0, 1, 64, 30, opts],
                          fds=fds, timeout=120)[0]
        finally:
            for fd in fds:
                os.close(fd)

    def expect_invalid(volumes, says, modes=None):
        try:
            create("bad", volumes, modes)
        except tf.DBusError as e:
            assert e.name == tf.INVALID_ARGS, (volumes, e.name, e.message)
            assert says in e.message, (volumes, e.message)
            return
        raise AssertionError(f"{volumes} was accepted")

    def invalid_args():
        ro = vols["ro"]
        expect_invalid([(ro, "data", "ro")], "guest_path")
        expect_invalid([(ro, "/", "ro")], "guest_path")
        expect_invalid([(ro, "/a/../b", "ro")], "guest_path")
        expect_invalid([(ro, "/a//b", "ro")], "guest_path")
        expect_invalid([(ro, "/proc/x", "ro")], "guest_path")
        expect_invalid([(ro, "/.forkd", "ro")], "guest_path")
        expect_invalid([(ro, "/" + "a" * 255, "ro")], "guest_path")
        expect_invalid([(ro, "/data", "RW")], "must be ro, cow or rw")
        expect_invalid([(ro, "/data", "ro"), (ro, "/data", "cow")], "given twice")
        # 25 entries on one descriptor: a message on a system bus carries at most 16.
        fds = [os.open(tf.GUEST, os.O_RDONLY), os.open(disk, os.O_RDONLY), os.open(ro, os.O_RDONLY)]
        try:
            b.call(DEST, PATH, IFACE, "CreateSnapshotFromFds", "shhuua{sv}",
                   ["bad", 0, 1, 64, 30, {"volumes": ("a(hss)", [(2, f"/v{i}", "ro") for i in range(25)])}], fds=fds)
            raise AssertionError("25 volumes were accepted")
        except tf.DBusError as e:
            assert e.name == tf.INVALID_ARGS and "At most 24" in e.message, (e.name, e.message)
        finally:
            for fd in fds:
                os.close(fd)
        expect_invalid([(h.tmp, "/data", "ro")], "not a regular file")
        expect_invalid([(vols["rw"], "/data", "rw")], "not open for reading and writing",
                       modes={vols["rw"]: os.O_RDONLY})
        assert not os.path.exists(os.path.join(h.state, "snapshots", "bad"))
    h.check("volumes: guest paths, modes, counts, file types and access modes are checked (InvalidArgs)",
            invalid_args)

    def snapshot_with_volumes():
        info = create("v1", [(vols["ro"], "/data", "ro"), (vols["cow"], "/srv/cache", "cow"),
                             (vols["rw"], "/home/u", "rw")])
        d = info["dir"]
        with open(os.path.join(d, "snapshot.json")) as f:
            meta = json.load(f)
        st = os.stat(vols["rw"])
        assert meta["volumes"] == [
            {"file": "volume-0.img", "guest_path": "/data", "mode": "ro"},
            {"file": "volume-1.img", "guest_path": "/srv/cache", "mode": "cow"},
            {"file": None, "guest_path": "/home/u", "mode": "rw", "host_path": vols["rw"],
             "dev": st.st_dev, "ino": st.st_ino}], meta["volumes"]
        for k, name in ((0, "ro"), (1, "cow")):
            with open(os.path.join(d, f"volume-{k}.img"), "rb") as f, open(vols[name], "rb") as g:
                assert f.read() == g.read(), name  # the snapshot owns a copy
        assert not os.path.exists(os.path.join(d, "volume-2.img"))
        got = {v["guest_path"]: v for v in h.m("GetSnapshotInfo", "s", ["v1"])[0]["volumes"]}
        assert got["/data"] == {"guest_path": "/data", "mode": "ro", "size": 2 * MIB}, got
        assert got["/srv/cache"]["size"] == 3 * MIB and "host_path" not in got["/srv/cache"], got
        assert got["/home/u"] == {"guest_path": "/home/u", "mode": "rw", "size": 4 * MIB,
                                  "host_path": vols["rw"]}, got
        # the host files may change now: the snapshot's copies do not
        with open(vols["ro"], "r+b") as f:
            f.write(b"changed")
        with open(os.path.join(d, "volume-0.img"), "rb") as f:
            assert f.read(2) == b"ro"
    h.check("a snapshot with ro, cow and rw volumes: volume-N.img copies, snapshot.json, SnapshotInfo",
            snapshot_with_volumes)

    ctx = {}

    def busy_rules():
        msg = h.expect_error(VOLUME_BUSY, "Fork", "sua{sv}", ["v1", 2, {}])
        assert vols["rw"] in msg, msg
        sb = h.fork("v1", 1)[0]
        ctx["holder"] = sb["id"]
        got = {v["guest_path"] for v in h.sandboxes()[sb["id"]]["volumes"]}
        assert got == {"/data", "/srv/cache", "/home/u"}, got
        msg = h.expect_error(VOLUME_BUSY, "Fork", "sua{sv}", ["v1", 1, {}])
        assert vols["rw"] in msg and sb["id"] in msg, msg
        # a fork of the running holder would make its children second holders
        msg = h.expect_error(VOLUME_BUSY, "ForkSandbox", "su", [sb["id"], 1])
        assert vols["rw"] in msg and sb["id"] in msg, msg
    h.check("rw volume: a fork of n > 1, a second holder and a fork of the running holder are VolumeBusy, "
            "naming the file and the holder",
            busy_rules)

    def release_on_pause_and_terminate():
        sid = ctx["holder"]
        h.m("PauseSandbox", "s", [sid], timeout=120)
        sb = h.fork("v1", 1)[0]  # the paused one holds nothing
        h.expect_error(VOLUME_BUSY, "ResumeSandbox", "s", [sid])
        h.m("TerminateSandbox", "s", [sb["id"]])
        h.wait_removed(sb["id"])
        sb2 = h.fork("v1", 1)[0]  # released with its holder
        h.m("TerminateSandbox", "s", [sb2["id"]])
        h.wait_removed(sb2["id"])
    h.check("rw volume: released when its holder is paused or ends", release_on_pause_and_terminate)

    def branch_carries():
        info = create("v2", [(vols["ro"], "/data", "ro"), (vols["cow"], "/srv/cache", "cow")])
        sb = h.fork("v2", 1)[0]
        br = h.m("BranchSandbox", "sssb", [sb["id"], "v2b", "full", True], timeout=120)[0]
        with open(os.path.join(br["dir"], "snapshot.json")) as f:
            meta = json.load(f)
        assert [(v["guest_path"], v["mode"]) for v in meta["volumes"]] == [("/data", "ro"), ("/srv/cache", "cow")]
        for v in meta["volumes"]:
            assert os.path.isfile(os.path.join(br["dir"], v["file"])), v
        kids = h.fork("v2b", 2)
        for k in kids:
            assert {v["guest_path"] for v in h.sandboxes()[k["id"]]["volumes"]} == {"/data", "/srv/cache"}
        h.terminate_all()
        assert info["tag"] == "v2"
    h.check("a branch carries its source's volumes to its snapshot and children", branch_carries)

    print(f"1..{h.n}")
    return 1 if h.failed else 0


if __name__ == "__main__":
    sys.exit(main())
