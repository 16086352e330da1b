/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The image: its source (layout directory, oci-archive, docker-archive), the
 * manifest it names, the config, and the check of the blobs that are read. */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "io-util.h"
#include "json-util.h"
#include "oci.h"
#include "strv.h"

#define CHUNK (256u * 1024u)

static void archive_freep(struct archive **a) {
        if (*a)
                archive_read_free(*a);
}

/* A file below dirfd by a relative path, no symlink anywhere on the way; without
 * O_DIRECTORY it must be a regular file (a fifo there would block the open). */
static int open_beneath(int dirfd, const char *path, int flags) {
        struct open_how how = {
                .flags = (uint64_t) (flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK),
                .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        };
        _cleanup_close_ int fd = (int) syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
        struct stat st;

        if (fd < 0)
                return -errno;
        if (!(flags & O_DIRECTORY)) {
                if (fstat(fd, &st) < 0)
                        return -errno;
                if (!S_ISREG(st.st_mode))
                        return -EBADFD;
                if (fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0)
                        return -errno;
        }
        return TAKE_FD(fd);
}

static bool exists_beneath(int dirfd, const char *path) {
        _cleanup_close_ int fd = open_beneath(dirfd, path, O_RDONLY);
        return fd >= 0;
}

/* ---- the outer tar into the work directory ---- */

static int write_member_data(struct archive *a, int fd, uint64_t *total, uint64_t max_bytes, const char *path) {
        const void *buf;
        size_t len;
        la_int64_t off;
        int r;

        while ((r = archive_read_data_block(a, &buf, &len, &off)) == ARCHIVE_OK) {
                if (off < 0 || (uint64_t) off + len > max_bytes - *total)
                        return oci_refuse("archive member \"%.256s\": larger than the size limit", path);
                r = pwrite_all(fd, buf, len, (uint64_t) off);
                if (r < 0)
                        return oci_fail(r, "Cannot write the unpacked archive: %s", strerror(-r));
        }
        if (r != ARCHIVE_EOF)
                return oci_refuse("archive member \"%.256s\": %s", path, archive_error_string(a) ?: "unreadable");
        return 0;
}

/* The regular file member e, where a stands, as name under parent; *total
 * counts what was unpacked. */
