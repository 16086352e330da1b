# SPDX-License-Identifier: LGPL-2.1-or-later
"""Fork and branch of a running Linux sandbox (part of test-linux-guest.py): a
sandbox with REPL state and a file forked into 3 and branched full, diff, live and
live without waiting, its state inherited by every child, also once the source is
deleted; and the errors of branch and fork that need something in flight or broken."""
import json
import os
import signal
import threading
import time

from linuxguest import N_CHILDREN, TAG, URANDOM, rest, urandom_differs


# What a sandbox of fork_and_branch_running shows of its state: x, /root/p.txt
# (written before the fork), a child's /root/k.txt and the parent's /root/late.txt.
SHOW_STATE = ("import os\n"
              "print(x, open('/root/p.txt').read(), os.path.exists('/root/k.txt'), os.path.exists('/root/late.txt'))")


def fork_and_branch_running(t, stack):
    """A running sandbox of the Linux guest with REPL state and a file: forked into
    3, branched full, diff, live and live without waiting (forkd's REST API v1 routes);
    the branches' children inherit both, and still do once the source is
    deleted. REST API v1's error rows for these routes, a few of them (the native
    tests have them all)."""
    def state(sid):
        status, r = rest(stack, "POST", f"/v1/sandboxes/{sid}/run_code", {"code": SHOW_STATE})
        return r.get("stdout") if status == 200 and isinstance(r, dict) and r.get("exit_code") == 0 else (status, r)

    def fork_tag(tag):
        status, sbs = rest(stack, "POST", "/v1/sandboxes", {"snapshot_tag": tag, "n": 1})
        return sbs[0]["id"] if status == 201 and isinstance(sbs, list) and len(sbs) == 1 else None

    def delete(*sids):
        return all(rest(stack, "DELETE", f"/v1/sandboxes/{sid}")[0] == 204 for sid in sids)

    parent = fork_tag(TAG)
    status, r = rest(stack, "POST", f"/v1/sandboxes/{parent}/run_code",
                     {"code": "x = 41\nwith open('/root/p.txt', 'w') as f: f.write('parent')\n"
                              "import os\nos.urandom(16)"})
    if not t.ok(parent and status == 200 and isinstance(r, dict) and r.get("exit_code") == 0,
                "a running sandbox: run_code 'x = 41' and a write to /root/p.txt", f"{parent} {status} {r}"):
        return

    # POST /v1/sandboxes/:id/fork, n = 3: the children inherit x and the file;
    # what one of them does is its own, and so is what the parent does afterwards
    t0 = time.monotonic()
    status, r = rest(stack, "POST", f"/v1/sandboxes/{parent}/fork", {"n": N_CHILDREN})
    fork_s = time.monotonic() - t0
    kids = r.get("children", []) if isinstance(r, dict) else []
    if not t.ok(status == 200 and isinstance(r, dict) and list(r) == ["children"] and len(set(kids)) == N_CHILDREN,
                f"POST /v1/sandboxes/:id/fork {{\"n\": {N_CHILDREN}}}: 200 {{\"children\": [ids]}}", f"{status} {r}"):
        return
    t.note(f"fork of the running sandbox into {N_CHILDREN}: {fork_s * 1000:.0f} ms under TCG")
    urandom_differs(t, lambda sid: (rest(stack, "POST", f"/v1/sandboxes/{sid}/run_code",
                                         {"code": f"print({URANDOM})"})[1] or {}).get("stdout"),
                    kids + [parent], "a running sandbox's")
    seen = {k: state(k) for k in kids}
    t.ok(all(v == "41 parent False False\n" for v in seen.values()),
         "each child of the fork evaluates x to 41 and reads /root/p.txt", seen)
    status, r = rest(stack, "POST", f"/v1/sandboxes/{kids[0]}/run_code",
                     {"code": "x = 99\nwith open('/root/k.txt', 'w') as f: f.write('kid')"})
    status2, r2 = rest(stack, "POST", f"/v1/sandboxes/{parent}/run_code",
                       {"code": "with open('/root/late.txt', 'w') as f: f.write('later')"})
    t.ok(status == 200 and r.get("exit_code") == 0 and status2 == 200 and r2.get("exit_code") == 0,
         "a child sets x = 99 and writes /root/k.txt; the parent then writes /root/late.txt", f"{r} {r2}")
    seen = {k: state(k) for k in [parent] + kids}
    want = {parent: "41 parent False True\n", kids[0]: "99 parent True False\n"}
    t.ok(all(v == want.get(k, "41 parent False False\n") for k, v in seen.items()),
         "the child's x = 99 and file are seen neither by its siblings nor by the parent; "
         "the parent's file written after the fork is not seen by the children", seen)
    for body in ({"n": 0}, {"n": 33}):
        status, r = rest(stack, "POST", f"/v1/sandboxes/{parent}/fork", body)
        t.ok(status == 400 and r == {"error": "n must be between 1 and 32"}, f"fork {body}: 400", f"{status} {r}")
    status, r = rest(stack, "POST", "/v1/sandboxes/sb-nosuch/fork", {"n": 1})
    t.ok(status == 404 and r == {"error": "sandbox not found"}, "fork of an unknown sandbox: 404", f"{status} {r}")
    t.ok(delete(*kids), "DELETE the fork's children")

    # POST /v1/sandboxes/:id/branch in every mode; each branch's children inherit
    branches = {"lx-full": {"mode": "full"}, "lx-diff": {"mode": "diff"}, "lx-live": {"mode": "live"},
                "lx-live-nowait": {"mode": "live", "wait": False}}
    made = []
    for tag, body in branches.items():
        t0 = time.monotonic()
        status, info = rest(stack, "POST", f"/v1/sandboxes/{parent}/branch", dict(body, tag=tag))
        took = time.monotonic() - t0
        info = info if isinstance(info, dict) else {}
        good = (status == 201 and info.get("tag") == tag and info.get("branched_from") == parent and
                isinstance(info.get("pause_ms"), int) and
                info.get("status") in (("writing", "ready") if body.get("wait") is False else ("ready",)))
        if body["mode"] == "diff":
            good &= info.get("parent_tag") == TAG and len(info.get("parent_content_hash") or "") == 64
        t.ok(good, f"branch {json.dumps(body)}: 201, branched_from, pause_ms, status {info.get('status')}",
             f"{status} {info}")
        if status == 201:
            made.append(tag)
        t.note(f"branch {tag}: {took:.1f} s, pause_ms {info.get('pause_ms')} under TCG")
    deadline = time.monotonic() + 180
    listed = {}
    while time.monotonic() < deadline:
        status, snaps = rest(stack, "GET", "/v1/snapshots")
        listed = {s.get("tag"): s for s in snaps} if status == 200 and isinstance(snaps, list) else {}
        if listed.get("lx-live-nowait", {}).get("status") in ("ready", "failed"):
            break
        time.sleep(0.5)
    t.ok(listed.get("lx-live-nowait", {}).get("status") == "ready",
         "the live branch without wait becomes \"ready\" in GET /v1/snapshots", listed.get("lx-live-nowait"))
    t.ok(all(listed.get(tag, {}).get("branched_from") == parent and isinstance(listed[tag].get("pause_ms"), int)
             for tag in made) and "branched_from" not in listed.get(TAG, {}),
         "GET /v1/snapshots: branched_from and pause_ms on each branch, not on the boot snapshot",
         {tag: listed.get(tag) for tag in made})

    for tag, body in (("lx-full", {"tag": "lx-full"}), (None, {"mode": "full", "diff": True}),
                      (None, {"mode": "full", "wait": False})):
        status, r = rest(stack, "POST", f"/v1/sandboxes/{parent}/branch", body)
        want = 409 if tag else 400
        t.ok(status == want and isinstance(r, dict) and r.get("error"), f"branch {json.dumps(body)}: {want}",
             f"{status} {r}")
    status, r = rest(stack, "POST", "/v1/sandboxes/sb-nosuch/branch", {"mode": "full"})
    t.ok(status == 404, "branch of an unknown sandbox: 404", f"{status} {r}")

    def fork_branches(when):
        seen = {}
        for tag in made:
            child = fork_tag(tag)
            seen[tag] = state(child) if child else "no child"
            if child:
                delete(child)
        t.ok(len(made) == len(branches) and all(v == "41 parent False True\n" for v in seen.values()),
             f"{when}: a child of each branch (full, diff, live, live without wait) evaluates x to 41 "
             "and reads /root/p.txt", seen)
    fork_branches("while the source runs")

    status, r = rest(stack, "DELETE", f"/v1/sandboxes/{parent}")
    status2, r2 = rest(stack, "GET", f"/v1/sandboxes/{parent}")
    t.ok(status == 204 and status2 == 404, "DELETE the source sandbox: 204, then 404", f"{status} {r}; {status2} {r2}")
    fork_branches("with the source deleted")
    t.ok(all(rest(stack, "DELETE", f"/v1/snapshots/{tag}")[0] == 204 for tag in made), "DELETE the branches")


