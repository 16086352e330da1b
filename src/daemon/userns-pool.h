/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * User namespaces of confined VMMs made ahead of time (vmm-userns.c), each for
 * one id of --vmm-uid-range, so that a fork takes them instead of making one per
 * child while its caller waits. The pool holds its ids as used in the range; a
 * fork that finds the range full drains the pool and tries again. It is filled
 * in a worker thread once a fork's children are up, for the next fork.
 */

#include <stdbool.h>
#include <sys/types.h>

typedef struct Manager Manager;
struct userns_fill;

/* How many the pool keeps ready: at most a quarter of the range's ids. */
#define USERNS_POOL_SIZE 128u

typedef struct UsernsPool {
        unsigned size;  /* what it keeps ready; 0: no pool */
        unsigned n;     /* ready: ids[0..n) with their namespaces fds[0..n) */
        uid_t *ids;
        int *fds;
        struct userns_fill *filling; /* the fill job in a worker, or NULL */
} UsernsPool;

/* Sizes the pool for m's uid range (none without one). */
int userns_pool_init(Manager *m);
/* Closes the namespaces and gives their ids back; a fill still running in a
 * worker is freed here once the workers are gone (manager_free()). */
void userns_pool_done(Manager *m);
/* One ready namespace and its id, which the caller now holds in the range:
 * -ENOENT when none is ready. */
int userns_pool_take(Manager *m, uid_t *ret_id, int *ret_fd);
/* Gives every ready id back to the range (a fork found it full). */
void userns_pool_drain(Manager *m);
/* Starts a fill in a worker, when none runs, up to ready namespaces (at most
 * the pool's size): a fork of N children asks for N after it, so a forkd that
 * forks one at a time keeps one ready, and one that forks a hundred at once a
 * hundred. */
void userns_pool_fill(Manager *m, unsigned ready);
