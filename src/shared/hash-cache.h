/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The SHA-256 of a snapshot file, kept beside it as NAME.sha256: one line,
 * "v1 DEV INO SIZE MTIME_NS CTIME_NS HEX". It holds only while the file is the very
 * one it was computed for, unchanged: any write, truncation or replacement changes
 * the inode, the times or the size, and the entry is ignored (then rewritten).
 * Snapshot files are written once, so a snapshot's content hash is computed once:
 * when a diff chain is first loaded, packed, pushed, unpacked or pulled. */

#include "snapshot-meta.h"

/* 1 with ret set when NAME.sha256 under dfd matches fd (NAME's open file); 0 when
 * there is none, or it is for another file or version. */
int hash_cache_get(int dfd, const char *name, int fd, char ret[SNAPSHOT_HASH_LEN + 1]);

/* Record hash for fd (NAME's open file, not to be written again) as NAME.sha256:
 * best effort, atomically (a temporary name, then rename). A directory that cannot
 * be written, a full disk or a race with another writer leave no entry. */
void hash_cache_put(int dfd, const char *name, int fd, const char *hash);
