/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A fleet's front end: its HTTP server, answers and metrics (fleet-front.h). */
#include <curl/curl.h>
#include <errno.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fleet-front-internal.h"
#include "io-util.h"
#include "json-util.h"
#include "macro.h"
#include "rest-pack.h"
#include "rest-util.h"

int front_answer(FrontRequest *r, unsigned status, const char *type, const char *body, size_t len) {
        char *b = malloc(len + 1);

        if (!b)
                return -ENOMEM;
        memcpy(b, body, len);
        b[len] = 0;
        free(r->answer);
        r->answer = b;
        r->answer_len = len;
        r->status = status;
        snprintf(r->answer_type, sizeof(r->answer_type), "%s", type ?: "application/json");
        r->answered = true;
        return 0;
}

int front_answer_json(FrontRequest *r, unsigned status, struct json_object *o) {
        const char *s = o ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN) : NULL;

        if (!s)
                return front_answer(r, 500, NULL, "{\"error\":\"out of memory\"}", 25);
        return front_answer(r, status, "application/json", s, strlen(s));
}

int front_answer_error(FrontRequest *r, unsigned status, const char *fmt, ...) {
        _cleanup_(json_object_putp) struct json_object *o = json_object_new_object();
        char msg[512];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        if (o)
                json_object_object_add(o, "error", json_object_new_string(msg));
        return front_answer_json(r, status, o);
}

int front_answer_node(FrontRequest *r, const char *node, const FleetAnswer *a) {
        if (a->status == 0) {
                atomic_fetch_add(&r->front->node_failures, 1);
                return front_answer_error(r, 502, "node %s did not answer: %s", node, a->error);
        }
        if (a->status < 200 || a->status > 599) {
                atomic_fetch_add(&r->front->node_failures, 1);
                return front_answer_error(r, 502, "node %s answered status %ld", node, a->status);
        }
        if (a->process_pid[0])
                front_add_header(r, "Forkd-Process-Pid", "%s", a->process_pid);
        return front_answer(r, (unsigned) a->status, a->content_type[0] ? a->content_type : NULL, a->body, a->len);
}

void front_add_header(FrontRequest *r, const char *name, const char *fmt, ...) {
        va_list ap;

        if (r->n_headers >= FRONT_HEADERS_MAX)
                return;
        r->headers[r->n_headers].name = name;
        va_start(ap, fmt);
        vsnprintf(r->headers[r->n_headers].value, sizeof(r->headers[0].value), fmt, ap);
        va_end(ap);
        r->n_headers++;
}

const char *front_query_arg(FrontRequest *r, const char *name) {
        return MHD_lookup_connection_value(r->connection, MHD_GET_ARGUMENT_KIND, name);
}

FleetCall front_call(const FrontRequest *r, const FleetRecord *node, const char *method, const char *path) {
        return (FleetCall) {
                .base = node->url,
                .method = method,
                .path = path,
                .authorization = r->authorization,
                .body_fd = -1,
                .answer_fd = -1,
                .timeout_ms = 600u * 1000u,
        };
}

/* ---- the server ---- */

/* The query as it goes on: every argument, escaped again. */
static enum MHD_Result add_query_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
        FrontRequest *r = cls;
        char *k, *v;
        size_t n = strlen(r->query);

        if (streq(key, "node"))
                return MHD_YES; /* the front end's own: which node */
        k = curl_easy_escape(NULL, key, 0);
        v = value ? curl_easy_escape(NULL, value, 0) : NULL;
        if (k)
                snprintf(r->query + n, sizeof(r->query) - n, "%c%s%s%s", n ? '&' : '?', k, v ? "=" : "", v ?: "");
        curl_free(k);
        curl_free(v);
        return strlen(r->query) + 1 < sizeof(r->query) ? MHD_YES : MHD_NO;
}

static bool check_auth(FrontRequest *r) {
        const char *h = r->authorization;
        size_t n;

        if (!r->front->cfg.token || streq(r->path, "/healthz") || streq(r->path, "/healthz/"))
                return true;
        if (!h || strncasecmp(h, "Bearer ", 7) != 0)
                return false;
        h += 7;
        h += strspn(h, " ");
        n = strlen(h);
        while (n > 0 && h[n - 1] == ' ')
                n--;
        return rest_secret_equal(h, n, r->front->cfg.token, r->front->token_len);
}

static bool is_bundle_upload(const FrontRequest *r) {
        return streq(r->method, "POST") && streq(r->path, "/v1/snapshots/unpack");
}

static void request_free(FrontRequest *r) {
        if (!r)
                return;
        free(r->body);
        free(r->answer);
        free(r->idem_key);
        safe_close(r->body_fd);
        safe_close(r->answer_fd);
        front_stream_drop(r);
        free(r);
}

static enum MHD_Result queue_answer(FrontRequest *r) {
        struct MHD_Response *resp;
        enum MHD_Result ret;

