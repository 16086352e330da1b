#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""forkd's networking arguments, refused before any VM is needed (no /dev/kvm).

A private dbus-daemon and the real forkd over a state directory holding two
hand-written snapshots, "plain" (no NIC) and "nic" (snapshot.json network and
agent_tcp true; the files are sparse, nothing restores them): SnapshotInfo
shows network and agent_tcp; Fork refuses a network policy on a snapshot
without NIC, per_child_netns on one with a NIC, an unknown policy and a wrong
type; CreateSnapshotFromFds refuses agent_tcp without network; ExposePort is on
the Manager and answers NoSuchSandbox for an unknown id; a sandbox record of a
killed forkd naming a namespace is cleaned at start without harm. forkd-rest
answers a fork's bad options (timeout_secs, on_timeout, memory_limit_mib,
network) in exactly forkd's words. As root it
runs in a mount and network namespace of its own (forkd cleans namespaces).

Environment: FORKD, FORKD_VMM (the built forkd and forkd-vmm; the latter never runs). TAP output."""

import json
import os
import socket
import urllib.error
import urllib.request
import shutil
import subprocess
import sys
import tempfile
import time

from dbusmini import Bus, DBusError
from tap import Tap, skip_all

FORKD = os.environ.get("FORKD", "")
VMM = os.environ.get("FORKD_VMM", "")
REST = os.environ.get("FORKD_REST", "")
DEST, PATH, IFACE = "org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager"
INVALID = "org.freedesktop.DBus.Error.InvalidArgs"
tap = Tap(detail_prefix="# ", detail_lines=20)
ok = tap.ok


def write_snapshot(snapdir, tag, network, agent_tcp):
    d = os.path.join(snapdir, tag)
    os.makedirs(d)
    mem, disk = 2 << 20, 1 << 20
    meta = {
        "format": 1, "tag": tag, "created_at_unix": 1700000000, "mem_size": mem, "vcpus": 1,
        "generation": 0, "memory_file": "memory.bin", "vmstate_file": "vmstate.bin", "disk_file": "disk.img",
        "disk_size": disk, "kernel": "/boot/vmlinuz", "guest": "linux", "parent_tag": None,
        "parent_content_hash": None,
    }
    if network:
        meta["network"] = True
    if agent_tcp:
        meta["agent_tcp"] = True
    with open(os.path.join(d, "snapshot.json"), "w") as f:
        json.dump(meta, f)
    for name, size in (("memory.bin", mem), ("vmstate.bin", 64), ("disk.img", disk)):
        with open(os.path.join(d, name), "wb") as f:
            f.truncate(size)


def http(port, method, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def rest_checks(tmp, address):
    """forkd-rest's side: the ports route and the new body fields."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(os.path.join(tmp, "rest.log"), "w")
    rest = subprocess.Popen([REST, "--listen", f"127.0.0.1:{port}", "--bus-address", address, "--no-direct"],
                            stdout=log, stderr=log)
    log.close()
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if rest.poll() is not None or time.monotonic() > deadline:
                    ok(False, "forkd-rest starts")
                    return
                time.sleep(0.05)
        for bad in (0, 65536, -1, "80", None, 1.5):
            st, text = http(port, "POST", "/v1/sandboxes/sb-nope-0000/ports", {"port": bad})
            ok(st == 400, f"REST ports: port {bad!r} is 400", f"{st} {text}")
        st, text = http(port, "GET", "/metrics", None)
        ok(st == 200 and "# TYPE forkd_fork_duration_seconds histogram" in text
           and 'forkd_agent_call_duration_seconds_bucket{le="+Inf"} 0' in text
           and "forkd_sandboxes_cpu_seconds 0" in text and "forkd_sandbox_cpu_seconds_total" not in text,
           "REST /metrics: forkd's histograms and totals, no series per sandbox", f"{st} {text[-1500:]}")
        st, text = http(port, "GET", "/v1/sandboxes?usage=false", None)
        ok(st == 200 and json.loads(text) == [], "REST GET /v1/sandboxes?usage=false", f"{st} {text}")
        st, text = http(port, "GET", "/v1/sandboxes?usage=sometimes", None)
        ok(st == 400, "REST GET /v1/sandboxes?usage=sometimes is 400", f"{st} {text}")
        st, text = http(port, "POST", "/v1/sandboxes/sb-nope-0000/ports", {"port": 8080})
        ok(st == 404, "REST ports: an unknown sandbox is 404", f"{st} {text}")
        st, text = http(port, "POST", "/v1/sandboxes", {"snapshot_tag": "plain", "n": 1, "network": "egress"})
        ok(st == 400 and "no NIC" in text, "REST fork: network on a snapshot without NIC is 400", f"{st} {text}")
        st, text = http(port, "POST", "/v1/sandboxes", {"snapshot_tag": "nic", "n": 1, "network": 7})
        ok(st == 400, "REST fork: a network that is not a string is 400", f"{st} {text}")
        # A fork's options: forkd-rest checks its body's fields with forkd's own checks
        # (src/shared/fork-options.c), so both answer in the same words, compared here.
        bus = Bus(address)
        for body, opts in (({"timeout_secs": 0}, {"timeout_secs": ("u", 0)}),
                           ({"timeout_secs": 86401}, {"timeout_secs": ("u", 86401)}),
                           ({"timeout_secs": 5, "on_timeout": "later"},
                            {"timeout_secs": ("u", 5), "on_timeout": ("s", "later")}),
                           ({"on_timeout": "kill"}, {"on_timeout": ("s", "kill")}),
                           ({"memory_limit_mib": 8}, {"memory_limit_mib": ("u", 8)}),
                           ({"network": "open"}, {"network": ("s", "open")})):
            st, text = http(port, "POST", "/v1/sandboxes", dict({"snapshot_tag": "nic", "n": 1}, **body))
            try:
                bus.call(DEST, PATH, IFACE, "Fork", "sua{sv}", ["nic", 1, opts])
                words = "Fork succeeded"
            except DBusError as e:
                words = e.message if e.name == INVALID else f"{e.name}: {e.message}"
            try:
                answer = json.loads(text)
            except ValueError:
                answer = text
            ok(st == 400 and answer == {"error": words}, f"fork option {body}: forkd-rest and forkd say {words!r}",
               f"REST {st} {text}; D-Bus {words}")
        bus.close()
        base = {"tag": "t2", "kernel": "/dev/null", "rootfs": "/dev/null"}
        st, text = http(port, "POST", "/v1/snapshots", dict(base, agent_tcp=True))
        ok(st == 400 and "agent_tcp" in text, "REST snapshot create: agent_tcp without network is 400",
           f"{st} {text}")
        for tap in (5, [], {}):
            st, text = http(port, "POST", "/v1/snapshots", dict(base, tap=tap))
            ok(st == 400 and "tap" in text, f"REST snapshot create: tap {tap!r} is 400", f"{st} {text}")
        st, text = http(port, "POST", "/v1/snapshots", dict(base, tap="x" * 64))
        ok(st == 400 and "tap" in text, "REST snapshot create: a tap of 64 bytes is 400", f"{st} {text}")
        # "tap" is accepted but gives no NIC yet (docs/rest-api.md): with it, agent_tcp is still
        # refused for want of "network": true.
        for tap in ("tap0", True):
            st, text = http(port, "POST", "/v1/snapshots", dict(base, tap=tap, agent_tcp=True))
            ok(st == 400 and "agent_tcp" in text, f"REST snapshot create: tap {tap!r} does not mean network yet",
               f"{st} {text}")
    finally:
        rest.terminate()
        rest.wait()


