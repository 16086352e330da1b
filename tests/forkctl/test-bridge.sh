#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# The trusted REST bridge (forkd --trusted-bridge-user) on the real parts, no
# /dev/kvm needed: a private dbus-daemon, a real polkitd with our policy and
# rules (polkit-env.sh), the real forkd, and the real forkd-rest running as the
# bridge user "forkd-rest" (as units/forkd-rest.service does). The snapshots are
# written by hand (snapshot.json and sparse files: forkd loads them without a VMM)
# and moved as bundles (PackSnapshot, UnpackSnapshot), which need no KVM either.
#
# Checks:
#   - hostile --trusted-bridge-user values (root, 0, -1, (uid_t) -1, overlong,
#     '/', ':', spaces, the VMM user) stop forkd with an error;
#   - on a socket passed as forkd.socket passes it (the bridge's file, mode 0600,
#     in a 0711 directory) the bridge is served; another uid is refused by the
#     mode, and, with the mode opened, by forkd's peer check; forkd's own
#     bus.sock (no socket unit) is the bridge's file, root's without the option;
#   - with polkitd stopped, forkd-rest as the bridge (direct socket) unpacks a
#     bundle: authorized with no polkit query, the snapshot is owned by the
#     bridge uid (snapshot.json, GetSnapshotInfo), and forkd-rest counted its
#     calls as direct (/metrics); deleting root's snapshot (org.forkd.manage-all)
#     is refused on the direct socket, over REST and raw;
#   - the bridge on the bus (forkd-rest --no-direct) still goes through polkit:
#     refused while polkitd is stopped, allowed by our rules once it runs;
#   - forkd without the option refuses the bridge on the direct socket.
#
# usage: test-bridge.sh POLKIT-SOURCE-DIR
# env: FORKD_DAEMON, FORKD_VMM, FORKD_REST, FORKCTL
# Output: TAP. Exit 77 (skip) when polkitd, unshare, root or a tool are missing.

set -u
polkit_dir=${1:?usage: test-bridge.sh POLKIT-DIR}
POLKITD=${POLKITD:-/usr/lib/polkit-1/polkitd}
HERE=$(dirname "$(realpath "$0")")

skip() { echo "1..0 # SKIP $*"; exit 77; }

if [ -z "${FORKD_BRIDGE_INNER:-}" ]; then
        [ -x "$POLKITD" ] || skip "polkitd not installed ($POLKITD)"
        [ "$(id -u)" = 0 ] || skip "needs root (mount namespace, setpriv)"
        for c in dbus-daemon busctl setpriv curl python3 systemd-socket-activate; do
                command -v $c >/dev/null || skip "$c not installed"
        done
        [ -x "${FORKD_DAEMON:-}" ] && [ -x "${FORKD_REST:-}" ] && [ -x "${FORKCTL:-}" ] ||
                skip "FORKD_DAEMON, FORKD_REST and FORKCTL must name the built programs"
        unshare -m --propagation private true 2>/dev/null || skip "cannot create a mount namespace"
        FORKD_BRIDGE_INNER=1 exec unshare -m --propagation private "$0" "$@"
fi

# ---- inside the private mount namespace ----
. "$HERE/polkit-env.sh"
polkit_dir=$(realpath "$polkit_dir")
polkit_env_scratch forkd-bridge-test

# The bridge is named as the packaged user, so our rules (subject.user ==
# "forkd-rest") allow it on the bus, as on an installed host.
UID_BR=61791; UID_OUT=61792; GID_FORKD=61790
polkit_env_users $GID_FORKD forkd-rest:$UID_BR forkd-br-out:$UID_OUT
polkit_env_bus org.forkd.Manager
polkit_env_polkitd || { echo "Bail out! polkitd did not start"; diag <"$T/polkitd.log"; exit 1; }

echo "1..22"

