#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
Integration test of forkd-rest: real HTTP(S) against the real stack (a
private dbus-daemon, the real forkd daemon with forkd-vmm and the test guest,
and forkd-rest), TAP output. Standard library only.

Environment (set by tests/rest/meson.build):
  FORKD_REST        build/src/rest/forkd-rest
  FORKD_DAEMON      build/src/daemon/forkd (the daemon part is skipped if absent)
  FORKD_VMM         build/src/vmm/forkd-vmm
  FORKD_TEST_GUEST  build/tests/guest/forkd-test-guest.elf
  DBUS_DAEMON       dbus-daemon
"""

import base64
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

import cgroupcpu
from tap import Skip, Tap, check  # the other REST tests use them as test_rest.Tap, ...

REST = os.environ.get("FORKD_REST", "")
DAEMON = os.environ.get("FORKD_DAEMON", "")
VMM = os.environ.get("FORKD_VMM", "")
GUEST = os.environ.get("FORKD_TEST_GUEST", "")
DBUS_DAEMON = os.environ.get("DBUS_DAEMON") or shutil.which("dbus-daemon") or ""
TOKEN = "t0ken-" + os.urandom(12).hex()
REQUEST_TIMEOUT = 3  # forkd-rest --timeout for the main instance
BODY_MAX = 1024 * 1024

# ---------------------------------------------------------------- processes


class Stack:
    """Every process and file the test creates; torn down even on failure."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="forkd-rest-test.")
        self.procs = []
        self.bus = None
        self.daemon = None

    def spawn(self, argv, env=None, **kw):
        logname = os.path.join(self.tmp, os.path.basename(argv[0]) + f".{len(self.procs)}.log")
        log = open(logname, "wb")
        p = subprocess.Popen(argv, stdout=kw.pop("stdout", log), stderr=log, env=env,
                             stdin=subprocess.DEVNULL, **kw)
        p.logname = logname
        self.procs.append(p)
        return p

    def stop(self, p, sig=signal.SIGTERM):
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def cleanup(self):
        for p in reversed(self.procs):
            try:
                self.stop(p)
            except Exception:  # noqa: BLE001
                pass
        self.remove_cgroot()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def finish(self, tap, c, rest):
        """The end of a run beside this one (rest-verbs, rest-sdk): forkd's log if a check
        failed, every sandbox left deleted, then both daemons stopped; one that exits
        uncleanly or with a sanitizer's report (ASan builds) fails the run."""
        if tap.failed and self.daemon:
            for line in self.log_tail(self.daemon, 40).splitlines():
                print(f"# forkd: {line}")
        try:
            r = c.req("GET", "/v1/sandboxes")
            for sb in (r.json or []) if r.status == 200 else []:
                c.req("DELETE", f"/v1/sandboxes/{sb['id']}")
        except Exception:  # noqa: BLE001
            pass
        for name, p in (("forkd", self.daemon), ("forkd-rest", rest)):
            self.stop(p)
            log = self.log_tail(p, 100000)
            if p.returncode != 0 or "Sanitizer" in log or "runtime error" in log:
                tap.failed += 1
                print(f"# {name} exited with {p.returncode}:")
                for line in log.splitlines()[-40:]:
                    print(f"# {name}: {line}")

    def log_tail(self, p, n=30):
        try:
            with open(p.logname, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""

    def start_bus(self):
        conf = os.path.join(self.tmp, "bus.conf")
        sock = os.path.join(self.tmp, "bus.sock")
        with open(conf, "w") as f:
            f.write(f"""<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={sock}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
""")
        p = self.spawn([DBUS_DAEMON, "--config-file=" + conf, "--nofork", "--nopidfile",
                        "--print-address=1"], stdout=subprocess.PIPE)
        line = p.stdout.readline().decode().strip()
        check(line.startswith("unix:"), f"dbus-daemon did not print its address: {line!r}")
        self.bus = line
        return line

    def start_daemon(self):
        state = os.path.join(self.tmp, "state")
        os.makedirs(state, exist_ok=True)
        env = dict(os.environ, FORKD_VMM=VMM)
        argv = [DAEMON, "--state-dir", state, "--bus-address", self.bus]
        # Memory limits in a cgroup of our own, not in the host's forkd one.
        self.cgroot = None
        if os.geteuid() == 0:
            if os.path.exists("/sys/fs/cgroup/memory/memory.limit_in_bytes"):
                self.cgroot = f"/sys/fs/cgroup/memory/forkd-rest-test-{os.getpid()}"
            else:
                try:
                    with open("/sys/fs/cgroup/cgroup.controllers") as f:
                        if "memory" in f.read().split():
                            self.cgroot = f"/sys/fs/cgroup/forkd-rest-test-{os.getpid()}"
                except OSError:
                    pass
        if self.cgroot:
            argv += ["--cgroup-root", self.cgroot]
        self.daemon = self.spawn(argv, env=env)
        return self.daemon

    def cpu_cgroot(self):
        """cgroup v1: forkd's directory of sandbox cgroups in the cpu hierarchy, else None."""
        return cgroupcpu.cpu_root(getattr(self, "cgroot", None))

    def cpu_max(self, sid):
        """A sandbox's cpu limit as v2's cpu.max says it: [quota or "max", period]."""
        return cgroupcpu.cpu_max(self.cgroot, sid)

    def remove_cgroot(self):
        for root in (getattr(self, "cgroot", None), self.cpu_cgroot()):
            if root:
                self.remove_cgroup_dir(root)

    @staticmethod
    def remove_cgroup_dir(root):
        for _ in range(100):
            try:
                for d in os.listdir(root):
                    if os.path.isdir(os.path.join(root, d)):
                        os.rmdir(os.path.join(root, d))
                os.rmdir(root)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)

    def start_rest(self, *extra, port=None, token=True, env=None):
        port = port or free_port()
        argv = [REST, "--listen", f"127.0.0.1:{port}", "--bus-address", self.bus,
                "--timeout", str(REQUEST_TIMEOUT), "--connection-limit", "64"]
        if token:
            argv += ["--token-file", self.token_file()]
        p = self.spawn(argv + list(extra), env=env)
        wait_port(port, p, self)
        return p, port

    def token_file(self):
        path = os.path.join(self.tmp, "token")
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, (TOKEN + "\n").encode())
            os.close(fd)
        return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, stack):
    for _ in range(200):
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited with {proc.returncode}: {stack.log_tail(proc)}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port}")


# ---------------------------------------------------------------- HTTP


class Resp:
    def __init__(self, status, headers, data):
        self.status = status
        self.headers = headers
        self.data = data
        self.json = None
        if data and headers.get("Content-Type", "").startswith("application/json"):
            self.json = json.loads(data)

    def __repr__(self):
        return f"<{self.status} {self.data[:300]!r}>"


class Client:
    def __init__(self, port, tls_ctx=None):
        self.port = port
        self.tls_ctx = tls_ctx

    def conn(self, timeout=60):
        if self.tls_ctx:
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=self.tls_ctx)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def req(self, method, path, body=None, token=TOKEN, headers=None, raw=None, timeout=120):
        h = dict(headers or {})
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        c = self.conn(timeout)
        try:
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            resp = Resp(r.status, r.headers, r.read())
        finally:
            c.close()
        if resp.status >= 400:
            check(resp.json is not None and isinstance(resp.json, dict), f"{method} {path}: error body is not JSON: {resp}")
            check(list(resp.json.keys()) == ["error"] and isinstance(resp.json["error"], str) and resp.json["error"],
                  f"{method} {path}: error body is not {{\"error\": message}}: {resp}")
        return resp

    def expect(self, status, method, path, body=None, **kw):
        r = self.req(method, path, body, **kw)
        check(r.status == status, f"{method} {path} {body!r}: expected {status}, got {r}")
        return r


# ---------------------------------------------------------------- tests without the daemon


def t_healthz(c):
    r = c.expect(200, "GET", "/healthz", token=None)
    check(r.json == {"ok": True}, r)
    c.expect(200, "GET", "/healthz", token="wrong")
    # forkd's probes use the trailing slash too; nothing else under it is open
    r = c.expect(200, "GET", "/healthz/", token=None)
    check(r.json == {"ok": True}, r)
    c.expect(401, "GET", "/healthz//", token=None)
    c.expect(401, "GET", "/healthz/x", token=None)
    c.expect(405, "POST", "/healthz/", token=None)


def t_auth(c):
    for tok in (None, "wrong", TOKEN + "x", TOKEN[:-1], ""):
        r = c.expect(401, "GET", "/version", token=tok)
        check(r.headers.get("WWW-Authenticate") == "Bearer", r.headers)
    c.expect(401, "GET", "/version", token=None, headers={"Authorization": "Basic " + TOKEN})
    c.expect(401, "GET", "/v1/snapshots", token=None)
    c.expect(401, "POST", "/v1/sandboxes", {"snapshot_tag": "x"}, token=None)
    c.expect(401, "DELETE", "/v1/snapshots/x", token="nope")
    c.expect(401, "GET", "/metrics", token=None)
    r = c.expect(200, "GET", "/version")
    check(r.json == {"version": r.json["version"], "api": "v1"} and isinstance(r.json["version"], str), r)


def t_unknown_route_and_method(c):
    for path in ("/", "/v2/snapshots", "/v1/snapshots/", "/v1/snapshots/a/b", "/v1/sandboxes/x/nope", "/healthz/x"):
        c.expect(404, "GET", path)
    for method, path, allow in (("PUT", "/v1/snapshots", "GET, POST"), ("DELETE", "/v1/sandboxes", "GET, POST"),
                                ("POST", "/healthz", "GET"), ("GET", "/v1/sandboxes/x/ping", "POST"),
                                ("PUT", "/v1/sandboxes/x", "GET, DELETE, PATCH"), ("GET", "/v1/snapshots/x", "DELETE")):
        r = c.expect(405, method, path, token=TOKEN)
        check(r.headers.get("Allow") == allow, f"{method} {path}: Allow {r.headers.get('Allow')!r}")


def t_malformed_json(c):
    for raw in (b"{", b"[]", b"\"x\"", b"{\"snapshot_tag\": \"a\",}", b"{\"snapshot_tag\": \"a\"} x",
                b"{\"snapshot_tag\": \"\xff\"}", b"\x00", b"nul", b"{'a': 1}", b"{\"a\":" * 100 + b"1" + b"}" * 100,
                b"{\"snapshot_tag\": \"a\", \"n\": 1e400}", b"{\"snapshot_tag\": \"a\", \"n\": 99999999999999999999999}"):
        c.expect(400, "POST", "/v1/sandboxes", raw=raw, headers={"Content-Type": "application/json"})
    c.expect(400, "POST", "/v1/sandboxes", raw=b"")
    c.expect(400, "POST", "/v1/snapshots", raw=b"   ")
    c.expect(400, "POST", "/v1/sandboxes/sb-1/eval", raw=b"{")
    c.expect(400, "POST", "/v1/sandboxes/sb-1/exec", raw=b"[\"ls\"]")


