/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The rw volumes of snapshots: one running sandbox at a time writes one. */

#include <systemd/sd-bus.h>

#include "image.h"
#include "manager.h"
#include "sandbox.h"

/* Whether a fork of n sandboxes of i may start: a snapshot with an rw volume
 * forks one sandbox at a time, and not while a running (or starting) sandbox
 * of any snapshot with the same file (device and inode) holds it; paused and
 * ended sandboxes hold nothing. Sets org.forkd.Error.VolumeBusy naming the
 * file and its holder. */
int volumes_check_fork(Manager *m, Image *i, unsigned n, sd_bus_error *error);

/* Whether the running sandbox s may be forked: not while it holds an rw volume
 * (its children would be second holders). VolumeBusy naming the file and s. */
int volumes_check_running_fork(Manager *m, Sandbox *s, sd_bus_error *error);

/* The fds of the rw volumes of the snapshot in dir, in order, for its template:
 * each host_path opened (O_NOFOLLOW, read-write) only if it is still the file
 * snapshot.json recorded (device, inode) and owned by the snapshot's owner or
 * root. -ESTALE (or the open's error) with *ret_error naming the path. */
int volumes_open_rw(const char *dir, int *fds, unsigned *ret_n, char **ret_error);