# ---- the option's value, at the boundary ----
bad=""
for v in root 0 -1 4294967295 18446744073709551616 "$(printf 'a%.0s' $(seq 70))" a/b "forkd-rest:x" \
         "forkd rest" 65533; do
        out=$(timeout 10 "$FORKD_DAEMON" --state-dir "$T/never" --bus-address "unix:path=$T/nowhere" \
                --trusted-bridge-user "$v" 2>&1); rc=$?
        { [ $rc != 0 ] && grep -q -- '--trusted-bridge-user' <<<"$out"; } || { bad+=" '${v:0:20}' (rc $rc)"; diag <<<"$out"; }
done
check "forkd refuses --trusted-bridge-user root, 0, -1, (uid_t) -1, overlong, '/', ':', ' ', the VMM user${bad:+; not:$bad}" \
        [ -z "$bad" ]
[ -e "$T/never" ] && not_ok "a refused option left a state directory" || ok "a refused option stops forkd before its state directory"

# ---- the snapshots: written by hand, as root's ----
# write_snapshot DIR TAG: a test-guest snapshot with sparse files (no owner_uid: root's)
write_snapshot() {
        mkdir -p "$1/$2"
        printf '{"format": 1, "tag": "%s", "created_at_unix": 1700000000, "mem_size": 2097152, "vcpus": 1,
 "generation": 0, "memory_file": "memory.bin", "vmstate_file": "vmstate.bin", "disk_file": "disk.img",
 "disk_size": 1048576, "kernel": "/boot/guest.elf", "guest": "test", "parent_tag": null,
 "parent_content_hash": null}\n' "$2" > "$1/$2/snapshot.json"
        truncate -s 2M "$1/$2/memory.bin"; truncate -s 64 "$1/$2/vmstate.bin"; truncate -s 1M "$1/$2/disk.img"
}
mkdir -p "$T/state/snapshots"
write_snapshot "$T/state/snapshots" rootsnap

# direct UID CALL...: a client of the direct socket as UID (tests/lib/dbusmini.py, found
# through PYTHONPATH, which meson sets and setpriv keeps); prints SERVED <reply>, EACCES,
# or REFUSED/ERROR <name>.
direct() {
        local uid=$1; shift
        setpriv --reuid="$uid" --regid="$uid" --clear-groups "$PY" - "$SOCK" "$@" <<'PY'
import json, sys
from dbusmini import Bus, DBusError
sock, member, sig, args = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
try:
    b = Bus("unix:path=" + sock, timeout=10, hello=False)
    print("SERVED", json.dumps(b.call("org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager", member, sig, args)))
except PermissionError:
    print("EACCES")
except DBusError as e:
    print("ERROR", e.name, e.message)
except Exception as e:
    print("REFUSED", type(e).__name__)
PY
}
export PYTHONPATH=${PYTHONPATH:-$HERE/../lib}
PY=/usr/bin/python3; [ -x "$PY" ] || PY=$(command -v python3)

# start_forkd ARGS...: forkd on a socket passed as forkd.socket passes it (polkit-env.sh)
SOCK=$T/run/forkd/bus.sock
start_forkd() { polkit_env_forkd "$SOCK" $UID_BR "$FORKD_DAEMON" --bus-address "$bus" --state-dir "$T/state" "$@"; }
stop_forkd() { kill "$forkd_pid"; wait "$forkd_pid" 2>/dev/null; }
start_forkd --trusted-bridge-user forkd-rest
MGR=(--address="$bus" --timeout=30 call org.forkd.Manager /org/forkd/Manager org.forkd.Manager)
got=$(busctl --address="$bus" get-property org.forkd.Manager /org/forkd/Manager org.forkd.Manager DirectSocket)
check "forkd trusts uid $UID_BR as the bridge (log)" grep -q "Trusting uid $UID_BR (forkd-rest)" "$T/forkd.log"
check "DirectSocket is the passed socket ($got)" [ "$got" = "s \"$SOCK\"" ]
"$FORKCTL" --bus-address "$bus" pack --tag rootsnap --out "$T/root.bundle" >"$T/pack.log" 2>&1
check "root packs its snapshot (forkctl pack, on the bus)" [ -s "$T/root.bundle" ]
chmod 644 "$T/root.bundle"


