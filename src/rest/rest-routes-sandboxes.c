/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* The sandbox routes: fork a snapshot, list, get, terminate, branch, fork a
 * sandbox, merge, deadlines, pause and resume. */

#include "fork-options.h"
#include "forkd-bus.h"
#include "json-util.h"
#include "macro.h"
#include "rate-bus.h"
#include "rest-bus.h"
#include "rest-reply.h"
#include "rest-routes-common.h"
#include "rest-routes-sandboxes.h"
#include "rest-util.h"

#define FORK_N_MAX 1000

/* Podflare's answer: 200 {"children": [ids]}; 404 {"error": "sandbox not found"}. */
static int on_reply_sandbox_fork(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *a = NULL, *o = NULL, *ids = NULL;
        const sd_bus_error *e = sd_bus_message_get_error(reply);
        int r;

        if (e && sd_bus_error_has_name(e, FORKD_ERROR_NO_SUCH_SANDBOX))
                return rest_reply_error(req, 404, "sandbox not found");
        r = rest_reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        r = rest_bus_read_dict_array_json(reply, &a);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        ids = json_object_new_array();
        o = json_object_new_object();
        if (!ids || !o)
                return rest_reply_error(req, 500, "out of memory");
        for (size_t i = 0; i < json_object_array_length(a); i++) {
                struct json_object *id;

                if (!json_object_object_get_ex(json_object_array_get_idx(a, i), "id", &id))
                        return rest_reply_error(req, 500, "unexpected reply from the daemon: a child without id");
                json_object_array_add(ids, json_object_get(id));
        }
        json_object_object_add(o, "children", TAKE_PTR(ids));
        return rest_reply_json(req, 200, o);
}

/* ---- sandboxes ---- */

/* cpu_limit, disk_rate and net_rate of a body: kept as JSON while the body
 * lives (json_dispatch checks nothing but that they are there), then checked
 * by limits_from_body() with the words forkd would answer with. */
struct limits_json {
        struct json_object *cpu_limit, *disk_rate, *net_rate;
};

static int keep_json(struct json_object *v, void *field, const char **ret_error) {
        *(struct json_object **) field = v; /* NULL for null: not given */
        return 0;
}

#define LIMIT_FIELDS(type, member)                                                                                \
        { "cpu_limit", JSON_KIND_ANY, keep_json, offsetof(type, member.cpu_limit), 0, JSON_NULLABLE },           \
        { "disk_rate", JSON_KIND_ANY, keep_json, offsetof(type, member.disk_rate), 0, JSON_NULLABLE },           \
        { "net_rate", JSON_KIND_ANY, keep_json, offsetof(type, member.net_rate), 0, JSON_NULLABLE }

/* 1 with *ret filled (*ret_given: LIMIT_* of what was given); else the 400 is
 * queued and this returns 0 or the reply's errno. zero_cpu: cpu_limit 0 is
 * allowed (PATCH: remove it). */
#define LIMIT_CPU 1u
#define LIMIT_DISK_RATE 2u
#define LIMIT_NET_RATE 4u
static int limits_from_body(RestRequest *req, const struct limits_json *j, bool zero_cpu, struct sandbox_limits *ret,
                            unsigned *ret_given) {
        char err[FORK_OPTION_ERROR_MAX];
        struct sandbox_limits l = {};
        unsigned given = 0;

        if (j->cpu_limit) {
                if (!json_object_is_type(j->cpu_limit, json_type_double) &&
                    !json_object_is_type(j->cpu_limit, json_type_int))
                        return MIN(rest_reply_error(req, 400, "cpu_limit must be a number"), 0);
                l.cpu_limit = json_object_get_double(j->cpu_limit);
                if (!(zero_cpu && l.cpu_limit == 0) && fork_option_check_cpu_limit_any(l.cpu_limit, err) < 0)
                        return MIN(rest_reply_error(req, 400, "%s", err), 0);
                given |= LIMIT_CPU;
        }
        if (j->disk_rate) {
                if (rate_limit_from_json(j->disk_rate, "disk_rate", &l.disk_rate, err) < 0)
                        return MIN(rest_reply_error(req, 400, "%s", err), 0);
                given |= LIMIT_DISK_RATE;
        }
        if (j->net_rate) {
                if (rate_limit_from_json(j->net_rate, "net_rate", &l.net_rate, err) < 0)
                        return MIN(rest_reply_error(req, 400, "%s", err), 0);
                given |= LIMIT_NET_RATE;
        }
        *ret = l;
        *ret_given = given;
        return 1;
}

