/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * A fleet node's record in etcd (forkd-rest --fleet-etcd): a thread of its own
 * keeps the key <prefix>nodes/<name> under a lease of ttl seconds and rewrites
 * the record when what it says changes (checked every second); a second
 * thread keeps the lease alive every third of its TTL, so that a forkd slow to
 * answer never holds a keep-alive back. The record is one JSON object:
 *
 *   {"format": 1, "name": NAME, "url": the advertised REST URL,
 *    "ready": whether forkd answered the last look,
 *    "capacity": {"cores", "memory_available_kib", "sandboxes_running",
 *                 "sandboxes_max"},
 *    "snapshots": [{"tag", "parent": tag or null,
 *                   "parent_content_hash": hex or null, "vcpus", "mem_size"}],
 *    "updated_unix": seconds}
 *
 * What forkd says is read over a D-Bus connection of the thread's own. A
 * lease etcd lost (this node was cut off longer than its TTL) is replaced by a
 * new one and the record written again. At a clean stop the lease is revoked:
 * the record goes at once; a node that dies drops out when its lease ends.
 */

#include <stdbool.h>

#include "fleet-etcd.h"

#define FLEET_NODE_NAME_MAX 63u
#define FLEET_TTL_DEFAULT 5u
#define FLEET_TTL_MIN 2u
#define FLEET_TTL_MAX 60u
#define FLEET_SNAPSHOTS_MAX 4096u
#define FLEET_KEY_PREFIX "/forkd/"

typedef struct FleetNode FleetNode;

typedef struct FleetNodeConfig {
        const char *etcd;        /* endpoints, as etcd_client_new() takes them */
        EtcdOptions etcd_opts;
        const char *name;        /* fleet_node_name_is_valid() */
        const char *advertise;   /* http(s)://HOST:PORT: where front ends reach this node's REST API */
        unsigned ttl_secs;       /* FLEET_TTL_MIN..FLEET_TTL_MAX */
        unsigned sandboxes_max;  /* the most sandboxes this node takes */
        const char *bus_address; /* forkd's bus; NULL: the system bus */
} FleetNodeConfig;

/* 1..63 of [A-Za-z0-9._-], not starting with '.' or '-'. */
bool fleet_node_name_is_valid(const char *name);

/* Checks the configuration (-EINVAL, logged), then starts the thread. */
int fleet_node_start(const FleetNodeConfig *cfg, FleetNode **ret);
/* Stops the thread, revoking the lease first (at most a second or two). */
FleetNode *fleet_node_stop(FleetNode *n);
