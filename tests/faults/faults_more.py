# SPDX-License-Identifier: LGPL-2.1-or-later
"""Parts 2-4 of test-faults.py: a VMM killed, a full disk, forkd-stack up after forkd died."""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

tf = sys.modules["test_forkd"]
tb = sys.modules["test_branch"]
from dbusmini import Bus, DBusError  # noqa: E402

MEM_MIB = 64


def ping(h, sid):
    assert json.loads(h.m("Ping", "s", [sid])[0])["pong"], sid


def disk_image(h):
    disk = os.path.join(h.tmp, "disk.img")
    if not os.path.exists(disk):
        with open(disk, "wb") as f:
            f.truncate(16 << 20)
    return disk


def template_pids(h, tag):
    """The template VMM of snapshot tag: a forkd-vmm child of forkd naming snapshots/<tag>."""
    out = []
    for pid in tf.vmm_processes(os.path.join(h.state, "snapshots", tag)):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
        ppid = int(st[st.rindex(")") + 2:].split()[1])
        if ppid == h.forkd.pid and b"template" in argv:
            out.append(pid)
    return out


# ---- 3. a VMM killed ----------------------------------------------------------

def vmm_kill(h, scale):
    h.start_bus()
    h.start_forkd()
    disk = disk_image(h)
    h.m("CreateSnapshot", "sssuu", ["base", tf.GUEST, disk, MEM_MIB, 30], timeout=120)
    opts = {"memory_limit_mib": ("u", 48)} if h.cgroot else {}
    recs = os.path.join(h.state, "sandboxes")
    overlays = os.path.join(h.state, "overlays")

    def gone(sids):
        live = set(h.sandboxes())
        assert not (set(sids) & live), f"still listed: {set(sids) & live}"
        tf.wait_for(lambda: not (set(h.cgroup_children()) & set(sids)), 20 * scale, "their cgroups to go")
        left = {n[:-5] for n in os.listdir(recs)} & set(sids)
        assert not left, f"records left: {left}"
        for sid in sids:
            try:
                h.m("Ping", "s", [sid])
                raise AssertionError(f"{sid} still answers")
            except DBusError as e:
                assert e.name == "org.forkd.Error.NoSuchSandbox", e.name

    def sandbox_pid():
        infos = h.fork("base", 3, opts)
        ids = [i["id"] for i in infos]
        for i in infos:
            ping(h, i["id"])
            # a write to its disk, so that it has an overlay
            tb.poke(i["pid"], b"dirty")
        victim = infos[1]
        os.kill(victim["pid"], signal.SIGKILL)
        reason = h.wait_removed(victim["id"], 30 * scale)
        assert reason == "crashed", reason
        gone([victim["id"]])
        for sid in (ids[0], ids[2]):
            ping(h, sid)
        assert h.forkd.poll() is None
        h.terminate_all()
        gone(ids)
        assert not os.listdir(overlays), os.listdir(overlays)
    h.check("vmm: a sandbox's VMM killed with SIGKILL: SandboxRemoved crashed, cgroup and record gone, "
            "the others answer", sandbox_pid)

    def template_pid():
        infos = h.fork("base", 3, opts)
        ids = [i["id"] for i in infos]
        tpl = template_pids(h, "base")
        assert len(tpl) == 1, f"templates of base: {tpl}"
        os.kill(tpl[0], signal.SIGKILL)
        for sid in ids:
            reason = h.wait_removed(sid, 30 * scale)
            assert reason in ("crashed", "terminated", "exited"), (sid, reason)
        gone(ids)
        assert not os.listdir(overlays), os.listdir(overlays)
        tf.wait_for(lambda: not [p for p in tf.vmm_processes(h.tmp)], 20 * scale, "every VMM to exit")
        # The snapshot forks again, from a new template.
        c = h.fork("base", 2, opts)
        for i in c:
            ping(h, i["id"])
        assert template_pids(h, "base") and template_pids(h, "base") != tpl
        h.terminate_all()
        gone([i["id"] for i in c])
    h.check("vmm: the template's VMM killed with SIGKILL: every child removed and freed, the snapshot forks again",
            template_pid)


# ---- 2. a full disk -------------------------------------------------------------

ENOSPC_RE = re.compile(r"No space left on device|ENOSPC", re.I)


