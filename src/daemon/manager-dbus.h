/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "manager.h"

extern const sd_bus_vtable manager_vtable[];

struct fork_options;
/* ForkSandbox's u n after the id, and, when the call is ForkSandboxEx, its
 * options a{sv} into o: timeout_secs (u, 1..86400) and on_timeout (s, "kill" or
 * "pause"); anything else is InvalidArgs. */
int bus_read_fork_n(sd_bus_message *message, uint32_t *ret_n, struct fork_options *o, sd_bus_error *error);

/* Register the Manager object, the per-object fallbacks and enumerators. */
int manager_add_bus_objects(Manager *m);
/* The same on another connection (a direct one, direct-listener.c). */
int manager_add_bus_objects_to(Manager *m, sd_bus *bus);
