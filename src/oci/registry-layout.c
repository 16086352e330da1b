/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Images between a registry and an OCI image layout directory (oci-layout,
 * index.json, blobs/sha256/<hex>). */

#include <fcntl.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include "io-util.h"
#include "json-util.h"
#include "macro.h"
#include "registry.h"

#define LAYERS_MAX 1024U
#define INDEX_MAX (4U * 1024U * 1024U)
#define BLOB_SIZE_MAX (UINT64_C(1) << 40)
#define REF_NAME_ANNOTATION "org.opencontainers.image.ref.name"

struct descriptor {
        char *media_type;
        char *digest;
        uint64_t size;
        struct json_object *platform;
        struct json_object *annotations;
};

static const struct json_dispatch descriptor_table[] = {
        { "mediaType", JSON_KIND_STRING, NULL, offsetof(struct descriptor, media_type), 0, 0 },
        { "digest", JSON_KIND_STRING, NULL, offsetof(struct descriptor, digest), 0, JSON_MANDATORY },
        { "size", JSON_KIND_UINT64, NULL, offsetof(struct descriptor, size), 0, JSON_MANDATORY },
        { "platform", JSON_KIND_OBJECT, NULL, offsetof(struct descriptor, platform), 0, 0 },
        { "annotations", JSON_KIND_OBJECT, NULL, offsetof(struct descriptor, annotations), 0, 0 },
        {}
};

static void descriptor_done(struct descriptor *d) {
        free(d->media_type);
        free(d->digest);
        *d = (struct descriptor) {};
}

/* Descriptors are read leniently (registries add fields), their digest and size strictly. */
static int descriptor_parse(oci_registry *r, struct json_object *o, const char *where, struct descriptor *ret) {
        struct descriptor d = {};
        const char *field = NULL, *why = NULL;
        int k;

        k = json_dispatch_full(o, descriptor_table, 0, &d, &field, &why);
        if (k < 0) {
                descriptor_done(&d);
                return oci_registry_set_error(r, -EBADMSG, "%s: %s%s%s", where, field ?: "", field ? ": " : "",
                                              why ?: "invalid descriptor");
        }
        if (!oci_digest_is_valid(d.digest) || d.size > BLOB_SIZE_MAX) {
                descriptor_done(&d);
                return oci_registry_set_error(r, -EBADMSG, "%s: a descriptor with an unusable digest or size", where);
        }
        *ret = d;
        return 0;
}

static bool is_index_type(const char *t) {
        return t && (strcmp(t, OCI_MEDIA_TYPE_INDEX) == 0 || strcmp(t, DOCKER_MEDIA_TYPE_MANIFEST_LIST) == 0);
}

static bool is_manifest_type(const char *t) {
        return t && (strcmp(t, OCI_MEDIA_TYPE_MANIFEST) == 0 || strcmp(t, DOCKER_MEDIA_TYPE_MANIFEST) == 0);
}

static const char *platform_field(struct json_object *p, const char *key) {
        struct json_object *v;

        if (!p || !json_object_object_get_ex(p, key, &v) || !json_object_is_type(v, json_type_string))
                return NULL;
        return json_object_get_string(v);
}

/* config and layers of an image manifest, config first. */
static int manifest_blobs(oci_registry *r, const char *data, size_t size, struct descriptor **ret, size_t *ret_n) {
        _cleanup_(json_object_putp) struct json_object *obj = NULL;
        struct json_object *config, *layers;
        struct descriptor *v;
        size_t n;
        int k;

        if (json_parse_strict(data, size, OCI_MANIFEST_MAX, 32, &obj, NULL) < 0)
                return oci_registry_set_error(r, -EBADMSG, "the image manifest is not valid JSON");
        if (!json_object_object_get_ex(obj, "config", &config) || !json_object_is_type(config, json_type_object) ||
            !json_object_object_get_ex(obj, "layers", &layers) || !json_object_is_type(layers, json_type_array))
                return oci_registry_set_error(r, -EBADMSG, "the image manifest lacks config or layers");
        n = json_object_array_length(layers);
        if (n > LAYERS_MAX)
                return oci_registry_set_error(r, -EBADMSG, "the image manifest has more than %u layers", LAYERS_MAX);
        v = calloc(n + 1, sizeof *v);
        if (!v)
                return -ENOMEM;
        k = descriptor_parse(r, config, "manifest config", &v[0]);
        for (size_t i = 0; k >= 0 && i < n; i++)
                k = descriptor_parse(r, json_object_array_get_idx(layers, i), "manifest layer", &v[i + 1]);
        if (k < 0) {
                for (size_t i = 0; i <= n; i++)
                        descriptor_done(&v[i]);
                free(v);
                return k;
        }
        *ret = v;
        *ret_n = n + 1;
        return 0;
}

