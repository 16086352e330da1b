/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* What the operations and the bus faces both send: the SnapshotInfo and
 * SandboxInfo dictionaries, the signals of snapshots and sandboxes, and the
 * Paused error of a pause in flight. Below both: an operation answers its
 * call with these and includes no bus face (image-dbus.h, sandbox-dbus.h,
 * paused-dbus.h, which include this). */

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

#include "manager.h"
#include "paused.h"
#include "usage.h"

/* SnapshotInfo, or SnapshotDetails with details. */
int image_append_info(sd_bus_message *reply, Image *i, bool details);
/* The same entries, into a dictionary the caller has opened (and adds to). */
int image_append_info_fields(sd_bus_message *reply, Image *i, bool details);
/* SnapshotNew (new) or SnapshotRemoved; none for forkd's own snapshots. */
void image_send_signal(Manager *m, const char *tag, bool new);

/* Append a SandboxInfo a{sv}, with its "usage". */
int sandbox_append_info(sd_bus_message *reply, Sandbox *s);
/* The same, with usage as its "usage" (read by the caller), or none for NULL. */
int sandbox_append_info_ex(sd_bus_message *reply, Sandbox *s, const SandboxUsage *usage);
/* An aa{sv} of the SandboxInfos of a fork's children, by the names their VMs were
 * spawned under (vm_id: the id too, until a merge moves another id onto one). */
int sandbox_append_infos(sd_bus_message *reply, Manager *m, char *const *vm_ids, unsigned n);
/* Its expires_at (RFC 3339, "" for none) and on_timeout, two {sv} entries. */
/* cpu_limit, disk_rate and net_rate, where set. */
int sandbox_append_limits(sd_bus_message *reply, const struct sandbox_limits *l);
int sandbox_append_deadline(sd_bus_message *reply, uint64_t expires_at, bool pause);

void sandbox_send_new_signal(Sandbox *s);
void sandbox_send_removed_signal(Sandbox *s, const char *reason);
/* SandboxRemoved for an id the sandbox no longer has (a merge's winner). */
void sandbox_send_removed_signal_as(Sandbox *s, const char *id, const char *reason);
void sandbox_send_state_changed(Sandbox *s);

/* Paused "sandbox <id> is being paused": a verb refused while a pause is in flight. */
int bus_sandbox_error_pausing(const char *id, sd_bus_error *error);

/* A SandboxInfo a{sv} of a paused sandbox ("state" and "status" "paused"). */
int paused_append_info(sd_bus_message *reply, Paused *p);
/* A method return to call with the SandboxInfo of p, or of s when p is NULL. */
int bus_sandbox_info_reply(sd_bus_message *call, Paused *p, Sandbox *s, sd_bus_message **ret);
