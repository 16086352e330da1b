# SPDX-License-Identifier: LGPL-2.1-or-later
"""A real etcd cluster for the fleet's tests: N members of Debian's etcd-server on
loopback ports, each with a data directory under a directory of the caller's, and
a client of etcd's v3 JSON gateway (urllib, independent of forkd's own client)."""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def free_ports(n):
    """n loopback TCP ports that were free a moment ago."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def b64(s):
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


class Cluster:
    def __init__(self, top, n=3):
        self.top, self.n = top, n
        ports = free_ports(2 * n)
        self.names = [f"e{i}" for i in range(n)]
        self.client = [f"http://127.0.0.1:{ports[i]}" for i in range(n)]
        self.peer = [f"http://127.0.0.1:{ports[n + i]}" for i in range(n)]
        self.procs = [None] * n

    @property
    def endpoints(self):
        return ",".join(self.client)

    def start_member(self, i):
        initial = ",".join(f"{self.names[k]}={self.peer[k]}" for k in range(self.n))
        data = os.path.join(self.top, self.names[i])
        log = open(os.path.join(self.top, f"{self.names[i]}.log"), "a")
        self.procs[i] = subprocess.Popen(
            [ETCD, "--name", self.names[i], "--data-dir", data,
             "--listen-client-urls", self.client[i], "--advertise-client-urls", self.client[i],
             "--listen-peer-urls", self.peer[i], "--initial-advertise-peer-urls", self.peer[i],
             "--initial-cluster", initial, "--initial-cluster-state", "new",
             "--initial-cluster-token", f"forkd-test-{os.getpid()}",
             "--heartbeat-interval", "50", "--election-timeout", "500"],
            stdout=log, stderr=log, start_new_session=True)
        log.close()

    def start(self, timeout=30):
        for i in range(self.n):
            self.start_member(i)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.healthy(i) for i in range(self.n)):
                return
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    raise AssertionError(f"etcd member {self.names[i]} exited with {p.returncode}: {self.log_tail(i)}")
            time.sleep(0.1)
        raise AssertionError("the etcd cluster did not become healthy: " + self.log_tail(0))

    def log_tail(self, i, n=1500):
        try:
            with open(os.path.join(self.top, f"{self.names[i]}.log")) as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def kill(self, i, sig=signal.SIGKILL):
        p = self.procs[i]
        if p and p.poll() is None:
            os.killpg(p.pid, sig)
            p.wait()

    def stop(self):
        for i in range(self.n):
            self.kill(i)

    # ---- the JSON gateway ----

    def call(self, path, body, endpoint=None, timeout=3):
        for url in ([endpoint] if endpoint else self.client):
            try:
                req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    return json.loads(r.read())
            except OSError as e:
                last = e
        raise AssertionError(f"no etcd member answered {path}: {last}")

    def healthy(self, i):
        try:
            self.call("/v3/kv/range", {"key": b64("health")}, endpoint=self.client[i], timeout=1)
            return True
        except AssertionError:
            return False

    def get_prefix(self, prefix):
        """{key: (value text, lease id)} of every key under prefix."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        out = self.call("/v3/kv/range", {"key": b64(prefix), "range_end": b64(end)})
        return {base64.b64decode(kv["key"]).decode(): (base64.b64decode(kv.get("value", "")).decode(),
                                                       int(kv.get("lease", 0)))
                for kv in out.get("kvs", [])}

    def put(self, key, value, lease=0):
        body = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        self.call("/v3/kv/put", body)

    def lease_grant(self, ttl):
        return int(self.call("/v3/lease/grant", {"TTL": ttl})["ID"])

    def lease_revoke(self, lease):
        self.call("/v3/lease/revoke", {"ID": str(lease)})
