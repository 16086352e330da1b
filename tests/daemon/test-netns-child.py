#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
Per-child network namespaces made by forkd (src/daemon/netns.c), for real,
with fake guests: tests/daemon/netns-helper makes child i with
netns_child_create(), then moves into a namespace of its own, G_i, with a tap
gtap and relays frames between the child's tap0 (virtio-net header stripped
and added) and gtap. The test gives gtap the guest's address, 172.16.0.2/30,
in every G_i, so G_i's kernel stands in for the guest of child i. Then:

  1. with egress, each child fetches a page from an HTTP server on the host at
     its host_addr (seen from the inside address: SNAT), and reaches a server
     outside the host (a namespace of the test's, behind a veth), masqueraded;
  2. with none, the same fetches fail within 2 s;
  3. no child reaches another's inside address (its guest_addr) or host end,
     nor another address of the host;
  4. the host dials each child's inside_addr:port and reaches G_i's server;
  5. destroy, and a crash (helper killed, netns_cleanup_leftovers() from a
     fresh process), leave no namespace, /run/netns file, mark, tap or veth; a
     namespace made as tools/netns-setup makes them survives the cleanup.

Everything runs in a private mount namespace (a tmpfs on /run) and a private
network namespace that plays the host: nothing of the real host's network,
nftables or /run is touched, packets go only to namespaces this test made, and
whatever the test leaves dies with it. TAP; a TAP skip when not root, or
/dev/net/tun or namespaces are unavailable. Every step is time-bounded.

Environment: NETNS_HELPER (the built netns-helper).
"""

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tap import Tap
from tap import skip_all as tap_skip_all

HELPER = os.environ.get("NETNS_HELPER", "")
INNER = "--inner"
GUEST_IP = "172.16.0.2"
# The "outside world": a namespace of this test's own behind a veth of the host.
WAN_HOST, WAN_PEER = "198.51.100.1", "198.51.100.2"
# Another address of the host (on lo): no child may reach it.
OTHER_HOST_ADDR = "192.0.2.1"
HTTP_PORT, GUEST_PORT, WAN_PORT = 8080, 9000, 8081
# A refusal is a connection that gets nowhere within CONNECT_TIMEOUT; what
# must work gets REACH_TIMEOUT, for loaded machines.
CONNECT_TIMEOUT = 2.0
# Two unprivileged uids of no account: a sandbox's owner, and someone else on the host.
OWNER_UID = 4242
OTHER_UID = 4243
REACH_TIMEOUT = 10.0

tap = Tap(detail_prefix="# ", detail_lines=20, detail_head=True)
ok = tap.ok


def skip_all(why):
    tap_skip_all(why, status=0)


def run(cmd, timeout=20, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


# Run in a namespace (nsenter), a small Python program: a client that prints
# what it received (or ERR ...), a server that answers every connection with
# a text naming the peer.
CLIENT = r"""
import socket, sys
host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    s = socket.create_connection((host, port), timeout=timeout)
    s.settimeout(timeout)
    s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
    data = b""
    while len(data) < 65536:
        b = s.recv(4096)
        if not b:
            break
        data += b
    print(data.decode(errors="replace"))
except Exception as e:
    print(f"ERR {type(e).__name__}: {e}")
    sys.exit(1)
"""

SERVER = r"""
import socket, sys, threading
addr, port, text = sys.argv[1], int(sys.argv[2]), sys.argv[3]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((addr, port))
srv.listen(16)
print("ready", flush=True)
def serve():
    while True:
        c, peer = srv.accept()
        c.settimeout(2)
        try:
            c.recv(4096)
        except OSError:
            pass
        c.sendall(f"{text} peer={peer[0]}".encode())
        c.close()
threading.Thread(target=serve, daemon=True).start()
sys.stdin.read()
"""


def nsenter(ns, cmd):
    return ["nsenter", f"--net={ns}", "--"] + cmd


def client(ns, host, port, timeout=CONNECT_TIMEOUT, uid=None):
    """(success, output) of a TCP fetch from namespace ns (None: this one), as
    uid (None: this process's; else the system's python3 under setpriv)."""
    cmd = [sys.executable, "-c", CLIENT, host, str(port), str(timeout)]
    if uid is not None:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3", *cmd[1:]]
    if ns:
        cmd = nsenter(ns, cmd)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 15)
    except subprocess.TimeoutExpired:
        return False, "client timed out"
    return r.returncode == 0, (r.stdout + r.stderr).strip()


class Server:
    """A TCP server in namespace ns (None: this one), until stop()."""

    def __init__(self, ns, addr, port, text):
        cmd = [sys.executable, "-c", SERVER, addr, str(port), text]
        if ns:
            cmd = nsenter(ns, cmd)
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = read_line(self.p, 20)
        if line != "ready":
            self.stop()
            raise RuntimeError(f"server {addr}:{port} in {ns}: {line!r}")

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=10)


def read_line(p, timeout):
    """One line of p's stdout within timeout seconds, or None."""
    r, _, _ = select.select([p.stdout], [], [], timeout)
    if not r:
        return None
    return p.stdout.readline().strip()


class Child:
    """netns-helper up INDEX POLICY: the child's namespace and its fake guest G."""

    def __init__(self, index, policy, wrap=()):
        self.index = index
        self.p = subprocess.Popen([*wrap, HELPER, "up", str(index), policy], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        line = read_line(self.p, 60)
        if not line:
            self.stop()
            raise RuntimeError(f"netns-helper up {index} {policy}: no answer (exit {self.p.returncode})")
        self.info = json.loads(line)
        self.g = f"/proc/{self.info['pid']}/ns/net"
        for cmd in (["ip", "link", "set", "lo", "up"],
                    ["ip", "addr", "add", f"{GUEST_IP}/30", "dev", "gtap"],
                    ["ip", "link", "set", "gtap", "up"],
                    ["ip", "route", "add", "default", "via", "172.16.0.1"]):
            run(nsenter(self.g, cmd))

    def __getattr__(self, k):
        if k in ("name", "host_addr", "inside_addr", "host_ifname", "policy"):
            return self.info[k]
        raise AttributeError(k)

    def stop(self, kill=False):
        if self.p.poll() is None:
            if kill:
                self.p.kill()
            else:
                self.p.stdin.close()
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=10)
        return self.p.returncode


class Page(BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello from the host at {self.server.server_address[0]}, peer={self.client_address[0]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def http_server(addr):
    s = ThreadingHTTPServer((addr, HTTP_PORT), Page)
    s.daemon_threads = True
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s


def host_links():
    out = run(["ip", "-o", "link", "show"]).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def is_nsfs(path):
    r = run(["stat", "-f", "-c", "%T", path], check=False)
    return r.returncode == 0 and r.stdout.strip() == "nsfs"


def ns_inode(path):
    return os.stat(path).st_ino


def ns_alive(ino):
    """Is a network namespace of this inode still some process's or mounted?"""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{pid}/ns/net") == f"net:[{ino}]":
                return True
        except OSError:
            pass
    with open("/proc/self/mountinfo") as f:
        return f"net:[{ino}]" in f.read()


def helper(*args, timeout=60):
    return subprocess.run([HELPER, *args], capture_output=True, text=True, timeout=timeout)


def leftovers():
    """What forkd's plumbing could leave: namespaces, marks, host links."""
    left = []
    for d in ("/run/netns", "/run/forkd/netns"):
        if os.path.isdir(d):
            left += [f"{d}/{x}" for x in os.listdir(d) if x.startswith("forkd-child-")]
    left += [x for x in host_links() if x.startswith("fkd")]
    return left


def tests(cleanup):
    r = helper("selftest")
    ok(r.returncode == 0, "netns-helper selftest: prefixes, names, addresses, refusals", r.stdout + r.stderr)

    r = helper("pick", "3")
    ok(r.returncode == 0 and r.stdout.split("\n")[:2] == ["1 2 3", "4 5 6"],
       "pick_free: the lowest free indices, two calls never share one", r.stdout + r.stderr)

    # A fork's namespaces, made side by side (netns_children_create()), then removed.
    r = helper("batch", "6", "3", "egress")
    try:
        d = json.loads(r.stdout)
    except ValueError:
        d = {}
    ok(r.returncode == 0 and sorted(d.get("names", [])) == sorted(f"forkd-child-{i}" for i in range(1, 7)) and
       not leftovers(), f"a batch of 6 with 3 threads: made ({d.get('ms')} ms) and removed, nothing left",
       r.stdout + r.stderr + repr(leftovers()))

    # The host's other side: another address, and the
    # "outside": a namespace behind a veth.
    run(["ip", "addr", "add", f"{OTHER_HOST_ADDR}/32", "dev", "lo"])
    wan = subprocess.Popen(["unshare", "-n", "sleep", "300"])
    cleanup.append(lambda: (wan.kill(), wan.wait(timeout=10)))
    wan_ns = f"/proc/{wan.pid}/ns/net"
    deadline = time.monotonic() + 10
    while os.readlink(wan_ns) == os.readlink("/proc/self/ns/net") and time.monotonic() < deadline:
        time.sleep(0.05)
    run(["ip", "link", "add", "wan0", "type", "veth", "peer", "name", "wan0p", "netns", str(wan.pid)])
    run(["ip", "addr", "add", f"{WAN_HOST}/24", "dev", "wan0"])
    run(["ip", "link", "set", "wan0", "up"])
    for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", f"{WAN_PEER}/24", "dev", "wan0p"],
                ["ip", "link", "set", "wan0p", "up"]):
        run(nsenter(wan_ns, cmd))
    wan_srv = Server(wan_ns, WAN_PEER, WAN_PORT, "hello from outside")
    cleanup.append(wan_srv.stop)
    other_srv = Server(None, OTHER_HOST_ADDR, HTTP_PORT, "another host address")
    cleanup.append(other_srv.stop)

    children = {}
    for i, policy in ((1, "egress"), (2, "egress"), (3, "none")):
        c = Child(i, policy)
        cleanup.append(c.stop)
        children[i] = c
    c1, c2, c3 = children[1], children[2], children[3]
    ok([c.inside_addr for c in (c1, c2, c3)] == ["10.200.0.2", "10.200.0.6", "10.200.0.10"] and
       [c.host_addr for c in (c1, c2, c3)] == ["10.200.0.1", "10.200.0.5", "10.200.0.9"] and
       [c.host_ifname for c in (c1, c2, c3)] == ["fkd1", "fkd2", "fkd3"],
       "children 1..3: the i-th /30 of 10.200.0.0/16, host end .1, inside .2",
       json.dumps([c.info for c in (c1, c2, c3)]))
    ok(all(is_nsfs(f"/run/netns/forkd-child-{i}") and os.path.exists(f"/run/forkd/netns/forkd-child-{i}")
           for i in (1, 2, 3)), "each child has a mounted /run/netns/forkd-child-<i> and forkd's mark")
    inodes = {i: ns_inode(f"/run/netns/forkd-child-{i}") for i in (1, 2, 3)}
    ok(len(set(inodes.values())) == 3 and ns_inode("/proc/self/ns/net") not in inodes.values(),
       "three namespaces apart from each other and from the host")
    r = run(["ip", "-n", "forkd-child-1", "-o", "addr", "show"])
    links = [line for line in r.stdout.splitlines() if " tap0 " in line or " veth0" in line]
    ok("172.16.0.1/30" in r.stdout and "10.200.0.2/30" in r.stdout and not any("inet6" in x for x in links),
       "inside: tap0 172.16.0.1/30, veth0 10.200.0.2/30, no IPv6 on either", r.stdout)
    r = run(["ip", "-o", "addr", "show", "dev", "fkd1"])
    ok("10.200.0.1/30" in r.stdout and "inet6" not in r.stdout, "host end fkd1: 10.200.0.1/30, no IPv6", r.stdout)
    r = run(["ip", "netns", "exec", "forkd-child-1", "cat", "/proc/sys/net/ipv4/ip_forward",
             "/proc/sys/net/ipv4/conf/tap0/forwarding", "/proc/sys/net/ipv4/conf/veth0/forwarding"])
    # ip_forward (all/forwarding) is the host's, inherited (forkd cannot write /proc/sys
    # under ProtectKernelTunables=); tap0 and veth0 forward because forkd set them.
    inherit = "0"
    try:
        with open("/proc/sys/net/core/devconf_inherit_init_net") as f:
            inherit = f.read().strip()
    except OSError:
        pass
    want = os.environ.get("FORKD_TEST_HOST_IP_FORWARD", "0") if inherit in ("0", "1") else "0"
    ok(r.stdout.split() == [want, "1", "1"], f"inside: forwarding on tap0 and veth0, set over netlink (ip_forward "
       f"{want}, the host's)", r.stdout)

    servers = [http_server(c.host_addr) for c in (c1, c2, c3)]
    cleanup.extend(s.shutdown for s in servers)

    # 1. egress: both children, the same guest IP, each to its own host_addr.
    for c in (c1, c2):
        good, out = client(c.g, c.host_addr, HTTP_PORT, timeout=REACH_TIMEOUT)
        ok(good and f"hello from the host at {c.host_addr}, peer={c.inside_addr}" in out,
           f"child {c.index} (egress, guest {GUEST_IP}) fetches a page from host_addr {c.host_addr}", out)
        good, out = client(c.g, WAN_PEER, WAN_PORT, timeout=REACH_TIMEOUT)
        ok(good and f"hello from outside peer={WAN_HOST}" in out,
           f"child {c.index} (egress) reaches a server outside the host, masqueraded as the host", out)

    # The operator's allow-list of forkd(8), NETWORKING: a rule in the host's chain egress.
    r = helper("nft", "add rule ip forkd egress ip daddr != { 203.0.113.0/24, 10.200.0.0/16 } drop")
    ok(r.returncode == 0, "an operator's allow-list rule goes into the host's chain egress", r.stderr)
    good, out = client(c1.g, WAN_PEER, WAN_PORT)
    ok(not good, f"with it, child 1 cannot reach {WAN_PEER}, which the list leaves out", out)
    good, out = client(c1.g, c1.host_addr, HTTP_PORT, timeout=REACH_TIMEOUT)
    ok(good and "hello from the host" in out, "and still reaches its host_addr", out)
    r = helper("nft", "flush chain ip forkd egress")
    good, out = client(c1.g, WAN_PEER, WAN_PORT, timeout=REACH_TIMEOUT)
    ok(r.returncode == 0 and good, "without it, child 1 reaches the outside again", out)

    # 2. none: the same fetches fail, fast.
    t0 = time.monotonic()
    good, out = client(c3.g, c3.host_addr, HTTP_PORT)
    ok(not good and time.monotonic() - t0 < 10, f"child 3 (none) cannot fetch from its host_addr {c3.host_addr}", out)
    good, out = client(c3.g, WAN_PEER, WAN_PORT)
    ok(not good, "child 3 (none) cannot reach outside the host", out)

    # 4. the host reaches every guest's port through the inside address (none too).
    guest_srv = {}
    for c in (c1, c2, c3):
        guest_srv[c.index] = Server(c.g, "0.0.0.0", GUEST_PORT, f"guest of child {c.index}")
        cleanup.append(guest_srv[c.index].stop)
    for c in (c1, c2, c3):
        good, out = client(None, c.inside_addr, GUEST_PORT, timeout=REACH_TIMEOUT)
        ok(good and f"guest of child {c.index} peer={c.host_addr}" in out,
           f"the host dials {c.inside_addr}:{GUEST_PORT} and reaches child {c.index}'s guest ({c.policy})", out)

    # 4b. From the host, only root and the owner dial a guest (the host's chain ip forkd dial):
    # another local user must not reach a sandbox's ports, its agent's included.
    good, out = client(None, c1.inside_addr, GUEST_PORT, uid=OTHER_UID)
    ok(not good, f"uid {OTHER_UID} cannot dial {c1.inside_addr}:{GUEST_PORT} (no owner allowed yet)", out)
    r = helper("allow", c1.name, str(OWNER_UID))
    ok(r.returncode == 0, f"netns_children_allow({c1.name}, {OWNER_UID})", r.stderr)
    good, out = client(None, c1.inside_addr, GUEST_PORT, timeout=REACH_TIMEOUT, uid=OWNER_UID)
    ok(good and f"guest of child {c1.index}" in out, f"its owner, uid {OWNER_UID}, dials child 1's guest", out)
    good, out = client(None, c2.inside_addr, GUEST_PORT, uid=OWNER_UID)
    ok(not good, f"uid {OWNER_UID} cannot dial child 2's guest, which is not its", out)
    good, out = client(None, c1.inside_addr, GUEST_PORT, uid=OTHER_UID)
    ok(not good, f"uid {OTHER_UID} still cannot dial child 1's guest", out)
    good, out = client(None, c1.inside_addr, GUEST_PORT, timeout=REACH_TIMEOUT)
    ok(good, "root still dials child 1's guest", out)
    r = helper("allow", c1.name, "0")
    good, out = client(None, c1.inside_addr, GUEST_PORT, uid=OWNER_UID)
    ok(r.returncode == 0 and not good, f"allowed again for root only: uid {OWNER_UID} no longer dials child 1", out)

    # 3. isolation: never another child, its host end, or another host address.
    for a, b in ((c1, c2), (c2, c1), (c1, c3), (c3, c1)):
        good, out = client(a.g, b.inside_addr, GUEST_PORT)
        ok(not good, f"child {a.index} cannot reach child {b.index}'s guest_addr {b.inside_addr}:{GUEST_PORT}", out)
    for a, b in ((c1, c2), (c2, c1)):
        good, out = client(a.g, b.host_addr, HTTP_PORT)
        ok(not good, f"child {a.index} cannot reach child {b.index}'s host end {b.host_addr}", out)
    good, out = client(c1.g, OTHER_HOST_ADDR, HTTP_PORT)
    ok(not good, f"child 1 cannot reach another address of the host ({OTHER_HOST_ADDR})", out)
    good, out = client(None, OTHER_HOST_ADDR, HTTP_PORT, timeout=REACH_TIMEOUT)
    ok(good and "another host address" in out, "(that address does serve the host itself)", out)
    good, out = client(c1.g, "172.16.0.1", GUEST_PORT)
    ok(not good, "child 1's guest cannot connect into its own namespace (tap0's address)", out)

    # The refusals above were the rules at work, not a relay gone dead.
    alive = [client(c.g, c.host_addr, HTTP_PORT, timeout=REACH_TIMEOUT)[0] for c in (c1, c2)]
    ok(alive == [True, True], "after all that, children 1 and 2 still fetch from their host_addr", alive)

    r = helper("pick", "2")
    ok(r.returncode == 0 and r.stdout.split("\n")[:2] == ["4 5", "6 7"], "pick_free skips namespaces that exist",
       r.stdout + r.stderr)

    # 5a. destroy.
    for s in servers:
        s.shutdown()
        s.server_close()
    for g in guest_srv.values():
        g.stop()
    for c in (c1, c2, c3):
        ok(c.stop() == 0, f"child {c.index}'s relay ends cleanly when its input closes")
    for c in (c1, c2, c3):
        r = helper("down", c.name)
        ok(r.returncode == 0, f"netns_child_destroy({c.name})", r.stderr)
    r = helper("down", "forkd-child-1")
    ok(r.returncode == 0, "netns_child_destroy again: idempotent", r.stderr)
    left = leftovers()
    ok(not left, "after destroy: no namespace file, mark or fkd link left", left)
    alive = [i for i, ino in inodes.items() if ns_alive(ino)]
    ok(not alive, "after destroy: the three namespaces (and their taps and veths) are gone", alive)

    # forkd under systemd has a read-only /proc/sys (ProtectKernelTunables=):
    # nothing inside needs it, the host's ip_forward only for egress, when 0.
    ro = ["unshare", "-m", "--propagation", "unchanged", "sh", "-c",
          'mount --bind -o ro /proc/sys /proc/sys && exec "$0" "$@"']
    c7 = Child(7, "none", wrap=ro)
    cleanup.append(c7.stop)
    guest7 = Server(c7.g, "0.0.0.0", GUEST_PORT, "guest of child 7")
    cleanup.append(guest7.stop)
    good, out = client(None, c7.inside_addr, GUEST_PORT, timeout=REACH_TIMEOUT)
    ok(good and "guest of child 7" in out, "with /proc/sys read-only: a none child is made and its guest reached", out)
    guest7.stop()
    c7.stop()
    run(["sh", "-c", "echo 0 > /proc/sys/net/ipv4/ip_forward"])
    r = subprocess.run([*ro, HELPER, "up", "8", "egress"], capture_output=True, text=True, timeout=60)
    ok(r.returncode != 0 and "set it with sysctl.d" in r.stderr and not os.path.exists("/run/netns/forkd-child-8"),
       "with /proc/sys read-only and ip_forward 0, an egress child is refused, naming why, leaving nothing", r.stderr)
    run(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])
    r = helper("down", "forkd-child-7")
    ok(r.returncode == 0 and not leftovers(), "child 7 destroyed, nothing left", leftovers())

    # 5b. a crash: the helper is killed after create, cleanup runs from a fresh process.
    c4 = Child(4, "egress")
    cleanup.append(c4.stop)
    ino4 = ns_inode("/run/netns/forkd-child-4")
    # While its maker lives (another forkd, say a test's beside ours), a cleanup leaves it alone.
    r = helper("cleanup")
    ok(r.returncode == 0 and r.stdout.strip() == "0" and ns_alive(ino4) and "fkd4" in host_links(),
       "netns_cleanup_leftovers() leaves a namespace whose maker is alive (its pid in the mark)", r.stdout + r.stderr)
    c4.stop(kill=True)
    # A namespace made as tools/netns-setup makes it (ip netns add, lo up), no mark.
    run(["ip", "netns", "add", "forkd-child-5"])
    cleanup.append(lambda: run(["ip", "netns", "delete", "forkd-child-5"], check=False))
    run(["ip", "-n", "forkd-child-5", "link", "set", "lo", "up"])
    # A dangling host end (its namespace long gone).
    run(["ip", "link", "add", "fkd6", "type", "veth", "peer", "name", "x6p"])
    ok(os.path.exists("/run/netns/forkd-child-4") and "fkd4" in host_links(), "after the kill: child 4 is left over")
    r = helper("cleanup")
    ok(r.returncode == 0 and r.stdout.strip() == "1", "netns_cleanup_leftovers() removes the one namespace forkd marked",
       r.stdout + r.stderr)
    ok(leftovers() == ["/run/netns/forkd-child-5"] and not ns_alive(ino4) and "x6p" not in host_links(),
       "after cleanup: child 4 and the dangling fkd6 are gone, nothing else of forkd's is left", leftovers())
    ok(is_nsfs("/run/netns/forkd-child-5"), "the pre-made forkd-child-5 survives the cleanup")
    r = helper("down", "forkd-child-5")
    ok(r.returncode == 0 and is_nsfs("/run/netns/forkd-child-5"), "destroy leaves an unmarked namespace alone",
       r.stderr)
    r = helper("up", "5", "egress")
    ok(r.returncode != 0 and "namespace name: File exists" in r.stderr and is_nsfs("/run/netns/forkd-child-5"),
       "create over an existing namespace: EEXIST, the namespace untouched", r.stderr)
    r = helper("pick", "1")
    ok(r.returncode == 0 and r.stdout.split("\n")[0] == "1", "pick_free: freed indices are free again", r.stdout)


def inner():
    run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run"])
    run(["ip", "link", "set", "lo", "up"])
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
        os.close(fd)
    except OSError as e:
        skip_all(f"/dev/net/tun cannot be opened: {e}")

    cleanup = []
    try:
        tests(cleanup)
    except Exception as e:  # a broken step fails the test, after the cleanup below
        ok(False, f"the test ran to its end: {type(e).__name__}: {e}")
    finally:
        for f in reversed(cleanup):
            try:
                f()
            except Exception:
                pass
        subprocess.run([HELPER, "cleanup"], capture_output=True, timeout=60)
    return tap.done()


def outer():
    if os.geteuid() != 0:
        skip_all("needs root: network namespaces, taps, veths and nftables")
    if not HELPER or not os.access(HELPER, os.X_OK):
        skip_all("NETNS_HELPER is not set to the built netns-helper")
    if not os.path.exists("/dev/net/tun"):
        skip_all("no /dev/net/tun")
    for tool in ("unshare", "nsenter", "ip", "mount", "stat"):
        if not shutil.which(tool):
            skip_all(f"{tool} is missing")
    try:
        r = subprocess.run(["unshare", "-m", "-n", "--propagation", "private", "true"], capture_output=True,
                           text=True, timeout=30)
    except subprocess.TimeoutExpired:
        skip_all("unshare -m -n timed out")
    if r.returncode != 0:
        skip_all(f"cannot make mount and network namespaces: {r.stderr.strip()}")
    # A new namespace takes its IPv4 settings, ip_forward included, from the host's
    # (net.core.devconf_inherit_init_net 0 or 1), so the children's ip_forward is
    # the host's: note it for the check below, before leaving the host's namespace.
    with open("/proc/sys/net/ipv4/ip_forward") as f:
        os.environ["FORKD_TEST_HOST_IP_FORWARD"] = f.read().strip()
    sys.stdout.flush()
    os.execvp("unshare", ["unshare", "-m", "-n", "--propagation", "private", "--",
                          sys.executable, os.path.abspath(__file__), INNER])


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if len(sys.argv) > 1 and sys.argv[1] == INNER:
        sys.exit(inner())
    outer()
