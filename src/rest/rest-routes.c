/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* The REST routes of the forkd API: the route table, the plain routes
 * (/healthz, /version, /metrics) and what the routes share. Each route is
 * one asynchronous call to org.forkd.Manager (or two); validation happens
 * before any D-Bus call, and the daemon validates again. Snapshots are
 * rest-routes-snapshots.c, sandboxes rest-routes-sandboxes.c, what reaches
 * into a guest rest-routes-guest.c, files rest-files.c, bundles rest-pack.c. */

#include "json-util.h"
#include "macro.h"
#include "rest-bus.h"
#include "rest-files.h"
#include "rest-json-text.h"
#include "rest-metrics.h"
#include "rest-pack.h"
#include "rest-reply.h"
#include "rest-routes-common.h"
#include "rest-routes-guest.h"
#include "rest-routes-processes.h"
#include "rest-routes-sandboxes.h"
#include "rest-routes-snapshots.h"
#include "rest-routes.h"
#include "rest-util.h"
#include "time-util.h"

#define IN_SET_N(r) ((r) == -EINVAL || (r) == -ERANGE)

int rest_reply_dispatch_error(RestRequest *req, int r, const char *field, const char *reason) {
        if (r == -ENOMEM)
                return rest_reply_error(req, 500, "out of memory");
        if (!field)
                return rest_reply_error(req, 400, "request body: %s", reason ?: "invalid");
        return rest_reply_error(req, 400, "field '%s': %s", field, reason ?: "invalid value");
}

/* Parse the body as strict JSON into base by table and check the rules' tag.
 * Fields the table does not name are ignored, as forkd does (its SDKs, MCP
 * server and CLI send fields of other versions, see REST_BODY_FLAGS); a field it
 * names must have the right type and range. Returns 1 when it parsed; otherwise the error is
 * queued and this returns 0 (or the reply's negative errno). *ret_obj is the
 * parsed body. */
int rest_parse_body(RestRequest *req, bool allow_empty, const struct json_dispatch *table, void *base,
                    const struct rest_body_rules *rules, struct json_object **ret_obj) {
        const char *field = NULL, *reason = NULL;
        int r;

        if (rest_request_parse_json(req, allow_empty, ret_obj) < 0)
                return 0;
        r = json_dispatch_full(*ret_obj, table, REST_BODY_FLAGS, base, &field, &reason);
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
                r = rest_reply_dispatch_error(req, r, field, reason);
        return MIN(r, 0);
}

/* A '%' path segment that must be a tag or sandbox id. */
const char *rest_param_or_reply(RestRequest *req, const char *what) {
        const char *p = rest_request_param(req);

        if (!rest_tag_is_valid(p)) {
                (void) rest_reply_error(req, 400, "invalid %s: must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$", what);
                return NULL;
        }
        return p;
}

/* Failure to create or send a call: no reply is queued yet. */
int rest_reply_call_failed(RestRequest *req, int r) {
        if (r == -EBUSY)
                return rest_reply_error(req, 503, "too many requests in flight to the daemon, retry later");
        if (r == -ENOMEM)
                return rest_reply_error(req, 500, "out of memory");
        return rest_reply_error(req, 503, "forkd daemon unavailable: cannot reach the bus: %s", strerror(-r));
}

int rest_reply_bus_result(RestRequest *req, sd_bus_message *reply, unsigned exists_status) {
        const sd_bus_error *e = sd_bus_message_get_error(reply);

        if (e)
                return rest_reply_bus_error(req, e, exists_status);
        return 1;
}

/* ---- replies ---- */

/* The reply's a{sv} or aa{sv}, written straight into JSON text (rest-json-text.h). */
static int reply_json_text(RestRequest *req, sd_bus_message *reply, unsigned status, bool array) {
        RestJsonText t = {};
        int r;

        r = array ? rest_bus_write_dict_array_json(reply, &t) : rest_bus_write_dict_json(reply, &t);
        if (r < 0) {
                rest_json_text_done(&t);
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        }
        r = rest_reply_raw(req, status, "application/json", t.buf, t.len);
        rest_json_text_done(&t);
        return r;
}

int rest_on_reply_dict(RestRequest *req, sd_bus_message *reply, unsigned status, unsigned exists_status) {
        int r;

        r = rest_reply_bus_result(req, reply, exists_status);
        if (r <= 0)
                return r;
        return reply_json_text(req, reply, status, false);
}

int rest_on_reply_dict_200(RestRequest *req, sd_bus_message *reply) {
        return rest_on_reply_dict(req, reply, 200, 0);
}

int rest_on_reply_dict_201(RestRequest *req, sd_bus_message *reply) {
        return rest_on_reply_dict(req, reply, 201, 0);
}

static int on_reply_array(RestRequest *req, sd_bus_message *reply, unsigned status) {
        int r;

        r = rest_reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        return reply_json_text(req, reply, status, true);
}

int rest_on_reply_array_200(RestRequest *req, sd_bus_message *reply) {
        return on_reply_array(req, reply, 200);
}

int rest_on_reply_array_201(RestRequest *req, sd_bus_message *reply) {
        return on_reply_array(req, reply, 201);
}