static int extract_member(struct archive *a, struct archive_entry *e, int parent, const char *name, const char *raw,
                          uint64_t *total, uint64_t max_bytes) {
        _cleanup_close_ int out = -EBADF;
        la_int64_t size = archive_entry_size(e);
        int r;

        if (size < 0 || (uint64_t) size > max_bytes - *total)
                return oci_refuse("archive member \"%.256s\": larger than the size limit", raw);
        (void) unlinkat(parent, name, 0);
        out = openat(parent, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (out < 0)
                return oci_refuse("archive member \"%.256s\": %m", raw);
        r = write_member_data(a, out, total, max_bytes, raw);
        if (r < 0)
                return r;
        if (ftruncate(out, size) < 0)
                return oci_fail(-errno, "Cannot unpack the archive: %m");
        *total += (uint64_t) size;
        return 0;
}

/* A reader of the outer archive (an image's tar, perhaps compressed) on fd. */
static int outer_open(int fd, struct archive **ret) {
        struct archive *a = archive_read_new();

        if (!a)
                return -ENOMEM;
        archive_read_support_format_tar(a);
        archive_read_support_filter_gzip(a);
        archive_read_support_filter_zstd(a);
        archive_read_support_filter_xz(a);
        if (archive_read_open_fd(a, fd, CHUNK) != ARCHIVE_OK) {
                int r = oci_refuse("Not an image archive: %s", archive_error_string(a) ?: "unreadable");

                archive_read_free(a);
                return r;
        }
        *ret = a;
        return 0;
}

/* The checks every member of the outer archive gets: the count (*n, the members
 * so far), and its name made canonical in *ret_path. */
static int outer_member(struct archive_entry *e, unsigned *n, char **ret_path) {
        const char *raw = archive_entry_pathname(e) ?: "", *reason = NULL;
        int r;

        r = oci_check_interrupted();
        if (r < 0)
                return r;
        if (++*n > OCI_OUTER_MEMBERS_MAX)
                return oci_refuse("archive: more than %u members", OCI_OUTER_MEMBERS_MAX);
        r = oci_path_normalize(raw, ret_path, &reason);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return oci_refuse("archive member \"%.256s\": %s", raw, reason);
        return 0;
}

/* Members over member_max are left in the archive (layers, for a first look at the
 * manifest and config only). */
static int extract_outer(int fd, int workdir, uint64_t max_bytes, uint64_t member_max) {
        _cleanup_(archive_freep) struct archive *a = NULL;
        struct archive_entry *e;
        uint64_t total = 0;
        unsigned n = 0;
        int r;

        r = outer_open(fd, &a);
        if (r < 0)
                return r;
        while ((r = archive_read_next_header(a, &e)) == ARCHIVE_OK || r == ARCHIVE_WARN) {
                const char *raw = archive_entry_pathname(e) ?: "", *name;
                _cleanup_free_ char *path = NULL;
                _cleanup_close_ int parent = -EBADF;
                mode_t t = archive_entry_filetype(e);
                la_int64_t size = archive_entry_size(e);

                r = outer_member(e, &n, &path);
                if (r < 0)
                        return r;
                if (!path[0] || (t != AE_IFDIR && t != AE_IFREG) || archive_entry_hardlink(e))
                        continue; /* only regular files and directories are needed */
                r = oci_open_parent(workdir, path, true, &parent, &name);
                if (r < 0)
                        return oci_refuse("archive member \"%.256s\": %s", raw, strerror(-r));
                if (t == AE_IFDIR) {
                        if (mkdirat(parent, name, 0700) < 0 && errno != EEXIST)
                                return oci_fail(-errno, "Cannot unpack the archive: %m");
                        continue;
                }
                if (size < 0 || (uint64_t) size > max_bytes - total)
                        return oci_refuse("archive member \"%.256s\": larger than the size limit", raw);
                if ((uint64_t) size > member_max)
                        continue;
                r = extract_member(a, e, parent, name, raw, &total, max_bytes);
                if (r < 0)
                        return r;
        }
        if (r != ARCHIVE_EOF)
                return oci_refuse("Not an image archive: %s", archive_error_string(a) ?: "unreadable");
        return 0;
}

/* ---- JSON ---- */

/* Parse buf as one JSON object or array. json_parse_strict() checks what json-c
 * lets through (UTF-8, NUL bytes, integer ranges, depth, trailing bytes) but takes
 * only objects: an array is checked inside a wrapper, then parsed on its own so
 * that nothing in it can close the wrapper early. */
static int parse_json(const char *buf, size_t len, const char *what, struct json_object **ret) {
        _cleanup_free_ char *wrapped = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct json_tokener *tok = NULL;
        struct json_object *v;
        const char *reason = NULL;
        size_t end;
        int r;

        if (memchr(buf, 0, len))
                return oci_refuse("%s: not JSON (NUL byte)", what);
        if (asprintf(&wrapped, "{\"v\":%.*s\n}", (int) len, buf) < 0)
                return -ENOMEM;
        r = json_parse_strict(wrapped, strlen(wrapped), OCI_JSON_MAX + 16, 64, &o, &reason);
        if (r < 0)
                return oci_refuse("%s: not valid JSON: %s", what, reason ?: strerror(-r));
        tok = json_tokener_new_ex(64);
        if (!tok)
                return -ENOMEM;
        v = json_tokener_parse_ex(tok, buf, (int) len);
        end = json_tokener_get_parse_end(tok);
        r = json_tokener_get_error(tok) == json_tokener_success ? 0 : -EBADMSG;
        json_tokener_free(tok);
        while (r >= 0 && end < len && strchr(" \t\r\n", buf[end]))
                end++;
        if (r < 0 || end != len || !(json_object_is_type(v, json_type_object) || json_object_is_type(v, json_type_array))) {
                json_object_put(v);
                return oci_refuse("%s: not one JSON object or array", what);
        }
        *ret = v;
        return 0;
}

static int read_json_at(int dirfd, const char *path, const char *what, struct json_object **ret) {
        _cleanup_close_ int fd = open_beneath(dirfd, path, O_RDONLY);
        _cleanup_free_ char *buf = NULL;
        ssize_t n;

        if (fd < 0)
                return oci_refuse("%s: cannot open it: %s", what, strerror(-fd));
        buf = malloc(OCI_JSON_MAX + 1);
        if (!buf)
                return -ENOMEM;
        n = loop_read(fd, buf, OCI_JSON_MAX + 1);
        if (n < 0)
                return oci_fail((int) n, "%s: %s", what, strerror((int) -n));
        if (n > OCI_JSON_MAX)
                return oci_refuse("%s: larger than %u bytes", what, OCI_JSON_MAX);
        return parse_json(buf, (size_t) n, what, ret);
}

static const char *json_str(struct json_object *o, const char *key) {
        struct json_object *v = NULL;

        if (!o || !json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, key, &v) ||
            !json_object_is_type(v, json_type_string))
                return NULL;
        return json_object_get_string(v);
}

