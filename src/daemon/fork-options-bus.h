/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The daemon's side of fork options (src/shared/fork-options.h holds the
 * checks and their words): Fork's a{sv}, ForkSandbox(Ex)'s n and options, and
 * SetTimeout's deadline, read from D-Bus messages; and the network a fork of
 * a snapshot gets (fork_options_resolve_network(), declared in fork-op.h). */

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

#include "fork-options.h"

struct fork_options; /* fork-op.h */

/* Fork's options a{sv} into o; timeout_only (ForkSandboxEx): only timeout_secs
 * and on_timeout are known. */
int parse_fork_options_full(sd_bus_message *message, struct fork_options *o, bool timeout_only,
                            sd_bus_error *error);

/* ForkSandbox's u n after the id, and, when the call is ForkSandboxEx, its
 * options a{sv} into o: timeout_secs (u, 1..86400) and on_timeout (s, "kill" or
 * "pause"); anything else is InvalidArgs. */
int bus_read_fork_n(sd_bus_message *message, uint32_t *ret_n, struct fork_options *o, sd_bus_error *error);

/* SetSandboxTimeout's and SetTimeout's (u timeout_secs, s on_timeout): the
 * deadline from now and the action ("" keeps the current one, "kill" without
 * one). */
int bus_read_timeout(sd_bus_message *message, bool current_pause, uint64_t *ret_expires, bool *ret_pause,
                     sd_bus_error *error);
