#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
bench/image: a snapshot of an OCI image through forkd-rest (POST /v1/snapshots with
"image"), against POST /v1/snapshots of the same tree as a ready ext4 root disk.

The image is a docker-archive made from the tools/mkimage Linux guest's own root tree
(python3.11, numpy, busybox; read out of its rootfs.ext4 with debugfs), padded with a
second layer of incompressible data up to --image-mib (default 150) so that it has the
size of a slim Python image; the baseline's root disk is the same tree (the Linux
guest's rootfs.ext4 with the same padding added, as tools/mkimage would write it). R
rounds (default 2) take turns:

  rootfs   POST /v1/snapshots {kernel, rootfs}: copy the disk, boot, snapshot
  cold     POST /v1/snapshots {image} with forkd's layer cache emptied first: check
           every blob, unpack the layers, write the ext4, boot, snapshot
  warm     the same with the layer cache of the cold run: no layer is unpacked

Each snapshot is deleted after it is timed. Medians; cold_ratio and warm_ratio are
cold / rootfs and warm / rootfs (targets: at most 1.5 and 1.1). With --json the last
line of stdout is one JSON object. --emulated marks the figures as the QEMU test
host's (bench/image runs there where /dev/kvm cannot boot Linux).
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TOP, "tests", "lib"))

import ociimage  # noqa: E402
from linuxguest import BenchFail, LinuxStack, bench_parser, rest  # noqa: E402

BOOT_WAIT = 600


def make_images(image, tmp, image_mib):
    """The docker-archive and the baseline's rootfs: the same tree."""
    tree = os.path.join(tmp, "tree")
    os.mkdir(tree)
    subprocess.run(["debugfs", "-R", f"rdump / {tree}", os.path.join(image, "rootfs.ext4")], check=True,
                   capture_output=True)
    shutil.rmtree(os.path.join(tree, "lost+found"), ignore_errors=True)
    base = ociimage.dir_layer(tree)
    pad_bytes = max(0, image_mib * 1048576 - len(base))
    pad = os.path.join(tmp, "pad")
    os.makedirs(os.path.join(pad, "opt", "data"))
    left, k = pad_bytes, 0
    while left > 0:
        n = min(left, 8 << 20)
        with open(os.path.join(pad, "opt", "data", f"blob{k:03d}"), "wb") as f:
            f.write(os.urandom(n))
        left -= n
        k += 1
    docker = os.path.join(tmp, "python.docker.tar")
    config = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["python3"]}
    ociimage.write_docker(docker, [base, ociimage.dir_layer(pad)], config)
    # The baseline: the same tree and padding as a ready root disk.
    shutil.copytree(os.path.join(pad, "opt"), os.path.join(tree, "opt"), dirs_exist_ok=True)
    rootfs = os.path.join(tmp, "rootfs.ext4")
    tree_bytes = int(subprocess.run(["du", "-sb", "--apparent-size", tree], capture_output=True, text=True,
                                    check=True).stdout.split()[0])
    size_mib = tree_bytes * 3 // 2 // 1048576 + 64
    subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-m", "0", "-E", "root_owner=0:0", "-d", tree, rootfs,
                    f"{size_mib}M"], check=True, capture_output=True)
    return docker, rootfs


def create(stack, body):
    t0 = time.monotonic()
    status, doc = rest(stack, "POST", "/v1/snapshots", dict(body, boot_wait_secs=BOOT_WAIT), timeout=3600)
    took = time.monotonic() - t0
    if status != 201:
        raise RuntimeError(f"POST /v1/snapshots {body}: {status} {doc}")
    status, doc = rest(stack, "DELETE", f"/v1/snapshots/{body['tag']}")
    if status != 204:
        raise RuntimeError(f"DELETE {body['tag']}: {status} {doc}")
    return took


def main():
    ap = bench_parser("bench/image", __doc__)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--image-mib", type=int, default=150)
    a = ap.parse_args()
    if not a.image:
        ap.error("--image is required")
    if not 1 <= a.rounds <= 20 or not 1 <= a.image_mib <= 4096:
        ap.error("--rounds takes 1..20, --image-mib 1..4096")

    tmp = tempfile.mkdtemp(prefix="forkd-bench-image.")
    g = None
    try:
        docker, rootfs = make_images(a.image, tmp, a.image_mib)
        g = LinuxStack(BenchFail(), TOP, os.path.abspath(a.build), a.image)
        cache = os.path.join(g.state, "forkd", "oci-layers")
        kernel = g.stack["FORKD_GUEST_KERNEL"]
        times = {"rootfs": [], "cold": [], "warm": []}
        for r in range(a.rounds):
            times["rootfs"].append(create(g.stack, {"tag": f"b-rootfs-{r}", "kernel": kernel, "rootfs": rootfs}))
            shutil.rmtree(cache, ignore_errors=True)
            times["cold"].append(create(g.stack, {"tag": f"b-cold-{r}", "image": docker}))
            times["warm"].append(create(g.stack, {"tag": f"b-warm-{r}", "image": docker}))
            print(f"round {r + 1}: rootfs {times['rootfs'][-1]:.2f} s, image cold {times['cold'][-1]:.2f} s, "
                  f"warm {times['warm'][-1]:.2f} s", flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        out = {
            "bench": "image", "emulated": a.emulated, "rounds": a.rounds,
            "image_bytes": os.path.getsize(docker), "rootfs_bytes": os.path.getsize(rootfs),
            "rootfs_s": round(med["rootfs"], 3), "image_cold_s": round(med["cold"], 3),
            "image_warm_s": round(med["warm"], 3),
            "cold_ratio": round(med["cold"] / med["rootfs"], 3), "warm_ratio": round(med["warm"] / med["rootfs"], 3),
        }
        print(f"docker-archive {out['image_bytes'] >> 20} MiB; medians of {a.rounds}: rootfs {out['rootfs_s']} s, "
              f"image cold {out['image_cold_s']} s ({out['cold_ratio']}x), warm {out['image_warm_s']} s "
              f"({out['warm_ratio']}x){' (emulated: QEMU TCG)' if a.emulated else ''}")
        if a.json:
            print(json.dumps(out))
    finally:
        if g:
            g.down()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