/* The limits given into an open a{sv}. */
static int append_limits(sd_bus_message *m, const struct sandbox_limits *l, unsigned given) {
        int r = 0;

        if (given & LIMIT_CPU)
                r = sd_bus_message_append(m, "{sv}", "cpu_limit", "d", l->cpu_limit);
        if (r >= 0 && (given & LIMIT_DISK_RATE))
                r = bus_append_rate(m, "disk_rate", &l->disk_rate);
        if (r >= 0 && (given & LIMIT_NET_RATE))
                r = bus_append_rate(m, "net_rate", &l->net_rate);
        return r;
}

struct fork_args {
        char snapshot_tag[REST_TAG_MAX + 2];
        int64_t n;
        bool per_child_netns;
        int64_t memory_limit_mib;
        bool live_fork;
        bool prewarm;
        bool hugepages;
        char network[16]; /* "": not given */
        int64_t timeout_secs; /* TIMEOUT_UNSET: not given */
        char on_timeout[8];   /* "": not given */
        struct limits_json limits;
};

/* timeout_secs absent (or null): no deadline. */
#define TIMEOUT_UNSET INT64_MIN

/* timeout_secs and on_timeout of a body: 1 when they are fine, else
 * the 400 is queued and this returns 0 or the reply's errno. */
static int check_timeout(RestRequest *req, int64_t secs, const char *on_timeout, bool required) {
        char err[FORK_OPTION_ERROR_MAX];

        if (fork_option_check_deadline(secs != TIMEOUT_UNSET, secs, on_timeout, required, err) >= 0)
                return 1;
        return MIN(rest_reply_error(req, 400, "%s", err), 0);
}

/* The two timeout options into an open a{sv}, if given. */
static int append_timeout(sd_bus_message *m, int64_t secs, const char *on_timeout) {
        int r = 0;

        if (secs != TIMEOUT_UNSET)
                r = sd_bus_message_append(m, "{sv}", "timeout_secs", "u", (uint32_t) secs);
        if (r >= 0 && on_timeout[0])
                r = sd_bus_message_append(m, "{sv}", "on_timeout", "s", on_timeout);
        return r;
}

#define TIMEOUT_FIELDS(type)                                                                                     \
        { "timeout_secs", JSON_KIND_INT64, NULL, offsetof(type, timeout_secs), 0, JSON_NULLABLE },             \
        { "on_timeout", JSON_KIND_STRING, NULL, offsetof(type, on_timeout), JSON_FIELD_SIZE(type, on_timeout), \
          JSON_NULLABLE }