/* A descriptor: digest and size, both checked for form. */
static int descriptor(struct json_object *d, const char *what, const char **ret_digest, int64_t *ret_size) {
        struct json_object *s = NULL;
        const char *digest = json_str(d, "digest");

        if (!oci_digest_is_valid(digest))
                return oci_refuse("%s: no sha256 digest, or a malformed one", what);
        if (!json_object_object_get_ex(d, "size", &s) || !json_object_is_type(s, json_type_int) ||
            json_object_get_int64(s) < 0)
                return oci_refuse("%s: no size", what);
        *ret_digest = digest;
        *ret_size = json_object_get_int64(s);
        return 0;
}

static int blob_path(const char *digest, char buf[static 96]) {
        snprintf(buf, 96, "blobs/sha256/%s", digest + 7);
        return 0;
}

/* A JSON blob at path: read whole, hashed and sized in memory, then parsed.
 * size < 0: the size is not known, only capped. */
static int read_json_blob(int dirfd, const char *path, const char *digest, int64_t size, const char *what,
                          struct json_object **ret) {
        _cleanup_(oci_hash_freep) oci_hash *h = NULL;
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        char got[OCI_DIGEST_LEN + 1];
        size_t cap = size < 0 ? OCI_JSON_MAX : (size_t) size;
        ssize_t n;

        if ((uint64_t) size > OCI_JSON_MAX && size >= 0)
                return oci_refuse("%s %s: larger than %u bytes", what, digest, OCI_JSON_MAX);
        fd = open_beneath(dirfd, path, O_RDONLY);
        if (fd < 0)
                return oci_refuse("%s %s: blob missing (%s)", what, digest, strerror(-fd));
        buf = malloc(cap + 1);
        h = oci_hash_new();
        if (!buf || !h)
                return -ENOMEM;
        n = loop_read(fd, buf, cap + 1);
        if (n < 0)
                return oci_refuse("%s %s: %s", what, digest, strerror((int) -n));
        if (size >= 0 && n != size)
                return oci_refuse("%s %s: the blob is not of the size its descriptor says (%" PRIi64 ")", what, digest,
                                  size);
        if ((size_t) n > cap)
                return oci_refuse("%s %s: larger than %u bytes", what, digest, OCI_JSON_MAX);
        oci_hash_update(h, buf, (size_t) n);
        oci_hash_final(h, got);
        if (strcmp(got, digest) != 0)
                return oci_refuse("%s %s: the blob's SHA-256 is %s", what, digest, got);
        return parse_json(buf, (size_t) n, what, ret);
}

