/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Snapshot links as OCI artifacts: the manifest and the sparse blob encoding
 * (snapshot-artifact.h). */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "io-util.h"
#include "json-util.h"
#include "macro.h"
#include "pack-internal.h"
#include "snapshot-artifact.h"

/* ---- digests ---- */

typedef struct digester {
        EVP_MD_CTX *ctx;
} digester;

static int digester_init(digester *d) {
        d->ctx = EVP_MD_CTX_new();
        if (!d->ctx || EVP_DigestInit_ex(d->ctx, EVP_sha256(), NULL) != 1)
                return -ENOMEM;
        return 0;
}

static void digester_update(digester *d, const void *p, size_t n) {
        (void) EVP_DigestUpdate(d->ctx, p, n);
}

/* 64 hex digits and a NUL into hex; frees the context. */
static void digester_final(digester *d, char *hex) {
        uint8_t md[32];
        unsigned n = 0;

        (void) EVP_DigestFinal_ex(d->ctx, md, &n);
        for (unsigned i = 0; i < 32; i++)
                snprintf(hex + 2 * i, 3, "%02x", md[i]);
        EVP_MD_CTX_free(d->ctx);
        d->ctx = NULL;
}

static void digester_done(digester *d) {
        EVP_MD_CTX_free(d->ctx);
        d->ctx = NULL;
}

void artifact_digest_buffer(const void *buf, size_t len, char ret[ARTIFACT_DIGEST_SIZE]) {
        digester d = {};

        memcpy(ret, "sha256:", 7);
        if (digester_init(&d) < 0) {
                digester_done(&d);
                memset(ret + 7, '0', 64);
                ret[71] = 0;
                return;
        }
        digester_update(&d, buf, len);
        digester_final(&d, ret + 7);
}

static bool digest_is_valid(const char *s) {
        return s && strncmp(s, "sha256:", 7) == 0 && snapshot_content_hash_is_valid(s + 7);
}

/* ---- the manifest ---- */

void artifact_link_done(struct artifact_link *l) {
        if (!l)
                return;
        free(l->layers);
        l->layers = NULL;
        l->n_layers = 0;
}

const struct artifact_layer *artifact_link_find_layer(const struct artifact_link *l, const char *name) {
        for (size_t i = 0; i < l->n_layers; i++)
                if (strcmp(l->layers[i].name, name) == 0)
                        return &l->layers[i];
        return NULL;
}

static struct json_object *descriptor(const char *media_type, const char *digest, uint64_t size) {
        struct json_object *o = json_object_new_object();

        if (!o)
                return NULL;
        json_object_object_add(o, "mediaType", json_object_new_string(media_type));
        json_object_object_add(o, "digest", json_object_new_string(digest));
        json_object_object_add(o, "size", json_object_new_int64((int64_t) size));
        return o;
}

int artifact_manifest_format(const struct artifact_link *l, char **ret_json) {
        _cleanup_json_ struct json_object *o = json_object_new_object();
        struct json_object *layers = json_object_new_array(), *ann = json_object_new_object(), *config;
        const char *s;
        char *dup;

        if (!o || !layers || !ann) {
                json_object_put(layers);
                json_object_put(ann);
                return -ENOMEM;
        }
        config = descriptor(ARTIFACT_CONFIG_MEDIA_TYPE, l->config_digest, l->config_size);
        json_object_object_add(o, "schemaVersion", json_object_new_int(2));
        json_object_object_add(o, "mediaType", json_object_new_string(ARTIFACT_MANIFEST_MEDIA_TYPE));
        json_object_object_add(o, "artifactType", json_object_new_string(ARTIFACT_TYPE));
        json_object_object_add(o, "config", config);
        json_object_object_add(o, "layers", layers);
        json_object_object_add(o, "annotations", ann);
        if (!config)
                return -ENOMEM;
        for (size_t i = 0; i < l->n_layers; i++) {
                const struct artifact_layer *y = &l->layers[i];
                struct json_object *d = descriptor(ARTIFACT_LAYER_MEDIA_TYPE, y->digest, y->blob_size);
                struct json_object *a = json_object_new_object();
                char size[32];

                if (!d || !a || json_object_array_add(layers, d) < 0) {
                        json_object_put(d);
                        json_object_put(a);
                        return -ENOMEM;
                }
                snprintf(size, sizeof(size), "%" PRIu64, y->size);
                json_object_object_add(a, ARTIFACT_ANNOTATION_TITLE, json_object_new_string(y->name));
                json_object_object_add(a, ARTIFACT_ANNOTATION_FILE_SIZE, json_object_new_string(size));
                json_object_object_add(a, ARTIFACT_ANNOTATION_FILE_SHA256, json_object_new_string(y->sha256));
                json_object_object_add(d, "annotations", a);
        }
        json_object_object_add(ann, ARTIFACT_ANNOTATION_TAG, json_object_new_string(l->tag));
        if (l->parent_tag[0]) {
                json_object_object_add(ann, ARTIFACT_ANNOTATION_PARENT, json_object_new_string(l->parent_digest));
                json_object_object_add(ann, ARTIFACT_ANNOTATION_PARENT_TAG, json_object_new_string(l->parent_tag));
                json_object_object_add(ann, ARTIFACT_ANNOTATION_PARENT_HASH,
                                       json_object_new_string(l->parent_content_hash));
        }
        s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        if (!s || !(dup = strdup(s)))
                return -ENOMEM;
        *ret_json = dup;
        return 0;
}

