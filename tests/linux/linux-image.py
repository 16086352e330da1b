# SPDX-License-Identifier: LGPL-2.1-or-later
"""Snapshots of OCI container images on the Linux guest (part of test-linux-guest.py).

The test makes its images itself: the first layer is the Linux image's own root tree
(python3.11, busybox; read out of rootfs.ext4 with debugfs) plus /etc/old.conf, the
second adds /opt/app/hello.txt, whites out /etc/old.conf and comes with ENV GREETING=hi
and WORKDIR /opt/app. The same image as a docker-archive (POST /v1/snapshots "image")
as an OCI image layout (forkctl snapshot create --image) and by reference from Debian's
docker-registry on loopback (pushed there with registry-tool) boots with forkd's default
kernel (forkd --default-kernel, the Linux image's) and forkd-agent-portable as PID 1.
Children see the file and the variable, start in /opt/app, miss the whited-out file,
and run_code keeps its globals with the image's own python3. Hostile images are 400
naming the member, with nothing registered and nothing left in the snapshots directory.

Volumes ride on the same boots: the docker-archive's snapshot has an ro and a cow
volume (three children see the ro one and cannot write it; each child's cow writes
stay its own; a branch of a child carries both to its children, and a branch of one
of those to theirs), the OCI layout's an rw one (its writes land in the host file, a
second holder is 409 while the first runs). A volume file forkctl's user cannot read
is refused, naming it."""
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time

import ociimage
from linuxguest import TCG_BOOT_WAIT_SECS, rest
from ociimage import member
from ociregistry import Registry

ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "GREETING=hi"]
# Cmd: a service that --start-cmd starts before the snapshot (the OCI layout's).
CMD = ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"]
CONFIG = {"Env": ENV, "WorkingDir": "/opt/app", "Cmd": CMD}
LAYER2 = [
    member("opt/", kind=tarfile.DIRTYPE, mode=0o755),
    member("opt/app/", kind=tarfile.DIRTYPE, mode=0o755),
    member("opt/app/hello.txt", b"hello from layer 2\n"),
    member("etc/.wh.old.conf"),
]


def base_layer(image, tmp):
    """The Linux image's root tree as a layer tar, with /etc/old.conf to white out."""
    tree = os.path.join(tmp, "tree")
    os.mkdir(tree)
    subprocess.run(["debugfs", "-R", f"rdump / {tree}", os.path.join(image, "rootfs.ext4")], check=True,
                   capture_output=True)
    shutil.rmtree(os.path.join(tree, "lost+found"), ignore_errors=True)
    with open(os.path.join(tree, "etc", "old.conf"), "w") as f:
        f.write("to be whited out\n")
    return ociimage.dir_layer(tree)


def make_volume(tmp, name, files):
    """An ext4 file of 16 MiB holding files {relative path: text}."""
    src = os.path.join(tmp, f"vol-{name}")
    os.makedirs(src)
    for rel, text in files.items():
        with open(os.path.join(src, rel), "w") as f:
            f.write(text)
    img = os.path.join(tmp, f"{name}.ext4")
    subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-d", src, img, "16M"], check=True, capture_output=True)
    os.chmod(img, 0o644)
    return img


def sh(fc, sid, cmd):
    rc, r, err = fc("exec", sid, "--", "sh", "-c", cmd)
    return (r or {}).get("stdout", "") if rc == 0 else f"rc {rc}: {r or err}"


def check_shared_volumes(t, fc, stack, ids):
    """ro: every child reads it and none can write it; cow: each child's writes its own."""
    outs = [sh(fc, sid, "cat /data/ro/hello.txt; touch /data/ro/x 2>/dev/null; echo $?") for sid in ids]
    t.ok(all(o.startswith("shared\n") and o.split()[-1] != "0" for o in outs),
         f"ro volume: {len(ids)} children read it, none can write it", outs)
    for i, sid in enumerate(ids):
        sh(fc, sid, f"echo child-{i} > /data/cow/note.txt")
    outs = [sh(fc, sid, "cat /data/cow/note.txt") for sid in ids]
    t.ok(outs == [f"child-{i}\n" for i in range(len(ids))], "cow volume: each child's writes stay its own", outs)


