#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
forkd's own Python SDK against forkd-rest: Controller.branch_sandbox and the
calls around it (spawn_sandboxes, list_snapshots, ping_sandbox, kill_sandbox,
delete_snapshot), on the real stack (test-rest.py's Stack, Tap and Client), TAP
output.

The client is forkd's sdk/python/forkd/controller.py, read at
https://github.com/q-qp-p/forkd (commit c667ebcf88083679510e96c72051707219f34387;
the same file in deeplethe/forkd at e54f141264f8fe0ac1ff1c8f439edf5b1631b7b1 is
the older one, without mode and wait). Its code is not here. SdkWire below is our
own client that puts the same bytes on the wire and reads the answer the same
way; what it copies is behaviour, taken from that file:

  - every call is urllib.request.urlopen(Request(base_url + path, data, method,
    headers), timeout) -- so urllib's own headers too (Host, User-Agent
    Python-urllib, Accept-Encoding identity, Connection close, Content-Length);
  - a call with a body sends json.dumps(body) (", " and ": " separators) with
    Content-Type: application/json; a call without one sends no body and no
    Content-Type (ping_sandbox, the GETs, the DELETEs);
  - Authorization: Bearer <token> when a token is set ($FORKD_TOKEN);
  - any 2xx is success: an empty body is None, anything else json.loads();
  - urllib's HTTPError (>= 400) becomes ControllerError(status, json.loads(body)
    or {} when empty, or the text when it is not JSON);
  - branch_sandbox(sandbox_id, tag=None, diff=False, measure_diff=False,
    mode=None, wait=True) POSTs /v1/sandboxes/<id>/branch with a body that is
    always an object, possibly {}: "tag" when given, "mode" when given else
    "diff": true when diff, "measure_diff": true when asked, "wait": false only
    when wait is False;
  - spawn_sandboxes(tag, n=1, per_child_netns=False, memory_limit_mib=None,
    prewarm=False, live_fork=False, hugepages=False) POSTs /v1/sandboxes with
    snapshot_tag, n and per_child_netns always, the others only when set;
  - get_sandbox GETs /v1/sandboxes/<id>; exec_command(id, args,
    timeout_secs=30) POSTs {"args", "timeout_secs"} to .../exec; eval_code(id,
    code) POSTs {"code"} to .../eval.

Every method of the Controller is called here (t_calls for those around
branch_sandbox).

With FORKD_PY_SDK naming a directory that holds forkd's SDK (the forkd package
of sdk/python), the same checks run through its Controller unmodified instead.

Environment: as test-rest.py (tests/rest/meson.build), and FORKD_PY_SDK.
"""

import importlib.util
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

_spec = importlib.util.spec_from_file_location("test_rest", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                         "test-rest.py"))
tr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tr)
check, Skip = tr.check, tr.Skip

TAG = "sdk"


class SdkError(Exception):
    def __init__(self, status, body, url):
        super().__init__(f"{url}: HTTP {status}: {body!r}")
        self.status, self.body, self.url = status, body, url


class SdkWire:
    """The wire behaviour of forkd's Controller (see the docstring at the top)."""

    Error = SdkError

    def __init__(self, base_url, token, timeout=60.0):
        self.base_url, self.token, self.timeout = base_url.rstrip("/"), token, timeout

    def call(self, method, path, body=None):
        hdrs = {}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        if self.token:
            hdrs["Authorization"] = "Bearer " + self.token
        url = self.base_url + path
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=payload, method=method, headers=hdrs),
                                        timeout=self.timeout) as resp:
                data = resp.read()
                return json.loads(data) if data else None
        except urllib.error.HTTPError as e:
            data = e.read()
            try:
                err = json.loads(data) if data else {}
            except json.JSONDecodeError:
                err = data.decode(errors="replace")
            raise SdkError(e.code, err, url) from e

    def list_snapshots(self):
        return self.call("GET", "/v1/snapshots")

    def delete_snapshot(self, tag):
        self.call("DELETE", f"/v1/snapshots/{tag}")

    def spawn_sandboxes(self, snapshot_tag, n=1, per_child_netns=False, memory_limit_mib=None, prewarm=False,
                        live_fork=False, hugepages=False):
        body = {"snapshot_tag": snapshot_tag, "n": n, "per_child_netns": per_child_netns}
        for key, value, on in (("memory_limit_mib", memory_limit_mib, memory_limit_mib is not None),
                               ("prewarm", True, prewarm), ("live_fork", True, live_fork),
                               ("hugepages", True, hugepages)):
            if on:
                body[key] = value
        return self.call("POST", "/v1/sandboxes", body)

    def kill_sandbox(self, sandbox_id):
        self.call("DELETE", f"/v1/sandboxes/{sandbox_id}")

    def list_sandboxes(self):
        return self.call("GET", "/v1/sandboxes")

    def get_sandbox(self, sandbox_id):
        return self.call("GET", f"/v1/sandboxes/{sandbox_id}")

    def exec_command(self, sandbox_id, args, timeout_secs=30):
        return self.call("POST", f"/v1/sandboxes/{sandbox_id}/exec", {"args": args, "timeout_secs": timeout_secs})

    def eval_code(self, sandbox_id, code):
        return self.call("POST", f"/v1/sandboxes/{sandbox_id}/eval", {"code": code})

    def ping_sandbox(self, sandbox_id):
        return self.call("POST", f"/v1/sandboxes/{sandbox_id}/ping")

    def branch_sandbox(self, sandbox_id, tag=None, diff=False, measure_diff=False, mode=None, wait=True):
        body = {}
        if tag is not None:
            body["tag"] = tag
        if mode is not None:
            body["mode"] = mode
        elif diff:
            body["diff"] = True
        if measure_diff:
            body["measure_diff"] = True
        if not wait:
            body["wait"] = False
        return self.call("POST", f"/v1/sandboxes/{sandbox_id}/branch", body)


