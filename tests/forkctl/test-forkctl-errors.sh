#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# forkctl's errors and usage, against a real dbus-daemon on which forkd is not
# running: every failure exits non-zero, prints on stderr only, and says what to do.
# usage: test-forkctl-errors.sh FORKCTL

set -u
forkctl=${1:?usage: test-forkctl-errors.sh FORKCTL}
command -v dbus-daemon >/dev/null || { echo "1..0 # SKIP dbus-daemon not installed"; exit 77; }

# A scratch directory and a private bus (polkit-env.sh; no polkitd needed here).
. "$(dirname "$(realpath "$0")")/polkit-env.sh"
polkit_env_scratch forkctl-errors
polkit_env_bus
unset DBUS_SYSTEM_BUS_ADDRESS # forkctl is always given --bus-address here

# expect EXIT STDERR-SUBSTRING DESCRIPTION -- ARGS...: runs forkctl, checks exit code,
# that stderr contains the text and that stdout stays empty.
expect() {
        local want_rc=$1 want_err=$2 desc=$3; shift 4
        local rc
        "$forkctl" "$@" >"$T/out" 2>"$T/err" </dev/null; rc=$?
        if [ "$rc" != "$want_rc" ]; then
                not_ok "$desc: exit $rc, wanted $want_rc ($(cat "$T/err"))"
        elif ! grep -qF -- "$want_err" "$T/err"; then
                not_ok "$desc: stderr lacks '$want_err': $(cat "$T/err")"
        elif [ -s "$T/out" ]; then
                not_ok "$desc: wrote to stdout: $(cat "$T/out")"
        else
                ok "$desc"
        fi
}

echo "1..63"
notrunning="forkd is not running; start it with 'systemctl start forkd' or 'tools/forkd-stack up'"
expect 5 "$notrunning" "ls without forkd" -- --bus-address "$bus" ls
expect 5 "$notrunning" "ls --json without forkd" -- --bus-address "$bus" ls --json
expect 5 "$notrunning" "snapshot ls without forkd" -- --bus-address "$bus" snapshot ls
expect 5 "$notrunning" "fork without forkd (progress path)" -- --bus-address "$bus" fork base -n 2
# forkctl opens kernel and rootfs itself (readable files here), then calls forkd.
expect 5 "$notrunning" "snapshot create without forkd" -- --bus-address "$bus" snapshot create t --kernel "$0" --rootfs "$0"
expect 1 "snapshot create: cannot open the kernel /nonexistent/k: No such file or directory" \
        "snapshot create with a missing kernel: the file and why, before any call" \
        -- --bus-address "$bus" snapshot create t --kernel /nonexistent/k --rootfs "$0"
expect 2 "snapshot create: cannot open the volume /nonexistent/v.ext4: No such file or directory" \
        "snapshot create with a missing volume: the file and why, before any call" \
        -- --bus-address "$bus" snapshot create t --kernel "$0" --rootfs "$0" --volume /nonexistent/v.ext4:/data
expect 2 "--volume: the guest path must be absolute" "snapshot create --volume with a relative guest path" \
        -- --bus-address "$bus" snapshot create t --kernel "$0" --rootfs "$0" --volume "$0":data:ro
expect 1 "snapshot create: the rootfs $T is not a regular file" "snapshot create with a directory as rootfs" \
        -- --bus-address "$bus" snapshot create t --kernel "$0" --rootfs "$T"
