/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* forkd-rest's own metrics, in Prometheus text format: requests by route,
 * method and status, latency by route, D-Bus calls, connections and
 * Idempotency-Key records. GET /metrics adds forkd's (rest-routes.c). */

#include <inttypes.h>

#include <json-c/json.h>
#include <systemd/sd-bus.h>

#include "macro.h"
#include "rest-metrics.h"
#include "rest-routes.h"
#include "rest-server-internal.h"
#include "time-util.h"

static const char *const method_names[_REST_METHOD_MAX] = { "GET", "POST", "DELETE", "OTHER" };

static const unsigned metric_codes[] = { 200, 201, 204, 400, 401, 403, 404, 405, 409, 413, 422, 500, 501, 503, 504 };
#define CODE_OTHER ELEMENTSOF(metric_codes)
_Static_assert(REST_METRICS_CODES == ELEMENTSOF(metric_codes) + 1, "REST_METRICS_CODES");

static const double latency_buckets[] = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10,  30, 60 };
#define BUCKETS ELEMENTSOF(latency_buckets)
_Static_assert(REST_METRICS_BUCKETS == BUCKETS, "REST_METRICS_BUCKETS");

int rest_metrics_method_index(const char *m) {
        for (int i = 0; i < REST_METHOD_OTHER; i++)
                if (!strcmp(m, method_names[i]))
                        return i;
        return REST_METHOD_OTHER;
}

void rest_metrics_record(RestServer *s, RestRequest *req) {
        size_t code = CODE_OTHER;
        double secs;
        size_t b;

        if (req->route_index < 0 || req->route_index >= REST_METRICS_ROUTES)
                return;
        for (size_t i = 0; i < ELEMENTSOF(metric_codes); i++)
                if (metric_codes[i] == req->status) {
                        code = i;
                        break;
                }
        s->metrics.requests[req->route_index][req->method_index][code]++;

        secs = (double) (now_usec() - req->start) / 1e6;
        for (b = 0; b < BUCKETS; b++)
                if (secs <= latency_buckets[b])
                        break;
        s->metrics.hist[req->route_index][b]++;
        s->metrics.hist_sum[req->route_index] += secs;
        s->metrics.hist_count[req->route_index]++;
}

/* ---------------- metrics ---------------- */

