# SPDX-License-Identifier: LGPL-2.1-or-later
"""Our Python SDK's test with the Linux guest (part of test-linux-guest.py)."""
import os
import re
import subprocess
import sys


def sdk_python(t, top, stack, image, env):
    """Our Python SDK's test (sdk/python/tests/test-sdk.py) with the Linux guest,
    against this stack: run_code in CPython, exec, files, fork, diff, merge,
    branch, pack/unpack and the tree-search example of sdk/python/README.md.
    Each of its TAP lines becomes one of ours."""
    senv = dict(env, FORKD_SDK_EXTERNAL="1", FORKD_SDK_GUEST="linux", FORKD_URL=stack["FORKD_URL"],
                FORKD_TOKEN_FILE=stack["FORKD_TOKEN_FILE"], FORKD_GUEST_KERNEL=f"{image}/vmlinuz",
                FORKD_GUEST_ROOTFS=f"{image}/rootfs.ext4")
    # the SDK from this checkout, and tests/lib (tap, and test-rest.py's imports)
    senv["PYTHONPATH"] = os.pathsep.join(p for p in (f"{top}/sdk/python", env.get("PYTHONPATH")) if p)
    try:
        p = subprocess.run([sys.executable, f"{top}/sdk/python/tests/test-sdk.py"], env=senv,
                           capture_output=True, text=True, timeout=1200)
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), -1
    seen = 0
    for line in out.splitlines():
        m = re.match(r"(not ok|ok) \d+ - (.*)", line)
        if m:
            seen += 1
            what, _, why = m.group(2).partition(" # SKIP")
            if why:
                # the SDK test's own skip (https:// needs a TLS forkd-rest), passed on as a skip
                t.skip("sdk (Linux guest): " + what, why.strip())
            else:
                t.ok(m.group(1) == "ok", "sdk (Linux guest): " + what)
    t.ok(rc == 0 and seen > 0, f"sdk/python/tests/test-sdk.py with the Linux guest: exit {rc}, {seen} subtests",
         out[-3000:] if rc != 0 else None)
