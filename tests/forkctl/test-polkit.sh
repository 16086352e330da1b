#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# bus_verify_polkit_async() against a real polkitd on a private system bus.
#
# The machine is never changed: the test re-executes itself in a private mount
# namespace (unshare -m) and bind-mounts, only there,
#   - copies of /etc/passwd and /etc/group holding two throwaway users:
#     forkd-pk-in (member of group "forkd") and forkd-pk-out (not),
#   - our polkit/org.forkd.policy over /usr/share/polkit-1/actions,
#   - our polkit/org.forkd.rules over /usr/share/polkit-1/rules.d, and an empty
#     dir over /etc/polkit-1/rules.d,
# then starts dbus-daemon (own config) and /usr/lib/polkit-1/polkitd in it.
#
# Checks, against test-polkit-service (links src/daemon/polkit.c):
#   root allowed without a polkit round trip, the group member allowed after
#   one, the outsider refused with org.freedesktop.DBus.Error.AccessDenied
#   naming the action; with polkitd gone, the outsider is refused at once
#   (no hang) and root still allowed; no query is left in the registry.
# If $FORKD_DAEMON is an executable, the same allow/deny check runs against forkd,
# and with $FORKD_TEST_GUEST and /dev/kvm also MergeSandbox, DiffSandboxes and
# RunCode on live sandboxes (outsider refused, member allowed).
#
# usage: test-polkit.sh SERVICE-BINARY POLKIT-SOURCE-DIR
# Output: TAP. Exit 77 (skip) when polkitd, unshare or root are missing.

set -u
service=${1:?usage: test-polkit.sh SERVICE-BINARY POLKIT-DIR}
polkit_dir=${2:?usage: test-polkit.sh SERVICE-BINARY POLKIT-DIR}
POLKITD=${POLKITD:-/usr/lib/polkit-1/polkitd}

skip() { echo "1..0 # SKIP $*"; exit 77; }

if [ -z "${FORKD_PK_INNER:-}" ]; then
        [ -x "$POLKITD" ] || skip "polkitd not installed ($POLKITD)"
        [ "$(id -u)" = 0 ] || skip "needs root (mount namespace, setpriv)"
        command -v dbus-daemon >/dev/null || skip "dbus-daemon not installed"
        command -v busctl >/dev/null || skip "busctl not installed"
        command -v setpriv >/dev/null || skip "setpriv not installed"
        command -v dbus-send >/dev/null || skip "dbus-send not installed"
        unshare -m --propagation private true 2>/dev/null || skip "cannot create a mount namespace"
        FORKD_PK_INNER=1 exec unshare -m --propagation private "$0" "$@"
fi

# ---- inside the private mount namespace ----
. "$(dirname "$(realpath "$0")")/polkit-env.sh"
service=$(realpath "$service")
polkit_dir=$(realpath "$polkit_dir")
polkit_env_scratch forkd-polkit-test

UID_IN=61771; UID_OUT=61772; GID_FORKD=61770
polkit_env_users $GID_FORKD forkd-pk-in:$UID_IN:forkd forkd-pk-out:$UID_OUT
polkit_env_bus org.forkd.PolkitTest org.forkd.Manager
polkit_env_polkitd

echo "1..24"
if timeout 5 busctl --address="$bus" status org.freedesktop.PolicyKit1 >/dev/null 2>&1; then
        ok "polkitd owns org.freedesktop.PolicyKit1 on the private bus"
else
        not_ok "polkitd owns org.freedesktop.PolicyKit1 on the private bus"
        sed 's/^/# /' "$T/polkitd.log"
        exit 1
fi

"$service" org.forkd.PolkitTest 2>"$T/service.log" &
service_pid=$!
pids+=($service_pid)
for _ in $(seq 100); do
        timeout 5 busctl --address="$bus" status org.forkd.PolkitTest >/dev/null 2>&1 && break
        sleep 0.05
done

