# SPDX-License-Identifier: LGPL-2.1-or-later
"""OCI images made by the tests themselves, no registry or network needed: layer
tars from members or from a directory, an OCI image layout (optionally with a
lying size or a corrupt blob), an oci-archive (the layout in a tar) and a
docker-archive (docker save's format)."""

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile

def sha(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


def member(name, data=b"", kind=tarfile.REGTYPE, mode=0o644, linkname="", devmajor=0, devminor=0, uid=0,
           xattrs=None):
    ti = tarfile.TarInfo(name)
    ti.uid = ti.gid = uid
    ti.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in (xattrs or {}).items()}
    ti.type = kind
    ti.mode = mode
    ti.mtime = 1700000000
    ti.linkname = linkname
    ti.devmajor, ti.devminor = devmajor, devminor
    ti.size = len(data) if kind == tarfile.REGTYPE else 0
    return ti, data


def layer_tar(members):
    """A layer's tar from [(TarInfo, bytes)], or the bytes themselves when given a tar."""
    if isinstance(members, (bytes, bytearray)):
        return bytes(members)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for ti, data in members:
            t.addfile(ti, io.BytesIO(data) if ti.type == tarfile.REGTYPE else None)
    return buf.getvalue()


def zstd(data, decompress=False):
    """zstd (-d with decompress) on data, through temporary files: a pipe moves
    subprocess's input 512 bytes a write, tens of thousands of system calls for a
    snapshot bundle (slow under TCG)."""
    with tempfile.TemporaryFile() as src, tempfile.TemporaryFile() as dst:
        src.write(data)
        src.seek(0)
        subprocess.run(["zstd", "-q", "-c"] + (["-d"] if decompress else []), stdin=src, stdout=dst, check=True)
        dst.seek(0)
        return dst.read()


def compress(tar, how):
    if how == "gzip":
        return gzip.compress(tar, mtime=0)
    if how == "zstd" and shutil.which("zstd"):
        return zstd(tar)
    return tar


def dir_layer(root):
    """A layer's tar of the directory tree root (owners, modes, links as they are)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name in sorted(os.listdir(root)):
            t.add(os.path.join(root, name), arcname=name)
    return buf.getvalue()


def image_parts(layers, config, comps=("gzip", "zstd")):
    """[(blob, diff_id)], config bytes"""
    tars = [layer_tar(m) for m in layers]
    blobs = [compress(t, comps[i % len(comps)]) for i, t in enumerate(tars)]
    cfg = json.dumps({
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": [sha(t) for t in tars]},
    }).encode()
    return list(zip(blobs, tars)), cfg


def write_oci(path, layers, config, lie_size=False, corrupt=False, comps=("gzip", "zstd")):
    parts, cfg = image_parts(layers, config, comps)
    os.makedirs(f"{path}/blobs/sha256")

    def put(b):
        with open(f"{path}/blobs/sha256/{sha(b)[7:]}", "wb") as f:
            f.write(b)
        return {"digest": sha(b), "size": len(b)}

    descs = []
    for i, (blob, _) in enumerate(parts):
        d = put(blob)
        d["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"
        if lie_size and i == len(parts) - 1:
            d["size"] += int(lie_size)  # True: one byte more than the blob; -1: one less
        if corrupt and i == len(parts) - 1:
            with open(f"{path}/blobs/sha256/{d['digest'][7:]}", "r+b") as f:
                f.seek(len(blob) // 2)
                f.write(b"\xff\xfe")
        descs.append(d)
    cd = put(cfg)
    cd["mediaType"] = "application/vnd.oci.image.config.v1+json"
    man = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                      "config": cd, "layers": descs}).encode()
    md = put(man)
    md["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    with open(f"{path}/index.json", "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [md]}, f)
    with open(f"{path}/oci-layout", "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    return [d["digest"] for d in descs]


def tar_dir(src, dst):
    with tarfile.open(dst, "w") as t:
        for name in sorted(os.listdir(src)):
            t.add(f"{src}/{name}", arcname=name)


def write_docker(path, layers, config):
    parts, cfg = image_parts(layers, config, comps=("plain",))
    with tarfile.open(path, "w") as t:
        def add(name, b):
            ti = tarfile.TarInfo(name)
            ti.size = len(b)
            t.addfile(ti, io.BytesIO(b))
        names = []
        for i, (_, tar) in enumerate(parts):
            names.append(f"{hashlib.sha256(tar).hexdigest()[:12]}{i}/layer.tar")
            add(names[-1], tar)
        add(f"{sha(cfg)[7:]}.json", cfg)
        add("manifest.json", json.dumps([{"Config": f"{sha(cfg)[7:]}.json", "RepoTags": ["t:1"],
                                          "Layers": names}]).encode())