        if (r->stream) {
                resp = front_stream_response(r, &r->status);
        } else if (r->answer_fd >= 0) {
                resp = MHD_create_response_from_fd((uint64_t) r->answer_len, r->answer_fd);
                if (resp)
                        r->answer_fd = -1; /* MHD closes it */
        } else
                resp = MHD_create_response_from_buffer(r->answer_len, r->answer, MHD_RESPMEM_MUST_COPY);
        if (!resp)
                return MHD_NO;
        (void) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->answer_type);
        for (size_t i = 0; i < r->n_headers; i++)
                (void) MHD_add_response_header(resp, r->headers[i].name, r->headers[i].value);
        ret = MHD_queue_response(r->connection, r->status, resp);
        MHD_destroy_response(resp);
        return ret;
}

static int handle(FrontRequest *r) {
        _cleanup_free_ char *record = NULL;
        int k;

        if (r->too_large)
                return front_answer_error(r, 413, "request body larger than %zu bytes",
                                          is_bundle_upload(r) ? (size_t) REST_BUNDLE_MAX : r->front->cfg.body_max);
        if (!check_auth(r))
                return front_answer_error(r, 401, "invalid api key");
        if (front_idem_applies(r)) {
                k = front_idem_claim(r, &record);
                if (k <= 0)
                        return k;
        }
        k = front_route(r);
        if (k < 0 && !r->answered)
                front_answer_error(r, 500, "internal error: %s", strerror(-k));
        if (record)
                front_idem_finish(r, record);
        return 0;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **con_cls) {
        FleetFront *f = cls;
        FrontRequest *r = *con_cls;

        if (!r) {
                const char *ct;

                r = calloc(1, sizeof(*r));
                if (!r)
                        return MHD_NO;
                *con_cls = r;
                r->front = f;
                r->connection = connection;
                r->body_fd = r->answer_fd = -1;
                atomic_fetch_add(&f->requests, 1);
                snprintf(r->method, sizeof(r->method), "%s", method);
                if (strlen(url) >= sizeof(r->path) ||
                    MHD_get_connection_values(connection, MHD_GET_ARGUMENT_KIND, add_query_arg, r) < 0 ||
                    strlen(r->query) + 1 >= sizeof(r->query)) {
                        front_answer_error(r, 414, "the URL is too long");
                        r->too_large = false;
                } else
                        snprintf(r->path, sizeof(r->path), "%s", url);
                r->authorization = MHD_lookup_connection_value(connection, MHD_HEADER_KIND,
                                                               MHD_HTTP_HEADER_AUTHORIZATION);
                ct = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
                snprintf(r->content_type, sizeof(r->content_type), "%s", ct ?: "");
                return MHD_YES;
        }
        if (*upload_data_size > 0) {
                size_t n = *upload_data_size;

                *upload_data_size = 0;
                if (r->too_large || r->answered)
                        return MHD_YES;
                if (is_bundle_upload(r)) {
                        if (r->body_fd < 0)
                                r->body_fd = memfd_create("forkd-front-bundle", MFD_CLOEXEC);
                        if (r->body_fd < 0)
                                return MHD_NO;
                        if (n > REST_BUNDLE_MAX - r->len) {
                                r->too_large = true;
                                return MHD_YES;
                        }
                        if (pwrite_all(r->body_fd, upload_data, n, r->len) < 0)
                                return MHD_NO;
                        r->len += n;
                        return MHD_YES;
                }
                if (n > f->cfg.body_max - r->len) {
                        r->too_large = true;
                        return MHD_YES;
                }
                return rest_body_append(&r->body, &r->len, &r->alloc, f->cfg.body_max, upload_data, n) < 0 ? MHD_NO
                                                                                                          : MHD_YES;
        }
        if (!r->answered)
                (void) handle(r);
        if (!r->answered)
                front_answer_error(r, 500, "internal error: no answer");
        return queue_answer(r);
}

static void on_completed(void *cls, struct MHD_Connection *connection, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
        request_free(*con_cls);
        *con_cls = NULL;
}

static void mhd_logger(void *cls, const char *fmt, va_list ap) {
        char buf[512];

        vsnprintf(buf, sizeof(buf), fmt, ap);
        buf[strcspn(buf, "\n")] = 0;
        log_debug("libmicrohttpd: %s", buf);
}

int fleet_front_start(const FleetFrontConfig *cfg, FleetFront **ret) {
        unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
        FleetFront *f;
        int r;

        f = calloc(1, sizeof(*f));
        if (!f)
                return -ENOMEM;
        f->cfg = *cfg;
        f->token_len = cfg->token ? strlen(cfg->token) : 0;
        pthread_mutex_init(&f->lock, NULL);
        pthread_cond_init(&f->fetch_done, NULL);
        r = fleet_watcher_start(cfg->etcd, &cfg->etcd_opts, &f->watcher);
        if (r < 0) {
                fleet_front_stop(f);
                return r;
        }
        if (cfg->tls_cert_pem && cfg->tls_key_pem)
                flags |= MHD_USE_TLS;
        f->mhd = MHD_start_daemon(
                flags, 0, NULL, NULL, on_access, f, MHD_OPTION_LISTEN_SOCKET, cfg->listen_fd,
                MHD_OPTION_NOTIFY_COMPLETED, on_completed, f, MHD_OPTION_CONNECTION_LIMIT, cfg->connection_limit,
                MHD_OPTION_CONNECTION_TIMEOUT, cfg->timeout_secs, MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, f,
                MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t) (64u * 1024u),
                (cfg->tls_cert_pem ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END), cfg->tls_cert_pem,
                MHD_OPTION_HTTPS_MEM_KEY, cfg->tls_key_pem, MHD_OPTION_END);
        if (!f->mhd) {
                fleet_front_stop(f);
                return log_error_errno(EIO, "Cannot start the front end's HTTP server.");
        }
        *ret = f;
        return 0;
}

