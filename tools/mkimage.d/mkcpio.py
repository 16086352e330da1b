#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Write a reproducible cpio archive (newc format) of a directory, gzip-compressed.

    mkcpio.py SRC OUT [--node PATH:TYPE:MAJOR:MINOR:MODE ...] [--mtime EPOCH] [--no-gzip]

Entries are sorted by path; owner is 0:0, every mtime is EPOCH, inode numbers are
sequential, so the same tree always gives the same bytes. --node adds a device node
(TYPE c or b) that an unprivileged build cannot create on disk, e.g. dev/console:c:5:1:600.
"""
import gzip
import os
import stat
import sys


def header(ino, mode, nlink, mtime, size, rmaj, rmin, name):
    fields = (ino, mode, 0, 0, nlink, mtime, size, 0, 0, rmaj, rmin, len(name) + 1, 0)
    return b"070701" + b"".join(b"%08X" % f for f in fields)


def pad4(n):
    return (4 - n % 4) % 4


def main(argv):
    args, nodes, mtime, compress = [], [], int(os.environ.get("SOURCE_DATE_EPOCH", "0")), True
    it = iter(argv)
    for a in it:
        if a == "--node":
            nodes.append(next(it))
        elif a == "--mtime":
            mtime = int(next(it))
        elif a == "--no-gzip":
            compress = False
        else:
            args.append(a)
    if len(args) != 2:
        sys.exit(__doc__)
    src, out = args

    entries = {}  # archive path -> (mode, data, rdev major, rdev minor)
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            path = os.path.normpath(os.path.join(rel, name))
            st = os.lstat(full)
            perm = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                entries[path] = (stat.S_IFDIR | perm, b"", 0, 0)
            elif stat.S_ISLNK(st.st_mode):
                entries[path] = (stat.S_IFLNK | 0o777, os.readlink(full).encode(), 0, 0)
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    entries[path] = (stat.S_IFREG | perm, f.read(), 0, 0)
            else:
                sys.exit(f"mkcpio: unsupported file type: {full}")
    for spec in nodes:
        path, kind, major, minor, mode = spec.split(":")
        fmt = {"c": stat.S_IFCHR, "b": stat.S_IFBLK}[kind]
        entries[os.path.normpath(path)] = (fmt | int(mode, 8), b"", int(major), int(minor))

    # Parents before children: sorting the paths does that, since "a" < "a/b".
    chunks = []
    for ino, path in enumerate(sorted(entries), start=1):
        mode, data, rmaj, rmin = entries[path]
        name = path.encode()
        nlink = 2 if stat.S_ISDIR(mode) else 1
        h = header(ino, mode, nlink, mtime, len(data), rmaj, rmin, name) + name + b"\0"
        chunks += [h, b"\0" * pad4(len(h)), data, b"\0" * pad4(len(data))]
    t = header(0, 0, 1, 0, 0, 0, 0, b"TRAILER!!!") + b"TRAILER!!!\0"
    chunks += [t, b"\0" * pad4(len(t))]
    blob = b"".join(chunks)
    if compress:
        blob = gzip.compress(blob, compresslevel=9, mtime=0)
    with open(out, "wb") as f:
        f.write(blob)


if __name__ == "__main__":
    main(sys.argv[1:])