/* ---- config ---- */

static int strv_from_json(struct json_object *cfg, const char *key, char ***ret) {
        struct json_object *v = NULL;
        _cleanup_strv_free_ char **l = NULL;
        size_t n;

        if (!cfg || !json_object_object_get_ex(cfg, key, &v) || json_object_is_type(v, json_type_null)) {
                l = calloc(1, sizeof(char *));
                if (!l)
                        return -ENOMEM;
                *ret = TAKE_PTR(l);
                return 0;
        }
        if (!json_object_is_type(v, json_type_array))
                return oci_refuse("config: %s is not an array", key);
        n = json_object_array_length(v);
        if (n > OCI_STRV_MAX)
                return oci_refuse("config: %s has more than %u entries", key, OCI_STRV_MAX);
        l = calloc(n + 1, sizeof(char *));
        if (!l)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct json_object *s = json_object_array_get_idx(v, i);

                if (!json_object_is_type(s, json_type_string))
                        return oci_refuse("config: %s holds something that is not a string", key);
                l[i] = strdup(json_object_get_string(s));
                if (!l[i])
                        return -ENOMEM;
        }
        *ret = TAKE_PTR(l);
        return 0;
}

static int string_from_json(struct json_object *cfg, const char *key, char **ret) {
        struct json_object *v = NULL;
        const char *s = "";

        if (cfg && json_object_object_get_ex(cfg, key, &v) && !json_object_is_type(v, json_type_null)) {
                if (!json_object_is_type(v, json_type_string))
                        return oci_refuse("config: %s is not a string", key);
                s = json_object_get_string(v);
        }
        *ret = strdup(s);
        return *ret ? 0 : -ENOMEM;
}

/* The config's fields and its diff_ids, one per layer already listed. */
static int parse_config(struct json_object *root, OciImage *img) {
        struct json_object *cfg = NULL, *rootfs = NULL, *ids = NULL;
        int r;

        if (!json_object_is_type(root, json_type_object))
                return oci_refuse("config: not a JSON object");
        if (json_object_object_get_ex(root, "config", &cfg) && !json_object_is_type(cfg, json_type_object)) {
                if (!json_object_is_type(cfg, json_type_null))
                        return oci_refuse("config: \"config\" is not an object");
                cfg = NULL;
        }
        if ((r = strv_from_json(cfg, "Env", &img->config.env)) < 0 ||
            (r = strv_from_json(cfg, "Entrypoint", &img->config.entrypoint)) < 0 ||
            (r = strv_from_json(cfg, "Cmd", &img->config.cmd)) < 0 ||
            (r = string_from_json(cfg, "WorkingDir", &img->config.working_dir)) < 0 ||
            (r = string_from_json(cfg, "User", &img->config.user)) < 0)
                return r;
        if (!json_object_object_get_ex(root, "rootfs", &rootfs) ||
            !json_object_object_get_ex(rootfs, "diff_ids", &ids) || !json_object_is_type(ids, json_type_array))
                return oci_refuse("config: no rootfs.diff_ids");
        if (json_object_array_length(ids) != img->n_layers)
                return oci_refuse("config: %zu diff_ids for %zu layers", json_object_array_length(ids),
                                  img->n_layers);
        for (size_t i = 0; i < img->n_layers; i++) {
                const char *d = json_object_get_string(json_object_array_get_idx(ids, i));

                if (!json_object_is_type(json_object_array_get_idx(ids, i), json_type_string) ||
                    !oci_digest_is_valid(d))
                        return oci_refuse("config: diff_id %zu is not a sha256 digest", i);
                memcpy(img->layers[i].diff_id, d, OCI_DIGEST_LEN + 1);
        }
        return 0;
}

