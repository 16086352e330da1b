#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# Callers reach only what they may read, and only what they own: forkd with a
# real polkitd on a private system bus, two unprivileged members of the group
# forkd (A and B), root, live sandboxes of the test guest on /dev/kvm.
#
# As test-polkit.sh, it re-executes itself in a private mount namespace and
# bind-mounts, only there, copies of /etc/passwd and /etc/group with the users
# forkd-own-a and forkd-own-b (both in group "forkd"), our polkit policy and
# rules, and an empty /etc/polkit-1/rules.d; then runs dbus-daemon, polkitd,
# forkd and forkd-rest (as A) on it. Nothing outside the namespace changes.
#
# Checks:
#   - /etc/shadow: A cannot snapshot it through forkctl (open fails: EACCES),
#     nor through the raw path method (CreateSnapshot is root's; the refusal
#     names CreateSnapshotFromFds), nor through forkd-rest running as A (400
#     naming the file); root still can create snapshots from paths; A can from
#     files A can read, and A owns the result (owner_uid in snapshot.json and
#     in GetSnapshotInfo);
#   - forkctl mcp as A and B: the same, through MCP tool calls (A's files
#     opened with A's rights, polkit allowing A's own work, B refused A's
#     sandbox as a tool error);
#   - ownership: B cannot see, ping, exec, eval, run code in, branch, fork,
#     merge, diff or terminate A's sandbox, nor see or delete A's snapshot:
#     org.freedesktop.DBus.Error.AccessDenied naming org.forkd.manage-all;
#     B's ListSandboxes leaves A's out, and B cannot read the properties of
#     A's sandbox object; B's own sandbox works; A cannot cascade-delete its
#     snapshot over B's diff branch of it; a bundle of A's snapshot unpacked
#     by B is B's; root does everything; the REST bridge owns what its
#     callers make; a stale boot staging directory is removed at start.
#
# usage: test-ownership.sh FORKCTL POLKIT-SOURCE-DIR
# env: FORKD_DAEMON, FORKD_VMM, FORKD_REST, FORKD_TEST_GUEST (all needed)
# Output: TAP. Exit 77 (skip) when polkitd, unshare, root or /dev/kvm are missing.

set -u
forkctl=${1:?usage: test-ownership.sh FORKCTL POLKIT-DIR}
polkit_dir=${2:?usage: test-ownership.sh FORKCTL POLKIT-DIR}
POLKITD=${POLKITD:-/usr/lib/polkit-1/polkitd}

skip() { echo "1..0 # SKIP $*"; exit 77; }

if [ -z "${FORKD_OWN_INNER:-}" ]; then
        [ -x "$POLKITD" ] || skip "polkitd not installed ($POLKITD)"
        [ "$(id -u)" = 0 ] || skip "needs root (mount namespace, setpriv)"
        for c in dbus-daemon busctl setpriv dbus-send python3; do
                command -v $c >/dev/null || skip "$c not installed"
        done
        [ -x "${FORKD_DAEMON:-}" ] && [ -x "${FORKD_REST:-}" ] && [ -r "${FORKD_TEST_GUEST:-}" ] ||
                skip "FORKD_DAEMON, FORKD_REST and FORKD_TEST_GUEST must name the built programs"
        # /dev/kvm: where it is missing the kvm suite runs in the test host instead.
        [ -w /dev/kvm ] || skip "no usable /dev/kvm (this test is in the kvm suite)"
        unshare -m --propagation private true 2>/dev/null || skip "cannot create a mount namespace"
        FORKD_OWN_INNER=1 exec unshare -m --propagation private "$0" "$@"
fi

# ---- inside the private mount namespace ----
. "$(dirname "$(realpath "$0")")/polkit-env.sh"
forkctl=$(realpath "$forkctl")
polkit_dir=$(realpath "$polkit_dir")
polkit_env_scratch forkd-ownership-test