def t_wrong_types(c):
    base = {"snapshot_tag": "py"}
    for extra in ({"n": "3"}, {"n": 1.5}, {"n": True}, {"n": None}, {"n": [1]}, {"per_child_netns": "yes"},
                  {"per_child_netns": 1}, {"live_fork": "true"}, {"memory_limit_mib": "256"},
                  {"memory_limit_mib": -1}, {"snapshot_tag": 5}, {"snapshot_tag": None},
                  # forkd's fields are known here: their types are checked
                  {"prewarm": "yes"}, {"prewarm": None}, {"prewarm": 1}, {"hugepages": "true"}, {"hugepages": 0}):
        r = c.expect(400, "POST", "/v1/sandboxes", dict(base, **extra))
        key = next(iter(extra))
        check(key in r.json["error"], (extra, r))
    c.expect(400, "POST", "/v1/sandboxes", {"n": 2})  # snapshot_tag missing
    # hugepages: true is refused, and says why
    r = c.expect(400, "POST", "/v1/sandboxes", dict(base, hugepages=True))
    check(r.json["error"].startswith("hugepages is not supported: ") and "page cache" in r.json["error"], r)
    snap = {"tag": "t", "kernel": "/k", "rootfs": "/r"}
    for extra in ({"tag": 1}, {"kernel": None}, {"rootfs": ["x"]}, {"boot_wait_secs": "10"},
                  {"boot_wait_secs": 0}, {"boot_wait_secs": 601}, {"mem_mib": -4}, {"rw": "yes"}, {"tap": 7}):
        c.expect(400, "POST", "/v1/snapshots", dict(snap, **extra))
    for missing in ("tag", "kernel", "rootfs"):
        c.expect(400, "POST", "/v1/snapshots", {k: v for k, v in snap.items() if k != missing})
    # an OCI image instead of a rootfs
    for body, says in (({"tag": "t", "image": "/i", "rootfs": "/r"}, "mutually exclusive"),
                       ({"tag": "t", "image": ""}, "image must not be empty"),
                       ({"tag": "t", "image": "/nonexistent/image.tar"}, "cannot open image"),
                       ({"tag": "t", "image": "/dev/null"}, "neither a directory"),
                       ({"tag": "t", "image": 7}, "image"),
                       (dict(snap, start_cmd=True), "start_cmd needs image"),
                       (dict(snap, vcpus=0), "vcpus must be between 1 and 32"),
                       (dict(snap, vcpus=33), "vcpus must be between 1 and 32"),
                       (dict(snap, vcpus="2"), "vcpus"), (dict(snap, vcpus=1.5), "vcpus")):
        r = c.expect(400, "POST", "/v1/snapshots", body)
        check(says in r.json["error"], (body, r.json))
    # volumes: checked before anything is opened, then opened as forkd-rest's user
    vsnap = {"tag": "t", "kernel": GUEST, "rootfs": GUEST}
    vol = {"host_path": GUEST, "guest_path": "/data", "mode": "ro"}
    for vols, says in (("x", "volumes"), ([1], "volumes"), ([dict(vol, mode="rwx")], "mode"),
                       ([dict(vol, mode=1)], "volumes"), ([dict(vol, extra=1)], "volumes"),
                       ([{"guest_path": "/data"}], "volumes"), ([dict(vol, host_path="rel.img")], "absolute"),
                       ([dict(vol, guest_path="/")], "guest_path"), ([dict(vol, guest_path="/a/../b")], "guest_path"),
                       ([dict(vol, guest_path="/proc/x")], "guest_path"), ([dict(vol, guest_path="data")], "guest_path"),
                       ([vol, dict(vol, mode="cow")], "same guest_path"),
                       ([dict(vol, guest_path="/v%d" % i) for i in range(25)], "at most 24"),
                       ([dict(vol, host_path="/nonexistent/v.ext4")], "cannot open volume /nonexistent/v.ext4"),
                       ([dict(vol, host_path="/")], "volume / is not a regular file")):
        r = c.expect(400, "POST", "/v1/snapshots", dict(vsnap, volumes=vols))
        check(says in r.json["error"], (vols, r.json))
    for body in ({}, {"args": "ls"}, {"args": []}, {"args": [1]}, {"args": ["ls"], "timeout_secs": "5"},
                 {"args": ["ls"], "timeout_secs": -1}, {"args": ["ls"], "timeout_secs": 3601}, {"args": ["a\u0000b"]}):
        c.expect(400, "POST", "/v1/sandboxes/sb-1/exec", body)
    for body in ({}, {"code": 1}, {"code": None}, {"code": ["x"]}):
        c.expect(400, "POST", "/v1/sandboxes/sb-1/eval", body)


def t_unknown_fields(c):
    """Fields a route does not know are ignored, as forkd ignores them: the
    request passes validation and goes on to the daemon (absent here: 503),
    while a known field of the wrong type next to them is still 400."""
    extra = {"bogus": 1, "prewarm_scratch_dir": "/x", "nested": {"a": [1, {"b": None}]}, "n2": None}
    for path, body in (("/v1/sandboxes", {"snapshot_tag": "py", "n": 2}),
                       ("/v1/sandboxes", {"snapshot_tag": "py", "prewarm": True, "hugepages": False}),
                       ("/v1/snapshots", {"tag": "t", "kernel": GUEST, "rootfs": GUEST, "rw": True}),
                       ("/v1/sandboxes/sb-1/exec", {"args": ["ls"], "cwd": "/"}),
                       ("/v1/sandboxes/sb-1/eval", {"code": "1"}),
                       ("/v1/sandboxes/sb-1/run_code", {"code": "x = 1"}),
                       ("/v1/sandboxes/sb-1/merge", {"winner": "sb-2"}),
                       ("/v1/sandboxes/sb-1/diff", {"other": "sb-2", "path": ["/root"]}),
                       ("/v1/sandboxes/sb-1/branch", {"tag": "b1", "measure_diff": True}),
                       ("/v1/sandboxes/sb-1/branch", {"tag": "b1", "lineage": "x"}),
                       ("/v1/sandboxes/sb-1/fork", {"n": 2}),
                       ("/v1/sandboxes/sb-1/fork", {}),
                       ("/v1/snapshots/py/compact", {"to": "py-flat"})):
        c.expect(503, "POST", path, dict(body, **extra))
        if not body:
            continue
        bad = dict(body, **extra)
        key = next(iter(body))
        bad[key] = 12.5 if not isinstance(body[key], (int, float)) or isinstance(body[key], bool) else "12"
        r = c.expect(400, "POST", path, bad)
        check(isinstance(r.json.get("error"), str) and r.json["error"], r)


def t_validation(c):
    for n in (0, 1001, -1, 2**32, 2**63):
        r = c.expect(400, "POST", "/v1/sandboxes", {"snapshot_tag": "py", "n": n})
        check("1000" in r.json["error"], r)
    for tag in (".hidden", "-x", "a" * 65, "a b", "a/b", "", "ü", "a;b", "x\n"):
        c.expect(400, "POST", "/v1/snapshots", {"tag": tag, "kernel": "/k", "rootfs": "/r"})
        c.expect(400, "POST", "/v1/sandboxes", {"snapshot_tag": tag})
    for seg in (".x", "-x", "a" * 65, "a%20b", "%2e%2e", "x%00"):
        c.expect(400, "GET", f"/v1/snapshots/{seg}/info")
        c.expect(400, "DELETE", f"/v1/snapshots/{seg}")
        c.expect(400, "GET", f"/v1/sandboxes/{seg}")
        c.expect(400, "POST", f"/v1/sandboxes/{seg}/ping")
    c.expect(400, "DELETE", "/v1/snapshots/py?cascade=true&force=true")
    c.expect(400, "DELETE", "/v1/snapshots/py?cascade=maybe")


def t_not_implemented_validation(c):
    """branch, compact and the running-sandbox fork check their requests
    before any D-Bus call: REST API v1's 400 rows hold."""
    # REST API v1: 400 when both mode and diff are set, or wait: false without mode "live"
    for body in ({"mode": "full", "diff": True}, {"mode": "diff", "diff": False}, {"wait": False},
                 {"mode": "full", "wait": False}, {"mode": "diff", "wait": False}, {"mode": "fast"},
                 {"mode": "livelier"}, {"mode": 1}, {"diff": "yes"}, {"wait": "no"}, {"tag": "../x"},
                 {"tag": "a" * 65}, {"tag": 5},
                 # forkd's legacy live: true is mode "live"; with mode, or with diff, it is 400 as there
                 {"live": True, "mode": "live"}, {"live": False, "mode": "full"}, {"live": True, "diff": True},
                 {"live": "yes"}, {"live": True, "measure_diff": True},
                 # parent_tag (forkd's snapshot-diff): a tag, and with a diff branch only
                 {"parent_tag": "py"}, {"parent_tag": "py", "mode": "full"}, {"parent_tag": "py", "mode": "live"},
                 {"parent_tag": "py", "live": True}, {"parent_tag": 5, "mode": "diff"},
                 {"parent_tag": "../x", "mode": "diff"}, {"parent_tag": "a" * 65, "mode": "diff"},
                 # forkd's measure_diff (its Python SDK's branch_sandbox sends it): with a full branch only
                 {"measure_diff": True, "diff": True}, {"measure_diff": True, "mode": "diff"},
                 {"measure_diff": True, "mode": "live"}, {"measure_diff": "yes"}, {"measure_diff": None}):
        c.expect(400, "POST", "/v1/sandboxes/sb-1/branch", body)
    c.expect(400, "POST", "/v1/sandboxes/sb-1/branch", raw=b"{")
    c.expect(400, "POST", "/v1/sandboxes/..x/branch", {})
    # REST API v1: 400 when to == :tag or either tag is unsafe
    for body in ({}, {"to": "py"}, {"to": "../x"}, {"to": ""}, {"to": 1}, {"to": "a" * 65}):
        c.expect(400, "POST", "/v1/snapshots/py/compact", body)
    c.expect(400, "POST", "/v1/snapshots/-py/compact", {"to": "py-flat"})
    # Podflare: n between 1 and 32
    for body in ({"n": 0}, {"n": 33}, {"n": -1}, {"n": 2**63}, {"n": 2**64 - 1}):
        r = c.expect(400, "POST", "/v1/sandboxes/sb-1/fork", body)
        check(r.json == {"error": "n must be between 1 and 32"}, r)  # REST API v1, word for word
    for body in ({"n": "2"}, {"n": 1.5}, {"n": None}, {"n": True}):
        r = c.expect(400, "POST", "/v1/sandboxes/sb-1/fork", body)
        check(r.json == {"error": "n must be an integer between 1 and 32"}, r)
    r = c.expect(401, "POST", "/v1/sandboxes/sb-1/fork", {"n": 2}, token="wrong")
    check(r.json == {"error": "invalid api key"}, r)  # REST API v1
    r = c.expect(401, "POST", "/v1/sandboxes/sb-1/fork", {"n": 2}, token=None)
    check(r.json == {"error": "invalid api key"}, r)
    # valid requests go on to the daemon, which is not there yet
    for path, body in (("/v1/sandboxes/sb-1/branch", {"tag": "c1", "mode": "full"}),
                       ("/v1/sandboxes/sb-1/branch", {"mode": "live", "wait": False}),
                       ("/v1/sandboxes/sb-1/branch", {"diff": True}), ("/v1/sandboxes/sb-1/branch", None),
                       ("/v1/sandboxes/sb-1/branch", {"measure_diff": True}),
                       ("/v1/sandboxes/sb-1/branch", {"mode": "full", "measure_diff": True}),
                       ("/v1/sandboxes/sb-1/branch", {"diff": True, "measure_diff": False}),
                       ("/v1/sandboxes/sb-1/branch", {"live": True, "wait": False}),
                       ("/v1/sandboxes/sb-1/branch", {"live": False, "diff": True}),
                       ("/v1/sandboxes/sb-1/branch", {"tag": "d1", "mode": "diff", "parent_tag": "py"}),
                       ("/v1/sandboxes/sb-1/branch", {"diff": True, "parent_tag": "py"}),
                       ("/v1/sandboxes/sb-1/branch", {"mode": "full", "parent_tag": None}),
                       ("/v1/snapshots/py/compact", {"to": "py-flat"}), ("/v1/sandboxes/sb-1/fork", {"n": 32}),
                       ("/v1/sandboxes/sb-1/fork", None)):
        c.expect(503, "POST", path, body)


