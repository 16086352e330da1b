/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The D-Bus face of paused sandboxes: their SandboxInfo, their polkit check,
 * and the methods that take one. */

#include <systemd/sd-bus.h>

#include "bus-info.h"
#include "manager.h"
#include "paused.h"

/* Polkit and ownership for verb on p, as sandbox_verify(). */
int paused_verify(sd_bus_message *message, Paused *p, const char *action, const char *verb, sd_bus_error *error);

/* Methods on a paused sandbox (userdata a Paused); the Manager's forward here
 * after the id was looked up:
 *   ResumeSandbox(s id) -> a{sv}, TerminateSandbox(s id),
 *   ForkSandbox(s id, u n) -> (aa{sv}, t),
 *   SetSandboxTimeout(s id, u timeout_secs, s on_timeout) -> a{sv} */
int bus_paused_method_resume(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_paused_method_terminate(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_paused_method_fork(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_paused_method_set_timeout(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_paused_method_set_limits(sd_bus_message *message, void *userdata, sd_bus_error *error);

/* A paused sandbox's object: org.forkd.PausedSandbox at its sandbox path
 * (FORKD_SANDBOX_PREFIX), while no running sandbox of its id is on the bus:
 * Resume() -> a{sv}, SetTimeout(u timeout_secs, s on_timeout) -> a{sv},
 * Terminate(), Fork(u n) -> (aa{sv}, t); properties Id, SnapshotTag, State
 * ("paused") and OwnerUID. */
extern const sd_bus_vtable paused_vtable[];
int paused_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata, void **found,
                       sd_bus_error *error);
int paused_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error);
