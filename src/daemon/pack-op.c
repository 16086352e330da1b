/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "branch.h"
#include "fs-util.h"
#include "bus-info.h"
#include "image.h"
#include "macro.h"
#include "operation.h"
#include "pack-op.h"
#include "pack.h"
#include "worker.h"

typedef struct PackJob {
        Manager *manager;
        int fd;
        /* pack */
        char **tags;           /* root first, each holding one n_users of its Image */
        char **dirs;
        size_t n;
        uint64_t bytes;
        /* unpack */
        char *new_tag;         /* NULL: the manifest's tags */
        char *staging;         /* snapshots_dir/.unpack-XXXXXX */
        char *snapshots_dir;
        struct pack_manifest manifest;
        char *error;           /* what went wrong, for the caller */
} PackJob;

static void pack_job_free(void *p) {
        PackJob *j = p;

        if (!j)
                return;
        image_release_chain(j->manager, j->tags, j->n);
        strv_free(j->tags);
        strv_free(j->dirs);
        safe_close(j->fd);
        free(j->new_tag);
        free(j->snapshots_dir);
        if (j->staging) {
                int r = rm_rf(j->staging);
                if (r < 0)
                        log_warning_errno(r, "Failed to remove %s, the next start retries: %m", j->staging);
                free(j->staging);
        }
        pack_manifest_done(&j->manifest);
        free(j->error);
        free(j);
}

static int take_fd(sd_bus_message *message, int fd, int want_mode, PackJob *j, sd_bus_error *error) {
        int fl = fcntl(fd, F_GETFL);

        if (fl < 0)
                return sd_bus_error_set_errnof(error, errno, "Cannot use the file descriptor: %m");
        if ((fl & O_ACCMODE) != want_mode && (fl & O_ACCMODE) != O_RDWR)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "The file descriptor must be open for %s.",
                                         want_mode == O_RDONLY ? "reading" : "writing");
        j->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (j->fd < 0)
                return sd_bus_error_set_errnof(error, errno, "Cannot use the file descriptor: %m");
        /* Pipes and sockets are waited for with a timeout (pack.c), blocking or not. */
        return 0;
}

/* ---- pack ---- */

static int pack_work(void *userdata) {
        Operation *o = userdata;
        PackJob *j = o->extra;

        return pack_write(j->fd, (const char *const *) j->dirs, j->n, &j->bytes, &j->error);
}

static void pack_done(int r, void *userdata) {
        Operation *o = userdata;
        PackJob *j = o->extra;

        if (r < 0) {
                log_warning_errno(r, "Packing %s failed: %s", j->tags[j->n - 1], j->error ?: strerror(-r));
                (void) sd_bus_reply_method_errorf(o->message, FORKD_ERROR_FAILED, "Packing %s failed: %s",
                                                  j->tags[j->n - 1], j->error ?: strerror(-r));
        } else {
                _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;

                log_info("Packed %s (%zu link(s), %" PRIu64 " bytes).", j->tags[j->n - 1], j->n, j->bytes);
                r = sd_bus_message_new_method_return(o->message, &reply);
                if (r >= 0)
                        r = sd_bus_message_append_strv(reply, j->tags);
                if (r >= 0)
                        r = sd_bus_message_append(reply, "t", j->bytes);
                if (r >= 0)
                        r = sd_bus_send(NULL, reply, NULL);
                if (r < 0)
                        (void) sd_bus_reply_method_errno(o->message, r, NULL);
        }
        operation_free(o);
}

int pack_snapshot_start(Manager *m, sd_bus_message *message, const char *tag, int fd, sd_bus_error *error) {
        Image *chain[PACK_LINKS_MAX];
        size_t n = 0;
        Operation *o = NULL;
        PackJob *j;
        int r;

        /* The head and every ancestor, as registered. */
        for (const char *t = tag; t && t[0];) {
                Image *i = hashmap_get(m->images, t);

                if (!i && n == 0)
                        return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SNAPSHOT, "No snapshot with tag %s.", tag);
                if (!i)
                        return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SNAPSHOT,
                                                 "Snapshot %s's chain lacks %s (the parent of %s): it cannot be packed.",
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
        j->fd = -EBADF;
        r = take_fd(message, fd, O_WRONLY, j, error);
        if (r < 0) {
                pack_job_free(j);
                return r;
        }
        /* DeleteSnapshot refuses the chain while it is in use here. */
        r = image_hold_chain(chain, n, &j->tags, &j->dirs, &j->n);
        if (r < 0) {
                pack_job_free(j);
                return r;
        }
        r = operation_begin(m, message, NULL, &o, error);
        if (r < 0) {
                pack_job_free(j);
                return r;
        }
        o->extra = j;
        o->free_extra = pack_job_free;
        r = operation_submit(o, pack_work, pack_done);
        if (r > 0)
                log_info("Packing %s (%zu link(s)).", tag, n);
        return r;
}

