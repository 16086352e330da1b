#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""
forkd --vmm-uid-range (forkd(8), VMM USERS), checked at start before any VM
runs: a range holding root, nobody, 65533, the --vmm-user, an existing user or
group, or one past the last uid, and a malformed one, stop forkd with a message
that names what is wrong; the default range (1879048192:65536), another free
one and 'shared' start; a default range in the way of the --vmm-user (or of a
user or group) falls back to 'shared' with a warning; FORKD_VMM_UID_RANGE is read when the option is absent; --no-confine
checks nothing; a trusted bridge uid inside the range is refused. Needs no
/dev/kvm. TAP output.
"""

import grp
import importlib.util
import os
import pwd
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("test_forkd", os.path.join(HERE, "test-forkd.py"))
tf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tf)


def refused(h, extra, words, env=None):
    # forkd exits before it owns its name; its log says why
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        try:
            h.start_forkd(extra)
        except AssertionError as e:
            assert "forkd exited with 1" in str(e), e
        else:
            raise AssertionError(f"forkd {extra} started")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    h.forkd = None
    with open(h.logs[-1]) as f:
        log = f.read()
    for w in words:
        assert w in log, (w, log[-1500:])


def starts(h, extra, env=None):
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        h.start_forkd(extra)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert h.stop_forkd() == 0


def run(h):
    h.start_bus()

    def default_range():
        starts(h, [])
        with open(h.logs[-1]) as f:
            assert "from --vmm-uid-range 1879048192:65536." in f.read()

    def shared():
        starts(h, ["--vmm-uid-range", "shared"])
        with open(h.logs[-1]) as f:
            assert "(--vmm-uid-range shared)" in f.read()
    h.check("the default (1879048192:65536), the same given, another free range and 'shared' start",
            lambda: (default_range(), starts(h, ["--vmm-uid-range", "1879048192:65536"]),
                     starts(h, ["--vmm-uid-range", "1879179264:1000"]), shared()))

    def default_falls_back():
        # The default range refused (here: it holds the --vmm-user) is no reason not to
        # start: 'shared', with a warning that names what is in the way.
        starts(h, ["--vmm-user", "1879048300"])
        with open(h.logs[-1]) as f:
            log = f.read()
        assert "The default --vmm-uid-range 1879048192:65536 holds 1879048300" in log, log[-1500:]
        assert "(--vmm-uid-range shared)" in log, log[-1500:]
    h.check("a default range that collides falls back to 'shared' with a warning; a given one is refused",
            lambda: (default_falls_back(),
                     refused(h, ["--vmm-user", "1879048300", "--vmm-uid-range", "1879048192:65536"],
                             ["holds 1879048300,"])))

    h.check("a range with root, 65533 or nobody is refused",
            lambda: (refused(h, ["--vmm-uid-range", "0:1000"], ["holds 0,"]),
                     refused(h, ["--vmm-uid-range", "65500:100"], ["holds 65533,"]),
                     refused(h, ["--vmm-uid-range", "65534:1"], ["holds 65534,"])))

    h.check("a range with the --vmm-user's uid or gid is refused",
            lambda: (refused(h, ["--vmm-user", "1879048300", "--vmm-uid-range", "1879048192:65536"],
                             ["holds 1879048300,"]),
                     refused(h, ["--vmm-user", "65533:1879048301", "--vmm-uid-range", "1879048192:65536"],
                             ["holds 1879048301,"])))

    def users_and_groups():
        u = next(p for p in pwd.getpwall() if 0 < p.pw_uid < 65533)
        refused(h, ["--vmm-uid-range", f"{u.pw_uid}:1"], ["holds the id of user "])
        # a group whose gid no user has
        uids = {p.pw_uid for p in pwd.getpwall()}
        g = next((g for g in grp.getgrall() if 0 < g.gr_gid < 65533 and g.gr_gid not in uids), None)
        if g:
            refused(h, ["--vmm-uid-range", f"{g.gr_gid}:1"], [f"holds the id of group {g.gr_name} ({g.gr_gid})"])
    h.check("a range with an existing user's or group's id is refused, naming it", users_and_groups)

    h.check("malformed and overflowing ranges are refused",
            lambda: [refused(h, ["--vmm-uid-range", s], ["--vmm-uid-range"]) for s in
                     ("1879048192", "1879048192:0", "x:1", "1879048192:-1", "1879048192:1:1", "4294967296:1",
                      "4294967200:1000")])

    h.check("FORKD_VMM_UID_RANGE when the option is absent; the option wins",
            lambda: (refused(h, [], ["not '0:x'"], {"FORKD_VMM_UID_RANGE": "0:x"}),
                     starts(h, ["--vmm-uid-range", "shared"], {"FORKD_VMM_UID_RANGE": "0:x"})))

    h.check("--no-confine checks no range",
            lambda: starts(h, ["--no-confine", "--vmm-uid-range", "0:1000"]))

    h.check("a trusted bridge uid inside the range is refused",
            lambda: refused(h, ["--vmm-uid-range", "1879048192:1000", "--trusted-bridge-user", "1879048195"],
                            ["uid 1879048195 is one of --vmm-uid-range"]))

    h.check("forkd logged no sanitizer report", h.assert_no_sanitizer_report)
    print(f"1..{h.n}")
    return 1 if h.failed else 0


def main():
    if not tf.FORKD or not tf.VMM:
        print("Bail out! FORKD and FORKD_VMM must be set")
        return 1
    if os.geteuid() != 0:
        tf.skip("needs root (forkd confines VMMs only as root, and checks the range then)")
    h = tf.Harness()
    try:
        return run(h)
    finally:
        h.cleanup()


if __name__ == "__main__":
    sys.exit(main())