def branch_carries_volumes(t, fc, stack, sid, made):
    """A branch of sid, then a branch of its child: each generation sees the volumes.
    The children it forks are killed at its end."""
    kids = []
    try:
        for gen in (1, 2):
            tag = f"img-vb{gen}"
            status, doc = rest(stack, "POST", f"/v1/sandboxes/{sid}/branch", {"tag": tag})
            if not t.ok(status == 201 and len((doc or {}).get("volumes", [])) == 2,
                        f"branch {tag} of a sandbox with volumes lists them", f"{status} {doc}"):
                return
            made.append(tag)
            rc, doc, err = fc("fork", tag)
            ids = [s["id"] for s in (doc or {}).get("sandboxes", [])]
            kids += ids
            if not t.ok(rc == 0 and len(ids) == 1, f"fork of {tag}", err):
                return
            out = sh(fc, ids[0], "cat /data/ro/hello.txt /data/cow/note.txt")
            t.ok(out == "shared\nchild-0\n", f"a child of {tag} sees the ro volume and the cow one as it was branched",
                 out)
            sid = ids[0]
    finally:
        if kids:
            fc("kill", *kids)


def rw_volume(t, fc, stack, rw, made):
    rc, doc, err = fc("fork", "img-layout")
    ids = [s["id"] for s in (doc or {}).get("sandboxes", [])]
    if not t.ok(rc == 0 and len(ids) == 1, "fork of the snapshot with an rw volume", err):
        return
    out = sh(fc, ids[0], "echo persisted > /data/rw/p.txt && sync && cat /data/rw/p.txt")
    t.ok(out == "persisted\n", "rw volume: the holder writes it", out)
    status, doc = rest(stack, "POST", "/v1/sandboxes", {"snapshot_tag": "img-layout"})
    t.ok(status == 409 and ids[0] in str(doc), "a second holder of the rw volume: 409 naming the holder",
         f"{status} {doc}")
    fc("kill", *ids)
    # The guest's ext4 may still hold the new file's metadata in its journal only: read
    # a copy after e2fsck replayed it, as the next mount would.
    copy = rw + ".check"
    shutil.copyfile(rw, copy)
    subprocess.run(["e2fsck", "-fy", copy], capture_output=True)
    p = subprocess.run(["debugfs", "-R", "cat /p.txt", copy], capture_output=True, text=True)
    t.ok(p.stdout == "persisted\n", "rw volume: the write is in the host file after the holder ended",
         p.stdout + p.stderr)


def leftovers(state):
    """What a failed create must not leave: staging and boot directories, work trees."""
    snaps = os.path.join(state, "forkd", "snapshots")
    return sorted(n for n in os.listdir(snaps) if n.startswith("."))


def check_child(t, fc, sid, what):
    rc, r, err = fc("exec", sid, "--", "cat", "hello.txt")
    t.ok(rc == 0 and r.get("stdout") == "hello from layer 2\n",
         f"{what}: exec cat hello.txt in the image's WorkingDir sees layer 2's file", r or err)
    rc, r, err = fc("exec", sid, "--", "sh", "-c", 'echo "$GREETING"; pwd; test -e /etc/old.conf; echo $?')
    t.ok(rc == 0 and r.get("stdout") == "hi\n/opt/app\n1\n",
         f"{what}: $GREETING is hi, the cwd /opt/app, and the whited-out /etc/old.conf is gone", r or err)
    fc("run", sid, "x = 40\nimport sys")
    rc, r, err = fc("run", sid, "print(x + 2, sys.executable, sys.version_info[:2] >= (3, 8))")
    out = (r or {}).get("stdout", "")
    t.ok(rc == 0 and out.startswith("42 ") and "python3" in out and out.endswith(" True\n"),
         f"{what}: run_code keeps its globals across calls, in the image's own python3", r or err)