int rest_on_reply_empty_204(RestRequest *req, sd_bus_message *reply) {
        int r = rest_reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        return rest_reply_no_content(req);
}

/* Build a Manager call with the given signature and arguments, send it. */
int rest_call_manager(RestRequest *req, const char *member, uint64_t timeout, rest_reply_func cb,
                      const char *types, ...) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        va_list ap;
        int r;

        r = rest_new_manager_call(req, member, &m);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        if (types) {
                va_start(ap, types);
                r = sd_bus_message_appendv(m, types, ap);
                va_end(ap);
                if (r < 0)
                        return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        }
        r = rest_call(req, m, timeout, cb);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        return 0;
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

/* What a scrape collected from forkd before it answers: its counts, then its
 * GetMetrics and (--metrics-per-sandbox) the sandboxes' series, as text. */
typedef struct MetricsScrape {
        unsigned snapshots, sandboxes;
        char *forkd;
        size_t forkd_len;
} MetricsScrape;

static void metrics_scrape_free(void *p) {
        MetricsScrape *m = p;

        if (!m)
                return;
        free(m->forkd);
        free(m);
}

static int metrics_reply(RestRequest *req, bool up, unsigned snapshots, unsigned sandboxes) {
        MetricsScrape *ms = rest_request_data(req);
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
        if (up && ms && ms->forkd)
                fwrite(ms->forkd, 1, ms->forkd_len, f);
        r = rest_metrics_format(rest_request_server(req), f);
        if (fclose(f) != 0 || r < 0)
                return rest_reply_error(req, 500, "cannot format metrics");
        return rest_reply_raw(req, 200, "text/plain; version=0.0.4; charset=utf-8", buf, len);
}

/* Append to the scrape's forkd text. */
static int scrape_append(MetricsScrape *ms, int (*format)(void *arg, FILE *f), void *arg) {
        _cleanup_free_ char *buf = NULL;
        size_t len = 0;
        FILE *f;
        int r;

        f = open_memstream(&buf, &len);
        if (!f)
                return -ENOMEM;
        r = format(arg, f);
        if (fclose(f) != 0 && r >= 0)
                r = -EIO;
        if (r < 0)
                return r;
        if (len > 0) {
                char *n = realloc(ms->forkd, ms->forkd_len + len);

                if (!n)
                        return -ENOMEM;
                memcpy(n + ms->forkd_len, buf, len);
                ms->forkd = n;
                ms->forkd_len += len;
        }
        return 0;
}

static int format_forkd(void *arg, FILE *f) {
        return rest_metrics_format_forkd(arg, f);
}

static int format_sandboxes(void *arg, FILE *f) {
        return rest_metrics_format_sandboxes(arg, REST_METRICS_SANDBOXES_MAX, f);
}

/* A call of the scrape, from a reply of the one before: on failure nothing is
 * answered yet (the caller answers). */
static int metrics_call(RestRequest *req, const char *member, rest_reply_func cb) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        int r;

        r = rest_new_manager_call(req, member, &m);
        return r < 0 ? r : rest_call_detached(req, m, 5 * USEC_PER_SEC, cb);
}

static int on_reply_metrics_sandboxes(RestRequest *req, sd_bus_message *reply) {
        MetricsScrape *ms = rest_request_data(req);
        struct json_object *list = NULL;

        /* Without the series when forkd could not list: the rest stands. */
        if (!sd_bus_message_is_method_error(reply, NULL) && rest_bus_read_dict_array_json(reply, &list) >= 0) {
                if (scrape_append(ms, format_sandboxes, list) < 0)
                        log_debug("Failed to format the sandboxes' metrics.");
                json_object_put(list);
        }
        return metrics_reply(req, true, ms->snapshots, ms->sandboxes);
}

static int on_reply_metrics_forkd(RestRequest *req, sd_bus_message *reply) {
        MetricsScrape *ms = rest_request_data(req);
        int r;

        /* A forkd without GetMetrics, or one that refused it: its counts only. */
        if (!sd_bus_message_is_method_error(reply, NULL) && scrape_append(ms, format_forkd, reply) < 0)
                log_debug("Failed to read forkd's metrics.");
        if (rest_metrics_per_sandbox(rest_request_server(req))) {
                r = metrics_call(req, "ListSandboxes", on_reply_metrics_sandboxes);
                if (r >= 0)
                        return 0;
        }
        return metrics_reply(req, true, ms->snapshots, ms->sandboxes);
}

static int on_reply_metrics(RestRequest *req, sd_bus_message *reply) {
        MetricsScrape *ms;
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
        if (!have_snap || !have_sb)
                return metrics_reply(req, false, 0, 0);
        ms = calloc(1, sizeof(*ms));
        if (!ms)
                return metrics_reply(req, true, snapshots, sandboxes);
        *ms = (MetricsScrape) { .snapshots = snapshots, .sandboxes = sandboxes };
        rest_request_set_data(req, ms, metrics_scrape_free);
        if (metrics_call(req, "GetMetrics", on_reply_metrics_forkd) < 0)
                return metrics_reply(req, true, snapshots, sandboxes);
        return 0;
}

