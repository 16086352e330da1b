/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* PushSnapshot and PullSnapshot: see pushpull-op.h. */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "branch.h"
#include "bus-info.h"
#include "fs-util.h"
#include "hash-cache.h"
#include "image.h"
#include "io-util.h"
#include "macro.h"
#include "operation.h"
#include "pack-op.h"
#include "pushpull-op.h"
#include "registry.h"
#include "snapshot-artifact.h"
#include "worker.h"

static void *mfree(void *p) {
        free(p);
        return NULL;
}

/* ---- the registries ---- */

int manager_load_registries(Manager *m, const char *path, bool explicit_path) {
        _cleanup_(oci_registry_config_freep) oci_registry_config *c = NULL;
        _cleanup_free_ char *error = NULL;
        int r;

        m->registry_config_path = strdup(path);
        if (!m->registry_config_path)
                return -ENOMEM;
        /* Checked here so that a broken file named on the command line stops forkd;
         * read again at each use, so that changes need no restart. */
        r = oci_registry_config_load(path, &c, &error);
        if (r == -ENOENT && !explicit_path)
                return 0;
        if (r < 0)
                log_error("Cannot load the registry configuration: %s", error ?: strerror(-r));
        return r;
}

void manager_free_registries(Manager *m) {
        m->registry_config_path = mfree(m->registry_config_path);
}

/* The reference and a client of its registry, from the configuration as it is
 * now, or InvalidArgs. */
static int open_ref(Manager *m, const char *s, oci_ref **ret_ref, oci_registry **ret_reg, sd_bus_error *error) {
        _cleanup_(oci_registry_config_freep) oci_registry_config *c = NULL;
        _cleanup_(oci_ref_freep) oci_ref *ref = NULL;
        _cleanup_free_ char *why = NULL;
        int r;

        r = oci_ref_parse(s, &ref, &why);
        if (r < 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Invalid reference: %s",
                                         why ?: "does not parse");
        r = oci_registry_config_load(m->registry_config_path, &c, &why);
        if (r == -ENOENT)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "Registry %s: no registry is configured (%s does not exist)", ref->host,
                                         m->registry_config_path);
        if (r < 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Registry %s: %s", ref->host,
                                         why ?: strerror(-r));
        why = mfree(why);
        r = oci_registry_new(c, ref->host, ret_reg, &why);
        if (r < 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "%s", why ?: "the registry is not configured");
        *ret_ref = TAKE_PTR(ref);
        return 0;
}

/* No option is known yet: an empty a{sv}. */
static int read_options(sd_bus_message *message, sd_bus_error *error) {
        const char *key;
        int r;

        r = sd_bus_message_enter_container(message, 'a', "{sv}");
        if (r < 0)
                return r;
        r = sd_bus_message_enter_container(message, 'e', "sv");
        if (r < 0)
                return r;
        if (r > 0) {
                r = sd_bus_message_read(message, "s", &key);
                if (r < 0)
                        return r;
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Unknown option \"%.64s\".", key);
        }
        return sd_bus_message_exit_container(message);
}

typedef struct PushPullJob {
        Manager *manager;
        oci_registry *reg;
        oci_ref *ref;
        char *snapshots_dir;
        char *error;               /* what went wrong, for the caller */
        /* push */
        char **tags, **dirs;       /* root first, each holding one n_users of its Image */
        size_t n;
        unsigned blobs_sent;
        uint64_t bytes_sent;
        char digest[OCI_DIGEST_SIZE];
        /* pull */
        char *new_tag;             /* NULL: the head's own */
        char *staging;             /* snapshots_dir/.unpack-XXXXXX */
        struct artifact_link links[PACK_LINKS_MAX]; /* root first once fetched */
        size_t n_links;
        char base[SNAPSHOT_TAG_MAX + 1]; /* the link here the pulled chain grows on, "" none */
        struct pack_manifest staged; /* the tags to register */
        unsigned blobs_fetched;
        uint64_t bytes_fetched;
} PushPullJob;

static void job_free(void *p) {
        PushPullJob *j = p;

        if (!j)
                return;
        image_release_chain(j->manager, j->tags, j->n);
        strv_free(j->tags);
        strv_free(j->dirs);
        oci_registry_free(j->reg);
        oci_ref_free(j->ref);
        free(j->snapshots_dir);
        free(j->new_tag);
        if (j->staging) {
                int r = rm_rf(j->staging);
                if (r < 0)
                        log_warning_errno(r, "Failed to remove %s, the next start retries: %m", j->staging);
                free(j->staging);
        }
        for (size_t i = 0; i < j->n_links; i++)
                artifact_link_done(&j->links[i]);
        pack_manifest_done(&j->staged);
        free(j->error);
        free(j);
}

