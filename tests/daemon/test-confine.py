#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
The confined VMM (src/vmm/jail.c, forkd-vmm(8) CONFINEMENT), through the real
forkd on a private bus, the real forkd-vmm on /dev/kvm, the test guest and
real cgroups:
- /proc shows the confinement of a running sandbox's VMM: seccomp filter mode,
  no capabilities in any set, a uid and gid of its own from --vmm-uid-range
  (the VMM group its one supplementary group), no_new_privs, a root that holds
  only the jail, no network but lo; and the same for the template, as the VMM
  user, with no capability either;
- a VMM reaches only its own snapshot chain (the snapshot and its parents)
  and the overlay and console directories, each through a descriptor of its
  own: no mount of the state directory, no other snapshot's directory or
  memory file in its root; snapshots/ itself is root's, 0700;
- one sandbox's VMM cannot open another's: its files under /proc/PID/root and
  /proc/PID/fd, its memory (/proc/PID/mem), its overlay (its own id's, 0600);
- the children of a running sandbox's frozen copy (ForkSandbox) run under
  that sandbox's id;
- a forbidden syscall kills the VMM (SIGSYS): forkd reports the sandbox as
  crashed, announces it, frees its cgroup and serves the others;
- forkd --no-confine runs VMMs as before, and there the same guest request
  kills nothing (so the filter is what killed).

forkd runs with FORKD_VMM_TEST_HOOKS=1, which only this test sets: with it a
VMM obeys the test guest's "forbidden_call" statement (RunCode) by calling a
syscall no allow-list has. TAP output.
"""

import glob
import importlib.util
import json
import os
import re
import signal
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("test_forkd", os.path.join(HERE, "test-forkd.py"))
tf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tf)

VMM_UID = 65533  # forkd's default --vmm-user
RANGE_FIRST, RANGE_COUNT = 0x70000000, 65536  # the --vmm-uid-range forkd(8) suggests
RANGE = ["--vmm-uid-range", f"{RANGE_FIRST}:{RANGE_COUNT}"]


def own_id(pid):
    # a sandbox's VMM: one id of the range as its uid and gid, the VMM group besides
    s = status(pid)
    uid = int(s["Uid"].split()[0])
    assert RANGE_FIRST <= uid < RANGE_FIRST + RANGE_COUNT, s["Uid"]
    assert s["Uid"].split() == [str(uid)] * 4, s["Uid"]
    assert s["Gid"].split() == [str(uid)] * 4, s["Gid"]
    assert s["Groups"].split() == [str(VMM_UID)], s["Groups"]
    return uid


def status(pid):
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def vmm_sanitized():
    # A sanitizer build links the VMM against libasan.
    with open(tf.VMM, "rb") as f:
        return b"libasan" in f.read()


def template_pids(h):
    # its children run the same command line: the template is the one forkd started
    return [p for p in tf.vmm_processes(h.tmp)
            if " template " in " " + cmdline(p) + " " and status(p)["PPid"] == str(h.forkd.pid)]


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def reached(pid):
    """What a confined VMM reaches of the state directory: at each path in its
    root, a link to /proc/self/fd/N, one of its own descriptors (--jail-link);
    the paths of those directories, relative to the state directory."""
    out = set()
    base = f"/proc/{pid}/root"
    for top, dirs, files in os.walk(base + STATE[0]):
        for name in dirs + files:
            path = os.path.join(top, name)
            if not os.path.islink(path):
                continue
            target = os.readlink(path)
            assert target.startswith("/proc/self/fd/"), (path, target)
            real = os.readlink(f"/proc/{pid}/fd/{target.rsplit('/', 1)[1]}")
            assert real == path[len(base):], (path, real)
            out.add(os.path.relpath(real, STATE[0]))
    return out


STATE = []


def run(h):
    STATE.append(h.state)
    h.setup_cgroups()
    disk = os.path.join(h.tmp, "disk.img")
    with open(disk, "wb") as f:
        f.truncate(16 << 20)
    os.environ["FORKD_VMM_TEST_HOOKS"] = "1"
    h.start_bus()
    h.start_forkd(RANGE)
    opts = {"memory_limit_mib": ("u", 128)} if h.cgroot else {}
    ctx = {}

    def create():
        h.m("CreateSnapshot", "sssuu", ["t1", tf.GUEST, disk, 64, 30], timeout=120)
        snaps = os.path.join(h.state, "snapshots")
        st = os.stat(os.path.join(snaps, "t1", "memory.bin"))
        assert st.st_uid == VMM_UID and st.st_gid == VMM_UID, (st.st_uid, st.st_gid)
        # no VMM passes through snapshots/: each reaches its own chain's directories only
        st = os.stat(snaps)
        assert st.st_uid == 0 and (st.st_mode & 0o777) == 0o700, (st.st_uid, oct(st.st_mode))
        st = os.stat(h.state)
        assert st.st_uid == 0 and st.st_gid == VMM_UID and (st.st_mode & 0o777) == 0o710, oct(st.st_mode)
        assert os.stat(os.path.join(h.state, "sandboxes")).st_uid == 0
    h.check("CreateSnapshot under confinement: the snapshot belongs to the VMM user, the state dir stays root's",
            create)

    def proc_shows_it():
        infos = h.fork("t1", 2, opts)
        ctx["ids"] = [i["id"] for i in infos]
        ctx["pids"] = {i["id"]: i["pid"] for i in infos}
        for i in infos:
            pid = i["pid"]
            s = status(pid)
            assert s["Seccomp"] == "2", s["Seccomp"]
            for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
                assert s[k] == "0000000000000000", (k, s[k])
            assert s["NoNewPrivs"] == "1"
            ctx.setdefault("uids", {})[i["id"]] = own_id(pid)
            root = f"/proc/{pid}/root"
            top = h.state.strip("/").split("/")[0]
            assert sorted(os.listdir(root)) == sorted({"proc", top}), os.listdir(root)
            assert not os.path.exists(root + "/etc/shadow") and not os.path.exists(root + "/dev/kvm")
            assert reached(pid) == {"snapshots/t1", "overlays", "logs"}, reached(pid)
            with open(f"/proc/{pid}/net/dev") as f:
                ifaces = [line.split(":")[0].strip() for line in f.readlines()[2:]]
            assert ifaces == ["lo"], ifaces
            with open(f"/proc/{pid}/mountinfo") as f:
                points = sorted(line.split()[4] for line in f)
            assert points == sorted(["/", "/proc"]), points
            if h.cgroot:
                with open(f"/proc/{pid}/cgroup") as f:
                    assert i["id"] in f.read()
        assert len(set(ctx["uids"].values())) == 2, ctx["uids"]
        for sid in ctx["ids"]:
            assert json.loads(h.m("Ping", "s", [sid])[0])["pong"] is True
        tpls = template_pids(h)
        assert len(tpls) == 1, tpls
        # The template is as confined as its children: same uid, no capabilities, same filter.
        s = status(tpls[0])
        assert s["Seccomp"] == "2" and s["NoNewPrivs"] == "1", s
        assert s["Uid"].split() == [str(VMM_UID)] * 4 and s["Gid"].split() == [str(VMM_UID)] * 4, s
        for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert s[k] == "0000000000000000", ("template", k, s[k])
        with open(f"/proc/{tpls[0]}/net/dev") as f:
            assert [line.split(":")[0].strip() for line in f.readlines()[2:]] == ["lo"]
        if h.cgroot:
            # A cgroup of its own beside its children's (and not forkd's): tpl-<pid>
            # in forkd's cgroup root; a child without a memory limit stays in it.
            mine = f"/{os.path.basename(h.cgroot)}/tpl-{tpls[0]}\n"
            with open(f"/proc/{tpls[0]}/cgroup") as f:
                assert mine in f.read(), open(f"/proc/{tpls[0]}/cgroup").read()
            with open(f"/proc/{h.forkd.pid}/cgroup") as f:
                assert os.path.basename(h.cgroot) not in f.read()
            kid = h.fork("t1", 1)[0]
            with open(f"/proc/{kid['pid']}/cgroup") as f:
                assert mine in f.read(), open(f"/proc/{kid['pid']}/cgroup").read()
            h.m("TerminateSandbox", "s", [kid["id"]])
            h.wait_removed(kid["id"])
    h.check("/proc of a sandbox's VMM and its template: Seccomp 2, no capabilities, an id of its own (the "
            "template 65533), no_new_privs, only the jail, only lo; the template in a cgroup of its own, with its "
            "children that have no limit",
            proc_shows_it)

    def userns_made_ahead():
        # Once a fork's children are up, forkd makes as many user namespaces (each with
        # an id of the range) for the next fork; the next fork's VMM enters one of them.
        def held():
            fds = set()
            for n in os.listdir(f"/proc/{h.forkd.pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{h.forkd.pid}/fd/{n}")
                except OSError:
                    continue
                if link.startswith("user:["):
                    fds.add(link)
            return fds
        tf.wait_for(lambda: len(held()) > 0, 30, "a user namespace forkd made ahead")
        ready = held()
        infos = h.fork("t1", 1, opts)
        pid = infos[0]["pid"]
        entered = os.readlink(f"/proc/{pid}/ns/user")
        assert entered in ready and entered not in held(), (entered, ready, held())
        assert own_id(pid) not in ctx["uids"].values(), (own_id(pid), ctx["uids"])
        assert json.loads(h.m("Ping", "s", [infos[0]["id"]])[0])["pong"] is True
        h.m("TerminateSandbox", "s", [infos[0]["id"]])
        h.wait_removed(infos[0]["id"])
    h.check("forkd holds user namespaces made ahead after a fork; the next fork's VMM enters one (forkd no longer "
            "holds it), with an id no other sandbox has", userns_made_ahead)

    def neither_opens_the_other():
        (a, b) = ctx["ids"]
        pa, pb = ctx["pids"][a], ctx["pids"][b]
        ua, ub = ctx["uids"][a], ctx["uids"][b]
        # b's overlay: an unnamed file of b's id, 0600, that only b holds (made at its first write)
        out = json.loads(h.m("RunCode", "ssu", [b, "disk_write", 10])[0])
        assert "disk written" in json.dumps(out), out
        overlays = []
        for fd in os.listdir(f"/proc/{pb}/fd"):
            target = os.readlink(f"/proc/{pb}/fd/{fd}")
            if target.startswith(os.path.join(h.state, "overlays") + "/"):
                st = os.stat(f"/proc/{pb}/fd/{fd}")
                assert st.st_uid == ub and st.st_gid == ub and (st.st_mode & 0o777) == 0o600, (target, st)
                overlays.append(fd)
        assert overlays, os.listdir(f"/proc/{pb}/fd")
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            # as a's VMM: its ids, the VMM group, no capability
            os.close(r)
            bad = []
            try:
                os.setgroups([VMM_UID])
                os.setresgid(ua, ua, ua)
                os.setresuid(ua, ua, ua)
                for path in ([f"/proc/{pb}/mem", f"/proc/{pb}/root{h.state}/snapshots/t1/memory.bin",
                              f"/proc/{pb}/environ"] + [f"/proc/{pb}/fd/{fd}" for fd in overlays]):
                    try:
                        os.close(os.open(path, os.O_RDONLY))
                        bad.append(path)
                    except PermissionError:
                        pass
                try:
                    os.listdir(f"/proc/{pb}/fd")
                    bad.append(f"/proc/{pb}/fd")
                except PermissionError:
                    pass
                try:
                    os.kill(pb, 0)
                    bad.append(f"kill({pb})")
                except PermissionError:
                    pass
            except BaseException as e:
                bad.append(repr(e))
            os.write(w, json.dumps(bad).encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            bad = json.loads(f.read())
        os.waitpid(child, 0)
        assert bad == [], bad
        assert json.loads(h.m("Ping", "s", [a])[0])["pong"] is True
        assert json.loads(h.m("Ping", "s", [b])[0])["pong"] is True
    h.check("one sandbox's VMM opens nothing of another's: /proc/PID/mem, root, fd (its 0600 overlay), no kill",
            neither_opens_the_other)

    def branch_and_fork_confined():
        # A branch is written by a fork of a confined VMM, into snapshots/ (the VMM user's)
        sid = ctx["ids"][1]
        h.m("RunCode", "ssu", [sid, "write /x.txt hello", 10])
        # and a disk layer: the frozen copies (the branch's writer, the fork's template)
        # copy its map under the VMM's filter (memfd_create)
        out = json.loads(h.m("RunCode", "ssu", [sid, "disk_write", 10])[0])
        assert "disk written" in json.dumps(out), out
        h.m("BranchSandbox", "sssb", [sid, "b1", "diff", True], timeout=120)
        infos = h.fork("b1", 1, opts)
        # a sandbox of b1 reaches b1 and its parent t1, and their files; one of t1
        # reaches t1 only: no other snapshot's directory or memory file
        pb1, pt1 = infos[0]["pid"], ctx["pids"][sid]
        assert reached(pb1) == {"snapshots/b1", "snapshots/t1", "overlays", "logs"}, reached(pb1)
        parent = [n for n in os.listdir(f"/proc/{pb1}/fd")
                  if os.readlink(f"/proc/{pb1}/fd/{n}") == os.path.join(h.state, "snapshots", "t1")]
        assert parent and os.path.exists(f"/proc/{pb1}/fd/{parent[0]}/memory.bin"), parent
        assert reached(pt1) == {"snapshots/t1", "overlays", "logs"}, reached(pt1)
        snaps_in_jail = f"/proc/{pt1}/root{h.state}/snapshots"
        assert sorted(os.listdir(snaps_in_jail)) == ["t1"], os.listdir(snaps_in_jail)
        assert not os.path.lexists(f"{snaps_in_jail}/b1") and not os.path.lexists(f"{snaps_in_jail}/b1/memory.bin")
        out = json.loads(h.m("RunCode", "ssu", [infos[0]["id"], "cat /x.txt", 10])[0])
        assert "hello" in json.dumps(out), out
        assert status(infos[0]["pid"])["Seccomp"] == "2"
        h.m("TerminateSandbox", "s", [infos[0]["id"]])
        h.wait_removed(infos[0]["id"])
        # ForkSandbox: the frozen copy of a confined VMM is the template, its children join their cgroups
        kids = h.bus.call(tf.DEST, tf.PATH, tf.IFACE, "ForkSandbox", "su", [sid, 2], timeout=120)
        assert kids, kids
        for sb in h.sandboxes().values():
            if sb["id"] not in ctx["ids"]:
                assert status(sb["pid"])["Seccomp"] == "2"
                # a copy of the source's VMM: the source's id
                assert own_id(sb["pid"]) == ctx["uids"][sid], (sb, ctx["uids"])
                assert json.loads(h.m("Ping", "s", [sb["id"]])[0])["pong"] is True
                if h.cgroot:
                    with open(f"/proc/{sb['pid']}/cgroup") as f:
                        assert sb["id"] in f.read()
                    # the frozen copy that forked it has a cgroup of its own too, not forkd's
                    tpl = status(sb["pid"])["PPid"]
                    mine = f"/{os.path.basename(h.cgroot)}/tpl-{tpl}\n"
                    with open(f"/proc/{tpl}/cgroup") as f:
                        assert mine in f.read(), (tpl, open(f"/proc/{tpl}/cgroup").read())
                h.m("TerminateSandbox", "s", [sb["id"]])
                h.wait_removed(sb["id"])
    h.check("a diff branch of a confined sandbox, and a fork from it", branch_and_fork_confined)

    def confined_template_refuses_netns():
        # forkd sends a confined template no namespace (vmm-client.c); one that gets a name
        # anyway refuses the request whole: its children could not enter it.
        snap = os.path.join(h.state, "snapshots", "t1")
        with tf.template_process(snap, os.path.join(h.state, "overlays"),
                                 ["--confine", f"{VMM_UID}:{VMM_UID}", "--jail-link", snap,
                                  "--jail-link", os.path.join(h.state, "overlays")]) as (p, a):
            assert json.loads(a.recv(65536))["event"] == "ready"
            s = status(p.pid)
            assert s["Uid"].split()[0] == str(VMM_UID) and s["CapEff"] == "0000000000000000", s
            x, y = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            ns = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                socket.send_fds(a, [json.dumps({"op": "spawn", "ids": ["c1"], "netns": ["forkd-child-1"]}).encode()],
                                [y.fileno(), ns])
            finally:
                os.close(ns)
                y.close()
            o = json.loads(a.recv(65536))
            assert o["ok"] is False and "confined template cannot put its children into a network namespace" \
                in o["error"], o
            x.close()
        assert p.returncode == 0, (p.returncode, p.err[-2000:])
    h.check("a confined template refuses to put children into a network namespace", confined_template_refuses_netns)

    def forbidden_syscall_kills():
        victim, other = ctx["ids"]
        pid = ctx["pids"][victim]
        try:
            h.m("RunCode", "ssu", [victim, "forbidden_call", 10])
            raise AssertionError("RunCode answered: the VMM survived its forbidden syscall")
        except tf.DBusError:
            pass
        reason = h.wait_removed(victim)
        assert reason == "crashed", reason
        tf.wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 10, "the VMM to be reaped")
        assert victim not in h.sandboxes()
        if h.cgroot:
            tf.wait_for(lambda: victim not in h.cgroup_children(), 10, "its cgroup to go")
        with open(h.logs[-1]) as f:
            log = f.read()
        assert re.search(rf"Sandbox {victim} removed: crashed \(code -?\d+, signal 31\)", log), log[-2000:]
        assert "made a system call its seccomp filter forbids" in log, log[-2000:]
        # forkd serves the others, and forks again
        assert json.loads(h.m("Ping", "s", [other])[0])["pong"] is True
        more = h.fork("t1", 1, opts)
        assert json.loads(h.m("Ping", "s", [more[0]["id"]])[0])["pong"] is True
        h.terminate_all()
    h.check("a forbidden syscall kills the VMM (SIGSYS): crashed, announced, cgroup freed, forkd serves on",
            forbidden_syscall_kills)

    def template_only_calls_kill():
        # What privileged code would call: setresuid, and prctl options beyond the VMM's
        # (the template once needed both, when it ran as root and switched its children).
        # A sanitizer build's VMM profile allows every prctl() option (the runtime's own).
        calls = ("setresuid",) if vmm_sanitized() else ("setresuid", "prctl")
        for call in calls:
            sid = h.fork("t1", 1, opts)[0]["id"]
            try:
                h.m("RunCode", "ssu", [sid, "forbidden_call " + call, 10])
                raise AssertionError(f"RunCode answered: the VMM survived {call}")
            except tf.DBusError:
                pass
            reason = h.wait_removed(sid)
            assert reason == "crashed", (call, reason)
        with open(h.logs[-1]) as f:
            log = f.read()
        assert log.count("made a system call its seccomp filter forbids") >= 1 + len(calls), log[-2000:]
        h.terminate_all()
    h.check("setresuid and a prctl option beyond the VMM's kill a child (the filter it inherited from its template)",
            template_only_calls_kill)

    def no_confine():
        assert h.stop_forkd() == 0
        h.start_forkd(["--no-confine"])
        infos = h.fork("t1", 1, opts)
        sid, pid = infos[0]["id"], infos[0]["pid"]
        s = status(pid)
        assert s["Seccomp"] == "0" and s["Uid"].split()[0] == "0", s
        # With no filter the same request kills nothing: the filter is what killed above.
        h.m("RunCode", "ssu", [sid, "forbidden_call", 10])
        assert json.loads(h.m("Ping", "s", [sid])[0])["pong"] is True
        h.terminate_all()
    h.check("forkd --no-confine: VMMs as before, and the guest's request kills nothing", no_confine)

    def template_cgroups_go():
        if not h.cgroot:
            return
        tpls = template_pids(h)
        assert tpls and os.path.isdir(f"{h.cgroot}/tpl-{tpls[0]}"), (tpls, os.listdir(h.cgroot))
        # A template killed on its own: its cgroup goes once forkd sees it gone.
        os.kill(tpls[0], signal.SIGKILL)
        tf.wait_for(lambda: not os.path.isdir(f"{h.cgroot}/tpl-{tpls[0]}"), 10, "the dead template's cgroup to go")
        h.fork("t1", 1)
        assert len(glob.glob(h.cgroot + "/tpl-*/")) == 1, os.listdir(h.cgroot)
        # A stopping forkd stops its templates and removes their cgroups.
        assert h.stop_forkd() == 0
        assert glob.glob(h.cgroot + "/tpl-*/") == [], os.listdir(h.cgroot)
        # A killed one's are the next start's to remove.
        h.start_forkd(RANGE)
        h.fork("t1", 1)
        assert len(glob.glob(h.cgroot + "/tpl-*/")) == 1, os.listdir(h.cgroot)
        h.stop_forkd(signal.SIGKILL)
        tf.wait_for(lambda: not tf.vmm_processes(h.tmp), 10, "the VMMs to die with forkd")
        h.start_forkd(RANGE)
        # removed by the start's sweep, retried while the dead VMMs' tasks are released
        tf.wait_for(lambda: glob.glob(h.cgroot + "/tpl-*/") == [], 10, "the killed forkd's template cgroup to go")
    h.check("a template's cgroup goes when it dies, when forkd stops, and at the start after a kill -9",
            template_cgroups_go)

    def clean():
        h.assert_no_sanitizer_report()
    h.check("forkd logged no sanitizer report", clean)
    print(f"1..{h.n}")
    return 1 if h.failed else 0


def main():
    return tf.run_on_harness(run, "the jail, cgroups, the system-bus policy")


if __name__ == "__main__":
    sys.exit(main())