/* A string member, or NULL when absent or not a string. */
static const char *get_string(struct json_object *o, const char *key) {
        struct json_object *v;

        if (!o || !json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
                return NULL;
        return json_object_get_string(v);
}

static int get_size(struct json_object *o, uint64_t max, uint64_t *ret) {
        struct json_object *v;
        int64_t n;

        if (!json_object_object_get_ex(o, "size", &v) || !json_object_is_type(v, json_type_int))
                return -EBADMSG;
        n = json_object_get_int64(v);
        if (n < 0 || (uint64_t) n > max)
                return -EBADMSG;
        *ret = (uint64_t) n;
        return 0;
}

static int parse_layer(struct json_object *d, size_t index, struct artifact_layer *y, char **ret_error) {
        struct json_object *a = NULL;
        const char *mt = get_string(d, "mediaType"), *digest = get_string(d, "digest"), *name, *size, *sha;
        char *end;
        unsigned long long n;

        if (!json_object_is_type(d, json_type_object) || !mt || strcmp(mt, ARTIFACT_LAYER_MEDIA_TYPE) != 0)
                return pack_set_error(ret_error, -EBADMSG, "Layer %zu is not a forkd snapshot file (media type %.128s).",
                                      index, mt ?: "(none)");
        if (!digest_is_valid(digest))
                return pack_set_error(ret_error, -EBADMSG, "Layer %zu has no valid sha256 digest.", index);
        /* The blob of a file: at most its size, its header, and 16 bytes per page. */
        if (get_size(d, PACK_FILE_SIZE_MAX + PACK_FILE_SIZE_MAX / 256 + 64, &y->blob_size) < 0)
                return pack_set_error(ret_error, -EBADMSG, "Layer %zu has an invalid size.", index);
        (void) json_object_object_get_ex(d, "annotations", &a);
        name = get_string(a, ARTIFACT_ANNOTATION_TITLE);
        size = get_string(a, ARTIFACT_ANNOTATION_FILE_SIZE);
        sha = get_string(a, ARTIFACT_ANNOTATION_FILE_SHA256);
        /* Nor forkd-vmm's hash caches, which are this machine's and never pushed. */
        if (!name || !snapshot_file_name_is_valid(name) || strcmp(name, "snapshot.json") == 0 ||
            strcmp(name, PACK_MANIFEST_NAME) == 0 ||
            (strlen(name) > strlen(SNAPSHOT_HASH_CACHE_SUFFIX) &&
             strcmp(name + strlen(name) - strlen(SNAPSHOT_HASH_CACHE_SUFFIX), SNAPSHOT_HASH_CACHE_SUFFIX) == 0))
                return pack_set_error(ret_error, -EBADMSG, "Layer %zu has no valid file name.", index);
        if (!sha || !snapshot_content_hash_is_valid(sha))
                return pack_set_error(ret_error, -EBADMSG, "Layer %s has no valid SHA-256.", name);
        if (!size || size[0] < '0' || size[0] > '9')
                return pack_set_error(ret_error, -EBADMSG, "Layer %s has no valid file size.", name);
        errno = 0;
        n = strtoull(size, &end, 10);
        if (errno != 0 || *end || n > PACK_FILE_SIZE_MAX || (size[0] == '0' && size[1]))
                return pack_set_error(ret_error, -EBADMSG, "Layer %s has no valid file size.", name);
        memcpy(y->name, name, strlen(name) + 1);
        memcpy(y->sha256, sha, SNAPSHOT_HASH_LEN + 1);
        memcpy(y->digest, digest, ARTIFACT_DIGEST_SIZE);
        y->size = n;
        return 0;
}

int artifact_manifest_parse(const char *json, size_t len, struct artifact_link *ret, char **ret_error) {
        _cleanup_json_ struct json_object *o = NULL;
        struct artifact_link l = {};
        struct json_object *v, *config = NULL, *layers = NULL, *ann = NULL;
        const char *err = NULL, *s, *parent, *ptag, *phash;
        size_t n;
        uint64_t total = 0;
        int r;

        r = json_parse_strict(json, len, ARTIFACT_MANIFEST_MAX, 8, &o, &err);
        if (r < 0)
                return pack_set_error(ret_error, -EBADMSG, "The manifest is not valid JSON: %s", err ?: "?");
        if (!json_object_object_get_ex(o, "schemaVersion", &v) || !json_object_is_type(v, json_type_int) ||
            json_object_get_int(v) != 2)
                return pack_set_error(ret_error, -EBADMSG, "The manifest's schemaVersion is not 2.");
        s = get_string(o, "mediaType");
        if (!s || strcmp(s, ARTIFACT_MANIFEST_MEDIA_TYPE) != 0)
                return pack_set_error(ret_error, -EBADMSG, "Not an OCI image manifest (media type %.128s).",
                                      s ?: "(none)");
        s = get_string(o, "artifactType");
        if (!s || strcmp(s, ARTIFACT_TYPE) != 0)
                return pack_set_error(ret_error, -EBADMSG, "Not a forkd snapshot (artifact type %.128s).", s ?: "(none)");
        (void) json_object_object_get_ex(o, "config", &config);
        s = get_string(config, "mediaType");
        if (!s || strcmp(s, ARTIFACT_CONFIG_MEDIA_TYPE) != 0)
                return pack_set_error(ret_error, -EBADMSG, "The manifest's config is not a forkd snapshot.json.");
        s = get_string(config, "digest");
        if (!digest_is_valid(s) || get_size(config, SNAPSHOT_META_FILE_MAX, &l.config_size) < 0)
                return pack_set_error(ret_error, -EBADMSG, "The manifest's config has an invalid digest or size.");
        memcpy(l.config_digest, s, ARTIFACT_DIGEST_SIZE);

        (void) json_object_object_get_ex(o, "annotations", &ann);
        s = get_string(ann, ARTIFACT_ANNOTATION_TAG);
        if (!s || !snapshot_tag_is_valid(s))
                return pack_set_error(ret_error, -EBADMSG, "The manifest has no valid " ARTIFACT_ANNOTATION_TAG ".");
        memcpy(l.tag, s, strlen(s) + 1);
        parent = get_string(ann, ARTIFACT_ANNOTATION_PARENT);
        ptag = get_string(ann, ARTIFACT_ANNOTATION_PARENT_TAG);
        phash = get_string(ann, ARTIFACT_ANNOTATION_PARENT_HASH);
        if (parent || ptag || phash) {
                if (!digest_is_valid(parent) || !ptag || !snapshot_tag_is_valid(ptag) || !phash ||
                    !snapshot_content_hash_is_valid(phash))
                        return pack_set_error(ret_error, -EBADMSG, "Link %s has invalid parent annotations.", l.tag);
                memcpy(l.parent_digest, parent, ARTIFACT_DIGEST_SIZE);
                memcpy(l.parent_tag, ptag, strlen(ptag) + 1);
                memcpy(l.parent_content_hash, phash, SNAPSHOT_HASH_LEN + 1);
        }

        if (!json_object_object_get_ex(o, "layers", &layers) || !json_object_is_type(layers, json_type_array))
                return pack_set_error(ret_error, -EBADMSG, "Link %s's manifest has no layers.", l.tag);
        n = json_object_array_length(layers);
        if (n > PACK_FILES_MAX)
                return pack_set_error(ret_error, -EBADMSG, "Link %s has more than %u files.", l.tag, PACK_FILES_MAX);
        l.layers = calloc(n + 1, sizeof(struct artifact_layer));
        if (!l.layers)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct artifact_layer *y = &l.layers[i];

                r = parse_layer(json_object_array_get_idx(layers, i), i, y, ret_error);
                if (r >= 0 && artifact_link_find_layer(&l, y->name))
                        r = pack_set_error(ret_error, -EBADMSG, "Link %s lists %s twice.", l.tag, y->name);
                if (r >= 0 && (total += y->size) > PACK_TOTAL_SIZE_MAX)
                        r = pack_set_error(ret_error, -EBADMSG, "Link %s is larger than %" PRIu64 " bytes.", l.tag,
                                           PACK_TOTAL_SIZE_MAX);
                if (r < 0) {
                        artifact_link_done(&l);
                        return r;
                }
                l.n_layers = i + 1;
        }
        *ret = l;
        return 0;
}

