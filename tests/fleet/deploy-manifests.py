#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
What tests/fleet/test-fleet-deploy.sh reads out of deploy/kubernetes and the
fleet's units, and their commands run here, without Kubernetes or systemd.

  deploy-manifests.py flags FILE...
      "PROGRAM OPTION" for every --option a container of the manifests gives
      forkd or forkd-rest (command and args), one a line.

  deploy-manifests.py run
      Against a one-member etcd of Debian's etcd-server:
      - node.yaml's pod: its containers in their order (dbus-daemon with the
        ConfigMap's bus.conf, forkd, forkd-rest), each volume a directory of a
        temporary one and every path under a mount moved into it, the
        downward API's values "test-node" and 127.0.0.1, a free port for 8889;
        the REST API lists forkd's snapshots over the pod's bus and the
        node's record in etcd is ready, with the advertised URL;
      - front.yaml's pod beside it: it answers /healthz, sees the node and
        lists its sandboxes;
      - forkd-rest-fleet.service and forkd-rest-front.service: ExecStart= as
        systemd expands it with units/*.env.example, the listen address and
        etcd moved here: the node's record appears, the front end answers.
      TAP lines without numbers ("ok - ...", "not ok - ...", "# ..."), which
      the caller numbers; exit status 77 (and the reason) when it cannot run.

Environment: FORKD_BUILD_DIR, FORKD_TOP.
"""

import base64
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

TOP = os.environ.get("FORKD_TOP") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("FORKD_BUILD_DIR") or os.path.join(TOP, "build")
K8S = os.path.join(TOP, "deploy", "kubernetes")
UNITS = os.path.join(TOP, "units")
sys.path.insert(0, os.path.join(TOP, "tests", "lib"))

PROGRAMS = {"forkd": os.path.join(BUILD, "src", "daemon", "forkd"),
            "forkd-rest": os.path.join(BUILD, "src", "rest", "forkd-rest")}
DOWNWARD = {"spec.nodeName": "test-node", "status.podIP": "127.0.0.1", "metadata.name": "forkd-test"}
failed = 0


def result(cond, what, detail=""):
    global failed
    print(("ok - " if cond else "not ok - ") + what, flush=True)
    if not cond:
        failed += 1
        for line in str(detail).splitlines():
            print("# " + line, flush=True)
    return cond


def containers(node):
    """Every container of every pod template under node, init containers first."""
    if isinstance(node, dict):
        for key in ("initContainers", "containers"):
            yield from node.get(key) or []
        for v in node.values():
            yield from containers(v)
    elif isinstance(node, list):
        for v in node:
            yield from containers(v)


def argv(c):
    return [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]


def flags(files):
    for path in files:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                for c in containers(doc):
                    a = argv(c)
                    if a and os.path.basename(a[0]) in PROGRAMS:
                        for arg in a[1:]:
                            if arg.startswith("--"):
                                print(os.path.basename(a[0]), arg.split("=", 1)[0])
    return 0


def wait_for(what, cond, procs, timeout=20):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        for name, p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{name} exited with {p.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def get(url, token=None):
    """(status, JSON body), or (None, the error)."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=3) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, ValueError) as e:
        return None, str(e)


class Runner:
    """Processes started here, each in a process group of its own (setsid), logs in tmp."""

    def __init__(self, tmp):
        self.tmp, self.procs = tmp, []

    def start(self, name, args):
        prog = PROGRAMS.get(args[0]) or shutil.which(args[0])
        log = open(os.path.join(self.tmp, name + ".log"), "w")
        p = subprocess.Popen([prog] + args[1:], stdout=log, stderr=log, start_new_session=True,
                             env=dict(os.environ, FORKD_VMM=os.path.join(BUILD, "src", "vmm", "forkd-vmm")))
        log.close()
        self.procs.append((name, p))
        print(f"# {name}: {' '.join(args)}", flush=True)

    def logs(self):
        out = ""
        for name, _ in self.procs:
            with open(os.path.join(self.tmp, name + ".log")) as f:
                out += f"--- {name}.log ---\n" + f.read()[-1500:] + "\n"
        return out

    def stop(self):
        for _, p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        self.procs = []


def record(cluster, name, ready=None):
    """The record of node name in etcd (with "ready" as asked), or None."""
    key = base64.b64encode(f"/forkd/nodes/{name}".encode()).decode()
    for kv in cluster.call("/v3/kv/range", {"key": key}).get("kvs", []):
        rec = json.loads(base64.b64decode(kv["value"]))
        if ready is None or rec.get("ready") is ready:
            return rec
    return None


def pod(run, doc, configmaps, port, etcd, tmp, token=None):
    """Starts the containers of doc's pod template as described in the module's help, with
    token (a fresh one by default) in its Secret; the token."""
    spec = doc["spec"]["template"]["spec"]
    moves = {}
    for c in spec["containers"]:
        for m in c.get("volumeMounts") or []:
            moves[m["mountPath"]] = os.path.join(tmp, m["name"])
    pattern = re.compile("|".join(re.escape(p) for p in sorted(moves, key=len, reverse=True)) +
                         r"(?=/|$|[^A-Za-z0-9._-])")

    def move(s):
        return pattern.sub(lambda m: moves[m.group(0)], s)

    token = token or secrets.token_hex(16)
    for v in spec["volumes"]:
        d = os.path.join(tmp, v["name"])
        os.makedirs(d, mode=0o700)
        if "configMap" in v:
            for key, text in configmaps[v["configMap"]["name"]].items():
                with open(os.path.join(d, key), "w") as f:
                    f.write(move(text))
        elif "secret" in v:
            with open(os.path.join(d, "token"), "w") as f:
                f.write(token + "\n")
            os.chmod(os.path.join(d, "token"), v["secret"].get("defaultMode", 0o400))
    for c in spec["containers"]:
        env = {e["name"]: DOWNWARD[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in c.get("env") or []}
        args = []
        for a in argv(c):
            a = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], move(a))
            a = a.replace("0.0.0.0:", "127.0.0.1:").replace(":8889", f":{port}")
            args.append("--fleet-etcd=" + etcd if a.startswith("--fleet-etcd=") else a)
        if args[0] == "forkd-rest" and "/var/lib/forkd-rest" in moves and "--fleet-front" not in args:
            args.append("--state-dir=" + moves["/var/lib/forkd-rest"])  # its default, mounted there
        run.start(f"{os.path.basename(tmp)}-{c['name']}", args)
        if args[0] == "dbus-daemon":
            wait_for("the pod's bus", lambda: any(os.path.exists(os.path.join(d, "system_bus_socket"))
                                                  for d in moves.values()), run.procs)
    return token


def unit_argv(unit, env_example, creds, port, etcd):
    """ExecStart= of unit as systemd expands it with the settings of env_example."""
    env = {"CREDENTIALS_DIRECTORY": creds}
    with open(os.path.join(UNITS, env_example)) as f:
        for line in f:
            m = re.match(r'^([A-Z_]+)="?(.*?)"?$', line.rstrip("\n"))
            if m:
                env[m.group(1)] = m.group(2)
    with open(os.path.join(UNITS, unit)) as f:
        line = next(ln for ln in f if ln.startswith("ExecStart="))
    args = []
    for w in line[len("ExecStart="):].split():
        if re.fullmatch(r"\$\w+", w):
            args += env[w[1:]].split()
        else:
            args.append(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], w))
    args[0] = os.path.basename(args[0])
    for i in range(1, len(args)):
        if args[i - 1] == "--listen":
            args[i] = f"127.0.0.1:{port}"
        elif args[i - 1] == "--fleet-etcd":
            args[i] = etcd
    return args, env


def run_all():
    from etcdcluster import ETCD, Cluster, free_ports

    if os.geteuid() != 0:
        print("needs root: on the pod's bus forkd admits root only")
        return 77
    for what, path in [("etcd (etcd-server)", ETCD), ("dbus-daemon", shutil.which("dbus-daemon") or "")]:
        if not os.path.exists(path):
            print(f"{what} is not installed: tools/install-deps installs it")
            return 77
    docs = []
    for name in ("node.yaml", "front.yaml"):
        with open(os.path.join(K8S, name)) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    node = next(d for d in docs if d["kind"] == "DaemonSet")
    front = next(d for d in docs if d["kind"] == "Deployment")
    tmp = tempfile.mkdtemp(prefix="forkd-deploy-")
    run = Runner(tmp)
    cluster = Cluster(tmp, n=1)
    try:
        cluster.start()
        node_port, front_port, unit_port, unit_front_port = free_ports(4)
        node_url, front_url = f"http://127.0.0.1:{node_port}", f"http://127.0.0.1:{front_port}"

        token = pod(run, node, configmaps, node_port, cluster.endpoints, os.path.join(tmp, "node"))
        try:
            wait_for("GET /v1/snapshots", lambda: get(node_url + "/v1/snapshots", token)[0] == 200, run.procs)
            result(True, "node.yaml's pod: forkd-rest lists forkd's snapshots over the pod's bus")
            rec = wait_for("the record of test-node, ready", lambda: record(cluster, "test-node", True), run.procs)
            result(rec.get("url") == node_url, f"node.yaml's pod: the record of test-node is ready, url {node_url}",
                   json.dumps(rec))
        except AssertionError as e:
            result(False, "node.yaml's pod: forkd-rest lists forkd's snapshots, its record is in etcd",
                   f"{e}\n{run.logs()}")

        # The front end takes the same Secret as the nodes.
        pod(run, front, configmaps, front_port, cluster.endpoints, os.path.join(tmp, "front"), token)
        try:
            def healthz():
                status, body = get(front_url + "/healthz")
                return status == 200 and (not isinstance(body, dict) or body.get("nodes", 1) >= 1)
            wait_for("the front end's /healthz with the node", healthz, run.procs)
            status, body = get(front_url + "/v1/sandboxes", token)
            result(status == 200 and isinstance(body, list),
                   "front.yaml's pod: /healthz sees the node; GET /v1/sandboxes answers through it",
                   f"{status} {body}")
        except AssertionError as e:
            result(False, "front.yaml's pod: /healthz answers and sees the node", f"{e}\n{run.logs()}")
        run.stop()

        # The units, as systemd would start them with the examples' settings.
        creds = os.path.join(tmp, "credentials")
        os.makedirs(creds, mode=0o700)
        with open(os.open(os.path.join(creds, "token"), os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(token + "\n")
        args, env = unit_argv("forkd-rest-fleet.service", "fleet.env.example", creds, unit_port, cluster.endpoints)
        # (--state-dir: the unit's StateDirectory=, here.)
        run.start("forkd-rest-fleet", args + ["--state-dir=" + os.path.join(tmp, "rest-state")])
        try:
            rec = wait_for(f"the record of {env['FORKD_FLEET_NODE']}", lambda: record(cluster, env["FORKD_FLEET_NODE"]),
                           run.procs)
            result(rec.get("url") == env["FORKD_FLEET_ADVERTISE"],
                   f"forkd-rest-fleet.service with fleet.env.example: the record of {env['FORKD_FLEET_NODE']} "
                   f"is in etcd, url {env['FORKD_FLEET_ADVERTISE']}", json.dumps(rec))
        except AssertionError as e:
            result(False, "forkd-rest-fleet.service with fleet.env.example: its record is in etcd",
                   f"{e}\n{run.logs()}")
        run.stop()
        args, env = unit_argv("forkd-rest-front.service", "fleet-front.env.example", creds, unit_front_port,
                              cluster.endpoints)
        run.start("forkd-rest-front", args)
        try:
            wait_for("/healthz", lambda: get(f"http://127.0.0.1:{unit_front_port}/healthz")[0] == 200, run.procs)
            result(True, "forkd-rest-front.service with fleet-front.env.example: /healthz answers")
        except AssertionError as e:
            result(False, "forkd-rest-front.service with fleet-front.env.example: /healthz answers",
                   f"{e}\n{run.logs()}")
    except (AssertionError, OSError, KeyError, StopIteration) as e:
        result(False, "the pods and units ran", f"{type(e).__name__}: {e}\n{run.logs()}")
    finally:
        run.stop()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "flags":
        sys.exit(flags(sys.argv[2:]))
    if len(sys.argv) == 2 and sys.argv[1] == "run":
        sys.exit(run_all())
    sys.exit(__doc__)