def by_reference(t, fc, stack, build, state, layout, tmp, made):
    """The layout pushed to a docker-registry on loopback, snapshotted by reference."""
    os.mkdir(os.path.join(tmp, "registry"))
    reg = Registry(os.path.join(tmp, "registry"))
    try:
        ref = f"{reg.host}/forkd/python:1"
        cfg = os.path.join(tmp, "client.json")
        with open(cfg, "w") as f:
            json.dump({"registries": [{"host": reg.host, "insecure_http": True}]}, f)
        p = subprocess.run([os.path.join(build, "src/oci/registry-tool"), "push-layout", layout, ref, "--config", cfg],
                           capture_output=True, text=True, timeout=300)
        if not t.ok(p.returncode == 0, f"the image pushed to docker-registry as {ref}", p.stderr):
            return
        # Not configured in forkd yet: refused, naming the registry.
        status, doc = rest(stack, "POST", "/v1/snapshots", {"tag": "img-ref", "image": ref})
        t.ok(status == 400 and reg.host in (doc or {}).get("error", ""),
             "a reference to a registry forkd does not know: 400", f"{status} {doc}")
        # forkd-stack's forkd reads $state/registries.json at each pull.
        shutil.copy(cfg, os.path.join(state, "registries.json"))
        t0 = time.monotonic()
        status, doc = rest(stack, "POST", "/v1/snapshots",
                           {"tag": "img-ref", "image": ref, "boot_wait_secs": TCG_BOOT_WAIT_SECS})
        if not t.ok(status == 201 and (doc or {}).get("tag") == "img-ref",
                    "POST /v1/snapshots with image = a reference: pulled from the registry and snapshotted",
                    f"{status} {doc}"):
            return
        made.append("img-ref")
        t.note(f"snapshot by reference (pull, layer cache warm): {time.monotonic() - t0:.1f} s under TCG")
        rc, doc, err = fc("fork", "img-ref")
        ids = [s["id"] for s in (doc or {}).get("sandboxes", [])]
        if t.ok(rc == 0 and len(ids) == 1, "fork of the pulled image's snapshot", err):
            check_child(t, fc, ids[0], "the pulled image's child")
            fc("kill", *ids)
        status, doc = rest(stack, "POST", "/v1/snapshots", {"tag": "img-none", "image": f"{reg.host}/forkd/none:1"})
        t.ok(status == 400 and "forkd/none" in (doc or {}).get("error", ""),
             "a reference the registry does not have: 400 naming it", f"{status} {doc}")
    finally:
        reg.stop()