static int job_error(PushPullJob *j, int r, const char *fmt, ...) _printf_(3, 4);
static int job_error(PushPullJob *j, int r, const char *fmt, ...) {
        va_list ap;

        free(j->error);
        j->error = NULL;
        va_start(ap, fmt);
        if (vasprintf(&j->error, fmt, ap) < 0)
                j->error = NULL;
        va_end(ap);
        return r;
}

/* The registry's message for a failed request (no credentials, see registry.h). */
static int registry_failed(PushPullJob *j, int r, const char *what) {
        const char *e = oci_registry_error(j->reg);

        return job_error(j, r, "%s: %s", what, e && e[0] ? e : strerror(-r));
}

static bool is_hash_cache(const char *name) {
        size_t n = strlen(name), k = strlen(SNAPSHOT_HASH_CACHE_SUFFIX);

        return n > k && strcmp(name + n - k, SNAPSHOT_HASH_CACHE_SUFFIX) == 0;
}

/* ---- push ---- */

static int push_file(PushPullJob *j, int dfd, const char *dir, const char *name, struct artifact_layer *y) {
        _cleanup_close_ int fd = -EBADF, tmp = -EBADF;
        char cached[SNAPSHOT_HASH_LEN + 1];
        struct stat st;
        bool known;
        int r;

        fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) < 0)
                return job_error(j, -errno, "Cannot open %s/%s: %m", dir, name);
        if (!S_ISREG(st.st_mode) || (uint64_t) st.st_size > PACK_FILE_SIZE_MAX)
                return job_error(j, -EINVAL, "%s/%s is not a regular file, or too large to push.", dir, name);
        tmp = open(j->snapshots_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (tmp < 0)
                return job_error(j, -errno, "Cannot make a temporary file in %s: %m", j->snapshots_dir);
        memcpy(y->name, name, strlen(name) + 1);
        y->size = (uint64_t) st.st_size;
        known = hash_cache_get(dfd, name, fd, cached) > 0;
        r = sparse_blob_encode(fd, y->size, tmp, known ? cached : NULL, y->digest, &y->blob_size, y->sha256);
        if (r < 0)
                return job_error(j, r, "Cannot read %s/%s: %s", dir, name, strerror(-r));
        if (!known)
                hash_cache_put(dfd, name, fd, y->sha256);
        r = oci_registry_put_blob(j->reg, j->ref->repo, y->digest, tmp, y->blob_size, NULL);
        if (r < 0)
                return registry_failed(j, r, "Cannot push a blob");
        if (r == 0)
                j->blobs_sent++;
        return 0;
}