def make_client(base_url, token):
    """forkd's Controller when FORKD_PY_SDK has it, else SdkWire."""
    sdk = os.environ.get("FORKD_PY_SDK")
    if sdk:
        # the package forkd in the directory FORKD_PY_SDK, whatever else is installed
        pkg = os.path.join(sdk, "forkd")
        spec = importlib.util.spec_from_file_location("forkd", os.path.join(pkg, "__init__.py"),
                                                      submodule_search_locations=[pkg])
        sys.modules["forkd"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["forkd"])
        from forkd.controller import Controller, ControllerError  # (theirs, not ours)
        c = Controller(base_url=base_url, token=token)
        c.Error = ControllerError
        return c, "forkd's Controller from " + sdk
    return SdkWire(base_url, token), "SdkWire (forkd's Controller's requests)"


class Ctx:
    pass


def fails(sdk, status, fn, *args, **kw):
    try:
        got = fn(*args, **kw)
    except sdk.Error as e:
        check(e.status == status, f"{fn.__name__}{args}{kw}: expected HTTP {status}, got {e.status} {e.body!r}")
        check(isinstance(e.body, dict) and isinstance(e.body.get("error"), str) and e.body["error"],
              f"{fn.__name__}{args}{kw}: the error body is not {{\"error\": message}}: {e.body!r}")
        return e.body
    raise AssertionError(f"{fn.__name__}{args}{kw}: expected HTTP {status}, got {got!r}")


def is_branch(snap, tag, sid, status="ready"):
    """What the SDK's docstring promises: a SnapshotInfo whose tag spawn_sandboxes
    takes, with branched_from; and REST API v1's pause_ms and status."""
    check(isinstance(snap, dict) and snap.get("tag") == tag and snap.get("branched_from") == sid and
          isinstance(snap.get("pause_ms"), int) and snap.get("status") == status and
          isinstance(snap.get("created_at_unix"), int) and snap.get("dir", "").endswith("/" + tag), snap)


def t_setup(c, sdk, stack):
    rootfs = os.path.join(stack.tmp, "rootfs.img")
    with open(rootfs, "wb") as f:
        f.truncate(8 << 20)
    c.expect(201, "POST", "/v1/snapshots", {"tag": TAG, "kernel": tr.GUEST, "rootfs": rootfs, "boot_wait_secs": 10})
    check([s["tag"] for s in sdk.list_snapshots()] == [TAG], "list_snapshots")


def t_spawn(c, sdk, stack):
    """spawn_sandboxes as the SDK sends it: per_child_netns false always, live_fork
    true for the source of live branches."""
    kids = sdk.spawn_sandboxes(TAG, n=1)
    check(isinstance(kids, list) and len(kids) == 1 and kids[0]["snapshot_tag"] == TAG, kids)
    live = sdk.spawn_sandboxes(TAG, n=1, live_fork=True)
    check(isinstance(live, list) and len(live) == 1, live)
    Ctx.sid, Ctx.live = kids[0]["id"], live[0]["id"]
    check(sdk.ping_sandbox(Ctx.sid)["pong"] is True, "ping_sandbox")