FleetFront *fleet_front_stop(FleetFront *f) {
        if (!f)
                return NULL;
        if (f->mhd)
                MHD_stop_daemon(f->mhd);
        fleet_watcher_stop(f->watcher);
        pthread_cond_destroy(&f->fetch_done);
        pthread_mutex_destroy(&f->lock);
        free(f);
        return NULL;
}

/* ---- the front end's own routes ---- */

int front_route_healthz(FrontRequest *r) {
        _cleanup_(json_object_putp) struct json_object *o = json_object_new_object();
        FleetView *v = fleet_view_get(r->front->watcher);
        char err[256];
        bool ok = fleet_watcher_etcd_ok(r->front->watcher, NULL, err, sizeof(err));
        size_t n = v->n_nodes;

        fleet_view_put(r->front->watcher, v);
        if (!ok)
                return front_answer_error(r, 503, "etcd does not answer: %s", err);
        if (!o)
                return -ENOMEM;
        json_object_object_add(o, "status", json_object_new_string("ok"));
        json_object_object_add(o, "nodes", json_object_new_int64((int64_t) n));
        return front_answer_json(r, 200, o);
}

int front_route_metrics(FrontRequest *r) {
        FleetFront *f = r->front;
        FleetView *v = fleet_view_get(f->watcher);
        _cleanup_free_ char *text = NULL;
        bool ok = fleet_watcher_etcd_ok(f->watcher, NULL, NULL, 0);
        uint64_t lost, refused;
        size_t ready = 0;
        int n;

        fleet_watcher_counts(f->watcher, &lost, &refused);
        for (size_t i = 0; i < v->n_nodes; i++)
                ready += v->nodes[i].ready;
        n = asprintf(&text,
                     "# HELP forkd_front_nodes Node records in etcd, and how many of them are ready.\n"
                     "# TYPE forkd_front_nodes gauge\n"
                     "forkd_front_nodes %zu\nforkd_front_nodes_ready %zu\n"
                     "# HELP forkd_front_etcd_up Whether the last read of etcd succeeded.\n"
                     "# TYPE forkd_front_etcd_up gauge\nforkd_front_etcd_up %d\n"
                     "# TYPE forkd_front_requests_total counter\nforkd_front_requests_total %" PRIuFAST64 "\n"
                     "# HELP forkd_front_placements_total Forks placed, and refused (no room, no holder, no etcd).\n"
                     "# TYPE forkd_front_placements_total counter\nforkd_front_placements_total %" PRIuFAST64 "\n"
                     "# TYPE forkd_front_placement_refusals_total counter\n"
                     "forkd_front_placement_refusals_total %" PRIuFAST64 "\n"
                     "# HELP forkd_front_fetches_total Chains fetched from one node into another, and failed.\n"
                     "# TYPE forkd_front_fetches_total counter\nforkd_front_fetches_total %" PRIuFAST64 "\n"
                     "# TYPE forkd_front_fetch_failures_total counter\nforkd_front_fetch_failures_total %" PRIuFAST64
                     "\n"
                     "# HELP forkd_front_nodes_lost_total Nodes that left etcd while this front end watched.\n"
                     "# TYPE forkd_front_nodes_lost_total counter\nforkd_front_nodes_lost_total %" PRIu64 "\n"
                     "# TYPE forkd_front_records_refused_total counter\nforkd_front_records_refused_total %" PRIu64
                     "\n"
                     "# TYPE forkd_front_node_failures_total counter\nforkd_front_node_failures_total %" PRIuFAST64
                     "\n"
                     "# TYPE forkd_front_idempotency_replays_total counter\n"
                     "forkd_front_idempotency_replays_total %" PRIuFAST64 "\n",
                     v->n_nodes, ready, ok, atomic_load(&f->requests), atomic_load(&f->placements),
                     atomic_load(&f->placement_refusals), atomic_load(&f->fetches_total),
                     atomic_load(&f->fetch_failures), lost, refused, atomic_load(&f->node_failures),
                     atomic_load(&f->idem_replays));
        fleet_view_put(f->watcher, v);
        if (n < 0)
                return -ENOMEM;
        return front_answer(r, 200, "text/plain; version=0.0.4", text, (size_t) n);
}