/* chain[0] = diff_id[0]; chain[i] = sha256(chain[i-1] + " " + diff_id[i]). */
static int chain_ids(OciImage *img) {
        for (size_t i = 0; i < img->n_layers; i++) {
                _cleanup_(oci_hash_freep) oci_hash *h = NULL;

                if (i == 0) {
                        memcpy(img->layers[0].chain_id, img->layers[0].diff_id, OCI_DIGEST_LEN + 1);
                        continue;
                }
                h = oci_hash_new();
                if (!h)
                        return -ENOMEM;
                oci_hash_update(h, img->layers[i - 1].chain_id, OCI_DIGEST_LEN);
                oci_hash_update(h, " ", 1);
                oci_hash_update(h, img->layers[i].diff_id, OCI_DIGEST_LEN);
                oci_hash_final(h, img->layers[i].chain_id);
        }
        return 0;
}

/* ---- OCI layout ---- */

static bool platform_is_linux_amd64(struct json_object *m) {
        struct json_object *p = NULL;
        const char *os, *arch;

        if (!json_object_object_get_ex(m, "platform", &p))
                return false;
        os = json_str(p, "os");
        arch = json_str(p, "architecture");
        return os && arch && strcmp(os, "linux") == 0 && strcmp(arch, "amd64") == 0;
}

static bool is_index_type(const char *mt) {
        return mt && (strcmp(mt, "application/vnd.oci.image.index.v1+json") == 0 ||
                      strcmp(mt, "application/vnd.docker.distribution.manifest.list.v2+json") == 0);
}

static int pick_manifest(int dirfd, struct json_object **ret) {
        _cleanup_json_ struct json_object *index = NULL;
        int r;

        r = read_json_at(dirfd, "index.json", "index.json", &index);
        if (r < 0)
                return r;
        for (unsigned depth = 0;; depth++) {
                struct json_object *ms = NULL, *pick = NULL;
                _cleanup_json_ struct json_object *next = NULL;
                const char *digest;
                int64_t size;
                size_t n;

                if (depth >= 4)
                        return oci_refuse("index: nested more than 4 deep");
                if (!json_object_is_type(index, json_type_object) ||
                    !json_object_object_get_ex(index, "manifests", &ms) || !json_object_is_type(ms, json_type_array))
                        return oci_refuse("index: no manifests");
                n = json_object_array_length(ms);
                if (n == 0)
                        return oci_refuse("index: no manifests");
                if (n == 1)
                        pick = json_object_array_get_idx(ms, 0);
                else
                        for (size_t i = 0; i < n && !pick; i++)
                                if (platform_is_linux_amd64(json_object_array_get_idx(ms, i)))
                                        pick = json_object_array_get_idx(ms, i);
                if (!pick)
                        return oci_refuse("index: %zu manifests, none for linux/amd64", n);
                r = descriptor(pick, "index: manifest", &digest, &size);
                if (r < 0)
                        return r;
                char path[96];

                blob_path(digest, path);
                r = read_json_blob(dirfd, path, digest, size, "manifest", &next);
                if (r < 0)
                        return r;
                if (!is_index_type(json_str(pick, "mediaType")) && !is_index_type(json_str(next, "mediaType"))) {
                        *ret = TAKE_PTR(next);
                        return 0;
                }
                json_object_put(index);
                index = TAKE_PTR(next);
        }
}