int rest_route_sandboxes_create(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "snapshot_tag", JSON_KIND_STRING, NULL, offsetof(struct fork_args, snapshot_tag),
                  JSON_FIELD_SIZE(struct fork_args, snapshot_tag), JSON_MANDATORY },
                { "n", JSON_KIND_INT64, NULL, offsetof(struct fork_args, n), 0, 0 },
                { "per_child_netns", JSON_KIND_BOOL, NULL, offsetof(struct fork_args, per_child_netns), 0, 0 },
                { "memory_limit_mib", JSON_KIND_INT64, NULL, offsetof(struct fork_args, memory_limit_mib), 0,
                  JSON_NULLABLE },
                { "live_fork", JSON_KIND_BOOL, NULL, offsetof(struct fork_args, live_fork), 0, 0 },
                /* forkd's: a throwaway snapshot after each restore, so that the first branch
                 * of the child does not pay for a cold page cache in its pause. Here a branch
                 * pauses the source for the state save and a fork(2) only, in every mode, and
                 * the snapshot's pages are already in the page cache, mapped by its template:
                 * there is nothing to warm, so it has no effect (docs/rest-api.md). */
                { "prewarm", JSON_KIND_BOOL, NULL, offsetof(struct fork_args, prewarm), 0, 0 },
                /* forkd's: back the child's RAM with 2 MiB huge pages. Refused when true, below. */
                { "hugepages", JSON_KIND_BOOL, NULL, offsetof(struct fork_args, hugepages), 0, 0 },
                /* "none" or "egress", for snapshots made with a NIC; forkd says what is wrong */
                { "network", JSON_KIND_STRING, NULL, offsetof(struct fork_args, network),
                  JSON_FIELD_SIZE(struct fork_args, network), JSON_NULLABLE },
                TIMEOUT_FIELDS(struct fork_args),
                LIMIT_FIELDS(struct fork_args, limits),
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct fork_args a = { .n = 1, .timeout_secs = TIMEOUT_UNSET };
        char err[FORK_OPTION_ERROR_MAX];
        struct sandbox_limits limits;
        unsigned limits_given;
        int r;

        r = rest_parse_body(req, false, table, &a,
                            &(struct rest_body_rules) { .tag = "snapshot_tag", .tag_value = a.snapshot_tag, .n = "n",
                                                        .n_max = FORK_N_MAX },
                            &o);
        if (r <= 0)
                return r;
        if (a.n < 1 || a.n > FORK_N_MAX)
                return rest_reply_error(req, 400, "n must be an integer between 1 and %d", FORK_N_MAX);
        if (a.memory_limit_mib != 0 && fork_option_check_memory_limit_mib(a.memory_limit_mib, err) < 0)
                return rest_reply_error(req, 400, "%s", err);
        if (a.network[0] && fork_option_check_network(a.network, err) < 0)
                return rest_reply_error(req, 400, "%s", err);
        r = check_timeout(req, a.timeout_secs, a.on_timeout, false);
        if (r <= 0)
                return r;
        r = limits_from_body(req, &a.limits, false, &limits, &limits_given);
        if (r <= 0)
                return r;
        /* A child's RAM is a MAP_PRIVATE mapping of the snapshot's memory.bin, shared
         * with its siblings through the page cache; huge pages could back it only as a
         * private copy of all of RAM per child (hugetlbfs), which is the cost a fork
         * here exists to avoid. Said rather than silently ignored. */
        if (a.hugepages)
                return rest_reply_error(req, 400,
                                        "hugepages is not supported: a sandbox's RAM is the snapshot's memory.bin mapped "
                                        "copy-on-write and shared through the page cache, which huge pages cannot back "
                                        "without copying all of it for every child; send hugepages: false or leave it out");

        r = rest_new_manager_call(req, "Fork", &m);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        r = sd_bus_message_append(m, "su", a.snapshot_tag, (uint32_t) a.n);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0)
                r = sd_bus_message_append(m, "{sv}", "per_child_netns", "b", a.per_child_netns);
        if (r >= 0 && a.memory_limit_mib > 0)
                r = sd_bus_message_append(m, "{sv}", "memory_limit_mib", "u", (uint32_t) a.memory_limit_mib);
        if (r >= 0)
                r = sd_bus_message_append(m, "{sv}", "live_fork", "b", a.live_fork);
        if (r >= 0 && a.network[0])
                r = sd_bus_message_append(m, "{sv}", "network", "s", a.network);
        if (r >= 0)
                r = append_timeout(m, a.timeout_secs, a.on_timeout);
        if (r >= 0)
                r = append_limits(m, &limits, limits_given);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, REST_CALL_TIMEOUT_FORK, rest_on_reply_array_201);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        return 0;
}

