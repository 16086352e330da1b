# SPDX-License-Identifier: LGPL-2.1-or-later
"""Processes in the Linux guest (part of test-linux-guest.py), over D-Bus
(tests/lib/dbusmini.py, the Manager's StartSandboxProcess ... OpenSandboxOutputStream)
and forkctl (exec --follow, ps, signal, logs):

  - a background python3 printing a line every 0.2 s, followed live through
    OpenSandboxOutputStream: its lines in order, the first long before its exit
    frame; ReadSandboxOutput at an offset while it runs agrees with the stream;
  - cat: what WriteSandboxStdin sends comes back, eof ends it;
  - SIGTERM to one of two sleeping processes leaves the other running;
  - forkctl exec --follow: stdout, stderr and the exit status (128+15 for SIGTERM),
    forkctl logs, ps --json, signal;
  - forkctl shell in a tmux pane (a real terminal): `echo $((6*7))` shows 42, a resize
    of the window shows in `stty size`, `exit` ends it;
  - a sandbox counting in the background forked into 3: each child's counter goes on
    in its own output (ReadSandboxOutput offsets move independently), and killing
    one child's counter leaves the others' counting.

Short on purpose: under TCG a fork takes seconds and every call is slow."""
import os
import re
import shlex
import shutil
import subprocess
import time

from dbusmini import Bus, DBusError
from procstream import EXIT, STDERR, STDOUT, Stream
from linuxguest import TAG

DEST, PATH, IFACE = "org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager"
TICKS = 25  # 5 s at 0.2 s
TICKER = f"import time\nfor i in range({TICKS}):\n    print('tick', i, flush=True)\n    time.sleep(0.2)\n"
COUNTER = "import time\ni = 0\nwhile True:\n    print(i, flush=True)\n    i += 1\n    time.sleep(0.2)\n"


def shell_under_tmux(t, fc, sid):
    """forkctl shell ID in a detached tmux session of 80x24: a command's answer, then a
    resize of the window to 100x30, which forkctl passes on (SIGWINCH) to the guest's pty."""
    if not shutil.which("tmux"):
        t.ok(False, "forkctl shell under tmux: tmux is in the test host", "tmux not found")
        return
    sock = f"forkd-test-{os.getpid()}"

    def tmux(*args):
        return subprocess.run(["tmux", "-L", sock, *args], env=dict(fc.env, TERM="xterm"), capture_output=True,
                              text=True, timeout=30)

    def pane_until(pred, secs=60):
        """The pane's text once pred holds of it, or at the deadline (not a fixed wait)."""
        deadline = time.monotonic() + secs
        while True:
            text = tmux("capture-pane", "-p", "-t", "sh", "-S", "-100").stdout
            if pred(text) or time.monotonic() > deadline:
                return text
            time.sleep(0.3)

    try:
        r = tmux("new-session", "-d", "-s", "sh", "-x", "80", "-y", "24",
                 shlex.join([fc.path, "shell", sid]) + "; echo forkctl-exit=$?; sleep 600")
        if not t.ok(r.returncode == 0, "tmux new-session with forkctl shell in it", r.stderr):
            return
        pane_until(lambda s: re.search(r"[#$] *$", s, re.M))  # the shell's prompt
        tmux("send-keys", "-t", "sh", "echo $((6*7))", "Enter")
        text = pane_until(lambda s: re.search(r"^42 *$", s, re.M))
        t.ok(re.search(r"^42 *$", text, re.M), "forkctl shell under tmux: echo $((6*7)) shows 42", text[-600:])
        tmux("resize-window", "-t", "sh", "-x", "100", "-y", "30")
        tmux("send-keys", "-t", "sh", "stty size", "Enter")
        text = pane_until(lambda s: re.search(r"^30 100 *$", s, re.M))
        t.ok(re.search(r"^30 100 *$", text, re.M), "forkctl shell under tmux: a resize to 100x30 shows in stty size",
             text[-600:])
        tmux("send-keys", "-t", "sh", "exit", "Enter")
        text = pane_until(lambda s: "forkctl-exit=" in s)
        t.ok("forkctl-exit=0" in text, "exit ends forkctl shell with status 0", text[-600:])
    finally:
        tmux("kill-server")