UID_A=61781; UID_B=61782; GID_FORKD=61780
polkit_env_users $GID_FORKD forkd-own-a:$UID_A:forkd forkd-own-b:$UID_B:forkd
polkit_env_bus org.forkd.Manager
polkit_env_polkitd
# A boot staging directory that a killed forkd left behind: removed at start.
mkdir -p "$T/state/snapshots/.boot-stale" && echo x > "$T/state/snapshots/.boot-stale/vmlinuz"
"$FORKD_DAEMON" --state-dir "$T/state" >"$T/forkd.log" 2>&1 &
forkd_pid=$!
pids+=($forkd_pid)
for _ in $(seq 100); do timeout 5 busctl --address="$bus" status org.forkd.Manager >/dev/null 2>&1 && break; sleep 0.1; done
if ! timeout 5 busctl --address="$bus" status org.forkd.Manager >/dev/null 2>&1; then
        not_ok "forkd is on the private bus"; diag <"$T/forkd.log"; echo "1..$n"; exit 1
fi

check "a boot staging directory left by a dead forkd is removed at start" [ ! -e "$T/state/snapshots/.boot-stale" ]

# The guest and a root disk every user may read; a file only root may read.
install -m 0644 "$FORKD_TEST_GUEST" "$T/guest.elf"
truncate -s 8M "$T/rootfs.img"; chmod 644 "$T/rootfs.img"
GUEST=$T/guest.elf; DISK=$T/rootfs.img
SECRET=/etc/shadow
[ -r "$SECRET" ] && [ "$(stat -c %a "$SECRET")" != 644 ] || SECRET=$T/secret
[ "$SECRET" = "$T/secret" ] && { echo secret > "$SECRET"; chmod 600 "$SECRET"; }

as()    { local u=$1; shift; setpriv --reuid="$u" --regid="$u" --groups=$GID_FORKD "$@"; }
# dsend USER METHOD ARGS...: a Manager call through dbus-send (prints the error's name and message)
dsend() {
        local u=$1 meth=$2; shift 2
        if [ "$u" = 0 ]; then
                dbus-send --bus="$bus" --print-reply --reply-timeout=60000 --dest=org.forkd.Manager \
                        /org/forkd/Manager "org.forkd.Manager.$meth" "$@" 2>&1
        else
                as "$u" dbus-send --bus="$bus" --print-reply --reply-timeout=60000 --dest=org.forkd.Manager \
                        /org/forkd/Manager "org.forkd.Manager.$meth" "$@" 2>&1
        fi
}
# bjson USER METHOD SIG ARGS...: busctl --json=short (root when USER is 0)
bjson() {
        local u=$1; shift
        if [ "$u" = 0 ]; then
                busctl --address="$bus" --timeout=60 --json=short call org.forkd.Manager /org/forkd/Manager \
                        org.forkd.Manager "$@" 2>&1
        else
                as "$u" busctl --address="$bus" --timeout=60 --json=short call org.forkd.Manager /org/forkd/Manager \
                        org.forkd.Manager "$@" 2>&1
        fi
}
ids()   { python3 -c 'import json, sys; print(" ".join(d["id"]["data"] for d in json.load(sys.stdin)["data"][0]))' 2>/dev/null; }
field() { python3 -c 'import json, sys; d = json.load(sys.stdin)["data"][0]; print(d[sys.argv[1]]["data"])' "$1" 2>/dev/null; }
fc()    { local u=$1; shift; if [ "$u" = 0 ]; then "$forkctl" "$@"; else as "$u" "$forkctl" "$@"; fi; }

# ---- 1. /etc/shadow ----
out=$(fc $UID_A snapshot create shadow1 --kernel "$SECRET" --rootfs "$DISK" 2>&1); rc=$?
echo "# A: forkctl snapshot create --kernel $SECRET: $out"
check "A cannot snapshot $SECRET as the kernel through forkctl: open fails, permission denied" \
        eval '[ $rc != 0 ] && grep -q "cannot open the kernel $SECRET: Permission denied" <<<"$out"'
out=$(fc $UID_A snapshot create shadow2 --kernel "$GUEST" --rootfs "$SECRET" 2>&1); rc=$?
check "A cannot snapshot $SECRET as the root disk through forkctl ($out)" \
        eval '[ $rc != 0 ] && grep -q "cannot open the rootfs $SECRET: Permission denied" <<<"$out"'
