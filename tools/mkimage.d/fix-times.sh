#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
# fix-times.sh IMAGE TREE EPOCH: set atime and ctime of every file of TREE inside the
# ext4 IMAGE to EPOCH, and its owner to root. mke2fs -d copies them from the host,
# where they are the times of unpacking and reading and the user who unpacked (not
# root when the image is built without privileges); mtime and crtime are already
# right, and every file of the packages in the tree belongs to root.
set -euo pipefail
img=$1 tree=$2 epoch=$3
cmds=$(mktemp)
trap 'rm -f "$cmds"' EXIT
(cd "$tree" && find . -print0 | LC_ALL=C sort -z) | while IFS= read -r -d '' p; do
	p=${p#.}
	p=${p:-/}
	case "$p" in *'"'*) echo "fix-times: unsupported name: $p" >&2; exit 1 ;; esac
	printf 'sif "%s" atime @%s\nsif "%s" ctime @%s\n' "$p" "$epoch" "$p" "$epoch"
	printf 'sif "%s" uid 0\nsif "%s" gid 0\n' "$p" "$p"
done >"$cmds"
out=$(debugfs -w -f "$cmds" "$img" 2>&1 >/dev/null | grep -v '^debugfs ' || true)
if [ -n "$out" ]; then
	echo "$out" | head -n 20 >&2
	exit 1
fi
