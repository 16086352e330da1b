/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A front end's routes: a sandbox's calls to its node, merged lists, snapshots
 * on a node chosen or named (fleet-front.h). Forks are fleet-front-place.c. */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fleet-front-internal.h"
#include "io-util.h"
#include "json-util.h"
#include "macro.h"
#include "rest-pack.h"
#include "snapshot-meta.h"

#define BODY_DEPTH_MAX 16
#define LIST_TIMEOUT_MS 5000u

/* "<id>.<node>": forkd's ids have no '.', node names may. */
static bool split_id(const char *fid, char id[static SNAPSHOT_TAG_MAX + 1], char node[static FLEET_NODE_NAME_MAX + 1]) {
        const char *dot = strchr(fid, '.');
        size_t n;

        if (!dot)
                return false;
        n = (size_t) (dot - fid);
        if (n == 0 || n > SNAPSHOT_TAG_MAX || strlen(dot + 1) > FLEET_NODE_NAME_MAX)
                return false;
        memcpy(id, fid, n);
        id[n] = 0;
        strcpy(node, dot + 1);
        return snapshot_tag_is_valid(id) && fleet_node_name_is_valid(node);
}

/* The node's answer, with its sandboxes renamed when it is JSON and a success. */
static int answer_renamed(FrontRequest *r, const char *node, const FleetAnswer *a) {
        _cleanup_(json_object_putp) struct json_object *o = NULL;

        if (a->status < 200 || a->status > 299 || front_parse_answer(a->body, a->len, &o) < 0)
                return front_answer_node(r, node, a);
        fleet_answer_rename(o, node);
        return front_answer_json(r, (unsigned) a->status, o);
}

static int answer_lost(FrontRequest *r, const char *node) {
        uint64_t at = fleet_watcher_lost_at(r->front->watcher, node);
        char when[32] = "";
        time_t t = (time_t) at;
        struct tm tm;

        if (at == 0)
                return front_answer_error(r, 404, "sandbox not found");
        if (gmtime_r(&t, &tm))
                strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
        return front_answer_error(r, 410, "node %s was lost at %s", node, when);
}

/* merge's winner and diff's other: the same node's, as its own id. */
static int rewrite_peer(FrontRequest *r, const char *field, const char *node, char **ret_body) {
        _cleanup_(json_object_putp) struct json_object *o = NULL;
        char id[SNAPSHOT_TAG_MAX + 1], other[FLEET_NODE_NAME_MAX + 1];
        struct json_object *v;
        const char *s;

        *ret_body = NULL;
        if (!r->body || json_parse_strict(r->body, r->len, r->front->cfg.body_max, BODY_DEPTH_MAX, &o, NULL) < 0 ||
            !json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, field, &v) ||
            !json_object_is_type(v, json_type_string))
                return 1; /* the node says what is wrong with it */
        if (!split_id(json_object_get_string(v), id, other))
                return front_answer_error(r, 404, "sandbox not found: %s", field), 0;
        if (!streq(other, node))
                return front_answer_error(r, 409, "%s is on node %s and this sandbox on node %s: both must be on one "
                                                  "node",
                                          field, other, node),
                       0;
        json_object_object_add(o, field, json_object_new_string(id));
        s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
        *ret_body = s ? strdup(s) : NULL;
        return *ret_body ? 1 : -ENOMEM;
}

/* A process's output with follow=true, and an exec with "stream": true: answers
 * that go on while the process runs, streamed through. */
static bool is_stream(FrontRequest *r, const char *rest) {
        _cleanup_(json_object_putp) struct json_object *o = NULL;
        struct json_object *v;
        const char *follow = front_query_arg(r, "follow");
        size_t n = strlen(rest);

        if (streq(r->method, "GET") && n > 7 && streq(rest + n - 7, "/output"))
                return follow && (streq(follow, "true") || streq(follow, "1"));
        if (!streq(r->method, "POST") || !streq(rest, "/exec") || !r->body ||
            json_parse_strict(r->body, r->len, r->front->cfg.body_max, BODY_DEPTH_MAX, &o, NULL) < 0)
                return false;
        return json_object_object_get_ex(o, "stream", &v) && json_object_is_type(v, json_type_boolean) &&
               json_object_get_boolean(v);
}