/* ?usage=false: without each sandbox's "usage" (ListSandboxesEx), for callers that list often. */
int rest_route_sandboxes_list(RestRequest *req) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        int usage = rest_parse_bool_arg(rest_request_query(req, "usage")), r;

        if (usage < 0)
                return rest_reply_error(req, 400, "usage must be true or false");
        if (!rest_request_query(req, "usage") || usage)
                return rest_call_manager(req, "ListSandboxes", REST_CALL_TIMEOUT_SHORT, rest_on_reply_array_200,
                                         NULL);
        r = rest_new_manager_call(req, "ListSandboxesEx", &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "a{sv}", 1, "usage", "b", 0);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, REST_CALL_TIMEOUT_SHORT, rest_on_reply_array_200);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        return 0;
}

int rest_route_sandbox_get(RestRequest *req) {
        const char *id = rest_param_or_reply(req, "sandbox id");

        if (!id)
                return 0;
        return rest_call_manager(req, "GetSandbox", REST_CALL_TIMEOUT_SHORT, rest_on_reply_dict_200, "s", id);
}

int rest_route_sandbox_delete(RestRequest *req) {
        const char *id = rest_param_or_reply(req, "sandbox id");

        if (!id)
                return 0;
        return rest_call_manager(req, "TerminateSandbox", REST_CALL_TIMEOUT_SHORT, rest_on_reply_empty_204, "s", id);
}

/* PATCH /v1/sandboxes/:id {"cpu_limit": X, "disk_rate": {...}, "net_rate": {...},
 * "memory_limit_mib": N}: the limits of a sandbox, live. */
struct limits_args {
        struct limits_json limits;
        int64_t memory_limit_mib; /* -1: not given */
};

int rest_route_sandbox_patch(RestRequest *req) {
        static const struct json_dispatch table[] = {
                LIMIT_FIELDS(struct limits_args, limits),
                { "memory_limit_mib", JSON_KIND_INT64, NULL, offsetof(struct limits_args, memory_limit_mib), 0, 0 },
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct limits_args a = { .memory_limit_mib = -1 };
        char err[FORK_OPTION_ERROR_MAX];
        struct sandbox_limits limits;
        unsigned given;
        const char *id;
        int r;

        id = rest_param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        r = rest_parse_body(req, false, table, &a, NULL, &o);
        if (r <= 0)
                return r;
        r = limits_from_body(req, &a.limits, true, &limits, &given);
        if (r <= 0)
                return r;
        if (a.memory_limit_mib != -1 && fork_option_check_memory_limit_mib(a.memory_limit_mib, err) < 0)
                return rest_reply_error(req, 400, "%s", err);
        if (given == 0 && a.memory_limit_mib == -1)
                return rest_reply_error(req, 400, "give at least one of cpu_limit, disk_rate, net_rate and "
                                                  "memory_limit_mib");

        r = rest_new_manager_call(req, "SetSandboxLimits", &m);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        r = sd_bus_message_append(m, "s", id);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0)
                r = append_limits(m, &limits, given);
        if (r >= 0 && a.memory_limit_mib != -1)
                r = sd_bus_message_append(m, "{sv}", "memory_limit_mib", "u", (uint32_t) a.memory_limit_mib);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, REST_CALL_TIMEOUT_SHORT, rest_on_reply_dict_200);
        return r < 0 ? rest_reply_call_failed(req, r) : 0;
}

struct merge_args {
        char winner[REST_TAG_MAX + 2];
};

int rest_route_sandbox_merge(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "winner", JSON_KIND_STRING, NULL, offsetof(struct merge_args, winner),
                  JSON_FIELD_SIZE(struct merge_args, winner), JSON_MANDATORY },
                {}
        };
        _cleanup_json_ struct json_object *o = NULL;
        struct merge_args a = {};
        const char *id;
        int r;

        id = rest_param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        r = rest_parse_body(req, false, table, &a,
                            &(struct rest_body_rules) { .tag = "winner", .tag_value = a.winner }, &o);
        if (r <= 0)
                return r;
        if (!strcmp(a.winner, id))
                return rest_reply_error(req, 400, "winner must be another sandbox than '%s' itself", id);
        return rest_call_manager(req, "MergeSandbox", REST_CALL_TIMEOUT_SHORT, rest_on_reply_dict_200, "ss", id,
                                 a.winner);
}

