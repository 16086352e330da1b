/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* The REST routes of the forkd API, each translated into one asynchronous
 * call to org.forkd.Manager. Validation happens here, before any D-Bus call;
 * the daemon validates again. */

#include <limits.h>

#include "boot-files.h"
#include "file-hashes.h"
#include "fork-options.h"
#include "forkd-bus.h"
#include "json-util.h"
#include "macro.h"
#include "rest-bus.h"
#include "rest-files.h"
#include "rest-metrics.h"
#include "rest-pack.h"
#include "rest-reply.h"
#include "rest-request.h"
#include "rest-routes.h"
#include "rest-util.h"
#include "time-util.h"

#define CALL_TIMEOUT_SHORT (30 * USEC_PER_SEC)
#define CALL_TIMEOUT_FORK (600 * USEC_PER_SEC)
#define BOOT_WAIT_DEFAULT 30
#define BOOT_WAIT_MAX 600
#define EXEC_TIMEOUT_MAX 3600
#define EXEC_ARGS_MAX 4096
#define FORK_N_MAX 1000
#define CODE_MAX (256 * 1024)
#define CALL_TIMEOUT_DIFF (120 * USEC_PER_SEC)
#define IN_SET_N(r) ((r) == -EINVAL || (r) == -ERANGE)

/* json_dispatch() flags for request bodies: no JSON_REJECT_UNKNOWN. forkd's
 * own clients send fields that only some forkd versions know (prewarm,
 * hugepages, measure_diff, parent_tag, ...) and forkd ignores the ones it
 * does not know; so does forkd-rest (docs/rest-api.md, "Requests"). */
#define BODY_FLAGS 0u

static int reply_dispatch_error(RestRequest *req, int r, const char *field, const char *reason) {
        if (r == -ENOMEM)
                return rest_reply_error(req, 500, "out of memory");
        if (!field)
                return rest_reply_error(req, 400, "request body: %s", reason ?: "invalid");
        return rest_reply_error(req, 400, "field '%s': %s", field, reason ?: "invalid value");
}

/* What a body's fields mean for the error a client gets back. */
struct body_rules {
        const char *tag;       /* a field that holds a tag: too long or malformed gets the tag error */
        const char *tag_value; /* where the dispatch puts it, checked after parsing */
        const char *n;         /* a field that holds a count: out of range gets the count error */
        int n_max;
};

/* Parse the body as strict JSON into base by table and check the rules' tag.
 * Fields the table does not name are ignored, as forkd does (its SDKs, MCP
 * server and CLI send fields of other versions, see BODY_FLAGS); a field it
 * names must have the right type and range. Returns 1 when it parsed; otherwise the error is
 * queued and this returns 0 (or the reply's negative errno). *ret_obj is the
 * parsed body. */
static int parse_body(RestRequest *req, bool allow_empty, const struct json_dispatch *table, void *base,
                      const struct body_rules *rules, struct json_object **ret_obj) {
        const char *field = NULL, *reason = NULL;
        int r;

        if (rest_request_parse_json(req, allow_empty, ret_obj) < 0)
                return 0;
        r = json_dispatch_full(*ret_obj, table, BODY_FLAGS, base, &field, &reason);
        if (r >= 0) {
                if (!rules || !rules->tag_value || rest_tag_is_valid(rules->tag_value))
                        return 1;
                r = rest_reply_error(req, 400, "invalid %s '%s': must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$",
                                     rules->tag, rules->tag_value);
                return MIN(r, 0);
        }
        if (rules && rules->tag && field && !strcmp(field, rules->tag) && r == -ENAMETOOLONG)
                r = rest_reply_error(req, 400, "invalid %s: at most %d characters", rules->tag, REST_TAG_MAX);
        else if (rules && rules->n && field && !strcmp(field, rules->n) && IN_SET_N(r))
                r = rest_reply_error(req, 400, "%s must be an integer between 1 and %d", rules->n, rules->n_max);
        else
                r = reply_dispatch_error(req, r, field, reason);
        return MIN(r, 0);
}

/* A '%' path segment that must be a tag or sandbox id. */
static const char *param_or_reply(RestRequest *req, const char *what) {
        const char *p = rest_request_param(req);

        if (!rest_tag_is_valid(p)) {
                (void) rest_reply_error(req, 400, "invalid %s: must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$", what);
                return NULL;
        }
        return p;
}

/* Failure to create or send a call: no reply is queued yet. */
static int reply_call_failed(RestRequest *req, int r) {
        if (r == -EBUSY)
                return rest_reply_error(req, 503, "too many requests in flight to the daemon, retry later");
        if (r == -ENOMEM)
                return rest_reply_error(req, 500, "out of memory");
        return rest_reply_error(req, 503, "forkd daemon unavailable: cannot reach the bus: %s", strerror(-r));
}

static int reply_bus_result(RestRequest *req, sd_bus_message *reply, unsigned exists_status) {
        const sd_bus_error *e = sd_bus_message_get_error(reply);

        if (e)
                return rest_reply_bus_error(req, e, exists_status);
        return 1;
}

/* ---- replies ---- */

static int on_reply_dict(RestRequest *req, sd_bus_message *reply, unsigned status, unsigned exists_status) {
        _cleanup_json_ struct json_object *o = NULL;
        int r;

        r = reply_bus_result(req, reply, exists_status);
        if (r <= 0)
                return r;
        r = rest_bus_read_dict_json(reply, &o);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        return rest_reply_json(req, status, o);
}

