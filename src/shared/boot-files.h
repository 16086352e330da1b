/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The files a snapshot boots from (kernel, initramfs, root disk), opened by
 * whoever has the right to read them: forkctl and forkd-rest open them with
 * their own credentials and hand the descriptors to forkd
 * (org.forkd.Manager.CreateSnapshotFromFds); forkd checks what it receives
 * and copies it into the snapshot's staging directory before a VMM sees it.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What forkd accepts (bytes). */
#define BOOT_KERNEL_SIZE_MAX (UINT64_C(256) << 20)
#define BOOT_INITRD_SIZE_MAX (UINT64_C(1) << 30)
#define BOOT_ROOTFS_SIZE_MAX (UINT64_C(64) << 30)
#define BOOT_IMAGE_SIZE_MAX (UINT64_C(32) << 30) /* an OCI image tar */

/* open(path) read-only (O_CLOEXEC, O_NOCTTY, no blocking on a FIFO) with the
 * caller's own credentials; -EISDIR or -EINVAL (not a regular file) after a
 * successful open. */
int boot_file_open(const char *path, int *ret_fd);

/* Where Debian puts a kernel's initramfs, beside it: vmlinu[zx][-V] ->
 * initrd.img[-V]. Returns 1 and the path in buf when that name applies and
 * the file exists, 0 when not (the kernel boots without one). */
int boot_initrd_beside(const char *kernel, char *buf, size_t size);

/* A descriptor handed over by a caller: a regular file, open for reading
 * (not O_PATH, not write-only), of at most max bytes. -EBADF not readable,
 * -EINVAL not a regular file, -EFBIG too large. */
int boot_fd_check(int fd, uint64_t max, uint64_t *ret_size);

/* An OCI image: a directory (an image layout) or a regular file (an
 * oci-archive or docker-archive tar), opened for reading with the caller's
 * rights. -EINVAL (closed) when it is neither. */
int boot_image_open(const char *path, int *ret_fd);
