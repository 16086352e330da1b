/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* mkdir -p with mode for the missing components; existing directories are fine. */
int mkdir_parents_and_self(const char *path, mode_t mode);

/* Write content to dir/name atomically: a temporary file in dir, renamed
 * over name. WRITE_SYNC_DATA fsyncs the file before the rename,
 * WRITE_SYNC_DIR the directory after it. Without either the file survives a
 * killed process (the page cache has it), not a power loss: for records that
 * only a crash of forkd needs, whose readers ignore a broken one. */
enum {
        WRITE_SYNC_DATA = 1 << 0,
        WRITE_SYNC_DIR = 1 << 1,
};
int write_file_atomic(const char *dir, const char *name, const char *content, size_t len, unsigned flags);

/* A new file name in the directory dfd with content, whole or not at all:
 * written as an unnamed O_TMPFILE and linked in once complete (one directory
 * operation rather than create and rename), or, where the file system has no
 * O_TMPFILE, through a temporary name. -EEXIST if name exists. Not synced. */
int write_file_new_at(int dfd, const char *name, const char *content, size_t len);

int fsync_path(const char *path);

/* Remove path and everything below it. Never follows symlinks, never leaves
 * the file system of path. -ENOENT is success. */
int rm_rf(const char *path);

/* Read a small file (at most max bytes, -EFBIG if larger) into a NUL-terminated buffer. */
int read_small_file(const char *path, size_t max, char **ret, size_t *ret_len);

/* Copy the regular file src_fd (its first size bytes, read at explicit offsets) into a new file dir_fd/name (O_EXCL,
 * mode): a reflink (FICLONE) where the file system can, else extent by
 * extent (SEEK_DATA/SEEK_HOLE, copy_file_range, read/write as the last
 * resort), so holes stay holes. On failure the new file is removed. */
int copy_file_sparse(int src_fd, int dir_fd, const char *name, uint64_t size, mode_t mode);