out=$(dsend $UID_A CreateSnapshot string:shadow3 string:"$GUEST" string:"$SECRET" uint32:0 uint32:10)
echo "# A: CreateSnapshot by path: $out"
check "A is refused the raw path method (AccessDenied naming CreateSnapshotFromFds)" \
        eval 'grep -q "org.freedesktop.DBus.Error.AccessDenied" <<<"$out" && grep -q CreateSnapshotFromFds <<<"$out"'
check "... and no snapshot of $SECRET exists" \
        eval '[ -z "$(ls "$T/state/snapshots" | grep -E "^(\.boot-)?shadow")" ]'

# forkd-rest as A: opens the files with A's rights.
TOKEN=owner-test-token; echo "$TOKEN" > "$T/token"; chown $UID_A "$T/token"; chmod 600 "$T/token"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
setpriv --reuid=$UID_A --regid=$UID_A --groups=$GID_FORKD "$FORKD_REST" --listen 127.0.0.1:$PORT --token-file "$T/token" --timeout 60 >"$T/rest.log" 2>&1 &
rest_pid=$!
pids+=($rest_pid)
# rest METHOD PATH [BODY]: prints the status, leaves the body in $T/body (Python's http.client).
rest() {
        python3 - "$PORT" "$TOKEN" "$T/body" "$@" <<'PY'
import http.client, sys
port, token, out, method, path = sys.argv[1:6]
body = sys.argv[6] if len(sys.argv) > 6 else None
try:
    c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=120)
    c.request(method, path, body=body, headers={"Authorization": "Bearer " + token,
                                                "Content-Type": "application/json"})
    r = c.getresponse()
    open(out, "wb").write(r.read())
    print(r.status)
except OSError as e:
    open(out, "w").write(str(e))
    print("000")
PY
}
for _ in $(seq 100); do [ "$(rest GET /healthz)" = 200 ] && break; sleep 0.1; done
code=$(rest POST /v1/snapshots "{\"tag\":\"shadow4\",\"kernel\":\"$SECRET\",\"rootfs\":\"$DISK\",\"boot_wait_secs\":10}")
body=$(cat "$T/body")
echo "# REST as A, kernel $SECRET: $code $body"
check "forkd-rest running as A: POST /v1/snapshots with $SECRET answers 400 {\"error\": ...} naming the file" \
        eval '[ "$code" = 400 ] && python3 -c "import json, sys; e = json.load(open(sys.argv[1]))[\"error\"]; sys.exit(0 if sys.argv[2] in e and \"Permission denied\" in e else 1)" "$T/body" "$SECRET"'
[ "$code" = 400 ] || diag <"$T/rest.log"

# Root still creates from paths; A from files A can read, and owns them.
out=$(bjson 0 CreateSnapshot sssuu rootsnap "$GUEST" "$DISK" 0 10)
check "root creates a snapshot from paths (CreateSnapshot)" eval '[ "$(field tag <<<"$out")" = rootsnap ]'
[ "$(field tag <<<"$out")" = rootsnap ] || { echo "# $out"; tail -5 "$T/forkd.log" | diag; }
check "... owned by root (owner_uid 0)" eval '[ "$(field owner_uid <<<"$out")" = 0 ]'
out=$(fc $UID_A snapshot create asnap --kernel "$GUEST" --rootfs "$DISK" --boot-wait 10 --json 2>&1); rc=$?
check "A creates a snapshot from files A can read (forkctl, descriptors)" [ $rc = 0 ]
[ $rc = 0 ] || { echo "$out" | diag; tail -5 "$T/forkd.log" | diag; }
check "... snapshot.json records owner_uid $UID_A" grep -q "\"owner_uid\": $UID_A" "$T/state/snapshots/asnap/snapshot.json"
check "... the boot staging directory is gone" eval '! ls -a "$T/state/snapshots" | grep -q "^\.boot-"'
out=$(bjson $UID_A GetSnapshotInfo s asnap)
check "... A sees its details, owner_uid $UID_A" eval '[ "$(field owner_uid <<<"$out")" = $UID_A ]'
code=$(rest POST /v1/snapshots "{\"tag\":\"restsnap\",\"kernel\":\"$GUEST\",\"rootfs\":\"$DISK\",\"boot_wait_secs\":10}")
check "forkd-rest as A creates from files it can read: 201, owner_uid $UID_A (the bridge owns its callers' work) ($code)" \
        eval '[ "$code" = 201 ] && grep -q "\"owner_uid\": *$UID_A" "$T/body"'
