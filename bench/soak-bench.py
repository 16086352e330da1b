#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
bench/soak: load and soak over REST against a running stack (bench/soak starts
one with tools/forkd-stack). Keeps --sandboxes N sandboxes of the test guest
alive for --minutes M while --clients K threads, each with its own keep-alive
HTTP connection and its own share of the sandboxes, send exec, run_code and
ping requests and churn (fork one sandbox, terminate another, so the count
stays at N). Samples forkd's RSS, its open fds and the number of forkd-vmm
processes at the start, every --sample-secs and at the end. Reports p50 and
p99 per request kind, request counts and errors (expected: none).

The test guest has no eval (its agent answers "not supported"): the eval
kind is its run_code op, the closest it has (POST .../run_code).

With --json the last line of stdout is one JSON object.
"""

import argparse
import http.client
import json
import os
import random
import sys
import threading
import time
import urllib.parse

KINDS = ("exec", "run_code", "ping", "fork", "terminate")
# Relative weights of what a client does next; "churn" is one fork and one terminate.
MIX = (("exec", 4), ("run_code", 3), ("ping", 2), ("churn", 1))


def proc_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def proc_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def vmm_processes(vmm_path):
    """Live forkd-vmm processes of this build (the template and its children)."""
    real = os.path.realpath(vmm_path)
    n = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{d}/exe") != real:
                continue
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        if st[st.rindex(")") + 2] not in "ZX":
            n += 1
    return n


def mem_available_kib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def percentile(sorted_values, p):
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, int(round(p / 100.0 * (len(sorted_values) - 1)))))
    return sorted_values[k]


class Api:
    """One keep-alive HTTP/1.1 connection to forkd-rest."""

    def __init__(self, url, token, timeout=120):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port or 80
        self.token = token
        self.timeout = timeout
        self.conn = None

    def request(self, method, path, body=None):
        status, raw = self.request_raw(method, path, body)
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = raw.decode(errors="replace")
        return status, payload

    def request_raw(self, method, path, body=None):
        """The status and the body's bytes, once the last of them arrived (nothing parsed)."""
        headers = {"Authorization": f"Bearer {self.token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                raw = resp.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # the server closed an idle keep-alive connection: one retry on a fresh one
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        if resp.getheader("Connection", "").lower() == "close":
            self.conn.close()
            self.conn = None
        return resp.status, raw

    def close(self):
        if self.conn:
            self.conn.close()


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.lat = {k: [] for k in KINDS}
        self.errors = {k: 0 for k in KINDS}
        self.first_errors = []

    def add(self, kind, seconds, error=None):
        with self.lock:
            if error is None:
                self.lat[kind].append(seconds)
            else:
                self.errors[kind] += 1
                if len(self.first_errors) < 10:
                    self.first_errors.append(f"{kind}: {error}")


def timed(stats, kind, fn, ok_status):
    t0 = time.monotonic()
    try:
        status, payload = fn()
    except Exception as e:  # noqa: BLE001 - counted as an error
        stats.add(kind, 0, repr(e))
        return None
    dt = time.monotonic() - t0
    if status not in ok_status:
        stats.add(kind, dt, f"HTTP {status}: {str(payload)[:200]}")
        return None
    stats.add(kind, dt)
    return payload


class Client(threading.Thread):
    def __init__(self, idx, args, token, tag, owned, stats, stop_at):
        super().__init__(daemon=True)
        self.idx = idx
        self.args = args
        self.api = Api(args.url, token)
        self.tag = tag
        self.owned = owned
        self.stats = stats
        self.stop_at = stop_at
        self.rng = random.Random(idx * 7919 + 1)
        self.kinds = [k for k, w in MIX for _ in range(w)]
        self.exc = None

    def one(self):
        kind = self.rng.choice(self.kinds)
        sid = self.rng.choice(self.owned)
        if kind == "exec":
            out = timed(self.stats, "exec", lambda: self.api.request(
                "POST", f"/v1/sandboxes/{sid}/exec", {"args": ["sh", "-c", "x = 7; print x"], "timeout_secs": 30}),
                (200,))
            if out is not None and (not isinstance(out, dict) or out.get("stdout") != "7\n"):
                self.stats.add("exec", 0, f"unexpected answer {out!r:.200}")
        elif kind == "run_code":
            out = timed(self.stats, "run_code", lambda: self.api.request(
                "POST", f"/v1/sandboxes/{sid}/run_code", {"code": "write /tmp/a hello; cat /tmp/a"}), (200,))
            if out is not None and (not isinstance(out, dict) or "hello" not in json.dumps(out)):
                self.stats.add("run_code", 0, f"unexpected answer {out!r:.200}")
        elif kind == "ping":
            timed(self.stats, "ping", lambda: self.api.request("POST", f"/v1/sandboxes/{sid}/ping"), (200,))
        else:
            out = timed(self.stats, "fork", lambda: self.api.request(
                "POST", "/v1/sandboxes", {"snapshot_tag": self.tag, "n": 1}), (200, 201))
            if out is not None:
                self.owned.append(out[0]["id"])
                victim = self.owned.pop(self.rng.randrange(len(self.owned) - 1))
                timed(self.stats, "terminate", lambda: self.api.request("DELETE", f"/v1/sandboxes/{victim}"),
                      (200, 204))

    def run(self):
        try:
            while time.monotonic() < self.stop_at:
                self.one()
                if self.args.think_ms:
                    time.sleep(self.args.think_ms / 1000.0)
        except Exception as e:  # noqa: BLE001
            self.exc = e
        finally:
            self.api.close()


def sample(args, t0, alive):
    return {
        "t_s": round(time.monotonic() - t0, 1),
        "forkd_rss_kib": proc_rss_kib(args.forkd_pid),
        "forkd_fds": proc_fds(args.forkd_pid),
        "vmm_processes": vmm_processes(args.vmm),
        "sandboxes": alive(),
        "mem_available_kib": mem_available_kib(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, required=True)
    ap.add_argument("--sandboxes", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--think-ms", type=float, default=5.0, help="pause of each client between requests")
    ap.add_argument("--sample-secs", type=float, default=30.0)
    ap.add_argument("--mem-mib", type=int, default=64)
    ap.add_argument("--fill-batch", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--url", required=True)
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--rootfs", required=True)
    ap.add_argument("--forkd-pid", type=int, required=True)
    ap.add_argument("--vmm", required=True)
    args = ap.parse_args()
    if args.minutes <= 0 or args.sandboxes < args.clients or args.clients < 1:
        ap.error("--minutes must be > 0 and --sandboxes at least --clients (>= 1)")

    with open(args.token_file) as f:
        token = f.read().strip()
    api = Api(args.url, token, timeout=900)
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))

    tag = f"soak{os.getpid()}"
    mem0 = mem_available_kib()
    st, out = api.request("POST", "/v1/snapshots", {"tag": tag, "kernel": args.kernel, "rootfs": args.rootfs,
                                                    "mem_mib": args.mem_mib, "boot_wait_secs": 30})
    if st not in (200, 201):
        print(f"bench/soak: snapshot failed: HTTP {st}: {out}", file=sys.stderr)
        return 1

    # Fill: N sandboxes, in batches.
    ids = []
    t_fill = time.monotonic()
    mem_after_snap = mem_available_kib()
    while len(ids) < args.sandboxes:
        n = min(args.fill_batch, args.sandboxes - len(ids))
        st, out = api.request("POST", "/v1/sandboxes", {"snapshot_tag": tag, "n": n})
        if st not in (200, 201):
            print(f"bench/soak: fork of {n} failed with {len(ids)} alive: HTTP {st}: {out}", file=sys.stderr)
            return 1
        ids += [s["id"] for s in out]
    fill_s = time.monotonic() - t_fill
    time.sleep(2)  # let the children settle (first answers, page faults)
    mem_filled = mem_available_kib()
    per_sandbox_kib = (mem_after_snap - mem_filled) / max(1, len(ids))
    say(f"filled {len(ids)} sandboxes in {fill_s:.1f} s; host memory per sandbox {per_sandbox_kib:.0f} KiB "
        f"(MemAvailable {mem0 // 1024} -> {mem_filled // 1024} MiB)")

    # Clients, each owning a share of the sandboxes.
    stats = Stats()
    shares = [ids[k::args.clients] for k in range(args.clients)]
    t0 = time.monotonic()
    stop_at = t0 + args.minutes * 60
    clients = [Client(k, args, token, tag, shares[k], stats, stop_at) for k in range(args.clients)]

    def alive():
        return sum(len(c.owned) for c in clients)

    samples = [sample(args, t0, alive)]
    say("start: " + json.dumps(samples[0]))
    for c in clients:
        c.start()
    next_sample = t0 + args.sample_secs
    while any(c.is_alive() for c in clients):
        time.sleep(min(1.0, max(0.0, next_sample - time.monotonic())))
        if time.monotonic() >= next_sample and time.monotonic() < stop_at:
            samples.append(sample(args, t0, alive))
            say("sample: " + json.dumps(samples[-1]))
            next_sample += args.sample_secs
    for c in clients:
        c.join()
    wall = time.monotonic() - t0
    # settle: terminations answered, let forkd free what it frees
    time.sleep(2)
    samples.append(sample(args, t0, alive))
    say("end: " + json.dumps(samples[-1]))
    crashed = [f"client {c.idx}: {c.exc!r}" for c in clients if c.exc]

    # Before cleanup: forkd still lists what we think is alive.
    st, listed = api.request("GET", "/v1/sandboxes")
    listed_n = len(listed) if st == 200 and isinstance(listed, list) else -1

    result = {
        "minutes": args.minutes,
        "sandboxes": args.sandboxes,
        "clients": args.clients,
        "think_ms": args.think_ms,
        "guest": "forkd-test-guest",
        "mem_mib": args.mem_mib,
        "fill_s": round(fill_s, 1),
        "host_mem_per_sandbox_kib": round(per_sandbox_kib),
        "forkd_rss_kib_start": samples[0]["forkd_rss_kib"],
        "forkd_rss_kib_end": samples[-1]["forkd_rss_kib"],
        "forkd_fds_start": samples[0]["forkd_fds"],
        "forkd_fds_end": samples[-1]["forkd_fds"],
        "vmm_processes_start": samples[0]["vmm_processes"],
        "vmm_processes_end": samples[-1]["vmm_processes"],
        "sandboxes_listed_end": listed_n,
        "samples": samples,
        "requests": {},
        "requests_total": 0,
        "requests_per_s": 0,
        "errors": sum(stats.errors.values()) + len(crashed),
        "first_errors": stats.first_errors + crashed,
    }
    total = 0
    for k in KINDS:
        lat = sorted(stats.lat[k])
        n = len(lat) + stats.errors[k]
        total += n
        result["requests"][k] = {
            "count": n,
            "errors": stats.errors[k],
            "p50_ms": round(percentile(lat, 50) * 1000, 2) if lat else None,
            "p99_ms": round(percentile(lat, 99) * 1000, 2) if lat else None,
        }
    result["requests_total"] = total
    result["requests_per_s"] = round(total / wall, 1)
    if listed_n != args.sandboxes:
        result["errors"] += 1
        result["first_errors"].append(f"forkd lists {listed_n} sandboxes at the end, expected {args.sandboxes}")

    say(f"{total} requests in {wall:.0f} s ({result['requests_per_s']}/s) from {args.clients} clients, "
        f"{result['errors']} errors")
    for k in KINDS:
        r = result["requests"][k]
        say(f"  {k:10s} {r['count']:7d}  p50 {r['p50_ms']} ms  p99 {r['p99_ms']} ms  errors {r['errors']}")
    say(f"forkd RSS {result['forkd_rss_kib_start']} -> {result['forkd_rss_kib_end']} KiB, "
        f"fds {result['forkd_fds_start']} -> {result['forkd_fds_end']}, "
        f"forkd-vmm processes {result['vmm_processes_start']} -> {result['vmm_processes_end']}")
    for e in result["first_errors"]:
        say(f"  error: {e}")

    # Cleanup is the stack's (bench/soak stops it); the snapshot goes with it.
    api.close()
    if args.json:
        print(json.dumps(result))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