/* ---- sparse blobs ---- */

static void put_le64(uint8_t *p, uint64_t v) {
        v = htole64(v);
        memcpy(p, &v, 8);
}

static uint64_t get_le64(const uint8_t *p) {
        uint64_t v;

        memcpy(&v, p, 8);
        return le64toh(v);
}

static bool page_is_zero(const uint8_t *p, size_t n) {
        return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

static const uint8_t zero_window[SPARSE_BLOB_WINDOW];

struct blob_writer {
        int fd;
        digester d;
        uint64_t count;
};

static int blob_write(struct blob_writer *w, const void *p, size_t n) {
        int r = w->fd >= 0 ? loop_write(w->fd, p, n) : 0;

        if (r < 0)
                return r;
        digester_update(&w->d, p, n);
        w->count += n;
        return 0;
}

static int blob_record(struct blob_writer *w, uint64_t offset, const uint8_t *p, size_t n) {
        uint8_t h[16];
        int r;

        put_le64(h, offset);
        put_le64(h + 8, n);
        r = blob_write(w, h, sizeof(h));
        if (r >= 0 && n > 0)
                r = blob_write(w, p, n);
        return r;
}

static void hash_zeros(digester *d, uint64_t n) {
        while (n > 0) {
                size_t k = n > sizeof(zero_window) ? sizeof(zero_window) : (size_t) n;

                digester_update(d, zero_window, k);
                n -= k;
        }
}

/* The content digester's update, unless the content's hash is known already. */
static void content_update(digester *d, bool known, const void *p, size_t n) {
        if (!known)
                digester_update(d, p, n);
}

static void content_zeros(digester *d, bool known, uint64_t n) {
        if (!known)
                hash_zeros(d, n);
}

int sparse_blob_encode(int in_fd, uint64_t size, int out_fd, const char *known_sha256,
                       char ret_digest[ARTIFACT_DIGEST_SIZE], uint64_t *ret_blob_size,
                       char ret_sha256[SNAPSHOT_HASH_LEN + 1]) {
        _cleanup_free_ uint8_t *buf = malloc(SPARSE_BLOB_WINDOW);
        struct blob_writer w = { .fd = out_fd };
        bool known = known_sha256 && snapshot_content_hash_is_valid(known_sha256);
        digester content = {};
        uint8_t head[16];
        uint64_t pos = 0;
        int r;

        if (!buf)
                return -ENOMEM;
        r = digester_init(&w.d);
        if (r >= 0 && !known)
                r = digester_init(&content);
        if (r < 0)
                goto finish;
        memcpy(head, SPARSE_BLOB_MAGIC, 8);
        put_le64(head + 8, size);
        r = blob_write(&w, head, sizeof(head));
        while (r >= 0 && pos < size) {
                off_t data = lseek(in_fd, (off_t) pos, SEEK_DATA);
                size_t n;

                if (data < 0 && errno != ENXIO) {
                        r = -errno;
                        break;
                }
                if (data < 0 || (uint64_t) data >= size) {
                        content_zeros(&content, known, size - pos); /* a hole to the end */
                        pos = size;
                        break;
                }
                /* Skip the windows wholly in a hole. */
                if ((uint64_t) data - pos >= SPARSE_BLOB_WINDOW) {
                        uint64_t w0 = (uint64_t) data / SPARSE_BLOB_WINDOW * SPARSE_BLOB_WINDOW;

                        content_zeros(&content, known, w0 - pos);
                        pos = w0;
                }
                n = size - pos < SPARSE_BLOB_WINDOW ? (size_t) (size - pos) : SPARSE_BLOB_WINDOW;
                r = pread_exact(in_fd, buf, n, pos);
                if (r < 0)
                        break;
                content_update(&content, known, buf, n);
                for (size_t i = 0; r >= 0 && i < n;) {
                        size_t start, k = n - i < SPARSE_BLOB_PAGE ? n - i : SPARSE_BLOB_PAGE;

                        if (page_is_zero(buf + i, k)) {
                                i += k;
                                continue;
                        }
                        start = i;
                        i += k;
                        while (i < n) {
                                k = n - i < SPARSE_BLOB_PAGE ? n - i : SPARSE_BLOB_PAGE;
                                if (page_is_zero(buf + i, k))
                                        break;
                                i += k;
                        }
                        r = blob_record(&w, pos + start, buf + start, i - start);
                }
                pos += n;
        }
        if (r >= 0)
                r = blob_record(&w, size, NULL, 0);
        if (r >= 0) {
                memcpy(ret_digest, "sha256:", 7);
                digester_final(&w.d, ret_digest + 7);
                if (known)
                        memcpy(ret_sha256, known_sha256, SNAPSHOT_HASH_LEN + 1);
                else
                        digester_final(&content, ret_sha256);
                *ret_blob_size = w.count;
        }
finish:
        digester_done(&w.d);
        digester_done(&content);
        return r;
}

int sparse_blob_decode(int in_fd, uint64_t blob_size, int out_fd, uint64_t size, const char *sha256,
                       char **ret_error) {
        _cleanup_free_ uint8_t *buf = malloc(SPARSE_BLOB_WINDOW);
        char hex[SNAPSHOT_HASH_LEN + 1];
        digester content = {};
        uint64_t in = 16, pos = 0;
        uint8_t h[16];
        int r;

        if (!buf)
                return -ENOMEM;
        if (blob_size < 32)
                return pack_set_error(ret_error, -EBADMSG, "The blob is too short for a forkd sparse file.");
        r = pread_exact(in_fd, h, sizeof(h), 0);
        if (r < 0)
                return r;
        if (memcmp(h, SPARSE_BLOB_MAGIC, 8) != 0)
                return pack_set_error(ret_error, -EBADMSG, "The blob is not a forkd sparse file.");
        if (get_le64(h + 8) != size)
                return pack_set_error(ret_error, -EBADMSG, "The blob holds %" PRIu64 " bytes, the manifest says %" PRIu64 ".",
                                      get_le64(h + 8), size);
        r = digester_init(&content);
        if (r < 0)
                goto finish;
        for (;;) {
                uint64_t off, len;

                if (blob_size - in < 16) {
                        r = pack_set_error(ret_error, -EBADMSG, "The blob is truncated.");
                        goto finish;
                }
                r = pread_exact(in_fd, h, sizeof(h), in);
                if (r < 0)
                        goto finish;
                in += 16;
                off = get_le64(h);
                len = get_le64(h + 8);
                if (len == 0) {
                        if (off != size || in != blob_size) {
                                r = pack_set_error(ret_error, -EBADMSG, "The blob's end record is invalid.");
                                goto finish;
                        }
                        break;
                }
                if (off < pos || off > size || len > size - off || len > blob_size - in) {
                        r = pack_set_error(ret_error, -EBADMSG, "The blob holds a record out of order or out of bounds.");
                        goto finish;
                }
                hash_zeros(&content, off - pos);
                while (len > 0) {
                        size_t k = len > SPARSE_BLOB_WINDOW ? SPARSE_BLOB_WINDOW : (size_t) len;

                        r = pread_exact(in_fd, buf, k, in);
                        if (r >= 0)
                                r = pwrite_all(out_fd, buf, k, off);
                        if (r < 0)
                                goto finish;
                        digester_update(&content, buf, k);
                        in += k;
                        off += k;
                        len -= k;
                }
                pos = off;
        }
        hash_zeros(&content, size - pos);
        digester_final(&content, hex);
        if (strcmp(hex, sha256) != 0) {
                r = pack_set_error(ret_error, -EBADMSG, "The file's content does not match its SHA-256 (%.12s... instead of %.12s...).",
                                   hex, sha256);
                goto finish;
        }
        if (ftruncate(out_fd, (off_t) size) < 0) {
                r = -errno;
                goto finish;
        }
        r = 0;
finish:
        digester_done(&content);
        return r;
}