/* /v1/sandboxes/<id>.<node>[/...]: to the node, with its own id. */
static int route_sandbox(FrontRequest *r, const char *fid, const char *rest) {
        _cleanup_free_ char *body = NULL;
        char id[SNAPSHOT_TAG_MAX + 1], name[FLEET_NODE_NAME_MAX + 1], path[4096];
        const FleetRecord *node;
        FleetAnswer a;
        FleetCall c;
        FleetView *v;
        int k;

        if (!split_id(fid, id, name))
                return front_answer_error(r, 404, "sandbox not found");
        if (streq(rest, "/merge") || streq(rest, "/diff")) {
                k = rewrite_peer(r, streq(rest, "/merge") ? "winner" : "other", name, &body);
                if (k <= 0)
                        return k;
        }
        if (strncmp(rest, "/processes/", 11) == 0 && strlen(rest) > 4 && streq(rest + strlen(rest) - 4, "/tty"))
                return front_answer_error(r, 501, "a terminal's WebSocket does not pass through a front end: open it "
                                                  "on node %s, as %s",
                                          name, id);
        v = fleet_view_get(r->front->watcher);
        node = fleet_view_node(v, name);
        if (!node) {
                fleet_view_put(r->front->watcher, v);
                return answer_lost(r, name);
        }
        snprintf(path, sizeof(path), "/v1/sandboxes/%s%s%s", id, rest, r->query);
        if (is_stream(r, rest)) {
                k = front_stream_start(r, node, path, body ?: r->body, body ? strlen(body) : r->len);
                fleet_view_put(r->front->watcher, v);
                return k;
        }
        c = front_call(r, node, r->method, path);
        c.body = body ?: r->body;
        c.len = body ? strlen(body) : r->len;
        c.content_type = r->content_type[0] ? r->content_type : NULL;
        r->asked_node = true;
        (void) fleet_http_call(&c, &a);
        if (a.status == 0 && !fleet_view_node(v, name))
                k = answer_lost(r, name);
        else if (streq(rest, "") || streq(rest, "/pause") || streq(rest, "/resume") || streq(rest, "/timeout") ||
                 streq(rest, "/merge") || streq(rest, "/fork"))
                k = answer_renamed(r, name, &a);
        else
                k = front_answer_node(r, name, &a);
        fleet_answer_done(&a);
        fleet_view_put(r->front->watcher, v);
        return k;
}

/* GET of a list on every node at once; unanswered nodes are named in a header. */
static int list_all(FrontRequest *r, const char *path, bool snapshots) {
        _cleanup_(json_object_putp) struct json_object *out = json_object_new_array(), *by_tag = NULL;
        FleetView *v = fleet_view_get(r->front->watcher);
        _cleanup_free_ FleetCall *calls = calloc(MAX(v->n_nodes, 1u), sizeof(FleetCall));
        _cleanup_free_ FleetAnswer *as = calloc(MAX(v->n_nodes, 1u), sizeof(FleetAnswer));
        char full[4096], missing[512] = "";
        int k;

        by_tag = json_object_new_object();
        if (!out || !calls || !as || !by_tag) {
                fleet_view_put(r->front->watcher, v);
                return -ENOMEM;
        }
        snprintf(full, sizeof(full), "%s%s", path, r->query);
        for (size_t i = 0; i < v->n_nodes; i++) {
                calls[i] = front_call(r, &v->nodes[i], "GET", full);
                calls[i].timeout_ms = LIST_TIMEOUT_MS;
        }
        (void) fleet_http_call_many(calls, v->n_nodes, as);
        for (size_t i = 0; i < v->n_nodes; i++) {
                _cleanup_(json_object_putp) struct json_object *a = NULL;
                const char *node = v->nodes[i].name;

                if (as[i].status != 200 || front_parse_answer(as[i].body, as[i].len, &a) < 0 ||
                    !json_object_is_type(a, json_type_array)) {
                        size_t n = strlen(missing);

                        atomic_fetch_add(&r->front->node_failures, 1);
                        snprintf(missing + n, sizeof(missing) - n, "%s%s", n ? ", " : "", node);
                        continue;
                }
                for (size_t j = 0; j < json_object_array_length(a); j++) {
                        struct json_object *e = json_object_array_get_idx(a, j), *tag, *seen, *nodes;

                        if (!snapshots) {
                                fleet_answer_rename(e, node);
                                json_object_array_add(out, json_object_get(e));
                                continue;
                        }
                        /* a snapshot held by several nodes is listed once, with every node */
                        if (!json_object_is_type(e, json_type_object) || !json_object_object_get_ex(e, "tag", &tag) ||
                            !json_object_is_type(tag, json_type_string))
                                continue;
                        if (json_object_object_get_ex(by_tag, json_object_get_string(tag), &seen)) {
                                if (json_object_object_get_ex(seen, "nodes", &nodes))
                                        json_object_array_add(nodes, json_object_new_string(node));
                                continue;
                        }
                        nodes = json_object_new_array();
                        json_object_array_add(nodes, json_object_new_string(node));
                        json_object_object_add(e, "nodes", nodes);
                        json_object_object_add(by_tag, json_object_get_string(tag), json_object_get(e));
                        json_object_array_add(out, json_object_get(e));
                }
        }
        for (size_t i = 0; i < v->n_nodes; i++)
                fleet_answer_done(&as[i]);
        fleet_view_put(r->front->watcher, v);
        if (missing[0])
                front_add_header(r, "Forkd-Unanswered-Nodes", "%s", missing);
        k = front_answer_json(r, 200, out);
        return k;
}

