#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
Files in a sandbox end to end: POST /v1/sandboxes/:id/files/write and
/files/read over real HTTP against forkd-rest, a private dbus-daemon, the real
forkd with forkd-vmm and the test guest (its file table: 47-byte paths, 256
bytes a file, 8 files; tests/guest/files.c); WriteFile and ReadFile on D-Bus
(the Manager and the Sandbox objects, error names) with tests/lib/dbusmini.py.
TAP output; the machinery (Stack, Client, Tap) is test-rest.py's.

Environment: as test-rest.py (tests/rest/meson.build).
"""

import base64
import importlib.util
import json
import os
import signal
import sys

from dbusmini import Bus, DBusError

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("test_rest", os.path.join(HERE, "test-rest.py"))
tr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tr)
check, Skip = tr.check, tr.Skip

TAG = "files"
CAP = 524288


def b64(data):
    return base64.b64encode(data).decode()


def fork(c, n):
    r = c.expect(201, "POST", "/v1/sandboxes", {"snapshot_tag": TAG, "n": n})
    return [sb["id"] for sb in r.json]


def write(c, sid, path, data, status=200, **extra):
    r = c.expect(status, "POST", f"/v1/sandboxes/{sid}/files/write", dict({"path": path, "data_b64": b64(data)}, **extra))
    if status == 200:
        check(r.json == {"path": path, "size": len(data)}, r)
    return r.json


def read(c, sid, path, status=200):
    r = c.expect(status, "POST", f"/v1/sandboxes/{sid}/files/read", {"path": path})
    if status != 200:
        return r.json["error"]
    check(list(r.json) == ["path", "data_b64", "size"] and r.json["path"] == path, r)
    data = base64.b64decode(r.json["data_b64"], validate=True)
    check(len(data) == r.json["size"], r)
    return data


def t_setup(c, stack):
    rootfs = os.path.join(stack.tmp, "rootfs.img")
    with open(rootfs, "wb") as f:
        f.truncate(8 << 20)
    c.expect(201, "POST", "/v1/snapshots", {"tag": TAG, "kernel": tr.GUEST, "rootfs": rootfs, "boot_wait_secs": 10})


class Ctx:
    pass


def t_round_trip(c, stack):
    sid = fork(c, 1)[0]
    Ctx.sb = sid
    data = bytes(range(256))
    write(c, sid, "/root/a.bin", data, mode=0o600)
    check(read(c, sid, "/root/a.bin") == data, "256 bytes back")
    # replace; mode absent and null take the default; an empty file
    write(c, sid, "/root/a.bin", b"\x00\xff new\n")
    check(read(c, sid, "/root/a.bin") == b"\x00\xff new\n", "replaced")
    write(c, sid, "/tmp/e", b"", mode=None)
    check(read(c, sid, "/tmp/e") == b"", "empty")
    # the same table run_code sees
    write(c, sid, "/tmp/t.txt", b"from files/write")
    r = c.expect(200, "POST", f"/v1/sandboxes/{sid}/run_code", {"code": "cat /tmp/t.txt; write /tmp/u from run_code"})
    check(r.json["stdout"] == "from files/write\n", r)
    check(read(c, sid, "/tmp/u") == b"from run_code", "run_code's file")


def t_errors(c, stack):
    sid = Ctx.sb
    w, rd = f"/v1/sandboxes/{sid}/files/write", f"/v1/sandboxes/{sid}/files/read"
    for body in ({}, {"path": "/a"}, {"data_b64": ""}, {"path": 1, "data_b64": ""}, {"path": "/a", "data_b64": 1},
                 {"path": "rel", "data_b64": ""}, {"path": "/a/../b", "data_b64": ""}, {"path": "/a//b", "data_b64": ""},
                 {"path": "/a/", "data_b64": ""}, {"path": "/a/./b", "data_b64": ""}, {"path": "/a\nb", "data_b64": ""},
                 {"path": "/" + "x" * 4095, "data_b64": ""}, {"path": None, "data_b64": ""},
                 {"path": "/a", "data_b64": "eA"}, {"path": "/a", "data_b64": "e A=="}, {"path": "/a", "data_b64": "eB=="},
                 {"path": "/a", "data_b64": "eA==\n"}, {"path": "/a", "data_b64": "e-8_"},
                 {"path": "/a", "data_b64": "", "mode": 4096}, {"path": "/a", "data_b64": "", "mode": -1},
                 {"path": "/a", "data_b64": "", "mode": "420"}, {"path": "/a", "data_b64": "", "mode": 1.5}):
        r = c.expect(400, "POST", w, body)
    check("normalized" in c.expect(400, "POST", w, {"path": "/a/../b", "data_b64": ""}).json["error"], "why")
    check("base64" in c.expect(400, "POST", w, {"path": "/a", "data_b64": "eA"}).json["error"], "why")
    # (unknown fields are left out: whether they are refused is the bridge's general rule)
    for body in ({}, {"path": "rel"}, {"path": ["/a"]}, {"path": None}):
        c.expect(400, "POST", rd, body)
    c.expect(400, "POST", rd, raw=b'{"path": "/a"', headers={"Content-Type": "application/json"})
    c.expect(400, "POST", w)
    c.expect(405, "GET", rd)
    c.expect(400, "POST", "/v1/sandboxes/bad%20id/files/read", {"path": "/a"})
    r = c.expect(404, "POST", "/v1/sandboxes/sb-nosuch/files/read", {"path": "/a"})
    check("sb-nosuch" in r.json["error"], r)
    c.expect(404, "POST", "/v1/sandboxes/sb-nosuch/files/write", {"path": "/a", "data_b64": ""})
    # the guest's answers: no such file, a directory, an ancestor that is a file
    check("/root/nosuch" in read(c, sid, "/root/nosuch", 404) and "No such file" in read(c, sid, "/root/nosuch", 404),
          "404 names the path")
    check("Is a directory" in read(c, sid, "/root", 409), "409 for a directory")
    read(c, sid, "/", 409)
    r = c.expect(409, "POST", w, {"path": "/root", "data_b64": ""})
    check("/root" in r.json["error"], r)
    read(c, sid, "/root/a.bin/x", 404)
    # over the cap: refused by forkd-rest before the bus (413 naming the path; a body over
    # forkd-rest's 1 MiB is test-rest.py's body cap), and over the test guest's own limits:
    # 256 bytes a file (its EFBIG) and its 16 KiB frame (EMSGSIZE), each a 413
    r = c.expect(413, "POST", w, {"path": "/root/big", "data_b64": b64(bytes(CAP + 1))})
    check("/root/big" in r.json["error"] and "524288" in r.json["error"], r)
    r = c.expect(413, "POST", w, {"path": "/root/big", "data_b64": b64(bytes(257))})
    check("/root/big" in r.json["error"] and "File too large" in r.json["error"], r)
    r = c.expect(413, "POST", w, {"path": "/root/big", "data_b64": b64(bytes(CAP))})
    check("payload too large" in r.json["error"], r)
    # a path over the test guest's 47 bytes: its ENAMETOOLONG is a 400
    c.expect(400, "POST", w, {"path": "/" + "n" * 60, "data_b64": ""})
    read(c, sid, "/root/big", 404)
    # and the sandbox kept its files through all of it
    check(read(c, sid, "/root/a.bin") == b"\x00\xff new\n", "state kept")
    r = c.expect(200, "POST", f"/v1/sandboxes/{sid}/ping")
    check(r.json["pong"] is True, r)


def t_fork_isolation(c, stack):
    """A forked child sees its parent's file; what a child or the parent writes
    afterwards is its own."""
    parent = fork(c, 1)[0]
    write(c, parent, "/root/shared", b"parent's")
    kids = c.expect(200, "POST", f"/v1/sandboxes/{parent}/fork", {"n": 2}).json["children"]
    check(len(kids) == 2, kids)
    for k in kids:
        check(read(c, k, "/root/shared") == b"parent's", f"{k} inherits the file")
    write(c, kids[0], "/root/shared", b"kid 0's")
    write(c, kids[0], "/root/only0", b"0")
    write(c, parent, "/root/late", b"after the fork")
    check(read(c, kids[0], "/root/shared") == b"kid 0's", "the child's own write")
    for sid in (kids[1], parent):
        check(read(c, sid, "/root/shared") == b"parent's", f"{sid} keeps the parent's contents")
        read(c, sid, "/root/only0", 404)
    for k in kids:
        read(c, k, "/root/late", 404)
    # children of a snapshot fork (POST /v1/sandboxes) start from the snapshot, not from a sibling
    other = fork(c, 1)[0]
    read(c, other, "/root/shared", 404)
    for sid in [parent, other] + kids:
        c.expect(204, "DELETE", f"/v1/sandboxes/{sid}")


def sandbox_path(sid):
    return "/org/forkd/sandbox/" + "".join(ch if ch.isalnum() else "_%02x" % ord(ch) for ch in sid)


def t_dbus(c, stack):
    """WriteFile and ReadFile on the Manager and on the Sandbox object, their error names."""
    sid = Ctx.sb
    bus = Bus(stack.bus)
    mgr = ("org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager")
    obj = ("org.forkd.Manager", sandbox_path(sid), "org.forkd.Sandbox")

    def err(target, member, sig, args):
        try:
            bus.call(*target, member, sig, args)
        except DBusError as e:
            return e
        raise AssertionError(f"{member}{args!r:.60} succeeded")

    try:
        check(bus.call(*mgr, "WriteFile", "ssayu", (sid, "/tmp/d", b"\x01\x02\x03", 0o644)) == [3], "WriteFile")
        check(bus.call(*mgr, "ReadFile", "ss", (sid, "/tmp/d")) == [[1, 2, 3]], "ReadFile")
        check(bus.call(*obj, "WriteFile", "sayu", ("/tmp/d", b"obj", 0)) == [3], "Sandbox.WriteFile")
        check(bus.call(*obj, "ReadFile", "s", ("/tmp/d",)) == [list(b"obj")], "Sandbox.ReadFile")
        check(read(c, sid, "/tmp/d") == b"obj", "REST sees the D-Bus write")
        for target, member, sig, args, name in (
                (mgr, "ReadFile", "ss", (sid, "/tmp/nosuch"), "org.forkd.Error.NoSuchFile"),
                (obj, "ReadFile", "s", ("/root",), "org.forkd.Error.NotRegularFile"),
                (mgr, "WriteFile", "ssayu", (sid, "/tmp/x", bytes(CAP + 1), 0o644), "org.forkd.Error.FileTooLarge"),
                (obj, "WriteFile", "sayu", ("/tmp/x", bytes(300), 0o644), "org.forkd.Error.FileTooLarge"),
                (mgr, "WriteFile", "ssayu", (sid, "relative", b"", 0o644), "org.freedesktop.DBus.Error.InvalidArgs"),
                (mgr, "WriteFile", "ssayu", (sid, "/tmp/../x", b"", 0o644), "org.freedesktop.DBus.Error.InvalidArgs"),
                (mgr, "WriteFile", "ssayu", (sid, "/tmp/x", b"", 0o10000), "org.freedesktop.DBus.Error.InvalidArgs"),
                (mgr, "ReadFile", "ss", (sid, "/" + "y" * 4095), "org.freedesktop.DBus.Error.InvalidArgs"),
                (mgr, "ReadFile", "ss", ("sb-nosuch", "/tmp/d"), "org.forkd.Error.NoSuchSandbox"),
                (mgr, "ReadFile", "s", (sid,), "org.freedesktop.DBus.Error.InvalidArgs")):
            e = err(target, member, sig, args)
            check(e.name == name, f"{member} {str(args)[:60]}: {e.name} ({e.message}), expected {name}")
        e = err(mgr, "ReadFile", "ss", (sid, "/tmp/nosuch"))
        check("/tmp/nosuch: No such file or directory" in e.message, e)
    finally:
        bus.close()


def main():
    tap = tr.Tap()
    missing = [what for what, path in (("forkd-rest", tr.REST), ("forkd", tr.DAEMON), ("forkd-vmm", tr.VMM),
                                       ("test guest", tr.GUEST), ("dbus-daemon", tr.DBUS_DAEMON))
               if not path or not os.path.exists(path)]
    if missing:
        print(f"1..0 # SKIP not built or not installed: {', '.join(missing)}")
        return 0
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        print("1..0 # SKIP /dev/kvm is not usable")
        return 0
    stack = tr.Stack()
    signal.signal(signal.SIGTERM, lambda *a: (stack.cleanup(), sys.exit(1)))
    try:
        stack.start_bus()
        rest, port = stack.start_rest("--timeout", "60")
        c = tr.Client(port)
        stack.start_daemon()
        tr.wait_daemon(c, stack)
        tests = [
            ("a snapshot of the test guest", t_setup),
            ("POST /v1/sandboxes/:id/files/write and /files/read: round trip, replace, mode, empty, run_code's table",
             t_round_trip),
            ("files: 400, 404, 409 and 413 rows, hostile paths and base64, the test guest's own limits", t_errors),
            ("files across POST /v1/sandboxes/:id/fork: children inherit, writes stay isolated", t_fork_isolation),
            ("WriteFile and ReadFile on D-Bus (Manager and Sandbox object): error names", t_dbus),
        ]
        for name, fn in tests:
            tap.run(name, fn, c, stack)
            if fn is t_setup and tap.failed:
                break
        stack.finish(tap, c, rest)
    finally:
        stack.cleanup()
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