struct branch_args {
        char tag[REST_TAG_MAX + 2];
        char mode[8];
        bool diff;
        bool live;
        bool measure_diff;
        bool wait;
        char parent_tag[REST_TAG_MAX + 2];
};

/* A branch whose parent_tag must first be checked against the source's snapshot. */
struct branch_call {
        char id[REST_TAG_MAX + 2];
        char tag[REST_TAG_MAX + 2];
        char parent_tag[REST_TAG_MAX + 2];
        const char *mode;
        bool wait;
};

static int send_branch(RestRequest *req, const char *id, const char *tag, const char *mode, bool wait,
                       bool detached) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        int r;

        if (!detached)
                return rest_call_manager(req, "BranchSandbox", REST_CALL_TIMEOUT_FORK, rest_on_reply_dict_201, "sssb",
                                         id, tag, mode, (int) wait);
        r = rest_new_manager_call(req, "BranchSandbox", &m);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        r = sd_bus_message_append(m, "sssb", id, tag, mode, (int) wait);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call_detached(req, m, REST_CALL_TIMEOUT_FORK, rest_on_reply_dict_201);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        return 0;
}

/* GetSandbox of the source answered: branch if parent_tag names the snapshot it runs from. */
static int on_reply_branch_source(RestRequest *req, sd_bus_message *reply) {
        const struct branch_call *b = rest_request_data(req);
        _cleanup_json_ struct json_object *o = NULL;
        struct json_object *v;
        int r;

        r = rest_reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        r = rest_bus_read_dict_json(reply, &o);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        if (!json_object_object_get_ex(o, "snapshot_tag", &v) || !json_object_is_type(v, json_type_string))
                return rest_reply_error(req, 500, "unexpected reply from the daemon: a sandbox without snapshot_tag");
        if (strcmp(json_object_get_string(v), b->parent_tag) != 0)
                return rest_reply_error(req, 400,
                                        "parent_tag '%s' must be the snapshot sandbox %s runs from ('%s'): a diff "
                                        "branch is a link of that snapshot's chain",
                                        b->parent_tag, b->id, json_object_get_string(v));
        return send_branch(req, b->id, b->tag, b->mode, b->wait, true);
}

