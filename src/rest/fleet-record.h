/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * A fleet node's record (fleet-node.h writes it) as the rest of the fleet reads
 * it back from etcd: hostile input, checked whole before anything follows it.
 * fleet_record_parse() refuses, with the reason, a record that is not strict
 * JSON of at most FLEET_RECORD_MAX bytes, whose name is not its key's, whose
 * URL is not one http(s)://HOST:PORT, whose capacity is out of range, or whose
 * snapshot list is malformed, too long or names a tag twice. Keys it does not
 * know are ignored (a newer node's).
 *
 * fleet_place() is the placement of a fork: n children of a snapshot over the
 * nodes, by where its chain already is.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fleet-etcd.h"
#include "fleet-node.h"
#include "snapshot-meta.h"

#define FLEET_RECORD_MAX (1u << 20)
#define FLEET_CORES_MAX 65536u
#define FLEET_SANDBOXES_MAX 4096u

typedef struct FleetSnapshot {
        char tag[SNAPSHOT_TAG_MAX + 1];
        char parent[SNAPSHOT_TAG_MAX + 1];                /* "": a base */
        char parent_content_hash[SNAPSHOT_HASH_LEN + 1]; /* "": none known */
        uint32_t vcpus;
        uint64_t mem_size;
} FleetSnapshot;

typedef struct FleetRecord {
        char name[FLEET_NODE_NAME_MAX + 1];
        char url[ETCD_URL_MAX + 1];
        bool ready;
        uint32_t cores;
        uint64_t memory_available_kib;
        uint32_t sandboxes_running, sandboxes_max;
        FleetSnapshot *snapshots; /* sorted by tag */
        size_t n_snapshots;
        uint64_t updated_unix;
} FleetRecord;

/* key: the record's etcd key (FLEET_KEY_PREFIX "nodes/" NAME). On failure
 * *ret is untouched and *ret_why says why. */
int fleet_record_parse(const char *key, const char *text, size_t len, FleetRecord *ret, const char **ret_why);
void fleet_record_done(FleetRecord *r);

/* The snapshot tag on the node, or NULL (a binary search). */
const FleetSnapshot *fleet_record_snapshot(const FleetRecord *r, const char *tag);

/* Whether node holds every link of tag's chain as source has it: the same
 * tags, each link with the same parent_content_hash. */
bool fleet_holds_chain(const FleetRecord *node, const FleetRecord *source, const char *tag);

/* How many more sandboxes the node takes now (0 when not ready). */
uint32_t fleet_room(const FleetRecord *r);

typedef struct FleetPlacement {
        size_t node;    /* index into nodes */
        uint32_t n;     /* children there */
        bool fetch;     /* the node lacks links of the chain: it fetches them from source first */
        size_t source;  /* with fetch: a node that holds the chain */
} FleetPlacement;

/* n children of tag over nodes[0..n_nodes): first the nodes that hold its whole
 * chain, most room first; then, for what is left, the least loaded of the others
 * with room, each fetching the chain from the holder with the most room (the
 * source, whose chain is the one placed). A node that has part of the chain,
 * or a tag of it with other content, takes none: a fetch ships the whole
 * chain, which its unpack would refuse. At most n_nodes entries in
 * ret. -ENOENT: no ready node holds tag's whole chain; -ENOSPC: the fleet has no room for n
 * (nothing is placed). */
int fleet_place(const FleetRecord *nodes, size_t n_nodes, const char *tag, uint32_t n, FleetPlacement *ret,
                size_t *ret_n);
