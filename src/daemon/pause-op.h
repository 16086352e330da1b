/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The operations of paused sandboxes (paused.h holds the record): a pause is
 * a branch of the running sandbox into forkd's snapshot, then the record, then
 * the VM goes; a resume and a fork of a paused sandbox are forks of that
 * snapshot. */

#include <stdbool.h>
#include <systemd/sd-bus.h>

#include "manager.h"
#include "paused.h"

struct fork_options;

/* Pause s (PauseSandbox after its operation_prelude(), or its deadline with message NULL):
 * message, if any, is answered once the VM is gone. error may be NULL. */
int paused_pause(Sandbox *s, sd_bus_message *message, sd_bus_error *error);

/* Resume p (topts NULL: a fork of 1 under its id, with its owner and
 * deadline), or fork it into n (topts: the children's deadline); message is
 * answered once the fork ends. 1 when it started, else an error in error. */
int paused_fork_start(sd_bus_message *message, Paused *p, unsigned n, const struct fork_options *topts,
                      sd_bus_error *error);