static int on_reply_dict_200(RestRequest *req, sd_bus_message *reply) {
        return on_reply_dict(req, reply, 200, 0);
}

static int on_reply_dict_201(RestRequest *req, sd_bus_message *reply) {
        return on_reply_dict(req, reply, 201, 0);
}

static int on_reply_snapshot_created(RestRequest *req, sd_bus_message *reply) {
        /* The spec says 400 for "snapshot already exists" here. */
        return on_reply_dict(req, reply, 201, 400);
}

static int on_reply_snapshot_info(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *o = NULL;
        int r;

        r = reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        r = rest_bus_read_dict_json(reply, &o);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        /* The spec always carries these three; the daemon may omit empty ones. */
        if (!json_object_object_get_ex(o, "ancestors", NULL))
                json_object_object_add(o, "ancestors", json_object_new_array());
        if (!json_object_object_get_ex(o, "dependents", NULL))
                json_object_object_add(o, "dependents", json_object_new_array());
        if (!json_object_object_get_ex(o, "chain_depth", NULL))
                json_object_object_add(o, "chain_depth", json_object_new_int64(0));
        return rest_reply_json(req, 200, o);
}

static int on_reply_array(RestRequest *req, sd_bus_message *reply, unsigned status) {
        _cleanup_json_ struct json_object *a = NULL;
        int r;

        r = reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        r = rest_bus_read_dict_array_json(reply, &a);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        return rest_reply_json(req, status, a);
}

static int on_reply_array_200(RestRequest *req, sd_bus_message *reply) {
        return on_reply_array(req, reply, 200);
}

static int on_reply_array_201(RestRequest *req, sd_bus_message *reply) {
        return on_reply_array(req, reply, 201);
}

static int on_reply_empty_204(RestRequest *req, sd_bus_message *reply) {
        int r = reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        return rest_reply_no_content(req);
}

/* Ping, Exec, Eval: the agent's JSON, passed through unchanged. */
static int on_reply_agent(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *o = NULL;
        const char *s;
        int r;

        r = reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        r = sd_bus_message_read_basic(reply, 's', &s);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        r = json_parse_strict(s, strlen(s), 16 * 1024 * 1024, 64, &o, NULL);
        if (r < 0)
                return rest_reply_error(req, 500, "the guest agent's reply is not a JSON object");
        return rest_reply_raw(req, 200, "application/json", s, strlen(s));
}

/* ---- plain routes ---- */

static int route_healthz(RestRequest *req) {
        static const char body[] = "{\"ok\":true}";
        return rest_reply_raw(req, 200, "application/json", body, sizeof body - 1);
}

static int route_version(RestRequest *req) {
        static const char body[] = "{\"version\":\"" FORKD_VERSION "\",\"api\":\"v1\"}";
        return rest_reply_raw(req, 200, "application/json", body, sizeof body - 1);
}

static int metrics_reply(RestRequest *req, bool up, unsigned snapshots, unsigned sandboxes) {
        _cleanup_free_ char *buf = NULL;
        size_t len = 0;
        FILE *f;
        int r;

        f = open_memstream(&buf, &len);
        if (!f)
                return rest_reply_error(req, 500, "out of memory");
        fputs("# HELP forkd_build_info Build information; always 1.\n"
              "# TYPE forkd_build_info gauge\n"
              "forkd_build_info{version=\"" FORKD_VERSION "\"} 1\n"
              "# HELP forkd_rest_daemon_up Whether the last scrape reached the forkd daemon.\n"
              "# TYPE forkd_rest_daemon_up gauge\n",
              f);
        fprintf(f, "forkd_rest_daemon_up %d\n", up);
        if (up)
                fprintf(f,
                        "# HELP forkd_snapshots_total Registered snapshots.\n"
                        "# TYPE forkd_snapshots_total gauge\n"
                        "forkd_snapshots_total %u\n"
                        "# HELP forkd_sandboxes_active Currently alive child VMs.\n"
                        "# TYPE forkd_sandboxes_active gauge\n"
                        "forkd_sandboxes_active %u\n",
                        snapshots, sandboxes);
        r = rest_metrics_format(rest_request_server(req), f);
        if (fclose(f) != 0 || r < 0)
                return rest_reply_error(req, 500, "cannot format metrics");
        return rest_reply_raw(req, 200, "text/plain; version=0.0.4; charset=utf-8", buf, len);
}

static int on_reply_metrics(RestRequest *req, sd_bus_message *reply) {
        unsigned snapshots = 0, sandboxes = 0;
        bool have_snap = false, have_sb = false;
        int r;

        if (sd_bus_message_is_method_error(reply, NULL))
                return metrics_reply(req, false, 0, 0);

        r = sd_bus_message_enter_container(reply, 'a', "{sv}");
        if (r < 0)
                return metrics_reply(req, false, 0, 0);
        while ((r = sd_bus_message_enter_container(reply, 'e', "sv")) > 0) {
                const char *key;

                if (sd_bus_message_read_basic(reply, 's', &key) < 0)
                        return metrics_reply(req, false, 0, 0);
                if (!strcmp(key, "SnapshotCount"))
                        have_snap = sd_bus_message_read(reply, "v", "u", &snapshots) >= 0;
                else if (!strcmp(key, "SandboxCount"))
                        have_sb = sd_bus_message_read(reply, "v", "u", &sandboxes) >= 0;
                else if (sd_bus_message_skip(reply, "v") < 0)
                        return metrics_reply(req, false, 0, 0);
                if (sd_bus_message_exit_container(reply) < 0)
                        return metrics_reply(req, false, 0, 0);
        }
        return metrics_reply(req, have_snap && have_sb, snapshots, sandboxes);
}

