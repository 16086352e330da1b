/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* forkd-oci: an OCI image (layout directory, oci-archive or docker-archive) into
 * an ext4 root file system for a forkd guest. The input is hostile: every blob is
 * checked against its digest and size, every layer member against the rules in
 * oci-layer.c, and every write goes through *at() calls from a directory fd of
 * the tree, never through a path the image could have redirected. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "macro.h"

struct archive;

#define OCI_JSON_MAX (4u * 1024u * 1024u)      /* index, manifest, config */
#define OCI_LAYERS_MAX 128u
#define OCI_MEMBERS_MAX (1u << 20)             /* per layer */
#define OCI_OUTER_MEMBERS_MAX 65536u           /* files and directories of an archive */
#define OCI_PATH_MAX 4096u
#define OCI_NAME_MAX 255u
#define OCI_STRV_MAX 4096u                     /* Env, Entrypoint, Cmd entries */
#define OCI_MAX_BYTES_DEFAULT (16ull << 30)
#define OCI_DIGEST_LEN 71                      /* "sha256:" and 64 hex digits */

/* Errors. A refusal of the input is -EBADMSG (exit status 2), anything else exits 1.
 * The first message set wins: it names what failed where it failed. */
#define OCI_ERROR_MAX 1024u
int oci_refuse(const char *fmt, ...) _printf_(1, 2);
int oci_fail(int r, const char *fmt, ...) _printf_(2, 3);
const char *oci_error_message(void);
/* The message is m now, whatever was set before ("": none). */
void oci_error_replace(const char *m);

/* Set by SIGTERM, SIGINT or SIGHUP: the loops stop with -EINTR, so that the work
 * directory is removed on the way out. */
extern volatile int oci_interrupted;
int oci_check_interrupted(void);

/* A digest "sha256:<64 lowercase hex>"; true when well formed. */
/* "sha256:" and 64 lowercase hex digits (registry-config.c). */
bool oci_digest_is_valid(const char *d);

/* SHA-256 with OpenSSL, as "sha256:<hex>". */
typedef struct oci_hash oci_hash;
oci_hash *oci_hash_new(void);
void oci_hash_update(oci_hash *h, const void *p, size_t n);
void oci_hash_final(oci_hash *h, char out[OCI_DIGEST_LEN + 1]);
oci_hash *oci_hash_free(oci_hash *h);
static inline void oci_hash_freep(oci_hash **h) {
        *h = oci_hash_free(*h);
}

/* A relative path inside the image made canonical: "./a//b/" -> "a/b", "." and "./"
 * -> "". -EBADMSG (with a static reason) for an absolute path, a ".." component, a
 * component over OCI_NAME_MAX or a path over OCI_PATH_MAX. */
int oci_path_normalize(const char *in, char **ret, const char **ret_reason);

/* The directory that holds the last component of the canonical path rel, opened
 * from root without following any symlink (O_PATH-free: a real directory fd), and
 * that last component. With create, missing directories on the way are made (0755).
 * -ELOOP when a component is a symlink, -ENOTDIR when it is something else. rel = ""
 * is refused (-EINVAL). */
int oci_open_parent(int root, const char *rel, bool create, int *ret_fd, const char **ret_name);

/* Remove name under dirfd and everything below it, never following symlinks.
 * A missing name is fine. */
int oci_rm_rf_at(int dirfd, const char *name);

/* The image as read from its manifest and config. */
typedef struct OciLayer {
        char digest[OCI_DIGEST_LEN + 1];   /* of the blob as stored ("" when unknown) */
        char diff_id[OCI_DIGEST_LEN + 1];  /* of the uncompressed tar */
        char chain_id[OCI_DIGEST_LEN + 1];
        int64_t size;                      /* of the blob, -1 when unknown */
        char *path;                        /* the blob below the image's directory */
        char name[OCI_DIGEST_LEN + 1];     /* how messages name it: digest, else diff_id */
} OciLayer;

typedef struct OciConfig {
        char **env;
        char *working_dir;
        char *user;
        char **entrypoint;
        char **cmd;
        bool start_cmd;
} OciConfig;

typedef struct OciImage {
        OciLayer layers[OCI_LAYERS_MAX];
        size_t n_layers;
        int dirfd;                         /* the layout, or the archive's work directory */
        int archive_fd;                    /* an archive whose large members are not unpacked yet */
        uint64_t max_bytes;
        OciConfig config;
} OciImage;

void oci_image_done(OciImage *img);

/* Read the image from fd: a directory (OCI layout) or a tar (oci-archive or
 * docker-archive, whose small members are unpacked into workdir, a private empty
 * directory): the manifest, the config (its digest checked) and the chain IDs of its
 * diff_ids. The layers' blobs are neither opened nor read, and need not be there yet:
 * max_bytes caps the archive. */
int oci_image_load(int fd, int workdir, uint64_t max_bytes, OciImage *ret);

/* What the layers still may take: the bytes of their regular files, and of their
 * uncompressed tars. */
typedef struct OciBudget {
        uint64_t files;
        uint64_t stream;
} OciBudget;

/* Apply layers from..n_layers-1 to the tree at root, in order, each read once
 * (oci_layer_apply()); after each, applied(i, userdata), and a negative answer
 * stops there. An archive's layers are read straight out of it where they come
 * in order; one that comes before its turn is unpacked into the work directory
 * and applied from there. A layer found in the cache by its chain ID is not read:
 * it was checked when it was stored. */
int oci_image_apply_layers(OciImage *img, size_t from, int root, OciBudget *budget,
                           int (*applied)(size_t i, void *userdata), void *userdata);

/* Where a layer's blob is read from: a file, or the member an archive reader
 * stands on (archive set; its data not read yet). */
typedef struct OciBlobSource {
        int fd;
        struct archive *archive;
} OciBlobSource;

/* Apply one layer to the tree at root, reading its blob once. The bytes are
 * hashed as they are read, and the blob's size and digest (where the image gives
 * them) and the uncompressed tar's diff_id must be what the image says, or the
 * layer is refused; unknown ones are filled in. A refused layer may have left part
 * of itself in the tree: the caller throws the tree away. */
int oci_layer_apply(int root, OciLayer *layer, const OciBlobSource *src, OciBudget *budget);

/* The tree: copies, the guest's files, its size, the file system. */
int oci_tree_link_copy(int src_parent, int dst_parent, const char *name);
int oci_tree_install_guest(int root, const char *agent_path, const OciConfig *c);
int oci_tree_bytes(int root, uint64_t *ret);
int oci_mkfs(const char *tree_path, const char *work_path, const char *out_path, uint64_t tree_bytes);

/* {"env": [...], "working_dir": ..., "user": ..., "entrypoint": [...], "cmd": [...],
 * "start_cmd": ...} as a new json-c object. */
struct json_object *oci_config_to_json(const OciConfig *c);
