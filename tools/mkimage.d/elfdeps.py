#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Check that every ELF file in a root tree finds its shared libraries inside the tree.

    elfdeps.py TREE [--prune DIR ...]

Libraries are looked up as the guest's loader would: RUNPATH/RPATH ($ORIGIN expanded),
then the multiarch directories. A Python extension module under a --prune directory
(relative to TREE) whose libraries are missing is deleted (e.g. _curses without
ncurses) and reported; any other unresolved library is an error (exit 1).
Prints the libraries that are used, one per line, on stdout.
"""
import os
import subprocess
import sys

LIBDIRS = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib", "usr/lib"]


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def dynamic(path):
    out = subprocess.run(["readelf", "-dW", path], capture_output=True, text=True).stdout
    needed, runpath = [], []
    for line in out.splitlines():
        if "(NEEDED)" in line:
            needed.append(line.split("[", 1)[1].rstrip("]"))
        elif "(RUNPATH)" in line or "(RPATH)" in line:
            runpath += line.split("[", 1)[1].rstrip("]").split(":")
    return needed, runpath


def resolve(tree, path, lib, runpath):
    origin = "/" + os.path.relpath(os.path.dirname(path), tree)
    for d in [r.replace("$ORIGIN", origin) for r in runpath] + ["/" + d for d in LIBDIRS]:
        cand = os.path.join(tree, d.lstrip("/"), lib)
        # Follow symlinks inside the tree (absolute targets are relative to the tree).
        for _ in range(40):
            if not os.path.islink(cand):
                break
            t = os.readlink(cand)
            cand = os.path.join(tree, t.lstrip("/")) if t.startswith("/") else os.path.join(os.path.dirname(cand), t)
        if os.path.isfile(cand):
            return cand
    return None


def main(argv):
    tree, prune = argv[0], []
    i = 1
    while i < len(argv):
        if argv[i] == "--prune":
            prune.append(argv[i + 1].strip("/"))
            i += 2
        else:
            sys.exit(__doc__)
    tree = os.path.abspath(tree)
    changed = True
    used, errors = set(), []
    while changed:  # deleting a module can make nothing else unresolved, but be safe
        changed, used, errors = False, set(), []
        for dirpath, _, files in os.walk(tree):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                if os.path.islink(path) or not is_elf(path):
                    continue
                needed, runpath = dynamic(path)
                missing = []
                for lib in needed:
                    r = resolve(tree, path, lib, runpath)
                    if r:
                        used.add(os.path.relpath(r, tree))
                    else:
                        missing.append(lib)
                if not missing:
                    continue
                rel = os.path.relpath(path, tree)
                if any(rel.startswith(p + "/") for p in prune) and ".cpython-" in name:
                    print(f"elfdeps: dropping {rel} (needs {', '.join(missing)})", file=sys.stderr)
                    os.unlink(path)
                    changed = True
                else:
                    errors.append(f"{rel}: missing {', '.join(missing)}")
    for e in errors:
        print(f"elfdeps: error: {e}", file=sys.stderr)
    for u in sorted(used):
        print(u)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
