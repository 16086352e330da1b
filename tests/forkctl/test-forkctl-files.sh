#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# forkctl write-file and read-file (WriteFile, ReadFile) against the real forkd,
# real dbus-daemon and real /dev/kvm, brought up by tools/forkd-stack, on the test
# guest (its file table: 47-byte paths, 256 bytes a file): bytes in and out
# unchanged, stdin, --file-mode, --json, exit statuses, and a fork-sandbox child
# that inherits a file while its sibling's writes stay its own.
# usage: test-forkctl-files.sh FORKCTL SOURCE-ROOT   ($FORKD_BUILD_DIR: the build dir)
# Skips (77) when forkd is not built yet or /dev/kvm is missing.

set -u
forkctl=${1:?usage: test-forkctl-files.sh FORKCTL SOURCE-ROOT}
top=${2:?usage: test-forkctl-files.sh FORKCTL SOURCE-ROOT}
build=${FORKD_BUILD_DIR:?FORKD_BUILD_DIR must name the build dir}

skip() { echo "1..0 # SKIP $*"; exit 77; }
[ -x "$build/src/daemon/forkd" ] || skip "forkd is not built ($build/src/daemon/forkd)"
[ -c /dev/kvm ] || skip "no /dev/kvm"
[ "$(id -u)" = 0 ] || skip "needs root (forkd allows root without polkit)"
command -v python3 >/dev/null || skip "python3 (to parse --json) is missing"
pyq() {
        python3 -c 'import json, sys
j = json.load(open(sys.argv[2]) if len(sys.argv) > 2 else sys.stdin)
r = eval(sys.argv[1])
print("\n".join(map(str, r)) if isinstance(r, list) else r)
sys.exit(r is False)' "$@" 2>/dev/null
}

state=$(mktemp -d /tmp/forkctl-files.XXXXXX)
port=$((20000 + RANDOM % 12000)) # below the ephemeral ports (32768-60999), which clients hold
cleanup() {
        FORKD_BUILD_DIR=$build "$top/tools/forkd-stack" down --state-dir "$state" >/dev/null 2>&1
        rm -rf "$state"
}
trap cleanup EXIT

env_out=$(FORKD_BUILD_DIR=$build "$top/tools/forkd-stack" up --state-dir "$state" --port "$port" 2>"$state.up.log")
rc=$?
if [ $rc != 0 ]; then
        echo "1..1"; echo "not ok 1 - tools/forkd-stack up failed ($rc)"; sed 's/^/# /' "$state.up.log"; rm -f "$state.up.log"; exit 1
fi
rm -f "$state.up.log"
eval "$env_out"
export FORKD_BUS_ADDRESS

n=0; failed=0
ok()     { n=$((n + 1)); echo "ok $n - $*"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $*"; }
fc() { "$forkctl" --no-progress "$@" 2>"$state/err"; }

echo "1..14"
tag=files-$$
fc snapshot create "$tag" --kernel "$FORKD_GUEST_KERNEL" --rootfs "$FORKD_GUEST_ROOTFS" --boot-wait 60 >/dev/null ||
        { not_ok "snapshot create: $(cat "$state/err")"; exit 1; }
id=$(fc fork "$tag" --json | pyq "j['sandboxes'][0]['id']")
[ -n "$id" ] || { not_ok "fork: $(cat "$state/err")"; exit 1; }

# every byte value, NUL and a final byte without newline included
python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256)))' >"$state/all.bin"
fc write-file "$id" /root/all.bin "$state/all.bin" && fc read-file "$id" /root/all.bin >"$state/back.bin" &&
        cmp -s "$state/all.bin" "$state/back.bin" && ok "write-file LOCAL, read-file: 256 bytes unchanged" ||
        not_ok "round trip: $(cat "$state/err"; cmp "$state/all.bin" "$state/back.bin")"
printf 'from stdin\n' | fc write-file "$id" /tmp/s - && [ "$(fc read-file "$id" /tmp/s)" = "from stdin" ] &&
        printf 'no dash' | fc write-file "$id" /tmp/s && [ "$(fc read-file "$id" /tmp/s)" = "no dash" ] &&
        ok "write-file from standard input ('-' and no LOCAL)" || not_ok "stdin: $(cat "$state/err")"
: | fc write-file "$id" /tmp/empty && fc read-file "$id" /tmp/empty >"$state/out" && [ ! -s "$state/out" ] &&
        ok "an empty file" || not_ok "empty: $(cat "$state/err")"
