#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Exercise forkd-test-guest over its agent socket.

Usage: agent-check.py SOCKET [--pings N] [--hostile] [--shutdown]

Connects to the unix stream socket forkd-vmm bridges to the guest's
virtio-console, runs every op of docs/agent-protocol.md with checks, then
(optionally) hostile input and a ping round-trip measurement.
"""
import base64
import hashlib
import json
import socket
import struct
import sys
import time

MAGIC = 0x31414B46
REQ, RESP, ERR, EVENT = 1, 2, 3, 4


def fnv1a(data, h=0xcbf29ce484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


class Agent:
    # Generous: under TCG, beside a second test host, a sanitizer build's VMM has been
    # seen to take over 10 s for one answer.
    def __init__(self, path, timeout=30.0):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(path)
        self.next_id = 1
        self.buf = b""

    def send_raw(self, data):
        self.s.sendall(data)

    def frame(self, ftype, fid, payload, flags=0):
        return struct.pack("<IHHII", MAGIC, ftype, flags, fid, len(payload)) + payload

    def recv_exact(self, n):
        while len(self.buf) < n:
            chunk = self.s.recv(65536)
            if not chunk:
                raise EOFError("agent socket closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv_frame(self):
        magic, ftype, flags, fid, ln = struct.unpack("<IHHII", self.recv_exact(16))
        assert magic == MAGIC, hex(magic)
        assert flags == 0
        payload = self.recv_exact(ln)
        return ftype, fid, json.loads(payload)

    def call(self, op, **args):
        fid = self.next_id
        self.next_id += 1
        body = dict(op=op, **args)
        self.send_raw(self.frame(REQ, fid, json.dumps(body).encode()))
        ftype, rid, obj = self.recv_frame()
        assert rid == fid, (rid, fid)
        return ftype, obj


def check(cond, what):
    if not cond:
        raise SystemExit("FAIL: " + what)
    print("ok:", what)


def main():
    path = sys.argv[1]
    pings = 1000
    if "--pings" in sys.argv:
        pings = int(sys.argv[sys.argv.index("--pings") + 1])
    a = Agent(path)

    t, r = a.call("ping")
    check(t == RESP and r.get("pong") is True and r.get("agent") == "forkd-test-guest", "ping %r" % r)

    t, r = a.call("identity")
    check(t == RESP and len(r["seed"]) == 64 and isinstance(r["wall_ns"], int), "identity %r" % r)
    drift = abs(r["wall_ns"] - time.time_ns()) / 1e6
    print("   wall clock offset vs host: %.3f ms" % drift)

    t, r = a.call("mem_write", offset_pages=3, pages=4, pattern=0xDEADBEEF)
    want = fnv1a(struct.pack("<I", 0xDEADBEEF) * 1024 * 4)
    check(t == RESP and r == {"pages": 4, "checksum": "%016x" % want}, "mem_write %r" % r)
    t, r = a.call("mem_checksum", offset_pages=3, pages=4)
    check(t == RESP and r == {"pages": 4, "checksum": "%016x" % want}, "mem_checksum %r" % r)
    t, r = a.call("mem_checksum", offset_pages=0, pages=1 << 40)
    check(t == ERR, "mem_checksum out of range -> error %r" % r)

    t, r = a.call("disk_write", block=5, pattern=0x01020304)
    want = fnv1a(struct.pack("<I", 0x01020304) * 1024)
    check(t == RESP and r == {"block": 5, "checksum": "%016x" % want}, "disk_write %r" % r)
    t, r = a.call("disk_read", block=5)
    check(t == RESP and r == {"block": 5, "checksum": "%016x" % want, "first": 0x01020304}, "disk_read %r" % r)
    t, r = a.call("disk_read", block=1 << 50)
    check(t == ERR, "disk_read beyond the end -> error %r" % r)

    # run_code: the test guest's file table and variables (tests/guest/files.c)
    def code(c):
        t, r = a.call("run_code", code=c)
        check(t == RESP and set(r) >= {"stdout", "stderr", "error", "exit_code"}, "run_code %r -> %r" % (c, r))
        return r
    r = code("x = 41\nprint x")
    check(r["stdout"] == "41\n" and r["error"] is None and r["exit_code"] == 0 and r["stderr"] == "", r)
    r = code("write /root/a.txt from a; write /tmp/q \"quoted\" \\ x\ncat /root/a.txt;cat /tmp/q; print x")
    check(r["stdout"] == "from a\n\"quoted\" \\ x\n41\n" and r["exit_code"] == 0, r)
    r = code("print y")
    check(r["exit_code"] == 1 and r["error"].startswith("NameError") and r["stdout"] == "" and
          r["stderr"] == r["error"] + "\n", r)
    r = code("cat /root/a.txt\nimport os\nprint x")
    check(r["stdout"] == "from a\n" and r["exit_code"] == 1 and "SyntaxError" in r["error"], "stops at the error %r" % r)
    for bad in ("write relative x", "write /a/../b x", "write /" + "p" * 60 + " x", "write /x " + "d" * 300,
                "rm /nosuch", "cat /root//a.txt"):
        r = code(bad)
        check(r["exit_code"] == 1 and r["error"], "%r -> %r" % (bad[:30], r))
    for args in ({}, {"code": 5}, {"code": "x\ud83d"}, {"code": "y" * 3000}, {"code": "x", "timeout_secs": "1"}):
        t, r = a.call("run_code", **args)
        check(t == ERR, "run_code %r -> error %r" % (str(args)[:40], r))
    # hash_files: SHA-256 of the files under the paths
    sha = lambda b: hashlib.sha256(b).hexdigest()
    t, r = a.call("hash_files", paths=["/root", "/tmp"])
    check(t == RESP and r == {"files": {"/root/a.txt": sha(b"from a"), "/tmp/q": sha(b'"quoted" \\ x')}},
          "hash_files %r" % r)
    code("write /rootless x;write /root/sub/b y;rm /tmp/q")
    t, r = a.call("hash_files", paths=["/root"])
    check(t == RESP and r == {"files": {"/root/a.txt": sha(b"from a"), "/root/sub/b": sha(b"y")}}, "under /root %r" % r)
    t, r = a.call("hash_files", paths=["/"])
    check(t == RESP and len(r["files"]) == 3, "hash_files / %r" % r)
    t, r = a.call("hash_files", paths=[])
    check(t == RESP and r == {"files": {}}, "hash_files [] %r" % r)
    # escaped paths, as json-c writes them ("\/root")
    a.send_raw(a.frame(REQ, 901, b'{"op":"hash_files","paths":["\\/ro\\u006ft"]}'))
    t, fid, r = a.recv_frame()
    check(t == RESP and fid == 901 and list(r["files"]) == ["/root/a.txt", "/root/sub/b"], "escaped path %r" % r)
    for args in ({}, {"paths": "/root"}, {"paths": [1]}, {"paths": ["root"]}, {"paths": ["/a/./b"]},
                 {"paths": ["/x"] * 17}, {"paths": ["/" + "y" * 300]}):
        t, r = a.call("hash_files", **args)
        check(t == ERR, "hash_files %r -> error %r" % (str(args)[:40], r))
    for k in range(8):
        code("write /f%d %d" % (k, k))
    r = code("write /f9 9")
    check(r["exit_code"] == 1 and "full" in r["error"], "file table full %r" % r)
    t, r = a.call("hash_files", paths=["/"])
    check(t == RESP and len(r["files"]) == 8, "a full table still fits one reply %r" % r)
    code("; ".join("rm /f%d" % k for k in range(5)))

    # write_file / read_file over the same table (tests/guest/files.c): 47-byte paths,
    # 256 bytes a file, 8 files; errors carry the errno name and the path
    b64 = lambda b: base64.b64encode(b).decode()
    def refused(op, ename, **args):
        t, r = a.call(op, **args)
        check(t == ERR and r.get("errno") == ename and
              (ename == "ENAMETOOLONG" or args["path"] in r["error"]), "%s %r -> %s %r" % (op, str(args)[:50], ename, r))
    data = bytes(range(256))
    t, r = a.call("write_file", path="/tmp/w.bin", data_b64=b64(data), mode=0o600)
    check(t == RESP and r == {"path": "/tmp/w.bin", "size": 256}, "write_file 256 bytes %r" % r)
    t, r = a.call("read_file", path="/tmp/w.bin")
    check(t == RESP and r == {"path": "/tmp/w.bin", "data_b64": b64(data), "size": 256}, "read_file %r" % r)
    t, r = a.call("write_file", path="/tmp/t", data_b64=b64(b"text\n"))
    check(t == RESP and r["size"] == 5 and code("cat /tmp/t")["stdout"] == "text\n\n", "run_code sees write_file's file")
    code("write /tmp/t from run_code")
    t, r = a.call("read_file", path="/tmp/t")
    check(t == RESP and base64.b64decode(r["data_b64"]) == b"from run_code", "read_file sees run_code's file %r" % r)
    t, r = a.call("hash_files", paths=["/tmp"])
    check(t == RESP and r["files"] == {"/tmp/w.bin": hashlib.sha256(data).hexdigest(),
                                       "/tmp/t": hashlib.sha256(b"from run_code").hexdigest()}, "hash_files %r" % r)
    t, r = a.call("write_file", path="/tmp/t", data_b64="")
    check(t == RESP and r["size"] == 0 and a.call("read_file", path="/tmp/t")[1]["data_b64"] == "", "empty file")
    # json-c writes '/' as "\/": the escaped form decodes to the same bytes
    a.send_raw(a.frame(REQ, 902, b'{"op":"write_file","path":"\\/tmp\\/e","data_b64":"\\/\\/\\/\\/"}'))
    t, fid, r = a.recv_frame()
    check(t == RESP and fid == 902 and r == {"path": "/tmp/e", "size": 3} and
          a.call("read_file", path="/tmp/e")[1]["data_b64"] == "////", "escaped data_b64 %r" % r)
    refused("write_file", "EFBIG", path="/tmp/w.bin", data_b64=b64(data + b"x"))
    refused("write_file", "EFBIG", path="/tmp/w.bin", data_b64=b64(bytes(4000)))
    check(a.call("read_file", path="/tmp/w.bin")[1]["size"] == 256, "a refused write leaves the file")
    refused("read_file", "ENOENT", path="/tmp/nosuch")
    refused("read_file", "EISDIR", path="/root")
    refused("read_file", "EISDIR", path="/")
    refused("write_file", "EISDIR", path="/root", data_b64="")
    refused("write_file", "ENOTDIR", path="/rootless/x", data_b64="")
    refused("read_file", "ENOTDIR", path="/rootless/x")
    refused("write_file", "ENAMETOOLONG", path="/" + "n" * 47, data_b64="")
    refused("read_file", "ENAMETOOLONG", path="/" + "n" * 300)
    for args in ({}, {"path": "rel", "data_b64": ""}, {"path": "/a/../b", "data_b64": ""}, {"path": "/a", "data_b64": "eA"},
                 {"path": "/a", "data_b64": "eB=="}, {"path": "/a", "data_b64": 5}, {"path": "/a"},
                 {"path": "/a", "data_b64": "", "mode": 0o10000}, {"path": "/a", "data_b64": "", "mode": "1"},
                 {"path": 7, "data_b64": ""}):
        t, r = a.call("write_file", **args)
        check(t == ERR and "errno" not in r, "write_file %r -> error %r" % (str(args)[:40], r))
    t, r = a.call("read_file", path="tmp")
    check(t == ERR and "errno" not in r, "read_file of a relative path %r" % r)
    n = 0
    while a.call("write_file", path="/full/%d" % n, data_b64="")[0] == RESP:
        n += 1
    refused("write_file", "ENOSPC", path="/full/%d" % n, data_b64="")
    check(n == 2, "the table took %d more files (8 in all)" % n)
    code("rm /full/0; rm /full/1; rm /tmp/w.bin; rm /tmp/t; rm /tmp/e")

    for op in ("exec", "eval", "nope"):
        t, r = a.call(op)
        check(t == ERR and "error" in r, "%s -> error %r" % (op, r))
    t, r = a.call("mem_write", offset_pages="x", pages=1, pattern=1)
    check(t == ERR, "wrong argument type -> error")

    if "--hostile" in sys.argv:
        for bad in (b"", b"[]", b"{", b'{"op":}', b'{"op":"ping"} x', b'{"op":"ping","a":[[[[' * 20,
                    b'{"op":"p\\ing"}', b'{"op":"ping","x":"\x01"}', b"\xff" * 100):
            a.send_raw(a.frame(REQ, 77, bad))
            t, fid, r = a.recv_frame()
            check(t == ERR and fid == 77, "malformed payload %r -> error" % bad[:20])
        a.send_raw(a.frame(REQ, 78, b"x" * 20000))
        t, fid, r = a.recv_frame()
        check(t == ERR and fid == 78 and r.get("errno") == "EMSGSIZE", "oversized frame -> error with its id %r" % r)
        a.send_raw(b"garbage!" * 5)
        t, fid, r = a.recv_frame()
        check(t == ERR and fid == 0, "bad magic -> one error with id 0")
        a.send_raw(a.frame(REQ, 79, b'{"op":"ping"}', flags=1))
        t, fid, r = a.recv_frame()
        check(t == ERR and fid == 0, "non-zero flags -> error with id 0")
        # byte-at-a-time delivery still reassembles
        data = a.frame(REQ, 80, b'{"op":"ping"}')
        for i in range(len(data)):
            a.send_raw(data[i:i + 1])
            time.sleep(0.001)
        t, fid, r = a.recv_frame()
        check(t == RESP and fid == 80 and r["pong"] is True, "ping delivered one byte at a time")
        # several requests in one write
        a.send_raw(b"".join(a.frame(REQ, 100 + i, b'{"op":"ping"}') for i in range(40)))
        ids = [a.recv_frame()[1] for _ in range(40)]
        check(ids == list(range(100, 140)), "40 pipelined pings answered in order")

    if pings:
        lat = []
        for _ in range(pings):
            t0 = time.perf_counter_ns()
            t, r = a.call("ping")
            lat.append(time.perf_counter_ns() - t0)
            assert t == RESP
        lat.sort()
        print("ping round trip over %d: p50 %.1f us, p90 %.1f us, p99 %.1f us, min %.1f us" % (
            pings, lat[len(lat) // 2] / 1e3, lat[len(lat) * 9 // 10] / 1e3, lat[len(lat) * 99 // 100] / 1e3,
            lat[0] / 1e3))

    if "--shutdown" in sys.argv:
        t, r = a.call("shutdown")
        check(t == RESP and r == {"ok": True}, "shutdown")
    print("all checks passed")


if __name__ == "__main__":
    main()
