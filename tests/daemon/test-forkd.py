#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
Integration test of forkd: a private dbus-daemon (system-bus-like config in a
temporary directory), the real forkd, the real forkd-vmm on /dev/kvm, the
test guest, and real cgroups. TAP output; a TAP skip when /dev/kvm is unusable.

Environment: FORKD (the daemon), FORKD_VMM, FORKD_TEST_GUEST.
"""

import contextlib
import fcntl
import glob
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import cgroupcpu
from dbusmini import Bus, DBusError

DEST = "org.forkd.Manager"
PATH = "/org/forkd/Manager"
IFACE = "org.forkd.Manager"
INVALID_ARGS = "org.freedesktop.DBus.Error.InvalidArgs"

def name_owner_pid(bus):
    """The pid of the process that owns forkd's name, or None. Not NameHasOwner alone:
    after a kill -9 the name can stay with the dead forkd's connection for a moment,
    while a process that shared its fd table (a user namespace helper, vmm-userns.c)
    finishes its own exit."""
    try:
        return bus.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                        "GetConnectionUnixProcessID", "s", [DEST])[0]
    except DBusError:
        return None


FORKD = os.environ.get("FORKD")
VMM = os.environ.get("FORKD_VMM")
GUEST = os.environ.get("FORKD_TEST_GUEST")


def skip(reason):
    # Under meson's TAP protocol a skip is "1..0 # SKIP" with exit 0 (77 is an error).
    print(f"1..0 # SKIP {reason}")
    sys.exit(0)


def kvm_usable():
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return fcntl.ioctl(fd, 0xAE00) == 12  # KVM_GET_API_VERSION
    except OSError:
        return False
    finally:
        os.close(fd)


def path_encode(prefix, label):
    # sd_bus_path_encode(): [A-Za-z0-9] kept, everything else _xx.
    out = "".join(c if c.isascii() and c.isalnum() else "_%02x" % ord(c) for c in label)
    return f"{prefix}/{out}"


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def vmm_processes(marker):
    """Live (non-zombie) forkd-vmm processes whose command line names marker."""
    out = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(d + "/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            with open(d + "/stat") as f:
                st = f.read()
        except OSError:
            continue
        state = st[st.rindex(")") + 2]
        if "forkd-vmm" in cmd and marker in cmd and state not in "ZX":
            out.append(int(os.path.basename(d)))
    return out


@contextlib.contextmanager
def template_process(snap, overlay_dir, extra=()):
    """forkd-vmm template of snap, started by hand and driven over its control socket
    as forkd drives it (forkd-vmm(8), TEMPLATE PROTOCOL): yields (process, socket).
    On the way out the socket closes (the template kills its children and ends), the
    process is reaped (killed after 20 s) and its error output left in process.err."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    p = subprocess.Popen([VMM, "template", "--snapshot", snap, "--control-fd", str(b.fileno()),
                          "--overlay-dir", overlay_dir, *extra], pass_fds=[b.fileno()], stderr=subprocess.PIPE)
    b.close()
    a.settimeout(30)
    try:
        yield p, a
    finally:
        a.close()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        p.err = p.stderr.read().decode(errors="replace")
        p.stderr.close()


