/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A front end's forks: placement over the nodes, and the fetch of a chain a
 * node lacks from one that holds it (fleet-front.h). */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fleet-front-internal.h"
#include "io-util.h"
#include "json-util.h"
#include "macro.h"
#include "rest-pack.h"
#include "snapshot-meta.h"
#include "time-util.h"

#define BODY_DEPTH_MAX 16
#define FORK_N_MAX 1000
#define VIEW_STALE_USEC (2 * USEC_PER_SEC)
#define FETCH_TIMEOUT_MS (3600u * 1000u)

/* Take the (node, tag) fetch slot, waiting while another request of this front
 * end holds it; across front ends, etcd's lock (fleet-front-lock.c) follows. */
static int fetch_lock(FleetFront *f, const char *node, const char *tag) {
        pthread_mutex_lock(&f->lock);
        for (;;) {
                bool busy = false;

                for (size_t i = 0; i < f->n_fetches; i++)
                        if (streq(f->fetches[i].node, node) && streq(f->fetches[i].tag, tag))
                                busy = true;
                if (!busy && f->n_fetches < FRONT_FETCHES_MAX)
                        break;
                pthread_cond_wait(&f->fetch_done, &f->lock);
        }
        snprintf(f->fetches[f->n_fetches].node, sizeof(f->fetches[0].node), "%s", node);
        snprintf(f->fetches[f->n_fetches].tag, sizeof(f->fetches[0].tag), "%s", tag);
        f->n_fetches++;
        pthread_mutex_unlock(&f->lock);
        return 0;
}

static void fetch_unlock(FleetFront *f, const char *node, const char *tag) {
        pthread_mutex_lock(&f->lock);
        for (size_t i = 0; i < f->n_fetches; i++)
                if (streq(f->fetches[i].node, node) && streq(f->fetches[i].tag, tag)) {
                        f->fetches[i] = f->fetches[--f->n_fetches];
                        break;
                }
        pthread_cond_broadcast(&f->fetch_done);
        pthread_mutex_unlock(&f->lock);
}

/* Whether target has tag now (its own answer, not its record: that lags a second). */
static bool node_has(const FrontRequest *r, const FleetRecord *target, const char *tag) {
        char path[128];
        FleetAnswer a;
        FleetCall c;
        bool has;

        snprintf(path, sizeof(path), "/v1/snapshots/%s/info", tag);
        c = front_call(r, target, "GET", path);
        c.timeout_ms = 10000;
        (void) fleet_http_call(&c, &a);
        has = a.status == 200;
        fleet_answer_done(&a);
        return has;
}

struct has_args {
        const FleetRecord *target;
        const char *tag;
};

static bool target_has(FrontRequest *r, void *data) {
        const struct has_args *h = data;

        return node_has(r, h->target, h->tag);
}

/* tag and its ancestors from source into target: source's bundle (its pack
 * route) into a file, then target's unpack, which checks every file's digest
 * and each link's parent_content_hash. An error is answered on r. */
int front_snapshot_to_node(FrontRequest *r, FleetView *v, const FleetRecord *source, const char *tag,
                           const FleetRecord *target) {
        _cleanup_close_ int fd = -EBADF;
        FleetFront *f = r->front;
        char path[128];
        FleetAnswer a = {};
        FleetCall c;
        FrontLock *lock = NULL;
        off_t size;
        int k = 0;

        fetch_lock(f, target->name, tag);
        k = front_lock_fetch(r, target->name, tag, target_has, &(struct has_args) { target, tag }, &lock);
        if (k < 0) {
                k = front_answer_error(r, 503, "cannot take the fetch lock of %s on node %s: %s", tag, target->name,
                                       strerror(-k));
                goto fail;
        }
        k = 0;
        if (node_has(r, target, tag))
                goto done; /* another request, here or at another front end, fetched it meanwhile */
        atomic_fetch_add(&f->fetches_total, 1);
        log_info("Fetching snapshot %s into node %s from node %s.", tag, target->name, source->name);
        fd = memfd_create("forkd-front-fetch", MFD_CLOEXEC);
        if (fd < 0) {
                k = front_answer_error(r, 500, "cannot make a file for the bundle: %m");
                goto fail;
        }
        snprintf(path, sizeof(path), "/v1/snapshots/%s/pack", tag);
        c = front_call(r, source, "GET", path);
        c.answer_fd = fd;
        c.answer_max = REST_BUNDLE_MAX;
        c.timeout_ms = FETCH_TIMEOUT_MS;
        (void) fleet_http_call(&c, &a);
        if (a.status != 200) {
                k = front_answer_error(r, 502, "cannot fetch snapshot %s from node %s: %s", tag, source->name,
                                       a.status ? a.body : a.error);
                goto fail;
        }
        fleet_answer_done(&a);
        size = lseek(fd, 0, SEEK_END);
        c = front_call(r, target, "POST", "/v1/snapshots/unpack");
        c.body_fd = fd;
        c.len = size > 0 ? (size_t) size : 0;
        c.content_type = "application/zstd";
        c.timeout_ms = FETCH_TIMEOUT_MS;
        r->asked_node = true;
        (void) fleet_http_call(&c, &a);
        /* 409: a tag of the chain is there already (the placement checked it is the same chain) */
        if (a.status != 201 && !(a.status == 409 && node_has(r, target, tag))) {
                k = front_answer_error(r, 502, "node %s cannot take snapshot %s from node %s: %s", target->name, tag,
                                       source->name, a.status ? a.body : a.error);
                goto fail;
        }
        goto done;
fail:
        atomic_fetch_add(&f->fetch_failures, 1);
        if (k >= 0)
                k = -EIO;
done:
        fleet_answer_done(&a);
        front_lock_release(lock);
        fetch_unlock(f, target->name, tag);
        return k;
}