[ "$code" = 201 ] || diag <"$T/body"

# ---- 2. ownership ----
SA=$(bjson $UID_A Fork 'sua{sv}' asnap 1 0 | ids)
check "A forks a sandbox of its snapshot ($SA)" [ -n "$SA" ]
out=$(bjson $UID_A GetSandbox s "${SA:-x}")
check "... GetSandbox as A shows owner_uid $UID_A" eval '[ "$(field owner_uid <<<"$out")" = $UID_A ]'
SB=$(bjson $UID_B Fork 'sua{sv}' rootsnap 1 0 | ids)
check "B forks a sandbox of root's snapshot ($SB)" [ -n "$SB" ]

denied() { grep -q "org.freedesktop.DBus.Error.AccessDenied" <<<"$1" && grep -q "org.forkd.manage-all" <<<"$1"; }
for call in "GetSandbox string:${SA:-x}" "Ping string:${SA:-x}" "Exec string:${SA:-x} array:string:/bin/true uint32:5" \
            "Eval string:${SA:-x} string:1" "RunCode string:${SA:-x} string:x uint32:5" \
            "WriteFile string:${SA:-x} string:/tmp/stolen array:byte:104,105 uint32:420" \
            "ReadFile string:${SA:-x} string:/tmp/a" \
            "BranchSandbox string:${SA:-x} string:stolen string:full boolean:true" \
            "ForkSandbox string:${SA:-x} uint32:1" "TerminateSandbox string:${SA:-x}" \
            "TerminateSandboxes array:string:${SA:-x}" "TerminateSandboxes array:string:${SB:-y},${SA:-x}" \
            "MergeSandbox string:${SB:-y} string:${SA:-x}" "MergeSandbox string:${SA:-x} string:${SB:-y}" \
            "GetSnapshotInfo string:asnap" "DeleteSnapshot string:asnap boolean:false boolean:false"; do
        # shellcheck disable=SC2086
        out=$(dsend $UID_B $call)
        if denied "$out"; then ok "B: ${call%% *} on A's is AccessDenied naming org.forkd.manage-all"
        else not_ok "B: ${call%% *} on A's is AccessDenied naming org.forkd.manage-all: $out"; fi
done
echo "# e.g. $(dsend $UID_B Exec string:${SA:-x} array:string:/bin/true uint32:5 | tr '\n' ' ')"
out=$(as $UID_B busctl --address="$bus" --timeout=30 call org.forkd.Manager /org/forkd/Manager org.forkd.Manager \
        DiffSandboxes ssas "${SB:-y}" "${SA:-x}" 0 2>&1)
check "B: DiffSandboxes of B's and A's is refused ($out)" eval 'grep -q "Access denied" <<<"$out"'
# The object path as sd_bus_path_encode() writes it: [A-Za-z0-9] kept (no leading digit), the rest _XX.
objpath=/org/forkd/sandbox/$(python3 -c 'import sys; print("".join(c if c.isascii() and c.isalnum() and not (i == 0 and c.isdigit()) else "_%02x" % ord(c) for i, c in enumerate(sys.argv[1])))' "${SA:-x}")
out=$(as $UID_B busctl --address="$bus" --timeout=30 call org.forkd.Manager "$objpath" org.forkd.Sandbox Ping 2>&1)
check "B: Ping on A's sandbox object (org.forkd.Sandbox) is refused ($out)" eval 'grep -q "Access denied" <<<"$out"'
out=$(as $UID_B busctl --address="$bus" get-property org.forkd.Manager "$objpath" org.forkd.Sandbox Pid 2>&1)
check "B cannot read the properties of A's sandbox object ($out)" eval 'grep -q "Access denied" <<<"$out"'
out=$(as $UID_A busctl --address="$bus" get-property org.forkd.Manager "$objpath" org.forkd.Sandbox OwnerUID 2>&1)
check "A reads its sandbox's OwnerUID property ($out)" [ "$out" = "u $UID_A" ]
check "A's sandbox and snapshot survived B's attempts" \
        eval '[ -n "$(bjson 0 GetSandbox s "${SA:-x}" | field id)" ] && [ -e "$T/state/snapshots/asnap/snapshot.json" ] && [ ! -e "$T/state/snapshots/stolen" ]'

