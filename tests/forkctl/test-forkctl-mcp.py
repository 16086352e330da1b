#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
forkctl mcp, driven by an MCP client over pipes (the stdio transport: one
JSON-RPC 2.0 message a line) against the real stack: tools/forkd-stack brings
up a private dbus-daemon and the real forkd with forkd-vmm on /dev/kvm, and
the test guest (its run_code language: "x = 5", "print x"; tests/guest/files.c).
Checks the lifecycle, tools/list and every inputSchema, every tool, and
hostile input; every line the server writes must be a JSON-RPC message.
TAP output. Standard library only.

usage: test-forkctl-mcp.py FORKCTL SOURCE-ROOT   ($FORKD_BUILD_DIR: the build dir)
Skips (77) when forkd is not built or /dev/kvm is missing.
"""

import json
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import time

from tap import Skip, Tap, check, skip_all

FORKCTL = sys.argv[1] if len(sys.argv) > 1 else ""
TOP = sys.argv[2] if len(sys.argv) > 2 else ""
BUILD = os.environ.get("FORKD_BUILD_DIR", "")
LINE_MAX = 4 * 1024 * 1024
TOOLS = {"create_snapshot", "list_snapshots", "spawn_sandboxes", "list_sandboxes", "exec", "eval", "run_code",
         "fork_sandbox", "branch_sandbox", "kill_sandbox", "pause_sandbox", "resume_sandbox"}


class Server:
    """One forkctl mcp process and its pipes."""

    def __init__(self, env, args=(), log=None, prefix=()):
        self.log = log or tempfile.TemporaryFile()
        self.p = subprocess.Popen([*prefix, FORKCTL, *args, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.log, env=env)
        self.buf = b""
        self.next_id = 1

    def send_raw(self, data):
        self.p.stdin.write(data)
        self.p.stdin.flush()

    def send(self, msg):
        self.send_raw(json.dumps(msg).encode() + b"\n")

    def recv(self, timeout=30):
        """The next message; every line must be one JSON-RPC 2.0 message."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            check(left > 0, f"no reply within {timeout}s")
            r, _, _ = select.select([self.p.stdout], [], [], left)
            if r:
                chunk = os.read(self.p.stdout.fileno(), 1 << 16)
                check(chunk, f"the server closed stdout (exit {self.p.poll()})")
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        msg = json.loads(line)
        check(isinstance(msg, dict) and msg.get("jsonrpc") == "2.0", f"not a JSON-RPC 2.0 message: {line[:200]!r}")
        return msg

    def quiet(self, wait=0.3):
        """Nothing more was written."""
        r, _, _ = select.select([self.p.stdout], [], [], wait)
        check(not r and not self.buf, "the server wrote a reply where none was due")

    def request(self, method, params=None, timeout=30):
        i = self.next_id
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": i, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        reply = self.recv(timeout)
        check(reply.get("id") == i, f"reply to {i} has id {reply.get('id')}: {reply}")
        return reply

    def call(self, tool, arguments=None, timeout=120):
        params = {"name": tool}
        if arguments is not None:
            params["arguments"] = arguments
        reply = self.request("tools/call", params, timeout)
        check("result" in reply, f"tools/call {tool}: {reply}")
        return reply["result"]

    def ok(self, tool, arguments=None, timeout=120):
        res = self.call(tool, arguments, timeout)
        check(res.get("isError") is False, f"{tool} failed: {res}")
        check(res["content"][0]["type"] == "text", f"{tool}: content {res['content']}")
        data = json.loads(res["content"][0]["text"])
        check(data == res["structuredContent"], f"{tool}: text and structuredContent differ: {res}")
        return data

    def tool_error(self, tool, arguments=None, want=None, timeout=120):
        res = self.call(tool, arguments, timeout)
        check(res.get("isError") is True, f"{tool} {arguments}: not an error: {res}")
        text = res["content"][0]["text"]
        check(res["content"][0]["type"] == "text" and text, f"{tool}: no message: {res}")
        if want:
            check(want in text, f"{tool}: message {text!r} lacks {want!r}")
        return text

    def error(self, reply, code, want=None):
        check("error" in reply and reply["error"]["code"] == code, f"wanted error {code}, got {reply}")
        if want:
            check(want in reply["error"]["message"], f"message {reply['error']['message']!r} lacks {want!r}")

    def alive(self):
        check(self.request("ping").get("result") == {}, "ping after that failed")

    def close(self, timeout=10):
        """EOF on stdin: the server exits 0."""
        self.p.stdin.close()
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise AssertionError("the server did not exit at EOF")
        rest = self.p.stdout.read()
        check(not rest.strip() and not self.buf, f"output after the last reply: {rest[:200]!r}")
        # an ASan/UBSan build reports on stderr (UBSan without changing the exit status)
        err = self.stderr()
        check("runtime error" not in err and "Sanitizer" not in err, f"sanitizer report: {err[-2000:]}")
        return rc

    def stderr(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")


INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}


