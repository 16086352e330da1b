/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* PushSnapshot and PullSnapshot on org.forkd.Manager: a snapshot chain to an
 * OCI registry as one artifact manifest per link (src/shared/snapshot-artifact.h),
 * and back. Both run in a worker thread as an Operation; the registries are the
 * admin's (forkd --registry-config, src/oci/registry.h). */

#include <systemd/sd-bus.h>

#include "manager.h"

#define REGISTRY_CONFIG_DEFAULT "/etc/forkd/registries.json"

/* Load path into m (at start). A missing default file leaves no registry
 * configured; any other failure is returned, with a message logged. */
int manager_load_registries(Manager *m, const char *path, bool explicit_path);
void manager_free_registries(Manager *m);

/* After their operation_prelude(); message is answered when the operation ends.
 * InvalidArgs, at once, for a reference that does not parse or names a registry
 * not configured. */
int push_snapshot_start(Manager *m, sd_bus_message *message, const char *tag, const char *ref, sd_bus_error *error);
int pull_snapshot_start(Manager *m, sd_bus_message *message, const char *ref, const char *new_tag,
                        sd_bus_error *error);