/* The node a snapshot call goes to: ?node=, else the ready node with the most room
 * (holding tag, when tag is given). NULL: answered. */
static const FleetRecord *pick_node(FrontRequest *r, FleetView *v, const char *tag) {
        const char *want = front_query_arg(r, "node");
        const FleetRecord *best = NULL;

        if (want) {
                const FleetRecord *n = fleet_view_node(v, want);

                if (!n)
                        front_answer_error(r, 404, "node %.64s is not in the fleet", want);
                return n;
        }
        for (size_t i = 0; i < v->n_nodes; i++) {
                const FleetRecord *n = &v->nodes[i];

                if (!n->ready || (tag && !fleet_record_snapshot(n, tag)))
                        continue;
                if (!best || fleet_room(n) > fleet_room(best))
                        best = n;
        }
        if (!best && tag)
                front_answer_error(r, 404, "snapshot not found");
        else if (!best)
                front_answer_error(r, 503, "no node of the fleet is ready");
        return best;
}

/* One call to one node, the request's body passed on; its answer as it came
 * (a bundle streamed through a file). */
static int forward(FrontRequest *r, const FleetRecord *node, const char *path, const char *body, size_t len,
                   bool bundle_answer) {
        char full[4096];
        FleetAnswer a;
        FleetCall c;
        int k;

        snprintf(full, sizeof(full), "%s%s", path, r->query);
        c = front_call(r, node, r->method, full);
        c.body = body;
        c.len = len;
        c.content_type = r->content_type[0] ? r->content_type : NULL;
        if (r->body_fd >= 0) {
                c.body_fd = r->body_fd;
                c.len = r->len;
        }
        if (bundle_answer) {
                r->answer_fd = memfd_create("forkd-front-pack", MFD_CLOEXEC);
                if (r->answer_fd < 0)
                        return -errno;
                c.answer_fd = r->answer_fd;
                c.answer_max = REST_BUNDLE_MAX;
        }
        r->asked_node = true;
        (void) fleet_http_call(&c, &a);
        if (bundle_answer && a.status == 200) {
                off_t size = lseek(r->answer_fd, 0, SEEK_END);

                k = front_answer(r, 200, a.content_type[0] ? a.content_type : "application/zstd", "", 0);
                r->answer_len = size > 0 ? (size_t) size : 0;
        } else {
                r->answer_fd = safe_close(r->answer_fd);
                k = front_answer_node(r, node->name, &a);
        }
        fleet_answer_done(&a);
        return k;
}

/* POST /v1/snapshots: on the node named or with the most room; "replicas": k
 * copies it to k - 1 more nodes. */