expect 5 "$notrunning" "kill without forkd" -- --bus-address "$bus" kill a b
expect 5 "$notrunning" "exec without forkd" -- --bus-address "$bus" exec sb -- /bin/true
FORKD_BUS_ADDRESS=$bus expect 5 "$notrunning" "\$FORKD_BUS_ADDRESS selects the bus" -- ping sb
FORKD_BUS_ADDRESS="unix:path=$T/nope" expect 5 "$notrunning" "--bus-address overrides \$FORKD_BUS_ADDRESS" -- --bus-address "$bus" ping sb
expect 5 "cannot connect to the bus at unix:path=$T/nope" "unreachable bus" -- --bus-address "unix:path=$T/nope" ls
expect 2 "no command given" "no command" --
expect 2 "unknown command 'frob'" "unknown command" -- frob
expect 2 "unknown snapshot subcommand" "unknown snapshot subcommand" -- snapshot frob
expect 2 "-n wants a whole number in 1..1000, not '0'" "-n 0 refused before any call" -- fork base -n 0
expect 2 "-n wants a whole number in 1..1000, not '1001'" "-n 1001 refused" -- fork base -n 1001
expect 2 "usage: forkctl fork TAG" "fork without a tag" -- fork
expect 2 "needs --kernel and --rootfs" "snapshot create without --kernel" -- snapshot create t --rootfs /r
expect 2 "option --kernel does not apply here" "an option of another verb" -- ls --kernel /k
expect 2 "--cascade and --force exclude each other" "rm --cascade --force" -- --bus-address "$bus" snapshot rm t --cascade --force
expect 2 "unknown option '--frob'" "unknown option" -- ls --frob
expect 2 "usage: forkctl merge ID WINNER" "merge without a winner" -- merge a
expect 2 "usage: forkctl diff ID OTHER" "diff without the other" -- diff a
expect 2 "option --timeout does not apply here" "merge --timeout" -- merge a b --timeout 5
expect 2 "snapshot compact needs --to" "compact without --to" -- snapshot compact a
expect 2 "--to must match" "compact --to ../x" -- snapshot compact a --to ../x
expect 2 "option --to does not apply here" "rm --to" -- snapshot rm a --to b
expect 2 "needs --from, --tag and --exec" "snapshot diff without --from" -- snapshot diff --tag t --exec true
expect 2 "--exec wants a command line" "snapshot diff --exec ''" -- snapshot diff --from a --tag t --exec ''
expect 2 "--exec-timeout-secs wants a whole number in 1..3600" "--exec-timeout-secs 3601" -- snapshot diff --from a --tag t --exec true --exec-timeout-secs 3601
expect 2 "--tag must name a new snapshot" "snapshot diff --tag BASE" -- snapshot diff --from a --tag a --exec true
expect 2 "option --exec does not apply here" "branch --exec" -- branch sb-1 --exec true
expect 2 "--network wants none or egress, not 'sideways'" "fork --network=sideways" -- fork base --network=sideways
expect 2 "fork --network wants none or egress" "fork --network without a policy" -- --bus-address "$bus" fork base --network
expect 2 "--agent-tcp needs --network" "snapshot create --agent-tcp without --network" \
        -- --bus-address "$bus" snapshot create t --kernel "$0" --rootfs "$0" --agent-tcp
expect 2 "snapshot create --network takes no value" "snapshot create --network egress" \
        -- --bus-address "$bus" snapshot create t --kernel "$0" --rootfs "$0" --network egress
expect 2 "ports wants a TCP port in 1..65535, not '0'" "ports 0" -- --bus-address "$bus" ports sb-1 0
expect 2 "usage: forkctl ports ID PORT" "ports without a port" -- ports sb-1
expect 2 "option --network does not apply here" "ls --network" -- ls --network none
expect 5 "$notrunning" "ports without forkd" -- --bus-address "$bus" ports sb-1 8080
# pause, resume, timeout and the deadline options: checked before any call
expect 2 "timeout wants S, a whole number of seconds in 1..86400, not '0'" "timeout 0" -- --bus-address "$bus" timeout sb-1 0
expect 2 "timeout wants S, a whole number of seconds in 1..86400, not '86401'" "timeout 86401" \
        -- --bus-address "$bus" timeout sb-1 86401
expect 2 "--on-timeout wants kill or pause, not 'later'" "timeout --on-timeout later" \
        -- --bus-address "$bus" timeout sb-1 5 --on-timeout later
expect 2 "--on-timeout needs --timeout" "fork --on-timeout without --timeout" -- --bus-address "$bus" fork base --on-timeout pause
expect 2 "--timeout wants a whole number in 1..86400, not '0'" "fork --timeout 0 (a deadline: 1..86400)" \
        -- --bus-address "$bus" fork base --timeout 0
expect 2 "usage: forkctl resume ID" "resume without an id" -- resume
expect 2 "option --timeout does not apply here" "pause --timeout" -- pause sb-1 --timeout 5
expect 5 "$notrunning" "pause without forkd" -- --bus-address "$bus" pause sb-1

