/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* PackSnapshot and UnpackSnapshot on org.forkd.Manager: a snapshot chain into
 * one bundle on a caller's fd, and back (src/shared/pack.h). Both run in a
 * worker thread as an Operation. */

#include <systemd/sd-bus.h>

#include "manager.h"

int bus_manager_method_pack_snapshot(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_manager_method_unpack_snapshot(sd_bus_message *message, void *userdata, sd_bus_error *error);
