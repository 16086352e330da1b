#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Drive the real forkd-agent on the host (not PID 1) over a socketpair.

Usage: test-agent.py FORKD_AGENT [unittest options]

Standard library only. Each test class starts its own agent with
--channel fd:N --no-clock; the agent's PATH puts Debian's python3 first so
that exec and the embedded interpreter see the same numpy. Tests that need
numpy skip (with the reason) when the embedded interpreter has none.
"""
import base64
import hashlib
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

MAGIC = 0x31414B46
REQ, RESP, ERR, EVENT = 1, 2, 3, 4
LIMIT = 1024 * 1024
AGENT = None


def frame(ftype, fid, payload, flags=0, magic=MAGIC, length=None):
    if isinstance(payload, (dict, list)):
        payload = json.dumps(payload).encode()
    n = len(payload) if length is None else length
    return struct.pack("<IHHII", magic, ftype, flags, fid, n) + payload


class Agent:
    def __init__(self, *extra, channel=None, wrapper=()):
        env = dict(os.environ, PATH="/usr/sbin:/usr/bin:/sbin:/bin")
        env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
        self.buf = b""
        self.next_id = 1
        self.stash = {}
        if channel is None:
            self.s, theirs = socket.socketpair()
            fd = theirs.fileno()
            self.p = subprocess.Popen([*wrapper, AGENT, f"--channel=fd:{fd}", "--no-clock", *extra],
                                      pass_fds=[fd], env=env)
            theirs.close()
        else:
            self.p = subprocess.Popen([AGENT, f"--channel={channel}", "--no-clock", *extra], env=env)
            self.s = None
        if self.s:
            self.s.settimeout(float(os.environ.get("AGENT_TEST_TIMEOUT", "60")))

    def close(self):
        if self.s:
            self.s.close()
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise AssertionError("agent did not exit at end of stream")
        return self.p.returncode

    def close_after_ping(self):
        self.ok("ping")
        return self.close()

    def send(self, data):
        self.s.sendall(data)

    def request(self, op, **args):
        fid = self.next_id
        self.next_id += 1
        self.send(frame(REQ, fid, dict(op=op, **args)))
        return fid

    def _read_frame(self):
        while True:
            if len(self.buf) >= 16:
                magic, ftype, flags, fid, n = struct.unpack("<IHHII", self.buf[:16])
                assert magic == MAGIC, f"bad magic from the agent: {magic:#x}"
                assert flags == 0
                assert ftype in (RESP, ERR), ftype
                assert n <= LIMIT, n
                if len(self.buf) >= 16 + n:
                    raw = self.buf[16:16 + n]
                    self.buf = self.buf[16 + n:]
                    raw.decode("utf-8")  # strict UTF-8, raises otherwise
                    assert b"\\u0000" not in raw
                    obj = json.loads(raw)
                    assert isinstance(obj, dict)
                    return ftype, fid, obj
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise EOFError("agent closed the channel")
            self.buf += chunk

    def next(self):
        if self.stash:
            fid = next(iter(self.stash))
            return (fid,) + self.stash.pop(fid)
        ftype, fid, obj = self._read_frame()
        return fid, ftype, obj

    def wait(self, fid):
        if fid in self.stash:
            return self.stash.pop(fid)
        while True:
            ftype, got, obj = self._read_frame()
            if got == fid:
                return ftype, obj
            self.stash[got] = (ftype, obj)

    def call(self, op, **args):
        return self.wait(self.request(op, **args))

    def ok(self, op, **args):
        ftype, obj = self.call(op, **args)
        assert ftype == RESP, (op, obj)
        return obj

    def error(self, op, **args):
        ftype, obj = self.call(op, **args)
        assert ftype == ERR, (op, args, obj)
        assert isinstance(obj.get("error"), str)
        return obj["error"]


def debian_numpy_version():
    try:
        return subprocess.run(["/usr/bin/python3", "-c", "import numpy; print(numpy.__version__)"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def pid_alive(pid):
    """True while /proc/PID exists (a zombie counts: nobody reaped it)."""
    return os.path.exists(f"/proc/{pid}")


class AgentTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.a = Agent()

    @classmethod
    def tearDownClass(cls):
        rc = cls.a.close()
        assert rc == 0, f"agent exited with {rc}"

    def alive(self):
        self.assertTrue(self.a.ok("ping")["pong"])


class TestBasics(AgentTest):
    def test_ping(self):
        r = self.a.ok("ping")
        self.assertIs(r["pong"], True)
        self.assertEqual(r["pid"], self.a.p.pid)
        self.assertEqual(r["agent"], "forkd-agent")
        want = debian_numpy_version()
        if want is None:
            self.assertIsNone(r["numpy_version"])
            self.skipTest("python3-numpy is not installed")
        self.assertEqual(r["numpy_version"], want)

    def test_eval_numpy(self):
        if self.a.ok("ping")["numpy_version"] is None:
            self.skipTest("numpy not importable in the embedded interpreter (apt-get install python3-numpy)")
        r = self.a.ok("eval", code="numpy.zeros(5).sum()")
        self.assertEqual(r["result"], "0.0")
        self.assertIsNone(r["error"])
        self.assertEqual(r["exit_code"], 0)

    def test_eval_zero_division(self):
        r = self.a.ok("eval", code="1/0")
        self.assertIsNone(r["result"])
        self.assertTrue(r["error"].startswith("ZeroDivisionError"), r["error"])
        self.assertNotEqual(r["exit_code"], 0)
        self.assertIn("Traceback", r["stderr"])

    def test_eval_syntax_error(self):
        r = self.a.ok("eval", code="1 +")
        self.assertIsNone(r["result"])
        self.assertTrue(r["error"].startswith("SyntaxError"), r["error"])
        self.alive()

    def test_eval_repr_and_print(self):
        r = self.a.ok("eval", code="print('side') or 'a\\udc80b'")
        self.assertEqual(r["stdout"], "side\n")
        self.assertEqual(r["result"], "'a\\udc80b'")

    def test_exec_python(self):
        r = self.a.ok("exec", args=["python3", "-c", "print(2+2)"])
        self.assertEqual(r["stdout"], "4\n")
        self.assertEqual(r["exit_code"], 0)
        self.assertIs(r["timed_out"], False)
        self.assertIs(r["truncated"], False)

    def test_exec_status_stderr_and_stdin(self):
        r = self.a.ok("exec", args=["sh", "-c", "cat; echo oops >&2; exit 7"])
        self.assertEqual((r["stdout"], r["stderr"], r["exit_code"]), ("", "oops\n", 7))

    def test_exec_signal(self):
        r = self.a.ok("exec", args=["sh", "-c", "kill -TERM $$"])
        self.assertEqual((r["exit_code"], r["signal"]), (128 + 15, 15))

    def test_exec_not_found(self):
        r = self.a.ok("exec", args=["/nonexistent/forkd-no-such-program"])
        self.assertEqual(r["exit_code"], 127)
        self.assertIn("No such file", r["stderr"])

    def test_exec_cwd(self):
        r = self.a.ok("exec", args=["pwd"], cwd="/tmp")
        self.assertEqual(r["stdout"], "/tmp\n")

    def test_exec_binary_output(self):
        r = self.a.ok("exec", args=["printf", "\\377\\000ok"])
        self.assertEqual(r["stdout"], "\ufffd\ufffdok")

    def test_run_code_persists(self):
        r = self.a.ok("run_code", code="counter = 41\nprint('set')")
        self.assertEqual((r["stdout"], r["exit_code"], r["error"]), ("set\n", 0, None))
        r = self.a.ok("run_code", code="counter += 1\nprint(counter)")
        self.assertEqual(r["stdout"], "42\n")
        self.assertEqual(self.a.ok("eval", code="counter")["result"], "42")
        r = self.a.ok("run_code", code="def f(n):\n    return n * counter\n")
        self.assertEqual(self.a.ok("eval", code="f(2)")["result"], "84")

    def test_run_code_raises(self):
        r = self.a.ok("run_code", code="print('before')\nraise ValueError('boom')")
        self.assertEqual(r["stdout"], "before\n")
        self.assertEqual(r["error"], "ValueError: boom")
        self.assertEqual(r["exit_code"], 1)
        self.assertIn("Traceback", r["stderr"])
        # stdout is restored and captured afresh
        self.assertEqual(self.a.ok("run_code", code="print('after')")["stdout"], "after\n")
        self.alive()

    def test_run_code_sys_exit(self):
        r = self.a.ok("run_code", code="import sys\nsys.exit(3)")
        self.assertEqual((r["exit_code"], r["error"]), (3, "SystemExit: 3"))
        r = self.a.ok("run_code", code="import sys\nsys.exit()")
        self.assertEqual((r["exit_code"], r["error"]), (0, None))
        r = self.a.ok("run_code", code="raise SystemExit('bye')")
        self.assertEqual(r["exit_code"], 1)
        self.assertEqual(r["stderr"], "bye\n")
        r = self.a.ok("eval", code="exit(5)")
        self.assertEqual(r["exit_code"], 5)
        r = self.a.ok("run_code", code="raise KeyboardInterrupt")
        self.assertEqual(r["exit_code"], 1)
        self.assertTrue(r["error"].startswith("KeyboardInterrupt"))
        self.alive()

    def test_run_code_fork_child_does_not_answer(self):
        r = self.a.ok("run_code", code="import os\npid = os.fork()\nprint('parent' if pid else 'child')")
        self.assertEqual(r["stdout"], "parent\n")
        self.alive()

    def test_run_code_subprocess(self):
        r = self.a.ok("run_code", code="import subprocess\nprint(subprocess.run(['sh','-c','exit 4']).returncode)")
        self.assertEqual(r["stdout"], "4\n")

    def test_run_code_stdin_is_empty(self):
        r = self.a.ok("run_code", code="input()")
        self.assertTrue(r["error"].startswith("EOFError"), r["error"])

    def test_eval_timeout(self):
        t = time.monotonic()
        r = self.a.ok("eval", code="[0 for _ in iter(int, 1)]", timeout_secs=1)
        self.assertLess(time.monotonic() - t, 10)
        self.assertIs(r["timed_out"], True)
        self.assertEqual(r["exit_code"], 124)
        self.assertTrue(r["error"].startswith("TimeoutError"), r["error"])
        r = self.a.ok("run_code", code="import time\nwhile True:\n    try:\n        time.sleep(5)\n"
                                       "    except Exception:\n        pass\n", timeout_secs=1)
        self.assertIs(r["timed_out"], True)
        self.alive()

    def test_threads_run_between_requests(self):
        # the loop polls without the GIL: a thread started by user code keeps running
        self.a.ok("run_code", code="import threading, time\nticks = 0\n"
                                   "def spin():\n    global ticks\n    for _ in range(20):\n"
                                   "        ticks += 1\n        time.sleep(0.01)\n"
                                   "threading.Thread(target=spin, daemon=True).start()")
        time.sleep(0.5)
        self.assertEqual(self.a.ok("eval", code="ticks")["result"], "20")

    def test_many_pings_pipelined(self):
        ids = [self.a.request("ping") for _ in range(500)]
        for fid in ids:
            ftype, obj = self.a.wait(fid)
            self.assertEqual(ftype, RESP)


class TestExecAsync(AgentTest):
    def test_ping_overtakes_slow_exec(self):
        slow = self.a.request("exec", args=["sleep", "1"])
        ping = self.a.request("ping")
        fid, ftype, obj = self.a.next()
        self.assertEqual((fid, ftype), (ping, RESP))
        ftype, obj = self.a.wait(slow)
        self.assertEqual((ftype, obj["exit_code"]), (RESP, 0))

    def test_timeout_kills_the_group(self):
        # the child prints the pid of a grandchild in its group, then both sleep
        slow = self.a.request("exec", args=["sh", "-c", "sleep 300 & echo $!; sleep 300"], timeout_secs=2)
        t = time.monotonic()
        # the agent keeps answering while it waits
        for _ in range(3):
            self.alive()
            time.sleep(0.2)
        ftype, r = self.a.wait(slow)
        self.assertEqual(ftype, RESP)
        self.assertLess(time.monotonic() - t, 15)
        self.assertIs(r["timed_out"], True)
        self.assertIn(r["exit_code"], (124, -9))
        grandchild = int(r["stdout"].split()[0])
        deadline = time.monotonic() + 5
        while pid_alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(pid_alive(grandchild), f"grandchild {grandchild} survived the timeout")
        self.alive()

    def test_background_child_does_not_hold_the_reply(self):
        t = time.monotonic()
        r = self.a.ok("exec", args=["sh", "-c", "sleep 3 & echo started"], timeout_secs=30)
        self.assertEqual(r["stdout"], "started\n")
        self.assertLess(time.monotonic() - t, 2.5)

    def test_output_flood_is_capped(self):
        code = ("import os\nb = b'x' * 65536\n"
                "for _ in range(64): os.write(1, b); os.write(2, b)")
        r = self.a.ok("exec", args=["python3", "-c", code], timeout_secs=60)
        self.assertIs(r["truncated"], True)
        self.assertEqual(r["exit_code"], 0)
        self.assertLessEqual(len(r["stdout"]) + len(r["stderr"]), LIMIT)
        self.assertTrue(set(r["stdout"]) <= {"x"})
        r = self.a.ok("exec", args=["sh", "-c", "head -c 3000000 /dev/zero"], timeout_secs=60)
        self.assertIs(r["truncated"], True)  # NULs become U+FFFD: 3 bytes each, fitted to the limit
        r = self.a.ok("run_code", code="print('y' * 10_000_000)\nimport sys\nsys.stderr.write('z' * 10_000_000)")
        self.assertIs(r["truncated"], True)
        self.assertEqual(r["exit_code"], 0)
        r = self.a.ok("eval", code="'w' * 10_000_000")
        self.assertIs(r["truncated"], True)
        self.alive()

    def test_concurrent_execs(self):
        ids = [self.a.request("exec", args=["sh", "-c", f"sleep 0.{9 - i}; echo {i}"]) for i in range(8)]
        for i, fid in enumerate(ids):
            ftype, r = self.a.wait(fid)
            self.assertEqual(r["stdout"], f"{i}\n")

    def test_orphans_are_reaped(self):
        r = self.a.ok("exec", args=["sh", "-c", "(sleep 0.3 &) ; (sleep 0.3 & echo $!)"])
        orphan = int(r["stdout"].split()[0])
        deadline = time.monotonic() + 5
        while pid_alive(orphan) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(pid_alive(orphan))


class TestHostile(AgentTest):
    def expect_error(self, fid):
        fid2, ftype, obj = self.a.next()
        self.assertEqual((fid2, ftype), (fid, ERR), obj)
        return obj["error"]

    def test_bad_magic_resyncs(self):
        self.a.send(b"garbage!" * 3 + frame(REQ, 900, {"op": "ping"}))
        self.expect_error(0)
        fid, ftype, obj = self.a.next()
        self.assertEqual((fid, ftype), (900, RESP))

    def test_bad_flags_and_type(self):
        self.a.send(frame(REQ, 901, {"op": "ping"}, flags=1))
        self.expect_error(0)
        self.alive()
        self.a.send(frame(9, 902, {"op": "ping"}))
        self.expect_error(0)
        self.alive()

    def test_oversized(self):
        self.a.send(frame(REQ, 903, b"x" * (LIMIT + 1)))
        self.assertIn("too large", self.expect_error(903))
        self.alive()
        # the header alone is answered at once; the payload that follows is skipped
        self.a.send(frame(REQ, 904, b"", length=LIMIT + 5))
        self.assertIn("too large", self.expect_error(904))
        ping = frame(REQ, 77777, {"op": "ping"})  # inside the skipped payload: never answered
        n = LIMIT // len(ping)
        self.a.send(ping * n + b"\0" * (LIMIT + 5 - n * len(ping)))
        self.alive()
        self.assertNotIn(77777, self.a.stash)

    def test_bad_payloads(self):
        for payload in [b"", b"{", b"[1,2]", b"\"ping\"", b"{\"op\":\"ping\"} x", b"\xff\xfe",
                        b"{\"op\":\"ping\",\"x\":\"\\u0000\"}", b"[" * 100000, b"{\"op\":1}", b"{}",
                        b"{\"op\":\"ping\"}\x00", b"{\"op\":\"nope\"}", b"{\"op\":\"ping\",\"extra\":1}",
                        b"{'op':'ping'}", b"{\"op\":\"exec\",\"args\":[],\"x\":NaN}"]:
            self.a.send(frame(REQ, 905, payload))
            self.expect_error(905)
        self.a.send(frame(REQ, 0, {"op": "ping"}))
        self.expect_error(0)
        self.alive()

    def test_wrong_argument_types(self):
        bad = [
            ("exec", {}),
            ("exec", {"args": "ls"}),
            ("exec", {"args": []}),
            ("exec", {"args": [1]}),
            ("exec", {"args": [""]}),
            ("exec", {"args": ["true"] * 257}),
            ("exec", {"args": ["true", "x" * 70000]}),
            ("exec", {"args": ["true"], "timeout_secs": "5"}),
            ("exec", {"args": ["true"], "timeout_secs": 0}),
            ("exec", {"args": ["true"], "timeout_secs": 3601}),
            ("exec", {"args": ["true"], "timeout_secs": -1}),
            ("exec", {"args": ["true"], "timeout_secs": 1.5}),
            ("exec", {"args": ["true"], "timeout": 5}),
            ("eval", {}),
            ("eval", {"code": 5}),
            ("eval", {"code": None}),
            ("eval", {"code": "1" * (256 * 1024 + 1)}),
            ("run_code", {"code": ["x"]}),
            ("run_code", {"code": "x", "timeout_secs": 99999999999999999999}),
            ("ping", {"x": 1}),
            ("identity", {"id": 1}),
        ]
        for op, args in bad:
            self.a.error(op, **args)
        self.alive()

    def test_host_frames_ignored(self):
        # responses and errors from the host, and events that are not identity events
        self.a.send(frame(RESP, 5, {"x": 1}) + frame(ERR, 6, {"error": "x"}) +
                    frame(EVENT, 0, {"op": "other"}) + frame(EVENT, 0, b"junk"))
        self.alive()

    def test_fuzz_frames(self):
        # an agent of its own: whatever the fuzzing leaves, the other tests start clean
        saved, self.a = self.a, Agent()
        try:
            self.fuzz(random.Random(int(os.environ.get("AGENT_FUZZ_SEED", "1234"))))
            self.assertEqual(self.a.close_after_ping(), 0)
        finally:
            self.a = saved

    def fuzz(self, rng):
        ops = ["ping", "identity", "eval", "run_code", "exec", "hash_files", "nope", 7, None]
        values = [None, True, 1, -1, 2 ** 64, 1.5, "", "x", [], ["ping"], {}, {"a": [1]}, "\u00e9\U0001f600"]
        for _ in range(400):
            kind = rng.random()
            if kind < 0.3:
                data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64)))
            elif kind < 0.7:
                req = {"op": rng.choice(ops)}
                for key in rng.sample(["args", "code", "timeout_secs", "id", "seed", "cwd", "paths", "zz"],
                                      rng.randrange(0, 3)):
                    req[key] = rng.choice(values)
                if req["op"] == "exec":
                    req["args"] = rng.choice([None, 1, [], [1], "true", {"a": 1}])  # never runs anything
                if req["op"] == "hash_files" and "paths" in req:
                    req["paths"] = rng.choice([None, "/", [], ["/proc/self"], ["/nonexistent"], [1], ["x/../y"],
                                               ["/dev/null"], ["/\u00e9"]])  # never a big tree
                if req["op"] in ("eval", "run_code") and isinstance(req.get("code"), str):
                    req["code"] = rng.choice(["", "x", "1+", "(", "'\\x00'", "None"])
                data = frame(rng.choice([REQ, REQ, REQ, EVENT]), rng.randrange(0, 2 ** 32), req)
            else:
                good = bytearray(frame(REQ, rng.randrange(1, 1000), {"op": "ping"}))
                for _ in range(rng.randrange(1, 4)):
                    # not the top bytes of len: an oversized frame's payload is skipped, and
                    # skipping gigabytes is the protocol's answer, not something to wait for
                    at = rng.choice([k for k in range(len(good)) if k not in (14, 15)])
                    good[at] = rng.getrandbits(8)
                data = bytes(good)
            self.a.send(data)
        # whatever state the decoder is in, this much filler ends any payload and any header
        self.a.send(b"\0" * (LIMIT + 64))
        fid = self.a.request("ping")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got, ftype, obj = self.a.next()
            if got == fid and ftype == RESP:
                break
        else:
            self.fail("no answer to ping after fuzzing")


class TestHashFiles(AgentTest):
    """hash_files: SHA-256 of the regular files under the paths, symlinks not
    followed, pseudo file systems not entered, hostile arguments refused."""

    def setUp(self):
        self.d = tempfile.mkdtemp(prefix="forkd-hash-files.")
        self.addCleanup(shutil.rmtree, self.d, ignore_errors=True)

    def put(self, rel, data):
        path = os.path.join(self.d, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def test_tree(self):
        a = self.put("a.txt", b"from a")
        b = self.put("sub/deeper/b.bin", bytes(range(256)) * 1000)
        e = self.put("empty", b"")
        os.symlink(a, os.path.join(self.d, "link"))
        os.symlink("/etc", os.path.join(self.d, "dirlink"))
        os.mkfifo(os.path.join(self.d, "fifo"))
        r = self.a.ok("hash_files", paths=[self.d, "/nonexistent/forkd-x", a])
        want = {p: hashlib.sha256(open(p, "rb").read()).hexdigest() for p in (a, b, e)}
        self.assertEqual(r, {"files": want})
        r = self.a.ok("hash_files", paths=[b])
        self.assertEqual(list(r["files"]), [b])
        self.assertEqual(self.a.ok("hash_files", paths=[os.path.join(self.d, "link")]), {"files": {}})
        self.assertEqual(self.a.ok("hash_files", paths=[]), {"files": {}})

    def test_pseudo_fs_not_entered(self):
        r = self.a.ok("hash_files", paths=["/proc/self", "/sys/kernel"], timeout_secs=30)
        self.assertEqual(r, {"files": {}})

    def test_bad_arguments(self):
        for args in ({}, {"paths": "/tmp"}, {"paths": [1]}, {"paths": ["tmp"]}, {"paths": ["/tmp/"]},
                     {"paths": ["/a/../b"]}, {"paths": ["/a//b"]}, {"paths": ["/a/./b"]}, {"paths": ["/a\nb"]},
                     {"paths": ["/a\u0000b"]}, {"paths": ["/x"] * 65}, {"paths": ["/" + "x" * 4096]},
                     {"paths": ["/tmp"], "timeout_secs": 0}, {"paths": ["/tmp"], "timeout_secs": 3601},
                     {"paths": ["/tmp"], "follow": True}):
            self.a.error("hash_files", **args)
        self.alive()

    def test_too_many_files(self):
        for i in range(10001):
            open(os.path.join(self.d, f"f{i}"), "wb").close()
        err = self.a.error("hash_files", paths=[self.d])
        self.assertIn("10000", err)
        self.alive()


class TestFileIO(AgentTest):
    """write_file and read_file: atomic replace, modes, the 512 KiB cap, no
    symlink followed at the final component, regular files only, errno names
    in the error frames, hostile arguments refused (agent-fileio.c)."""

    CAP = 524288

    def setUp(self):
        self.d = tempfile.mkdtemp(prefix="forkd-fileio.")
        self.addCleanup(shutil.rmtree, self.d, ignore_errors=True)

    def p(self, rel):
        return os.path.join(self.d, rel)

    def write(self, path, data, **extra):
        return self.a.ok("write_file", path=path, data_b64=base64.b64encode(data).decode(), **extra)

    def read(self, path):
        r = self.a.ok("read_file", path=path)
        self.assertEqual(set(r), {"path", "data_b64", "size"})
        data = base64.b64decode(r["data_b64"], validate=True)
        self.assertEqual(r["size"], len(data))
        self.assertEqual(r["path"], path)
        return data

    def refused(self, op, errno_name, **args):
        ftype, obj = self.a.call(op, **args)
        self.assertEqual(ftype, ERR, (op, args, obj))
        self.assertEqual(obj.get("errno"), errno_name, obj)
        self.assertIn(args["path"], obj["error"])
        return obj["error"]

    def listing(self):
        return sorted(os.listdir(self.d))

    def test_round_trip(self):
        f = self.p("a.bin")
        data = bytes(range(256)) * 7 + b"\x00end"
        self.assertEqual(self.write(f, data), {"path": f, "size": len(data)})
        with open(f, "rb") as fh:
            self.assertEqual(fh.read(), data)
        self.assertEqual(os.stat(f).st_mode & 0o7777, 0o644)
        self.assertEqual(self.read(f), data)
        # replace: new contents, new mode, and nothing else left in the directory
        self.assertEqual(self.write(f, b"short", mode=0o600)["size"], 5)
        self.assertEqual(self.read(f), b"short")
        self.assertEqual(os.stat(f).st_mode & 0o7777, 0o600)
        self.assertEqual(self.listing(), ["a.bin"])
        # empty files both ways, and the mode is exact (no umask)
        self.write(f, b"", mode=0o4755)
        self.assertEqual(self.read(f), b"")
        self.assertEqual(os.stat(f).st_mode & 0o7777, 0o4755)
        self.write(self.p("zero"), b"x", mode=0)
        self.assertEqual(os.stat(self.p("zero")).st_mode & 0o7777, 0)

    def test_replace_is_a_new_inode(self):
        """A reader holding the old file keeps the old contents (rename, not rewrite in place)."""
        f = self.p("r.txt")
        self.write(f, b"old contents")
        with open(f, "rb") as old:
            self.write(f, b"new")
            self.assertEqual(old.read(), b"old contents")
        self.assertEqual(self.read(f), b"new")

    def test_cap(self):
        big = os.urandom(self.CAP)
        f = self.p("cap.bin")
        self.assertEqual(self.write(f, big)["size"], self.CAP)
        self.assertEqual(self.read(f), big)
        err = self.refused("write_file", "EFBIG", path=f, data_b64=base64.b64encode(big + b"x").decode())
        self.assertIn("File too large", err)
        self.assertEqual(self.read(f), big, "a refused write leaves the old file")
        with open(f, "ab") as fh:
            fh.write(b"y")
        self.assertIn("File too large", self.refused("read_file", "EFBIG", path=f))
        self.assertEqual(self.listing(), ["cap.bin"])

    def test_proc_file_read_by_reading(self):
        """stat() says 0 bytes; the contents are read anyway."""
        data = self.read("/proc/self/status")
        self.assertIn(b"Name:", data)

    def test_symlink_not_followed(self):
        target = self.p("target")
        self.write(target, b"target's")
        os.symlink(target, self.p("link"))
        self.assertIn("symbolic link", self.refused("read_file", "ELOOP", path=self.p("link")))
        self.refused("write_file", "ELOOP", path=self.p("link"), data_b64="eA==")
        self.assertEqual(self.read(target), b"target's")
        self.assertTrue(os.path.islink(self.p("link")))
        # a dangling link at the final component: not created through
        os.symlink(self.p("nowhere"), self.p("dangling"))
        self.refused("write_file", "ELOOP", path=self.p("dangling"), data_b64="eA==")
        self.assertFalse(os.path.exists(self.p("nowhere")))
        # directories above the final component are resolved as usual
        os.mkdir(self.p("real"))
        os.symlink(self.p("real"), self.p("dirlink"))
        self.write(self.p("dirlink/f"), b"via a linked dir")
        self.assertEqual(self.read(self.p("real/f")), b"via a linked dir")

    def test_not_regular(self):
        os.mkdir(self.p("dir"))
        self.refused("read_file", "EISDIR", path=self.p("dir"))
        self.refused("write_file", "EISDIR", path=self.p("dir"), data_b64="")
        self.refused("read_file", "EISDIR", path="/")
        self.refused("write_file", "EISDIR", path="/", data_b64="")
        os.mkfifo(self.p("fifo"))
        self.assertIn("Not a regular file", self.refused("read_file", "EINVAL", path=self.p("fifo")))
        self.refused("write_file", "EINVAL", path=self.p("fifo"), data_b64="eA==")
        self.refused("read_file", "ENOENT", path=self.p("missing"))
        self.refused("write_file", "ENOENT", path=self.p("nodir/f"), data_b64="eA==")
        self.write(self.p("plain"), b"x")
        self.refused("write_file", "ENOTDIR", path=self.p("plain/f"), data_b64="eA==")
        self.refused("read_file", "ENOTDIR", path=self.p("plain/f"))
        self.assertEqual(self.listing(), ["dir", "fifo", "plain"])
        self.alive()

    def test_failed_write_leaves_nothing(self):
        """A write that fails half-way (no room left on the file system) leaves the old
        file as it was and no temporary file: an agent of its own, in a private mount
        namespace where the directory is a 64 KiB tmpfs."""
        if os.geteuid() != 0 or not shutil.which("unshare"):
            self.skipTest("needs root and unshare(1) for a private tmpfs")
        d = self.d
        a = Agent(wrapper=("unshare", "-m", "--propagation", "private", "sh", "-c",
                           f"mount -t tmpfs -o size=64k forkd-test {d} && exec \"$@\"", "sh"))
        try:
            f = os.path.join(d, "f")
            r = a.ok("write_file", path=f, data_b64=base64.b64encode(b"old").decode())
            self.assertEqual(r["size"], 3)
            ftype, obj = a.call("write_file", path=f, data_b64=base64.b64encode(os.urandom(200000)).decode())
            self.assertEqual((ftype, obj.get("errno")), (ERR, "ENOSPC"), obj)
            self.assertEqual(a.ok("hash_files", paths=[d])["files"], {f: hashlib.sha256(b"old").hexdigest()})
            self.assertEqual(base64.b64decode(a.ok("read_file", path=f)["data_b64"]), b"old")
        finally:
            self.assertEqual(a.close_after_ping(), 0)
        self.assertEqual(self.listing(), [], "the tmpfs was private to the agent")
        self.refused("write_file", "ENAMETOOLONG", path=self.p("n" * 300), data_b64="eA==")
        self.assertEqual(self.listing(), [])

    def test_bad_arguments(self):
        f = self.p("f")
        for args in ({}, {"path": f}, {"data_b64": ""}, {"path": 1, "data_b64": ""}, {"path": f, "data_b64": 1},
                     {"path": "rel", "data_b64": ""}, {"path": f + "/", "data_b64": ""},
                     {"path": self.d + "/../x", "data_b64": ""}, {"path": self.d + "//x", "data_b64": ""},
                     {"path": self.d + "/./x", "data_b64": ""}, {"path": f + "\n", "data_b64": ""},
                     {"path": "/" + "x" * 4096, "data_b64": ""},
                     {"path": f, "data_b64": "eA"}, {"path": f, "data_b64": "e A=="}, {"path": f, "data_b64": "eB=="},
                     {"path": f, "data_b64": "e-8="}, {"path": f, "data_b64": "eA==\n"},
                     {"path": f, "data_b64": "", "mode": 0o10000}, {"path": f, "data_b64": "", "mode": -1},
                     {"path": f, "data_b64": "", "mode": "644"}, {"path": f, "data_b64": "", "mode": 1.5},
                     {"path": f, "data_b64": "", "append": True}):
            err = self.a.error("write_file", **args)
            self.assertTrue(err.startswith("bad argument"), (args, err))
        for args in ({}, {"path": "rel"}, {"path": f, "data_b64": ""}, {"path": f, "mode": 420},
                     {"path": "/" + "x" * 4096}):
            err = self.a.error("read_file", **args)
            self.assertTrue(err.startswith("bad argument"), (args, err))
        # a NUL in the path never gets as far as the op (the strict parser refuses it)
        self.a.error("write_file", path=f + "\u0000", data_b64="")
        self.a.error("read_file", path=f + "\u0000")
        self.assertEqual(self.listing(), [])
        # the longest path allowed gets as far as the file system
        self.refused("read_file", "ENAMETOOLONG", path="/" + "x" * 4094)
        self.alive()


class TestIdentity(AgentTest):
    def test_identity_event(self):
        seed = os.urandom(32).hex()
        wall = time.time_ns() - 3600 * 10 ** 9  # an hour ago: the host clock must not move
        self.a.send(frame(EVENT, 0, {"op": "identity", "id": "sbx-42", "generation": 7,
                                     "seed": seed, "wall_ns": wall}))
        r = self.a.ok("identity")
        self.assertEqual((r["id"], r["generation"], r["seed"]), ("sbx-42", 7, seed))
        self.assertLess(abs(r["wall_ns"] - wall), 5 * 10 ** 9)
        self.assertLess(abs(time.time_ns() - wall - 3600 * 10 ** 9), 60 * 10 ** 9, "host clock changed")
        # malformed events are ignored: nothing answered, identity unchanged
        for ev in [{"op": "identity", "id": "x", "generation": -1, "seed": seed, "wall_ns": 1},
                   {"op": "identity", "id": "x", "generation": 1, "seed": "zz" * 32, "wall_ns": 1},
                   {"op": "identity", "id": [], "generation": 1, "seed": seed, "wall_ns": 1},
                   {"op": "identity", "id": "x", "generation": 1, "seed": seed}]:
            self.a.send(frame(EVENT, 0, ev))
        r = self.a.ok("identity")
        self.assertEqual((r["id"], r["generation"]), ("sbx-42", 7))
        # numeric ids are kept as numbers
        self.a.send(frame(EVENT, 0, {"op": "identity", "id": 5, "generation": 8, "seed": seed, "wall_ns": wall}))
        self.assertEqual(self.a.ok("identity")["id"], 5)

    def test_python_random_reseeded(self):
        before = self.a.ok("run_code", code="import random\nstate = random.getstate()")
        self.assertEqual(before["exit_code"], 0)
        self.a.send(frame(EVENT, 0, {"op": "identity", "id": "r", "generation": 1,
                                     "seed": os.urandom(32).hex(), "wall_ns": time.time_ns()}))
        r = self.a.ok("eval", code="random.getstate() != state")
        self.assertEqual(r["result"], "True")
        if self.a.ok("ping")["numpy_version"]:
            r = self.a.ok("run_code", code="s1 = numpy.random.get_state()[1].copy()")
            self.a.send(frame(EVENT, 0, {"op": "identity", "id": "r", "generation": 2,
                                         "seed": os.urandom(32).hex(), "wall_ns": time.time_ns()}))
            self.assertEqual(self.a.ok("eval", code="bool((numpy.random.get_state()[1] != s1).any())")["result"],
                             "True")


class TestLifecycle(unittest.TestCase):
    def test_shutdown(self):
        a = Agent()
        self.assertEqual(a.ok("shutdown"), {"ok": True})
        self.assertEqual(a.close(), 0)

    def test_shutdown_kills_running_exec(self):
        a = Agent()
        slow = a.request("exec", args=["sh", "-c", "sleep 300 & echo $!; sleep 300"])
        time.sleep(0.5)
        self.assertEqual(a.ok("shutdown"), {"ok": True})
        self.assertEqual(a.close(), 0)

    def test_end_of_stream_exits(self):
        a = Agent()
        a.ok("ping")
        self.assertEqual(a.close(), 0)

    def test_unix_channel(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "agent.sock")
            a = Agent(channel=f"unix:{path}")
            try:
                deadline = time.monotonic() + 30
                while not os.path.exists(path) and time.monotonic() < deadline:
                    time.sleep(0.02)
                for _ in range(2):  # a second connection after the first closed
                    a.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    a.s.settimeout(30)
                    while True:  # the path appears at bind(), connections succeed after listen()
                        try:
                            a.s.connect(path)
                            break
                        except ConnectionRefusedError:
                            if time.monotonic() > deadline:
                                raise
                            time.sleep(0.02)
                    a.buf = b""
                    self.assertIs(a.ok("ping")["pong"], True)
                    a.s.close()
                a.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                a.s.connect(path)
                a.buf = b""
                self.assertEqual(a.ok("shutdown"), {"ok": True})
                a.s.close()
                a.s = None
                self.assertEqual(a.close(), 0)
            finally:
                if a.p.poll() is None:
                    a.p.kill()
                    a.p.wait()

    def test_no_python(self):
        a = Agent("--no-python")
        r = a.ok("ping")
        self.assertIsNone(r["numpy_version"])
        # the embedded interpreter's refusal, or the portable agent's (no python3 child)
        self.assertRegex(a.error("eval", code="1"), "Python|no python3")
        self.assertEqual(a.ok("exec", args=["true"])["exit_code"], 0)
        self.assertEqual(a.close(), 0)


def can_unshare():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "--pid", "--net", "--fork", "--mount", "--mount-proc", "true"],
                          capture_output=True).returncode == 0


class TestImageConfig(unittest.TestCase):
    """/.forkd/image.json (here --image-config=): the defaults of exec and of Python."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="forkd-agent-image-")
        os.chmod(self.dir, 0o755)
        self.conf = os.path.join(self.dir, "image.json")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def agent(self, conf, *extra):
        with open(self.conf, "w") as f:
            f.write(conf if isinstance(conf, str) else json.dumps(conf))
        return Agent(f"--image-config={self.conf}", *extra)

    def test_defaults(self):
        marker = os.path.join(self.dir, "started")
        a = self.agent({"env": ["FOO=bar", "PATH=/usr/bin:/bin"], "working_dir": self.dir,
                        "cmd": ["sh", "-c", "echo $FOO > started.tmp && mv started.tmp started"],
                        "start_cmd": True})
        r = a.ok("exec", args=["sh", "-c", "echo $FOO; pwd; echo $HOME"])
        self.assertEqual(r["stdout"], f"bar\n{self.dir}\n/root\n")
        r = a.ok("exec", args=["sh", "-c", "echo $FOO $BAR; pwd"], env={"FOO": "baz", "BAR": "1"}, cwd="/")
        self.assertEqual(r["stdout"], "baz 1\n/\n")
        self.assertIn("bad argument 'env'", a.error("exec", args=["true"], env={"A": 1}))
        self.assertIn("bad argument 'env'", a.error("exec", args=["true"], env={"A=B": "1"}))
        # the service started before ready, once; it renames its marker into place
        # when written, so the marker is never seen empty
        for _ in range(100):
            if os.path.exists(marker):
                break
            time.sleep(0.05)
        with open(marker) as f:
            self.assertEqual(f.read(), "bar\n")
        if AGENT.endswith("-portable"):
            r = a.ok("run_code", code="import os\nprint(os.environ['FOO'], os.getcwd())")
            self.assertEqual(r["stdout"], f"bar {self.dir}\n")
            r = a.ok("ping")
            self.assertTrue(r["version"].endswith("-portable"))
            self.assertTrue(r["python_path"].endswith("python3"))
        self.assertEqual(a.close(), 0)

    @unittest.skipUnless(os.getuid() == 0, "switching users needs root")
    def test_user(self):
        a = self.agent({"user": "nobody"})
        r = a.ok("exec", args=["id", "-u"], cwd="/")
        self.assertEqual(r["stdout"], "65534\n")
        r = a.ok("exec", args=["id", "-u"], cwd="/", user="0:0")
        self.assertEqual(r["stdout"], "0\n")
        r = a.ok("exec", args=["sh", "-c", "id -u; id -g"], cwd="/", user="12345:678")
        self.assertEqual(r["stdout"], "12345\n678\n")
        self.assertIn("no such user", a.error("exec", args=["true"], user="no-such-user-here"))
        r = a.ok("exec", args=["no-such-program-here"], user="0")
        self.assertEqual(r["exit_code"], 127)
        if AGENT.endswith("-portable"):
            r = a.ok("eval", code="__import__('os').getuid()")
            self.assertEqual(r["result"], "65534")
        self.assertEqual(a.close(), 0)

    def test_bad_or_missing(self):
        for conf in ("not json", '{"env": "A=1"}', '{"user": 5}', '{"start_cmd": true}'):
            a = self.agent(conf)
            r = a.ok("exec", args=["sh", "-c", "pwd"])
            self.assertEqual(r["exit_code"], 0)
            self.assertEqual(a.close(), 0)
        a = Agent(f"--image-config={self.dir}/missing.json")
        self.assertEqual(a.ok("exec", args=["true"])["exit_code"], 0)
        self.assertEqual(a.close(), 0)

    def test_no_python3_on_path(self):
        if not AGENT.endswith("-portable"):
            self.skipTest("the embedded agent does not look for python3")
        a = self.agent({"env": ["PATH=/nonexistent"]})
        self.assertFalse(a.ok("ping")["python"])
        self.assertEqual(a.error("run_code", code="1"),
                         "this image has no python3 (3.8 or later): run_code needs one; exec works")
        self.assertEqual(a.ok("exec", args=["/bin/true"])["exit_code"], 0)
        self.assertEqual(a.close(), 0)