static int route_metrics(RestRequest *req) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        int r;

        r = rest_new_call(req, "/org/forkd/Manager", "org.freedesktop.DBus.Properties", "GetAll", &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "s", "org.forkd.Manager");
        if (r >= 0)
                r = rest_call(req, m, 5 * USEC_PER_SEC, on_reply_metrics);
        if (r < 0)
                return metrics_reply(req, false, 0, 0);
        return 0;
}

/* Build a Manager call with the given signature and arguments, send it. */
static int call_manager(RestRequest *req, const char *member, uint64_t timeout, rest_reply_func cb,
                        const char *types, ...) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        va_list ap;
        int r;

        r = rest_new_manager_call(req, member, &m);
        if (r < 0)
                return reply_call_failed(req, r);
        if (types) {
                va_start(ap, types);
                r = sd_bus_message_appendv(m, types, ap);
                va_end(ap);
                if (r < 0)
                        return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        }
        r = rest_call(req, m, timeout, cb);
        if (r < 0)
                return reply_call_failed(req, r);
        return 0;
}

/* ---- snapshots ---- */

/* 1 with the file open, else the request was answered: 400 with the file and
 * why (the spec's "missing kernel/rootfs" row). */
static int open_boot_file(RestRequest *req, const char *what, const char *path, int *ret_fd) {
        int r = boot_file_open(path, ret_fd);

        if (r == -EISDIR || r == -EINVAL)
                return rest_reply_error(req, 400, "%s %s is not a regular file", what, path);
        if (r < 0)
                return rest_reply_error(req, 400, "cannot open %s %s as forkd-rest's user (uid %u): %s", what, path,
                                        (unsigned) geteuid(), strerror(-r));
        return 1;
}

struct snapshot_create_args {
        char tag[REST_TAG_MAX + 2];
        char kernel[PATH_MAX];
        char rootfs[PATH_MAX];
        int64_t boot_wait_secs;
        int64_t mem_mib;
        bool rw;
        bool network;   /* "network": true */
        bool agent_tcp;
};

/* The spec's "tap" (a host tap as the guest's eth0 there): a string under 64
 * bytes, a boolean or null is accepted, other types are refused. It does not
 * give the snapshot a NIC yet: our own tests send the spec's request, with
 * "tap", everywhere, and every fork of those snapshots would then make a
 * namespace per child and refuse per_child_netns (issue 14's follow-up).
 * Ask for a NIC with "network": true. */
static int parse_tap(struct json_object *v, void *field, const char **ret_error) {
        if (!v || json_object_is_type(v, json_type_boolean))
                return 0;
        if (json_object_is_type(v, json_type_string)) {
                if (json_object_get_string_len(v) >= 64) {
                        *ret_error = "tap must be shorter than 64 bytes";
                        return -ENAMETOOLONG;
                }
                return 0;
        }
        *ret_error = "tap must be a string, a boolean or null";
        return -EINVAL;
}

static int route_snapshots_create(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "tag", JSON_KIND_STRING, NULL, offsetof(struct snapshot_create_args, tag),
                  JSON_FIELD_SIZE(struct snapshot_create_args, tag), JSON_MANDATORY },
                { "kernel", JSON_KIND_STRING, NULL, offsetof(struct snapshot_create_args, kernel),
                  JSON_FIELD_SIZE(struct snapshot_create_args, kernel), JSON_MANDATORY },
                { "rootfs", JSON_KIND_STRING, NULL, offsetof(struct snapshot_create_args, rootfs),
                  JSON_FIELD_SIZE(struct snapshot_create_args, rootfs), JSON_MANDATORY },
                { "boot_wait_secs", JSON_KIND_INT64, NULL, offsetof(struct snapshot_create_args, boot_wait_secs), 0, 0 },
                { "mem_mib", JSON_KIND_INT64, NULL, offsetof(struct snapshot_create_args, mem_mib), 0, JSON_NULLABLE },
                /* accepted for compatibility; forkd has no rw switch here */
                { "rw", JSON_KIND_BOOL, NULL, offsetof(struct snapshot_create_args, rw), 0, JSON_NULLABLE },
                { "network", JSON_KIND_BOOL, NULL, offsetof(struct snapshot_create_args, network), 0, 0 },
                { "agent_tcp", JSON_KIND_BOOL, NULL, offsetof(struct snapshot_create_args, agent_tcp), 0, 0 },
                /* checked, no effect yet (parse_tap()) */
                { "tap", JSON_KIND_ANY, parse_tap, 0, 0, JSON_NULLABLE },
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct snapshot_create_args a = { .boot_wait_secs = BOOT_WAIT_DEFAULT };
        _cleanup_close_ int kernel_fd = -EBADF, rootfs_fd = -EBADF, initrd_fd = -EBADF;
        char initrd[PATH_MAX];
        int r;

        r = parse_body(req, false, table, &a, &(struct body_rules) { .tag = "tag", .tag_value = a.tag }, &o);
        if (r <= 0)
                return r;
        if (!a.kernel[0] || !a.rootfs[0])
                return rest_reply_error(req, 400, "kernel and rootfs must not be empty");
        if (a.boot_wait_secs < 1 || a.boot_wait_secs > BOOT_WAIT_MAX)
                return rest_reply_error(req, 400, "boot_wait_secs must be between 1 and %d", BOOT_WAIT_MAX);
        if (a.mem_mib < 0 || a.mem_mib > 1024 * 1024)
                return rest_reply_error(req, 400, "mem_mib out of range");
        if (a.agent_tcp && !a.network)
                return rest_reply_error(req, 400, "agent_tcp needs network: true (the guest agent's TCP port is "
                                                  "reached through the NIC)");

        /* Opened here, with forkd-rest's own credentials, and handed to forkd as
         * descriptors: forkd never opens a path for the bridge. */
        r = open_boot_file(req, "kernel", a.kernel, &kernel_fd);
        if (r <= 0)
                return r;
        r = open_boot_file(req, "rootfs", a.rootfs, &rootfs_fd);
        if (r <= 0)
                return r;
        if (boot_initrd_beside(a.kernel, initrd, sizeof(initrd)) > 0) {
                r = open_boot_file(req, "initrd (beside the kernel)", initrd, &initrd_fd);
                if (r <= 0)
                        return r;
        }

        r = rest_new_manager_call(req, "CreateSnapshotFromFds", &m);
        if (r < 0)
                return reply_call_failed(req, r);
        r = sd_bus_message_append(m, "shhuu", a.tag, kernel_fd, rootfs_fd, (uint32_t) a.mem_mib,
                                  (uint32_t) a.boot_wait_secs);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0 && initrd_fd >= 0)
                r = sd_bus_message_append(m, "{sv}", "initrd", "h", initrd_fd);
        /* Only when asked: a forkd of before networking knows neither. */
        if (r >= 0 && a.network)
                r = sd_bus_message_append(m, "{sv}", "network", "b", 1);
        if (r >= 0 && a.agent_tcp)
                r = sd_bus_message_append(m, "{sv}", "agent_tcp", "b", 1);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, (uint64_t) (a.boot_wait_secs + 120) * USEC_PER_SEC, on_reply_snapshot_created);
        if (r < 0)
                return reply_call_failed(req, r);
        return 0;
}

