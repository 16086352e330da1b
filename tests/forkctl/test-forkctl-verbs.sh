#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# forkctl run, diff and merge against the real forkd, real dbus-daemon and
# real /dev/kvm, brought up by tools/forkd-stack, on the test guest (its run_code
# language and file table): tables, --json, exit statuses and usage errors; and
# exec --follow, ps, signal and logs on the test guest's processes (its ticker,
# sleep and scripts).
# usage: test-forkctl-verbs.sh FORKCTL SOURCE-ROOT   ($FORKD_BUILD_DIR: the build dir)
# Skips (77) when forkd is not built yet or /dev/kvm is missing.

set -u
forkctl=${1:?usage: test-forkctl-verbs.sh FORKCTL SOURCE-ROOT}
top=${2:?usage: test-forkctl-verbs.sh FORKCTL SOURCE-ROOT}
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

state=$(mktemp -d /tmp/forkctl-verbs.XXXXXX)
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

echo "1..33"
tag=verbs-$$
fc snapshot create "$tag" --kernel "$FORKD_GUEST_KERNEL" --rootfs "$FORKD_GUEST_ROOTFS" --boot-wait 60 >/dev/null ||
        { not_ok "snapshot create: $(cat "$state/err")"; exit 1; }
fc fork "$tag" -n 3 --json >"$state/fork.json"
mapfile -t ids < <(pyq "[s['id'] for s in j['sandboxes']]" "$state/fork.json")
mapfile -t pids < <(pyq "[s['pid'] for s in j['sandboxes']]" "$state/fork.json")
[ ${#ids[@]} = 3 ] && ok "fork -n 3" || { not_ok "fork: $(cat "$state/fork.json" "$state/err")"; exit 1; }
p=${ids[0]} w=${ids[1]} s=${ids[2]}

# run: the agent's answer; state kept across calls
fc run "$p" 'x = 41; write /root/p.txt parent' >/dev/null && fc run "$p" --timeout 5 'print x' --json >"$state/out" &&
        pyq "j['stdout'] == '41\n' and j['exit_code'] == 0 and j['error'] is None" "$state/out" >/dev/null \
        && ok "run keeps x across calls (--timeout, --json)" || not_ok "run: $(cat "$state/out" "$state/err")"
fc run "$p" --timeout 3601 'print x'; rc=$?
[ $rc = 2 ] && grep -q -- "--timeout" "$state/err" && ok "run --timeout 3601: usage error" || not_ok "run --timeout 3601: rc=$rc"

# diff: + added in OTHER, - removed (only in ID), ~ modified
fc run "$w" 'write /root/w.txt winner; write /tmp/m one; x = winner' >/dev/null
fc run "$s" 'write /tmp/m two' >/dev/null
fc run "$p" 'write /tmp/m one' >/dev/null
out=$(fc diff "$p" "$w")
[ "$out" = "$(printf '+ /root/w.txt\n- /root/p.txt')" ] && ok "diff: + and - lines" || not_ok "diff: '$out' $(cat "$state/err")"
fc diff "$w" "$s" /tmp --json >"$state/out" &&
        pyq "j == {'added': [], 'removed': [], 'modified': ['/tmp/m']}" "$state/out" >/dev/null \
        && ok "diff PATH --json: modified" || not_ok "diff --json: $(cat "$state/out" "$state/err")"
fc diff "$p" "$w" relative; rc=$?
[ $rc = 1 ] && grep -q "normalized" "$state/err" && ok "diff with a relative path: exit 1, says why" \
        || not_ok "diff relative: rc=$rc $(cat "$state/err")"
fc diff "$p" sb-nosuch; rc=$?
[ $rc = 3 ] && grep -q "sb-nosuch" "$state/err" && ok "diff with an unknown other: exit 3, names it" \
        || not_ok "diff unknown: rc=$rc $(cat "$state/err")"

# merge: p drives w's VM, w is gone, p's old VM is gone
fc merge "$p" "$w" --json >"$state/out" && pyq "j['id'] == '$p' and j['pid'] == ${pids[1]}" "$state/out" >/dev/null \
        && ok "merge: $p now has the winner's pid" || not_ok "merge: $(cat "$state/out" "$state/err")"
[ "$(fc run "$p" 'print x' --json | pyq "j['stdout']")" = winner ] && ! kill -0 "${pids[0]}" 2>/dev/null \
        && ok "after merge: $p runs the winner's state, its old VM is gone" || not_ok "after merge: $(cat "$state/err")"
fc ping "$w"; rc=$?
[ $rc = 3 ] && ok "the winner's id: exit 3" || not_ok "ping winner: rc=$rc $(cat "$state/err")"
fc merge "$p" "$p"; rc=$?
[ $rc = 1 ] && grep -q "another sandbox" "$state/err" && ok "merge into itself: exit 1, says why" || not_ok "merge self: rc=$rc $(cat "$state/err")"
fc merge "$p" "$w"; rc=$?
[ $rc = 3 ] && grep -q "'$w'" "$state/err" && ok "merge with a gone winner: exit 3, names it" \
        || not_ok "merge gone: rc=$rc $(cat "$state/err")"
fc merge "$p" "$s" | grep -q "^$p " && ok "merge table names $p" || not_ok "merge table: $(cat "$state/err")"

# chains: rm with dependents, --force, --cascade; compact; snapshot diff
fc branch "$p" --tag "$tag-d1" --mode diff >/dev/null && c=$(fc fork "$tag-d1" --json | pyq "j['sandboxes'][0]['id']") &&
        fc branch "$c" --tag "$tag-d2" --mode diff >/dev/null && fc kill "$c" >/dev/null &&
        ok "a chain $tag <- $tag-d1 <- $tag-d2" || not_ok "chain: $(cat "$state/err")"
fc snapshot info "$tag-d2" >"$state/out" &&
        grep -qE "^ *ancestors: $tag, $tag-d1 \(root first, the parent last\)$" "$state/out" &&
        grep -qE "^ *chain_depth: 2$" "$state/out" && fc snapshot info "$tag" >"$state/out" &&
        grep -qE "^ *dependents: $tag-d1 \(snapshot rm refuses" "$state/out" &&
        ok "snapshot info: ancestors root first, chain_depth, dependents" || not_ok "info: $(cat "$state/out")"
fc snapshot rm "$tag"; rc=$?
[ $rc = 1 ] && grep -qF "is the parent of 1 chained snapshot(s): [$tag-d1]" "$state/err" &&
        grep -qF -- "--cascade" "$state/err" && ok "snapshot rm of a parent: exit 1, names its dependents" \
        || not_ok "rm parent: rc=$rc $(cat "$state/err")"
fc snapshot compact "$tag-d2" --to "$tag-flat" --json >"$state/out" &&
        pyq "j['tag'] == '$tag-flat' and 'parent_tag' not in j" "$state/out" >/dev/null &&
        [ "$(fc snapshot info "$tag-flat" --json | pyq "j['chain_depth']")" = 0 ] &&
        fc fork "$tag-flat" --json >"$state/out" && fc kill "$(pyq "j['sandboxes'][0]['id']" "$state/out")" >/dev/null \
        && ok "snapshot compact: a flat snapshot that forks" || not_ok "compact: $(cat "$state/out" "$state/err")"
fc snapshot compact "$tag-d2" --to "$tag-d2"; rc=$?
[ $rc = 2 ] && grep -q -- "--to must name a new snapshot" "$state/err" && ok "compact --to itself: usage error" \
        || not_ok "compact to itself: rc=$rc $(cat "$state/err")"
fc snapshot compact "$tag-d2" --to "$tag-flat"; rc=$?
[ $rc = 1 ] && grep -q "already exists" "$state/err" && ok "compact to an existing tag: exit 1" \
        || not_ok "compact existing: rc=$rc $(cat "$state/err")"
fc snapshot compact "$tag-d2"; rc=$?
[ $rc = 2 ] && ok "compact without --to: usage error" || not_ok "compact without --to: rc=$rc"
fc snapshot rm "$tag-d1" --force >/dev/null && fc fork "$tag-d2"; rc=$?
[ $rc = 1 ] && grep -qF "references parent \`$tag-d1\`, which no longer exists" "$state/err" &&
        ok "rm --force orphans the child, which fails to fork naming its parent" \
        || not_ok "force: rc=$rc $(cat "$state/err")"
# snapshot diff: the test guest runs exec of sh -c CODE in its run_code language
before=$(fc ls --json | pyq "len(j['sandboxes'])")
fc snapshot diff --from "$tag" --tag "$tag-x" --exec "write /root/x.txt step-one; y = 7" --json >"$state/out" &&
        pyq "j['tag'] == '$tag-x' and j['parent_tag'] == '$tag' and len(j['parent_content_hash']) == 64" \
                "$state/out" >/dev/null &&
        [ "$(fc ls --json | pyq "len(j['sandboxes'])")" = "$before" ] &&
        c=$(fc fork "$tag-x" --json | pyq "j['sandboxes'][0]['id']") &&
        [ "$(fc run "$c" 'print y; cat /root/x.txt' --json | pyq "j['stdout']")" = "$(printf '7\nstep-one')" ] &&
        fc kill "$c" >/dev/null \
        && ok "snapshot diff: a diff link of $tag with the command's changes; its sandbox is gone" \
        || not_ok "snapshot diff: $(cat "$state/out" "$state/err")"
fc snapshot diff --from "$tag" --tag "$tag-y" --exec "y = 8; bogus statement"; rc=$?
[ $rc = 1 ] && grep -q "exited with status 1; no snapshot '$tag-y' was made" "$state/err" &&
        grep -q "bogus" "$state/err" && [ "$(fc ls --json | pyq "len(j['sandboxes'])")" = "$before" ] &&
        ! fc snapshot info "$tag-y" >/dev/null \
        && ok "snapshot diff whose command fails: exit 1 with its status and stderr, no sandbox or snapshot left" \
        || not_ok "snapshot diff failing: rc=$rc $(cat "$state/err")"
fc snapshot diff --from "$tag" --tag "$tag-x"; rc=$?
[ $rc = 2 ] && grep -q "needs --from, --tag and --exec" "$state/err" && ok "snapshot diff without --exec: usage error" \
        || not_ok "snapshot diff usage: rc=$rc $(cat "$state/err")"
fc snapshot diff --from "$tag" --tag "$tag-x" --exec true --exec-timeout-secs 0; rc=$?
[ $rc = 2 ] && ok "snapshot diff --exec-timeout-secs 0: usage error" || not_ok "exec timeout 0: rc=$rc"
# processes: the guest's ticker followed, a script's failure as the exit status, a
# process killed by TERM while followed (128+15), ps, logs at an offset
q=${ids[0]}
fc exec --follow "$q" -- ticker 3 100 >"$state/out"; rc=$?
[ $rc = 0 ] && [ "$(awk '{print $2}' "$state/out" | tr '\n' ' ')" = "0 1 2 " ] \
        && ok "exec --follow: the ticker's lines as they come, exit 0" || not_ok "exec --follow: rc=$rc $(cat "$state/out" "$state/err")"
fc exec --follow "$q" -- /bin/sh -c "x = 1; nosuch" >"$state/out"; rc=$?
[ $rc = 1 ] && grep -q "SyntaxError" "$state/err" && ok "exec --follow of a failing script: its stderr, exit 1" \
        || not_ok "exec --follow failing: rc=$rc $(cat "$state/err")"
"$forkctl" --no-progress exec --follow "$q" -- sleep 600000 >/dev/null 2>&1 &
follower=$!
for _ in $(seq 100); do
        sp=$(fc ps "$q" --json | pyq "[p['pid'] for p in j if p['running'] and p['args'][0] == 'sleep']")
        [ -n "$sp" ] && break
        sleep 0.05
done
fc ps "$q" >"$state/out" && grep -q "running.*sleep 600000" "$state/out" && grep -q "exited (0).*ticker 3 100" "$state/out" \
        && ok "ps: running and exited processes" || not_ok "ps: $(cat "$state/out" "$state/err")"
fc signal "$q" "$sp" TERM; rc=$?
wait "$follower"; frc=$?
[ $rc = 0 ] && [ $frc = 143 ] && fc ps "$q" | grep -q "killed (TERM).*sleep" \
        && ok "signal TERM: the follower exits 128+15, ps says killed" || not_ok "signal: rc=$rc follower=$frc $(cat "$state/err")"
tp=$(fc ps "$q" --json | pyq "[p['pid'] for p in j if p['args'][0] == 'ticker'][0]")
fc logs "$q" "$tp" >"$state/all" && fc logs "$q" "$tp" --offset 22 >"$state/tail" &&
        [ "$(tail -c +23 "$state/all")" = "$(cat "$state/tail")" ] && [ "$(wc -l <"$state/tail")" = 2 ] &&
        ! fc signal "$q" 999999 TERM \
        && ok "logs from 0 and at an offset; signal of an unknown pid fails" || not_ok "logs: $(cat "$state/err")"
# more than one read of the guest's (64 KiB each): an exited process's logs go on to its end
fc exec --follow "$q" -- flood 200000 >"$state/flood"; rc=$?
fp=$(fc ps "$q" --json | pyq "[p['pid'] for p in j if p['args'][0] == 'flood'][0]")
fc logs "$q" "$fp" >"$state/all"
[ $rc = 0 ] && [ "$(wc -c <"$state/flood")" = 200000 ] && cmp -s "$state/flood" "$state/all" \
        && ok "logs of an exited process past one read: all 200000 bytes" \
        || not_ok "logs past one read: rc=$rc $(wc -c <"$state/flood") $(wc -c <"$state/all") $(cat "$state/err")"

fc snapshot rm "$tag" --cascade --force; rc=$?
[ $rc = 2 ] && ok "rm --cascade --force: usage error" || not_ok "rm both: rc=$rc"
fc branch "$p" --tag "$tag-d3" --mode diff >/dev/null
fc kill "$p" >/dev/null
fc snapshot rm "$tag" --cascade >/dev/null && ! fc snapshot info "$tag-d3" >/dev/null && ! fc snapshot info "$tag" >/dev/null &&
        ! fc snapshot info "$tag-x" >/dev/null \
        && ok "rm --cascade deletes the subtree" || not_ok "cascade: $(cat "$state/err")"
fc snapshot rm "$tag-d2" >/dev/null; fc snapshot rm "$tag-flat" >/dev/null
[ "$failed" = 0 ]
