/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* forkd-rest's own metrics (rest-metrics.c): counted by the server, written
 * in Prometheus text format for GET /metrics. */

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "rest-request.h"

enum { REST_METHOD_GET, REST_METHOD_POST, REST_METHOD_DELETE, REST_METHOD_OTHER, _REST_METHOD_MAX };

#define REST_METRICS_ROUTES 40  /* routes counted, "unknown" included */
#define REST_METRICS_CODES 16   /* the statuses counted one by one, and "other" */
#define REST_METRICS_BUCKETS 18 /* latency histogram buckets, without +Inf */

typedef struct RestMetrics {
        uint64_t requests[REST_METRICS_ROUTES][_REST_METHOD_MAX][REST_METRICS_CODES];
        uint64_t hist[REST_METRICS_ROUTES][REST_METRICS_BUCKETS + 1];
        double hist_sum[REST_METRICS_ROUTES];
        uint64_t hist_count[REST_METRICS_ROUTES];
        uint64_t conns_cut, conns_total, calls_total, calls_direct, calls_rejected;
        uint64_t idem_replays, idem_waits;
} RestMetrics;

/* REST_METHOD_* of an HTTP method. */
int rest_metrics_method_index(const char *m);
/* A request that was answered: count it by route, method and status. */
void rest_metrics_record(RestServer *s, RestRequest *req);
/* Metrics in Prometheus text format (the bridge's own counters). */
int rest_metrics_format(RestServer *s, FILE *f);

/* At most this many sandboxes get series of their own (--metrics-per-sandbox). */
#define REST_METRICS_SANDBOXES_MAX 1000u

struct json_object;
typedef struct sd_bus_message sd_bus_message;
/* forkd's GetMetrics reply (the running sandboxes' totals and forkd's
 * histograms) in Prometheus text format. */
int rest_metrics_format_forkd(sd_bus_message *reply, FILE *f);
/* Series per sandbox from a ListSandboxes reply as JSON (the sandboxes with a
 * "usage"), at most max of them, and how many were left out. */
int rest_metrics_format_sandboxes(struct json_object *list, unsigned max, FILE *f);
/* Whether forkd-rest runs with --metrics-per-sandbox. */
bool rest_metrics_per_sandbox(RestServer *s);