/* ---- unpack ---- */

/* Worker thread: only the file system. The event loop checks the registry
 * again before anything is moved into place. */
static int tag_free_on_disk(const char *tag, void *userdata) {
        PackJob *j = userdata;
        _cleanup_free_ char *dir = NULL;
        struct stat st;

        if (asprintf(&dir, "%s/%s", j->snapshots_dir, tag) < 0)
                return -ENOMEM;
        return lstat(dir, &st) >= 0 ? -EEXIST : 0;
}

static int unpack_work(void *userdata) {
        Operation *o = userdata;
        PackJob *j = o->extra;
        _cleanup_close_ int dfd = open(j->staging, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

        int r;

        if (dfd < 0)
                return -errno;
        r = pack_read_full(j->fd, dfd, j->new_tag, tag_free_on_disk, j, &j->manifest, &j->error);
        if (r < 0) {
                /* Here rather than in the event loop: it may be large. */
                (void) rm_rf(j->staging);
                free(j->staging);
                j->staging = NULL;
        }
        return r;
}

/* Before the reply, not after it: a caller that got its answer finds no
 * .unpack-* directory left (the test of kill -9 and a full disk checks). */
static void drop_staging(PackJob *j) {
        int r;

        if (!j->staging)
                return;
        r = rm_rf(j->staging);
        if (r < 0)
                log_warning_errno(r, "Failed to remove %s, the next start retries: %m", j->staging);
        free(j->staging);
        j->staging = NULL;
}

static int reply_error(Operation *o, const char *name, const char *fmt, ...) _printf_(3, 4);
static int reply_error(Operation *o, const char *name, const char *fmt, ...) {
        _cleanup_free_ char *s = NULL;
        va_list ap;
        int k;

        drop_staging(o->extra);

        va_start(ap, fmt);
        k = vasprintf(&s, fmt, ap);
        va_end(ap);
        log_warning("Unpacking failed: %s", k >= 0 ? s : "?");
        (void) sd_bus_reply_method_errorf(o->message, name, "%s", k >= 0 ? s : "Unpacking failed.");
        operation_free(o);
        return 0;
}

int pack_install_staged(Manager *m, const char *staging, const struct pack_manifest *mf, uid_t owner_uid,
                        Image **loaded) {
        size_t moved = 0, n = mf->n_links;
        const char *reason = NULL;
        int r = 0;

        /* Whoever unpacks owns what lands, whatever the bundle's snapshot.json says;
         * recorded while the links are still staged. */
        for (size_t k = 0; k < n; k++) {
                _cleanup_free_ char *dir = NULL;

                if (asprintf(&dir, "%s/%s", staging, mf->links[k].tag) < 0)
                        return -ENOMEM;
                r = image_write_owner(dir, owner_uid);
                if (r < 0)
                        return r;
        }
        for (; moved < n; moved++) {
                const char *tag = mf->links[moved].tag;
                _cleanup_free_ char *from = NULL, *to = NULL;

                if (asprintf(&from, "%s/%s", staging, tag) < 0 || asprintf(&to, "%s/%s", m->snapshots_dir, tag) < 0) {
                        r = -ENOMEM;
                        break;
                }
                if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) < 0) {
                        r = -errno;
                        break;
                }
        }
        for (size_t k = 0; r >= 0 && k < n; k++) {
                r = image_load(m, mf->links[k].tag, &loaded[k], &reason);
                if (r < 0)
                        log_warning_errno(r, "Unpacked snapshot %s does not load: %s", mf->links[k].tag,
                                          reason ?: "?");
        }
        if (r >= 0) {
                (void) fsync_path(m->snapshots_dir);
                return 0;
        }
        for (size_t k = 0; k < n; k++)
                loaded[k] = image_free(loaded[k]);
        while (moved > 0) {
                const char *tag = mf->links[--moved].tag;
                _cleanup_free_ char *from = NULL, *to = NULL;

                if (asprintf(&from, "%s/%s", staging, tag) >= 0 && asprintf(&to, "%s/%s", m->snapshots_dir, tag) >= 0)
                        (void) rename(to, from);
        }
        return r;
}