class Harness:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="forkd-test-")
        os.chmod(self.tmp, 0o755)  # the bus socket lives here; unprivileged callers connect too
        self.state = os.path.join(self.tmp, "state")
        self.bus_proc = None
        self.forkd = None
        self.bus = None
        self.cgroot = None
        self.n = 0
        self.failed = 0
        self.logs = []

    # ---- plumbing ----

    def start_bus(self):
        sock = os.path.join(self.tmp, "bus.sock")
        conf = os.path.join(self.tmp, "bus.conf")
        with open(conf, "w") as f:
            f.write(f"""<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={sock}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow receive_sender="*"/>
  </policy>
  <policy user="root">
    <allow own="org.forkd.Manager"/>
  </policy>
</busconfig>
""")
        self.bus_proc = subprocess.Popen(["dbus-daemon", "--config-file=" + conf, "--nofork", "--nopidfile",
                                          "--print-address=1"], stdout=subprocess.PIPE, text=True)
        self.address = self.bus_proc.stdout.readline().strip()
        if not self.address:
            raise RuntimeError("dbus-daemon did not start")
        self.bus = Bus(self.address)
        self.bus.add_match(f"type='signal',sender='{DEST}',interface='{IFACE}'")

    def start_forkd(self, extra=()):
        log = open(os.path.join(self.tmp, f"forkd.{len(self.logs)}.log"), "w")
        self.logs.append(log.name)
        args = [FORKD, "--bus-address", self.address, "--state-dir", self.state]
        if self.cgroot:
            args += ["--cgroup-root", self.cgroot]
        env = dict(os.environ, FORKD_VMM=VMM)
        self.forkd = subprocess.Popen(args + list(extra), stdout=log, stderr=log, env=env)
        log.close()

        def owned():
            if self.forkd.poll() is not None:
                raise AssertionError(f"forkd exited with {self.forkd.returncode}")
            return name_owner_pid(self.bus) == self.forkd.pid
        wait_for(owned, 20, "forkd to own its name")

    def stop_forkd(self, sig=signal.SIGTERM):
        if self.forkd and self.forkd.poll() is None:
            self.forkd.send_signal(sig)
            try:
                self.forkd.wait(30)
            except subprocess.TimeoutExpired:
                self.forkd.kill()
                self.forkd.wait()
        rc = self.forkd.returncode if self.forkd else 0
        self.forkd = None
        return rc

    def assert_no_sanitizer_report(self):
        for log in self.logs:
            with open(log) as f:
                text = f.read()
            for bad in ("Sanitizer", "runtime error:"):
                assert bad not in text, f"{log}:\n{text[-3000:]}"

    def setup_cgroups(self):
        v1 = "/sys/fs/cgroup/memory"
        if os.path.exists(os.path.join(v1, "memory.limit_in_bytes")):
            self.cgroot = os.path.join(v1, f"forkd-test-{os.getpid()}")
            return
        try:
            with open("/sys/fs/cgroup/cgroup.controllers") as f:
                if "memory" in f.read().split():
                    self.cgroot = f"/sys/fs/cgroup/forkd-test-{os.getpid()}"
        except OSError:
            pass

    def cleanup(self):
        try:
            self.stop_forkd(signal.SIGKILL)
        except Exception:
            pass
        # VMMs die with forkd (PR_SET_PDEATHSIG); wait so that cgroups empty.
        try:
            wait_for(lambda: not vmm_processes(self.tmp), 20, "VMMs to exit")
        except AssertionError:
            for pid in vmm_processes(self.tmp):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if self.bus:
            self.bus.close()
        if self.bus_proc:
            self.bus_proc.kill()
            self.bus_proc.wait()
        for root in (self.cgroot, self.cpu_cgroot()):
            if not root or not os.path.isdir(root):
                continue
            deadline = time.monotonic() + 20
            while os.path.isdir(root) and time.monotonic() < deadline:
                for d in glob.glob(root + "/*/"):
                    try:
                        os.rmdir(d)
                    except OSError:
                        pass
                try:
                    os.rmdir(root)
                except OSError:
                    time.sleep(0.05)
        if os.environ.get("FORKD_TEST_KEEP"):
            print(f"# kept {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- helpers ----

    def m(self, member, sig="", args=(), timeout=60):
        return self.bus.call(DEST, PATH, IFACE, member, sig, args, timeout)

    def expect_error(self, name, member, sig="", args=(), path=PATH, iface=IFACE):
        try:
            self.bus.call(DEST, path, iface, member, sig, args)
        except DBusError as e:
            assert e.name == name, f"{member}{args!r}: expected {name}, got {e.name} ({e.message})"
            return e.message
        raise AssertionError(f"{member}{args!r} succeeded, expected {name}")

    def check(self, name, fn):
        self.n += 1
        try:
            fn()
            print(f"ok {self.n} - {name}")
        except Exception as e:  # noqa: BLE001
            self.failed += 1
            print(f"not ok {self.n} - {name}")
            for line in traceback.format_exception(type(e), e, e.__traceback__):
                for sub in line.rstrip().splitlines():
                    print(f"# {sub}")
            for log in self.logs[-1:]:
                try:
                    with open(log) as f:
                        tail = f.read().splitlines()[-15:]
                    for line in tail:
                        print(f"# forkd: {line}")
                except OSError:
                    pass

    def fork(self, tag, n, options=None):
        return self.m("Fork", "sua{sv}", [tag, n, options or {}], timeout=120)[0]

    def wait_removed(self, sid, timeout=30):
        member, body = self.bus.wait_signal(lambda mb, b: mb == "SandboxRemoved" and b[0] == sid, timeout)
        return body[2]

    def sandboxes(self):
        return {s["id"]: s for s in self.m("ListSandboxes")[0]}

    def terminate_all(self):
        for sid in list(self.sandboxes()):
            self.m("TerminateSandbox", "s", [sid])
            self.wait_removed(sid)

    def cpu_cgroot(self):
        """cgroup v1: where forkd makes the sandboxes' cgroups of the cpu hierarchy, else None."""
        return cgroupcpu.cpu_root(self.cgroot)

    def cgroup_children(self):
        if not self.cgroot or not os.path.isdir(self.cgroot):
            return []
        return [os.path.basename(d.rstrip("/")) for d in glob.glob(self.cgroot + "/sb-*/")]


def run_on_harness(run, root_needs):
    """main() of the tests on this harness: the environment, /dev/kvm and root
    checked (root_needs says what for), then run(h) on a Harness that is
    always cleaned up."""
    if not FORKD or not VMM or not GUEST:
        print("Bail out! FORKD, FORKD_VMM and FORKD_TEST_GUEST must be set")
        return 1
    if not kvm_usable():
        skip("/dev/kvm is not usable")
    if os.geteuid() != 0:
        skip(f"needs root ({root_needs})")
    h = Harness()
    try:
        return run(h)
    finally:
        h.cleanup()


def main():
    if not FORKD or not VMM or not GUEST:
        print("Bail out! FORKD, FORKD_VMM and FORKD_TEST_GUEST must be set")
        return 1
    if not kvm_usable():
        skip("/dev/kvm is not usable")
    if os.geteuid() != 0:
        skip("needs root (cgroups, the system-bus policy)")
    for tool in ("dbus-daemon", "busctl"):
        if not shutil.which(tool):
            print(f"Bail out! {tool} is missing")
            return 1

    h = Harness()
    try:
        return run(h)
    finally:
        h.cleanup()


def run(h):
    h.setup_cgroups()
    disk = os.path.join(h.tmp, "disk.img")
    with open(disk, "wb") as f:
        f.truncate(16 << 20)
    h.start_bus()
    h.start_forkd()
    ctx = {}

    def introspect():
        out = subprocess.run(["busctl", "--address=" + h.address, "introspect", DEST, PATH],
                             capture_output=True, text=True, check=True).stdout
        for word in ("org.forkd.Manager", ".CreateSnapshot", ".Fork", "sua{sv}", ".SandboxRemoved",
                     ".SnapshotCount", ".Exec", "sasu"):
            assert word in out, f"{word} missing from introspection:\n{out}"
        js = subprocess.run(["busctl", "--address=" + h.address, "--json=short", "get-property", DEST, PATH, IFACE,
                             "StateDirectory"], capture_output=True, text=True, check=True).stdout
        assert json.loads(js)["data"] == h.state
    h.check("busctl introspect shows org.forkd.Manager", introspect)

    def direct_socket():
        # forkd's direct (peer-to-peer) socket serves root only: root gets the same
        # objects; anyone else is refused by the file mode, and, with the mode opened
        # up, by the peer-credential check before a byte is read.
        path = h.bus.call(DEST, PATH, "org.freedesktop.DBus.Properties", "Get", "ss", [IFACE, "DirectSocket"])[0]
        assert path == os.path.join(h.state, "bus.sock"), path
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, oct(os.stat(path).st_mode)
        direct = Bus("unix:path=" + path, hello=False)
        try:
            assert direct.call(DEST, PATH, IFACE, "ListSnapshots")[0] == []
        finally:
            direct.close()
        # Clients connecting at once: sd-bus may read BEGIN and the first call in
        # one go, and forkd must still dispatch that call (it once waited for ever).
        failures = []

        def hammer():
            for _ in range(40):
                try:
                    b = Bus("unix:path=" + path, timeout=5, hello=False)
                    try:
                        b.call(DEST, PATH, IFACE, "ListSnapshots", timeout=5)
                    finally:
                        b.close()
                except Exception as e:  # noqa: BLE001 - reported below
                    failures.append(f"{type(e).__name__}: {e}")
        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not failures, f"{len(failures)} of 160 direct calls failed: {failures[:3]}"
        probe = ("from dbusmini import Bus\n"  # PYTHONPATH: tests/lib, inherited
                 "try:\n"
                 f"    b = Bus('unix:path={path}', timeout=5, hello=False)\n"
                 f"    print('SERVED', b.call({DEST!r}, {PATH!r}, {IFACE!r}, 'ListSnapshots'))\n"
                 "except PermissionError:\n    print('EACCES')\n"
                 "except Exception as e:\n    print('REFUSED', type(e).__name__)\n")
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", probe]
        out = subprocess.run(as_nobody, capture_output=True, text=True, timeout=30).stdout.strip()
        assert out == "EACCES", f"nobody on the 0600 socket: {out!r}"
        modes = [(d, stat.S_IMODE(os.stat(d).st_mode)) for d in (h.tmp, h.state)]
        try:
            for d, _ in modes:
                os.chmod(d, 0o755)
            os.chmod(path, 0o666)
            out = subprocess.run(as_nobody, capture_output=True, text=True, timeout=30).stdout.strip()
        finally:
            os.chmod(path, 0o600)
            for d, mode in modes:
                os.chmod(d, mode)
        assert out.startswith("REFUSED"), f"nobody on a 0666 socket: {out!r}"
    h.check("the direct socket serves root and refuses others (mode and peer credentials)", direct_socket)

    def create():
        info = h.m("CreateSnapshot", "sssuu", ["t1", GUEST, disk, 64, 30])[0]
        assert info["vcpus"] == int(os.environ.get("FORKD_DEFAULT_VCPUS") or 1), info
        assert info["tag"] == "t1" and info["status"] == "ready" and info["mem_size"] == 64 << 20, info
        h.bus.wait_signal(lambda m, b: m == "SnapshotNew" and b == ["t1", "/org/forkd/snapshot/t1"])
        assert h.m("ListSnapshots")[0][0]["tag"] == "t1"
        assert h.bus.call(DEST, PATH, "org.freedesktop.DBus.Properties", "Get", "ss", [IFACE, "SnapshotCount"])[0] == 1
        tag = h.bus.call(DEST, "/org/forkd/snapshot/t1", "org.freedesktop.DBus.Properties", "Get", "ss",
                         ["org.forkd.Snapshot", "Tag"])[0]
        assert tag == "t1"
        details = h.m("GetSnapshotInfo", "s", ["t1"])[0]
        assert details["vmstate_bytes"] > 0 and details["dependents"] == [] and details["chain_depth"] == 0, details
        assert os.path.isfile(os.path.join(h.state, "snapshots/t1/snapshot.json"))
    h.check("CreateSnapshot from the test guest, SnapshotNew, properties", create)

    def default_mem_mib():
        # What CreateSnapshot without mem_mib gets: --default-mem-mib, else FORKD_DEFAULT_MEM_MIB, else
        # forkd-vmm's 256 (forkd-rest's POST /v1/snapshots without a memory field checks the size it gives).
        # A value CreateSnapshot's mem_mib could not be is refused before the state directory is touched.
        env = {k: v for k, v in os.environ.items() if k != "FORKD_DEFAULT_MEM_MIB"}
        for args, var in ((["--default-mem-mib", "7"], None), (["--default-mem-mib", "3074"], None),
                          (["--default-mem-mib", "x"], None), (["--default-mem-mib", ""], None),
                          ([], "12"), ([], "-64"), ([], "64 ")):
            e = env if var is None else dict(env, FORKD_DEFAULT_MEM_MIB=var)
            r = subprocess.run([FORKD, "--state-dir", h.state + "-never"] + args, capture_output=True, text=True,
                               timeout=30, env=e)
            assert r.returncode != 0 and "takes 0 or an even number from 16 to 3072" in r.stderr, (args, var, r)
        assert not os.path.exists(h.state + "-never")
        r = subprocess.run([FORKD, "--help"], capture_output=True, text=True, timeout=30)
        assert "--default-mem-mib N" in r.stdout and "FORKD_DEFAULT_MEM_MIB" in r.stdout, r.stdout
    h.check("--default-mem-mib (or FORKD_DEFAULT_MEM_MIB): not a size mem_mib takes is refused, --help names it",
            default_mem_mib)

    def default_vcpus():
        # --default-vcpus (or FORKD_DEFAULT_VCPUS): 1..32, anything else stops forkd at start.
        env = {k: v for k, v in os.environ.items() if k != "FORKD_DEFAULT_VCPUS"}
        for args, var in ((["--default-vcpus", "0"], None), (["--default-vcpus", "33"], None),
                          (["--default-vcpus", "x"], None), ([], "-2"), ([], "2 ")):
            e = env if var is None else dict(env, FORKD_DEFAULT_VCPUS=var)
            r = subprocess.run([FORKD, "--state-dir", h.state + "-never"] + args, capture_output=True, text=True,
                               timeout=30, env=e)
            assert r.returncode != 0 and "takes a number from 1 to 32" in r.stderr, (args, var, r)
        assert not os.path.exists(h.state + "-never")
        r = subprocess.run([FORKD, "--help"], capture_output=True, text=True, timeout=30)
        assert "--default-vcpus N" in r.stdout and "FORKD_DEFAULT_VCPUS" in r.stdout, r.stdout
    h.check("--default-vcpus (or FORKD_DEFAULT_VCPUS): 1..32 only, --help names it", default_vcpus)

    def triple_fault():
        # tests/guest/triple-fault.S, built beside the test guest: it prints two
        # lines and triple-faults at once. mem_mib 0: the default.
        elf = os.path.join(os.path.dirname(GUEST), "forkd-triple-fault.elf")
        assert os.path.exists(elf), f"{elf} is not built"
        msg = h.expect_error("org.forkd.Error.Failed", "CreateSnapshot", "sssuu", ["tf", elf, disk, 0, 30])
        assert "the guest crashed during boot (triple fault)" in msg, msg
        assert msg.endswith("  forkd-triple-fault: started\n"
                            "  forkd-triple-fault: loading an empty IDT, then faulting"), msg
        log = os.path.join(h.state, "logs", "tf.boot.log")
        assert log in msg, msg
        with open(log) as f:
            assert "forkd-triple-fault: started" in f.read(), "the console log the error names is gone"
        assert all(i["tag"] != "tf" for i in h.m("ListSnapshots")[0])
        assert not os.path.exists(os.path.join(h.state, "snapshots", "tf"))
    h.check("CreateSnapshot of a guest that triple-faults: the error says so and quotes its console", triple_fault)

    def create_from_fds():
        """CreateSnapshotFromFds checks what it receives (never the fd's path), copies it into
        snapshots/.boot-<tag>/ and boots from there; the copies are gone after the boot."""
        b = Bus(h.address, unix_fds=True)
        opened = []

        def fd(path, flags=os.O_RDONLY):
            opened.append(os.open(path, flags | os.O_CLOEXEC))
            return opened[-1]

        def refused(fds, args, want):
            try:
                b.call(DEST, PATH, IFACE, "CreateSnapshotFromFds", "shhuua{sv}", args, fds=fds)
            except DBusError as e:
                assert e.name == INVALID_ARGS and want in e.message, f"{args}: {e.name}: {e.message}"
                return
            raise AssertionError(f"{args} was accepted")
        try:
            g, d = fd(GUEST), fd(disk)
            refused([fd(os.path.dirname(GUEST), os.O_RDONLY | os.O_DIRECTORY), d], ["t8", 0, 1, 64, 30, {}],
                    "The kernel is not a regular file")
            refused([g, fd(disk, os.O_WRONLY)], ["t8", 0, 1, 64, 30, {}], "The rootfs descriptor is not open for reading")
            refused([g, fd(disk, os.O_PATH)], ["t8", 0, 1, 64, 30, {}], "The rootfs descriptor is not open for reading")
            refused([g, d, fd("/dev/null")], ["t8", 0, 1, 64, 30, {"initrd": ("h", 2)}], "The initrd is not a regular file")
            refused([g, d], ["t8", 0, 1, 64, 30, {"bogus": ("h", 0)}], "Unknown option")
            refused([g, d], ["t8", 0, 1, 64, 30, {"initrd": ("s", "/boot/initrd.img")}], "initrd must be of type h")
            refused([g, d], ["t8", 0, 1, 64, 0, {}], "boot_wait_secs")
            refused([g, d], ["t8", 0, 1, 64, 30, {"vcpus": ("u", 0)}], "Option vcpus must be from 1 to 32")
            refused([g, d], ["t8", 0, 1, 64, 30, {"vcpus": ("u", 33)}], "Option vcpus must be from 1 to 32")
            refused([g, d], ["t8", 0, 1, 64, 30, {"vcpus": ("s", "2")}], "vcpus must be of type u")
            # Two vCPUs: the snapshot says so, and a fork of it answers its agent.
            info = b.call(DEST, PATH, IFACE, "CreateSnapshotFromFds", "shhuua{sv}",
                          ["t8", 0, 1, 64, 30, {"vcpus": ("u", 2)}], fds=[g, d])[0]
            assert info["tag"] == "t8" and info["owner_uid"] == 0 and info["vcpus"] == 2, info
            with open(os.path.join(h.state, "snapshots", "t8", "snapshot.json")) as f:
                assert json.load(f)["vcpus"] == 2
            child = h.fork("t8", 1)[0]
            assert json.loads(h.m("Ping", "s", [child["id"]])[0])["pong"], child
            h.m("TerminateSandbox", "s", [child["id"]])
            h.wait_removed(child["id"])
            assert not any(n.startswith(".boot-") for n in os.listdir(os.path.join(h.state, "snapshots")))
            h.m("DeleteSnapshot", "sbb", ["t8", False, False])
        finally:
            for o in opened:
                os.close(o)
            b.close()
    h.check("CreateSnapshotFromFds: regular, readable files only; booted from forkd's own copies", create_from_fds)

    def create_from_image():
        """CreateSnapshotFromImage: forkd-oci writes the disk of an OCI image (here booted with
        the test guest as the kernel option, which ignores it); the config is kept; a hostile
        image or a missing kernel is InvalidArgs, and nothing is left."""
        import tarfile
        import ociimage
        from ociimage import member
        b = Bus(h.address, unix_fds=True)
        opened = []
        cfg = {"Env": ["PATH=/bin", "A=1"], "WorkingDir": "/srv", "Cmd": ["sh"]}
        layout, bad = os.path.join(h.tmp, "img.oci"), os.path.join(h.tmp, "bad.oci")
        ociimage.write_oci(layout, [[member("srv/", kind=tarfile.DIRTYPE, mode=0o755), member("srv/a", b"a")]], cfg)
        ociimage.write_oci(bad, [[member("../x", b"x")]], cfg)

        def fd(path, flags=os.O_RDONLY):
            opened.append(os.open(path, flags | os.O_CLOEXEC))
            return opened[-1]

        def refused(fds, args, want):
            try:
                b.call(DEST, PATH, IFACE, "CreateSnapshotFromImage", "shuua{sv}", args, fds=fds)
            except DBusError as e:
                assert e.name == INVALID_ARGS and want in e.message, f"{args}: {e.name}: {e.message}"
                return
            raise AssertionError(f"{args} was accepted")
        try:
            img, g = fd(layout, os.O_RDONLY | os.O_DIRECTORY), fd(GUEST)
            refused([img], ["i1", 0, 64, 30, {}], "No kernel")
            refused([fd("/dev/null"), g], ["i1", 0, 64, 30, {"kernel": ("h", 1)}], "must be a directory")
            refused([img, g], ["i1", 0, 64, 30, {"bogus": ("b", True)}], "Unknown option")
            refused([img, g], ["i1", 0, 64, 30, {"start_cmd": ("s", "yes")}], "must be of type b")
            refused([img, g], ["i1", 0, 64, 30, {"initrd": ("h", 1)}], "initrd needs option kernel")
            refused([fd(bad, os.O_RDONLY | os.O_DIRECTORY), g], ["i1", 0, 64, 30, {"kernel": ("h", 1)}],
                    '"../x"')
            snaps = os.path.join(h.state, "snapshots")
            assert "i1" not in os.listdir(snaps) and not [n for n in os.listdir(snaps) if n.startswith(".")], \
                os.listdir(snaps)
            info = b.call(DEST, PATH, IFACE, "CreateSnapshotFromImage", "shuua{sv}",
                          ["i1", 0, 64, 30, {"kernel": ("h", 1)}], fds=[img, g])[0]
            image = info.get("image") or {}
            assert image.get("working_dir") == "/srv" and image.get("env") == ["PATH=/bin", "A=1"] and \
                image.get("cmd") == ["sh"] and image.get("start_cmd") is False, info
            with open(os.path.join(snaps, "i1", "snapshot.json")) as f:
                assert json.load(f)["image"]["working_dir"] == "/srv"
            assert h.m("GetSnapshotInfo", "s", ["i1"])[0]["image"]["env"] == ["PATH=/bin", "A=1"]
            assert not [n for n in os.listdir(snaps) if n.startswith(".")], os.listdir(snaps)
            h.m("DeleteSnapshot", "sbb", ["i1", False, False])
        finally:
            for o in opened:
                os.close(o)
            b.close()
    h.check("CreateSnapshotFromImage: an OCI layout's disk by forkd-oci, its config kept; hostile images, "
            "a missing kernel and bad options are InvalidArgs with nothing left", create_from_image)

    def bad_args():
        h.expect_error(INVALID_ARGS, "Fork", "sua{sv}", ["t1", 0, {}])
        h.expect_error(INVALID_ARGS, "Fork", "sua{sv}", ["t1", 1001, {}])
        h.expect_error("org.forkd.Error.NoSuchSnapshot", "Fork", "sua{sv}", ["nope", 1, {}])
        h.expect_error(INVALID_ARGS, "Fork", "sua{sv}", ["../x", 1, {}])
        h.expect_error(INVALID_ARGS, "GetSnapshotInfo", "s", ["../x"])
        h.expect_error("org.forkd.Error.NoSuchSnapshot", "GetSnapshotInfo", "s", ["nope"])
        h.expect_error(INVALID_ARGS, "CreateSnapshot", "sssuu", ["../x", GUEST, disk, 64, 30])
        h.expect_error("org.forkd.Error.SnapshotExists", "CreateSnapshot", "sssuu", ["t1", GUEST, disk, 64, 30])
        h.expect_error(INVALID_ARGS, "CreateSnapshot", "sssuu", ["t9", "/nonexistent", disk, 64, 30])
        h.expect_error(INVALID_ARGS, "CreateSnapshot", "sssuu", ["t9", GUEST, disk, 64, 0])
        h.expect_error(INVALID_ARGS, "DeleteSnapshot", "sbb", ["t1", True, True])
        h.expect_error("org.forkd.Error.NoSuchSnapshot", "DeleteSnapshot", "sbb", ["nope", False, False])
        h.expect_error(INVALID_ARGS, "Fork", "sua{sv}", ["t1", 1, {"bogus": ("b", True)}])
        h.expect_error(INVALID_ARGS, "Fork", "sua{sv}", ["t1", 1, {"memory_limit_mib": ("s", "40")}])
        h.expect_error(INVALID_ARGS, "Fork", "sua{sv}", ["t1", 1, {"memory_limit_mib": ("u", 1)}])
        msg = h.expect_error(INVALID_ARGS, "Fork", "sua{sv}", ["t1", 1, {"per_child_netns": ("b", True)}]) \
            if not os.path.exists("/run/netns/forkd-child-1") else "netns"
        assert "netns" in msg, msg
        h.expect_error("org.forkd.Error.NoSuchSandbox", "Ping", "s", ["sb-000000-0000"])
        h.expect_error(INVALID_ARGS, "Ping", "s", ["../x"])
        h.expect_error("org.forkd.Error.NoSuchSandbox", "TerminateSandbox", "s", ["sb-000000-0000"])
        # Wrong types: sd-bus refuses a signature that does not match the method's.
        h.expect_error(INVALID_ARGS, "Fork", "ssa{sv}", ["t1", "3", {}])
        h.expect_error(INVALID_ARGS, "Fork", "su", ["t1", 3])
        h.expect_error(INVALID_ARGS, "GetSnapshotInfo", "u", [3])
        # busctl too, with a wrong signature
        r = subprocess.run(["busctl", "--address=" + h.address, "call", DEST, PATH, IFACE, "Fork", "sss", "t1", "x",
                            "y"], capture_output=True, text=True)
        assert r.returncode != 0
        assert not h.sandboxes(), "a refused call created sandboxes"
    h.check("bad arguments get precise D-Bus errors", bad_args)

    def unprivileged():
        # No polkitd on this private bus: an unprivileged caller may read, not change.
        # (Authorization against a real polkitd is tested with the polkit helper.)
        if not shutil.which("setpriv"):
            raise AssertionError("setpriv is missing")
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "busctl", "--address=" + h.address]
        r = subprocess.run(nobody + ["call", DEST, PATH, IFACE, "ListSnapshots"], capture_output=True, text=True)
        assert r.returncode == 0 and '"t1"' in r.stdout, r
        r = subprocess.run(nobody + ["call", DEST, PATH, IFACE, "Fork", "sua{sv}", "t1", "1", "0"], capture_output=True,
                           text=True)
        assert r.returncode != 0 and "denied" in r.stderr.lower(), r
        assert not h.sandboxes()
    h.check("unprivileged callers: reads allowed, Fork refused without polkit", unprivileged)

    def fork_ping_terminate():
        infos = h.fork("t1", 3)
        assert len(infos) == 3
        ids = [i["id"] for i in infos]
        for i in infos:
            assert i["state"] == "running" and i["snapshot_tag"] == "t1" and i["pid"] > 0, i
            assert i["guest_addr"] == "agent:" + i["id"] and "memory_limit_mib" not in i and "netns" not in i
            assert len(i["id"]) == 14 and i["id"].startswith("sb-"), i["id"]
        for sid in ids:
            h.bus.wait_signal(lambda m, b, sid=sid: m == "SandboxNew" and b[0] == sid)
            reply = json.loads(h.m("Ping", "s", [sid])[0])
            assert reply["pong"] is True, reply
        obj = path_encode("/org/forkd/sandbox", ids[0])
        reply = json.loads(h.bus.call(DEST, obj, "org.forkd.Sandbox", "Ping")[0])
        assert reply["pong"] is True
        assert h.bus.call(DEST, obj, "org.freedesktop.DBus.Properties", "Get", "ss", ["org.forkd.Sandbox", "Id"])[0] \
            == ids[0]
        assert h.m("GetSandbox", "s", [ids[1]])[0]["id"] == ids[1]
        assert h.bus.call(DEST, PATH, "org.freedesktop.DBus.Properties", "Get", "ss", [IFACE, "SandboxCount"])[0] == 3
        h.expect_error("org.forkd.Error.GuestError", "Eval", "ss", [ids[0], "1+1"])
        h.expect_error("org.forkd.Error.GuestError", "Exec", "sasu", [ids[0], ["true"], 0])
        h.expect_error(INVALID_ARGS, "Exec", "sasu", [ids[0], ["true"], 3601])
        tree = subprocess.run(["busctl", "--address=" + h.address, "tree", DEST], capture_output=True, text=True,
                              check=True).stdout
        assert obj in tree, tree
        # Terminate through the Manager and through the object.
        h.m("TerminateSandbox", "s", [ids[0]])
        assert h.wait_removed(ids[0]) == "terminated"
        h.bus.call(DEST, path_encode("/org/forkd/sandbox", ids[1]), "org.forkd.Sandbox", "Terminate")
        assert h.wait_removed(ids[1]) == "terminated"
        h.expect_error("org.forkd.Error.NoSuchSandbox", "Ping", "s", [ids[0]])
        assert json.loads(h.m("Ping", "s", [ids[2]])[0])["pong"]
        ctx["survivor"] = ids[2]
        assert not os.path.exists(os.path.join(h.state, "sandboxes", ids[0] + ".json"))
        assert os.path.exists(os.path.join(h.state, "sandboxes", ids[2] + ".json"))
    h.check("fork 3, ping each, terminate, signals", fork_ping_terminate)

    def usage():
        infos = h.fork("t1", 1)
        sid = infos[0]["id"]
        assert "usage" not in infos[0], infos[0]  # a fork's reply goes without
        h.bus.wait_signal(lambda m, b: m == "SandboxNew" and b[0] == sid)

        def get():
            return h.m("GetSandbox", "s", [sid])[0]["usage"]
        u0 = get()
        for k in ("cpu_usec", "memory_private_kib", "memory_shared_kib", "disk_read_bytes", "disk_written_bytes",
                  "net_rx_bytes", "net_tx_bytes", "throttled_usec"):
            assert k in u0, (k, u0)
        assert set(u0["throttled_usec"]) >= {"disk", "net"}, u0
        assert u0["memory_shared_kib"] > 0, u0  # the snapshot's pages the guest touched, from the page cache
        # CPU grows while the guest spins.
        out = h.m("RunCode", "ssu", [sid, "spin 1500", 30])[0]
        assert "spun" in out, out
        u1 = get()
        assert u1["cpu_usec"] - u0["cpu_usec"] >= 700000, (u0, u1)
        # Private memory grows by what the guest writes: 2048 pages, 8 MiB.
        out = h.m("RunCode", "ssu", [sid, "dirty 2048", 30])[0]
        assert "dirtied" in out, out
        u2 = get()
        assert u2["memory_private_kib"] - u1["memory_private_kib"] >= 7 * 1024, (u1, u2)
        # The disk's counters: one block written.
        out = h.m("RunCode", "ssu", [sid, "disk_write", 30])[0]
        assert "disk written" in out, out
        u3 = get()
        assert u3["disk_written_bytes"] - u2["disk_written_bytes"] >= 512, (u2, u3)
        assert u3["disk_read_bytes"] >= u2["disk_read_bytes"], (u2, u3)
        # ListSandboxes has it, ListSandboxesEx can leave it out.
        assert "usage" in h.sandboxes()[sid]
        assert all("usage" not in s for s in h.m("ListSandboxesEx", "a{sv}", [{"usage": ("b", False)}])[0])
        assert "usage" in {s["id"]: s for s in h.m("ListSandboxesEx", "a{sv}", [{}])[0]}[sid]
        h.expect_error(INVALID_ARGS, "ListSandboxesEx", "a{sv}", [{"bogus": ("b", True)}])
        h.expect_error(INVALID_ARGS, "ListSandboxesEx", "a{sv}", [{"usage": ("u", 1)}])
        # The totals and histograms.
        m = h.m("GetMetrics")[0]
        assert m["sandboxes"] >= 1 and m["cpu_usec"] >= u3["cpu_usec"], m
        assert m["disk_written_bytes"] >= u3["disk_written_bytes"], m
        for name in ("fork_latency_usec", "branch_pause_usec", "agent_call_usec"):
            bounds, counts, total, count = m[name]
            assert len(counts) == len(bounds) + 1 and counts[-1] == count, (name, m[name])
            assert list(counts) == sorted(counts), (name, m[name])
        assert m["fork_latency_usec"][3] >= 1 and m["agent_call_usec"][3] >= 3, m
        h.m("TerminateSandbox", "s", [sid])
        assert h.wait_removed(sid) == "terminated"
    h.check("usage: cpu grows while the guest spins, private memory as it writes, disk counters; "
            "ListSandboxesEx, GetMetrics", usage)

    def terminate_many():
        infos = h.fork("t1", 3)
        ids = [i["id"] for i in infos]
        pids = [i["pid"] for i in infos]
        # Bad lists: refused whole, nothing killed.
        h.expect_error(INVALID_ARGS, "TerminateSandboxes", "as", [[]])
        h.expect_error(INVALID_ARGS, "TerminateSandboxes", "as", [[ids[0], ids[0]]])
        h.expect_error(INVALID_ARGS, "TerminateSandboxes", "as", [[ids[0], "../x"]])
        h.expect_error(INVALID_ARGS, "TerminateSandboxes", "as", [[f"sb-none-{k}" for k in range(1001)]])
        assert all(sid in h.sandboxes() for sid in ids)
        # Two live ones and two unknown: the unknown come back, in order; the reply
        # comes once both VMMs have exited; the third sandbox lives on.
        gone = "sb-gone-0000"
        unknown = h.m("TerminateSandboxes", "as", [[gone, ids[0], "sb-never-1", ids[1]]])[0]
        assert unknown == [gone, "sb-never-1"], unknown
        for pid in pids[:2]:
            assert not os.path.exists(f"/proc/{pid}"), f"VMM {pid} still there after the reply"
        listed = h.sandboxes()
        assert ids[0] not in listed and ids[1] not in listed and ids[2] in listed, sorted(listed)
        for sid in ids[:2]:
            assert not os.path.exists(os.path.join(h.state, "sandboxes", sid + ".json"))
        assert json.loads(h.m("Ping", "s", [ids[2]])[0])["pong"]
        # Only unknown ids: answered at once.
        assert h.m("TerminateSandboxes", "as", [[ids[0]]])[0] == [ids[0]]
        assert h.m("TerminateSandboxes", "as", [[ids[2]]])[0] == []
        assert ids[2] not in h.sandboxes() and not os.path.exists(f"/proc/{pids[2]}")
    h.check("TerminateSandboxes: many at once, unknown ids returned, answered once the VMMs are gone; bad lists "
            "refused whole", terminate_many)

    def memory_limit():
        if not h.cgroot:
            raise AssertionError("no cgroup memory controller on this host")
        infos = h.fork("t1", 3, {"memory_limit_mib": ("u", 40)})
        ids = [i["id"] for i in infos]
        for i in infos:
            assert i["memory_limit_mib"] == 40
        assert sorted(h.cgroup_children()) == sorted(ids), h.cgroup_children()
        victim = infos[1]
        # The guest's RAM is the VMM's MAP_PRIVATE mapping of memory.bin. The test guest's
        # agent cannot be reached through the D-Bus API with mem_write, so write its scratch
        # area (16 MiB .. 64 MiB) the way the guest would: copy-on-write faults charged to
        # the VMM's memory cgroup.
        pid = victim["pid"]
        with open(f"/proc/{pid}/maps") as f:
            start = next(int(line.split("-")[0], 16) for line in f if line.rstrip().endswith("/memory.bin"))
        fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
        try:
            chunk = b"\xa5" * (1 << 20)
            for mib in range(16, 64):
                os.pwrite(fd, chunk, start + (mib << 20))
        except OSError:
            pass  # the process died under us: that is the point
        finally:
            os.close(fd)
        assert h.wait_removed(victim["id"]) == "oom-killed"
        for sid in (ids[0], ids[2]):
            assert json.loads(h.m("Ping", "s", [sid])[0])["pong"], sid
        assert h.forkd.poll() is None
        wait_for(lambda: victim["id"] not in h.cgroup_children(), 10, "the victim's cgroup to go")
        for sid in (ids[0], ids[2]):
            h.m("TerminateSandbox", "s", [sid])
            assert h.wait_removed(sid) == "terminated"
        wait_for(lambda: not (set(h.cgroup_children()) & set(ids)), 10, "the cgroups to go")
    h.check("cgroupfs memory limit: the guest over its limit dies alone, oom-killed", memory_limit)

    def restart():
        limited = h.fork("t1", 2, {"memory_limit_mib": ("u", 48)}) if h.cgroot else []
        if h.cgroot:
            assert len(h.cgroup_children()) == 2, h.cgroup_children()
        rc = h.stop_forkd()
        assert rc == 0, f"forkd exited with {rc} on SIGTERM"
        # A clean stop ends the running sandboxes as Terminate would, says so, and
        # leaves no record or cgroup (a kill -9 leaves them to the next start: kill9).
        for sid in [ctx["survivor"]] + [i["id"] for i in limited]:
            assert h.wait_removed(sid) == "daemon-stop", sid
        wait_for(lambda: not vmm_processes(h.tmp), 20, "the VMMs to exit with forkd")
        assert not os.listdir(os.path.join(h.state, "sandboxes")), os.listdir(os.path.join(h.state, "sandboxes"))
        assert not h.cgroup_children(), h.cgroup_children()
        h.start_forkd()
        assert [s["tag"] for s in h.m("ListSnapshots")[0]] == ["t1"]
        assert not h.sandboxes()
        assert not os.listdir(os.path.join(h.state, "sandboxes"))
        infos = h.fork("t1", 1)
        assert json.loads(h.m("Ping", "s", [infos[0]["id"]])[0])["pong"]
        ctx["survivor"] = infos[0]["id"]
    h.check("SIGTERM ends every sandbox (daemon-stop), leaves nothing; the registry reloads", restart)

    def kill9():
        marker = h.tmp
        opts = {"memory_limit_mib": ("u", 48)} if h.cgroot else {}
        serial = h.bus.send(DEST, PATH, IFACE, "Fork", "sua{sv}", ["t1", 50, opts])
        h.bus.send(DEST, PATH, IFACE, "CreateSnapshot", "sssuu", ["t2", GUEST, disk, 64, 30])
        recs = os.path.join(h.state, "sandboxes")
        wait_for(lambda: len(os.listdir(recs)) > 10, 20, "the fork to be under way")
        h.stop_forkd(signal.SIGKILL)
        try:
            h.bus.wait_reply(serial, 5)
        except Exception:  # noqa: BLE001
            pass  # NoReply/disconnect: expected
        wait_for(lambda: not vmm_processes(marker), 20, "every forkd-vmm to die with forkd")
        h.start_forkd(["--max-operations", "1"])
        tags = sorted(s["tag"] for s in h.m("ListSnapshots")[0])
        assert tags in (["t1"], ["t1", "t2"]), tags
        snaps = sorted(os.listdir(os.path.join(h.state, "snapshots")))
        assert snaps == tags, f"on disk {snaps}, registered {tags}"
        assert not os.listdir(recs), os.listdir(recs)
        assert not h.sandboxes()
        wait_for(lambda: not h.cgroup_children(), 20, "stale cgroups to be removed")
        # A fork of 50 with limits after the restart, and the operation cap (1 here) meanwhile.
        serial = h.bus.send(DEST, PATH, IFACE, "Fork", "sua{sv}", ["t1", 50, opts])
        h.expect_error("org.forkd.Error.Busy", "Fork", "sua{sv}", ["t1", 1, {}])
        infos = h.bus.wait_reply(serial, 120)[0]
        assert len(infos) == 50 and len({i["id"] for i in infos}) == 50
        if h.cgroot:
            assert len(h.cgroup_children()) == 50
        for i in infos[::7]:
            assert json.loads(h.m("Ping", "s", [i["id"]])[0])["pong"]
        if "t2" in tags:
            infos2 = h.fork("t2", 1)
            assert json.loads(h.m("Ping", "s", [infos2[0]["id"]])[0])["pong"]
        h.terminate_all()
        wait_for(lambda: not h.cgroup_children(), 20, "the cgroups of terminated sandboxes to go")
    h.check("kill -9 during a fork of 50: registry intact, no VMM or cgroup orphaned", kill9)

    def runtime_dir():
        # --runtime-dir (the unit's /run/forkd): the records of live sandboxes go to
        # DIR/sandboxes, the registry stays; a kill -9 leaves them there for the next
        # start, which announces the sandboxes as gone and removes them.
        run = os.path.join(h.tmp, "run")
        recs, state_recs = os.path.join(run, "sandboxes"), os.path.join(h.state, "sandboxes")
        assert h.stop_forkd() == 0
        h.start_forkd(["--runtime-dir", run])
        ids = sorted(i["id"] for i in h.fork("t1", 3))
        assert sorted(os.listdir(recs)) == [i + ".json" for i in ids], os.listdir(recs)
        assert not os.listdir(state_recs), os.listdir(state_recs)
        # One forkd a runtime directory, whatever its state directory.
        log = os.path.join(h.tmp, "second-forkd.log")
        with open(log, "w") as f:
            rc = subprocess.run([FORKD, "--bus-address", h.address, "--state-dir", os.path.join(h.tmp, "state2"),
                                 "--runtime-dir", run], stdout=f, stderr=f, env=dict(os.environ, FORKD_VMM=VMM),
                                timeout=30).returncode
        with open(log) as f:
            text = f.read()
        assert rc != 0 and "Another forkd uses the runtime directory" in text, (rc, text[-2000:])
        h.stop_forkd(signal.SIGKILL)
        wait_for(lambda: not vmm_processes(h.tmp), 20, "every forkd-vmm to die with forkd")
        assert sorted(os.listdir(recs)) == [i + ".json" for i in ids], os.listdir(recs)
        h.start_forkd(["--runtime-dir", run])
        for sid in ids:
            assert h.wait_removed(sid) == "daemon-restart", sid
        wait_for(lambda: not os.listdir(recs), 10, "the records to go")
        assert not h.sandboxes()
        # back to the state directory's records for the checks that follow
        assert h.stop_forkd() == 0
        h.start_forkd()
    h.check("--runtime-dir: records there, one forkd a runtime directory, kill -9 then restart "
            "announces them (daemon-restart)", runtime_dir)

    def delete():
        for tag in [s["tag"] for s in h.m("ListSnapshots")[0]]:
            h.m("DeleteSnapshot", "sbb", [tag, False, False])
            h.bus.wait_signal(lambda m, b, tag=tag: m == "SnapshotRemoved" and b[0] == tag)
        assert h.m("ListSnapshots")[0] == []
        assert not [d for d in os.listdir(os.path.join(h.state, "snapshots"))], "snapshot files left"
        h.expect_error("org.forkd.Error.NoSuchSnapshot", "DeleteSnapshot", "sbb", ["t1", False, False])
        wait_for(lambda: not vmm_processes(h.tmp), 20, "the templates to exit")
        assert h.forkd.poll() is None
        assert h.stop_forkd() == 0
    h.check("delete the snapshot, SnapshotRemoved, clean stop", delete)

    def socket_activated():
        # units/forkd.socket, as systemd-socket-activate(1) passes it: forkd starts on
        # the first connection to its direct socket, serves it, keeps the fd from its
        # VMMs, and leaves the path (systemd's) in place when it stops.
        assert shutil.which("systemd-socket-activate"), "systemd-socket-activate (package systemd) is missing"
        sock = os.path.join(h.tmp, "activated.sock")
        log = open(os.path.join(h.tmp, "forkd.activated.log"), "w")
        h.logs.append(log.name)
        # It passes only the environment named with -E.
        keep = ["-E", "FORKD_VMM=" + VMM] + [a for k in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS",
                                                           "FORKD_NO_CONFINE", "FORKD_LOG_DEBUG")
                                             if k in os.environ for a in ("-E", f"{k}={os.environ[k]}")]
        act = subprocess.Popen(["systemd-socket-activate", "-l", sock] + keep + [
                               FORKD, "--bus-address", h.address, "--state-dir", h.state], stdout=log, stderr=log)
        log.close()
        try:
            wait_for(lambda: os.path.exists(sock), 10, "systemd-socket-activate to listen")
            time.sleep(0.3)
            assert act.poll() is None
            owner = h.bus.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                               "NameHasOwner", "s", [DEST])[0]
            assert not owner, "forkd runs before anyone connected"
            direct = Bus("unix:path=" + sock, timeout=30, hello=False)
            try:
                assert direct.call(DEST, PATH, IFACE, "ListSnapshots", timeout=30)[0] == []
                got = direct.call(DEST, PATH, "org.freedesktop.DBus.Properties", "Get", "ss",
                                  [IFACE, "DirectSocket"])[0]
                assert got == sock, f"DirectSocket is {got!r}, not the passed {sock!r}"
                assert not os.path.exists(os.path.join(h.state, "bus.sock")), "bound its own socket too"
                pid = act.pid
                with open(f"/proc/{pid}/comm") as f:
                    assert f.read().strip() == "forkd"
                fds = {}
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    try:
                        fds[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
                    except OSError:
                        pass
                assert fds.get("3", "").startswith("socket:"), f"fd 3 is not the passed socket: {fds}"
                with open(f"/proc/{pid}/fdinfo/3") as f:
                    flags = int(next(ln for ln in f if ln.startswith("flags:")).split()[1], 8)
                assert flags & 0o2000000, f"the passed socket is not O_CLOEXEC (flags {flags:o})"
                info = direct.call(DEST, PATH, IFACE, "CreateSnapshot", "sssuu", ["sa", GUEST, disk, 64, 30],
                                   timeout=120)[0]
                assert info["tag"] == "sa", info
                kid = direct.call(DEST, PATH, IFACE, "Fork", "sua{sv}", ["sa", 1, {}], timeout=120)[0][0]
                assert json.loads(direct.call(DEST, PATH, IFACE, "Ping", "s", [kid["id"]])[0])["pong"]
                for vpid in vmm_processes(h.tmp):
                    with open(f"/proc/{vpid}/environ", "rb") as f:
                        assert b"LISTEN_FDS" not in f.read(), f"VMM {vpid} inherited $LISTEN_FDS"
                    for fd in os.listdir(f"/proc/{vpid}/fd"):
                        try:
                            tgt = os.readlink(f"/proc/{vpid}/fd/{fd}")
                        except OSError:
                            continue
                        assert tgt != fds["3"], f"VMM {vpid} inherited the passed socket as fd {fd}"
            finally:
                direct.close()
            act.send_signal(signal.SIGTERM)
            assert act.wait(30) == 0
            wait_for(lambda: not vmm_processes(h.tmp), 20, "the VMMs to exit with forkd")
            assert os.path.exists(sock), "forkd removed the path of a socket it did not create"
        finally:
            if act.poll() is None:
                act.kill()
                act.wait()
    h.check("socket activation: forkd starts on its first direct connection and serves it", socket_activated)

    h.check("forkd logged no sanitizer report", h.assert_no_sanitizer_report)

    print(f"1..{h.n}")
    return 1 if h.failed else 0


if __name__ == "__main__":
    sys.exit(main())