# call UID GID [extra setpriv args...] -- busctl args: prints "rc<TAB>output"
call_as() {
        local uid=$1 gid=$2 groups=$3; shift 3
        local out rc
        if [ "$uid" = 0 ]; then
                out=$(busctl --address="$bus" --timeout=30 call "$@" 2>&1); rc=$?
        else
                out=$(setpriv --reuid="$uid" --regid="$gid" --groups="$groups" \
                        busctl --address="$bus" --timeout=30 call "$@" 2>&1); rc=$?
        fi
        echo "$rc $out"
}
# dsend UID GID GROUPS: Fork via dbus-send, which prints the error name and message
dsend() {
        setpriv --reuid="$1" --regid="$2" --groups="$3" \
                dbus-send --bus="$bus" --print-reply --reply-timeout=30000 --dest=org.forkd.PolkitTest \
                /org/forkd/PolkitTest org.forkd.PolkitTest.Fork string:base 2>&1
}
fork_as() { call_as "$@" org.forkd.PolkitTest /org/forkd/PolkitTest org.forkd.PolkitTest Fork s base; }
runs() { busctl --address="$bus" call org.forkd.PolkitTest /org/forkd/PolkitTest org.forkd.PolkitTest LastRuns | awk '{print $2}'; }
pending() { busctl --address="$bus" call org.forkd.PolkitTest /org/forkd/PolkitTest org.forkd.PolkitTest Pending | awk '{print $2}'; }

res=$(fork_as 0 0 0)
[ "$res" = '0 s "authorized"' ] && ok "root is allowed" || not_ok "root is allowed: $res"
[ "$(runs)" = 1 ] && ok "root is allowed without asking polkit (handler ran once)" || not_ok "root handler runs: $(runs)"

res=$(fork_as $UID_IN $UID_IN $GID_FORKD)
[ "$res" = '0 s "authorized"' ] && ok "member of group forkd is allowed" || not_ok "member of group forkd is allowed: $res"
[ "$(runs)" = 2 ] && ok "member: polkit asked asynchronously, message re-dispatched (handler ran twice)" \
        || not_ok "member handler runs: $(runs)"

res=$(dsend $UID_OUT $UID_OUT $UID_OUT)
echo "# outsider: $res"
case "$res" in
*"Access denied: polkit does not allow uid $UID_OUT to perform action 'org.forkd.fork'"*)
        ok "outsider is refused with a message naming the action" ;;
*)      not_ok "outsider is refused with a message naming the action: $res" ;;
esac
case "$res" in
"Error org.freedesktop.DBus.Error.AccessDenied: "*) ok "outsider gets org.freedesktop.DBus.Error.AccessDenied" ;;
*) not_ok "outsider gets org.freedesktop.DBus.Error.AccessDenied: $res" ;;
esac

[ "$(pending)" = 0 ] && ok "no query left in the registry" || not_ok "queries left in the registry: $(pending)"

# polkitd goes away: non-root refused at once, root still allowed.
kill "$polkitd_pid"; wait "$polkitd_pid" 2>/dev/null
start=$(date +%s)
res=$(dsend $UID_IN $UID_IN $GID_FORKD)
elapsed=$(( $(date +%s) - start ))
echo "# without polkitd: $res (${elapsed}s)"
case "$res" in
*"polkit (org.freedesktop.PolicyKit1) is not available"*) ok "without polkitd, non-root is refused with a clear error" ;;
*) not_ok "without polkitd, non-root is refused with a clear error: $res" ;;
esac
[ "$elapsed" -le 5 ] && ok "without polkitd, the refusal does not hang (${elapsed}s)" || not_ok "refusal took ${elapsed}s"
res=$(fork_as 0 0 0)
[ "$res" = '0 s "authorized"' ] && ok "without polkitd, root is still allowed" || not_ok "root without polkitd: $res"

# From here on the member may fork but not pause (read by the polkitd started next):
# a fork whose deadline pauses is refused it, naming org.forkd.pause.
cat >"$T/etc-rules/10-forkd-test-nopause.rules" <<EOF
polkit.addRule(function(action, subject) {
        if (action.id == "org.forkd.pause" && subject.user == "forkd-pk-in")
                return polkit.Result.NO;
        return polkit.Result.NOT_HANDLED;
});
EOF

# A query still pending at exit: polkitd stopped (SIGSTOP) while a member asks.
polkit_env_polkitd
kill -STOP "$polkitd_pid"
(fork_as $UID_IN $UID_IN $GID_FORKD >/dev/null 2>&1) &
caller=$!
for _ in $(seq 50); do [ "$(pending)" = 1 ] && break; sleep 0.1; done
[ "$(pending)" = 1 ] && ok "a query is pending while polkitd does not answer" || not_ok "pending queries: $(pending)"

