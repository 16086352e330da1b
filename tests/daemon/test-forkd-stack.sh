#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# tools/forkd-stack against the real thing (private dbus-daemon, forkd with
# forkd-vmm on /dev/kvm, forkd-rest): up prints exactly the five variables;
# busctl --address=$FORKD_BUS_ADDRESS introspect org.forkd.Manager
# /org/forkd/Manager shows every method of dbus/org.forkd.Manager.xml; the API
# answers on FORKD_URL with the token in FORKD_TOKEN_FILE, and the default guest
# (FORKD_GUEST_KERNEL, FORKD_GUEST_ROOTFS) is snapshotted, forked, pinged and
# deleted through it; a second up on the same state dir is refused; down stops
# every process it started, VMMs included.
#
# usage: test-forkd-stack.sh SOURCE-ROOT     ($FORKD_BUILD_DIR: the build dir)
# TAP output; a missing prerequisite is a TAP skip (exit 0).

set -u
top=${1:?usage: test-forkd-stack.sh SOURCE-ROOT}
build=${FORKD_BUILD_DIR:?FORKD_BUILD_DIR must name the build dir}

skip() { echo "1..0 # SKIP $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root (forkd allows root without polkit)"
[ -c /dev/kvm ] || skip "no /dev/kvm"
for tool in busctl dbus-daemon python3 setsid flock; do
        command -v $tool >/dev/null || skip "$tool is missing"
done

state=$(mktemp -d /tmp/forkd-stack-test.XXXXXX)
port=$((20000 + RANDOM % 12000)) # below the ephemeral ports (32768-60999), which clients hold
stack() { FORKD_BUILD_DIR=$build FORKD_STACK_NO_BUILD=1 "$top/tools/forkd-stack" "$@"; }
cleanup() {
        stack down --state-dir "$state" >/dev/null 2>&1
        rm -rf "$state"
}
trap cleanup EXIT

n=0 failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() {
        n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"
        local title=$1 why
        shift
        [ $# -gt 0 ] || return 0
        why=$(printf '%s\n' "$@" | sed 's/^/# /')
        printf '%s\n' "$why"
        # and on stderr, which is all that meson's --print-errorlogs shows
        printf 'not ok %s - %s\n%s\n' "$n" "$title" "$why" >&2
}

# HTTP with the token: http METHOD PATH [JSON-BODY] -> "STATUS BODY" on stdout.
http() {
        python3 - "$FORKD_URL" "$FORKD_TOKEN_FILE" "$@" <<'EOF'
import sys, urllib.request, urllib.error
url, token_file, method, path = sys.argv[1:5]
body = sys.argv[5].encode() if len(sys.argv) > 5 else None
token = open(token_file).read().strip() if token_file != "-" else None
req = urllib.request.Request(url + path, data=body, method=method)
if token:
    req.add_header("Authorization", "Bearer " + token)
if body is not None:
    req.add_header("Content-Type", "application/json")
try:
    with urllib.request.urlopen(req, timeout=300) as r:
        status, data = r.status, r.read()
except urllib.error.HTTPError as e:
    status, data = e.code, e.read()
print(status, data.decode(errors="replace"))
EOF
}
# running PID: the process exists and is not a zombie.
running() { [ -e "/proc/$1" ] && ! grep -q '^[0-9]* (.*) Z ' "/proc/$1/stat" 2>/dev/null; }
# jsonq EXPR: evaluates EXPR on the JSON document j read from stdin, prints the result.
jsonq() { python3 -c 'import json, sys; j = json.load(sys.stdin); r = eval(sys.argv[1]); print(r if not isinstance(r, (list, dict)) else json.dumps(r))' "$1"; }

# ---- up ----
out=$(stack up --state-dir "$state" --port "$port" 2>"$state.up.log")
rc=$?
if [ $rc = 0 ] && [ "$(cut -d= -f1 <<<"$out" | tr '\n' ' ')" = \
        "FORKD_BUS_ADDRESS FORKD_URL FORKD_TOKEN_FILE FORKD_GUEST_KERNEL FORKD_GUEST_ROOTFS " ]; then
        ok "forkd-stack up prints FORKD_BUS_ADDRESS, FORKD_URL, FORKD_TOKEN_FILE, FORKD_GUEST_KERNEL, FORKD_GUEST_ROOTFS"
else
        notok "forkd-stack up (exit $rc)" "$out" "$(cat "$state.up.log")"
        rm -f "$state.up.log"
        echo "1..$n"
        exit 1
fi
rm -f "$state.up.log"
eval "$out"
[ -n "$FORKD_URL" ] && [ -s "$FORKD_TOKEN_FILE" ] && [ -f "$FORKD_GUEST_KERNEL" ] && [ -f "$FORKD_GUEST_ROOTFS" ] &&
        ok "FORKD_URL is set, the token file and the default guest exist" ||
        notok "FORKD_URL, token file or guest missing" "$out"

# ---- D-Bus ----
intro=$(busctl --address="$FORKD_BUS_ADDRESS" introspect org.forkd.Manager /org/forkd/Manager 2>&1)
methods=$(python3 - "$top/dbus/org.forkd.Manager.xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
for i in ET.parse(sys.argv[1]).getroot().iter("interface"):
    if i.get("name") == "org.forkd.Manager":
        print(" ".join(m.get("name") for m in i.iter("method")))
EOF
)
missing=
for m in $methods; do
        grep -Eq "^\.$m +method " <<<"$intro" || missing="$missing $m"
done
if [ -n "$methods" ] && [ -z "$missing" ] && grep -q '^org.forkd.Manager  *interface' <<<"$intro"; then
        ok "busctl --address=\$FORKD_BUS_ADDRESS introspect org.forkd.Manager /org/forkd/Manager shows the methods ($methods)"
else
        notok "busctl introspect shows the methods (missing:${missing:- all})" "$intro"
fi

# ---- REST ----
r=$(FORKD_TOKEN_FILE=- http GET /healthz)
[ "$r" = '200 {"ok":true}' ] || [ "$(jsonq 'j' <<<"${r#* }" 2>/dev/null)" = '{"ok": true}' ] &&
        ok "GET \$FORKD_URL/healthz" || notok "GET /healthz" "$r"
r1=$(FORKD_TOKEN_FILE=- http GET /version)
r2=$(http GET /version)
[ "${r1%% *}" = 401 ] && [ "${r2%% *}" = 200 ] && ok "/version: 401 without a token, 200 with FORKD_TOKEN_FILE's" ||
        notok "/version with and without the token" "$r1" "$r2"

tag=stack-$$
r=$(http POST /v1/snapshots "{\"tag\":\"$tag\",\"kernel\":\"$FORKD_GUEST_KERNEL\",\"rootfs\":\"$FORKD_GUEST_ROOTFS\",\"boot_wait_secs\":240}")
[ "${r%% *}" = 201 ] && [ "$(jsonq 'j["tag"]' <<<"${r#* }")" = "$tag" ] &&
        ok "POST /v1/snapshots of the default guest" || notok "POST /v1/snapshots of the default guest" "$r"

r=$(http POST /v1/sandboxes "{\"snapshot_tag\":\"$tag\",\"n\":3}")
mapfile -t ids < <(jsonq '"\n".join(s["id"] for s in j)' <<<"${r#* }" 2>/dev/null)
[ "${r%% *}" = 201 ] && [ ${#ids[@]} = 3 ] && ok "POST /v1/sandboxes n=3 of it" ||
        notok "POST /v1/sandboxes n=3" "$r" "forkd's log:" "$(tail -n 30 "$state/forkd.log" 2>&1)"
pongs=0
for id in "${ids[@]}"; do
        r=$(http POST "/v1/sandboxes/$id/ping")
        [ "${r%% *}" = 200 ] && [ "$(jsonq 'j["pong"]' <<<"${r#* }")" = True ] && pongs=$((pongs + 1))
done
[ $pongs = 3 ] && ok "every child answers ping" || notok "$pongs of 3 children answered ping"
deleted=0
for id in "${ids[@]}"; do
        r=$(http DELETE "/v1/sandboxes/$id")
        [ "${r%% *}" = 204 ] && deleted=$((deleted + 1))
done
r=$(http GET /v1/sandboxes)
[ $deleted = 3 ] && [ "$r" = "200 []" ] && ok "DELETE each sandbox; none left" || notok "DELETE sandboxes ($deleted of 3)" "$r"
r=$(http DELETE "/v1/snapshots/$tag")
[ "${r%% *}" = 204 ] && ok "DELETE /v1/snapshots/$tag" || notok "DELETE /v1/snapshots/$tag" "$r"

# ---- a second up, then down ----
if stack up --state-dir "$state" --port "$port" >"$state/up2.out" 2>"$state/up2.err"; then
        notok "a second up on a running state dir is refused" "$(cat "$state/up2.out" "$state/up2.err")"
elif [ -s "$state/up2.out" ]; then
        notok "a refused second up prints nothing on stdout" "$(cat "$state/up2.out")"
else
        ok "a second up on a running state dir is refused: $(tail -n 1 "$state/up2.err")"
fi
r=$(FORKD_TOKEN_FILE=- http GET /healthz)
[ "${r%% *}" = 200 ] && ok "the refused up left the running stack alone" || notok "the stack after a refused up" "$r"

# Something to stop: a live sandbox, so that down has a VMM to take with it.
# (boot_wait_secs as above: the Linux guest under nested KVM in the test host can take more
# than the default 30 s to boot)
r1=$(http POST /v1/snapshots "{\"tag\":\"$tag\",\"kernel\":\"$FORKD_GUEST_KERNEL\",\"rootfs\":\"$FORKD_GUEST_ROOTFS\",\"boot_wait_secs\":240}")
r=$(http POST /v1/sandboxes "{\"snapshot_tag\":\"$tag\",\"n\":2}")
pids=()
for f in "$state"/*.pid; do
        read -r p _ <"$f" && pids+=("$p")
done
vmms=$(jsonq '" ".join(str(s["pid"]) for s in j)' <<<"${r#* }" 2>/dev/null)
if stack down --state-dir "$state" 2>"$state/down.err"; then
        # Give the VMMs a moment: they die with forkd (parent-death signal).
        for _ in $(seq 100); do
                left=
                for p in "${pids[@]}" $vmms; do
                        running "$p" && left="$left $p"
                done
                # Nothing else that runs from the state dir either (templates, children).
                for d in /proc/[0-9]*; do
                        grep -qF "$state" "$d/cmdline" 2>/dev/null && running "${d#/proc/}" && left="$left ${d#/proc/}"
                done
                [ -z "$left" ] && break
                sleep 0.1
        done
        if [ ${#pids[@]} -ge 3 ] && [ -n "$vmms" ] && [ -z "$left" ] && ! ls "$state"/*.pid >/dev/null 2>&1; then
                ok "down stops dbus-daemon, forkd, forkd-rest and the VMMs (${pids[*]} $vmms)"
        else
                notok "down stops everything it started" "recorded: ${pids[*]}; VMMs: $vmms; still running:$left" \
                        "the snapshot: $r1" "the fork: $r"
        fi
else
        notok "forkd-stack down" "$(cat "$state/down.err")"
fi

echo "1..$n"
[ $failed = 0 ]