def main():
    if not FORKCTL or not TOP or not BUILD:
        print("usage: test-forkctl-mcp.py FORKCTL SOURCE-ROOT (with FORKD_BUILD_DIR)", file=sys.stderr)
        return 2
    if not os.access(os.path.join(BUILD, "src/daemon/forkd"), os.X_OK):
        skip_all(f"forkd is not built ({BUILD}/src/daemon/forkd)")
    if not os.path.exists("/dev/kvm"):
        skip_all("no /dev/kvm")
    if os.getuid() != 0:
        skip_all("needs root (forkd allows root without polkit)")

    state = tempfile.mkdtemp(prefix="forkctl-mcp.")
    # the test guest everywhere: its run_code language and hostile modes are what this test speaks
    stack_env = dict(os.environ, FORKD_BUILD_DIR=BUILD, FORKD_STACK_NO_BUILD="1", FORKD_STACK_GUEST="test")
    stack = [os.path.join(TOP, "tools/forkd-stack")]
    port = str(random.randint(20000, 31999))  # below the ephemeral ports (32768-60999)
    servers = []
    tap = Tap()
    try:
        up = subprocess.run(stack + ["up", "--state-dir", state, "--port", port], env=stack_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=180)
        if up.returncode != 0:
            print("not ok 1 - tools/forkd-stack up failed")
            for line in up.stderr.splitlines():
                print(f"# {line}")
            print("1..1")
            return 1
        senv = dict(line.split("=", 1) for line in up.stdout.splitlines() if "=" in line)
        env = dict(os.environ, FORKD_BUS_ADDRESS=senv["FORKD_BUS_ADDRESS"])
        kernel, rootfs = senv["FORKD_GUEST_KERNEL"], senv["FORKD_GUEST_ROOTFS"]
        tag = f"mcp-{os.getpid()}"
        s = Server(env)
        servers.append(s)
        ctx = {}

        def before_initialize():
            s.error(s.request("tools/list"), -32002, "initialize")
            s.error(s.request("tools/call", {"name": "list_snapshots"}), -32002, "initialize")
            check(s.request("ping").get("result") == {}, "ping before initialize")

        def initialize():
            r = s.request("initialize", INIT)["result"]
            check(r["protocolVersion"] == "2025-06-18", r)
            check(r["capabilities"].get("tools") is not None, r)
            check(r["serverInfo"]["name"] == "forkctl" and r["serverInfo"]["version"], r)
            s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            s.quiet()
            s.error(s.request("initialize", INIT), -32600, "already initialized")

        def versions():
            for asked, answered in (("2024-11-05", "2024-11-05"), ("2025-03-26", "2025-03-26"),
                                    ("1999-01-01", "2025-06-18")):
                o = Server(env)
                servers.append(o)
                r = o.request("initialize", dict(INIT, protocolVersion=asked))["result"]
                check(r["protocolVersion"] == answered, f"asked {asked}, got {r['protocolVersion']}")
                check(o.close() == 0, "exit status at EOF")
            o = Server(env)
            servers.append(o)
            o.error(o.request("initialize", {"capabilities": {}}), -32602, "protocolVersion")
            o.close()

        def tools_list():
            tools = s.request("tools/list")["result"]["tools"]
            names = [t["name"] for t in tools]
            check(set(names) == TOOLS and len(names) == len(TOOLS), f"tools: {names}")
            for t in tools:
                check(isinstance(t.get("description"), str) and len(t["description"]) > 20, f"{t['name']} description")
                sc = t["inputSchema"]
                check(sc.get("type") == "object" and isinstance(sc.get("properties"), dict), f"{t['name']}: {sc}")
                check(sc.get("additionalProperties") is False, f"{t['name']}: additionalProperties")
                for req in sc.get("required", []):
                    check(req in sc["properties"], f"{t['name']}: required {req} not a property")
                for pname, prop in sc["properties"].items():
                    check(prop.get("type") in ("string", "integer", "number", "boolean", "array", "object"),
                          f"{t['name']}.{pname}: {prop}")
                    check(isinstance(prop.get("description"), str) and prop["description"], f"{t['name']}.{pname}")
                    if prop["type"] == "integer":
                        check(prop["minimum"] <= prop.get("default", prop["minimum"]) <= prop["maximum"], f"{pname}")
                    if prop["type"] == "array":
                        check(prop["items"] == {"type": "string"}, f"{pname} items")
                    if "enum" in prop:
                        check(prop.get("default") in prop["enum"], f"{pname} default")
                    json.dumps(prop)  # plain JSON
            spawn = next(t for t in tools if t["name"] == "spawn_sandboxes")["inputSchema"]
            check(spawn["required"] == ["snapshot_tag"] and spawn["properties"]["n"]["maximum"] == 1000, spawn)
            for t in ("spawn_sandboxes", "fork_sandbox"):
                props = next(x for x in tools if x["name"] == t)["inputSchema"]["properties"]
                check(props["cpu_limit"]["type"] == "number" and props["disk_rate"]["type"] == "object" and
                      set(props["net_rate"]["properties"]) == {"bandwidth", "ops", "burst"}, (t, props))

        def create_snapshot():
            info = s.ok("create_snapshot", {"tag": tag, "kernel": kernel, "rootfs": rootfs, "boot_wait_secs": 60},
                        timeout=300)
            check(info["tag"] == tag and info["status"] == "ready" and info["owner_uid"] == 0, info)
            s.tool_error("create_snapshot", {"tag": tag, "kernel": kernel, "rootfs": rootfs}, "already exists")
            s.tool_error("create_snapshot", {"tag": tag + "x", "kernel": "/nonexistent/vmlinux", "rootfs": rootfs},
                         "cannot open the kernel /nonexistent/vmlinux")
            s.tool_error("create_snapshot", {"tag": tag + "x", "kernel": kernel, "rootfs": "/"}, "not a regular file")
            s.tool_error("create_snapshot", {"tag": tag + "x", "kernel": "vmlinux", "rootfs": rootfs}, "absolute path")
            s.tool_error("create_snapshot", {"tag": tag + "x", "kernel": kernel, "rootfs": rootfs,
                                             "boot_wait_secs": 0}, "from 1 to 600")
            tags = [x["tag"] for x in s.ok("list_snapshots")["snapshots"]]
            check(tag in tags and tag + "x" not in tags, tags)

        def spawn_and_run_code():
            sbs = s.ok("spawn_sandboxes", {"snapshot_tag": tag, "n": 2}, timeout=300)["sandboxes"]
            check(len(sbs) == 2 and all(x["snapshot_tag"] == tag for x in sbs), sbs)
            ctx["ids"] = [x["id"] for x in sbs]
            sb = ctx["ids"][0]
            r = s.ok("run_code", {"sandbox_id": sb, "code": "x = 5"})
            check(r.get("error") is None and r["stdout"] == "", r)
            r = s.ok("run_code", {"sandbox_id": sb, "code": "print x", "timeout_secs": 10})
            check(r["stdout"] == "5\n" and r["error"] is None, r)
            # the other sandbox has its own globals
            r = s.ok("run_code", {"sandbox_id": ctx["ids"][1], "code": "print x"})
            check(r["stdout"] == "" and r["error"], f"x leaked into the sibling: {r}")
            listed = [x["id"] for x in s.ok("list_sandboxes")["sandboxes"]]
            check(set(ctx["ids"]) <= set(listed), listed)

        def exec_and_eval():
            sb = ctx["ids"][0]
            r = s.ok("exec", {"sandbox_id": sb, "args": ["sh", "-c", "print x"], "timeout_secs": 30})
            check(r["stdout"] == "5\n" and r["exit_code"] == 0, r)
            r = s.ok("exec", {"sandbox_id": sb, "args": ["sh", "-c", "bogus statement"]})
            check(r["exit_code"] != 0, f"a failing command is a result, not a tool error: {r}")
            # the test guest runs nothing but sh -c, and no eval: guest errors are tool errors
            s.tool_error("exec", {"sandbox_id": sb, "args": ["ls", "/"]}, "not supported by the test guest")
            s.tool_error("eval", {"sandbox_id": sb, "code": "1 + 1"}, "not supported by the test guest")

        def fork_and_branch():
            sb = ctx["ids"][0]
            r = s.ok("fork_sandbox", {"sandbox_id": sb, "n": 2}, timeout=300)
            kids = [x["id"] for x in r["sandboxes"]]
            check(len(kids) == 2 and isinstance(r["parent_pause_us"], int), r)
            ctx["ids"] += kids
            s.ok("run_code", {"sandbox_id": kids[0], "code": "x = 6"})
            check(s.ok("run_code", {"sandbox_id": kids[1], "code": "print x"})["stdout"] == "5\n", "fork state")
            check(s.ok("run_code", {"sandbox_id": sb, "code": "print x"})["stdout"] == "5\n", "parent state")
            # a limit given to fork_sandbox (ForkSandboxEx): the child has it, its source not
            r = s.ok("fork_sandbox", {"sandbox_id": sb, "disk_rate": {"bandwidth": 1 << 20, "ops": 50}}, timeout=300)
            kid = r["sandboxes"][0]["id"]
            ctx["ids"].append(kid)
            listed = {x["id"]: x for x in s.ok("list_sandboxes")["sandboxes"]}
            check(listed[kid].get("disk_rate") == {"bandwidth": 1 << 20, "ops": 50}, listed[kid])
            check("disk_rate" not in listed[sb], listed[sb])
            info = s.ok("branch_sandbox", {"sandbox_id": kids[0], "tag": tag + "-br", "mode": "full"}, timeout=300)
            check(info["tag"] == tag + "-br" and info["branched_from"] == kids[0] and info["status"] == "ready", info)
            s.tool_error("branch_sandbox", {"sandbox_id": kids[0], "tag": tag + "-br"}, "already exists")
            s.tool_error("branch_sandbox", {"sandbox_id": kids[0], "wait": False}, "live")
            sbs = s.ok("spawn_sandboxes", {"snapshot_tag": tag + "-br"}, timeout=300)["sandboxes"]
            ctx["ids"].append(sbs[0]["id"])
            check(s.ok("run_code", {"sandbox_id": sbs[0]["id"], "code": "print x"})["stdout"] == "6\n", "branch state")

        def pause_resume():
            sb = ctx["ids"][0]
            info = s.ok("pause_sandbox", {"sandbox_id": sb}, timeout=300)
            check(info["id"] == sb and info["status"] == "paused", info)
            s.tool_error("run_code", {"sandbox_id": sb, "code": "print x"}, "paused")
            s.tool_error("pause_sandbox", {"sandbox_id": sb}, "paused")
            info = s.ok("resume_sandbox", {"sandbox_id": sb}, timeout=300)
            check(info["id"] == sb and info["status"] == "running", info)
            check(s.ok("run_code", {"sandbox_id": sb, "code": "print x"})["stdout"] == "5\n", "state after resume")
            s.tool_error("resume_sandbox", {"sandbox_id": sb}, "not paused")
            s.tool_error("resume_sandbox", {}, "missing required argument 'sandbox_id'")

        def kill():
            for i in ctx["ids"]:
                check(s.ok("kill_sandbox", {"sandbox_id": i}) == {"id": i, "killed": True}, "kill")
            s.tool_error("kill_sandbox", {"sandbox_id": ctx["ids"][0]}, f"no sandbox '{ctx['ids'][0]}'")
            s.tool_error("run_code", {"sandbox_id": ctx["ids"][0], "code": "print x"}, "NoSuchSandbox")
            left = [x["id"] for x in s.ok("list_sandboxes")["sandboxes"]]
            check(not set(ctx["ids"]) & set(left), left)
            s.tool_error("spawn_sandboxes", {"snapshot_tag": "no-such-snapshot"}, "no snapshot 'no-such-snapshot'")

        def hostile_guests():
            # a guest that answers garbage, and one that never answers: tool errors, and the server
            # (and forkd) serve on
            ids = [x["id"] for x in s.ok("spawn_sandboxes", {"snapshot_tag": tag, "n": 2}, timeout=300)["sandboxes"]]
            try:
                s.ok("run_code", {"sandbox_id": ids[0], "code": "hostile garbage"})
                s.ok("run_code", {"sandbox_id": ids[1], "code": "hostile silent"})
                t = s.tool_error("run_code", {"sandbox_id": ids[0], "code": "print x", "timeout_secs": 5})
                check(ids[0] in t or "guest" in t, t)
                t0 = time.monotonic()
                s.tool_error("run_code", {"sandbox_id": ids[1], "code": "print x", "timeout_secs": 2},
                             "did not answer in time")
                check(time.monotonic() - t0 < 30, "the timeout took too long")
                s.alive()
            finally:
                for i in ids:
                    s.call("kill_sandbox", {"sandbox_id": i})

        def bad_arguments():
            cases = [
                ("spawn_sandboxes", {"snapshot_tag": tag, "n": "2"}, "'n' must be an integer, not a string"),
                ("spawn_sandboxes", {"snapshot_tag": tag, "n": 2.5}, "'n' must be an integer"),
                ("spawn_sandboxes", {"snapshot_tag": tag, "n": 0}, "from 1 to 1000, not 0"),
                ("spawn_sandboxes", {"snapshot_tag": tag, "n": 1001}, "not 1001"),
                ("spawn_sandboxes", {"snapshot_tag": tag, "n": 2 ** 64 - 1}, "from 1 to 1000"),
                ("spawn_sandboxes", {"snapshot_tag": tag, "n": -1}, "not -1"),
                ("spawn_sandboxes", {"snapshot_tag": tag, "per_child_netns": "yes"}, "must be a boolean"),
                ("spawn_sandboxes", {"n": 1}, "missing required argument 'snapshot_tag'"),
                ("spawn_sandboxes", {"snapshot_tag": tag, "prewarm": True}, "unknown argument 'prewarm'"),
                ("spawn_sandboxes", {"snapshot_tag": None}, "not null"),
                ("spawn_sandboxes", {"snapshot_tag": "../etc"}, "must match"),
                ("spawn_sandboxes", [tag], "arguments must be an object"),
                ("exec", {"sandbox_id": "sb", "args": []}, "1 to 1024 items"),
                ("exec", {"sandbox_id": "sb", "args": ["sh", 1]}, "item 1 is an integer"),
                ("exec", {"sandbox_id": "sb", "args": "sh -c ls"}, "an array of strings"),
                ("run_code", {"sandbox_id": "sb", "code": "x" * (256 * 1024 + 1)}, "1 to 262144 characters"),
                ("run_code", {"sandbox_id": "sb", "code": "print x", "timeout_secs": 3601}, "from 0 to 3600"),
                ("branch_sandbox", {"sandbox_id": "sb", "mode": "half"}, "one of full, diff, live"),
                ("fork_sandbox", {"sandbox_id": "sb", "n": 33}, "from 1 to 32"),
                ("fork_sandbox", {"sandbox_id": "sb", "cpu_limit": "1"}, "'cpu_limit' must be a number, not a string"),
                ("fork_sandbox", {"sandbox_id": "sb", "cpu_limit": 0}, "must be a number above 0"),
                ("fork_sandbox", {"sandbox_id": "sb", "cpu_limit": 0.001}, "cpu_limit must be a number of at least 0.01"),
                ("spawn_sandboxes", {"snapshot_tag": tag, "disk_rate": {}}, "disk_rate needs at least one of"),
                ("spawn_sandboxes", {"snapshot_tag": tag, "net_rate": {"rate": 1}},
                 "net_rate takes only bandwidth, ops and burst"),
                ("spawn_sandboxes", {"snapshot_tag": tag, "net_rate": 5}, "'net_rate' must be an object"),
                ("list_snapshots", {"all": True}, "unknown argument 'all'; it takes no arguments"),
                ("kill_sandbox", None, "missing required argument 'sandbox_id'"),
            ]
            for tool, args, want in cases:
                s.tool_error(tool, args, want)
            s.alive()

        def hostile():
            s.send_raw(b"{not json\n")
            s.error(s.recv(), -32700, "parse error")
            s.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": "ping"} trailing\n')
            s.error(s.recv(), -32700)
            s.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": "\xff\xfe"}\n')
            s.error(s.recv(), -32700, "UTF-8")
            s.send_raw(b'{"a":' * 100 + b"1" + b"}" * 100 + b"\n")
            s.error(s.recv(), -32700, "too deep")
            s.send({"jsonrpc": "1.0", "id": 7, "method": "ping"})
            r = s.recv()
            s.error(r, -32600, "jsonrpc")
            check(r["id"] == 7, r)
            s.send({"id": 8, "method": "ping"})
            s.error(s.recv(), -32600, "jsonrpc")
            s.send([{"jsonrpc": "2.0", "id": 9, "method": "ping"}])
            r = s.recv()
            s.error(r, -32600, "batch")
            check(r["id"] is None, r)
            s.send({"jsonrpc": "2.0", "id": None, "method": "ping"})
            s.error(s.recv(), -32600, "id")
            s.send({"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"})
            s.error(s.recv(), -32600, "id")
            s.send({"jsonrpc": "2.0", "id": 10, "method": 5})
            s.error(s.recv(), -32600, "method")
            s.send({"jsonrpc": "2.0", "id": 11})
            s.error(s.recv(), -32600, "method")
            s.error(s.request("resources/list"), -32601, "resources/list")
            s.error(s.request("tools/call", {"name": "rm_rf"}), -32602, "unknown tool")
            s.error(s.request("tools/call", {"arguments": {}}), -32602, "name")
            s.error(s.request("tools/call", [1, 2]), -32602, "object")
            s.error(s.request("tools/list", {"cursor": "x"}), -32602, "cursor")
            s.error(s.request("notifications/initialized"), -32600, "notification")
            # many values in a small line: refused before they are parsed
            s.send({"jsonrpc": "2.0", "id": 12, "method": "ping", "params": {"a": [{}] * 70000}})
            s.error(s.recv(), -32600, "JSON values")
            # string ids are echoed as they are
            s.send({"jsonrpc": "2.0", "id": "abc", "method": "ping"})
            check(s.recv() == {"jsonrpc": "2.0", "id": "abc", "result": {}}, "string id")
            # notifications and responses get no reply, whatever they hold
            s.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}})
            s.send({"jsonrpc": "2.0", "method": "no/such/notification", "params": [1]})
            s.send({"jsonrpc": "2.0", "id": 99, "result": {}})
            s.send_raw(b"\n   \n\r\n")
            s.quiet()
            s.alive()

        def huge_lines():
            # a line over the limit gets one error and is skipped; the message after it in the
            # same write is answered
            big = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"pad": "' + b"x" * LINE_MAX + b'"}}'
            s.send_raw(big + b'\n{"jsonrpc": "2.0", "id": "after", "method": "ping"}\n')
            r = s.recv()
            s.error(r, -32600, "more than 4194304 bytes")
            check(r["id"] is None, r)
            check(s.recv() == {"jsonrpc": "2.0", "id": "after", "result": {}}, "message after a huge line")
            # 12 MiB without a newline, in pieces, then the rest of the line: one error
            for _ in range(12):
                s.send_raw(b"y" * (1 << 20))
            s.error(s.recv(), -32600, "more than")
            s.send_raw(b'yyy"}\n')
            s.quiet(1)
            s.alive()
            # a line just under the limit is read, and parsed
            pad = LINE_MAX - 200
            ok = json.dumps({"jsonrpc": "2.0", "id": "big", "method": "tools/call",
                             "params": {"name": "run_code", "arguments": {"sandbox_id": "sb", "code": "p" * pad}}})
            check(len(ok) < LINE_MAX, "test line too long")
            s.send_raw(ok.encode() + b"\n")
            r = s.recv()
            check(r["id"] == "big" and r["result"]["isError"] and "characters" in r["result"]["content"][0]["text"], r)

        def no_bus():
            o = Server(dict(env, FORKD_BUS_ADDRESS="unix:path=" + os.path.join(state, "no-such-bus")))
            servers.append(o)
            o.request("initialize", INIT)
            o.tool_error("list_sandboxes", None, "cannot connect to the bus")
            o.tool_error("list_sandboxes", {}, "cannot connect to the bus")
            o.alive()
            check(o.close() == 0, "exit status")

        def unprivileged():
            # forkctl mcp as uid 65534: it opens the boot files with its own rights, and forkd asks
            # polkit, which is not running here: a denial, as a tool error
            nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
            if not shutil.which("setpriv"):
                raise AssertionError("setpriv (util-linux) is missing")
            if subprocess.run(nobody + [FORKCTL, "--version"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode != 0:
                raise Skip(f"uid 65534 cannot run {FORKCTL} (a build dir it cannot reach)")
            pub = tempfile.mkdtemp(prefix="forkctl-mcp-pub.")
            try:
                os.chmod(pub, 0o755)
                for name, src in (("kernel", kernel), ("rootfs", None)):
                    with open(os.path.join(pub, name), "wb") as f:
                        f.write(open(src, "rb").read() if src else b"\0" * 4096)
                    os.chmod(os.path.join(pub, name), 0o644)
                secret = os.path.join(pub, "secret")
                with open(secret, "w") as f:
                    f.write("root only\n")
                os.chmod(secret, 0o600)
                o = Server(env, prefix=nobody)
                servers.append(o)
                o.request("initialize", INIT)
                check(tag in [x["tag"] for x in o.ok("list_snapshots")["snapshots"]], "list_snapshots as nobody")
                o.tool_error("create_snapshot", {"tag": tag + "-n", "kernel": secret, "rootfs": secret},
                             f"cannot open the kernel {secret}: Permission denied")
                o.tool_error("create_snapshot", {"tag": tag + "-n", "kernel": os.path.join(pub, "kernel"),
                                                 "rootfs": os.path.join(pub, "rootfs")},
                             "[org.freedesktop.DBus.Error.AccessDenied]")
                o.tool_error("spawn_sandboxes", {"snapshot_tag": tag}, "polkit")
                check(o.ok("list_sandboxes")["sandboxes"] == [], "nobody sees no sandboxes")
                o.alive()
                check(o.close() == 0, "exit status")
            finally:
                shutil.rmtree(pub, ignore_errors=True)

        def stdio_only():
            # the server's stdout held only protocol messages (recv() checked each line); EOF exits 0
            check(s.close() == 0, f"exit status; stderr: {s.stderr()}")

        def help_and_usage():
            h = subprocess.run([FORKCTL, "mcp", "--help"], stdout=subprocess.PIPE, text=True, timeout=10)
            check(h.returncode == 0 and '"command": "forkctl"' in h.stdout and "tools/list" in h.stdout, h.stdout)
            u = subprocess.run([FORKCTL, "mcp", "extra"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, timeout=10)
            check(u.returncode == 2 and "usage: forkctl mcp" in u.stderr, u.stderr)

        tap.run("calls before initialize are refused, ping is answered", before_initialize)
        tap.run("initialize, notifications/initialized (no reply), a second initialize refused", initialize)
        tap.run("protocol versions: 2024-11-05 and 2025-03-26 echoed, an unknown one gets ours", versions)
        tap.run("tools/list: the 12 tools, each inputSchema an object schema", tools_list)
        tap.run("create_snapshot from paths (CreateSnapshotFromFds), list_snapshots; its errors", create_snapshot)
        tap.run("spawn_sandboxes, then run_code: x = 5, print x", spawn_and_run_code)
        tap.run("exec; guest errors (test guest: no eval) are tool errors", exec_and_eval)
        tap.run("fork_sandbox and branch_sandbox keep the sandbox's state", fork_and_branch)
        tap.run("pause_sandbox and resume_sandbox: the state kept, a paused sandbox refused", pause_resume)
        tap.run("kill_sandbox; forkd's errors are tool errors", kill)
        tap.run("hostile guests (garbage, silence): tool errors, the server serves on", hostile_guests)
        tap.run("bad arguments: types, ranges, required, unknown keys, null", bad_arguments)
        tap.run("hostile messages: JSON, jsonrpc, batches, ids, methods, params", hostile)
        tap.run("lines over 4 MiB: an error, skipped, the server reads on", huge_lines)
        tap.run("no bus: tool errors, the server serves on", no_bus)
        tap.run("as uid 65534: boot files opened with its rights, polkit's denial a tool error", unprivileged)
        tap.run("stdout carried only protocol messages; EOF exits 0", stdio_only)
        tap.run("forkctl mcp --help, usage error", help_and_usage)
    finally:
        for sv in servers:
            if sv.p.poll() is None:
                sv.p.kill()
                sv.p.wait()
        subprocess.run(stack + ["down", "--state-dir", state], env=stack_env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)
        shutil.rmtree(state, ignore_errors=True)
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