static int route_snapshots_list(RestRequest *req) {
        return call_manager(req, "ListSnapshots", CALL_TIMEOUT_SHORT, on_reply_array_200, NULL);
}

static int route_snapshot_delete(RestRequest *req) {
        const char *tag = param_or_reply(req, "tag");
        int cascade, force;

        if (!tag)
                return 0;
        cascade = rest_parse_bool_arg(rest_request_query(req, "cascade"));
        force = rest_parse_bool_arg(rest_request_query(req, "force"));
        if (cascade < 0 || force < 0)
                return rest_reply_error(req, 400, "cascade and force take true or false");
        if (cascade && force)
                return rest_reply_error(req, 400, "?cascade=true and ?force=true are mutually exclusive");
        return call_manager(req, "DeleteSnapshot", CALL_TIMEOUT_FORK, on_reply_empty_204, "sbb", tag, cascade, force);
}

static int route_snapshot_info(RestRequest *req) {
        const char *tag = param_or_reply(req, "tag");

        if (!tag)
                return 0;
        return call_manager(req, "GetSnapshotInfo", CALL_TIMEOUT_SHORT, on_reply_snapshot_info, "s", tag);
}

/* Podflare's answer (seed 002): 200 {"children": [ids]}; 404 {"error": "sandbox not found"}. */
static int on_reply_sandbox_fork(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *a = NULL, *o = NULL, *ids = NULL;
        const sd_bus_error *e = sd_bus_message_get_error(reply);
        int r;

        if (e && sd_bus_error_has_name(e, FORKD_ERROR_NO_SUCH_SANDBOX))
                return rest_reply_error(req, 404, "sandbox not found");
        r = reply_bus_result(req, reply, 0);
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

struct compact_args {
        char to[REST_TAG_MAX + 2];
};

static int route_snapshot_compact(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "to", JSON_KIND_STRING, NULL, offsetof(struct compact_args, to), JSON_FIELD_SIZE(struct compact_args, to),
                  JSON_MANDATORY },
                {}
        };
        _cleanup_json_ struct json_object *o = NULL;
        struct compact_args a = {};
        const char *tag;
        int r;

        tag = param_or_reply(req, "tag");
        if (!tag)
                return 0;
        r = parse_body(req, false, table, &a, &(struct body_rules) { .tag = "to", .tag_value = a.to }, &o);
        if (r <= 0)
                return r;
        if (!strcmp(a.to, tag))
                return rest_reply_error(req, 400, "to must name a new snapshot, not '%s' itself", tag);
        /* 201 SnapshotInfo of the flat snapshot; 409 when to exists or the chain is broken, 404 unknown tag */
        return call_manager(req, "CompactSnapshot", CALL_TIMEOUT_FORK, on_reply_dict_201, "ss", tag, a.to);
}

/* ---- sandboxes ---- */

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
};

/* timeout_secs absent (or null): no deadline. */
#define TIMEOUT_UNSET INT64_MIN

