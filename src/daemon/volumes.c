/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "forkd-bus.h"
#include "hashmap.h"
#include "fork-op.h"
#include "macro.h"
#include "operation.h"
#include "sandbox.h"
#include "snapshot-meta.h"
#include "volumes.h"

static bool meta_has_rw(const struct snapshot_meta *meta, uint64_t dev, uint64_t ino) {
        for (uint32_t k = 0; k < meta->n_volumes; k++)
                if (!meta->volumes[k].file[0] && meta->volumes[k].dev == dev && meta->volumes[k].ino == ino)
                        return true;
        return false;
}

int volumes_check_fork(Manager *m, Image *i, unsigned n, sd_bus_error *error) {
        for (uint32_t k = 0; k < i->meta.n_volumes; k++) {
                const struct snapshot_volume *v = &i->meta.volumes[k];
                HashmapIter it = {};
                void *p;

                if (v->file[0])
                        continue;
                if (n > 1)
                        return sd_bus_error_setf(error, FORKD_ERROR_VOLUME_BUSY,
                                                 "Snapshot %s has the rw volume %s: it forks one sandbox at a time, "
                                                 "not %u.", i->tag, v->host_path, n);
                /* a fork that has not registered its sandbox yet holds the file too */
                for (Operation *o = m->operations; o; o = o->next)
                        if (o->fork && o->fork->image && meta_has_rw(&o->fork->image->meta, v->dev, v->ino))
                                return sd_bus_error_setf(error, FORKD_ERROR_VOLUME_BUSY,
                                                         "The rw volume %s is held by a sandbox of %s that is "
                                                         "starting; retry once it has ended or is paused.",
                                                         v->host_path, o->fork->image->tag);
                while (hashmap_iterate(m->sandboxes, &it, &p)) {
                        Sandbox *s = p;
                        Image *si;

                        if (s->state == SANDBOX_TERMINATING)
                                continue;
                        si = hashmap_get(m->images, s->snapshot_tag);
                        if (si && meta_has_rw(&si->meta, v->dev, v->ino))
                                return sd_bus_error_setf(error, FORKD_ERROR_VOLUME_BUSY,
                                                         "The rw volume %s is held by sandbox %s; terminate or "
                                                         "pause it first.", v->host_path, s->id);
                }
        }
        return 0;
}

int volumes_check_running_fork(Manager *m, Sandbox *s, sd_bus_error *error) {
        Image *i = hashmap_get(m->images, s->snapshot_tag);

        if (!i)
                return 0;
        for (uint32_t k = 0; k < i->meta.n_volumes; k++)
                if (!i->meta.volumes[k].file[0])
                        return sd_bus_error_setf(error, FORKD_ERROR_VOLUME_BUSY,
                                                 "The rw volume %s is held by sandbox %s; a fork of it would "
                                                 "be a second holder. Pause it, then fork the paused sandbox.",
                                                 i->meta.volumes[k].host_path, s->id);
        return 0;
}

int volumes_open_rw(const char *dir, int *fds, unsigned *ret_n, char **ret_error) {
        struct snapshot_meta *meta;
        const char *err = NULL;
        char path[4096];
        unsigned n = 0;
        int r;

        meta = calloc(1, sizeof(*meta));
        if (!meta)
                return -ENOMEM;
        snprintf(path, sizeof(path), "%s/snapshot.json", dir);
        r = snapshot_meta_read_file(path, meta, &err);
        if (r < 0) {
                free(meta);
                return r;
        }
        for (uint32_t k = 0; k < meta->n_volumes; k++) {
                const struct snapshot_volume *v = &meta->volumes[k];
                struct stat st;
                int fd;

                if (v->file[0])
                        continue;
                fd = open(v->host_path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
                if (fd < 0) {
                        r = -errno;
                        if (ret_error && asprintf(ret_error, "Cannot open the rw volume %s: %s", v->host_path,
                                                  strerror(-r)) < 0)
                                *ret_error = NULL;
                        goto fail;
                }
                if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t) st.st_dev != v->dev ||
                    (uint64_t) st.st_ino != v->ino || (st.st_uid != 0 && st.st_uid != meta->owner_uid)) {
                        safe_close(fd);
                        r = -ESTALE;
                        if (ret_error && asprintf(ret_error, "The rw volume %s is no longer the file the snapshot "
                                                  "was made with (device, inode or owner changed)",
                                                  v->host_path) < 0)
                                *ret_error = NULL;
                        goto fail;
                }
                fds[n++] = fd;
        }
        free(meta);
        *ret_n = n;
        return 0;
fail:
        for (unsigned k = 0; k < n; k++)
                safe_close(fds[k]);
        free(meta);
        return r;
}