static int route_snapshot_create(FrontRequest *r, FleetView *v) {
        _cleanup_(json_object_putp) struct json_object *o = NULL, *made = NULL;
        struct json_object *rep = NULL, *tag;
        const FleetRecord *node;
        const char *body;
        int64_t replicas = 1;
        size_t copied = 1;
        int k;

        if (!r->body || json_parse_strict(r->body, r->len, r->front->cfg.body_max, BODY_DEPTH_MAX, &o, NULL) < 0 ||
            !json_object_is_type(o, json_type_object))
                return front_answer_error(r, 400, "the body must be a JSON object");
        if (json_object_object_get_ex(o, "replicas", &rep)) {
                if (!json_object_is_type(rep, json_type_int) || (replicas = json_object_get_int64(rep)) < 1 ||
                    replicas > (int64_t) v->n_nodes)
                        return front_answer_error(r, 400, "replicas must be an integer between 1 and %zu (the nodes)",
                                                  v->n_nodes);
                json_object_object_del(o, "replicas");
        }
        node = pick_node(r, v, NULL);
        if (!node)
                return 0;
        body = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
        k = forward(r, node, "/v1/snapshots", body, strlen(body), false);
        if (k < 0 || r->status != 201 || replicas == 1)
                return k;
        if (front_parse_answer(r->answer, r->answer_len, &made) < 0 ||
            !json_object_object_get_ex(made, "tag", &tag) || !json_object_is_type(tag, json_type_string))
                return 0;
        for (size_t i = 0; i < v->n_nodes && copied < (size_t) replicas; i++) {
                FrontRequest sub = { .front = r->front, .authorization = r->authorization, .body_fd = -1,
                                     .answer_fd = -1 };

                if (&v->nodes[i] == node || !v->nodes[i].ready)
                        continue;
                if (front_snapshot_to_node(&sub, v, node, json_object_get_string(tag), &v->nodes[i]) >= 0 &&
                    !sub.answered)
                        copied++;
                free(sub.answer);
        }
        front_add_header(r, "Forkd-Replicas", "%zu", copied);
        return 0;
}

/* DELETE /v1/snapshots/<tag> without ?node=: on every node that holds it. */
static int route_snapshot_delete_all(FrontRequest *r, FleetView *v, const char *tag) {
        _cleanup_free_ FleetCall *calls = calloc(MAX(v->n_nodes, 1u), sizeof(FleetCall));
        _cleanup_free_ FleetAnswer *as = calloc(MAX(v->n_nodes, 1u), sizeof(FleetAnswer));
        _cleanup_free_ size_t *which = calloc(MAX(v->n_nodes, 1u), sizeof(size_t));
        char path[4096];
        size_t n = 0;
        int k = 0;

        if (!calls || !as || !which)
                return -ENOMEM;
        snprintf(path, sizeof(path), "/v1/snapshots/%s%s", tag, r->query);
        for (size_t i = 0; i < v->n_nodes; i++)
                if (fleet_record_snapshot(&v->nodes[i], tag)) {
                        which[n] = i;
                        calls[n++] = front_call(r, &v->nodes[i], "DELETE", path);
                }
        if (n == 0)
                return front_answer_error(r, 404, "snapshot not found");
        r->asked_node = true;
        (void) fleet_http_call_many(calls, n, as);
        for (size_t i = 0; i < n && !r->answered; i++)
                if (as[i].status != 204)
                        k = front_answer_node(r, v->nodes[which[i]].name, &as[i]);
        for (size_t i = 0; i < n; i++)
                fleet_answer_done(&as[i]);
        if (!r->answered)
                k = front_answer(r, 204, "application/json", "", 0);
        return k;
}

static int route_snapshots(FrontRequest *r, const char *sub) {
        FleetView *v = fleet_view_get(r->front->watcher);
        char tag[SNAPSHOT_TAG_MAX + 1], path[4096];
        const FleetRecord *node;
        const char *slash;
        size_t n;
        int k = 0;

        if (streq(sub, "")) {
                if (streq(r->method, "POST"))
                        k = route_snapshot_create(r, v);
                else if (streq(r->method, "GET"))
                        k = list_all(r, "/v1/snapshots", true);
                else
                        k = front_answer_error(r, 405, "method not allowed");
                goto done;
        }
        if (streq(sub, "/unpack")) {
                node = pick_node(r, v, NULL);
                if (node)
                        k = forward(r, node, "/v1/snapshots/unpack", r->body, r->len, false);
                goto done;
        }
        slash = strchr(sub + 1, '/');
        n = slash ? (size_t) (slash - sub - 1) : strlen(sub + 1);
        if (n == 0 || n > SNAPSHOT_TAG_MAX) {
                k = front_answer_error(r, 404, "snapshot not found");
                goto done;
        }
        memcpy(tag, sub + 1, n);
        tag[n] = 0;
        if (!snapshot_tag_is_valid(tag)) {
                k = front_answer_error(r, 400, "invalid snapshot tag");
                goto done;
        }
        if (!slash && streq(r->method, "DELETE") && !front_query_arg(r, "node")) {
                k = route_snapshot_delete_all(r, v, tag);
                goto done;
        }
        node = pick_node(r, v, tag);
        if (node) {
                snprintf(path, sizeof(path), "/v1/snapshots/%s", sub + 1);
                k = forward(r, node, path, r->body, r->len, slash && streq(slash, "/pack"));
        }
done:
        fleet_view_put(r->front->watcher, v);
        return k;
}

