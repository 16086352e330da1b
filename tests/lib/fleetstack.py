# SPDX-License-Identifier: LGPL-2.1-or-later
"""Fleet nodes for the fleet's tests and bench/fleet: a forkd stack
(tools/forkd-stack, a private bus, its own state directory and port) whose
forkd-rest keeps its record in etcd, and the records as etcd holds them."""

import json
import os
import subprocess
import time
import urllib.error
import urllib.request

from etcdcluster import free_ports

PREFIX = "/forkd/nodes/"
SANITIZER_WORDS = ("AddressSanitizer", "LeakSanitizer", "runtime error:")


def sanitizer_report(path):
    """The first sanitizer report in a log, with some context, or None."""
    with open(path, errors="replace") as f:
        text = f.read()
    for bad in SANITIZER_WORDS:
        if bad in text:
            return text[max(text.find(bad) - 200, 0):][:1500]
    return None


def tear_down(top, fronts, nodes, cluster):
    """Front ends, nodes and etcd stopped; top removed unless FORKD_TEST_KEEP."""
    for f in fronts:
        f.down()
    for n in nodes:
        n.down()
    if cluster:
        cluster.stop()
    if os.environ.get("FORKD_TEST_KEEP"):
        print(f"# kept {top}")
    else:
        subprocess.run(["rm", "-rf", top])


def why_not_here(etcd):
    """Why the fleet's tests cannot run on this machine, or None."""
    if not os.path.exists(etcd):
        return "etcd (Debian's etcd-server) is not installed: tools/install-deps installs it"
    if os.geteuid() != 0:
        return "needs root (tools/forkd-stack)"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "/dev/kvm is not usable"
    return None


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
    def __init__(self, top, name, etcd, build, stack, ttl, max_sandboxes=20, token_file=None):
        self.name, self.state = name, os.path.join(top, name)
        self.port = free_ports(1)[0]
        self.etcd, self.build, self.stack = etcd, build, stack
        self.ttl, self.max_sandboxes = ttl, max_sandboxes
        self.env = {}
        self.token_file = token_file

    def up(self):
        env = dict(os.environ, FORKD_BUILD_DIR=self.build, FORKD_STACK_BUS="private", FORKD_STACK_GUEST="test",
                   FORKD_STACK_REST_ARGS=f"--fleet-etcd {self.etcd} --fleet-node {self.name} "
                                         f"--fleet-lease-ttl {self.ttl} --fleet-max-sandboxes {self.max_sandboxes}")
        if self.token_file:
            env["FORKD_STACK_TOKEN_FILE"] = self.token_file
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


class Front:
    """forkd-rest --fleet-front on a port of its own, with the fleet's token."""

    def __init__(self, top, name, etcd, build, token_file):
        self.name, self.etcd, self.build, self.token_file = name, etcd, build, token_file
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = os.path.join(top, name + ".log")
        self.proc = None
        with open(token_file) as f:
            self.token = f.read().strip()

    def up(self):
        rest = os.path.join(self.build, "src", "rest", "forkd-rest")
        self.proc = subprocess.Popen([rest, "--fleet-front", "--fleet-etcd", self.etcd, "--listen",
                                      f"127.0.0.1:{self.port}", "--token-file", self.token_file],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "a"))
        wait_for(f"{self.name} answering", lambda: self.alive() and self._healthz(), 20)

    def alive(self):
        if self.proc.poll() is not None:
            with open(self.log, errors="replace") as f:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}: {f.read()[-1500:]}")
        return True

    def _healthz(self):
        try:
            urllib.request.urlopen(self.url + "/healthz", timeout=2).read()
            return True
        except OSError:
            return False

    def down(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def call(self, method, path, body=None, headers=None, raw=None, timeout=120):
        """(status, headers, parsed body or bytes) of one request; never raises for an HTTP status."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        h = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        h.update(headers or {})
        r = urllib.request.Request(self.url + path, method=method, data=data, headers=h)
        try:
            resp = urllib.request.urlopen(r, timeout=timeout)
        except urllib.error.HTTPError as e:
            resp = e
        with resp:
            text = resp.read()
            try:
                return resp.status, resp.headers, json.loads(text or b"null")
            except ValueError:
                return resp.status, resp.headers, text
