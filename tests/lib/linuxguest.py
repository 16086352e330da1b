# SPDX-License-Identifier: LGPL-2.1-or-later
"""The Linux guest's test in the test host: what its parts share (test-linux-guest.py
and tests/linux/linux-*.py): the stack (tools/forkd-stack on the host's system bus, with
the Linux image), forkctl and REST clients, and helpers for forkd's processes."""
import argparse
import json
import os
import signal
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

N_CHILDREN = 3
LIMIT_MIB = 768
# forkd's REST API v1 example request for POST /v1/snapshots (tests/spec-snapshot-request.json,
# also sent by tests/rest/test-rest.py), as the API documents it (only
# the two paths are ours): no memory field, so forkd's default (256 MiB) must
# boot the Linux guest.
SPEC_SNAPSHOT_REQUEST = json.load(open(os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "spec-snapshot-request.json")))
DEFAULT_MEM_MIB = 256
TAG = SPEC_SNAPSHOT_REQUEST["tag"]
# The one field changed: under TCG every guest instruction is emulated, and the
# kernel reaches forkd-agent long after the example's 10 s (forkd waits at most
# boot_wait_secs for the agent's first answer). tests/rest/test-rest.py sends
# the body unchanged, 10 s included, with the test guest.
TCG_BOOT_WAIT_SECS = 300


