/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "manager.h"

extern const sd_bus_vtable manager_vtable[];

/* Register the Manager object, the per-object fallbacks and enumerators. */
int manager_add_bus_objects(Manager *m);
/* The same on another connection (a direct one, direct-listener.c). */
int manager_add_bus_objects_to(Manager *m, sd_bus *bus);

/* The snapshot tag, with NoSuchSnapshot (or InvalidArgs) into error. */
int bus_manager_get_image(Manager *m, const char *tag, Image **ret, sd_bus_error *error);

/* manager-dbus-sandboxes.c:
 *   Fork(s snapshot_tag, u n, a{sv} options) -> aa{sv} sandboxes
 *   TerminateSandboxes(as ids) -> as unknown */
int bus_manager_method_create_snapshot(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_manager_method_create_snapshot_from_fds(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_manager_method_create_snapshot_from_image(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_manager_method_create_snapshot_from_image_ref(sd_bus_message *message, void *userdata,
                                                      sd_bus_error *error);

int bus_manager_method_fork(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_manager_method_terminate_sandboxes(sd_bus_message *message, void *userdata, sd_bus_error *error);
