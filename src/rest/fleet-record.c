/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Node records read back, and the placement of a fork (fleet-record.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fleet-record.h"
#include "json-util.h"
#include "macro.h"

#define RECORD_DEPTH_MAX 4
#define MEM_SIZE_MAX (3ull << 30)
#define MEMORY_KIB_MAX (1ull << 40) /* 1 EiB */
#define CHAIN_LINKS_MAX 64u         /* forkd-vmm's CHAIN_DEPTH_MAX */

typedef struct Top {
        int format;
        char name[FLEET_NODE_NAME_MAX + 1];
        char url[ETCD_URL_MAX + 1];
        bool ready;
        struct json_object *capacity, *snapshots;
        uint64_t updated_unix;
} Top;

typedef struct Capacity {
        uint32_t cores;
        uint64_t memory_available_kib;
        uint32_t sandboxes_running, sandboxes_max;
} Capacity;

static const struct json_dispatch top_table[] = {
        { "format", JSON_KIND_INT, NULL, offsetof(Top, format), 0, JSON_MANDATORY },
        { "name", JSON_KIND_STRING, NULL, offsetof(Top, name), JSON_FIELD_SIZE(Top, name), JSON_MANDATORY },
        { "url", JSON_KIND_STRING, NULL, offsetof(Top, url), JSON_FIELD_SIZE(Top, url), JSON_MANDATORY },
        { "ready", JSON_KIND_BOOL, NULL, offsetof(Top, ready), 0, JSON_MANDATORY },
        { "capacity", JSON_KIND_OBJECT, NULL, offsetof(Top, capacity), 0, JSON_MANDATORY },
        { "snapshots", JSON_KIND_ARRAY, NULL, offsetof(Top, snapshots), 0, JSON_MANDATORY },
        { "updated_unix", JSON_KIND_UINT64, NULL, offsetof(Top, updated_unix), 0, 0 },
        {}
};

static const struct json_dispatch capacity_table[] = {
        { "cores", JSON_KIND_UINT32, NULL, offsetof(Capacity, cores), 0, JSON_MANDATORY },
        { "memory_available_kib", JSON_KIND_UINT64, NULL, offsetof(Capacity, memory_available_kib), 0,
          JSON_MANDATORY },
        { "sandboxes_running", JSON_KIND_UINT32, NULL, offsetof(Capacity, sandboxes_running), 0, JSON_MANDATORY },
        { "sandboxes_max", JSON_KIND_UINT32, NULL, offsetof(Capacity, sandboxes_max), 0, JSON_MANDATORY },
        {}
};

static const struct json_dispatch snapshot_table[] = {
        { "tag", JSON_KIND_STRING, NULL, offsetof(FleetSnapshot, tag), JSON_FIELD_SIZE(FleetSnapshot, tag),
          JSON_MANDATORY },
        { "parent", JSON_KIND_STRING, NULL, offsetof(FleetSnapshot, parent), JSON_FIELD_SIZE(FleetSnapshot, parent),
          JSON_NULLABLE },
        { "parent_content_hash", JSON_KIND_STRING, NULL, offsetof(FleetSnapshot, parent_content_hash),
          JSON_FIELD_SIZE(FleetSnapshot, parent_content_hash), JSON_NULLABLE },
        { "vcpus", JSON_KIND_UINT32, NULL, offsetof(FleetSnapshot, vcpus), 0, JSON_MANDATORY },
        { "mem_size", JSON_KIND_UINT64, NULL, offsetof(FleetSnapshot, mem_size), 0, JSON_MANDATORY },
        {}
};

void fleet_record_done(FleetRecord *r) {
        if (!r)
                return;
        free(r->snapshots);
        r->snapshots = NULL;
        r->n_snapshots = 0;
}

static int snapshot_cmp(const void *a, const void *b) {
        return strcmp(((const FleetSnapshot *) a)->tag, ((const FleetSnapshot *) b)->tag);
}

static int parse_snapshots(struct json_object *array, FleetRecord *r, const char **ret_why) {
        size_t n = json_object_array_length(array);

        if (n > FLEET_SNAPSHOTS_MAX)
                return *ret_why = "more than 4096 snapshots", -E2BIG;
        r->snapshots = calloc(MAX(n, 1u), sizeof(FleetSnapshot));
        if (!r->snapshots)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                FleetSnapshot *s = &r->snapshots[i];
                const char *field = NULL;

                if (json_dispatch(json_object_array_get_idx(array, i), snapshot_table, 0, s, &field) < 0)
                        return *ret_why = "a snapshot entry is malformed", -EBADMSG;
                if (!snapshot_tag_is_valid(s->tag) || (s->parent[0] && !snapshot_tag_is_valid(s->parent)))
                        return *ret_why = "a snapshot's tag or parent is not a tag", -EBADMSG;
                if (s->parent_content_hash[0] && !snapshot_content_hash_is_valid(s->parent_content_hash))
                        return *ret_why = "a snapshot's parent_content_hash is not 64 lowercase hex digits",
                               -EBADMSG;
                if (s->vcpus < 1 || s->vcpus > SNAPSHOT_VCPUS_MAX || s->mem_size == 0 || s->mem_size > MEM_SIZE_MAX)
                        return *ret_why = "a snapshot's vcpus or mem_size is out of range", -ERANGE;
        }
        r->n_snapshots = n;
        qsort(r->snapshots, n, sizeof(FleetSnapshot), snapshot_cmp);
        for (size_t i = 1; i < n; i++)
                if (strcmp(r->snapshots[i - 1].tag, r->snapshots[i].tag) == 0)
                        return *ret_why = "a snapshot tag is listed twice", -EBADMSG;
        return 0;
}

