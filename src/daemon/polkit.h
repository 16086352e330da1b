/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Asynchronous polkit checks for D-Bus method handlers.
 *
 * A handler that changes state calls bus_verify_polkit_async() first:
 *
 *     r = bus_verify_polkit_async(m, "org.forkd.fork",
 *                                 (const char *[]) { "snapshot", tag, "verb", "fork", NULL },
 *                                 &manager->polkit_registry, error);
 *     if (r < 0)
 *             return r;       (error is set: AccessDenied, or a failure)
 *     if (r == 0)
 *             return 1;       (asked polkit; the handler runs again when it answers)
 *     ... authorized: do the work ...
 *
 * Mechanism: a sender whose effective uid is 0 is authorized at once. For
 * anyone else, org.freedesktop.PolicyKit1.Authority.CheckAuthorization is
 * called asynchronously on the message's bus (subject "system-bus-name",
 * no interaction) and the request message is remembered in the registry.
 * When polkit answers, the answer is stored and the request message is put
 * back into the bus's read queue (sd_bus_enqueue_for_read()), so the same
 * handler runs again with the same message; this time the stored answer is
 * returned (1 or -EACCES) and the registry entry is dropped.
 *
 * Rules for handlers:
 *  - call it before any state change and before any reply;
 *  - one action per message (a second check on the same message with another
 *    action would start over);
 *  - the handler must be safe to run twice on the same message: everything
 *    it does before the check (argument parsing, validation) is repeated.
 *
 * If polkitd is not on the bus, non-root callers are refused with
 * AccessDenied ("polkit is not available"), never left waiting.
 *
 * On a direct (peer-to-peer) connection there is no bus to ask polkit on:
 * the caller is the socket's peer (SO_PEERCRED, never a sender field the
 * peer wrote), root is allowed, and so is the one trusted bridge uid, if
 * polkit_registry_trust_bridge() named one, for every action but
 * org.forkd.manage-all. Anyone else there is refused.
 */

#include <sys/types.h>

#include <systemd/sd-bus.h>

struct polkit_registry;

/* Never a real owner: a check against it always takes the non-owner path. */
#define OWNER_UID_INVALID ((uid_t) -1)
/* The action a caller needs on what another uid owns. */
#define POLKIT_ACTION_MANAGE_ALL "org.forkd.manage-all"

int bus_verify_polkit_async(sd_bus_message *m, const char *action, const char **details,
                            struct polkit_registry **registry, sd_bus_error *error);

/*
 * Ownership: sandboxes and snapshots record the uid that made them. A caller
 * whose uid is 0 may act on everything (no polkit round trip). The owner
 * needs `action` (NULL: nothing, the call is allowed at once). Anyone else
 * needs org.forkd.manage-all instead, whatever `action` is; a refusal is
 * AccessDenied naming org.forkd.manage-all, `what` ("sandbox sb-1") and the
 * owner. Same contract as bus_verify_polkit_async(): 1 allowed, 0 asked
 * polkit (return 1 from the handler), < 0 refused with error set.
 */
int bus_verify_owner_async(sd_bus_message *m, uid_t owner, const char *what, const char *action,
                           const char **details, struct polkit_registry **registry, sd_bus_error *error);

/* bus_verify_owner_async() for what is asked of a sandbox (kind "sandbox" or
 * "paused sandbox") id, forked from snapshot: details "sandbox" id, "snapshot"
 * snapshot, "verb" verb; a refusal names "<kind> <id>". */
int bus_verify_sandbox_async(sd_bus_message *m, const char *kind, const char *id, const char *snapshot, uid_t owner,
                             const char *action, const char *verb, struct polkit_registry **registry,
                             sd_bus_error *error);

/* The sender's effective uid (cached per bus and unique name, as for the checks). */
int bus_message_sender_uid(sd_bus_message *m, struct polkit_registry **registry, uid_t *ret);

/*
 * Trusts `uid` on direct connections as the REST bridge (see above): its
 * calls there are authorized without asking polkit, as the shipped rules
 * would answer for it on the bus, org.forkd.manage-all excepted. 0 and
 * OWNER_UID_INVALID are refused (-EINVAL). Allocates *registry if needed.
 */
int polkit_registry_trust_bridge(struct polkit_registry **registry, uid_t uid);

/* Cancels the pending queries and frees everything. Accepts NULL, returns NULL. */
struct polkit_registry *polkit_registry_free(struct polkit_registry *registry);

/* Number of queries in the registry (pending or answered but not yet consumed). */
unsigned polkit_registry_size(const struct polkit_registry *registry);
