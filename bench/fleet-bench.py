#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
bench/fleet: what a fleet of forkd nodes on etcd costs, on this machine.

  placement  bench/fleet-place: fleet_place() over 3 node records of 1000
             snapshots each (placement_p50_ms, placement_p99_ms; target p99
             at most 1 ms)
  the fleet  a three-member etcd cluster on loopback, three forkd stacks whose
             forkd-rest keeps its record under a lease (--ttl, default 5 s,
             forkd-rest's default) and one front end (forkd-rest
             --fleet-front), all with one token:
  front      R rounds, in turn: a fork of 100 of a snapshot on node-b straight
             to node-b's REST API, and the same through the front end (which
             places it on node-b, the holder), each on a node whose record
             says it runs nothing, timed to its answer, its children
             terminated after; front_ratio is the median through
             the front end over the median straight (target at most 1.15)
  remote     node-a takes one sandbox and holds it; R rounds: a snapshot made
             on node-a, then a fork of 1 of it through the front end, which
             fetches the chain into another node first (remote_first_fork_ms),
             then a second fork there (local_fork_ms, against a fork of 1
             straight to that node: local_fork_direct_ms); medians
  loss       R rounds: node-c's forkd-rest is started again, waits a random
             part of its TTL, and is killed with -9; the time until the front
             end stops listing it, polled every 10 ms (node_loss_detect_ms,
             the median; target at most the TTL and 1 s)

With --json the last line of stdout is one JSON object. Needs root,
etcd-server and a usable /dev/kvm.
"""

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TOP, "tests", "lib"))

from etcdcluster import ETCD, Cluster  # noqa: E402
from fleetstack import Front, Node, wait_for  # noqa: E402


def placement(build):
    out = subprocess.run([os.path.join(build, "bench", "fleet-place"), "--json"], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.splitlines()[-1])


def seen(front, name):
    st, _, out = front.call("GET", "/v1/fleet/nodes")
    return st == 200 and any(n["name"] == name and n["ready"] for n in out)


def timed(fn):
    t0 = time.monotonic()
    out = fn()
    return (time.monotonic() - t0) * 1000, out


def direct(node, method, path, body=None):
    """(status, body) of a call straight to a node's REST API, as a front end is called."""
    f = Front.__new__(Front)
    f.url, f.token = node.env["FORKD_URL"], node.token
    st, _, out = Front.call(f, method, path, body, timeout=600)
    return st, out


def must(st_out, want, what):
    if st_out[0] != want:
        raise SystemExit(f"bench/fleet: {what}: {st_out}")
    return st_out[1]


def snapshot(node, tag):
    must(direct(node, "POST", "/v1/snapshots", {"tag": tag, "kernel": node.env["FORKD_GUEST_KERNEL"],
                                                "rootfs": node.env["FORKD_GUEST_ROOTFS"], "mem_mib": 64,
                                                "boot_wait_secs": 10}), 201, f"snapshot {tag}")


def front_vs_direct(front, b, rounds):
    straight, through = [], []
    for _ in range(rounds):
        for via, times in (("node", straight), ("front", through)):
            # each fork starts on a settled node: the last round's children gone from its record
            wait_for("node-b empty as the front end sees it",
                     lambda: any(n["name"] == "node-b" and n["capacity"]["sandboxes_running"] == 0
                                 for n in front.call("GET", "/v1/fleet/nodes")[2]), 10)
            if via == "node":
                ms, kids = timed(lambda: must(direct(b, "POST", "/v1/sandboxes", {"snapshot_tag": "warm", "n": 100}),
                                              201, "fork 100 on node-b"))
            else:
                ms, kids = timed(lambda: must(front.call("POST", "/v1/sandboxes", {"snapshot_tag": "warm", "n": 100},
                                                         timeout=600)[::2], 201, "fork 100 through the front end"))
                if {k["node"] for k in kids} != {"node-b"}:
                    raise SystemExit(f"bench/fleet: the front end placed the fork elsewhere: {kids[:2]}")
            times.append(ms)
            for k in kids:
                must(direct(b, "DELETE", "/v1/sandboxes/" + k["id"].split(".", 1)[0]), 204, "terminate")
    return straight, through


def remote(front, nodes, rounds):
    a = nodes["node-a"]
    must(direct(a, "POST", "/v1/sandboxes", {"snapshot_tag": "warm-a"}), 201, "fill node-a")
    wait_for("node-a full as the front end sees it",
             lambda: any(n["name"] == "node-a" and n["capacity"]["sandboxes_running"] == 1
                         for n in front.call("GET", "/v1/fleet/nodes")[2]), 10)
    first, second, straight = [], [], []
    for i in range(rounds):
        tag = f"remote-{i}"
        snapshot(a, tag)
        ms, kids = timed(lambda: must(front.call("POST", "/v1/sandboxes", {"snapshot_tag": tag})[::2], 201,
                                      "the first fork elsewhere"))
        first.append(ms)
        where = nodes[kids[0]["node"]]
        ms, more = timed(lambda: must(front.call("POST", "/v1/sandboxes", {"snapshot_tag": tag})[::2], 201,
                                      "the second fork"))
        if more[0]["node"] != where.name:
            raise SystemExit(f"bench/fleet: the second fork went to {more[0]['node']}, not {where.name}")
        second.append(ms)
        ms, mine = timed(lambda: must(direct(where, "POST", "/v1/sandboxes", {"snapshot_tag": tag}), 201,
                                      "a fork straight there"))
        straight.append(ms)
        for k in kids + more + mine:
            must(direct(where, "DELETE", "/v1/sandboxes/" + k["id"].split(".", 1)[0]), 204, "terminate")
    return first, second, straight


