/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "manager.h"

extern const sd_bus_vtable manager_vtable[];

/* Register the Manager object, the per-object fallbacks and enumerators. */
int manager_add_bus_objects(Manager *m);
/* The same on another connection (a direct one, direct-listener.c). */
int manager_add_bus_objects_to(Manager *m, sd_bus *bus);
