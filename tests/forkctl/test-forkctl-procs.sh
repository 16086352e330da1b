#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# forkctl exec --follow, ps, signal and logs against a stand-in for forkd's process
# methods on a private bus (fake-procs-service.c): the frames of an output stream
# to stdout and stderr, gaps said on stderr, the exit status (128+N for a signal),
# a stream cut short or invalid, logs at an offset and across a gap, ps's table
# and --json, signal's errors, shell with its input from a file. No guest, no /dev/kvm.
# usage: test-forkctl-procs.sh FORKCTL FAKE-SERVICE

set -u
forkctl=${1:?usage: test-forkctl-procs.sh FORKCTL FAKE-SERVICE}
fake=${2:?usage: test-forkctl-procs.sh FORKCTL FAKE-SERVICE}
command -v dbus-daemon >/dev/null || { echo "1..0 # SKIP dbus-daemon not installed"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "1..0 # SKIP the private bus lets root own org.forkd.Manager only"; exit 77; }

. "$(dirname "$(realpath "$0")")/polkit-env.sh"
polkit_env_scratch forkctl-procs
polkit_env_bus org.forkd.Manager
unset DBUS_SYSTEM_BUS_ADDRESS
"$fake" "$bus" 2>"$T/fake.log" &
pids+=($!)
for _ in $(seq 100); do
        busctl --address="$bus" status org.forkd.Manager >/dev/null 2>&1 && break
        sleep 0.05
done

# run NAME ARGS...: forkctl on the bus; its stdout, stderr and exit status in $T/NAME.{out,err,rc}
run() {
        local name=$1; shift
        "$forkctl" --bus-address "$bus" "$@" >"$T/$name.out" 2>"$T/$name.err" </dev/null
        echo $? >"$T/$name.rc"
}
# is NAME RC STDOUT STDERR-SUBSTRING DESCRIPTION
is() {
        local rc out
        rc=$(cat "$T/$1.rc"); out=$(cat "$T/$1.out"; echo x); out=${out%x}
        if [ "$rc" = "$2" ] && [ "$out" = "$3" ] && { [ -z "$4" ] || grep -qF -- "$4" "$T/$1.err"; }; then
                ok "$5"
        else
                not_ok "$5: exit $rc, stdout $(printf %q "$out"), stderr $(cat "$T/$1.err")"
        fi
}

echo "1..13"
run a exec --follow sb-1 -- exit3 arg
is a 3 $'out\ntail\n' "forkctl: 5 bytes dropped" "exec --follow: stdout, a gap said on stderr, exit status 3"
grep -qx "err" "$T/a.err" && ok "exec --follow: the process's stderr on ours" || not_ok "stderr: $(cat "$T/a.err")"
run b exec --follow sb-1 -- term
is b 143 $'bye\n' "" "exec --follow of a process SIGTERM killed: exit status 143"
run c logs sb-1 42 --follow --offset 6
is c 0 $'line2\nline3\n' "" "logs --follow --offset 6: the stream from byte 6, exit 0"
run d logs sb-1 42 --offset 12
is d 0 $'line3\n' "" "logs --offset 12: ReadSandboxOutput from byte 12 until it stops moving"
run e logs sb-1 7
is e 0 $'1\nline2\nline3\n' "forkctl: 4 bytes dropped" "logs across the ring's start: the gap said, the rest written"
run e2 logs sb-1 8
is e2 0 $'line1\nline2\nline3\n' "" "logs of an exited process: its output, no read after its end"
run f logs sb-1 66 --follow
is f 1 "" "invalid frame on the output stream" "logs --follow of an invalid frame: exit 1"
run g logs sb-1 67 --follow
is g 1 "cut" "ended before its exit" "logs --follow of a stream cut short: what came, then exit 1"
run h signal sb-1 99 TERM
is h 1 "" "no such process 99" "signal of an unknown pid: forkd's NoSuchProcess, exit 1"
run i ps sb-1
if [ "$(cat "$T/i.rc")" = 0 ] && grep -Eq '^42 +running +no +18 ' "$T/i.out" &&
   grep -Eq '^15 +killed \(TERM\) ' "$T/i.out" && grep -q 'counter -x' "$T/i.out"; then
        ok "ps: a table of the processes"
else
        not_ok "ps: $(cat "$T/i.out" "$T/i.err")"
fi

printf 'echo hi\nexit\n' >"$T/shell.in"
"$forkctl" --bus-address "$bus" shell sb-1 <"$T/shell.in" >"$T/j.out" 2>"$T/j.err"; echo $? >"$T/j.rc"
is j 7 $'echo hi\nexit\n' "" "shell: /bin/sh -i on an 80x24 pty, stdin to it and its output back, its exit status"
"$forkctl" --bus-address "$bus" shell sb-1 --cmd 'echo x' </dev/null >"$T/k.out" 2>"$T/k.err"; echo $? >"$T/k.rc"
is k 7 "" "" "shell --cmd: sh -c CMD; the end of our input closes its stdin"
[ "$failed" = 0 ]
