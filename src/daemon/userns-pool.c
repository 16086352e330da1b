/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <stdlib.h>

#include "macro.h"
#include "manager.h"
#include "uid-range.h"
#include "userns-pool.h"
#include "vmm-userns.h"
#include "worker.h"

/* A fill: ids taken from the range in the event loop, their namespaces made in a worker. */
struct userns_fill {
        Manager *manager;
        uid_t owner;
        gid_t group;
        unsigned n, made;
        uid_t *ids;
        int *fds;
};

static void fill_free(struct userns_fill *j, UidRange *range) {
        if (!j)
                return;
        for (unsigned i = 0; i < j->n; i++) {
                if (i < j->made)
                        safe_close(j->fds[i]);
                uid_range_free(range, j->ids[i]);
        }
        free(j->ids);
        free(j->fds);
        free(j);
}

int userns_pool_init(Manager *m) {
        UsernsPool *p = &m->userns_pool;

        *p = (UsernsPool) {};
        if (m->vmm_uids.count == 0)
                return 0;
        p->size = MIN(USERNS_POOL_SIZE, m->vmm_uids.count / 4);
        if (p->size == 0)
                return 0;
        p->ids = calloc(p->size, sizeof(uid_t));
        p->fds = calloc(p->size, sizeof(int));
        if (!p->ids || !p->fds) {
                free(p->ids);
                free(p->fds);
                *p = (UsernsPool) {};
                return -ENOMEM;
        }
        return 0;
}

void userns_pool_drain(Manager *m) {
        UsernsPool *p = &m->userns_pool;

        for (unsigned i = 0; i < p->n; i++) {
                safe_close(p->fds[i]);
                uid_range_free(&m->vmm_uids, p->ids[i]);
        }
        p->n = 0;
}

void userns_pool_done(Manager *m) {
        UsernsPool *p = &m->userns_pool;

        userns_pool_drain(m);
        /* The workers are gone (manager_free()): a fill they dropped or ran is ours. */
        fill_free(p->filling, &m->vmm_uids);
        free(p->ids);
        free(p->fds);
        *p = (UsernsPool) {};
}

int userns_pool_take(Manager *m, uid_t *ret_id, int *ret_fd) {
        UsernsPool *p = &m->userns_pool;

        if (p->n == 0)
                return -ENOENT;
        /* The newest first: the others wait their turn in the order they were made. */
        p->n--;
        *ret_id = p->ids[p->n];
        *ret_fd = p->fds[p->n];
        return 0;
}

static int fill_work(void *userdata) {
        struct userns_fill *j = userdata;

        for (; j->made < j->n; j->made++) {
                int r = vmm_userns_new(j->owner, j->ids[j->made], j->group, &j->fds[j->made]);

                if (r < 0)
                        return r;
        }
        return 0;
}

static void fill_done(int r, void *userdata) {
        struct userns_fill *j = userdata;
        Manager *m = j->manager;
        UsernsPool *p = &m->userns_pool;
        unsigned i = 0;

        p->filling = NULL;
        if (r < 0)
                log_warning_errno(r, "Could not make user namespaces for VMMs ahead of time (%u of %u made): %m",
                                  j->made, j->n);
        for (; i < j->made && p->n < p->size; i++) {
                p->ids[p->n] = j->ids[i];
                p->fds[p->n++] = j->fds[i];
        }
        /* What did not fit (a fork drained the pool meanwhile, or a failure) goes back. */
        for (unsigned k = i; k < j->n; k++) {
                if (k < j->made)
                        safe_close(j->fds[k]);
                uid_range_free(&m->vmm_uids, j->ids[k]);
        }
        j->n = j->made = 0;
        fill_free(j, &m->vmm_uids);
}

void userns_pool_fill(Manager *m, unsigned ready) {
        UsernsPool *p = &m->userns_pool;
        struct userns_fill *j;
        uint32_t free_ids;
        unsigned want;

        ready = MIN(ready, p->size);
        if (ready == 0 || p->filling || p->n >= ready || !m->workers || m->exiting)
                return;
        /* Never the range's last ids: forks come first. */
        free_ids = m->vmm_uids.count - m->vmm_uids.n_used;
        if (free_ids <= p->size)
                return;
        want = MIN(ready - p->n, free_ids - p->size);
        j = calloc(1, sizeof(*j));
        if (!j)
                return;
        *j = (struct userns_fill) { .manager = m, .owner = m->vmm_uid, .group = m->vmm_gid };
        j->ids = calloc(want, sizeof(uid_t));
        j->fds = calloc(want, sizeof(int));
        if (!j->ids || !j->fds) {
                fill_free(j, &m->vmm_uids);
                return;
        }
        for (; j->n < want; j->n++)
                if (uid_range_alloc(&m->vmm_uids, &j->ids[j->n]) < 0)
                        break;
        if (j->n == 0 || worker_pool_submit(m->workers, fill_work, fill_done, j) < 0) {
                fill_free(j, &m->vmm_uids);
                return;
        }
        p->filling = j;
}
