/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <systemd/sd-bus.h>

#include "bus-info.h"
#include "manager.h"

extern const sd_bus_vtable image_vtable[];

int image_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata, void **found,
                      sd_bus_error *error);
int image_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error);

/* A snapshot tag a caller names (what: "snapshot tag", "target tag"): valid
 * and not one of forkd's own (paused.h); else InvalidArgs into error. */
int bus_check_tag(const char *tag, const char *what, sd_bus_error *error);

/* Polkit and ownership for a verb on snapshot i, owned by owner (image_owner(i),
 * or a subtree's common owner): see bus_verify_owner_async(). */
int image_verify(sd_bus_message *message, Image *i, uid_t owner, const char *action, const char *verb,
                 sd_bus_error *error);
/* The owner of i and every snapshot below it when they all have the same one,
 * else OWNER_UID_INVALID. */
uid_t image_subtree_owner(Image *i);

int bus_image_method_delete(sd_bus_message *message, void *userdata, sd_bus_error *error);
