#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
# fix-times.sh IMAGE TREE EPOCH: set atime and ctime of every file of TREE inside the
# ext4 IMAGE to EPOCH. mke2fs -d copies them from the host, where they are the times
# of unpacking and reading; mtime and crtime are already right.
set -euo pipefail
img=$1 tree=$2 epoch=$3
cmds=$(mktemp)
trap 'rm -f "$cmds"' EXIT
(cd "$tree" && find . -print0 | LC_ALL=C sort -z) | while IFS= read -r -d '' p; do
	p=${p#.}
	p=${p:-/}
	case "$p" in *'"'*) echo "fix-times: unsupported name: $p" >&2; exit 1 ;; esac
	printf 'sif "%s" atime @%s\nsif "%s" ctime @%s\n' "$p" "$epoch" "$p" "$epoch"
done >"$cmds"
out=$(debugfs -w -f "$cmds" "$img" 2>&1 >/dev/null | grep -v '^debugfs ' || true)
if [ -n "$out" ]; then
	echo "$out" | head -n 20 >&2
	exit 1
fi
