/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Direct (peer-to-peer) D-Bus connections from root and the trusted REST
 * bridge on state_dir/bus.sock or forkd.socket's socket, serving the same
 * objects as the bus (manager_add_bus_objects_to()). */

#include "manager.h"

/* Take the socket systemd passed (units/forkd.socket) as the direct socket:
 * call before anything is spawned, as it makes the passed fds O_CLOEXEC. Any
 * other passed fd is closed with a warning. */
int manager_take_activated_direct(Manager *m);

/* Trust uid, the REST bridge's user (forkd --trusted-bridge-user), on direct
 * connections: admitted, and authorized without polkit for all but
 * org.forkd.manage-all. Call before manager_listen_direct(). -EINVAL for 0
 * or OWNER_UID_INVALID, -EEXIST for the VMM user. */
int manager_trust_bridge(Manager *m, uid_t uid);

/* Listen on the passed socket, or else on state_dir/bus.sock for direct D-Bus connections (root and the
 * trusted bridge, which then owns the file; only when forkd itself runs as root). Failure leaves the bus as
 * the only way in. */
int manager_listen_direct(Manager *m);

/* Close every direct connection and the listening socket. */
void manager_close_direct(Manager *m);