static int route_metrics(RestRequest *req) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        int r;

        r = rest_new_call(req, "/org/forkd/Manager", "org.freedesktop.DBus.Properties", "GetAll", &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "s", "org.forkd.Manager");
        /* Detached: the scrape goes on with GetMetrics (and ListSandboxes) from the replies. */
        if (r >= 0)
                r = rest_call_detached(req, m, 5 * USEC_PER_SEC, on_reply_metrics);
        if (r < 0)
                return metrics_reply(req, false, 0, 0);
        rest_request_wait(req);
        return 0;
}

const RestRoute rest_routes[] = {
        { "/healthz", true, { { "GET", route_healthz, 0 } }, "GET" },
        /* forkd answers it with a trailing slash too, and its probes use both */
        { "/healthz/", true, { { "GET", route_healthz, 0 } }, "GET" },
        { "/version", false, { { "GET", route_version, 0 } }, "GET" },
        { "/metrics", false, { { "GET", route_metrics, 0 } }, "GET" },
        { "/v1/snapshots", false,
          { { "GET", rest_route_snapshots_list, 0 }, { "POST", rest_route_snapshots_create, 0 } }, "GET, POST" },
        { "/v1/snapshots/%", false,
          { { "DELETE", rest_route_snapshot_delete, 0 }, { "POST", rest_route_snapshot_post, REST_BUNDLE_MAX } },
          "DELETE" },
        { "/v1/snapshots/%/pack", false, { { "GET", rest_route_snapshot_pack, 0 } }, "GET" },
        { "/v1/snapshots/%/info", false, { { "GET", rest_route_snapshot_info, 0 } }, "GET" },
        { "/v1/snapshots/%/compact", false, { { "POST", rest_route_snapshot_compact, 0 } }, "POST" },
        { "/v1/snapshots/%/push", false, { { "POST", rest_route_snapshot_push, 0 } }, "POST" },
        { "/v1/sandboxes", false,
          { { "GET", rest_route_sandboxes_list, 0 }, { "POST", rest_route_sandboxes_create, 0 } }, "GET, POST" },
        { "/v1/sandboxes/%", false,
          { { "GET", rest_route_sandbox_get, 0 }, { "DELETE", rest_route_sandbox_delete, 0 },
            { "PATCH", rest_route_sandbox_patch, 0 } },
          "GET, DELETE, PATCH" },
        { "/v1/sandboxes/%/ping", false, { { "POST", rest_route_sandbox_ping, 0 } }, "POST" },
        { "/v1/sandboxes/%/exec", false, { { "POST", rest_route_sandbox_exec, 0 } }, "POST" },
        { "/v1/sandboxes/%/eval", false, { { "POST", rest_route_sandbox_eval, 0 } }, "POST" },
        { "/v1/sandboxes/%/run_code", false, { { "POST", rest_route_sandbox_run_code, 0 } }, "POST" },
        { "/v1/sandboxes/%/merge", false, { { "POST", rest_route_sandbox_merge, 0 } }, "POST" },
        { "/v1/sandboxes/%/diff", false, { { "POST", rest_route_sandbox_diff, 0 } }, "POST" },
        { "/v1/sandboxes/%/branch", false, { { "POST", rest_route_sandbox_branch, 0 } }, "POST" },
        { "/v1/sandboxes/%/fork", false, { { "POST", rest_route_sandbox_fork, 0 } }, "POST" },
        { "/v1/sandboxes/%/pause", false, { { "POST", rest_route_sandbox_pause, 0 } }, "POST" },
        { "/v1/sandboxes/%/timeout", false, { { "POST", rest_route_sandbox_timeout, 0 } }, "POST" },
        { "/v1/sandboxes/%/resume", false, { { "POST", rest_route_sandbox_resume, 0 } }, "POST" },
        { "/v1/sandboxes/%/ports", false, { { "POST", rest_route_sandbox_ports, 0 } }, "POST" },
        { "/v1/sandboxes/%/files/write", false, { { "POST", rest_route_sandbox_files_write, 0 } }, "POST" },
        { "/v1/sandboxes/%/files/read", false, { { "POST", rest_route_sandbox_files_read, 0 } }, "POST" },
        { "/v1/sandboxes/%/processes", false,
          { { "GET", rest_route_processes_list, 0 }, { "POST", rest_route_processes_start, 0 } }, "GET, POST" },
        { "/v1/sandboxes/%/processes/%/output", false, { { "GET", rest_route_process_output, 0 } }, "GET" },
        { "/v1/sandboxes/%/processes/%/stdin", false, { { "POST", rest_route_process_stdin, 0 } }, "POST" },
        { "/v1/sandboxes/%/processes/%/signal", false, { { "POST", rest_route_process_signal, 0 } }, "POST" },
        { "/v1/sandboxes/%/processes/%/resize", false, { { "POST", rest_route_process_resize, 0 } }, "POST" },
        { "/v1/sandboxes/%/processes/%/tty", false, { { "GET", rest_route_process_tty, 0 } }, "GET" },
};
const size_t rest_routes_count = ELEMENTSOF(rest_routes);