def t_calls(c, sdk, stack):
    """The Controller's other methods, with every argument it has."""
    sid = Ctx.sid
    sb = sdk.get_sandbox(sid)
    check(sb["id"] == sid and sb["snapshot_tag"] == TAG, sb)
    check(sid in [x["id"] for x in sdk.list_sandboxes()], "list_sandboxes")
    # the test guest runs ["sh", "-c", CODE] as run_code (tests/guest/README.md)
    r = sdk.exec_command(sid, ["sh", "-c", "x = sdk; print x"])
    check(r["stdout"] == "sdk\n" and r["exit_code"] == 0 and r["stderr"] == "", r)
    r = sdk.exec_command(sid, ["sh", "-c", "print x"], timeout_secs=5)
    check(r["stdout"] == "sdk\n", r)
    # eval: the test guest has no Python; its error comes back as ControllerError 500 {"error": ...}
    e = fails(sdk, 500, sdk.eval_code, sid, "1+1")
    check(e == {"error": "not supported by the test guest"}, e)
    fails(sdk, 404, sdk.get_sandbox, "sb-nosuch")
    # spawn_sandboxes with every argument: prewarm is accepted (no effect here: docs/rest-api.md),
    # memory_limit_mib where forkd has a memory cgroup, hugepages refused with why
    kw = {"memory_limit_mib": 64} if stack.cgroot else {}
    kids = sdk.spawn_sandboxes(TAG, n=2, per_child_netns=False, prewarm=True, live_fork=True, **kw)
    check(len(kids) == 2 and all(k["snapshot_tag"] == TAG for k in kids), kids)
    if kw:
        check(all(k["memory_limit_mib"] == 64 for k in kids), kids)
    for k in kids:
        check(sdk.ping_sandbox(k["id"])["pong"] is True, k)
        check(sdk.kill_sandbox(k["id"]) is None, k)
    e = fails(sdk, 400, sdk.spawn_sandboxes, TAG, hugepages=True)
    check(e["error"].startswith("hugepages is not supported"), e)
    e = fails(sdk, 400, sdk.spawn_sandboxes, TAG, n=0)
    check("1000" in e["error"], e)
    fails(sdk, 404, sdk.spawn_sandboxes, "nosuch")


def t_branch_full(c, sdk, stack):
    sid = Ctx.sid
    # the SDK's own example: branch_sandbox(sb_id, tag="checkpoint-1") -- body {"tag": ...}
    is_branch(sdk.branch_sandbox(sid, tag="checkpoint-1"), "checkpoint-1", sid)
    # no argument at all: body {}; the tag is REST API v1's branch-<source-id>-<unix-ts>
    b = sdk.branch_sandbox(sid)
    check(b["tag"].startswith(f"branch-{sid}-") and b["tag"][len(f"branch-{sid}-"):].isdigit(), b)
    is_branch(b, b["tag"], sid)
    Ctx.auto = b["tag"]
    is_branch(sdk.branch_sandbox(sid, tag="sdk-full", mode="full"), "sdk-full", sid)
    # measure_diff: forkd's measurement hook, a full branch here
    is_branch(sdk.branch_sandbox(sid, tag="sdk-md", measure_diff=True), "sdk-md", sid)
    is_branch(sdk.branch_sandbox(sid, tag="sdk-md-full", mode="full", measure_diff=True), "sdk-md-full", sid)
    # the branches are snapshots: spawn_sandboxes takes their tag
    grand = sdk.spawn_sandboxes("checkpoint-1", n=2)
    check(len(grand) == 2 and all(g["snapshot_tag"] == "checkpoint-1" for g in grand), grand)
    for g in grand:
        check(sdk.ping_sandbox(g["id"])["pong"] is True, g)
        check(sdk.kill_sandbox(g["id"]) is None, "kill_sandbox returns None (204, no body)")
    check(sdk.ping_sandbox(sid)["pong"] is True, "the source runs on")