static void unpack_done(int r, void *userdata) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Operation *o = userdata;
        PackJob *j = o->extra;
        Manager *m = o->manager;
        Image *loaded[PACK_LINKS_MAX] = {};
        size_t n = j->manifest.n_links;

        if (r == -EBADMSG) {
                reply_error(o, SD_BUS_ERROR_INVALID_ARGS, "The bundle is refused: %s", j->error ?: "invalid");
                return;
        }
        if (r == -EEXIST) {
                reply_error(o, FORKD_ERROR_SNAPSHOT_EXISTS, "%s", j->error ?: "A snapshot of the bundle exists already.");
                return;
        }
        if (r < 0) {
                reply_error(o, FORKD_ERROR_FAILED, "Unpacking failed: %s", j->error ?: strerror(-r));
                return;
        }
        for (size_t k = 0; k < n; k++) {
                const char *tag = j->manifest.links[k].tag;
                _cleanup_free_ char *dir = NULL;
                struct stat st;

                if (asprintf(&dir, "%s/%s", m->snapshots_dir, tag) < 0) {
                        reply_error(o, FORKD_ERROR_FAILED, "Out of memory.");
                        return;
                }
                if (hashmap_get(m->images, tag) || hashmap_get(m->creating, tag) || branch_in_flight(m, tag) ||
                    lstat(dir, &st) >= 0) {
                        reply_error(o, FORKD_ERROR_SNAPSHOT_EXISTS,
                                    "Snapshot %s exists already; delete it first%s.", tag,
                                    j->new_tag ? "" : (n == 1 ? ", or unpack it under a new tag" : ""));
                        return;
                }
        }
        if (hashmap_size(m->images) + hashmap_size(m->creating) + n > SNAPSHOTS_MAX) {
                reply_error(o, FORKD_ERROR_BUSY, "At most %u snapshots.", SNAPSHOTS_MAX);
                return;
        }
        r = pack_install_staged(m, j->staging, &j->manifest, o->owner_uid, loaded);
        if (r < 0) {
                reply_error(o, FORKD_ERROR_FAILED, "The unpacked snapshots do not load: %s", strerror(-r));
                return;
        }
        for (size_t k = 0; k < n; k++) {
                log_info("Snapshot %s unpacked%s%s.", loaded[k]->tag, loaded[k]->meta.parent_tag[0] ? ", parent " : "",
                         loaded[k]->meta.parent_tag);
                image_send_signal(m, loaded[k]->tag, true);
        }
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

int unpack_snapshot_start(Manager *m, sd_bus_message *message, int fd, const char *new_tag, sd_bus_error *error) {
        Operation *o = NULL;
        PackJob *j;
        char rnd[9];
        int r;

        j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->manager = m;
        j->fd = -EBADF;
        r = take_fd(message, fd, O_RDONLY, j, error);
        if (r < 0) {
                pack_job_free(j);
                return r;
        }
        random_hex(rnd, 8);
        if ((new_tag[0] && !(j->new_tag = strdup(new_tag))) || !(j->snapshots_dir = strdup(m->snapshots_dir)) ||
            asprintf(&j->staging, "%s/" PACK_STAGING_PREFIX "%s", m->snapshots_dir, rnd) < 0) {
                j->staging = NULL;
                pack_job_free(j);
                return -ENOMEM;
        }
        if (mkdir(j->staging, 0750) < 0) {
                r = -errno;
                free(j->staging);
                j->staging = NULL;
                pack_job_free(j);
                return sd_bus_error_set_errnof(error, r, "Cannot create a staging directory: %m");
        }
        r = operation_begin(m, message, NULL, &o, error);
        if (r < 0) {
                pack_job_free(j);
                return r;
        }
        o->extra = j;
        o->free_extra = pack_job_free;
        r = operation_submit(o, unpack_work, unpack_done);
        if (r > 0)
                log_info("Unpacking a bundle%s%s.", new_tag[0] ? " as " : "", new_tag);
        return r;
}
