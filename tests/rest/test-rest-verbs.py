#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
run_code, merge and diff end to end: real HTTP against forkd-rest, a private
dbus-daemon, the real forkd with forkd-vmm and the test guest (its run_code
language and file table, tests/guest/files.c), TAP output. The machinery
(Stack, Client, Tap) is test-rest.py's.

Environment: as test-rest.py (tests/rest/meson.build).
"""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

_spec = importlib.util.spec_from_file_location("test_rest", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                         "test-rest.py"))
tr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tr)
check, Skip = tr.check, tr.Skip

TAG = "verbs"
SPEC_KEYS = ["stdout", "stderr", "error", "exit_code"]


class Ctx:
    pass


def fork(c, n, **extra):
    r = c.expect(201, "POST", "/v1/sandboxes", dict({"snapshot_tag": TAG, "n": n}, **extra))
    return [sb["id"] for sb in r.json], {sb["id"]: sb for sb in r.json}


def run(c, sid, code, status=200, **extra):
    r = c.expect(status, "POST", f"/v1/sandboxes/{sid}/run_code", dict({"code": code}, **extra))
    if status == 200:
        check(list(r.json)[:4] == SPEC_KEYS and set(r.json) <= set(SPEC_KEYS) | {"truncated", "timed_out"}, r)
    return r.json


def ok(c, sid, code, **extra):
    j = run(c, sid, code, **extra)
    check(j["error"] is None and j["exit_code"] == 0 and j["stderr"] == "", j)
    return j["stdout"]


def vmm_alive(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"forkd-vmm" in f.read()
    except OSError:
        return False


def t_setup(c, stack):
    rootfs = os.path.join(stack.tmp, "rootfs.img")
    with open(rootfs, "wb") as f:
        f.truncate(8 << 20)
    c.expect(201, "POST", "/v1/snapshots", {"tag": TAG, "kernel": tr.GUEST, "rootfs": rootfs, "boot_wait_secs": 10})


def t_run_code(c, stack):
    ids, _ = fork(c, 1)
    sid = ids[0]
    Ctx.run_sb = sid
    # REST API v1's answer: exactly stdout, stderr, error, exit_code
    r = c.expect(200, "POST", f"/v1/sandboxes/{sid}/run_code", {"code": "x = 41"})
    check({k: r.json[k] for k in SPEC_KEYS} == {"stdout": "", "stderr": "", "error": None, "exit_code": 0}, r)
    # globals persist across calls
    check(ok(c, sid, "print x") == "41\n", "x persists")
    check(ok(c, sid, "x = 42; print x", timeout_secs=5) == "42\n", "timeout_secs accepted")
    check(ok(c, sid, "print x", timeout_secs=0) == "42\n", "timeout_secs 0: the default")
    check(ok(c, sid, "print x", timeout_secs=None) == "42\n", "timeout_secs null: the default")
    # an exception in the code is a 200 with error and exit_code, as REST API v1's eval shows
    j = run(c, sid, "print x\nprint nosuch")
    check(j["stdout"] == "42\n" and j["exit_code"] == 1 and j["error"].startswith("NameError") and
          j["stderr"].startswith("NameError"), j)


def t_run_code_errors(c, stack):
    sid = Ctx.run_sb
    base = f"/v1/sandboxes/{sid}/run_code"
    for body in ({}, {"code": 1}, {"code": None}, {"code": ["x"]}, {"code": "x = 1", "timeout_secs": -1},
                 {"code": "x = 1", "timeout_secs": 3601}, {"code": "x = 1", "timeout_secs": "5"},
                 {"code": "x = 1", "timeout_secs": 1.5},
                 {"code": "a\u0000b"}, {"code": "y" * (256 * 1024 + 1)}):
        r = c.expect(400, "POST", base, body)
        check(r.json["error"], r)
    c.expect(400, "POST", base, raw=b'{"code": "x = 1"', headers={"Content-Type": "application/json"})
    c.expect(400, "POST", base, raw=b"[]", headers={"Content-Type": "application/json"})
    c.expect(400, "POST", base)
    c.expect(404, "POST", "/v1/sandboxes/sb-nosuch/run_code", {"code": "x = 1"})
    c.expect(400, "POST", "/v1/sandboxes/bad%20id/run_code", {"code": "x = 1"})
    c.expect(405, "GET", base)
    # the guest's own refusal (code over the test guest's 2 KiB) is a 500 with its message
    r = c.expect(500, "POST", base, {"code": "z" * 3000})
    check("code" in r.json["error"], r)
    # and the sandbox kept its state through all of it
    check(ok(c, sid, "print x") == "42\n", "state kept")
    c.expect(204, "DELETE", f"/v1/sandboxes/{sid}")


def t_run_code_fork(c, stack):
    """Globals and files persist across POST /v1/sandboxes/:id/fork and a branch of
    a running sandbox: each child starts with the parent's state at the pause, and
    what any of them does afterwards is its own."""
    ids, _ = fork(c, 1)
    parent = ids[0]
    ok(c, parent, "x = 41; write /root/p.txt parent")
    r = c.expect(200, "POST", f"/v1/sandboxes/{parent}/fork", {"n": 3})
    kids = r.json["children"]
    check(len(kids) == 3, r)
    for k in kids:
        check(ok(c, k, "print x; cat /root/p.txt") == "41\nparent\n", f"{k} inherits x and the file")
    # a child's change stays its own; the parent's writes after the fork stay the parent's
    ok(c, kids[0], "x = 99; write /root/k.txt kid0")
    ok(c, parent, "write /root/late.txt parent-after")
    check(ok(c, kids[0], "print x") == "99\n", "the child's x")
    for sid in kids[1:] + [parent]:
        check(ok(c, sid, "print x") == "41\n", f"{sid}: x is still 41")
        j = run(c, sid, "cat /root/k.txt")
        check(j["exit_code"] != 0 and j["error"], f"{sid} sees the child's file: {j}")
    for k in kids:
        j = run(c, k, "cat /root/late.txt")
        check(j["exit_code"] != 0 and j["error"], f"{k} sees the parent's later file: {j}")
    # a child of a child, and the children of a branch, inherit them as well
    grand = c.expect(200, "POST", f"/v1/sandboxes/{kids[0]}/fork", {"n": 1}).json["children"]
    check(ok(c, grand[0], "print x; cat /root/k.txt") == "99\nkid0\n", "the grandchild inherits x = 99")
    c.expect(201, "POST", f"/v1/sandboxes/{parent}/branch", {"tag": "verbs-rc", "mode": "full"})
    bkids, _ = fork(c, 1, snapshot_tag="verbs-rc")
    check(ok(c, bkids[0], "print x; cat /root/late.txt") == "41\nparent-after\n", "a branch child inherits x")
    for sid in [parent] + kids + grand + bkids:
        c.expect(204, "DELETE", f"/v1/sandboxes/{sid}")
    c.expect(204, "DELETE", "/v1/snapshots/verbs-rc")


def t_diff(c, stack):
    ids, _ = fork(c, 2)
    a, b = ids
    Ctx.diff_sbs = ids
    d = c.expect(200, "POST", f"/v1/sandboxes/{a}/diff", {"other": b}).json
    check(d == {"added": [], "removed": [], "modified": []}, f"two fresh forks: {d}")
    # REST API v1's example
    ok(c, a, "write /root/a.txt from a")
    ok(c, b, "write /root/b.txt from b")
    d = c.expect(200, "POST", f"/v1/sandboxes/{a}/diff", {"other": b}).json
    check(d == {"added": ["/root/b.txt"], "removed": ["/root/a.txt"], "modified": []}, d)
    check(list(d) == ["added", "removed", "modified"], d)
    # the other way round
    d = c.expect(200, "POST", f"/v1/sandboxes/{b}/diff", {"other": a}).json
    check(d == {"added": ["/root/a.txt"], "removed": ["/root/b.txt"], "modified": []}, d)
    # modified: in both, different contents; same contents: not listed; /tmp is a default path
    ok(c, a, "write /tmp/m.txt one; write /tmp/same hello; write /etc/only-a x")
    ok(c, b, "write /tmp/m.txt two; write /tmp/same hello; write /etc/only-b y")
    d = c.expect(200, "POST", f"/v1/sandboxes/{a}/diff", {"other": b}).json
    check(d == {"added": ["/root/b.txt"], "removed": ["/root/a.txt"], "modified": ["/tmp/m.txt"]}, d)
    # paths: elsewhere, and everything
    d = c.expect(200, "POST", f"/v1/sandboxes/{a}/diff", {"other": b, "paths": ["/etc"]}).json
    check(d == {"added": ["/etc/only-b"], "removed": ["/etc/only-a"], "modified": []}, d)
    d = c.expect(200, "POST", f"/v1/sandboxes/{a}/diff", {"other": b, "paths": ["/"]}).json
    check(d == {"added": ["/etc/only-b", "/root/b.txt"], "removed": ["/etc/only-a", "/root/a.txt"],
                "modified": ["/tmp/m.txt"]}, d)
    d = c.expect(200, "POST", f"/v1/sandboxes/{a}/diff", {"other": b, "paths": ["/root/a.txt", "/nowhere"]}).json
    check(d == {"added": [], "removed": ["/root/a.txt"], "modified": []}, d)
    d = c.expect(200, "POST", f"/v1/sandboxes/{a}/diff", {"other": b, "paths": None}).json
    check(d["modified"] == ["/tmp/m.txt"], f"paths null: the default {d}")
    # a sandbox against itself
    d = c.expect(200, "POST", f"/v1/sandboxes/{a}/diff", {"other": a, "paths": ["/"]}).json
    check(d == {"added": [], "removed": [], "modified": []}, d)
    # a file removed in b after the fork is "removed" seen from a
    ok(c, a, "write /root/shared.txt s")
    ok(c, b, "write /root/shared.txt s")
    d = c.expect(200, "POST", f"/v1/sandboxes/{a}/diff", {"other": b, "paths": ["/root"]}).json
    check(d["removed"] == ["/root/a.txt"], d)
    ok(c, b, "rm /root/shared.txt")
    d = c.expect(200, "POST", f"/v1/sandboxes/{a}/diff", {"other": b, "paths": ["/root"]}).json
    check(d["removed"] == ["/root/a.txt", "/root/shared.txt"], d)


def t_diff_errors(c, stack):
    a, b = Ctx.diff_sbs
    base = f"/v1/sandboxes/{a}/diff"
    for body in ({}, {"other": 5}, {"other": ""}, {"other": "bad id"}, {"other": "x" * 65}, {"other": b, "paths": []},
                 {"other": b, "paths": "/root"}, {"other": b, "paths": ["root"]}, {"other": b, "paths": [1]},
                 {"other": b, "paths": ["/a/../b"]}, {"other": b, "paths": ["/a//b"]}, {"other": b, "paths": ["/a/"]},
                 {"other": b, "paths": ["/a/./b"]}, {"other": b, "paths": ["/a\nb"]}, {"other": b, "paths": ["/a\u0000"]},
                 {"other": b, "paths": ["/x"] * 65}, {"other": b, "paths": ["/" + "x" * 4096]}):
        r = c.expect(400, "POST", base, body)
        check(r.json["error"], r)
    c.expect(400, "POST", base)
    c.expect(404, "POST", "/v1/sandboxes/sb-nosuch/diff", {"other": b})
    r = c.expect(404, "POST", base, {"other": "sb-nosuch"})
    check("sb-nosuch" in r.json["error"], r)
    c.expect(405, "GET", base)
    # more paths than the test guest takes (16): its refusal is a 500 naming the sandbox
    r = c.expect(500, "POST", base, {"other": b, "paths": [f"/p{i}" for i in range(17)]})
    check(a in r.json["error"] or b in r.json["error"], r)
    for sid in (a, b):
        c.expect(204, "DELETE", f"/v1/sandboxes/{sid}")
    c.expect(404, "POST", base, {"other": b})


def t_pause_resume(c, stack):
    """Pause and resume over REST: pause frees the VM and keeps globals and files; a paused
    sandbox is listed, refuses the verbs with 409 and REST API v1's body, forks (any number
    of batches) and stays paused; resume brings the same id back with its state; DELETE
    removes a paused one."""
    ids, info = fork(c, 1)
    sid = ids[0]
    ok(c, sid, "x = 17; write /root/state.txt kept")
    r = c.expect(200, "POST", f"/v1/sandboxes/{sid}/pause")
    check(r.json["id"] == sid and r.json["status"] == "paused" and r.json["pid"] == 0, r)
    check(not vmm_alive(info[sid]["pid"]), "the VMM is gone once the pause is answered")
    check(c.expect(200, "GET", f"/v1/sandboxes/{sid}").json["status"] == "paused", "GET shows paused")
    listed = {sb["id"]: sb for sb in c.expect(200, "GET", "/v1/sandboxes").json}
    check(listed[sid]["status"] == "paused", listed)
    for verb, body in (("exec", {"args": ["true"]}), ("eval", {"code": "1"}), ("run_code", {"code": "print x"}),
                       ("branch", {"tag": "from-paused"}), ("pause", None)):
        r = c.expect(409, "POST", f"/v1/sandboxes/{sid}/{verb}", body)
        check(r.json == {"error": f"sandbox {sid} is paused"}, f"{verb}: {r}")
    for _ in range(2):
        r = c.expect(200, "POST", f"/v1/sandboxes/{sid}/fork", {"n": 2})
        kids = r.json["children"]
        check(len(kids) == 2, r)
        for k in kids:
            check(ok(c, k, "print x; cat /root/state.txt") == "17\nkept\n", f"{k}: the paused state")
            c.expect(204, "DELETE", f"/v1/sandboxes/{k}")
    check(c.expect(200, "GET", f"/v1/sandboxes/{sid}").json["status"] == "paused", "still paused after the forks")
    r = c.expect(200, "POST", f"/v1/sandboxes/{sid}/resume", {})
    check(r.json["id"] == sid and r.json["status"] == "running" and r.json["pid"] > 0, r)
    check(ok(c, sid, "print x; cat /root/state.txt") == "17\nkept\n", "globals and files back")
    r = c.expect(409, "POST", f"/v1/sandboxes/{sid}/resume")
    check("not paused" in r.json["error"], r)
    c.expect(404, "POST", "/v1/sandboxes/sb-nosuch-0000/pause")
    c.expect(404, "POST", "/v1/sandboxes/sb-nosuch-0000/resume")
    c.expect(400, "POST", f"/v1/sandboxes/{sid}/pause", raw=b"{not json")
    c.expect(200, "POST", f"/v1/sandboxes/{sid}/pause")
    c.expect(204, "DELETE", f"/v1/sandboxes/{sid}")
    c.expect(404, "GET", f"/v1/sandboxes/{sid}")


def t_timeouts(c, stack):
    """timeout_secs and on_timeout on POST /v1/sandboxes and /fork, POST /v1/sandboxes/:id/timeout,
    expires_at (RFC 3339 or null); kill and pause at the deadline."""
    for body, want in (({"timeout_secs": 0}, "timeout_secs"), ({"timeout_secs": 86401}, "timeout_secs"),
                       ({"timeout_secs": "5"}, "timeout_secs"), ({"timeout_secs": 5, "on_timeout": "later"},
                                                                  "on_timeout"),
                       ({"on_timeout": "kill"}, "needs timeout_secs")):
        r = c.expect(400, "POST", "/v1/sandboxes", dict({"snapshot_tag": TAG}, **body))
        check(want in r.json["error"], f"{body}: {r}")
    _, plain = fork(c, 1)
    (pid, p), = plain.items()
    check(p["expires_at"] is None and p["on_timeout"] == "kill", p)
    t0 = time.time()
    ids, info = fork(c, 1, timeout_secs=1)
    gone = ids[0]
    check(info[gone]["expires_at"].endswith("Z") and info[gone]["on_timeout"] == "kill", info)
    ids, info = fork(c, 1, timeout_secs=1, on_timeout="pause")
    paused = ids[0]
    deadline = time.time() + 15
    while time.time() < deadline:
        if (c.req("GET", f"/v1/sandboxes/{gone}").status == 404 and
                c.expect(200, "GET", f"/v1/sandboxes/{paused}").json["status"] == "paused"):
            break
        time.sleep(0.1)
    check(time.time() - t0 >= 0.9, "nothing happened before the deadline")
    c.expect(404, "GET", f"/v1/sandboxes/{gone}")
    check(c.expect(200, "GET", f"/v1/sandboxes/{paused}").json["status"] == "paused", "paused at the deadline")
    r = c.expect(200, "POST", f"/v1/sandboxes/{pid}/timeout", {"timeout_secs": 600})
    check(r.json["expires_at"] and r.json["on_timeout"] == "kill", r)
    r = c.expect(200, "POST", f"/v1/sandboxes/{paused}/timeout", {"timeout_secs": 600, "on_timeout": "kill"})
    check(r.json["status"] == "paused" and r.json["expires_at"], r)
    for body in ({}, {"timeout_secs": 0}, {"timeout_secs": 10, "on_timeout": "x"}):
        c.expect(400, "POST", f"/v1/sandboxes/{pid}/timeout", body)
    c.expect(404, "POST", "/v1/sandboxes/sb-nosuch-0000/timeout", {"timeout_secs": 5})
    r = c.expect(200, "POST", f"/v1/sandboxes/{pid}/fork", {"n": 2, "timeout_secs": 300})
    for k in r.json["children"]:
        check(c.expect(200, "GET", f"/v1/sandboxes/{k}").json["expires_at"], f"{k} has a deadline")
        c.expect(204, "DELETE", f"/v1/sandboxes/{k}")
    c.expect(400, "POST", f"/v1/sandboxes/{pid}/fork", {"n": 1, "timeout_secs": -1})
    # limits on the copies of a running sandbox; the source keeps none
    rate = {"bandwidth": 1 << 20, "ops": 50}
    r = c.expect(200, "POST", f"/v1/sandboxes/{pid}/fork", {"n": 1, "disk_rate": rate})
    k = r.json["children"][0]
    check(c.expect(200, "GET", f"/v1/sandboxes/{k}").json.get("disk_rate") == rate, "the copy has its disk_rate")
    check("disk_rate" not in c.expect(200, "GET", f"/v1/sandboxes/{pid}").json, "the source has none")
    c.expect(204, "DELETE", f"/v1/sandboxes/{k}")
    c.expect(400, "POST", f"/v1/sandboxes/{pid}/fork", {"n": 1, "net_rate": {"burst": 8192}})
    for k in (pid, paused):
        c.expect(204, "DELETE", f"/v1/sandboxes/{k}")


def records(stack):
    d = os.path.join(stack.tmp, "state", "sandboxes")
    out = {}
    for name in os.listdir(d):
        if name.endswith(".json"):
            with open(os.path.join(d, name)) as f:
                out[name[:-5]] = json.load(f)
    return out


def t_merge(c, stack):
    limit = {"memory_limit_mib": 64} if stack.cgroot else {}
    ids, info = fork(c, 3, **limit)
    p, w, s = ids
    Ctx.merge = (p, w, s)
    ok(c, p, "x = parent; write /root/p.txt parent")
    ok(c, w, "x = winner; write /root/w.txt winner")
    ok(c, s, "x = sibling")
    old_pid = info[p]["pid"]
    r = c.expect(200, "POST", f"/v1/sandboxes/{p}/merge", {"winner": w})
    sb = r.json
    check(sb["id"] == p and sb["pid"] == info[w]["pid"] and sb["snapshot_tag"] == TAG, r)
    check(sb["created_at_unix"] == info[w]["created_at_unix"], r)
    if limit:
        check(sb.get("memory_limit_mib") == 64, r)
    # the old VM of p is gone when the answer comes
    check(not vmm_alive(old_pid), f"the old VM of {p} (pid {old_pid}) still runs")
    check(vmm_alive(sb["pid"]), "the winner's VM runs")
    # p drives the winner's VM: its globals and files
    check(ok(c, p, "print x; cat /root/w.txt") == "winner\nwinner\n", "p has the winner's state")
    j = run(c, p, "cat /root/p.txt")
    check(j["exit_code"] == 1, f"the parent's file went with its VM: {j}")
    c.expect(200, "POST", f"/v1/sandboxes/{p}/ping")
    # the winner's id is gone
    for method, path in (("GET", f"/v1/sandboxes/{w}"), ("POST", f"/v1/sandboxes/{w}/ping"),
                         ("DELETE", f"/v1/sandboxes/{w}")):
        c.expect(404, method, path)
    c.expect(404, "POST", f"/v1/sandboxes/{w}/run_code", {"code": "print x"})
    lst = c.expect(200, "GET", "/v1/sandboxes").json
    check(sorted(x["id"] for x in lst) == sorted([p, s]), lst)
    check([x["pid"] for x in lst if x["id"] == p] == [info[w]["pid"]], lst)
    g = c.expect(200, "GET", f"/v1/sandboxes/{p}").json
    # the same sandbox, but for its usage, which moves (and which the merge's answer need not carry)
    check({k: v for k, v in g.items() if k != "usage"} == {k: v for k, v in sb.items() if k != "usage"},
          f"GET after merge {g} != {sb}")
    check("usage" in g, f"GET after merge has no usage: {g}")
    # the record of the winner's VM names p, the old one's is gone
    rec = records(stack)
    check(p not in rec and rec.get(w, {}).get("id") == p and rec[w].get("vm_id") == w, rec)
    # the sibling is untouched
    check(ok(c, s, "print x") == "sibling\n", "sibling")
    # diff works across the new mapping
    d = c.expect(200, "POST", f"/v1/sandboxes/{p}/diff", {"other": s}).json
    check(d == {"added": [], "removed": ["/root/w.txt"], "modified": []}, d)


def t_merge_again(c, stack):
    """A second merge into the same id: the VM retired now is one whose id had
    already moved (its VM name differs from its id)."""
    p, w, s = Ctx.merge
    pid_w = c.expect(200, "GET", f"/v1/sandboxes/{p}").json["pid"]
    sb = c.expect(200, "POST", f"/v1/sandboxes/{p}/merge", {"winner": s}).json
    check(sb["id"] == p and sb["pid"] != pid_w, sb)
    check(not vmm_alive(pid_w), "the first winner's VM is gone")
    check(ok(c, p, "print x") == "sibling\n", "p drives the sibling's VM")
    lst = c.expect(200, "GET", "/v1/sandboxes").json
    check([x["id"] for x in lst] == [p], lst)
    rec = records(stack)
    check(list(rec) == [s] and rec[s]["id"] == p, rec)


def t_merge_errors(c, stack):
    p, w, s = Ctx.merge
    base = f"/v1/sandboxes/{p}/merge"
    r = c.expect(400, "POST", base, {"winner": p})
    check(p in r.json["error"], r)
    for body in ({}, {"winner": 5}, {"winner": None}, {"winner": ""}, {"winner": "bad id"}, {"winner": "x" * 65}):
        c.expect(400, "POST", base, body)
    c.expect(400, "POST", base)
    r = c.expect(404, "POST", base, {"winner": "sb-nosuch"})
    check("sb-nosuch" in r.json["error"], r)
    c.expect(404, "POST", base, {"winner": w})  # merged away already
    c.expect(404, "POST", "/v1/sandboxes/sb-nosuch/merge", {"winner": p})
    c.expect(404, "POST", f"/v1/sandboxes/{w}/merge", {"winner": p})
    c.expect(405, "GET", base)
    check(ok(c, p, "print x") == "sibling\n", "nothing changed")


def t_merge_restart(c, stack):
    """forkd killed after a merge: the next start cleans up by the records
    (the VMs died with it) and announces nothing is left."""
    p, w, s = Ctx.merge
    pid = c.expect(200, "GET", f"/v1/sandboxes/{p}").json["pid"]
    stack.daemon.send_signal(signal.SIGKILL)
    stack.daemon.wait()
    for _ in range(100):
        if not vmm_alive(pid):
            break
        time.sleep(0.05)
    check(not vmm_alive(pid), "the VM outlived forkd")
    stack.start_daemon()
    tr.wait_daemon(c, stack)
    check(c.expect(200, "GET", "/v1/sandboxes").json == [], "no sandbox after the restart")
    check(records(stack) == {}, f"records left: {records(stack)}")
    c.expect(404, "GET", f"/v1/sandboxes/{p}")
    if stack.cgroot:
        left = [d for d in os.listdir(stack.cgroot) if os.path.isdir(os.path.join(stack.cgroot, d))] \
            if os.path.isdir(stack.cgroot) else []
        for _ in range(50):
            if not left:
                break
            time.sleep(0.1)
            left = [d for d in os.listdir(stack.cgroot) if os.path.isdir(os.path.join(stack.cgroot, d))]
        check(left == [], f"cgroups left: {left}")


def bus_path(sid):
    return "/org/forkd/sandbox/" + "".join(ch if ch.isalnum() else "_%02x" % ord(ch) for ch in sid)


def busctl(stack, *args, check_rc=True):
    r = subprocess.run(["busctl", "--address=" + stack.bus, *args], capture_output=True, text=True, timeout=60)
    if check_rc:
        check(r.returncode == 0, f"busctl {args}: {r.stderr}")
    return r


def t_merge_bus(c, stack):
    """MergeSandbox and DiffSandboxes on D-Bus: the signal, the object paths,
    the properties of the Sandbox object that now drives the winner's VM."""
    if not shutil.which("busctl"):
        raise Skip("busctl is not installed")
    ids, info = fork(c, 2)
    p, w = ids
    mon = subprocess.Popen(["busctl", "--address=" + stack.bus, "--json=short", "monitor"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    seen = []
    reader = threading.Thread(target=lambda: [seen.append(line) for line in mon.stdout], daemon=True)
    reader.start()

    def members():
        for line in list(seen):
            try:
                m = json.loads(line)
            except ValueError:
                continue
            yield m.get("member"), m.get("path")

    def wait_seen(want, what, poke=None):
        # wait for the monitor to print the messages in want, not for a clock; poke() makes
        # one more of them, for a monitor that may not have been attached for the last
        deadline = time.monotonic() + 30
        while not want <= set(members()) and time.monotonic() < deadline:
            if poke:
                poke()
            time.sleep(0.1)
        check(want <= set(members()), f"the monitor did not show {what} ({len(seen)} lines)")
    try:
        # the monitor is attached once it shows one of the Pings made after it started
        wait_seen({("Ping", "/org/forkd/Manager")}, "a Ping made after it started",
                  lambda: busctl(stack, "call", "org.forkd.Manager", "/org/forkd/Manager",
                                 "org.freedesktop.DBus.Peer", "Ping"))
        ok(c, w, "write /tmp/w x")
        r = busctl(stack, "--json=short", "call", "org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager",
                   "DiffSandboxes", "ssas", p, w, "0")
        check(json.loads(r.stdout)["data"] == [["/tmp/w"], [], []], r.stdout)
        r = busctl(stack, "--json=short", "call", "org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager",
                   "MergeSandbox", "ss", p, w)
        d = json.loads(r.stdout)["data"][0]
        check(d["id"]["data"] == p and d["pid"]["data"] == info[w]["pid"], d)
        r = busctl(stack, "--json=short", "get-property", "org.forkd.Manager", bus_path(p), "org.forkd.Sandbox", "Pid")
        check(json.loads(r.stdout)["data"] == info[w]["pid"], r.stdout)
        r = busctl(stack, "--json=short", "get-property", "org.forkd.Manager", bus_path(p), "org.forkd.Sandbox", "Id")
        check(json.loads(r.stdout)["data"] == p, r.stdout)
        r = busctl(stack, "introspect", "org.forkd.Manager", bus_path(w), "org.forkd.Sandbox", check_rc=False)
        check(r.returncode != 0, f"the winner's object still answers: {r.stdout}")
        r = busctl(stack, "call", "org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager", "MergeSandbox",
                   "ss", p, p, check_rc=False)
        check(r.returncode != 0 and "another sandbox" in r.stderr, r.stderr)
        r = busctl(stack, "call", "org.forkd.Manager", bus_path(p), "org.forkd.Sandbox", "Merge", "s", w,
                   check_rc=False)
        check(r.returncode != 0 and "No sandbox" in r.stderr, r.stderr)
        # the daemon checks what forkd-rest checks, for callers on the bus
        mgr = ("call", "org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager")
        for args, want in ((("DiffSandboxes", "ssas", p, p, "65", *(["/x"] * 65)), "At most 64 paths"),
                           (("DiffSandboxes", "ssas", p, p, "1", "/a/../b"), "normalized"),
                           (("DiffSandboxes", "ssas", p, "bad id", "0"), "Invalid other sandbox id"),
                           (("MergeSandbox", "ss", p, "bad id"), "Invalid winner id"),
                           (("RunCode", "ssu", p, "x = 1", "3601"), "timeout_secs must be at most 3600")):
            r = busctl(stack, *mgr, *args, check_rc=False)
            check(r.returncode != 0 and want in r.stderr, f"{args[:3]}: {r.stderr}")
        r = busctl(stack, "--json=short", *mgr, "RunCode", "ssu", p, "x = 7; print x", "0")
        check(json.loads(json.loads(r.stdout)["data"][0])["stdout"] == "7\n", r.stdout)
        wait_seen({("SandboxRemoved", "/org/forkd/Manager"), ("PropertiesChanged", bus_path(p))},
                  "SandboxRemoved and the surviving object's PropertiesChanged")
    finally:
        mon.terminate()
        mon.wait(timeout=10)
        reader.join(timeout=10)
    removed = changed = False
    for line in seen:
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("member") == "SandboxRemoved":
            args = [x for x in m.get("payload", {}).get("data", [])]
            check(args[0] != p, f"a SandboxRemoved for {p}, whose id lives on: {line}")
            if args[0] == w:
                check(args[2] == "merged" and args[1] == bus_path(w), line)
                removed = True
        if m.get("member") == "PropertiesChanged" and m.get("path") == bus_path(p):
            changed = "Pid" in json.dumps(m.get("payload"))
    check(removed, "no SandboxRemoved(..., merged) for the winner")
    check(changed, "no PropertiesChanged with Pid on the surviving object")
    c.expect(204, "DELETE", f"/v1/sandboxes/{p}")


def t_terminate_after_merge(c, stack):
    """Merge, then delete: every VM and cgroup is gone."""
    limit = {"memory_limit_mib": 64} if stack.cgroot else {}
    ids, info = fork(c, 2, **limit)
    p, w = ids
    c.expect(200, "POST", f"/v1/sandboxes/{p}/merge", {"winner": w})
    c.expect(204, "DELETE", f"/v1/sandboxes/{p}")
    c.expect(404, "GET", f"/v1/sandboxes/{p}")
    check(c.expect(200, "GET", "/v1/sandboxes").json == [], "sandboxes left")
    for sid in ids:
        check(not vmm_alive(info[sid]["pid"]), f"VM of {sid} left")
    check(records(stack) == {}, f"records left: {records(stack)}")
    if stack.cgroot:
        for _ in range(50):
            # (the snapshot's fork template keeps its own, tpl-<pid>, while it runs)
            left = [d for d in os.listdir(stack.cgroot)
                    if os.path.isdir(os.path.join(stack.cgroot, d)) and not d.startswith("tpl-")]
            if not left:
                break
            time.sleep(0.1)
        check(left == [], f"cgroups left: {left}")


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
            ("POST /v1/sandboxes/:id/run_code: REST API v1's answer, globals persist", t_run_code),
            ("run_code: 400 and 404 rows, the guest's refusal", t_run_code_errors),
            ("run_code globals and files persist across /fork and a branch of a running sandbox; "
             "each child's state is its own", t_run_code_fork),
            ("POST /v1/sandboxes/:id/diff: REST API v1's example, modified, paths", t_diff),
            ("diff: 400 and 404 rows, the guest's refusal", t_diff_errors),
            ("POST /v1/sandboxes/:id/merge: :id drives the winner's VM, the winner's id is gone", t_merge),
            ("merge into the same id again", t_merge_again),
            ("merge: 400 and 404 rows", t_merge_errors),
            ("MergeSandbox and DiffSandboxes on D-Bus: SandboxRemoved \"merged\", object paths, properties",
             t_merge_bus),
            ("forkd killed after a merge: records and cgroups cleaned up", t_merge_restart),
            ("merge then DELETE: no VM, record or cgroup left", t_terminate_after_merge),
            ("POST /v1/sandboxes/:id/pause and /resume: state kept, 409 on a paused sandbox, fork from paused, "
             "DELETE", t_pause_resume),
            ("timeout_secs, on_timeout and POST /v1/sandboxes/:id/timeout: expires_at, kill and pause at the "
             "deadline", t_timeouts),
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