list_b=$(bjson $UID_B ListSandboxes | ids)
check "B's ListSandboxes lists B's own ($list_b)" eval 'grep -qw -- "${SB:-y}" <<<"$list_b"'
check "B's ListSandboxes leaves A's out" eval '! grep -qw -- "${SA:-x}" <<<"$list_b"'
list_a=$(fc $UID_A ls 2>&1)
check "forkctl ls as A shows A's sandbox with its owner, not B's" \
        eval 'grep -q -- "${SA:-x}.*forkd-own-a" <<<"$list_a" && ! grep -q -- "${SB:-y}" <<<"$list_a"'
out=$(bjson $UID_B Ping s "${SB:-y}")
check "B pings its own sandbox ($out)" eval 'grep -q "\"type\":\"s\"" <<<"$out"'
out=$(bjson $UID_B WriteFile ssayu "${SB:-y}" /tmp/own 2 104 105 420)
out2=$(bjson $UID_B ReadFile ss "${SB:-y}" /tmp/own)
check "B writes and reads a file in its own sandbox (WriteFile $out, ReadFile $out2)" \
        eval 'grep -q "\"data\":\[2\]" <<<"$out" && grep -q "\"data\":\[\[104,105\]\]" <<<"$out2"'
out=$(bjson $UID_B ForkSandbox su "${SB:-y}" 1)
SB2=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0][0]["id"]["data"])' <<<"$out" 2>/dev/null)
check "B forks its own running sandbox ($SB2)" [ -n "$SB2" ]
[ -n "$SB2" ] || echo "# $out"
out=$(bjson $UID_B GetSandbox s "${SB2:-z}")
check "... the child is B's (owner_uid $UID_B)" eval '[ "$(field owner_uid <<<"$out")" = $UID_B ]'
out=$(bjson $UID_B TerminateSandboxes as 2 "${SB2:-z}" sb-none-0)
check "... and B terminates it with TerminateSandboxes, told which id named none ($out)" \
        eval 'grep -q "\"data\":\[\[\"sb-none-0\"\]\]" <<<"$out" && [ -z "$(bjson 0 GetSandbox s "${SB2:-z}" | field id)" ]'

# Root does everything.
list_root=$(bjson 0 ListSandboxes | ids)
check "root's ListSandboxes lists A's and B's" eval 'grep -qw -- "${SA:-x}" <<<"$list_root" && grep -qw -- "${SB:-y}" <<<"$list_root"'
out=$(bjson 0 Ping s "${SA:-x}")
check "root pings A's sandbox" eval '! grep -qi "denied\|failed" <<<"$out"'
out=$(bjson 0 GetSnapshotInfo s asnap)
check "root sees the details of A's snapshot" eval '[ "$(field owner_uid <<<"$out")" = $UID_A ]'
out=$(bjson 0 TerminateSandbox s "${SA:-x}")
check "root terminates A's sandbox" eval '[ -z "$out" ]'
out=$(bjson $UID_B TerminateSandbox s "${SB:-y}")
check "B terminates its own sandbox" eval '[ -z "$out" ]'
# B chains a diff branch onto A's snapshot: A may not cascade over B's link.
SBA=$(bjson $UID_B Fork 'sua{sv}' asnap 1 0 | ids)
out=$(bjson $UID_B BranchSandbox sssb "${SBA:-x}" bchild diff true)
check "B branches (diff) its sandbox of A's snapshot into bchild, owned by B" \
        eval '[ "$(field owner_uid <<<"$out")" = $UID_B ] && [ "$(field parent_tag <<<"$out")" = asnap ]'