def t_branch_diff(c, sdk, stack):
    sid = Ctx.sid
    for tag, kw, is_diff in (("sdk-diff", {"mode": "diff"}, True), ("sdk-ldiff", {"diff": True}, True),
                             # mode wins over the legacy boolean: the SDK sends only "mode"
                             ("sdk-mode-wins", {"mode": "full", "diff": True}, False)):
        b = sdk.branch_sandbox(sid, tag=tag, **kw)
        is_branch(b, tag, sid)
        # a diff branch is a link of the chain of the source's snapshot
        check(b.get("parent_tag") == (TAG if is_diff else None), b)
    grand = sdk.spawn_sandboxes("sdk-diff", n=1)
    check(sdk.ping_sandbox(grand[0]["id"])["pong"] is True, grand)
    sdk.kill_sandbox(grand[0]["id"])


def t_branch_live(c, sdk, stack):
    lid = Ctx.live
    is_branch(sdk.branch_sandbox(lid, tag="sdk-live", mode="live"), "sdk-live", lid)
    b = sdk.branch_sandbox(lid, tag="sdk-live-nw", mode="live", wait=False)
    check(b.get("status") in ("writing", "ready"), b)
    is_branch(b, "sdk-live-nw", lid, b.get("status"))
    # the SDK's advice for wait=False: poll list_snapshots until status is "ready"
    deadline = time.monotonic() + 30
    while True:
        st = [s.get("status") for s in sdk.list_snapshots() if s["tag"] == "sdk-live-nw"]
        check(len(st) == 1 and st[0] in ("writing", "ready"), st)
        if st == ["ready"]:
            break
        check(time.monotonic() < deadline, "sdk-live-nw never became ready")
        time.sleep(0.05)
    grand = sdk.spawn_sandboxes("sdk-live-nw", n=1)
    check(sdk.ping_sandbox(grand[0]["id"])["pong"] is True, grand)
    sdk.kill_sandbox(grand[0]["id"])
    # every sandbox here can take a live branch, live_fork or not (org.forkd.Manager(5))
    is_branch(sdk.branch_sandbox(Ctx.sid, tag="sdk-live-any", mode="live"), "sdk-live-any", Ctx.sid)


def t_branch_errors(c, sdk, stack):
    sid = Ctx.sid
    # REST API v1's rows, as the SDK sees them: ControllerError with status and the parsed {"error": ...}
    fails(sdk, 400, sdk.branch_sandbox, sid, tag="sdk-x", wait=False)
    fails(sdk, 400, sdk.branch_sandbox, sid, tag="sdk-x", mode="diff", wait=False)
    fails(sdk, 400, sdk.branch_sandbox, sid, tag="sdk-x", diff=True, wait=False)
    fails(sdk, 400, sdk.branch_sandbox, sid, tag="sdk-x", mode="fast")
    fails(sdk, 400, sdk.branch_sandbox, sid, tag="bad tag")
    fails(sdk, 400, sdk.branch_sandbox, sid, tag="x" * 65)
    # measure_diff with a diff or live branch: forkd's own 400
    fails(sdk, 400, sdk.branch_sandbox, sid, tag="sdk-x", diff=True, measure_diff=True)
    fails(sdk, 400, sdk.branch_sandbox, sid, tag="sdk-x", mode="diff", measure_diff=True)
    fails(sdk, 400, sdk.branch_sandbox, sid, tag="sdk-x", mode="live", measure_diff=True)
    e = fails(sdk, 404, sdk.branch_sandbox, "sb-nosuch", tag="sdk-x")
    check("sb-nosuch" in e["error"], e)
    fails(sdk, 409, sdk.branch_sandbox, sid, tag="checkpoint-1")
    fails(sdk, 409, sdk.branch_sandbox, sid, tag=TAG, mode="live")
    check("sdk-x" not in [s["tag"] for s in sdk.list_snapshots()], "a refused branch left a snapshot")
    # a wrong token: 401 with an error body
    other = make_client(sdk.base_url, "wrong-" + tr.TOKEN)[0]
    fails(other, 401, other.branch_sandbox, sid, tag="sdk-x")
    check(sdk.ping_sandbox(sid)["pong"] is True, "the source survived")