def node_loss(front, c, ttl, rounds):
    times = []
    rng = random.Random(1)
    for _ in range(rounds):
        wait_for("node-c in the front end's view", lambda: seen(front, "node-c"), 30)
        time.sleep(rng.uniform(0, ttl))
        os.kill(c.pid("rest"), signal.SIGKILL)
        t0 = time.monotonic()
        wait_for("node-c gone from the front end's view", lambda: not seen(front, "node-c"), ttl + 10, step=0.01)
        times.append((time.monotonic() - t0) * 1000)
        c.up()  # forkd-rest again, under a new lease
    return times


def fleet(build, ttl, rounds):
    top = tempfile.mkdtemp(prefix="forkd-bench-fleet-")
    cluster = Cluster(os.path.join(top, "etcd"), 3)
    os.makedirs(cluster.top)
    nodes, front = {}, None
    token = os.path.join(top, "token")
    with open(token, "w") as f:
        f.write(os.urandom(16).hex())
    os.chmod(token, 0o600)
    try:
        cluster.start()
        stack = os.path.join(TOP, "tools", "forkd-stack")
        for name, room in (("node-a", 1), ("node-b", 150), ("node-c", 150)):
            nodes[name] = Node(top, name, cluster.endpoints, build, stack, ttl, room, token_file=token)
            nodes[name].up()
        front = Front(top, "front", cluster.endpoints, build, token)
        front.up()
        snapshot(nodes["node-b"], "warm")
        snapshot(nodes["node-a"], "warm-a")
        wait_for("the front end sees warm on node-b",
                 lambda: any(s["tag"] == "warm" and "node-b" in s["nodes"]
                             for s in front.call("GET", "/v1/snapshots")[2]), 10)
        wait_for("three ready nodes", lambda: all(seen(front, n) for n in nodes), 10)
        out = {"front": front_vs_direct(front, nodes["node-b"], rounds)}
        out["remote"] = remote(front, nodes, rounds)
        out["loss"] = node_loss(front, nodes["node-c"], ttl, rounds)
        return out
    finally:
        if front:
            front.down()
        for n in nodes.values():
            n.down()
        cluster.stop()
        shutil.rmtree(top, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(prog="bench/fleet", description="bench/fleet")
    ap.add_argument("--build", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ttl", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not 1 <= args.rounds <= 20 or not 2 <= args.ttl <= 60:
        ap.error("--rounds must be 1..20, --ttl 2..60")
    if os.geteuid() != 0:
        sys.exit("bench/fleet: needs root (tools/forkd-stack)")
    if not os.path.exists(ETCD):
        sys.exit("bench/fleet: needs etcd (Debian's etcd-server; tools/install-deps installs it)")
    place = placement(args.build)
    got = fleet(args.build, args.ttl, args.rounds)
    straight, through = got["front"]
    first, second, local_direct = got["remote"]
    loss = got["loss"]
    med = statistics.median
    doc = {"front_ratio": round(med(through) / med(straight), 3),
           "front_fork100_ms": round(med(through), 1), "direct_fork100_ms": round(med(straight), 1),
           "placement_p50_ms": place["placement_p50_ms"],
           "placement_p99_ms": place["placement_p99_ms"], "records_parse_ms": place["records_parse_ms"],
           "node_loss_detect_ms": round(med(loss), 1),
           "node_loss_rounds_ms": [round(t, 1) for t in loss], "lease_ttl_ms": args.ttl * 1000,
           "remote_first_fork_ms": round(med(first), 1), "local_fork_ms": round(med(second), 1),
           "local_fork_direct_ms": round(med(local_direct), 1), "rounds": args.rounds}
    print(f"bench/fleet: 3 nodes on this machine, etcd of 3 members on loopback, lease TTL {args.ttl} s, "
          f"one front end")
    print(f"placement decision, 3 nodes x {place['snapshots']} snapshots: p50 {doc['placement_p50_ms']} ms, "
          f"p99 {doc['placement_p99_ms']} ms (target p99 <= 1 ms)")
    print(f"fork of 100 on node-b: straight {doc['direct_fork100_ms']} ms, through the front end "
          f"{doc['front_fork100_ms']} ms (medians of {args.rounds}): ratio {doc['front_ratio']} (target <= 1.15)")
    print(f"fork of 1 of a chain only a full node holds: first (with the fetch) {doc['remote_first_fork_ms']} ms, "
          f"the next there {doc['local_fork_ms']} ms, one straight to that node {doc['local_fork_direct_ms']} ms")
    print(f"node killed with -9 gone from the front end's view after {doc['node_loss_detect_ms']} ms (median of "
          f"{args.rounds}: {doc['node_loss_rounds_ms']}; target <= {args.ttl * 1000 + 1000} ms)")
    if args.json:
        print(json.dumps(doc, separators=(",", ":")))


if __name__ == "__main__":
    main()