static int load_oci(int dirfd, uint64_t max_bytes, OciImage *img) {
        _cleanup_json_ struct json_object *manifest = NULL, *config = NULL;
        struct json_object *cdesc = NULL, *layers = NULL;
        const char *digest;
        int64_t size;
        int r;

        r = pick_manifest(dirfd, &manifest);
        if (r < 0)
                return r;
        if (!json_object_object_get_ex(manifest, "config", &cdesc) ||
            !json_object_object_get_ex(manifest, "layers", &layers) || !json_object_is_type(layers, json_type_array))
                return oci_refuse("manifest: no config or no layers");
        if (json_object_array_length(layers) > OCI_LAYERS_MAX)
                return oci_refuse("manifest: more than %u layers", OCI_LAYERS_MAX);
        img->n_layers = json_object_array_length(layers);
        for (size_t i = 0; i < img->n_layers; i++) {
                OciLayer *l = &img->layers[i];
                char path[96];

                r = descriptor(json_object_array_get_idx(layers, i), "manifest: layer", &digest, &size);
                if (r < 0)
                        return r;
                memcpy(l->name, digest, OCI_DIGEST_LEN + 1);
                memcpy(l->digest, digest, OCI_DIGEST_LEN + 1); /* checked when the layer is applied */
                l->size = size;
                blob_path(digest, path);
                l->path = strdup(path);
                if (!l->path)
                        return -ENOMEM;
        }
        r = descriptor(cdesc, "manifest: config", &digest, &size);
        if (r < 0)
                return r;
        {
                char path[96];

                blob_path(digest, path);
                r = read_json_blob(dirfd, path, digest, size, "config", &config);
        }
        if (r < 0)
                return r;
        r = parse_config(config, img);
        if (r < 0)
                return r;
        return chain_ids(img);
}

/* ---- docker-archive ---- */

/* The digest a docker-archive file name carries: "blobs/sha256/<hex>" or
 * "<hex>.json"; NULL (out untouched) when it carries none. */
static bool digest_of_name(const char *name, char out[OCI_DIGEST_LEN + 1]) {
        char d[OCI_DIGEST_LEN + 8];
        size_t len = strlen(name);

        if (strncmp(name, "blobs/sha256/", 13) == 0 && len == 13 + 64)
                snprintf(d, sizeof(d), "sha256:%s", name + 13);
        else if (len == 64 + 5 && strcmp(name + 64, ".json") == 0)
                snprintf(d, sizeof(d), "sha256:%.64s", name);
        else
                return false;
        if (!oci_digest_is_valid(d))
                return false;
        memcpy(out, d, OCI_DIGEST_LEN + 1);
        return true;
}

static int load_docker(int dirfd, uint64_t max_bytes, OciImage *img) {
        _cleanup_json_ struct json_object *manifest = NULL, *config = NULL;
        struct json_object *entry, *layers = NULL;
        char expect[OCI_DIGEST_LEN + 1];
        const char *cname;
        int r;

        r = read_json_at(dirfd, "manifest.json", "manifest.json", &manifest);
        if (r < 0)
                return r;
        if (!json_object_is_type(manifest, json_type_array) || json_object_array_length(manifest) != 1)
                return oci_refuse("manifest.json: not an array of exactly one image");
        entry = json_object_array_get_idx(manifest, 0);
        cname = json_str(entry, "Config");
        if (!cname || !json_object_object_get_ex(entry, "Layers", &layers) ||
            !json_object_is_type(layers, json_type_array))
                return oci_refuse("manifest.json: no Config or no Layers");
        if (!digest_of_name(cname, expect))
                return oci_refuse("manifest.json: the config's name \"%.128s\" carries no digest", cname);
        r = read_json_blob(dirfd, cname, expect, -1, "config", &config);
        if (r < 0)
                return r;
        if (json_object_array_length(layers) > OCI_LAYERS_MAX)
                return oci_refuse("manifest.json: more than %u layers", OCI_LAYERS_MAX);
        img->n_layers = json_object_array_length(layers);
        for (size_t i = 0; i < img->n_layers; i++) {
                OciLayer *l = &img->layers[i];
                struct json_object *v = json_object_array_get_idx(layers, i);
                const char *name = json_object_get_string(v), *reason = NULL;
                _cleanup_free_ char *norm = NULL;

                if (!json_object_is_type(v, json_type_string))
                        return oci_refuse("manifest.json: layer %zu is not a file name", i);
                r = oci_path_normalize(name, &norm, &reason);
                if (r == -ENOMEM)
                        return r;
                if (r < 0 || !norm[0])
                        return oci_refuse("manifest.json: layer \"%.128s\": %s", name, reason ?: "empty");
                l->path = TAKE_PTR(norm);
                l->size = -1;
        }
        r = parse_config(config, img);
        if (r < 0)
                return r;
        for (size_t i = 0; i < img->n_layers; i++) {
                OciLayer *l = &img->layers[i];
                const char *name = json_object_get_string(json_object_array_get_idx(layers, i));

                /* the digest the name carries, checked when the layer is applied; else none */
                if (digest_of_name(name, expect)) {
                        memcpy(l->digest, expect, OCI_DIGEST_LEN + 1);
                        memcpy(l->name, expect, OCI_DIGEST_LEN + 1);
                } else
                        memcpy(l->name, l->diff_id, OCI_DIGEST_LEN + 1);
        }
        return chain_ids(img);
}