def images(t, fc, stack, build, image, state):
    tmp = tempfile.mkdtemp(prefix="forkd-linux-image.")
    made = []
    try:
        t0 = time.monotonic()
        layers = [base_layer(image, tmp), LAYER2]
        docker = os.path.join(tmp, "python.docker.tar")
        layout = os.path.join(tmp, "python.oci")
        ociimage.write_docker(docker, layers, CONFIG)
        ociimage.write_oci(layout, layers, CONFIG, comps=("plain", "gzip"))
        ro = make_volume(tmp, "ro", {"hello.txt": "shared\n"})
        cow = make_volume(tmp, "cow", {"note.txt": "base\n"})
        rw = make_volume(tmp, "rw", {})
        volumes = [{"host_path": ro, "guest_path": "/data/ro", "mode": "ro"},
                   {"host_path": cow, "guest_path": "/data/cow", "mode": "cow"}]
        t.note(f"images made ({os.path.getsize(docker) >> 20} MiB docker-archive) in {time.monotonic() - t0:.1f} s")

        # A docker-archive through REST, with forkd's default kernel.
        t0 = time.monotonic()
        status, doc = rest(stack, "POST", "/v1/snapshots",
                           {"tag": "img-docker", "image": docker, "boot_wait_secs": TCG_BOOT_WAIT_SECS,
                            "volumes": volumes})
        ok = t.ok(status == 201 and isinstance(doc, dict) and doc.get("tag") == "img-docker",
                  "POST /v1/snapshots with image: a docker-archive boots with forkd's default kernel and is snapshotted",
                  f"{status} {doc}")
        if ok:
            made.append("img-docker")
            t.note(f"snapshot of a docker-archive (cold layer cache): {time.monotonic() - t0:.1f} s under TCG")
            cfg = doc.get("image") or {}
            t.ok(cfg.get("working_dir") == "/opt/app" and "GREETING=hi" in cfg.get("env", []) and
                 cfg.get("cmd") == CMD and cfg.get("start_cmd") is False,
                 "SnapshotInfo image: the config's Env, WorkingDir and Cmd", doc)
            t.ok([(v.get("guest_path"), v.get("mode")) for v in doc.get("volumes", [])] ==
                 [("/data/ro", "ro"), ("/data/cow", "cow")], "SnapshotInfo volumes: the ro and the cow one", doc)

        # The same image as an OCI layout through forkctl: its layers come from the cache.
        t0 = time.monotonic()
        rc, doc, err = fc("snapshot", "create", "img-layout", "--image", layout, "--boot-wait",
                          str(TCG_BOOT_WAIT_SECS), "--volume", f"{rw}:/data/rw:rw", "--start-cmd")
        if t.ok(rc == 0 and isinstance(doc, dict) and doc.get("tag") == "img-layout",
                "forkctl snapshot create --image: an OCI image layout", doc or err):
            made.append("img-layout")
            t.note(f"snapshot of the OCI layout (layer cache warm): {time.monotonic() - t0:.1f} s under TCG")

        if "img-docker" in made:
            rc, doc, err = fc("fork", "img-docker", "-n", "3")
            ids = [s["id"] for s in (doc or {}).get("sandboxes", [])]
            if t.ok(rc == 0 and len(ids) == 3, "fork -n 3 of the docker-archive's snapshot", err):
                rc, r, err = fc("ping", ids[0])
                t.ok(rc == 0 and r.get("pid") == 1 and "python3" in (r.get("python_path") or ""),
                     "ping: forkd-agent-portable is PID 1 and uses the image's python3", r or err)
                for sid in ids[:2]:
                    check_child(t, fc, sid, sid)
                check_shared_volumes(t, fc, stack, ids)
                branch_carries_volumes(t, fc, stack, ids[0], made)
                fc("kill", *ids)
        if "img-layout" in made:
            rc, doc, err = fc("fork", "img-layout")
            ids = [s["id"] for s in (doc or {}).get("sandboxes", [])]
            if t.ok(rc == 0 and len(ids) == 1, "fork of the OCI layout's snapshot", err):
                check_child(t, fc, ids[0], "the OCI layout's child")
                out = sh(fc, ids[0], "ps -o args | grep -c '[h]ttp.server 8000'")
                t.ok(out == "1\n", "--start-cmd: the image's Cmd runs in the child, started before the snapshot", out)
                fc("kill", *ids)
            rw_volume(t, fc, stack, rw, made)

        # A volume file forkctl's user cannot read: refused, naming it.
        os.chmod(tmp, 0o755)
        secret = make_volume(tmp, "secret", {})
        os.chmod(secret, 0o600)
        p = subprocess.run(["runuser", "-u", "nobody", "--", fc.path, "--no-progress", "snapshot", "create",
                            "img-secret", "--image", layout, "--volume", f"{secret}:/data/s"],
                           env=fc.env, capture_output=True, text=True, timeout=120)
        t.ok(p.returncode != 0 and "secret.ext4" in p.stderr, "a volume file the caller cannot read is refused",
             f"{p.returncode} {p.stderr}")

        by_reference(t, fc, stack, build, state, layout, tmp, made)

        # Hostile images: 400 naming the member, nothing registered, nothing left.
        before = leftovers(state)
        bad = os.path.join(tmp, "dotdot.docker.tar")
        ociimage.write_docker(bad, [LAYER2, [member("../escape", b"x")]], CONFIG)
        status, doc = rest(stack, "POST", "/v1/snapshots",
                           {"tag": "img-bad", "image": bad, "boot_wait_secs": TCG_BOOT_WAIT_SECS})
        t.ok(status == 400 and '"../escape"' in (doc or {}).get("error", ""),
             "an image with a ../ member: 400 naming the member", f"{status} {doc}")
        bad = os.path.join(tmp, "symlink.oci")
        ociimage.write_oci(bad, [[member("evil", kind=tarfile.SYMTYPE, linkname="/etc")],
                                 [member("evil/pwned", b"x")]], CONFIG)
        rc, doc, err = fc("snapshot", "create", "img-bad", "--image", bad)
        t.ok(rc != 0 and '"evil/pwned"' in err and not os.path.exists("/etc/pwned"),
             "forkctl --image with a file through a symlink out of the tree: refused, naming the member", err)
        rc, doc, err = fc("snapshot", "info", "img-bad")
        t.ok(rc != 0 and leftovers(state) == before, "nothing registered, nothing left in the snapshots directory",
             (leftovers(state), before))
    finally:
        for tag in reversed(made):
            fc("snapshot", "rm", tag)
        shutil.rmtree(tmp, ignore_errors=True)
