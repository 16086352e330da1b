#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
forkd-vmm's control op "branch" on the test guest, on the real /dev/kvm: the
snapshot holds guest RAM and disk as they stood at the pause; the source runs
on and its later writes (RAM, and disk through a fresh overlay stacked on the
frozen one) reach neither that branch nor the next; refusals; a frozen copy
that dies half-way leaves no snapshot. TAP output.

Usage: test-branch-vmm.py FORKD_VMM TEST_GUEST_ELF AGENT_CHECK_PY

FORKD_TEST_VCPUS=N boots the base snapshot with N vCPUs (test-branch-vmm-smp2):
every check then also sees each AP's counter go on growing (the guest's "cpus").
"""

import array
import errno
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from tap import Tap

VMM, GUEST, AGENT_PY = sys.argv[1:4]
_spec = importlib.util.spec_from_file_location("agent_check", AGENT_PY)
ac = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ac)

tap = Tap()
check = tap.run  # check(name, fn): fn raises to fail
VCPUS = int(os.environ.get("FORKD_TEST_VCPUS") or 1)


def aps_counting(call):
    """call(op) -> the answer of the test guest's agent: with several vCPUs, every AP
    counts and goes on counting."""
    first = call("cpus")
    assert first["cpus"] == VCPUS and all(c > 0 for c in first["counters"][1:]), first
    for _ in range(300):
        now = call("cpus")
        if all(b > a for a, b in zip(first["counters"][1:], now["counters"][1:])):
            return
        time.sleep(0.1)
    raise AssertionError(f"an AP stopped counting: {first} then {now}")


def connect(path, kind):
    s = socket.socket(socket.AF_UNIX, kind)
    for _ in range(500):
        try:
            s.connect(path)
            return s
        except OSError:
            time.sleep(0.01)
    raise AssertionError(f"{path} never accepted")


class VM:
    def __init__(self, tmp, name, args, env=None):
        self.ctl_path = os.path.join(tmp, name + ".ctl")
        self.agent_path = os.path.join(tmp, name + ".agent")
        self.p = subprocess.Popen([VMM] + args + ["--control-socket", self.ctl_path, "--agent-socket",
                                                  self.agent_path, "--console-log", os.path.join(tmp, name + ".log")],
                                  env=env)
        self.ctl = connect(self.ctl_path, socket.SOCK_SEQPACKET)
        self.ctl.settimeout(30)
        self.agent = None

    def a(self, op, **args):
        if not self.agent:
            for _ in range(500):  # until the VMM listens
                try:
                    self.agent = ac.Agent(self.agent_path)
                    break
                except OSError:
                    time.sleep(0.01)
        t, r = self.agent.call(op, **args)
        assert t == ac.RESP, (op, r)
        return r

    def control(self, req, fd=None):
        data = json.dumps(req).encode()
        if fd is None:
            self.ctl.send(data)
        else:
            self.ctl.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        return json.loads(self.ctl.recv(65536))

    def branch(self, d, tag, mode=None):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        req = {"op": "branch", "dir": d, "tag": tag}
        if mode:
            req["mode"] = mode
        try:
            r = self.control(req, b.fileno())
        finally:
            b.close()
        a.settimeout(30)
        return r, a

    def stop(self):
        try:
            self.control({"op": "shutdown"})
        except OSError:
            pass
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def main():
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
        os.close(fd)
    except OSError:
        print("1..0 # SKIP /dev/kvm is not usable")
        return 0
    tmp = tempfile.mkdtemp(prefix="forkd-branch-vmm-")
    vms = []
    try:
        run(tmp, vms)
    finally:
        for v in vms:
            if v.p.poll() is None:
                v.p.kill()
                v.p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return tap.done()


def run(tmp, vms):
    disk = os.path.join(tmp, "disk.img")
    with open(disk, "wb") as f:
        f.truncate(16 << 20)
    base = os.path.join(tmp, "base")
    ctx = {}

    def make_base():
        v = VM(tmp, "boot", ["boot", "--kernel", GUEST, "--disk", disk, "--mem-mib", "64", "--vcpus", str(VCPUS)])
        vms.append(v)
        assert v.a("ping")["pong"]
        aps_counting(v.a)
        # A booted VM's RAM is a shared memfd: a fork would not freeze it.
        r, _ = v.branch(os.path.join(tmp, "nope"), "nope")
        assert not r["ok"] and "restored" in r["error"], r
        assert v.control({"op": "snapshot", "dir": base, "tag": "base"})["ok"]
        aps_counting(v.a)
        assert json.load(open(os.path.join(base, "snapshot.json")))["vcpus"] == VCPUS
        v.stop()
    check("a snapshot to start from; a booted VM refuses to branch", make_base)

    def ram_and_disk():
        # The copies write only after a stall, so the source's later writes land first.
        v = VM(tmp, "src", ["restore", "--snapshot", base, "--overlay-dir", tmp],
               env=dict(os.environ, FORKD_TEST_BRANCH_STALL_MS="400"))
        vms.append(v)
        ctx["src"] = v
        a_sum = v.a("mem_write", offset_pages=0, pages=64, pattern=0x11111111)["checksum"]
        v.a("disk_write", block=3, pattern=111)
        v.a("disk_write", block=5, pattern=222)
        r, res1 = v.branch(os.path.join(tmp, "b1"), "b1")
        assert r["ok"] and r["pause_us"] > 0 and r["pid"] > 0 and r["mode"] == "full", r
        # The source runs on at once, while the copy has not written yet.
        assert v.a("ping")["pong"]
        # Later writes of the source: RAM, a block of the frozen layer, a new block.
        v.a("mem_write", offset_pages=0, pages=64, pattern=0x22222222)
        v.a("disk_write", block=3, pattern=333)
        assert v.a("disk_read", block=3)["first"] == 333
        assert v.a("disk_read", block=5)["first"] == 222  # from the frozen layer
        r, res2 = v.branch(os.path.join(tmp, "b2"), "b2")
        assert r["ok"], r
        v.a("disk_write", block=7, pattern=444)
        v.a("disk_write", block=5, pattern=555)
        assert [v.a("disk_read", block=b)["first"] for b in (3, 5, 7)] == [333, 555, 444]
        assert not os.path.exists(os.path.join(tmp, "b1")), "the copy did not stall"
        assert json.loads(res1.recv(4096)) == {"ok": True, "dir": os.path.join(tmp, "b1")}
        assert res1.recv(4096) == b""  # the copy is gone
        assert json.loads(res2.recv(4096))["ok"]
        assert subprocess.run([VMM, "check", os.path.join(tmp, "b1")], capture_output=True).returncode == 0
        for tag, mem_sum, blocks in (("b1", a_sum, [111, 222, 0]), ("b2", None, [333, 222, 0])):
            c = VM(tmp, "c-" + tag, ["restore", "--snapshot", os.path.join(tmp, tag)])
            vms.append(c)
            got = c.a("mem_checksum", offset_pages=0, pages=64)["checksum"]
            if mem_sum:
                assert got == mem_sum, (tag, got, mem_sum)
            assert [c.a("disk_read", block=b)["first"] for b in (3, 5, 7)] == blocks, tag
            c.stop()
        assert not [x for x in os.listdir(tmp) if ".tmp." in x]
        # The disk was not copied: the base and the frozen overlays are hard links.
        meta = {t: json.load(open(os.path.join(tmp, t, "snapshot.json"))) for t in ("b1", "b2")}
        assert meta["b1"]["disk_layers"] == 1 and meta["b2"]["disk_layers"] == 2, meta
        ino = lambda *p: os.stat(os.path.join(tmp, *p)).st_ino  # noqa: E731
        assert ino("b1", "disk.img") == ino("b2", "disk.img") == ino("base", "disk.img")
        assert ino("b1", "disk.layer.1") == ino("b2", "disk.layer.1")
        assert os.stat(os.path.join(tmp, "b2", "disk.layer.2")).st_blocks * 512 <= 3 * 4096 + 4096
        # A branch of a VM restored from a layered snapshot: its layers, and one more.
        c = VM(tmp, "c-b2b", ["restore", "--snapshot", os.path.join(tmp, "b2"), "--overlay-dir", tmp])
        vms.append(c)
        c.a("disk_write", block=9, pattern=999)
        r, res = c.branch(os.path.join(tmp, "b3"), "b3")
        assert r["ok"] and json.loads(res.recv(4096))["ok"], r
        c.stop()
        assert json.load(open(os.path.join(tmp, "b3", "snapshot.json")))["disk_layers"] == 3
        assert ino("b3", "disk.layer.2") == ino("b2", "disk.layer.2")
        c = VM(tmp, "c-b3", ["restore", "--snapshot", os.path.join(tmp, "b3")])
        vms.append(c)
        assert [c.a("disk_read", block=b)["first"] for b in (3, 5, 7, 9)] == [333, 222, 0, 999]
        c.stop()
        # A layer's map that does not fit the disk is refused, with a reason.
        with open(os.path.join(tmp, "b3", "disk.layer.1.map"), "ab") as f:
            f.write(b"x")
        out = subprocess.run([VMM, "check", os.path.join(tmp, "b3")], capture_output=True, text=True)
        assert out.returncode != 0 and "disk.layer.1.map" in out.stderr, out
    check("branch: RAM and disk as at the pause; the source's later writes reach neither branch", ram_and_disk)

    def refusals():
        v = ctx["src"]
        d = os.path.join(tmp, "r")
        r = v.control({"op": "branch", "dir": d, "tag": "r"})
        assert not r["ok"] and "result fd" in r["error"], r
        for req, word in (({"dir": "rel/path", "tag": "r"}, "absolute"), ({"dir": d, "tag": "bad/tag"}, "tag"),
                          ({"dir": d, "tag": "r", "mode": "live"}, "mode"),
                          ({"dir": d, "tag": "r", "mode": "diff"}, "parent_dir"),
                          ({"dir": d, "tag": "r", "mode": "diff", "parent_dir": os.path.join(tmp, "nope"),
                            "parent_tag": "nope"}, "gone"),
                          ({"dir": os.path.join(tmp, "b1"), "tag": "b1"}, "exists")):
            a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            r = v.control(dict(op="branch", **req), b.fileno())
            b.close()
            assert not r["ok"] and word in r["error"], (req, r)
            a.settimeout(1)
            assert a.recv(100) == b""  # nothing forked: the only other end is closed
        assert v.a("ping")["pong"]
    check("refusals: no result fd, relative dir, bad tag, unknown mode, existing dir; the VM runs on", refusals)

    def killed_copy():
        env = dict(os.environ, FORKD_TEST_BRANCH_STALL_MS="5000")
        v = VM(tmp, "stall", ["restore", "--snapshot", base], env=env)
        vms.append(v)
        r, res = v.branch(os.path.join(tmp, "k"), "k")
        assert r["ok"], r
        staging = os.path.join(tmp, f"k.tmp.{r['pid']}")
        deadline = time.monotonic() + 10
        while not os.path.isdir(staging):
            assert time.monotonic() < deadline, "no staging directory"
            time.sleep(0.01)
        os.kill(r["pid"], signal.SIGKILL)
        assert res.recv(4096) == b""  # no report: it died
        assert not os.path.exists(os.path.join(tmp, "k"))
        assert v.a("ping")["pong"]
        v.stop()
    check("a frozen copy killed half-way: no report, no snapshot, only its staging directory", killed_copy)

    def fork_running():
        v = VM(tmp, "fsrc", ["restore", "--snapshot", base, "--overlay-dir", tmp])
        vms.append(v)
        want = v.a("mem_write", offset_pages=8, pages=16, pattern=0x5a5a5a5a)["checksum"]
        v.a("disk_write", block=4, pattern=4444)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            r = v.control({"op": "fork"}, theirs.fileno())
        finally:
            theirs.close()
        assert r["ok"] and r["pause_us"] > 0 and r["pid"] > 0, r
        ours.settimeout(30)
        ev = json.loads(ours.recv(65536))
        assert ev["event"] == "ready" and ev["mem_size"] == 64 << 20, ev
        # The source runs on; what it writes now, the children do not see.
        v.a("mem_write", offset_pages=8, pages=16, pattern=0x77777777)
        v.a("disk_write", block=4, pattern=7777)
        ids = ["fk-0", "fk-1", "fk-2"]
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in ids]
        req = json.dumps({"op": "spawn", "ids": ids, "with_control": False}).encode()
        ours.sendmsg([req], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [p[1].fileno() for p in pairs]))])
        for p in pairs:
            p[1].close()
        rep = json.loads(ours.recv(65536))
        assert rep["ok"] and len(rep["pids"]) == 3 and all(x > 0 for x in rep["pids"]), rep
        agents = []
        for p in pairs:
            ag = ac.Agent.__new__(ac.Agent)
            ag.s, ag.next_id, ag.buf = p[0], 1, b""
            p[0].settimeout(10)
            agents.append(ag)
        aps_counting(v.a)
        for k, ag in enumerate(agents):
            aps_counting(lambda op: ag.call(op)[1])
            t, got = ag.call("mem_checksum", offset_pages=8, pages=16)
            assert t == ac.RESP and got["checksum"] == want, (k, got, want)
            t, got = ag.call("disk_read", block=4)
            assert got["first"] == 4444, (k, got)
            t, got = ag.call("identity")
            assert got["id"] == ids[k], got
        # A child's writes are its own.
        agents[0].call("disk_write", block=4, pattern=1)
        assert agents[1].call("disk_read", block=4)[1]["first"] == 4444
        assert v.a("disk_read", block=4)["first"] == 7777
        # Hanging up ends the template and its children; the source lives on.
        ours.close()
        for p in pairs:
            p[0].settimeout(10)
            try:
                while p[0].recv(65536):
                    pass
            except OSError:
                pass
        assert v.a("ping")["pong"]
        v.stop()
    check("fork: the frozen copy becomes a template; children have RAM and disk as at the pause, "
          "their own identity, and die with it", fork_running)

    def diff():
        import hashlib
        v = VM(tmp, "dsrc", ["restore", "--snapshot", base, "--overlay-dir", tmp])
        vms.append(v)
        x = v.a("mem_write", offset_pages=0, pages=256, pattern=0x0d0d0d0d)["checksum"]
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        r = v.control({"op": "branch", "dir": os.path.join(tmp, "d1"), "tag": "d1", "mode": "diff",
                       "parent_dir": base, "parent_tag": "base"}, b.fileno())
        b.close()
        a.settimeout(30)
        assert r["ok"] and json.loads(a.recv(4096))["ok"], r
        v.stop()
        meta = json.load(open(os.path.join(tmp, "d1", "snapshot.json")))
        with open(os.path.join(base, "memory.bin"), "rb") as f:
            want = hashlib.sha256(f.read()).hexdigest()
        assert meta["parent_tag"] == "base" and meta["parent_content_hash"] == want, meta
        st = os.stat(os.path.join(tmp, "d1", "memory.bin"))
        assert st.st_size == 64 << 20 and st.st_blocks * 512 < 8 << 20, st  # only what changed
        c = VM(tmp, "d1c", ["restore", "--snapshot", os.path.join(tmp, "d1"), "--overlay-dir", tmp])
        vms.append(c)
        assert c.a("mem_checksum", offset_pages=0, pages=256)["checksum"] == x
        assert c.a("ping")["pong"]
        y = c.a("mem_write", offset_pages=512, pages=16, pattern=0x0e0e0e0e)["checksum"]
        c.a("disk_write", block=6, pattern=6666)  # d2 gets a disk layer
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        r = c.control({"op": "branch", "dir": os.path.join(tmp, "d2"), "tag": "d2", "mode": "diff",
                       "parent_dir": os.path.join(tmp, "d1"), "parent_tag": "d1"}, b.fileno())
        b.close()
        a.settimeout(30)
        assert r["ok"] and json.loads(a.recv(4096))["ok"], r
        c.stop()
        c = VM(tmp, "d2c", ["restore", "--snapshot", os.path.join(tmp, "d2")])
        vms.append(c)
        assert c.a("mem_checksum", offset_pages=0, pages=256)["checksum"] == x
        assert c.a("mem_checksum", offset_pages=512, pages=16)["checksum"] == y
        c.stop()
        assert json.load(open(os.path.join(tmp, "d2", "snapshot.json")))["disk_layers"] == 1
        # compact: the chain head as a flat snapshot, staged and renamed into place
        flat = os.path.join(tmp, "d2flat")
        crash = subprocess.run([VMM, "compact", "--snapshot", os.path.join(tmp, "d2"), "--tag", "d2flat", flat],
                               capture_output=True, text=True, env=dict(os.environ, FORKD_TEST_CRASH_COMPACT="disk"))
        assert crash.returncode == 99 and not os.path.exists(flat), crash
        assert os.path.isdir(os.path.join(tmp, ".compact-staging-d2flat"))
        out = subprocess.run([VMM, "compact", "--snapshot", os.path.join(tmp, "d2"), "--tag", "d2flat", flat],
                             capture_output=True, text=True)
        assert out.returncode == 0 and json.loads(out.stdout) == {"ok": True}, out
        assert not os.path.exists(os.path.join(tmp, ".compact-staging-d2flat"))
        meta = json.load(open(os.path.join(flat, "snapshot.json")))
        assert meta["tag"] == "d2flat" and meta.get("parent_tag") is None and meta.get("disk_layers", 0) == 0, meta
        assert sorted(os.listdir(flat)) == ["disk.img", "memory.bin", "snapshot.json", "vmstate"], os.listdir(flat)
        st = os.stat(os.path.join(flat, "memory.bin"))
        assert st.st_size == 64 << 20 and st.st_blocks * 512 < 32 << 20, st  # sparse where zero
        c = VM(tmp, "flatc", ["restore", "--snapshot", flat])
        vms.append(c)
        assert c.a("mem_checksum", offset_pages=0, pages=256)["checksum"] == x
        assert c.a("mem_checksum", offset_pages=512, pages=16)["checksum"] == y
        assert c.a("disk_read", block=6)["first"] == 6666
        c.stop()
        out = subprocess.run([VMM, "compact", "--snapshot", os.path.join(tmp, "d2"), "--tag", "d2flat", flat],
                             capture_output=True, text=True)
        assert out.returncode == 1 and json.loads(out.stdout)["errno"] == errno.EEXIST, out
        # A parent that changed is refused when the chain is loaded.
        with open(os.path.join(tmp, "d1", "memory.bin"), "r+b") as f:
            f.seek(5 << 20)
            f.write(b"tampered")
        out = subprocess.run([VMM, "check", os.path.join(tmp, "d2")], capture_output=True, text=True)
        assert out.returncode != 0 and "but parent now has content" in out.stderr, out
        out = subprocess.run([VMM, "compact", "--snapshot", os.path.join(tmp, "d2"), "--tag", "d2flat2",
                              os.path.join(tmp, "d2flat2")], capture_output=True, text=True)
        assert out.returncode == 1 and json.loads(out.stdout)["errno"] == errno.ESTALE, out
        assert "but parent now has content" in json.loads(out.stdout)["error"], out
        assert not [n for n in os.listdir(tmp) if "d2flat2" in n], os.listdir(tmp)
    check("diff: only the changed pages, parent_tag and SHA-256 of the parent; a chain of two restores; "
          "compact writes it flat (memory, merged disk), staged, crash-safe; a changed parent is refused", diff)

    ctx["src"].stop()


if __name__ == "__main__":
    sys.exit(main())
