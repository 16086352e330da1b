/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* A long-running method call (CreateSnapshot, Fork): holds the request
 * message until the reply, and counts against --max-operations. */

#include <errno.h>
#include <stdbool.h>
#include <sys/types.h>

#include <systemd/sd-bus.h>

#include "manager.h"

struct ImageCreate;

struct Operation {
        Manager *manager;
        sd_bus_message *message;
        uid_t owner_uid;            /* the caller's uid: it owns what the operation makes */
        char *tag;                  /* CreateSnapshot: its entry in manager->creating */
        struct ImageCreate *create;
        ForkOp *fork;
        /* Anything else the operation owns (ForkSandbox's state), freed with it. */
        void *extra;
        void (*free_extra)(void *extra);
        Operation *next, *prev;
};

/* -EBUSY when max_operations run already. Asks the bus for the caller's uid
 * (cached) unless message is NULL (owner root). */
int operation_new(Manager *m, sd_bus_message *message, Operation **ret);
/* Accepts NULL, returns NULL. */
Operation *operation_free(Operation *o);

/* The prelude of every operation a method starts (create, fork, branch, compact,
 * pack, unpack, pause, resume), in this order:
 *   1. polkit: `action` with the details "snapshot" and "verb"; for what a
 *      sandbox starts (`kind` set), the owner's check (bus_verify_sandbox_async); with
 *      timeout_pause, org.forkd.pause as well, verb "timeout" (on_timeout "pause"
 *      is a pause asked for ahead of time);
 *   2. no new operation once forkd is stopping;
 *   3. `tag`, when set, is free (no snapshot, no create, no branch to it).
 * Returns 1 to go on, 0 when polkit was asked (the method returns 1 and runs again
 * once it answers), < 0 with error set. What is the method's own (limits, files)
 * comes after it, then operation_begin() and operation_submit(). */
#define OPERATION_SHUTTING_DOWN "forkd is shutting down."

typedef struct OperationPrelude {
        const char *action;
        const char *verb;
        const char *snapshot;   /* the "snapshot" detail */
        const char *kind;       /* NULL: polkit alone; "sandbox" or "paused sandbox": */
        const char *id;         /* its id, the "sandbox" detail, */
        uid_t owner;            /* and its owner (bus_verify_sandbox_async) */
        bool timeout_pause;
        const char *tag;
} OperationPrelude;

int operation_prelude(Manager *m, sd_bus_message *message, const OperationPrelude *p, sd_bus_error *error);

static inline int operation_check_not_exiting(Manager *m, sd_bus_error *error) {
        if (m->exiting)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, OPERATION_SHUTTING_DOWN);
        return 0;
}

/* SnapshotExists "Snapshot <tag> exists already." when tag is registered,
 * being created (create, compact, unpack) or being branched to; else 0. */
int operation_check_tag_free(Manager *m, const char *tag, sd_bus_error *error);

/* The operation itself: Busy "<N> operations are running; retry later." at
 * --max-operations. With claim, the operation holds that tag (in
 * manager->creating) until it is freed. */
int operation_begin(Manager *m, sd_bus_message *message, const char *claim, Operation **ret, sd_bus_error *error);

/* Hands o to a worker thread: work runs there, done on the event loop. Frees o
 * when it cannot. Returns 1 (the method answers later) or < 0. */
int operation_submit(Operation *o, int (*work)(void *o), void (*done)(int r, void *o));
