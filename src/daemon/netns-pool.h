/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Namespaces made ahead of time (forkd --netns-pool N): making a child's
 * namespace costs about 3 ms (rtnetlink, nftables, a thread in the
 * namespace), which a fork of 100 would otherwise pay in its critical path.
 *
 * Per policy, a pool keeps up to N namespaces ready, each exactly what
 * netns_child_create() makes (tap fd open, forkd's mark, index reserved).
 * A policy's pool is filled only once a fork asked for that policy: a forkd
 * whose callers never fork with a NIC makes none. One background thread of
 * its own, at a low priority, refills it after every take; a take never
 * waits for it. A taken namespace belongs to the fork as if the fork had made
 * it (destroyed with its sandbox, never given back: a used namespace is not
 * reused). netns_pool_free() destroys what is still pooled; a killed forkd's
 * are leftovers for the next start's netns_cleanup_leftovers(). */

#include "netns.h"

/* The most namespaces per policy --netns-pool takes. */
#define NETNS_POOL_MAX 1000u

typedef struct NetnsPool NetnsPool;

/* size 1..NETNS_POOL_MAX per policy; starts the refill thread, idle until a
 * first take. */
int netns_pool_new(const NetnsPrefix *prefix, unsigned size, NetnsPool **ret);
/* Stops the thread (it finishes the namespace it is making) and destroys
 * every pooled namespace. */
NetnsPool *netns_pool_free(NetnsPool *p);

/* Moves up to n ready namespaces of policy into out[0..k) and returns k; out
 * is then the caller's (netns_child_done(), netns_child_destroy(),
 * netns_release()). Marks the policy as wanted and wakes the refill.
 * Thread-safe. */
unsigned netns_pool_take(NetnsPool *p, NetnsPolicy policy, NetnsChild *out, unsigned n);

/* How many namespaces of policy are ready now; *ret_wanted whether a fork
 * asked for that policy yet (only then is it filled). Thread-safe. */
unsigned netns_pool_ready(NetnsPool *p, NetnsPolicy policy, bool *ret_wanted);
unsigned netns_pool_size(const NetnsPool *p);