fc write-file "$id" /tmp/j "$state/all.bin" --file-mode 600 --json >"$state/out" &&
        pyq "j == {'path': '/tmp/j', 'size': 256}" "$state/out" >/dev/null &&
        fc read-file "$id" /tmp/j --json >"$state/out" &&
        pyq "j['path'] == '/tmp/j' and j['size'] == 256 and __import__('base64').b64decode(j['data_b64']) == bytes(range(256))" \
                "$state/out" >/dev/null && ok "--json of both, --file-mode 600" || not_ok "json: $(cat "$state/out" "$state/err")"

# usage errors: exit 2, nothing sent
rcs=
for bad in 8 10000 -1 0x1 ""; do
        fc write-file "$id" /tmp/m "$state/all.bin" --file-mode "$bad"; rcs="$rcs$?"
done
fc read-file "$id" relative; rc1=$?
fc write-file "$id" /tmp/../x "$state/all.bin"; rc2=$?
fc read-file "$id" /tmp/x extra; rc3=$?
fc read-file "$id" /tmp/x --file-mode 644; rc4=$?
[ "$rcs" = 22222 ] && [ "$rc1$rc2$rc3$rc4" = 2222 ] && grep -q "file-mode" "$state/err" &&
        ! fc read-file "$id" /tmp/m 2>/dev/null && ok "bad --file-mode, relative and '..' paths, extra arguments: exit 2" ||
        not_ok "usage: $rcs $rc1 $rc2 $rc3 $rc4 $(cat "$state/err")"

# the guest's refusals: exit 1 with forkd's message naming the path
fc read-file "$id" /root/nosuch; rc=$?
[ $rc = 1 ] && grep -q "/root/nosuch: No such file or directory" "$state/err" && ok "read-file of a missing file: exit 1, names it" ||
        not_ok "missing: rc=$rc $(cat "$state/err")"
fc read-file "$id" /root; rc=$?
[ $rc = 1 ] && grep -q "/root: Is a directory" "$state/err" && ok "read-file of a directory: exit 1" ||
        not_ok "directory: rc=$rc $(cat "$state/err")"
head -c 300 /dev/zero | fc write-file "$id" /tmp/big; rc=$?
[ $rc = 1 ] && grep -q "File too large" "$state/err" && ok "over the test guest's 256 bytes: exit 1, File too large" ||
        not_ok "guest cap: rc=$rc $(cat "$state/err")"
head -c $((512 * 1024 + 1)) /dev/zero >"$state/huge"
fc write-file "$id" /tmp/big "$state/huge"; rc=$?
[ $rc = 1 ] && grep -q "more than 524288 bytes" "$state/err" && ok "LOCAL over 512 KiB: exit 1 before any call" ||
        not_ok "cap: rc=$rc $(cat "$state/err")"
fc write-file "$id" /tmp/x "$state/nosuch"; rc=$?
[ $rc = 1 ] && grep -q "cannot open" "$state/err" && ok "a missing LOCAL: exit 1" || not_ok "local: rc=$rc $(cat "$state/err")"
fc read-file sb-nosuch /tmp/x; rc=$?
[ $rc = 3 ] && grep -q "sb-nosuch" "$state/err" && ok "an unknown sandbox: exit 3" || not_ok "unknown: rc=$rc $(cat "$state/err")"

# a running sandbox's fork: both children see the file, each one's writes are its own
fc write-file "$id" /root/shared - <<<"parent" && fc fork-sandbox "$id" -n 2 --json >"$state/out" &&
        mapfile -t kids < <(pyq "[s['id'] for s in j['sandboxes']]" "$state/out") && [ ${#kids[@]} = 2 ] &&
        [ "$(fc read-file "${kids[0]}" /root/shared)" = parent ] && [ "$(fc read-file "${kids[1]}" /root/shared)" = parent ] &&
        ok "fork-sandbox: the children read the parent's file" || { not_ok "fork-sandbox: $(cat "$state/out" "$state/err")"; kids=(x x); }
fc write-file "${kids[0]}" /root/shared - <<<"kid" && [ "$(fc read-file "${kids[0]}" /root/shared)" = kid ] &&
        [ "$(fc read-file "${kids[1]}" /root/shared)" = parent ] && [ "$(fc read-file "$id" /root/shared)" = parent ] &&
        ok "a child's write stays its own (sibling and parent unchanged)" || not_ok "isolation: $(cat "$state/err")"

"$forkctl" --help | grep -q "write-file ID PATH" && ok "--help lists write-file" || not_ok "--help"
fc kill "$id" "${kids[@]}" >/dev/null
[ $failed = 0 ]