/* timeout_secs and on_timeout of a body (issue 17): 1 when they are fine, else
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

static int route_sandboxes_create(RestRequest *req) {
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
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct fork_args a = { .n = 1, .timeout_secs = TIMEOUT_UNSET };
        char err[FORK_OPTION_ERROR_MAX];
        int r;

        r = parse_body(req, false, table, &a,
                       &(struct body_rules) { .tag = "snapshot_tag", .tag_value = a.snapshot_tag, .n = "n",
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
                return reply_call_failed(req, r);
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
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, CALL_TIMEOUT_FORK, on_reply_array_201);
        if (r < 0)
                return reply_call_failed(req, r);
        return 0;
}

static int route_sandboxes_list(RestRequest *req) {
        return call_manager(req, "ListSandboxes", CALL_TIMEOUT_SHORT, on_reply_array_200, NULL);
}

static int route_sandbox_get(RestRequest *req) {
        const char *id = param_or_reply(req, "sandbox id");

        if (!id)
                return 0;
        return call_manager(req, "GetSandbox", CALL_TIMEOUT_SHORT, on_reply_dict_200, "s", id);
}

static int route_sandbox_delete(RestRequest *req) {
        const char *id = param_or_reply(req, "sandbox id");

        if (!id)
                return 0;
        return call_manager(req, "TerminateSandbox", CALL_TIMEOUT_SHORT, on_reply_empty_204, "s", id);
}

static int route_sandbox_ping(RestRequest *req) {
        const char *id = param_or_reply(req, "sandbox id");

        if (!id)
                return 0;
        return call_manager(req, "Ping", CALL_TIMEOUT_SHORT, on_reply_agent, "s", id);
}

struct exec_args {
        struct json_object *args;
        int64_t timeout_secs;
};

static int route_sandbox_exec(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "args", JSON_KIND_ARRAY, NULL, offsetof(struct exec_args, args), 0, JSON_MANDATORY },
                { "timeout_secs", JSON_KIND_INT64, NULL, offsetof(struct exec_args, timeout_secs), 0, 0 },
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct exec_args a = {};
        const char *id;
        size_t n;
        int r;

        id = param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        r = parse_body(req, false, table, &a, NULL, &o);
        if (r <= 0)
                return r;
        n = json_object_array_length(a.args);
        if (n == 0 || n > EXEC_ARGS_MAX)
                return rest_reply_error(req, 400, "args must hold 1 to %d strings", EXEC_ARGS_MAX);
        if (a.timeout_secs < 0 || a.timeout_secs > EXEC_TIMEOUT_MAX)
                return rest_reply_error(req, 400, "timeout_secs must be between 0 and %d", EXEC_TIMEOUT_MAX);

        r = rest_new_manager_call(req, "Exec", &m);
        if (r < 0)
                return reply_call_failed(req, r);
        r = sd_bus_message_append(m, "s", id);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "s");
        for (size_t i = 0; r >= 0 && i < n; i++) {
                struct json_object *e = json_object_array_get_idx(a.args, i);
                const char *s;
                size_t len;

                if (!e || !json_object_is_type(e, json_type_string))
                        return rest_reply_error(req, 400, "args[%zu]: expected a string", i);
                s = json_object_get_string(e);
                len = (size_t) json_object_get_string_len(e);
                if (memchr(s, 0, len) || !utf8_is_valid_n(s, len))
                        return rest_reply_error(req, 400, "args[%zu]: invalid string", i);
                r = sd_bus_message_append_basic(m, 's', s);
        }
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r >= 0)
                r = sd_bus_message_append(m, "u", (uint32_t) a.timeout_secs);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, (uint64_t) ((a.timeout_secs ?: 30) + 30) * USEC_PER_SEC, on_reply_agent);
        if (r < 0)
                return reply_call_failed(req, r);
        return 0;
}

struct eval_args {
        char *code;
};

static int route_sandbox_eval(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "code", JSON_KIND_STRING, NULL, offsetof(struct eval_args, code), 0, JSON_MANDATORY },
                {}
        };
        _cleanup_json_ struct json_object *o = NULL;
        struct eval_args a = {};
        const char *field = NULL, *reason = NULL, *id;
        int r;

        id = param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        if (rest_request_parse_json(req, false, &o) < 0)
                return 0;
        r = json_dispatch_full(o, table, BODY_FLAGS, &a, &field, &reason);
        if (r < 0) {
                free(a.code);
                return reply_dispatch_error(req, r, field, reason);
        }
        r = call_manager(req, "Eval", CALL_TIMEOUT_SHORT, on_reply_agent, "ss", id, a.code);
        free(a.code);
        return r;
}

/* run_code: the spec's four fields, checked, plus the agent's truncated and
 * timed_out flags where it sends them. */
static int on_reply_run_code(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *o = NULL, *out = NULL;
        struct json_object *v;
        const char *s;
        int r;

        r = reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        r = sd_bus_message_read_basic(reply, 's', &s);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        r = json_parse_strict(s, strlen(s), 16 * 1024 * 1024, 64, &o, NULL);
        if (r < 0)
                return rest_reply_error(req, 500, "the guest agent's reply is not a JSON object");
        out = json_object_new_object();
        if (!out)
                return rest_reply_error(req, 500, "out of memory");
        for (unsigned i = 0; i < 2; i++) {
                const char *k = i == 0 ? "stdout" : "stderr";

                if (!json_object_object_get_ex(o, k, &v) || !json_object_is_type(v, json_type_string))
                        return rest_reply_error(req, 500, "the guest agent's reply has no %s string", k);
                json_object_object_add(out, k, json_object_get(v));
        }
        if (!json_object_object_get_ex(o, "error", &v) ||
            (v && !json_object_is_type(v, json_type_string)))
                return rest_reply_error(req, 500, "the guest agent's reply has no error string or null");
        json_object_object_add(out, "error", json_object_get(v));
        if (!json_object_object_get_ex(o, "exit_code", &v) || !json_object_is_type(v, json_type_int))
                return rest_reply_error(req, 500, "the guest agent's reply has no integer exit_code");
        json_object_object_add(out, "exit_code", json_object_get(v));
        for (unsigned i = 0; i < 2; i++) {
                const char *k = i == 0 ? "truncated" : "timed_out";

                if (json_object_object_get_ex(o, k, &v) && json_object_is_type(v, json_type_boolean))
                        json_object_object_add(out, k, json_object_get(v));
        }
        return rest_reply_json(req, 200, out);
}

