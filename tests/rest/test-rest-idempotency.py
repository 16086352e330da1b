#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
Idempotency-Key end to end: real HTTP against forkd-rest (with a --state-dir of
its own, restarted with SIGTERM and killed with SIGKILL along the way), a
private dbus-daemon and the real forkd with forkd-vmm and the test guest. TAP
output; the machinery (Stack, Client, Tap) is test-rest.py's.

forkd is stopped (SIGSTOP) where a request must stay in flight: its D-Bus call
waits in the socket until SIGCONT, so "the first request is still running" is
a state the test holds, not a race it hopes to win.

Environment: as test-rest.py (tests/rest/meson.build).
"""

import hashlib
import importlib.util
import os
import re
import signal
import struct
import sys
import threading
import time

_spec = importlib.util.spec_from_file_location("test_rest", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                         "test-rest.py"))
tr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tr)
check, Skip = tr.check, tr.Skip

TAG = "idem"
TOKEN2 = "second-" + os.urandom(12).hex()
INTERRUPTED = ("a request with this Idempotency-Key was interrupted by a restart of forkd-rest; "
               "its outcome is unknown")


class T:
    """The current forkd-rest, which the tests restart."""
    stack = None
    rest = None
    port = None
    c = None
    state = None
    token_file = None
    token = tr.TOKEN
    first = {}  # key -> the first answer


# ---------------------------------------------------------------- helpers


def field(b):
    return struct.pack("<Q", len(b)) + b


def record_name(key, token):
    """The record's file name, as docs/rest-api.md says: SHA-256 of the scope
    (SHA-256 of the scope magic and the token) and the key, each field
    length-prefixed."""
    scope = hashlib.sha256(field(b"forkd-rest-idempotency-scope") + (field(token.encode()) if token else b"")).digest()
    return hashlib.sha256(scope + field(key.encode())).hexdigest()


def record_path(key, token=None):
    return os.path.join(T.state, record_name(key, token or T.token))


def records():
    return sorted(n for n in os.listdir(T.state) if not n.startswith("."))


def post(path, body, key, token=None, raw=None, headers=None):
    h = dict(headers or {})
    if key is not None:
        h["Idempotency-Key"] = key
    return T.c.req("POST", path, body, token=token or T.token, headers=h, raw=raw, timeout=180)


def sandboxes():
    r = T.c.expect(200, "GET", "/v1/sandboxes", token=T.token)
    return sorted(sb["id"] for sb in r.json)


def fork_body(n=1):
    return {"snapshot_tag": TAG, "n": n}


def replayed(r):
    return r.headers.get("Idempotent-Replayed") == "true"


def same_answer(a, b):
    check(a.status == b.status and a.data == b.data and a.headers.get("Content-Type") == b.headers.get("Content-Type"),
          f"not the same answer: {a} / {b}")


def start_rest(token_file=None, token=None):
    T.token_file = token_file or T.stack.token_file()
    T.token = token or tr.TOKEN
    T.rest, T.port = T.stack.start_rest("--timeout", "60", "--state-dir", T.state, "--token-file", T.token_file,
                                        port=T.port, token=False)
    T.c = tr.Client(T.port)
    # The port takes connections from listen() on; an answer means forkd-rest
    # is past its start (and the sweep of its records).
    T.c.expect(200, "GET", "/healthz", token=None)


def stop_rest(sig):
    """Stop forkd-rest; a SIGTERM must end it cleanly (and, in an ASan build,
    without a sanitizer's report)."""
    T.stack.stop(T.rest, sig)
    if sig == signal.SIGTERM:
        log = T.stack.log_tail(T.rest, 100000)
        check(T.rest.returncode == 0 and "Sanitizer" not in log and "runtime error" not in log,
              f"forkd-rest exited with {T.rest.returncode}: {log[-3000:]}")


def restart_rest(sig=signal.SIGTERM, **kw):
    stop_rest(sig)
    start_rest(**kw)


def wait_for(cond, what, timeout=30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def pending(key):
    try:
        with open(record_path(key), "rb") as f:
            return b"\nstate pending\n" in f.read()
    except FileNotFoundError:
        return False


class Frozen:
    """forkd stopped: calls to it wait until the block ends."""

    def __enter__(self):
        os.kill(T.stack.daemon.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        os.kill(T.stack.daemon.pid, signal.SIGCONT)


def in_thread(fn, *args):
    out = {}

    def run():
        try:
            out["r"] = fn(*args)
        except Exception as e:  # noqa: BLE001 - the caller looks at it
            out["e"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def metric(name):
    r = T.c.expect(200, "GET", "/metrics", token=T.token)
    m = re.search(rf"^{name} (\d+)$", r.data.decode(), re.M)
    check(m, f"no {name} in /metrics")
    return int(m.group(1))


# ---------------------------------------------------------------- tests


def t_setup():
    rootfs = os.path.join(T.stack.tmp, "rootfs.img")
    with open(rootfs, "wb") as f:
        f.truncate(8 << 20)
    T.c.expect(201, "POST", "/v1/snapshots", {"tag": TAG, "kernel": tr.GUEST, "rootfs": rootfs, "boot_wait_secs": 10})
    check(records() == [], f"records without any key: {records()}")


def t_same_key_same_body():
    before = sandboxes()
    r1 = post("/v1/sandboxes", fork_body(), "fork-1")
    check(r1.status == 201 and len(r1.json) == 1 and not replayed(r1), r1)
    r2 = post("/v1/sandboxes", fork_body(), "fork-1")
    same_answer(r1, r2)
    check(replayed(r2), f"no Idempotent-Replayed: true on the replay: {dict(r2.headers)}")
    after = sandboxes()
    check(len(after) == len(before) + 1 and r1.json[0]["id"] in after, f"forks: {before} -> {after}")
    with open(record_path("fork-1"), "rb") as f:
        rec = f.read()
    check(rec.startswith(b"forkd-rest-idempotency 1\n") and b"\nstate answered\nstatus 201\n" in rec and
          rec.endswith(r1.data), rec[:300])
    T.first["fork-1"] = r1


def t_other_body():
    before = sandboxes()
    for path, body, raw in (("/v1/sandboxes", fork_body(2), None),
                            ("/v1/sandboxes", None, b'{"n": 1, "snapshot_tag": "idem"}'),  # same meaning, other bytes
                            (f"/v1/sandboxes/{T.first['fork-1'].json[0]['id']}/fork", {"n": 1}, None),
                            ("/v1/snapshots", {"tag": "idem-other", "kernel": tr.GUEST, "rootfs": "/nonexistent"}, None)):
        r = post(path, body, "fork-1", raw=raw, headers={"Content-Type": "application/json"})
        check(r.status == 422 and "another request" in r.json["error"], f"{path} {body or raw}: {r}")
    check(sandboxes() == before, "a 422 forked")
    # the record is untouched: the first answer still comes back
    same_answer(T.first["fork-1"], post("/v1/sandboxes", fork_body(), "fork-1"))


def t_bad_keys():
    before, recs = sandboxes(), records()
    for key in ("k" * 256, "a\tb", "a\x7fb", "a\x01b", b"caf\xc3\xa9", b"\xff", ""):
        r = post("/v1/sandboxes", fork_body(), key)
        check(r.status == 400 and "Idempotency-Key" in r.json["error"], f"key {key!r}: {r}")
    # two keys in one request
    c = T.c.conn()
    try:
        c.putrequest("POST", "/v1/sandboxes")
        for k, v in (("Authorization", f"Bearer {T.token}"), ("Content-Type", "application/json"),
                     ("Idempotency-Key", "two-a"), ("Idempotency-Key", "two-b")):
            c.putheader(k, v)
        data = b'{"snapshot_tag": "idem"}'
        c.putheader("Content-Length", str(len(data)))
        c.endheaders(data)
        r = c.getresponse()
        body = r.read()
        check(r.status == 400 and b"more than one Idempotency-Key" in body, f"two keys: {r.status} {body!r}")
    finally:
        c.close()
    check(sandboxes() == before and records() == recs, "a refused key forked or left a record")
    # 255 printable characters, space included, are a key
    key = ("k y" * 100)[:255]
    r1 = post("/v1/sandboxes", fork_body(), key)
    check(r1.status == 201, r1)
    same_answer(r1, post("/v1/sandboxes", fork_body(), key))
    check(len(sandboxes()) == len(before) + 1, "the 255-character key forked twice")


def t_ignored_elsewhere():
    """Where nothing is created the header is ignored, even an invalid one."""
    recs = records()
    r1 = T.c.expect(200, "GET", "/v1/sandboxes", token=T.token, headers={"Idempotency-Key": "list"})
    r = post("/v1/sandboxes", fork_body(), None)
    check(r.status == 201, r)
    sid = r.json[0]["id"]
    r2 = T.c.expect(200, "GET", "/v1/sandboxes", token=T.token, headers={"Idempotency-Key": "list"})
    check(r1.data != r2.data and not replayed(r2), "a GET with a key was replayed")
    T.c.expect(200, "GET", "/v1/sandboxes", token=T.token, headers={"Idempotency-Key": "x" * 300})
    for _ in range(2):
        r = post(f"/v1/sandboxes/{sid}/ping", None, "ping")
        check(r.status == 200 and not replayed(r), r)
        r = post(f"/v1/sandboxes/{sid}/run_code", {"code": "print 1"}, "\x01" * 300)
        check(r.status == 200 and not replayed(r), r)
    T.c.expect(204, "DELETE", f"/v1/sandboxes/{sid}", token=T.token, headers={"Idempotency-Key": "del"})
    T.c.expect(404, "DELETE", f"/v1/sandboxes/{sid}", token=T.token, headers={"Idempotency-Key": "del"})
    check(records() == recs, f"records for requests that create nothing: {set(records()) - set(recs)}")


def t_refusals():
    """A request refused before forkd was asked keeps nothing: the key is free.
    forkd's own answer, an error too, is kept."""
    before = sandboxes()
    r = post("/v1/sandboxes", {"snapshot_tag": "bad tag!", "n": 1}, "refused")
    check(r.status == 400, r)
    check(not os.path.exists(record_path("refused")), "a 400 of forkd-rest's own was kept")
    r = post("/v1/sandboxes", fork_body(), "refused")
    check(r.status == 201 and not replayed(r), f"the key of a refused request is not free again: {r}")
    r1 = post("/v1/sandboxes", {"snapshot_tag": "nosuch", "n": 1}, "forkd-404")
    check(r1.status == 404, r1)
    r2 = post("/v1/sandboxes", {"snapshot_tag": "nosuch", "n": 1}, "forkd-404")
    same_answer(r1, r2)
    check(replayed(r2), "forkd's 404 was not kept")
    check(len(sandboxes()) == len(before) + 1, "forks")


def t_concurrent():
    before = sandboxes()
    waits, replays = metric("forkd_rest_idempotency_waits_total"), metric("forkd_rest_idempotency_replays_total")
    with Frozen():
        ta, a = in_thread(post, "/v1/sandboxes", fork_body(2), "together")
        wait_for(lambda: pending("together"), "the first request's pending record")
        tb, b = in_thread(post, "/v1/sandboxes", fork_body(2), "together")
        # B must reach forkd-rest while forkd is stopped; the waits metric below
        # proves it did (a B that came late would be a replay, not a wait).
        time.sleep(0.5)
        check(ta.is_alive() and tb.is_alive(), f"answered while forkd was stopped: {a} {b}")
    ta.join(180)
    tb.join(180)
    check("r" in a and "r" in b, f"{a} {b}")
    check(a["r"].status == 201 and len(a["r"].json) == 2, a["r"])
    same_answer(a["r"], b["r"])
    check(not replayed(a["r"]) and replayed(b["r"]), "which one was the replay")
    check(len(sandboxes()) == len(before) + 2, f"forks: {len(before)} -> {len(sandboxes())}")
    check(metric("forkd_rest_idempotency_waits_total") == waits + 1, "the second request did not wait")
    check(metric("forkd_rest_idempotency_replays_total") == replays + 1, "replays")
    T.first["together"] = a["r"]


def t_restart():
    before = sandboxes()
    r1 = post("/v1/sandboxes", fork_body(), "restart")
    check(r1.status == 201, r1)
    T.first["restart"] = r1
    for sig in (signal.SIGTERM, signal.SIGKILL):
        restart_rest(sig)
        for key in ("restart", "fork-1", "together"):
            body = fork_body(2) if key == "together" else fork_body()
            r = post("/v1/sandboxes", body, key)
            same_answer(T.first[key], r)
            check(replayed(r), r)
    check(len(sandboxes()) == len(before) + 1, "a replay after a restart forked")


def interrupted(sig):
    key = f"interrupted-{sig}"
    before = sandboxes()
    with Frozen():
        t, a = in_thread(post, "/v1/sandboxes", fork_body(), key)
        wait_for(lambda: pending(key), "the pending record")
        # and the call on its way to forkd (which is stopped): a kill between the record
        # and the call would leave forkd nothing to do
        wait_for(lambda: metric("forkd_rest_dbus_calls_in_flight") >= 1, "the call to forkd")
        stop_rest(sig)
        t.join(30)
        if sig == signal.SIGTERM:
            # the client got the shutdown's 503, which is no outcome
            check("r" in a and a["r"].status == 503 and "shutting down" in a["r"].json["error"], a)
        else:
            check("e" in a, f"the request outlived forkd-rest: {a}")
    start_rest()
    check(pending(key), "the record of the interrupted request is gone")
    # forkd did the work that nobody heard about, once the call reached it. One that
    # did not reach forkd before SIGKILL ended forkd-rest (seen in the QEMU test host)
    # is never done: then nothing is forked, now or by the retries below.
    try:
        wait_for(lambda: len(sandboxes()) == len(before) + 1, "forkd's fork of the interrupted request")
        forked = 1
    except AssertionError:
        if sig == signal.SIGTERM:
            raise
        check(len(sandboxes()) == len(before), f"forkd forked {len(sandboxes()) - len(before)} times")
        print("# forkd never got the call: it was lost with forkd-rest's socket", flush=True)
        forked = 0
    for _ in range(2):
        r = post("/v1/sandboxes", fork_body(), key)
        check(r.status == 409 and r.json["error"] == INTERRUPTED, r)
    r = post("/v1/sandboxes", fork_body(3), key)
    check(r.status == 422, r)
    check(len(sandboxes()) == len(before) + forked, "the retry forked again")


def t_interrupted_kill():
    interrupted(signal.SIGKILL)


def t_interrupted_term():
    interrupted(signal.SIGTERM)


def t_scope():
    """Records belong to the token: another token's same key is another
    record, and each survives the other's time."""
    tf2 = os.path.join(T.stack.tmp, "token2")
    fd = os.open(tf2, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, (TOKEN2 + "\n").encode())
    os.close(fd)
    before = sandboxes()
    restart_rest(token_file=tf2, token=TOKEN2)
    r1 = post("/v1/sandboxes", fork_body(), "fork-1")
    check(r1.status == 201 and not replayed(r1), f"another token's record was replayed: {r1}")
    check(r1.data != T.first["fork-1"].data, "the same sandbox")
    r2 = post("/v1/sandboxes", fork_body(), "fork-1")
    same_answer(r1, r2)
    check(os.path.exists(record_path("fork-1", TOKEN2)) and os.path.exists(record_path("fork-1", tr.TOKEN)),
          "one record per token")
    restart_rest(sig=signal.SIGKILL)
    same_answer(T.first["fork-1"], post("/v1/sandboxes", fork_body(), "fork-1"))
    check(len(sandboxes()) == len(before) + 1, "forks")


def age_record(key, secs):
    path = record_path(key)
    with open(path, "rb") as f:
        data = f.read()
    m = re.search(rb"\ncreated (\d+)\n", data)
    check(m, data[:200])
    old = int(m.group(1)) - secs
    with open(path, "wb") as f:
        f.write(data[:m.start(1)] + str(old).encode() + data[m.end(1):])


def t_expiry():
    """24 hours after its first request a key is new again: expired records go
    at start, and one met on the way is treated as absent."""
    before = sandboxes()
    age_record("restart", 24 * 3600 + 60)
    age_record("fork-1", 23 * 3600)  # not yet
    restart_rest()
    check(not os.path.exists(record_path("restart")), "an expired record survived the start")
    r = post("/v1/sandboxes", fork_body(), "restart")
    check(r.status == 201 and not replayed(r) and r.data != T.first["restart"].data, r)
    same_answer(T.first["fork-1"], post("/v1/sandboxes", fork_body(), "fork-1"))
    # while running
    age_record("restart", 24 * 3600)
    r2 = post("/v1/sandboxes", fork_body(2), "restart")  # another body: no 422 for an expired record
    check(r2.status == 201 and len(r2.json) == 2 and not replayed(r2), r2)
    check(len(sandboxes()) == len(before) + 3, "forks")


def t_damaged():
    """A truncated or garbled record is an error the client sees; forkd-rest
    keeps serving."""
    before = sandboxes()
    path = record_path("fork-1")
    with open(path, "rb") as f:
        data = f.read()
    for bad in (data[:len(data) // 2], data[:-1], data + b"x", b"\x00" * 100, b"", data.replace(b"answered", b"answerex")):
        with open(path, "wb") as f:
            f.write(bad)
        r = post("/v1/sandboxes", fork_body(), "fork-1")
        check(r.status == 409 and "cannot be read" in r.json["error"], f"{bad[:60]!r}: {r}")
    with open(path, "wb") as f:
        f.write(data)
    same_answer(T.first["fork-1"], post("/v1/sandboxes", fork_body(), "fork-1"))
    check(sandboxes() == before and T.rest.poll() is None, "forked, or forkd-rest died")


def t_unpack():
    """A bundle upload's body is hashed as it streams to its file."""
    r = T.c.req("GET", f"/v1/snapshots/{TAG}/pack", token=T.token, timeout=300)
    check(r.status == 200 and len(r.data) > 0, r)
    bundle = r.data
    h = {"Content-Type": "application/zstd"}
    r1 = post("/v1/snapshots/unpack?tag=idem-u1", None, "unpack", raw=bundle, headers=h)
    check(r1.status == 201 and r1.json[0]["tag"] == "idem-u1", r1)
    r2 = post("/v1/snapshots/unpack?tag=idem-u1", None, "unpack", raw=bundle, headers=h)
    same_answer(r1, r2)
    check(replayed(r2), r2)
    r = post("/v1/snapshots/unpack?tag=idem-u2", None, "unpack", raw=bundle, headers=h)
    check(r.status == 422, f"another query: {r}")
    r = post("/v1/snapshots/unpack?tag=idem-u1", None, "unpack", raw=bundle[:-1] + bytes([bundle[-1] ^ 1]), headers=h)
    check(r.status == 422, f"another last byte: {r}")
    tags = [s["tag"] for s in T.c.expect(200, "GET", "/v1/snapshots", token=T.token).json]
    check("idem-u1" in tags and "idem-u2" not in tags, tags)


def t_other_routes():
    """branch and the fork of a running sandbox; pause and resume once forkd-rest serves them."""
    sid = T.first["fork-1"].json[0]["id"]
    for path, body, status in ((f"/v1/sandboxes/{sid}/branch", {"tag": "idem-b1", "mode": "full"}, 201),
                               (f"/v1/sandboxes/{sid}/fork", {"n": 1}, 200)):
        before = sandboxes()
        r1 = post(path, body, "other-" + path)
        check(r1.status == status, r1)
        r2 = post(path, body, "other-" + path)
        same_answer(r1, r2)
        check(replayed(r2), r2)
        check(len(sandboxes()) == len(before) + (1 if path.endswith("/fork") else 0), "forks")
    tags = [s["tag"] for s in T.c.expect(200, "GET", "/v1/snapshots", token=T.token).json]
    check(tags.count("idem-b1") == 1, tags)
    r = post(f"/v1/sandboxes/{sid}/pause", None, None)
    if r.status == 404 and "no route" in r.json["error"]:
        raise Skip("forkd-rest has no pause route yet")
    check(r.status < 300, f"pause: {r}")
    T.c.req("POST", f"/v1/sandboxes/{sid}/resume", token=T.token)
    for verb in ("pause", "resume"):
        r1 = post(f"/v1/sandboxes/{sid}/{verb}", None, "verb-" + verb)
        r2 = post(f"/v1/sandboxes/{sid}/{verb}", None, "verb-" + verb)
        check(r1.status < 300, r1)
        same_answer(r1, r2)
        check(replayed(r2), f"{verb} was done twice: {r2}")


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
    T.stack = stack
    T.state = os.path.join(stack.tmp, "rest-state")
    signal.signal(signal.SIGTERM, lambda *a: (stack.cleanup(), sys.exit(1)))
    try:
        stack.start_bus()
        start_rest()
        stack.start_daemon()
        tr.wait_daemon(T.c, stack)
        tests = [
            ("a snapshot of the test guest", t_setup),
            ("same key, same body: one fork, the same status and body", t_same_key_same_body),
            ("same key, another body, path or bytes: 422, nothing done", t_other_body),
            ("keys of 256 characters, with control or non-ASCII bytes, empty or twice: 400; 255: a key",
             t_bad_keys),
            ("a key where nothing is created (GET, DELETE, ping, run_code) is ignored", t_ignored_elsewhere),
            ("forkd-rest's own 400 frees the key; forkd's 404 is kept", t_refusals),
            ("two requests with one key at once: one fork, both get its answer", t_concurrent),
            ("records survive SIGTERM and SIGKILL of forkd-rest: replays after the restart", t_restart),
            ("killed (SIGKILL) with a request in flight: the retry gets 409, forkd forked once", t_interrupted_kill),
            ("stopped (SIGTERM) with a request in flight: the retry gets 409, forkd forked once", t_interrupted_term),
            ("records are per token", t_scope),
            ("records expire after 24 hours: at start and when met", t_expiry),
            ("a damaged record: 409, forkd-rest keeps serving", t_damaged),
            ("POST /v1/snapshots/unpack: the streamed body and the query are hashed", t_unpack),
            ("branch, fork of a running sandbox, pause and resume", t_other_routes),
        ]
        for name, fn in tests:
            tap.run(name, fn)
            if fn is t_setup and tap.failed:
                break
        stack.finish(tap, T.c, T.rest)
    finally:
        stack.cleanup()
    return tap.done()


if __name__ == "__main__":
    sys.exit(main())