static int push_link(PushPullJob *j, size_t index, struct artifact_link *l) {
        const char *dir = j->dirs[index], *reason = NULL;
        _cleanup_close_ int dfd = -EBADF, cfd = -EBADF;
        _cleanup_free_ char *json = NULL, *manifest = NULL;
        struct dirent **names = NULL;
        struct snapshot_meta meta;
        size_t len = 0;
        int n, r;

        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd < 0)
                return job_error(j, -errno, "Cannot open %s: %m", dir);
        r = read_file_capped_at(dfd, "snapshot.json", SNAPSHOT_META_FILE_MAX, &json, &len);
        if (r < 0)
                return job_error(j, r, "Cannot read %s/snapshot.json: %s", dir, strerror(-r));
        r = snapshot_meta_parse(json, len, &meta, &reason);
        if (r < 0)
                return job_error(j, r, "%s/snapshot.json is invalid: %s", dir, reason ?: "?");
        if (strcmp(meta.tag, j->tags[index]) != 0 ||
            (index > 0 && strcmp(meta.parent_tag, j->tags[index - 1]) != 0))
                return job_error(j, -EINVAL, "%s/snapshot.json does not name the tag and parent registered.", dir);
        memcpy(l->tag, meta.tag, sizeof(l->tag));
        memcpy(l->parent_tag, meta.parent_tag, sizeof(l->parent_tag));
        memcpy(l->parent_content_hash, meta.parent_content_hash, sizeof(l->parent_content_hash));

        /* The config: snapshot.json's bytes as read. */
        artifact_digest_buffer(json, len, l->config_digest);
        l->config_size = len;
        cfd = open(j->snapshots_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (cfd < 0)
                return job_error(j, -errno, "Cannot make a temporary file in %s: %m", j->snapshots_dir);
        r = loop_write(cfd, json, len);
        if (r < 0)
                return job_error(j, r, "Cannot write a temporary file: %s", strerror(-r));
        r = oci_registry_put_blob(j->reg, j->ref->repo, l->config_digest, cfd, len, NULL);
        if (r < 0)
                return registry_failed(j, r, "Cannot push a blob");
        if (r == 0)
                j->blobs_sent++;

        n = scandir(dir, &names, NULL, alphasort);
        if (n < 0)
                return job_error(j, -errno, "Cannot list %s: %m", dir);
        l->layers = calloc((size_t) n + 1, sizeof(struct artifact_layer));
        if (!l->layers)
                r = -ENOMEM;
        for (int i = 0; r >= 0 && i < n; i++) {
                const char *name = names[i]->d_name;

                if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || strcmp(name, "snapshot.json") == 0 ||
                    is_hash_cache(name))
                        continue;
                if (!snapshot_file_name_is_valid(name) || strcmp(name, PACK_MANIFEST_NAME) == 0 ||
                    l->n_layers >= PACK_FILES_MAX) {
                        r = job_error(j, -EINVAL, "%s/%s cannot be pushed (odd name, or too many files).", dir, name);
                        break;
                }
                r = push_file(j, dfd, dir, name, &l->layers[l->n_layers]);
                if (r >= 0)
                        l->n_layers++;
        }
        for (int i = 0; i < n; i++)
                free(names[i]);
        free(names);
        if (r < 0)
                return r;
        if (!artifact_link_find_layer(l, meta.memory_file) || !artifact_link_find_layer(l, meta.vmstate_file) ||
            !artifact_link_find_layer(l, meta.disk_file))
                return job_error(j, -EINVAL, "%s lacks its memory, vmstate or disk file.", dir);
        if (index > 0) {
                const struct artifact_link *p = l - 1;
                const struct artifact_layer *pm = NULL;
                struct snapshot_meta pmeta;
                _cleanup_free_ char *pjson = NULL;
                size_t plen = 0;

                /* The chain as it is here must hold: the parent's memory is what the link was made on. */
                {
                        _cleanup_close_ int pfd = open(j->dirs[index - 1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);

                        if (pfd < 0)
                                return job_error(j, -errno, "Cannot open %s: %m", j->dirs[index - 1]);
                        r = read_file_capped_at(pfd, "snapshot.json", SNAPSHOT_META_FILE_MAX, &pjson, &plen);
                }
                if (r >= 0)
                        r = snapshot_meta_parse(pjson, plen, &pmeta, &reason);
                if (r >= 0)
                        pm = artifact_link_find_layer(p, pmeta.memory_file);
                if (!pm || strcmp(pm->sha256, l->parent_content_hash) != 0)
                        return job_error(j, -ESTALE,
                                         "Snapshot %s was made on other content of %s than the one here: the chain is "
                                         "broken and cannot be pushed.",
                                         l->tag, p->tag);
                memcpy(l->parent_digest, j->digest, OCI_DIGEST_SIZE); /* the manifest pushed last */
        }
        r = artifact_manifest_format(l, &manifest);
        if (r < 0)
                return job_error(j, r, "Cannot format the manifest of %s: %s", l->tag, strerror(-r));
        /* j->digest: the manifest last pushed, the next link's parent. */
        artifact_digest_buffer(manifest, strlen(manifest), j->digest);
        r = oci_registry_put_manifest(j->reg, j->ref->repo, index + 1 == j->n ? j->ref->tag : j->digest,
                                      OCI_MEDIA_TYPE_MANIFEST, manifest, strlen(manifest));
        if (r < 0)
                return registry_failed(j, r, "Cannot push a manifest");
        return 0;
}

static int push_work(void *userdata) {
        Operation *o = userdata;
        PushPullJob *j = o->extra;
        int r = 0;

        for (size_t i = 0; r >= 0 && i < j->n; i++) {
                r = push_link(j, i, &j->links[i]);
                j->n_links = i + 1;
        }
        j->bytes_sent = oci_registry_bytes_sent(j->reg);
        return r;
}

static void push_done(int r, void *userdata) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Operation *o = userdata;
        PushPullJob *j = o->extra;
        const char *head = j->tags[j->n - 1];

        if (r < 0) {
                log_warning("Pushing %s failed: %s", head, j->error ?: strerror(-r));
                (void) sd_bus_reply_method_errorf(o->message,
                                                  r == -ESTALE ? FORKD_ERROR_CHAIN_BROKEN : FORKD_ERROR_FAILED,
                                                  "Pushing %s failed: %s", head, j->error ?: strerror(-r));
                operation_free(o);
                return;
        }
        log_info("Pushed %s as %s (%zu link(s), %u blob(s) and %" PRIu64 " bytes sent).", head, j->digest, j->n,
                 j->blobs_sent, j->bytes_sent);
        r = sd_bus_message_new_method_return(o->message, &reply);
        if (r >= 0)
                r = sd_bus_message_append(reply, "a{sv}", 4, "digest", "s", j->digest, "bytes_sent", "t",
                                          j->bytes_sent, "blobs_sent", "u", j->blobs_sent, "links", "u",
                                          (uint32_t) j->n);
        if (r >= 0)
                r = sd_bus_send(NULL, reply, NULL);
        if (r < 0)
                (void) sd_bus_reply_method_errno(o->message, r, NULL);
        operation_free(o);
}