def branch_and_fork_errors(t, fc, stack, restart):
    """REST API v1's error rows of branch and fork that need something in flight or
    something broken: 401 without the token; with forkd at
    --max-branches 2 and its branch writers held 8 s (FORKD_TEST_BRANCH_STALL_MS),
    409 for a fork of a live branch still being written and for its tag, 503 at the
    cap; 500 for a full branch whose writer is killed, and for a fork and a branch
    of a sandbox whose VMM is stopped (--control-timeout-sec 10)."""
    for route, body in (("fork", {"n": 1}), ("branch", {"mode": "full"})):
        status, r = rest(stack, "POST", f"/v1/sandboxes/sb-x/{route}", body, token=False)
        t.ok(status == 401 and r == {"error": "invalid api key"}, f"{route} without the bearer token: 401",
             f"{status} {r}")
    try:
        stack.update(restart({"FORKD_TEST_BRANCH_STALL_MS": "8000",
                              "FORKD_STACK_FORKD_ARGS": "--max-branches 2 --control-timeout-sec 10"}))
    except RuntimeError as e:
        t.ok(False, "forkd-stack again with --max-branches 2 and branch writers held 8 s", str(e))
        return
    snaps = os.path.join(os.path.dirname(stack["FORKD_TOKEN_FILE"]), "forkd", "snapshots")

    def in_thread(method, path, body):
        out = {}
        th = threading.Thread(target=lambda: out.update(r=rest(stack, method, path, body)))
        th.start()
        return th, out

    def vmm_pid(sid):
        rc, doc, err = fc("ls")
        return next((int(s["pid"]) for s in (doc or {}).get("sandboxes", []) if s.get("id") == sid), None)

    status, sbs = rest(stack, "POST", "/v1/sandboxes", {"snapshot_tag": TAG, "n": 2})
    if not t.ok(status == 201 and isinstance(sbs, list) and len(sbs) == 2, "fork 2 of the boot snapshot", sbs):
        return
    p, q = (s["id"] for s in sbs)
    status, info = rest(stack, "POST", f"/v1/sandboxes/{p}/branch", {"tag": "lx-w", "mode": "live", "wait": False})
    t.ok(status == 201 and isinstance(info, dict) and info.get("status") == "writing",
         "a live branch without wait, its writer held: 201, status \"writing\"", f"{status} {info}")
    status, r = rest(stack, "POST", "/v1/sandboxes", {"snapshot_tag": "lx-w", "n": 1})
    t.ok(status == 409 and isinstance(r, dict) and r.get("error"), "fork of the branch being written: 409",
         f"{status} {r}")
    status, r = rest(stack, "POST", f"/v1/sandboxes/{q}/branch", {"tag": "lx-w", "mode": "full"})
    t.ok(status == 409 and isinstance(r, dict) and r.get("error"), "a branch to the tag in flight: 409",
         f"{status} {r}")
    th, out = in_thread("POST", f"/v1/sandboxes/{q}/branch", {"tag": "lx-w2", "mode": "full"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not [n for n in os.listdir(snaps) if n.startswith("lx-w2.tmp.")]:
        time.sleep(0.1)
    status, r = rest(stack, "POST", f"/v1/sandboxes/{p}/branch", {"tag": "lx-w3", "mode": "full"})
    t.ok(status == 503 and isinstance(r, dict) and r.get("error"), "a third branch at --max-branches 2: 503",
         f"{status} {r}")
    th.join(300)
    t.ok(out.get("r", (0,))[0] == 201, "the second branch in flight: 201 once written", out.get("r"))

    # a full branch whose writer dies: 500, and no snapshot
    th, out = in_thread("POST", f"/v1/sandboxes/{p}/branch", {"tag": "lx-x", "mode": "full"})
    deadline, staged = time.monotonic() + 60, []
    while time.monotonic() < deadline and not staged:
        staged = [n for n in os.listdir(snaps) if n.startswith("lx-x.tmp.")]
        time.sleep(0.05)
    if staged:
        os.kill(int(staged[0].rsplit(".", 1)[1]), signal.SIGKILL)
    th.join(300)
    status, r = out.get("r", (0, None))
    _, listed = rest(stack, "GET", "/v1/snapshots")
    tags = {x.get("tag") for x in listed} if isinstance(listed, list) else None
    t.ok(staged and status == 500 and isinstance(r, dict) and r.get("error") and tags is not None
         and "lx-x" not in tags and not [n for n in os.listdir(snaps) if n.startswith("lx-x")],
         "a full branch whose writer is killed: 500 with the reason, no snapshot left", f"{status} {r} {tags}")

    # a stopped VMM: fork and branch fail after --control-timeout-sec, the sandbox is killed
    for sid, route, body in ((p, "fork", {"n": 1}), (q, "branch", {"tag": "lx-y", "mode": "full"})):
        pid = vmm_pid(sid)
        if pid:
            os.kill(pid, signal.SIGSTOP)
        status, r = rest(stack, "POST", f"/v1/sandboxes/{sid}/{route}", body)
        deadline = time.monotonic() + 60  # killed: gone once its exit is seen
        while (gone := rest(stack, "GET", f"/v1/sandboxes/{sid}")[0]) != 404 and time.monotonic() < deadline:
            time.sleep(0.2)
        t.ok(pid and status == 500 and isinstance(r, dict) and "did not answer within 10 s" in r.get("error", "")
             and gone == 404, f"{route} of a sandbox whose VMM is stopped: 500, and the sandbox is killed (then 404)",
             f"{pid} {status} {r} {gone}")
    try:
        stack.update(restart({}))
    except RuntimeError as e:
        t.ok(False, "forkd-stack again as it was", str(e))
        return
    t.ok(all(rest(stack, "DELETE", f"/v1/snapshots/{tag}")[0] == 204 for tag in ("lx-w", "lx-w2")),
         "DELETE the branches")
