/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Making the namespaces of a whole fork at once: netns_child_create() for
 * many indices, a few threads side by side (each one mostly waits for the
 * kernel). Blocking: for worker threads and tools, never the event loop. */

#include "netns.h"

/* Threads netns_children_create() uses at most. */
#define NETNS_BATCH_THREADS_MAX 4u

/* How often one position tries another index when its namespace exists
 * already (another forkd, or tools/netns-setup, made it since the pick). */
#define NETNS_BATCH_EEXIST_RETRIES 8u

/* Creates the namespaces of indices[0..n) with policy into ret[0..n),
 * threads at a time (1..NETNS_BATCH_THREADS_MAX; fewer when a thread cannot
 * be started). ret_made[i] says which exist afterwards: on failure the others
 * stop being started, what was made stays (for the caller to destroy), and
 * *ret_failed (the position in indices) and *ret_failed_step say what failed
 * first. A position whose namespace exists already gets another free index
 * (netns_pick_free(); the old one is released) and tries again, at most
 * NETNS_BATCH_EEXIST_RETRIES times: indices[] then says which it has.
 * Returns the first failure's errno or 0. */
int netns_children_create(const NetnsPrefix *prefix, unsigned *indices, unsigned n, NetnsPolicy policy,
                          unsigned threads, NetnsChild *ret, bool *ret_made, unsigned *ret_failed,
                          const char **ret_failed_step);
