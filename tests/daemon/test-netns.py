#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
per_child_netns for real: network namespaces forkd-child-1..3 made by
tools/netns-setup, the real forkd on a private bus, the real forkd-vmm on
/dev/kvm. Confined (the default), each sandbox records forkd-child-<i> and its
VMM stays in its template's empty namespace (it may enter none and open no
socket); with forkd --no-confine each child's VMM runs in
/run/netns/forkd-child-<i> (same nsfs inode), siblings apart. A missing
namespace, or a file that is none, is refused before anything runs, and a
template's child that cannot enter its namespace exits with status 4. The template's spawn
protocol is also driven directly: bad names refused, children fail closed.

forkd's per_child_netns fixes the names (forkd-child-<i>), so they cannot be unique to this
run: the test creates only those that are missing, removes only what it
created, and keeps the window in which they exist short. TAP; a TAP skip when
/dev/kvm, root or ip netns cannot work.

Environment: FORKD, FORKD_VMM, FORKD_TEST_GUEST. Argument: tools/netns-setup.
"""

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("test_forkd", os.path.join(HERE, "test-forkd.py"))
tf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tf)

NETNS_DIR = "/run/netns"
NAMES = [f"forkd-child-{i}" for i in (1, 2, 3, 4)]
FAILED = "org.forkd.Error.Failed"


def ns_inode(path):
    return os.stat(path).st_ino


def ip_netns_works():
    """Make and remove a namespace of our own name: can ip netns work here?"""
    probe = f"forkd-test-probe-{os.getpid()}"
    try:
        r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"ip netns add failed: {e}"
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True, timeout=30)
    return None


class Namespaces:
    """forkd-child-<i>: create what is missing, remember what we made, remove only that."""

    def __init__(self, setup_tool):
        self.tool = setup_tool
        self.ours = set()
        self.plain_files = set()

    def setup(self, n):
        before = {x for x in NAMES[:n] if os.path.exists(os.path.join(NETNS_DIR, x))}
        r = subprocess.run([self.tool, str(n)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"netns-setup {n}: {r.returncode} {r.stdout} {r.stderr}"
        self.ours |= {x for x in NAMES[:n] if x not in before}
        for x in NAMES[:n]:
            assert os.stat(os.path.join(NETNS_DIR, x)).st_dev != os.stat(NETNS_DIR).st_dev, f"{x} is not a mount"

    def plain_file(self, name):
        """A file where a namespace should be: passes an existence check, is no namespace."""
        path = os.path.join(NETNS_DIR, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        os.close(fd)
        self.plain_files.add(path)

    def remove_plain_files(self):
        for path in list(self.plain_files):
            try:
                os.unlink(path)
            except OSError:
                pass
            self.plain_files.discard(path)

    def cleanup(self):
        self.remove_plain_files()
        for x in sorted(self.ours):
            subprocess.run(["ip", "netns", "delete", x], capture_output=True, timeout=30)
        self.ours.clear()


def vmm_children(ppid):
    """Live processes whose parent is ppid."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        rest = st[st.rindex(")") + 2:].split()
        if int(rest[1]) == ppid and rest[0] not in "ZX":
            out.append(int(d))
    return out


