#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
Pause, resume and fork of a paused sandbox, end to end on the real
parts: a private dbus-daemon, forkd, forkd-vmm on /dev/kvm and the test guest
(the harness of test-forkd.py). The guest's state is a pattern written into its
RAM through /proc/<pid>/mem of its VMM (as test-branch.py does): a resumed
sandbox and the children of a paused one must see the pattern of the moment of
the pause. Also: errors (409 Paused for the verbs a paused sandbox refuses,
NotPaused, NoSuchSandbox), forkd's snapshots hidden and refused as tags,
deletion, a restart and a kill -9 of forkd (paused sandboxes survive, forkd's
unneeded snapshots go), and a kill -9 during a pause (paused or gone, never
both, nothing half-written).

Environment: FORKD, FORKD_VMM, FORKD_TEST_GUEST.
"""

import importlib.util
import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tf = load("test_forkd", "test-forkd.py")
tb = load("test_branch", "test-branch.py")

PAUSED = "org.forkd.Error.Paused"
NOT_PAUSED = "org.forkd.Error.NotPaused"
NO_SANDBOX = "org.forkd.Error.NoSuchSandbox"
NO_SNAPSHOT = "org.forkd.Error.NoSuchSnapshot"
INVALID = tf.INVALID_ARGS


def main():
    return tf.run_on_harness(run, "the system-bus policy, /proc/<pid>/mem of the VMMs")


def run(h):
    disk = os.path.join(h.tmp, "disk.img")
    with open(disk, "wb") as f:
        f.truncate(16 << 20)
    h.start_bus()
    h.start_forkd()
    ctx = {}
    snapdir = os.path.join(h.state, "snapshots")
    pauseddir = os.path.join(h.state, "paused")

    def ping(sid):
        assert json.loads(h.m("Ping", "s", [sid])[0])["pong"], sid

    def forkds():
        return sorted(d for d in os.listdir(snapdir) if d.startswith("paused."))

    def records():
        return sorted(os.listdir(pauseddir)) if os.path.isdir(pauseddir) else []

    def alive(pid):
        try:
            os.kill(pid, 0)
            return tb.comm(pid) != ""
        except OSError:
            return False

    def aps_counting(sid):
        """With several vCPUs (test-pause-smp2): each AP's counter (the test guest's
        run_code "cpus") goes on growing. Nothing to check with one vCPU."""
        n = int(os.environ.get("FORKD_DEFAULT_VCPUS") or 1)
        if n < 2:
            return

        def counters():
            return json.loads(json.loads(h.m("RunCode", "ssu", [sid, "cpus", 10])[0])["stdout"])
        first = counters()
        assert first["cpus"] == n and all(c > 0 for c in first["counters"][1:]), first
        tf.wait_for(lambda: all(b > a for a, b in zip(first["counters"][1:], counters()["counters"][1:])), 30,
                    "every AP to go on counting")

    def setup():
        # test-pause-smp2 gives every snapshot 2 vCPUs (forkd's FORKD_DEFAULT_VCPUS).
        info = h.m("CreateSnapshot", "sssuu", ["base", tf.GUEST, disk, 64, 30])[0]
        assert info["vcpus"] == int(os.environ.get("FORKD_DEFAULT_VCPUS") or 1), info
        p = h.fork("base", 1)[0]
        tb.poke(p["pid"], b"state-at-pause")
        ping(p["id"])
        aps_counting(p["id"])
        ctx["s"] = p
    h.check("a running sandbox of the test guest, a pattern in its RAM", setup)

    def pause():
        s = ctx["s"]
        info = h.m("PauseSandbox", "s", [s["id"]], timeout=120)[0]
        assert info["id"] == s["id"] and info["state"] == "paused" and info["status"] == "paused", info
        assert info["snapshot_tag"] == "base" and info["pid"] == 0 and info["paused_at_unix"] > 0, info
        assert info["created_at_unix"] == s["created_at_unix"], (info, s)
        # Answered once the VMM is gone.
        assert not alive(s["pid"]), f"the VMM {s['pid']} still runs after the pause's reply"
        got = h.m("GetSandbox", "s", [s["id"]])[0]
        assert got["status"] == "paused", got
        listed = {x["id"]: x for x in h.m("ListSandboxes")[0]}
        assert listed[s["id"]]["status"] == "paused", listed
        assert len(forkds()) == 1 and records() == [s["id"] + ".json"], (forkds(), records())
        rec = json.load(open(os.path.join(pauseddir, records()[0])))
        assert rec["id"] == s["id"] and rec["tag"] == forkds()[0] and rec["origin_tag"] == "base", rec
        # forkd's snapshot: diff against base, not listed, not reachable by name.
        meta = json.load(open(os.path.join(snapdir, forkds()[0], "snapshot.json")))
        assert meta.get("parent_tag") == "base", meta
        assert not [x for x in h.m("ListSnapshots")[0] if x["tag"].startswith("paused.")]
        h.expect_error(INVALID, "GetSnapshotInfo", "s", [forkds()[0]])
        h.expect_error(INVALID, "Fork", "sua{sv}", [forkds()[0], 1, {}])
        h.expect_error(INVALID, "DeleteSnapshot", "sbb", [forkds()[0], False, True])
        ctx["tag"] = forkds()[0]
    h.check("PauseSandbox: status paused, the VMM gone before the reply, listed; the state a diff snapshot "
            "of forkd's, hidden", pause)

    def refusals():
        sid = ctx["s"]["id"]
        for member, sig, args in (("Ping", "s", [sid]), ("Exec", "sasu", [sid, ["true"], 5]),
                                  ("Eval", "ss", [sid, "1"]), ("RunCode", "ssu", [sid, "1", 5]),
                                  ("BranchSandbox", "sssb", [sid, "b1", "full", True]),
                                  ("PauseSandbox", "s", [sid]), ("WriteFile", "ssayu", [sid, "/x", b"x", 0o644])):
            msg = h.expect_error(PAUSED, member, sig, args)
            assert msg == f"sandbox {sid} is paused", (member, msg)
        h.expect_error(NO_SANDBOX, "PauseSandbox", "s", ["sb-000000-0000"])
        h.expect_error(NO_SANDBOX, "ResumeSandbox", "s", ["sb-000000-0000"])
        h.expect_error(INVALID, "ResumeSandbox", "s", ["../x"])
        for bad in ("paused.x", "paused.sb-1"):
            h.expect_error(INVALID, "CreateSnapshot", "sssuu", [bad, tf.GUEST, disk, 64, 30])
            h.expect_error(INVALID, "CompactSnapshot", "ss", ["base", bad])
    h.check("a paused sandbox: ping, exec, eval, run_code, branch, pause, write_file are 409 Paused 'sandbox ID is "
            "paused'; unknown ids; paused.* tags refused", refusals)

    def fork_from_paused():
        sid = ctx["s"]["id"]
        for _ in range(2):  # any number of batches
            kids, pause_us = h.m("ForkSandbox", "su", [sid, 3], timeout=120)
            assert pause_us == 0 and len(kids) == 3, kids
            for k in kids:
                assert k["snapshot_tag"] == "base" and k["status"] == "running", k
                assert tb.peek(k["pid"], 14) == b"state-at-pause", k
                ping(k["id"])
            for k in kids:
                h.m("TerminateSandbox", "s", [k["id"]])
                h.wait_removed(k["id"])
        assert h.m("GetSandbox", "s", [sid])[0]["status"] == "paused"
        assert forkds() == [ctx["tag"]], forkds()
    h.check("ForkSandbox of a paused sandbox: children with the paused state, twice; it stays paused", fork_from_paused)

    def snapshot_needed():
        for cascade in (False, True):
            msg = h.expect_error("org.forkd.Error.HasDependents", "DeleteSnapshot", "sbb", ["base", cascade, False])
            assert ctx["tag"] in msg, msg
        assert h.m("GetSandbox", "s", [ctx["s"]["id"]])[0]["status"] == "paused"
    h.check("the snapshot a paused sandbox needs cannot be deleted, with cascade neither (409 HasDependents)",
            snapshot_needed)

    def restart():
        sid = ctx["s"]["id"]
        assert h.stop_forkd() == 0
        h.start_forkd()
        assert h.m("GetSandbox", "s", [sid])[0]["status"] == "paused"
        h.stop_forkd(signal.SIGKILL)
        # What a kill in the middle of writing a record leaves: the next start removes it.
        with open(os.path.join(pauseddir, f".#{sid}.json.4242"), "w") as f:
            f.write('{"id": "half')
        h.start_forkd()
        assert h.m("GetSandbox", "s", [sid])[0]["status"] == "paused"
        assert forkds() == [ctx["tag"]], forkds()
        assert records() == [sid + ".json"], records()
    h.check("a paused sandbox survives a restart of forkd and a kill -9; a half-written record's temporary file "
            "is removed at start", restart)

    def resume():
        sid = ctx["s"]["id"]
        info = h.m("ResumeSandbox", "s", [sid], timeout=120)[0]
        assert info["id"] == sid and info["status"] == "running" and info["pid"] > 0, info
        assert info["snapshot_tag"] == "base" and info["created_at_unix"] == ctx["s"]["created_at_unix"], info
        assert tb.peek(info["pid"], 14) == b"state-at-pause"
        ping(sid)
        aps_counting(sid)
        assert records() == [], records()
        h.expect_error(NOT_PAUSED, "ResumeSandbox", "s", [sid])
        ctx["s"] = info
    h.check("ResumeSandbox: the same id runs again with the paused state, answered; its record gone; a second "
            "resume is NotPaused", resume)

    def hash_cache():
        """forkd-vmm caches the parent's SHA-256 beside its memory.bin; one written for another file
        (another inode, size or times) is not believed."""
        import hashlib
        base = os.path.join(snapdir, "base")
        cache = os.path.join(base, "memory.bin.sha256")
        assert os.path.exists(cache), os.listdir(base)
        want = hashlib.sha256(open(os.path.join(base, "memory.bin"), "rb").read()).hexdigest()
        assert open(cache).read().split()[-1] == want
        with open(cache, "w") as f:
            f.write("v1 1 2 3 4 5 " + "0" * 64 + "\n")
        s = h.fork("base", 1)[0]
        h.m("PauseSandbox", "s", [s["id"]], timeout=120)
        tag = [d for d in forkds() if d.startswith(f"paused.{s['id']}.")][0]
        meta = json.load(open(os.path.join(snapdir, tag, "snapshot.json")))
        assert meta["parent_content_hash"] == want, meta
        assert open(cache).read().split()[-1] == want, "the stale cache was not replaced"
        h.m("TerminateSandbox", "s", [s["id"]])
        h.wait_removed(s["id"])
    h.check("the parent's hash cache: written beside base/memory.bin, a stale one recomputed", hash_cache)

    def pause_again():
        sid = ctx["s"]["id"]
        tb.poke(ctx["s"]["pid"], b"second-pause!!")
        info = h.m("PauseSandbox", "s", [sid], timeout=120)[0]
        assert info["status"] == "paused" and info["snapshot_tag"] == "base", info
        # the second state is chained on the first
        assert len(forkds()) == 2, forkds()
        info = h.m("ResumeSandbox", "s", [sid], timeout=120)[0]
        assert tb.peek(info["pid"], 14) == b"second-pause!!"
        ctx["s"] = info
    h.check("pause and resume again: the second state, chained on the first", pause_again)

    def delete():
        sid = ctx["s"]["id"]
        h.m("PauseSandbox", "s", [sid], timeout=120)
        h.m("TerminateSandbox", "s", [sid])
        assert h.wait_removed(sid) == "terminated"
        h.expect_error(NO_SANDBOX, "GetSandbox", "s", [sid])
        assert records() == [] and forkds() == [], (records(), forkds())
    h.check("TerminateSandbox of a paused sandbox: SandboxRemoved, its record and every snapshot of forkd's gone",
            delete)

    def object_methods():
        # Pause, Resume and SetTimeout on the sandbox's own object: the Manager's PauseSandbox,
        # ResumeSandbox and SetSandboxTimeout forward to them. Paused, the path is an
        # org.forkd.PausedSandbox, and a running sandbox again once resumed.
        s = h.fork("base", 1)[0]
        sid = s["id"]
        obj = tf.path_encode("/org/forkd/sandbox", sid)
        running, paused = "org.forkd.Sandbox", "org.forkd.PausedSandbox"
        tb.poke(s["pid"], b"object-pause!!")
        info = h.bus.call(tf.DEST, obj, running, "SetTimeout", "us", [600, ""])[0]
        assert info["id"] == sid and info["expires_at"] and info["on_timeout"] == "kill", info
        h.expect_error(INVALID, "SetTimeout", "us", [0, ""], path=obj, iface=running)
        h.expect_error(INVALID, "SetTimeout", "us", [10, "never"], path=obj, iface=running)
        msg = h.expect_error(NOT_PAUSED, "Resume", path=obj, iface=running)
        assert msg == f"sandbox {sid} is not paused", msg
        info = h.bus.call(tf.DEST, obj, running, "Pause", timeout=120)[0]
        assert info["id"] == sid and info["state"] == "paused" and info["status"] == "paused", info
        assert info["pid"] == 0 and info["snapshot_tag"] == "base" and info["on_timeout"] == "kill", info
        assert not alive(s["pid"]), f"the VMM {s['pid']} still runs after the pause's reply"
        assert records() == [sid + ".json"], records()
        assert h.m("GetSandbox", "s", [sid])[0]["status"] == "paused"
        xml = h.bus.call(tf.DEST, obj, "org.freedesktop.DBus.Introspectable", "Introspect")[0]
        assert f'"{paused}"' in xml and f'"{running}"' not in xml, xml
        get = "org.freedesktop.DBus.Properties"
        assert h.bus.call(tf.DEST, obj, get, "Get", "ss", [paused, "State"])[0] == "paused"
        assert h.bus.call(tf.DEST, obj, get, "Get", "ss", [paused, "Id"])[0] == sid
        info = h.bus.call(tf.DEST, obj, paused, "SetTimeout", "us", [900, "kill"])[0]
        assert info["status"] == "paused" and info["on_timeout"] == "kill" and info["expires_at"], info
        rec = json.load(open(os.path.join(pauseddir, sid + ".json")))
        assert rec["on_timeout"] == "kill" and rec["expires_at_usec"] > 0, rec
        h.expect_error(INVALID, "SetTimeout", "us", [0, ""], path=obj, iface=paused)
        info = h.bus.call(tf.DEST, obj, paused, "Resume", timeout=120)[0]
        assert info["id"] == sid and info["status"] == "running" and info["pid"] > 0, info
        assert info["expires_at"] and info["on_timeout"] == "kill", info
        assert tb.peek(info["pid"], 14) == b"object-pause!!"
        ping(sid)
        assert records() == [], records()
        assert h.bus.call(tf.DEST, obj, get, "Get", "ss", [running, "State"])[0] == "running"
        msg = h.expect_error(NOT_PAUSED, "ResumeSandbox", "s", [sid])
        assert msg == f"sandbox {sid} is not paused", msg
        # Paused again through the Manager, deleted through the paused object.
        h.m("PauseSandbox", "s", [sid], timeout=120)
        h.bus.call(tf.DEST, obj, paused, "Terminate")
        assert h.wait_removed(sid) == "terminated"
        h.expect_error(NO_SANDBOX, "GetSandbox", "s", [sid])
        tf.wait_for(lambda: records() == [] and forkds() == [], 10, "the paused sandbox's record and state to go")
    h.check("Pause, Resume and SetTimeout on the sandbox object, as PauseSandbox, ResumeSandbox and "
            "SetSandboxTimeout; a paused sandbox's path is an org.forkd.PausedSandbox with Resume, SetTimeout and "
            "Terminate", object_methods)

    def kill_during_pause():
        outcomes = set()
        for delay in (0.0, 0.005, 0.02, 0.06, 0.15, 0.4):
            s = h.fork("base", 1)[0]
            h.bus.send(tf.DEST, tf.PATH, tf.IFACE, "PauseSandbox", "s", [s["id"]])
            time.sleep(delay)
            h.stop_forkd(signal.SIGKILL)
            tf.wait_for(lambda: not tf.vmm_processes(h.tmp), 20, "the VMMs to exit")
            h.start_forkd()
            try:
                st = h.m("GetSandbox", "s", [s["id"]])[0]["status"]
            except tf.DBusError as e:
                assert e.name == NO_SANDBOX, e
                st = "gone"
            outcomes.add(st)
            assert st in ("paused", "gone"), st
            if st == "paused":
                assert records() == [s["id"] + ".json"] and len(forkds()) == 1, (records(), forkds())
                info = h.m("ResumeSandbox", "s", [s["id"]], timeout=120)[0]
                ping(info["id"])
                h.m("TerminateSandbox", "s", [s["id"]])
                h.wait_removed(s["id"])
            # A writer that outlived forkd finishes and lands; forkd then removes what nothing needs.
            tf.wait_for(lambda: not [d for d in os.listdir(snapdir) if ".tmp." in d] and forkds() == [], 20,
                        f"forkd's snapshots and staging directories to go: {os.listdir(snapdir)}")
            assert records() == [], records()
        print(f"# outcomes of a kill -9 during a pause: {sorted(outcomes)}")
    h.check("kill -9 during a pause: afterwards paused (and resumable) or gone, nothing half-written left",
            kill_during_pause)

    def kill_during_resume():
        outcomes = set()
        for delay in (0.0, 0.003, 0.01, 0.03, 0.1):
            s = h.fork("base", 1)[0]
            tb.poke(s["pid"], b"resume-pattern")
            h.m("PauseSandbox", "s", [s["id"]], timeout=120)
            h.bus.send(tf.DEST, tf.PATH, tf.IFACE, "ResumeSandbox", "s", [s["id"]])
            time.sleep(delay)
            h.stop_forkd(signal.SIGKILL)
            tf.wait_for(lambda: not tf.vmm_processes(h.tmp), 20, "the VMMs to exit")
            h.start_forkd()
            try:
                st = h.m("GetSandbox", "s", [s["id"]])[0]["status"]
            except tf.DBusError as e:
                assert e.name == NO_SANDBOX, e
                st = "gone"
            outcomes.add(st)
            # The VM of a resume dies with forkd, as every running one does: paused again, or gone.
            assert st in ("paused", "gone"), st
            listed = [x for x in h.m("ListSandboxes")[0] if x["id"] == s["id"]]
            assert len(listed) == (st == "paused"), listed
            if st == "paused":
                info = h.m("ResumeSandbox", "s", [s["id"]], timeout=120)[0]
                assert tb.peek(info["pid"], 14) == b"resume-pattern", "the paused state, intact"
                h.m("TerminateSandbox", "s", [s["id"]])
                h.wait_removed(s["id"])
            tf.wait_for(lambda: records() == [] and forkds() == [], 20, "records and forkd's snapshots to go")
        print(f"# outcomes of a kill -9 during a resume: {sorted(outcomes)}")
        assert "paused" in outcomes, outcomes
    h.check("kill -9 during a resume: afterwards paused with its state (listed once) or gone", kill_during_resume)

    def timeouts():
        import datetime
        bad = (({"timeout_secs": ("u", 0)}, "timeout_secs"), ({"timeout_secs": ("u", 86401)}, "timeout_secs"),
               ({"timeout_secs": ("u", 5), "on_timeout": ("s", "later")}, "on_timeout"),
               ({"on_timeout": ("s", "kill")}, "needs timeout_secs"), ({"timeout_secs": ("s", "5")}, "type u"))
        for opts, want in bad:
            msg = h.expect_error(INVALID, "Fork", "sua{sv}", ["base", 1, opts])
            assert want in msg, (opts, msg)
        t0 = time.time()
        kill, pause = h.fork("base", 1, {"timeout_secs": ("u", 1)})[0], \
            h.fork("base", 1, {"timeout_secs": ("u", 1), "on_timeout": ("s", "pause")})[0]
        for sb, action in ((kill, "kill"), (pause, "pause")):
            exp = datetime.datetime.strptime(sb["expires_at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                tzinfo=datetime.timezone.utc).timestamp()
            assert t0 + 0.5 < exp < time.time() + 1.5 and sb["on_timeout"] == action, sb
        plain = h.fork("base", 1)[0]
        assert plain["expires_at"] == "" and plain["on_timeout"] == "kill", plain
        assert h.wait_removed(kill["id"], 10) == "timeout"
        tf.wait_for(lambda: h.m("GetSandbox", "s", [pause["id"]])[0]["status"] == "paused", 10,
                    "the sandbox to be paused at its deadline")
        assert h.m("GetSandbox", "s", [pause["id"]])[0]["expires_at"] == "", "the deadline it acted on is gone"
        # SetSandboxTimeout: on a running sandbox, then on a paused one (recorded), acted on at start-up.
        info = h.m("SetSandboxTimeout", "sus", [plain["id"], 600, ""])[0]
        assert info["expires_at"] and info["on_timeout"] == "kill", info
        h.expect_error(INVALID, "SetSandboxTimeout", "sus", [plain["id"], 0, ""])
        h.expect_error(INVALID, "SetSandboxTimeout", "sus", [plain["id"], 10, "never"])
        h.m("TerminateSandbox", "s", [plain["id"]])
        h.wait_removed(plain["id"])
        info = h.m("SetSandboxTimeout", "sus", [pause["id"], 1, "kill"])[0]
        assert info["status"] == "paused" and info["on_timeout"] == "kill" and info["expires_at"], info
        rec = json.load(open(os.path.join(pauseddir, pause["id"] + ".json")))
        assert rec["on_timeout"] == "kill" and rec["expires_at_usec"] > 0, rec
        assert h.stop_forkd() == 0
        time.sleep(1.5)  # the deadline passes while forkd is down
        h.start_forkd()
        tf.wait_for(lambda: not os.path.exists(os.path.join(pauseddir, pause["id"] + ".json")), 10,
                    "the expired paused sandbox to be deleted at start-up")
        h.expect_error(NO_SANDBOX, "GetSandbox", "s", [pause["id"]])
        assert forkds() == [], forkds()
        # ForkSandboxEx: children of a running sandbox with a deadline.
        src = h.fork("base", 1)[0]
        kids, _ = h.m("ForkSandboxEx", "sua{sv}", [src["id"], 2, {"timeout_secs": ("u", 300)}], timeout=120)
        assert all(k["expires_at"] and k["on_timeout"] == "kill" for k in kids), kids
        h.expect_error(INVALID, "ForkSandboxEx", "sua{sv}", [src["id"], 1, {"network": ("s", "none")}])
        h.terminate_all()
    h.check("timeouts: Fork's timeout_secs and on_timeout checked; kill and pause at the deadline; "
            "SetSandboxTimeout on running and paused sandboxes; a deadline passed while forkd was down is acted on "
            "at start-up; ForkSandboxEx", timeouts)

    def templates():
        """tag -> pid of every forkd-vmm template of a paused sandbox's snapshot."""
        out = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                argv = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if len(argv) > 3 and argv[1] == b"template" and argv[2] == b"--snapshot":
                tag = os.path.basename(argv[3].decode())
                if tag.startswith("paused."):
                    out[tag] = int(d)
        return out

    def warm_templates():
        ids = []
        for k in range(10):
            s = h.fork("base", 1)[0]
            tb.poke(s["pid"], b"warm-%02d" % k)
            h.m("PauseSandbox", "s", [s["id"]], timeout=120)
            ids.append(s["id"])
            tag = [d for d in forkds() if d.startswith(f"paused.{s['id']}.")][0]
            # Started in the background after the reply: a resume or fork then finds it running.
            tf.wait_for(lambda: tag in templates(), 30, f"the template of {tag}")
        tags = {sid: [d for d in forkds() if d.startswith(f"paused.{sid}.")][0] for sid in ids}
        running = templates()
        assert len(running) == 8, running
        assert all(tags[sid] in running for sid in ids[2:]), (running, tags)
        # The oldest, whose template stopped, still resumes: its template starts again.
        info = h.m("ResumeSandbox", "s", [ids[0]], timeout=120)[0]
        assert tb.peek(info["pid"], 7) == b"warm-00", info
        ping(ids[0])
        kids, _ = h.m("ForkSandbox", "su", [ids[1], 2], timeout=120)
        assert all(tb.peek(k["pid"], 7) == b"warm-01" for k in kids), kids
        # TerminateSandboxes: running and paused ones at once, and one unknown id.
        ids = [k["id"] for k in kids] + ids + ["sb-never-1"]
        unknown = h.m("TerminateSandboxes", "as", [ids])[0]
        assert unknown == ["sb-never-1"], unknown
        for sid in ids[:-1]:
            assert h.wait_removed(sid) == "terminated", sid
        assert h.m("ListSandboxes")[0] == [] and records() == [], (h.m("ListSandboxes")[0], records())
        assert forkds() == [], forkds()
        tf.wait_for(lambda: not templates(), 30, "the paused sandboxes' templates to go")
    h.check("a pause starts its snapshot's template; at most 8 wait idle, the oldest stop and start again on a "
            "resume or fork; TerminateSandboxes ends running and paused ones at once", warm_templates)

    h.check("no sanitizer report from forkd", h.assert_no_sanitizer_report)
    print(f"1..{h.n}", flush=True)
    return 1 if h.failed else 0


if __name__ == "__main__":
    sys.exit(main())