static void descriptors_free(struct descriptor *v, size_t n) {
        for (size_t i = 0; i < n; i++)
                descriptor_done(&v[i]);
        free(v);
}

/* 1 when blobs/sha256/<hex> is there with this size and digest, 0 when not. */
static int blob_present(int blobs_fd, const char *digest, uint64_t size) {
        _cleanup_close_ int fd = -EBADF;
        unsigned char md[EVP_MAX_MD_SIZE], buf[64 * 1024];
        char hex[65];
        unsigned len = 0;
        EVP_MD_CTX *ctx;
        struct stat st;
        ssize_t n;
        int ret = 0;

        fd = openat(blobs_fd, digest + 7, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return errno == ENOENT ? 0 : negative_errno();
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (!S_ISREG(st.st_mode) || (uint64_t) st.st_size != size)
                return 0;
        ctx = EVP_MD_CTX_new();
        if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
                EVP_MD_CTX_free(ctx);
                return -ENOMEM;
        }
        while ((n = loop_read(fd, buf, sizeof buf)) > 0)
                (void) EVP_DigestUpdate(ctx, buf, n);
        if (n < 0)
                ret = (int) n;
        else if (EVP_DigestFinal_ex(ctx, md, &len) == 1 && len == 32) {
                for (unsigned i = 0; i < 32; i++)
                        (void) snprintf(hex + 2 * i, 3, "%02x", md[i]);
                ret = strcmp(hex, digest + 7) == 0;
        } else
                ret = -EIO;
        EVP_MD_CTX_free(ctx);
        return ret;
}

/* A temporary name in blobs/sha256, renamed to <hex> only once complete. */
static int blob_fetch(oci_registry *r, const char *repo, int blobs_fd, const struct descriptor *d) {
        _cleanup_close_ int fd = -EBADF;
        char tmp[128];
        int k;

        (void) snprintf(tmp, sizeof tmp, ".partial-%s.%d", d->digest + 7, (int) getpid());
        fd = openat(blobs_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0)
                return oci_registry_set_error(r, negative_errno(), "cannot create blobs/sha256/%s: %m", tmp);
        k = oci_registry_get_blob(r, repo, d->digest, d->size, fd);
        if (k >= 0 && fsync(fd) < 0)
                k = oci_registry_set_error(r, negative_errno(), "cannot write blob %s: %m", d->digest);
        if (k >= 0 && renameat(blobs_fd, tmp, blobs_fd, d->digest + 7) < 0)
                k = oci_registry_set_error(r, negative_errno(), "cannot rename blob %s into place: %m", d->digest);
        if (k < 0)
                (void) unlinkat(blobs_fd, tmp, 0);
        return k;
}

/* Write data to dfd/name through a temporary name. */
static int write_atomic(oci_registry *r, int dfd, const char *name, const void *data, size_t size) {
        _cleanup_close_ int fd = -EBADF;
        char tmp[128];
        int k;

        (void) snprintf(tmp, sizeof tmp, ".tmp-%s.%d", name, (int) getpid());
        fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0)
                return oci_registry_set_error(r, negative_errno(), "cannot create %s: %m", tmp);
        k = loop_write(fd, data, size);
        if (k >= 0 && fsync(fd) < 0)
                k = negative_errno();
        if (k >= 0 && renameat(dfd, tmp, dfd, name) < 0)
                k = negative_errno();
        if (k < 0) {
                (void) unlinkat(dfd, tmp, 0);
                errno = -k;
                return oci_registry_set_error(r, k, "cannot write %s: %m", name);
        }
        return 0;
}