out=$(dsend $UID_A DeleteSnapshot string:asnap boolean:true boolean:false)
check "A cannot delete its snapshot with cascade over B's bchild (AccessDenied, manage-all)" \
        eval 'denied "$out" && [ -e "$T/state/snapshots/bchild" ] && [ -e "$T/state/snapshots/asnap" ]'
out=$(bjson $UID_B DeleteSnapshot sbb bchild false false)
check "B deletes bchild" eval '[ -z "$out" ]'
bjson $UID_B TerminateSandbox s "${SBA:-x}" >/dev/null

# A bundle of A's snapshot, unpacked by B: B owns what lands (the bundle's owner_uid is A's).
mkdir -p "$T/a" && chown $UID_A "$T/a"
out=$(fc $UID_A pack --tag asnap --out "$T/a/asnap.tar.zst" 2>&1); rc=$?
check "A packs its snapshot" [ $rc = 0 ]
[ $rc = 0 ] || echo "$out" | diag
out=$(fc $UID_B unpack "$T/a/asnap.tar.zst" --tag bcopy 2>&1); rc=$?
check "B unpacks it as bcopy" [ $rc = 0 ]
[ $rc = 0 ] || echo "$out" | diag
out=$(bjson $UID_B GetSnapshotInfo s bcopy)
check "... bcopy is B's (owner_uid $UID_B in GetSnapshotInfo and snapshot.json)" \
        eval '[ "$(field owner_uid <<<"$out")" = $UID_B ] && grep -q "\"owner_uid\": $UID_B" "$T/state/snapshots/bcopy/snapshot.json"'
out=$(bjson $UID_B DeleteSnapshot sbb bcopy false false)
check "... and B deletes it" eval '[ -z "$out" ]'

out=$(bjson $UID_A DeleteSnapshot sbb asnap false false)
check "A deletes its own snapshot" eval '[ -z "$out" ] && [ ! -e "$T/state/snapshots/asnap" ]'
out=$(bjson $UID_A DeleteSnapshot sbb rootsnap false false)
check "A cannot delete root's snapshot ($out)" eval 'grep -q "Access denied" <<<"$out" && [ -e "$T/state/snapshots/rootsnap" ]'
out=$(bjson 0 DeleteSnapshot sbb restsnap false false)
check "root deletes the bridge's snapshot" eval '[ -z "$out" ]'

# ---- 3. forkctl mcp: an MCP client's calls are its user's, polkit decides ----
# mcp USER CALLS-JSON: one forkctl mcp session as USER (on the system bus of
# $DBUS_SYSTEM_BUS_ADDRESS); CALLS is a list of [tool, arguments]; "@ID" in an
# argument is the first sandbox of the last spawn_sandboxes. One line a call:
# "OK <structuredContent>" or "ERR <message>".
# (/usr/bin/python3: a python3 found earlier in root's PATH, pyenv's say, may be root's only)
sys_python=/usr/bin/python3; [ -x "$sys_python" ] || sys_python=$(command -v python3)
mcp() {
        local u=$1; shift
        as "$u" "$sys_python" - "$forkctl" "$@" <<'PY'
import json, subprocess, sys
p = subprocess.Popen([sys.argv[1], "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
def rpc(i, method, params):
    p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\n")
    p.stdin.flush()
    r = json.loads(p.stdout.readline())
    assert r["id"] == i, r
    return r["result"]
rpc(0, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
p.stdin.write('{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
sid = ""
for i, (tool, args) in enumerate(json.loads(sys.argv[2]), 1):
    args = json.loads(json.dumps(args).replace("@ID", sid))
    res = rpc(i, "tools/call", {"name": tool, "arguments": args})
    if res["isError"]:
        print("ERR", res["content"][0]["text"].replace("\n", " "))
        continue
    if tool == "spawn_sandboxes":
        sid = res["structuredContent"]["sandboxes"][0]["id"]
    print("OK", json.dumps(res["structuredContent"]))
p.stdin.close()
sys.exit(p.wait())
PY
}
calls=$(python3 -c 'import json, sys; g, d, s = sys.argv[1:4]; print(json.dumps([
    ["create_snapshot", {"tag": "mcpshadow", "kernel": s, "rootfs": d}],
    ["create_snapshot", {"tag": "mcpsnap", "kernel": g, "rootfs": d, "boot_wait_secs": 10}],
    ["spawn_sandboxes", {"snapshot_tag": "mcpsnap"}],
    ["run_code", {"sandbox_id": "@ID", "code": "x = 5"}],
    ["run_code", {"sandbox_id": "@ID", "code": "print x"}],
    ["list_sandboxes", {}]]))' "$GUEST" "$DISK" "$SECRET")
out=$(mcp $UID_A "$calls" 2>&1); rc=$?
echo "$out" | cut -c1-300 | diag
line() { sed -n "${1}p" <<<"$out"; }
check "forkctl mcp as A: create_snapshot of $SECRET is a tool error, the open failed with A's rights" \
        eval 'grep -q "^ERR create_snapshot: cannot open the kernel $SECRET: Permission denied" <<<"$(line 1)"'
check "... create_snapshot of files A can read: A's snapshot (owner_uid $UID_A)" \
        eval 'python3 -c "import json, sys; d = json.loads(sys.argv[1][3:]); sys.exit(d[\"owner_uid\"] != $UID_A)" "$(line 2)"'
MA=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1][3:])["sandboxes"][0]["id"])' "$(line 3)" 2>/dev/null)
check "... spawn_sandboxes, run_code x = 5 then print x: 5 ($MA)" \
        eval '[ -n "$MA" ] && [ "$(python3 -c "import json, sys; print(json.loads(sys.argv[1][3:])[\"stdout\"], end=\"\")" "$(line 5)")" = 5 ]'