def full_disk(h, scale):
    """forkd on a tmpfs state directory mounted in a private mount namespace."""
    h.start_bus()
    disk = disk_image(h)
    size_mib = 160
    os.makedirs(h.state)
    log = open(os.path.join(h.tmp, "forkd.disk.log"), "w")
    h.logs.append(log.name)
    args = [tf.FORKD, "--bus-address", h.address, "--state-dir", h.state]
    if h.cgroot:
        args += ["--cgroup-root", h.cgroot]
    env = dict(os.environ, FORKD_VMM=tf.VMM)
    # unshare execs sh, which mounts and execs forkd: one pid throughout.
    h.forkd = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                                'mount -t tmpfs -o size="$1" forkd-faults "$2" && shift 2 && exec "$@"', "sh",
                                f"{size_mib}m", h.state] + args, stdout=log, stderr=log, env=env)
    log.close()

    def owned():
        if h.forkd.poll() is not None:
            raise AssertionError(f"forkd exited with {h.forkd.returncode}")
        return tf.name_owner_pid(h.bus) == h.forkd.pid
    tf.wait_for(owned, 20 * scale, "forkd on its tmpfs to own its name")
    # The tmpfs as the test sees it: through forkd's root, in its mount namespace.
    root = f"/proc/{h.forkd.pid}/root{h.state}"
    snaps = os.path.join(root, "snapshots")
    filler = os.path.join(root, "filler")
    ctx = {}

    def free_bytes():
        st = os.statvfs(root)
        return st.f_bavail * st.f_frsize

    def fill(leave):
        """Fill the tmpfs so that at most `leave` bytes stay free. What forkd and its VMMs
        write meanwhile (records, logs) can take the last bytes first: the filler then
        stops at ENOSPC, the disk as full as asked or fuller."""
        if os.path.exists(filler):
            os.unlink(filler)
        n = free_bytes() - leave
        if n <= 0:
            return
        with open(filler, "wb", buffering=0) as f:
            chunk = b"\xff" * (1 << 20)
            try:
                while n > 0:
                    n -= f.write(chunk[:min(n, len(chunk))])
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise

    def nothing_half_written(expect_tags, forks=True):
        names = os.listdir(snaps)
        stray = [n for n in names if n.startswith(".") or ".tmp." in n]
        assert not stray, f"half-written leftovers: {stray}"
        listed = {s["tag"] for s in h.m("ListSnapshots")[0]}
        assert listed == set(names) == set(expect_tags), f"listed {sorted(listed)}, on disk {sorted(names)}"
        for t in sorted(listed) if forks else ():
            c = h.fork(t, 1)[0]
            ping(h, c["id"])
            h.m("TerminateSandbox", "s", [c["id"]])
            h.wait_removed(c["id"])

    def first():
        before = free_bytes()
        h.m("CreateSnapshot", "sssuu", ["a", tf.GUEST, disk, MEM_MIB, 30], timeout=120)
        used = before - free_bytes()
        ctx["snap_bytes"] = used
        # A bundle of "a" to unpack later (forkctl writes it outside the tmpfs).
        bundle = os.path.join(h.tmp, "a.tar.zst")
        p = subprocess.run([tf_forkctl(), "--bus-address", h.address, "--no-progress", "pack", "--tag", "a",
                            "--out", bundle], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        ctx["bundle"] = bundle
        print(f"# a snapshot of the test guest takes {used / 1048576:.1f} MiB on the tmpfs")
        nothing_half_written(["a"])
    h.check("disk: forkd on a 160 MiB tmpfs (private mount namespace) creates and forks a snapshot", first)

    def expect_enospc(what, fn):
        try:
            fn()
        except DBusError as e:
            assert ENOSPC_RE.search(e.message), f"{what}: the error does not name ENOSPC: {e.name}: {e.message}"
            return e.message
        raise AssertionError(f"{what} succeeded on a full disk")

    def unpack(tag):
        p = subprocess.run([tf_forkctl(), "--bus-address", h.address, "--no-progress", "unpack", ctx["bundle"],
                            "--tag", tag], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise DBusError("forkctl", p.stderr.strip())

    def full():
        # Two fill levels: nothing free, and about half a snapshot free.
        for k, leave in enumerate((0, ctx["snap_bytes"] // 2)):
            try:
                full_once(k, leave)
            finally:
                # A failure here must not leave the disk full for the next check.
                if os.path.exists(filler):
                    os.unlink(filler)

    def full_once(k, leave):
        p = h.fork("a", 1)[0]
        tb.poke(p["pid"], b"x" * 65536)
        fill(leave)
        msg = expect_enospc("create", lambda: h.m("CreateSnapshot", "sssuu", [f"x{k}", tf.GUEST, disk,
                                                                              MEM_MIB, 30], timeout=120))
        print(f"# create, {leave >> 10} KiB free: {msg.splitlines()[0]}")
        nothing_half_written(["a"], forks=False)
        msg = expect_enospc("branch", lambda: h.m("BranchSandbox", "sssb", [p["id"], f"y{k}", "full", True],
                                                  timeout=120))
        print(f"# branch, {leave >> 10} KiB free: {msg.splitlines()[0]}")
        nothing_half_written(["a"], forks=False)
        msg = expect_enospc("unpack", lambda: unpack(f"z{k}"))
        print(f"# unpack, {leave >> 10} KiB free: {msg.splitlines()[-1]}")
        nothing_half_written(["a"], forks=False)
        assert h.forkd.poll() is None
        os.unlink(filler)
        ping(h, p["id"])
        h.m("TerminateSandbox", "s", [p["id"]])
        h.wait_removed(p["id"])
        nothing_half_written(["a"])
    h.check("disk: create, branch and unpack on a full tmpfs fail naming ENOSPC and leave nothing behind", full)

    def holders():
        """What holds space on the tmpfs: its files, and open files of it (deleted ones too)."""
        out = [f"{free_bytes() >> 10} KiB free"]
        for dirpath, _, files in os.walk(root):
            for f in files:
                path = os.path.join(dirpath, f)
                try:
                    out.append(f"{os.stat(path).st_blocks >> 1} KiB {path[len(root):]}")
                except OSError:
                    pass
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    t = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if t.startswith(h.state + "/") and (t.endswith(" (deleted)") or "/." in t):
                        with open(f"/proc/{pid}/comm") as c:
                            comm = c.read().strip()
                        out.append(f"pid {pid} ({comm}) fd {fd}: {t}")
            except OSError:
                pass
        return out

    def freed():
        try:
            h.m("CreateSnapshot", "sssuu", ["x", tf.GUEST, disk, MEM_MIB, 30], timeout=120)
        except DBusError:
            for line in holders():
                print(f"# tmpfs: {line}")
            raise
        p = h.fork("a", 1)[0]
        h.m("BranchSandbox", "sssb", [p["id"], "y", "diff", True], timeout=120)
        h.m("TerminateSandbox", "s", [p["id"]])
        h.wait_removed(p["id"])
        h.m("DeleteSnapshot", "sbb", ["x", False, False])
        unpack("z")
        nothing_half_written(["a", "y", "z"])
    h.check("disk: once space is freed, create, branch and unpack work again", freed)
    h.terminate_all()


def tf_forkctl():
    return os.environ["FORKCTL"]


# ---- 4. forkd-stack up after forkd died ----------------------------------------

def stack_restart(h, scale):
    top = os.environ.get("FORKD_SOURCE_ROOT")
    build = os.environ.get("FORKD_BUILD_DIR")
    state = os.path.join(h.tmp, "stack")
    port = 20000 + os.getpid() % 12000  # below the ephemeral ports (32768-60999)
    # FORKD_STACK_GUEST=test: the test guest on real KVM too, as tools/run-tests has it
    # (otherwise up on real KVM wants the Linux image that tools/mkimage builds).
    env = dict(os.environ, FORKD_BUILD_DIR=build or "", FORKD_STACK_NO_BUILD="1", FORKD_STACK_GUEST="test")

    def stack(*args):
        p = subprocess.run([os.path.join(top, "tools/forkd-stack"), *args, "--state-dir", state],
                           capture_output=True, text=True, env=env, timeout=120 * scale)
        return p

    def pidof(name):
        """The recorded pid; 0 without a record (no private bus: the system bus is used)."""
        try:
            with open(os.path.join(state, f"{name}.pid")) as f:
                return int(f.read().split()[0])
        except FileNotFoundError:
            return 0

    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read()
            return st[st.rindex(")") + 2] not in "ZX"
        except OSError:
            return False

    def parse(out):
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def works(v):
        with open(v["FORKD_TOKEN_FILE"]) as f:
            token = f.read().strip()
        req = urllib.request.Request(v["FORKD_URL"] + "/v1/snapshots", headers={"Authorization": "Bearer " + token})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200, r.status
            return json.load(r)

    def run():
        if not top or not build:
            raise AssertionError("FORKD_SOURCE_ROOT and FORKD_BUILD_DIR must be set")
        if not os.path.exists(os.path.join(build, "src/rest/forkd-rest")):
            raise AssertionError("forkd-rest is not built")
        try:
            p = stack("up", "--port", str(port))
            assert p.returncode == 0, f"up: {p.stderr}"
            v = parse(p.stdout)
            works(v)
            bus, rest, forkd = pidof("dbus"), pidof("rest"), pidof("forkd")
            os.kill(forkd, signal.SIGKILL)
            tf.wait_for(lambda: not alive(forkd), 10 * scale, "forkd to die")
            p = stack("up", "--port", str(port))
            assert p.returncode == 0, f"up after forkd died: {p.stderr}"
            v2 = parse(p.stdout)
            assert v2 == v, f"the variables changed: {v} -> {v2}"
            assert pidof("dbus") == bus and (not bus or alive(bus)), "the bus was not kept"
            assert pidof("rest") == rest and alive(rest), "forkd-rest was not kept"
            assert pidof("forkd") != forkd and alive(pidof("forkd"))
            works(v2)  # forkd-rest, with its token, reaches the new forkd
            # With everything up, up is still refused.
            p = stack("up", "--port", str(port))
            assert p.returncode != 0 and "already running" in p.stderr, (p.returncode, p.stderr)
            # forkd-rest died (not forkd): up starts it again, the token stays.
            os.kill(rest, signal.SIGKILL)
            tf.wait_for(lambda: not alive(rest), 10 * scale, "forkd-rest to die")
            p = stack("up", "--port", str(port))
            assert p.returncode == 0, f"up after forkd-rest died: {p.stderr}"
            assert parse(p.stdout) == v
            assert pidof("dbus") == bus and pidof("rest") != rest and alive(pidof("rest"))
            works(v)
        finally:
            p = stack("down")
            for name in ("dbus", "rest", "forkd"):
                assert not os.path.exists(os.path.join(state, f"{name}.pid")), name
            assert p.returncode == 0, p.stderr
        assert not tf.vmm_processes(state)
    h.check("stack: forkd-stack up after forkd (then forkd-rest) was killed restarts it and keeps the rest", run)
