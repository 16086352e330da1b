/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <pthread.h>

#include "macro.h"
#include "netns-batch.h"

struct batch {
        const NetnsPrefix *prefix;
        unsigned *indices;
        unsigned n;
        NetnsPolicy policy;
        NetnsChild *out;
        bool *made;

        pthread_mutex_t lock;
        unsigned next;  /* the next position to make */
        int error;      /* the first failure */
        unsigned failed;
        const char *failed_step;
};

static void *batch_thread(void *userdata) {
        struct batch *b = userdata;

        for (;;) {
                const char *step = NULL;
                unsigned i;
                int r;

                pthread_mutex_lock(&b->lock);
                i = b->error < 0 ? b->n : b->next++;
                pthread_mutex_unlock(&b->lock);
                if (i >= b->n)
                        return NULL;
                r = netns_child_create(b->prefix, b->indices[i], b->policy, &b->out[i], &step);
                for (unsigned k = 0; r == -EEXIST && k < NETNS_BATCH_EEXIST_RETRIES; k++) {
                        unsigned other;

                        /* Made by someone else since the pick: this position takes another. */
                        if (netns_pick_free(b->prefix, 1, &other) < 0)
                                break;
                        netns_release(b->indices[i]);
                        b->indices[i] = other;
                        r = netns_child_create(b->prefix, other, b->policy, &b->out[i], &step);
                }
                if (r >= 0) {
                        b->made[i] = true;
                        continue;
                }
                pthread_mutex_lock(&b->lock);
                if (b->error == 0) {
                        b->error = r;
                        b->failed = i;
                        b->failed_step = step;
                }
                pthread_mutex_unlock(&b->lock);
        }
}

int netns_children_create(const NetnsPrefix *prefix, unsigned *indices, unsigned n, NetnsPolicy policy,
                          unsigned threads, NetnsChild *ret, bool *ret_made, unsigned *ret_failed,
                          const char **ret_failed_step) {
        struct batch b = { .prefix = prefix, .indices = indices, .n = n, .policy = policy, .out = ret,
                           .made = ret_made, .lock = PTHREAD_MUTEX_INITIALIZER };
        pthread_t t[NETNS_BATCH_THREADS_MAX];
        unsigned started = 0;

        for (unsigned i = 0; i < n; i++)
                ret_made[i] = false;
        threads = MAX(MIN(threads, NETNS_BATCH_THREADS_MAX), 1u);
        threads = MIN(threads, MAX(n, 1u));
        /* This thread is one of them. */
        for (; started + 1 < threads; started++)
                if (pthread_create(&t[started], NULL, batch_thread, &b) != 0)
                        break;
        (void) batch_thread(&b);
        for (unsigned k = 0; k < started; k++)
                (void) pthread_join(t[k], NULL);
        if (b.error < 0) {
                if (ret_failed)
                        *ret_failed = b.failed;
                if (ret_failed_step)
                        *ret_failed_step = b.failed_step;
        }
        return b.error;
}
