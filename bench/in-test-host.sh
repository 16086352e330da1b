# SPDX-License-Identifier: LGPL-2.1-or-later
# Sourced by the bench/ scripts once $top and $build are set.
# bench_exec NAME SCRIPT ARGS...: python3 SCRIPT ARGS, as bench_exec_cmd runs a command.
# bench_exec_cmd NAME CMD ARGS...: CMD ARGS here where /dev/kvm is usable
# (tools/kvm-check: real KVM or PVM; real KVM only when bench_no_pvm is set, for
# the Linux guest), else inside the real-KVM test host (tests/host-vm/run) with
# --emulated added: the figures are then QEMU's, not ours. $FORKD_HOST_VM_CARRY,
# if set, names directories outside the checkout to carry in.
# The bench scripts import the test library tests/lib (dbusmini) and the daemon tests'
# helpers: PYTHONPATH names it, here and in the test host, which has the checkout at the
# same absolute path.
PYTHONPATH="$(cd "$top" && pwd -P)/tests/lib${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
bench_exec() {
        name=$1 script=$2
        shift 2
        bench_exec_cmd "$name" python3 "$script" "$@"
}

bench_exec_cmd() {
        name=$1
        shift
        kvm=$("$top/tools/kvm-check" 2>/dev/null) || true
        if [ "$kvm" = real ] || { [ "$kvm" = pvm ] && [ -z "${bench_no_pvm:-}" ]; }; then
                exec "$@"
        fi
        case $build/ in
        "$top"/*) rel=${build#"$top"/} ;;
        *) echo "$name: FORKD_BENCH_BUILD must lie inside $top to be carried into the test host" >&2; exit 2 ;;
        esac
        why="no usable /dev/kvm here"
        if [ "$kvm" = pvm ]; then
                why="/dev/kvm here is PVM, which cannot boot Linux"
        fi
        echo "$name: $why: running in the test host (QEMU TCG, nested SVM); the figures are emulated" >&2
        # Its CPU without AVX2, which TCG emulates slowly (tests/host-vm/run): OpenSSL's
        # SHA-256 takes 2.4 times as long with it, a cost real hardware does not have.
        FORKD_HOST_VM_CPU=${FORKD_HOST_VM_CPU:-max,erms=off,fsrm=off,avx2=off} \
        FORKD_HOST_VM_BUILD=0 FORKD_HOST_VM_BUILDDIR=$rel FORKD_HOST_VM_STDIN=none \
                FORKD_HOST_VM_PASSENV="${FORKD_HOST_VM_PASSENV:-} PYTHONPATH" \
                exec "$top/tests/host-vm/run" -- "$@" --emulated
}

# bench_linux_image NAME: the tools/mkimage Linux guest of this build's agent (or
# $FORKD_GUEST_IMAGE) in $img, carried into the test host; it runs here only on real
# KVM (bench_no_pvm). Call it once $build has agent/forkd-agent.
bench_linux_image() {
        img=${FORKD_GUEST_IMAGE:-}
        if [ -z "$img" ]; then
                img=$("$top/tools/mkimage" --agent "$build/agent/forkd-agent") || {
                        echo "$1: tools/mkimage failed; or set FORKD_GUEST_IMAGE to an image directory" >&2
                        exit 1
                }
        fi
        img=$(cd "$img" && pwd) || exit 1
        export FORKD_HOST_VM_CARRY="$img"
        bench_no_pvm=1
}
