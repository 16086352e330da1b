/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "manager.h"

extern const sd_bus_vtable manager_vtable[];

/* Register the Manager object, the per-object fallbacks and enumerators. */
int manager_add_bus_objects(Manager *m);

/* Take the socket systemd passed (units/forkd.socket) as the direct socket:
 * call before anything is spawned, as it makes the passed fds O_CLOEXEC. Any
 * other passed fd is closed with a warning. */
int manager_take_activated_direct(Manager *m);

/* Listen on the passed socket, or else on state_dir/bus.sock for direct D-Bus connections (root only; only
 * when forkd itself runs as root). Failure leaves the bus as the only way in. */
int manager_listen_direct(Manager *m);

/* Close every direct connection and the listening socket. */
void manager_close_direct(Manager *m);
