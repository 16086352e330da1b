#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
A fleet's nodes in etcd, with real parts: a three-member etcd cluster from
Debian's etcd-server on loopback ports, and three forkd stacks
(tools/forkd-stack, each with its own state directory, private bus and port)
whose forkd-rest runs with --fleet-etcd.

Each node keeps its record under <prefix>nodes/<name> on a lease: its URL,
capacity and snapshots, rewritten as they change. A node stopped cleanly
revokes its lease (its record goes at once); one killed with -9 drops out when
the lease ends. A lease etcd dropped is replaced. One etcd member killed: the
nodes keep their leases through the others. Bad fleet options are refused at
start.

The waits are for events (a record as expected), each bounded; the bound after
a kill -9 is the lease's TTL and a second or two more, which is what the lease
promises.

Environment: FORKD_BUILD_DIR (the meson build directory), FORKD_TOP.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

TOP = os.environ.get("FORKD_TOP") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(TOP, "tests", "lib"))

from etcdcluster import ETCD, Cluster, free_ports  # noqa: E402
from fleetstack import Node, sanitizer_report, tear_down, wait_for, why_not_here  # noqa: E402
from fleetstack import records as cluster_records  # noqa: E402
from tap import Tap, check, skip_all  # noqa: E402

BUILD = os.environ.get("FORKD_BUILD_DIR") or os.path.join(TOP, "build")
REST = os.path.join(BUILD, "src", "rest", "forkd-rest")
STACK = os.path.join(TOP, "tools", "forkd-stack")
TTL = 2


class Ctx:
    cluster = None
    nodes = []


def records():
    return cluster_records(Ctx.cluster)


def t_cluster(top):
    Ctx.cluster = Cluster(os.path.join(top, "etcd"), 3)
    os.makedirs(Ctx.cluster.top)
    Ctx.cluster.start()


def t_nodes_up(top):
    Ctx.nodes = [Node(top, name, Ctx.cluster.endpoints, BUILD, STACK, TTL) for name in ("node-a", "node-b", "node-c")]
    for n in Ctx.nodes:
        n.up()
    recs = wait_for("three ready records", lambda: (lambda r: r if len(r) == 3 and
                                                    all(v[0]["ready"] for v in r.values()) else None)(records()), 20)
    for n in Ctx.nodes:
        rec, lease = recs[n.name]
        check(rec["format"] == 1 and rec["name"] == n.name and rec["url"] == f"http://127.0.0.1:{n.port}", rec)
        check(lease != 0, (n.name, "no lease"))
        cap = rec["capacity"]
        check(cap["cores"] >= 1 and cap["memory_available_kib"] > 0 and cap["sandboxes_running"] == 0 and
              cap["sandboxes_max"] == 20, cap)
        check(isinstance(rec["snapshots"], list) and isinstance(rec["updated_unix"], int), rec)
    check(len({lease for _, lease in recs.values()}) == 3, "one lease per node")


def t_snapshot_and_fork(top):
    b = Ctx.nodes[1]
    b.req("POST", "/v1/snapshots", {"tag": "warm", "kernel": b.env["FORKD_GUEST_KERNEL"],
                                    "rootfs": b.env["FORKD_GUEST_ROOTFS"], "mem_mib": 64, "boot_wait_secs": 10})
    rec = wait_for("warm in node-b's record",
                   lambda: (lambda r: r if any(s["tag"] == "warm" for s in r["snapshots"]) else None)(
                       records()["node-b"][0]), 10)
    s = [s for s in rec["snapshots"] if s["tag"] == "warm"][0]
    check(s["parent"] is None and s["vcpus"] == 1 and s["mem_size"] == 64 << 20, s)
    check(all(not r[0]["snapshots"] for name, r in records().items() if name != "node-b"), "only node-b has it")
    kids = b.req("POST", "/v1/sandboxes", {"snapshot_tag": "warm", "n": 2})
    wait_for("two running in node-b's record",
             lambda: records()["node-b"][0]["capacity"]["sandboxes_running"] == 2, 10)
    for k in kids:
        b.req("DELETE", f"/v1/sandboxes/{k['id']}")
    wait_for("none running in node-b's record",
             lambda: records()["node-b"][0]["capacity"]["sandboxes_running"] == 0, 10)


def t_clean_stop(top):
    a = Ctx.nodes[0]
    os.kill(a.pid("rest"), signal.SIGTERM)
    wait_for("node-a's record gone at its stop (its lease revoked)", lambda: "node-a" not in records(), 1.5)
    a.up()  # forkd-stack starts what died and keeps the rest
    wait_for("node-a back", lambda: "node-a" in records() and records()["node-a"][0]["ready"], 10)


