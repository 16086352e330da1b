/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* forkd-rest's own metrics, in Prometheus text format: requests by route,
 * method and status, latency by route, D-Bus calls, connections and
 * Idempotency-Key records. GET /metrics adds forkd's (rest-routes.c). */

#include <inttypes.h>

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
