#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# forkd doctor and forkctl doctor: the same checks, text and --json agree, the exit
# status follows the statuses, usage errors are 2, --help is 0.
#   - every check is named, the JSON (one line, the last) parses and matches the text;
#   - /dev/kvm absent (an empty file bound over it where it exists) is a fail with a fix;
#   - a state directory on tmpfs has no reflink (warn);
#   - as uid 65534 the root-only checks skip rather than fail, and nothing crashes;
#   - with the shipped polkit and bus files where polkitd and dbus-daemon read them, a
#     private system bus and a real polkitd: those checks are ok; a world-readable token
#     fails; files only under --prefix warn; a stopped polkitd is a warn within the limit.
# Needs no /dev/kvm: it passes with one and without. Parts that need root (mount
# namespaces) or polkitd say why they skip.
# usage: test-doctor.sh FORKD FORKCTL SRCDIR       Output: TAP.

set -u
forkd=$(realpath "${1:?usage: test-doctor.sh FORKD FORKCTL SRCDIR}")
forkctl=$(realpath "${2:?}")
src=$(realpath "${3:?}")
POLKITD=${POLKITD:-/usr/lib/polkit-1/polkitd}
CHECKS="kvm tun netns cgroup userfaultfd reflink vmm polkit-action polkit-rules bus-policy polkitd token"

# As root, everything runs in a private mount namespace: the bind mounts below stay in it.
if [ "$(id -u)" = 0 ] && [ -z "${FORKD_DOCTOR_INNER:-}" ] && unshare -m --propagation private true 2>/dev/null; then
        FORKD_DOCTOR_INNER=1 exec unshare -m --propagation private "$0" "$@"
fi
root=false
[ "$(id -u)" = 0 ] && [ -n "${FORKD_DOCTOR_INNER:-}" ] && root=true
. "$(dirname "$(realpath "$0")")/polkit-env.sh"

T=$(mktemp -d /tmp/forkd-doctor-test.XXXXXX)
chmod 755 "$T"
pids=()
cleanup() {
        for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
        for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
        umount "$T/tmpfs" 2>/dev/null
        rm -rf "$T"
}
trap cleanup EXIT