def t_kill9(top):
    c = Ctx.nodes[2]
    os.kill(c.pid("rest"), signal.SIGKILL)
    t0 = time.monotonic()
    wait_for("node-c's record gone when its lease ends", lambda: "node-c" not in records(), TTL + 2)
    gone = time.monotonic() - t0
    check(gone <= TTL + 2, gone)
    check({"node-a", "node-b"} <= set(records()), records().keys())


def t_lease_lost(top):
    b = Ctx.nodes[1]
    _, lease = records()["node-b"]
    Ctx.cluster.lease_revoke(lease)
    rec = wait_for("node-b under a new lease",
                   lambda: (lambda r: r.get("node-b") if r.get("node-b") and r["node-b"][1] != lease else None)(
                       records()), 10)
    check(rec[0]["ready"] and any(s["tag"] == "warm" for s in rec[0]["snapshots"]), rec)


def t_etcd_member_down(top):
    Ctx.cluster.kill(0)  # the first endpoint in every node's list
    leases = {n: lease for n, (_, lease) in records().items()}
    # three TTLs: a node that could not keep its lease alive would have lost it
    time.sleep(3 * TTL)
    now = records()
    check(set(now) == set(leases) and all(now[n][1] == leases[n] for n in leases), (leases, now))


def t_bad_options(top):
    cases = [(["--fleet-etcd", "ftp://127.0.0.1:1"], "--fleet-etcd"),
             (["--fleet-etcd", "http://127.0.0.1:2379/path"], "--fleet-etcd"),
             (["--fleet-etcd", "http://127.0.0.1:99999"], "--fleet-etcd"),
             (["--fleet-etcd", ",".join(["http://127.0.0.1:1"] * 17)], "--fleet-etcd"),
             (["--fleet-etcd", "http://127.0.0.1:1", "--fleet-node", "../x"], "--fleet-node"),
             (["--fleet-etcd", "http://127.0.0.1:1", "--fleet-node", "a" * 64], "--fleet-node"),
             (["--fleet-etcd", "http://127.0.0.1:1", "--fleet-node", "n", "--fleet-lease-ttl", "1"],
              "--fleet-lease-ttl"),
             (["--fleet-etcd", "http://127.0.0.1:1", "--fleet-node", "n", "--fleet-advertise", "x"],
              "--fleet-advertise"),
             (["--fleet-node", "n"], "need --fleet-etcd"),
             (["--fleet-etcd", "http://127.0.0.1:1", "--fleet-node", "n", "--fleet-etcd-cert", "/x"],
              "--fleet-etcd-cert and --fleet-etcd-key")]
    port = free_ports(1)[0]
    for args, want in cases:
        p = subprocess.run([REST, "--listen", f"127.0.0.1:{port}", "--bus-address", "unix:path=/nonexistent"] + args,
                           capture_output=True, text=True, timeout=10)
        check(p.returncode != 0 and want in p.stderr, (args, p.returncode, p.stderr[-300:]))


def t_down(top):
    for n in Ctx.nodes:
        n.down()
    check(not records(), records())
    for n in Ctx.nodes:
        for name in os.listdir(n.state):
            if name.endswith(".log"):
                report = sanitizer_report(os.path.join(n.state, name))
                check(report is None, f"{n.name}/{name}: {report}")


def main():
    if why_not_here(ETCD):
        skip_all(why_not_here(ETCD))
    tap = Tap()
    top = tempfile.mkdtemp(prefix="forkd-fleet-")
    try:
        tap.run("a three-member etcd cluster on loopback", t_cluster, top)
        if not tap.failed:
            tap.run("three nodes, each with its record under a lease of its own: URL, capacity, snapshots",
                    t_nodes_up, top)
        if not tap.failed:
            tap.run("a snapshot and sandboxes on node-b show in its record, and only there", t_snapshot_and_fork, top)
            tap.run("a clean stop revokes the lease: the record goes at once; back on a restart", t_clean_stop, top)
            tap.run(f"kill -9 of node-c's forkd-rest: its record goes within the TTL ({TTL} s) and 2 s",
                    t_kill9, top)
            tap.run("a lease etcd dropped: a new one, and the record again", t_lease_lost, top)
            tap.run("one etcd member killed: every node keeps its lease", t_etcd_member_down, top)
        tap.run("bad fleet options: refused at start, naming the option", t_bad_options, top)
        tap.run("the nodes stop cleanly: no record left, no sanitizer report in their logs", t_down, top)
    finally:
        tear_down(top, [], Ctx.nodes, Ctx.cluster)
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
