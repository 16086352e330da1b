#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# Real test of the systemd-scope memory-limit backend (src/daemon/cgroup.c):
# systemd (from a Debian debootstrap tree) boots as PID 1 of new PID, mount, UTS,
# IPC and cgroup namespaces, with the build directory and /dev/kvm bind-mounted
# in; forkd runs inside as the repository ships it (units/forkd.service, started
# by D-Bus activation through dbus/org.forkd.Manager.service), must pick the
# systemd-scope backend, and forks the test guest with memory_limit_mib. Checked: each sandbox
# gets forkd-<id>.scope with MemoryMax=, the limit is in the kernel, a sandbox
# driven over its limit dies alone and is reported "oom-killed", its siblings
# answer, MergeSandbox keeps the winner's scope and drops the old VM's, terminating
# removes the scopes, and after a kill -9 of forkd in the
# middle of a fork and systemd's restart of it no VMM, scope or cgroup is left.
#
# The tree is cached outside the repository, in $FORKD_SCOPE_TREE_CACHE
# (default /var/cache/forkd-systemd-scope); its first build (debootstrap
# --variant=minbase --include=systemd,dbus bookworm) took 46 s here. The mirror
# comes from the machine's apt configuration.
#
# TAP output. A missing prerequisite is a TAP skip ("1..0 # SKIP reason", exit 0):
# meson's TAP protocol counts exit 77 as an error.
# Environment: FORKD, FORKD_VMM, FORKD_TEST_GUEST, FORKD_BUILD_ROOT.

set -u

CACHE=${FORKD_SCOPE_TREE_CACHE:-/var/cache/forkd-systemd-scope}
TREE=$CACHE/tree
SUITE=bookworm
LIMIT_MIB=40
STATE=/var/lib/forkd     # inside the namespace: the unit's --state-dir
LOG=/run/forkd-test.log  # inside the namespace: forkd's output

skip() { echo "1..0 # SKIP $*"; exit 0; }
bail() { echo "Bail out! $*"; exit 1; }

# ---- the tree (cached, built once) ----
build_tree() {
        local mirror
        command -v debootstrap >/dev/null || return 1
        mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null)
        [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null)
        [ -n "$mirror" ] || return 1
        rm -rf "$TREE.tmp"
        debootstrap --variant=minbase --include=systemd,dbus "$SUITE" "$TREE.tmp" "$mirror" >"$CACHE/debootstrap.log" 2>&1 || return 1
        touch "$TREE.tmp/.forkd-tree-ok" && mv "$TREE.tmp" "$TREE"
}
# A tree already there is used as it is (tools/run-tests carries it read-only into the test
# host, which has no network to build one).
prepare_tree() {
        [ -e "$TREE/.forkd-tree-ok" ] && return 0
        mkdir -p "$CACHE" || return 1
        (
                flock 9
                [ -e "$TREE/.forkd-tree-ok" ] || build_tree
        ) 9>"$CACHE/.lock"
}
# --prepare-tree: only build the cached tree (tools/run-tests, before the test host boots).
if [ "${1:-}" = --prepare-tree ]; then
        prepare_tree && [ -x "$TREE/lib/systemd/systemd" ] && exit 0
        echo "test-systemd-scope: no debootstrap tree in $TREE and it could not be built (see $CACHE/debootstrap.log)" >&2
        exit 1
fi

[ -n "${FORKD:-}" ] && [ -n "${FORKD_VMM:-}" ] && [ -n "${FORKD_TEST_GUEST:-}" ] && [ -n "${FORKD_BUILD_ROOT:-}" ] ||
        bail "FORKD, FORKD_VMM, FORKD_TEST_GUEST and FORKD_BUILD_ROOT must be set"