int rest_route_sandbox_branch(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "tag", JSON_KIND_STRING, NULL, offsetof(struct branch_args, tag), JSON_FIELD_SIZE(struct branch_args, tag),
                  JSON_NULLABLE },
                { "mode", JSON_KIND_STRING, NULL, offsetof(struct branch_args, mode),
                  JSON_FIELD_SIZE(struct branch_args, mode), 0 },
                { "diff", JSON_KIND_BOOL, NULL, offsetof(struct branch_args, diff), 0, 0 },
                /* forkd's legacy spelling of mode "live" (its API before mode existed). */
                { "live", JSON_KIND_BOOL, NULL, offsetof(struct branch_args, live), 0, 0 },
                /* forkd's Python SDK sends it (Controller.branch_sandbox(measure_diff=True)): forkd's
                 * measurement hook, a diff taken inside a full branch's pause to report what it would
                 * have cost. A branch here pauses for the same few microseconds in every mode, so
                 * there is nothing to measure: accepted with a full branch, the answer is that of
                 * mode "full", and with another mode it is refused as forkd refuses it. */
                { "measure_diff", JSON_KIND_BOOL, NULL, offsetof(struct branch_args, measure_diff), 0, 0 },
                { "wait", JSON_KIND_BOOL, NULL, offsetof(struct branch_args, wait), 0, 0 },
                /* forkd's snapshot-diff sends it: the chain parent of a diff branch. Here a diff
                 * branch is always a link of the source's snapshot, so it must name that one. */
                { "parent_tag", JSON_KIND_STRING, NULL, offsetof(struct branch_args, parent_tag),
                  JSON_FIELD_SIZE(struct branch_args, parent_tag), JSON_NULLABLE },
                {}
        };
        _cleanup_json_ struct json_object *o = NULL;
        _cleanup_free_ struct branch_call *b = NULL;
        struct branch_args a = { .wait = true };
        const char *field = NULL, *reason = NULL, *id, *mode;
        bool has_mode;
        int r;

        id = rest_param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        if (rest_request_parse_json(req, true, &o) < 0)
                return 0;
        r = json_dispatch_full(o, table, REST_BODY_FLAGS, &a, &field, &reason);
        if (r < 0) {
                if (field && !strcmp(field, "mode") && r == -ENAMETOOLONG)
                        return rest_reply_error(req, 400, "mode must be \"full\", \"diff\" or \"live\"");
                if (field && (!strcmp(field, "tag") || !strcmp(field, "parent_tag")) && r == -ENAMETOOLONG)
                        return rest_reply_error(req, 400, "invalid %s: at most %d characters", field, REST_TAG_MAX);
                return rest_reply_dispatch_error(req, r, field, reason);
        }
        if (a.tag[0] && !rest_tag_is_valid(a.tag))
                return rest_reply_error(req, 400, "invalid tag '%s': must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$", a.tag);
        if (a.parent_tag[0] && !rest_tag_is_valid(a.parent_tag))
                return rest_reply_error(req, 400, "invalid parent_tag '%s': must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$",
                                        a.parent_tag);
        has_mode = json_object_object_get_ex(o, "mode", NULL);
        if (has_mode && strcmp(a.mode, "full") && strcmp(a.mode, "diff") && strcmp(a.mode, "live"))
                return rest_reply_error(req, 400, "mode must be \"full\", \"diff\" or \"live\"");
        if (has_mode && json_object_object_get_ex(o, "diff", NULL))
                return rest_reply_error(req, 400, "mode and diff are mutually exclusive; use mode");
        if (has_mode && json_object_object_get_ex(o, "live", NULL))
                return rest_reply_error(req, 400, "mode and live are mutually exclusive; use mode");
        if (a.diff && a.live)
                return rest_reply_error(req, 400, "diff and live are mutually exclusive; use mode");
        /* diff: true and live: true are the legacy spellings of modes "diff" and "live"; no mode means "full". */
        mode = has_mode ? a.mode : a.diff ? "diff" : a.live ? "live" : "full";
        if (!a.wait && strcmp(mode, "live") != 0)
                return rest_reply_error(req, 400, "wait: false needs mode: \"live\"");
        if (a.measure_diff && strcmp(mode, "full") != 0)
                return rest_reply_error(req, 400, "measure_diff needs mode \"full\" (and no diff: true)");
        if (!a.parent_tag[0])
                return send_branch(req, id, a.tag, mode, a.wait, false);

        if (strcmp(mode, "diff") != 0)
                return rest_reply_error(req, 400, "parent_tag needs mode \"diff\": only a diff branch is a link of a chain");
        b = calloc(1, sizeof(*b));
        if (!b)
                return rest_reply_error(req, 500, "out of memory");
        strcpy(b->id, id);
        strcpy(b->tag, a.tag);
        strcpy(b->parent_tag, a.parent_tag);
        b->mode = "diff";
        b->wait = a.wait;
        {
                _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;

                r = rest_new_manager_call(req, "GetSandbox", &m);
                if (r < 0)
                        return rest_reply_call_failed(req, r);
                r = sd_bus_message_append(m, "s", id);
                if (r < 0)
                        return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
                rest_request_set_data(req, b, free);
                r = rest_call_detached(req, m, REST_CALL_TIMEOUT_SHORT, on_reply_branch_source);
                if (r < 0) {
                        rest_request_set_data(req, NULL, NULL);
                        return rest_reply_call_failed(req, r);
                }
        }
        TAKE_PTR(b);
        rest_request_wait(req);
        return 0;
}

#define SANDBOX_FORK_N_MAX 32

struct sandbox_fork_args {
        int64_t n;
        int64_t timeout_secs;
        char on_timeout[8];
        struct limits_json limits;
};

