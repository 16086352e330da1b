#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
Wire compatibility with forkd's own clients, on the real stack (test-rest.py's
Stack: a private bus, forkd, forkd-rest, the test guest on /dev/kvm), TAP output.

Every HTTP request that forkd's clients send to the routes forkd-rest serves is
replayed here as those clients put it on the wire: method, path, headers and
the exact bytes of the JSON body. What is replayed was read in forkd's sources
(https://github.com/deeplethe/forkd and https://github.com/q-qp-p/forkd); none
of their code is here, the replay is ours:

  - TypeScript SDK (sdk/typescript/src/controller.ts, sandbox.ts; both versions:
    the one whose branchSandbox sends tag/diff/measure_diff and the one that adds
    mode/wait and spawnSandboxes' liveFork): fetch() of undici, so lower-case
    header names, "content-type: application/json" only with a body,
    JSON.stringify() bodies (no spaces), a POST without a body as
    "content-length: 0", keep-alive connections, undici's default headers
    (accept, accept-language, sec-fetch-mode, user-agent node,
    accept-encoding). Undefined options are left out of the body, except
    n (default 1) and per_child_netns (default false), always sent.
  - MCP server (sdk/mcp/forkd_mcp/server.py): httpx.Client with
    "Content-Type: application/json" on EVERY request, GET and DELETE and the
    bodiless ping included; json= bodies as httpx encodes them (compact
    separators, ensure_ascii off); one new connection per tool call. Its
    spawn_sandboxes always sends memory_limit_mib (default 256) and prewarm
    (default false); create_snapshot always sends rw and boot_wait_secs;
    wait_for_text is an exec of ["sh", "-c", "tail -c 4096 PATH ..."].
  - CLI (crates/forkd-cli/src/main.rs, ureq): snapshot-diff = spawn
    {n, per_child_netns, snapshot_tag} (serde_json::json!, so keys sorted),
    ping polled as a POST with an empty body AND Content-Type: application/json,
    exec {args, timeout_secs}, branch {mode: "diff", parent_tag, tag}, DELETE
    of the sandbox; snapshot --from-sandbox = branch {tag, diff: true} or
    {mode: "live"[, wait: false]}; rmi = DELETE /v1/snapshots/:tag (409 with
    REST API v1's words when it has dependents; ?cascade=true, ?force=true);
    snapshot-info = GET .../info; snapshot-compact = POST .../compact {to}.

forkd's Python SDK (Controller) is test-rest-sdk.py's. Routes forkd has and
forkd-rest does not serve (/v1/workspaces...) are checked to be a clean 404.

Environment: as test-rest.py (tests/rest/meson.build).
"""

import http.client
import importlib.util
import json
import os
import signal
import sys
import time

_spec = importlib.util.spec_from_file_location("test_rest", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                         "test-rest.py"))
tr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tr)
check, Skip = tr.check, tr.Skip

TAG = "compat"


class Wire:
    """One client's way of putting requests on the wire. Each request returns
    (status, headers, raw body bytes, parsed JSON or None)."""

    def __init__(self, port, name, base_headers, header_case, content_type_always, dumps, keep_alive):
        self.port, self.name = port, name
        self.base_headers = base_headers          # list of (name, value), in order
        self.header_case = header_case            # str.lower, or identity
        self.content_type_always = content_type_always
        self.dumps = dumps
        self.keep_alive = keep_alive
        self.conn = None
        self.sent = []                            # (method, path, body bytes) of every request

    def _conn(self):
        if self.conn is None or not self.keep_alive:
            if self.conn:
                self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        return self.conn

    def close(self):
        if self.conn:
            self.conn.close()
            self.conn = None

    def request(self, method, path, body=None, raw=None, token=tr.TOKEN):
        data = raw if raw is not None else (self.dumps(body).encode() if body is not None else None)
        hdrs = []
        for k, v in self.base_headers:
            hdrs.append((k, v))
        if data is not None or self.content_type_always:
            hdrs.append(("Content-Type", "application/json"))
        if token:
            hdrs.append(("Authorization", "Bearer " + token))
        c = self._conn()
        c.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        c.putheader(self.header_case("Host"), f"127.0.0.1:{self.port}")
        for k, v in hdrs:
            c.putheader(self.header_case(k), v)
        if data is not None:
            c.putheader(self.header_case("Content-Length"), str(len(data)))
        elif method in ("POST", "PUT", "PATCH"):
            c.putheader(self.header_case("Content-Length"), "0")
        c.endheaders(data)
        r = c.getresponse()
        out = r.read()
        if not self.keep_alive or r.getheader("Connection", "").lower() == "close":
            self.close()
        self.sent.append((method, path, data))
        parsed = json.loads(out) if out else None
        if r.status >= 400:
            check(isinstance(parsed, dict) and list(parsed) == ["error"] and isinstance(parsed["error"], str) and
                  parsed["error"], f"{self.name} {method} {path}: error body is not {{\"error\": message}}: {out!r}")
        return r.status, r.headers, out, parsed

    def ok(self, status, method, path, body=None, **kw):
        st, h, out, parsed = self.request(method, path, body, **kw)
        check(st == status, f"{self.name} {method} {path} {body!r}: expected {status}, got {st} {out[:400]!r}")
        return parsed


def fetch(port):
    """undici's fetch() in Node 18+, as the TypeScript SDK calls it."""
    return Wire(port, "TypeScript SDK",
                [("accept", "*/*"), ("accept-language", "*"), ("sec-fetch-mode", "cors"), ("user-agent", "node"),
                 ("accept-encoding", "gzip, deflate")],
                str.lower, False, lambda b: json.dumps(b, separators=(",", ":"), ensure_ascii=False), True)


def httpx_client(port):
    """httpx.Client(base_url, headers={"Content-Type": ..., "Authorization": ...}) of the MCP server:
    one per tool call, closed after it."""
    return Wire(port, "MCP server",
                [("Accept", "*/*"), ("Accept-Encoding", "gzip, deflate"), ("Connection", "keep-alive"),
                 ("User-Agent", "python-httpx/0.28.1")],
                lambda k: k, True, lambda b: json.dumps(b, separators=(",", ":"), ensure_ascii=False), False)


def ureq_agent(port):
    """ureq 2 of the forkd CLI: serde_json::to_string() of json!{} (keys sorted, compact)."""
    return Wire(port, "forkd CLI", [("User-Agent", "ureq/2.9.7"), ("Accept", "*/*"), ("accept-encoding", "gzip")],
                lambda k: k, False, lambda b: json.dumps(b, separators=(",", ":"), sort_keys=True), True)


class Ctx:
    pass


def is_sandbox(sb, tag=TAG):
    check(isinstance(sb, dict) and isinstance(sb.get("id"), str) and sb.get("snapshot_tag") == tag and
          isinstance(sb.get("created_at_unix"), int), sb)


def is_snapshot(s, tag, branched_from=None):
    check(isinstance(s, dict) and s.get("tag") == tag and s.get("dir", "").endswith("/" + tag) and
          isinstance(s.get("created_at_unix"), int), s)
    if branched_from:
        check(s.get("branched_from") == branched_from and isinstance(s.get("pause_ms"), int), s)


def guest_refuses(st, parsed):
    """The test guest has no Python: eval is its error, passed on (test-rest.py t_exec_eval)."""
    check(st == 500 and parsed == {"error": "not supported by the test guest"}, (st, parsed))


# ---------------------------------------------------------------- MCP server


def t_mcp(c, stack):
    port = c.port
    rootfs = os.path.join(stack.tmp, "rootfs.img")
    with open(rootfs, "wb") as f:
        f.truncate(8 << 20)
    Ctx.rootfs = rootfs

    def tool():
        return httpx_client(port)

    # create_snapshot(tag, kernel, rootfs): rw and boot_wait_secs always, tap when given
    s = tool().ok(201, "POST", "/v1/snapshots", {"tag": TAG, "kernel": tr.GUEST, "rootfs": rootfs, "rw": False,
                                                 "boot_wait_secs": 10})
    is_snapshot(s, TAG)
    s = tool().ok(201, "POST", "/v1/snapshots", {"tag": "compat-tap", "kernel": tr.GUEST, "rootfs": rootfs,
                                                 "rw": True, "boot_wait_secs": 2, "tap": "forkd-tap0"})
    is_snapshot(s, "compat-tap")
    # list_snapshots: GET with Content-Type and no body
    check(sorted(x["tag"] for x in tool().ok(200, "GET", "/v1/snapshots")) == [TAG, "compat-tap"], "list_snapshots")
    # spawn_sandboxes(tag): memory_limit_mib 256 and prewarm false always
    body = {"snapshot_tag": TAG, "n": 2, "per_child_netns": False, "memory_limit_mib": 256, "prewarm": False}
    if stack.cgroot:
        kids = tool().ok(201, "POST", "/v1/sandboxes", body)
        check(len(kids) == 2 and all(k.get("memory_limit_mib") == 256 for k in kids), kids)
    else:
        # no memory controller for forkd here: the limit cannot be applied, and is not faked
        st, _, out, parsed = tool().request("POST", "/v1/sandboxes", body)
        check(st >= 400 and "memory limits are not available" in parsed["error"].lower(), (st, out))
        print("# MCP spawn_sandboxes with its default memory_limit_mib 256 needs forkd's memory cgroup; "
              "replayed without it")
        kids = tool().ok(201, "POST", "/v1/sandboxes", {k: v for k, v in body.items() if k != "memory_limit_mib"})
    for k in kids:
        is_sandbox(k)
    if not stack.cgroot:
        del body["memory_limit_mib"]
    live = tool().ok(201, "POST", "/v1/sandboxes", dict(body, n=1, prewarm=True, live_fork=True))
    Ctx.mcp = [k["id"] for k in kids] + [live[0]["id"]]
    sid = Ctx.mcp[0]
    # ping_sandbox: POST, no body, Content-Length: 0, Content-Type: application/json
    check(tool().ok(200, "POST", f"/v1/sandboxes/{sid}/ping").get("pong") is True, "ping_sandbox")
    # get_sandbox, list_sandboxes
    is_sandbox(tool().ok(200, "GET", f"/v1/sandboxes/{sid}"))
    check(set(Ctx.mcp) <= {x["id"] for x in tool().ok(200, "GET", "/v1/sandboxes")}, "list_sandboxes")
    # exec_command(args, timeout_secs=30): the test guest runs ["sh", "-c", CODE] as run_code
    r = tool().ok(200, "POST", f"/v1/sandboxes/{sid}/exec", {"args": ["sh", "-c", "x = mcp; print x"],
                                                             "timeout_secs": 30})
    check(r.get("stdout") == "mcp\n" and r.get("exit_code") == 0 and "stderr" in r, r)
    # wait_for_text: an exec of tail, answered (200) by the guest whatever it makes of it
    st, _, out, r = tool().request("POST", f"/v1/sandboxes/{sid}/exec",
                                   {"args": ["sh", "-c", "tail -c 4096 /tmp/agent.log 2>/dev/null || true"],
                                    "timeout_secs": 5})
    check(st == 200 and isinstance(r.get("stdout"), str) and isinstance(r.get("exit_code"), int), (st, out))
    # eval_code
    guest_refuses(*tool().request("POST", f"/v1/sandboxes/{sid}/eval", {"code": "1+1"})[::3])
    # branch_sandbox(sandbox_id, tag, diff, measure_diff, mode, wait): as the Python SDK's
    for tag, b in (("mcp-b", {"tag": "mcp-b"}), ("mcp-diff", {"tag": "mcp-diff", "mode": "diff"}),
                   ("mcp-ldiff", {"tag": "mcp-ldiff", "diff": True}),
                   ("mcp-md", {"tag": "mcp-md", "measure_diff": True})):
        is_snapshot(tool().ok(201, "POST", f"/v1/sandboxes/{sid}/branch", b), tag, sid)
    s = tool().ok(201, "POST", f"/v1/sandboxes/{Ctx.mcp[2]}/branch", {"tag": "mcp-live", "mode": "live",
                                                                      "wait": False})
    check(s.get("status") in ("writing", "ready"), s)
    auto = tool().ok(201, "POST", f"/v1/sandboxes/{sid}/branch", {})
    check(auto["tag"].startswith(f"branch-{sid}-"), auto)
    Ctx.mcp_snaps = ["mcp-b", "mcp-diff", "mcp-ldiff", "mcp-md", "mcp-live", auto["tag"], "compat-tap"]
    # kill_sandbox: DELETE with Content-Type and no body; 204 without a body
    for k in Ctx.mcp:
        st, _, out, _ = tool().request("DELETE", f"/v1/sandboxes/{k}")
        check(st == 204 and out == b"", (st, out))
    st, _, _, parsed = tool().request("GET", f"/v1/sandboxes/{sid}")
    check(st == 404, (st, parsed))


# ---------------------------------------------------------------- TypeScript SDK


def t_typescript(c, stack):
    w = fetch(c.port)
    try:
        check(TAG in [s["tag"] for s in w.ok(200, "GET", "/v1/snapshots")], "listSnapshots")
        # Sandbox.create({snapshotTag}) = spawnSandboxes({snapshotTag, n: 1}): perChildNetns undefined -> false
        kids = w.ok(201, "POST", "/v1/sandboxes", {"snapshot_tag": TAG, "n": 1, "per_child_netns": False})
        is_sandbox(kids[0])
        # spawnSandboxes with every option the SDK knows (prewarm false and true, liveFork)
        more = w.ok(201, "POST", "/v1/sandboxes", {"snapshot_tag": TAG, "n": 2, "per_child_netns": False,
                                                   "prewarm": False})
        warm = w.ok(201, "POST", "/v1/sandboxes", {"snapshot_tag": TAG, "n": 1, "per_child_netns": False,
                                                   "prewarm": True, "live_fork": True})
        lf = w.ok(201, "POST", "/v1/sandboxes", {"snapshot_tag": TAG, "n": 1, "per_child_netns": False,
                                                 "live_fork": False})
        if stack.cgroot:
            lim = w.ok(201, "POST", "/v1/sandboxes", {"snapshot_tag": TAG, "n": 1, "per_child_netns": False,
                                                      "memory_limit_mib": 64, "prewarm": True})
            check(lim[0].get("memory_limit_mib") == 64, lim)
            more += lim
        ids = [k["id"] for k in kids + more + warm + lf]
        sid = kids[0]["id"]
        check(w.ok(200, "POST", f"/v1/sandboxes/{sid}/ping").get("pong") is True, "pingSandbox")
        is_sandbox(w.ok(200, "GET", f"/v1/sandboxes/{sid}"))
        check(set(ids) <= {x["id"] for x in w.ok(200, "GET", "/v1/sandboxes")}, "listSandboxes")
        # execCommand(id, args) -> timeout_secs 30 always
        r = w.ok(200, "POST", f"/v1/sandboxes/{sid}/exec", {"args": ["sh", "-c", "x = ts; print x"],
                                                            "timeout_secs": 30})
        check(r.get("stdout") == "ts\n" and r.get("exit_code") == 0, r)
        guest_refuses(*w.request("POST", f"/v1/sandboxes/{sid}/eval", {"code": "1+1"})[::3])
        # branchSandbox: the older SDK (tag, diff, measure_diff) and the newer (mode, wait)
        for tag, b in (("ts-b", {"tag": "ts-b"}), ("ts-diff", {"tag": "ts-diff", "diff": True}),
                       ("ts-md", {"tag": "ts-md", "measure_diff": True}),
                       ("ts-mode", {"tag": "ts-mode", "mode": "diff"}),
                       ("ts-live", {"tag": "ts-live", "mode": "live"})):
            is_snapshot(w.ok(201, "POST", f"/v1/sandboxes/{sid}/branch", b), tag, sid)
        s = w.ok(201, "POST", f"/v1/sandboxes/{warm[0]['id']}/branch", {"tag": "ts-nw", "mode": "live",
                                                                        "wait": False})
        check(s.get("status") in ("writing", "ready"), s)
        auto = w.ok(201, "POST", f"/v1/sandboxes/{sid}/branch", {})
        check(auto["tag"].startswith(f"branch-{sid}-"), auto)
        # Sandbox.branch() of a grandchild works too: spawn from the branch
        g = w.ok(201, "POST", "/v1/sandboxes", {"snapshot_tag": "ts-diff", "n": 1, "per_child_netns": False})
        check(w.ok(200, "POST", f"/v1/sandboxes/{g[0]['id']}/ping").get("pong") is True, "grandchild")
        ids.append(g[0]["id"])
        # ControllerError: status and the parsed {"error": ...}
        st, _, _, e = w.request("POST", "/v1/sandboxes/sb-nosuch/branch", {"tag": "ts-x"})
        check(st == 404 and "sb-nosuch" in e["error"], (st, e))
        st, _, _, e = w.request("POST", f"/v1/sandboxes/{sid}/branch", {"tag": "ts-b"})
        check(st == 409, (st, e))
        # killSandbox, deleteSnapshot: 204 and no body ("tolerate" empty)
        for k in ids:
            st, _, out, _ = w.request("DELETE", f"/v1/sandboxes/{k}")
            check(st == 204 and out == b"", (st, out))
        deadline = time.monotonic() + 30
        while [x.get("status") for x in w.ok(200, "GET", "/v1/snapshots") if x["tag"] == "ts-nw"] != ["ready"]:
            check(time.monotonic() < deadline, "ts-nw never became ready")
            time.sleep(0.05)
        for tag in ("ts-b", "ts-diff", "ts-md", "ts-mode", "ts-live", "ts-nw", auto["tag"]):
            st, _, out, _ = w.request("DELETE", f"/v1/snapshots/{tag}")
            check(st == 204 and out == b"", (tag, st, out))
        # the SDK's requests went over kept-alive connections, and every one had its answer
        check(len(w.sent) > 30, len(w.sent))
    finally:
        w.close()


# ---------------------------------------------------------------- forkd's CLI


def t_cli(c, stack):
    w = ureq_agent(c.port)
    try:
        # forkd snapshot-diff --from compat --tag cli-l1 --exec "sh -c '...'"
        kids = w.ok(201, "POST", "/v1/sandboxes", {"snapshot_tag": TAG, "n": 1, "per_child_netns": False})
        sid = kids[0]["id"]
        st, _, out, pong = w.request("POST", f"/v1/sandboxes/{sid}/ping", raw=b"")  # its wait_for_guest_agent
        check(st == 200 and pong.get("pong") is True, (st, out))
        r = w.ok(200, "POST", f"/v1/sandboxes/{sid}/exec", {"args": ["sh", "-c", "write /tmp/agent/lib.py l1"],
                                                            "timeout_secs": 60})
        check(r["exit_code"] == 0, r)
        s = w.ok(201, "POST", f"/v1/sandboxes/{sid}/branch", {"tag": "cli-l1", "mode": "diff", "parent_tag": TAG})
        is_snapshot(s, "cli-l1", sid)
        check(s.get("parent_tag") == TAG, s)
        # forkd snapshot --from-sandbox: {tag, diff: true}; {mode: "live"}; {mode: "live", wait: false}
        is_snapshot(w.ok(201, "POST", f"/v1/sandboxes/{sid}/branch", {"tag": "cli-fs", "diff": True}), "cli-fs", sid)
        is_snapshot(w.ok(201, "POST", f"/v1/sandboxes/{sid}/branch", {"mode": "live", "tag": "cli-lv"}), "cli-lv", sid)
        s = w.ok(201, "POST", f"/v1/sandboxes/{sid}/branch", {"mode": "live", "tag": "cli-nw", "wait": False})
        check(s.get("status") in ("writing", "ready"), s)
        # forkd's own legacy spelling of a live branch, from its API before "mode"
        is_snapshot(w.ok(201, "POST", f"/v1/sandboxes/{sid}/branch", {"live": True, "tag": "cli-ll"}), "cli-ll", sid)
        # parent_tag of a sandbox that does not exist: 404 from the look-up, nothing written
        st, _, _, e = w.request("POST", "/v1/sandboxes/sb-nosuch/branch", {"tag": "cli-x", "mode": "diff",
                                                                          "parent_tag": TAG})
        check(st == 404 and "sb-nosuch" in e["error"], (st, e))
        # forkd's parent_tag with a non-diff branch: 400 as there
        st, _, _, e = w.request("POST", f"/v1/sandboxes/{sid}/branch", {"tag": "cli-x", "parent_tag": "cli-l1"})
        check(st == 400 and "diff" in e["error"], (st, e))
        st, _, out, _ = w.request("DELETE", f"/v1/sandboxes/{sid}")
        check(st == 204, (st, out))
        # L2, chained off L1
        sid = w.ok(201, "POST", "/v1/sandboxes", {"snapshot_tag": "cli-l1", "n": 1, "per_child_netns": False})[0]["id"]
        w.ok(200, "POST", f"/v1/sandboxes/{sid}/ping", raw=b"")
        r = w.ok(200, "POST", f"/v1/sandboxes/{sid}/exec", {"args": ["sh", "-c", "cat /tmp/agent/lib.py"],
                                                            "timeout_secs": 60})
        check(r["stdout"] == "l1\n", r)
        # a parent_tag that is not the snapshot the sandbox runs from: 400 naming both, nothing written
        st, _, _, e = w.request("POST", f"/v1/sandboxes/{sid}/branch", {"tag": "cli-l2", "mode": "diff",
                                                                        "parent_tag": TAG})
        check(st == 400 and TAG in e["error"] and "cli-l1" in e["error"], (st, e))
        s = w.ok(201, "POST", f"/v1/sandboxes/{sid}/branch", {"tag": "cli-l2", "mode": "diff",
                                                              "parent_tag": "cli-l1"})
        check(s.get("parent_tag") == "cli-l1", s)
        w.request("DELETE", f"/v1/sandboxes/{sid}")
        # forkd snapshot-info cli-l2 --json
        info = w.ok(200, "GET", "/v1/snapshots/cli-l2/info")
        check(info["chain_depth"] == 2 and info["parent_tag"] == "cli-l1" and info["ancestors"] == [TAG, "cli-l1"],
              info)
        # forkd rmi cli-l1: 409 with REST API v1's words
        st, _, _, e = w.request("DELETE", "/v1/snapshots/cli-l1")
        check(st == 409 and e == {"error": "snapshot `cli-l1` is the parent of 1 chained snapshot(s): [cli-l2]; "
                                           "rerun with `?cascade=true` to delete the whole subtree, or "
                                           "`?force=true` to orphan the children (they will fail to restore)"},
              (st, e))
        # forkd snapshot-compact --from cli-l2 --to cli-flat
        s = w.ok(201, "POST", "/v1/snapshots/cli-l2/compact", {"to": "cli-flat"})
        check(s["tag"] == "cli-flat" and "parent_tag" not in s, s)
        check(w.ok(200, "GET", "/v1/snapshots/cli-flat/info")["chain_depth"] == 0, "compact depth")
        # forkd rmi --cascade, rmi --force
        st, _, out, _ = w.request("DELETE", "/v1/snapshots/cli-l1?cascade=true")
        check(st == 204 and out == b"", (st, out))
        check(not {"cli-l1", "cli-l2"} & {x["tag"] for x in w.ok(200, "GET", "/v1/snapshots")}, "cascade")
        deadline = time.monotonic() + 30
        while [x.get("status") for x in w.ok(200, "GET", "/v1/snapshots") if x["tag"] == "cli-nw"] != ["ready"]:
            check(time.monotonic() < deadline, "cli-nw never became ready")
            time.sleep(0.05)
        check("cli-x" not in {x["tag"] for x in w.ok(200, "GET", "/v1/snapshots")}, "a refused branch wrote")
        for tag in ("cli-flat", "cli-fs", "cli-lv", "cli-nw", "cli-ll"):
            st, _, out, _ = w.request("DELETE", f"/v1/snapshots/{tag}?force=true")
            check(st == 204, (tag, st, out))
        # forkd workspace ...: routes forkd-rest does not serve answer a clean 404 with {"error": ...}
        for method, path, body in (("GET", "/v1/workspaces", None),
                                   ("POST", "/v1/workspaces", {"name": "w", "per_child_netns": False,
                                                               "snapshot_tag": TAG}),
                                   ("POST", "/v1/workspaces/w/suspend", {"diff": False}),
                                   ("POST", "/v1/workspaces/w/resume", {}), ("DELETE", "/v1/workspaces/w", None)):
            st, _, out, e = w.request(method, path, body)
            check(st == 404 and "no route" in e["error"], (method, path, st, out))
    finally:
        w.close()


# ---------------------------------------------------------------- fields and texts


def t_fields(c, stack):
    """Unknown fields ignored on the real stack (the call does its work), a
    known field of the wrong type 400, REST API v1's texts, /healthz/."""
    w = fetch(c.port)
    try:
        extra = {"bogus": 1, "nested": {"x": [1, None]}, "prewarm_scratch_dir": "/dev/shm/x"}
        kids = w.ok(201, "POST", "/v1/sandboxes", dict({"snapshot_tag": TAG, "n": 2, "hugepages": False}, **extra))
        a, b = kids[0]["id"], kids[1]["id"]
        r = w.ok(200, "POST", f"/v1/sandboxes/{a}/run_code", dict({"code": "x = 7; print x", "timeout": 5}, **extra))
        check(r["stdout"] == "7\n", r)
        r = w.ok(200, "POST", f"/v1/sandboxes/{a}/exec", dict({"args": ["sh", "-c", "print x"], "cwd": "/"}, **extra))
        check(r["stdout"] == "7\n", r)
        d = w.ok(200, "POST", f"/v1/sandboxes/{a}/diff", dict({"other": b}, **extra))
        check(set(d) == {"added", "removed", "modified"}, d)
        f = w.ok(200, "POST", f"/v1/sandboxes/{a}/fork", dict({"n": 1}, **extra))
        check(len(f["children"]) == 1, f)
        # known fields, wrong type or range: 400, nothing done
        before = sorted(x["id"] for x in w.ok(200, "GET", "/v1/sandboxes"))
        for path, body, word in (("/v1/sandboxes", {"snapshot_tag": TAG, "prewarm": "yes"}, "prewarm"),
                                 ("/v1/sandboxes", {"snapshot_tag": TAG, "hugepages": 1}, "hugepages"),
                                 ("/v1/sandboxes", {"snapshot_tag": TAG, "n": "2"}, "n"),
                                 ("/v1/sandboxes", {"snapshot_tag": TAG, "memory_limit_mib": 1.5}, "memory_limit_mib"),
                                 (f"/v1/sandboxes/{a}/branch", {"measure_diff": "yes"}, "measure_diff"),
                                 (f"/v1/sandboxes/{a}/branch", {"parent_tag": 5, "mode": "diff"}, "parent_tag"),
                                 (f"/v1/sandboxes/{a}/branch", {"live": 1}, "live"),
                                 (f"/v1/sandboxes/{a}/exec", {"args": ["sh"], "timeout_secs": "5"}, "timeout_secs"),
                                 (f"/v1/sandboxes/{a}/fork", {"n": "2"}, "n")):
            st, _, _, e = w.request("POST", path, dict(body, **extra))
            check(st == 400 and word in e["error"], (path, body, st, e))
        # hugepages: true is refused, with why
        st, _, _, e = w.request("POST", "/v1/sandboxes", {"snapshot_tag": TAG, "n": 1, "hugepages": True})
        check(st == 400 and e["error"].startswith("hugepages is not supported"), (st, e))
        # REST API v1, word for word
        for n in (0, 33, 1000):
            st, _, _, e = w.request("POST", f"/v1/sandboxes/{a}/fork", {"n": n})
            check(st == 400 and e == {"error": "n must be between 1 and 32"}, (n, st, e))
        for tok in (None, "wrong"):
            st, _, _, e = w.request("POST", f"/v1/sandboxes/{a}/fork", {"n": 1}, token=tok)
            check(st == 401 and e == {"error": "invalid api key"}, (st, e))
        st, _, _, e = w.request("POST", "/v1/sandboxes/sb-nosuch/fork", {"n": 1})
        check(st == 404 and e == {"error": "sandbox not found"}, (st, e))
        # /healthz and /healthz/ without a token
        for path in ("/healthz", "/healthz/"):
            st, _, _, o = w.request("GET", path, token=None)
            check(st == 200 and o == {"ok": True}, (path, st, o))
        check(sorted(x["id"] for x in w.ok(200, "GET", "/v1/sandboxes")) == before, "a sandbox from a refused request")
        for k in [a, b] + f["children"]:
            w.ok(204, "DELETE", f"/v1/sandboxes/{k}")
    finally:
        w.close()


def t_cleanup(c, stack):
    w = fetch(c.port)
    try:
        deadline = time.monotonic() + 30
        while any(x.get("status") == "writing" for x in w.ok(200, "GET", "/v1/snapshots")):
            check(time.monotonic() < deadline, "a branch never finished")
            time.sleep(0.05)
        for tag in Ctx.mcp_snaps:
            w.ok(204, "DELETE", f"/v1/snapshots/{tag}")
        check([x["tag"] for x in w.ok(200, "GET", "/v1/snapshots")] == [TAG], "snapshots left")
        check(w.ok(200, "GET", "/v1/sandboxes") == [], "sandboxes left")
        w.ok(204, "DELETE", f"/v1/snapshots/{TAG}")
    finally:
        w.close()


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
        tests = [
            ("MCP server: every tool's requests (Content-Type on all, memory_limit_mib and prewarm on spawn)", t_mcp),
            ("TypeScript SDK: every Controller and Sandbox request (fetch, keep-alive, compact JSON)", t_typescript),
            ("forkd CLI: snapshot-diff (parent_tag), snapshot --from-sandbox, snapshot-info, rmi 409/cascade/force, "
             "snapshot-compact; workspaces 404", t_cli),
            ("unknown fields ignored on the real stack, wrong types 400, hugepages refused, REST API v1 texts, /healthz/",
             t_fields),
            ("cleanup: every branch deleted, no sandbox left", t_cleanup),
        ]
        for name, fn in tests:
            tap.run(name, fn, c, stack)
            if fn is t_mcp and tap.failed:
                break
        stack.finish(tap, c, rest)
    finally:
        stack.cleanup()
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