check "... list_sandboxes as A lists it; the session exits 0" eval '[ $rc = 0 ] && grep -q -- "$MA" <<<"$(line 6)"'
calls=$(python3 -c 'import json, sys; print(json.dumps([["run_code", {"sandbox_id": sys.argv[1], "code": "print x"}],
    ["kill_sandbox", {"sandbox_id": sys.argv[1]}], ["list_sandboxes", {}]]))' "${MA:-x}")
out=$(mcp $UID_B "$calls" 2>&1); rc=$?
echo "$out" | cut -c1-300 | diag
check "forkctl mcp as B: run_code and kill_sandbox on A's sandbox are tool errors, AccessDenied naming manage-all" \
        eval 'denied "$(line 1)" && denied "$(line 2)" && grep -q "^ERR" <<<"$(line 1)$(line 2)"'
check "... B's list_sandboxes leaves A's out; the session exits 0" eval '[ $rc = 0 ] && grep -q "^OK" <<<"$(line 3)" && ! grep -q -- "${MA:-x}" <<<"$(line 3)"'
out=$(mcp $UID_A "$(python3 -c 'import json, sys; print(json.dumps([["kill_sandbox", {"sandbox_id": sys.argv[1]}]]))' "${MA:-x}")" 2>&1)
check "... A kills its sandbox through forkctl mcp ($out)" eval 'grep -q "^OK {\"id\": \"${MA:-x}\", \"killed\": true}" <<<"$out"'
bjson $UID_A DeleteSnapshot sbb mcpsnap false false >/dev/null

# Both daemons stop cleanly (exit 0; under ASan: no leak or error report).
kill -TERM "$rest_pid"; wait "$rest_pid"; rc_rest=$?
kill -TERM "$forkd_pid"; wait "$forkd_pid"; rc_forkd=$?
check "forkd-rest and forkd exit 0 on SIGTERM ($rc_rest, $rc_forkd)" eval '[ $rc_rest = 0 ] && [ $rc_forkd = 0 ]'
check "no sanitizer report in their logs" eval '! grep -qE "ERROR: (Address|Leak)Sanitizer|runtime error:" "$T/forkd.log" "$T/rest.log"'
grep -hE -A20 "ERROR: (Address|Leak)Sanitizer|runtime error:" "$T/forkd.log" "$T/rest.log" | head -40 | diag

echo "1..$n"
if [ "$failed" != 0 ]; then
        echo "# $failed failed; forkd's log:"; tail -n 30 "$T/forkd.log" | diag
        exit 1
fi
exit 0