int fleet_record_parse(const char *key, const char *text, size_t len, FleetRecord *ret, const char **ret_why) {
        _cleanup_json_ struct json_object *o = NULL;
        const char *why = NULL, *field = NULL, *name;
        FleetRecord r = {};
        Capacity cap = {};
        Top top = {};
        int k;

        if (strncmp(key, FLEET_KEY_PREFIX "nodes/", strlen(FLEET_KEY_PREFIX "nodes/")) != 0)
                return *ret_why = "the key is not a node's", -EINVAL;
        name = key + strlen(FLEET_KEY_PREFIX "nodes/");
        k = json_parse_strict(text, len, FLEET_RECORD_MAX, RECORD_DEPTH_MAX, &o, &why);
        if (k < 0)
                return *ret_why = k == -EMSGSIZE ? "the record is over 1 MiB" : "the record is not strict JSON", k;
        if (json_dispatch(o, top_table, 0, &top, &field) < 0)
                return *ret_why = "the record's fields are malformed or missing", -EBADMSG;
        if (top.format != 1)
                return *ret_why = "the record's format is not 1", -EPROTONOSUPPORT;
        if (!fleet_node_name_is_valid(top.name) || strcmp(top.name, name) != 0)
                return *ret_why = "the record's name is not its key's", -EBADMSG;
        if (etcd_endpoints_check(top.url, &why) < 0 || strchr(top.url, ','))
                return *ret_why = "the record's url is not one http(s)://HOST:PORT", -EBADMSG;
        if (json_dispatch(top.capacity, capacity_table, 0, &cap, &field) < 0)
                return *ret_why = "the record's capacity is malformed", -EBADMSG;
        if (cap.cores < 1 || cap.cores > FLEET_CORES_MAX || cap.memory_available_kib > MEMORY_KIB_MAX ||
            cap.sandboxes_max < 1 || cap.sandboxes_max > FLEET_SANDBOXES_MAX ||
            cap.sandboxes_running > FLEET_SANDBOXES_MAX)
                return *ret_why = "the record's capacity is out of range", -ERANGE;
        strcpy(r.name, top.name);
        strcpy(r.url, top.url);
        r.ready = top.ready;
        r.cores = cap.cores;
        r.memory_available_kib = cap.memory_available_kib;
        r.sandboxes_running = cap.sandboxes_running;
        r.sandboxes_max = cap.sandboxes_max;
        r.updated_unix = top.updated_unix;
        k = parse_snapshots(top.snapshots, &r, ret_why);
        if (k < 0) {
                fleet_record_done(&r);
                return k;
        }
        *ret = r;
        return 0;
}

const FleetSnapshot *fleet_record_snapshot(const FleetRecord *r, const char *tag) {
        FleetSnapshot key = {};

        if (!r->n_snapshots || strlen(tag) > SNAPSHOT_TAG_MAX)
                return NULL;
        strcpy(key.tag, tag);
        return bsearch(&key, r->snapshots, r->n_snapshots, sizeof(FleetSnapshot), snapshot_cmp);
}

static bool same_link(const FleetSnapshot *a, const FleetSnapshot *b) {
        return strcmp(a->parent, b->parent) == 0 && strcmp(a->parent_content_hash, b->parent_content_hash) == 0 &&
               a->vcpus == b->vcpus && a->mem_size == b->mem_size;
}