int push_snapshot_start(Manager *m, sd_bus_message *message, const char *tag, const char *ref, sd_bus_error *error) {
        Image *chain[PACK_LINKS_MAX];
        size_t n = 0;
        Operation *o = NULL;
        PushPullJob *j;
        int r;

        r = read_options(message, error);
        if (r < 0)
                return r;
        for (const char *t = tag; t && t[0];) {
                Image *i = hashmap_get(m->images, t);

                if (!i && n == 0)
                        return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SNAPSHOT, "No snapshot with tag %s.", tag);
                if (!i)
                        return sd_bus_error_setf(error, FORKD_ERROR_CHAIN_BROKEN,
                                                 "Snapshot %s's chain lacks %s (the parent of %s): it cannot be pushed.",
                                                 tag, t, chain[n - 1]->tag);
                if (n >= PACK_LINKS_MAX)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "Snapshot %s's chain is longer than %u links.", tag, PACK_LINKS_MAX);
                for (size_t k = 0; k < n; k++)
                        if (chain[k] == i)
                                return sd_bus_error_setf(error, FORKD_ERROR_FAILED, "Snapshot %s's chain loops.", tag);
                chain[n++] = i;
                t = i->meta.parent_tag;
        }
        j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->manager = m;
        r = open_ref(m, ref, &j->ref, &j->reg, error);
        if (r >= 0 && !j->ref->tag)
                r = sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                      "Push to a tag (host/repository:tag), not to a digest.");
        if (r < 0) {
                job_free(j);
                return r;
        }
        j->snapshots_dir = strdup(m->snapshots_dir);
        /* DeleteSnapshot refuses the chain while it is in use here. */
        r = image_hold_chain(chain, n, &j->tags, &j->dirs, &j->n);
        if (r >= 0 && !j->snapshots_dir)
                r = -ENOMEM;
        if (r < 0) {
                job_free(j);
                return r;
        }
        r = operation_begin(m, message, NULL, &o, error);
        if (r < 0) {
                job_free(j);
                return r;
        }
        o->extra = j;
        o->free_extra = job_free;
        r = operation_submit(o, push_work, push_done);
        if (r > 0)
                log_info("Pushing %s (%zu link(s)) to %s/%s.", tag, n, j->ref->host, j->ref->repo);
        return r;
}

/* ---- pull ---- */

static int hash_memory_here(PushPullJob *j, const char *tag, char ret[SNAPSHOT_HASH_LEN + 1]) {
        _cleanup_free_ char *dir = NULL;
        _cleanup_close_ int dfd = -EBADF, fd = -EBADF;
        _cleanup_free_ char *json = NULL;
        struct snapshot_meta meta;
        const char *reason = NULL;
        char digest[ARTIFACT_DIGEST_SIZE];
        uint64_t blob_size;
        struct stat st;
        size_t len = 0;
        int r;

        if (asprintf(&dir, "%s/%s", j->snapshots_dir, tag) < 0)
                return -ENOMEM;
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd < 0)
                return -errno;
        r = read_file_capped_at(dfd, "snapshot.json", SNAPSHOT_META_FILE_MAX, &json, &len);
        if (r >= 0)
                r = snapshot_meta_parse(json, len, &meta, &reason);
        if (r < 0)
                return job_error(j, -EEXIST, "Snapshot %s exists here but does not load: delete it first.", tag);
        fd = openat(dfd, meta.memory_file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) < 0)
                return job_error(j, -EEXIST, "Snapshot %s exists here but its memory file cannot be read: %m", tag);
        if (hash_cache_get(dfd, meta.memory_file, fd, ret) > 0)
                return 0;
        r = sparse_blob_encode(fd, (uint64_t) st.st_size, -1, NULL, digest, &blob_size, ret);
        if (r >= 0)
                hash_cache_put(dfd, meta.memory_file, fd, ret);
        return r;
}

