#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""PushSnapshot and PullSnapshot without a VM (no /dev/kvm): a private
dbus-daemon, the real forkd over a state directory holding a hand-written
chain of four links (sparse memory files, each child's parent_content_hash the
SHA-256 of its parent's memory), and Debian's docker-registry on loopback.

The chain is pushed (twice: the second sends no blob), deleted, pulled back
with its files, their hashes and their holes; pulled again with the base here
(only the missing link is fetched); pulled under a new tag; refused with
nothing registered when a blob in the registry's storage is changed, when an
ancestor here has other content, when the registry is not configured, and when
the reference is no forkd snapshot.

Environment: FORKD, FORKD_VMM (never runs). TAP output."""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from dbusmini import Bus, DBusError
from ociregistry import Registry, free_port, binary as registry_binary
from tap import Tap, skip_all

FORKD = os.environ.get("FORKD", "")
VMM = os.environ.get("FORKD_VMM", "")
REST = os.environ.get("FORKD_REST", "")
FORKCTL = os.environ.get("FORKCTL", "")
DEST, PATH, IFACE = "org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager"
INVALID = "org.freedesktop.DBus.Error.InvalidArgs"
EXISTS = "org.forkd.Error.SnapshotExists"
tap = Tap(detail_prefix="# ", detail_lines=20)
ok = tap.ok
MEM = 8 << 20


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_link(snapdir, tag, parent, marker):
    """A link whose memory holds a few pages of data in 8 MiB of holes."""
    d = os.path.join(snapdir, tag)
    os.makedirs(d)
    mem = os.path.join(d, "memory.bin")
    with open(mem, "wb") as f:
        f.truncate(MEM)
        for k, off in enumerate((0, 3 << 20, MEM - 4096)):
            f.seek(off)
            f.write((marker * 4096)[:4096 - k])
    with open(os.path.join(d, "vmstate.bin"), "wb") as f:
        f.write(marker * 50)
    with open(os.path.join(d, "disk.img"), "wb") as f:
        f.truncate(1 << 20)
    meta = {
        "format": 1, "tag": tag, "created_at_unix": 1700000000, "mem_size": MEM, "vcpus": 1,
        "generation": 0, "memory_file": "memory.bin", "vmstate_file": "vmstate.bin", "disk_file": "disk.img",
        "disk_size": 1 << 20, "kernel": "/boot/vmlinuz", "guest": "linux",
        "parent_tag": parent, "parent_content_hash": None,
    }
    if parent:
        meta["parent_content_hash"] = sha256_file(os.path.join(snapdir, parent, "memory.bin"))
    with open(os.path.join(d, "snapshot.json"), "w") as f:
        json.dump(meta, f)


def http(port, method, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def rest_checks(tmp, address, bus, ref):
    """forkd-rest's push and pull routes, with forkd's errors as statuses."""
    port = free_port()
    with open(os.path.join(tmp, "rest.log"), "w") as log:
        rest = subprocess.Popen([REST, "--listen", f"127.0.0.1:{port}", "--bus-address", address, "--no-direct"],
                                stdout=log, stderr=log)
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
        st, text = http(port, "POST", "/v1/snapshots/l1/push", {"ref": ref.replace(":v1", ":rest")})
        body = json.loads(text) if st == 200 else {}
        ok(st == 200 and body.get("links") == 2 and body.get("digest", "").startswith("sha256:"),
           "REST push: 200 with digest, bytes_sent, blobs_sent, links", f"{st} {text}")
        st, text = http(port, "POST", "/v1/snapshots/pull", {"ref": ref.replace(":v1", ":rest"), "tag": "l1-rest"})
        body = json.loads(text) if st == 201 else []
        ok(st == 201 and [b["tag"] for b in body] == ["l1-rest"], "REST pull: 201 [SnapshotInfo] under the new tag",
           f"{st} {text}")
        st, text = http(port, "POST", "/v1/snapshots/pull", {"ref": ref.replace(":v1", ":rest"), "tag": "l1-rest"})
        ok(st == 409, "REST pull: a taken tag is 409", f"{st} {text}")
        st, text = http(port, "POST", "/v1/snapshots/pull", {"ref": "127.0.0.2:1/x/y:z"})
        ok(st == 400 and "not configured" in text, "REST pull: a registry not configured is 400", f"{st} {text}")
        st, text = http(port, "POST", "/v1/snapshots/l1/push", {})
        ok(st == 400, "REST push: no ref is 400", f"{st} {text}")
        st, text = http(port, "POST", "/v1/snapshots/nope/push", {"ref": ref})
        ok(st == 404, "REST push: an unknown tag is 404", f"{st} {text}")
    finally:
        rest.terminate()
        rest.wait(timeout=10)


def expect_error(bus, name, member, sig, args, text=""):
    try:
        bus.call(DEST, PATH, IFACE, member, sig, args, 120)
    except DBusError as e:
        return e.name == name and text in e.message, f"{e.name}: {e.message}"
    return False, "succeeded"


def main():
    if not FORKD or not os.access(FORKD, os.X_OK) or not VMM or not os.access(VMM, os.X_OK):
        skip_all("FORKD and FORKD_VMM are not set to the built forkd and forkd-vmm")
    for t in ("dbus-daemon", "docker-registry"):
        if (shutil.which(t) if t == "dbus-daemon" else registry_binary()) is None:
            if os.environ.get("CI") and t == "docker-registry":
                tap.bail(f"{t} not installed (tools/install-deps installs it)")
            skip_all(f"{t} not installed")
    tmp = tempfile.mkdtemp(prefix="forkd-push-pull-")
    os.chmod(tmp, 0o755)
    state = os.path.join(tmp, "state")
    snapdir = os.path.join(state, "snapshots")
    os.makedirs(snapdir)
    for tag, parent, marker in (("base", None, b"B"), ("l1", "base", b"1"), ("l2", "l1", b"2"), ("l3", "l2", b"3")):
        write_link(snapdir, tag, parent, marker)
    want = {t: {n: sha256_file(os.path.join(snapdir, t, n)) for n in ("memory.bin", "vmstate.bin", "disk.img")}
            for t in ("base", "l1", "l2", "l3")}
    reg = Registry(tmp)
    config = os.path.join(tmp, "registries.json")
    with open(config, "w") as f:
        json.dump({"registries": [{"host": reg.host, "insecure_http": True}]}, f)

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
        with open(log, "w") as lf:
            forkd = subprocess.Popen([FORKD, "--bus-address", address, "--state-dir", state, "--no-confine",
                                      "--vmm", VMM, "--registry-config", config], stdout=lf, stderr=lf)
        deadline = time.monotonic() + 20
        while not bus.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "NameHasOwner",
                           "s", [DEST])[0]:
            if forkd.poll() is not None or time.monotonic() > deadline:
                with open(log) as f:
                    ok(False, "forkd starts with --registry-config", f.read())
                return
            time.sleep(0.05)
        ok(True, "forkd starts over the hand-written chain with --registry-config")

        def call(member, sig, args):
            return bus.call(DEST, PATH, IFACE, member, sig, args, 120)

        def tags():
            return sorted(s["tag"] for s in call("ListSnapshots", "", [])[0])

        def no_trace():
            return [d for d in os.listdir(snapdir) if d.startswith(".")]

        ref = f"{reg.host}/forkd/chain:v1"
        res = call("PushSnapshot", "ssa{sv}", ["l3", ref, {}])[0]
        # 4 configs, 4 memory and 4 vmstate files, and the disk.img all links share, stored once.
        ok(res.get("links") == 4 and res.get("blobs_sent") == 13 and res["digest"].startswith("sha256:")
           and res.get("bytes_sent", 0) > 0, "PushSnapshot: four links, each distinct blob once, the head's digest",
           res)
        ok(res.get("bytes_sent", 1 << 30) < 4 * MEM, "the holes of the memory files are not sent", res)
        with urllib.request.urlopen(urllib.request.Request(
                f"http://{reg.host}/v2/forkd/chain/manifests/v1",
                headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})) as r:
            head = json.loads(r.read())
        ok(head.get("artifactType") == "application/vnd.forkd.snapshot.v1"
           and head["config"]["mediaType"] == "application/vnd.forkd.snapshot.config.v1+json"
           and head["annotations"].get("org.forkd.tag") == "l3"
           and head["annotations"].get("org.forkd.parent", "").startswith("sha256:")
           and sorted(y["annotations"]["org.opencontainers.image.title"] for y in head["layers"])
           == ["disk.img", "memory.bin", "vmstate.bin"], "the head's manifest: our artifact, tag, parent, one layer per file",
           head)
        again = call("PushSnapshot", "ssa{sv}", ["l3", ref, {}])[0]
        ok(again.get("blobs_sent") == 0 and again["digest"] == res["digest"],
           "a second push sends no blob and gives the same digest", again)

        for t in ("l3", "l2", "l1", "base"):
            call("DeleteSnapshot", "sbb", [t, False, False])
        pulled = call("PullSnapshot", "ssa{sv}", [ref, "", {}])[0]
        ok([p["tag"] for p in pulled] == ["base", "l1", "l2", "l3"] and tags() == ["base", "l1", "l2", "l3"],
           "PullSnapshot registers the chain, root first", pulled)
        same = all(sha256_file(os.path.join(snapdir, t, n)) == h for t in want for n, h in want[t].items())
        ok(same, "every pulled file has its content")
        st = os.stat(os.path.join(snapdir, "l3", "memory.bin"))
        ok(st.st_size == MEM and st.st_blocks * 512 < MEM // 4, "a pulled memory file is sparse again",
           (st.st_size, st.st_blocks))
        ok(not no_trace(), "no staging directory is left", no_trace())

        call("DeleteSnapshot", "sbb", ["l3", False, False])
        before = reg.blob_gets()
        pulled = call("PullSnapshot", "ssa{sv}", [ref, "", {}])[0]
        gets = reg.blob_gets() - before
        ok([p["tag"] for p in pulled] == ["l3"], "with the base here, only the missing link is registered", pulled)
        ok(gets == 4, "and only its blobs are fetched (config and three files)", gets)

        pulled = call("PullSnapshot", "ssa{sv}", [ref, "copy", {}])[0]
        ok([p["tag"] for p in pulled] == ["copy"] and pulled[0].get("parent_tag") == "l2",
           "a pull under a new tag registers the head under it, on the base here", pulled)
        good, why = expect_error(bus, EXISTS, "PullSnapshot", "ssa{sv}", [ref, "", {}], "l3")
        ok(good, "a pull whose head exists is SnapshotExists", why)

        # A changed blob in the registry's storage: refused, nothing registered.
        call("DeleteSnapshot", "sbb", ["l3", False, False])
        mem = [y for y in head["layers"] if y["annotations"]["org.opencontainers.image.title"] == "memory.bin"][0]
        path = reg.blob_path(mem["digest"])
        with open(path, "r+b") as f:
            f.seek(40)
            c = f.read(1)
            f.seek(40)
            f.write(bytes([c[0] ^ 0xff]))
        good, why = expect_error(bus, INVALID, "PullSnapshot", "ssa{sv}", [ref, "", {}], "digest")
        ok(good, "a changed blob is refused", why)
        ok("l3" not in tags() and not os.path.exists(os.path.join(snapdir, "l3")) and not no_trace(),
           "and nothing of it is registered or left", (tags(), no_trace()))
        with open(path, "r+b") as f:
            f.seek(40)
            f.write(c)

        # An ancestor here under the same tag with other content.
        call("DeleteSnapshot", "sbb", ["copy", False, False])
        call("DeleteSnapshot", "sbb", ["l2", False, False])
        forkd_stop = forkd
        forkd_stop.terminate()
        forkd_stop.wait(timeout=20)
        write_link(snapdir, "l2", "l1", b"X")
        with open(log, "a") as lf:
            forkd = subprocess.Popen([FORKD, "--bus-address", address, "--state-dir", state, "--no-confine",
                                      "--vmm", VMM, "--registry-config", config], stdout=lf, stderr=lf)
        deadline = time.monotonic() + 20
        while not bus.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "NameHasOwner",
                           "s", [DEST])[0]:
            assert forkd.poll() is None and time.monotonic() < deadline, open(log).read()
            time.sleep(0.05)
        good, why = expect_error(bus, EXISTS, "PullSnapshot", "ssa{sv}", [ref, "", {}], "other content")
        ok(good, "an ancestor here with other content is SnapshotExists", why)
        ok("l3" not in tags() and not no_trace(), "and nothing is registered", tags())

        good, why = expect_error(bus, INVALID, "PullSnapshot", "ssa{sv}", ["127.0.0.2:1/forkd/chain:v1", "", {}],
                                 "not configured")
        ok(good, "a registry not configured is InvalidArgs", why)
        good, why = expect_error(bus, INVALID, "PushSnapshot", "ssa{sv}", ["l1", "no-such-registry.example/x:y", {}],
                                 "not configured")
        ok(good, "a push to a registry not configured is InvalidArgs", why)
        good, why = expect_error(bus, INVALID, "PushSnapshot", "ssa{sv}", ["l1", "Not A Ref", {}])
        ok(good, "a reference that does not parse is InvalidArgs", why)
        good, why = expect_error(bus, INVALID, "PushSnapshot", "ssa{sv}", ["l1", ref, {"x": ("b", True)}], "x")
        ok(good, "an unknown option is InvalidArgs", why)
        good, why = expect_error(bus, "org.forkd.Error.NoSuchSnapshot", "PullSnapshot", "ssa{sv}",
                                 [f"{reg.host}/forkd/chain:nope", "", {}])
        ok(good, "an unknown tag in the registry is NoSuchSnapshot", why)
        if REST and os.access(REST, os.X_OK):
            rest_checks(tmp, address, bus, ref)
        if FORKCTL and os.access(FORKCTL, os.X_OK):
            cref = ref.replace(":v1", ":ctl")
            p = subprocess.run([FORKCTL, "--bus-address", address, "--no-progress", "push", "l1", cref],
                               capture_output=True, text=True, timeout=120)
            ok(p.returncode == 0 and p.stdout.strip().startswith("sha256:"), "forkctl push prints the head's digest",
               (p.returncode, p.stdout, p.stderr))
            p = subprocess.run([FORKCTL, "--bus-address", address, "--no-progress", "--json", "pull", cref, "--tag",
                                "l1-ctl"], capture_output=True, text=True, timeout=120)
            ok(p.returncode == 0 and [s["tag"] for s in json.loads(p.stdout)["snapshots"]] == ["l1-ctl"],
               "forkctl pull --tag registers the head under it", (p.returncode, p.stdout, p.stderr))
            p = subprocess.run([FORKCTL, "--bus-address", address, "--no-progress", "pull", "127.0.0.2:1/x/y:z"],
                               capture_output=True, text=True, timeout=120)
            ok(p.returncode != 0 and "not configured" in p.stderr, "forkctl pull: a registry not configured fails",
               (p.returncode, p.stderr))
        ok(forkd.poll() is None, "forkd still runs")
    finally:
        if forkd and forkd.poll() is None:
            forkd.terminate()
            forkd.wait(timeout=20)
        busd.terminate()
        busd.wait(timeout=10)
        reg.stop()
        if os.environ.get("KEEP_TMP"):
            print(f"# kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return tap.done()


def outer():
    """As root, forkd removes the namespaces a previous forkd left: so it runs
    in a mount and network namespace of its own, with a tmpfs on /run, as
    test-net-args does."""
    if os.geteuid() != 0 or os.environ.get("PUSH_PULL_INNER") == "1":
        if os.geteuid() == 0:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run"], check=True)
            subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
        return main()
    if shutil.which("unshare") is None:
        skip_all("needs unshare(1) to keep forkd's namespace cleanup off the host")
    os.environ["PUSH_PULL_INNER"] = "1"
    os.execvp("unshare", ["unshare", "-m", "-n", "--propagation", "private", "--", sys.executable,
                          os.path.abspath(__file__)])


if __name__ == "__main__":
    sys.exit(outer())