struct run_code_args {
        char *code;
        int64_t timeout_secs;
};

static int route_sandbox_run_code(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "code", JSON_KIND_STRING, NULL, offsetof(struct run_code_args, code), 0, JSON_MANDATORY },
                { "timeout_secs", JSON_KIND_INT64, NULL, offsetof(struct run_code_args, timeout_secs), 0,
                  JSON_NULLABLE },
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct run_code_args a = {};
        const char *field = NULL, *reason = NULL, *id;
        int r;

        id = param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        if (rest_request_parse_json(req, false, &o) < 0)
                return 0;
        r = json_dispatch_full(o, table, BODY_FLAGS, &a, &field, &reason);
        _cleanup_free_ char *code = a.code;
        if (r < 0)
                return reply_dispatch_error(req, r, field, reason);
        if (strlen(code) > CODE_MAX)
                return rest_reply_error(req, 400, "code is longer than %d bytes", CODE_MAX);
        if (strlen(code) != (size_t) json_object_get_string_len(json_object_object_get(o, "code")))
                return rest_reply_error(req, 400, "code must not contain NUL characters");
        if (a.timeout_secs < 0 || a.timeout_secs > EXEC_TIMEOUT_MAX)
                return rest_reply_error(req, 400, "timeout_secs must be between 0 and %d", EXEC_TIMEOUT_MAX);

        r = rest_new_manager_call(req, "RunCode", &m);
        if (r < 0)
                return reply_call_failed(req, r);
        r = sd_bus_message_append(m, "ssu", id, code, (uint32_t) a.timeout_secs);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, (uint64_t) ((a.timeout_secs ?: 30) + 30) * USEC_PER_SEC, on_reply_run_code);
        if (r < 0)
                return reply_call_failed(req, r);
        return 0;
}

struct merge_args {
        char winner[REST_TAG_MAX + 2];
};

static int route_sandbox_merge(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "winner", JSON_KIND_STRING, NULL, offsetof(struct merge_args, winner),
                  JSON_FIELD_SIZE(struct merge_args, winner), JSON_MANDATORY },
                {}
        };
        _cleanup_json_ struct json_object *o = NULL;
        struct merge_args a = {};
        const char *id;
        int r;

        id = param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        r = parse_body(req, false, table, &a, &(struct body_rules) { .tag = "winner", .tag_value = a.winner }, &o);
        if (r <= 0)
                return r;
        if (!strcmp(a.winner, id))
                return rest_reply_error(req, 400, "winner must be another sandbox than '%s' itself", id);
        return call_manager(req, "MergeSandbox", CALL_TIMEOUT_SHORT, on_reply_dict_200, "ss", id, a.winner);
}

static int on_reply_port(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *o = NULL;
        const char *addr;
        int r;

        r = reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        r = sd_bus_message_read_basic(reply, 's', &addr);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        o = json_object_new_object();
        if (!o || json_object_object_add(o, "host_addr", json_object_new_string(addr)) < 0)
                return rest_reply_error(req, 500, "out of memory");
        return rest_reply_json(req, 200, o);
}

struct port_args {
        int64_t port;
};

/* POST /v1/sandboxes/:id/ports {"port": P}: where the host dials the guest's
 * TCP port P. 409 for a sandbox without NIC. */
static int route_sandbox_ports(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "port", JSON_KIND_INT64, NULL, offsetof(struct port_args, port), 0, JSON_MANDATORY },
                {}
        };
        _cleanup_json_ struct json_object *o = NULL;
        struct port_args a = {};
        const char *id;
        int r;

        id = param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        r = parse_body(req, false, table, &a, NULL, &o);
        if (r <= 0)
                return r;
        if (a.port < 1 || a.port > 65535)
                return rest_reply_error(req, 400, "port must be an integer between 1 and 65535");
        return call_manager(req, "ExposePort", CALL_TIMEOUT_SHORT, on_reply_port, "sq", id, (uint16_t) a.port);
}

static int on_reply_diff(RestRequest *req, sd_bus_message *reply) {
        static const char *const keys[3] = { "added", "removed", "modified" };
        _cleanup_json_ struct json_object *out = NULL;
        int r;

        r = reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        out = json_object_new_object();
        if (!out)
                return rest_reply_error(req, 500, "out of memory");
        for (unsigned k = 0; k < 3; k++) {
                struct json_object *l = json_object_new_array();
                const char *s;

                if (!l || json_object_object_add(out, keys[k], l) < 0) {
                        json_object_put(l);
                        return rest_reply_error(req, 500, "out of memory");
                }
                r = sd_bus_message_enter_container(reply, 'a', "s");
                while (r >= 0 && (r = sd_bus_message_read_basic(reply, 's', &s)) > 0)
                        if (json_object_array_add(l, json_object_new_string(s)) < 0)
                                r = -ENOMEM;
                if (r >= 0)
                        r = sd_bus_message_exit_container(reply);
                if (r < 0)
                        return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        }
        return rest_reply_json(req, 200, out);
}

struct diff_args {
        char other[REST_TAG_MAX + 2];
        struct json_object *paths;
};