static int fetch_manifest(PushPullJob *j, const char *reference, struct artifact_link *ret, char *ret_digest) {
        _cleanup_(oci_manifest_freep) oci_manifest *mf = NULL;
        _cleanup_free_ char *why = NULL;
        int r;

        r = oci_registry_get_manifest(j->reg, j->ref->repo, reference, &mf);
        if (r == -ENOENT)
                return job_error(j, r, "%s/%s has no %s.", j->ref->host, j->ref->repo, reference);
        if (r < 0)
                return registry_failed(j, r, "Cannot fetch a manifest");
        if (!mf->media_type || strcmp(mf->media_type, OCI_MEDIA_TYPE_MANIFEST) != 0)
                return job_error(j, -EBADMSG, "%s/%s@%s is not an OCI image manifest (%s).", j->ref->host, j->ref->repo,
                                 mf->digest, mf->media_type ?: "no media type");
        r = artifact_manifest_parse(mf->data, mf->size, ret, &why);
        if (r < 0)
                return job_error(j, r, "%s/%s@%s: %s", j->ref->host, j->ref->repo, mf->digest, why ?: "invalid");
        if (ret_digest)
                memcpy(ret_digest, mf->digest, OCI_DIGEST_SIZE);
        return 0;
}

/* The head's manifest and its ancestors' up to the root, or to the first
 * ancestor here with the content the chain was made on (the base). */
static int pull_manifests(PushPullJob *j) {
        struct artifact_link chain[PACK_LINKS_MAX] = {};
        uint64_t total = 0;
        size_t n = 0;
        int r;

        r = fetch_manifest(j, oci_ref_reference(j->ref), &chain[n++], NULL);
        while (r >= 0 && chain[n - 1].parent_tag[0]) {
                const struct artifact_link *l = &chain[n - 1];
                char hash[SNAPSHOT_HASH_LEN + 1];
                struct stat st;
                _cleanup_free_ char *dir = NULL;

                for (size_t k = 0; k < n; k++)
                        if (strcmp(chain[k].tag, l->parent_tag) == 0) {
                                r = job_error(j, -EBADMSG, "The pulled chain loops at %s.", l->parent_tag);
                                goto finish;
                        }
                if (asprintf(&dir, "%s/%s", j->snapshots_dir, l->parent_tag) < 0) {
                        r = -ENOMEM;
                        break;
                }
                if (lstat(dir, &st) >= 0) {
                        r = hash_memory_here(j, l->parent_tag, hash);
                        if (r < 0) {
                                if (!j->error)
                                        r = job_error(j, r, "Cannot read snapshot %s here: %s", l->parent_tag,
                                                      strerror(-r));
                                break;
                        }
                        if (strcmp(hash, l->parent_content_hash) != 0) {
                                r = job_error(j, -EEXIST,
                                              "Snapshot %s exists here with other content (%.12s...) than the pulled "
                                              "%s was made on (%.12s...); delete it first.",
                                              l->parent_tag, hash, l->tag, l->parent_content_hash);
                                break;
                        }
                        memcpy(j->base, l->parent_tag, sizeof(j->base));
                        break;
                }
                if (n >= PACK_LINKS_MAX) {
                        r = job_error(j, -EBADMSG, "The pulled chain is longer than %u links.", PACK_LINKS_MAX);
                        break;
                }
                r = fetch_manifest(j, l->parent_digest, &chain[n], NULL);
                if (r >= 0 && strcmp(chain[n].tag, l->parent_tag) != 0)
                        r = job_error(j, -EBADMSG, "%s's parent manifest names %s, not %s.", l->tag, chain[n].tag,
                                      l->parent_tag);
                n++;
        }
        /* The whole chain as a bundle may hold it (pack.h): the disk space a pull may take. */
        for (size_t k = 0; r >= 0 && k < n; k++)
                for (size_t i = 0; r >= 0 && i < chain[k].n_layers; i++)
                        if ((total += chain[k].layers[i].size) > PACK_TOTAL_SIZE_MAX)
                                r = job_error(j, -EBADMSG, "The pulled chain is larger than %" PRIu64 " bytes.",
                                              PACK_TOTAL_SIZE_MAX);
finish:
        if (r < 0) {
                for (size_t k = 0; k < n; k++)
                        artifact_link_done(&chain[k]);
                return r;
        }
        for (size_t k = 0; k < n; k++)
                j->links[k] = chain[n - 1 - k];
        j->n_links = n;
        return 0;
}

static int fetch_blob(PushPullJob *j, int fd, const char *digest, uint64_t size, const char *what) {
        int r = oci_registry_get_blob(j->reg, j->ref->repo, digest, size, fd);

        if (r == -EBADMSG)
                return job_error(j, r, "%s does not match its digest %s.", what, digest);
        if (r < 0)
                return registry_failed(j, r, "Cannot fetch a blob");
        j->blobs_fetched++;
        return 0;
}

