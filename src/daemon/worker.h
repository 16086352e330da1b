/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * A fixed pool of worker threads for the blocking parts of long operations
 * (booting a VM, starting a template, spawning children, fsyncing records).
 *
 * The threads live as long as the pool. That matters: forkd-vmm processes
 * are started with PR_SET_PDEATHSIG, which fires when the *thread* that forked
 * them exits, so a VMM started from a short-lived thread would be killed when
 * that thread ends. Jobs run fn() in a worker; done() then runs in the event
 * loop thread with fn()'s return value.
 */

#include <systemd/sd-event.h>

typedef struct WorkerPool WorkerPool;
typedef int (*worker_fn_t)(void *userdata);
typedef void (*worker_done_t)(int r, void *userdata);

int worker_pool_new(sd_event *e, unsigned n_threads, WorkerPool **ret);
/* Waits for running jobs, drops queued ones (their done() is not called).
 * Accepts NULL, returns NULL. */
WorkerPool *worker_pool_free(WorkerPool *p);
int worker_pool_submit(WorkerPool *p, worker_fn_t fn, worker_done_t done, void *userdata);
/* Jobs queued or running, or finished and not yet handed to done(). */
unsigned worker_pool_pending(const WorkerPool *p);