def expect_error(bus, name, member, sig, args, text=""):
    try:
        bus.call(DEST, PATH, IFACE, member, sig, args)
    except DBusError as e:
        return e.name == name and text in e.message, f"{e.name}: {e.message}"
    return False, "succeeded"


def main():
    if not FORKD or not os.access(FORKD, os.X_OK) or not VMM or not os.access(VMM, os.X_OK):
        skip_all("FORKD and FORKD_VMM are not set to the built forkd and forkd-vmm")
    if shutil.which("dbus-daemon") is None:
        skip_all("dbus-daemon not installed")
    tmp = tempfile.mkdtemp(prefix="forkd-net-args-")
    os.chmod(tmp, 0o755)
    state = os.path.join(tmp, "state")
    os.makedirs(os.path.join(state, "snapshots"))
    os.makedirs(os.path.join(state, "sandboxes"))
    write_snapshot(os.path.join(state, "snapshots"), "plain", False, False)
    write_snapshot(os.path.join(state, "snapshots"), "nic", True, True)
    # A record a killed forkd left, naming a namespace of its own that is gone.
    with open(os.path.join(state, "sandboxes", "sb-abcdef-0000.json"), "w") as f:
        json.dump({"id": "sb-abcdef-0000", "snapshot_tag": "nic", "created_at_unix": 1700000000,
                   "memory_limit_mib": 0, "owner_uid": 0, "cgroup": False, "netns": "forkd-child-4093"}, f)

    sock = os.path.join(tmp, "bus.sock")
    conf = os.path.join(tmp, "bus.conf")
    with open(conf, "w") as f:
        f.write(f"""<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={sock}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
""")
    busd = subprocess.Popen(["dbus-daemon", "--config-file=" + conf, "--nofork", "--nopidfile", "--print-address=1"],
                            stdout=subprocess.PIPE, text=True)
    forkd = None
    log = os.path.join(tmp, "forkd.log")
    try:
        address = busd.stdout.readline().strip()
        bus = Bus(address)
        bus.add_match(f"type='signal',sender='{DEST}',interface='{IFACE}'")
        with open(log, "w") as lf:
            forkd = subprocess.Popen([FORKD, "--bus-address", address, "--state-dir", state, "--no-confine",
                                      "--vmm", VMM], stdout=lf, stderr=lf)
        deadline = time.monotonic() + 20
        while not bus.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "NameHasOwner",
                           "s", [DEST])[0]:
            if forkd.poll() is not None or time.monotonic() > deadline:
                with open(log) as f:
                    ok(False, "forkd starts without /dev/kvm", f.read())
                return
            time.sleep(0.05)
        ok(True, "forkd starts over the hand-written snapshots")

        plain = bus.call(DEST, PATH, IFACE, "GetSnapshotInfo", "s", ["plain"])[0]
        nic = bus.call(DEST, PATH, IFACE, "GetSnapshotInfo", "s", ["nic"])[0]
        ok(plain.get("network") is False and plain.get("agent_tcp") is False,
           "SnapshotInfo of a snapshot without NIC: network false, agent_tcp false", plain)
        ok(nic.get("network") is True and nic.get("agent_tcp") is True,
           "SnapshotInfo of a snapshot made with network and agent_tcp: both true", nic)

        good, why = expect_error(bus, INVALID, "Fork", "sua{sv}", ["plain", 1, {"network": ("s", "egress")}],
                                 "has no NIC")
        ok(good, "Fork: a network policy on a snapshot without NIC is InvalidArgs naming the fix", why)
        good, why = expect_error(bus, INVALID, "Fork", "sua{sv}", ["plain", 1, {"network": ("s", "none")}],
                                 "network")
        ok(good, "Fork: network none on a snapshot without NIC too", why)
        good, why = expect_error(bus, INVALID, "Fork", "sua{sv}", ["nic", 1, {"per_child_netns": ("b", False),
                                                                            "network": ("s", "sideways")}],
                                 "none")
        ok(good, "Fork: an unknown policy is InvalidArgs", why)
        good, why = expect_error(bus, INVALID, "Fork", "sua{sv}", ["nic", 1, {"network": ("b", True)}], "type s")
        ok(good, "Fork: network of type b is InvalidArgs", why)
        good, why = expect_error(bus, INVALID, "Fork", "sua{sv}", ["nic", 1, {"per_child_netns": ("b", True)}],
                                 "per_child_netns")
        ok(good, "Fork: per_child_netns with a NIC snapshot is InvalidArgs, saying why", why)

        try:
            fdbus = Bus(address, unix_fds=True)
            with open("/dev/null", "rb") as k, open("/dev/null", "rb") as r:
                try:
                    fdbus.call(DEST, PATH, IFACE, "CreateSnapshotFromFds", "shhuua{sv}",
                               ["t1", 0, 1, 0, 30, {"agent_tcp": ("b", True)}], fds=[k.fileno(), r.fileno()])
                    good, why = False, "succeeded"
                except DBusError as e:
                    good, why = e.name == INVALID and "needs network" in e.message, f"{e.name}: {e.message}"
            fdbus.close()
        except (OSError, RuntimeError) as e:
            good, why = False, repr(e)
        ok(good, "CreateSnapshotFromFds: agent_tcp without network is InvalidArgs", why)

        good, why = expect_error(bus, "org.forkd.Error.NoSuchSandbox", "ExposePort", "sq", ["sb-nope-0000", 8080])
        ok(good, "ExposePort on the Manager: an unknown sandbox is NoSuchSandbox", why)

        intro = bus.call(DEST, PATH, "org.freedesktop.DBus.Introspectable", "Introspect")[0]
        ok('<method name="ExposePort">' in intro and 'name="port"' in intro, "the Manager introspects ExposePort",
           intro[-400:])

        # usage and metrics, without any sandbox: the reply's shapes
        m = bus.call(DEST, PATH, IFACE, "GetMetrics")[0]
        ok(m.get("sandboxes") == 0 and m.get("cpu_usec") == 0 and
           all(len(m[h][1]) == len(m[h][0]) + 1 and m[h][3] == 0 and not any(m[h][1])
               for h in ("fork_latency_usec", "branch_pause_usec", "agent_call_usec")),
           "GetMetrics: no sandboxes, three empty histograms (bounds, cumulative counts, sum, count)", m)
        ok(bus.call(DEST, PATH, IFACE, "ListSandboxesEx", "a{sv}", [{"usage": ("b", False)}])[0] == [],
           "ListSandboxesEx usage false: no sandboxes")
        good, why = expect_error(bus, INVALID, "ListSandboxesEx", "a{sv}", [{"usages": ("b", False)}], "usages")
        ok(good, "ListSandboxesEx: an unknown option is InvalidArgs", why)

        if REST and os.access(REST, os.X_OK):
            rest_checks(tmp, address)

        left = os.listdir(os.path.join(state, "sandboxes"))
        ok(forkd.poll() is None and "sb-abcdef-0000.json" not in left,
           "a record naming a namespace is cleaned at start, forkd still runs", left)
    finally:
        if forkd and forkd.poll() is None:
            forkd.terminate()
            try:
                forkd.wait(20)
            except subprocess.TimeoutExpired:
                forkd.kill()
                forkd.wait()
            with open(log, errors="replace") as f:
                text = f.read()
            ok(forkd.returncode == 0 and "Sanitizer" not in text and "runtime error" not in text,
               f"forkd stops cleanly (exit {forkd.returncode}), no sanitizer report", text[-3000:])
        busd.terminate()
        busd.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return tap.done()


def outer():
    """As root, forkd removes the namespaces and fkd* links a previous forkd
    left (netns_cleanup_leftovers()): so it runs in a mount and network
    namespace of its own, with a tmpfs on /run, and touches nothing of the host."""
    if os.geteuid() != 0 or os.environ.get("NET_ARGS_INNER") == "1":
        if os.geteuid() == 0:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run"], check=True)
            subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
        return main()
    if shutil.which("unshare") is None:
        skip_all("needs unshare(1) to keep forkd's namespace cleanup off the host")
    os.environ["NET_ARGS_INNER"] = "1"
    os.execvp("unshare", ["unshare", "-m", "-n", "--propagation", "private", "--", sys.executable,
                          os.path.abspath(__file__)])


if __name__ == "__main__":
    sys.exit(outer())