def parent_of(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("PPid:"):
                return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


def main():
    if not tf.FORKD or not tf.VMM or not tf.GUEST or len(sys.argv) != 2:
        print("Bail out! FORKD, FORKD_VMM, FORKD_TEST_GUEST and the netns-setup argument are needed")
        return 1
    if not tf.kvm_usable():
        tf.skip("/dev/kvm is not usable")
    if os.geteuid() != 0:
        tf.skip("needs root (network namespaces)")
    for tool in ("dbus-daemon", "ip"):
        if not tf.shutil.which(tool):
            tf.skip(f"{tool} is missing")
    why = ip_netns_works()
    if why:
        tf.skip(why)

    h = tf.Harness()
    ns = Namespaces(sys.argv[1])
    try:
        return run(h, ns)
    finally:
        ns.cleanup()
        h.cleanup()


def run(h, ns):
    disk = os.path.join(h.tmp, "disk.img")
    with open(disk, "wb") as f:
        f.truncate(16 << 20)
    h.start_bus()
    h.start_forkd()
    ctx = {}
    daemon_ns = ns_inode(f"/proc/{h.forkd.pid}/ns/net")

    def create():
        info = h.m("CreateSnapshot", "sssuu", ["t1", tf.GUEST, disk, 64, 30])[0]
        assert info["status"] == "ready", info
    h.check("snapshot of the test guest", create)

    def netns_setup_tool():
        tool = sys.argv[1]
        for bad in (["0"], ["1001"], ["-1"], ["3x"], ["01"], [], ["1", "2"], ["--bogus"]):
            r = subprocess.run([tool] + bad, capture_output=True, text=True, timeout=30)
            assert r.returncode == 2 and r.stderr, (bad, r)
        r = subprocess.run([tool, "--help"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "forkd-child-" in r.stdout, r
        ns.setup(3)
        ns.setup(3)  # idempotent: same namespaces, same inodes
        inodes = [ns_inode(os.path.join(NETNS_DIR, x)) for x in NAMES[:3]]
        ns.setup(3)
        assert inodes == [ns_inode(os.path.join(NETNS_DIR, x)) for x in NAMES[:3]]
        assert len(set(inodes)) == 3 and daemon_ns not in inodes, inodes
        ctx["inodes"] = inodes
    h.check("tools/netns-setup: usage errors, creates forkd-child-1..3, idempotent", netns_setup_tool)

    def fork_in_namespaces():
        # Confined (the default), a VMM has no capability to enter a namespace and may open
        # no socket: every child stays in its template's empty namespace, and the sandbox
        # records forkd-child-<i> (forkd-vmm(8), CONFINEMENT).
        infos = h.fork("t1", 3, {"per_child_netns": ("b", True)})
        assert len(infos) == 3
        tpl = {parent_of(i["pid"]) for i in infos}
        assert len(tpl) == 1, tpl
        ctx["template"] = tpl.pop()
        ctx["template_ns"] = ns_inode(f"/proc/{ctx['template']}/ns/net")
        assert ctx["template_ns"] != daemon_ns and ctx["template_ns"] not in ctx["inodes"]
        with open(f"/proc/{ctx['template']}/net/dev") as f:
            assert [line.split(":")[0].strip() for line in f.readlines()[2:]] == ["lo"]
        for k, i in enumerate(infos):
            assert i["netns"] == f"forkd-child-{k + 1}", i
            assert i["id"].endswith(f"-{k:04d}"), i
            assert ns_inode(f"/proc/{i['pid']}/ns/net") == ctx["template_ns"], i
        assert ns_inode(f"/proc/{h.forkd.pid}/ns/net") == daemon_ns
        for k, i in enumerate(infos):
            assert json.loads(h.m("Ping", "s", [i["id"]])[0])["pong"] is True, i
            assert h.m("GetSandbox", "s", [i["id"]])[0]["netns"] == f"forkd-child-{k + 1}"
            assert h.bus.call(tf.DEST, tf.path_encode("/org/forkd/sandbox", i["id"]), "org.freedesktop.DBus.Properties",
                              "Get", "ss", ["org.forkd.Sandbox", "NetNS"])[0] == f"forkd-child-{k + 1}"
        listed = h.sandboxes()
        assert sorted(listed) == sorted(i["id"] for i in infos)
        assert all(listed[i["id"]]["netns"] == i["netns"] for i in infos)
        # Without the option, the sandbox has no netns.
        plain = h.fork("t1", 1)[0]
        assert "netns" not in plain, plain
        assert ns_inode(f"/proc/{plain['pid']}/ns/net") == ctx["template_ns"]
        assert h.bus.call(tf.DEST, tf.path_encode("/org/forkd/sandbox", plain["id"]), "org.freedesktop.DBus.Properties",
                          "Get", "ss", ["org.forkd.Sandbox", "NetNS"])[0] == ""
        h.terminate_all()
        tf.wait_for(lambda: not vmm_children(ctx["template"]), 20, "the children to exit")
    h.check("fork 3 with per_child_netns, confined: forkd-child-<i> recorded, every VMM in its template's empty "
            "namespace, answering", fork_in_namespaces)

    def fork_in_namespaces_unconfined():
        # forkd --no-confine: the template is root, and each child enters its namespace.
        assert h.stop_forkd() == 0
        h.start_forkd(["--no-confine"])
        inodes = ctx["inodes"]
        infos = h.fork("t1", 3, {"per_child_netns": ("b", True)})
        vmm_ns = []
        for k, i in enumerate(infos):
            assert i["netns"] == f"forkd-child-{k + 1}", i
            got = ns_inode(f"/proc/{i['pid']}/ns/net")
            assert got == inodes[k], f"{i['id']} (pid {i['pid']}) is in net ns {got}, not forkd-child-{k + 1} {inodes[k]}"
            vmm_ns.append(got)
            assert json.loads(h.m("Ping", "s", [i["id"]])[0])["pong"] is True, i
        assert len(set(vmm_ns)) == 3 and daemon_ns not in vmm_ns, vmm_ns
        tpl = {parent_of(i["pid"]) for i in infos}
        assert len(tpl) == 1, tpl
        ctx["template"] = tpl.pop()
        assert ns_inode(f"/proc/{ctx['template']}/ns/net") == daemon_ns
        h.terminate_all()
        tf.wait_for(lambda: not vmm_children(ctx["template"]), 20, "the children to exit")
    h.check("forkd --no-confine: fork 3 with per_child_netns, each VMM in forkd-child-<i>, apart, answering",
            fork_in_namespaces_unconfined)

    def records():
        return sorted(os.listdir(os.path.join(h.state, "sandboxes")))

    def missing_namespace():
        if os.path.exists(os.path.join(NETNS_DIR, NAMES[3])):
            raise AssertionError(f"{NAMES[3]} exists on this host and is not ours; cannot test a missing one")
        before = vmm_children(ctx["template"])
        msg = h.expect_error(tf.INVALID_ARGS, "Fork", "sua{sv}", ["t1", 4, {"per_child_netns": ("b", True)}])
        assert "forkd-child-4" in msg and "/run/netns" in msg, msg
        assert not h.sandboxes() and not records()
        assert vmm_children(ctx["template"]) == before == []
    h.check("per_child_netns with forkd-child-4 missing: InvalidArgs naming it, nothing runs", missing_namespace)

    def not_a_namespace():
        # Exists, but is a plain file: refused before anything runs, confined or not.
        ns.plain_file(NAMES[3])
        try:
            for args in ([], ["--no-confine"]):
                assert h.stop_forkd() == 0
                h.start_forkd(args)
                before = h.sandboxes()
                msg = h.expect_error(tf.INVALID_ARGS, "Fork", "sua{sv}", ["t1", 4, {"per_child_netns": ("b", True)}])
                assert "/run/netns/forkd-child-4 is not a network namespace" in msg, (args, msg)
                assert h.sandboxes() == before and not records()
        finally:
            ns.remove_plain_files()
        # forkd still works with the option.
        infos = h.fork("t1", 3, {"per_child_netns": ("b", True)})
        assert [ns_inode(f"/proc/{i['pid']}/ns/net") for i in infos] == ctx["inodes"]
        h.terminate_all()
    h.check("per_child_netns with forkd-child-4 no namespace: InvalidArgs, nothing runs, confined or not",
            not_a_namespace)

    def template_protocol():
        snap = os.path.join(h.state, "snapshots", "t1")
        ours = []
        try:
            with tf.template_process(snap, h.tmp) as (p, a):
                assert json.loads(a.recv(65536))["event"] == "ready"

                def spawn(req, n_fds, netns_fds=None):
                    # per child its agent socket, then (with a name) the namespace's fd, which the
                    # controller opens (forkd-vmm(8), TEMPLATE PROTOCOL)
                    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(n_fds)]
                    fds = []
                    for k, x in enumerate(pairs):
                        fds.append(x[1].fileno())
                        if netns_fds and netns_fds[k] is not None:
                            fds.append(netns_fds[k])
                    socket.send_fds(a, [json.dumps(req).encode()], fds)
                    for x in pairs:
                        x[1].close()
                        ours.append(x[0])  # the agent channels stay open while the children run
                    while True:
                        o = json.loads(a.recv(65536))
                        if "event" not in o:
                            return o

                bad = ["../x", "a/b", "", ".", "..", "x" * 65, 3, True, {"a": 1}, "a b", "/run/netns/forkd-child-1"]
                for name in bad:
                    o = spawn({"op": "spawn", "ids": ["c1"], "netns": [name]}, 1)
                    assert o["ok"] is False and "netns" in o["error"], (name, o)
                # An escaped NUL never reaches the name check: the strict JSON parser refuses it.
                o = spawn({"op": "spawn", "ids": ["c1"], "netns": ["forkd-child-1\u0000/../x"]}, 1)
                assert o["ok"] is False, o
                for netns in ("forkd-child-1", [], ["forkd-child-1", "forkd-child-2"], {"c1": "x"}):
                    o = spawn({"op": "spawn", "ids": ["c1"], "netns": netns}, 1)
                    assert o["ok"] is False and "netns" in o["error"], (netns, o)
                assert not vmm_children(p.pid), "a refused request forked"
                # A name whose fd is no network namespace: the child exits with 4 (VMM_CHILD_EXIT_NETNS).
                absent = f"forkd-test-absent-{os.getpid()}"
                assert not os.path.exists(os.path.join(NETNS_DIR, absent))
                # with a name but no fd for it: refused whole
                o = spawn({"op": "spawn", "ids": ["c1", "c2"], "netns": [absent, None]}, 2)
                assert o["ok"] is False and "file descriptors" in o["error"], o
                not_ns = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    o = spawn({"op": "spawn", "ids": ["c1", "c2"], "netns": [absent, None]}, 2, [not_ns, None])
                finally:
                    os.close(not_ns)
                assert o["ok"] is True and len(o["pids"]) == 2, o
                exits = {}
                deadline = time.monotonic() + 20
                while "c1" not in exits and time.monotonic() < deadline:
                    ev = json.loads(a.recv(65536))
                    if ev.get("event") == "exit":
                        exits[ev["id"]] = ev
                assert exits["c1"]["code"] == 4 and exits["c1"]["signal"] == 0, exits
                # Its sibling without a namespace runs, in the template's.
                assert "c2" not in exits
                assert ns_inode(f"/proc/{o['pids'][1]}/ns/net") == ns_inode(f"/proc/{p.pid}/ns/net") == daemon_ns
                ns2 = os.open(os.path.join(NETNS_DIR, "forkd-child-2"), os.O_RDONLY | os.O_CLOEXEC)
                try:
                    o = spawn({"op": "spawn", "ids": ["c3"], "netns": ["forkd-child-2"]}, 1, [ns2])
                finally:
                    os.close(ns2)
                assert o["ok"] is True
                # The reply comes as soon as it is forked; it enters the namespace right after.
                tf.wait_for(lambda: ns_inode(f"/proc/{o['pids'][0]}/ns/net") == ctx["inodes"][1], 10,
                            "c3 to enter forkd-child-2")
                assert ns_inode(f"/proc/{p.pid}/ns/net") == daemon_ns
        finally:
            for x in ours:  # the agent channels, once the template and its children are gone
                x.close()
        assert p.returncode == 0, (p.returncode, p.err[-2000:])
        assert f"/run/netns/{absent}" in p.err, p.err[-2000:]
    h.check("forkd-vmm template: bad netns names refused whole, a child fails closed with status 4",
            template_protocol)

    def cleanup_namespaces():
        created = sorted(ns.ours)
        ns.cleanup()
        for x in created:
            assert not os.path.exists(os.path.join(NETNS_DIR, x)), x
        assert h.forkd.poll() is None
        assert h.stop_forkd() == 0
        h.assert_no_sanitizer_report()
    h.check("namespaces we made removed, clean stop, no sanitizer report", cleanup_namespaces)

    print(f"1..{h.n}")
    return 1 if h.failed else 0


if __name__ == "__main__":
    sys.exit(main())