def t_body_cap(c):
    # announced too large: refused before any byte of the body is read
    s = socket.create_connection(("127.0.0.1", c.port), timeout=10)
    s.sendall(b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: " + str(BODY_MAX + 1).encode() + b"\r\n\r\n")
    data = s.recv(4096)
    s.close()
    check(data.startswith(b"HTTP/1.1 413 "), data)
    check(b'{"error":' in data, data)
    # streamed (chunked) past the cap: the excess is dropped, then 413
    s = socket.create_connection(("127.0.0.1", c.port), timeout=10)
    s.sendall(b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() +
              b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"4000\r\n" + b" " * 0x4000 + b"\r\n"
    for _ in range(BODY_MAX // 0x4000 + 8):
        s.sendall(chunk)
    s.sendall(b"0\r\n\r\n")
    data = s.recv(4096)
    s.close()
    check(data.startswith(b"HTTP/1.1 413 "), data)
    # just under the cap still parses (and fails as JSON, not as size)
    c.expect(400, "POST", "/v1/sandboxes", raw=b" " * (BODY_MAX - 10) + b"[]")


def t_header_cap(c):
    s = socket.create_connection(("127.0.0.1", c.port), timeout=10)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (256 * 1024) + b"\r\n\r\n")
    except OSError:
        pass  # the server may close while we still send
    try:
        data = s.recv(4096)
    except OSError:
        data = b""
    s.close()
    check(data == b"" or data.split(b" ")[1] in (b"413", b"431", b"400"), data[:200])
    c.expect(200, "GET", "/healthz")


def t_limits_validation(c):
    """cpu_limit, disk_rate, net_rate on POST /v1/sandboxes, POST
    /v1/sandboxes/:id/fork and PATCH /v1/sandboxes/:id: a bad value is a 400 naming the field, before any
    D-Bus call (the daemon is absent here: a good body is a 503)."""
    base = {"snapshot_tag": "py"}
    bad = [({"cpu_limit": "1"}, "cpu_limit must be a number"),
           ({"cpu_limit": 0.001}, "cpu_limit must be a number of at least 0.01"),
           ({"cpu_limit": -1}, "cpu_limit"),
           ({"disk_rate": 5}, "disk_rate must be an object"),
           ({"disk_rate": {}}, "disk_rate needs at least one of bandwidth, ops and burst"),
           ({"disk_rate": {"bandwidth": 4095}}, "disk_rate.bandwidth must be 0 or between 4096 and 1099511627776"),
           ({"disk_rate": {"bandwidth": 2**40 + 1}}, "disk_rate.bandwidth"),
           ({"disk_rate": {"ops": 10**7 + 1}}, "disk_rate.ops must be 0 or between 1 and 10000000"),
           ({"disk_rate": {"ops": -1}}, "disk_rate.ops must be a non-negative integer"),
           ({"disk_rate": {"ops": 1.5}}, "disk_rate.ops must be a non-negative integer"),
           ({"net_rate": {"burst": 8192}}, "net_rate.burst needs net_rate.bandwidth"),
           ({"net_rate": {"bandwidth": 4096, "burst": 2**40 + 1}}, "net_rate.burst must be at most 1099511627776"),
           ({"net_rate": {"rate": 1}}, "net_rate takes only bandwidth, ops and burst")]
    for extra, says in bad:
        r = c.expect(400, "POST", "/v1/sandboxes", dict(base, **extra))
        check(says in r.json["error"], (extra, r.json))
        r = c.expect(400, "PATCH", "/v1/sandboxes/sb-1", extra)
        check(says in r.json["error"], (extra, r.json))
        r = c.expect(400, "POST", "/v1/sandboxes/sb-1/fork", dict({"n": 1}, **extra))
        check(says in r.json["error"], (extra, r.json))
    r = c.expect(400, "PATCH", "/v1/sandboxes/sb-1", {})
    check("at least one" in r.json["error"], r)
    c.expect(400, "PATCH", "/v1/sandboxes/sb-1", {"memory_limit_mib": 8})
    c.expect(400, "PATCH", "/v1/sandboxes/.x", {"cpu_limit": 1})
    # well-formed: on to forkd, which is not there
    good = {"cpu_limit": 0.5, "disk_rate": {"bandwidth": 10 << 20, "ops": 100, "burst": 1 << 20},
            "net_rate": {"bandwidth": 4096}}
    c.expect(503, "POST", "/v1/sandboxes", dict(base, **good))
    c.expect(503, "PATCH", "/v1/sandboxes/sb-1", good)
    c.expect(503, "POST", "/v1/sandboxes/sb-1/fork", dict({"n": 2}, **good))
    c.expect(503, "PATCH", "/v1/sandboxes/sb-1", {"cpu_limit": 0, "disk_rate": {"bandwidth": 0}})
    c.expect(503, "PATCH", "/v1/sandboxes/sb-1", {"memory_limit_mib": 64})


def ws_upgrade(c, path, key=None, version="13", upgrade="websocket"):
    """A WebSocket handshake on a raw socket: the status line and headers."""
    key = key if key is not None else base64.b64encode(os.urandom(16)).decode()
    s = socket.create_connection(("127.0.0.1", c.port), timeout=30)
    try:
        h = f"GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\n"
        if upgrade:
            h += f"Upgrade: {upgrade}\r\nConnection: Upgrade\r\n"
        if key:
            h += f"Sec-WebSocket-Key: {key}\r\n"
        if version:
            h += f"Sec-WebSocket-Version: {version}\r\n"
        s.sendall((h + "\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            d = s.recv(4096)
            if not d:
                break
            data += d
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next((int(x.split(":", 1)[1]) for x in lines if x.lower().startswith("content-length:")), 0)
        while len(body) < length:
            d = s.recv(4096)
            if not d:
                break
            body += d
        return status, body
    finally:
        s.close()


def t_processes_validation(c):
    """The process routes check every argument before any D-Bus call: a bad
    one is 400, a good one reaches for forkd, which is absent here (503)."""
    base = "/v1/sandboxes/sb-1/processes"
    subroutes = (("GET", "output", None), ("POST", "stdin", {"data": "x"}), ("POST", "signal", {"signal": "TERM"}),
                 ("POST", "resize", {"cols": 80, "rows": 24}))
    for pid in ("0", "01", "-1", "4194305", "99999999999", "abc", "1.5", "%2031", "1%00"):
        for method, what, body in subroutes:
            r = c.expect(400, method, f"{base}/{pid}/{what}", body)
            check(r.json["error"] == "invalid pid", r)
        status, _ = ws_upgrade(c, f"{base}/{pid}/tty")
        check(status == 400, (pid, status))
    for method, what, body in subroutes:
        c.expect(400, method, f"/v1/sandboxes/.x/processes/1/{what}", body)
        c.expect(503, method, f"{base}/4194304/{what}", body)
    c.expect(400, "GET", "/v1/sandboxes/.x/processes")
    c.expect(400, "POST", "/v1/sandboxes/.x/processes", {"args": ["true"]})

    # output: offset and follow
    for q in ("offset=-1", "offset=abc", "offset=1e3", "offset=", "offset=99999999999999999999", "offset=01",
              "follow=maybe", "follow=", "follow=2"):
        r = c.expect(400, "GET", f"{base}/7/output?{q}")
        check(("offset" if q.startswith("offset") else "follow") in r.json["error"], (q, r))
    for q in ("", "?offset=0", "?offset=12345", "?follow=true", "?follow=false&offset=3", "?follow=1"):
        c.expect(503, "GET", f"{base}/7/output{q}")

    # start
    bad = [({"args": ["true"], "cmd": "true"}, "exactly one of args and cmd"),
           ({}, "exactly one of args and cmd"),
           ({"args": []}, "args must hold 1 to 4096 strings"),
           ({"args": ["x"] * 4097}, "args must hold 1 to 4096 strings"),
           ({"args": ["x", 5]}, "args[1]"),
           ({"args": ["x" * 70000, "y" * 70000]}, "args must be at most 131072 bytes"),
           ({"args": "true"}, "args"),
           ({"cmd": ""}, "cmd must be 1 to"),
           ({"cmd": 5}, "cmd"),
           ({"cmd": "true", "env": {"A=B": "x"}}, "env: invalid name"),
           ({"cmd": "true", "env": {"": "x"}}, "env: invalid name"),
           ({"cmd": "true", "env": {"A": 5}}, "env[\"A\"]"),
           ({"cmd": "true", "env": ["A=B"]}, "env"),
           ({"cmd": "true", "env": {f"V{i}": "x" for i in range(1025)}}, "env must hold at most 1024"),
           ({"cmd": "true", "env": {"A": "x" * 70000, "B": "y" * 70000}}, "env must be at most 131072 bytes"),
           ({"cmd": "true", "pty": {"cols": 0, "rows": 24}}, "pty"),
           ({"cmd": "true", "pty": {"cols": 80, "rows": 1001}}, "pty"),
           ({"cmd": "true", "pty": {"cols": 80}}, "pty"),
           ({"cmd": "true", "pty": {"cols": "80", "rows": 24}}, "pty"),
           ({"cmd": "true", "pty": [80, 24]}, "pty"),
           ({"cmd": "true", "timeout_secs": -1}, "timeout_secs must be between 0 and 86400"),
           ({"cmd": "true", "timeout_secs": 86401}, "timeout_secs must be between 0 and 86400"),
           ({"cmd": "true", "stdin": "yes"}, "stdin"),
           ({"cmd": "true", "cwd": ""}, "cwd"),
           ({"cmd": "true", "user": 0}, "user")]
    for body, says in bad:
        r = c.expect(400, "POST", base, body)
        check(says in r.json["error"], (body, r.json))
    # a NUL in env, in a name or a value, and in args
    for raw in (b'{"cmd": "true", "env": {"A": "x\\u0000y"}}', b'{"cmd": "true", "env": {"A\\u0000": "x"}}',
                b'{"args": ["a\\u0000b"]}'):
        c.expect(400, "POST", base, raw=raw, headers={"Content-Type": "application/json"})
    for body in ({"args": ["echo", "hi"]}, {"cmd": "echo hi"},
                 {"cmd": "cat", "cwd": "/tmp", "env": {"A": "b", "C": ""}, "user": "root",
                  "pty": {"cols": 1000, "rows": 1}, "timeout_secs": 86400, "stdin": False},
                 {"args": ["x"] * 4096}, {"cmd": "true", "env": None, "pty": None, "cwd": None}):
        c.expect(503, "POST", base, body)
    c.expect(503, "GET", base)

    # stdin: at most 64 KiB decoded
    for body, says in (({"data": "x" * 65537}, "at most 65536 bytes"),
                       ({"data_b64": base64.b64encode(b"x" * 65537).decode()}, "at most 65536 bytes"),
                       ({"data_b64": "not base64"}, "base64"),
                       ({"data_b64": "eA"}, "base64"),
                       ({"data": "x", "data_b64": "eA=="}, "mutually exclusive"),
                       ({"data": "x", "eof": "yes"}, "eof"),
                       ({"data": 5}, "data")):
        r = c.expect(400, "POST", f"{base}/7/stdin", body)
        check(says in r.json["error"], (body, r.json))
    for body in ({"data": "x" * 65536}, {"data_b64": base64.b64encode(b"\xff" * 65536).decode(), "eof": True},
                 {"data": ""}, {"eof": True}, {}):
        c.expect(503, "POST", f"{base}/7/stdin", body)

    # signal
    for sig in ("SIGFOO", "FOO", "", "sigterm", "TERM ", "0", "65", 0, 65, -9, True, None, 1.5, "9x"):
        r = c.expect(400, "POST", f"{base}/7/signal", {"signal": sig})
        check("signal" in r.json["error"], (sig, r.json))
    c.expect(400, "POST", f"{base}/7/signal", {})
    for sig in ("SIGTERM", "TERM", "KILL", "SIGINT", "9", "64", 15, 1, 64):
        c.expect(503, "POST", f"{base}/7/signal", {"signal": sig})

    # resize
    for body in ({"cols": 0, "rows": 24}, {"cols": 80, "rows": 1001}, {"cols": 80}, {"rows": 24},
                 {"cols": "80", "rows": 24}, {"cols": 80.5, "rows": 24}):
        r = c.expect(400, "POST", f"{base}/7/resize", body)
        check("cols" in r.json["error"] or "rows" in r.json["error"], (body, r.json))
    c.expect(503, "POST", f"{base}/7/resize", {"cols": 1000, "rows": 1})

    # the terminal: a WebSocket handshake or 400
    for kw in ({"key": "short"}, {"key": ""}, {"key": "dGhlIHNhbXBsZSBub25jZQ"},
               {"key": base64.b64encode(os.urandom(17)).decode()}, {"version": "8"}, {"version": ""},
               {"upgrade": None}, {"upgrade": "h2c"}):
        status, body = ws_upgrade(c, f"{base}/7/tty", **kw)
        check(status == 400 and json.loads(body).get("error"), (kw, status, body))
    status, body = ws_upgrade(c, f"{base}/7/tty?offset=x")
    check(status == 400, (status, body))
    status, body = ws_upgrade(c, f"{base}/7/tty")
    check(status == 503, (status, body))

    # exec with "stream"
    c.expect(400, "POST", "/v1/sandboxes/sb-1/exec", {"args": ["true"], "stream": "yes"})
    c.expect(400, "POST", "/v1/sandboxes/sb-1/exec", {"args": [], "stream": True})
    c.expect(400, "POST", "/v1/sandboxes/sb-1/exec", {"args": ["a", 1], "stream": True})
    c.expect(503, "POST", "/v1/sandboxes/sb-1/exec", {"args": ["true"], "stream": True})
    c.expect(503, "POST", "/v1/sandboxes/sb-1/exec", {"args": ["true"], "stream": False})


def t_daemon_absent(c):
    for method, path, body in (("GET", "/v1/snapshots", None), ("GET", "/v1/sandboxes", None),
                               ("POST", "/v1/sandboxes", {"snapshot_tag": "py", "n": 2}),
                               ("POST", "/v1/sandboxes/sb-1/ping", None), ("GET", "/v1/snapshots/py/info", None)):
        r = c.expect(503, method, path, body)
        check("unavailable" in r.json["error"], r)
    r = c.expect(200, "GET", "/metrics")
    text = r.data.decode()
    check('forkd_build_info{version="' in text and "forkd_rest_daemon_up 0" in text, text[:400])


def t_slow_client(c):
    """Headers sent byte by byte, each gap longer than the timeout; and a
    trickle fast enough to dodge an idle timeout: both cut off, while another
    client is served."""
    results = {}

    def slow(name, gap):
        s = socket.create_connection(("127.0.0.1", c.port), timeout=30)
        req = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Padding: " + b"p" * 200 + b"\r\n\r\n"
        sent = 0
        try:
            for b in req:
                s.sendall(bytes([b]))
                sent += 1
                time.sleep(gap)
            results[name] = ("completed", sent, s.recv(100))
        except OSError as e:
            results[name] = ("cut", sent, str(e))
        finally:
            s.close()

    threads = [threading.Thread(target=slow, args=("idle", REQUEST_TIMEOUT + 1.5)),
               threading.Thread(target=slow, args=("trickle", 0.25))]
    for t in threads:
        t.start()
    time.sleep(0.5)
    served = 0
    while any(t.is_alive() for t in threads):
        c.expect(200, "GET", "/healthz", token=None)
        served += 1
        time.sleep(0.2)
    for t in threads:
        t.join()
    for name in ("idle", "trickle"):
        state, sent, info = results[name]
        check(state == "cut" or (state == "completed" and info == b""),
              f"{name} client was not cut off: {results[name]}")
        check(sent < 220, f"{name} client sent its whole request: {results[name]}")
    check(served > 0, "no other client was served meanwhile")
    m = c.expect(200, "GET", "/metrics").data.decode()
    cut = [l for l in m.splitlines() if l.startswith("forkd_rest_connections_cut_total ")]
    check(cut and int(cut[0].split()[1]) >= 1, cut)


def t_bundle_upload_rate(c):
    """A bundle upload (POST /v1/snapshots/unpack, its body spooled to a file) that
    outlasts --timeout while it keeps up 1 MiB/s is answered; one slower than that
    is still cut. The daemon is absent here: an upload that arrives whole is 503."""
    def upload(total, chunk, gap):
        s = socket.create_connection(("127.0.0.1", c.port), timeout=30)
        head = (f"POST /v1/snapshots/unpack HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"Content-Type: application/zstd\r\nContent-Length: {total}\r\n\r\n").encode()
        sent, t0 = 0, time.monotonic()
        try:
            s.sendall(head)
            while sent < total:
                s.sendall(b"\0" * min(chunk, total - sent))
                sent += min(chunk, total - sent)
                time.sleep(gap)
            reply = s.recv(200)
            return ("answered" if reply else "cut"), sent, reply, time.monotonic() - t0
        except OSError as e:
            return "cut", sent, str(e), time.monotonic() - t0
        finally:
            s.close()

    # 8 MiB at about 2 MiB/s: about 4 s, past the 3 s --timeout, within 3 + 8 s.
    state, sent, reply, took = upload(8 << 20, 128 << 10, 0.06)
    check(state == "answered" and reply.startswith(b"HTTP/1.1 503") and took > REQUEST_TIMEOUT,
          f"an upload at 2 MiB/s was not answered: {state} {sent} {reply!r} {took:.1f} s")
    # 8 MiB at 128 KiB/s: cut a little after 3 s, long before the end.
    state, sent, reply, took = upload(8 << 20, 64 << 10, 0.5)
    check(state == "cut" and sent < 2 << 20 and took < REQUEST_TIMEOUT + 5,
          f"an upload at 128 KiB/s was not cut: {state} {sent} {reply!r} {took:.1f} s")


def t_connection_flood(c):
    socks = []
    try:
        for _ in range(200):  # --connection-limit is 64
            try:
                socks.append(socket.create_connection(("127.0.0.1", c.port), timeout=5))
            except OSError:
                break
        for s in socks[:100]:
            try:
                s.sendall(b"GET /heal")
            except OSError:
                pass
    finally:
        for s in socks:
            s.close()
    for _ in range(50):
        try:
            c.expect(200, "GET", "/healthz", token=None)
            return
        except (OSError, http.client.HTTPException):
            time.sleep(0.1)
    c.expect(200, "GET", "/healthz", token=None)


def t_token_file_checks(stack):
    bad = os.path.join(stack.tmp, "token-bad")
    for content, mode in ((b"", 0o600), (b"\n\n", 0o600), (b"secret\n", 0o644), (b"sec ret\n", 0o600)):
        with open(bad, "wb") as f:
            f.write(content)
        os.chmod(bad, mode)
        p = subprocess.run([REST, "--listen", f"127.0.0.1:{free_port()}", "--token-file", bad],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
        check(p.returncode != 0, f"forkd-rest started with token file {content!r} mode {oct(mode)}")
    p = subprocess.run([REST, "--listen", "nonsense"], capture_output=True, timeout=20)
    check(p.returncode != 0, "bad --listen accepted")
    p = subprocess.run([REST, "--tls-cert", "/nonexistent"], capture_output=True, timeout=20)
    check(p.returncode != 0, "--tls-cert without --tls-key accepted")


def t_https(stack):
    openssl = shutil.which("openssl")
    if not openssl:
        raise Skip("openssl not installed")
    cert = os.path.join(stack.tmp, "cert.pem")
    key = os.path.join(stack.tmp, "key.pem")
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    os.chmod(key, 0o600)
    p, port = stack.start_rest("--tls-cert", cert, "--tls-key", key)
    ctx = ssl.create_default_context(cafile=cert)
    c = Client(port, ctx)
    r = c.expect(200, "GET", "/healthz", token=None)
    check(r.json == {"ok": True}, r)
    c.expect(200, "GET", "/version")
    c.expect(401, "GET", "/version", token="wrong")
    c.expect(400, "POST", "/v1/sandboxes", {"snapshot_tag": "py", "n": 0})
    # a client that does not trust the certificate fails the handshake
    try:
        Client(port, ssl.create_default_context()).req("GET", "/healthz", token=None)
        raise AssertionError("TLS handshake succeeded with an untrusted certificate")
    except ssl.SSLError:
        pass
    # plain HTTP to the TLS port gets no HTTP answer
    try:
        r = Client(port).req("GET", "/healthz", token=None, timeout=10)
        raise AssertionError(f"plain HTTP answered on the TLS port: {r}")
    except (OSError, http.client.HTTPException):
        pass
    c.expect(200, "GET", "/healthz", token=None)
    stack.stop(p)
    check(p.returncode == 0, f"forkd-rest (TLS) exit status {p.returncode}")


def t_socket_activation(stack):
    sa = shutil.which("systemd-socket-activate")
    if not sa:
        raise Skip("systemd-socket-activate not installed")
    port = free_port()
    p = stack.spawn([sa, "-l", f"127.0.0.1:{port}", REST, "--token-file", stack.token_file(),
                     "--bus-address", stack.bus, "--listen", "127.0.0.1:1"])
    wait_port(port, p, stack)
    c = Client(port)
    # the first connection makes systemd-socket-activate exec forkd-rest
    for _ in range(100):
        try:
            r = c.req("GET", "/healthz", token=None, timeout=10)
            break
        except (OSError, http.client.HTTPException):
            time.sleep(0.1)
    check(r.status == 200 and r.json == {"ok": True}, r)
    c.expect(200, "GET", "/version")
    c.expect(401, "GET", "/version", token=None)
    log = stack.log_tail(p)
    check("passed by the service manager" in log, log)
    stack.stop(p)


# ---------------------------------------------------------------- tests with the daemon


# forkd's REST API v1 example request for POST /v1/snapshots (tests/spec-snapshot-request.json,
# also sent by tests/linux/test-linux-guest.py), as the API documents it
# (only the two paths are ours): no memory field, so forkd's default applies.
SPEC_SNAPSHOT_REQUEST = json.load(open(os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "spec-snapshot-request.json")))
# forkd's default: FORKD_DEFAULT_MEM_MIB (the test environment's, meson.build), else forkd-vmm's 256
DEFAULT_MEM_MIB = int(os.environ.get("FORKD_DEFAULT_MEM_MIB") or 0) or 256


class Ctx:
    tag = SPEC_SNAPSHOT_REQUEST["tag"]
    sandboxes = []


def run_on_stack(tests, first=None, rest_args=("--timeout", "60")):
    """A TAP run of tests, each (name, fn(c, stack)), against the real stack: a private
    dbus-daemon, forkd-rest (stack.rest_proc) and forkd; skipped when a part is not
    built or /dev/kvm is not usable; stops after first if that failed. Returns TAP's
    exit status."""
    tap = Tap()
    missing = [what for what, path in (("forkd-rest", REST), ("forkd", DAEMON), ("forkd-vmm", VMM),
                                       ("test guest", GUEST), ("dbus-daemon", DBUS_DAEMON))
               if not path or not os.path.exists(path)]
    if missing:
        print(f"1..0 # SKIP not built or not installed: {', '.join(missing)}")
        return 0
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        print("1..0 # SKIP /dev/kvm is not usable")
        return 0
    stack = Stack()
    signal.signal(signal.SIGTERM, lambda *a: (stack.cleanup(), sys.exit(1)))
    try:
        stack.start_bus()
        rest, port = stack.start_rest(*rest_args)
        stack.rest_proc = rest
        c = Client(port)
        stack.start_daemon()
        wait_daemon(c, stack)
        for name, fn in tests:
            tap.run(name, fn, c, stack)
            if fn is first and tap.failed:
                break
        stack.finish(tap, c, rest)
    finally:
        stack.cleanup()
    return tap.done()


def wait_daemon(c, stack):
    for _ in range(300):
        if stack.daemon.poll() is not None:
            raise AssertionError(f"forkd exited with {stack.daemon.returncode}: {stack.log_tail(stack.daemon)}")
        r = c.req("GET", "/v1/snapshots")
        if r.status == 200:
            return
        time.sleep(0.1)
    raise AssertionError(f"forkd did not come up: {r}")


def t_snapshot_create(c, stack):
    rootfs = os.path.join(stack.tmp, "rootfs.img")
    with open(rootfs, "wb") as f:
        f.truncate(8 << 20)
    Ctx.rootfs = rootfs
    body = dict(SPEC_SNAPSHOT_REQUEST, kernel=GUEST, rootfs=rootfs)
    check(list(body) == list(SPEC_SNAPSHOT_REQUEST), body)
    r = c.expect(201, "POST", "/v1/snapshots", body)
    check(r.json["tag"] == Ctx.tag and isinstance(r.json["dir"], str) and r.json["dir"].startswith("/"), r)
    check(isinstance(r.json["created_at_unix"], int) and r.json["created_at_unix"] > 1600000000, r)
    Ctx.snapshot = r.json
    # No memory field: the guest got the default, and the snapshot says so.
    check(r.json.get("mem_size") == DEFAULT_MEM_MIB << 20, r)
    r = c.expect(200, "GET", f"/v1/snapshots/{Ctx.tag}/info")
    check(r.json["memory_logical_bytes"] == DEFAULT_MEM_MIB << 20 and r.json["mem_size"] == DEFAULT_MEM_MIB << 20, r)


def t_pack_unpack(c, stack):
    """Our extension: GET /v1/snapshots/:tag/pack and POST /v1/snapshots/unpack."""
    def unpack(data, status, query=""):
        return c.expect(status, "POST", "/v1/snapshots/unpack" + query, raw=data,
                        headers={"Content-Type": "application/zstd"})

    def tags():
        return {s["tag"] for s in c.expect(200, "GET", "/v1/snapshots").json}

    r = c.expect(200, "GET", f"/v1/snapshots/{Ctx.tag}/pack")
    check(r.headers.get("Content-Type") == "application/zstd" and r.data[:4] == b"\x28\xb5\x2f\xfd", r)
    one = r.data
    c.expect(404, "GET", "/v1/snapshots/rest-nosuch/pack")
    c.expect(400, "GET", "/v1/snapshots/-bad/pack")
    r = unpack(one, 409)
    check(Ctx.tag in r.json["error"], r)
    r = c.expect(405, "POST", "/v1/snapshots/other", raw=b"x")
    check(r.headers.get("Allow") == "DELETE", r.headers)
    before = tags()
    bad = bytearray(one)
    bad[len(bad) // 2] ^= 0x20
    r = unpack(bytes(bad), 400, "?tag=rest-bad")
    check("refused" in r.json["error"], r)
    r = unpack(b"not a bundle", 400, "?tag=rest-bad")
    check(tags() == before, "a refused bundle registered something")
    snapdir = os.path.dirname(Ctx.snapshot["dir"])
    check(not [d for d in os.listdir(snapdir) if d.startswith(".unpack-")], os.listdir(snapdir))
    unpack(one, 400, "?tag=-bad")
    # A bundle announced over the cap (1 GiB): 413 before any byte is read.
    s = socket.create_connection(("127.0.0.1", c.port), timeout=10)
    s.sendall(b"POST /v1/snapshots/unpack HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() +
              b"\r\nContent-Length: " + str((1 << 30) + 1).encode() + b"\r\n\r\n")
    data = s.recv(4096)
    s.close()
    check(data.startswith(b"HTTP/1.1 413 ") and b"1073741824" in data, data)
    # Over the JSON body cap is fine for a bundle.
    r = unpack(b"\0" * (BODY_MAX + 4096), 400, "?tag=rest-bad")
    check("refused" in r.json["error"], r)
    # One snapshot under a new tag, then a chain of two.
    r = unpack(one, 201, "?tag=rest-unpacked")
    check([s["tag"] for s in r.json] == ["rest-unpacked"], r)
    sb = c.expect(201, "POST", "/v1/sandboxes", {"snapshot_tag": "rest-unpacked", "n": 1}).json[0]
    c.expect(200, "POST", f"/v1/sandboxes/{sb['id']}/ping")
    c.expect(201, "POST", f"/v1/sandboxes/{sb['id']}/branch", {"tag": "rest-link", "mode": "diff"})
    c.expect(204, "DELETE", f"/v1/sandboxes/{sb['id']}")
    chain = c.expect(200, "GET", "/v1/snapshots/rest-link/pack").data
    c.expect(204, "DELETE", "/v1/snapshots/rest-link")
    c.expect(204, "DELETE", "/v1/snapshots/rest-unpacked")
    r = unpack(chain, 400, "?tag=rest-other")
    check("one snapshot" in r.json["error"], r)
    r = unpack(chain, 201)
    check([s["tag"] for s in r.json] == ["rest-unpacked", "rest-link"], r)
    check(r.json[1].get("parent_tag") == "rest-unpacked", r)
    sb = c.expect(201, "POST", "/v1/sandboxes", {"snapshot_tag": "rest-link", "n": 1}).json[0]
    c.expect(200, "POST", f"/v1/sandboxes/{sb['id']}/ping")
    c.expect(204, "DELETE", f"/v1/sandboxes/{sb['id']}")
    c.expect(204, "DELETE", "/v1/snapshots/rest-link")
    c.expect(204, "DELETE", "/v1/snapshots/rest-unpacked")
    # A bundle far larger than a pipe's buffer streams while forkd packs it: 8 MiB
    # of random bytes in the guest's RAM (through /proc/<pid>/mem of its VMM).
    sb = c.expect(201, "POST", "/v1/sandboxes", {"snapshot_tag": Ctx.tag, "n": 1}).json[0]
    with open(f"/proc/{sb['pid']}/maps") as f:
        base = next(int(l.split("-")[0], 16) for l in f if l.rstrip().endswith("/memory.bin"))
    noise = os.urandom(8 << 20)
    fd = os.open(f"/proc/{sb['pid']}/mem", os.O_RDWR)
    try:
        os.pwrite(fd, noise, base + (16 << 20))
    finally:
        os.close(fd)
    c.expect(201, "POST", f"/v1/sandboxes/{sb['id']}/branch", {"tag": "rest-big", "mode": "full"})
    c.expect(204, "DELETE", f"/v1/sandboxes/{sb['id']}")
    r = c.expect(200, "GET", "/v1/snapshots/rest-big/pack")
    check(len(r.data) > (8 << 20) and r.headers.get("Transfer-Encoding") == "chunked", (len(r.data), r.headers))
    r = unpack(r.data, 201, "?tag=rest-big2")
    sb = c.expect(201, "POST", "/v1/sandboxes", {"snapshot_tag": "rest-big2", "n": 1}).json[0]
    fd = os.open(f"/proc/{sb['pid']}/mem", os.O_RDONLY)
    try:
        with open(f"/proc/{sb['pid']}/maps") as f:
            base = next(int(l.split("-")[0], 16) for l in f if l.rstrip().endswith("/memory.bin"))
        check(os.pread(fd, 1 << 20, base + (16 << 20)) == noise[:1 << 20], "the unpacked guest RAM differs")
    finally:
        os.close(fd)
    c.expect(204, "DELETE", f"/v1/sandboxes/{sb['id']}")
    c.expect(204, "DELETE", "/v1/snapshots/rest-big2")
    c.expect(204, "DELETE", "/v1/snapshots/rest-big")


def t_snapshot_errors(c, stack):
    # REST API v1: "400 - ... snapshot already exists"
    r = c.expect(400, "POST", "/v1/snapshots", {"tag": Ctx.tag, "kernel": GUEST, "rootfs": Ctx.rootfs})
    check(Ctx.tag in r.json["error"] or "exist" in r.json["error"], r)
    # REST API v1: 500 on a boot failure (or 400 if the daemon refuses the path up front)
    r = c.req("POST", "/v1/snapshots", {"tag": "rest-nokernel", "kernel": "/nonexistent/vmlinux",
                                        "rootfs": Ctx.rootfs, "boot_wait_secs": 5})
    check(r.status in (400, 500), r)
    # REST API v1: 500 on a boot failure: a kernel that exists but is no kernel
    junk = os.path.join(stack.tmp, "junk-kernel")
    with open(junk, "wb") as f:
        f.write(os.urandom(64 << 10))
    r = c.expect(500, "POST", "/v1/snapshots", {"tag": "rest-junk", "kernel": junk, "rootfs": Ctx.rootfs,
                                                "boot_wait_secs": 5})
    # REST API v1: 500 on a boot failure: a guest that triple-faults while booting
    # (tests/guest/triple-fault.S): the error says so and quotes its console.
    elf = os.path.join(os.path.dirname(GUEST), "forkd-triple-fault.elf")
    check(os.path.exists(elf), f"{elf} is not built")
    r = c.expect(500, "POST", "/v1/snapshots", {"tag": "rest-tf", "kernel": elf, "rootfs": Ctx.rootfs,
                                                "boot_wait_secs": 10})
    err = r.json["error"]
    check(list(r.json) == ["error"] and "the guest crashed during boot (triple fault)" in err, r)
    check(err.endswith("  forkd-triple-fault: started\n  forkd-triple-fault: loading an empty IDT, then faulting"),
          r)
    log = os.path.join(stack.tmp, "state", "logs", "rest-tf.boot.log")
    check(log in err and os.path.exists(log), f"the console log the error names: {r}")
    r = c.expect(200, "GET", "/v1/snapshots")
    for tag in ("rest-junk", "rest-tf"):
        check(all(s["tag"] != tag for s in r.json), f"a failed boot left a snapshot: {r}")
        check(not os.path.exists(os.path.join(os.path.dirname(Ctx.snapshot["dir"]), tag)), "snapshot dir left")
    c.expect(404, "GET", "/v1/snapshots/rest-nosuch/info")
    c.expect(404, "DELETE", "/v1/snapshots/rest-nosuch")
    c.expect(404, "POST", "/v1/sandboxes", {"snapshot_tag": "rest-nosuch", "n": 1})


def t_snapshot_list_info(c, stack):
    r = c.expect(200, "GET", "/v1/snapshots")
    check(isinstance(r.json, list), r)
    mine = [s for s in r.json if s.get("tag") == Ctx.tag]
    check(len(mine) == 1 and mine[0]["dir"] == Ctx.snapshot["dir"], r)
    r = c.expect(200, "GET", f"/v1/snapshots/{Ctx.tag}/info")
    i = r.json
    check(i["tag"] == Ctx.tag and i["dir"] == Ctx.snapshot["dir"], r)
    check(i["chain_depth"] == 0 and i["ancestors"] == [] and i["dependents"] == [], r)
    for k in ("memory_logical_bytes", "memory_physical_bytes", "vmstate_bytes"):
        check(isinstance(i.get(k), int) and i[k] >= 0, f"{k}: {r}")
    check(i["memory_logical_bytes"] > 0, r)
    check("parent_tag" not in i, r)


def t_fork(c, stack):
    r = c.expect(201, "POST", "/v1/sandboxes", {"snapshot_tag": Ctx.tag, "n": 2, "per_child_netns": False,
                                                 "live_fork": False})
    check(isinstance(r.json, list) and len(r.json) == 2, r)
    for sb in r.json:
        check(sb["snapshot_tag"] == Ctx.tag and isinstance(sb["id"], str) and sb["id"], r)
        check(isinstance(sb["created_at_unix"], int), r)
        check(isinstance(sb.get("pid"), int) and sb["pid"] > 1, r)
        check("memory_limit_mib" not in sb or sb["memory_limit_mib"] == 0, r)
    check(r.json[0]["id"] != r.json[1]["id"], r)
    Ctx.sandboxes = [sb["id"] for sb in r.json]


def t_fork_limits(c, stack):
    """cpu_limit, disk_rate, net_rate on POST /v1/sandboxes, shown in
    SandboxInfo; PATCH changes them live (cpu.max, or v1's cpu.cfs_quota_us,
    too); a bad PATCH is a 400 and changes nothing."""
    if not stack.cgroot or (stack.cgroot.startswith("/sys/fs/cgroup/memory/") and not stack.cpu_cgroot()):
        raise Skip("no cgroup v2 tree of forkd's, nor v1 memory and cpu hierarchies (or not root)")
    if not stack.cpu_cgroot() and not os.path.exists(os.path.join(stack.cgroot, "..", "cgroup.subtree_control")):
        raise Skip("no cgroup.subtree_control")
    rate = {"bandwidth": 1 << 20, "ops": 100}
    r = c.expect(201, "POST", "/v1/sandboxes", {"snapshot_tag": Ctx.tag, "cpu_limit": 0.5, "disk_rate": rate})
    sid = r.json[0]["id"]
    try:
        check(r.json[0]["cpu_limit"] == 0.5 and r.json[0]["disk_rate"] == rate, r)
        check("net_rate" not in r.json[0], r)
        check(stack.cpu_max(sid) == ["50000", "100000"], "cpu.max after the fork")
        r = c.expect(200, "PATCH", f"/v1/sandboxes/{sid}", {"cpu_limit": 0.25, "net_rate": {"bandwidth": 8192}})
        check(r.json["cpu_limit"] == 0.25 and r.json["net_rate"] == {"bandwidth": 8192}, r)
        check(stack.cpu_max(sid) == ["25000", "100000"], "cpu.max after PATCH")
        # a bad value: 400 naming it, and the good one beside it is not applied
        r = c.expect(400, "PATCH", f"/v1/sandboxes/{sid}", {"cpu_limit": 0.75, "disk_rate": {"ops": 0.5}})
        check("disk_rate.ops" in r.json["error"], r)
        r = c.expect(400, "PATCH", f"/v1/sandboxes/{sid}", {"cpu_limit": 64})
        check("cpu_limit must be a number between 0.01 and" in r.json["error"], r)
        r = c.expect(200, "GET", f"/v1/sandboxes/{sid}")
        check(r.json["cpu_limit"] == 0.25 and r.json["disk_rate"] == rate, r)
        check(stack.cpu_max(sid) == ["25000", "100000"], "cpu.max after the refused PATCH")
        # removed
        r = c.expect(200, "PATCH", f"/v1/sandboxes/{sid}", {"cpu_limit": 0, "disk_rate": {"bandwidth": 0}})
        check("cpu_limit" not in r.json and "disk_rate" not in r.json, r)
        check(stack.cpu_max(sid)[0] == "max", "cpu.max after removing cpu_limit")
        c.expect(200, "POST", f"/v1/sandboxes/{sid}/ping")
    finally:
        c.req("DELETE", f"/v1/sandboxes/{sid}")
    c.expect(404, "PATCH", "/v1/sandboxes/sb-000000-0000", {"cpu_limit": 0.5})


def t_fork_memory_limit(c, stack):
    """memory_limit_mib: each child in a cgroup of its own with that limit,
    shown in SandboxInfo, gone with the sandbox."""
    if not stack.cgroot:
        raise Skip("no cgroup memory controller (or not root)")
    r = c.expect(201, "POST", "/v1/sandboxes", {"snapshot_tag": Ctx.tag, "n": 2, "memory_limit_mib": 48})
    ids = [sb["id"] for sb in r.json]
    try:
        check(all(sb["memory_limit_mib"] == 48 for sb in r.json), r)
        v1 = stack.cgroot.startswith("/sys/fs/cgroup/memory/")
        for sid in ids:
            with open(os.path.join(stack.cgroot, sid, "memory.limit_in_bytes" if v1 else "memory.max")) as f:
                check(int(f.read()) == 48 << 20, f"{sid}: limit in the kernel")
            r = c.expect(200, "GET", f"/v1/sandboxes/{sid}")
            check(r.json["memory_limit_mib"] == 48, r)
            c.expect(200, "POST", f"/v1/sandboxes/{sid}/ping")
    finally:
        for sid in ids:
            c.req("DELETE", f"/v1/sandboxes/{sid}")
    for _ in range(100):
        if not any(os.path.exists(os.path.join(stack.cgroot, sid)) for sid in ids):
            break
        time.sleep(0.1)
    check(not any(os.path.exists(os.path.join(stack.cgroot, sid)) for sid in ids), "cgroups left after DELETE")
    # REST API v1: "per_child_netns ... the host must have created those namespaces"
    if not os.path.exists("/run/netns/forkd-child-1"):
        r = c.expect(400, "POST", "/v1/sandboxes", {"snapshot_tag": Ctx.tag, "n": 1, "per_child_netns": True})
        check("forkd-child-1" in r.json["error"], r)


def t_sandbox_list_get(c, stack):
    r = c.expect(200, "GET", "/v1/sandboxes")
    ids = {sb["id"] for sb in r.json}
    check(set(Ctx.sandboxes) <= ids, r)
    r = c.expect(200, "GET", f"/v1/sandboxes/{Ctx.sandboxes[0]}")
    check(r.json["id"] == Ctx.sandboxes[0] and r.json["snapshot_tag"] == Ctx.tag, r)
    c.expect(404, "GET", "/v1/sandboxes/sb-nosuch")
    m = c.expect(200, "GET", "/metrics").data.decode()
    check("forkd_rest_daemon_up 1" in m, m[:300])
    check(any(l.startswith("forkd_snapshots_total ") and int(l.split()[1]) >= 1 for l in m.splitlines()), m[:600])
    check(any(l.startswith("forkd_sandboxes_active ") and int(l.split()[1]) >= 2 for l in m.splitlines()), m[:600])
    # each sandbox's usage as a JSON object, left out with ?usage=false
    for sb in r_list_usage(c):
        u = sb["usage"]
        check(isinstance(u, dict) and u["cpu_usec"] >= 0 and u["memory_shared_kib"] > 0, sb)
        check(isinstance(u["throttled_usec"], dict) and "disk" in u["throttled_usec"], sb)
    r = c.expect(200, "GET", f"/v1/sandboxes/{Ctx.sandboxes[0]}")
    check("disk_written_bytes" in r.json["usage"], r)
    r = c.expect(200, "GET", "/v1/sandboxes?usage=false")
    check(set(Ctx.sandboxes) <= {sb["id"] for sb in r.json} and all("usage" not in sb for sb in r.json), r)
    c.expect(400, "GET", "/v1/sandboxes?usage=maybe")
    # forkd's totals and histograms; no series per sandbox without --metrics-per-sandbox
    lines = m.splitlines()
    for name in ("forkd_fork_duration_seconds", "forkd_branch_pause_seconds", "forkd_agent_call_duration_seconds"):
        check(f"# TYPE {name} histogram" in lines and any(l.startswith(f'{name}_bucket{{le="+Inf"}} ') for l in lines)
              and any(l.startswith(f"{name}_count ") for l in lines), (name, m[-3000:]))
    fork_count = [int(l.split()[1]) for l in lines if l.startswith("forkd_fork_duration_seconds_count ")]
    check(fork_count and fork_count[0] >= 1, fork_count)
    buckets = [int(l.split()[1]) for l in lines if l.startswith("forkd_fork_duration_seconds_bucket")]
    check(buckets == sorted(buckets) and buckets[-1] == fork_count[0], buckets)
    for name in ("forkd_sandboxes_cpu_seconds", "forkd_sandboxes_memory_private_bytes",
                 "forkd_sandboxes_memory_shared_bytes", "forkd_sandboxes_disk_read_bytes",
                 "forkd_sandboxes_disk_written_bytes", "forkd_sandboxes_net_rx_bytes", "forkd_sandboxes_net_tx_bytes"):
        check(any(l.startswith(name + " ") for l in lines), (name, m[-3000:]))
    check("forkd_sandbox_cpu_seconds_total" not in m and "forkd_rest_metrics_sandboxes_left_out" not in m, m[-2000:])
    # with --metrics-per-sandbox: one series per sandbox and the gauge of those left out
    p, port = stack.start_rest("--metrics-per-sandbox")
    try:
        m2 = Client(port).expect(200, "GET", "/metrics").data.decode()
        for sid in Ctx.sandboxes:
            for name in ("forkd_sandbox_cpu_seconds_total", "forkd_sandbox_memory_private_bytes",
                         "forkd_sandbox_disk_read_bytes_total", "forkd_sandbox_net_tx_bytes_total"):
                check(f'{name}{{id="{sid}"}} ' in m2, (name, sid, m2[-3000:]))
        check("forkd_rest_metrics_sandboxes_left_out 0" in m2, m2[-1000:])
    finally:
        stack.stop(p)


def r_list_usage(c):
    r = c.expect(200, "GET", "/v1/sandboxes")
    return [sb for sb in r.json if sb["id"] in Ctx.sandboxes]


def t_ping(c, stack):
    for sid in Ctx.sandboxes:
        r = c.expect(200, "POST", f"/v1/sandboxes/{sid}/ping")
        check(r.json["pong"] is True and r.json["pid"] == 1 and "numpy_version" in r.json, r)
    c.expect(200, "POST", f"/v1/sandboxes/{Ctx.sandboxes[0]}/ping", {})
    c.expect(404, "POST", "/v1/sandboxes/sb-nosuch/ping")


def t_exec_eval(c, stack):
    """The test guest refuses exec and eval (docs/agent-protocol.md): an
    error from the guest, never a fake success."""
    sid = Ctx.sandboxes[0]
    # the agent's error frame {"error": "not supported by the test guest"}
    # comes back as org.forkd.Error.GuestError -> 500 with that message
    r = c.req("POST", f"/v1/sandboxes/{sid}/exec", {"args": ["python3", "-c", "print(2+2)"], "timeout_secs": 5})
    check(r.status == 500 and r.json == {"error": "not supported by the test guest"}, r)
    r = c.req("POST", f"/v1/sandboxes/{sid}/eval", {"code": "1+1"})
    check(r.status == 500 and r.json == {"error": "not supported by the test guest"}, r)
    c.expect(404, "POST", "/v1/sandboxes/sb-nosuch/exec", {"args": ["true"]})
    c.expect(404, "POST", "/v1/sandboxes/sb-nosuch/eval", {"code": "1"})
    # the sandbox is still healthy afterwards
    c.expect(200, "POST", f"/v1/sandboxes/{sid}/ping")


def t_chains(c, stack):
    """REST API v1's chain rows: DELETE with dependents (409 naming them, cascade,
    force, both 400), compact (201 SnapshotInfo of a flat snapshot that forks;
    409, 400, 404), an orphan and a re-snapshotted parent 409."""
    sid = Ctx.sandboxes[0]

    def diff_of(parent, tag):
        child = c.expect(201, "POST", "/v1/sandboxes", {"snapshot_tag": parent, "n": 1}).json[0]["id"]
        r = c.expect(201, "POST", f"/v1/sandboxes/{child}/branch", {"tag": tag, "mode": "diff"})
        check(r.json["parent_tag"] == parent, r)
        c.expect(204, "DELETE", f"/v1/sandboxes/{child}")

    def fork_one(tag):
        child = c.expect(201, "POST", "/v1/sandboxes", {"snapshot_tag": tag, "n": 1}).json[0]["id"]
        c.expect(200, "POST", f"/v1/sandboxes/{child}/ping")
        c.expect(204, "DELETE", f"/v1/sandboxes/{child}")

    # Ctx.tag <- rest-d1 (t_branch) <- rest-d1b
    diff_of("rest-d1", "rest-d1b")
    r = c.expect(409, "DELETE", "/v1/snapshots/rest-d1")
    check(r.json == {"error": "snapshot `rest-d1` is the parent of 1 chained snapshot(s): [rest-d1b]; rerun with "
                              "`?cascade=true` to delete the whole subtree, or `?force=true` to orphan the children "
                              "(they will fail to restore)"}, r)
    c.expect(400, "DELETE", "/v1/snapshots/rest-d1?cascade=true&force=true")

    # compact the head: a flat snapshot; the chain stays
    r = c.expect(201, "POST", "/v1/snapshots/rest-d1b/compact", {"to": "rest-flat"})
    check(r.json["tag"] == "rest-flat" and "parent_tag" not in r.json and r.json["dir"].endswith("/rest-flat"), r)
    r = c.expect(200, "GET", "/v1/snapshots/rest-flat/info")
    check(r.json["chain_depth"] == 0 and r.json["ancestors"] == [] and "parent_tag" not in r.json, r)
    check(c.expect(200, "GET", "/v1/snapshots/rest-d1b/info").json["chain_depth"] == 2, "the chain changed")
    fork_one("rest-flat")
    fork_one("rest-d1b")
    c.expect(409, "POST", "/v1/snapshots/rest-d1b/compact", {"to": "rest-flat"})
    c.expect(409, "POST", "/v1/snapshots/rest-d1b/compact", {"to": Ctx.tag})
    c.expect(400, "POST", "/v1/snapshots/rest-d1b/compact", {"to": "rest-d1b"})
    c.expect(400, "POST", "/v1/snapshots/rest-d1b/compact", {"to": ".compact-staging-x"})
    c.expect(404, "POST", "/v1/snapshots/rest-nosuch/compact", {"to": "rest-flat2"})
    listed = {s["tag"] for s in c.expect(200, "GET", "/v1/snapshots").json}
    check("rest-flat2" not in listed, listed)

    # force: the child is orphaned and fails to fork, naming its parent
    c.expect(204, "DELETE", "/v1/snapshots/rest-d1?force=true")
    c.expect(404, "GET", "/v1/snapshots/rest-d1/info")
    r = c.expect(409, "POST", "/v1/sandboxes", {"snapshot_tag": "rest-d1b", "n": 1})
    check("references parent `rest-d1`, which no longer exists" in r.json["error"], r)
    # the parent re-snapshotted under the same tag: REST API v1's 409
    c.expect(201, "POST", f"/v1/sandboxes/{sid}/branch", {"tag": "rest-d1", "mode": "full"})
    r = c.expect(409, "POST", "/v1/sandboxes", {"snapshot_tag": "rest-d1b", "n": 1})
    check(r.json["error"].startswith("chain `rest-d1b` references `rest-d1` content `") and
          "but parent now has content" in r.json["error"], r)
    r = c.expect(409, "POST", "/v1/snapshots/rest-d1b/compact", {"to": "rest-flat2"})
    check("but parent now has content" in r.json["error"], r)

    # cascade: the whole subtree (the stale rest-d1b too: its parent_tag names rest-d1)
    diff_of("rest-d1", "rest-e1")
    diff_of("rest-e1", "rest-e2")
    r = c.expect(409, "DELETE", "/v1/snapshots/rest-d1")
    check("2 chained snapshot(s)" in r.json["error"] and "rest-d1b" in r.json["error"] and
          "rest-e1" in r.json["error"], r)
    c.expect(204, "DELETE", "/v1/snapshots/rest-d1?cascade=true")
    for tag in ("rest-d1", "rest-e1", "rest-e2", "rest-d1b"):
        c.expect(404, "GET", f"/v1/snapshots/{tag}/info")
    c.expect(204, "DELETE", "/v1/snapshots/rest-flat")
    r = c.expect(200, "GET", "/v1/sandboxes")
    check(len(r.json) == len(Ctx.sandboxes), f"sandboxes left behind: {r}")


def t_sandbox_fork(c, stack):
    """POST /v1/sandboxes/:id/fork: 200 {"children": [ids]}, every
    child answering already; the parent runs on; the error bodies as given."""
    sid = Ctx.sandboxes[0]
    r = c.expect(200, "POST", f"/v1/sandboxes/{sid}/fork", {"n": 3})
    check(list(r.json) == ["children"] and len(r.json["children"]) == 3 and len(set(r.json["children"])) == 3, r)
    children = list(r.json["children"])
    for child in children:
        c.expect(200, "POST", f"/v1/sandboxes/{child}/ping")
    r = c.expect(200, "POST", f"/v1/sandboxes/{sid}/fork", None)
    check(len(r.json["children"]) == 1, r)
    children += r.json["children"]
    c.expect(200, "POST", f"/v1/sandboxes/{sid}/ping")
    r = c.expect(400, "POST", f"/v1/sandboxes/{sid}/fork", {"n": 33})
    check(r.json == {"error": "n must be between 1 and 32"}, r)
    r = c.expect(404, "POST", "/v1/sandboxes/sb-nosuch/fork", {"n": 2})
    check(r.json == {"error": "sandbox not found"}, r)
    r = c.expect(401, "POST", f"/v1/sandboxes/{sid}/fork", {"n": 2}, token="wrong")
    check(r.json == {"error": "invalid api key"}, r)
    for child in children:
        c.expect(204, "DELETE", f"/v1/sandboxes/{child}")


def t_branch(c, stack):
    """POST /v1/sandboxes/:id/branch: 201 with a SnapshotInfo
    carrying branched_from, pause_ms and status; REST API v1's 404 and 409 rows;
    children of the branch answer."""
    sid = Ctx.sandboxes[0]
    r = c.expect(201, "POST", f"/v1/sandboxes/{sid}/branch", {"tag": "rest-c1", "mode": "full"})
    check(r.json["tag"] == "rest-c1" and r.json["branched_from"] == sid and r.json["status"] == "ready" and
          isinstance(r.json["pause_ms"], int) and r.json["dir"].endswith("/rest-c1"), r)
    r = c.expect(201, "POST", f"/v1/sandboxes/{sid}/branch", None)
    check(r.json["tag"].startswith(f"branch-{sid}-") and r.json["status"] == "ready", r)
    r = c.expect(201, "POST", f"/v1/sandboxes/{sid}/branch", {"tag": "rest-live", "mode": "live", "wait": False})
    check(r.json["status"] in ("writing", "ready") and r.json["branched_from"] == sid, r)
    r = c.expect(201, "POST", f"/v1/sandboxes/{sid}/branch", {"tag": "rest-live2", "mode": "live"})
    check(r.json["status"] == "ready", r)
    for tag, body in (("rest-d1", {"tag": "rest-d1", "mode": "diff"}), ("rest-d2", {"tag": "rest-d2", "diff": True})):
        r = c.expect(201, "POST", f"/v1/sandboxes/{sid}/branch", body)
        check(r.json["tag"] == tag and r.json["parent_tag"] == Ctx.tag and len(r.json["parent_content_hash"]) == 64 and
              r.json["status"] == "ready", r)
    c.expect(409, "POST", f"/v1/sandboxes/{sid}/branch", {"tag": "rest-c1"})
    c.expect(409, "POST", f"/v1/sandboxes/{sid}/branch", {"tag": Ctx.tag, "mode": "live"})
    c.expect(404, "POST", "/v1/sandboxes/sb-nosuch/branch", {"mode": "full"})
    deadline = time.monotonic() + 30
    while True:
        listed = {s["tag"]: s for s in c.expect(200, "GET", "/v1/snapshots").json}
        if listed.get("rest-live", {}).get("status") == "ready":
            break
        check(time.monotonic() < deadline, f"rest-live never became ready: {listed.get('rest-live')}")
        time.sleep(0.05)
    # GET /v1/snapshots: branched_from and pause_ms on every branch, and only there
    check(all(listed[t].get("branched_from") == sid and isinstance(listed[t].get("pause_ms"), int)
              for t in ("rest-c1", "rest-live", "rest-live2", "rest-d1", "rest-d2")) and
          "branched_from" not in listed[Ctx.tag] and "pause_ms" not in listed[Ctx.tag], listed)
    for tag in ("rest-c1", "rest-live", "rest-d1"):
        r = c.expect(201, "POST", "/v1/sandboxes", {"snapshot_tag": tag, "n": 1})
        child = r.json[0]["id"]
        c.expect(200, "POST", f"/v1/sandboxes/{child}/ping")
        c.expect(204, "DELETE", f"/v1/sandboxes/{child}")
    c.expect(200, "POST", f"/v1/sandboxes/{sid}/ping")
    # diff links hold on to their parent (rest-d1 stays for t_chains)
    c.expect(409, "DELETE", f"/v1/snapshots/{Ctx.tag}")
    c.expect(204, "DELETE", "/v1/snapshots/rest-d2")



def t_sandbox_delete(c, stack):
    for sid in Ctx.sandboxes:
        r = c.expect(204, "DELETE", f"/v1/sandboxes/{sid}")
        check(r.data == b"", r)
        c.expect(404, "DELETE", f"/v1/sandboxes/{sid}")
        c.expect(404, "GET", f"/v1/sandboxes/{sid}")
        c.expect(404, "POST", f"/v1/sandboxes/{sid}/ping")


def t_fork_errors(c, stack):
    # a snapshot whose memory image is damaged: the restore fails -> 500
    tag = "rest-broken"
    r = c.expect(201, "POST", "/v1/snapshots", {"tag": tag, "kernel": GUEST, "rootfs": Ctx.rootfs})
    files = os.listdir(r.json["dir"])
    broken = False
    for name in files:
        if name.startswith("mem"):
            with open(os.path.join(r.json["dir"], name), "r+b") as f:
                f.truncate(4096)
            broken = True
    r2 = c.req("POST", "/v1/sandboxes", {"snapshot_tag": tag, "n": 1})
    if r2.status == 201:  # nothing to break, or the daemon checks lazily: do not leak
        for sb in r2.json:
            c.req("DELETE", f"/v1/sandboxes/{sb['id']}")
    c.expect(204, "DELETE", f"/v1/snapshots/{tag}")
    check(broken, f"no memory file in {files}")
    check(r2.status == 500, r2)


def t_calls_cap(c, stack):
    """A hung daemon: calls in flight wait (suspended, the loop keeps serving),
    the one beyond --max-calls is 503 at once, and a client that leaves
    mid-call does no harm."""
    import select
    p, port = stack.start_rest("--max-calls", "2")
    c2 = Client(port)
    os.kill(stack.daemon.pid, signal.SIGSTOP)
    socks = []
    try:
        for path in ("/v1/sandboxes", "/v1/snapshots", "/v1/sandboxes"):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
            socks.append(s)
        # exactly one of the three is beyond the cap of two and answered at once
        ready, _, _ = select.select(socks, [], [], 30)
        check(len(ready) == 1, f"{len(ready)} answered while the daemon is stopped")
        data = ready[0].recv(4096)
        check(data.startswith(b"HTTP/1.1 503 ") and b"too many" in data, data)
        waiting = [s for s in socks if s is not ready[0]]
        m = c2.expect(200, "GET", "/metrics").data.decode()  # over the cap too: no daemon gauges
        check("forkd_rest_dbus_calls_in_flight 2" in m and "forkd_rest_daemon_up 0" in m, m[-900:])
        c2.expect(200, "GET", "/healthz", token=None)
        c2.expect(400, "POST", "/v1/sandboxes", {"snapshot_tag": "x", "n": 0})
        waiting[0].close()  # leaves mid-call
    finally:
        os.kill(stack.daemon.pid, signal.SIGCONT)
    data = waiting[1].recv(4096)
    check(data.startswith(b"HTTP/1.1 200 "), data)
    for s in socks:
        s.close()
    for _ in range(100):
        m = c2.expect(200, "GET", "/metrics").data.decode()
        if "forkd_rest_dbus_calls_in_flight 0" in m:
            break
        time.sleep(0.05)
    check("forkd_rest_dbus_calls_in_flight 0" in m, m[-900:])
    c2.expect(200, "GET", "/v1/snapshots")
    stack.stop(p)
    check(p.returncode == 0, f"forkd-rest exit status {p.returncode}: {stack.log_tail(p)}")


def t_snapshot_delete(c, stack):
    c.expect(400, "DELETE", f"/v1/snapshots/{Ctx.tag}?cascade=true&force=true")
    c.expect(204, "DELETE", f"/v1/snapshots/{Ctx.tag}")
    c.expect(404, "DELETE", f"/v1/snapshots/{Ctx.tag}")
    c.expect(404, "GET", f"/v1/snapshots/{Ctx.tag}/info")
    r = c.expect(200, "GET", "/v1/snapshots")
    check(all(s["tag"] != Ctx.tag for s in r.json), r)


def t_no_leak(c, stack):
    c.expect(200, "GET", "/healthz", token=None)
    r = c.expect(200, "GET", "/v1/sandboxes")
    check(r.json == [], f"leaked sandboxes: {r}")
    check(stack.daemon.poll() is None, "forkd died")


def t_daemon_gone(c, stack):
    stack.stop(stack.daemon)
    r = c.expect(503, "GET", "/v1/sandboxes")
    check("unavailable" in r.json["error"], r)
    c.expect(200, "GET", "/healthz", token=None)


# ---------------------------------------------------------------- main


# FORKD_REST_TESTS=t_a,t_b runs only those test functions (the rest are reported as skipped), e.g.
# the ones that need no daemon where there is no /dev/kvm:
#   FORKD_REST_TESTS=t_processes_validation meson test -C build rest --suite rest
ONLY = [x for x in os.environ.get("FORKD_REST_TESTS", "").split(",") if x]


def main():
    tap = Tap()

    def run(name, fn, *args):
        if ONLY and fn.__name__ not in ONLY and fn.__name__ != "<lambda>":
            tap.skip(name, "not in FORKD_REST_TESTS")
            return
        tap.run(name, fn, *args)
    if not REST or not os.access(REST, os.X_OK):
        print(f"1..0 # SKIP forkd-rest not built ({REST!r})")
        return 0  # meson's TAP protocol: a skip exits 0 (77 is an error)
    if not DBUS_DAEMON:
        print("1..0 # SKIP dbus-daemon not installed")
        return 0

    stack = Stack()

    def on_signal(signum, frame):
        stack.cleanup()
        sys.exit(1)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        stack.start_bus()
        rest, port = stack.start_rest()
        c = Client(port)

        run("GET /healthz without a token", t_healthz, c)
        run("bearer token on every route but /healthz", t_auth, c)
        run("unknown route 404, wrong method 405 with Allow", t_unknown_route_and_method, c)
        run("malformed JSON bodies are 400", t_malformed_json, c)
        run("wrong JSON types of known fields are 400; hugepages: true is refused", t_wrong_types, c)
        run("unknown fields are ignored, on every route with a body", t_unknown_fields, c)
        run("tags, ids and n validated before any D-Bus call", t_validation, c)
        run("compact, branch, fork of a running sandbox: REST API v1's 400 rows", t_not_implemented_validation, c)
        run("daemon absent: 503, /metrics still answers", t_daemon_absent, c)
        run("cpu_limit, disk_rate, net_rate: 400 naming the field on POST and PATCH", t_limits_validation, c)
        run("processes: pid, offset, follow, args/cmd, env, pty, signal, stdin, resize, tty handshake: 400 "
            "before any D-Bus call", t_processes_validation, c)
        run("body cap: 413 from Content-Length and while streaming", t_body_cap, c)
        run("header cap", t_header_cap, c)
        run("slow clients are cut off while another is served", t_slow_client, c)
        run("a bundle upload outlasts --timeout at 1 MiB/s or more, and is cut below", t_bundle_upload_rate, c)
        run("connection flood", t_connection_flood, c)
        run("token file: empty, world-readable, bad characters refused", t_token_file_checks, stack)
        run("HTTPS with a generated certificate", t_https, stack)
        run("socket activation via systemd-socket-activate", t_socket_activation, stack)

        daemon_tests = [
            ("POST /v1/snapshots from the test guest, REST API v1's example request as it stands: the default memory",
             t_snapshot_create),
            ("POST /v1/snapshots error rows; a guest that triple-faults at boot", t_snapshot_errors),
            ("GET /v1/snapshots and /v1/snapshots/:tag/info", t_snapshot_list_info),
            ("POST /v1/sandboxes n=2", t_fork),
            ("POST /v1/sandboxes with memory_limit_mib; per_child_netns without the namespaces is 400",
             t_fork_memory_limit),
            ("POST /v1/sandboxes with cpu_limit and disk_rate; PATCH /v1/sandboxes/:id changes them live",
             t_fork_limits),
            ("GET /v1/sandboxes, /v1/sandboxes/:id, /metrics gauges", t_sandbox_list_get),
            ("POST /v1/sandboxes/:id/ping", t_ping),
            ("exec and eval: the test guest's error, passed on", t_exec_eval),
            ("POST /v1/sandboxes/:id/branch (full, diff, legacy diff, live): 201 SnapshotInfo, 404, 409; "
             "children of a branch answer", t_branch),
            ("POST /v1/sandboxes/:id/fork: 200 children that answer; REST API v1's 400, 401, 404 bodies",
             t_sandbox_fork),
            ("chains: DELETE with dependents 409, ?cascade, ?force; compact 201, 409, 400, 404; an orphan and a "
             "re-snapshotted parent 409", t_chains),
            ("pack and unpack (our extension): a snapshot and a chain of two round-trip, 404, 409, "
             "400 for a changed byte and for --tag on a chain, nothing left behind", t_pack_unpack),
            ("DELETE /v1/sandboxes/:id", t_sandbox_delete),
            ("POST /v1/sandboxes on a damaged snapshot is 500", t_fork_errors),
            ("a hung daemon: call cap 503, loop keeps serving", t_calls_cap),
            ("DELETE /v1/snapshots/:tag", t_snapshot_delete),
            ("afterwards: /healthz answers, no sandbox leaked", t_no_leak),
            ("daemon stopped: 503", t_daemon_gone),
        ]
        missing = [what for what, path in (("forkd", DAEMON), ("forkd-vmm", VMM), ("test guest", GUEST))
                   if not path or not os.path.exists(path)]
        if ONLY and not any(fn.__name__ in ONLY for _, fn in daemon_tests):
            for name, _ in daemon_tests:
                tap.skip(name, "not in FORKD_REST_TESTS")
        elif missing or not os.path.exists("/dev/kvm"):
            reason = ("not built: " + ", ".join(missing)) if missing else "no /dev/kvm"
            for name, _ in daemon_tests:
                run(name, lambda: (_ for _ in ()).throw(Skip(reason)))
        else:
            stack.start_daemon()
            try:
                wait_daemon(c, stack)
                ok = True
            except AssertionError as e:
                ok = False
                run("forkd comes up", lambda: (_ for _ in ()).throw(e))
            if ok:
                for name, fn in daemon_tests:
                    run(name, fn, c, stack)
                    if name.startswith("POST /v1/snapshots from") and tap.failed:
                        break
                # whatever happened, do not leave sandboxes behind
                try:
                    r = c.req("GET", "/v1/sandboxes")
                    for sb in (r.json or []) if r.status == 200 else []:
                        c.req("DELETE", f"/v1/sandboxes/{sb['id']}")
                except Exception:  # noqa: BLE001
                    pass
            if tap.failed and stack.daemon:
                for line in stack.log_tail(stack.daemon, 40).splitlines():
                    print(f"# forkd: {line}")

        stack.stop(rest)
        if rest.returncode != 0:
            tap.failed += 1
            print(f"# forkd-rest exited with {rest.returncode}: {stack.log_tail(rest)}")
    finally:
        stack.cleanup()
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
