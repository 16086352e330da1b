/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <systemd/sd-bus.h>

#include "bus-info.h"
#include "manager.h"

extern const sd_bus_vtable sandbox_vtable[];

int sandbox_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata, void **found,
                        sd_bus_error *error);
int sandbox_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error);

/* Polkit and ownership for a verb on s (bus_verify_owner_async()): its owner
 * needs action, anyone else but root org.forkd.manage-all. */
int sandbox_verify(sd_bus_message *message, Sandbox *s, const char *action, const char *verb, sd_bus_error *error);

/* The object's methods; the Manager's forward here with the looked-up sandbox. */
int bus_sandbox_method_terminate(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_ping(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_exec(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_eval(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_run_code(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_merge(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_diff(sd_bus_message *message, void *userdata, sd_bus_error *error);
/* Branch and the tail of Manager.BranchSandbox (after the id): reads
 * (s tag, s mode, b wait). */
int bus_sandbox_method_branch(sd_bus_message *message, void *userdata, sd_bus_error *error);
/* Fork and the tail of Manager.ForkSandbox(Ex) (after the id): reads (u n)
 * and ForkSandboxEx's options. Answers (aa{sv} sandboxes, t pause_us). */
int bus_sandbox_method_fork(sd_bus_message *message, void *userdata, sd_bus_error *error);
/* PauseSandbox(s id) -> a{sv} and SetSandboxTimeout(s id, u timeout_secs, s on_timeout) -> a{sv}
 * after the id: a running sandbox. */
int bus_sandbox_method_pause(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_set_timeout(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_set_limits(sd_bus_message *message, void *userdata, sd_bus_error *error);
/* Resume of a running sandbox (pausing or not): NotPaused. */
int bus_sandbox_method_resume(sd_bus_message *message, void *userdata, sd_bus_error *error);
/* sandbox-files.c */
int bus_sandbox_method_write_file(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_read_file(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_expose_port(sd_bus_message *message, void *userdata, sd_bus_error *error);
