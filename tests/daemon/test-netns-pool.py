#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
forkd --netns-pool: network namespaces made ahead of time, for real. A private
bus, the real forkd and forkd-vmm on /dev/kvm, the test guest snapshotted with a
NIC. Checks: the option's bounds; NetnsPoolSize and NetnsPool; a policy's pool
fills only once a fork asked for it, up to N; a fork takes what is ready (forkd's
log says how many) and makes the rest; taken namespaces are the sandboxes' and
go with them, never back to the pool; the pool refills; each policy has its own;
a stopped forkd leaves no namespace or fkd link, and a killed one's are removed
by the next forkd.

As root it runs in a mount and network namespace of its own, with a tmpfs on
/run: forkd's namespace cleanup touches nothing of the host. TAP; a TAP skip
when /dev/kvm or root is missing.

Environment: FORKD, FORKD_VMM, FORKD_TEST_GUEST.
"""

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("test_forkd", os.path.join(HERE, "test-forkd.py"))
tf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tf)

NETNS_DIR = "/run/netns"
POOL = 3
TAG = "nic"
PROPS = "org.freedesktop.DBus.Properties"


def namespaces():
    try:
        return {x for x in os.listdir(NETNS_DIR) if x.startswith("forkd-child-")}
    except FileNotFoundError:
        return set()


def fkd_links():
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30).stdout
    return [m for m in re.findall(r"^\d+: (fkd\d+)[@:]", out, re.M)]


def main():
    if not tf.FORKD or not tf.VMM or not tf.GUEST:
        print("Bail out! FORKD, FORKD_VMM and FORKD_TEST_GUEST must be set")
        return 1
    if not tf.kvm_usable():
        tf.skip("/dev/kvm is not usable")
    for tool in ("dbus-daemon", "ip"):
        if not shutil.which(tool):
            tf.skip(f"{tool} is missing")
    if not os.path.exists("/dev/net/tun"):
        tf.skip("/dev/net/tun is missing")
    h = tf.Harness()
    try:
        return run(h)
    finally:
        h.cleanup()


def run(h):
    disk = os.path.join(h.tmp, "disk.img")
    with open(disk, "wb") as f:
        f.truncate(16 << 20)
    h.start_bus()
    ctx = {}

    def prop(name):
        return h.bus.call(tf.DEST, tf.PATH, PROPS, "Get", "ss", [tf.IFACE, name])[0]

    def pool_ready(want):
        tf.wait_for(lambda: prop("NetnsPool") == want, 60, f"the pool to be {want} (it is {prop('NetnsPool')})")

    def pool_log():
        """(made, taken from the pool) of every fork so far, from forkd's log."""
        with open(h.logs[-1]) as f:
            return [(int(a), int(b)) for a, b in
                    re.findall(r"Made (\d+) network namespace\(s\) in \d+ ms, (\d+) of them taken from the pool",
                               f.read())]

    def fork(n, policy):
        kids = h.fork(TAG, n, {"network": ("s", policy)})
        assert len(kids) == n and all(k.get("netns") for k in kids), kids
        return kids

    def bad_option():
        for bad in ("1001", "-1", "x", "", "+3", " 3"):
            r = subprocess.run([tf.FORKD, "--netns-pool", bad, "--state-dir", h.state + "-never"],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode != 0 and "--netns-pool takes a number from 0 to 1000" in r.stderr, (bad, r)
        assert not os.path.exists(h.state + "-never")
        r = subprocess.run([tf.FORKD, "--help"], capture_output=True, text=True, timeout=30)
        assert "--netns-pool N" in r.stdout, r.stdout
    h.check("--netns-pool: out of 0..1000 or not a number is refused, --help names it", bad_option)

    def start():
        h.start_forkd(["--netns-pool", str(POOL)])
        assert prop("NetnsPoolSize") == POOL, prop("NetnsPoolSize")
        assert prop("NetnsPool") == {}, prop("NetnsPool")
        assert namespaces() == set(), namespaces()
        fds = [os.open(tf.GUEST, os.O_RDONLY | os.O_CLOEXEC), os.open(disk, os.O_RDONLY | os.O_CLOEXEC)]
        b = tf.Bus(h.address, unix_fds=True)
        try:
            info = b.call(tf.DEST, tf.PATH, tf.IFACE, "CreateSnapshotFromFds", "shhuua{sv}",
                          [TAG, 0, 1, 64, 30, {"network": ("b", True)}], timeout=120, fds=fds)[0]
        finally:
            b.close()
            for fd in fds:
                os.close(fd)
        assert info.get("network") is True, info
        # A snapshot's boot namespace is gone once it is written; no fork asked for a policy yet.
        assert prop("NetnsPool") == {} and namespaces() == set(), (prop("NetnsPool"), namespaces())
    h.check(f"forkd --netns-pool {POOL}: NetnsPoolSize {POOL}, NetnsPool empty, nothing made before a fork",
            start)

    def first_fork():
        kids = fork(2, "egress")
        assert pool_log() == [(2, 0)], pool_log()
        pool_ready({"egress": POOL})
        mine = {k["netns"] for k in kids}
        pooled = namespaces() - mine
        assert len(mine) == 2 and len(pooled) == POOL and mine <= namespaces(), (mine, namespaces())
        ctx["kids"], ctx["pooled"] = kids, pooled
    h.check("the first egress fork makes its own; then the egress pool fills to N, nothing else", first_fork)

    def take():
        kids = fork(POOL + 1, "egress")
        assert pool_log()[-1] == (POOL + 1, POOL), pool_log()
        names = [k["netns"] for k in kids]
        assert len(set(names)) == POOL + 1, names
        taken = set(names) & ctx["pooled"]
        assert taken == ctx["pooled"], (names, ctx["pooled"])
        pool_ready({"egress": POOL})
        everyone = {k["netns"] for k in ctx["kids"] + kids}
        refill = namespaces() - everyone
        assert len(refill) == POOL and not refill & ctx["pooled"], (refill, ctx["pooled"])
        ctx["kids"] += kids
        ctx["pooled"] = refill
    h.check(f"a fork of {POOL + 1} takes the {POOL} ready and makes 1; the pool refills with new ones", take)

    def other_policy():
        kids = fork(1, "none")
        assert pool_log()[-1] == (1, 0), pool_log()
        pool_ready({"egress": POOL, "none": POOL})
        ctx["kids"] += kids
    h.check("policy none has a pool of its own, filled once a fork asked for it", other_policy)

    def sandboxes_go():
        theirs = {k["netns"] for k in ctx["kids"]}
        pooled = namespaces() - theirs
        assert len(pooled) == 2 * POOL, pooled
        h.terminate_all()
        tf.wait_for(lambda: namespaces() == pooled, 30, "the sandboxes' namespaces to go")
        assert prop("NetnsPool") == {"egress": POOL, "none": POOL}, prop("NetnsPool")
        assert len(fkd_links()) == 2 * POOL, fkd_links()
    h.check("terminated sandboxes' namespaces are removed, not given back; the pool stays full", sandboxes_go)

    def killed():
        assert namespaces(), "the pool is empty before the kill"
        h.stop_forkd(signal.SIGKILL)
        tf.wait_for(lambda: not tf.vmm_processes(h.tmp), 20, "the VMMs to exit")
        assert len(namespaces()) == 2 * POOL, namespaces()
        h.start_forkd()
        assert prop("NetnsPoolSize") == 0 and prop("NetnsPool") == {}, (prop("NetnsPoolSize"), prop("NetnsPool"))
        assert namespaces() == set() and fkd_links() == [], (namespaces(), fkd_links())
    h.check("forkd killed with a full pool: the next forkd (no pool) removes every pooled namespace and link",
            killed)

    def stopped():
        assert h.stop_forkd() == 0
        h.start_forkd(["--netns-pool", "2"])
        kids = fork(1, "egress")
        pool_ready({"egress": 2})
        assert len(namespaces()) == 3, namespaces()
        del kids
        assert h.stop_forkd() == 0
        assert namespaces() == set() and fkd_links() == [], (namespaces(), fkd_links())
    h.check("a forkd stopped with a pool and a sandbox exits 0 and leaves no namespace or link", stopped)

    h.check("no sanitizer report", h.assert_no_sanitizer_report)
    print(f"1..{h.n}", flush=True)
    return 1 if h.failed else 0


def outer():
    """forkd removes the namespaces and fkd* links a previous forkd left: so this
    runs in a mount and network namespace of its own, with a tmpfs on /run."""
    if os.geteuid() != 0:
        tf.skip("needs root (network namespaces)")
    if os.environ.get("NETNS_POOL_INNER") == "1":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run"], check=True)
        subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
        return main()
    if shutil.which("unshare") is None:
        tf.skip("needs unshare(1) to keep forkd's namespace cleanup off the host")
    os.environ["NETNS_POOL_INNER"] = "1"
    os.execvp("unshare", ["unshare", "-m", "-n", "--propagation", "private", "--", sys.executable,
                          os.path.abspath(__file__)])


if __name__ == "__main__":
    sys.exit(outer())