static int open_layout(oci_registry *r, const char *dir, bool create, int *ret_dfd, int *ret_blobs_fd) {
        _cleanup_close_ int dfd = -EBADF, blobs = -EBADF;

        if (create && mkdir(dir, 0755) < 0 && errno != EEXIST)
                return oci_registry_set_error(r, negative_errno(), "cannot create %s: %m", dir);
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return oci_registry_set_error(r, negative_errno(), "cannot open %s: %m", dir);
        if (create && ((mkdirat(dfd, "blobs", 0755) < 0 && errno != EEXIST) ||
                       (mkdirat(dfd, "blobs/sha256", 0755) < 0 && errno != EEXIST)))
                return oci_registry_set_error(r, negative_errno(), "cannot create %s/blobs/sha256: %m", dir);
        blobs = openat(dfd, "blobs/sha256", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (blobs < 0)
                return oci_registry_set_error(r, negative_errno(), "cannot open %s/blobs/sha256: %m", dir);
        *ret_dfd = TAKE_FD(dfd);
        *ret_blobs_fd = TAKE_FD(blobs);
        return 0;
}

/* The manifest of an index for linux/amd64. */
static int pick_platform(oci_registry *r, const oci_manifest *index, struct descriptor *ret) {
        _cleanup_(json_object_putp) struct json_object *obj = NULL;
        struct json_object *list;
        int k;

        if (json_parse_strict(index->data, index->size, OCI_MANIFEST_MAX, 32, &obj, NULL) < 0 ||
            !json_object_object_get_ex(obj, "manifests", &list) || !json_object_is_type(list, json_type_array))
                return oci_registry_set_error(r, -EBADMSG, "the image index %s is not valid", index->digest);
        for (size_t i = 0; i < json_object_array_length(list); i++) {
                struct descriptor d = {};
                const char *os, *arch;

                k = descriptor_parse(r, json_object_array_get_idx(list, i), "image index", &d);
                if (k < 0)
                        return k;
                os = platform_field(d.platform, "os");
                arch = platform_field(d.platform, "architecture");
                if (os && arch && strcmp(os, "linux") == 0 && strcmp(arch, "amd64") == 0 &&
                    (!d.media_type || is_manifest_type(d.media_type))) {
                        *ret = d;
                        return 0;
                }
                descriptor_done(&d);
        }
        return oci_registry_set_error(r, -ENOENT, "the image index %s has no linux/amd64 image", index->digest);
}

/* index.json with the entry for tag replaced (or added). */
static int write_index(oci_registry *r, int dfd, const oci_manifest *m, const char *tag) {
        _cleanup_(json_object_putp) struct json_object *index = NULL, *entry = NULL;
        _cleanup_free_ char *old = NULL;
        struct json_object *list = NULL, *fresh;
        bool present = false;
        const char *s;
        size_t len = 0;
        int k;

        k = read_file_capped_at(dfd, "index.json", INDEX_MAX, &old, &len);
        if (k >= 0 && json_parse_strict(old, len, INDEX_MAX, 32, &index, NULL) >= 0 &&
            json_object_object_get_ex(index, "manifests", &list) && json_object_is_type(list, json_type_array)) {
                fresh = json_object_new_array();
                if (!fresh)
                        return -ENOMEM;
                for (size_t i = 0; i < json_object_array_length(list); i++) {
                        struct json_object *e = json_object_array_get_idx(list, i), *ann, *name;

                        if (tag && json_object_object_get_ex(e, "annotations", &ann) &&
                            json_object_object_get_ex(ann, REF_NAME_ANNOTATION, &name) &&
                            json_object_is_type(name, json_type_string) && strcmp(json_object_get_string(name), tag) == 0)
                                continue;
                        /* Pulled by digest: an entry of the same image, tagged or not, stays and is enough. */
                        if (!tag && json_object_object_get_ex(e, "digest", &name) &&
                            json_object_is_type(name, json_type_string) && strcmp(json_object_get_string(name), m->digest) == 0)
                                present = true;
                        (void) json_object_array_add(fresh, json_object_get(e));
                }
                (void) json_object_object_add(index, "manifests", fresh);
                list = fresh;
        } else {
                json_object_put(index);
                index = json_object_new_object();
                list = json_object_new_array();
                if (!index || !list)
                        return -ENOMEM;
                (void) json_object_object_add(index, "schemaVersion", json_object_new_int(2));
                (void) json_object_object_add(index, "manifests", list);
        }

        if (present)
                goto write;
        entry = json_object_new_object();
        if (!entry)
                return -ENOMEM;
        (void) json_object_object_add(entry, "mediaType", json_object_new_string(m->media_type));
        (void) json_object_object_add(entry, "digest", json_object_new_string(m->digest));
        (void) json_object_object_add(entry, "size", json_object_new_int64((int64_t) m->size));
        if (tag) {
                struct json_object *ann = json_object_new_object();

                if (!ann)
                        return -ENOMEM;
                (void) json_object_object_add(ann, REF_NAME_ANNOTATION, json_object_new_string(tag));
                (void) json_object_object_add(entry, "annotations", ann);
        }
        (void) json_object_array_add(list, TAKE_PTR(entry));
write:
        s = json_object_to_json_string_ext(index, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        if (!s)
                return -ENOMEM;
        return write_atomic(r, dfd, "index.json", s, strlen(s));
}

static int write_manifest_blob(oci_registry *r, int blobs_fd, const oci_manifest *m) {
        int k = blob_present(blobs_fd, m->digest, m->size);

        if (k < 0)
                return oci_registry_set_error(r, k, "cannot read blob %s of the layout", m->digest);
        if (k > 0)
                return 0;
        return write_atomic(r, blobs_fd, m->digest + 7, m->data, m->size);
}

int oci_registry_pull_layout(oci_registry *r, const oci_ref *ref, const char *dir, size_t skip_layers,
                             oci_layout_stats *ret_stats) {
        _cleanup_(oci_manifest_freep) oci_manifest *m = NULL;
        _cleanup_close_ int dfd = -EBADF, blobs_fd = -EBADF;
        static const char layout[] = "{\"imageLayoutVersion\":\"1.0.0\"}";
        uint64_t fetched0 = oci_registry_bytes_fetched(r), sent0 = oci_registry_bytes_sent(r);
        struct descriptor *blobs = NULL;
        size_t n_blobs = 0;
        unsigned fetched_blobs = 0;
        int k;

        k = open_layout(r, dir, true, &dfd, &blobs_fd);
        if (k < 0)
                return k;
        k = oci_registry_get_manifest(r, ref->repo, oci_ref_reference(ref), &m);
        if (k < 0)
                return k;
        if (is_index_type(m->media_type)) {
                _cleanup_(oci_manifest_freep) oci_manifest *image = NULL;
                struct descriptor d = {};

                k = pick_platform(r, m, &d);
                if (k < 0)
                        return k;
                k = oci_registry_get_manifest(r, ref->repo, d.digest, &image);
                if (k >= 0 && image->size != d.size)
                        k = oci_registry_set_error(r, -EBADMSG, "manifest %s is %zu bytes, not the %" PRIu64 " its index says",
                                                   d.digest, image->size, d.size);
                descriptor_done(&d);
                if (k < 0)
                        return k;
                oci_manifest_free(m);
                m = TAKE_PTR(image);
        }
        if (!is_manifest_type(m->media_type))
                return oci_registry_set_error(r, -EMEDIUMTYPE, "manifest %s has media type %s, not an image manifest",
                                              m->digest, m->media_type);
        k = manifest_blobs(r, m->data, m->size, &blobs, &n_blobs);
        if (k < 0)
                return k;

        for (size_t i = 0; i < n_blobs; i++) {
                if (i >= 1 && i - 1 < skip_layers)
                        continue; /* blobs[0] is the config, then the layers */
                k = blob_present(blobs_fd, blobs[i].digest, blobs[i].size);
                if (k < 0) {
                        k = oci_registry_set_error(r, k, "cannot read blob %s of the layout", blobs[i].digest);
                        break;
                }
                if (k > 0)
                        continue;
                k = blob_fetch(r, ref->repo, blobs_fd, &blobs[i]);
                if (k < 0)
                        break;
                fetched_blobs++;
        }
        descriptors_free(blobs, n_blobs);
        if (k < 0)
                return k;

        k = write_manifest_blob(r, blobs_fd, m);
        if (k < 0)
                return k;
        k = write_atomic(r, dfd, "oci-layout", layout, strlen(layout));
        if (k < 0)
                return k;
        k = write_index(r, dfd, m, ref->tag);
        if (k < 0)
                return k;

        if (ret_stats)
                *ret_stats = (oci_layout_stats) {
                        .fetched_bytes = oci_registry_bytes_fetched(r) - fetched0,
                        .sent_bytes = oci_registry_bytes_sent(r) - sent0,
                        .blobs_fetched = fetched_blobs,
                };
        if (ret_stats)
                memcpy(ret_stats->digest, m->digest, OCI_DIGEST_SIZE);
        return 0;
}

/* The entry of index.json for tag, or its only entry. */
static int layout_pick(oci_registry *r, int dfd, const char *tag, struct descriptor *ret) {
        _cleanup_(json_object_putp) struct json_object *index = NULL;
        _cleanup_free_ char *buf = NULL;
        struct json_object *list;
        size_t len = 0, n;
        int k;

        k = read_file_capped_at(dfd, "index.json", INDEX_MAX, &buf, &len);
        if (k < 0) {
                errno = -k;
                return oci_registry_set_error(r, k, "cannot read index.json of the layout: %m");
        }
        if (json_parse_strict(buf, len, INDEX_MAX, 32, &index, NULL) < 0 ||
            !json_object_object_get_ex(index, "manifests", &list) || !json_object_is_type(list, json_type_array))
                return oci_registry_set_error(r, -EBADMSG, "index.json of the layout is not valid");
        n = json_object_array_length(list);
        for (size_t i = 0; i < n; i++) {
                struct descriptor d = {};
                struct json_object *name;

                k = descriptor_parse(r, json_object_array_get_idx(list, i), "index.json", &d);
                if (k < 0)
                        return k;
                if (n == 1 || (tag && d.annotations &&
                               json_object_object_get_ex(d.annotations, REF_NAME_ANNOTATION, &name) &&
                               json_object_is_type(name, json_type_string) && strcmp(json_object_get_string(name), tag) == 0)) {
                        *ret = d;
                        return 0;
                }
                descriptor_done(&d);
        }
        return oci_registry_set_error(r, -ENOENT, "index.json of the layout names no image %s", tag ?: "(untagged)");
}

int oci_registry_push_layout(oci_registry *r, const char *dir, const oci_ref *ref, oci_layout_stats *ret_stats) {
        _cleanup_close_ int dfd = -EBADF, blobs_fd = -EBADF;
        _cleanup_free_ char *data = NULL;
        uint64_t fetched0 = oci_registry_bytes_fetched(r), sent0 = oci_registry_bytes_sent(r);
        struct descriptor top = {}, *blobs = NULL;
        char digest[OCI_DIGEST_SIZE];
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned md_len = 0, sent_blobs = 0;
        size_t size = 0, n_blobs = 0;
        const char *media_type;
        int k;

        k = open_layout(r, dir, false, &dfd, &blobs_fd);
        if (k < 0)
                return k;
        k = layout_pick(r, dfd, ref->tag, &top);
        if (k < 0)
                return k;
        k = read_file_capped_at(blobs_fd, top.digest + 7, OCI_MANIFEST_MAX, &data, &size);
        if (k < 0) {
                errno = -k;
                k = oci_registry_set_error(r, k, "cannot read manifest %s of the layout: %m", top.digest);
                goto out;
        }
        (void) EVP_Digest(data, size, md, &md_len, EVP_sha256(), NULL);
        memcpy(digest, "sha256:", 7);
        for (unsigned i = 0; i < 32; i++)
                (void) snprintf(digest + 7 + 2 * i, 3, "%02x", md[i]);
        if (strcmp(digest, top.digest) != 0 || size != top.size) {
                k = oci_registry_set_error(r, -EBADMSG, "manifest %s of the layout does not match its digest or size",
                                           top.digest);
                goto out;
        }
        media_type = top.media_type ?: OCI_MEDIA_TYPE_MANIFEST;
        if (!is_manifest_type(media_type)) {
                k = oci_registry_set_error(r, -EMEDIUMTYPE, "the layout's %s is a %s: only image manifests are pushed",
                                           top.digest, media_type);
                goto out;
        }
        if (ref->digest && strcmp(ref->digest, digest) != 0) {
                k = oci_registry_set_error(r, -EBADMSG, "the layout's image is %s, not %s", digest, ref->digest);
                goto out;
        }
        k = manifest_blobs(r, data, size, &blobs, &n_blobs);
        if (k < 0)
                goto out;
        for (size_t i = 0; i < n_blobs; i++) {
                _cleanup_close_ int fd = openat(blobs_fd, blobs[i].digest + 7, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                struct stat st;

                if (fd < 0 || fstat(fd, &st) < 0) {
                        k = oci_registry_set_error(r, negative_errno(), "cannot open blob %s of the layout: %m", blobs[i].digest);
                        break;
                }
                if (!S_ISREG(st.st_mode) || (uint64_t) st.st_size != blobs[i].size) {
                        k = oci_registry_set_error(r, -EBADMSG, "blob %s of the layout is not %" PRIu64 " bytes",
                                                   blobs[i].digest, blobs[i].size);
                        break;
                }
                k = oci_registry_put_blob(r, ref->repo, blobs[i].digest, fd, blobs[i].size, NULL);
                if (k < 0)
                        break;
                if (k == 0)
                        sent_blobs++;
        }
        if (k < 0)
                goto out;
        k = oci_registry_put_manifest(r, ref->repo, oci_ref_reference(ref), media_type, data, size);
        if (k < 0)
                goto out;
        if (ret_stats) {
                *ret_stats = (oci_layout_stats) {
                        .fetched_bytes = oci_registry_bytes_fetched(r) - fetched0,
                        .sent_bytes = oci_registry_bytes_sent(r) - sent0,
                        .blobs_sent = sent_blobs,
                };
                memcpy(ret_stats->digest, digest, OCI_DIGEST_SIZE);
        }
        k = 0;
out:
        descriptors_free(blobs, n_blobs);
        descriptor_done(&top);
        return k;
}
