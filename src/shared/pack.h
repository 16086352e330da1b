/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Snapshot bundles: a snapshot chain (root to head) in one tar compressed
 * with zstd (libarchive): forkd's `pack`/`unpack` of diff-snapshot chains.
 *
 * The first member is "manifest.json":
 *
 *   { "version": 2,
 *     "chain": [ { "tag": T, "parent_tag": null|T, "parent_content_hash": null|H,
 *                  "files": [ { "name": N, "size": S, "sha256": H }, ... ] }, ... ] }
 *
 * ordered from the root to the head. Every other member is "<tag>/<name>", a
 * regular file listed there, once. Files are stored as sparse entries (pax,
 * GNU sparse 1.0): the holes of a memory file cost nothing in the bundle, and
 * are holes again when it is unpacked.
 *
 * Unpacking checks every member against the manifest (name, type, size,
 * SHA-256 of the whole logical content) and the chain against itself (each
 * link's parent_content_hash is the digest of its parent's memory file) while
 * writing into a staging directory; nothing there is usable until the caller
 * renames it into place.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "snapshot-meta.h"

#define PACK_MANIFEST_NAME "manifest.json"
#define PACK_MANIFEST_VERSION 2
#define PACK_MANIFEST_MAX (1024u * 1024u)            /* bytes of manifest.json */
#define PACK_LINKS_MAX 64u                            /* links in one bundle */
#define PACK_FILES_MAX (2u * SNAPSHOT_DISK_LAYERS_MAX + 8u) /* files in one link */
#define PACK_FILE_SIZE_MAX (UINT64_C(64) << 30)       /* logical size of one file */
#define PACK_TOTAL_SIZE_MAX (UINT64_C(256) << 30)     /* logical size of all files */
#define PACK_STALL_TIMEOUT_MS (60 * 1000)             /* a pipe without progress this long fails */

struct pack_file {
        char name[SNAPSHOT_FILE_NAME_MAX + 1];
        uint64_t size;
        char sha256[SNAPSHOT_HASH_LEN + 1];
        bool seen; /* unpack: its member was read */
};

struct pack_link {
        char tag[SNAPSHOT_TAG_MAX + 1];
        char parent_tag[SNAPSHOT_TAG_MAX + 1];          /* "": none */
        char parent_content_hash[SNAPSHOT_HASH_LEN + 1]; /* "": none */
        struct pack_file *files;
        size_t n_files;
};

struct pack_manifest {
        struct pack_link *links; /* root first */
        size_t n_links;
};

void pack_manifest_done(struct pack_manifest *m);

/* Parse and check manifest.json (the limits above, valid tags and file names,
 * no duplicate tag or file, each link's parent the link before it, every link
 * with a snapshot.json). On failure *ret is untouched and *ret_error (malloc()ed)
 * says why. */
int pack_manifest_parse(const char *json, size_t len, struct pack_manifest *ret, char **ret_error);
int pack_manifest_format(const struct pack_manifest *m, char **ret_json);

/* Write the bundle of dirs[0..n) (snapshot directories, root first) to fd;
 * *ret_bytes (optional): its size. *ret_error (malloc()ed) says what failed. */
int pack_write(int fd, const char *const *dirs, size_t n, uint64_t *ret_bytes, char **ret_error);

/* Read a bundle from fd into staging_dfd/<tag>/ (new_tag instead of the tag
 * for a single-link bundle, when not NULL; snapshot.json is rewritten for
 * it). Returns -EBADMSG for a refused bundle, another negative errno for an
 * I/O failure; *ret_error (malloc()ed) says why. On success *ret is the
 * manifest (with new_tag applied). */
int pack_read(int fd, int staging_dfd, const char *new_tag, struct pack_manifest *ret, char **ret_error);

/* The same, calling check(tag, userdata) for every tag the bundle would
 * register once its manifest is read, before any member is: a negative
 * return stops there, with that errno (and a message naming the tag). */
typedef int (*pack_tag_check_t)(const char *tag, void *userdata);
int pack_read_full(int fd, int staging_dfd, const char *new_tag, pack_tag_check_t check, void *userdata,
                   struct pack_manifest *ret, char **ret_error);