[ "$(id -u)" = 0 ] || skip "needs root (namespaces, mounts, cgroups)"
# Inside the tree the build directory sits at a fixed path: the shipped unit's
# PrivateTmp= and ProtectHome= would hide it where checkouts often live (/tmp, /root).
INBUILD=/opt/forkd-test-build
inside() {
        case "$1" in
        "$FORKD_BUILD_ROOT"/*) echo "$INBUILD${1#"$FORKD_BUILD_ROOT"}" ;;
        *) bail "$1 is not under FORKD_BUILD_ROOT ($FORKD_BUILD_ROOT)" ;;
        esac
}
IN_FORKD=$(inside "$FORKD") IN_VMM=$(inside "$FORKD_VMM") IN_GUEST=$(inside "$FORKD_TEST_GUEST")
for tool in unshare nsenter chroot python3 flock; do
        command -v $tool >/dev/null || skip "$tool is missing"
done
python3 -c 'import fcntl,os,sys; fd=os.open("/dev/kvm",os.O_RDWR); sys.exit(fcntl.ioctl(fd,0xAE00)!=12)' 2>/dev/null ||
        skip "/dev/kvm is not usable"
CGMODE=
if [ "$(stat -f -c %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ]; then
        grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null && CGMODE=unified
elif [ "$(stat -f -c %T /sys/fs/cgroup/memory 2>/dev/null)" = cgroupfs ]; then
        CGMODE=hybrid
fi
[ -n "$CGMODE" ] || skip "no cgroup memory controller"

prepare_tree
[ -e "$TREE/.forkd-tree-ok" ] && [ -x "$TREE/lib/systemd/systemd" ] ||
        skip "no debootstrap tree in $TREE and it could not be built (see $CACHE/debootstrap.log)"

# ---- namespaces ----
T=$(mktemp -d /tmp/forkd-scope-test.XXXXXX)

# Shared libraries forkd and forkd-vmm need that the tree lacks (libasan and
# libubsan in a sanitizer build): copied into the overlay, never into the cache.
: >"$T/libs"
for lib in $(ldd "$FORKD" "$FORKD_VMM" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u); do
        [ -e "$TREE$lib" ] || echo "$lib" >>"$T/libs"
done
NAME=forkd-scope-test-$$
NSINIT=
CGS=()

cleanup() {
        local pid
        # Killing PID 1 of the namespace kills everything in it; the mount
        # namespace, its mounts and the cgroup namespace go with the last process.
        if [ -n "$NSINIT" ]; then
                kill -KILL "$NSINIT" 2>/dev/null
        fi
        if [ -s "$T/unshare.pid" ]; then
                pid=$(cat "$T/unshare.pid")
                kill -KILL "$pid" 2>/dev/null
                wait "$pid" 2>/dev/null
        fi
        # Our cgroups, deepest first, once their tasks are gone.
        for d in "${CGS[@]}"; do
                for i in $(seq 100); do
                        find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
                        [ -d "$d" ] || break
                        sleep 0.05
                done
                [ -d "$d" ] && echo "# could not remove cgroup $d"
        done
        rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# A fresh cgroup in each hierarchy, below where we are: the root of the
# namespace's cgroups, so that the systemd inside stays in there.
while IFS=: read -r _ ctrl path; do
        if [ -z "$ctrl" ]; then
                [ "$CGMODE" = unified ] && mnt=/sys/fs/cgroup || mnt=/sys/fs/cgroup/unified
        else
                mnt=$(awk -v c="$ctrl" '$3 == "cgroup" { n = split($4, o, ","); for (i = 1; i <= n; i++) if (o[i] == c) print $2 }' /proc/self/mounts | head -1)
        fi
        [ -n "$mnt" ] && [ -d "$mnt" ] || continue
        if [ "$CGMODE" = unified ]; then
                # cgroup v2 hands controllers only to the children of a cgroup without
                # processes, and ours has some (this script): the new one goes at the top,
                # where systemd has enabled memory for its slices, and goes away with us.
                path=/
        fi
        d=$mnt${path%/}/$NAME
        mkdir "$d" || bail "cannot create cgroup $d"
        if [ "$CGMODE" = unified ] && ! grep -qw memory "$d/cgroup.controllers"; then
                CGS+=("$d")
                bail "the memory controller is not handed down to $d (controllers: $(cat "$d/cgroup.controllers"))"
        fi
        CGS+=("$d")
        # A v1 cpuset cgroup takes no task before it has CPUs and memory nodes.
        if [ -e "$d/cpuset.cpus" ]; then
                cat "$(dirname "$d")/cpuset.cpus" >"$d/cpuset.cpus"
                cat "$(dirname "$d")/cpuset.mems" >"$d/cpuset.mems"
        fi
done </proc/self/cgroup

cat >"$T/init.sh" <<'EOF'
#!/bin/bash
# PID 1 of the new namespaces until it execs systemd.
set -e
T=$1 TREE=$2 BUILD=$3 CGMODE=$4 INBUILD=$5
R=$T/root
mkdir -p "$T/upper" "$T/work" "$R"
# The cached tree stays pristine: writes go to an overlay in $T.
mount -t overlay overlay -o "lowerdir=$TREE,upperdir=$T/upper,workdir=$T/work" "$R"
mount -t proc proc "$R/proc"
# Read-only /sys: udev and friends stay off (ConditionPathIsReadWrite=/sys).
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
if [ "$CGMODE" = unified ]; then
        mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$R/sys/fs/cgroup"
else
        # Hybrid like the host: systemd finds a tmpfs with name=systemd and
        # mounts the other hierarchies and the unified one itself.
        mount -t tmpfs -o mode=755,nosuid,nodev,noexec tmpfs "$R/sys/fs/cgroup"
        mkdir "$R/sys/fs/cgroup/systemd" "$R/sys/fs/cgroup/memory"
        mount -t cgroup -o none,name=systemd cgroup "$R/sys/fs/cgroup/systemd"
        mount -t cgroup -o memory cgroup "$R/sys/fs/cgroup/memory"
fi
mount -t tmpfs -o mode=755,nosuid tmpfs "$R/dev"
for d in null zero full random urandom tty kvm; do
        touch "$R/dev/$d"
        mount --bind "/dev/$d" "$R/dev/$d"
done
mkdir "$R/dev/pts" "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
mkdir -p "$R$INBUILD"
mount --bind "$BUILD" "$R$INBUILD"
mount -o remount,bind,ro "$R$INBUILD"
while read -r lib; do
        mkdir -p "$R$(dirname "$lib")"
        cp -L "$lib" "$R$lib"
done <"$T/libs"
# pivot_root, not chroot: a chrooted process may not create user namespaces
# (units with PrivateUsers=), and systemd is better off at the real root.
cd "$R"
mkdir -p .oldroot
pivot_root . .oldroot
cd /
umount -l /.oldroot
rmdir /.oldroot
exec /usr/bin/env -i container=forkd-test /lib/systemd/systemd --unit=basic.target
EOF
chmod +x "$T/init.sh"

# Join the cgroups, then unshare: the cgroup namespace is rooted there.
sh -c 'for d in "$@"; do echo $$ >"$d/cgroup.procs" || exit 1; done
       exec unshare --pid --fork --mount --uts --ipc --cgroup --propagation private "'"$T"'/init.sh" "'"$T"'" "'"$TREE"'" "'"$FORKD_BUILD_ROOT"'" "'"$CGMODE"'" "'"$INBUILD"'"' \
        sh "${CGS[@]}" >"$T/console.log" 2>&1 &
echo $! >"$T/unshare.pid"

for i in $(seq 200); do
        NSINIT=$(pgrep -P "$(cat "$T/unshare.pid")" 2>/dev/null | head -1)
        [ -n "$NSINIT" ] && [ "$(readlink "/proc/$NSINIT/exe" 2>/dev/null)" != /usr/bin/bash ] &&
                [ "$(cat "/proc/$NSINIT/comm" 2>/dev/null)" = systemd ] && break
        NSINIT=
        sleep 0.05
done
[ -n "$NSINIT" ] || { sed 's/^/# /' "$T/console.log"; bail "systemd did not start as PID 1 of the namespace"; }
# unshare --fork stays behind in the namespace's root cgroup, outside the PID namespace
# where systemd cannot move it. Under cgroup v2 a cgroup with a process in it hands no
# controller down, so systemd could never give a scope memory.max: it goes back to ours.
if [ "$CGMODE" = unified ]; then
        echo "$(cat "$T/unshare.pid")" >"/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)/cgroup.procs" ||
                bail "cannot move unshare out of the namespace's root cgroup"
fi

IN() { nsenter -t "$NSINIT" -m -u -i -p -C -r -w "$@"; }

# ---- TAP ----
N=0
FAILED=0
ok() { N=$((N + 1)); echo "ok $N - $1"; }
notok() {
        N=$((N + 1)); FAILED=$((FAILED + 1)); echo "not ok $N - $1"
        shift
        [ $# -gt 0 ] && printf '# %s\n' "$@"
        IN tail -n 15 "$LOG" </dev/null 2>/dev/null | sed 's/^/# forkd: /'
}
bus() { IN busctl --timeout=120 "$@"; }
mgr() { bus --json=short call org.forkd.Manager /org/forkd/Manager org.forkd.Manager "$@"; }

state=
for i in $(seq 300); do
        state=$(IN systemctl is-system-running 2>/dev/null)
        case $state in running | degraded) break ;; esac
        sleep 0.1
done
if [ "$state" = running ] || [ "$state" = degraded ] && IN test -S /run/dbus/system_bus_socket; then
        ok "systemd 252 is PID 1 of the namespace ($state) with the system bus socket"
else
        notok "systemd 252 is PID 1 of the namespace" "state: $state" "$(sed 's/^/console: /' "$T/console.log")"
        echo "1..$N"
        exit 1
fi

# forkd as the repository ships it: units/forkd.service (hardened, Type=dbus,
# watchdog, Restart=on-failure), started by D-Bus activation through
# dbus/org.forkd.Manager.service (SystemdService=), with the bus policy
# dbus/org.forkd.Manager.conf. Only the paths of the binaries are the build's,
# and a drop-in sends the log to a file.
SRCDIR=$(cd "$(dirname "$0")/../.." && pwd)
R=/proc/$NSINIT/root
render() { sed -e "s|@SBINDIR@/forkd|$IN_FORKD|g" -e "s|@LIBEXECDIR@/forkd/forkd-vmm|$IN_VMM|g" "$1"; }
cp "$SRCDIR/dbus/org.forkd.Manager.conf" "$R/etc/dbus-1/system.d/"
mkdir -p "$R/usr/share/dbus-1/system-services" "$R/etc/systemd/system/forkd.service.d"
render "$SRCDIR/dbus/org.forkd.Manager.service" >"$R/usr/share/dbus-1/system-services/org.forkd.Manager.service"
render "$SRCDIR/units/forkd.service" >"$R/etc/systemd/system/forkd.service"
printf '[Service]\nStandardOutput=append:%s\nStandardError=append:%s\n' $LOG $LOG \
        >"$R/etc/systemd/system/forkd.service.d/50-test-log.conf"
# LeakSanitizer stops the world with ptrace(2), which the unit's system call
# filter refuses: a sanitizer build gets ptrace back, nothing else.
if ldd "$FORKD" "$FORKD_VMM" 2>/dev/null | grep -q libasan; then
        printf '[Service]\nSystemCallFilter=ptrace\n' >"$R/etc/systemd/system/forkd.service.d/60-sanitizer.conf"
fi
IN systemctl daemon-reload
IN busctl call org.freedesktop.DBus / org.freedesktop.DBus ReloadConfig >/dev/null 2>&1
IN truncate -s 16M /run/disk.img
# Wait until forkd owns its name (after activation or an automatic restart).
wait_forkd() {
        for i in $(seq 300); do
                bus call org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus NameHasOwner s org.forkd.Manager 2>/dev/null |
                        grep -q true && [ "$(IN systemctl is-active forkd.service)" = active ] && return 0
                sleep 0.05
        done
        return 1
}
# Scopes and sandbox cgroups of forkd in the namespace, one per line.
leftovers() {
        IN systemctl list-units --all --plain --no-legend 'forkd-sb-*.scope' 2>/dev/null
        IN sh -c 'ls -d /sys/fs/cgroup/*/forkd.slice/forkd-sb-* /sys/fs/cgroup/forkd.slice/forkd-sb-*' 2>/dev/null
}
# forkd-vmm processes (templates and children) of the namespace, by host pid.
# (The tree has no procps: look from the host, with shell builtins only.)
vmms() {
        local d arg0
        for d in /proc/[0-9]*; do
                [ "$d/ns/pid" -ef "/proc/$NSINIT/ns/pid" ] || continue
                read -r -d '' arg0 <"$d/cmdline" 2>/dev/null || continue
                [ "$arg0" = "$IN_VMM" ] && echo "${d#/proc/}"
        done
}
# The first call activates it.
if mgr ListSnapshots >/dev/null 2>"$T/activate.err" && wait_forkd; then
        ok "a call to org.forkd.Manager activates forkd.service (the shipped, hardened unit)"
