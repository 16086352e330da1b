#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# forkctl pause, resume, timeout and fork/fork-sandbox --timeout against the real
# forkd, real dbus-daemon and real /dev/kvm, brought up by tools/forkd-stack, on the
# test guest (its run_code globals show the state a sandbox was paused with): ls
# with the paused state and the deadline, the refusals of a paused sandbox,
# forks of it, usage errors, and deadlines acted on (SandboxRemoved reason
# "timeout", watched with dbus-monitor).
# usage: test-forkctl-pause.sh FORKCTL SOURCE-ROOT   ($FORKD_BUILD_DIR: the build dir)
# Skips (77) when forkd is not built yet or /dev/kvm is missing.

set -u
forkctl=${1:?usage: test-forkctl-pause.sh FORKCTL SOURCE-ROOT}
top=${2:?usage: test-forkctl-pause.sh FORKCTL SOURCE-ROOT}
build=${FORKD_BUILD_DIR:?FORKD_BUILD_DIR must name the build dir}

skip() { echo "1..0 # SKIP $*"; exit 77; }
[ -x "$build/src/daemon/forkd" ] || skip "forkd is not built ($build/src/daemon/forkd)"
[ -c /dev/kvm ] || skip "no /dev/kvm"
[ "$(id -u)" = 0 ] || skip "needs root (forkd allows root without polkit)"
command -v python3 >/dev/null || skip "python3 (to parse --json) is missing"
command -v dbus-monitor >/dev/null || skip "dbus-monitor (to see SandboxRemoved) is missing"
# jq is not among the dependencies: pyq EXPR [FILE] prints EXPR evaluated on the
# JSON document j (lists one item per line) and fails when it is False.
pyq() {
        python3 -c 'import json, sys
j = json.load(open(sys.argv[2]) if len(sys.argv) > 2 else sys.stdin)
r = eval(sys.argv[1])
print("\n".join(map(str, r)) if isinstance(r, list) else r)
sys.exit(r is False)' "$@" 2>/dev/null
}

