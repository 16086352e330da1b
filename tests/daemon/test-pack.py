#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
Pack and unpack (PackSnapshot, UnpackSnapshot) end to end on the real parts:
a private dbus-daemon, forkd, forkd-vmm on /dev/kvm, the test guest (the
harness of test-forkd.py), and forkctl, which passes the bundle's fd over
the bus. A diff chain of three links is packed, deleted, unpacked and forked
from; a bundle with one byte changed and hostile bundles are refused and
leave nothing behind.

Environment: FORKD, FORKD_VMM, FORKD_TEST_GUEST, FORKCTL.
"""

import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile

from ociimage import zstd

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tf = _load("test_forkd", "test-forkd.py")
tb = _load("test_branch", "test-branch.py")
SCRATCH = tb.SCRATCH
FORKCTL = os.environ.get("FORKCTL")
ZERO_HASH = "0" * 64


def unzstd(data):
    return zstd(data, decompress=True)


def tar_bytes(members):
    """members: (TarInfo, bytes or None), in order; an uncompressed tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
            else:
                t.addfile(info)
    return buf.getvalue()


def reg(name, data):
    return tarfile.TarInfo(name), data


def special(name, kind, linkname=""):
    i = tarfile.TarInfo(name)
    i.type, i.linkname = kind, linkname
    if kind == tarfile.CHRTYPE:
        i.devmajor, i.devminor = 1, 3
    return i, None


def manifest(tag="evil", files=(("snapshot.json", 2),)):
    m = {"version": 2, "chain": [{"tag": tag, "parent_tag": None, "parent_content_hash": None,
                                  "files": [{"name": f[0], "size": f[1], "sha256": f[2] if len(f) > 2 else ZERO_HASH}
                                            for f in files]}]}
    return reg("manifest.json", json.dumps(m).encode())


def main():
    if not tf.FORKD or not tf.VMM or not tf.GUEST or not FORKCTL:
        print("Bail out! FORKD, FORKD_VMM, FORKD_TEST_GUEST and FORKCTL must be set")
        return 1
    if not tf.kvm_usable():
        tf.skip("/dev/kvm is not usable")
    if os.geteuid() != 0:
        tf.skip("needs root (the system-bus policy, /proc/<pid>/mem of the VMMs)")
    h = tf.Harness()
    try:
        rc = run(h)
        print(f"1..{h.n}")
        return rc
    finally:
        h.cleanup()