def t_https(c, sdk, stack):
    """HTTPS, as a user points the SDK at forkd-rest --tls-cert: base_url https://...,
    urllib's default context, the certificate trusted through SSL_CERT_FILE."""
    openssl = shutil.which("openssl")
    if not openssl:
        raise Skip("openssl not installed")
    cert, key = os.path.join(stack.tmp, "cert.pem"), os.path.join(stack.tmp, "key.pem")
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    os.chmod(key, 0o600)
    _, port = stack.start_rest("--timeout", "60", "--tls-cert", cert, "--tls-key", key)
    tls = make_client(f"https://127.0.0.1:{port}", tr.TOKEN)[0]
    old = os.environ.get("SSL_CERT_FILE")
    try:
        # untrusted: the SDK's call fails in the handshake, nothing is branched
        os.environ["SSL_CERT_FILE"] = os.devnull
        try:
            tls.branch_sandbox(Ctx.sid, tag="sdk-tls")
            raise AssertionError("a branch over TLS with an untrusted certificate")
        except urllib.error.URLError as e:
            check(isinstance(e.reason, ssl.SSLError), e)
        os.environ["SSL_CERT_FILE"] = cert
        b = tls.branch_sandbox(Ctx.sid, tag="sdk-tls", mode="live", wait=False)
        check(b.get("status") in ("writing", "ready"), b)
        is_branch(b, "sdk-tls", Ctx.sid, b["status"])
        fails(tls, 409, tls.branch_sandbox, Ctx.sid, tag="sdk-tls")
    finally:
        if old is None:
            os.environ.pop("SSL_CERT_FILE", None)
        else:
            os.environ["SSL_CERT_FILE"] = old
    deadline = time.monotonic() + 30
    while [s.get("status") for s in sdk.list_snapshots() if s["tag"] == "sdk-tls"] != ["ready"]:
        check(time.monotonic() < deadline, "sdk-tls never became ready")
        time.sleep(0.05)


def t_cleanup(c, sdk, stack):
    for sid in (Ctx.sid, Ctx.live):
        sdk.kill_sandbox(sid)
    fails(sdk, 404, sdk.branch_sandbox, Ctx.sid, tag="sdk-after")
    # the branches outlive their sources; delete_snapshot returns None
    for tag in ("checkpoint-1", Ctx.auto, "sdk-full", "sdk-md", "sdk-md-full", "sdk-diff", "sdk-ldiff",
                "sdk-mode-wins", "sdk-live", "sdk-live-nw", "sdk-live-any", "sdk-tls"):
        check(sdk.delete_snapshot(tag) is None, tag)
    check([s["tag"] for s in sdk.list_snapshots()] == [TAG], sdk.list_snapshots())
    check(sdk.list_sandboxes() == [], "sandboxes left")


def main():
    tap = tr.Tap()
    missing = [what for what, path in (("forkd-rest", tr.REST), ("forkd", tr.DAEMON), ("forkd-vmm", tr.VMM),
                                       ("test guest", tr.GUEST), ("dbus-daemon", tr.DBUS_DAEMON))
               if not path or not os.path.exists(path)]
    if missing:
        print(f"1..0 # SKIP not built or not installed: {', '.join(missing)}")
        return 0
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        print("1..0 # SKIP /dev/kvm is not usable")
        return 0
    stack = tr.Stack()
    signal.signal(signal.SIGTERM, lambda *a: (stack.cleanup(), sys.exit(1)))
    try:
        stack.start_bus()
        rest, port = stack.start_rest("--timeout", "60")
        c = tr.Client(port)
        stack.start_daemon()
        tr.wait_daemon(c, stack)
        sdk, what = make_client(f"http://127.0.0.1:{port}/", tr.TOKEN)
        print(f"# client: {what}")
        tests = [
            ("a snapshot of the test guest; list_snapshots", t_setup),
            ("spawn_sandboxes (per_child_netns false, live_fork true), ping_sandbox", t_spawn),
            ("get_sandbox, list_sandboxes, exec_command, eval_code; spawn_sandboxes with memory_limit_mib, "
             "prewarm, live_fork; hugepages refused", t_calls),
            ("branch_sandbox: tag, no tag, mode full, measure_diff; grandchildren of the branch", t_branch_full),
            ("branch_sandbox: mode diff, legacy diff=True, mode over diff", t_branch_diff),
            ("branch_sandbox: mode live, wait True and False (list_snapshots until ready)", t_branch_live),
            ("branch_sandbox: ControllerError 400, 404, 409, 401 with {\"error\": ...}", t_branch_errors),
            ("branch_sandbox over HTTPS: base_url https://, the certificate in SSL_CERT_FILE", t_https),
            ("kill_sandbox, delete_snapshot of every branch", t_cleanup),
        ]
        for name, fn in tests:
            tap.run(name, fn, c, sdk, stack)
            if fn in (t_setup, t_spawn) and tap.failed:
                break
        stack.finish(tap, c, rest)
    finally:
        stack.cleanup()
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