bool fleet_holds_chain(const FleetRecord *node, const FleetRecord *source, const char *tag) {
        /* a chain is at most CHAIN_LINKS_MAX deep; a loop in a hostile record ends there */
        for (unsigned depth = 0; depth < CHAIN_LINKS_MAX; depth++) {
                const FleetSnapshot *a = fleet_record_snapshot(node, tag), *b = fleet_record_snapshot(source, tag);

                if (!a || !b || !same_link(a, b))
                        return false;
                if (!a->parent[0])
                        return true;
                tag = a->parent;
        }
        return false;
}

/* Whether node has any tag of tag's chain (as source has it), with the same
 * content or not: a fetch ships the whole chain, and unpack refuses a bundle
 * with a tag the node has already. */
static bool chain_overlaps(const FleetRecord *node, const FleetRecord *source, const char *tag) {
        for (unsigned depth = 0; depth < CHAIN_LINKS_MAX && *tag; depth++) {
                const FleetSnapshot *b = fleet_record_snapshot(source, tag);

                if (fleet_record_snapshot(node, tag))
                        return true;
                if (!b)
                        return false;
                tag = b->parent;
        }
        return false;
}

uint32_t fleet_room(const FleetRecord *r) {
        if (!r->ready || r->sandboxes_running >= r->sandboxes_max)
                return 0;
        return r->sandboxes_max - r->sandboxes_running;
}

enum { OTHER, HOLDER, CONFLICT };

/* Whether a ranks before b: holders by room, others by load (running / max,
 * compared without division), then room. */
static bool ranks_before(const FleetRecord *a, const FleetRecord *b, bool holders) {
        uint64_t load_a = (uint64_t) a->sandboxes_running * b->sandboxes_max,
                 load_b = (uint64_t) b->sandboxes_running * a->sandboxes_max;

        if (!holders && load_a != load_b)
                return load_a < load_b;
        return fleet_room(a) > fleet_room(b);
}

/* Of the nodes not yet used of kind (HOLDER or OTHER), the index of the one that
 * ranks first (holders: most room; others: least loaded, then most room), or
 * n_nodes. */
static size_t pick(const FleetRecord *nodes, size_t n_nodes, const bool *used, const uint8_t *kind, bool holders) {
        size_t best = n_nodes;

        for (size_t i = 0; i < n_nodes; i++) {
                uint32_t room = fleet_room(&nodes[i]);

                if (used[i] || kind[i] != (holders ? HOLDER : OTHER) || room == 0)
                        continue;
                if (best == n_nodes || ranks_before(&nodes[i], &nodes[best], holders))
                        best = i;
        }
        return best;
}

int fleet_place(const FleetRecord *nodes, size_t n_nodes, const char *tag, uint32_t n, FleetPlacement *ret,
                size_t *ret_n) {
        _cleanup_free_ bool *used = calloc(MAX(n_nodes, 1u), sizeof(bool));
        _cleanup_free_ uint8_t *kind = calloc(MAX(n_nodes, 1u), sizeof(uint8_t));
        size_t source = n_nodes, k = 0;
        uint64_t room = 0;

        if (!used || !kind)
                return -ENOMEM;
        /* the source: of the ready nodes with tag's whole chain, the one with the most
         * room (its chain is the one placed) */
        for (size_t i = 0; i < n_nodes; i++)
                if (nodes[i].ready && fleet_holds_chain(&nodes[i], &nodes[i], tag) &&
                    (source == n_nodes || fleet_room(&nodes[i]) > fleet_room(&nodes[source])))
                        source = i;
        if (source == n_nodes)
                return -ENOENT;
        for (size_t i = 0; i < n_nodes; i++) {
                /* a node with part of the chain, or a tag of it with other content, cannot take it */
                if (nodes[i].ready && fleet_holds_chain(&nodes[i], &nodes[source], tag))
                        kind[i] = HOLDER;
                else if (chain_overlaps(&nodes[i], &nodes[source], tag))
                        kind[i] = CONFLICT;
                if (kind[i] != CONFLICT)
                        room += fleet_room(&nodes[i]);
        }
        if (room < n)
                return -ENOSPC;
        for (bool holders = true; n > 0; holders = false) {
                size_t i;

                while (n > 0 && (i = pick(nodes, n_nodes, used, kind, holders)) < n_nodes) {
                        uint32_t take = MIN(n, fleet_room(&nodes[i]));

                        used[i] = true;
                        ret[k++] = (FleetPlacement) { .node = i, .n = take, .fetch = !holders, .source = source };
                        n -= take;
                }
                if (!holders)
                        break;
        }
        if (n > 0)
                return -ENOSPC; /* not reached: room was counted first */
        *ret_n = k;
        return 0;
}