static int route_sandbox_diff(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "other", JSON_KIND_STRING, NULL, offsetof(struct diff_args, other),
                  JSON_FIELD_SIZE(struct diff_args, other), JSON_MANDATORY },
                { "paths", JSON_KIND_ARRAY, NULL, offsetof(struct diff_args, paths), 0, JSON_NULLABLE },
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct diff_args a = {};
        const char *id;
        size_t n = 0;
        int r;

        id = param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        r = parse_body(req, false, table, &a, &(struct body_rules) { .tag = "other", .tag_value = a.other }, &o);
        if (r <= 0)
                return r;
        if (a.paths) {
                n = json_object_array_length(a.paths);
                if (n < 1 || n > HASH_PATHS_MAX)
                        return rest_reply_error(req, 400, "paths must hold 1 to %u paths (absent: /root and /tmp)",
                                                HASH_PATHS_MAX);
                for (size_t i = 0; i < n; i++) {
                        struct json_object *e = json_object_array_get_idx(a.paths, i);

                        if (!e || !json_object_is_type(e, json_type_string) ||
                            strlen(json_object_get_string(e)) != (size_t) json_object_get_string_len(e) ||
                            !hash_path_is_valid(json_object_get_string(e)))
                                return rest_reply_error(req, 400,
                                                        "paths[%zu]: expected an absolute, normalized path (no '.', "
                                                        "'..', '//' or trailing '/')", i);
                }
        }

        r = rest_new_manager_call(req, "DiffSandboxes", &m);
        if (r < 0)
                return reply_call_failed(req, r);
        r = sd_bus_message_append(m, "ss", id, a.other);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "s");
        for (size_t i = 0; r >= 0 && i < n; i++)
                r = sd_bus_message_append_basic(m, 's', json_object_get_string(json_object_array_get_idx(a.paths, i)));
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, CALL_TIMEOUT_DIFF, on_reply_diff);
        if (r < 0)
                return reply_call_failed(req, r);
        return 0;
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
                return call_manager(req, "BranchSandbox", CALL_TIMEOUT_FORK, on_reply_dict_201, "sssb", id, tag, mode,
                                    (int) wait);
        r = rest_new_manager_call(req, "BranchSandbox", &m);
        if (r < 0)
                return reply_call_failed(req, r);
        r = sd_bus_message_append(m, "sssb", id, tag, mode, (int) wait);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call_detached(req, m, CALL_TIMEOUT_FORK, on_reply_dict_201);
        if (r < 0)
                return reply_call_failed(req, r);
        return 0;
}

/* GetSandbox of the source answered: branch if parent_tag names the snapshot it runs from. */
static int on_reply_branch_source(RestRequest *req, sd_bus_message *reply) {
        const struct branch_call *b = rest_request_data(req);
        _cleanup_json_ struct json_object *o = NULL;
        struct json_object *v;
        int r;

        r = reply_bus_result(req, reply, 0);
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

static int route_sandbox_branch(RestRequest *req) {
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

        id = param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        if (rest_request_parse_json(req, true, &o) < 0)
                return 0;
        r = json_dispatch_full(o, table, BODY_FLAGS, &a, &field, &reason);
        if (r < 0) {
                if (field && !strcmp(field, "mode") && r == -ENAMETOOLONG)
                        return rest_reply_error(req, 400, "mode must be \"full\", \"diff\" or \"live\"");
                if (field && (!strcmp(field, "tag") || !strcmp(field, "parent_tag")) && r == -ENAMETOOLONG)
                        return rest_reply_error(req, 400, "invalid %s: at most %d characters", field, REST_TAG_MAX);
                return reply_dispatch_error(req, r, field, reason);
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
                        return reply_call_failed(req, r);
                r = sd_bus_message_append(m, "s", id);
                if (r < 0)
                        return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
                rest_request_set_data(req, b, free);
                r = rest_call_detached(req, m, CALL_TIMEOUT_SHORT, on_reply_branch_source);
                if (r < 0) {
                        rest_request_set_data(req, NULL, NULL);
                        return reply_call_failed(req, r);
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
};

static int route_sandbox_fork(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "n", JSON_KIND_INT64, NULL, offsetof(struct sandbox_fork_args, n), 0, 0 },
                TIMEOUT_FIELDS(struct sandbox_fork_args),
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct sandbox_fork_args a = { .n = 1, .timeout_secs = TIMEOUT_UNSET };
        const char *field = NULL, *reason = NULL, *id;
        int r;

        id = param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        if (rest_request_parse_json(req, true, &o) < 0)
                return 0;
        r = json_dispatch_full(o, table, BODY_FLAGS, &a, &field, &reason);
        if (r == -ERANGE || (r >= 0 && (a.n < 1 || a.n > SANDBOX_FORK_N_MAX)))
                /* seed 002's words, exactly */
                return rest_reply_error(req, 400, "n must be between 1 and %d", SANDBOX_FORK_N_MAX);
        if (r == -EINVAL && field && !strcmp(field, "n"))
                return rest_reply_error(req, 400, "n must be an integer between 1 and %d", SANDBOX_FORK_N_MAX);
        if (r < 0)
                return reply_dispatch_error(req, r, field, reason);
        r = check_timeout(req, a.timeout_secs, a.on_timeout, false);
        if (r <= 0)
                return r;
        if (a.timeout_secs == TIMEOUT_UNSET)
                return call_manager(req, "ForkSandbox", CALL_TIMEOUT_FORK, on_reply_sandbox_fork, "su", id,
                                    (uint32_t) a.n);
        /* With a deadline for the children. */
        r = rest_new_manager_call(req, "ForkSandboxEx", &m);
        if (r < 0)
                return reply_call_failed(req, r);
        r = sd_bus_message_append(m, "su", id, (uint32_t) a.n);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0)
                r = append_timeout(m, a.timeout_secs, a.on_timeout);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, CALL_TIMEOUT_FORK, on_reply_sandbox_fork);
        return r < 0 ? reply_call_failed(req, r) : 0;
}

