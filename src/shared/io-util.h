/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The read and write loops every program needs: EINTR retried, short reads
 * and writes continued, sizes capped by the caller. 0 or -errno. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* All of buf to fd; a non-blocking fd that says EAGAIN is waited on with poll. */
int loop_write(int fd, const void *buf, size_t len);
/* Exactly len bytes at off; -EIO when the file ends first. */
int pread_exact(int fd, void *buf, size_t len, uint64_t off);
/* All of buf at off. */
int pwrite_all(int fd, const void *buf, size_t len, uint64_t off);
/* Up to len bytes, stopping early only at end of file; the count read, or -errno. */
ssize_t loop_read(int fd, void *buf, size_t len);

/* A regular file (path relative to dfd, or AT_FDCWD) of at most max bytes into a
 * new NUL-terminated buffer: -EMSGSIZE when larger, -EISDIR for a directory,
 * -EBADFD for anything else that is not a regular file. ret_len may be NULL. */
int read_file_capped_at(int dfd, const char *path, size_t max, char **ret_buf, size_t *ret_len);