# ---- another unprivileged uid on the direct socket ----
out=$(direct $UID_OUT ListSnapshots "" '[]')
check "another uid cannot open the bridge's 0600 socket ($out)" [ "$out" = EACCES ]
chmod 666 "$SOCK"
out=$(direct $UID_OUT ListSnapshots "" '[]')
chmod 600 "$SOCK"
case "$out" in REFUSED*) ok "with the mode opened, forkd refuses another uid before a call ($out)" ;;
*) not_ok "with the mode opened, forkd refuses another uid before a call: $out" ;; esac
out=$(direct $UID_BR ListSnapshots "" '[]')
check "the bridge is served on the direct socket ($out)" grep -q '^SERVED.*rootsnap' <<<"$out"

# ---- polkitd stopped: the bridge on the direct socket needs no polkit query ----
kill "$polkitd_pid"; wait "$polkitd_pid" 2>/dev/null
timeout 5 busctl --address="$bus" status org.freedesktop.PolicyKit1 >/dev/null 2>&1 &&
        echo "Bail out! polkitd still on the bus" && exit 1

TOKEN=bridge-test-token-0123456789
printf '%s\n' "$TOKEN" > "$T/token"; chown $UID_BR "$T/token"; chmod 600 "$T/token"
port_of() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# start_rest PORT [ARGS...]: forkd-rest as the bridge user
start_rest() {
        local port=$1; shift
        setpriv --reuid=$UID_BR --regid=$UID_BR --clear-groups "$FORKD_REST" --debug --listen "127.0.0.1:$port" \
                --bus-address "$bus" --token-file "$T/token" "$@" >>"$T/rest.log" 2>&1 &
        rest_pid=$!
        pids+=($rest_pid)
        for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && break; sleep 0.05; done
}
# req PORT METHOD PATH [curl args...]: prints "STATUS BODY"
req() {
        local port=$1 method=$2 path=$3; shift 3
        curl -s -X "$method" -H "Authorization: Bearer $TOKEN" -w '\n%{http_code}' "$@" \
                "http://127.0.0.1:$port$path" | { body=$(cat); echo "${body##*$'\n'} ${body%$'\n'*}"; }
}
P1=$(port_of)
start_rest "$P1"
# The first calls may go through the bus while the direct connection comes up.
for _ in $(seq 50); do
        m=$(req "$P1" GET /metrics | grep -E '^forkd_rest_dbus_calls_direct_total' | awk '{print $2}')
        req "$P1" GET /v1/snapshots >/dev/null
        [ "${m:-0}" -gt 0 ] && break; sleep 0.1
done
check "forkd-rest as the bridge (uid $UID_BR) calls forkd on the direct socket (direct calls: ${m:-0})" [ "${m:-0}" -gt 0 ]
out=$(req "$P1" POST "/v1/snapshots/unpack?tag=viabridge" --data-binary @"$T/root.bundle" -H 'Content-Type: application/octet-stream')
case "$out" in 201*) ok "polkitd stopped: the bridge unpacks over the direct socket (201)" ;;
*) not_ok "polkitd stopped: the bridge unpacks over the direct socket: $out"; tail -5 "$T/forkd.log" | diag ;; esac
owner=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("owner_uid"))' \
        "$T/state/snapshots/viabridge/snapshot.json" 2>&1)