/* GET /v1/fleet/nodes: the nodes as this front end sees them now. */
static int route_nodes(FrontRequest *r) {
        _cleanup_(json_object_putp) struct json_object *out = json_object_new_array();
        FleetView *v = fleet_view_get(r->front->watcher);
        int k;

        for (size_t i = 0; out && i < v->n_nodes; i++) {
                const FleetRecord *n = &v->nodes[i];
                struct json_object *o = json_object_new_object(), *cap = json_object_new_object();

                if (!o || !cap) {
                        json_object_put(o);
                        json_object_put(cap);
                        fleet_view_put(r->front->watcher, v);
                        return -ENOMEM;
                }
                json_object_object_add(cap, "cores", json_object_new_int64(n->cores));
                json_object_object_add(cap, "memory_available_kib", json_object_new_uint64(n->memory_available_kib));
                json_object_object_add(cap, "sandboxes_running", json_object_new_int64(n->sandboxes_running));
                json_object_object_add(cap, "sandboxes_max", json_object_new_int64(n->sandboxes_max));
                json_object_object_add(o, "name", json_object_new_string(n->name));
                json_object_object_add(o, "url", json_object_new_string(n->url));
                json_object_object_add(o, "ready", json_object_new_boolean(n->ready));
                json_object_object_add(o, "capacity", cap);
                json_object_object_add(o, "snapshots", json_object_new_int64((int64_t) n->n_snapshots));
                json_object_array_add(out, o);
        }
        fleet_view_put(r->front->watcher, v);
        k = front_answer_json(r, 200, out);
        return k;
}

int front_route(FrontRequest *r) {
        const char *p = r->path;

        if (streq(p, "/healthz") || streq(p, "/healthz/"))
                return front_route_healthz(r);
        if (streq(p, "/metrics"))
                return front_route_metrics(r);
        if (streq(p, "/version")) {
                static const char body[] = "{\"version\":\"" FORKD_VERSION "\",\"api\":\"v1\",\"fleet\":\"front\"}";

                return front_answer(r, 200, "application/json", body, sizeof(body) - 1);
        }
        /* what goes on to a node: ids, tags, pids and route words only */
        if (strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-") != strlen(p))
                return front_answer_error(r, 404, "not found");
        if (streq(p, "/v1/fleet/nodes"))
                return streq(r->method, "GET") ? route_nodes(r) : front_answer_error(r, 405, "method not allowed");
        if (streq(p, "/v1/sandboxes")) {
                if (streq(r->method, "GET"))
                        return list_all(r, "/v1/sandboxes", false);
                if (streq(r->method, "POST"))
                        return front_sandboxes_create(r);
                return front_answer_error(r, 405, "method not allowed");
        }
        if (strncmp(p, "/v1/sandboxes/", 14) == 0) {
                char fid[FRONT_ID_MAX + 1];
                const char *slash = strchr(p + 14, '/');
                size_t n = slash ? (size_t) (slash - p - 14) : strlen(p + 14);

                if (n == 0 || n > FRONT_ID_MAX)
                        return front_answer_error(r, 404, "sandbox not found");
                memcpy(fid, p + 14, n);
                fid[n] = 0;
                return route_sandbox(r, fid, slash ?: "");
        }
        if (streq(p, "/v1/snapshots") || strncmp(p, "/v1/snapshots/", 14) == 0)
                return route_snapshots(r, p + 13);
        return front_answer_error(r, 404, "not found");
}
