#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# forkctl through the whole flow against the real forkd, real dbus-daemon and
# real /dev/kvm, brought up by tools/forkd-stack: snapshot create (test guest),
# snapshot ls/info, fork, ls --json parses, ping, kill, errors that name the
# fix (a guest that triple-faults at boot among them), snapshot rm.
# usage: test-forkctl-flow.sh FORKCTL SOURCE-ROOT   ($FORKD_BUILD_DIR: the build dir)
# Skips (77) when forkd is not built yet or /dev/kvm is missing.

set -u
forkctl=${1:?usage: test-forkctl-flow.sh FORKCTL SOURCE-ROOT}
top=${2:?usage: test-forkctl-flow.sh FORKCTL SOURCE-ROOT}
build=${FORKD_BUILD_DIR:?FORKD_BUILD_DIR must name the build dir}

skip() { echo "1..0 # SKIP $*"; exit 77; }
[ -x "$build/src/daemon/forkd" ] || skip "forkd is not built ($build/src/daemon/forkd)"
[ -c /dev/kvm ] || skip "no /dev/kvm"
[ "$(id -u)" = 0 ] || skip "needs root (forkd allows root without polkit)"
jsonok() { python3 -c 'import json, sys; json.load(sys.stdin)' 2>/dev/null; }
# jq is not among the dependencies: pyq EXPR [FILE] prints EXPR evaluated on the
# JSON document j (lists one item per line) and fails when it is False.
pyq() {
        python3 -c 'import json, sys
j = json.load(open(sys.argv[2]) if len(sys.argv) > 2 else sys.stdin)
r = eval(sys.argv[1])
print("\n".join(map(str, r)) if isinstance(r, list) else r)
sys.exit(r is False)' "$@" 2>/dev/null
}
command -v python3 >/dev/null || skip "python3 (to parse --json) is missing"

state=$(mktemp -d /tmp/forkctl-flow.XXXXXX)
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

echo "1..28"
tag=flow-$$
if fc snapshot create "$tag" --kernel "$FORKD_GUEST_KERNEL" --rootfs "$FORKD_GUEST_ROOTFS" --boot-wait 240 --json >"$state/out" && jsonok <"$state/out"; then
        ok "snapshot create $tag (--json parses)"
else
        not_ok "snapshot create: $(cat "$state/err")"; sed 's/^/# /' "$state/forkd.log" | tail -20
fi

fc snapshot ls --json >"$state/out" && jsonok <"$state/out" &&
        pyq "'$tag' in [s['tag'] for s in j['snapshots']]" "$state/out" >/dev/null \
        && ok "snapshot ls --json lists it" || not_ok "snapshot ls --json: $(cat "$state/out" "$state/err")"
fc snapshot ls | grep -q "^$tag " && ok "snapshot ls table lists it" || not_ok "snapshot ls table"
fc snapshot info "$tag" | grep -q "tag: $tag" && ok "snapshot info" || not_ok "snapshot info: $(cat "$state/err")"

fc fork "$tag" -n 3 --json >"$state/fork.json"
if jsonok <"$state/fork.json" && [ "$(pyq "len(j['sandboxes'])" "$state/fork.json")" = 3 ]; then
        ok "fork -n 3 --json gives 3 sandboxes"
else
        not_ok "fork -n 3: $(cat "$state/fork.json" "$state/err")"
fi
mapfile -t ids < <(pyq "[s['id'] for s in j['sandboxes']]" "$state/fork.json")

fc ls --json >"$state/ls.json" && jsonok <"$state/ls.json" && ok "ls --json parses" || not_ok "ls --json"
[ "$(pyq "len(j['sandboxes'])" "$state/ls.json")" = 3 ] && ok "ls shows the 3 sandboxes" || not_ok "ls count: $(cat "$state/ls.json")"
fc ls | head -1 | grep -q '^ID  *SNAPSHOT  *STATE' && ok "ls table has a header" || not_ok "ls table"
[ "$(pyq "all('cpu_usec' in s['usage'] for s in j['sandboxes'])" "$state/ls.json")" = True ] \
        && ok "ls --json has each sandbox's usage" || not_ok "ls usage: $(cat "$state/ls.json")"

# top --once: one table of the 3, sorted by CPU; --json with --once only; a bad --sort is a usage error
fc top --once >"$state/top" && head -1 "$state/top" | grep -q '^ID  *STATE  *CPU%  *MEM PRIVATE' &&
        [ "$(grep -c '^sb-' "$state/top")" = 3 ] && ok "top --once prints a table of the 3" \
        || not_ok "top --once: $(cat "$state/top" "$state/err")"
if fc top --once --json --sort mem >"$state/top.json" &&
        pyq "len(j['sandboxes']) == 3 and all(k in s for s in j['sandboxes'] for k in ('id', 'cpu_percent', 'memory_private_kib', 'memory_shared_kib', 'disk_bytes_per_sec', 'net_bytes_per_sec')) and [s['memory_private_kib'] for s in j['sandboxes']] == sorted([s['memory_private_kib'] for s in j['sandboxes']], reverse=True)" \
                "$state/top.json" | grep -q True; then
        ok "top --once --json --sort mem: the 3, largest first"
else
        not_ok "top --once --json: $(cat "$state/top.json" "$state/err")"
fi
fc top --json; rc=$?
[ $rc = 2 ] && grep -q -- "--json goes with --once" "$state/err" && ok "top --json without --once: usage error" \
        || not_ok "top --json: rc=$rc $(cat "$state/err")"