def processes(t, fc, stack):
    bus = Bus(stack["FORKD_BUS_ADDRESS"], unix_fds=True, timeout=120)

    def call(member, sig, *args, timeout=120):
        return bus.call(DEST, PATH, IFACE, member, sig, args, timeout=timeout)

    def error_of(member, sig, *args):
        try:
            call(member, sig, *args)
            return None
        except DBusError as e:
            return e.name

    def start(sid, argv, options=None):
        return call("StartSandboxProcess", "sasa{sv}", sid, argv, options or {})[0]

    def stream(sid, pid, offset=0):
        call("OpenSandboxOutputStream", "sut", sid, pid, offset)
        fds = bus.take_fds()
        for fd in fds[1:]:
            os.close(fd)
        return Stream(fds[0]) if fds else None

    def read(sid, pid, offset, max_=262144):
        """ReadSandboxOutput: (bytes, next_offset, gap, exited, exit_code, signal), None when gone."""
        try:
            chunks, nxt, gap, exited, code, sig = call("ReadSandboxOutput", "sutu", sid, pid, offset, max_)
        except DBusError as e:
            if e.name == "org.forkd.Error.NoSuchProcess":
                return None
            raise
        return b"".join(bytes(c[2]) for c in chunks), nxt, gap, exited, code, sig

    def listed(sid):
        return {p["pid"]: p for p in call("ListSandboxProcesses", "s", sid)[0]}

    rc, doc, err = fc("fork", TAG)
    ids = [s["id"] for s in (doc or {}).get("sandboxes", [])]
    if not t.ok(rc == 0 and len(ids) == 1, "processes: a sandbox of the boot snapshot", err):
        return
    sid = ids[0]
    children = []
    try:
        # ---- a ticker followed live, and read at an offset while it runs
        pid = start(sid, ["python3", "-u", "-c", TICKER])
        s = stream(sid, pid, 0)
        t.ok(isinstance(pid, int) and pid > 1 and s is not None,
             "StartSandboxProcess answers the pid; OpenSandboxOutputStream a descriptor", pid)
        if s:
            s.pump(lambda st: st.data().count(b"\n") >= 5, 120)
            mid = read(sid, pid, 7)
            s.pump(lambda st: st.exit() is not None, 120)
            out = s.data()
            want = b"".join(b"tick %d\n" % i for i in range(TICKS))
            first = next((f[0] for f in s.frames if f[1] == STDOUT), None)
            end = next((f[0] for f in s.frames if f[1] == EXIT), None)
            t.ok(out == want and s.exit() == (0, 0),
                 "the stream carries the ticker's lines in order, then its exit frame (0, 0)",
                 f"{out[:200]!r} exit {s.exit()}")
            t.ok(first is not None and end is not None and end - first >= 2.0,
                 "the stream is live: the first line came seconds before the exit frame",
                 f"first {first} exit {end}")
            t.ok(all(f[4] == (0, 0, 0) for f in s.frames) and
                 all(f[2] == sum(len(g[3]) for g in s.frames[:i] if g[1] in (STDOUT, STDERR))
                     for i, f in enumerate(s.frames) if f[1] in (STDOUT, STDERR)),
                 "frame offsets follow the bytes, pad bytes zero")
            s.pump(lambda st: False, 5)
            t.ok(s.closed, "forkd closes the stream after the exit frame")
            s.close()
            t.ok(mid is not None and len(mid[0]) > 0 and mid[1] == 7 + len(mid[0]) and mid[2] == 0 and
                 out[7:7 + len(mid[0])] == mid[0] and (mid[3] is False and mid[4] == -1 and mid[5] == 0),
                 "ReadSandboxOutput at offset 7 while it runs: the stream's bytes from 7, next_offset after them",
                 f"{mid!r:.300}")

        # ---- cat: stdin echoed, eof ends it
        pid = start(sid, ["cat"])
        w = call("WriteSandboxStdin", "suayb", sid, pid, b"hello stdin\n", False)[0]
        w2 = call("WriteSandboxStdin", "suayb", sid, pid, b"", True)[0]
        s = stream(sid, pid, 0)
        ok = s is not None and s.pump(lambda st: st.exit() is not None, 60)
        t.ok(w == 12 and w2 == 0 and ok and s.data() == b"hello stdin\n" and s.exit() == (0, 0),
             "cat: WriteSandboxStdin's bytes come back on its stream, eof ends it with 0",
             f"{w} {w2} {s.data() if s else None!r} {s.exit() if s else None}")
        if s:
            s.close()

        # ---- SIGTERM to one of two
        a = start(sid, ["sleep", "600"])
        b = start(sid, ["sleep", "600"])
        call("SignalSandboxProcess", "sus", sid, a, "SIGTERM")
        deadline = time.monotonic() + 60
        procs = listed(sid)
        while time.monotonic() < deadline and procs.get(a, {}).get("running", False):
            time.sleep(0.3)
            procs = listed(sid)
        pa, pb = procs.get(a, {}), procs.get(b, {})
        t.ok(pa.get("running") is False and pa.get("signal") == 15 and pa.get("exit_code") == -1 and
             pb.get("running") is True and pb.get("args") == ["sleep", "600"],
             "SIGTERM to one of two sleeps: it is killed (signal 15, exit_code -1), the other runs on", procs)
        t.ok(error_of("SignalSandboxProcess", "sus", sid, b, "SIGNOPE") == "org.freedesktop.DBus.Error.InvalidArgs"
             and error_of("SignalSandboxProcess", "sus", sid, 99999, "TERM") == "org.forkd.Error.NoSuchProcess"
             and error_of("StartSandboxProcess", "sasa{sv}", sid, [], {}) == "org.freedesktop.DBus.Error.InvalidArgs"
             and error_of("StartSandboxProcess", "sasa{sv}", sid, ["true"], {"nope": ("b", True)})
             == "org.freedesktop.DBus.Error.InvalidArgs"
             and error_of("ReadSandboxOutput", "sutu", sid, b, 0, 0) == "org.freedesktop.DBus.Error.InvalidArgs",
             "an unknown signal, option or max is InvalidArgs; an unknown pid NoSuchProcess")

        # ---- forkctl
        rc, doc, err = fc("ps", sid)
        t.ok(rc == 0 and isinstance(doc, list) and any(p.get("pid") == b and p.get("running") for p in doc),
             "forkctl ps --json lists the sleep that runs", doc or err)
        rc, _, err = fc("signal", sid, str(b), "KILL")
        t.ok(rc == 0, "forkctl signal ID PID KILL", err)
        p = fc.run("exec", "--follow", sid, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
        t.ok(p.returncode == 3 and p.stdout == "out\n" and "err" in p.stderr,
             "forkctl exec --follow: stdout, stderr, exit status 3", f"{p.returncode} {p.stdout!r} {p.stderr!r}")
        p = fc.run("exec", "--follow", sid, "--", "sh", "-c", "echo bye; kill -TERM $$")
        t.ok(p.returncode == 128 + 15 and p.stdout == "bye\n",
             "forkctl exec --follow of a process SIGTERM kills: exit status 143", f"{p.returncode} {p.stdout!r}")
        shell_under_tmux(t, fc, sid)
        pid = start(sid, ["sh", "-c", "for i in 1 2 3; do echo line$i; done; sleep 600"])
        deadline = time.monotonic() + 60  # until its three lines are there, not a fixed wait
        while time.monotonic() < deadline and (read(sid, pid, 0) or (b"",))[0] != b"line1\nline2\nline3\n":
            time.sleep(0.2)
        p = fc.run("logs", sid, str(pid), "--offset", "6")
        t.ok(p.returncode == 0 and p.stdout.startswith("line2\nline3\n"),
             "forkctl logs --offset 6: the output from byte 6 on", f"{p.returncode} {p.stdout!r} {p.stderr!r}")
        call("SignalSandboxProcess", "sus", sid, pid, "KILL")

        # ---- a counter in the background through a fork into 3
        pid = start(sid, ["python3", "-u", "-c", COUNTER])
        deadline = time.monotonic() + 60
        r = read(sid, pid, 0)
        while time.monotonic() < deadline and (r is None or r[0].count(b"\n") < 3):
            time.sleep(0.5)
            r = read(sid, pid, 0)
        if not t.ok(r is not None and r[0].startswith(b"0\n1\n2\n"), "a counter runs in the sandbox", r):
            return
        res = call("ForkSandbox", "su", sid, 3, timeout=600)
        children = [c["id"] for c in res[0]]
        if not t.ok(len(children) == 3, "ForkSandbox of the counting sandbox into 3", res):
            return
        offs = {c: (read(c, pid, 0) or (b"", 0))[1] for c in children + [sid]}

        def grown(c, before, wait=15):
            """next_offset of c's counter past before within wait s; the new offset or None."""
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                r = read(c, pid, before)
                if r is None:
                    return None
                if r[1] > before:
                    return r[1]
                time.sleep(0.5)
            return None

        later = {c: grown(c, offs[c]) for c in offs}
        t.ok(all(later.values()), "after the fork the counter goes on in each of the 3 children and the parent",
             {"before": offs, "after": later})
        seqs = {}
        for c in children:
            r = read(c, pid, 0)
            nums = [int(x) for x in r[0].split()] if r else []
            seqs[c] = nums == list(range(len(nums))) and len(nums) > 3
        t.ok(all(seqs.values()), "each child's output is the counter's whole sequence, unbroken by the fork", seqs)

        victim, others = children[0], children[1:]
        call("SignalSandboxProcess", "sus", victim, pid, "KILL")
        deadline = time.monotonic() + 60
        seen = read(victim, pid, later[victim] or 0)
        while time.monotonic() < deadline and seen is not None and not seen[3]:
            time.sleep(0.5)
            seen = read(victim, pid, seen[1])
        t.ok(seen is None or seen[3] and seen[5] == 9,
             "SIGKILL to one child's counter: it exits (signal 9) there", seen)
        base = {c: (read(c, pid, 0) or (b"", 0))[1] for c in others + [sid]}
        after = {c: grown(c, base[c]) for c in base}
        t.ok(all(after.values()), "the counters of the other children and of the parent count on", after)
    except DBusError as e:
        t.ok(False, "processes: a D-Bus call failed", f"{e.name}: {e}")
    finally:
        fc("kill", sid, *children)
        bus.close()
