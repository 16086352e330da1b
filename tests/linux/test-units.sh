#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# meson's 'units' test: the shipped units, bus files and polkit files
# under a real systemd. Outside, it boots the real-KVM test host (tests/host-vm/run) with
# this build directory carried in and runs itself there with --inside. Inside, as a
# package would: `meson install` with the build's own prefix, systemd-sysusers,
# `systemctl daemon-reload`, dbus ReloadConfig; then nothing is started by hand:
#   - a busctl call bus-activates forkd.service (dbus/org.forkd.Manager.service);
#   - an HTTP request to 127.0.0.1:8889 socket-activates forkd-rest.service, which runs
#     as its system user and reads the token through LoadCredential= (/etc/forkd/token);
#   - over REST: snapshot of the test guest, fork 2, ping, delete: forkd-rest is
#     authorized by polkit through polkit/org.forkd.rules;
#   - over D-Bus: a local user without the group "forkd" is refused, one in it and root
#     are allowed;
#   - the watchdog is exercised (a drop-in shortens WatchdogSec=), nothing restarts,
#     and `systemctl stop` leaves no forkd-vmm behind;
#   - forkd.socket: a connection to /run/forkd/bus.sock starts forkd, `systemctl stop
#     forkd` with the socket left in place leaves no VMM, scope, cgroup or record, and
#     the next connection starts it again.
# TAP. Usage: test-units.sh BUILD_DIR        (outside; boots the test host)
#             test-units.sh --inside BUILD_DIR (inside the test host, as root)
set -u

