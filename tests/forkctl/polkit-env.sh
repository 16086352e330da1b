# SPDX-License-Identifier: LGPL-2.1-or-later
# shellcheck shell=bash
#
# The private bus and polkit world of the tests that need one (test-polkit.sh,
# test-ownership.sh, test-bridge.sh, test-doctor.sh, test-forkctl-errors.sh and
# bench/rest --installed), sourced by them. What bind-mounts runs only in their
# own mount namespace (unshare -m): nothing outside it changes. They set before
# calling what follows:
#   polkit_dir  our polkit/ sources (org.forkd.policy, org.forkd.rules)
#   POLKITD     the polkitd binary
# Sourcing it defines the TAP helpers ok, not_ok (counting n and failed), check
# WHAT CMD... and diag (stdin as TAP comments).
#
# polkit_env_scratch PREFIX
#       makes T, the scratch directory (/tmp/PREFIX.XXXXXX, mode 0755), and pids, the
#       processes started here; on exit every one of them is killed and T removed.
# polkit_env_users GID_FORKD NAME:UID[:forkd]...
#       bind-mounts copies of /etc/passwd and /etc/group holding these users (each
#       with a group of its own, the same number as its uid; ":forkd" makes it a
#       member of the group forkd, GID_FORKD), our policy and rules where polkitd
#       reads them, and an empty /etc/polkit-1/rules.d.
# polkit_env_bus [NAME...]
#       starts dbus-daemon (a system bus on $T/system_bus_socket where root may own
#       org.freedesktop.PolicyKit1 and the NAMEs), exports DBUS_SYSTEM_BUS_ADDRESS
#       and sets bus to it.
# polkit_env_polkitd
#       starts polkitd on it (polkitd_pid); returns 1 if it does not take its name.
# polkit_env_forkd SOCK BRIDGE_UID FORKD ARGS...
#       starts FORKD ARGS... socket-activated on SOCK as units/forkd.socket passes its
#       socket (the file BRIDGE_UID's, mode 0600, in a directory of mode 0711), with
#       systemd-socket-activate(1), which passes on only FORKD_VMM and the sanitizer
#       and debug settings; a first connection starts it (forkd_pid, output appended
#       to $T/forkd.log); returns 1 if it does not own org.forkd.Manager on $bus.

n=0; failed=0
ok()     { n=$((n + 1)); echo "ok $n - $*"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $*"; }
check()  { local what=$1; shift; if "$@"; then ok "$what"; else not_ok "$what"; fi; }
diag()   { sed 's/^/# /'; }

polkit_env_cleanup() {
        local p
        for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
        for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
        rm -rf "$T"
}

polkit_env_scratch() {
        T=$(mktemp -d "/tmp/$1.XXXXXX")
        chmod 755 "$T"
        pids=()
        trap polkit_env_cleanup EXIT
}

polkit_env_users() {
        local gid_forkd=$1 names=forkd members="" u name uid
        shift
        for u in "$@"; do names+="|${u%%:*}"; done
        mkdir -p "$T/actions" "$T/rules" "$T/etc-rules"
        cp "$polkit_dir/org.forkd.policy" "$T/actions/"
        cp "$polkit_dir/org.forkd.rules" "$T/rules/50-org.forkd.rules"
        grep -v -E "^($names):" /etc/passwd > "$T/passwd"
        grep -v -E "^($names):" /etc/group > "$T/group"
        for u in "$@"; do
                name=${u%%:*}; uid=${u#*:}; uid=${uid%%:*}
                echo "$name:x:$uid:$uid::/nonexistent:/usr/sbin/nologin" >> "$T/passwd"
                echo "$name:x:$uid:" >> "$T/group"
                case "$u" in *:forkd) members+="${members:+,}$name" ;; esac
        done
        echo "forkd:x:$gid_forkd:$members" >> "$T/group"
        chmod 644 "$T/passwd" "$T/group"
        mount --bind "$T/passwd" /etc/passwd
        mount --bind "$T/group" /etc/group
        mount --bind "$T/actions" /usr/share/polkit-1/actions
        mount --bind "$T/rules" /usr/share/polkit-1/rules.d
        mkdir -p /etc/polkit-1/rules.d 2>/dev/null
        mount --bind "$T/etc-rules" /etc/polkit-1/rules.d
}

polkit_env_bus() {
        local owns="" name
        for name in "$@"; do owns+="    <allow own=\"$name\"/>"$'\n'; done
        cat > "$T/bus.conf" <<XML
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=$T/system_bus_socket</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <allow send_type="method_call"/>
    <allow send_destination="org.freedesktop.DBus"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow send_type="signal"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
  </policy>
  <policy user="polkitd">
    <allow own="org.freedesktop.PolicyKit1"/>
  </policy>
  <policy user="root">
    <allow own="org.freedesktop.PolicyKit1"/>
$owns  </policy>
</busconfig>
XML
        dbus-daemon --config-file="$T/bus.conf" --nofork --nopidfile 2>"$T/dbus.log" &
        pids+=($!)
        export DBUS_SYSTEM_BUS_ADDRESS="unix:path=$T/system_bus_socket"
        bus=$DBUS_SYSTEM_BUS_ADDRESS
        for _ in $(seq 100); do [ -S "$T/system_bus_socket" ] && break; sleep 0.05; done
}

polkit_env_polkitd() {
        "$POLKITD" --no-debug >>"$T/polkitd.log" 2>&1 &
        polkitd_pid=$!
        pids+=($polkitd_pid)
        for _ in $(seq 100); do
                timeout 5 busctl --address="$bus" status org.freedesktop.PolicyKit1 >/dev/null 2>&1 && return 0
                sleep 0.1
        done
        return 1
}

polkit_env_forkd() {
        local sock=$1 uid=$2 keep=() k
        shift 2
        for k in FORKD_VMM ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS FORKD_LOG_DEBUG FORKD_NO_CONFINE; do
                if [ -n "${!k:-}" ]; then keep+=(-E "$k=${!k}"); fi
        done
        mkdir -p "$(dirname "$sock")"
        chmod 711 "$(dirname "$sock")"
        rm -f "$sock"
        systemd-socket-activate -l "$sock" "${keep[@]}" "$@" >>"$T/forkd.log" 2>&1 &
        forkd_pid=$!
        pids+=($forkd_pid)
        for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
        chown "$uid" "$sock"
        chmod 600 "$sock"
        /usr/bin/python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' "$sock"
        for _ in $(seq 100); do
                timeout 5 busctl --address="$bus" status org.forkd.Manager >/dev/null 2>&1 && return 0
                sleep 0.1
        done
        return 1
}
