/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* A long-running method call (CreateSnapshot, Fork): holds the request
 * message until the reply, and counts against --max-operations. */

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

/* The models' hooks (ManagerHooks, manager.h): branches, forks and pauses. */
extern const ManagerHooks operation_hooks;