# The service frees its registry (with the pending query) on SIGTERM and exits 0
# (under ASan: no leaks).
kill -TERM "$service_pid"; wait "$service_pid"; rc=$?
[ $rc = 0 ] && ok "service exits cleanly with a query pending, registry freed (exit 0)" || { not_ok "service exit status $rc"; sed 's/^/# /' "$T/service.log"; }
kill "$caller" 2>/dev/null; wait "$caller" 2>/dev/null
kill -CONT "$polkitd_pid"

# The real daemon, when it has landed.
if [ -n "${FORKD_DAEMON:-}" ] && [ -x "$FORKD_DAEMON" ]; then
        mkdir -p "$T/state"
        "$FORKD_DAEMON" --state-dir "$T/state" >"$T/forkd.log" 2>&1 &
        pids+=($!)
        for _ in $(seq 100); do timeout 5 busctl --address="$bus" status org.forkd.Manager >/dev/null 2>&1 && break; sleep 0.1; done
        # CreateSnapshot: its authorization comes before anything that
        # depends on state (Fork of an unknown tag answers NoSuchSnapshot to
        # anyone, as ListSnapshots shows the tags to anyone anyway).
        mfork() { call_as "$@" org.forkd.Manager /org/forkd/Manager org.forkd.Manager CreateSnapshot 'sssuu' polkit-probe /nonexistent/kernel /nonexistent/rootfs 0 1; }
        res=$(mfork $UID_OUT $UID_OUT $UID_OUT)
        case "$res" in
        *"Access denied"*) ok "forkd: outsider refused ($res)" ;;
        *) not_ok "forkd: outsider refused: $res"; sed 's/^/# /' "$T/forkd.log" ;;
        esac
        # CreateSnapshot by path is root's: forkd would open the paths as root.
        res=$(setpriv --reuid=$UID_IN --regid=$UID_IN --groups=$GID_FORKD \
                dbus-send --bus="$bus" --print-reply --reply-timeout=30000 --dest=org.forkd.Manager /org/forkd/Manager \
                org.forkd.Manager.CreateSnapshot string:polkit-probe string:/nonexistent/kernel \
                string:/nonexistent/rootfs uint32:0 uint32:1 2>&1)
        case "$res" in
        *"AccessDenied"*"CreateSnapshotFromFds"*) ok "forkd: member refused CreateSnapshot by path, pointed at CreateSnapshotFromFds" ;;
        *) not_ok "forkd: member refused CreateSnapshot by path: $res" ;;
        esac
        # ... and allowed past polkit with descriptors (/dev/null: not a regular file).
        res=$(call_as $UID_IN $UID_IN $GID_FORKD org.forkd.Manager /org/forkd/Manager org.forkd.Manager \
                CreateSnapshotFromFds 'shhuua{sv}' polkit-probe 0 0 0 1 0 </dev/null)
        case "$res" in
        *"Access denied"*|"") not_ok "forkd: member allowed past polkit: $res" ;;
        *) ok "forkd: member allowed past polkit ($res)" ;;
        esac
        # merge, diff and run_code on live sandboxes of the test guest: their
        # lookups come first, so this needs sandboxes (and /dev/kvm).
        if [ -n "${FORKD_TEST_GUEST:-}" ] && [ -r "$FORKD_TEST_GUEST" ] && [ -w /dev/kvm ]; then
                truncate -s 8M "$T/rootfs.img"
                mgr() { busctl --address="$bus" --timeout=60 --json=short call org.forkd.Manager /org/forkd/Manager org.forkd.Manager "$@"; }
                mgr CreateSnapshot 'sssuu' pk "$FORKD_TEST_GUEST" "$T/rootfs.img" 0 10 >/dev/null
                mapfile -t sb < <(mgr Fork 'sua{sv}' pk 2 0 |
                        python3 -c 'import json, sys; print("\n".join(d["id"]["data"] for d in json.load(sys.stdin)["data"][0]))')
                m_as() { call_as "$1" "$2" "$3" org.forkd.Manager /org/forkd/Manager org.forkd.Manager "${@:4}"; }
                for verb in "MergeSandbox ss ${sb[0]:-x} ${sb[1]:-y}" "DiffSandboxes ssas ${sb[0]:-x} ${sb[1]:-y} 0" \
                            "RunCode ssu ${sb[0]:-x} x 0"; do
                        # shellcheck disable=SC2086
                        res=$(m_as $UID_OUT $UID_OUT $UID_OUT $verb)
                        case "$res" in
                        *"Access denied"*) ok "forkd: outsider refused ${verb%% *}" ;;
                        *) not_ok "forkd: outsider refused ${verb%% *}: $res"; sed 's/^/# /' "$T/forkd.log" | tail -5 ;;
                        esac
                done
                # The member's own two: root's are not the member's (org.forkd.manage-all).
                mapfile -t sb < <(setpriv --reuid=$UID_IN --regid=$UID_IN --groups=$GID_FORKD \
                        busctl --address="$bus" --timeout=60 --json=short call org.forkd.Manager /org/forkd/Manager \
                        org.forkd.Manager Fork 'sua{sv}' pk 2 0 |
                        python3 -c 'import json, sys; print("\n".join(d["id"]["data"] for d in json.load(sys.stdin)["data"][0]))')
                res=$(m_as $UID_IN $UID_IN $GID_FORKD DiffSandboxes ssas "${sb[0]:-x}" "${sb[1]:-y}" 0)
                [ "$res" = "0 asasas 0 0 0" ] && ok "forkd: member may diff (nothing differs)" || not_ok "forkd: member diff: $res"
                res=$(m_as $UID_IN $UID_IN $GID_FORKD MergeSandbox ss "${sb[0]:-x}" "${sb[1]:-y}")
                case "$res" in
                "0 a{sv} "*"\"${sb[0]:-x}\""*) ok "forkd: member may merge" ;;
                *) not_ok "forkd: member merge: $res" ;;
                esac
                # A deadline that pauses is a pause: refused to a member who may fork but not pause
                # (the rule above), for Fork and for ForkSandboxEx; the same Fork with a deadline
                # that kills is the member's, so the refusal is the pause's.
                res=$(m_as $UID_IN $UID_IN $GID_FORKD Fork 'sua{sv}' pk 1 2 timeout_secs u 600 on_timeout s pause)
                case "$res" in
                "1 "*"Access denied"*) ok "forkd: Fork with on_timeout pause needs org.forkd.pause" ;;
                *) not_ok "forkd: Fork with on_timeout pause needs org.forkd.pause: $res" ;;
                esac
                res=$(m_as $UID_IN $UID_IN $GID_FORKD ForkSandboxEx 'sua{sv}' "${sb[0]:-x}" 1 2 timeout_secs u 600 on_timeout s pause)
                case "$res" in
                "1 "*"Access denied"*) ok "forkd: ForkSandboxEx with on_timeout pause needs org.forkd.pause" ;;
                *) not_ok "forkd: ForkSandboxEx with on_timeout pause needs org.forkd.pause: $res" ;;
                esac
                res=$(m_as $UID_IN $UID_IN $GID_FORKD Fork 'sua{sv}' pk 1 2 timeout_secs u 600 on_timeout s kill)
                case "$res" in
                "0 aa{sv} 1 "*) ok "forkd: Fork with on_timeout kill is the member's" ;;
                *) not_ok "forkd: Fork with on_timeout kill is the member's: $res" ;;
                esac
                for id in $(mgr ListSandboxes | python3 -c 'import json, sys; print(" ".join(d["id"]["data"] for d in json.load(sys.stdin)["data"][0]))'); do
                        mgr TerminateSandbox s "$id" >/dev/null 2>&1
                done
        else
                for v in "outsider refused MergeSandbox" "outsider refused DiffSandboxes" "outsider refused RunCode" \
                         "member may diff" "member may merge" \
                         "on_timeout pause: Fork" "on_timeout pause: ForkSandbox" "on_timeout kill"; do
                        n=$((n + 1)); echo "ok $n # SKIP no test guest or /dev/kvm; forkd: $v"
                done
        fi
else
        n=$((n + 1)); echo "ok $n # SKIP forkd not built; daemon: outsider refused"
        n=$((n + 1)); echo "ok $n # SKIP forkd not built; daemon: member refused CreateSnapshot by path"
        n=$((n + 1)); echo "ok $n # SKIP forkd not built; daemon: member allowed"
        for v in "outsider refused MergeSandbox" "outsider refused DiffSandboxes" "outsider refused RunCode" \
                 "member may diff" "member may merge" \
                         "on_timeout pause: Fork" "on_timeout pause: ForkSandbox" "on_timeout kill"; do
                n=$((n + 1)); echo "ok $n # SKIP forkd not built; daemon: $v"
        done
fi

[ "$failed" = 0 ] || { echo "# $failed failed; service log:"; sed 's/^/# /' "$T/service.log"; exit 1; }
exit 0
