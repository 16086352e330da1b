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

/* Fork's options a{sv} into o; timeout_only (ForkSandboxEx): only timeout_secs,
 * on_timeout, cpu_limit, disk_rate and net_rate are known. */
int parse_fork_options_full(sd_bus_message *message, struct fork_options *o, bool timeout_only,
                            sd_bus_error *error);

/* SetSandboxLimits's a{sv}: cpu_limit (d; 0 removes it), disk_rate and
 * net_rate (a{st}; all zero removes it), memory_limit_mib (u). ret holds the
 * sandbox's limits on entry and gets the new ones; *ret_given says which were
 * given (LIMIT_*). Everything is checked before anything is returned; none
 * given is InvalidArgs. vcpus and the host's support: bus_check_limits(). */
#define LIMIT_CPU 1u
#define LIMIT_DISK_RATE 2u
#define LIMIT_NET_RATE 4u
#define LIMIT_MEMORY 8u
int bus_read_limits(sd_bus_message *message, bool *ret_memory_given, uint32_t *ret_memory_limit_mib,
                    struct sandbox_limits *ret, unsigned *ret_given, sd_bus_error *error);

/* cpu_limit against the snapshot's vcpus, and whether this host can apply the
 * cgroup limits (NotSupported). */
typedef struct Manager Manager;
int bus_check_limits(Manager *m, uint32_t memory_limit_mib, const struct sandbox_limits *l, uint32_t vcpus,
                     sd_bus_error *error);

/* ForkSandbox's u n after the id, and, when the call is ForkSandboxEx, its
 * options a{sv} into o: timeout_secs (u, 1..86400), on_timeout (s, "kill" or
 * "pause"), cpu_limit (d), disk_rate and net_rate (a{st}); anything else is
 * InvalidArgs. */
int bus_read_fork_n(sd_bus_message *message, uint32_t *ret_n, struct fork_options *o, sd_bus_error *error);

/* SetSandboxTimeout's and SetTimeout's (u timeout_secs, s on_timeout): the
 * deadline from now and the action ("" keeps the current one, "kill" without
 * one). */
int bus_read_timeout(sd_bus_message *message, bool current_pause, uint64_t *ret_expires, bool *ret_pause,
                     sd_bus_error *error);