int rest_metrics_format(RestServer *s, FILE *f) {
        size_t nroutes = MIN(rest_routes_count + 1, (size_t) REST_METRICS_ROUTES);

        fputs("# HELP forkd_rest_requests_total HTTP requests answered by forkd-rest, by route, method and status.\n"
              "# TYPE forkd_rest_requests_total counter\n",
              f);
        for (size_t r = 0; r < nroutes; r++)
                for (size_t m = 0; m < _REST_METHOD_MAX; m++)
                        for (size_t c = 0; c < REST_METRICS_CODES; c++) {
                                if (!s->metrics.requests[r][m][c])
                                        continue;
                                fprintf(f, "forkd_rest_requests_total{route=\"%s\",method=\"%s\",code=\"",
                                        r < rest_routes_count ? rest_routes[r].pattern : "unknown", method_names[m]);
                                if (c < CODE_OTHER)
                                        fprintf(f, "%u", metric_codes[c]);
                                else
                                        fputs("other", f);
                                fprintf(f, "\"} %" PRIu64 "\n", s->metrics.requests[r][m][c]);
                        }

        fputs("# HELP forkd_rest_request_duration_seconds Time from request headers to response, by route.\n"
              "# TYPE forkd_rest_request_duration_seconds histogram\n",
              f);
        for (size_t r = 0; r < nroutes; r++) {
                const char *name = r < rest_routes_count ? rest_routes[r].pattern : "unknown";
                uint64_t cum = 0;

                if (!s->metrics.hist_count[r])
                        continue;
                for (size_t b = 0; b < BUCKETS; b++) {
                        cum += s->metrics.hist[r][b];
                        fprintf(f, "forkd_rest_request_duration_seconds_bucket{route=\"%s\",le=\"%g\"} %" PRIu64 "\n",
                                name, latency_buckets[b], cum);
                }
                fprintf(f, "forkd_rest_request_duration_seconds_bucket{route=\"%s\",le=\"+Inf\"} %" PRIu64 "\n",
                        name, s->metrics.hist_count[r]);
                fprintf(f, "forkd_rest_request_duration_seconds_sum{route=\"%s\"} %.6f\n", name, s->metrics.hist_sum[r]);
                fprintf(f, "forkd_rest_request_duration_seconds_count{route=\"%s\"} %" PRIu64 "\n", name,
                        s->metrics.hist_count[r]);
        }

        fprintf(f,
                "# HELP forkd_rest_dbus_calls_in_flight D-Bus calls to the daemon awaiting a reply.\n"
                "# TYPE forkd_rest_dbus_calls_in_flight gauge\n"
                "forkd_rest_dbus_calls_in_flight %u\n"
                "# HELP forkd_rest_dbus_calls_total D-Bus calls sent to the daemon.\n"
                "# TYPE forkd_rest_dbus_calls_total counter\n"
                "forkd_rest_dbus_calls_total %" PRIu64 "\n"
                "# HELP forkd_rest_dbus_calls_direct_total D-Bus calls sent on the direct connection to forkd.\n"
                "# TYPE forkd_rest_dbus_calls_direct_total counter\n"
                "forkd_rest_dbus_calls_direct_total %" PRIu64 "\n"
                "# HELP forkd_rest_dbus_calls_rejected_total Requests refused because too many calls were in flight.\n"
                "# TYPE forkd_rest_dbus_calls_rejected_total counter\n"
                "forkd_rest_dbus_calls_rejected_total %" PRIu64 "\n"
                "# HELP forkd_rest_connections_active Open HTTP connections.\n"
                "# TYPE forkd_rest_connections_active gauge\n"
                "forkd_rest_connections_active %u\n"
                "# HELP forkd_rest_connections_total HTTP connections accepted.\n"
                "# TYPE forkd_rest_connections_total counter\n"
                "forkd_rest_connections_total %" PRIu64 "\n"
                "# HELP forkd_rest_connections_cut_total Connections cut off for not sending a request in time.\n"
                "# TYPE forkd_rest_connections_cut_total counter\n"
                "forkd_rest_connections_cut_total %" PRIu64 "\n"
                "# HELP forkd_rest_idempotency_records Idempotency-Key records kept (answered or in flight).\n"
                "# TYPE forkd_rest_idempotency_records gauge\n"
                "forkd_rest_idempotency_records %u\n"
                "# HELP forkd_rest_idempotency_replays_total Answers replayed for a repeated Idempotency-Key.\n"
                "# TYPE forkd_rest_idempotency_replays_total counter\n"
                "forkd_rest_idempotency_replays_total %" PRIu64 "\n"
                "# HELP forkd_rest_idempotency_waits_total Requests that waited for the first request of their Idempotency-Key.\n"
                "# TYPE forkd_rest_idempotency_waits_total counter\n"
                "forkd_rest_idempotency_waits_total %" PRIu64 "\n",
                s->calls_in_flight, s->metrics.calls_total, s->metrics.calls_direct, s->metrics.calls_rejected,
                s->conns_active, s->metrics.conns_total, s->metrics.conns_cut,
                s->idem ? rest_idem_records(s->idem) : 0u, s->metrics.idem_replays, s->metrics.idem_waits);
        return ferror(f) ? -EIO : 0;
}

bool rest_metrics_per_sandbox(RestServer *s) {
        return s->metrics_per_sandbox;
}

/* ---------------- forkd's metrics (GetMetrics) ---------------- */