check "the snapshot made through the bridge is the bridge's (owner_uid $owner)" [ "$owner" = "$UID_BR" ]
out=$(busctl "${MGR[@]}" GetSnapshotInfo s viabridge 2>&1)
check "GetSnapshotInfo says so too" grep -q "\"owner_uid\" u $UID_BR" <<<"$out"
out=$(req "$P1" DELETE /v1/snapshots/rootsnap)
case "$out" in 403*manage-all*) ok "root's snapshot is refused to the bridge over REST on the direct socket (org.forkd.manage-all)" ;;
*) not_ok "root's snapshot is refused to the bridge over REST on the direct socket: $out" ;; esac
out=$(direct $UID_BR DeleteSnapshot sbb '["rootsnap", false, false]')
case "$out" in "ERROR org.freedesktop.DBus.Error.AccessDenied"*manage-all*) ok "DeleteSnapshot of root's: AccessDenied naming org.forkd.manage-all" ;;
*) not_ok "DeleteSnapshot of root's: $out" ;; esac

# ---- the bridge on the bus still asks polkit ----
P2=$(port_of)
start_rest "$P2" --no-direct
out=$(req "$P2" GET /v1/snapshots/viabridge/pack -o /dev/null)
case "$out" in 403*) ok "polkitd stopped: the bridge on the bus (--no-direct) is refused ($out)" ;;
*) not_ok "polkitd stopped: the bridge on the bus (--no-direct) is refused: $out" ;; esac
check "the refusal says polkit is not available" grep -q "polkit (org.freedesktop.PolicyKit1) is not available" <<<"$(
        req "$P2" DELETE /v1/snapshots/viabridge)"
polkit_env_polkitd || not_ok "polkitd restarts"
out=$(req "$P2" DELETE /v1/snapshots/viabridge)
case "$out" in 2*) ok "with polkitd back, our rules allow the bridge on the bus ($out)" ;;
*) not_ok "with polkitd back, our rules allow the bridge on the bus: $out" ;; esac
m2=$(req "$P2" GET /metrics | grep -E '^forkd_rest_dbus_calls_direct_total' | awk '{print $2}')
check "--no-direct made no direct call (${m2:-?})" [ "${m2:-x}" = 0 ]

# ---- without the option: the bridge is nobody special ----
stop_forkd
start_forkd
out=$(direct $UID_BR ListSnapshots "" '[]')
case "$out" in REFUSED*) ok "without the option, forkd refuses the bridge uid on the direct socket ($out)" ;;
*) not_ok "without the option, forkd refuses the bridge uid on the direct socket: $out" ;; esac
stop_forkd

# ---- forkd's own socket (no forkd.socket): the bridge's file, root's without the option ----
"$FORKD_DAEMON" --bus-address "$bus" --state-dir "$T/state" --trusted-bridge-user $UID_BR >>"$T/forkd.log" 2>&1 &
forkd_pid=$!
pids+=($forkd_pid)
for _ in $(seq 100); do [ -S "$T/state/bus.sock" ] && break; sleep 0.05; done
check "forkd's own bus.sock belongs to the bridge (a uid), mode 0600 ($(stat -c '%a %u' "$T/state/bus.sock"))" \
        [ "$(stat -c '%a %u' "$T/state/bus.sock")" = "600 $UID_BR" ]
stop_forkd
"$FORKD_DAEMON" --bus-address "$bus" --state-dir "$T/state" >>"$T/forkd.log" 2>&1 &
forkd_pid=$!
pids+=($forkd_pid)
for _ in $(seq 100); do [ "$(stat -c %u "$T/state/bus.sock" 2>/dev/null)" = 0 ] && break; sleep 0.05; done
check "without the option it is root's ($(stat -c '%a %u' "$T/state/bus.sock"))" \
        [ "$(stat -c '%a %u' "$T/state/bus.sock")" = "600 0" ]
stop_forkd

for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
pids=()
san=$(grep -h -E 'ERROR: (Address|Leak)Sanitizer|runtime error' "$T/forkd.log" "$T/rest.log" | head -n 3)
check "no sanitizer report from forkd or forkd-rest (an ASan build)${san:+: $san}" [ -z "$san" ]

[ "$failed" = 0 ] || { echo "# $failed failed; forkd log:"; tail -20 "$T/forkd.log" | diag; grep -i -E "direct|error" "$T/rest.log" | tail -20 | diag; exit 1; }
exit 0