def run(h):
    h.setup_cgroups()
    disk = os.path.join(h.tmp, "disk.img")
    with open(disk, "wb") as f:
        f.truncate(16 << 20)
    h.start_bus()
    h.start_forkd()
    snapdir = os.path.join(h.state, "snapshots")
    bundle = os.path.join(h.tmp, "chain.tar.zst")
    ctx = {}

    def forkctl(*args, ok=True):
        p = subprocess.run([FORKCTL, "--bus-address", h.address, "--no-progress", *args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
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
        g = h.fork("l2", 1)[0]
        tb.poke(g["pid"], b"link-three", SCRATCH + 8192)
        assert branch(g["id"], "l3")["parent_tag"] == "l2"
        h.terminate_all()
        info = h.m("GetSnapshotInfo", "s", ["l3"])[0]
        assert info["parent_tag"] == "l2", info
    h.check("a diff chain base <- l1 <- l2 <- l3", chain)

    def pack():
        doc = json.loads(forkctl("--json", "pack", "--tag", "l3", "--out", bundle).stdout)
        assert doc["chain"] == ["base", "l1", "l2", "l3"], doc
        assert doc["bytes"] == os.path.getsize(bundle), (doc, os.path.getsize(bundle))
        # Sparse: the bundle is far smaller than four 64 MiB memory files.
        assert os.path.getsize(bundle) < 8 << 20, os.path.getsize(bundle)
        with tarfile.open(fileobj=io.BytesIO(unzstd(open(bundle, "rb").read()))) as t:
            names = t.getnames()
            assert names[0] == "manifest.json", names
            m = json.load(t.extractfile("manifest.json"))
        assert m["version"] == 2 and [l["tag"] for l in m["chain"]] == ["base", "l1", "l2", "l3"], m
        assert m["chain"][0]["parent_tag"] is None and m["chain"][2]["parent_tag"] == "l1", m
        for link in m["chain"]:
            for f in link["files"]:
                assert f"{link['tag']}/{f['name']}" in names, (f, names)
                assert len(f["sha256"]) == 64 and f["size"] == os.path.getsize(
                    os.path.join(snapdir, link["tag"], f["name"])), f
        ctx["manifest"] = m
        # A tag that does not exist, and --out/--tag both needed.
        p = forkctl("pack", "--tag", "nope", "--out", os.path.join(h.tmp, "nope.tar.zst"), ok=False)
        assert p.returncode == 3 and not os.path.exists(os.path.join(h.tmp, "nope.tar.zst")), p.stderr
        assert forkctl("pack", "--tag", "l3", ok=False).returncode == 2
        # One link alone.
        doc = json.loads(forkctl("--json", "pack", "--tag", "base", "--out", os.path.join(h.tmp, "base.tar.zst")).stdout)
        assert doc["chain"] == ["base"], doc
    h.check("pack bundles the head and every ancestor, root first, manifest.json first", pack)

    def existing():
        before = tags()
        p = forkctl("unpack", bundle, ok=False)
        assert "exists already" in p.stderr, p.stderr
        assert tags() == before
        no_trace()
    h.check("unpack over existing tags gives SnapshotExists and leaves no trace", existing)

    def delete_chain():
        for t in ("l3", "l2", "l1", "base"):
            forkctl("snapshot", "rm", t)
        assert tags() == [], tags()
    h.check("the chain is deleted", delete_chain)

    def refused(data, *words, args=()):
        path = os.path.join(h.tmp, "bad.tar.zst")
        with open(path, "wb") as f:
            f.write(data)
        p = forkctl("unpack", path, *args, ok=False)
        for w in words:
            assert w in p.stderr, (w, p.stderr)
        assert tags() == [], tags()
        no_trace()
        return p

    def one_byte():
        raw = bytearray(unzstd(open(bundle, "rb").read()))
        with tarfile.open(fileobj=io.BytesIO(bytes(raw))) as t:
            member = t.getmember("l2/vmstate")
        raw[member.offset_data + 100] ^= 0x01
        p = refused(zstd(bytes(raw)), "l2/vmstate", "SHA-256")
        assert p.returncode == 1, p.returncode
        # And a byte of the compressed stream itself.
        data = bytearray(open(bundle, "rb").read())
        data[len(data) // 2] ^= 0x40
        refused(bytes(data), "refused")
    h.check("a bundle with one byte changed is refused, nothing registered or left", one_byte)

    def truncated():
        data = open(bundle, "rb").read()
        refused(data[:len(data) // 2], "truncated")
    h.check("a truncated (interrupted) bundle is refused, nothing left", truncated)

    def hostile():
        outside = os.path.join(h.state, "x")
        cases = [
            ([manifest(), reg("../x", b"hi")], ['".."']),
            ([manifest(), reg("evil/../../x", b"hi")], ['".."']),
            ([manifest(), reg(outside, b"hi")], ["absolute path"]),
            ([manifest(), special("evil/snapshot.json", tarfile.SYMTYPE, "/etc/passwd")], ["symbolic link"]),
            ([manifest(), special("evil/snapshot.json", tarfile.LNKTYPE, "/etc/passwd")], ["hard link"]),
            ([manifest(), special("evil/snapshot.json", tarfile.CHRTYPE)], ["device node"]),
            ([manifest(files=(("snapshot.json", 2), ("vmstate", 2, hashlib.sha256(b"ab").hexdigest()))),
              reg("evil/vmstate", b"ab"), reg("evil/vmstate", b"ab")], ["twice"]),
            ([manifest(), reg("evil/other", b"hi")], ["does not list"]),
            ([manifest(), reg("evil/snapshot.json", b"x" * 4096)], ["oversized"]),
            ([manifest(files=(("snapshot.json", 1 << 50),))], ["too large"]),
            ([reg("evil/snapshot.json", b"{}")], ["not manifest.json"]),
            ([reg("manifest.json", b" " * (2 << 20))], ["manifest.json is larger"]),
            ([manifest(), reg("evil/snapshot.json", b"{}")], ["SHA-256"]),
            ([manifest(files=(("snapshot.json", 2), ("vmstate", 2))), reg("evil/snapshot.json", b"{}")], ["does not match"]),
        ]
        for members, words in cases:
            refused(zstd(tar_bytes(members)), "refused", *words)
            assert not os.path.exists(outside) and not os.path.exists(os.path.join(h.tmp, "x"))
        # Not zstd at all, and an empty file.
        refused(tar_bytes([manifest()]), "Not a forkd bundle")
        refused(b"", "refused")
    h.check("hostile bundles (.., absolute, links, device, duplicate, unlisted, oversized, no manifest) refused",
            hostile)

    def unpack():
        doc = json.loads(forkctl("--json", "unpack", bundle).stdout)
        got = [s["tag"] for s in doc["snapshots"]]
        assert got == ["base", "l1", "l2", "l3"], got
        assert doc["snapshots"][3]["parent_tag"] == "l2", doc
        assert tags() == ["base", "l1", "l2", "l3"], tags()
        no_trace()
        # Holes stay holes.
        st = os.stat(os.path.join(snapdir, "l1", "memory.bin"))
        assert st.st_blocks * 512 < st.st_size // 4, (st.st_blocks, st.st_size)
        info = h.m("GetSnapshotInfo", "s", ["l3"])[0]
        assert info["parent_tag"] == "l2" and info["parent_content_hash"] == ctx["manifest"]["chain"][3]["parent_content_hash"], info
        # Each memory file's SHA-256, checked as it was unpacked, is cached beside it for the
        # very file as registered (after forkd's chown), so no fork hashes a parent again.
        for link in ("base", "l1", "l2"):
            mem = os.path.join(snapdir, link, "memory.bin")
            st = os.stat(mem)
            with open(mem, "rb") as f:
                want = hashlib.sha256(f.read()).hexdigest()
            line = (f"v1 {st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {want}\n")
            with open(mem + ".sha256") as f:
                got = f.read()
            assert got == line, (link, got, line)
        c = h.fork("l3", 2)
        for ch in c:
            assert json.loads(h.m("Ping", "s", [ch["id"]])[0])["pong"]
            assert tb.peek(ch["pid"], 8) == b"link-one"
            assert tb.peek(ch["pid"], 8, SCRATCH + 4096) == b"link-two"
            assert tb.peek(ch["pid"], 10, SCRATCH + 8192) == b"link-three"
        h.terminate_all()
    h.check("unpack registers the chain root first; a child of the head answers with every link's state", unpack)

    def new_tag():
        p = forkctl("unpack", bundle, "--tag", "other", ok=False)
        assert "only for a bundle of one snapshot" in p.stderr, p.stderr
        no_trace()
        p = forkctl("unpack", os.path.join(h.tmp, "base.tar.zst"), ok=False)
        assert "exists already" in p.stderr and "under a new tag" in p.stderr, p.stderr
        doc = json.loads(forkctl("--json", "unpack", os.path.join(h.tmp, "base.tar.zst"), "--tag", "base2").stdout)
        assert [s["tag"] for s in doc["snapshots"]] == ["base2"], doc
        with open(os.path.join(snapdir, "base2", "snapshot.json")) as f:
            assert json.load(f)["tag"] == "base2"
        ch = h.fork("base2", 1)[0]
        assert json.loads(h.m("Ping", "s", [ch["id"]])[0])["pong"]
        h.terminate_all()
        assert forkctl("unpack", bundle, "--tag", "bad/tag", ok=False).returncode == 1
    h.check("--tag renames a bundle of one snapshot only", new_tag)

    def pipes():
        # A pipe each way (forkctl --out /dev/stdout, unpack /dev/stdin): the same bytes.
        p = subprocess.run([FORKCTL, "--bus-address", h.address, "--no-progress", "pack", "--tag", "base2",
                            "--out", "/dev/stdout"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        assert p.returncode == 0, p.stderr
        with tarfile.open(fileobj=io.BytesIO(unzstd(p.stdout))) as t:
            assert t.getnames()[0] == "manifest.json"
        q = subprocess.run([FORKCTL, "--bus-address", h.address, "--no-progress", "--json", "unpack", "/dev/stdin",
                            "--tag", "base3"], input=p.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=120)
        assert q.returncode == 0, q.stderr
        assert [s["tag"] for s in json.loads(q.stdout)["snapshots"]] == ["base3"], q.stdout
        forkctl("snapshot", "rm", "base3")
        # A failed pack into a pipe leaves the device alone.
        p = subprocess.run([FORKCTL, "--bus-address", h.address, "pack", "--tag", "nope", "--out", "/dev/stdout"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        assert p.returncode == 3 and os.path.exists("/dev/stdout"), p.stderr
    h.check("pack into a pipe and unpack from one", pipes)

    def clean_exit():
        assert h.stop_forkd() == 0
        no_trace()
        h.assert_no_sanitizer_report()
    h.check("forkd exits cleanly, no sanitizer report", clean_exit)

    def restart():
        assert h.stop_forkd() == 0
        os.mkdir(os.path.join(snapdir, ".unpack-deadbeef"))  # a killed unpack's staging
        h.start_forkd()
        assert tags() == ["base", "base2", "l1", "l2", "l3"], tags()
        no_trace()
        h.assert_no_sanitizer_report()
    h.check("after a restart the unpacked chain loads, a staging directory left behind is removed", restart)

    return 1 if h.failed else 0


if __name__ == "__main__":
    sys.exit(main())
