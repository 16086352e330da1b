/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <systemd/sd-bus.h>

#include "manager.h"

extern const sd_bus_vtable image_vtable[];

int image_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata, void **found,
                      sd_bus_error *error);
int image_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error);

/* SnapshotInfo, or SnapshotDetails with details. */
int image_append_info(sd_bus_message *reply, Image *i, bool details);
/* The same entries, into a dictionary the caller has opened (and adds to). */
int image_append_info_fields(sd_bus_message *reply, Image *i, bool details);

void image_send_signal(Manager *m, const char *tag, bool new);

int bus_image_method_delete(sd_bus_message *message, void *userdata, sd_bus_error *error);
