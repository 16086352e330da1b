/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The network namespaces of a fork (fork options net): taken from the pool
 * first, the rest made a few at a time on the fork's worker. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fork-op.h"
#include "macro.h"
#include "manager.h"
#include "netns-batch.h"
#include "netns-pool.h"
#include "time-util.h"

/* opts.net: a namespace per child, a few at a time. On failure what was made
 * stays in f->net (net_made[]) for cleanup_unowned(). */
int fork_op_make_namespaces(ForkOp *f) {
        const char *step = NULL;
        uint64_t start = now_usec();
        unsigned failed = 0, pooled, rest;
        long ncpu;
        int r = 0;

        /* What the pool has ready first: those are the fork's as if it had made them. */
        pooled = netns_pool_take(f->manager->netns_pool, f->opts.net_policy, f->net, f->n);
        for (unsigned i = 0; i < pooled; i++) {
                f->net_index[i] = f->net[i].index;
                f->net_made[i] = true;
        }
        f->n_net_picked = pooled;
        rest = f->n - pooled;
        if (rest > 0) {
                r = netns_pick_free(&f->net_prefix, rest, f->net_index + pooled);
                if (r < 0) {
                        free(f->error);
                        if (asprintf(&f->error, "No free network namespace index for %u children in %s (%s)",
                                     rest, NETNS_DEFAULT_PREFIX, strerror(-r)) < 0)
                                f->error = NULL;
                        return r;
                }
                f->n_net_picked = f->n;
                /* No more threads than CPUs: on 2 CPUs, 4 threads made 10 namespaces slower than 2. */
                ncpu = sysconf(_SC_NPROCESSORS_ONLN);
                r = netns_children_create(&f->net_prefix, f->net_index + pooled, rest, f->opts.net_policy,
                                          (unsigned) MIN(MAX(ncpu, 1L), (long) NETNS_BATCH_THREADS_MAX),
                                          f->net + pooled, f->net_made + pooled, &failed, &step);
                failed += pooled;
        }
        for (unsigned i = 0; r >= 0 && i < f->n; i++) {
                f->netns[i] = strdup(f->net[i].name);
                if (!f->netns[i])
                        r = -ENOMEM;
        }
        if (r >= 0) {
                /* Only the owner (and root) may dial the guests from the host. */
                r = netns_children_allow(f->net, f->n, f->opts.owner_uid);
                failed = 0;
                step = "who may dial the guests (nftables chain ip forkd dial)";
        }
        if (r < 0) {
                free(f->error);
                if (asprintf(&f->error, "Failed to create the network namespace of %s (%s%s%s)", f->ids[failed],
                             step ?: "", step ? ": " : "", strerror(-r)) < 0)
                        f->error = NULL;
                return r;
        }
        log_info("Made %u network namespace(s) in %" PRIu64 " ms, %u of them taken from the pool.", f->n,
                 (now_usec() - start) / 1000, pooled);
        return 0;
}
