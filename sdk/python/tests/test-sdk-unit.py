#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
The SDK's own behaviour that the real stack cannot show on demand: every HTTP
status to its typed error, timeouts (the SDK's own and the per-call ones),
the bytes it puts on the wire (forkd's SDK's bodies), the files cap checked
before sending, a pack cut off midway leaving nothing behind. Against a small
HTTP server in this process (http.server, real sockets), TAP output.
"""

import base64
import io
import json
import os
import socket
import sys
import tempfile
import time
import traceback

import forkd
from forkd import Controller, InvalidArgument, Sandbox
from sdkserver import Server, raises
from tap import Tap, check


S = Server()


def ctl(**kw):
    return Controller(S.url, token=kw.pop("token", "tok"), **kw)


# ---------------------------------------------------------------- tests


def t_env():
    saved = {k: os.environ.pop(k, None) for k in ("FORKD_URL", "FORKD_TOKEN", "FORKD_TOKEN_FILE")}
    try:
        c = Controller()
        check(c.base_url == "http://127.0.0.1:8889" and c.token is None, c.base_url)
        os.environ["FORKD_URL"] = S.url + "/"
        os.environ["FORKD_TOKEN"] = "from-env"
        c = Controller()
        check(c.base_url == S.url and c.token == "from-env", (c.base_url, c.token))
        S.json(200, [])
        check(c.list_snapshots() == [], "list")
        check(S.last()["headers"].get("Authorization") == "Bearer from-env", S.last()["headers"])
        del os.environ["FORKD_TOKEN"]
        with tempfile.NamedTemporaryFile("w", delete=False) as f:
            f.write("from-file\n")
        os.environ["FORKD_TOKEN_FILE"] = f.name
        check(Controller().token == "from-file", "FORKD_TOKEN_FILE")
        os.unlink(f.name)
        raises(InvalidArgument, Controller)
        del os.environ["FORKD_TOKEN_FILE"]
        # explicit arguments win
        check(Controller("http://h:1", token="t").base_url == "http://h:1", "base_url argument")
        c = Controller(S.url + "/prefix", token=None)
        c.list_snapshots()
        check(S.last()["path"] == "/prefix/v1/snapshots" and "Authorization" not in S.last()["headers"], S.last())
        for bad in ("ftp://x", "localhost:8889", "http://", "http://h:99999", "http://h/?q=1", "http://u:p@h"):
            raises(InvalidArgument, Controller, bad)
        raises(InvalidArgument, Controller, S.url, token="a\nb")
        raises(InvalidArgument, Controller, S.url, timeout=0)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def t_errors():
    table = {400: forkd.BadRequest, 401: forkd.Unauthorized, 403: forkd.Forbidden, 404: forkd.NotFound,
             405: forkd.MethodNotAllowed, 409: forkd.Conflict, 413: forkd.PayloadTooLarge, 500: forkd.ServerError,
             501: forkd.Unsupported, 502: forkd.ServerError, 503: forkd.Unavailable, 504: forkd.Timeout,
             418: forkd.ForkdError}
    c = ctl()
    for status, cls in table.items():
        S.json(status, {"error": f"message {status}"})
        e = raises(cls, c.get_sandbox, "sb-1")
        check(type(e) is cls and e.status == status and e.message == f"message {status}", repr(e))
        check(e.body == {"error": f"message {status}"} and e.method == "GET" and e.url == S.url + "/v1/sandboxes/sb-1",
              vars(e))
        check(f"HTTP {status}: message {status}" in str(e), str(e))
        check(isinstance(e, forkd.ControllerError), "forkd's SDK's name")
    check(issubclass(forkd.Timeout, TimeoutError) and issubclass(forkd.ConnectionFailed, ConnectionError), "builtins")
    S.reply = lambda req: (502, "text/html", b"<h1>Bad Gateway</h1>\n")
    e = raises(forkd.ServerError, c.list_snapshots)
    check(e.message == "<h1>Bad Gateway</h1>" and e.body == "<h1>Bad Gateway</h1>\n", repr(e))
    S.reply = lambda req: (404, None, b"")
    e = raises(forkd.NotFound, c.list_snapshots)
    check(e.message == "HTTP status 404" and e.body is None, repr(e))
    # success that is not what the API promises
    S.reply = lambda req: (200, "application/json", b"{nope")
    raises(forkd.ProtocolError, c.list_snapshots)
    S.json(200, {"children": ["ok", "../bad"]})
    raises(forkd.ProtocolError, c.fork_sandbox, "sb-1", 2)
    S.reply = lambda req: (204, None, b"")
    check(c.kill_sandbox("sb-1") is None and c.delete_snapshot("t") is None, "204 is None")
    # nothing listens
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    e = raises(forkd.ConnectionFailed, Controller(f"http://127.0.0.1:{port}").list_snapshots)
    check(e.status is None and str(port) in str(e), e)


def t_timeouts():
    def slow(h):
        time.sleep(1.5)
        try:
            h.send_response(200)
            h.send_header("Content-Length", "2")
            h.end_headers()
            h.wfile.write(b"[]")
        except OSError:
            pass  # the client gave up, as it should

    S.reply = lambda req: slow
    c = ctl(timeout=0.3)
    t0 = time.monotonic()
    e = raises(forkd.Timeout, c.list_snapshots)
    check(e.status is None and time.monotonic() - t0 < 1.2 and "0.3" in e.message, (e, time.monotonic() - t0))
    t0 = time.monotonic()
    raises(forkd.Timeout, ctl().run_code, "sb-1", "x = 1", timeout=0.3)
    check(time.monotonic() - t0 < 1.2, "the per-call timeout")
    time.sleep(1.3)


def t_timeout_per_call():
    seen = []
    c = ctl()
    real = c._connection
    c._connection = lambda t: (seen.append(t), real(t))[1]
    S.json(200, {"stdout": "", "stderr": "", "exit_code": 0, "error": None, "children": ["a"]})
    c.exec_sandbox("sb-1", ["true"], timeout_secs=100)
    c.exec_command("sb-1", ["true"])
    c.run_code("sb-1", "x", timeout_secs=600)
    c.run_code("sb-1", "x")
    c.fork_sandbox("sb-1", 1)
    c.diff("sb-1", "sb-2")
    c.get_sandbox("sb-1")
    c.eval_sandbox("sb-1", "1")
    c.create_snapshot("t", "/k", "/r", boot_wait_secs=300)
    check(seen == [145.0, 75.0, 645.0, 75.0, 615.0, 135.0, 60.0, 60.0, 435.0], seen)
    seen.clear()
    check(ctl(timeout=900)._timeout(None, 100) == 900.0, "the constructor's timeout is the least")
    c.spawn_sandboxes("t", n=5, timeout=7)
    check(seen == [7.0], seen)


def t_wire():
    c = ctl()
    S.json(201, [{"id": "sb-1"}])
    c.spawn_sandboxes("base")
    r = S.last()
    check(r["method"] == "POST" and r["path"] == "/v1/sandboxes", r)
    check(r["body"] == b'{"snapshot_tag": "base", "n": 1, "per_child_netns": false}', r["body"])
    check(r["headers"]["Content-Type"] == "application/json" and r["headers"]["Authorization"] == "Bearer tok", r)
    c.spawn_sandboxes("base", n=3, per_child_netns=True, memory_limit_mib=64, prewarm=True, live_fork=True,
                      hugepages=True)
    check(S.last_body() == {"snapshot_tag": "base", "n": 3, "per_child_netns": True, "memory_limit_mib": 64,
                            "prewarm": True, "live_fork": True, "hugepages": True}, S.last_body())
    rate = {"bandwidth": 10 << 20, "ops": 100}
    c.spawn_sandboxes("base", cpu_limit=0.5, disk_rate=rate, net_rate={"bandwidth": 4096})
    check(S.last_body() == {"snapshot_tag": "base", "n": 1, "per_child_netns": False, "cpu_limit": 0.5,
                            "disk_rate": rate, "net_rate": {"bandwidth": 4096}}, S.last_body())
    S.json(200, {"children": ["sb-2"]})
    c.fork_sandbox("sb-1", 2, cpu_limit=1, disk_rate=rate)
    check(S.last()["path"] == "/v1/sandboxes/sb-1/fork" and
          S.last_body() == {"n": 2, "cpu_limit": 1, "disk_rate": rate}, S.last())
    c.fork_sandbox("sb-1")
    check(S.last_body() == {"n": 1}, S.last_body())
    S.json(200, {"id": "sb-1"})
    c.set_limits("sb-1", cpu_limit=0, net_rate={"bandwidth": 0}, memory_limit_mib=64)
    check(S.last()["method"] == "PATCH" and S.last()["path"] == "/v1/sandboxes/sb-1" and
          S.last_body() == {"cpu_limit": 0, "net_rate": {"bandwidth": 0}, "memory_limit_mib": 64}, S.last())
    S.json(201, {"tag": "b"})
    for kw, want in (({}, {}), ({"tag": "b"}, {"tag": "b"}), ({"diff": True}, {"diff": True}),
                     ({"mode": "live", "diff": True, "wait": False}, {"mode": "live", "wait": False}),
                     ({"measure_diff": True}, {"measure_diff": True})):
        c.branch_sandbox("sb-1", **kw)
        check(S.last()["path"] == "/v1/sandboxes/sb-1/branch" and S.last_body() == want, (kw, S.last()))
    S.json(200, {"pong": True})
    c.ping_sandbox("sb-1")
    check(S.last()["body"] == b"" and "Content-Type" not in S.last()["headers"], S.last())
    c.exec_command("sb-1", ["ls", "-l"])
    check(S.last_body() == {"args": ["ls", "-l"], "timeout_secs": 30}, S.last_body())
    c.eval_code("sb-1", "1+1")
    check(S.last_body() == {"code": "1+1"} and S.last()["path"] == "/v1/sandboxes/sb-1/eval", S.last())
    c.run_code("sb-1", "x = 1")
    check(S.last_body() == {"code": "x = 1"}, S.last_body())
    c.diff("sb-1", "sb-2", paths=["/etc"])
    check(S.last_body() == {"other": "sb-2", "paths": ["/etc"]}, S.last_body())
    c.merge("sb-1", "sb-2")
    check(S.last_body() == {"winner": "sb-2"} and S.last()["path"] == "/v1/sandboxes/sb-1/merge", S.last())
    c.compact_snapshot("a", "b")
    check(S.last_body() == {"to": "b"} and S.last()["path"] == "/v1/snapshots/a/compact", S.last())
    S.reply = lambda req: (204, None, b"")
    c.delete_snapshot("a", cascade=True)
    check(S.last()["method"] == "DELETE" and S.last()["path"] == "/v1/snapshots/a?cascade=true", S.last())
    raises(InvalidArgument, c.delete_snapshot, "a", cascade=True, force=True)
    n = len(S.requests)
    for call in (lambda: c.get_sandbox("a/b"), lambda: c.get_sandbox(""), lambda: c.get_sandbox("x" * 65),
                 lambda: c.kill_sandbox("-a"), lambda: c.spawn_sandboxes("t", n=True),
                 lambda: c.exec_sandbox("sb-1", "ls"), lambda: c.exec_sandbox("sb-1", []),
                 lambda: c.exec_sandbox("sb-1", ["ls"], timeout_secs=3601), lambda: c.diff("sb-1", "sb-2", paths="/x"),
                 lambda: c.create_snapshot("t", "rel", "/r"), lambda: c.compact_snapshot("a", "a"),
                 lambda: c.run_code("sb-1", "y" * (256 * 1024 + 1)), lambda: c.set_limits("sb-1"),
                 lambda: c.spawn_sandboxes("t", cpu_limit="1"), lambda: c.fork_sandbox("sb-1", cpu_limit=True),
                 lambda: c.fork_sandbox("sb-1", disk_rate={"rate": 1}), lambda: c.set_limits("sb-1", disk_rate={}),
                 lambda: c.set_limits("sb-1", net_rate={"ops": -1}), lambda: c.set_limits("sb-1", net_rate=5)):
        raises(InvalidArgument, call)
    check(len(S.requests) == n, "a refused argument sent a request")


def t_files():
    c = ctl()
    S.json(200, {"path": "/f", "size": 3})
    c.write_file("sb-1", "/f", "abc", mode=0o644)
    r = S.last()
    check(r["path"] == "/v1/sandboxes/sb-1/files/write", r)
    check(S.last_body() == {"path": "/f", "data_b64": "YWJj", "mode": 420}, S.last_body())
    big = os.urandom(forkd.FILE_MAX)
    c.write_file("sb-1", "/f", io.BytesIO(big))
    check(base64.b64decode(S.last_body()["data_b64"]) == big, "512 KiB exactly goes")
    n = len(S.requests)
    e = raises(InvalidArgument, c.write_file, "sb-1", "/f", big + b"x")
    check("524288" in str(e) and len(S.requests) == n, e)
    raises(InvalidArgument, c.write_file, "sb-1", "/f", io.BytesIO(big + b"x"))
    raises(InvalidArgument, c.write_file, "sb-1", "/f", 12)
    raises(InvalidArgument, c.write_file, "sb-1", "/f", b"x", mode=0o10000)
    check(len(S.requests) == n, "nothing sent")
    S.json(200, {"path": "/f", "data_b64": base64.b64encode(b"\x00\xffhi").decode(), "size": 4})
    check(c.read_file("sb-1", "/f") == b"\x00\xffhi" and S.last_body() == {"path": "/f"}, "read")
    sb = Sandbox.connect("sb-1", controller=c)
    check(sb.files.read("/f", format="bytes") == b"\x00\xffhi", "files.read bytes")
    check(sb.files.read("/f") == "\x00\ufffdhi", "files.read text")
    S.json(200, {"path": "/f", "data_b64": "!!!", "size": 3})
    raises(forkd.ProtocolError, c.read_file, "sb-1", "/f")
    S.json(200, {"path": "/f", "data_b64": "YWJj", "size": 4})
    raises(forkd.ProtocolError, c.read_file, "sb-1", "/f")
    S.json(404, {"error": "no such file: /f"})
    e = raises(forkd.NotFound, sb.files.read, "/f")
    check(e.message == "no such file: /f", e)
    S.json(413, {"error": "file larger than 524288 bytes"})
    raises(forkd.PayloadTooLarge, sb.files.read, "/f")


def t_pack_unpack():
    chunks = [b"\x28\xb5\x2f\xfd" + os.urandom(1000), os.urandom(70000)]

    def stream(cut):
        def f(h):
            h.send_response(200)
            h.send_header("Content-Type", "application/zstd")
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            for ch in chunks:
                h.wfile.write(b"%x\r\n" % len(ch) + ch + b"\r\n")
                h.wfile.flush()
            if not cut:
                h.wfile.write(b"0\r\n\r\n")
            h.close_connection = True
        return f

    c = ctl()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "b.tar.zst")
        S.reply = lambda req: stream(False)
        check(c.pack("base", out) == sum(map(len, chunks)), "bytes counted")
        check(open(out, "rb").read() == b"".join(chunks) and S.last()["path"] == "/v1/snapshots/base/pack", "pack")
        check(os.listdir(d) == ["b.tar.zst"], os.listdir(d))
        # cut midway: an error, and the old file stays as it was, no temporary left
        with open(out, "wb") as f:
            f.write(b"old")
        S.reply = lambda req: stream(True)
        raises(forkd.ProtocolError, c.pack, "base", out)
        check(os.listdir(d) == ["b.tar.zst"] and open(out, "rb").read() == b"old", os.listdir(d))
        S.json(404, {"error": "no such snapshot 'base'"})
        raises(forkd.NotFound, c.pack, "base", out)
        check(os.listdir(d) == ["b.tar.zst"] and open(out, "rb").read() == b"old", os.listdir(d))
        os.unlink(out)
        raises(forkd.NotFound, c.pack, "base", out)
        check(os.listdir(d) == [], os.listdir(d))
        buf = io.BytesIO()
        S.reply = lambda req: stream(False)
        c.pack("base", buf)
        check(buf.getvalue() == b"".join(chunks), "pack into a file object")
        # unpack: path, bytes, file object; the body and its length as they are
        with open(out, "wb") as f:
            f.write(b"bundle-bytes")
        S.json(201, [{"tag": "base"}])
        check(c.unpack(out, tag="new") == [{"tag": "base"}], "unpack")
        r = S.last()
        check(r["path"] == "/v1/snapshots/unpack?tag=new" and r["body"] == b"bundle-bytes" and
              r["headers"]["Content-Type"] == "application/zstd" and r["headers"]["Content-Length"] == "12", r)
        c.unpack(b"raw")
        check(S.last()["path"] == "/v1/snapshots/unpack" and S.last()["body"] == b"raw", S.last())
        f = io.BytesIO(b"xxpartial")
        f.seek(2)
        c.unpack(f)
        check(S.last()["body"] == b"partial", S.last())
        raises(InvalidArgument, c.unpack, 5)
        raises(InvalidArgument, c.unpack, b"x", tag="../t")


def t_sandbox():
    c = ctl()
    S.json(201, [{"id": "sb-new", "pid": 1}])
    sb = Sandbox.create("base", controller=c)
    check(sb.id == "sb-new" and S.last_body()["snapshot_tag"] == "base", sb)
    # A server without the process routes: commands.run takes the exec route
    # (tests/test-sdk-commands-unit.py tests the process routes).
    exec_answer = json.dumps({"stdout": "hi\n", "stderr": "", "exit_code": 0, "truncated": False,
                              "timed_out": False}).encode()
    S.reply = lambda req: ((404, "application/json", b'{"error": "no route for POST /v1/sandboxes/sb-new/processes"}')
                           if req["path"].endswith("/processes") else (200, "application/json", exec_answer))
    r = sb.commands.run("echo hi")
    check(S.last_body() == {"args": ["/bin/sh", "-c", "echo hi"], "timeout_secs": 60, "stream": True}, S.last_body())
    check(r == forkd.CommandResult("hi\n", "", 0), r)
    sb.commands.run(["ls", "/"], timeout=5)
    check(S.last_body() == {"args": ["ls", "/"], "timeout_secs": 5, "stream": True}, S.last_body())
    sb.commands.run(["ls", "/"], timeout=0)  # no time limit: the process routes, then exec
    check(S.last_body() == {"args": ["ls", "/"], "timeout_secs": 0}, S.last_body())
    S.json(200, {"stdout": "", "stderr": "NameError: x\n", "error": "NameError: x", "exit_code": 1})
    r = sb.run_code("print(x)", timeout=9)
    check(S.last_body() == {"code": "print(x)", "timeout_secs": 9} and r.error == "NameError: x" and
          r.exit_code == 1 and r.text == "", r)
    S.json(200, {"stdout": 5, "stderr": "", "error": None, "exit_code": 0})
    raises(forkd.ProtocolError, sb.run_code, "x")
    S.json(200, {"children": ["sb-a", "sb-b"]})
    kids = sb.fork(2)
    check([k.id for k in kids] == ["sb-a", "sb-b"] and S.last_body() == {"n": 2}, kids)
    raises(InvalidArgument, sb.fork, 33)
    S.json(200, {"added": [], "removed": [], "modified": []})
    sb.diff(kids[0], paths=["/root"])
    check(S.last()["path"] == "/v1/sandboxes/sb-new/diff" and S.last_body() == {"other": "sb-a", "paths": ["/root"]},
          S.last())
    S.json(200, {"id": "sb-new", "pid": 2})
    check(sb.merge_into(kids[1]) is sb and S.last_body() == {"winner": "sb-b"}, S.last())
    n = len(S.requests)
    kids[1].close()
    check(len(S.requests) == n, "close() of a merged winner sends nothing")
    raises(InvalidArgument, kids[1].run_code, "x")
    raises(InvalidArgument, sb.merge_into, kids[1])
    S.json(201, {"tag": "br"})
    sb.branch()
    check(S.last_body() == {"mode": "full"}, S.last_body())
    sb.branch(tag="br", mode="diff")
    check(S.last_body() == {"tag": "br", "mode": "diff"}, S.last_body())
    S.json(404, {"error": "no such sandbox"})
    with sb:
        pass
    check(S.last()["method"] == "DELETE" and S.last()["path"] == "/v1/sandboxes/sb-new", "exit closes; 404 is fine")
    n = len(S.requests)
    sb.close()
    check(len(S.requests) == n, "close() twice sends once")
    # an error inside the with block is not hidden by close()'s
    S.json(503, {"error": "daemon down"})
    try:
        with Sandbox.connect("sb-z", controller=c):
            raise KeyError("inside")
    except KeyError:
        pass
    raises(InvalidArgument, Sandbox, "base", sandbox_id="sb-1", controller=c)
    saved = os.environ.pop("FORKD_SNAPSHOT", None)
    try:
        raises(InvalidArgument, Sandbox, controller=c)
    finally:
        if saved is not None:
            os.environ["FORKD_SNAPSHOT"] = saved


def main():
    tap = Tap()
    for name, fn in (
            ("FORKD_URL, FORKD_TOKEN, FORKD_TOKEN_FILE, the bearer header, base_url checks", t_env),
            ("every status to its typed error with the server's message; protocol errors; no server", t_errors),
            ("the SDK's timeout, and a per-call one", t_timeouts),
            ("each call waits the server's own bound plus a margin", t_timeout_per_call),
            ("forkd's SDK's bodies on the wire; arguments refused before sending", t_wire),
            ("files: base64 both ways, the 512 KiB cap before sending, shapes checked", t_files),
            ("pack streams into a path or a file object, a cut-off bundle leaves nothing; unpack", t_pack_unpack),
            ("Sandbox: commands.run, run_code, fork, diff, merge_into, branch, close", t_sandbox)):
        tap.run(name, fn)
    print(f"1..{tap.n}", flush=True)
    S.httpd.shutdown()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
