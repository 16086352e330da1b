#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
bench/pull: PushSnapshot and PullSnapshot of a diff chain through Debian's
docker-registry on loopback, over forkd's D-Bus API (a private dbus-daemon, the
Python client of the tests). No VM: the chain is written by hand as forkd-vmm
writes one (a base whose memory holds --data-mib of data in --mem-mib, and two
diff links that each changed --link-mib), so it runs anywhere.

  push     the chain (base <- l1 <- l2) to the registry: bytes and blobs sent
  pull     l1 and l2 deleted here, the base kept: PullSnapshot of l2 fetches only
           the two missing links; bytes the registry served (its access log:
           manifests and blobs) against the data of the two links (their files'
           allocated bytes: what must move), as ratio (target: at most 1.1)

With --json the last line of stdout is one JSON object.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TOP, "tests", "lib"))

from ociregistry import Registry  # noqa: E402

MIB = 1 << 20


def load_test_forkd():
    spec = importlib.util.spec_from_file_location("test_forkd", os.path.join(TOP, "tests/daemon/test-forkd.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def write_link(snapdir, tag, parent, mem, data, offset):
    """A snapshot directory as forkd-vmm writes one: data random bytes at offset in
    mem bytes of holes (a diff link's memory holds only the pages it changed)."""
    d = os.path.join(snapdir, tag)
    os.makedirs(d)
    with open(os.path.join(d, "memory.bin"), "wb") as f:
        f.truncate(mem)
        f.seek(offset)
        left = data
        while left > 0:
            n = min(left, 4 * MIB)
            f.write(os.urandom(n))
            left -= n
    with open(os.path.join(d, "vmstate.bin"), "wb") as f:
        f.write(os.urandom(64 * 1024))
    with open(os.path.join(d, "disk.img"), "wb") as f:
        f.truncate(MIB)
    meta = {"format": 1, "tag": tag, "created_at_unix": 1700000000, "mem_size": mem, "vcpus": 1, "generation": 0,
            "memory_file": "memory.bin", "vmstate_file": "vmstate.bin", "disk_file": "disk.img",
            "disk_size": MIB, "kernel": "/boot/vmlinuz", "guest": "linux", "parent_tag": parent,
            "parent_content_hash": sha256_file(os.path.join(snapdir, parent, "memory.bin")) if parent else None}
    with open(os.path.join(d, "snapshot.json"), "w") as f:
        json.dump(meta, f)


def allocated(path):
    return sum(os.stat(os.path.join(path, n)).st_blocks * 512 for n in os.listdir(path) if n != "snapshot.json")


def served_bytes(log, since):
    """Bytes of the GETs the registry answered after offset since of its log."""
    total = 0
    with open(log) as f:
        f.seek(since)
        for line in f:
            m = re.search(r'"GET (\S+) HTTP/[\d.]+" (\d{3}) (\d+)', line)
            if m and m.group(2) in ("200", "206"):
                total += int(m.group(3))
    return total


def main():
    ap = argparse.ArgumentParser(prog="bench/pull", description=__doc__.split("\n\n")[0].strip())
    ap.add_argument("--mem-mib", type=int, default=256)
    ap.add_argument("--data-mib", type=int, default=64)
    ap.add_argument("--link-mib", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not (16 <= a.mem_mib <= 3072 and 1 <= a.data_mib <= a.mem_mib // 2 and 1 <= a.link_mib <= a.mem_mib // 4):
        ap.error("--mem-mib 16..3072, --data-mib up to half of it, --link-mib up to a quarter")
    tf = load_test_forkd()
    h = tf.Harness()
    reg = None
    try:
        snapdir = os.path.join(h.state, "snapshots")
        os.makedirs(snapdir)
        mem = a.mem_mib * MIB
        write_link(snapdir, "base", None, mem, a.data_mib * MIB, 0)
        write_link(snapdir, "l1", "base", mem, a.link_mib * MIB, mem // 2)
        write_link(snapdir, "l2", "l1", mem, a.link_mib * MIB, mem // 2 + a.link_mib * MIB)
        links_bytes = allocated(os.path.join(snapdir, "l1")) + allocated(os.path.join(snapdir, "l2"))
        regdir = os.path.join(h.tmp, "registry")
        os.mkdir(regdir)
        reg = Registry(regdir)
        config = os.path.join(h.tmp, "registries.json")
        with open(config, "w") as f:
            json.dump({"registries": [{"host": reg.host, "insecure_http": True}]}, f)
        h.start_bus()
        h.start_forkd(["--registry-config", config, "--no-confine"])
        ref = f"{reg.host}/bench/chain:1"
        t0 = time.monotonic()
        push = h.m("PushSnapshot", "ssa{sv}", ["l2", ref, {}], timeout=600)[0]
        push_s = time.monotonic() - t0
        for tag in ("l2", "l1"):
            h.m("DeleteSnapshot", "sbb", [tag, False, False])
        reg.log.flush()
        since = os.path.getsize(reg.log.name)
        t0 = time.monotonic()
        pulled = h.m("PullSnapshot", "ssa{sv}", [ref, "", {}], timeout=600)[0]
        pull_s = time.monotonic() - t0
        reg.log.flush()
        fetched = served_bytes(reg.log.name, since)
        if [p["tag"] for p in pulled] != ["l1", "l2"]:
            raise RuntimeError(f"the pull registered {[p['tag'] for p in pulled]}, not l1 and l2")
        out = {"bench": "pull", "mem_mib": a.mem_mib, "data_mib": a.data_mib, "link_mib": a.link_mib,
               "push_s": round(push_s, 3), "push_bytes_sent": push.get("bytes_sent"),
               "push_blobs_sent": push.get("blobs_sent"), "pull_s": round(pull_s, 3),
               "pull_fetched_bytes": fetched, "missing_links_bytes": links_bytes,
               "pull_ratio": round(fetched / links_bytes, 3)}
        print(f"push of base <- l1 <- l2: {out['push_bytes_sent']} bytes in {out['push_blobs_sent']} blobs, "
              f"{push_s:.2f} s; pull of l2 with the base here: {fetched} bytes fetched for {links_bytes} bytes "
              f"of data in the two missing links ({out['pull_ratio']}x), {pull_s:.2f} s")
        if a.json:
            print(json.dumps(out))
    finally:
        if reg:
            reg.stop()
        h.cleanup()
        shutil.rmtree(h.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
