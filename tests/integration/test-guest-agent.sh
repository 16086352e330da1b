#!/bin/sh
# Boot the test guest under forkd-vmm and drive every agent op, hostile input
# included, through tests/guest/agent-check.py; then the guest powers off and
# the VMM must exit 0 (clean shutdown through the i8042).
set -eu
vmm=$1 guest=$2 check=$3
[ -r /dev/kvm ] || { echo "1..0 # SKIP /dev/kvm is not usable"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/forkd-agent-check.XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
truncate -s 8M "$dir/disk.img"
"$vmm" boot --kernel "$guest" --disk "$dir/disk.img" --mem-mib 64 --id agent-check \
        --console-log "$dir/console.log" --agent-socket "$dir/agent.sock" --overlay-dir "$dir" &
pid=$!
i=0
while [ ! -S "$dir/agent.sock" ]; do
        i=$((i + 1)); [ $i -lt 500 ] || { echo "agent socket never appeared"; exit 1; }
        kill -0 "$pid" || { echo "forkd-vmm died"; cat "$dir/console.log"; exit 1; }
        sleep 0.01
done
if ! python3 "$check" "$dir/agent.sock" --hostile --shutdown; then
        echo "agent check failed; console log:"; cat "$dir/console.log"
        echo "forkd-vmm state:"; grep -E "State|SigPnd|ShdPnd" "/proc/$pid/status" || true
        exit 1
fi
rc=0; wait "$pid" || rc=$?
pid=
[ "$rc" -eq 0 ] || { echo "forkd-vmm exited $rc after guest shutdown"; cat "$dir/console.log"; exit 1; }
grep -q "forkd-test-guest: ready" "$dir/console.log"
echo "guest agent check passed"