/* ---- layers ---- */

typedef struct Applier {
        OciImage *img;
        size_t next;            /* the next layer to apply */
        int root;
        OciBudget *budget;
        int (*applied)(size_t i, void *userdata);
        void *userdata;
} Applier;

static int apply_one(Applier *p, const OciBlobSource *src) {
        int r = oci_layer_apply(p->root, &p->img->layers[p->next], src, p->budget);

        if (r < 0)
                return r;
        r = p->applied(p->next, p->userdata);
        if (r < 0)
                return r;
        p->next++;
        return 0;
}

/* The layers from p->next on whose blobs are files in the image's directory.
 * With all, a missing one is refused; else the first missing one ends it. */
static int apply_files(Applier *p, bool all) {
        while (p->next < p->img->n_layers) {
                OciLayer *l = &p->img->layers[p->next];
                _cleanup_close_ int fd = open_beneath(p->img->dirfd, l->path, O_RDONLY);
                int r;

                if (fd < 0 && !all)
                        return 0;
                if (fd < 0)
                        return oci_refuse("layer %s: the blob %.128s is missing (%s)", l->name, l->path, strerror(-fd));
                r = apply_one(p, &(OciBlobSource) { .fd = fd });
                if (r < 0)
                        return r;
        }
        return 0;
}

/* The first layer from p->next on whose blob is path: its index, or SIZE_MAX;
 * *ret_again when a later layer names the same blob. */
static size_t layer_of(const Applier *p, const char *path, bool *ret_again) {
        size_t k = SIZE_MAX;

        *ret_again = false;
        for (size_t i = p->next; i < p->img->n_layers; i++) {
                if (strcmp(p->img->layers[i].path, path) != 0)
                        continue;
                if (k != SIZE_MAX) {
                        *ret_again = true;
                        break;
                }
                k = i;
        }
        return k;
}

/* One pass over the archive: the next layer's blob is applied as it is read, one
 * that comes before its turn (or that a later layer names too) is unpacked into
 * the work directory, the rest is passed over. Checked as extract_outer() checks. */
static int apply_archive(Applier *p, int fd) {
        _cleanup_(archive_freep) struct archive *a = NULL;
        struct archive_entry *e;
        uint64_t total = 0;
        unsigned n = 0;
        int r;

        if (lseek(fd, 0, SEEK_SET) < 0)
                return oci_fail(-errno, "Cannot read the image archive: %m");
        r = outer_open(fd, &a);
        if (r < 0)
                return r;
        r = ARCHIVE_EOF;
        while (p->next < p->img->n_layers &&
               ((r = archive_read_next_header(a, &e)) == ARCHIVE_OK || r == ARCHIVE_WARN)) {
                const char *raw = archive_entry_pathname(e) ?: "", *name;
                _cleanup_free_ char *path = NULL;
                _cleanup_close_ int parent = -EBADF;
                bool again;
                size_t k;

                r = outer_member(e, &n, &path);
                if (r < 0)
                        return r;
                if (!path[0] || archive_entry_filetype(e) != AE_IFREG || archive_entry_hardlink(e))
                        continue;
                k = layer_of(p, path, &again);
                if (k == SIZE_MAX)
                        continue;
                if (k == p->next && !again) {
                        r = apply_one(p, &(OciBlobSource) { .fd = -EBADF, .archive = a });
                        if (r < 0)
                                return r;
                } else {
                        r = oci_open_parent(p->img->dirfd, path, true, &parent, &name);
                        if (r < 0)
                                return oci_refuse("archive member \"%.256s\": %s", raw, strerror(-r));
                        r = extract_member(a, e, parent, name, raw, &total, p->img->max_bytes);
                        if (r < 0)
                                return r;
                }
                r = apply_files(p, false);
                if (r < 0)
                        return r;
        }
        if (p->next < p->img->n_layers && r != ARCHIVE_EOF)
                return oci_refuse("Not an image archive: %s", archive_error_string(a) ?: "unreadable");
        return 0;
}

