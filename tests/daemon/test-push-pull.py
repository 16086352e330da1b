#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
Push and pull (PushSnapshot, PullSnapshot) end to end on the real parts: a
private dbus-daemon, forkd, forkd-vmm on /dev/kvm, the test guest (the harness
of test-forkd.py), forkctl, and Debian's docker-registry on loopback. A diff
chain of three links (base <- l1 <- l2) is pushed, deleted, pulled and forked
from; pulled again with its base here (only the missing link's blobs are
fetched, by the registry's log); refused with nothing registered when a blob
in the registry's storage is changed; and a registry not configured is
refused.

Environment: FORKD, FORKD_VMM, FORKD_TEST_GUEST, FORKCTL.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tf = _load("test_forkd", "test-forkd.py")
tb = _load("test_branch", "test-branch.py")
tpf = _load("test_push_pull_files", "test-push-pull-files.py")  # its Registry
SCRATCH = tb.SCRATCH
FORKCTL = os.environ.get("FORKCTL")


def main():
    if not tf.FORKD or not tf.VMM or not tf.GUEST or not FORKCTL:
        print("Bail out! FORKD, FORKD_VMM, FORKD_TEST_GUEST and FORKCTL must be set")
        return 1
    if not tf.kvm_usable():
        tf.skip("/dev/kvm is not usable")
    if os.geteuid() != 0:
        tf.skip("needs root (the system-bus policy, /proc/<pid>/mem of the VMMs)")
    if tpf.registry_binary() is None:
        if os.environ.get("CI"):
            print("Bail out! docker-registry is not installed (tools/install-deps installs it)")
            return 1
        tf.skip("docker-registry is not installed")
    h = tf.Harness()
    reg = None
    try:
        reg = tpf.Registry(h.tmp)
        rc = run(h, reg)
        print(f"1..{h.n}")
        return rc
    finally:
        if reg:
            reg.stop()
        h.cleanup()


def run(h, reg):
    h.setup_cgroups()
    disk = os.path.join(h.tmp, "disk.img")
    with open(disk, "wb") as f:
        f.truncate(16 << 20)
    config = os.path.join(h.tmp, "registries.json")
    with open(config, "w") as f:
        json.dump({"registries": [{"host": reg.host, "insecure_http": True}]}, f)
    h.start_bus()
    h.start_forkd(extra=("--registry-config", config))
    snapdir = os.path.join(h.state, "snapshots")
    ref = f"{reg.host}/forkd/chain:v1"
    ctx = {}

    def forkctl(*args, ok=True):
        p = subprocess.run([FORKCTL, "--bus-address", h.address, "--no-progress", *args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        if ok:
            assert p.returncode == 0, (args, p.returncode, p.stderr)
        else:
            assert p.returncode != 0, (args, p.stdout)
        return p

    def tags():
        return sorted(s["tag"] for s in h.m("ListSnapshots")[0])

    def no_trace():
        left = [d for d in os.listdir(snapdir) if d.startswith(".")]
        assert not left, left

    def branch(sid, tag):
        return h.m("BranchSandbox", "sssb", [sid, tag, "diff", True], timeout=60)[0]

    def chain():
        h.m("CreateSnapshot", "sssuu", ["base", tf.GUEST, disk, 64, 30])
        p = h.fork("base", 1)[0]
        tb.poke(p["pid"], b"link-one")
        assert branch(p["id"], "l1")["parent_tag"] == "base"
        c = h.fork("l1", 1)[0]
        tb.poke(c["pid"], b"link-two", SCRATCH + 4096)
        assert branch(c["id"], "l2")["parent_tag"] == "l1"
        h.terminate_all()
        ctx["info"] = h.m("GetSnapshotInfo", "s", ["l2"])[0]
        assert ctx["info"]["parent_tag"] == "l1", ctx["info"]
    h.check("a diff chain base <- l1 <- l2", chain)

    def push():
        doc = json.loads(forkctl("--json", "push", "l2", ref).stdout)
        assert doc["links"] == 3 and doc["digest"].startswith("sha256:") and doc["blobs_sent"] >= 3 * 3, doc
        # Sparse: far less than three 64 MiB memory files.
        assert doc["bytes_sent"] < 3 * (64 << 20) // 2, doc
        again = h.m("PushSnapshot", "ssa{sv}", ["l2", ref, {}], timeout=300)[0]
        assert again["blobs_sent"] == 0 and again["digest"] == doc["digest"], again
        ctx["digest"] = doc["digest"]
    h.check("push sends the chain once; a second push sends no blob", push)

    def pull():
        for t in ("l2", "l1", "base"):
            forkctl("snapshot", "rm", t)
        assert tags() == [], tags()
        doc = json.loads(forkctl("--json", "pull", ref).stdout)
        assert [s["tag"] for s in doc["snapshots"]] == ["base", "l1", "l2"], doc
        assert tags() == ["base", "l1", "l2"], tags()
        no_trace()
        st = os.stat(os.path.join(snapdir, "l1", "memory.bin"))
        assert st.st_blocks * 512 < st.st_size // 4, (st.st_blocks, st.st_size)
        info = h.m("GetSnapshotInfo", "s", ["l2"])[0]
        assert info["parent_content_hash"] == ctx["info"]["parent_content_hash"], info
        c = h.fork("l2", 2)
        for ch in c:
            assert json.loads(h.m("Ping", "s", [ch["id"]])[0])["pong"]
            assert tb.peek(ch["pid"], 8) == b"link-one"
            assert tb.peek(ch["pid"], 8, SCRATCH + 4096) == b"link-two"
        h.terminate_all()
    h.check("pull registers the chain root first, sparse; a child of the head has every link's state", pull)

    def partial():
        forkctl("snapshot", "rm", "l2")
        before = reg.blob_gets()
        doc = json.loads(forkctl("--json", "pull", ref).stdout)
        assert [s["tag"] for s in doc["snapshots"]] == ["l2"], doc
        req = urllib.request.Request(f"http://{reg.host}/v2/forkd/chain/manifests/v1",
                                     headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            manifest = json.loads(r.read())
        ctx["head"] = manifest
        # l2's config and its files, nothing of base or l1.
        assert reg.blob_gets() - before == 1 + len(manifest["layers"]), (reg.blob_gets() - before, manifest)
        c = h.fork("l2", 1)[0]
        assert tb.peek(c["pid"], 8, SCRATCH + 4096) == b"link-two"
        h.terminate_all()
    h.check("a pull with the base here fetches only the missing link", partial)

    def tampered():
        forkctl("snapshot", "rm", "l2")
        mem = [y for y in ctx["head"]["layers"]
               if y["annotations"]["org.opencontainers.image.title"] == "memory.bin"][0]
        path = reg.blob_path(mem["digest"])
        with open(path, "r+b") as f:
            f.seek(40)
            c = f.read(1)
            f.seek(40)
            f.write(bytes([c[0] ^ 0xff]))
        p = forkctl("pull", ref, ok=False)
        assert "digest" in p.stderr, p.stderr
        assert tags() == ["base", "l1"], tags()
        assert not os.path.exists(os.path.join(snapdir, "l2"))
        no_trace()
        with open(path, "r+b") as f:
            f.seek(40)
            f.write(c)
    h.check("a changed blob in the registry is refused, nothing registered or left", tampered)

    def unconfigured():
        p = forkctl("pull", "127.0.0.2:5999/forkd/chain:v1", ok=False)
        assert "not configured" in p.stderr, p.stderr
        h.expect_error("org.freedesktop.DBus.Error.InvalidArgs", "PushSnapshot", "ssa{sv}",
                       ["l1", "registry.invalid/x:y", {}])
        assert tags() == ["base", "l1"], tags()
    h.check("a registry not configured is refused", unconfigured)
    return 1 if h.failed else 0


if __name__ == "__main__":
    sys.exit(main())
