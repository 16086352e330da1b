/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <systemd/sd-bus.h>

#include "manager.h"

extern const sd_bus_vtable sandbox_vtable[];

int sandbox_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata, void **found,
                        sd_bus_error *error);
int sandbox_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error);

/* Polkit and ownership for a verb on s (bus_verify_owner_async()): its owner
 * needs action, anyone else but root org.forkd.manage-all. */
int sandbox_verify(sd_bus_message *message, Sandbox *s, const char *action, const char *verb, sd_bus_error *error);
/* Append a SandboxInfo a{sv}. */
int sandbox_append_info(sd_bus_message *reply, Sandbox *s);
/* An aa{sv} of the SandboxInfos of a fork's children, by the names their VMs were
 * spawned under (vm_id: the id too, until a merge moves another id onto one). */
int sandbox_append_infos(sd_bus_message *reply, Manager *m, char *const *vm_ids, unsigned n);
/* Its expires_at (RFC 3339, "" for none) and on_timeout, two {sv} entries. */
int sandbox_append_deadline(sd_bus_message *reply, uint64_t expires_at, bool pause);

void sandbox_send_new_signal(Sandbox *s);
void sandbox_send_removed_signal(Sandbox *s, const char *reason);
/* SandboxRemoved for an id the sandbox no longer has (a merge's winner). */
void sandbox_send_removed_signal_as(Sandbox *s, const char *id, const char *reason);
void sandbox_send_state_changed(Sandbox *s);

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
/* Resume of a running sandbox (pausing or not): NotPaused. */
int bus_sandbox_method_resume(sd_bus_message *message, void *userdata, sd_bus_error *error);
/* Paused "sandbox <id> is being paused": a verb refused while a pause is in flight. */
int bus_sandbox_error_pausing(const char *id, sd_bus_error *error);
/* sandbox-files.c */
int bus_sandbox_method_write_file(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_read_file(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_expose_port(sd_bus_message *message, void *userdata, sd_bus_error *error);
