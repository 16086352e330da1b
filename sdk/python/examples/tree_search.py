#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Tree search with forkd (Podflare's fork-and-merge pattern): load the data once
in a parent sandbox, fork one child per hypothesis, run each, keep the best
child's state in the parent with merge_into, close the rest.

    FORKD_URL=http://127.0.0.1:8889 FORKD_TOKEN=... tree_search.py SNAPSHOT_TAG

The snapshot is one of forkd's Linux guest (tools/mkimage: CPython 3.11 and
numpy; no pandas, so the data is a numpy array). --guest test runs the same
search in the test guest's tiny run_code language (tests/guest/files.c), so
that the test suite can run this script where Linux cannot boot.
"""

import argparse
import os
import sys

# The in-tree package, when the SDK is not installed (or PYTHONPATH=sdk/python).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from forkd import Sandbox  # noqa: E402

PYTHON = {
    "setup": (
        "import numpy as np\n"
        "rng = np.random.default_rng(4)\n"
        "data = rng.normal(loc=[0.0, 1.0, -2.0], scale=[1.0, 0.5, 3.0], size=(10000, 3))\n"
    ),
    # Five hypotheses; each names itself in `choice` and prints its score.
    "plans": [
        "choice = 'mean of column 0'; print(float(data[:, 0].mean()))",
        "choice = 'mean of column 1'; print(float(data[:, 1].mean()))",
        "choice = 'mean of column 2'; print(float(data[:, 2].mean()))",
        "choice = 'spread of column 2'; print(float(data[:, 2].std()))",
        "choice = 'share of column 1 above 0'; print(float((data[:, 1] > 0).mean()))",
    ],
    "show": "print(choice)",
}

# The same search in the test guest's language: variables hold text, print shows one.
TEST_GUEST = {
    "setup": "data = loaded",
    "plans": [
        "choice = mean of column 0; score = 0.01; print score",
        "choice = mean of column 1; score = 1.0; print score",
        "choice = mean of column 2; score = -2.0; print score",
        "choice = spread of column 2; score = 3.0; print score",
        "choice = share of column 1 above 0; score = 0.98; print score",
    ],
    "show": "print choice",
}


def pick_best_index(results):
    """The plan with the highest score; a plan that failed scores nothing."""
    scores = []
    for r in results:
        try:
            scores.append(float(r.stdout.split()[-1]) if r.error is None else float("-inf"))
        except (IndexError, ValueError):
            scores.append(float("-inf"))
    return max(range(len(scores)), key=scores.__getitem__)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot", nargs="?", default=os.environ.get("FORKD_SNAPSHOT"),
                    help="the snapshot to start from (default $FORKD_SNAPSHOT)")
    ap.add_argument("--guest", choices=("linux", "test"), default="linux")
    args = ap.parse_args()
    if not args.snapshot:
        ap.error("no snapshot: pass SNAPSHOT_TAG or set FORKD_SNAPSHOT")
    lang = PYTHON if args.guest == "linux" else TEST_GUEST

    with Sandbox.create(args.snapshot) as parent:
        r = parent.run_code(lang["setup"])
        if r.error:
            sys.exit(f"setup failed: {r.error}")

        plans = lang["plans"]
        children = parent.fork(n=len(plans))
        try:
            results = [c.run_code(p) for c, p in zip(children, plans)]
            for i, r in enumerate(results):
                print(f"plan {i}: {r.stdout.strip() or r.error}")
            best = pick_best_index(results)
            winner = children[best]
            parent.merge_into(winner)
        finally:
            for c in children:
                c.close()

        # The parent now drives the winner's VM: its globals are the winner's.
        chosen = parent.run_code(lang["show"]).stdout.strip()
        print(f"winner: plan {best} ({chosen})")
        print(f"parent {parent.id} kept the winner's state")


if __name__ == "__main__":
    main()
