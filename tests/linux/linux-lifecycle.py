# SPDX-License-Identifier: LGPL-2.1-or-later
"""Pause, resume, deadlines and idempotency of a Linux sandbox (part of
test-linux-guest.py), with forkd killed with -9 in the middle of a pause and of a resume."""
import os
import time

from linuxguest import TAG, branch_writers, kill9_during, rest


def pause_resume_linux(t, stack, restart, state):
    """Pause and resume with the Linux Python guest over REST: a sandbox with REPL globals, a file and
    a background process is paused (its VMM exits), refuses the verbs with 409, forks twice
    (it stays paused), survives a restart of the stack, and resumes under its id with all of
    it and its wall clock set again; a deadline with on_timeout pause pauses a sandbox; DELETE
    removes a paused one."""
    def run(sid, code):
        status, r = rest(stack, "POST", f"/v1/sandboxes/{sid}/run_code", {"code": code})
        return r.get("stdout") if status == 200 and isinstance(r, dict) and r.get("exit_code") == 0 else (status, r)

    # The image has no pgrep: the background sleep is looked for in /proc.
    show = ("import os, time\n"
            "def alive():\n"
            "    for p in os.listdir('/proc'):\n"
            "        try:\n"
            "            if p.isdigit() and open('/proc/' + p + '/cmdline', 'rb').read().split(b'\\0')[:2] == "
            "[b'sleep', b'4242']:\n"
            "                return True\n"
            "        except OSError:\n"
            "            pass\n"
            "    return False\n"
            "print(x, open('/root/s.txt').read(), alive(), abs(time.time() - {now}) < 30)")
    status, sbs = rest(stack, "POST", "/v1/sandboxes", {"snapshot_tag": TAG, "n": 1})
    sid = sbs[0]["id"] if status == 201 and isinstance(sbs, list) else None
    pid = sbs[0]["pid"] if sid else 0
    out = run(sid, "import subprocess\nx = 17\nopen('/root/s.txt', 'w').write('kept')\n"
                   "subprocess.Popen(['sleep', '4242'], start_new_session=True)") if sid else None
    if not t.ok(sid and out == "", "pause: a sandbox with x = 17, /root/s.txt and a background sleep", f"{sid} {out}"):
        return
    t0 = time.monotonic()
    status, info = rest(stack, "POST", f"/v1/sandboxes/{sid}/pause")
    pause_s = time.monotonic() - t0
    t.ok(status == 200 and isinstance(info, dict) and info.get("status") == "paused" and
         not os.path.exists(f"/proc/{pid}"), "POST /v1/sandboxes/:id/pause: 200 paused, its VMM gone",
         f"{status} {info}")
    t.note(f"pause of the Linux guest: {pause_s * 1000:.0f} ms under TCG")
    status, listed = rest(stack, "GET", "/v1/sandboxes")
    t.ok(status == 200 and any(x.get("id") == sid and x.get("status") == "paused" for x in listed),
         "GET /v1/sandboxes lists it paused", listed)
    refused = {v: rest(stack, "POST", f"/v1/sandboxes/{sid}/{v}", b) for v, b in
               (("exec", {"args": ["true"]}), ("eval", {"code": "1"}), ("run_code", {"code": "1"}),
                ("branch", {"tag": "from-paused"}), ("pause", None))}
    t.ok(all(st == 409 and r == {"error": f"sandbox {sid} is paused"} for st, r in refused.values()),
         "exec, eval, run_code, branch and pause of a paused sandbox: 409 with REST API v1's body", refused)
    for batch in (1, 2):
        status, r = rest(stack, "POST", f"/v1/sandboxes/{sid}/fork", {"n": 2})
        kids = r.get("children", []) if status == 200 and isinstance(r, dict) else []
        seen = {k: run(k, "print(x, open('/root/s.txt').read())") for k in kids}
        t.ok(len(kids) == 2 and all(v == "17 kept\n" for v in seen.values()),
             f"fork of the paused sandbox, batch {batch}: children with its globals and file", f"{status} {seen}")
        for k in kids:
            rest(stack, "DELETE", f"/v1/sandboxes/{k}")
    stack.update(restart({}))
    status, info = rest(stack, "GET", f"/v1/sandboxes/{sid}")
    t.ok(status == 200 and info.get("status") == "paused", "still paused after a restart of the stack",
         f"{status} {info}")
    time.sleep(2)
    t0 = time.monotonic()
    status, info = rest(stack, "POST", f"/v1/sandboxes/{sid}/resume")
    resume_s = time.monotonic() - t0
    t.ok(status == 200 and isinstance(info, dict) and info.get("id") == sid and info.get("status") == "running",
         "POST /v1/sandboxes/:id/resume: 200 running, the same id", f"{status} {info}")
    t.note(f"resume of the Linux guest to a ready agent: {resume_s * 1000:.0f} ms under TCG")
    out = run(sid, show.format(now=time.time()))
    t.ok(out == "17 kept True True\n", "resumed: x, the file and the background process are back, the clock is "
         "set again", out)
    status, r = rest(stack, "POST", f"/v1/sandboxes/{sid}/resume")
    t.ok(status == 409, "resume of a running sandbox: 409", f"{status} {r}")
    status, r = rest(stack, "POST", f"/v1/sandboxes/{sid}/timeout", {"timeout_secs": 600})
    t.ok(status == 200 and r.get("expires_at") and r.get("on_timeout") == "kill",
         "POST /v1/sandboxes/:id/timeout: a deadline from now", f"{status} {r}")

    # Idempotency-Key: a retried pause and a retried resume replay the first answer.
    answers = []
    for key, verb in (("lx-pause-1", "pause"), ("lx-pause-1", "pause"), ("lx-resume-1", "resume"),
                      ("lx-resume-1", "resume")):
        h = {}
        st, body = rest(stack, "POST", f"/v1/sandboxes/{sid}/{verb}", headers={"Idempotency-Key": key},
                        ret_headers=h)
        answers.append((st, body, h.get("Idempotent-Replayed")))
    t.ok([a[0] for a in answers] == [200] * 4 and answers[0][1] == answers[1][1] and
         answers[2][1] == answers[3][1] and answers[1][2] == "true" and answers[3][2] == "true" and
         answers[0][1].get("status") == "paused" and answers[2][1].get("status") == "running",
         "Idempotency-Key: a retried pause and a retried resume replay the first answer (200 both)", answers)

    # kill -9 of forkd in the middle of a pause (about 1.4 s under TCG): paused with its state, or gone.
    st, info, outcome = kill9_during(stack, restart, state, sid, "pause", 0.5)
    # A pause's writer (forkd-branch) may outlive the killed forkd: the new one adopts it as a
    # branch in flight, which counts against --max-branches, until it lands (and, nothing
    # needing it, is removed). The branch checks below count on none being in flight.
    deadline = time.monotonic() + 300
    while branch_writers() and time.monotonic() < deadline:
        time.sleep(0.5)
    t.ok(not branch_writers(), "the killed pause's writer, if any, finished", branch_writers())
    if outcome == "paused":
        st, info = rest(stack, "POST", f"/v1/sandboxes/{sid}/resume")
        out = run(sid, "print(x, open('/root/s.txt').read())") if st == 200 else (st, info)
        t.ok(out == "17 kept\n", "kill -9 during a pause: paused, and it resumes with its state", out)
        rest(stack, "DELETE", f"/v1/sandboxes/{sid}")
    else:
        t.ok(outcome == 404, "kill -9 during a pause: gone with forkd's VMMs (not paused)", f"{st} {info}")
    t.note(f"kill -9 during the Linux guest's pause: {outcome}")
    status, sbs = rest(stack, "POST", "/v1/sandboxes",
                       {"snapshot_tag": TAG, "n": 1, "timeout_secs": 3, "on_timeout": "pause"})
    dl = sbs[0]["id"] if status == 201 and isinstance(sbs, list) else None
    t.ok(dl and sbs[0].get("expires_at") and sbs[0].get("on_timeout") == "pause", "a fork with a 3 s deadline, "
         "on_timeout pause: expires_at set", f"{status} {sbs}")
    deadline, st = time.monotonic() + 60, None
    while dl and time.monotonic() < deadline:
        st = rest(stack, "GET", f"/v1/sandboxes/{dl}")[1].get("status")
        if st == "paused":
            break
        time.sleep(0.5)
    t.ok(st == "paused", "it is paused at its deadline", st)
    gone = [rest(stack, "DELETE", f"/v1/sandboxes/{x}")[0] for x in (dl,) if x]
    t.ok(gone == [204] and rest(stack, "GET", f"/v1/sandboxes/{dl}")[0] == 404, "DELETE of a paused sandbox", gone)

    # kill -9 of forkd in the middle of a resume (about 3.7 s under TCG): afterwards paused with
    # its state and listed once, or gone with forkd's VMMs; never running and paused both.
    status, sbs = rest(stack, "POST", "/v1/sandboxes", {"snapshot_tag": TAG, "n": 1})
    rs = sbs[0]["id"] if status == 201 and isinstance(sbs, list) else None
    out = run(rs, "y = 42") if rs else None
    status, info = rest(stack, "POST", f"/v1/sandboxes/{rs}/pause") if out == "" else (None, out)
    if not t.ok(status == 200 and info.get("status") == "paused", "a sandbox with y = 42, paused", f"{status} {info}"):
        return
    st, info, outcome = kill9_during(stack, restart, state, rs, "resume", 1)
    listed = [x for x in rest(stack, "GET", "/v1/sandboxes")[1] if x.get("id") == rs]
    if outcome == "paused":
        st, info = rest(stack, "POST", f"/v1/sandboxes/{rs}/resume")
        out = run(rs, "print(y)") if st == 200 else (st, info)
        t.ok(len(listed) == 1 and out == "42\n", "kill -9 during a resume: paused, listed once, and it resumes "
             "with its state", f"{listed} {out}")
        rest(stack, "DELETE", f"/v1/sandboxes/{rs}")
    else:
        t.ok(outcome == 404 and not listed, "kill -9 during a resume: gone with forkd's VMMs (not listed)",
             f"{st} {info} {listed}")
    t.note(f"kill -9 during the Linux guest's resume: {outcome}")