static const struct {
        const char *key, *name, *help;
        double scale; /* to the unit the name says */
} forkd_totals[] = {
        { "cpu_usec", "forkd_sandboxes_cpu_seconds", "CPU time of the running sandboxes, summed.", 1e-6 },
        { "memory_private_kib", "forkd_sandboxes_memory_private_bytes",
          "Anonymous resident memory of the running sandboxes' VMMs, summed.", 1024 },
        { "memory_shared_kib", "forkd_sandboxes_memory_shared_bytes",
          "File-backed resident memory of the running sandboxes' VMMs (the snapshots' pages), summed.", 1024 },
        { "disk_read_bytes", "forkd_sandboxes_disk_read_bytes", "Bytes the running sandboxes read from their disks, summed.", 1 },
        { "disk_written_bytes", "forkd_sandboxes_disk_written_bytes",
          "Bytes the running sandboxes wrote to their disks, summed.", 1 },
        { "net_rx_bytes", "forkd_sandboxes_net_rx_bytes", "Bytes the running sandboxes' NICs received, summed.", 1 },
        { "net_tx_bytes", "forkd_sandboxes_net_tx_bytes", "Bytes the running sandboxes' NICs sent, summed.", 1 },
};

static const struct {
        const char *key, *name, *help;
} forkd_histograms[] = {
        { "fork_latency_usec", "forkd_fork_duration_seconds", "Time from a fork call to its sandboxes being ready." },
        { "branch_pause_usec", "forkd_branch_pause_seconds", "Time a branch paused its source sandbox." },
        { "agent_call_usec", "forkd_agent_call_duration_seconds", "Time from an agent request to its answer." },
};

static int format_histogram(sd_bus_message *reply, const char *name, const char *help, FILE *f) {
        const uint64_t *bounds, *counts;
        size_t nb, nc;
        uint64_t sum, count;
        int r;

        r = sd_bus_message_enter_container(reply, 'v', "(atattt)");
        if (r < 0)
                return r;
        r = sd_bus_message_enter_container(reply, 'r', "atattt");
        if (r < 0)
                return r;
        r = sd_bus_message_read_array(reply, 't', (const void **) &bounds, &nb);
        if (r < 0)
                return r;
        r = sd_bus_message_read_array(reply, 't', (const void **) &counts, &nc);
        if (r < 0)
                return r;
        r = sd_bus_message_read(reply, "tt", &sum, &count);
        if (r < 0)
                return r;
        nb /= sizeof(uint64_t);
        nc /= sizeof(uint64_t);
        if (nc != nb + 1)
                return -EBADMSG;
        fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
        for (size_t b = 0; b < nb; b++)
                fprintf(f, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, (double) bounds[b] / 1e6, counts[b]);
        fprintf(f, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, counts[nb]);
        fprintf(f, "%s_sum %.6f\n%s_count %" PRIu64 "\n", name, (double) sum / 1e6, name, count);
        r = sd_bus_message_exit_container(reply);
        if (r < 0)
                return r;
        return sd_bus_message_exit_container(reply);
}

int rest_metrics_format_forkd(sd_bus_message *reply, FILE *f) {
        int r;

        r = sd_bus_message_enter_container(reply, 'a', "{sv}");
        if (r < 0)
                return r;
        while ((r = sd_bus_message_enter_container(reply, 'e', "sv")) > 0) {
                const char *key;
                bool done = false;

                r = sd_bus_message_read_basic(reply, 's', &key);
                if (r < 0)
                        return r;
                for (size_t i = 0; !done && i < ELEMENTSOF(forkd_totals); i++) {
                        uint64_t v;

                        if (!streq(key, forkd_totals[i].key))
                                continue;
                        r = sd_bus_message_read(reply, "v", "t", &v);
                        if (r < 0)
                                return r;
                        fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n%s %.*f\n", forkd_totals[i].name,
                                forkd_totals[i].help, forkd_totals[i].name, forkd_totals[i].name,
                                forkd_totals[i].scale < 1 ? 6 : 0, (double) v * forkd_totals[i].scale);
                        done = true;
                }
                for (size_t i = 0; !done && i < ELEMENTSOF(forkd_histograms); i++) {
                        if (!streq(key, forkd_histograms[i].key))
                                continue;
                        r = format_histogram(reply, forkd_histograms[i].name, forkd_histograms[i].help, f);
                        if (r < 0)
                                return r;
                        done = true;
                }
                if (!done) {
                        r = sd_bus_message_skip(reply, "v");
                        if (r < 0)
                                return r;
                }
                r = sd_bus_message_exit_container(reply);
                if (r < 0)
                        return r;
        }
        if (r < 0)
                return r;
        r = sd_bus_message_exit_container(reply);
        if (r < 0)
                return r;
        return ferror(f) ? -EIO : 0;
}

