/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>

#include "usage-batch.h"

/* The reader tells the caller every this many items (and at the end). */
#define USAGE_BATCH_STEP 16

static void *reader(void *userdata) {
        UsageBatch *b = userdata;

        for (size_t i = 0; i < b->n; i++) {
                bool stop;

                b->read(b->items[i], &b->usage[i]);
                if ((i + 1) % USAGE_BATCH_STEP != 0 && i + 1 != b->n)
                        continue;
                pthread_mutex_lock(&b->lock);
                b->ready = i + 1;
                stop = b->stop;
                pthread_cond_signal(&b->cond);
                pthread_mutex_unlock(&b->lock);
                if (stop)
                        break;
        }
        return NULL;
}

int usage_batch_start(UsageBatch *b, void *const *items, size_t n, usage_read_fn read) {
        sigset_t all, saved;

        *b = (UsageBatch) { .items = items, .n = n, .read = read };
        b->usage = calloc(n ? n : 1, sizeof(SandboxUsage));
        if (!b->usage)
                return -ENOMEM;
        if (n >= USAGE_BATCH_THREAD_MIN && pthread_mutex_init(&b->lock, NULL) == 0) {
                if (pthread_cond_init(&b->cond, NULL) == 0) {
                        /* the reader takes no signal: forkd's go to its event loop */
                        sigfillset(&all);
                        pthread_sigmask(SIG_BLOCK, &all, &saved);
                        b->threaded = pthread_create(&b->thread, NULL, reader, b) == 0;
                        pthread_sigmask(SIG_SETMASK, &saved, NULL);
                        if (b->threaded)
                                return 0;
                        pthread_cond_destroy(&b->cond);
                }
                pthread_mutex_destroy(&b->lock);
        }
        for (size_t i = 0; i < n; i++)
                read(items[i], &b->usage[i]);
        b->seen = n;
        return 0;
}

const SandboxUsage *usage_batch_get(UsageBatch *b, size_t i) {
        if (i >= b->seen) {
                pthread_mutex_lock(&b->lock);
                while (b->ready <= i)
                        pthread_cond_wait(&b->cond, &b->lock);
                b->seen = b->ready;
                pthread_mutex_unlock(&b->lock);
        }
        return &b->usage[i];
}

void usage_batch_done(UsageBatch *b) {
        if (b->threaded) {
                pthread_mutex_lock(&b->lock);
                b->stop = true;
                pthread_mutex_unlock(&b->lock);
                pthread_join(b->thread, NULL);
                pthread_cond_destroy(&b->cond);
                pthread_mutex_destroy(&b->lock);
        }
        free(b->usage);
        *b = (UsageBatch) {};
}
