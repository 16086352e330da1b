# SPDX-License-Identifier: LGPL-2.1-or-later
"""Networking of the Linux guest (part of test-linux-guest.py): a snapshot made with
network and agent_tcp, children with egress and none, host_addr, guest_addr dialed
from the host, an exposed port, isolation, and no namespace left after DELETE or
after kill -9 of forkd and a restart."""
import json
import os
import subprocess
import threading
import time
import urllib.request

from linuxguest import TCG_BOOT_WAIT_SECS, kill9_forkd, rest


NET_TAG = "py-net"
NET_PORT = 8000            # the guest's http.server, exposed
AGENT_TCP_PORT = 8888      # src/shared/agent-tcp-port.h
NET_TIMEOUT = 10           # every connection attempt, guest or host side


def net_leftovers():
    """What forkd's networking could leave on the host: namespaces, marks, fkd* veths, taps."""
    left = []
    for d in ("/run/netns", "/run/forkd/netns"):
        if os.path.isdir(d):
            left += [f"{d}/{x}" for x in os.listdir(d) if x.startswith("forkd-child-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        parts = line.split(": ")
        name = parts[1].split("@")[0] if len(parts) > 1 else ""
        if name.startswith("fkd") or name.startswith("tap"):
            left.append(name)
    return left


def agent_tcp(addr, msg, timeout=30):
    """forkd's JSON-line agent protocol as forkd's sdk/python Sandbox._send speaks
    it: one JSON object and a newline, the write side shut, the answer until EOF."""
    import socket
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=NET_TIMEOUT) as c:
        c.settimeout(timeout)
        c.sendall((json.dumps(msg) + "\n").encode())
        c.shutdown(socket.SHUT_WR)
        buf = bytearray()
        while True:
            chunk = c.recv(65536)
            if not chunk:
                break
            buf.extend(chunk)
    return json.loads(buf.decode())


class HostPage:
    """An HTTP server on one host_addr (the host end of one child's veth: an
    address the test's namespaces only reach), serving one page."""

    def __init__(self, addr, text):
        import http.server

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer((addr, 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def guest_fetch(fc, sid, url):
    """The guest fetches url (python3's urllib): (fetched, text or error)."""
    code = (f"import urllib.request\nprint(urllib.request.urlopen({url!r}, timeout={NET_TIMEOUT}).read().decode())")
    rc, r, err = fc("exec", sid, "--timeout", str(NET_TIMEOUT + 20), "--", "python3", "-c", code)
    if rc == 0 and r and r.get("exit_code") == 0:
        return True, r.get("stdout", "")
    return False, (r or {}).get("stderr") or err


def guest_connect(fc, sid, addr):
    """Can the guest open a TCP connection to addr (host:port)? (connected, detail)"""
    host, port = addr.rsplit(":", 1)
    code = ("import socket\n"
            f"socket.create_connection(({host!r}, {int(port)}), timeout={NET_TIMEOUT}).close()\nprint('connected')")
    rc, r, err = fc("exec", sid, "--timeout", str(NET_TIMEOUT + 20), "--", "python3", "-c", code)
    return rc == 0 and r is not None and r.get("stdout") == "connected\n", r or err


def networking(t, fc, stack, restart, state):
    kernel, rootfs = stack["FORKD_GUEST_KERNEL"], stack["FORKD_GUEST_ROOTFS"]
    t.ok(not net_leftovers(), "networking: nothing of forkd's networking on the host before", net_leftovers())

    # A snapshot with a NIC and the agent on TCP (compatibility mode).
    t0 = time.monotonic()
    status, snap = rest(stack, "POST", "/v1/snapshots", {"tag": NET_TAG, "kernel": kernel, "rootfs": rootfs,
                                                         "boot_wait_secs": TCG_BOOT_WAIT_SECS, "network": True,
                                                         "agent_tcp": True})
    if not t.ok(status == 201 and isinstance(snap, dict) and snap.get("network") is True
                and snap.get("agent_tcp") is True,
                "POST /v1/snapshots with network and agent_tcp: the guest boots with a NIC, the snapshot says so",
                f"{status} {snap}"):
        return
    t.note(f"snapshot with a NIC: {time.monotonic() - t0:.1f} s under TCG")
    t.ok(not net_leftovers(), "the boot VM's namespace is gone once the snapshot is written", net_leftovers())

    pages = []
    try:
        # Done-when 1: two children of one snapshot, the same guest IP, each fetches from its host_addr.
        t0 = time.monotonic()
        status, kids = rest(stack, "POST", "/v1/sandboxes", {"snapshot_tag": NET_TAG, "n": 2, "network": "egress"})
        if not t.ok(status == 201 and isinstance(kids, list) and len(kids) == 2,
                    "fork 2 with network egress", f"{status} {kids}"):
            return
        t.note(f"fork of 2 with namespaces: {(time.monotonic() - t0) * 1000:.0f} ms under TCG")
        a, b = kids
        t.ok(all(k.get("netns", "").startswith("forkd-child-") and k.get("host_addr") and
                 k.get("guest_addr", "").endswith(f":{AGENT_TCP_PORT}") for k in kids) and
             a["netns"] != b["netns"] and a["host_addr"] != b["host_addr"],
             "each child: a namespace of its own, a host_addr and a dialable guest_addr", kids)
        for k in kids:
            rc, r, err = fc("exec", k["id"], "--", "python3", "-c",
                            "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                            f"s.connect(({k['host_addr']!r}, 9))\nprint(s.getsockname()[0])")
            k["guest_ip"] = (r or {}).get("stdout", "").strip() or err
        t.ok(a["guest_ip"] == b["guest_ip"] == "172.16.0.2", "both guests have the snapshot's IP, 172.16.0.2",
             [a["guest_ip"], b["guest_ip"]])
        for k in kids:
            page = HostPage(k["host_addr"], f"hello {k['id']}")
            pages.append(page)
            good, out = guest_fetch(fc, k["id"], f"http://{k['host_addr']}:{page.port}/")
            t.ok(good and out.strip() == f"hello {k['id']}",
                 f"{k['id']} (egress) fetches the page of the host at its host_addr {k['host_addr']}", out)

        # Done-when 2: with network none, the same fetch fails.
        rc, doc, err = fc("fork", NET_TAG, "--network", "none")
        none = ((doc or {}).get("sandboxes") or [{}])[0]
        if t.ok(rc == 0 and none.get("host_addr"), "forkctl fork --network none", doc or err):
            page = HostPage(none["host_addr"], "unreachable")
            pages.append(page)
            t0 = time.monotonic()
            good, out = guest_fetch(fc, none["id"], f"http://{none['host_addr']}:{page.port}/")
            t.ok(not good and time.monotonic() - t0 < NET_TIMEOUT + 25,
                 f"{none['id']} (none) cannot fetch from its host_addr", out)

        # Done-when 3: neither reaches the other's guest_addr (nor the other's exposed port).
        for x, y in ((a, b), (b, a)):
            good, out = guest_connect(fc, x["id"], y["guest_addr"])
            t.ok(not good, f"{x['id']} cannot reach {y['id']}'s guest_addr {y['guest_addr']}", out)

        # Done-when 4: the host dials each guest_addr; forkd's JSON-line protocol runs a command.
        for k in kids:
            try:
                pong = agent_tcp(k["guest_addr"], {"action": "ping"})
                r = agent_tcp(k["guest_addr"], {"action": "exec", "args": ["/bin/sh", "-c", "echo net-$((6*7))"],
                                                "timeout": 10})
            except (OSError, ValueError) as e:
                pong, r = None, repr(e)
            t.ok(isinstance(pong, dict) and pong.get("pong") is True and isinstance(r, dict)
                 and r.get("stdout") == "net-42\n" and r.get("exit_code") == 0,
                 f"the host dials {k['id']}'s guest_addr {k['guest_addr']}: ping, and exec runs a command",
                 f"{pong} {r}")

        # Done-when 5: an exposed port serves a guest HTTP server to the host.
        rc, r, err = fc("exec", a["id"], "--", "sh", "-c",
                        "echo served-by-the-guest > /root/index.html && setsid python3 -m http.server "
                        f"{NET_PORT} --bind 0.0.0.0 --directory /root </dev/null >/dev/null 2>&1 & echo started")
        t.ok(rc == 0 and (r or {}).get("stdout") == "started\n", "exec starts python3 -m http.server in the guest",
             r or err)
        status, exp = rest(stack, "POST", f"/v1/sandboxes/{a['id']}/ports", {"port": NET_PORT})
        addr = exp.get("host_addr") if isinstance(exp, dict) else None
        t.ok(status == 200 and addr == a["guest_addr"].rsplit(":", 1)[0] + f":{NET_PORT}",
             "POST /v1/sandboxes/:id/ports: the inside address and the port", f"{status} {exp}")
        rc, doc, err = fc("ports", a["id"], str(NET_PORT))
        t.ok(rc == 0 and (doc or {}).get("host_addr") == addr, "forkctl ports says the same", doc or err)
        body, deadline = None, time.monotonic() + 60
        while addr and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{addr}/index.html", timeout=NET_TIMEOUT) as resp:
                    body = resp.read().decode()
                break
            except OSError as e:
                body = repr(e)
                time.sleep(1)
        t.ok(body == "served-by-the-guest\n", f"the host fetches the guest's page at {addr}", body)
        good, out = guest_connect(fc, b["id"], addr or "0.0.0.0:1")
        t.ok(not good, f"{b['id']} cannot reach {a['id']}'s exposed port", out)
        status, exp = rest(stack, "POST", f"/v1/sandboxes/{a['id']}/ports", {"port": 0})
        t.ok(status == 400, "ports: port 0 is 400", f"{status} {exp}")

        # Done-when 6: after DELETE, nothing is left.
        for k in kids + ([none] if none.get("id") else []):
            status, r = rest(stack, "DELETE", f"/v1/sandboxes/{k['id']}")
            t.ok(status == 204, f"DELETE {k['id']}", f"{status} {r}")
        deadline = time.monotonic() + 30
        while net_leftovers() and time.monotonic() < deadline:
            time.sleep(0.5)
        t.ok(not net_leftovers(), "after DELETE: no namespace, mark, tap or fkd* veth is left", net_leftovers())

        # ... and after kill -9 of forkd and a restart.
        status, kids = rest(stack, "POST", "/v1/sandboxes", {"snapshot_tag": NET_TAG, "n": 2, "network": "egress"})
        t.ok(status == 201 and len(net_leftovers()) >= 2, "fork 2 again: their namespaces exist",
             f"{status} {net_leftovers()}")
        kill9_forkd(state)
        stack.update(restart({}))
        deadline = time.monotonic() + 30
        while net_leftovers() and time.monotonic() < deadline:
            time.sleep(0.5)
        t.ok(not net_leftovers(), "after kill -9 of forkd and a restart: no namespace, tap or fkd* veth is left",
             net_leftovers())
        status, lst = rest(stack, "GET", "/v1/sandboxes")
        t.ok(status == 200 and not any(k.get("snapshot_tag") == NET_TAG for k in (lst or [])),
             "and none of the killed forkd's sandboxes is listed", f"{status} {lst}")
    finally:
        for page in pages:
            page.close()
        rest(stack, "DELETE", f"/v1/snapshots/{NET_TAG}")
