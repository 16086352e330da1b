/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "manager.h"

extern const sd_bus_vtable manager_vtable[];

/* Register the Manager object, the per-object fallbacks and enumerators. */
int manager_add_bus_objects(Manager *m);

/* Listen on state_dir/bus.sock for direct D-Bus connections (root only; only
 * when forkd itself runs as root). Failure leaves the bus as the only way in. */
int manager_listen_direct(Manager *m);

/* Close every direct connection and the listening socket. */
void manager_close_direct(Manager *m);
