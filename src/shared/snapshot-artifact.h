/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Snapshot chains as OCI artifacts: forkd's `push` and `pull` (the transport is
 * src/oci/registry.h; this is the format, which needs no network).
 *
 * One image manifest per chain link:
 *
 *   { "schemaVersion": 2,
 *     "mediaType": "application/vnd.oci.image.manifest.v1+json",
 *     "artifactType": "application/vnd.forkd.snapshot.v1",
 *     "config": { "mediaType": "application/vnd.forkd.snapshot.config.v1+json",
 *                 "digest": D, "size": S },                 the link's snapshot.json
 *     "layers": [ { "mediaType": "application/vnd.forkd.snapshot.file.v1.sparse",
 *                   "digest": D, "size": S,
 *                   "annotations": { "org.opencontainers.image.title": NAME,
 *                                    "org.forkd.file.size": "BYTES",
 *                                    "org.forkd.file.sha256": HEX } }, ... ],
 *     "annotations": { "org.forkd.tag": TAG,
 *                      "org.forkd.parent": PARENT_MANIFEST_DIGEST,      (not on a root)
 *                      "org.forkd.parent.tag": PARENT_TAG,              (idem)
 *                      "org.forkd.parent.content_hash": HEX } }         (idem)
 *
 * One layer per file of the link but snapshot.json and the hash caches, sorted
 * by name; org.forkd.file.sha256 is the SHA-256 of the file's logical content
 * (holes read as zeros), as in a pack bundle.
 *
 * A layer blob is a sparse file in the "forkd sparse v1" encoding:
 *
 *   "FKDSPRS1"  u64 logical size
 *   records     u64 offset, u64 length (> 0), then length bytes of data
 *   end         u64 offset = the logical size, u64 length = 0
 *
 * all integers little-endian, records in increasing offset order, none
 * overlapping. What no record covers reads as zeros. The encoder writes one
 * record per maximal run of 4 KiB pages that are not all zeros inside each
 * 1 MiB-aligned window of the file: the blob is a function of the content
 * only (identical files give identical blobs, which the registry stores
 * once), and holes cost 16 bytes per run.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pack.h"
#include "snapshot-meta.h"

#define ARTIFACT_TYPE "application/vnd.forkd.snapshot.v1"
#define ARTIFACT_CONFIG_MEDIA_TYPE "application/vnd.forkd.snapshot.config.v1+json"
#define ARTIFACT_LAYER_MEDIA_TYPE "application/vnd.forkd.snapshot.file.v1.sparse"
#define ARTIFACT_MANIFEST_MEDIA_TYPE "application/vnd.oci.image.manifest.v1+json"
#define ARTIFACT_ANNOTATION_TAG "org.forkd.tag"
#define ARTIFACT_ANNOTATION_PARENT "org.forkd.parent"
#define ARTIFACT_ANNOTATION_PARENT_TAG "org.forkd.parent.tag"
#define ARTIFACT_ANNOTATION_PARENT_HASH "org.forkd.parent.content_hash"
#define ARTIFACT_ANNOTATION_TITLE "org.opencontainers.image.title"
#define ARTIFACT_ANNOTATION_FILE_SIZE "org.forkd.file.size"
#define ARTIFACT_ANNOTATION_FILE_SHA256 "org.forkd.file.sha256"
#define ARTIFACT_MANIFEST_MAX (256u * 1024u)
#define ARTIFACT_DIGEST_SIZE (7 + 64 + 1) /* "sha256:", 64 hex digits, NUL */

#define SPARSE_BLOB_MAGIC "FKDSPRS1"
#define SPARSE_BLOB_WINDOW (1024u * 1024u)
#define SPARSE_BLOB_PAGE 4096u

struct artifact_layer {
        char name[SNAPSHOT_FILE_NAME_MAX + 1];
        uint64_t size;                     /* logical size of the file */
        char sha256[SNAPSHOT_HASH_LEN + 1]; /* of the logical content */
        char digest[ARTIFACT_DIGEST_SIZE];  /* of the blob */
        uint64_t blob_size;
};

struct artifact_link {
        char tag[SNAPSHOT_TAG_MAX + 1];
        char parent_tag[SNAPSHOT_TAG_MAX + 1];           /* "": a root */
        char parent_content_hash[SNAPSHOT_HASH_LEN + 1];
        char parent_digest[ARTIFACT_DIGEST_SIZE];        /* the parent's manifest, "" on a root */
        char config_digest[ARTIFACT_DIGEST_SIZE];
        uint64_t config_size;
        struct artifact_layer *layers;
        size_t n_layers;
};

void artifact_link_done(struct artifact_link *l);
const struct artifact_layer *artifact_link_find_layer(const struct artifact_link *l, const char *name);

/* The manifest of l (compact JSON, keys in a fixed order: the same link gives
 * the same bytes, hence the same digest). */
int artifact_manifest_format(const struct artifact_link *l, char **ret_json);

/* Parse and check a manifest: the media and artifact types, valid digests,
 * tag and file names, no duplicate layer, at most PACK_FILES_MAX layers of at
 * most PACK_FILE_SIZE_MAX bytes, a config of at most SNAPSHOT_META_FILE_MAX,
 * the parent annotations all present or all absent. -EBADMSG and
 * *ret_error (malloc()ed) when refused. */
int artifact_manifest_parse(const char *json, size_t len, struct artifact_link *ret, char **ret_error);

/* "sha256:<hex>" of buf. */
void artifact_digest_buffer(const void *buf, size_t len, char ret[ARTIFACT_DIGEST_SIZE]);

/* Encode the size bytes of in_fd (read with pread, holes skipped with
 * SEEK_DATA) to out_fd (written sequentially; -1: nowhere, for the hashes
 * alone). Returns the blob's digest and size and the SHA-256 of the logical
 * content: known_sha256 when it is given (from the file's hash cache), not
 * computed again. */
int sparse_blob_encode(int in_fd, uint64_t size, int out_fd, const char *known_sha256,
                       char ret_digest[ARTIFACT_DIGEST_SIZE], uint64_t *ret_blob_size,
                       char ret_sha256[SNAPSHOT_HASH_LEN + 1]);

/* Decode the blob_size bytes of in_fd (from offset 0) into out_fd, a new
 * empty file, leaving holes where no record is: -EBADMSG (and *ret_error) when
 * the encoding is invalid, its size is not size, or its content does not hash
 * to sha256. */
int sparse_blob_decode(int in_fd, uint64_t blob_size, int out_fd, uint64_t size, const char *sha256,
                       char **ret_error);