n=0 failed=0
ok()     { n=$((n + 1)); echo "ok $n - $*"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $*"; }
skip()   { n=$((n + 1)); echo "ok $n # SKIP $*"; }
check()  { local what=$1; shift; if "$@"; then ok "$what"; else not_ok "$what"; fi; }

# run NAME CMD...: stdout in $T/NAME.out, stderr in $T/NAME.err, exit status in $T/NAME.rc
run() {
        local name=$1; shift
        timeout 60 "$@" >"$T/$name.out" 2>"$T/$name.err"
        echo $? >"$T/$name.rc"
}
rc() { cat "$T/$1.rc"; }

# run_json NAME CMD...: run, then check the JSON report (its one line): valid, every
# check once in order, statuses known, a fix on every check that is not ok and none on
# those that are, the overall status and the exit status agree. Writes $T/NAME.tsv
# (name, status, detail, fix per line) and $T/NAME.statuses ("name status"); on a bad
# report, $T/NAME.bad says why. One python3 per report: it is slow to start on a busy host.
run_json() {
        local name=$1
        run "$@"
        rm -f "$T/$name.bad"
        python3 - "$T/$name" "$(rc "$name")" "$CHECKS" >"$T/$name.why" 2>&1 <<'EOF' || cp "$T/$name.why" "$T/$name.bad"
import json, sys
base = sys.argv[1]
lines = open(base + ".out").read().splitlines()
assert len(lines) == 1, f"{len(lines)} lines, want one"
doc = json.loads(lines[-1])
names = sys.argv[3].split()
checks = doc["checks"]
assert [c["name"] for c in checks] == names, [c["name"] for c in checks]
for c in checks:
    assert c["status"] in ("ok", "warn", "fail", "skip"), c
    assert isinstance(c["detail"], str) and c["detail"], c
    if c["status"] == "ok":
        assert c["fix"] is None, c
    else:
        assert isinstance(c["fix"], str) and c["fix"], c
    for v in (c["detail"], c["fix"] or ""):
        assert "\t" not in v and "\n" not in v, c
st = [c["status"] for c in checks]
want = "fail" if "fail" in st else "warn" if "warn" in st else "ok"
assert doc["status"] == want, (doc["status"], want)
assert int(sys.argv[2]) == (1 if want == "fail" else 0), ("exit", sys.argv[2], want)
with open(base + ".tsv", "w") as f:
    for c in checks:
        f.write("\t".join((c["name"], c["status"], c["detail"], c["fix"] or "")) + "\n")
with open(base + ".statuses", "w") as f:
    for c in checks:
        f.write(f'{c["name"]} {c["status"]}\n')
EOF
}
json_valid() { [ ! -e "$T/$1.bad" ]; }

# The text report of $1 agrees with the JSON report of $2: one line per check with the
# same status and detail, a "fix:" line under exactly the checks that have one, the
# summary line, and the exit status.
text_agrees() {
        python3 - "$T/$1.out" "$(rc "$1")" "$T/$2.out" <<'EOF'
import json, re, sys
text = open(sys.argv[1]).read().splitlines()
doc = json.loads(open(sys.argv[3]).read().splitlines()[-1])
i = 0
for c in doc["checks"]:
    m = re.match(r"^(ok|warn|fail|skip) +(\S+) +(.*)$", text[i])
    assert m, text[i]
    assert (m.group(1), m.group(2)) == (c["status"], c["name"]), (text[i], c)
    # details with a time or a count in them may differ between two runs: compare the start
    if c["name"] not in ("polkitd",):
        assert m.group(3) == c["detail"], (m.group(3), c["detail"])
    i += 1
    if c["fix"] is not None:
        f = re.match(r"^ +fix: (.*)$", text[i])
        assert f, text[i]
        if c["name"] not in ("polkitd",):
            assert f.group(1) == c["fix"], (f.group(1), c["fix"])
        i += 1
counts = {s: sum(1 for c in doc["checks"] if c["status"] == s) for s in ("ok", "warn", "fail", "skip")}
summary = f'{doc["status"]}: {counts["ok"]} ok, {counts["warn"]} warn, {counts["fail"]} fail, {counts["skip"]} skip'
assert text[i] == summary, (text[i], summary)
assert i + 1 == len(text), text[i + 1:]
assert int(sys.argv[2]) == (1 if doc["status"] == "fail" else 0), sys.argv[2]
EOF
}

# status_of NAME CHECK, field_of NAME CHECK detail|fix: from the report run_json NAME made
status_of() { awk -F'\t' -v c="$2" '$1 == c { print $2 }' "$T/$1.tsv" 2>/dev/null; }
field_of() { awk -F'\t' -v c="$2" -v f="$3" '$1 == c { print (f == "detail" ? $3 : $4) }' "$T/$1.tsv" 2>/dev/null; }

# ---- both programs, text and JSON ----
for prog in forkd forkctl; do
        bin=$forkd; [ $prog = forkctl ] && bin=$forkctl
        run "$prog-text" "$bin" doctor
        run_json "$prog-json" "$bin" doctor --json
        missing=""
        for c in $CHECKS; do
                grep -Eq "^(ok|warn|fail|skip) +$c " "$T/$prog-text.out" || missing="$missing $c"
        done
        check "$prog doctor names every check in its text${missing:+ (missing:$missing)}" [ -z "$missing" ]
        if json_valid "$prog-json"; then
                ok "$prog doctor --json: one valid JSON object, every check, exit $(rc "$prog-json") matches its statuses"
        else
                not_ok "$prog doctor --json"; sed 's/^/# /' "$T/$prog-json.bad" "$T/$prog-json.out" "$T/$prog-json.err"
        fi
        if text_agrees "$prog-text" "$prog-json" 2>"$T/$prog-agree.why"; then
                ok "$prog doctor: the text agrees with the JSON (statuses, details, fixes, summary, exit $(rc "$prog-text"))"
        else
                not_ok "$prog doctor: the text agrees with the JSON"; sed 's/^/# /' "$T/$prog-agree.why" "$T/$prog-text.out"
        fi
        check "$prog doctor writes nothing on stderr" [ ! -s "$T/$prog-text.err" ]
done
sed 's/^/# forkctl doctor: /' "$T/forkctl-text.out"
check "forkd doctor and forkctl doctor report the same statuses" \
        cmp -s "$T/forkd-json.statuses" "$T/forkctl-json.statuses"
run_json order "$forkctl" --json doctor
check "forkctl --json doctor (global option first) is the same report" \
        cmp -s "$T/order.statuses" "$T/forkctl-json.statuses"

# ---- usage ----
for prog in forkd forkctl; do
        bin=$forkd; [ $prog = forkctl ] && bin=$forkctl
        run help "$bin" doctor --help
        check "$prog doctor --help: exit 0, names --json, --state-dir, --prefix and every check" \
                bash -c '[ "$(cat "$1.rc")" = 0 ] && grep -q -- --json "$1.out" && grep -q -- --state-dir "$1.out" &&
                         grep -q -- --prefix "$1.out" && for c in $2; do grep -q "^  $c " "$1.out" || exit 1; done' \
                _ "$T/help" "$CHECKS"
        run unknown "$bin" doctor --no-such-option
        check "$prog doctor --no-such-option: exit 2 with a message" \
                bash -c '[ "$(cat "$1.rc")" = 2 ] && grep -q "no-such-option" "$1.err" && [ ! -s "$1.out" ]' _ "$T/unknown"
        run extra "$bin" doctor stray
        check "$prog doctor stray: exit 2" [ "$(rc extra)" = 2 ]
        run relative "$bin" doctor --state-dir relative/dir
        check "$prog doctor --state-dir relative/dir: exit 2" [ "$(rc relative)" = 2 ]
done
run nonverb "$forkctl" --state-dir /tmp ls
check "forkctl --state-dir on another verb: exit 2" [ "$(rc nonverb)" = 2 ]
run fhelp "$forkctl" --help
check "forkctl --help lists doctor" grep -q "^  doctor " "$T/fhelp.out"
run dhelp "$forkd" --help
check "forkd --help mentions forkd doctor" grep -q "forkd doctor" "$T/dhelp.out"

# ---- /dev/kvm absent ----
kvm_absent() {
        check "$1: kvm is a fail" [ "$(status_of "$2" kvm)" = fail ]
        check "$1: the fix says what to load and where the tests go" \
                bash -c 'f=$(cat); grep -q "kvm_intel" <<<"$f" && grep -q "kvm_amd" <<<"$f" && grep -q "test host" <<<"$f"' \
                <<<"$(field_of "$2" kvm fix)"
        check "$1: exit status 1" [ "$(rc "$2")" = 1 ]
}
if [ ! -e /dev/kvm ]; then
        kvm_absent "no /dev/kvm here" forkctl-json
elif $root; then
        touch "$T/nokvm"
        if mount --bind "$T/nokvm" /dev/kvm; then
                run_json nokvm "$forkd" doctor --json
                kvm_absent "an empty file bound over /dev/kvm" nokvm
                umount /dev/kvm
        else
                skip "cannot bind a file over /dev/kvm"
        fi
        run_json withkvm "$forkctl" doctor --json
        echo "# /dev/kvm here: $(status_of withkvm kvm): $(field_of withkvm kvm detail)"
else
        skip "/dev/kvm exists and hiding it needs root (a mount namespace)"
fi

# ---- state directory on tmpfs ----
tmpfs_dir=""
if $root && mkdir "$T/tmpfs" && mount -t tmpfs tmpfs "$T/tmpfs"; then
        tmpfs_dir=$T/tmpfs
elif [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] && [ -w /dev/shm ]; then
        tmpfs_dir=$(mktemp -d /dev/shm/forkd-doctor.XXXXXX)
fi
if [ -n "$tmpfs_dir" ]; then
        run_json tmpfs "$forkctl" doctor --json --state-dir "$tmpfs_dir/state"
        check "a state directory on tmpfs: reflink warns, names tmpfs and gives the fix" \
                bash -c '[ "$1" = warn ] && grep -q tmpfs <<<"$2" && grep -qi "btrfs or XFS" <<<"$3"' _ \
                "$(status_of tmpfs reflink)" "$(field_of tmpfs reflink detail)" "$(field_of tmpfs reflink fix)"
        check "the reflink check leaves nothing in the state directory" \
                bash -c '[ -z "$(ls -A "$1")" ]' _ "$tmpfs_dir"
        [ "$tmpfs_dir" = "$T/tmpfs" ] || rmdir "$tmpfs_dir"
else
        skip "no tmpfs to put a state directory on"
fi

# ---- as uid 65534 ----
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
        nobody=(setpriv --reuid 65534 --regid 65534 --clear-groups)
        if "${nobody[@]}" test -x "$forkctl" && "${nobody[@]}" test -x "$forkd"; then
                run_json nr-forkctl "${nobody[@]}" "$forkctl" doctor --json
                run nr-forkd "${nobody[@]}" "$forkd" doctor
                run_json root-ref "$forkctl" doctor --json
                if json_valid nr-forkctl; then
                        ok "as uid 65534: forkctl doctor --json is valid, exit $(rc nr-forkctl) matches (no crash)"
                else
                        not_ok "as uid 65534: forkctl doctor --json"; sed 's/^/# /' "$T/nr-forkctl.bad" "$T/nr-forkctl.err"
                fi
                check "as uid 65534: forkd doctor exits 0 or 1 (no crash)" bash -c '[ "$1" = 0 ] || [ "$1" = 1 ]' _ "$(rc nr-forkd)"
                check "as uid 65534: netns is a skip that says why" \
                        bash -c '[ "$1" = skip ] && grep -q root <<<"$2"' _ "$(status_of nr-forkctl netns)" \
                        "$(field_of nr-forkctl netns detail)"
                worse=""
                for c in $CHECKS; do
                        [ "$(status_of nr-forkctl "$c")" = fail ] && [ "$(status_of root-ref "$c")" != fail ] &&
                                worse="$worse $c"
                done
                check "as uid 65534: no check fails that passes as root${worse:+ (fail:$worse)}" [ -z "$worse" ]
                echo "# as uid 65534: $(tr '\n' ' ' <"$T/nr-forkctl.statuses")"
        else
                skip "uid 65534 cannot run the binaries in this build directory"
        fi
else
        skip "not root or no setpriv: the non-root run needs root to drop to 65534"
fi

# ---- polkit, the bus policy, polkitd and the token, installed for real ----
if ! $root; then
        skip "the installed-files checks need root (bind mounts in a mount namespace)"
elif [ ! -x "$POLKITD" ] || ! command -v dbus-daemon >/dev/null || ! command -v busctl >/dev/null; then
        skip "polkitd ($POLKITD), dbus-daemon or busctl not installed"
elif [ ! -d /usr/share/polkit-1/actions ] || [ ! -d /usr/share/polkit-1/rules.d ] || [ ! -d /usr/share/dbus-1/system.d ]; then
        skip "no /usr/share/polkit-1/actions, /usr/share/polkit-1/rules.d or /usr/share/dbus-1/system.d to put the files in"
else
        mkdir -p "$T/actions" "$T/rules" "$T/dbus-share" "$T/empty"
        cp "$src/polkit/org.forkd.policy" "$T/actions/"
        cp "$src/polkit/org.forkd.rules" "$T/rules/50-org.forkd.rules"
        cp "$src/dbus/org.forkd.Manager.conf" "$T/dbus-share/"
        # The shipped files where polkitd and dbus-daemon read them; the /etc directories
        # (where they exist) emptied, so that only these count. All in this mount namespace.
        mount --bind "$T/actions" /usr/share/polkit-1/actions &&
        mount --bind "$T/rules" /usr/share/polkit-1/rules.d &&
        mount --bind "$T/dbus-share" /usr/share/dbus-1/system.d || not_ok "bind the shipped files into place"
        for d in /etc/polkit-1/rules.d /etc/dbus-1/system.d; do
                [ -d "$d" ] && mount --bind "$T/empty" "$d"
        done
        # A private system bus and polkitd on it (polkit-env.sh).
        polkit_env_bus
        polkit_env_polkitd
        printf 'doctor-test-token\n' >"$T/token"
        chmod 0600 "$T/token"

        run_json installed "$forkctl" doctor --json --token-file "$T/token"
        bad=""
        for c in polkit-action polkit-rules bus-policy polkitd token; do
                [ "$(status_of installed $c)" = ok ] || bad="$bad $c=$(status_of installed $c)"
        done
        if [ -z "$bad" ]; then
                ok "installed files, private bus, real polkitd: polkit-action, polkit-rules, bus-policy, polkitd, token are ok"
        else
                not_ok "installed files and polkitd are ok (not:$bad)"; sed 's/^/# /' "$T/installed.out" "$T/polkitd.log"
        fi
        # as many as the shipped file declares (seven since org.forkd.pause)
        actions=$(grep -c '<action id="org\.forkd\.' "$src/polkit/org.forkd.policy")
        check "polkitd's detail counts the $actions org.forkd actions of org.forkd.policy" \
                grep -q "knows $actions org.forkd actions" <<<"$(field_of installed polkitd detail)"
        run_json installed-forkd "$forkd" doctor --json --token-file "$T/token"
        check "forkd doctor agrees" cmp -s "$T/installed.statuses" "$T/installed-forkd.statuses"

        chmod 0644 "$T/token"
        run wtoken "$forkctl" doctor --token-file "$T/token"
        check "a world-readable token file is a fail with chmod in the fix, exit 1" \
                bash -c 'grep -q "^fail  token .*readable by everyone" "$1.out" && grep -q "fix: chmod 0600" "$1.out" &&
                         [ "$(cat "$1.rc")" = 1 ]' _ "$T/wtoken"
        chmod 0600 "$T/token"

        # Installed under a prefix only: found, but where polkitd and dbus-daemon do not look.
        mkdir -p "$T/prefix/share/polkit-1/actions" "$T/prefix/share/dbus-1/system.d"
        cp "$src/polkit/org.forkd.policy" "$T/prefix/share/polkit-1/actions/"
        cp "$src/dbus/org.forkd.Manager.conf" "$T/prefix/share/dbus-1/system.d/"
        mount --bind "$T/empty" /usr/share/polkit-1/actions
        mount --bind "$T/empty" /usr/share/dbus-1/system.d
        run_json prefix "$forkctl" doctor --json --prefix "$T/prefix" --token-file "$T/token"
        check "--prefix: an action file found only there warns that polkitd does not look there" \
                bash -c '[ "$1" = warn ] && grep -q "does not look" <<<"$2"' _ "$(status_of prefix polkit-action)" \
                "$(field_of prefix polkit-action detail)"
        check "--prefix: a bus policy found only there fails (dbus-daemon does not read it)" \
                bash -c '[ "$1" = fail ] && grep -q "does not look" <<<"$2"' _ "$(status_of prefix bus-policy)" \
                "$(field_of prefix bus-policy detail)"
        run_json noprefix "$forkctl" doctor --json --token-file "$T/token"
        check "nothing installed: the bus policy fails and the action file warns, each with a fix" \
                bash -c '[ "$1" = fail ] && [ "$2" = warn ]' _ "$(status_of noprefix bus-policy)" \
                "$(status_of noprefix polkit-action)"
        umount /usr/share/polkit-1/actions /usr/share/dbus-1/system.d

        # polkitd stopped: the check gives up in time and warns.
        kill -STOP "$polkitd_pid"
        start=$(date +%s)
        run_json stopped "$forkctl" doctor --json --token-file "$T/token"
        elapsed=$(( $(date +%s) - start ))
        kill -CONT "$polkitd_pid"
        check "a stopped polkitd is a warn" [ "$(status_of stopped polkitd)" = warn ]
        check "and the doctor still ends within 10 s (${elapsed}s)" [ "$elapsed" -le 10 ]
        echo "# stopped polkitd: $(field_of stopped polkitd detail)"

        # No bus at all: a warn, not a hang.
        DBUS_SYSTEM_BUS_ADDRESS="unix:path=$T/no-such-socket" run_json nobus "$forkctl" doctor --json --token-file "$T/token"
        check "no system bus: polkitd is a warn" [ "$(status_of nobus polkitd)" = warn ]
fi

echo "1..$n"
[ $failed = 0 ]
