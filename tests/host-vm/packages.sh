# SPDX-License-Identifier: LGPL-2.1-or-later
# Sourced by run and mkimage: the one place that lists what the test host needs.

# Debian release of the test host; the project is built outside on the same release.
HOST_VM_RELEASE=bookworm

# Debian packages the runner needs on the machine that runs it (also in tools/install-deps).
# command:package pairs, so the runner can tell which ones are missing.
HOST_VM_TOOLS="qemu-system-x86_64:qemu-system-x86 debootstrap:debootstrap mke2fs:e2fsprogs
               flock:util-linux unshare:util-linux"

# What goes into the test host's tree on top of debootstrap --variant=minbase. meson and
# ninja run the build dir's tests in place (meson test -C build-host-vm --no-rebuild).
# libasan8 and libubsan1: tools/run-tests runs its sanitizer build there too. openssl: the
# REST test makes a certificate to check HTTPS. tmux: the Linux guest's test runs forkctl
# shell in a real terminal. etcd-server: the fleet's tests run an etcd cluster.
# The kernel comes from the same tree, so the booted kernel and /lib/modules always match.
# libpam-systemd provides the logind polkitd depends on (debootstrap does not resolve it).
HOST_VM_PACKAGES="systemd systemd-sysv libpam-systemd dbus polkitd python3 kmod udev iproute2 procps curl
                  linux-image-amd64 initramfs-tools zstd
                  meson ninja-build
                  libsystemd0 libjson-c5 libzstd1 libssl3 libmnl0 libnftables1 libmicrohttpd12 libcmocka0 libarchive13
                  libasan8 libubsan1 openssl tmux etcd-server"
