/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* mkdir -p with mode for the missing components; existing directories are fine. */
int mkdir_parents_and_self(const char *path, mode_t mode);

/* Write content to dir/name atomically: a temporary file in dir, fsync,
 * rename over name, fsync of the directory (skipped if sync_dir is false:
 * for batches, the caller fsyncs the directory once). */
int write_file_atomic(const char *dir, const char *name, const char *content, size_t len, bool sync_dir);

int fsync_path(const char *path);

/* Remove path and everything below it. Never follows symlinks, never leaves
 * the file system of path. -ENOENT is success. */
int rm_rf(const char *path);

/* Read a small file (at most max bytes, -EFBIG if larger) into a NUL-terminated buffer. */
int read_small_file(const char *path, size_t max, char **ret, size_t *ret_len);
