/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The usage of many sandboxes, for one reply that lists them. Each read costs
 * a few microseconds in the kernel (/proc/PID/statm, the process CPU clock),
 * which for a list of 1000 was as much again as writing the reply. A batch of
 * USAGE_BATCH_THREAD_MIN or more is read by a thread of its own, in order,
 * while the caller writes the reply and takes each figure as it needs it; a
 * smaller one (or one whose thread could not start) is read in place.
 *
 * Between usage_batch_start() and usage_batch_done() the reader may call
 * read() on any item: the caller must not touch what read() touches.
 */

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "usage.h"

#define USAGE_BATCH_THREAD_MIN 64

typedef void (*usage_read_fn)(void *item, SandboxUsage *ret);

typedef struct UsageBatch {
        void *const *items;
        size_t n;
        usage_read_fn read;
        SandboxUsage *usage;
        size_t seen; /* the caller's: usage[0..seen) are known read */

        bool threaded;
        pthread_t thread;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        size_t ready; /* under lock: usage[0..ready) are read */
        bool stop;    /* under lock: the caller is done */
} UsageBatch;

/* items must stay valid until usage_batch_done(). -ENOMEM, or 0. */
int usage_batch_start(UsageBatch *b, void *const *items, size_t n, usage_read_fn read);
/* Item i's usage (i < n), once it is read. */
const SandboxUsage *usage_batch_get(UsageBatch *b, size_t i);
/* Stops and joins the reader, frees the figures. Safe on a zeroed batch. */
void usage_batch_done(UsageBatch *b);