class TestPid1(unittest.TestCase):
    """PID 1 of a new PID, mount and network namespace, as in the guest: mounts,
    reaping, power-off, lo. --no-clock keeps the host's clock alone (it is root
    here); the network namespace keeps the host's network out of its reach."""

    def setUp(self):
        if not can_unshare():
            self.skipTest("needs root and unshare(1) for PID and network namespaces")
        self.a = Agent(wrapper=("unshare", "--pid", "--net", "--fork", "--mount", "--propagation", "private",
                                "--mount-proc", "--kill-child"))

    def tearDown(self):
        if self.a.p.poll() is None:
            self.a.p.kill()
            self.a.p.wait()

    def test_pid1(self):
        r = self.a.ok("ping")
        self.assertEqual(r["pid"], 1)
        r = self.a.ok("exec", args=["sh", "-c", "cut -d' ' -f5,9 /proc/self/mountinfo; echo PATH=$PATH"])
        mounts = set(r["stdout"].splitlines())
        for want in ["/tmp tmpfs", "/run tmpfs", "/proc proc"]:
            self.assertIn(want, mounts)
        self.assertIn("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", mounts)
        # no NIC in this namespace: lo is brought up, nothing else is there to configure
        if shutil.which("ip"):
            r = self.a.ok("exec", args=["ip", "-o", "-4", "addr", "show"])
            self.assertEqual(r["exit_code"], 0, r)
            self.assertEqual([ln.split()[1] for ln in r["stdout"].splitlines()], ["lo"], r["stdout"])
            r = self.a.ok("exec", args=["ip", "-4", "route", "show", "default"])
            self.assertEqual(r["stdout"], "")
        # orphans are reaped by PID 1: no zombie left behind
        r = self.a.ok("exec", args=["sh", "-c", "(sleep 0.2 &); (sleep 0.2 &); sleep 0.6; "
                                                "grep -l '^State:.*Z' /proc/[0-9]*/status || true"])
        self.assertEqual(r["stdout"], "")
        # SIGTERM and SIGINT do not take PID 1 down
        self.a.ok("exec", args=["sh", "-c", "kill -TERM 1; kill -INT 1; kill -HUP 1"])
        self.assertEqual(self.a.ok("eval", code="1+1")["result"], "2")
        self.assertEqual(self.a.ok("shutdown"), {"ok": True})
        self.a.p.wait(timeout=20)  # reboot(RB_POWER_OFF) in a PID namespace ends its init


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    AGENT = sys.argv.pop(1)
    if not os.access(AGENT, os.X_OK):
        print(f"1..0 # SKIP {AGENT} is not built")
        sys.exit(77)
    unittest.main(verbosity=2)