# limits: the option words, before any call
expect 2 "limits wants at least one of --cpu-limit" "limits without a limit" -- limits sb-1
expect 2 "--cpu-limit wants a number of CPUs" "--cpu-limit not a number" -- fork t --cpu-limit 1e3
expect 2 "--cpu-limit wants a number of CPUs" "--cpu-limit too small" -- fork t --cpu-limit 0.001
expect 2 "fork --cpu-limit wants a number of CPUs of at least 0.01" "fork --cpu-limit 0" -- --bus-address "$bus" fork t --cpu-limit 0
expect 2 "disk_rate.bandwidth must be 0 or between 4096" "--disk-rate below 4 KiB/s" -- fork t --disk-rate 100
expect 2 "disk_rate.ops must be 0 or between 1 and 10000000" "--disk-rate ops too high" -- limits sb-1 --disk-rate ops=20000000
expect 2 "net_rate.burst needs net_rate.bandwidth" "--net-rate burst alone" -- limits sb-1 --net-rate burst=1M
expect 2 "net_rate: unknown key 'rate'" "--net-rate unknown key" -- limits sb-1 --net-rate rate=1
expect 2 "disk_rate: '5' wants a key" "--disk-rate second item without key" -- limits sb-1 --disk-rate 1M,5
expect 2 "disk_rate: bandwidth wants a number of bytes" "--disk-rate bad suffix" -- limits sb-1 --disk-rate 10X
expect 2 "option --disk-rate does not apply here" "--disk-rate on ping" -- ping sb-1 --disk-rate 1M
expect 5 "$notrunning" "limits without forkd" -- --bus-address "$bus" limits sb-1 --cpu-limit 0.5 --disk-rate 10M,ops=100,burst=1M --net-rate ops=50

# processes: arguments checked before any call
expect 2 "invalid PID '0'" "signal with PID 0" -- signal sb-1 0 TERM
expect 2 "invalid PID 'x'" "logs with a PID that is no number" -- logs sb-1 x
expect 2 "unknown signal 'NOPE'" "signal with an unknown signal" -- signal sb-1 7 NOPE
expect 2 "unknown signal '65'" "signal 65" -- signal sb-1 7 65
expect 2 "--offset wants a number of bytes" "logs --offset -1" -- logs sb-1 7 --offset -1
expect 2 "usage: forkctl ps ID" "ps without an id" -- ps
expect 2 "option --follow does not apply here" "--follow on ps" -- ps sb-1 --follow
expect 2 "option --cmd does not apply here" "--cmd on exec" -- exec sb-1 --cmd x -- true
expect 2 "usage: forkctl exec ID [--timeout S] [--follow] -- ARGV..." "exec --follow without a command" -- exec --follow sb-1
expect 5 "$notrunning" "exec --follow without forkd" -- --bus-address "$bus" exec --follow sb-1 -- true
expect 5 "$notrunning" "logs without forkd" -- --bus-address "$bus" logs sb-1 7 --offset 3
expect 5 "$notrunning" "shell without forkd" -- --bus-address "$bus" shell sb-1 --cmd true

"$forkctl" --help >"$T/out" 2>&1; rc=$?
missing=""
for v in "snapshot create" "snapshot ls" "snapshot info" "snapshot rm" "snapshot compact TAG --to T" "snapshot diff --from BASE --tag T --exec CMD" "--exec-timeout-secs" "--cascade" "--force" "fork TAG" " ls " "kill ID" "ping ID" "exec ID" "eval ID" "run ID" "merge ID WINNER" "diff ID OTHER" "ports ID PORT" "exec --follow ID" "ps ID" "signal ID PID SIG" "logs ID PID" "--offset N" "shell ID [--cmd CMD]" "pause ID" "resume ID" "timeout ID S" "limits ID" "--cpu-limit" "--disk-rate" "--net-rate" "--on-timeout" "--network" "--agent-tcp" "--json" "--bus-address" "FORKD_BUS_ADDRESS"; do
        grep -qF -- "$v" "$T/out" || missing="$missing [$v]"
done
[ "$rc" = 0 ] && [ -z "$missing" ] && ok "--help names every verb and option" || not_ok "--help: rc=$rc missing:$missing"
out=$("$forkctl" --version); rc=$?
[ "$rc" = 0 ] && [[ "$out" =~ ^forkctl\ [0-9]+\.[0-9]+ ]] && ok "--version" || not_ok "--version: $out"

[ "$failed" = 0 ]
