/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * forkd-rest's HTTP side: libmicrohttpd in external-polling epoll mode driven
 * by sd-event (its epoll fd is one io source, its timeout one timer), the
 * request lifecycle (auth, body cap, suspend while a D-Bus call is in flight,
 * resume on the reply), request deadlines, Idempotency-Key (the store is
 * rest-idem.c) and the bridge's own metrics. No threads.
 */

#include <json-c/json.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

typedef struct RestServer RestServer;
typedef struct RestRequest RestRequest;

typedef struct RestConfig {
        int listen_fd;              /* bound, listening socket; the server takes it */
        const char *tls_cert_pem;   /* both set: HTTPS */
        const char *tls_key_pem;
        const char *token;          /* NULL: no authentication */
        const char *bus_address;    /* NULL: the system bus */
        bool no_direct;             /* never use forkd's direct socket */
        unsigned connection_limit;  /* MHD_OPTION_CONNECTION_LIMIT */
        unsigned timeout_secs;      /* idle timeout and request deadline */
        size_t memory_limit;        /* per-connection pool (headers) */
        size_t body_max;            /* request body cap */
        unsigned calls_max;         /* D-Bus calls in flight */
        const char *state_dir;      /* Idempotency-Key records (rest-idem.h); NULL: keys are refused */
        bool state_dir_create;      /* make state_dir now, fail if we cannot; else at first use */
} RestConfig;

#define REST_CONNECTION_LIMIT_DEFAULT 256u
#define REST_TIMEOUT_SECS_DEFAULT 10u
#define REST_MEMORY_LIMIT_DEFAULT (64u * 1024u)
#define REST_BODY_MAX_DEFAULT (1024u * 1024u)
#define REST_CALLS_MAX_DEFAULT 64u

int rest_server_new(sd_event *event, const RestConfig *config, RestServer **ret);
RestServer *rest_server_free(RestServer *s);
static inline void rest_server_freep(RestServer **s) {
        rest_server_free(*s);
}

/* ---- used by the route handlers (rest-routes.c) ---- */

typedef int (*rest_reply_func)(RestRequest *req, sd_bus_message *reply);

struct rest_method {
        const char *method;     /* "GET", "POST", "DELETE" */
        int (*handler)(RestRequest *req);
};

/* Non-zero for a method whose body goes to a file (rest_request_body_fd()),
 * at most that many bytes, instead of memory (rest-pack.c). */
size_t rest_method_body_fd_max(const struct rest_method *m);

/* Bundles (POST /v1/snapshots/unpack): the body cap. */
#define REST_BUNDLE_MAX (UINT64_C(1) << 30)
/* A bundle takes longer to arrive than timeout_secs allows a request: its
 * deadline grows by a second for each REST_UPLOAD_MIN_RATE bytes that arrive,
 * so a client that keeps up this rate is never cut, and a slower one still is. */
#define REST_UPLOAD_MIN_RATE (1024u * 1024u)

typedef struct RestRoute {
        const char *pattern;    /* "/v1/snapshots/%/info": '%' matches one segment */
        bool no_auth;
        struct rest_method methods[3];
        const char *allow;      /* value of the Allow header on 405 */
} RestRoute;

extern const RestRoute rest_routes[];
extern const size_t rest_routes_count;

const char *rest_request_param(RestRequest *req);             /* the '%' segment, or NULL */
const char *rest_request_body(RestRequest *req, size_t *ret_len);
/* A route with rest_method_body_fd_max(): the body in an unlinked temporary
 * file ($TMPDIR, else /var/tmp; a memfd if neither takes one), at offset 0
 * (owned by req; an empty one if there was no body). Negative errno on failure. */
int rest_request_body_fd(RestRequest *req);
const char *rest_request_query(RestRequest *req, const char *key);
RestServer *rest_request_server(RestRequest *req);

/* Parse the body as one strict JSON object. An empty body yields an empty
 * object when allow_empty. On failure a 400 has been queued and the return
 * value is negative. */
int rest_request_parse_json(RestRequest *req, bool allow_empty, struct json_object **ret);

/* Replies. Each returns 0 (or a negative errno if even the reply failed). */
int rest_reply_json(RestRequest *req, unsigned status, struct json_object *body);
int rest_reply_raw(RestRequest *req, unsigned status, const char *content_type, const char *body, size_t len);
int rest_reply_error(RestRequest *req, unsigned status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int rest_reply_no_content(RestRequest *req);
/* size bytes of fd from offset 0 (fd is taken, also on failure). */
int rest_reply_fd(RestRequest *req, unsigned status, const char *content_type, int fd, uint64_t size);
/* Turn a D-Bus error reply into the mapped status and {"error": message}. */
int rest_reply_bus_error(RestRequest *req, const sd_bus_error *e, unsigned override_exists_status);

/* Create a method call on org.forkd.Manager at /org/forkd/Manager, or on
 * interface/path given. Fails with a queued 503 when the bus is unreachable. */
int rest_new_manager_call(RestRequest *req, const char *member, sd_bus_message **ret);
int rest_new_call(RestRequest *req, const char *path, const char *interface, const char *member,
                  sd_bus_message **ret);
/* Send m asynchronously and suspend the connection until the reply; then
 * on_reply(req, reply) is called with an error or a method return. A 503
 * is queued instead when the cap of calls in flight is reached. */
int rest_call(RestRequest *req, sd_bus_message *m, uint64_t timeout_usec, rest_reply_func on_reply);

/* A D-Bus call that leaves the connection alone: on_reply(req, reply) may
 * come while a stream is being sent, or after rest_request_wait(). */
int rest_call_detached(RestRequest *req, sd_bus_message *m, uint64_t timeout_usec, rest_reply_func on_reply);
/* Suspend the connection until a reply is queued (from an event source of
 * the route's own, or a detached call's reply). */
void rest_request_wait(RestRequest *req);
/* Route state, freed with the request. */
void rest_request_set_data(RestRequest *req, void *data, void (*free_data)(void *));
void *rest_request_data(RestRequest *req);

/* Streamed replies: MHD pulls the body from read(req, buf, max): > 0 bytes,
 * REST_STREAM_AGAIN (nothing now: the connection is suspended until
 * rest_stream_resume()), REST_STREAM_END, or REST_STREAM_ERROR (the
 * connection is cut, so the client sees a truncated body). */
#define REST_STREAM_AGAIN 0
#define REST_STREAM_END (-1)
#define REST_STREAM_ERROR (-2)
typedef ssize_t (*rest_stream_read_func)(RestRequest *req, char *buf, size_t max);
int rest_reply_stream(RestRequest *req, unsigned status, const char *content_type, rest_stream_read_func read);
void rest_stream_resume(RestRequest *req);

/* Metrics in Prometheus text format (the bridge's own counters). */
int rest_metrics_format(RestServer *s, FILE *f);
