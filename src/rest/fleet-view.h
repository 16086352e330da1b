/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * A front end's view of the fleet (forkd-rest --fleet-front): a thread reads
 * the node records (FLEET_KEY_PREFIX "nodes/") from etcd every
 * FLEET_VIEW_PERIOD_MS and publishes what it read as one immutable FleetView,
 * which request threads take a reference to and read without a lock. A
 * record that fleet_record_parse() refuses is logged (once per change) and
 * left out. A node that was in the view and is no longer is remembered as
 * lost, with the time it went, so that its sandboxes answer 410; it is also
 * written to etcd (FLEET_KEY_PREFIX "lost/<name>", kept a day), where front
 * ends that start later read it.
 */

#include <stdbool.h>
#include <stdint.h>

#include "fleet-etcd.h"
#include "fleet-record.h"

#define FLEET_VIEW_PERIOD_MS 250u
#define FLEET_VIEW_NODES_MAX 1024u
#define FLEET_VIEW_LOST_MAX 1024u

typedef struct FleetView {
        unsigned refs;           /* under the watcher's lock */
        FleetRecord *nodes;      /* sorted by name */
        size_t n_nodes;
        uint64_t read_usec;      /* CLOCK_MONOTONIC of the read it holds */
} FleetView;

typedef struct FleetWatcher FleetWatcher;

/* The first read happens before this returns (its failure is logged, not fatal). */
int fleet_watcher_start(const char *etcd, const EtcdOptions *opts, FleetWatcher **ret);
FleetWatcher *fleet_watcher_stop(FleetWatcher *w);

/* The newest view, with a reference (never NULL once started). */
FleetView *fleet_view_get(FleetWatcher *w);
void fleet_view_put(FleetWatcher *w, FleetView *v);

/* The node named, or NULL. */
const FleetRecord *fleet_view_node(const FleetView *v, const char *name);

/* Whether the last read of etcd succeeded, and how long ago (usec) the view's read was. */
bool fleet_watcher_etcd_ok(FleetWatcher *w, uint64_t *ret_age_usec, char *ret_error, size_t error_size);

/* When the node named left the view (CLOCK_REALTIME seconds), or 0 when it is not known lost. */
uint64_t fleet_watcher_lost_at(FleetWatcher *w, const char *name);
/* The nodes that left the view, and the records refused, since the start. */
void fleet_watcher_counts(FleetWatcher *w, uint64_t *ret_lost, uint64_t *ret_refused);