/* The view's records as placement sees them: each node's count of running
 * sandboxes with what this front end placed there in the last two seconds,
 * unless the record was written after that. */
static FleetRecord *records_with_reservations(FleetFront *f, const FleetView *v) {
        FleetRecord *nodes = calloc(MAX(v->n_nodes, 1u), sizeof(FleetRecord));
        uint64_t now = now_usec();

        if (!nodes)
                return NULL;
        memcpy(nodes, v->nodes, v->n_nodes * sizeof(FleetRecord)); /* shallow: the view owns the snapshots */
        pthread_mutex_lock(&f->lock);
        for (size_t i = 0; i < FRONT_RESERVATIONS_MAX; i++) {
                const FrontReservation *res = &f->reservations[i];
                FleetRecord *n;

                if (res->n == 0 || now - res->usec > FRONT_RESERVE_USEC)
                        continue;
                n = (FleetRecord *) fleet_view_node(&(FleetView) { .nodes = nodes, .n_nodes = v->n_nodes }, res->node);
                /* a record written in a later second than the placement counts its children */
                if (n && n->updated_unix <= res->at_unix)
                        n->sandboxes_running = (uint32_t) MIN((uint64_t) n->sandboxes_running + res->n,
                                                              (uint64_t) n->sandboxes_max);
        }
        pthread_mutex_unlock(&f->lock);
        return nodes;
}

static void reserve(FleetFront *f, const char *node, uint32_t n) {
        pthread_mutex_lock(&f->lock);
        f->reservations[f->reservation_next] = (FrontReservation) {
                .n = n,
                .usec = now_usec(),
                .at_unix = now_realtime_usec() / USEC_PER_SEC,
        };
        snprintf(f->reservations[f->reservation_next].node, sizeof(f->reservations[0].node), "%s", node);
        f->reservation_next = (f->reservation_next + 1) % FRONT_RESERVATIONS_MAX;
        pthread_mutex_unlock(&f->lock);
}

/* The children made so far are terminated: a fork is all of its n or nothing. */
static void undo_children(FrontRequest *r, FleetView *v, const FleetPlacement *p, size_t n_p, FleetAnswer *as) {
        for (size_t i = 0; i < n_p; i++) {
                _cleanup_(json_object_putp) struct json_object *a = NULL;

                if (as[i].status != 201 || front_parse_answer(as[i].body, as[i].len, &a) < 0 ||
                    !json_object_is_type(a, json_type_array))
                        continue;
                for (size_t j = 0; j < json_object_array_length(a); j++) {
                        struct json_object *id;
                        char path[128];
                        FleetAnswer d;
                        FleetCall c;

                        if (!json_object_object_get_ex(json_object_array_get_idx(a, j), "id", &id) ||
                            !json_object_is_type(id, json_type_string) ||
                            !snapshot_tag_is_valid(json_object_get_string(id)))
                                continue;
                        snprintf(path, sizeof(path), "/v1/sandboxes/%s", json_object_get_string(id));
                        c = front_call(r, &v->nodes[p[i].node], "DELETE", path);
                        c.timeout_ms = 10000;
                        (void) fleet_http_call(&c, &d);
                        fleet_answer_done(&d);
                }
        }
}