/* POST /v1/sandboxes/:id/timeout {"timeout_secs": N, "on_timeout": ...}: a new deadline from now. */
struct timeout_args {
        int64_t timeout_secs;
        char on_timeout[8];
};

static int route_sandbox_timeout(RestRequest *req) {
        static const struct json_dispatch table[] = {
                TIMEOUT_FIELDS(struct timeout_args),
                {}
        };
        _cleanup_json_ struct json_object *o = NULL;
        struct timeout_args a = { .timeout_secs = TIMEOUT_UNSET };
        const char *id = param_or_reply(req, "sandbox id");
        int r;

        if (!id)
                return 0;
        r = parse_body(req, false, table, &a, NULL, &o);
        if (r <= 0)
                return r;
        r = check_timeout(req, a.timeout_secs, a.on_timeout, true);
        if (r <= 0)
                return r;
        return call_manager(req, "SetSandboxTimeout", CALL_TIMEOUT_SHORT, on_reply_dict_200, "sus", id,
                            (uint32_t) a.timeout_secs, a.on_timeout);
}

/* POST /v1/sandboxes/:id/pause and /resume: a body, if any, must be JSON; its
 * fields are ignored (none are defined). */
static int route_sandbox_pause_or_resume(RestRequest *req, const char *member) {
        _cleanup_json_ struct json_object *o = NULL;
        const char *id = param_or_reply(req, "sandbox id");

        if (!id)
                return 0;
        if (rest_request_parse_json(req, true, &o) < 0)
                return 0;
        return call_manager(req, member, CALL_TIMEOUT_FORK, on_reply_dict_200, "s", id);
}

static int route_sandbox_pause(RestRequest *req) {
        return route_sandbox_pause_or_resume(req, "PauseSandbox");
}

static int route_sandbox_resume(RestRequest *req) {
        return route_sandbox_pause_or_resume(req, "ResumeSandbox");
}

const RestRoute rest_routes[] = {
        { "/healthz", true, { { "GET", route_healthz, 0 } }, "GET" },
        /* forkd answers it with a trailing slash too, and its probes use both */
        { "/healthz/", true, { { "GET", route_healthz, 0 } }, "GET" },
        { "/version", false, { { "GET", route_version, 0 } }, "GET" },
        { "/metrics", false, { { "GET", route_metrics, 0 } }, "GET" },
        { "/v1/snapshots", false, { { "GET", route_snapshots_list, 0 }, { "POST", route_snapshots_create, 0 } }, "GET, POST" },
        { "/v1/snapshots/%", false,
          { { "DELETE", route_snapshot_delete, 0 }, { "POST", rest_route_snapshot_post, REST_BUNDLE_MAX } }, "DELETE" },
        { "/v1/snapshots/%/pack", false, { { "GET", rest_route_snapshot_pack, 0 } }, "GET" },
        { "/v1/snapshots/%/info", false, { { "GET", route_snapshot_info, 0 } }, "GET" },
        { "/v1/snapshots/%/compact", false, { { "POST", route_snapshot_compact, 0 } }, "POST" },
        { "/v1/sandboxes", false, { { "GET", route_sandboxes_list, 0 }, { "POST", route_sandboxes_create, 0 } }, "GET, POST" },
        { "/v1/sandboxes/%", false, { { "GET", route_sandbox_get, 0 }, { "DELETE", route_sandbox_delete, 0 } }, "GET, DELETE" },
        { "/v1/sandboxes/%/ping", false, { { "POST", route_sandbox_ping, 0 } }, "POST" },
        { "/v1/sandboxes/%/exec", false, { { "POST", route_sandbox_exec, 0 } }, "POST" },
        { "/v1/sandboxes/%/eval", false, { { "POST", route_sandbox_eval, 0 } }, "POST" },
        { "/v1/sandboxes/%/run_code", false, { { "POST", route_sandbox_run_code, 0 } }, "POST" },
        { "/v1/sandboxes/%/merge", false, { { "POST", route_sandbox_merge, 0 } }, "POST" },
        { "/v1/sandboxes/%/diff", false, { { "POST", route_sandbox_diff, 0 } }, "POST" },
        { "/v1/sandboxes/%/branch", false, { { "POST", route_sandbox_branch, 0 } }, "POST" },
        { "/v1/sandboxes/%/fork", false, { { "POST", route_sandbox_fork, 0 } }, "POST" },
        { "/v1/sandboxes/%/pause", false, { { "POST", route_sandbox_pause, 0 } }, "POST" },
        { "/v1/sandboxes/%/timeout", false, { { "POST", route_sandbox_timeout, 0 } }, "POST" },
        { "/v1/sandboxes/%/resume", false, { { "POST", route_sandbox_resume, 0 } }, "POST" },
        { "/v1/sandboxes/%/ports", false, { { "POST", route_sandbox_ports, 0 } }, "POST" },
        { "/v1/sandboxes/%/files/write", false, { { "POST", rest_route_sandbox_files_write, 0 } }, "POST" },
        { "/v1/sandboxes/%/files/read", false, { { "POST", rest_route_sandbox_files_read, 0 } }, "POST" },
};
const size_t rest_routes_count = ELEMENTSOF(rest_routes);
