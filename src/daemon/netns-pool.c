/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "macro.h"
#include "netns-batch.h"
#include "netns-pool.h"

/* After a failed make, the refill waits this long times the failures in a
 * row (at most RETRY_MAX_SEC) before it tries again: a host that cannot make
 * namespaces is not hammered, and a fork still makes its own. */
#define RETRY_SEC 1
#define RETRY_MAX_SEC 30
/* The refill thread's nice value: it yields to the VMMs and to forks. */
#define REFILL_NICE 10

struct policy_pool {
        NetnsChild *items; /* [size], the first n ready */
        unsigned n;
        bool wanted;
        unsigned failures;
};

struct NetnsPool {
        NetnsPrefix prefix;
        unsigned size;
        pthread_mutex_t lock;
        pthread_cond_t cond; /* CLOCK_MONOTONIC */
        pthread_t thread;
        bool started;
        bool stop;
        struct policy_pool pools[_NETNS_POLICY_MAX];
};

static void child_destroy(NetnsChild *c) {
        int r;

        netns_child_done(c);
        r = netns_child_destroy(c->name);
        if (r < 0)
                log_warning_errno(r, "Failed to remove the pooled network namespace %s: %m", c->name);
        netns_release(c->index);
}

/* The policy to make one for next, or -1; under the lock. */
static int next_policy(NetnsPool *p) {
        for (int k = 0; k < _NETNS_POLICY_MAX; k++)
                if (p->pools[k].wanted && p->pools[k].n < p->size)
                        return k;
        return -1;
}

static int make_one(NetnsPool *p, NetnsPolicy policy, NetnsChild *ret, const char **ret_step) {
        unsigned index;
        int r = -EEXIST;

        /* As netns_children_create(): an index whose namespace appeared since the pick gives way. */
        for (unsigned k = 0; r == -EEXIST && k <= NETNS_BATCH_EEXIST_RETRIES; k++) {
                r = netns_pick_free(&p->prefix, 1, &index);
                if (r < 0) {
                        *ret_step = "a free index";
                        return r;
                }
                r = netns_child_create(&p->prefix, index, policy, ret, ret_step);
                if (r < 0)
                        netns_release(index);
        }
        return r;
}

static void wait_seconds(NetnsPool *p, unsigned sec) {
        struct timespec ts;

        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += sec;
        while (!p->stop && pthread_cond_timedwait(&p->cond, &p->lock, &ts) == 0)
                ;
}

static void *refill_thread(void *userdata) {
        NetnsPool *p = userdata;

        /* Linux: a thread's nice value is its own. */
        (void) setpriority(PRIO_PROCESS, (id_t) gettid(), REFILL_NICE);
        pthread_mutex_lock(&p->lock);
        while (!p->stop) {
                const char *step = NULL;
                NetnsChild c;
                int policy = next_policy(p), r;

                if (policy < 0) {
                        pthread_cond_wait(&p->cond, &p->lock);
                        continue;
                }
                pthread_mutex_unlock(&p->lock);
                r = make_one(p, (NetnsPolicy) policy, &c, &step);
                pthread_mutex_lock(&p->lock);

                struct policy_pool *pp = &p->pools[policy];
                if (r < 0) {
                        pp->failures++;
                        if (pp->failures == 1)
                                log_warning_errno(r, "Failed to make a network namespace for the pool (%s): %m; "
                                                  "forks make their own meanwhile.", step ?: "?");
                        wait_seconds(p, MIN(pp->failures * RETRY_SEC, (unsigned) RETRY_MAX_SEC));
                        continue;
                }
                pp->failures = 0;
                /* Only this thread adds, so there is room; the lock orders it with takes. */
                pp->items[pp->n++] = c;
                if (pp->n == p->size)
                        log_debug("netns pool: %u namespaces with policy %s ready", p->size,
                                  netns_policy_to_string((NetnsPolicy) policy));
        }
        pthread_mutex_unlock(&p->lock);
        return NULL;
}

int netns_pool_new(const NetnsPrefix *prefix, unsigned size, NetnsPool **ret) {
        NetnsPool *p;
        pthread_condattr_t attr;
        int r;

        if (!prefix || size < 1 || size > NETNS_POOL_MAX || !ret)
                return -EINVAL;
        p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        p->prefix = *prefix;
        p->size = size;
        for (int k = 0; k < _NETNS_POLICY_MAX; k++) {
                p->pools[k].items = calloc(size, sizeof(NetnsChild));
                if (!p->pools[k].items) {
                        netns_pool_free(p);
                        return -ENOMEM;
                }
        }
        (void) pthread_mutex_init(&p->lock, NULL);
        (void) pthread_condattr_init(&attr);
        (void) pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        (void) pthread_cond_init(&p->cond, &attr);
        (void) pthread_condattr_destroy(&attr);
        r = pthread_create(&p->thread, NULL, refill_thread, p);
        if (r != 0) {
                netns_pool_free(p);
                return -r;
        }
        p->started = true;
        *ret = p;
        return 0;
}

NetnsPool *netns_pool_free(NetnsPool *p) {
        if (!p)
                return NULL;
        if (p->started) {
                pthread_mutex_lock(&p->lock);
                p->stop = true;
                pthread_cond_broadcast(&p->cond);
                pthread_mutex_unlock(&p->lock);
                (void) pthread_join(p->thread, NULL);
                pthread_cond_destroy(&p->cond);
                pthread_mutex_destroy(&p->lock);
        }
        for (int k = 0; k < _NETNS_POLICY_MAX; k++) {
                for (unsigned i = 0; i < p->pools[k].n; i++)
                        child_destroy(&p->pools[k].items[i]);
                free(p->pools[k].items);
        }
        free(p);
        return NULL;
}

unsigned netns_pool_take(NetnsPool *p, NetnsPolicy policy, NetnsChild *out, unsigned n) {
        struct policy_pool *pp;
        unsigned k;

        if (!p || policy < 0 || policy >= _NETNS_POLICY_MAX || !out)
                return 0;
        pthread_mutex_lock(&p->lock);
        pp = &p->pools[policy];
        k = MIN(n, pp->n);
        /* The newest first: the order does not matter, the copy is one block. */
        memcpy(out, pp->items + (pp->n - k), k * sizeof(NetnsChild));
        pp->n -= k;
        pp->wanted = true;
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
        return k;
}

unsigned netns_pool_ready(NetnsPool *p, NetnsPolicy policy, bool *ret_wanted) {
        unsigned n = 0;
        bool wanted = false;

        if (p && policy >= 0 && policy < _NETNS_POLICY_MAX) {
                pthread_mutex_lock(&p->lock);
                n = p->pools[policy].n;
                wanted = p->pools[policy].wanted;
                pthread_mutex_unlock(&p->lock);
        }
        if (ret_wanted)
                *ret_wanted = wanted;
        return n;
}

unsigned netns_pool_size(const NetnsPool *p) {
        return p ? p->size : 0;
}
