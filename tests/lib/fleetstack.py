# SPDX-License-Identifier: LGPL-2.1-or-later
"""Fleet nodes for the fleet's tests and bench/fleet: a forkd stack
(tools/forkd-stack, a private bus, its own state directory and port) whose
forkd-rest keeps its record in etcd, and the records as etcd holds them."""

import json
import os
import subprocess
import time
import urllib.request

from etcdcluster import free_ports

PREFIX = "/forkd/nodes/"


def wait_for(what, cond, timeout, step=0.05):
    """cond()'s first true value, asked every step seconds for at most timeout."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def records(cluster):
    """{node name: (record, lease)} of every node record in etcd."""
    return {k[len(PREFIX):]: (json.loads(v), lease) for k, (v, lease) in cluster.get_prefix(PREFIX).items()}


class Node:
    def __init__(self, top, name, etcd, build, stack, ttl, max_sandboxes=20):
        self.name, self.state = name, os.path.join(top, name)
        self.port = free_ports(1)[0]
        self.etcd, self.build, self.stack = etcd, build, stack
        self.ttl, self.max_sandboxes = ttl, max_sandboxes
        self.env = {}

    def up(self):
        env = dict(os.environ, FORKD_BUILD_DIR=self.build, FORKD_STACK_BUS="private", FORKD_STACK_GUEST="test",
                   FORKD_STACK_REST_ARGS=f"--fleet-etcd {self.etcd} --fleet-node {self.name} "
                                         f"--fleet-lease-ttl {self.ttl} --fleet-max-sandboxes {self.max_sandboxes}")
        log = open(self.state + ".up.log", "w")
        out = subprocess.run([self.stack, "up", "--state-dir", self.state, "--port", str(self.port)], env=env,
                             stdout=subprocess.PIPE, stderr=log, text=True, timeout=180)
        log.close()
        if out.returncode != 0:
            with open(self.state + ".up.log") as f:
                raise AssertionError(f"forkd-stack up {self.name} failed: {f.read()[-2000:]}")
        self.env = dict(line.split("=", 1) for line in out.stdout.split())
        with open(self.env["FORKD_TOKEN_FILE"]) as f:
            self.token = f.read().strip()

    def down(self):
        subprocess.run([self.stack, "down", "--state-dir", self.state], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60)

    def pid(self, what):
        with open(os.path.join(self.state, f"{what}.pid")) as f:
            return int(f.read().split()[0])

    def req(self, method, path, body=None):
        r = urllib.request.Request(self.env["FORKD_URL"] + path, method=method,
                                   data=None if body is None else json.dumps(body).encode(),
                                   headers={"Authorization": f"Bearer {self.token}",
                                            "Content-Type": "application/json"})
        with urllib.request.urlopen(r, timeout=60) as resp:
            return json.loads(resp.read() or b"null")