if [ "${1:-}" != --inside ]; then
        top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
        build=$(cd "${1:?usage: test-units.sh BUILD_DIR}" && pwd -P)
        [ -e "$build/tests/guest/forkd-test-guest.elf" ] ||
                { echo "Bail out! $build/tests/guest/forkd-test-guest.elf is not built"; exit 1; }
        case "$build/" in
        "$top"/*) export FORKD_HOST_VM_BUILD=0 FORKD_HOST_VM_BUILDDIR=${build#"$top"/} ;;
        *) echo "Bail out! $build is not inside the checkout $top"; exit 1 ;;
        esac
        # The checkout is copied to the same absolute path inside the test host.
        export FORKD_HOST_VM_STDIN=none PYTHONPATH=$top/tests/lib
        export FORKD_HOST_VM_PASSENV="${FORKD_HOST_VM_PASSENV:-} PYTHONPATH"
        exec "$top/tests/host-vm/run" -- bash tests/linux/test-units.sh --inside "$FORKD_HOST_VM_BUILDDIR"
fi

BUILD=$(cd "${2:?--inside needs BUILD_DIR}" && pwd -P)
GUEST=$BUILD/tests/guest/forkd-test-guest.elf
WORK=/srv/forkd-units-test       # not /tmp or /var/tmp: the units have PrivateTmp=
URL=http://127.0.0.1:8889
MGR=(org.forkd.Manager /org/forkd/Manager org.forkd.Manager)
n=0 failed=0

ok() { n=$((n + 1)); echo "ok $n - $*"; }
notok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $*"; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else notok "$what"; fi; }
result() { if [ "$1" = 0 ]; then ok "$2"; else notok "$2"; fi; }   # result $? DESCRIPTION
diag() { sed 's/^/# /'; }
bail() {
        echo "Bail out! $*"
        journalctl -b --no-pager -o short-monotonic -u forkd.service -u forkd-rest.service \
                -u forkd-rest.socket -u polkit.service -u dbus.service 2>&1 | tail -n 60 | diag
        exit 1
}
[ "$(id -u)" = 0 ] || bail "needs root"
[ "$(cat /proc/1/comm)" = systemd ] || bail "PID 1 is not systemd"

# curl_rest METHOD PATH [BODY] [--no-token]: prints the body, then the status on the last line.
curl_rest() {
        local method=$1 path=$2 body=${3:-} auth=(-H "Authorization: Bearer $TOKEN")
        [ "${4:-}" = --no-token ] && auth=()
        curl -sS --max-time 120 -X "$method" "${auth[@]}" ${body:+-H 'Content-Type: application/json' --data "$body"} \
                -w '\n%{http_code}\n' "$URL$path" 2>&1
}
status_of() { tail -n 1 <<<"$1"; }
body_of() { sed '$d' <<<"$1"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)" 2>/dev/null; }
vmms() { pgrep -x forkd-vmm | wc -l; }
is2xx() { [[ $1 = 20? ]]; }
sandboxes() { busctl call "${MGR[@]}" ListSandboxes | awk '{ print $2 }'; }

# ---- 1. install as a package would ----
prefix=$(meson introspect "$BUILD" --buildoptions | json '[o["value"] for o in d if o["name"]=="prefix"][0]')
echo "# meson prefix: $prefix"
if out=$(meson install -C "$BUILD" --no-rebuild 2>&1); then ok "meson install"; else
        notok "meson install"; diag <<<"$out"; fi
grep -E '^Installing ' <<<"$out" | grep -Ev '/(man|include)/' | diag
systemctl daemon-reload
# What a package's postinst does: the system users of sysusers.d, then reload systemd.
out=$(systemd-sysusers 2>&1); rc=$?
diag <<<"$out"
{ [ $rc = 0 ] && getent passwd forkd-rest >/dev/null && getent group forkd >/dev/null; }; result $? "systemd-sysusers creates forkd's users and group"
systemctl daemon-reload
unit_path=$(systemctl show -p FragmentPath --value forkd.service)
check "systemd finds forkd.service after daemon-reload (${unit_path:-nowhere})" [ -n "$unit_path" ]
for u in forkd.socket forkd-rest.service forkd-rest.socket; do
        p=$(systemctl show -p FragmentPath --value $u)
        check "systemd finds $u (${p:-nowhere})" [ -n "$p" ]
done
out=$(systemd-analyze verify --man=no forkd.service forkd.socket forkd-rest.service forkd-rest.socket 2>&1)
check "systemd-analyze verify of the four units is clean" [ -z "$out" ]
[ -z "$out" ] || diag <<<"$out"
busctl call org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus ReloadConfig >/dev/null ||
        bail "dbus ReloadConfig failed"
# dbus reads policies from /usr/share/dbus-1/system.d and /etc/dbus-1/system.d only; polkitd
# reads actions from /usr/share/polkit-1/actions and rules from {/etc,/usr/share}/polkit-1/rules.d.
check "bus policy installed where dbus-daemon reads it" [ -e /usr/share/dbus-1/system.d/org.forkd.Manager.conf ]
check "polkit actions installed where polkitd reads them" [ -e /usr/share/polkit-1/actions/org.forkd.policy ]
check "polkit rules installed where polkitd reads them" \
        [ -e /usr/share/polkit-1/rules.d/50-org.forkd.rules ] || [ -e /etc/polkit-1/rules.d/50-org.forkd.rules ]
actions=$(busctl call org.freedesktop.PolicyKit1 /org/freedesktop/PolicyKit1/Authority \
        org.freedesktop.PolicyKit1.Authority EnumerateActions s "" 2>&1)
for a in manage-snapshots fork run-code terminate manage-all; do
        check "polkitd knows org.forkd.$a" grep -q "\"org.forkd.$a\"" <<<"$actions"
done

# The token: written where forkd-rest.service's LoadCredential= takes it, root-only.
install -d -m 0700 /etc/forkd
TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
(umask 077 && printf '%s\n' "$TOKEN" >/etc/forkd/token)
mkdir -p "$WORK" && truncate -s 16M "$WORK/disk.img"
# The guest image where an installed, hardened forkd.service can read it: its
# PrivateTmp= and ProtectHome= hide checkouts under /tmp, /root and /home.
install -m 0644 "$GUEST" "$WORK/forkd-test-guest.elf"
GUEST=$WORK/forkd-test-guest.elf

# Shorten the watchdog so that a forkd that does not ping it is caught within the test.
mkdir -p /run/systemd/system/forkd.service.d
printf '[Service]\nWatchdogSec=4s\n' >/run/systemd/system/forkd.service.d/50-test-watchdog.conf
systemctl daemon-reload

# ---- 2. bus activation ----
check "forkd.service is not running before the first call" [ "$(systemctl is-active forkd.service)" != active ]
if out=$(busctl call --timeout=60 "${MGR[@]}" ListSnapshots 2>&1); then
        ok "busctl ListSnapshots bus-activates forkd"; else notok "busctl ListSnapshots bus-activates forkd"; diag <<<"$out"; fi
check "forkd.service is active after it" [ "$(systemctl is-active forkd.service)" = active ]
[ "$(systemctl is-active forkd.service)" = active ] || bail "forkd.service did not start"
FORKD_PID=$(systemctl show -p MainPID --value forkd.service)

# ---- 2b. socket activation and the token ----
systemctl start forkd-rest.socket || bail "cannot start forkd-rest.socket"
check "forkd-rest.service is not running before the first request" [ "$(systemctl is-active forkd-rest.service)" != active ]
r=$(curl_rest GET /v1/snapshots)
check "GET /v1/snapshots with the token: 200 (got $(status_of "$r"))" [ "$(status_of "$r")" = 200 ]
[ "$(status_of "$r")" = 200 ] || { body_of "$r" | diag; bail "forkd-rest does not answer"; }
check "the request socket-activated forkd-rest.service" [ "$(systemctl is-active forkd-rest.service)" = active ]
r=$(curl_rest GET /v1/snapshots '' --no-token)
check "GET /v1/snapshots without the token: 401 (got $(status_of "$r"))" [ "$(status_of "$r")" = 401 ]
r=$(curl -sS -o /dev/null -w '%{http_code}' -H "Authorization: Bearer x$TOKEN" $URL/v1/snapshots)
check "GET /v1/snapshots with a wrong token: 401 (got $r)" [ "$r" = 401 ]
REST_PID=$(systemctl show -p MainPID --value forkd-rest.service)
rest_uid=$(awk '/^Uid:/ { print $2 }' /proc/$REST_PID/status 2>/dev/null)
{ [ -n "$rest_uid" ] && [ "$rest_uid" != 0 ] && [ "$(getent passwd "$rest_uid" | cut -d: -f1)" = forkd-rest ]; }; result $? "forkd-rest runs as the unprivileged user forkd-rest (uid ${rest_uid:-?})"
capeff=$(awk '/^CapEff:/ { print $2 }' /proc/$REST_PID/status 2>/dev/null)
check "forkd-rest has no capabilities (CapEff ${capeff:-?})" [ "$capeff" = 0000000000000000 ]

# ---- 3. REST as forkd-rest's user, authorized by polkit ----
r=$(curl_rest POST /v1/snapshots "{\"tag\":\"units1\",\"kernel\":\"$GUEST\",\"rootfs\":\"$WORK/disk.img\",\"mem_mib\":64,\"boot_wait_secs\":60}")
check "POST /v1/snapshots of the test guest: 2xx (got $(status_of "$r"))" is2xx "$(status_of "$r")"
is2xx "$(status_of "$r")" || body_of "$r" | diag
r=$(curl_rest POST /v1/sandboxes '{"snapshot_tag":"units1","n":2}')
ids=$(body_of "$r" | json '" ".join(s["id"] for s in d)')
{ is2xx "$(status_of "$r")" && [ "$(wc -w <<<"$ids")" = 2 ]; }; result $? "POST /v1/sandboxes n=2: 2xx with 2 ids (got $(status_of "$r"): $ids)"
[ "$(wc -w <<<"$ids")" = 2 ] || body_of "$r" | diag
first=${ids%% *}
r=$(curl_rest POST "/v1/sandboxes/${first:-none}/ping" '{}')
check "POST /v1/sandboxes/$first/ping: 200 (got $(status_of "$r"))" [ "$(status_of "$r")" = 200 ]
for id in $ids; do
        r=$(curl_rest DELETE "/v1/sandboxes/$id")
        check "DELETE /v1/sandboxes/$id: 2xx (got $(status_of "$r"))" is2xx "$(status_of "$r")"
done

# ---- 3b. D-Bus: local users without the group are refused, with it and root allowed ----
id forkdnobody >/dev/null 2>&1 || useradd -M -s /usr/sbin/nologin forkdnobody
id forkdmember >/dev/null 2>&1 || useradd -M -s /usr/sbin/nologin -G forkd forkdmember
out=$(runuser -u forkdnobody -- busctl call --timeout=30 "${MGR[@]}" Fork "sua{sv}" units1 1 0 2>&1)
rc=$?
echo "# forkdnobody: $out"
check "a user without the group is refused Fork over D-Bus" [ $rc != 0 ]
check "... with a clear error (access denied / not authorized)" grep -qiE 'denied|not authori|authentication' <<<"$out"
check "... and no sandbox was made" [ "$(sandboxes)" = 0 ]
# busctl prints every AccessDenied as "Access denied"; dbus-send shows forkd's message.
out=$(runuser -u forkdnobody -- dbus-send --system --print-reply --reply-timeout=30000 --dest=org.forkd.Manager \
        /org/forkd/Manager org.forkd.Manager.CreateSnapshot string:units2 string:"$GUEST" string:"$WORK/disk.img" \
        uint32:64 uint32:60 2>&1)
rc=$?
echo "# forkdnobody: $out"
{ [ $rc != 0 ] && grep -q 'AccessDenied' <<<"$out" && grep -q "polkit" <<<"$out" && grep -q 'org.forkd.manage-snapshots' <<<"$out"; }; result $? "a user without the group is refused CreateSnapshot by polkit, the message naming the action"
check "... and no snapshot units2 exists" sh -c '! test -e /var/lib/forkd/snapshots/units2'
out=$(runuser -u forkdmember -- busctl --json=short call --timeout=60 "${MGR[@]}" Fork "sua{sv}" units1 1 0 2>&1)
rc=$?
check "a member of the group forkd may Fork over D-Bus" [ $rc = 0 ]
[ $rc = 0 ] || echo "# forkdmember: $out"
out=$(busctl --json=short call --timeout=60 "${MGR[@]}" Fork "sua{sv}" units1 1 0 2>&1)
rc=$?
check "root may Fork over D-Bus" [ $rc = 0 ]
[ $rc = 0 ] || echo "# root: $out"
check "two sandboxes are left running for stop to clean up ($(vmms) forkd-vmm with the template)" [ "$(sandboxes)" = 2 ]

# ---- 4. health, watchdog, stop ----
sleep 10   # > 2 x the test's WatchdogSec=4s
{ [ "$(systemctl is-active forkd.service)" = active ] && [ "$(systemctl show -p MainPID --value forkd.service)" = "$FORKD_PID" ]; }; result $? "forkd.service active, same PID after 10 s with WatchdogSec=4s"
{ [ "$(systemctl show -p NRestarts --value forkd.service)" = 0 ] && [ "$(systemctl show -p Result --value forkd.service)" = success ]; }; result $? "forkd.service: no restarts, result success"
wd=$(systemctl show -p WatchdogTimestampMonotonic --value forkd.service)
check "forkd pinged the watchdog (WatchdogTimestampMonotonic=$wd)" [ "${wd:-0}" != 0 ]
{ [ "$(systemctl is-active forkd-rest.service)" = active ] && [ "$(systemctl show -p NRestarts --value forkd-rest.service)" = 0 ]; }; result $? "forkd-rest.service active, no restarts"
systemctl status --no-pager forkd.service forkd-rest.service 2>&1 | head -n 30 | diag
# Why forkd-rest cannot be a DynamicUser= service: dbus-daemon skips dynamic users in NSS.
{ tr "\\0" "\\n" </proc/"$(pgrep -x dbus-daemon | head -n 1)"/environ | grep NSS | sed "s/^/dbus-daemon: /" | diag; } 2>/dev/null

r=$(curl_rest DELETE /v1/snapshots/units1?force=true)
check "DELETE /v1/snapshots/units1?force=true (2 sandboxes of it alive): 2xx (got $(status_of "$r"))" is2xx "$(status_of "$r")"
is2xx "$(status_of "$r")" || body_of "$r" | diag

systemctl stop forkd-rest.socket forkd-rest.service forkd.service
check "systemctl stop: all three inactive" \
        [ "$(systemctl is-active forkd.service forkd-rest.service forkd-rest.socket | sort -u | tr '\n' ' ')" = "inactive " ]
check "systemctl stop: no forkd-vmm left ($(vmms))" [ "$(vmms)" = 0 ]
check "forkd.service stopped cleanly (Result=$(systemctl show -p Result --value forkd.service))" \
        [ "$(systemctl show -p Result --value forkd.service)" = success ]

# ---- 5. forkd.socket: forkd starts on its first direct connection ----
# direct CALL...: a root client of forkd's direct socket (tests/lib/dbusmini.py, on the
# PYTHONPATH carried in; no bus daemon in between); prints the reply's body as JSON.
SOCK=/run/forkd/bus.sock
direct() {
        python3 - "$SOCK" "$@" <<'PY'
import json, sys
from dbusmini import Bus
sock, member, sig, args = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
iface, path = "org.forkd.Manager", "/org/forkd/Manager"
b = Bus("unix:path=" + sock, timeout=120, hello=False)
if member == "Get":
    print(json.dumps(b.call(iface, path, "org.freedesktop.DBus.Properties", "Get", "ss", [iface, args[0]])))
else:
    if member == "Fork":  # a{sv} values as [signature, value]
        args[2] = {k: tuple(v) for k, v in args[2].items()}
    print(json.dumps(b.call(iface, path, iface, member, sig, args, 120)))
PY
}
systemctl enable forkd.socket 2>&1 | diag
check "forkd.socket is enabled (sockets.target wants it)" [ "$(systemctl is-enabled forkd.socket)" = enabled ]
systemctl start forkd.socket || bail "cannot start forkd.socket"
check "forkd.socket listening, forkd.service not running" \
        [ "$(systemctl is-active forkd.socket)/$(systemctl is-active forkd.service)" = active/inactive ]
# The file is the trusted bridge's (forkd.service: --trusted-bridge-user=forkd-rest),
# its directory lets that user reach it by name.
check "$SOCK is a socket, mode 0600, owned by forkd-rest ($(stat -c '%A %U' $SOCK 2>&1))" \
        [ "$(stat -c '%F %a %U' $SOCK 2>/dev/null)" = "socket 600 forkd-rest" ]
check "/run/forkd is root's, mode 0711 ($(stat -c '%a %U' /run/forkd 2>&1))" \
        [ "$(stat -c '%a %u' /run/forkd 2>/dev/null)" = "711 0" ]
out=$(direct ListSnapshots "" '[]' 2>&1); rc=$?
{ [ $rc = 0 ] && [ "$out" = '[[]]' ]; }; result $? "a direct connection to $SOCK socket-activates forkd and is served (ListSnapshots: $out)"
check "forkd.service is active after it" [ "$(systemctl is-active forkd.service)" = active ]
out=$(direct Get "" '["DirectSocket"]' 2>&1)
check "DirectSocket names the passed socket ($out)" [ "$out" = "[\"$SOCK\"]" ]
check "forkd did not bind a socket of its own in its state directory" [ ! -e /var/lib/forkd/bus.sock ]
out=$(direct CreateSnapshot sssuu "[\"units2\", \"$GUEST\", \"$WORK/disk.img\", 64, 60]" 2>&1)
result $? "CreateSnapshot over the direct socket" || diag <<<"$out"
out=$(direct Fork 'sua{sv}' '["units2", 2, {"memory_limit_mib": ["u", 64]}]' 2>&1)
result $? "Fork 2 over the direct socket" || diag <<<"$out"
# forkd-sb-<id>.scope per sandbox with a memory limit, forkd-tpl-<pid>.scope per fork template
scopes() { systemctl list-units --all --plain --no-legend "forkd-${1:-*}.scope" | grep -c . ; }
check "two sandboxes running ($(sandboxes)), $(vmms) forkd-vmm, $(scopes 'sb-*') sandbox scopes (memory limits), $(scopes 'tpl-*') template scope" \
        [ "$(sandboxes)/$(vmms)/$(scopes 'sb-*')/$(scopes 'tpl-*')" = 2/3/2/1 ]
out=$(systemctl stop forkd.service 2>&1)
diag <<<"$out"
check "systemctl stop forkd.service: forkd inactive, forkd.socket still listening" \
        [ "$(systemctl is-active forkd.service)/$(systemctl is-active forkd.socket)" = inactive/active ]
check "after stop: no forkd-vmm ($(vmms))" [ "$(vmms)" = 0 ]
check "after stop: no forkd scope left ($(scopes))" [ "$(scopes)" = 0 ]
left=$(find /sys/fs/cgroup -name 'forkd-sb-*' 2>/dev/null | head -n 5)
check "after stop: no forkd cgroup left (${left:-none})" [ -z "$left" ]
left=$(ls -A /var/lib/forkd/sandboxes 2>/dev/null | head -n 5)
check "after stop: no sandbox record left (${left:-none})" [ -z "$left" ]
check "after stop: $SOCK is still there" [ -S "$SOCK" ]
out=$(direct ListSnapshots "" '[]' 2>&1); rc=$?
{ [ $rc = 0 ] && grep -q '"units2"' <<<"$out"; }; result $? "the next connection starts forkd again, with its snapshots"
check "forkd.service active again" [ "$(systemctl is-active forkd.service)" = active ]
check "no sandbox survived the stop ($(sandboxes))" [ "$(sandboxes)" = 0 ]
direct DeleteSnapshot sbb '["units2", true, true]' >/dev/null 2>&1
systemctl stop forkd.socket forkd.service
systemctl disable forkd.socket 2>&1 | diag
check "forkd.socket and forkd.service stopped" \
        [ "$(systemctl is-active forkd.socket forkd.service | sort -u | tr '\n' ' ')" = "inactive " ]

if [ $failed != 0 ]; then
        echo "# journal of the units:"
        journalctl -b --no-pager -o short-monotonic -u forkd.service -u forkd-rest.service \
                -u forkd-rest.socket -u polkit.service 2>&1 | tail -n 80 | diag
fi
echo "1..$n"
[ $failed = 0 ]