else
        notok "a call to org.forkd.Manager activates forkd.service" "$(cat "$T/activate.err")" \
                "$(IN systemctl --no-pager status forkd.service 2>&1)"
        wait_forkd
fi
if IN grep -q "Memory limits: systemd-scope" $LOG; then
        ok "forkd picks the systemd-scope backend under systemd ($(IN grep -o 'Memory limits: .*' $LOG))"
else
        notok "forkd picks the systemd-scope backend under systemd"
fi

if mgr CreateSnapshot sssuu t1 "$IN_GUEST" /run/disk.img 64 30 | grep -q '"ready"'; then
        ok "CreateSnapshot of the test guest"
else
        notok "CreateSnapshot of the test guest"
fi

# Fork 3 with a limit: "id pid limit" per line.
mgr Fork 'sua{sv}' t1 3 1 memory_limit_mib u $LIMIT_MIB >"$T/fork.json"
mapfile -t SB < <(python3 -c '
import json, sys
for s in json.load(open(sys.argv[1]))["data"][0]:
    print(s["id"]["data"], s["pid"]["data"], s.get("memory_limit_mib", {}).get("data"))' "$T/fork.json" 2>/dev/null)
if [ ${#SB[@]} = 3 ] && [ "${SB[0]##* }" = $LIMIT_MIB ]; then
        ok "Fork of 3 with memory_limit_mib=$LIMIT_MIB"
else
        notok "Fork of 3 with memory_limit_mib=$LIMIT_MIB" "$(cat "$T/fork.json")"
        echo "1..$N"
        exit 1
fi
IDS=() PIDS=()
for l in "${SB[@]}"; do
        set -- $l
        IDS+=("$1") PIDS+=("$2")
done

bad=
for i in 0 1 2; do
        unit=forkd-${IDS[$i]}.scope
        props=$(IN systemctl show -p ActiveState,MemoryMax,Delegate,ControlGroup "$unit")
        grep -qx ActiveState=active <<<"$props" && grep -qx MemoryMax=$((LIMIT_MIB << 20)) <<<"$props" &&
                grep -qx Delegate=yes <<<"$props" || { bad="$unit: $props"; break; }
        cg=$(sed -n 's/^ControlGroup=//p' <<<"$props")
        if [ "$CGMODE" = unified ]; then
                kernel=$(IN cat "/sys/fs/cgroup$cg/memory.max")
        else
                kernel=$(IN cat "/sys/fs/cgroup/memory$cg/memory.limit_in_bytes")
        fi
        [ "$kernel" = $((LIMIT_MIB << 20)) ] || {
                bad="$unit: kernel limit '$kernel'; controllers: root: $(IN cat /sys/fs/cgroup/cgroup.controllers),"
                bad+=" root's subtree: $(IN cat /sys/fs/cgroup/cgroup.subtree_control),"
                bad+=" forkd.slice's subtree: $(IN cat /sys/fs/cgroup/forkd.slice/cgroup.subtree_control 2>&1)"
                break; }
        # The VMM is under the limit: in <scope>/<id> of the memory hierarchy.
        IN grep -Eq "^[0-9]+:(memory|[^:]*,memory|memory,[^:]*)?:$cg/${IDS[$i]}\$|^0::$cg/${IDS[$i]}\$" "/proc/${PIDS[$i]}/cgroup" ||
                { bad="VMM ${PIDS[$i]} not in $cg/${IDS[$i]}: $(IN cat /proc/${PIDS[$i]}/cgroup)"; break; }
done
if [ -z "$bad" ]; then
        ok "each sandbox has an active forkd-<id>.scope, MemoryMax=$((LIMIT_MIB << 20)), Delegate=yes, limit in the kernel, VMM inside"
else
        notok "each sandbox has an active forkd-<id>.scope with MemoryMax=" "$bad" \
                "$(IN systemctl --no-pager status "forkd-${IDS[0]}.scope" 2>&1)"
fi

# systemd's own view (systemctl status) lists the VMM once it joined the
# scope's cgroups in the hierarchy systemd tracks (unified / name=systemd).
status=
for i in $(seq 100); do
        status=$(IN systemctl --no-pager status "forkd-${IDS[0]}.scope" 2>&1)
        grep -q -- "─${PIDS[0]} " <<<"$status" && break
        sleep 0.05
done
if grep -q -- "─${PIDS[0]} " <<<"$status"; then
        ok "systemctl status forkd-<id>.scope lists the VMM (pid ${PIDS[0]})"
elif grep -q "Failed to dump process list.*Input/output error" <<<"$status" &&
        IN sh -c 'cat "/sys/fs/cgroup/forkd.slice/forkd-$1.scope/$1/cgroup.procs"' sh "${IDS[0]}" 2>/dev/null |
                grep -qx "${PIDS[0]}"; then
        # Seen in the test host (cgroup v2, systemd in a cgroup namespace below another
        # systemd): systemctl cannot dump any scope's processes there (EIO). The scope's own
        # cgroup, which systemd tracks, holds the VMM.
        ok "the scope's cgroup holds the VMM (pid ${PIDS[0]}); systemctl status cannot dump processes here (EIO)"
else
        notok "systemctl status forkd-<id>.scope lists the VMM (pid ${PIDS[0]})" "$status"
fi

# Over the limit: write the victim's guest RAM (copy-on-write faults charged
# to its memory cgroup) through /proc/<pid>/mem, from the host.
VPID=$(grep -l "^NSpid:.*[[:space:]]${PIDS[1]}\$" /proc/[0-9]*/status 2>/dev/null | while read -r f; do
        p=${f#/proc/}; p=${p%/status}
        [ "$(readlink /proc/$p/ns/pid)" = "$(readlink /proc/$NSINIT/ns/pid)" ] && echo "$p"
done | head -1)
python3 - "$VPID" <<'EOF'
import os, sys
pid = int(sys.argv[1])
with open(f"/proc/{pid}/maps") as f:
    start = next(int(line.split("-")[0], 16) for line in f if line.rstrip().endswith("/memory.bin"))
fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
try:
    for mib in range(16, 64):
        os.pwrite(fd, b"\xa5" * (1 << 20), start + (mib << 20))
except OSError:
    pass
EOF
# 60 s: under TCG in the test host, with the sanitizer build, the OOM kill and
# the VM's teardown are slow.
reason=
for i in $(seq 1200); do
        reason=$(IN sed -n "s/.*Sandbox ${IDS[1]} removed: \([a-z-]*\).*/\1/p" $LOG)
        [ -n "$reason" ] && break
        sleep 0.05
done
if [ "$reason" = oom-killed ]; then
        ok "the sandbox over its limit is removed as oom-killed"
else
        notok "the sandbox over its limit is removed as oom-killed" "reason: '$reason'"
        # on stderr too: meson shows it where the TAP log stays in the test host
        { echo "test-systemd-scope: the sandbox over its limit: reason '$reason' after ${i} polls; forkd's log:"
          IN tail -n 30 "$LOG" </dev/null 2>/dev/null; } >&2
fi

alive=0
for i in 0 2; do
        mgr Ping s "${IDS[$i]}" 2>/dev/null | grep -q pong && alive=$((alive + 1))
done
if [ $alive = 2 ] && [ "$(IN systemctl is-active forkd.service)" = active ] &&
        [ "$(IN systemctl is-active "forkd-${IDS[0]}.scope")" = active ]; then
        ok "its siblings answer, their scopes and forkd live on"
else
        notok "its siblings answer, their scopes and forkd live on" "$alive of 2 answered"
fi

# MergeSandbox: IDS[0] takes over the VM of IDS[2], which keeps its scope
# (forkd-<winner>.scope); the scope of IDS[0]'s old VM goes with that VM.
merged=$(mgr MergeSandbox ss "${IDS[0]}" "${IDS[2]}" 2>&1)
gone=
for i in $(seq 200); do
        gone=$(IN systemctl is-active "forkd-${IDS[0]}.scope")
        [ "$gone" != active ] && break
        sleep 0.05
done
if python3 -c 'import json, sys; d = json.loads(sys.argv[1])["data"][0]
sys.exit(not (d["id"]["data"] == sys.argv[2] and d["pid"]["data"] == int(sys.argv[3])))' "$merged" "${IDS[0]}" "${PIDS[2]}" 2>/dev/null &&
        [ "$gone" != active ] && [ "$(IN systemctl is-active "forkd-${IDS[2]}.scope")" = active ] &&
        mgr Ping s "${IDS[0]}" 2>/dev/null | grep -q pong && ! mgr GetSandbox s "${IDS[2]}" >/dev/null 2>&1; then
        ok "MergeSandbox: ${IDS[0]} drives the VM of ${IDS[2]} in forkd-${IDS[2]}.scope; its old scope is gone"
else
        notok "MergeSandbox keeps the winner's scope and removes the old one" "$merged" "old scope: $gone" \
                "$(IN systemctl list-units --all --plain --no-legend 'forkd-sb-*.scope' 2>&1)"
fi

mgr TerminateSandbox s "${IDS[0]}" >/dev/null
# Both scopes and their cgroups, for at most 30 s: under TCG, beside another test host, the
# OOM-killed VM's cgroup was once still there after the 10 s this waited before.
left=
end=$((SECONDS + 30))
while :; do
        left=$(leftovers)
        [ -z "$left" ] || [ $SECONDS -ge $end ] && break
        sleep 0.05
done
if [ -z "$left" ]; then
        ok "terminating (after a merge) removes the scopes and their cgroups"
else
        notok "terminating removes the scopes and their cgroups" "$left" \
                "$(IN sh -c 'for d in /sys/fs/cgroup/forkd.slice/forkd-sb-*; do echo "$d: $(tr "\n" " " <"$d/cgroup.events") procs: $(tr "\n" " " <"$d/cgroup.procs")"; done' 2>&1)"
fi

# kill -9 of forkd while it forks 30 with limits, then a restart: the registry
# is intact, and no VMM, scope or cgroup is left.
mgr Fork 'sua{sv}' t1 30 1 memory_limit_mib u $LIMIT_MIB >/dev/null 2>&1 &
forkpid=$!
# Once children are being spawned (the template runs, some VMMs exist), for at most 60 s.
end=$((SECONDS + 60))
while [ $SECONDS -lt $end ]; do
        [ "$(vmms | wc -l)" -ge 3 ] && break
        sleep 0.01
done
during="$(IN ls "$STATE/sandboxes" | wc -l) records, $(IN systemctl list-units --all --plain --no-legend 'forkd-sb-*.scope' | wc -l) scopes, $(vmms | wc -l) VMM processes"
IN systemctl kill --kill-who=main -s KILL forkd.service
wait $forkpid 2>/dev/null
for i in $(seq 200); do
        [ -z "$(vmms)" ] && [ -z "$(leftovers)" ] && break
        sleep 0.05
done
vmms_left=$(vmms)
# systemd starts forkd again (Restart=on-failure); it cleans up after its
# predecessor, from the sandbox records.
started=yes
wait_forkd || started=no
for i in $(seq 200); do
        [ -z "$(leftovers)" ] && break
        sleep 0.05
done
left=$(leftovers)
if [ -z "$vmms_left" ] && [ -z "$left" ] && [ $started = yes ]; then
        ok "kill -9 of forkd during a fork of 30 ($during), restart: no VMM, scope or cgroup left"
else
        notok "kill -9 of forkd during a fork of 30 ($during), restart: no VMM, scope or cgroup left" \
                "VMMs left: $vmms_left" "left: $left" "forkd restarted: $started"
fi
tags=$(mgr ListSnapshots 2>/dev/null | python3 -c 'import json, sys; print(" ".join(s["tag"]["data"] for s in json.load(sys.stdin)["data"][0]))' 2>/dev/null)
sbs=$(mgr ListSandboxes 2>/dev/null | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["data"][0]))' 2>/dev/null)
recs=$(IN ls "$STATE/sandboxes" 2>/dev/null)
mgr Fork 'sua{sv}' t1 2 1 memory_limit_mib u $LIMIT_MIB >"$T/fork2.json" 2>&1
mapfile -t IDS2 < <(python3 -c 'import json, sys; print("\n".join(s["id"]["data"] for s in json.load(open(sys.argv[1]))["data"][0]))' "$T/fork2.json" 2>/dev/null)
pongs=0
for id in "${IDS2[@]}"; do
        mgr Ping s "$id" 2>/dev/null | grep -q pong && pongs=$((pongs + 1))
        [ "$(IN systemctl is-active "forkd-$id.scope")" = active ] || pongs=-99
        mgr TerminateSandbox s "$id" >/dev/null 2>&1
done
if [ "$tags" = t1 ] && [ "$sbs" = 0 ] && [ -z "$recs" ] && [ $pongs = 2 ]; then
        ok "after the restart: snapshot t1 registered, no sandbox or record, a new fork with limits gets its scopes and answers"
else
        notok "after the restart: registry intact, new fork works" "snapshots: '$tags', sandboxes: '$sbs', records: '$recs', answered: $pongs" "$(cat "$T/fork2.json")"
fi

if IN grep -Eq "Sanitizer|runtime error:" $LOG; then
        notok "forkd logged no sanitizer report" "$(IN grep -E -A20 "Sanitizer|runtime error:" $LOG | head -40)"
else
        ok "forkd logged no sanitizer report"
fi

echo "1..$N"
[ $FAILED = 0 ]