/* No record says a node holds tag: one made in the last second or so is not in
 * its node's record yet. The nodes are asked; those that have it take the
 * children, most room first, then the others with room, each fetching from the
 * first that has it. -ENOENT: none has it. */
static int place_by_asking(FrontRequest *r, FleetView *v, const FleetRecord *seen, const char *tag, uint32_t n,
                           FleetPlacement *ret, size_t *ret_n) {
        _cleanup_free_ FleetCall *calls = calloc(MAX(v->n_nodes, 1u), sizeof(FleetCall));
        _cleanup_free_ FleetAnswer *as = calloc(MAX(v->n_nodes, 1u), sizeof(FleetAnswer));
        size_t n_p = 0, source = SIZE_MAX;
        char path[128];
        bool any = false;

        if (!calls || !as)
                return -ENOMEM;
        snprintf(path, sizeof(path), "/v1/snapshots/%s/info", tag);
        for (size_t i = 0; i < v->n_nodes; i++) {
                calls[i] = front_call(r, &v->nodes[i], "GET", path);
                calls[i].timeout_ms = 5000;
        }
        (void) fleet_http_call_many(calls, v->n_nodes, as);
        for (size_t i = 0; i < v->n_nodes; i++)
                if (as[i].status == 200 && source == SIZE_MAX)
                        source = i;
        /* the holders first, then the others, which fetch from the first holder */
        for (int pass = 0; pass < 2 && source != SIZE_MAX; pass++)
                while (n > 0) {
                        size_t best = SIZE_MAX;

                        for (size_t i = 0; i < v->n_nodes; i++) {
                                bool taken = false;

                                if ((as[i].status == 200) != (pass == 0) || fleet_room(&seen[i]) == 0)
                                        continue;
                                for (size_t j = 0; j < n_p; j++)
                                        taken |= ret[j].node == i;
                                if (!taken &&
                                    (best == SIZE_MAX || fleet_room(&seen[i]) > fleet_room(&seen[best])))
                                        best = i;
                        }
                        if (best == SIZE_MAX)
                                break;
                        ret[n_p] = (FleetPlacement) { .node = best, .n = MIN(n, fleet_room(&seen[best])),
                                                      .fetch = pass == 1, .source = source };
                        n -= ret[n_p++].n;
                }
        for (size_t i = 0; i < v->n_nodes; i++) {
                any |= as[i].status == 200;
                fleet_answer_done(&as[i]);
        }
        if (!any)
                return -ENOENT;
        if (n > 0)
                return -ENOSPC;
        *ret_n = n_p;
        return 0;
}