class Forkctl:
    def __init__(self, path, env):
        self.path = path
        self.env = env

    def __call__(self, *args, timeout=600):
        """Run forkctl --json; returns (exit status, parsed JSON or None, stderr)."""
        p = subprocess.run([self.path, "--no-progress", "--json", *args], env=self.env,
                           capture_output=True, text=True, timeout=timeout)
        try:
            doc = json.loads(p.stdout) if p.stdout.strip() else None
        except ValueError:
            doc = None
        return p.returncode, doc, p.stderr.strip() or p.stdout.strip()

    def run(self, *args, timeout=600):
        """Run forkctl without --json: the CompletedProcess, its output as text."""
        return subprocess.run([self.path, "--no-progress", *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout)


class LinuxStack:
    """tools/forkd-stack up with the Linux image as its default guest (image None: the
    test guest), on a state directory of its own: stack (its KEY=VALUE lines, updated on
    each restart), env (for forkctl and forkd-stack), fc (forkctl --json)."""

    def __init__(self, t, top, build, image):
        self.top, self.build, self.image = top, build, image
        # Install the bus policy as a package would, so that forkd owns its name on the
        # host's real system bus; down() takes it away again where it was not there before
        # (a benchmark on a developer's machine leaves /etc as it found it).
        self.policy = None
        if os.path.isdir("/etc/dbus-1/system.d"):
            dst = "/etc/dbus-1/system.d/org.forkd.Manager.conf"
            if not os.path.exists(dst):
                subprocess.run(["cp", f"{top}/dbus/org.forkd.Manager.conf", dst], check=True)
                self.policy = dst
            reload_bus_config()
        self.state = tempfile.mkdtemp(prefix="forkd-linux-test.")
        self.env = dict(os.environ, FORKD_BUILD_DIR=build, FORKD_STACK_NO_BUILD="1")
        if image:
            self.env["FORKD_GUEST_IMAGE"] = image
        else:
            self.env.pop("FORKD_GUEST_IMAGE", None)
            self.env["FORKD_STACK_GUEST"] = "test"
        up = subprocess.run([f"{top}/tools/forkd-stack", "up", "--state-dir", self.state, "--port", "18889"],
                            env=self.env, capture_output=True, text=True, timeout=300)
        if up.returncode != 0:
            t.bail(f"tools/forkd-stack up failed: {up.stderr[-2000:]}")
        self.stack = dict(line.split("=", 1) for line in up.stdout.splitlines() if "=" in line)
        self.env["FORKD_BUS_ADDRESS"] = self.stack["FORKD_BUS_ADDRESS"]
        self.fc = Forkctl(f"{build}/src/forkctl/forkctl", self.env)

    def restart(self, extra_env):
        """forkd-stack down and up again (restart_stack); returns the new stack's lines."""
        return restart_stack(self.top, self.state, self.env, extra_env)

    def down(self):
        """forkd-stack down; the bus policy it installed and its state directory go too."""
        subprocess.run([f"{self.top}/tools/forkd-stack", "down", "--state-dir", self.state], env=self.env,
                       capture_output=True, timeout=120)
        if self.policy:
            os.unlink(self.policy)
            reload_bus_config()
        shutil.rmtree(self.state, ignore_errors=True)


def reload_bus_config():
    subprocess.run(["busctl", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                    "ReloadConfig"], capture_output=True)


def restart_stack(top, state, env, extra_env):
    """forkd-stack down and up again on the same state (its snapshots stay), with
    extra_env for it (and so for forkd and its VMMs); returns the new stack's lines."""
    subprocess.run([f"{top}/tools/forkd-stack", "down", "--state-dir", state], env=env,
                   capture_output=True, timeout=120)
    up = subprocess.run([f"{top}/tools/forkd-stack", "up", "--state-dir", state, "--port", "18889"],
                        env=dict(env, **extra_env), capture_output=True, text=True, timeout=300)
    if up.returncode != 0:
        raise RuntimeError(f"tools/forkd-stack up failed: {up.stderr[-2000:]}")
    return dict(line.split("=", 1) for line in up.stdout.splitlines() if "=" in line)


def branch_writers():
    """The pids of forkd-branch processes (a branch's or a pause's frozen copy writing it)."""
    found = []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and open(f"/proc/{p}/comm").read().strip() == "forkd-branch":
                found.append(int(p))
        except OSError:
            pass
    return found


def template_cgroups(state):
    """{pid: (its /proc/PID/cgroup, its scope's ActiveState)} of forkd's fork templates (its
    VMM children whose command line says template)."""
    with open(os.path.join(state, "forkd.pid")) as f:
        forkd = f.read().split()[0]
    found = {}
    for p in os.listdir("/proc"):
        try:
            if not p.isdigit():
                continue
            with open(f"/proc/{p}/stat") as f:
                ppid = f.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if ppid != forkd or b"template" not in argv:
                continue
            with open(f"/proc/{p}/cgroup") as f:
                cg = f.read().strip()
        except (OSError, IndexError):
            continue
        unit = subprocess.run(["systemctl", "show", "-p", "ActiveState", f"forkd-tpl-{p}.scope"],
                              capture_output=True, text=True).stdout.split()
        found[int(p)] = (cg, unit)
    return found


def kill9_forkd(state):
    """kill -9 the stack's forkd and wait until it is gone (or a zombie), not a fixed pause."""
    with open(os.path.join(state, "forkd.pid")) as f:
        pid = int(f.read().split()[0])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except (OSError, IndexError):
            break
        time.sleep(0.1)


def kill9_during(stack, restart, state, sid, verb, after_s):
    """POST /v1/sandboxes/SID/VERB in a thread, kill -9 forkd after_s later, restart the stack:
    (status, body, outcome) of GET /v1/sandboxes/SID then; outcome is its status or the HTTP one."""
    late = threading.Thread(target=rest, args=(stack, "POST", f"/v1/sandboxes/{sid}/{verb}"), daemon=True)
    late.start()
    time.sleep(after_s)
    kill9_forkd(state)
    stack.update(restart({}))
    st, info = rest(stack, "GET", f"/v1/sandboxes/{sid}")
    return st, info, info.get("status") if st == 200 else st


def rest(stack, method, path, body=None, timeout=600, token=True, headers=None, ret_headers=None):
    """One request to forkd-rest with the stack's token (token=False: none); returns
    (status, parsed JSON or text). ret_headers, a dict, gets the answer's headers."""
    headers = dict(headers or {}, **{"Content-Type": "application/json"})
    if token:
        with open(stack["FORKD_TOKEN_FILE"]) as f:
            headers["Authorization"] = "Bearer " + f.read().strip()
    req = urllib.request.Request(stack["FORKD_URL"] + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, data = r.status, r.read()
            if ret_headers is not None:
                ret_headers.update(r.headers)
    except urllib.error.HTTPError as e:
        status, data = e.code, e.read()
        if ret_headers is not None:
            ret_headers.update(e.headers)
    try:
        return status, json.loads(data) if data else None
    except ValueError:
        return status, data.decode(errors="replace")


def rest_raw(stack, method, path, data=None, ctype="application/zstd", timeout=600):
    """A request with a raw body (or none); returns (status, bytes)."""
    with open(stack["FORKD_TOKEN_FILE"]) as f:
        headers = {"Authorization": "Bearer " + f.read().strip()}
    if data is not None:
        headers["Content-Type"] = ctype
    req = urllib.request.Request(stack["FORKD_URL"] + path, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


URANDOM = "__import__('os').urandom(16).hex()"


def urandom_differs(t, ask, sids, what):
    """The first thing asked of each fork (ask(sid) reads 16 bytes of os.urandom):
    they differ in every one, and from the parent's when it is in sids."""
    seen = {sid: ask(sid) for sid in sids}
    t.ok(all(seen.values()) and len(set(seen.values())) == len(sids),
         f"os.urandom differs in every child of {what} fork, read first", seen)


def dump_logs(t, state):
    """forkd's and forkd-rest's logs and the guests' consoles, for a failed run."""
    for root, _, files in os.walk(state):
        for name in sorted(files):
            if name.endswith(".log") or "console" in name:
                path = os.path.join(root, name)
                with open(path, errors="replace") as f:
                    lines = f.read().splitlines()[-40:]
                t.note(f"--- {path} (last {len(lines)} lines)")
                t.note("\n".join(lines))
    # what systemd and the process table say: a fork that hangs waits for one of them
    for cmd in (["systemctl", "list-units", "--all", "--no-pager", "--plain", "forkd-*"],
                ["systemctl", "list-jobs", "--no-pager"],
                ["ps", "-eo", "pid,ppid,stat,wchan:24,etime,args"]):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError) as e:
            out = str(e)
        if cmd[0] == "ps":
            out = "\n".join(ln for ln in out.splitlines() if "forkd" in ln or "PID" in ln)
        t.note(f"--- {' '.join(cmd)}")
        t.note(out.strip()[-4000:])


class BenchFail:
    """For LinuxStack in a benchmark: a failure to start is an exception, not a TAP line."""

    def bail(self, why):
        raise RuntimeError(why)


def bench_parser(prog, doc):
    """The arguments of a benchmark of the Linux guest (bench/image, bench/process):
    --build, --image, --json and --emulated; the caller adds its own."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0].strip())
    ap.add_argument("--build", required=True)
    ap.add_argument("--image", help="the tools/mkimage Linux guest's directory")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--emulated", action="store_true")
    return ap