int oci_image_apply_layers(OciImage *img, size_t from, int root, OciBudget *budget,
                           int (*applied)(size_t i, void *userdata), void *userdata) {
        Applier p = {
                .img = img, .next = from, .root = root, .budget = budget, .applied = applied, .userdata = userdata,
        };
        int r;

        if (img->archive_fd >= 0) {
                /* The small members are here since oci_image_load(): a layer among them is applied from here. */
                r = apply_files(&p, false);
                if (r >= 0)
                        r = apply_archive(&p, img->archive_fd);
                if (r < 0)
                        return r;
                img->archive_fd = safe_close(img->archive_fd);
        }
        return apply_files(&p, true);
}

void oci_image_done(OciImage *img) {
        for (size_t i = 0; i < img->n_layers; i++) {
                free(img->layers[i].path);
                img->layers[i].path = NULL;
        }
        img->n_layers = 0;
        img->dirfd = safe_close(img->dirfd);
        img->archive_fd = safe_close(img->archive_fd);
        strv_free(img->config.env);
        strv_free(img->config.entrypoint);
        strv_free(img->config.cmd);
        free(img->config.working_dir);
        free(img->config.user);
        img->config = (OciConfig) {};
}

int oci_image_load(int fd, int workdir, uint64_t max_bytes, OciImage *img) {
        _cleanup_close_ int dirfd = -EBADF, archive_fd = -EBADF;
        struct stat st;
        int r;

        *img = (OciImage) { .dirfd = -EBADF, .archive_fd = -EBADF, .max_bytes = max_bytes };
        if (fstat(fd, &st) < 0)
                return oci_fail(-errno, "Cannot look at the image's fd: %m");
        if (S_ISDIR(st.st_mode)) {
                dirfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
                if (dirfd < 0)
                        return oci_fail(-errno, "Cannot duplicate the image's fd: %m");
        } else if (S_ISREG(st.st_mode)) {
                if ((uint64_t) st.st_size > max_bytes)
                        return oci_refuse("The image archive is larger than the size limit");
                if (lseek(fd, 0, SEEK_SET) < 0)
                        return oci_fail(-errno, "Cannot read the image archive: %m");
                /* The manifests and the config first: the layers only when they are read. */
                r = extract_outer(fd, workdir, max_bytes, OCI_JSON_MAX);
                if (r < 0)
                        return r;
                dirfd = fcntl(workdir, F_DUPFD_CLOEXEC, 3);
                archive_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
                if (dirfd < 0 || archive_fd < 0)
                        return -errno;
        } else
                return oci_refuse("The image's fd is neither a directory nor a regular file");

        if (exists_beneath(dirfd, "oci-layout") && exists_beneath(dirfd, "index.json"))
                r = load_oci(dirfd, max_bytes, img);
        else if (exists_beneath(dirfd, "manifest.json"))
                r = load_docker(dirfd, max_bytes, img);
        else
                r = oci_refuse("Neither an OCI image layout (oci-layout, index.json) nor a docker-archive (manifest.json)");
        if (r < 0) {
                oci_image_done(img);
                return r;
        }
        img->dirfd = TAKE_FD(dirfd);
        img->archive_fd = TAKE_FD(archive_fd);
        return r;
}
