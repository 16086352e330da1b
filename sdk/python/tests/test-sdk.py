#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
Our Python SDK (sdk/python/forkd) against the real stack: a private
dbus-daemon, forkd with forkd-vmm, forkd-rest (tests/rest/test-rest.py's Stack),
real HTTP, TAP output. Every Controller method and the Sandbox surface
(create, commands.run, files, run_code, fork, diff, merge_into, branch, close),
the typed errors, pack/unpack, and sdk/python/examples/tree_search.py.

The guest (FORKD_SDK_GUEST):
  test   (default) the test guest natively (/dev/kvm may be PVM); run_code is
         its tiny language (tests/guest/files.c)
  linux  the Linux guest of tools/mkimage, run_code is Python: needs real KVM
         (the test host). The image is FORKD_GUEST_IMAGE (a tools/mkimage
         directory: vmlinuz, rootfs.ext4) or FORKD_GUEST_KERNEL and
         FORKD_GUEST_ROOTFS; FORKD_SDK_BOOT_WAIT (default 300) is the snapshot's
         boot_wait_secs.
With FORKD_SDK_EXTERNAL=1 the test brings up nothing and uses the stack at
FORKD_URL with FORKD_TOKEN or FORKD_TOKEN_FILE (as `tools/forkd-stack up`
prints them, with FORKD_GUEST_KERNEL and FORKD_GUEST_ROOTFS).

Environment otherwise: as tests/rest/test-rest.py (sdk/python/meson.build).
"""

import importlib.util
import io
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.dirname(HERE)
TOP = os.path.dirname(os.path.dirname(SDK))

import forkd
from forkd import (BadRequest, Conflict, Controller, ForkdError, InvalidArgument, NotFound, PtySize, Sandbox,
                   ServerError, Unauthorized)

_spec = importlib.util.spec_from_file_location("test_rest", os.path.join(TOP, "tests", "rest", "test-rest.py"))
tr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tr)
check, Skip = tr.check, tr.Skip

GUEST_KIND = os.environ.get("FORKD_SDK_GUEST", "test")
EXTERNAL = os.environ.get("FORKD_SDK_EXTERNAL") == "1"
TAG = "sdk-py"


class TestGuest:
    """run_code in the test guest's language; exec runs only ["sh", "-c", CODE],
    as run_code does; eval is refused."""

    def set(self, var, value):
        return f"{var} = {value}"

    def show(self, var):
        return f"print {var}"

    def write(self, path, text):
        return f"write {path} {text}"

    def cat(self, path):
        return f"cat {path}"

    def shell_cat(self, path):
        return f"cat {path}"

    failing = "print nosuch"
    error_name = "NameError"
    boot_wait = 10


class LinuxGuest:
    def set(self, var, value):
        return f"{var} = {value!r}"

    def show(self, var):
        return f"print({var})"

    def write(self, path, text):
        return f"open({path!r}, 'w').write({text!r})"

    def cat(self, path):
        return f"print(open({path!r}).read())"

    def shell_cat(self, path):
        return f"cat {path}; echo"

    failing = "print(nosuch)"
    error_name = "NameError"
    boot_wait = int(os.environ.get("FORKD_SDK_BOOT_WAIT", "300"))


G = LinuxGuest() if GUEST_KIND == "linux" else TestGuest()


class Ctx:
    made_snapshots = []


def ok_code(sb, code):
    r = sb.run_code(code)
    check(r.error is None and r.exit_code == 0 and r.stderr == "", f"{sb.id}: {code!r}: {r}")
    return r.stdout


# ---------------------------------------------------------------- tests


def t_service(ctl, stack):
    check(ctl.healthz() == {"ok": True}, "healthz")
    v = ctl.version()
    check(v.get("api") == "v1" and isinstance(v.get("version"), str), v)


def t_create_snapshot(ctl, stack):
    if GUEST_KIND == "linux":
        img = os.environ.get("FORKD_GUEST_IMAGE")
        kernel = os.environ.get("FORKD_GUEST_KERNEL") or (img and os.path.join(img, "vmlinuz"))
        rootfs = os.environ.get("FORKD_GUEST_ROOTFS") or (img and os.path.join(img, "rootfs.ext4"))
        check(kernel and rootfs, "FORKD_SDK_GUEST=linux needs FORKD_GUEST_IMAGE or FORKD_GUEST_KERNEL/ROOTFS")
    else:
        kernel = os.environ["FORKD_GUEST_KERNEL"] if EXTERNAL else tr.GUEST
        Ctx.tmp = tempfile.mkdtemp(prefix="forkd-sdk-test.") if EXTERNAL else stack.tmp
        rootfs = os.path.join(Ctx.tmp, "rootfs.img")
        with open(rootfs, "wb") as f:
            f.truncate(8 << 20)
    info = ctl.create_snapshot(TAG, kernel, rootfs, boot_wait_secs=G.boot_wait)
    Ctx.made_snapshots.append(TAG)
    check(info["tag"] == TAG and info["dir"].startswith("/"), info)
    check(TAG in [s["tag"] for s in ctl.list_snapshots()], "list_snapshots lists it")
    si = ctl.snapshot_info(TAG)
    check(si["tag"] == TAG and si["chain_depth"] == 0 and si["dependents"] == [], si)
    # REST API v1's "already exists" answer, typed
    try:
        ctl.create_snapshot(TAG, kernel, rootfs, boot_wait_secs=G.boot_wait)
        check(False, "a second snapshot under the same tag was accepted")
    except BadRequest as e:
        check(e.status == 400 and TAG in e.message, e)


def t_controller_sandboxes(ctl, stack):
    sbs = ctl.spawn_sandboxes(TAG, n=2)
    check(len(sbs) == 2 and all(s["snapshot_tag"] == TAG and isinstance(s["pid"], int) for s in sbs), sbs)
    ids = [s["id"] for s in sbs]
    listed = {s["id"] for s in ctl.list_sandboxes()}
    check(set(ids) <= listed, f"{ids} not in {listed}")
    check(ctl.get_sandbox(ids[0])["id"] == ids[0], "get_sandbox")
    p = ctl.ping_sandbox(ids[0])
    check(p.get("pong") is True, p)
    # exec (both names), run_code, eval
    code = G.set("x", "5") + ("; " if GUEST_KIND == "test" else "\n") + G.show("x")
    if GUEST_KIND == "test":
        r = ctl.exec_sandbox(ids[0], ["sh", "-c", "x = 5; print x"], timeout_secs=10)
        check(r["stdout"] == "5\n" and r["exit_code"] == 0, r)
        r = ctl.exec_command(ids[0], ["sh", "-c", "print x"])
        check(r["stdout"] == "5\n", r)
        try:
            ctl.eval_sandbox(ids[0], "1 + 1")
            check(False, "the test guest evaluated an expression")
        except ServerError as e:
            check(e.status == 500 and e.message, e)
    else:
        r = ctl.exec_sandbox(ids[0], ["sh", "-c", "echo hello; echo oops >&2; exit 3"], timeout_secs=30)
        check(r["stdout"] == "hello\n" and r["stderr"] == "oops\n" and r["exit_code"] == 3, r)
        r = ctl.exec_command(ids[0], ["python3", "-c", "print(2+2)"])
        check(r["stdout"] == "4\n", r)
        r = ctl.eval_sandbox(ids[0], "1 + 1")
        check(r.get("result") == "2", r)
        check(ctl.eval_code(ids[0], "len('abc')").get("result") == "3", "eval_code")
    r = ctl.run_code(ids[1], code, timeout_secs=20)
    check(r["stdout"] == "5\n" and r["error"] is None and r["exit_code"] == 0, r)
    check(ctl.run_code(ids[1], G.show("x"))["stdout"] == "5\n", "globals persist through Controller.run_code")
    for sid in ids:
        check(ctl.kill_sandbox(sid) is None, "kill_sandbox returns None")
    try:
        ctl.get_sandbox(ids[0])
        check(False, "a killed sandbox is still there")
    except NotFound as e:
        check(e.status == 404 and e.message, e)


def t_errors(ctl, stack):
    # 404 with the server's message, as the typed error and as forkd's ControllerError
    for call in (lambda: ctl.get_sandbox("sb-nosuch"), lambda: ctl.kill_sandbox("sb-nosuch"),
                 lambda: ctl.spawn_sandboxes("nosuch-tag"), lambda: ctl.snapshot_info("nosuch-tag"),
                 lambda: Sandbox.connect("sb-nosuch", controller=ctl).run_code("x = 1")):
        try:
            call()
            check(False, "no error")
        except NotFound as e:
            check(isinstance(e, forkd.ControllerError) and e.status == 404 and e.message and
                  e.body == {"error": e.message},
                  repr(e))
    # 400: the server's refusal (a fork of 33: Podflare's text)
    sid = ctl.spawn_sandboxes(TAG)[0]["id"]
    try:
        ctl._call("POST", f"/v1/sandboxes/{sid}/fork", {"n": 33})
        check(False, "fork of 33 accepted")
    except BadRequest as e:
        check(e.status == 400 and "between 1 and 32" in e.message, e)
    ctl.kill_sandbox(sid)
    # refused before sending: no request made
    for call in (lambda: ctl.get_sandbox("../etc"), lambda: ctl.spawn_sandboxes(TAG, n=0),
                 lambda: ctl.fork_sandbox("sb-x", n=33), lambda: ctl.branch_sandbox("sb-x", mode="half"),
                 lambda: ctl.diff("sb-x", "sb-y", paths=["relative"]), lambda: ctl.run_code("sb-x", "a\0b"),
                 lambda: ctl.write_file("sb-x", "/f", b"x" * (forkd.FILE_MAX + 1)),
                 lambda: ctl.write_file("sb-x", "relative", b"x"), lambda: ctl.merge("sb-x", "sb-x")):
        try:
            call()
            check(False, "no error")
        except InvalidArgument as e:
            check(e.status is None and isinstance(e, ValueError), repr(e))
    # 401: a wrong token, and none
    for token in ("wrong-token", None):
        bad = Controller(ctl.base_url, token="placeholder", timeout=10)
        bad.token = token
        try:
            bad.list_snapshots()
            check(False, f"token {token!r} accepted")
        except Unauthorized as e:
            check(e.status == 401 and e.message, e)
    # no server there: ConnectionFailed, status None
    port = tr.free_port()
    try:
        Controller(f"http://127.0.0.1:{port}", timeout=5).list_snapshots()
        check(False, "a closed port answered")
    except forkd.ConnectionFailed as e:
        check(e.status is None, e)


def t_sandbox_e2b(ctl, stack):
    sb = Sandbox.create(TAG, controller=ctl)
    with sb:
        check(sb.info["id"] == sb.id and sb.is_running(), sb)
        check(ok_code(sb, G.set("x", "41")) == "", "x = 41")
        check(ok_code(sb, G.show("x")) == "41\n", "globals persist")
        r = sb.run_code(G.failing)
        check(r.exit_code == 1 and r.error.startswith(G.error_name), r)
        check(ok_code(sb, G.show("x")) == "41\n", "state kept after an error")
        ok_code(sb, G.write("/root/e2b.txt", "hello"))
        r = sb.commands.run(G.shell_cat("/root/e2b.txt"))
        check(isinstance(r, forkd.CommandResult) and r.stdout == "hello\n" and r.exit_code == 0, r)
        if GUEST_KIND == "linux":
            try:
                r = sb.commands.run(["sh", "-c", "echo err >&2; exit 7"], timeout=10)
                check(False, f"exit 7 did not raise: {r}")
            except forkd.CommandExitException as e:
                check(e.stderr == "err\n" and e.exit_code == 7, e)
            check(sb.commands.run("exit 0").exit_code == 0, "exit 0")
        check(sb.ping().get("pong") is True, "ping")
    check(not sb.is_running(), "the context manager closed it")
    try:
        ctl.get_sandbox(sb.id)
        check(False, "still there after close")
    except NotFound:
        pass
    sb.close()  # idempotent
    try:
        sb.run_code("x = 1")
        check(False, "a closed sandbox ran code")
    except InvalidArgument:
        pass
    # $FORKD_URL / $FORKD_TOKEN and $FORKD_SNAPSHOT: Sandbox() as Podflare writes it
    env = dict(os.environ, FORKD_URL=ctl.base_url, FORKD_TOKEN=ctl.token or "", FORKD_SNAPSHOT=TAG)
    env.pop("FORKD_TOKEN_FILE", None)
    out = subprocess.run([sys.executable, "-c",
                          "import sys; sys.path.insert(0, sys.argv[1]); import forkd\n"
                          "with forkd.Sandbox() as s: print(s.id, s.ping()['pong'])", SDK],
                         env=env, capture_output=True, text=True, timeout=300)
    check(out.returncode == 0 and out.stdout.split()[1] == "True", out)
    check(out.stdout.split()[0] not in {s["id"] for s in ctl.list_sandboxes()}, "Sandbox() left its sandbox")


def files_route(sb):
    """Skip while forkd-rest has no files routes (another change adds them)."""
    try:
        sb.files.read("/nonexistent-sdk-probe")
    except NotFound as e:
        if e.message.startswith("no route for"):
            raise Skip("forkd-rest has no POST /v1/sandboxes/:id/files/{write,read} yet") from e
        return
    except forkd.Unsupported as e:
        raise Skip(f"files ops not supported here: {e.message}") from e
    check(False, "a missing file was read")


def t_files(ctl, stack):
    with Sandbox.create(TAG, controller=ctl) as sb:
        # the cap is the SDK's before it is the server's: nothing sent, nothing written
        try:
            sb.files.write("/root/big", b"\0" * (forkd.FILE_MAX + 1))
            check(False, "over the cap")
        except InvalidArgument as e:
            check("512" in str(e) or str(forkd.FILE_MAX) in str(e), e)
        files_route(sb)
        r = sb.files.write("/root/f.txt", "hello from the sdk")
        check(r == {"path": "/root/f.txt", "size": 18}, r)
        check(sb.files.read("/root/f.txt") == "hello from the sdk", "text round trip")
        if GUEST_KIND == "test":
            check(ok_code(sb, G.cat("/root/f.txt")) == "hello from the sdk\n", "run_code sees the file")
        else:
            check(ok_code(sb, G.cat("/root/f.txt")) == "hello from the sdk\n", "Python sees the file")
        blob = bytes(range(256)) * (1 if GUEST_KIND == "test" else 2048)
        blob = blob[:200] if GUEST_KIND == "test" else blob[:forkd.FILE_MAX]
        check(sb.files.write("/root/b.bin", io.BytesIO(blob))["size"] == len(blob), "file object")
        check(sb.files.read("/root/b.bin", format="bytes") == blob, "binary round trip")
        if GUEST_KIND == "linux":
            sb.files.write("/root/m.txt", b"secret", mode=0o600)
            check(sb.commands.run("stat -c %a /root/m.txt").stdout == "600\n", "mode")
            check(sb.commands.run("head -c 600000 /dev/zero > /root/big").exit_code == 0, "a big file")
            try:
                sb.files.read("/root/big")
                check(False, "read more than the cap")
            except forkd.PayloadTooLarge as e:
                check(e.status == 413 and e.message, e)
        try:
            sb.files.read("/root/nosuch")
            check(False, "read a missing file")
        except NotFound as e:
            check(e.status == 404 and e.message, e)
        try:
            sb.files.write("/root/../etc/x", "no")
            check(False, "a path with .. was written")
        except BadRequest as e:
            check(e.status == 400 and "path" in e.message, e)


def expect_exit(fn, *a, **kw):
    try:
        r = fn(*a, **kw)
    except forkd.CommandExitException as e:
        return e
    check(False, f"no CommandExitException: {r}")


def t_processes_test_guest(ctl):
    """The E2B surface over the test guest's built-in programs (no terminals there)."""
    with Sandbox.create(TAG, controller=ctl) as sb:
        outs = []
        r = sb.commands.run("echo one two", on_stdout=outs.append)
        check(r.stdout == "one two\n" and r.stderr == "" and r.exit_code == 0 and "".join(outs) == r.stdout, (r, outs))
        check(sb.commands.run("true").exit_code == 0, "true")
        e = expect_exit(sb.commands.run, "x = 1; nosuch")
        check(e.exit_code == 1 and e.stderr.startswith("SyntaxError"), e)
        h = sb.commands.run("cat", background=True, stdin=True)
        check(h.pid in [p.pid for p in sb.commands.list()], "listed")
        h.send_stdin("hi\n")
        h.close_stdin()
        check(h.wait().stdout == "hi\n", h.stdout)
        h = sb.commands.run("sleep 300000", background=True)
        check(h.kill() is True, "kill")
        e = expect_exit(h.wait)
        check(e.signal == 9 and e.exit_code == -9, e)
        h = sb.commands.run("ticker 3 300", background=True)
        h.disconnect()
        out = sb.commands.connect(h.pid).wait().stdout
        check([ln.split()[1] for ln in out.splitlines()] == ["0", "1", "2"], "connect follows from the start")


def t_processes(ctl, stack):
    if GUEST_KIND != "linux":
        return t_processes_test_guest(ctl)
    with Sandbox.create(TAG, controller=ctl) as sb:
        try:
            sb.commands.list()
        except NotFound as e:
            if e.message.startswith("no route for"):
                raise Skip("forkd-rest has no /v1/sandboxes/:id/processes routes yet") from e
            raise
        outs = []
        r = sb.commands.run("echo one; echo two >&2; printf '\\303\\251'", on_stdout=outs.append)
        check(r.stdout == "one\n\u00e9" and r.stderr == "two\n" and r.exit_code == 0 and "".join(outs) == r.stdout,
              (r, outs))
        e = expect_exit(sb.commands.run, "exit 3")
        check(e.exit_code == 3 and e.signal is None, e)
        h = sb.commands.run("read x; echo got $x", background=True, stdin=True)
        check(h.pid in [p.pid for p in sb.commands.list()], "listed")
        h.send_stdin("hi\n")
        check(h.wait().stdout == "got hi\n", h.stdout)
        h = sb.commands.run("sleep 300", background=True)
        check(h.kill() is True, "kill")
        e = expect_exit(h.wait)
        check(e.signal == 9 and e.exit_code == -9, e)
        h = sb.commands.run("echo early; sleep 1; echo late", background=True)
        h.disconnect()
        check(sb.commands.connect(h.pid).wait().stdout == "early\nlate\n", "connect follows from the start")
        data = []
        t = sb.pty.create(PtySize(rows=24, cols=80), on_data=data.append)
        sb.pty.resize(t.pid, PtySize(rows=30, cols=100))
        sb.pty.send_stdin(t.pid, b"stty size; exit 5\n")
        e = expect_exit(t.wait, timeout=60)
        check(e.exit_code == 5 and b"30 100" in b"".join(data), (e, b"".join(data)[-300:]))


def t_fork_diff(ctl, stack):
    with Sandbox.create(TAG, controller=ctl) as parent:
        ok_code(parent, G.set("x", "42"))
        a, b = parent.fork(n=2)
        try:
            check(all(isinstance(k, Sandbox) for k in (a, b)) and a.id != b.id != parent.id, (a, b))
            for k in (a, b):
                check(ok_code(k, G.show("x")) == "42\n", f"{k.id} inherits x")
            # REST API v1's diff example
            ok_code(a, G.write("/root/a.txt", "from a"))
            ok_code(b, G.write("/root/b.txt", "from b"))
            d = a.diff(b)
            check(d == {"added": ["/root/b.txt"], "removed": ["/root/a.txt"], "modified": []}, d)
            check(a.diff(b.id, paths=["/root/a.txt"]) == {"added": [], "removed": ["/root/a.txt"], "modified": []},
                  "diff by id with paths")
            ok_code(a, G.write("/tmp/m.txt", "one"))
            ok_code(b, G.write("/tmp/m.txt", "two"))
            check(b.diff(a)["modified"] == ["/tmp/m.txt"], "modified under /tmp")
            ok_code(a, G.set("x", "43"))
            check(ok_code(b, G.show("x")) == "42\n" and ok_code(parent, G.show("x")) == "42\n", "a's x is its own")
        finally:
            a.close()
            b.close()
        check(not a.is_running() and not b.is_running(), "children closed")


def t_merge_branch(ctl, stack):
    with Sandbox.create(TAG, controller=ctl) as parent:
        ok_code(parent, G.set("x", "parent"))
        kids = parent.fork(3)
        try:
            for i, k in enumerate(kids):
                ok_code(k, G.set("x", f"kid{i}") + ("; " if GUEST_KIND == "test" else "\n") +
                        G.write("/root/kid.txt", f"kid{i}"))
            winner = kids[1]
            pid = winner.info["pid"]
            check(parent.merge_into(winner) is parent, "merge_into returns the parent")
            check(parent.info["pid"] == pid, "the parent drives the winner's VM")
            check(ok_code(parent, G.show("x")) == "kid1\n", "the parent has the winner's globals")
            check(ok_code(parent, G.cat("/root/kid.txt")) == "kid1\n", "and its files")
            check(not winner.is_running(), "the winner is spent")
            try:
                winner.run_code("x = 1")
                check(False, "a merged sandbox ran code")
            except InvalidArgument:
                pass
            check(ctl.merge(parent.id, kids[2].id)["id"] == parent.id, "Controller.merge")
            check(ok_code(parent, G.show("x")) == "kid2\n", "merged again")
            kids[2]._defunct = True  # merged through the Controller: that Sandbox does not know
            # branch: a snapshot of the running parent, and a sandbox of it
            info = parent.branch(tag="sdk-py-branch")
            Ctx.made_snapshots.append("sdk-py-branch")
            check(info["tag"] == "sdk-py-branch", info)
            ok_code(parent, G.set("x", "after"))
            with Sandbox.create(info["tag"], controller=ctl) as child:
                check(ok_code(child, G.show("x")) == "kid2\n", "the branch has the state at the branch")
            auto = parent.branch()
            Ctx.made_snapshots.append(auto["tag"])
            check(auto["tag"] and auto["tag"] != "sdk-py-branch", auto)
            try:
                parent.branch(tag="sdk-py-branch")
                check(False, "a branch over an existing tag")
            except (Conflict, BadRequest) as e:
                check(e.status in (400, 409), e)
        finally:
            for k in kids:
                k.close()


def t_chain_pack(ctl, stack):
    """branch in diff mode (a chain link), delete with dependents (409), compact,
    pack and unpack through files and file objects."""
    sb = ctl.spawn_sandboxes(TAG)[0]["id"]
    try:
        link = ctl.branch_sandbox(sb, tag="sdk-py-link", mode="diff")
        Ctx.made_snapshots.append("sdk-py-link")
    finally:
        ctl.kill_sandbox(sb)
    check(link.get("parent_tag") == TAG, link)
    check(ctl.snapshot_info(TAG)["dependents"] == ["sdk-py-link"], "the base names its dependent")
    try:
        ctl.delete_snapshot(TAG)
        check(False, "a snapshot with dependents was deleted")
    except Conflict as e:
        check(e.status == 409 and "sdk-py-link" in e.message, e)
    flat = ctl.compact_snapshot("sdk-py-link", "sdk-py-flat")
    Ctx.made_snapshots.append("sdk-py-flat")
    check(flat["tag"] == "sdk-py-flat" and ctl.snapshot_info("sdk-py-flat")["chain_depth"] == 0, flat)
    with tempfile.TemporaryDirectory(prefix="forkd-sdk-test.") as d:
        out = os.path.join(d, "chain.tar.zst")
        n = ctl.pack("sdk-py-link", out)
        check(n == os.path.getsize(out) and n > 0, f"{n} bytes, {os.path.getsize(out)} on disk")
        with open(out, "rb") as f:
            check(f.read(4) == b"\x28\xb5\x2f\xfd", "a zstd stream")
        buf = io.BytesIO()
        check(ctl.pack("sdk-py-flat", buf) == len(buf.getvalue()) > 0, "pack into a file object")
        # a failed pack leaves nothing behind
        try:
            ctl.pack("sdk-py-nosuch", os.path.join(d, "none.tar.zst"))
            check(False, "packed a missing snapshot")
        except NotFound:
            pass
        check(sorted(os.listdir(d)) == ["chain.tar.zst"], os.listdir(d))
        # unpack: the chain's root is still registered, so the whole bundle is refused
        ctl.delete_snapshot("sdk-py-link")
        try:
            ctl.unpack(out)
            check(False, "a bundle over an existing snapshot was unpacked")
        except Conflict as e:
            check(TAG in e.message, e)
        check("sdk-py-link" not in [s["tag"] for s in ctl.list_snapshots()], "a refused bundle registered its link")
        try:
            ctl.unpack(io.BytesIO(buf.getvalue()))
            check(False, "an existing tag was unpacked over")
        except Conflict as e:
            check("sdk-py-flat" in e.message, e)
        flat_file = os.path.join(d, "flat.tar.zst")
        with open(flat_file, "wb") as f:
            f.write(buf.getvalue())
        r = ctl.unpack(flat_file, tag="sdk-py-unpacked")
        Ctx.made_snapshots.append("sdk-py-unpacked")
        check([s["tag"] for s in r] == ["sdk-py-unpacked"], r)
    with Sandbox.create("sdk-py-unpacked", controller=ctl) as sb:
        check(sb.ping().get("pong") is True, "a sandbox of the unpacked snapshot")
    try:
        ctl.unpack(b"not a bundle", tag="sdk-py-bad")
        check(False, "garbage unpacked")
    except BadRequest:
        pass
    ctl.delete_snapshot("sdk-py-unpacked")
    ctl.delete_snapshot("sdk-py-flat")


def t_tree_search(ctl, stack):
    env = dict(os.environ, FORKD_URL=ctl.base_url, FORKD_TOKEN=ctl.token or "")
    env.pop("FORKD_TOKEN_FILE", None)
    before = {s["id"] for s in ctl.list_sandboxes()}
    out = subprocess.run([sys.executable, os.path.join(SDK, "examples", "tree_search.py"), TAG, "--guest", GUEST_KIND],
                         env=env, capture_output=True, text=True, timeout=1200)
    for line in (out.stdout + out.stderr).splitlines():
        print(f"# tree_search.py: {line}")
    check(out.returncode == 0, f"tree_search.py exited with {out.returncode}")
    lines = out.stdout.splitlines()
    check(len([x for x in lines if x.startswith("plan ")]) == 5, lines)
    check("winner: plan 3 (spread of column 2)" in lines, lines)
    check({s["id"] for s in ctl.list_sandboxes()} == before, "tree_search.py left sandboxes behind")


def t_https(ctl, stack):
    if stack is None:
        raise Skip("an external stack: its forkd-rest is plain HTTP")
    openssl = shutil.which("openssl")
    if not openssl:
        raise Skip("openssl not installed")
    cert, key = os.path.join(stack.tmp, "sdk-cert.pem"), os.path.join(stack.tmp, "sdk-key.pem")
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    os.chmod(key, 0o600)
    p, port = stack.start_rest("--tls-cert", cert, "--tls-key", key)
    tls = Controller(f"https://127.0.0.1:{port}", token=ctl.token, ssl_context=ssl.create_default_context(cafile=cert))
    check(TAG in [s["tag"] for s in tls.list_snapshots()], "list_snapshots over HTTPS")
    with Sandbox.create(TAG, controller=tls) as sb:
        check(ok_code(sb, G.set("y", "7") + ("; " if GUEST_KIND == "test" else "\n") + G.show("y")) == "7\n",
              "run_code over HTTPS")
    try:
        Controller(f"https://127.0.0.1:{port}", token=ctl.token).list_snapshots()
        check(False, "an untrusted certificate was accepted")
    except forkd.ConnectionFailed as e:
        check(e.status is None and "CERTIFICATE" in str(e).upper(), e)
    stack.stop(p)


def cleanup(ctl):
    for s in ctl.list_sandboxes():
        try:
            ctl.kill_sandbox(s["id"])
        except ForkdError:
            pass
    for tag in reversed(Ctx.made_snapshots):
        try:
            ctl.delete_snapshot(tag, cascade=True)
        except ForkdError:
            pass


def main():
    tap = tr.Tap()
    stack = rest = None
    if EXTERNAL:
        if not os.environ.get("FORKD_URL"):
            print("1..0 # SKIP FORKD_SDK_EXTERNAL=1 needs FORKD_URL")
            return 0
    else:
        missing = [what for what, path in (("forkd-rest", tr.REST), ("forkd", tr.DAEMON), ("forkd-vmm", tr.VMM),
                                           ("test guest", tr.GUEST), ("dbus-daemon", tr.DBUS_DAEMON))
                   if not path or not os.path.exists(path)]
        if missing:
            print(f"1..0 # SKIP not built or not installed: {', '.join(missing)}")
            return 0
        if not os.access("/dev/kvm", os.R_OK | os.W_OK):
            print("1..0 # SKIP /dev/kvm is not usable")
            return 0
    print(f"# guest: {GUEST_KIND}{' (external stack)' if EXTERNAL else ''}", flush=True)
    if not EXTERNAL:
        stack = tr.Stack()
        signal.signal(signal.SIGTERM, lambda *a: (stack.cleanup(), sys.exit(1)))
    try:
        if EXTERNAL:
            ctl = Controller()
        else:
            stack.start_bus()
            rest, port = stack.start_rest("--timeout", "60")
            c = tr.Client(port)
            stack.start_daemon()
            tr.wait_daemon(c, stack)
            ctl = Controller(f"http://127.0.0.1:{port}", token=tr.TOKEN)
        tests = [
            ("healthz and version", t_service),
            ("create_snapshot, list_snapshots, snapshot_info; the existing tag is a BadRequest", t_create_snapshot),
            ("spawn/list/get/ping/exec/eval/run_code/kill through Controller", t_controller_sandboxes),
            ("typed errors: NotFound, BadRequest, Unauthorized, InvalidArgument before sending, ConnectionFailed",
             t_errors),
            ("Sandbox.create, run_code with persistent globals, commands.run, context manager, Sandbox() from "
             "the environment", t_sandbox_e2b),
            ("files.write and files.read (the cap before sending)", t_files),
            ("commands (run, background, stdin, kill, connect) and pty (create, resize, send_stdin; "
             "the Linux guest only)", t_processes),
            ("fork(n) inherits globals; diff (REST API v1's example)", t_fork_diff),
            ("merge_into: the parent drives the winner's VM; branch and a sandbox of it", t_merge_branch),
            ("diff branch, Conflict on delete, compact_snapshot, pack and unpack", t_chain_pack),
            ("examples/tree_search.py (REST API v1's tree search) runs", t_tree_search),
            ("https:// with an ssl_context; an untrusted certificate is ConnectionFailed", t_https),
        ]
        for name, fn in tests:
            tap.run(name, fn, ctl, stack)
            if fn is t_create_snapshot and tap.failed:
                break
        try:
            left = ctl.list_sandboxes()
            tap.run("no sandbox left behind", lambda *a: check(left == [], left))
        finally:
            cleanup(ctl)
        if stack:
            stack.finish(tap, c, rest)
    finally:
        if stack:
            stack.cleanup()
        elif getattr(Ctx, "tmp", None):
            shutil.rmtree(Ctx.tmp, ignore_errors=True)
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