int rest_route_sandbox_fork(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "n", JSON_KIND_INT64, NULL, offsetof(struct sandbox_fork_args, n), 0, 0 },
                TIMEOUT_FIELDS(struct sandbox_fork_args),
                LIMIT_FIELDS(struct sandbox_fork_args, limits),
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct sandbox_fork_args a = { .n = 1, .timeout_secs = TIMEOUT_UNSET };
        const char *field = NULL, *reason = NULL, *id;
        struct sandbox_limits limits;
        unsigned limits_given;
        int r;

        id = rest_param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        if (rest_request_parse_json(req, true, &o) < 0)
                return 0;
        r = json_dispatch_full(o, table, REST_BODY_FLAGS, &a, &field, &reason);
        if (r == -ERANGE || (r >= 0 && (a.n < 1 || a.n > SANDBOX_FORK_N_MAX)))
                /* Podflare's words, exactly */
                return rest_reply_error(req, 400, "n must be between 1 and %d", SANDBOX_FORK_N_MAX);
        if (r == -EINVAL && field && !strcmp(field, "n"))
                return rest_reply_error(req, 400, "n must be an integer between 1 and %d", SANDBOX_FORK_N_MAX);
        if (r < 0)
                return rest_reply_dispatch_error(req, r, field, reason);
        r = check_timeout(req, a.timeout_secs, a.on_timeout, false);
        if (r <= 0)
                return r;
        r = limits_from_body(req, &a.limits, false, &limits, &limits_given);
        if (r <= 0)
                return r;
        if (a.timeout_secs == TIMEOUT_UNSET && limits_given == 0)
                return rest_call_manager(req, "ForkSandbox", REST_CALL_TIMEOUT_FORK, on_reply_sandbox_fork, "su", id,
                                         (uint32_t) a.n);
        /* With a deadline or limits for the children. */
        r = rest_new_manager_call(req, "ForkSandboxEx", &m);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        r = sd_bus_message_append(m, "su", id, (uint32_t) a.n);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0)
                r = append_timeout(m, a.timeout_secs, a.on_timeout);
        if (r >= 0)
                r = append_limits(m, &limits, limits_given);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, REST_CALL_TIMEOUT_FORK, on_reply_sandbox_fork);
        return r < 0 ? rest_reply_call_failed(req, r) : 0;
}

/* POST /v1/sandboxes/:id/timeout {"timeout_secs": N, "on_timeout": ...}: a new deadline from now. */
struct timeout_args {
        int64_t timeout_secs;
        char on_timeout[8];
};

int rest_route_sandbox_timeout(RestRequest *req) {
        static const struct json_dispatch table[] = {
                TIMEOUT_FIELDS(struct timeout_args),
                {}
        };
        _cleanup_json_ struct json_object *o = NULL;
        struct timeout_args a = { .timeout_secs = TIMEOUT_UNSET };
        const char *id = rest_param_or_reply(req, "sandbox id");
        int r;

        if (!id)
                return 0;
        r = rest_parse_body(req, false, table, &a, NULL, &o);
        if (r <= 0)
                return r;
        r = check_timeout(req, a.timeout_secs, a.on_timeout, true);
        if (r <= 0)
                return r;
        return rest_call_manager(req, "SetSandboxTimeout", REST_CALL_TIMEOUT_SHORT, rest_on_reply_dict_200, "sus", id,
                                 (uint32_t) a.timeout_secs, a.on_timeout);
}

/* POST /v1/sandboxes/:id/pause and /resume: a body, if any, must be JSON; its
 * fields are ignored (none are defined). */
static int route_sandbox_pause_or_resume(RestRequest *req, const char *member) {
        _cleanup_json_ struct json_object *o = NULL;
        const char *id = rest_param_or_reply(req, "sandbox id");

        if (!id)
                return 0;
        if (rest_request_parse_json(req, true, &o) < 0)
                return 0;
        return rest_call_manager(req, member, REST_CALL_TIMEOUT_FORK, rest_on_reply_dict_200, "s", id);
}

int rest_route_sandbox_pause(RestRequest *req) {
        return route_sandbox_pause_or_resume(req, "PauseSandbox");
}

int rest_route_sandbox_resume(RestRequest *req) {
        return route_sandbox_pause_or_resume(req, "ResumeSandbox");
}