if [ ${#ids[@]} -ge 1 ] && fc ping "${ids[0]}" --json >"$state/out" && pyq "j['pong'] is True" "$state/out" >/dev/null; then
        ok "ping ${ids[0]} answers pong"
else
        not_ok "ping: $(cat "$state/out" "$state/err")"
fi

# branch a running sandbox: the new snapshot forks; an unknown id exits 3; --no-wait needs live
if fc branch "${ids[0]:-none}" --tag "$tag-br" --json >"$state/br.json" &&
        pyq "j['tag'] == '$tag-br' and j['branched_from'] == '${ids[0]:-none}' and j['status'] == 'ready' and 'pause_ms' in j" \
                "$state/br.json" >/dev/null; then
        ok "branch ${ids[0]:-none} --tag $tag-br --json: SnapshotInfo with branched_from, pause_ms, status"
else
        not_ok "branch: $(cat "$state/br.json" "$state/err")"
fi
fc fork "$tag-br" --json >"$state/brf.json" && bid=$(pyq "j['sandboxes'][0]['id']" "$state/brf.json") &&
        fc ping "$bid" >/dev/null && fc kill "$bid" && ok "fork of the branch answers" || not_ok "fork of branch: $(cat "$state/err")"
fc branch sb-000000-0000; rc=$?
[ $rc = 3 ] && ok "branch of an unknown sandbox: exit 3" || not_ok "branch unknown: rc=$rc $(cat "$state/err")"
fc branch "${ids[0]:-none}" --no-wait; rc=$?
[ $rc = 2 ] && grep -q -- "--no-wait needs --mode live" "$state/err" && ok "branch --no-wait without live: usage error" \
        || not_ok "branch --no-wait: rc=$rc $(cat "$state/err")"
fc snapshot rm "$tag-br" >/dev/null
# fork a running sandbox
if fc fork-sandbox "${ids[0]:-none}" -n 2 --json >"$state/fs.json" &&
        pyq "len(j['sandboxes']) == 2 and j['parent_pause_us'] > 0" "$state/fs.json" >/dev/null; then
        ok "fork-sandbox ${ids[0]:-none} -n 2 --json: 2 sandboxes and the parent's pause"
        mapfile -t fids < <(pyq "[s['id'] for s in j['sandboxes']]" "$state/fs.json")
        fc kill "${fids[@]}"
else
        not_ok "fork-sandbox: $(cat "$state/fs.json" "$state/err")"
fi
fc fork-sandbox "${ids[0]:-none}" -n 33; rc=$?
[ $rc = 2 ] && ok "fork-sandbox -n 33: usage error" || not_ok "fork-sandbox -n 33: rc=$rc $(cat "$state/err")"

# kill of many ids at once (sent together): an unknown one among them is named, in the
# order given, and does not keep the others alive
fc kill "${ids[2]:-none}" sb-000000-9999 --json >"$state/kill.json"; rc=$?
[ $rc = 3 ] && pyq "j['terminated'] == ['${ids[2]:-none}'] and [f['id'] for f in j['failed']] == ['sb-000000-9999']" \
        "$state/kill.json" >/dev/null && grep -q "sb-000000-9999" "$state/err" \
        && ok "kill of a live and an unknown id: exit 3, the live one gone, the unknown one named" \
        || not_ok "kill live + unknown: rc=$rc $(cat "$state/kill.json" "$state/err")"
fc kill "${ids[0]:-none}" "${ids[1]:-none}" && ok "kill ${ids[0]:-none} ${ids[1]:-none}" || not_ok "kill: $(cat "$state/err")"
[ "$(fc ls --json | pyq "len(j['sandboxes'])")" = 0 ] && ok "no sandboxes left" || not_ok "sandboxes left after kill"

fc ping "${ids[0]:-none}"; rc=$?
[ $rc = 3 ] && grep -q "no sandbox '${ids[0]:-none}'.*forkctl ls" "$state/err" && ok "ping of a dead sandbox: exit 3, says what to do" \
        || not_ok "ping dead: rc=$rc $(cat "$state/err")"
fc fork no-such-tag; rc=$?
[ $rc = 3 ] && grep -qF "no snapshot 'no-such-tag'; list them with 'forkctl snapshot ls'" "$state/err" \
        && ok "fork of an unknown tag: exit 3, says what to do" || not_ok "fork unknown: rc=$rc $(cat "$state/err")"
fc snapshot create "$tag" --kernel "$FORKD_GUEST_KERNEL" --rootfs "$FORKD_GUEST_ROOTFS"; rc=$?
[ $rc != 0 ] && grep -q "already exists" "$state/err" && ok "snapshot create of an existing tag refused" \
        || not_ok "duplicate create: rc=$rc $(cat "$state/err")"
# tests/guest/triple-fault.S: prints two lines and triple-faults at once.
fc snapshot create "$tag-tf" --kernel "$build/tests/guest/forkd-triple-fault.elf" --rootfs "$FORKD_GUEST_ROOTFS"; rc=$?
[ $rc = 1 ] && grep -qF "the guest crashed during boot (triple fault)" "$state/err" \
        && grep -qx "  forkd-triple-fault: loading an empty IDT, then faulting" "$state/err" \
        && ok "snapshot create of a guest that triple-faults: exit 1, the crash and its console lines" \
        || not_ok "triple fault: rc=$rc $(cat "$state/err")"

fc snapshot rm "$tag" && ok "snapshot rm" || not_ok "snapshot rm: $(cat "$state/err")"
fc snapshot info "$tag"; rc=$?
[ $rc = 3 ] && ok "snapshot info after rm: exit 3" || not_ok "info after rm: rc=$rc $(cat "$state/err")"

[ "$failed" = 0 ]
