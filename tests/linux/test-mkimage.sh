#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
# tools/mkimage (TAP): an unprivileged build (as nobody) and a root build give the
# same bytes (reproducible, and no root needed for the image itself); the root tree
# is trimmed to about 70 MiB; the image holds what the guest needs.
# Usage: test-mkimage.sh FORKD_AGENT
set -u
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
agent=${1:?usage: test-mkimage.sh FORKD_AGENT}
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }

[ "$(id -u)" = 0 ] || { echo "1..0 # SKIP needs root (to run a build as nobody)"; exit 0; }
id nobody >/dev/null 2>&1 || { echo "1..0 # SKIP no user nobody"; exit 0; }
command -v debugfs >/dev/null || { echo "1..0 # SKIP debugfs (e2fsprogs) is missing"; exit 0; }

t=$(mktemp -d /tmp/forkd-mkimage-test.XXXXXX)
trap 'rm -rf "$t"' EXIT
chmod 755 "$t"
mkdir "$t/nobody" && cp "$agent" "$t/agent" && chmod 755 "$t/agent"
# The packages are downloaded once: reuse what the main cache holds.
main_cache=${FORKD_IMAGE_CACHE:-/var/cache/forkd-image}
mkdir -p "$t/nobody/cache/debs"
cp "$main_cache"/debs/*.deb "$t/nobody/cache/debs/" 2>/dev/null
chown -R nobody:nogroup "$t/nobody"

"$top/tools/mkimage" --force --agent "$t/agent" --out "$t/root" >"$t/root.log" 2>&1
ok $? "root build"
setpriv --reuid=nobody --regid=nogroup --clear-groups \
	env -i PATH="$PATH" HOME="$t/nobody" FORKD_IMAGE_CACHE="$t/nobody/cache" \
	"$top/tools/mkimage" --agent "$t/agent" --out "$t/nobody/out" >"$t/nobody.log" 2>&1
rc=$?
ok $rc "unprivileged build (as nobody)"
[ $rc = 0 ] || sed 's/^/# /' "$t/nobody.log" | tail -n 15

same=0
for f in vmlinuz initrd.img rootfs.ext4 manifest.json; do
	a=$(sha256sum <"$t/root/$f" 2>/dev/null) b=$(sha256sum <"$t/nobody/out/$f" 2>/dev/null)
	[ -n "$a" ] && [ "$a" = "$b" ] || { same=1; echo "# $f differs"; }
done
ok $same "both builds give the same bytes (vmlinuz, initrd.img, rootfs.ext4, manifest.json)"

bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rootfs_tree"]["bytes"])' "$t/root/manifest.json" 2>/dev/null)
echo "# root tree: $((${bytes:-0} / 1048576)) MiB"
ok "$([ -n "$bytes" ] && [ "$bytes" -le $((80 << 20)) ]; echo $?)" "the root tree is trimmed to at most 80 MiB"

missing=
for p in /usr/sbin/forkd-agent /usr/bin/python3.11 /usr/bin/busybox \
	/usr/lib/python3/dist-packages/numpy/__init__.py /usr/lib/x86_64-linux-gnu/blas/libblas.so.3; do
	debugfs -R "stat $p" "$t/root/rootfs.ext4" 2>/dev/null | grep -q 'User: *0 *Group: *0' || missing+=" $p"
done
ok "$([ -z "$missing" ]; echo $?)" "forkd-agent, python3.11, busybox, numpy and the reference BLAS are in, owned by root${missing:+ (missing or not owned by root:$missing)}"
echo "1..$n"
exit $failed
