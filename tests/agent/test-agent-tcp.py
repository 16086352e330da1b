#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""forkd's JSON-line agent protocol on TCP, against the real forkd-agent on the host.

Usage: test-agent-tcp.py FORKD_AGENT [unittest options]

The agent serves its framed channel on a socketpair (as in test-agent.py) and
the JSON-line protocol on a listening socket on 127.0.0.1 that this test binds
to an ephemeral port and hands over with --tcp=fd:N. The client below sends
what forkd's Python Sandbox sends: one connection per request, the JSON object
and a newline, a half-close, then everything up to end of stream is the reply.
TestPid1Guest runs the agent as PID 1 in PID, mount and network namespaces of
its own, with a veth named eth0 and forkd.agent_tcp=1 in a bind-mounted
/proc/cmdline, and its client inside that namespace. Traffic stays on
loopback or inside the namespaces this test makes.
"""
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("test_agent", os.path.join(HERE, "test-agent.py"))
ta = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ta)

LINE_MAX = 1024 * 1024
MAX_CONNECTIONS = 16


def listener():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


def roundtrip(port, data, timeout=35.0):
    """What forkd's Sandbox._send does with a request: raw bytes in, raw bytes out."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.settimeout(timeout)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        buf = bytearray()
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf.extend(chunk)
    return bytes(buf)


def send(port, msg, timeout=35.0):
    raw = roundtrip(port, (json.dumps(msg) + "\n").encode(), timeout)
    return check_reply(raw)


def check_reply(raw):
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1, raw[:200]
    obj = json.loads(raw.decode("utf-8"))
    assert isinstance(obj, dict), obj
    return obj


def tcp_listening_inodes():
    """Inodes of listening TCP sockets (IPv4 and IPv6) in this network namespace."""
    inodes = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A":  # TCP_LISTEN
                        inodes.add(fields[9])
        except FileNotFoundError:
            pass
    return inodes


def listening_sockets_of(pid):
    listening = tcp_listening_inodes()
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in listening:
            found.append(fd)
    return found


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TcpAgent(ta.Agent):
    """The agent on a socketpair channel (as ta.Agent), with --tcp=fd:N on an
    ephemeral port of 127.0.0.1."""

    def __init__(self, *extra):
        env = dict(os.environ, PATH="/usr/sbin:/usr/bin:/sbin:/bin")
        env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
        self.buf = b""
        self.next_id = 1
        self.stash = {}
        lst = listener()
        self.port = lst.getsockname()[1]
        self.s, theirs = socket.socketpair()
        fds = [theirs.fileno(), lst.fileno()]
        self.p = subprocess.Popen([ta.AGENT, f"--channel=fd:{fds[0]}", f"--tcp=fd:{fds[1]}", "--no-clock", *extra],
                                  pass_fds=fds, env=env)
        theirs.close()
        lst.close()
        self.s.settimeout(float(os.environ.get("AGENT_TEST_TIMEOUT", "60")))


class TcpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.a = TcpAgent()
        cls.port = cls.a.port

    @classmethod
    def tearDownClass(cls):
        rc = cls.a.close()
        assert rc == 0, f"agent exited with {rc}"

    def send(self, msg, **kw):
        return send(self.port, msg, **kw)

    def raw(self, data, **kw):
        return roundtrip(self.port, data, **kw)

    def alive(self):
        self.assertIs(self.send({"action": "ping"})["pong"], True)
        self.assertIs(self.a.ok("ping")["pong"], True)

    def refused(self, data, want=None):
        r = check_reply(self.raw(data))
        self.assertEqual(r["exit_code"], 1, r)
        self.assertIsInstance(r["error"], str)
        self.assertNotIn("stdout", r)  # so that forkd's SDK reports it as an error
        if want:
            self.assertIn(want, r["error"])
        return r