state=$(mktemp -d /tmp/forkctl-pause.XXXXXX)
port=$((20000 + RANDOM % 12000)) # below the ephemeral ports (32768-60999), which clients hold
monitor=
cleanup() {
        [ -n "$monitor" ] && kill "$monitor" 2>/dev/null
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
# row ID: the line of ID in the ls table (the header first, to check the columns)
row() { fc ls | awk -v id="$1" 'NR == 1 || $1 == id'; }
# removed ID [SECS]: the reason of ID's SandboxRemoved, once dbus-monitor saw it (empty: not within SECS)
removed() {
        local i r
        for ((i = 0; i < ${2:-10} * 10; i++)); do
                # dbus-monitor prints a signal's arguments one a line: id, object path, reason
                r=$(awk -v id="$1" '/member=SandboxRemoved/ { a = 0; next }
                        /^ *string / { a++; gsub(/^ *string "|"$/, ""); if (a == 1) s = $0; else if (s == id) { print; exit } }' \
                        "$state/monitor")
                [ -n "$r" ] && { echo "$r"; return 0; }
                sleep 0.1
        done
        return 1
}
# paused ID [SECS]: until forkctl ls shows ID paused (1), or SECS passed (0)
paused() {
        local i
        for ((i = 0; i < ${2:-10} * 10; i++)); do
                [ "$(fc ls --json | pyq "[x['status'] for x in j['sandboxes'] if x['id'] == '$1'][0]")" = paused ] && return 0
                sleep 0.1
        done
        return 1
}

dbus-monitor --address "$FORKD_BUS_ADDRESS" \
        "type='signal',interface='org.forkd.Manager',member='SandboxRemoved'" >"$state/monitor" 2>&1 &
monitor=$!

echo "1..24"
tag=pause-$$
fc snapshot create "$tag" --kernel "$FORKD_GUEST_KERNEL" --rootfs "$FORKD_GUEST_ROOTFS" --boot-wait 60 >/dev/null ||
        { not_ok "snapshot create: $(cat "$state/err")"; exit 1; }
s=$(fc fork "$tag" --json | pyq "j['sandboxes'][0]['id']")
[ -n "$s" ] && fc run "$s" 'x = 41' >/dev/null && ok "a sandbox $s with x = 41" ||
        { not_ok "fork, run: $(cat "$state/err")"; exit 1; }

# pause: the table names it, the sandbox is paused, ls shows it paused without a VMM
fc pause "$s" >"$state/out" && grep -q "^$s  *$tag  *paused  *- " "$state/out" &&
        grep -qF "Paused sandbox '$s'; resume it with 'forkctl resume $s'." "$state/err" \
        && ok "pause: its row, paused, no pid; says how to resume" || not_ok "pause: $(cat "$state/out" "$state/err")"
row "$s" >"$state/out"
head -1 "$state/out" | grep -q '^ID  *SNAPSHOT  *STATE  *PID  *MEMLIMIT  *NETNS  *ADDRESS  *CREATED  *EXPIRES  *OWNER  *CPU  *MEM(PRIV+SHARED)$' &&
        grep -q "^$s  *$tag  *paused  *-  " "$state/out" \
        && ok "ls: the EXPIRES column; $s paused with no pid" || not_ok "ls: $(cat "$state/out" "$state/err")"
fc ls --json | pyq "[(x['status'], x['pid']) for x in j['sandboxes'] if x['id'] == '$s'] == [('paused', 0)]" >/dev/null \
        && ok "ls --json: status paused, pid 0" || not_ok "ls --json: $(fc ls --json) $(cat "$state/err")"

# what a paused sandbox refuses: exit 1, forkd's reason and what to do
for verb in "exec $s -- true" "run $s print-x" "ping $s" "branch $s --tag $tag-b" "pause $s"; do
        # shellcheck disable=SC2086 # the words of $verb are its arguments
        fc $verb >"$state/out"; rc=$?
        [ $rc = 1 ] && grep -qF "${verb%% *}: sandbox '$s' is paused; resume it with 'forkctl resume $s'" "$state/err" &&
                [ ! -s "$state/out" ] \
                && ok "${verb%% *} of a paused sandbox: exit 1, says it is paused and how to resume" \
                || not_ok "${verb%% *} paused: rc=$rc $(cat "$state/out" "$state/err")"
done

# fork-sandbox of the paused one: its children run from the paused state, it stays paused
fc fork-sandbox "$s" -n 2 --json >"$state/out" && mapfile -t kids < <(pyq "[k['id'] for k in j['sandboxes']]" "$state/out") &&
        [ ${#kids[@]} = 2 ] && [ "$(fc run "${kids[1]}" 'print x' --json | pyq "j['stdout']")" = 41 ] &&
        [ "$(fc ls --json | pyq "[x['status'] for x in j['sandboxes'] if x['id'] == '$s'][0]")" = paused ] &&
        fc kill "${kids[@]}" \
        && ok "fork-sandbox of a paused sandbox: children with its x, it stays paused" \
        || not_ok "fork-sandbox paused: $(cat "$state/out" "$state/err")"

# resume: running again under its id, with its state
fc resume "$s" >"$state/out" && grep -q "^$s  *$tag  *running  *[0-9]" "$state/out" &&
        [ "$(fc run "$s" 'print x' --json | pyq "j['stdout']")" = 41 ] \
        && ok "resume: $s runs again with x = 41" || not_ok "resume: $(cat "$state/out" "$state/err")"
fc resume "$s"; rc=$?
[ $rc = 1 ] && grep -qF "resume: sandbox '$s' is not paused; pause it with 'forkctl pause $s'" "$state/err" \
        && ok "resume of a running sandbox: exit 1, says it is not paused" || not_ok "resume running: rc=$rc $(cat "$state/err")"
fc pause sb-000000-9999; rc=$?
[ $rc = 3 ] && grep -q "no sandbox 'sb-000000-9999'" "$state/err" && ok "pause of an unknown sandbox: exit 3" \
        || not_ok "pause unknown: rc=$rc $(cat "$state/err")"

# timeout: usage errors before any call, then deadlines on a running and a paused sandbox
bad=""
# ARGS|what the error says
for t in "$s 0|timeout wants S, a whole number of seconds in 1..86400, not '0'" "$s x|not 'x'; usage: forkctl timeout ID S" \
        "$s -5|unknown option '-5'" "$s 5 --on-timeout never|--on-timeout wants kill or pause, not 'never'" \
        "$s|usage: forkctl timeout ID S [--on-timeout kill|pause]" "$s 5 --timeout 5|option --timeout does not apply here"; do
        args=${t%%|*}
        # shellcheck disable=SC2086
        fc timeout $args; rc=$?
        [ $rc = 2 ] && grep -qF -- "${t#*|}" "$state/err" || bad="$bad [$args: rc=$rc $(head -1 "$state/err")]"
done
[ -z "$bad" ] && ok "timeout with 0, x, -5, a bad --on-timeout, no S, --timeout: usage errors that say why" \
        || not_ok "timeout usage:$bad"
fc timeout "$s" 86401; grep -qF "timeout wants S, a whole number of seconds in 1..86400, not '86401'" "$state/err" \
        && ok "timeout 86401: names the range" || not_ok "timeout 86401: $(cat "$state/err")"
fc timeout "$s" 600 --json >"$state/out" &&
        pyq "j['expires_at'].endswith('Z') and j['on_timeout'] == 'kill'" "$state/out" >/dev/null &&
        row "$s" | grep -q "^$s .* [0-9-]* [0-9:]* (kill)  " \
        && ok "timeout 600: expires_at set, ls shows it (kill)" || not_ok "timeout 600: $(cat "$state/out" "$state/err")"
fc timeout "$s" 600 --on-timeout pause >"$state/out" && grep -q "^$s .* (pause)  " "$state/out" &&
        grep -q "^Sandbox '$s' expires at [0-9-]* [0-9:]* (pause)\.$" "$state/err" &&
        fc timeout "$s" 900 --json | pyq "j['on_timeout'] == 'pause'" >/dev/null \
        && ok "timeout --on-timeout pause: shown; a later timeout without it keeps pause" \
        || not_ok "timeout pause: $(cat "$state/out" "$state/err")"
fc timeout "$s" 1 >/dev/null && paused "$s" 10 \
        && ok "timeout 1 --on-timeout pause (kept): paused at the deadline" || not_ok "pause at deadline: $(cat "$state/err")"
fc timeout "$s" 1 --on-timeout kill --json >"$state/out" &&
        pyq "j['status'] == 'paused' and j['on_timeout'] == 'kill'" "$state/out" >/dev/null &&
        [ "$(removed "$s" 10)" = timeout ] && [ -z "$(fc ls --json | pyq "[x for x in j['sandboxes'] if x['id'] == '$s']")" ] \
        && ok "timeout 1 --on-timeout kill of a paused sandbox: removed with reason timeout" \
        || not_ok "kill paused at deadline: $(cat "$state/out" "$state/err") $(removed "$s" 0)"

# fork --timeout: the children go at their deadline, with reason timeout
fc fork "$tag" -n 2 --timeout 86401; rc=$?
[ $rc = 2 ] && grep -qF -- "--timeout wants a whole number in 1..86400, not '86401'" "$state/err" \
        && ok "fork --timeout 86401: usage error" || not_ok "fork --timeout 86401: rc=$rc $(cat "$state/err")"
fc fork "$tag" --on-timeout pause; rc=$?
[ $rc = 2 ] && grep -qF -- "--on-timeout needs --timeout" "$state/err" && ok "fork --on-timeout alone: usage error" \
        || not_ok "fork --on-timeout alone: rc=$rc $(cat "$state/err")"
fc fork "$tag" -n 2 --timeout 2 >"$state/out" && mapfile -t kids < <(awk 'NR > 1 { print $1 }' "$state/out") &&
        [ ${#kids[@]} = 2 ] && grep -q "^${kids[0]} .* (kill)  " "$state/out" &&
        [ "$(removed "${kids[0]}" 10)" = timeout ] && [ "$(removed "${kids[1]}" 2)" = timeout ] \
        && ok "fork --timeout 2: both children removed with reason timeout" \
        || not_ok "fork --timeout: $(cat "$state/out" "$state/err") [${kids[*]}]: $(removed "${kids[0]:-x}" 0)"
c=$(fc fork "$tag" --timeout 1 --on-timeout pause --json | pyq "j['sandboxes'][0]['id']") && paused "$c" 10 &&
        row "$c" | grep -q "^$c  *$tag  *paused  *- " && fc kill "$c" && [ "$(removed "$c" 5)" = terminated ] \
        && ok "fork --timeout 1 --on-timeout pause: paused at the deadline; kill deletes it" \
        || not_ok "fork pause at deadline: $(row "${c:-x}") $(cat "$state/err")"

# fork-sandbox --timeout: ForkSandboxEx of a running sandbox
p=$(fc fork "$tag" --json | pyq "j['sandboxes'][0]['id']")
fc fork-sandbox "$p" --timeout 1 --json >"$state/out" && k=$(pyq "j['sandboxes'][0]['id']" "$state/out") &&
        pyq "j['sandboxes'][0]['expires_at'] != '' and j['parent_pause_us'] > 0" "$state/out" >/dev/null &&
        [ "$(removed "$k" 10)" = timeout ] && fc ping "$p" >/dev/null \
        && ok "fork-sandbox --timeout 1: the child goes with reason timeout, the parent runs on" \
        || not_ok "fork-sandbox --timeout: $(cat "$state/out" "$state/err")"
fc kill "$p" >/dev/null

fc snapshot rm "$tag" >/dev/null || not_ok "snapshot rm: $(cat "$state/err")"
[ "$failed" = 0 ]
