/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Snapshot chains in the daemon: deleting a snapshot that other snapshots
 * chain on (refused, cascade or force), refusing to fork an orphaned link,
 * and compacting a chain head into a flat snapshot.
 *
 * Compact runs `forkd-vmm compact` in a worker thread: it loads the head with
 * its chain (every parent_content_hash checked), writes the whole memory
 * (sparse where zero), the vmstate and the merged disk into
 * snapshots_dir/.compact-staging-<to>/, and renames it to snapshots_dir/<to>.
 * forkd removes stale .compact-staging-* directories when it starts.
 */

#include <stdbool.h>
#include <systemd/sd-bus.h>

#include "manager.h"

/* DeleteSnapshot/Delete of i once polkit agreed: refuses a snapshot with
 * dependents (HasDependents, naming them all) unless cascade (the whole
 * subtree, children first) or force (i alone, its children orphaned). */
int chain_delete(Image *i, bool cascade, bool force, sd_bus_message *message, sd_bus_error *error);

/* Before a fork of i: ChainBroken when an ancestor is no longer registered. */
int chain_check_restorable(Manager *m, Image *i, sd_bus_error *error);

/* CompactSnapshot(s tag, s to) -> a{sv} after its operation_prelude(): compact tag into
 * to; message is answered with to's info once it is registered. */
int chain_compact_start(Manager *m, sd_bus_message *message, const char *tag, const char *to,
                        sd_bus_error *error);

