#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""forkd-oci build against images this test makes itself: an OCI layout, an
oci-archive and a docker-archive of the same two layers, hostile layers that must
be refused with nothing left behind, the layer cache, and (where umoci and skopeo
are installed, which CI requires) an image umoci made, converted by skopeo.

usage: test-oci.py FORKD_OCI FORKD_AGENT REGISTRY_TOOL"""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

import ociimage
import ociregistry
from ociimage import member, sha, tar_dir
from tap import Skip, Tap, check

FORKD_OCI, AGENT, REGISTRY_TOOL = sys.argv[1], sys.argv[2], sys.argv[3]
TOP = tempfile.mkdtemp(prefix="forkd-oci-test.")
# e2fsprogs lives in /usr/sbin, which a user's PATH may lack.
DEBUGFS = shutil.which("debugfs") or "/usr/sbin/debugfs"
E2FSCK = shutil.which("e2fsck") or "/usr/sbin/e2fsck"


def user_xattrs_work():
    try:
        os.setxattr(TOP, "user.forkd-test", b"1")
        return True
    except OSError:
        return False


XATTRS = user_xattrs_work()


LAYER1 = [
    member("etc/", kind=tarfile.DIRTYPE, mode=0o755),
    member("etc/motd", b"welcome\n", uid=1000, mode=0o640, xattrs={"user.forkd": "yes"}),
    member("etc/old.conf", b"to be whited out\n"),
    member("bin/", kind=tarfile.DIRTYPE, mode=0o755),
    member("bin/sh", b"#!fake shell\n", mode=0o755),
    member("bin/ash", kind=tarfile.LNKTYPE, linkname="bin/sh"),
    member("usr/lib/", kind=tarfile.DIRTYPE, mode=0o755),
    member("lib", kind=tarfile.SYMTYPE, linkname="usr/lib"),
    member("var/cache/", kind=tarfile.DIRTYPE, mode=0o755),
    member("var/cache/a", b"lower"),
]
LAYER2 = [
    member("opt/app/", kind=tarfile.DIRTYPE, mode=0o755),
    member("opt/app/hello.txt", b"hello from layer 2\n"),
    member("etc/.wh.old.conf"),
    member("var/cache/.wh..wh..opq"),
    member("var/cache/b", b"upper"),
]
CONFIG = {"Env": ["PATH=/usr/bin:/bin", "GREETING=hi"], "WorkingDir": "/opt/app", "Cmd": ["/bin/sh"]}




def write_oci(path, layers, config=CONFIG, **kw):
    return ociimage.write_oci(path, layers, config, **kw)


def write_docker(path, layers, config=CONFIG):
    return ociimage.write_docker(path, layers, config)


def build(src, out, cache=None, extra=()):
    fd = os.open(src, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(src) else 0))
    try:
        argv = [FORKD_OCI, "build", "--image-fd", str(fd), "--agent", AGENT, "--out", out, *extra]
        if cache:
            argv += ["--cache", cache]
        return subprocess.run(argv, pass_fds=[fd], capture_output=True, text=True, timeout=300)
    finally:
        os.close(fd)


def debugfs(img, req):
    p = subprocess.run([DEBUGFS, "-R", req, img], capture_output=True, text=True)
    return p.stdout


def exists(img, path):
    return "Inode:" in debugfs(img, f"stat {path}")


def check_built(p, out):
    check(p.returncode == 0, f"exit {p.returncode}: {p.stderr.strip()}")
    res = json.loads(p.stdout)
    check(debugfs(out, "cat /opt/app/hello.txt") == "hello from layer 2\n", "hello.txt missing or wrong")
    check(debugfs(out, "cat /etc/motd") == "welcome\n", "layer 1's motd missing")
    motd = debugfs(out, "stat /etc/motd")
    check("Mode:  0640" in motd and "0x6553f100" in motd, f"motd's mode or mtime: {motd}")
    if os.geteuid() == 0:
        check("User:  1000" in motd, f"motd's owner: {motd}")
    if XATTRS:
        check("yes" in debugfs(out, "ea_get /etc/motd user.forkd"), "motd's xattr")
    check(not exists(out, "/etc/old.conf"), "whited-out old.conf still there")
    check(not exists(out, "/var/cache/a"), "opaque directory kept a lower entry")
    check(exists(out, "/var/cache/b"), "opaque directory lost this layer's entry")
    check(exists(out, "/.forkd/forkd-agent"), "no /.forkd/forkd-agent")
    check("Mode:  0755" in debugfs(out, "stat /.forkd/forkd-agent"), "agent mode not 0755")
    check("Mode:  01777" in debugfs(out, "stat /tmp") or "Mode:  1777" in debugfs(out, "stat /tmp"), "/tmp not 1777")
    ino_sh = debugfs(out, "stat /bin/sh").split("Inode:")[1].split()[0]
    ino_ash = debugfs(out, "stat /bin/ash").split("Inode:")[1].split()[0]
    check(ino_sh == ino_ash, "hard link lost")
    check("usr/lib" in debugfs(out, "stat /lib"), "symlink target not stored as is")
    cfg = json.loads(debugfs(out, "cat /.forkd/image.json"))
    check("GREETING=hi" in cfg["env"], f"image.json env: {cfg}")
    check(cfg["working_dir"] == "/opt/app", f"image.json working_dir: {cfg}")
    check(cfg["entrypoint"] == [] and cfg["cmd"] == ["/bin/sh"] and cfg["user"] == "", f"image.json: {cfg}")
    check(res["config"] == cfg, "stdout config differs from image.json")
    check(len(res["layers"]) == 2 and res["rootfs_bytes"] == os.path.getsize(out), f"result: {res}")
    check(res["tree_bytes"] > 0 or res["rootfs_cached"], f"result: {res}")
    fsck = subprocess.run([E2FSCK, "-fn", out], capture_output=True, text=True)
    check(fsck.returncode == 0, f"e2fsck: {fsck.stdout[-2000:]}")
    return res


def leftovers(d):
    return [n for n in os.listdir(d) if n.startswith(".forkd-oci-") or n.startswith(".stage-") or ".tmp-" in n]


def t_layout():
    d = f"{TOP}/layout"
    digests = write_oci(d, [LAYER1, LAYER2])
    res = check_built(build(d, f"{TOP}/layout.ext4"), f"{TOP}/layout.ext4")
    check(res["layers"] == digests and res["cached_layers"] == 0, f"result: {res}")
    check(not leftovers(TOP), f"left behind: {leftovers(TOP)}")


def t_oci_archive():
    d = f"{TOP}/layout2"
    write_oci(d, [LAYER1, LAYER2], comps=("plain", "gzip"))
    tar_dir(d, f"{TOP}/oci-archive.tar")
    check_built(build(f"{TOP}/oci-archive.tar", f"{TOP}/ociar.ext4"), f"{TOP}/ociar.ext4")
    check(not leftovers(TOP), f"left behind: {leftovers(TOP)}")


def t_docker_archive():
    write_docker(f"{TOP}/docker.tar", [LAYER1, LAYER2])
    check_built(build(f"{TOP}/docker.tar", f"{TOP}/docker.ext4"), f"{TOP}/docker.ext4")


def t_start_cmd():
    p = build(f"{TOP}/layout", f"{TOP}/startcmd.ext4", extra=["--start-cmd"])
    check(p.returncode == 0 and json.loads(p.stdout)["config"]["start_cmd"] is True, p.stdout + p.stderr)
    check(json.loads(debugfs(f"{TOP}/startcmd.ext4", "cat /.forkd/image.json"))["start_cmd"] is True, "start_cmd")


def refused(name, layers, want, extra=(), **kw):
    d = f"{TOP}/bad-{name}"
    os.makedirs(f"{TOP}/out-{name}")
    write_oci(d, layers, **kw)
    out = f"{TOP}/out-{name}/rootfs.ext4"
    cache = f"{TOP}/out-{name}/cache"
    p = build(d, out, cache=cache, extra=extra)
    check(p.returncode == 2, f"exit {p.returncode}, stderr {p.stderr!r}")
    check(want in p.stderr, f"stderr {p.stderr!r} does not name {want!r}")
    check(len(p.stderr.strip().splitlines()) == 1, f"more than one line: {p.stderr!r}")
    check(not os.path.exists(out), "ROOTFS left behind")
    check(os.listdir(f"{TOP}/out-{name}") == ["cache"], f"left: {os.listdir(f'{TOP}/out-{name}')}")
    check(not leftovers(cache), f"left in the cache: {leftovers(cache)}")
    return p


def t_dotdot():
    refused("dotdot", [LAYER1, [member("../x", b"x")]], '"../x"')


def t_symlink_escape():
    outside = f"{TOP}/outside"
    os.makedirs(outside)
    refused("symlink", [LAYER1, [member("evil", kind=tarfile.SYMTYPE, linkname=outside),
                                 member("evil/pwned", b"x")]], '"evil/pwned"')
    check(not os.path.exists(f"{outside}/pwned"), "written through the symlink")


def t_hardlink_escape():
    refused("hardlink", [[member("passwd", kind=tarfile.LNKTYPE, linkname="/etc/passwd")]], '"passwd"')
    refused("hardlink2", [[member("x", kind=tarfile.LNKTYPE, linkname="../../etc/passwd")]], '"x"')


def t_overlong():
    refused("overlong", [[member("a/" + "n" * 300, b"x")]], "name too long")
    refused("absolute", [[member("/etc/shadow", b"x")]], '"/etc/shadow"')


def t_hostile_archive():
    d = f"{TOP}/bad-archive-layout"
    write_oci(d, [LAYER1, [member("ok", b"x"), member("../../x", b"x")]])
    tar_dir(d, f"{TOP}/bad-archive.tar")
    os.makedirs(f"{TOP}/out-archive")
    out = f"{TOP}/out-archive/rootfs.ext4"
    p = build(f"{TOP}/bad-archive.tar", out)
    check(p.returncode == 2 and '"../../x"' in p.stderr, f"exit {p.returncode}: {p.stderr!r}")
    check(os.listdir(f"{TOP}/out-archive") == [], f"left: {os.listdir(f'{TOP}/out-archive')}")


def t_device():
    refused("device", [LAYER1, [member("dev/mem", kind=tarfile.CHRTYPE, devmajor=1, devminor=1)]], '"dev/mem"')


def t_bad_digest():
    p = refused("digest", [LAYER1, LAYER2], "layer sha256:", corrupt=True)
    check("SHA-256" in p.stderr, p.stderr)


def t_lying_size():
    p = refused("size", [LAYER1, LAYER2], "layer sha256:", lie_size=True)
    check("size" in p.stderr or "bytes" in p.stderr, p.stderr)


def t_bad_trailer():
    # The tar reads well, then the decompressor finds the blob's checksum wrong:
    # the refusal names the blob's digest, not only "cannot decompress".
    for comp in ("gzip", "zstd"):
        d = f"{TOP}/trailer-{comp}"
        write_oci(d, [LAYER1, LAYER2], comps=(comp,))
        with open(f"{d}/index.json") as f:
            manifest = json.load(f)["manifests"][0]["digest"]
        with open(f"{d}/blobs/sha256/{manifest[7:]}") as f:
            top = json.load(f)["layers"][-1]["digest"]
        with open(f"{d}/blobs/sha256/{top[7:]}", "r+b") as f:
            f.seek(-3, os.SEEK_END)
            b = f.read(1)
            f.seek(-3, os.SEEK_END)
            f.write(bytes([b[0] ^ 0xFF]))
        p = build(d, f"{TOP}/trailer-{comp}.ext4")
        check(p.returncode == 2 and f"layer {top}: the blob's SHA-256 is" in p.stderr, f"{comp}: {p.stderr!r}")
        check(not os.path.exists(f"{TOP}/trailer-{comp}.ext4"), "ROOTFS left behind")


def t_short_size():
    p = refused("short", [LAYER1, LAYER2], "layer sha256:", lie_size=-1)
    check("more than" in p.stderr and "bytes its descriptor says" in p.stderr, p.stderr)


def t_bomb():
    # A few KiB of zstd that would unpack to 64 MiB: refused once past --max-bytes.
    bomb = ociimage.layer_tar([member("x", b"x")]) + bytes(64 << 20)
    p = refused("bomb", [LAYER1, bomb], "larger than the size limit", extra=["--max-bytes", str(16 << 20)])
    check(p.stderr.startswith("layer sha256:"), p.stderr)


def docker_by_digest(path, layers, order):
    """A docker-archive whose layers are blobs/sha256/<diff_id> files (docker 25's
    save), written in the given order of the distinct layers, manifest.json last."""
    parts, cfg = ociimage.image_parts(layers, CONFIG, comps=("plain",))
    names = [f"blobs/sha256/{sha(tar)[7:]}" for _, tar in parts]
    with tarfile.open(path, "w") as t:
        def add(name, b):
            ti = tarfile.TarInfo(name)
            ti.size = len(b)
            t.addfile(ti, io.BytesIO(b))
        add(f"{sha(cfg)[7:]}.json", cfg)
        for i in order:
            add(names[i], parts[i][1])
        add("manifest.json", json.dumps([{"Config": f"{sha(cfg)[7:]}.json", "Layers": names}]).encode())


def t_docker_order():
    # The top layer's blob first: unpacked to wait for its turn, the base read on the way.
    docker_by_digest(f"{TOP}/reversed.tar", [LAYER1, LAYER2], order=[1, 0])
    check_built(build(f"{TOP}/reversed.tar", f"{TOP}/reversed.ext4"), f"{TOP}/reversed.ext4")
    # One blob named by two layers: applied twice.
    again = [member("srv/again.txt", b"again\n")]
    docker_by_digest(f"{TOP}/twice.tar", [LAYER1, again, LAYER2, again], order=[0, 1, 2])
    p = build(f"{TOP}/twice.tar", f"{TOP}/twice.ext4")
    check(p.returncode == 0 and len(json.loads(p.stdout)["layers"]) == 4, p.stdout + p.stderr)
    check(debugfs(f"{TOP}/twice.ext4", "cat /srv/again.txt") == "again\n", "the twice-named layer")
    check(debugfs(f"{TOP}/twice.ext4", "cat /opt/app/hello.txt") == "hello from layer 2\n", "layer 3")
    check(not leftovers(TOP), f"left behind: {leftovers(TOP)}")


def t_docker_diff_id():
    # A layer.tar (no digest in its name) that is not what the config's diff_id says.
    write_docker(f"{TOP}/good.tar", [LAYER1, LAYER2])
    with open(f"{TOP}/good.tar", "rb") as f:
        data = bytearray(f.read())
    data[data.index(b"hello from layer 2")] = ord("j")
    with open(f"{TOP}/changed.tar", "wb") as f:
        f.write(data)
    os.makedirs(f"{TOP}/out-changed")
    p = build(f"{TOP}/changed.tar", f"{TOP}/out-changed/rootfs.ext4", cache=f"{TOP}/out-changed/cache")
    check(p.returncode == 2 and "the config's diff_id says" in p.stderr, f"exit {p.returncode}: {p.stderr!r}")
    check(os.listdir(f"{TOP}/out-changed") == ["cache"], f"left: {os.listdir(f'{TOP}/out-changed')}")
    check(not leftovers(f"{TOP}/out-changed/cache"), "left in the cache")


def t_cache():
    cache = f"{TOP}/cache"
    a, b = f"{TOP}/cache-a", f"{TOP}/cache-b"
    write_oci(a, [LAYER1, LAYER2])
    write_oci(b, [LAYER1, [member("srv/other.txt", b"other image\n")]])
    p = build(a, f"{TOP}/ca.ext4", cache=cache)
    check(p.returncode == 0 and json.loads(p.stdout)["cached_layers"] == 0, p.stdout + p.stderr)
    p = build(b, f"{TOP}/cb.ext4", cache=cache)
    check(p.returncode == 0, p.stderr)
    check(json.loads(p.stdout)["cached_layers"] == 1, p.stdout)
    check(debugfs(f"{TOP}/cb.ext4", "cat /srv/other.txt") == "other image\n", "image b's file")
    check(not exists(f"{TOP}/cb.ext4", "/opt/app/hello.txt"), "image a's layer 2 leaked into b")
    check(debugfs(f"{TOP}/cb.ext4", "cat /etc/old.conf") == "to be whited out\n", "the cache lost a file")
    res = check_built(build(a, f"{TOP}/ca2.ext4", cache=cache), f"{TOP}/ca2.ext4")
    check(res["cached_layers"] == 2 and res["rootfs_cached"], f"the same image again is its cached disk: {res}")
    check(os.stat(f"{TOP}/ca2.ext4").st_ino == os.stat(f"{TOP}/ca.ext4").st_ino, "not a link to the cached disk")
    write_docker(f"{TOP}/cache-a.tar", [LAYER1, LAYER2])
    res = check_built(build(f"{TOP}/cache-a.tar", f"{TOP}/ca-docker.ext4", cache=cache), f"{TOP}/ca-docker.ext4")
    check(res["rootfs_cached"], f"the same image as a docker-archive is the cached disk too: {res}")
    check(not leftovers(cache), f"left in the cache: {leftovers(cache)}")
    # A cached image's layer blobs are not read again: with its top layer's blob
    # overwritten, image a is still its cached disk ...
    with open(f"{a}/index.json") as f:
        manifest = json.load(f)["manifests"][0]["digest"]
    with open(f"{a}/blobs/sha256/{manifest[7:]}") as f:
        top = json.load(f)["layers"][-1]["digest"]
    with open(f"{a}/blobs/sha256/{top[7:]}", "r+b") as f:
        f.write(b"not the layer")
    res = check_built(build(a, f"{TOP}/ca3.ext4", cache=cache), f"{TOP}/ca3.ext4")
    check(res["rootfs_cached"], f"a cached image with a broken top layer blob: {res}")
    # Without the cached disks, and with half-written layer entries: both ignored.
    for n in os.listdir(cache):
        if n.startswith("rootfs-"):
            os.unlink(f"{cache}/{n}")
        else:
            os.unlink(f"{cache}/{n}/done")
    p = build(b, f"{TOP}/cb2.ext4", cache=cache)
    check(p.returncode == 0 and json.loads(p.stdout)["cached_layers"] == 0, p.stdout + p.stderr)
    # ... and once it has to be read, the broken blob is refused.
    p = build(a, f"{TOP}/ca4.ext4", cache=cache)
    check(p.returncode == 2 and f"layer {top}: the blob" in p.stderr, p.stdout + p.stderr)


def t_umoci_skopeo():
    missing = [t for t in ("umoci", "skopeo") if not shutil.which(t)]
    if missing:
        if os.environ.get("CI"):
            raise AssertionError(f"not installed: {missing} (tools/install-deps)")
        raise Skip(f"not installed: {missing}")
    d = f"{TOP}/umoci"
    rootless = [] if os.geteuid() == 0 else ["--rootless"]

    def run(*argv):
        p = subprocess.run(argv, capture_output=True, text=True)
        check(p.returncode == 0, f"{argv}: {p.stderr}")

    run("umoci", "init", "--layout", d)
    run("umoci", "new", "--image", f"{d}:t")
    run("umoci", "unpack", *rootless, "--image", f"{d}:t", f"{TOP}/bundle")
    os.makedirs(f"{TOP}/bundle/rootfs/opt/app")
    with open(f"{TOP}/bundle/rootfs/opt/app/hello.txt", "w") as f:
        f.write("hello from umoci\n")
    run("umoci", "repack", "--image", f"{d}:t", f"{TOP}/bundle")
    run("umoci", "config", "--image", f"{d}:t", "--config.env", "GREETING=hi", "--config.workingdir", "/opt/app")
    run("skopeo", "--insecure-policy", "copy", f"oci:{d}:t", f"oci-archive:{TOP}/umoci-oci.tar")
    run("skopeo", "--insecure-policy", "copy", f"oci:{d}:t", f"docker-archive:{TOP}/umoci-docker.tar:forkd/t:1")
    for src in (d, f"{TOP}/umoci-oci.tar", f"{TOP}/umoci-docker.tar"):
        out = f"{TOP}/umoci-{os.path.basename(src)}.ext4"
        p = build(src, out)
        check(p.returncode == 0, f"{src}: {p.stderr}")
        check(debugfs(out, "cat /opt/app/hello.txt") == "hello from umoci\n", f"{src}: hello.txt")
        cfg = json.loads(debugfs(out, "cat /.forkd/image.json"))
        check("GREETING=hi" in cfg["env"] and cfg["working_dir"] == "/opt/app", f"{src}: {cfg}")


def t_unprivileged():
    if os.geteuid() != 0:
        raise Skip("already not root (the other tests ran as this user)")
    d = f"{TOP}/nobody"
    os.makedirs(d)
    os.chmod(d, 0o777)
    os.chmod(TOP, 0o755)

    def drop():
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    fd = os.open(f"{TOP}/layout", os.O_RDONLY | os.O_DIRECTORY)
    try:
        p = subprocess.run([FORKD_OCI, "build", "--image-fd", str(fd), "--agent", AGENT, "--out", f"{d}/r.ext4",
                            "--cache", f"{d}/cache"], pass_fds=[fd], capture_output=True, text=True,
                           preexec_fn=drop, timeout=300)
    finally:
        os.close(fd)
    if p.returncode != 0 and "Permission denied" in p.stderr and not os.access(AGENT, os.R_OK):
        raise Skip("the agent is not readable by nobody")
    check(p.returncode == 0, p.stderr)
    check(debugfs(f"{d}/r.ext4", "cat /opt/app/hello.txt") == "hello from layer 2\n", "hello.txt as nobody")


def t_by_reference():
    """--ref against a docker-registry on loopback: the first build fetches every
    blob; the same image again fetches its manifest and config only (its root disk
    is cached); an image that shares the first layer fetches only its second."""
    if not ociregistry.binary():
        if os.environ.get("CI"):
            raise AssertionError("docker-registry is not installed (tools/install-deps)")
        raise Skip("docker-registry is not installed")
    d = f"{TOP}/by-ref"
    os.makedirs(f"{d}/registry")
    reg = ociregistry.Registry(f"{d}/registry")
    try:
        config = f"{d}/registries.json"
        with open(config, "w") as f:
            json.dump({"registries": [{"host": reg.host, "insecure_http": True}]}, f)
        base = LAYER1 + [member("opt/big.bin", os.urandom(256 * 1024))]  # does not compress
        write_oci(f"{d}/a", [base, [member("srv/a.txt", b"image a\n")]])
        write_oci(f"{d}/b", [base, [member("srv/b.txt", b"image b\n")]])
        for name in ("a", "b"):
            p = subprocess.run([REGISTRY_TOOL, "push-layout", f"{d}/{name}", f"{reg.host}/forkd/{name}:1", "--config",
                                config], capture_output=True, text=True, timeout=120)
            check(p.returncode == 0, p.stderr)

        def pull(name, out):
            p = subprocess.run([FORKD_OCI, "build", "--ref", f"{reg.host}/forkd/{name}:1", "--registry-config", config,
                                "--agent", AGENT, "--out", f"{d}/{out}", "--cache", f"{d}/cache"],
                               capture_output=True, text=True, timeout=300)
            check(p.returncode == 0, p.stderr)
            return json.loads(p.stdout)
        res = pull("a", "a1.ext4")
        check(res["fetched_bytes"] >= 256 * 1024 and not res["rootfs_cached"], f"the first pull: {res}")
        check(exists(f"{d}/a1.ext4", "/opt/big.bin") and exists(f"{d}/a1.ext4", "/srv/a.txt"), "image a's layers")
        res = pull("a", "a2.ext4")
        check(res["rootfs_cached"] and res["fetched_bytes"] < 64 * 1024, f"the same image again: {res}")
        check(os.stat(f"{d}/a2.ext4").st_ino == os.stat(f"{d}/a1.ext4").st_ino, "not the cached disk")
        res = pull("b", "b.ext4")
        check(res["cached_layers"] == 1 and not res["rootfs_cached"] and res["fetched_bytes"] < 64 * 1024,
              f"an image sharing the first layer: {res}")
        check(debugfs(f"{d}/b.ext4", "cat /srv/b.txt") == "image b\n", "image b's own layer")
    finally:
        reg.stop()


def main():
    tap = Tap()
    try:
        for name, fn in [
            ("OCI layout directory", t_layout),
            ("oci-archive", t_oci_archive),
            ("docker-archive", t_docker_archive),
            ("--start-cmd", t_start_cmd),
            ("refused: .. path", t_dotdot),
            ("refused: a file through a symlink out of the tree", t_symlink_escape),
            ("refused: hard links out of the tree", t_hardlink_escape),
            ("refused: device node", t_device),
            ("refused: overlong and absolute names", t_overlong),
            ("refused: a hostile layer in an oci-archive", t_hostile_archive),
            ("refused: layer digest mismatch", t_bad_digest),
            ("refused: manifest lies about a size", t_lying_size),
            ("refused: a blob whose compressed trailer is damaged", t_bad_trailer),
            ("refused: a blob longer than its descriptor", t_short_size),
            ("refused: a layer that decompresses past --max-bytes", t_bomb),
            ("refused: a docker-archive layer that is not its diff_id", t_docker_diff_id),
            ("docker-archive: layers out of order, one blob named twice", t_docker_order),
            ("layer cache: a cached image's layers are not read again, a broken one is refused when read", t_cache),
            ("--ref: a cached image fetches its manifest and config only, a shared layer is not fetched", t_by_reference),
            ("umoci image through skopeo", t_umoci_skopeo),
            ("as an unprivileged user", t_unprivileged),
        ]:
            tap.run(name, fn)
    finally:
        shutil.rmtree(TOP, ignore_errors=True)
    sys.exit(tap.done())


if __name__ == "__main__":
    main()
