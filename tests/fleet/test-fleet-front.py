#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
A fleet's front ends, with real parts: a three-member etcd cluster from
Debian's etcd-server on loopback ports, three forkd stacks (tools/forkd-stack,
each with its own state directory, private bus and port, forkd-rest with
--fleet-etcd) and two front ends (forkd-rest --fleet-front). Nodes and front
ends share one token.

Placement by where a snapshot is, and by room: a fork of a snapshot held by
node-b lands on node-b; a fork of 100 of a snapshot held only by node-a, when
node-a is full, lands on another node after one fetch of the chain, and every
child answers. Every sandbox route through either front end. Idempotency-Key
across front ends. Hostile records in etcd ignored. kill -9 of a node: no
placements there within the TTL and a second, 410 for its sandboxes, the rest
as before. One etcd member down: nothing fails; two down: placement is 503,
placed sandboxes answer.

The waits are for events, each bounded: after a kill -9 the bound is the
lease's TTL and a second, which is what the front end promises.

Environment: FORKD_BUILD_DIR (the meson build directory), FORKD_TOP.
"""

import base64
import http.client
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time

TOP = os.environ.get("FORKD_TOP") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(TOP, "tests", "lib"))

from etcdcluster import ETCD, Cluster  # noqa: E402
from fleetstack import Front, Node, sanitizer_report, tear_down, wait_for, why_not_here  # noqa: E402
from fleetstack import records as cluster_records  # noqa: E402
from tap import Tap, check, skip_all  # noqa: E402

BUILD = os.environ.get("FORKD_BUILD_DIR") or os.path.join(TOP, "build")
STACK = os.path.join(TOP, "tools", "forkd-stack")
TTL = 4  # 2 s leases can end on a machine loaded by other suites (etcd's fsyncs)
N_REMOTE = 100


class Ctx:
    cluster = None
    nodes = {}
    fronts = []
    kept = {}  # name: a front-end sandbox id kept for later checks


def records():
    return cluster_records(Ctx.cluster)


def ok(front, status, method, path, body=None, **kw):
    st, hdrs, out = front.call(method, path, body, **kw)
    check(st == status, (front.name, method, path, st, out))
    return out, hdrs


def metric(front, name):
    st, _, text = front.call("GET", "/metrics")
    text = text.decode() if isinstance(text, bytes) else str(text)
    m = re.search(rf"^{name} (\d+)$", text, re.M)
    return int(m.group(1)) if m else None


def node_seen(front, name):
    """The node as the front end sees it (GET /v1/fleet/nodes), or {}."""
    st, _, out = front.call("GET", "/v1/fleet/nodes")
    check(st == 200 and isinstance(out, list), (st, out))
    return next((n for n in out if n["name"] == name), {})


def make_snapshot(front, node, tag):
    n = Ctx.nodes[node]
    out, _ = ok(front, 201, "POST", f"/v1/snapshots?node={node}",
                {"tag": tag, "kernel": n.env["FORKD_GUEST_KERNEL"], "rootfs": n.env["FORKD_GUEST_ROOTFS"],
                 "mem_mib": 64, "boot_wait_secs": 10})
    check(out["tag"] == tag, out)
    wait_for(f"{tag} in {node}'s record",
             lambda: any(s["tag"] == tag for s in records()[node][0]["snapshots"]), 10)


def t_up(top):
    Ctx.cluster = Cluster(os.path.join(top, "etcd"), 3)
    os.makedirs(Ctx.cluster.top)
    Ctx.cluster.start()
    token = os.path.join(top, "token")
    with open(token, "w") as f:
        f.write(os.urandom(16).hex())
    os.chmod(token, 0o600)
    for name, room in (("node-a", 2), ("node-b", 120), ("node-c", 120)):
        Ctx.nodes[name] = Node(top, name, Ctx.cluster.endpoints, BUILD, STACK, TTL, room, token_file=token)
        Ctx.nodes[name].up()
    wait_for("three ready records", lambda: len(records()) == 3 and all(v[0]["ready"] for v in records().values()),
             20)
    Ctx.fronts = [Front(top, f"front-{i}", Ctx.cluster.endpoints, BUILD, token) for i in (1, 2)]
    for f in Ctx.fronts:
        f.up()
        out, _ = ok(f, 200, "GET", "/healthz")
        check(out == {"status": "ok", "nodes": 3}, out)
        out, _ = ok(f, 200, "GET", "/version")
        check(out.get("fleet") == "front", out)
        wait_for(f"{f.name} sees three ready nodes",
                 lambda: sum(node_seen(f, n).get("ready", False) for n in Ctx.nodes) == 3, 5)
    st, _, out = Ctx.fronts[0].call("GET", "/v1/sandboxes", headers={"Authorization": "Bearer nope"})
    check(st == 401 and out == {"error": "invalid api key"}, (st, out))


def t_local(top):
    f1, f2 = Ctx.fronts
    make_snapshot(f1, "node-b", "warm-b")
    out, _ = ok(f2, 201, "POST", "/v1/sandboxes", {"snapshot_tag": "warm-b"})
    check(len(out) == 1 and out[0]["node"] == "node-b" and out[0]["id"].endswith(".node-b"), out)
    Ctx.kept["b"] = out[0]["id"]
    check(metric(f2, "forkd_front_fetches_total") == 0, "no fetch for a local fork")
    st, _, out = f1.call("POST", "/v1/sandboxes", {"snapshot_tag": "nosuch"})
    check(st == 404 and "not found" in out["error"], (st, out))
    for bad, want in (({"snapshot_tag": "warm-b", "n": 0}, "n must be"), ({"snapshot_tag": "../x"}, "snapshot_tag"),
                      ({"n": 1}, "snapshot_tag")):
        st, _, out = f1.call("POST", "/v1/sandboxes", bad)
        check(st == 400 and want in out["error"], (bad, st, out))
    st, _, out = f1.call("POST", "/v1/sandboxes", raw=b"{not json")
    check(st == 400, (st, out))


def t_remote(top):
    f1, f2 = Ctx.fronts
    make_snapshot(f1, "node-a", "only-a")
    full, _ = ok(f1, 201, "POST", "/v1/sandboxes", {"snapshot_tag": "only-a", "n": 2})
    check(all(c["node"] == "node-a" for c in full), full)
    wait_for("node-a full as the front end sees it", lambda: node_seen(f1, "node-a")["capacity"]["sandboxes_running"] == 2,
             10)
    before = metric(f1, "forkd_front_fetches_total")
    kids, _ = ok(f1, 201, "POST", "/v1/sandboxes", {"snapshot_tag": "only-a", "n": N_REMOTE}, timeout=600)
    check(len(kids) == N_REMOTE and len({k["id"] for k in kids}) == N_REMOTE, len(kids))
    where = {k["node"] for k in kids}
    check(where <= {"node-b", "node-c"}, where)
    check(metric(f1, "forkd_front_fetches_total") - before == len(where), "one fetch per node that lacked it")
    for k in kids:
        ok(f2, 200, "POST", f"/v1/sandboxes/{k['id']}/ping")
    # a second fork there runs from the chain fetched, with no fetch
    again, _ = ok(f2, 201, "POST", "/v1/sandboxes", {"snapshot_tag": "only-a"})
    check(metric(f2, "forkd_front_fetches_total") == 0 or again[0]["node"] == "node-a", again)
    listed, hdrs = ok(f2, 200, "GET", "/v1/sandboxes?usage=false")
    ids = {s["id"] for s in listed}
    check({k["id"] for k in kids + full + again} <= ids and hdrs.get("Forkd-Unanswered-Nodes") is None, len(ids))
    snaps, _ = ok(f1, 200, "GET", "/v1/snapshots")
    only = [s for s in snaps if s["tag"] == "only-a"]
    check(len(only) == 1 and "node-a" in only[0]["nodes"] and len(only[0]["nodes"]) == 1 + len(where), only)
    for k in kids + again + full:
        ok(f1, 204, "DELETE", f"/v1/sandboxes/{k['id']}")


def t_fetch_once(top):
    f1, f2 = Ctx.fronts
    make_snapshot(f1, "node-a", "race-a")
    for f in (f1, f2):  # the last test's sandboxes on node-a gone, as both front ends see it
        wait_for(f"node-a empty as {f.name} sees it",
                 lambda: node_seen(f, "node-a")["capacity"]["sandboxes_running"] == 0, 10)
    full, _ = ok(f1, 201, "POST", "/v1/sandboxes", {"snapshot_tag": "race-a", "n": 2})
    check(all(k["node"] == "node-a" for k in full), full)
    for f in (f1, f2):
        wait_for(f"node-a full as {f.name} sees it",
                 lambda: node_seen(f, "node-a")["capacity"]["sandboxes_running"] == 2, 10)
    before = [metric(f, "forkd_front_fetches_total") for f in (f1, f2)]
    out = [None, None]

    def fork(i, f):
        out[i] = f.call("POST", "/v1/sandboxes", {"snapshot_tag": "race-a"})

    threads = [threading.Thread(target=fork, args=(i, f)) for i, f in enumerate((f1, f2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    check(all(o and o[0] == 201 for o in out), out)
    where = {o[2][0]["node"] for o in out}
    fetched = sum(metric(f, "forkd_front_fetches_total") - b for f, b in zip((f1, f2), before))
    check(fetched == len(where) and "node-a" not in where, (fetched, where))
    for o in out:
        ok(f2, 200, "POST", f"/v1/sandboxes/{o[2][0]['id']}/ping")
        ok(f1, 204, "DELETE", f"/v1/sandboxes/{o[2][0]['id']}")
    for k in full:
        ok(f1, 204, "DELETE", f"/v1/sandboxes/{k['id']}")


def t_split(top):
    f1, f2 = Ctx.fronts
    # node-b runs the one kept sandbox only, node-c none, as the front end sees it
    b = wait_for("node-b's record settled", lambda: (lambda c: c if c["sandboxes_running"] == 1 else None)(
        node_seen(f1, "node-b")["capacity"]), 10)
    wait_for("node-c's record settled", lambda: node_seen(f1, "node-c")["capacity"]["sandboxes_running"] == 0, 10)
    n = b["sandboxes_max"] - 1 + 5
    kids, _ = ok(f1, 201, "POST", "/v1/sandboxes", {"snapshot_tag": "warm-b", "n": n}, timeout=600)
    per = {}
    for k in kids:
        per[k["node"]] = per.get(k["node"], 0) + 1
    # a placement of the last two seconds on node-b may count against its room: 5 or a few more go elsewhere
    check(len(kids) == n and set(per) == {"node-b", "node-c"} and per["node-b"] >= n - 10, per)
    for k in kids[-5:] + kids[:5]:
        ok(f2, 200, "POST", f"/v1/sandboxes/{k['id']}/ping")
    for k in kids:
        ok(f2, 204, "DELETE", f"/v1/sandboxes/{k['id']}")


def t_routes(top):
    f1, f2 = Ctx.fronts
    sid = Ctx.kept["b"]
    for f in (f1, f2):
        ok(f, 200, "POST", f"/v1/sandboxes/{sid}/ping")
        out, _ = ok(f, 200, "GET", f"/v1/sandboxes/{sid}")
        check(out["id"] == sid and out["node"] == "node-b", out)
        out, _ = ok(f, 200, "POST", f"/v1/sandboxes/{sid}/exec", {"args": ["/bin/sh", "-c", "x = 1; print x"]})
        check(out["exit_code"] == 0 and out["stdout"] == "1\n", out)
        out, _ = ok(f, 200, "POST", f"/v1/sandboxes/{sid}/run_code", {"code": "x = 41"})
        check(out["exit_code"] == 0 and out["error"] is None, out)
    pid = ok(f1, 201, "POST", f"/v1/sandboxes/{sid}/processes", {"args": ["/bin/sh", "-c", "echo one two"]})[0]["pid"]
    out, _ = ok(f2, 200, "GET", f"/v1/sandboxes/{sid}/processes")
    check(any(p["pid"] == pid for p in out["processes"]), out)
    _, _, text = f2.call("GET", f"/v1/sandboxes/{sid}/processes/{pid}/output?follow=true")
    text = text.decode() if isinstance(text, bytes) else json.dumps(text)
    check("one two" in text or "b25lIHR3bw" in text, text[:500])
    # a follow stream goes through as the process prints: cat has not ended when its first line comes
    cat = ok(f1, 201, "POST", f"/v1/sandboxes/{sid}/processes", {"args": ["cat"]})[0]["pid"]
    conn = http.client.HTTPConnection("127.0.0.1", f2.port, timeout=30)
    conn.request("GET", f"/v1/sandboxes/{sid}/processes/{cat}/output?follow=true",
                 headers={"Authorization": f"Bearer {f2.token}"})
    resp = conn.getresponse()
    check(resp.status == 200 and resp.getheader("Content-Type").startswith("application/x-ndjson"),
          (resp.status, resp.getheaders()))
    ok(f1, 200, "POST", f"/v1/sandboxes/{sid}/processes/{cat}/stdin", {"data": "streamed\n"})
    first = json.loads(resp.readline())
    check(base64.b64decode(first.get("data_b64", "")) == b"streamed\n" or first.get("data") == "streamed\n", first)
    running = ok(f1, 200, "GET", f"/v1/sandboxes/{sid}/processes")[0]
    check(any(p["pid"] == cat and p["running"] for p in running["processes"]), running)
    ok(f1, 200, "POST", f"/v1/sandboxes/{sid}/processes/{cat}/stdin", {"data": "", "eof": True})
    rest = resp.read().decode()
    check(json.loads(rest.strip().splitlines()[-1]) == {"exit_code": 0, "signal": None}, rest[-300:])
    conn.close()
    snap, _ = ok(f1, 201, "POST", f"/v1/sandboxes/{sid}/branch", {"tag": "br-b"})
    check(snap["tag"] == "br-b", snap)
    kids, _ = ok(f2, 200, "POST", f"/v1/sandboxes/{sid}/fork", {"n": 2})
    check(len(kids["children"]) == 2 and all(c.endswith(".node-b") for c in kids["children"]), kids)
    for c in kids["children"]:
        ok(f1, 200, "POST", f"/v1/sandboxes/{c}/ping")
    out, _ = ok(f1, 200, "POST", f"/v1/sandboxes/{kids['children'][0]}/pause")
    check(out["id"] == kids["children"][0] and out["status"] == "paused", out)
    out, _ = ok(f2, 200, "POST", f"/v1/sandboxes/{kids['children'][0]}/resume")
    check(out["status"] == "running", out)
    ok(f2, 200, "POST", f"/v1/sandboxes/{kids['children'][0]}/ping")
    for c in kids["children"]:
        ok(f2, 204, "DELETE", f"/v1/sandboxes/{c}")
    st, _, out = f1.call("POST", f"/v1/sandboxes/{kids['children'][0]}/ping")
    check(st == 404, (st, out))
    for bad in ("sb-nosuch", "sb-x.node-zz", "sb-x.no/de", ".node-b"):
        st, _, out = f1.call("POST", f"/v1/sandboxes/{bad}/ping")
        check(st == 404, (bad, st, out))
    st, _, out = f1.call("GET", f"/v1/sandboxes/{sid}/processes/{pid}/tty")
    check(st == 501 and "node-b" in out["error"], (st, out))


def t_idempotency(top):
    f1, f2 = Ctx.fronts
    h = {"Idempotency-Key": "fleet-key-1"}
    first, _ = ok(f1, 201, "POST", "/v1/sandboxes", {"snapshot_tag": "warm-b"}, headers=h)
    again, hdrs = ok(f2, 201, "POST", "/v1/sandboxes", {"snapshot_tag": "warm-b"}, headers=h)
    check(again == first and hdrs.get("Idempotent-Replayed") == "true", (first, again, dict(hdrs)))
    st, _, out = f2.call("POST", "/v1/sandboxes", {"snapshot_tag": "warm-b", "n": 2}, headers=h)
    check(st == 422 and "another request" in out["error"], (st, out))
    listed, _ = ok(f1, 200, "GET", "/v1/sandboxes?usage=false")
    check(sum(1 for s in listed if s["id"] == first[0]["id"]) == 1, "made once")
    ok(f1, 204, "DELETE", f"/v1/sandboxes/{first[0]['id']}")


def t_hostile_records(top):
    f1, _ = Ctx.fronts
    before = metric(f1, "forkd_front_records_refused_total")
    good = dict(records()["node-b"][0])
    bad = {
        "evil-url": dict(good, name="evil-url", url="http://127.0.0.1:1/../x"),
        "evil-cap": dict(good, name="evil-cap", capacity=dict(good["capacity"], sandboxes_max=10 ** 12)),
        "evil-snaps": dict(good, name="evil-snaps", snapshots=[{"tag": "warm-b"}, 5]),
        "evil-name": dict(good, name="someone-else"),
    }
    try:
        hostile_records_checked(f1, before, bad)
    finally:
        for name in list(bad) + ["evil-json"]:
            Ctx.cluster.call("/v3/kv/deleterange", {"key": __import__("etcdcluster").b64(f"/forkd/nodes/{name}")})


def hostile_records_checked(f1, before, bad):
    for name, rec in bad.items():
        Ctx.cluster.put(f"/forkd/nodes/{name}", json.dumps(rec))
    Ctx.cluster.put("/forkd/nodes/evil-json", "{not json" + "x" * 1000)
    wait_for("five records refused", lambda: metric(f1, "forkd_front_records_refused_total") - before >= 5, 10)
    out, _ = ok(f1, 200, "GET", "/healthz")
    check(out["nodes"] == 3, out)
    kids, _ = ok(f1, 201, "POST", "/v1/sandboxes", {"snapshot_tag": "warm-b", "n": 3})
    check(all(k["node"] in ("node-b", "node-c") for k in kids), kids)  # the holders, never a hostile record
    for k in kids:
        ok(f1, 204, "DELETE", f"/v1/sandboxes/{k['id']}")
    with open(f1.log, errors="replace") as f:
        check("Ignoring the fleet record /forkd/nodes/evil-url" in f.read(), "logged")


class HostileNode:
    """A node record in etcd whose REST API is this: every answer too long, not
    JSON, or too slow; it has no room, so nothing is placed there."""

    def __init__(self):
        import http.server

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def answer(self, body, ctype="application/json"):
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass

            def do_GET(self):
                if self.path.split("?")[0] == "/v1/sandboxes":
                    self.answer(b"[" + b" " * (17 << 20) + b"]")  # over a front end's 16 MiB
                elif self.path.startswith("/v1/snapshots"):
                    # held until the test has the front end's list: past its 5 s, as long as it takes
                    outer.release.wait(60)
                    self.answer(b"[]")
                else:
                    self.answer(b"{not json")

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                self.answer(b"{\"id\": " * (3 << 20))  # 21 MiB

        outer = self
        self.release = threading.Event()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def record(self):
        return {"format": 1, "name": "hostile", "url": f"http://127.0.0.1:{self.port}", "ready": True,
                "capacity": {"cores": 1, "memory_available_kib": 1, "sandboxes_running": 1, "sandboxes_max": 1},
                "snapshots": [], "updated_unix": int(time.time())}

    def stop(self):
        self.release.set()
        self.server.shutdown()


def t_hostile_node(top):
    f1, f2 = Ctx.fronts
    h = HostileNode()
    try:
        Ctx.cluster.put("/forkd/nodes/hostile", json.dumps(h.record()))
        wait_for("the front ends see the hostile node", lambda: all(node_seen(f, "hostile") for f in (f1, f2)), 10)
        listed, hdrs = ok(f1, 200, "GET", "/v1/sandboxes?usage=false")
        check(hdrs.get("Forkd-Unanswered-Nodes") == "hostile" and Ctx.kept["b"] in {s["id"] for s in listed},
              (dict(hdrs), len(listed)))
        # the list comes while the hostile node still holds its answer: the front end gave up on it
        snaps, hdrs = ok(f2, 200, "GET", "/v1/snapshots")
        held = not h.release.is_set()
        h.release.set()
        check(held and hdrs.get("Forkd-Unanswered-Nodes") == "hostile" and any(s["tag"] == "warm-b" for s in snaps),
              (dict(hdrs), held))
        st, _, out = f1.call("POST", "/v1/sandboxes/sb-1.hostile/ping")
        check(st == 502 and "node hostile did not answer: its answer is longer than a front end takes" in
              out["error"], (st, out))
        # an answer that is not JSON is not renamed: it goes to the client as it came, bounded
        st, _, out = f2.call("GET", "/v1/sandboxes/sb-1.hostile")
        check(st == 200 and out == b"{not json", (st, out))
        kids, _ = ok(f1, 201, "POST", "/v1/sandboxes", {"snapshot_tag": "warm-b"})
        check(kids[0]["node"] in ("node-b", "node-c"), kids)  # both hold warm-b since the split
        ok(f1, 204, "DELETE", f"/v1/sandboxes/{kids[0]['id']}")
        ok(f2, 200, "POST", f"/v1/sandboxes/{Ctx.kept['b']}/ping")
    finally:
        Ctx.cluster.call("/v3/kv/deleterange", {"key": __import__("etcdcluster").b64("/forkd/nodes/hostile")})
        h.stop()


def t_node_lost(top):
    f1, f2 = Ctx.fronts
    make_snapshot(f1, "node-c", "only-c")
    out, _ = ok(f1, 201, "POST", "/v1/sandboxes", {"snapshot_tag": "only-c"})
    check(out[0]["node"] == "node-c", out)
    lost = out[0]["id"]
    c = Ctx.nodes["node-c"]
    os.kill(c.pid("rest"), signal.SIGKILL)
    t0 = time.monotonic()
    for f in (f1, f2):
        wait_for(f"{f.name} without node-c", lambda: f.call("GET", "/healthz")[2].get("nodes") == 2, TTL + 1.5,
                 step=0.02)
    gone = time.monotonic() - t0
    check(gone <= TTL + 1, f"{gone:.2f} s")
    st, _, out = f1.call("POST", "/v1/sandboxes", {"snapshot_tag": "only-c"})
    check(st == 404, (st, out))
    for f in (f1, f2):
        st, _, out = f.call("POST", f"/v1/sandboxes/{lost}/ping")
        check(st == 410 and re.fullmatch(r"node node-c was lost at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", out["error"]),
              (st, out))
        ok(f, 200, "POST", f"/v1/sandboxes/{Ctx.kept['b']}/ping")
    kids, _ = ok(f2, 201, "POST", "/v1/sandboxes", {"snapshot_tag": "warm-b"})
    check(kids[0]["node"] == "node-b", kids)
    Ctx.kept["b2"] = kids[0]["id"]
    # a front end started after the loss reads it from etcd
    f3 = Front(top, "front-3", Ctx.cluster.endpoints, BUILD, Ctx.fronts[0].token_file)
    f3.up()
    try:
        st, _, out = f3.call("POST", f"/v1/sandboxes/{lost}/ping")
        check(st == 410 and out["error"].startswith("node node-c was lost at "), (st, out))
    finally:
        f3.down()
    report = sanitizer_report(f3.log)
    check(f3.proc.returncode == 0 and report is None, (f3.proc.returncode, report))


def t_etcd_down(top):
    f1, f2 = Ctx.fronts
    Ctx.cluster.kill(0)
    for i in range(3):
        for f in (f1, f2):
            kids, _ = ok(f, 201, "POST", "/v1/sandboxes", {"snapshot_tag": "warm-b"})
            ok(f, 200, "POST", f"/v1/sandboxes/{kids[0]['id']}/ping")
            ok(f, 204, "DELETE", f"/v1/sandboxes/{kids[0]['id']}")
    Ctx.cluster.kill(1)
    # each front end refuses once its last read of etcd is 2 s old (a read that fails takes up to 2 s)
    for f in (f1, f2):
        st, _, out = wait_for(f"{f.name} refusing placement without quorum",
                              lambda: (lambda a: a if a[0] != 201 else None)(
                                  f.call("POST", "/v1/sandboxes", {"snapshot_tag": "warm-b"}, timeout=30)), 15,
                              step=0.2)
        check(st == 503 and "cannot place a fork: etcd does not answer" in out["error"], (st, out))
    for f in (f1, f2):
        ok(f, 200, "POST", f"/v1/sandboxes/{Ctx.kept['b']}/ping")
        ok(f, 200, "POST", f"/v1/sandboxes/{Ctx.kept['b2']}/exec", {"args": ["/bin/sh", "-c", "x = 1"]})


def t_down(top):
    for f in Ctx.fronts:
        f.down()
        check(f.proc.returncode == 0, (f.name, f.proc.returncode))
        report = sanitizer_report(f.log)
        check(report is None, f"{f.name}: {report}")


def main():
    if why_not_here(ETCD):
        skip_all(why_not_here(ETCD))
    tap = Tap()
    top = tempfile.mkdtemp(prefix="forkd-front-")
    try:
        tap.run("etcd, three nodes and two front ends that see them", t_up, top)
        if not tap.failed:
            tap.run("a fork of a snapshot node-b holds lands on node-b; bad bodies are 400", t_local, top)
            tap.run(f"a fork of {N_REMOTE} of a snapshot only a full node-a holds: elsewhere, after one fetch, "
                    "every child answers", t_remote, top)
            tap.run("two front ends fork at once a chain that one node must fetch: fetched once", t_fetch_once, top)
            tap.run("a fork with more children than the holder has room for: split, the rest fetched elsewhere",
                    t_split, top)
            tap.run("every sandbox route through either front end", t_routes, top)
            tap.run("Idempotency-Key: a retry through the other front end gets the first answer", t_idempotency,
                    top)
            tap.run("hostile records in etcd: ignored and logged, never followed", t_hostile_records, top)
            tap.run("a hostile node's answers (too long, not JSON, never coming): 502 naming it or left out of "
                    "lists, and the rest answers", t_hostile_node, top)
            tap.run(f"kill -9 of node-c: no placements there within the TTL ({TTL} s) and 1 s; 410 for its "
                    "sandboxes, also through a front end started later; the rest answers", t_node_lost, top)
            tap.run("one etcd member down: nothing fails; two: placement is 503, placed sandboxes answer",
                    t_etcd_down, top)
        tap.run("the front ends stop cleanly, with no sanitizer report", t_down, top)
    finally:
        tear_down(top, Ctx.fronts, Ctx.nodes.values(), Ctx.cluster)
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