/* POST /v1/sandboxes: n children of snapshot_tag, placed by fleet_place(). */
int front_sandboxes_create(FrontRequest *r) {
        _cleanup_(json_object_putp) struct json_object *o = NULL, *out = NULL;
        _cleanup_free_ FleetPlacement *p = NULL;
        _cleanup_free_ FleetRecord *seen = NULL;
        _cleanup_free_ FleetAnswer *as = NULL;
        FleetFront *f = r->front;
        struct json_object *tagv, *nv;
        _cleanup_free_ FleetCall *calls = NULL;
        _cleanup_free_ char **bodies = NULL;
        char tag[SNAPSHOT_TAG_MAX + 1], err[256];
        size_t n_p = 0, failed = SIZE_MAX;
        int64_t n = 1;
        uint64_t age;
        FleetView *v;
        int k;

        if (!r->body || json_parse_strict(r->body, r->len, f->cfg.body_max, BODY_DEPTH_MAX, &o, NULL) < 0 ||
            !json_object_is_type(o, json_type_object))
                return front_answer_error(r, 400, "the body must be a JSON object");
        if (!json_object_object_get_ex(o, "snapshot_tag", &tagv) || !json_object_is_type(tagv, json_type_string) ||
            !snapshot_tag_is_valid(json_object_get_string(tagv)))
                return front_answer_error(r, 400, "snapshot_tag must be a snapshot tag");
        snprintf(tag, sizeof(tag), "%s", json_object_get_string(tagv));
        if (json_object_object_get_ex(o, "n", &nv) && !json_object_is_type(nv, json_type_null)) {
                if (!json_object_is_type(nv, json_type_int) || (n = json_object_get_int64(nv)) < 1 || n > FORK_N_MAX)
                        return front_answer_error(r, 400, "n must be an integer between 1 and %d", FORK_N_MAX);
        }
        if (!fleet_watcher_etcd_ok(f->watcher, &age, err, sizeof(err)) || age > VIEW_STALE_USEC) {
                atomic_fetch_add(&f->placement_refusals, 1);
                return front_answer_error(r, 503,
                                          "cannot place a fork: etcd does not answer (%s), and placement needs the "
                                          "fleet's records; sandboxes already placed still answer",
                                          err[0] ? err : "its last answer is too old");
        }
        v = fleet_view_get(f->watcher);
        p = calloc(MAX(v->n_nodes, 1u), sizeof(FleetPlacement));
        seen = records_with_reservations(f, v);
        if (!p || !seen) {
                fleet_view_put(f->watcher, v);
                return -ENOMEM;
        }
        k = fleet_place(seen, v->n_nodes, tag, (uint32_t) n, p, &n_p);
        if (k == -ENOENT)
                k = place_by_asking(r, v, seen, tag, (uint32_t) n, p, &n_p);
        if (k == -ENOENT || k == -ENOSPC) {
                atomic_fetch_add(&f->placement_refusals, 1);
                fleet_view_put(f->watcher, v);
                if (k == -ENOENT)
                        return front_answer_error(r, 404, "snapshot not found on any ready node");
                return front_answer_error(r, 503, "the fleet has no room for %" PRId64 " more sandboxes", n);
        }
        if (k < 0) {
                fleet_view_put(f->watcher, v);
                return k;
        }
        atomic_fetch_add(&f->placements, 1);
        for (size_t i = 0; i < n_p; i++) {
                if (!p[i].fetch)
                        continue;
                k = front_snapshot_to_node(r, v, &v->nodes[p[i].source], tag, &v->nodes[p[i].node]);
                if (k < 0) {
                        fleet_view_put(f->watcher, v);
                        return r->answered ? 0 : k;
                }
        }

        calls = calloc(n_p, sizeof(FleetCall));
        bodies = calloc(n_p, sizeof(char *));
        as = calloc(n_p, sizeof(FleetAnswer));
        if (!calls || !bodies || !as) {
                fleet_view_put(f->watcher, v);
                return -ENOMEM;
        }
        for (size_t i = 0; i < n_p; i++) {
                const char *s;

                json_object_object_add(o, "n", json_object_new_int64(p[i].n));
                s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
                bodies[i] = s ? strdup(s) : NULL;
                calls[i] = front_call(r, &v->nodes[p[i].node], "POST", "/v1/sandboxes");
                calls[i].body = bodies[i] ?: "";
                calls[i].len = bodies[i] ? strlen(bodies[i]) : 0;
        }
        r->asked_node = true;
        (void) fleet_http_call_many(calls, n_p, as);

        out = json_object_new_array();
        for (size_t i = 0; i < n_p && out; i++) {
                _cleanup_(json_object_putp) struct json_object *a = NULL;

                if (failed == SIZE_MAX &&
                    (as[i].status != 201 || front_parse_answer(as[i].body, as[i].len, &a) < 0 ||
                     !json_object_is_type(a, json_type_array))) {
                        failed = i;
                        continue;
                }
                for (size_t j = 0; a && j < json_object_array_length(a); j++) {
                        struct json_object *e = json_object_array_get_idx(a, j), *id;
                        char buf[FRONT_ID_MAX + 1];

                        if (!json_object_object_get_ex(e, "id", &id) || !json_object_is_type(id, json_type_string))
                                continue;
                        snprintf(buf, sizeof(buf), "%s.%s", json_object_get_string(id), v->nodes[p[i].node].name);
                        json_object_object_add(e, "id", json_object_new_string(buf));
                        json_object_object_add(e, "node", json_object_new_string(v->nodes[p[i].node].name));
                        json_object_array_add(out, json_object_get(e));
                }
        }
        if (!out)
                k = -ENOMEM;
        else if (failed != SIZE_MAX) {
                undo_children(r, v, p, n_p, as);
                k = front_answer_node(r, v->nodes[p[failed].node].name, &as[failed]);
        } else {
                for (size_t i = 0; i < n_p; i++)
                        reserve(f, v->nodes[p[i].node].name, p[i].n);
                k = front_answer_json(r, 201, out);
        }
        for (size_t i = 0; i < n_p; i++) {
                fleet_answer_done(&as[i]);
                free(bodies[i]);
        }
        fleet_view_put(f->watcher, v);
        return k;
}