static const struct {
        const char *key, *name, *type, *help;
        double scale;
} sandbox_series[] = {
        { "cpu_usec", "forkd_sandbox_cpu_seconds_total", "counter", "CPU time of a sandbox's VMM.", 1e-6 },
        { "memory_private_kib", "forkd_sandbox_memory_private_bytes", "gauge",
          "Anonymous resident memory of a sandbox's VMM: what it alone costs.", 1024 },
        { "memory_shared_kib", "forkd_sandbox_memory_shared_bytes", "gauge",
          "File-backed resident memory of a sandbox's VMM, shared through the page cache.", 1024 },
        { "disk_read_bytes", "forkd_sandbox_disk_read_bytes_total", "counter", "Bytes a sandbox read from its disks.", 1 },
        { "disk_written_bytes", "forkd_sandbox_disk_written_bytes_total", "counter",
          "Bytes a sandbox wrote to its disks.", 1 },
        { "net_rx_bytes", "forkd_sandbox_net_rx_bytes_total", "counter", "Bytes a sandbox's NIC received.", 1 },
        { "net_tx_bytes", "forkd_sandbox_net_tx_bytes_total", "counter", "Bytes a sandbox's NIC sent.", 1 },
};

/* An id that needs no escaping in a label value (forkd's ids are [A-Za-z0-9._-]). */
static bool label_safe(const char *s) {
        if (!*s)
                return false;
        for (; *s; s++)
                if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '.' ||
                      *s == '_' || *s == '-'))
                        return false;
        return true;
}

int rest_metrics_format_sandboxes(struct json_object *list, unsigned max, FILE *f) {
        size_t n = json_object_is_type(list, json_type_array) ? json_object_array_length(list) : 0;
        unsigned shown = 0, left_out = 0;

        for (size_t k = 0; k < ELEMENTSOF(sandbox_series); k++) {
                fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", sandbox_series[k].name, sandbox_series[k].help,
                        sandbox_series[k].name, sandbox_series[k].type);
                shown = left_out = 0;
                for (size_t i = 0; i < n; i++) {
                        struct json_object *sb = json_object_array_get_idx(list, i), *id, *usage, *v;

                        if (!json_object_object_get_ex(sb, "id", &id) || !json_object_object_get_ex(sb, "usage", &usage) ||
                            !json_object_is_type(usage, json_type_object) || !label_safe(json_object_get_string(id)))
                                continue;
                        if (shown >= max) {
                                left_out++;
                                continue;
                        }
                        shown++;
                        if (!json_object_object_get_ex(usage, sandbox_series[k].key, &v))
                                continue;
                        fprintf(f, "%s{id=\"%s\"} %.*f\n", sandbox_series[k].name, json_object_get_string(id),
                                sandbox_series[k].scale < 1 ? 6 : 0,
                                (double) json_object_get_uint64(v) * sandbox_series[k].scale);
                }
        }
        fprintf(f,
                "# HELP forkd_rest_metrics_sandboxes_left_out Sandboxes over the cap of %u that got no series of their own.\n"
                "# TYPE forkd_rest_metrics_sandboxes_left_out gauge\n"
                "forkd_rest_metrics_sandboxes_left_out %u\n",
                max, left_out);
        return ferror(f) ? -EIO : 0;
}
