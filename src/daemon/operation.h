/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* A long-running method call (CreateSnapshot, Fork): holds the request
 * message until the reply, and counts against --max-operations. */

#include <errno.h>
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

/* The prelude of every operation a method starts (create, fork, branch,
 * compact, pack, unpack, pause, resume), after polkit agreed: no new one once
 * forkd is stopping, then the operation itself, Busy at --max-operations.
 * Each method checks what is its own (tags, limits) between the two, as before. */
#define OPERATION_SHUTTING_DOWN "forkd is shutting down."

static inline int operation_check_not_exiting(Manager *m, sd_bus_error *error) {
        if (m->exiting)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, OPERATION_SHUTTING_DOWN);
        return 0;
}

/* SnapshotExists "Snapshot <tag> exists already." when tag is registered,
 * being created (create, compact, unpack) or being branched to; else 0. */
int operation_check_tag_free(Manager *m, const char *tag, sd_bus_error *error);

/* operation_new() for a method call: Busy "<N> operations are running; retry
 * later." at the cap, other errors as they are. */
static inline int operation_new_or_busy(Manager *m, sd_bus_message *message, Operation **ret, sd_bus_error *error) {
        int r = operation_new(m, message, ret);

        if (r == -EBUSY)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "%u operations are running; retry later.",
                                         m->max_operations);
        return r;
}
