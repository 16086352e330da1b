/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * A client of OCI distribution registries (the Docker Registry HTTP API v2 that
 * docker-registry, Harbor, Zot and the cloud registries speak), on libcurl.
 *
 *   oci_ref_parse()                  "host[:port]/repo[/more]:tag" or "...@sha256:<hex>"
 *   oci_registry_config_load()       the admin's JSON file of registries
 *   oci_registry_new()               a client for one configured host
 *   oci_registry_get_manifest() ...  the protocol's operations, one request each
 *   oci_registry_pull_layout()       an image into an OCI image layout directory
 *   oci_registry_push_layout()       a layout's image to a registry
 *
 * Functions return >= 0 or a negative errno. A client's failures leave a message
 * in oci_registry_error(): the method, the URL (without user, password or query)
 * and the HTTP status. No message and no debug line ever holds a credential.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OCI_MANIFEST_MAX (4U * 1024U * 1024U)
#define OCI_DIGEST_SIZE (7 + 64 + 1) /* "sha256:" 64 hex digits and the NUL */

#define OCI_MEDIA_TYPE_INDEX "application/vnd.oci.image.index.v1+json"
#define OCI_MEDIA_TYPE_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define DOCKER_MEDIA_TYPE_MANIFEST_LIST "application/vnd.docker.distribution.manifest.list.v2+json"
#define DOCKER_MEDIA_TYPE_MANIFEST "application/vnd.docker.distribution.manifest.v2+json"

/* "sha256:" and 64 lowercase hex digits: the only digests forkd accepts. */
bool oci_digest_is_valid(const char *s);

typedef struct oci_ref {
        char *host;   /* "host" or "host:port" or "[v6]:port" */
        char *repo;   /* "library/debian" */
        char *tag;    /* "latest" when neither a tag nor a digest was given; NULL with a digest */
        char *digest; /* "sha256:..." or NULL */
} oci_ref;

/* ret_error (may be NULL) gets a malloc()ed reason on failure. */
int oci_ref_parse(const char *s, oci_ref **ret, char **ret_error);
oci_ref *oci_ref_free(oci_ref *r);
/* The manifest reference of the API: the digest if there is one, else the tag. */
const char *oci_ref_reference(const oci_ref *r);

typedef struct oci_registry_config oci_registry_config;

/* Reads and checks the whole file (every entry's host, its HTTP rule, that its
 * credentials file is readable and holds "user:password"). */
int oci_registry_config_load(const char *path, oci_registry_config **ret, char **ret_error);
oci_registry_config *oci_registry_config_free(oci_registry_config *c);

/* True for localhost, 127.0.0.0/8 and ::1, with or without a port. */
bool oci_host_is_loopback(const char *host);

typedef struct oci_registry oci_registry;

/* A client for host, which must be configured in c ("registry X is not configured
 * in FILE" otherwise). c may be freed afterwards. */
int oci_registry_new(const oci_registry_config *c, const char *host, oci_registry **ret, char **ret_error);
oci_registry *oci_registry_free(oci_registry *r);

/* Defaults: 10 s to connect, 60 s for a whole request that is not a blob's body,
 * and a blob transfer fails once it moves no byte for 30 s. 0 keeps a value. */
void oci_registry_set_timeouts(oci_registry *r, uint64_t connect_usec, uint64_t request_usec, uint64_t stall_usec);

/* The message of the last failure, or "" */
const char *oci_registry_error(const oci_registry *r);
/* Set the message (used by the layout code too); returns err (negative). */
int oci_registry_set_error(oci_registry *r, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Bytes of response and request bodies moved since the client was made. */
uint64_t oci_registry_bytes_fetched(const oci_registry *r);
uint64_t oci_registry_bytes_sent(const oci_registry *r);

typedef struct oci_manifest {
        char *data;
        size_t size;
        char *media_type;
        char digest[OCI_DIGEST_SIZE];
} oci_manifest;

oci_manifest *oci_manifest_free(oci_manifest *m);

/* reference: a tag or a digest. At most OCI_MANIFEST_MAX bytes; the digest is the
 * SHA-256 of the bytes, which must equal the registry's Docker-Content-Digest
 * when it sends one, and the digest asked for when reference is one. */
int oci_registry_get_manifest(oci_registry *r, const char *repo, const char *reference, oci_manifest **ret);

/* The blob's bytes are appended to fd as they arrive, following redirects (to
 * a host other than the registry without its Authorization). -EBADMSG when
 * they do not hash to digest or their count is not size: the caller discards
 * what was written. */
int oci_registry_get_blob(oci_registry *r, const char *repo, const char *digest, uint64_t size, int fd);

/* 1 and the size (ret_size may be NULL) when the registry has the blob, 0 when not. */
int oci_registry_head_blob(oci_registry *r, const char *repo, const char *digest, uint64_t *ret_size);

/* Uploads size bytes of fd from offset 0 as blob digest (POST, then one PUT
 * ?digest=), unless a HEAD shows the registry has it. With mount_from (a repo on
 * the same registry), asks to mount it from there first. Returns 1 when nothing
 * was sent (present or mounted), 0 when uploaded. */
int oci_registry_put_blob(oci_registry *r, const char *repo, const char *digest, int fd, uint64_t size,
                          const char *mount_from);

/* PUT of a manifest under a tag or its digest. */
int oci_registry_put_manifest(oci_registry *r, const char *repo, const char *reference, const char *media_type,
                              const void *data, size_t size);

typedef struct oci_layout_stats {
        uint64_t fetched_bytes; /* everything the registry sent, manifests included */
        uint64_t sent_bytes;
        unsigned blobs_fetched; /* config and layers not already in the layout */
        unsigned blobs_sent;    /* blobs the registry did not have */
        char digest[OCI_DIGEST_SIZE]; /* the image manifest pulled or pushed */
} oci_layout_stats;

/* Writes the image ref names (of an index: its linux/amd64 manifest) into the
 * OCI image layout dir (created when missing): blobs/sha256/<hex> for its
 * manifest, config and layers, oci-layout, and index.json, where an entry
 * annotated org.opencontainers.image.ref.name = the tag replaces one of the same
 * name. A blob already in dir with the right size and digest is not fetched, nor
 * are the first skip_layers layers (SIZE_MAX: the manifest and config only, to look
 * before fetching the rest; the layout is then complete only with a second pull). */
int oci_registry_pull_layout(oci_registry *r, const oci_ref *ref, const char *dir, size_t skip_layers,
                             oci_layout_stats *ret_stats);

/* Pushes the image of layout dir that index.json names ref's tag (or its only
 * image), blobs first, to ref. */
int oci_registry_push_layout(oci_registry *r, const char *dir, const oci_ref *ref, oci_layout_stats *ret_stats);

static inline void oci_ref_freep(oci_ref **p) {
        oci_ref_free(*p);
}
static inline void oci_registry_config_freep(oci_registry_config **p) {
        oci_registry_config_free(*p);
}
static inline void oci_registry_freep(oci_registry **p) {
        oci_registry_free(*p);
}
static inline void oci_manifest_freep(oci_manifest **p) {
        oci_manifest_free(*p);
}