class TestActions(TcpTest):
    def test_ping(self):
        r = self.send({"action": "ping"})
        self.assertIs(r["pong"], True)
        self.assertEqual(r["pid"], self.a.p.pid)
        self.assertIn("numpy_version", r)
        self.assertEqual(r["numpy_version"], self.a.ok("ping")["numpy_version"])

    def test_exec_string_command_as_the_sdk_sends_it(self):
        r = self.send({"action": "exec", "args": ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], "timeout": 30})
        self.assertEqual((r["stdout"], r["stderr"], r["exit_code"]), ("out\n", "err\n", 3))
        self.assertIs(r["timed_out"], False)

    def test_exec_argv_and_default_timeout(self):
        r = self.send({"action": "exec", "args": ["printf", "%s|", "a b", "c"]})
        self.assertEqual((r["stdout"], r["exit_code"]), ("a b|c|", 0))

    def test_exec_timeout(self):
        t0 = time.monotonic()
        r = self.send({"action": "exec", "args": ["/bin/sh", "-c", "echo started; sleep 30"], "timeout": 1})
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(r["exit_code"], 124)
        self.assertIs(r["timed_out"], True)
        self.assertEqual(r["stdout"], "started\n")

    def test_exec_fractional_timeout(self):
        r = self.send({"action": "exec", "args": ["true"], "timeout": 0.5})
        self.assertEqual(r["exit_code"], 0)

    def test_exec_not_found(self):
        r = self.send({"action": "exec", "args": ["/nonexistent/forkd-test"]})
        self.assertEqual(r["exit_code"], 127)
        self.assertIn("/nonexistent/forkd-test", r["stderr"])

    def test_exec_output_is_bounded(self):
        r = self.send({"action": "exec", "args": ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' a"]})
        self.assertIs(r["truncated"], True)
        self.assertEqual(r["exit_code"], 0)
        self.assertLessEqual(len(r["stdout"]), LINE_MAX)

    def test_exec_bad_arguments(self):
        for msg, want in [
            ({"action": "exec"}, "args"),
            ({"action": "exec", "args": "echo hi"}, "args"),
            ({"action": "exec", "args": []}, "args"),
            ({"action": "exec", "args": ["echo", 1]}, "args"),
            ({"action": "exec", "args": ["true"], "timeout": 0}, "timeout"),
            ({"action": "exec", "args": ["true"], "timeout": -1}, "timeout"),
            ({"action": "exec", "args": ["true"], "timeout": 100000}, "timeout"),
            ({"action": "exec", "args": ["true"], "timeout": "5"}, "timeout"),
        ]:
            with self.subTest(msg=msg):
                self.refused((json.dumps(msg) + "\n").encode(), want)
        self.alive()

    def test_concurrent_execs(self):
        out = {}

        def run(i):
            out[i] = self.send({"action": "exec", "args": ["sh", "-c", f"sleep 1; echo {i}"]})

        t0 = time.monotonic()
        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        # the framed channel answers meanwhile
        self.assertIs(self.a.ok("ping")["pong"], True)
        self.assertEqual(self.a.ok("exec", args=["echo", "framed"])["stdout"], "framed\n")
        for t in threads:
            t.join()
        self.assertLess(time.monotonic() - t0, 3.5)
        self.assertEqual({i: r["stdout"] for i, r in out.items()}, {i: f"{i}\n" for i in range(4)})

    def test_client_gone_during_exec(self):
        s = socket.create_connection(("127.0.0.1", self.port))
        s.sendall(b'{"action": "exec", "args": ["sleep", "1"]}\n')
        s.close()
        time.sleep(1.5)
        self.alive()


class TestEval(TcpTest):
    def test_expression(self):
        r = self.send({"action": "eval", "code": "2 ** 10"})
        self.assertEqual((r["result"], r["exit_code"]), ("1024", 0))
        self.assertNotIn("error", r)
        r = self.send({"action": "eval", "code": "'a' * 3"})
        self.assertEqual(r["result"], "'aaa'")

    def test_numpy(self):
        if self.a.ok("ping")["numpy_version"] is None:
            self.skipTest("numpy not importable in the embedded interpreter (apt-get install python3-numpy)")
        self.assertEqual(self.send({"action": "eval", "code": "1 + numpy.zeros(3).sum()"})["result"], "1.0")
        self.assertEqual(self.send({"action": "eval", "code": "np.arange(3).tolist()"})["result"], "[0, 1, 2]")

    def test_exception(self):
        r = self.send({"action": "eval", "code": "1/0"})
        self.assertEqual(r["exit_code"], 1)
        self.assertTrue(r["error"].startswith("ZeroDivisionError"), r)
        self.assertIn("Traceback", r["traceback"])
        self.assertNotIn("result", r)

    def test_statement_is_a_syntax_error(self):
        r = self.send({"action": "eval", "code": "x = 1"})
        self.assertTrue(r["error"].startswith("SyntaxError"), r)

    def test_fresh_namespace_per_call(self):
        # as forkd's agent: a new globals dict each time, nothing persists
        self.assertEqual(self.send({"action": "eval", "code": "(y := 5)"})["result"], "5")
        r = self.send({"action": "eval", "code": "y"})
        self.assertTrue(r["error"].startswith("NameError"), r)
        # and the framed channel's REPL globals are not visible, nor touched
        self.a.ok("run_code", code="framed_only = 7")
        r = self.send({"action": "eval", "code": "framed_only"})
        self.assertTrue(r["error"].startswith("NameError"), r)
        self.assertEqual(self.a.ok("eval", code="framed_only")["result"], "7")

    def test_print_is_captured(self):
        r = self.send({"action": "eval", "code": "print('hello')"})
        self.assertEqual((r["result"], r["stdout"]), ("None", "hello\n"))

    def test_bad_code(self):
        self.refused(b'{"action": "eval"}\n', "code")
        self.refused(b'{"action": "eval", "code": 5}\n', "code")
        self.refused((json.dumps({"action": "eval", "code": "1+" * 200000 + "1"}) + "\n").encode(), "256 KiB")
        self.alive()


class TestFraming(TcpTest):
    def test_malformed_lines(self):
        for data, want in [
            (b"{bad\n", "bad request"),
            (b"\n", "bad request"),
            (b"[1, 2]\n", "bad request"),
            (b'"ping"\n', "bad request"),
            (b'{"action": "ping"} {"action": "ping"}\n', "bad request"),
            (b'{"action": "ping", "x": "\xff"}\n', "bad request"),
            (b'{"action": "ping", "x": "a\x00b"}\n', "bad request"),
            (b'{"action": 5}\n', "action"),
            (b'{"nothing": 1}\n', "action"),
            (b'{"action": "shutdown"}\n', "unknown action: shutdown"),
            (b'{"action": "run_code", "code": "1"}\n', "unknown action"),
            (b"[" * 100000 + b"\n", "bad request"),
        ]:
            with self.subTest(data=data[:40]):
                self.refused(data, want)
        self.alive()

    def test_end_of_stream_ends_the_line(self):
        r = check_reply(self.raw(b'{"action": "ping"}'))
        self.assertIs(r["pong"], True)

    def test_crlf(self):
        self.assertIs(check_reply(self.raw(b'{"action": "ping"}\r\n'))["pong"], True)

    def test_one_request_per_connection(self):
        r = check_reply(self.raw(b'{"action": "ping"}\n{"action": "exec", "args": ["touch", "/tmp/nope"]}\n'))
        self.assertIs(r["pong"], True)

    def test_unknown_keys_are_ignored(self):
        r = self.send({"action": "ping", "extra": [1, 2, 3]})
        self.assertIs(r["pong"], True)

    def test_long_line_within_the_limit(self):
        msg = {"action": "ping", "pad": ""}
        msg["pad"] = "x" * (LINE_MAX - len(json.dumps(msg)))
        data = json.dumps(msg).encode()
        self.assertEqual(len(data), LINE_MAX)
        self.assertIs(check_reply(self.raw(data + b"\n"))["pong"], True)

    def test_oversized_line(self):
        r = self.refused(b'{"action": "ping", "pad": "' + b"x" * LINE_MAX + b'"}\n', "exceeds")
        self.assertIn(str(LINE_MAX), r["error"])
        # and a flood without any newline: answered, the rest read and dropped
        r = self.refused(b"y" * (4 * LINE_MAX))
        self.alive()

    def test_empty_connections(self):
        for _ in range(20):
            socket.create_connection(("127.0.0.1", self.port)).close()
        self.assertEqual(self.raw(b""), b"")  # nothing sent: closed without a reply, as forkd's agent does
        self.alive()

    def test_connection_cap(self):
        idle = [socket.create_connection(("127.0.0.1", self.port)) for _ in range(MAX_CONNECTIONS)]
        try:
            time.sleep(0.3)
            extra = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            extra.sendall(b'{"action": "ping"}\n')
            extra.shutdown(socket.SHUT_WR)
            extra.settimeout(1.0)
            with self.assertRaises(socket.timeout):
                extra.recv(100)  # waits in the backlog: all 16 slots are taken
            # the framed channel is not held up
            self.assertIs(self.a.ok("ping")["pong"], True)
            idle.pop().close()  # a slot frees up
            extra.settimeout(10)
            buf = b""
            while True:
                chunk = extra.recv(65536)
                if not chunk:
                    break
                buf += chunk
            self.assertIs(check_reply(buf)["pong"], True)
            extra.close()
        finally:
            for s in idle:
                s.close()
        self.alive()

    def test_slow_client(self):
        with socket.create_connection(("127.0.0.1", self.port)) as s:
            for b in b'{"action": "ping"}\n':
                s.sendall(bytes([b]))
            s.shutdown(socket.SHUT_WR)
            s.settimeout(10)
            buf = b""
            while chunk := s.recv(100):
                buf += chunk
        self.assertIs(check_reply(buf)["pong"], True)


class TestSwitch(unittest.TestCase):
    def test_off_without_the_switch(self):
        a = ta.Agent()
        try:
            a.ok("ping")
            self.assertEqual(listening_sockets_of(a.p.pid), [])
        finally:
            self.assertEqual(a.close(), 0)

    def test_listening_with_the_switch(self):
        a = TcpAgent()
        try:
            a.ok("ping")
            self.assertEqual(len(listening_sockets_of(a.p.pid)), 1)
        finally:
            self.assertEqual(a.close(), 0)

    def test_address_and_port(self):
        port = free_port()
        a = ta.Agent(f"--tcp=127.0.0.1:{port}")
        try:
            a.ok("ping")  # the agent listens before it serves the channel
            self.assertIs(send(port, {"action": "ping"})["pong"], True)
        finally:
            self.assertEqual(a.close(), 0)

    def test_bad_spec_leaves_the_channel_working(self):
        for spec in ["nonsense", "127.0.0.1:", "1.2.3.4.5:80", "fd:1", "70000"]:
            with self.subTest(spec=spec):
                a = ta.Agent(f"--tcp={spec}")
                try:
                    self.assertIs(a.ok("ping")["pong"], True)
                    self.assertEqual(listening_sockets_of(a.p.pid), [])
                finally:
                    self.assertEqual(a.close(), 0)


# A client that runs inside the agent's namespace (through the channel's exec): what
# forkd's Sandbox sends, to ADDR:8888; prints the reply.
IN_GUEST_CLIENT = """
import json, socket, sys
with socket.create_connection((sys.argv[1], 8888), timeout=5) as s:
    s.settimeout(20)
    s.sendall((sys.argv[2] + "\\n").encode())
    s.shutdown(socket.SHUT_WR)
    buf = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        buf += c
sys.stdout.write(buf.decode())
"""


class TestPid1Guest(unittest.TestCase):
    """PID 1 in new PID, mount and network namespaces made here, as in a guest at boot:
    a veth named eth0 stands for the virtio NIC, and /proc/cmdline (a bind mount)
    carries the switch. Checks the NIC configuration and the listener on port 8888,
    from inside that namespace."""

    def start(self, cmdline, nic=True):
        if not ta.can_unshare():
            self.skipTest("needs root and unshare(1) for PID and network namespaces")
        self.cmdline = os.path.join(self.tmp, "cmdline")
        with open(self.cmdline, "w") as f:
            f.write(cmdline + "\n")
        setup = "ip link add eth0 type veth peer name eth0-peer && ip link set eth0-peer up && " if nic else ""
        self.a = ta.Agent(wrapper=("unshare", "--pid", "--net", "--fork", "--mount", "--propagation", "private",
                                   "--mount-proc", "--kill-child", "sh", "-c",
                                   setup + 'mount --bind "$0" /proc/cmdline && exec "$@"', self.cmdline))

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="test-agent-tcp.")
        self.a = None

    def tearDown(self):
        if self.a and self.a.p.poll() is None:
            self.a.p.kill()
            self.a.p.wait()
        if self.a:
            self.a.s.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def client(self, addr, msg):
        r = self.a.ok("exec", args=["/usr/bin/python3", "-c", IN_GUEST_CLIENT, addr, json.dumps(msg)])
        self.assertEqual(r["exit_code"], 0, r)
        return check_reply(r["stdout"].encode())

    def test_nic_and_switch(self):
        self.start("console=ttyS0 reboot=k forkd.agent_tcp=1 quiet")
        self.assertEqual(self.a.ok("ping")["pid"], 1)
        r = self.a.ok("exec", args=["ip", "-o", "-4", "addr", "show", "dev", "eth0"])
        self.assertEqual([ln.split()[3] for ln in r["stdout"].splitlines()], ["172.16.0.2/30"], r)
        r = self.a.ok("exec", args=["ip", "-4", "route", "show", "default"])
        self.assertEqual(r["stdout"].split()[:5], ["default", "via", "172.16.0.1", "dev", "eth0"], r)
        r = self.a.ok("exec", args=["ip", "-o", "link", "show", "lo"])
        self.assertIn(",UP", r["stdout"])
        # forkd's protocol on 0.0.0.0:8888: by loopback and by the NIC's address
        for addr in ("127.0.0.1", "172.16.0.2"):
            r = self.client(addr, {"action": "ping"})
            self.assertEqual((r["pong"], r["pid"]), (True, 1))
        r = self.client("127.0.0.1", {"action": "exec", "args": ["/bin/sh", "-c", "echo hi"],
                                      "timeout": 10})
        self.assertEqual((r["stdout"], r["exit_code"]), ("hi\n", 0))
        self.assertEqual(self.client("127.0.0.1", {"action": "eval", "code": "6 * 7"})["result"], "42")

    def test_switch_off(self):
        for cmdline in ("console=ttyS0 quiet", "forkd.agent_tcp=0", "forkd.agent_tcp=1 forkd.agent_tcp=0",
                        "forkd.agent_tcp=maybe"):
            with self.subTest(cmdline=cmdline):
                self.start(cmdline, nic=False)
                self.assertEqual(self.a.ok("ping")["pid"], 1)
                r = self.a.ok("exec", args=["sh", "-c", "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null"])
                self.assertNotIn(" 0A ", r["stdout"], r["stdout"])  # no socket in state LISTEN
                self.assertEqual(self.a.ok("shutdown"), {"ok": True})
                self.a.p.wait(timeout=20)
                self.a.s.close()
                self.a = None


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    ta.AGENT = sys.argv.pop(1)
    if not os.access(ta.AGENT, os.X_OK):
        print(f"1..0 # SKIP {ta.AGENT} is not built")
        sys.exit(77)
    unittest.main(verbosity=2)
