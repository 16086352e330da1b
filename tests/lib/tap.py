# SPDX-License-Identifier: LGPL-2.1-or-later
"""TAP output for the Python tests (meson's protocol : 'tap').

Two styles, one counter:

  tap = Tap()
  tap.run("name", fn, *args)       # fn raises AssertionError (check()) to fail,
                                   # Skip("why") to skip; anything else fails too,
                                   # with its traceback as diagnostics
  tap.ok(cond, "what", detail)     # a plain assertion; detail is shown on failure
  tap.skip("what", "why")          # ok N - what # SKIP why
  tap.note("text")                 # diagnostics, "# " before each line
  tap.bail("why")                  # Bail out! and exit 1
  sys.exit(tap.done())             # the plan "1..N" last; 1 if any test failed

skip_all(why) prints the plan of a test that cannot run here ("1..0 # SKIP why")
and exits. Every line is flushed at once, so a test killed by its timeout still
shows how far it got.
"""

import sys
import traceback


class Skip(Exception):
    """Raised by a Tap.run() function: the test is reported as skipped."""


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def skip_all(why, status=77):
    print(f"1..0 # SKIP {why}", flush=True)
    sys.exit(status)


def note(text, prefix="# "):
    for line in str(text).splitlines():
        print(f"{prefix}{line}", flush=True)


class Tap:
    """The test counter. A failed ok()'s detail is shown as diagnostics:
    detail_prefix before each line, at most detail_lines lines of it (the last
    ones, or the first ones with detail_head=True)."""

    def __init__(self, detail_prefix="#   ", detail_lines=30, detail_head=False):
        self.n = 0
        self.failed = 0
        self.detail_prefix = detail_prefix
        self.detail_lines = detail_lines
        self.detail_head = detail_head

    def run(self, name, fn, *args):
        self.n += 1
        try:
            fn(*args)
            print(f"ok {self.n} - {name}", flush=True)
        except Skip as e:
            print(f"ok {self.n} - {name} # SKIP {e}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every failure, keep going
            self.failed += 1
            print(f"not ok {self.n} - {name}", flush=True)
            note(f"{type(e).__name__}: {e}\n" + traceback.format_exc())

    def ok(self, cond, what, detail=None, todo=None):
        """todo: a known bug; its failure is TAP's "not ok ... # TODO" (meson:
        expected fail), shown with its detail, not counted as a failure."""
        self.n += 1
        if cond:
            print(f"ok {self.n} - {what}" + (f" # TODO {todo}" if todo else ""), flush=True)
        elif todo:
            print(f"not ok {self.n} - {what} # TODO {todo}", flush=True)
        else:
            self.failed += 1
            print(f"not ok {self.n} - {what}", flush=True)
        if not cond and detail is not None:
            lines = str(detail).splitlines()
            lines = lines[:self.detail_lines] if self.detail_head else lines[-self.detail_lines:]
            for line in lines:
                print(f"{self.detail_prefix}{line}", flush=True)
        return cond

    def skip(self, what, why):
        self.n += 1
        print(f"ok {self.n} - {what} # SKIP {why}", flush=True)

    def note(self, text):
        note(text)

    def bail(self, why):
        print(f"Bail out! {why}", flush=True)
        sys.exit(1)

    def done(self):
        print(f"1..{self.n}", flush=True)
        return 1 if self.failed else 0