static int pull_link(PushPullJob *j, int staging_dfd, size_t index) {
        const struct artifact_link *l = &j->links[index];
        _cleanup_close_ int dfd = -EBADF, cfd = -EBADF;
        _cleanup_free_ char *json = NULL;
        struct snapshot_meta meta;
        const char *reason = NULL;
        char what[SNAPSHOT_TAG_MAX + SNAPSHOT_FILE_NAME_MAX + 8];
        size_t len = 0;
        int r;

        if (mkdirat(staging_dfd, l->tag, 0750) < 0)
                return job_error(j, -errno, "Cannot create the staging directory: %m");
        dfd = openat(staging_dfd, l->tag, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd < 0)
                return job_error(j, -errno, "Cannot open the staging directory: %m");
        cfd = openat(dfd, "snapshot.json", O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
        if (cfd < 0)
                return job_error(j, -errno, "Cannot create %s/snapshot.json: %m", l->tag);
        snprintf(what, sizeof(what), "%s/snapshot.json", l->tag);
        r = fetch_blob(j, cfd, l->config_digest, l->config_size, what);
        if (r < 0)
                return r;
        r = read_file_capped_at(dfd, "snapshot.json", SNAPSHOT_META_FILE_MAX, &json, &len);
        if (r < 0)
                return job_error(j, r, "Cannot read %s: %s", what, strerror(-r));
        r = snapshot_meta_parse(json, len, &meta, &reason);
        if (r < 0)
                return job_error(j, -EBADMSG, "%s is invalid: %s", what, reason ?: "?");
        if (strcmp(meta.tag, l->tag) != 0 || strcmp(meta.parent_tag, l->parent_tag) != 0 ||
            strcmp(meta.parent_content_hash, l->parent_content_hash) != 0)
                return job_error(j, -EBADMSG, "%s does not name the tag and parent of its manifest.", what);
        if (!artifact_link_find_layer(l, meta.memory_file) || !artifact_link_find_layer(l, meta.vmstate_file) ||
            !artifact_link_find_layer(l, meta.disk_file))
                return job_error(j, -EBADMSG, "Link %s lacks its memory, vmstate or disk file.", l->tag);
        if (index > 0) {
                const struct artifact_link *p = &j->links[index - 1];
                const struct artifact_layer *pm = NULL;
                _cleanup_close_ int pfd = openat(staging_dfd, p->tag, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                _cleanup_free_ char *pjson = NULL;
                struct snapshot_meta pmeta;
                size_t plen = 0;

                r = pfd < 0 ? -errno : read_file_capped_at(pfd, "snapshot.json", SNAPSHOT_META_FILE_MAX, &pjson, &plen);
                if (r >= 0)
                        r = snapshot_meta_parse(pjson, plen, &pmeta, &reason);
                if (r >= 0)
                        pm = artifact_link_find_layer(p, pmeta.memory_file);
                if (!pm || strcmp(pm->sha256, l->parent_content_hash) != 0)
                        return job_error(j, -EBADMSG, "Link %s references %s content %.12s..., but the pulled %s has "
                                         "content %.12s...", l->tag, p->tag, l->parent_content_hash, p->tag,
                                         pm ? pm->sha256 : "(none)");
        }
        for (size_t i = 0; i < l->n_layers; i++) {
                const struct artifact_layer *y = &l->layers[i];
                _cleanup_close_ int tmp = -EBADF, fd = -EBADF;
                _cleanup_free_ char *why = NULL;

                snprintf(what, sizeof(what), "%s/%s", l->tag, y->name);
                tmp = openat(staging_dfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
                if (tmp < 0)
                        return job_error(j, -errno, "Cannot make a temporary file: %m");
                r = fetch_blob(j, tmp, y->digest, y->blob_size, what);
                if (r < 0)
                        return r;
                fd = openat(dfd, y->name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
                if (fd < 0)
                        return job_error(j, -errno, "Cannot create %s: %m", what);
                r = sparse_blob_decode(tmp, y->blob_size, fd, y->size, y->sha256, &why);
                if (r < 0)
                        return job_error(j, r, "%s is refused: %s", what, why ?: strerror(-r));
                if (fsync(fd) < 0)
                        return job_error(j, -errno, "Cannot write %s: %m", what);
                /* checked just now: the first fork of a diff chain need not hash it again */
                hash_cache_put(dfd, y->name, fd, y->sha256);
        }
        return 0;
}

/* The head under another tag: its snapshot.json says so, and its directory. */
static int pull_rename_head(PushPullJob *j, int staging_dfd) {
        struct artifact_link *l = &j->links[j->n_links - 1];
        _cleanup_close_ int dfd = openat(staging_dfd, l->tag, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        _cleanup_close_ int wfd = -EBADF;
        _cleanup_free_ char *json = NULL, *out = NULL;
        struct snapshot_meta meta;
        const char *reason = NULL;
        size_t len = 0;
        int r;

        if (dfd < 0)
                return -errno;
        r = read_file_capped_at(dfd, "snapshot.json", SNAPSHOT_META_FILE_MAX, &json, &len);
        if (r >= 0)
                r = snapshot_meta_parse(json, len, &meta, &reason);
        if (r < 0)
                return r;
        snprintf(meta.tag, sizeof(meta.tag), "%s", j->new_tag);
        r = snapshot_meta_format(&meta, &out);
        if (r < 0)
                return r;
        wfd = openat(dfd, "snapshot.json.new", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        if (wfd < 0)
                return -errno;
        r = loop_write(wfd, out, strlen(out));
        if (r >= 0 && fsync(wfd) < 0)
                r = -errno;
        if (r < 0)
                return r;
        if (renameat(dfd, "snapshot.json.new", dfd, "snapshot.json") < 0 ||
            renameat(staging_dfd, l->tag, staging_dfd, j->new_tag) < 0)
                return -errno;
        snprintf(l->tag, sizeof(l->tag), "%s", j->new_tag);
        return 0;
}

static int pull_work(void *userdata) {
        Operation *o = userdata;
        PushPullJob *j = o->extra;
        _cleanup_close_ int dfd = open(j->staging, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        const char *head;
        _cleanup_free_ char *dir = NULL;
        struct stat st;
        int r;

        if (dfd < 0)
                return -errno;
        r = pull_manifests(j);
        if (r < 0)
                goto finish;
        head = j->new_tag ?: j->links[j->n_links - 1].tag;
        for (size_t k = 0; k + 1 < j->n_links; k++)
                if (strcmp(j->links[k].tag, head) == 0) {
                        r = job_error(j, -EBADMSG, "The pulled chain holds %s already: pull it under another tag.",
                                      head);
                        goto finish;
                }
        if (asprintf(&dir, "%s/%s", j->snapshots_dir, head) < 0) {
                r = -ENOMEM;
                goto finish;
        }
        if (lstat(dir, &st) >= 0) {
                r = job_error(j, -EEXIST, "Snapshot %s exists already; delete it first%s.", head,
                              j->new_tag ? "" : ", or pull it under a new tag");
                goto finish;
        }
        for (size_t k = 0; r >= 0 && k < j->n_links; k++)
                r = pull_link(j, dfd, k);
        if (r >= 0 && j->new_tag) {
                r = pull_rename_head(j, dfd);
                if (r < 0)
                        r = job_error(j, r, "Cannot rename the pulled head: %s", strerror(-r));
        }
        if (r < 0)
                goto finish;
        j->staged.links = calloc(j->n_links, sizeof(struct pack_link));
        if (!j->staged.links) {
                r = -ENOMEM;
                goto finish;
        }
        for (size_t k = 0; k < j->n_links; k++)
                memcpy(j->staged.links[k].tag, j->links[k].tag, sizeof(j->links[k].tag));
        j->staged.n_links = j->n_links;
finish:
        j->bytes_fetched = oci_registry_bytes_fetched(j->reg);
        if (r < 0) {
                /* Here rather than in the event loop: it may be large. */
                (void) rm_rf(j->staging);
                j->staging = mfree(j->staging);
        }
        return r;
}

static void drop_staging(PushPullJob *j) {
        int r;

        if (!j->staging)
                return;
        r = rm_rf(j->staging);
        if (r < 0)
                log_warning_errno(r, "Failed to remove %s, the next start retries: %m", j->staging);
        j->staging = mfree(j->staging);
}

static void pull_reply_error(Operation *o, const char *name, const char *fmt, ...) _printf_(3, 4);
static void pull_reply_error(Operation *o, const char *name, const char *fmt, ...) {
        _cleanup_free_ char *s = NULL;
        va_list ap;
        int k;

        drop_staging(o->extra);
        va_start(ap, fmt);
        k = vasprintf(&s, fmt, ap);
        va_end(ap);
        log_warning("Pulling failed: %s", k >= 0 ? s : "?");
        (void) sd_bus_reply_method_errorf(o->message, name, "%s", k >= 0 ? s : "Pulling failed.");
        operation_free(o);
}

static void pull_done(int r, void *userdata) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Operation *o = userdata;
        PushPullJob *j = o->extra;
        Manager *m = o->manager;
        Image *loaded[PACK_LINKS_MAX] = {};
        size_t n = j->staged.n_links;

        if (r == -EBADMSG)
                return pull_reply_error(o, SD_BUS_ERROR_INVALID_ARGS, "The pulled snapshot is refused: %s",
                                        j->error ?: "invalid");
        if (r == -EEXIST)
                return pull_reply_error(o, FORKD_ERROR_SNAPSHOT_EXISTS, "%s", j->error ?: "A snapshot exists already.");
        if (r == -ENOENT && j->error)
                return pull_reply_error(o, FORKD_ERROR_NO_SUCH_SNAPSHOT, "%s", j->error);
        if (r < 0)
                return pull_reply_error(o, FORKD_ERROR_FAILED, "Pulling failed: %s", j->error ?: strerror(-r));
        if (j->base[0] && !hashmap_get(m->images, j->base))
                return pull_reply_error(o, FORKD_ERROR_CHAIN_BROKEN,
                                        "Snapshot %s, the base of the pulled chain, was deleted meanwhile.", j->base);
        for (size_t k = 0; k < n; k++) {
                const char *tag = j->staged.links[k].tag;
                _cleanup_free_ char *dir = NULL;
                struct stat st;

                if (asprintf(&dir, "%s/%s", m->snapshots_dir, tag) < 0)
                        return pull_reply_error(o, FORKD_ERROR_FAILED, "Out of memory.");
                if (hashmap_get(m->images, tag) || hashmap_get(m->creating, tag) || branch_in_flight(m, tag) ||
                    lstat(dir, &st) >= 0)
                        return pull_reply_error(o, FORKD_ERROR_SNAPSHOT_EXISTS,
                                                "Snapshot %s exists already; delete it first.", tag);
        }
        if (hashmap_size(m->images) + hashmap_size(m->creating) + n > SNAPSHOTS_MAX)
                return pull_reply_error(o, FORKD_ERROR_BUSY, "At most %u snapshots.", SNAPSHOTS_MAX);
        r = pack_install_staged(m, j->staging, &j->staged, o->owner_uid, loaded);
        if (r < 0)
                return pull_reply_error(o, FORKD_ERROR_FAILED, "The pulled snapshots do not load: %s", strerror(-r));
        for (size_t k = 0; k < n; k++) {
                log_info("Snapshot %s pulled%s%s.", loaded[k]->tag, loaded[k]->meta.parent_tag[0] ? ", parent " : "",
                         loaded[k]->meta.parent_tag);
                image_send_signal(m, loaded[k]->tag, true);
        }
        log_info("Pulled %s/%s:%s (%zu link(s), %u blob(s) and %" PRIu64 " bytes fetched%s%s).", j->ref->host,
                 j->ref->repo, oci_ref_reference(j->ref), n, j->blobs_fetched, j->bytes_fetched,
                 j->base[0] ? ", on " : "", j->base);
        drop_staging(j);
        r = sd_bus_message_new_method_return(o->message, &reply);
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'a', "a{sv}");
        for (size_t k = 0; r >= 0 && k < n; k++)
                r = image_append_info(reply, loaded[k], false);
        if (r >= 0)
                r = sd_bus_message_close_container(reply);
        if (r >= 0)
                r = sd_bus_send(NULL, reply, NULL);
        if (r < 0)
                (void) sd_bus_reply_method_errno(o->message, r, NULL);
        operation_free(o);
}

int pull_snapshot_start(Manager *m, sd_bus_message *message, const char *ref, const char *new_tag,
                        sd_bus_error *error) {
        Operation *o = NULL;
        PushPullJob *j;
        char rnd[9];
        int r;

        r = read_options(message, error);
        if (r < 0)
                return r;
        j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->manager = m;
        r = open_ref(m, ref, &j->ref, &j->reg, error);
        if (r < 0) {
                job_free(j);
                return r;
        }
        random_hex(rnd, 8);
        if ((new_tag[0] && !(j->new_tag = strdup(new_tag))) || !(j->snapshots_dir = strdup(m->snapshots_dir)) ||
            asprintf(&j->staging, "%s/" PACK_STAGING_PREFIX "%s", m->snapshots_dir, rnd) < 0) {
                j->staging = NULL;
                job_free(j);
                return -ENOMEM;
        }
        if (mkdir(j->staging, 0750) < 0) {
                r = -errno;
                j->staging = mfree(j->staging);
                job_free(j);
                return sd_bus_error_set_errnof(error, r, "Cannot create a staging directory: %m");
        }
        r = operation_begin(m, message, NULL, &o, error);
        if (r < 0) {
                job_free(j);
                return r;
        }
        o->extra = j;
        o->free_extra = job_free;
        r = operation_submit(o, pull_work, pull_done);
        if (r > 0)
                log_info("Pulling %s/%s%s%s.", j->ref->host, j->ref->repo, new_tag[0] ? " as " : "", new_tag);
        return r;
}
