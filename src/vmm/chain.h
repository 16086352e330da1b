/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Diff snapshots (chain links): memory.bin holds only the pages that differ
 * from the parent snapshot's memory, with memory.map, a bitmap of those
 * pages (little-endian 64-bit words, mem_size / 4096 / 64 of them), and
 * snapshot.json names the parent (parent_tag, a sibling directory) and the
 * SHA-256 of its memory.bin (parent_content_hash).
 *
 * Writing one: the pages of a restored VM that differ from its snapshot are
 * exactly the anonymous pages of its private mapping of that snapshot's
 * memory (copy-on-write faults put them there; clean pages stay page cache),
 * found through /proc/self/pagemap.
 *
 * Restoring one: the root's memory.bin is mapped MAP_PRIVATE, then each
 * link's runs of present pages over it with MAP_FIXED, root first; nothing is
 * assembled, clean pages stay shared through the page cache. Content hashes
 * are checked once, when the chain is loaded.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "snapshot.h"

#define CHAIN_DEPTH_MAX 64u
#define SNAPSHOT_MEMORY_MAP_FILE "memory.map"

struct vmm;

/* Write the pages of vmm's guest RAM that differ from the snapshot it was
 * restored from into dfd/memory.bin (sparse, mem_size long) and their bitmap
 * into dfd/memory.map. */
int chain_write_memory_diff(int dfd, const struct vmm *vmm);

/* SHA-256 of the whole file fd as 64 lowercase hex digits. */
int chain_hash_file(int fd, char ret[SNAPSHOT_HASH_LEN + 1]);
/* The same for the file dfd/name (open as fd), from the cache file
 * dfd/name.sha256 when that was written for this very file (device, inode,
 * size, modification and change times: a snapshot's memory never changes in
 * place), else computed and recorded there (best effort; not fsynced, a lost
 * one is computed again). Hashing the parent's 256 MiB took about 200 ms at
 * every diff branch and every start of a diff snapshot's template. The cache
 * is a file the VMM user may write: it saves time, it is not a guard (the
 * parent_content_hash check finds a parent re-snapshotted under its tag, not
 * a file altered in place). */
int chain_hash_file_cached(int dfd, const char *name, int fd, char ret[SNAPSHOT_HASH_LEN + 1]);

/* Load snap's ancestors (snap->meta.parent_tag set): check each link's
 * parent_content_hash, open each link's memory.bin and read its map.
 * -ENOLINK: a parent is gone (deleted with force); -ESTALE: a parent's memory
 * no longer has the content the link was made against (re-snapshotted under
 * the same tag); *ret_error says which, in forkd's documented words. */
int chain_load(struct snapshot *snap, char **ret_error);
void chain_free(struct snapshot *snap);

/* Map snap's guest RAM: MAP_PRIVATE of memory.bin, or of its chain. */
int snapshot_map_memory(const struct snapshot *snap, uint8_t **ret);
