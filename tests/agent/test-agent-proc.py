#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The process table of forkd-agent (proc_* ops), driven over a socket.

Usage: test-agent-proc.py FORKD_AGENT [unittest options]

Standard library only; the channel client is test-agent.py's. Each test class
starts its own agent (not PID 1). Tests wait for what they expect (output, the
end of a process) with a deadline for failure, never for a fixed time.
"""
import base64
import importlib.util
import os
import socket
import sys
import tempfile
import time
import unittest

_spec = importlib.util.spec_from_file_location(
    "test_agent", os.path.join(os.path.dirname(os.path.abspath(__file__)), "test-agent.py"))
test_agent = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(test_agent)
Agent, ERR, RESP = test_agent.Agent, test_agent.ERR, test_agent.RESP

RING = 2 * 1024 * 1024
MAX_PROCS = 256
DEADLINE = float(os.environ.get("AGENT_TEST_TIMEOUT", "60"))


def b64(data):
    return base64.b64encode(data).decode()


def decode(chunks):
    return b"".join(base64.b64decode(c["data_b64"]) for c in chunks)


def vmrss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


class ProcTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.a = Agent()

    @classmethod
    def tearDownClass(cls):
        rc = cls.a.close()
        assert rc == 0, f"agent exited with {rc}"

    def start(self, **args):
        return self.a.ok("proc_start", **args)["pid"]

    def errno(self, op, want, **args):
        ftype, obj = self.a.call(op, **args)
        self.assertEqual(ftype, ERR, (op, args, obj))
        self.assertEqual(obj.get("errno"), want, obj)
        return obj["error"]

    def follow(self, pid, offset=0, until=None, max=None):
        """Long-poll pid from offset until its end (or until until(output) holds):
        returns (output, per-stream output, last answer)."""
        out, streams = b"", {"stdout": b"", "stderr": b""}
        deadline = time.monotonic() + DEADLINE
        extra = {} if max is None else {"max": max}
        while True:
            self.assertLess(time.monotonic(), deadline, f"process {pid} did not get there: {out[-400:]!r}")
            r = self.a.ok("proc_read", pid=pid, offset=offset, wait_ms=5000, **extra)
            self.assertEqual(r["gap"], 0, r)
            for c in r["chunks"]:
                data = base64.b64decode(c["data_b64"])
                self.assertEqual(c["offset"], offset, "chunks are contiguous")
                offset += len(data)
                out += data
                streams[c["stream"]] += data
            self.assertEqual(r["next_offset"], offset)
            if r["end"] or (until and until(out)):
                return out, streams, r

    def entry(self, pid):
        for p in self.a.ok("proc_list")["processes"]:
            if p["pid"] == pid:
                return p
        return None

    def wait_entry(self, pid, cond):
        deadline = time.monotonic() + DEADLINE
        while True:
            e = self.entry(pid)
            if e is not None and cond(e):
                return e
            self.assertLess(time.monotonic(), deadline, f"process {pid}: {e}")
            time.sleep(0.05)


class TestOutput(ProcTest):
    def test_start_with_read(self):
        # a short command: the start's answer carries all of it, its end too (it waits for
        # the end, not only for output)
        r = self.a.ok("proc_start", args=["sh", "-c", "echo hi; exit 3"], stdin=False,
                      read={"max": 65536, "wait_ms": 5000})
        self.assertEqual(set(r), {"pid", "read"}, r)
        rd = r["read"]
        self.assertTrue(rd["end"] and rd["exit_code"] == 3, rd)
        self.assertEqual(b"".join(base64.b64decode(c["data_b64"]) for c in rd["chunks"]), b"hi\n")
        # a silent one: the answer comes at the read's wait, with nothing read and the pid
        t0 = time.monotonic()
        r = self.a.ok("proc_start", args=["sleep", "30"], read={"wait_ms": 300})
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)
        self.assertTrue(r["read"]["chunks"] == [] and r["read"]["exited"] is False and r["read"]["next_offset"] == 0,
                        r)
        self.a.ok("proc_signal", pid=r["pid"], signal=9)
        # wait_ms 0: at once
        r = self.a.ok("proc_start", args=["sleep", "30"], read={"wait_ms": 0})
        self.assertIn("read", r)
        self.a.ok("proc_signal", pid=r["pid"], signal=9)
        for bad in ({"max": 0}, {"max": 262145}, {"wait_ms": 60001}, {"what": 1}, {"max": "1"}):
            msg = self.errno("proc_start", "EINVAL", args=["true"], read=bad)
            self.assertIn("'read'", msg)

    def test_follow_loop(self):
        pid = self.start(cmd="for i in $(seq 1 30); do echo line $i; echo warn $i >&2; sleep 0.02; done")
        e = self.entry(pid)
        self.assertEqual(e["args"], ["/bin/sh", "-c", e["args"][2]])
        self.assertIs(e["pty"], False)
        self.assertGreater(e["started_ns"], 1_000_000_000 * 1_000_000_000)
        out, streams, r = self.follow(pid)
        self.assertEqual(streams["stdout"].decode().splitlines(), [f"line {i}" for i in range(1, 31)])
        self.assertEqual(streams["stderr"].decode().splitlines(), [f"warn {i}" for i in range(1, 31)])
        # Both streams in the one log, each line whole. Their order across the two pipes is
        # the order the agent read them in, which the machine's load decides.
        self.assertEqual(sorted(out.decode().splitlines()),
                         sorted([f"line {i}" for i in range(1, 31)] + [f"warn {i}" for i in range(1, 31)]))
        self.assertEqual((r["exited"], r["exit_code"], r["signal"], r["end"]), (True, 0, None, True))
        # its end was read: the entry stays (10 minutes) for readers to come, who get the
        # same bytes and the end again
        self.assertIs(self.entry(pid)["running"], False)
        r2 = self.a.ok("proc_read", pid=pid, offset=0, max=262144)
        self.assertEqual((decode(r2["chunks"]), r2["end"], r2["exit_code"]), (out, True, 0))

    def test_exit_status_and_timeout(self):
        pid = self.start(args=["sh", "-c", "echo x; exit 3"], stdin=False)
        self.assertEqual(self.follow(pid)[2]["exit_code"], 3)
        pid = self.start(args=["sleep", "100"], timeout_secs=1)
        r = self.follow(pid)[2]
        self.assertEqual((r["exit_code"], r["signal"]), (None, 9))

    def test_overrun_gap(self):
        total = 3_000_000
        pid = self.start(cmd=f"head -c {total} /dev/zero | tr '\\0' a")
        self.wait_entry(pid, lambda e: not e["running"] and e["end_offset"] == total)
        r = self.a.ok("proc_read", pid=pid, offset=0, max=1000)
        self.assertEqual(r["gap"], total - RING)
        self.assertEqual(r["chunks"][0]["offset"], total - RING)
        self.assertEqual(decode(r["chunks"]), b"a" * 1000)
        self.assertEqual(r["next_offset"], total - RING + 1000)
        self.assertIs(r["end"], False)
        # inside the ring: no gap, exactly the bytes after the offset
        r = self.a.ok("proc_read", pid=pid, offset=total - 10)
        self.assertEqual((r["gap"], decode(r["chunks"]), r["next_offset"], r["end"]), (0, b"a" * 10, total, True))

    def test_interleaved_runs_fit_the_reply(self):
        # many short runs of alternating streams: the reply stays within the frame limit
        pid = self.start(args=["python3", "-c",
                               "import os\nfor i in range(20000):\n os.write(1 + i % 2, b'x')"])
        self.wait_entry(pid, lambda e: not e["running"] and e["end_offset"] == 20000)
        out, streams, r = self.follow(pid, max=262144)
        self.assertEqual((len(streams["stdout"]), len(streams["stderr"])), (10000, 10000))

    def test_long_poll_answers_at_wait_ms(self):
        pid = self.start(args=["cat"])
        t0 = time.monotonic()
        r = self.a.ok("proc_read", pid=pid, wait_ms=300)
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)
        self.assertEqual((r["chunks"], r["next_offset"], r["exited"], r["end"]), ([], 0, False, False))
        # a pending long poll does not hold up other requests; output answers it
        fid = self.a.request("proc_read", pid=pid, wait_ms=30000)
        self.assertIs(self.a.ok("ping")["pong"], True)
        self.a.ok("proc_stdin", pid=pid, data_b64=b64(b"woke\n"))
        ftype, r = self.a.wait(fid)
        self.assertEqual((ftype, decode(r["chunks"])), (RESP, b"woke\n"))
        # and so does the end
        fid = self.a.request("proc_read", pid=pid, offset=5, wait_ms=30000)
        self.a.ok("proc_stdin", pid=pid, data_b64="", eof=True)
        ftype, r = self.a.wait(fid)
        self.assertEqual((ftype, r["chunks"], r["end"], r["exit_code"]), (RESP, [], True, 0))


class TestStdinSignals(ProcTest):
    def test_cat_echoes_until_eof(self):
        pid = self.start(args=["cat"])
        sent = b""
        for i in range(20):
            chunk = bytes([i]) * 3000 + b"\n"
            self.assertEqual(self.a.ok("proc_stdin", pid=pid, data_b64=b64(chunk))["written"], len(chunk))
            sent += chunk
        self.a.ok("proc_stdin", pid=pid, data_b64=b64(b"last"), eof=True)
        sent += b"last"
        out, streams, r = self.follow(pid)
        self.assertEqual(out, sent)
        self.assertEqual((r["exit_code"], r["end"]), (0, True))

    def test_stdin_false(self):
        pid = self.start(args=["cat"], stdin=False)
        self.errno("proc_stdin", "EPIPE", pid=pid, data_b64=b64(b"x"))
        self.assertEqual(self.follow(pid)[2]["exit_code"], 0)

    def test_stdin_full(self):
        pid = self.start(args=["sleep", "1000"])
        chunk = b64(b"y" * 65536)
        for _ in range(16):  # the pipe takes 64 KiB, the queue 256 KiB more
            ftype, obj = self.a.call("proc_stdin", pid=pid, data_b64=chunk)
            if ftype == ERR:
                break
        self.assertEqual((obj.get("errno"), obj["error"]), ("EAGAIN", "stdin is full; retry"))
        self.a.ok("proc_signal", pid=pid, signal=9)
        self.assertEqual(self.follow(pid)[2]["signal"], 9)

    def test_sigterm_one_of_two(self):
        one = self.start(args=["sleep", "1000"])
        two = self.start(args=["sleep", "1000"])
        self.assertEqual(self.a.ok("proc_signal", pid=one, signal=15), {"ok": True})
        r = self.follow(one)[2]
        self.assertEqual((r["exited"], r["exit_code"], r["signal"]), (True, None, 15))
        e = self.entry(two)
        self.assertIs(e["running"], True)
        self.errno("proc_signal", "ESRCH", pid=one, signal=15)
        self.a.ok("proc_signal", pid=two, signal=9)
        self.assertEqual(self.follow(two)[2]["signal"], 9)

    def test_signal_reaches_the_group(self):
        pid = self.start(cmd="sleep 1000 & echo started; wait")
        self.follow(pid, until=lambda out: b"started" in out)
        self.a.ok("proc_signal", pid=pid, signal=15)
        self.assertEqual(self.follow(pid)[2]["signal"], 15)

    def test_exec_while_processes_run(self):
        pid = self.start(args=["yes"])
        self.wait_entry(pid, lambda e: e["end_offset"] > 0)
        r = self.a.ok("exec", args=["sh", "-c", "echo hi; echo err >&2"])
        self.assertEqual((r["stdout"], r["stderr"], r["exit_code"]), ("hi\n", "err\n", 0))
        self.a.ok("proc_signal", pid=pid, signal=9)
        self.follow(pid, offset=self.entry(pid)["end_offset"], max=262144)


class TestPty(ProcTest):
    def test_size_and_resize(self):
        pid = self.start(args=["sh", "-c", "stty size; read x; stty size"], pty={"cols": 80, "rows": 24})
        e = self.entry(pid)
        self.assertIs(e["pty"], True)
        out, _, r = self.follow(pid, until=lambda out: b"\n" in out)
        self.assertEqual(out, b"24 80\r\n")
        self.assertEqual(self.a.ok("proc_resize", pid=pid, cols=132, rows=43), {"ok": True})
        self.a.ok("proc_stdin", pid=pid, data_b64=b64(b"\n"))
        out, streams, r = self.follow(pid, offset=r["next_offset"])
        self.assertEqual(out.split(b"\r\n")[-2], b"43 132")
        self.assertEqual(streams["stderr"], b"")
        self.assertEqual(r["exit_code"], 0)

    def test_interactive_shell(self):
        pid = self.start(args=["sh", "-i"], pty={"cols": 100, "rows": 30},
                         env={"PS1": "$ ", "ENV": "/dev/null", "HOME": "/tmp"})
        out, _, r = self.follow(pid, until=lambda out: out.endswith(b"$ "))  # the prompt
        self.a.ok("proc_stdin", pid=pid, data_b64=b64(b"echo $((6*7))\n"))
        out, _, r = self.follow(pid, offset=r["next_offset"], until=lambda out: b"\n42\r\n" in out)
        self.assertEqual(out, b"echo $((6*7))\r\n42\r\n$ "[:len(out)])
        self.a.ok("proc_stdin", pid=pid, data_b64="", eof=True)  # ^D ends the shell
        out, _, r = self.follow(pid, offset=r["next_offset"])
        self.assertEqual((r["exited"], r["end"]), (True, True))

    def test_resize_needs_a_pty(self):
        pid = self.start(args=["sleep", "1000"], stdin=False)
        self.errno("proc_resize", "ENOTTY", pid=pid, cols=10, rows=10)
        self.a.ok("proc_signal", pid=pid, signal=9)
        self.follow(pid)


class TestLimits(ProcTest):
    def count(self):
        return len(self.a.ok("proc_list")["processes"])

    def test_bad_start(self):
        before = self.count()
        for args, want in [
            (dict(args=["true"] * 4097), "E2BIG"),
            (dict(args=["true", "x" * (130 * 1024)]), "E2BIG"),
            (dict(cmd="x" * (129 * 1024)), "E2BIG"),
            (dict(args=[]), "EINVAL"),
            (dict(args=[""]), "EINVAL"),
            (dict(args=["true", 1]), "EINVAL"),
            (dict(args=["true"], cmd="true"), "EINVAL"),
            (dict(), "EINVAL"),
            (dict(args=["true"], env={"A=B": "x"}), "EINVAL"),
            (dict(args=["true"], env={"": "x"}), "EINVAL"),
            (dict(args=["true"], env={f"K{i}": "v" for i in range(1025)}), "E2BIG"),
            (dict(args=["true"], env={"K": "v" * (129 * 1024)}), "E2BIG"),
            (dict(args=["true"], env={"K": 1}), "EINVAL"),
            (dict(args=["true"], pty={"cols": 0, "rows": 10}), "EINVAL"),
            (dict(args=["true"], pty={"cols": 10, "rows": 1001}), "EINVAL"),
            (dict(args=["true"], pty={"cols": 10}), "EINVAL"),
            (dict(args=["true"], pty={"cols": 10, "rows": 10, "x": 1}), "EINVAL"),
            (dict(args=["true"], timeout_secs=86401), "EINVAL"),
            (dict(args=["true"], timeout_secs=-1), "EINVAL"),
            (dict(args=["true"], stdin="yes"), "EINVAL"),
            (dict(args=["true"], bogus=1), "EINVAL"),
            (dict(args=["/nonexistent/forkd-no-such-program"]), "ENOENT"),
            (dict(args=["true"], cwd="/nonexistent/forkd-no-such-dir"), "ENOENT"),
            (dict(args=["true"], user="forkd-no-such-user"), "EINVAL"),
        ]:
            with self.subTest(args=str(args)[:80]):
                self.errno("proc_start", want, **args)
        self.assertEqual(self.count(), before, "nothing was started")

    def test_nul(self):
        before = self.count()
        # refused by the strict JSON parser already, before any op runs
        for req in [dict(args=["true"], env={"A": "x\0y"}), dict(args=["tr\0ue"]), dict(cmd="true\0")]:
            ftype, obj = self.a.call("proc_start", **req)
            self.assertEqual(ftype, ERR, obj)
            self.assertIn("NUL", obj["error"])
        self.assertEqual(self.count(), before)

    def test_bad_requests(self):
        pid = self.start(args=["sleep", "1000"])
        for op, args in [("proc_read", {}), ("proc_signal", dict(signal=15)),
                         ("proc_stdin", dict(data_b64="")), ("proc_resize", dict(cols=1, rows=1))]:
            with self.subTest(op=op):
                self.errno(op, "ESRCH", pid=999999999, **args)
                self.errno(op, "ESRCH", pid=-1, **args)
                self.errno(op, "EINVAL", pid="1", **args)
                self.errno(op, "EINVAL", pid=pid, unknown=True, **args)
        self.errno("proc_list", "EINVAL", pid=pid)
        msg = self.errno("proc_read", "EINVAL", pid=pid, offset=1)
        self.assertEqual(msg, "offset 1 is beyond the end of the output (0)")
        for bad in [dict(max=0), dict(max=262145), dict(wait_ms=60001), dict(offset=-1)]:
            self.errno("proc_read", "EINVAL", pid=pid, **bad)
        for sig in [0, 65, -9, 1 << 40]:
            self.errno("proc_signal", "EINVAL", pid=pid, signal=sig)
        self.errno("proc_signal", "EINVAL", pid=pid, signal="TERM")
        self.errno("proc_stdin", "EINVAL", pid=pid, data_b64=b64(b"z" * 65537))
        self.errno("proc_stdin", "EINVAL", pid=pid, data_b64="not base64!")
        self.assertEqual(self.a.ok("proc_stdin", pid=pid, data_b64=b64(b"z" * 65536))["written"], 65536)
        self.errno("proc_resize", "ENOTTY", pid=pid, cols=1, rows=1)
        self.errno("proc_resize", "EINVAL", pid=pid, cols=1001, rows=1)
        self.a.ok("proc_signal", pid=pid, signal=9)
        self.follow(pid)

    def test_list_of_long_command_lines_fits(self):
        # one alone is listed whole
        pid = self.start(args=["sh", "-c", "exec sleep 1000", "y" * 120_000], stdin=False)
        self.assertEqual(self.entry(pid)["args"][3], "y" * 120_000)
        self.a.ok("proc_signal", pid=pid, signal=9)
        self.follow(pid)
        pids = [self.start(args=["sh", "-c", "exec sleep 1000", "x" * 120_000], stdin=False) for _ in range(10)]
        entries = [self.entry(pid) for pid in pids]  # each a proc_list that fits in one reply
        for e in entries:
            self.assertEqual(e["args"][:3], ["sh", "-c", "exec sleep 1000"])
            self.assertLessEqual(sum(len(x) for x in e["args"]), 1024)
        for pid in pids:
            self.a.ok("proc_signal", pid=pid, signal=9)
        for pid in pids:
            self.follow(pid)

    def test_table_is_full_at_256(self):
        # Entries read to their end (earlier tests') give way, one for each start; then
        # the table holds only running processes and is full.
        pids = []
        for _ in range(2 * MAX_PROCS):
            ftype, obj = self.a.call("proc_start", args=["sleep", "1000"], stdin=False)
            if ftype == ERR:
                break
            pids.append(obj["pid"])
        self.assertEqual(self.count(), MAX_PROCS)
        msg = self.errno("proc_start", "EAGAIN", args=["true"])
        self.assertEqual(msg, "too many processes (256)")
        self.assertEqual(self.a.ok("exec", args=["echo", "still"])["stdout"], "still\n")
        for pid in pids:
            self.a.ok("proc_signal", pid=pid, signal=9)
        for pid in pids[:-1]:
            self.follow(pid)
        # A full table of exited entries: those read to their end give way to new ones, the
        # one nobody read does not.
        self.wait_entry(pids[-1], lambda e: not e["running"])
        self.assertEqual(self.count(), MAX_PROCS)
        fresh = self.start(args=["true"])
        # the one that gave way exited the longest ago: the 255 were killed together, so
        # which one that is depends on when the agent reaped each
        gone = [pid for pid in pids[:-1] if self.entry(pid) is None]
        self.assertEqual(len(gone), 1, gone)
        self.assertIsNotNone(self.entry(pids[-1]))
        self.follow(fresh)


class TestFlood(ProcTest):
    def test_rss_bounded_while_nobody_reads(self):
        warm = self.start(args=["true"])  # the table's own allocation, before measuring
        self.follow(warm)
        before = vmrss_kib(self.a.p.pid)
        pid = self.start(args=["yes", "flood"])
        e = self.wait_entry(pid, lambda e: e["end_offset"] > 16 * RING)
        after = vmrss_kib(self.a.p.pid)
        self.a.ok("proc_signal", pid=pid, signal=9)
        self.wait_entry(pid, lambda e: not e["running"])
        margin_kib = 8 * 1024
        self.assertLess(after - before, RING // 1024 + margin_kib, (before, after, e["end_offset"]))
        r = self.a.ok("proc_read", pid=pid, offset=0, max=16)
        self.assertGreater(r["gap"], 0)
        self.assertEqual(set(decode(r["chunks"])) - set(b"flood\n"), set())


class TestReconnect(unittest.TestCase):
    def connect(self, a, path, deadline):
        a.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        a.s.settimeout(30)
        while True:  # the path appears at bind(), connections succeed after listen()
            try:
                a.s.connect(path)
                break
            except (ConnectionRefusedError, FileNotFoundError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        a.buf, a.stash = b"", {}

    def test_reconnect_at_offset(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "agent.sock")
            a = Agent(channel=f"unix:{path}")
            try:
                deadline = time.monotonic() + 30
                self.connect(a, path, deadline)
                pid = a.ok("proc_start", args=["cat"])["pid"]
                a.ok("proc_stdin", pid=pid, data_b64=b64(b"first part\n"))
                r = a.ok("proc_read", pid=pid, wait_ms=10000)
                self.assertEqual(decode(r["chunks"]), b"first part\n")
                offset = r["next_offset"]
                # a long poll pending when the connection goes is dropped unanswered
                stale = a.request("proc_read", pid=pid, offset=offset, wait_ms=30000)
                a.ok("ping")
                a.s.close()

                self.connect(a, path, deadline)
                a.next_id = stale  # the same id again: only the new request may answer it
                a.ok("proc_stdin", pid=pid, data_b64=b64(b"second part\n"), eof=True)
                ftype, r = a.call("proc_read", pid=pid, offset=5, wait_ms=10000)
                self.assertEqual(ftype, RESP)
                got, off = b"", 5
                while True:
                    self.assertEqual(r["gap"], 0)
                    got += decode(r["chunks"])
                    if r["end"]:
                        break
                    off = r["next_offset"]
                    r = a.ok("proc_read", pid=pid, offset=off, wait_ms=10000)
                self.assertEqual(got, b"first part\nsecond part\n"[5:])
                self.assertIs(a.ok("ping")["pong"], True)
                self.assertEqual(a.stash, {}, "no answer of the old connection came")
                a.s.close()
                a.s = None
            finally:
                if a.p.poll() is None:
                    a.p.terminate()
                    a.p.wait()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    test_agent.AGENT = sys.argv.pop(1)
    if not os.access(test_agent.AGENT, os.X_OK):
        print(f"1..0 # SKIP {test_agent.AGENT} is not built")
        sys.exit(77)
    unittest.main(verbosity=2)
