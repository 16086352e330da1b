/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <fcntl.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <time.h>

#include "json-util.h"
#include "macro.h"
#include "forkd-bus.h"
#include "rest-idem.h"
#include "rest-server.h"
#include "rest-util.h"
#include "sha256.h"
#include "time-util.h"

#define REST_PARAM_MAX 256
#define REST_JSON_DEPTH_MAX 32
#define DIRECT_RETRY_USEC (5 * USEC_PER_SEC)
#define IDEM_HEADER "Idempotency-Key"
#define IDEM_REPLAYED_HEADER "Idempotent-Replayed"

enum { METHOD_GET, METHOD_POST, METHOD_DELETE, METHOD_OTHER, _METHOD_MAX };
static const char *const method_names[_METHOD_MAX] = { "GET", "POST", "DELETE", "OTHER" };

static const unsigned metric_codes[] = { 200, 201, 204, 400, 401, 403, 404, 405, 409, 413, 422, 500, 501, 503, 504 };
#define CODE_OTHER ELEMENTSOF(metric_codes)
#define CODES_MAX (ELEMENTSOF(metric_codes) + 1)

static const double latency_buckets[] = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10,  30, 60 };
#define BUCKETS ELEMENTSOF(latency_buckets)
#define ROUTES_MAX 32

typedef struct RestConn RestConn;

struct RestConn {
        RestServer *server;
        int fd;
        uint64_t deadline; /* CLOCK_MONOTONIC usec; 0: none */
        RestConn *prev, *next;
};

struct RestRequest {
        RestServer *server;
        struct MHD_Connection *connection;
        RestConn *conn;
        const RestRoute *route;
        const struct rest_method *method;
        int route_index; /* rest_routes_count: unknown */
        int method_index;
        char param[REST_PARAM_MAX];
        bool has_param;

        char *body;
        size_t body_len, body_alloc;
        int body_fd;      /* rest_method_body_fd_max(): the body goes here */

        bool too_large;   /* body over the cap: discarding the rest */
        bool queued;      /* a response went to MHD */
        bool suspended;   /* a D-Bus call is in flight */
        struct MHD_Response *pending;
        unsigned pending_status;
        sd_bus_slot *slot;
        rest_reply_func on_reply;

        unsigned status;
        uint64_t start;
        RestRequest *prev, *next; /* suspended list */

        /* a streamed reply (rest_reply_stream()) */
        rest_stream_read_func stream_read;
        bool streaming, stream_suspended, stream_abort;
        RestRequest *stream_prev, *stream_next;
        void *data;
        void (*free_data)(void *data);

        /* Idempotency-Key (rest-idem.c) */
        char *idem_key;             /* a valid key on a route that takes one */
        sha256_ctx idem_hash;       /* of method, path, query and body */
        RestIdemEntry *idem;        /* the key's first request: this one, to be answered */
        RestIdemEntry *idem_wait;   /* waiting for the answer of the key's first request ... */
        RestRequest *idem_next;     /* ... in its list of waiters */
        bool idem_sent;             /* a call went to forkd: the answer is an outcome to keep */
};

struct RestServer {
        sd_event *event;
        struct MHD_Daemon *daemon;
        sd_event_source *io_source, *timer_source, *deadline_source, *resume_source;
        sd_bus *bus;
        char *bus_address;
        sd_bus *direct;              /* to forkd itself, bypassing the bus daemon; may be NULL */
        sd_bus_slot *direct_query;   /* asking forkd for its DirectSocket */
        uint64_t direct_next_query;  /* CLOCK_MONOTONIC usec */
        bool no_direct;
        char *token;
        size_t token_len;
        char *tls_cert, *tls_key;
        unsigned timeout_secs;
        size_t body_max;
        unsigned calls_max, calls_in_flight;

        RestConn *conns;
        unsigned conns_active;
        RestRequest *suspended;
        RestRequest *streams;        /* replies being streamed */
        RestIdem *idem;              /* NULL: no state directory, keys are refused */
        bool stopping;

        /* metrics */
        uint64_t requests[ROUTES_MAX][_METHOD_MAX][CODES_MAX];
        uint64_t hist[ROUTES_MAX][BUCKETS + 1];
        double hist_sum[ROUTES_MAX];
        uint64_t hist_count[ROUTES_MAX];
        uint64_t conns_cut, conns_total, calls_total, calls_direct, calls_rejected;
        uint64_t idem_replays, idem_waits;
};

/* ---------------- D-Bus connection ---------------- */

static int bus_ensure(RestServer *s) {
        _cleanup_(sd_bus_unrefp) sd_bus *bus = NULL;
        int r;

        if (s->bus && sd_bus_is_open(s->bus) > 0)
                return 0;

        /* Calls still pending on a closed connection hold their own
         * references; the old bus stays attached until they got their
         * (synthesised) error replies. */
        s->bus = sd_bus_unref(s->bus);

        if (s->bus_address) {
                r = sd_bus_new(&bus);
                if (r < 0)
                        return r;
                r = sd_bus_set_address(bus, s->bus_address);
                if (r < 0)
                        return r;
                r = sd_bus_set_bus_client(bus, true);
                if (r < 0)
                        return r;
                (void) sd_bus_set_description(bus, "forkd-rest");
                r = sd_bus_start(bus);
                if (r < 0)
                        return r;
        } else {
                r = sd_bus_open_system_with_description(&bus, "forkd-rest");
                if (r < 0)
                        return r;
        }
        r = sd_bus_attach_event(bus, s->event, SD_EVENT_PRIORITY_NORMAL);
        if (r < 0)
                return r;

        s->bus = TAKE_PTR(bus);
        return 0;
}

/* ---------------- direct connection to forkd ----------------
 *
 * Each call through the bus passes the bus daemon twice (call and reply),
 * each time a wakeup of another process. forkd also serves its objects on a
 * socket of its own (DirectSocket), to root and to the one user it trusts as
 * the bridge (forkd --trusted-bridge-user; the shipped units trust
 * forkd-rest): its accept checks the peer's uid, and there the bridge needs
 * no polkit round trip. Anyone else is refused (by the file's mode, or by
 * forkd closing the connection), and calls stay on the bus. The path comes
 * from the owner of org.forkd.Manager, a name that the bus policy lets only
 * root own, and the peer must be root. Any failure leaves the bus as it was. */

static int direct_connect(RestServer *s, const char *path) {
        _cleanup_(sd_bus_unrefp) sd_bus *bus = NULL;
        union {
                struct sockaddr sa;
                struct sockaddr_un un;
        } sa = { .un.sun_family = AF_UNIX };
        struct ucred uc;
        socklen_t n = sizeof uc;
        int fd, r;

        if (path[0] != '/' || strlen(path) >= sizeof sa.un.sun_path)
                return -EINVAL;
        strcpy(sa.un.sun_path, path);

        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        /* Non-blocking: a unix socket connects at once or fails (EAGAIN when
         * the backlog is full); it never stalls the loop. */
        if (connect(fd, &sa.sa, sizeof sa.un) < 0) {
                r = -errno;
                safe_close(fd);
                return r;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &n) < 0 || n != sizeof uc || uc.uid != 0) {
                safe_close(fd);
                return -EPERM;
        }

        r = sd_bus_new(&bus);
        if (r < 0) {
                safe_close(fd);
                return r;
        }
        r = sd_bus_set_fd(bus, fd, fd);
        if (r < 0) {
                safe_close(fd);
                return r;
        }
        (void) sd_bus_set_description(bus, "forkd-rest-direct");
        r = sd_bus_start(bus);
        if (r < 0)
                return r;
        r = sd_bus_attach_event(bus, s->event, SD_EVENT_PRIORITY_NORMAL);
        if (r < 0)
                return r;
        s->direct = sd_bus_unref(s->direct);
        s->direct = TAKE_PTR(bus);
        log_debug("Calls go to forkd directly on %s.", path);
        return 0;
}

static int on_direct_socket(sd_bus_message *reply, void *userdata, sd_bus_error *ret_error) {
        RestServer *s = userdata;
        const char *path;
        int r;

        s->direct_query = sd_bus_slot_unref(s->direct_query);
        if (sd_bus_message_is_method_error(reply, NULL))
                return 0; /* an older forkd, or none yet: the bus it is */
        r = sd_bus_message_read(reply, "v", "s", &path);
        if (r < 0 || !*path)
                return 0;
        r = direct_connect(s, path);
        if (r < 0)
                log_debug_errno(r, "No direct connection to forkd on %s, using the bus: %m", path);
        return 0;
}

static void direct_query_start(RestServer *s) {
        uint64_t now = now_usec();
        int r;

        if (s->no_direct || s->direct_query || !s->bus || now < s->direct_next_query)
                return;
        s->direct_next_query = now + DIRECT_RETRY_USEC;
        r = sd_bus_call_method_async(s->bus, &s->direct_query, "org.forkd.Manager", "/org/forkd/Manager",
                                     "org.freedesktop.DBus.Properties", "Get", on_direct_socket, s, "ss",
                                     "org.forkd.Manager", "DirectSocket");
        if (r < 0)
                log_debug_errno(r, "Cannot ask forkd for its direct socket: %m");
}

/* The connection a call goes out on: the direct one once forkd has
 * accepted it (authentication done: forkd closes connections it does not
 * want, e.g. beyond its cap, before that), the bus otherwise. */
static sd_bus *call_bus(RestServer *s) {
        if (s->direct) {
                if (sd_bus_is_ready(s->direct) > 0)
                        return s->direct;
                if (sd_bus_is_open(s->direct) > 0)
                        return s->bus; /* still authenticating */
                /* Closed: forkd went away or refused us. Pending calls hold
                 * their own references and get their (synthesised) error
                 * replies. */
                s->direct = sd_bus_unref(s->direct);
        }
        direct_query_start(s);
        return s->bus;
}

/* ---------------- responses ---------------- */

static void suspended_unlink(RestRequest *req) {
        RestServer *s = req->server;

        if (req->prev)
                req->prev->next = req->next;
        else if (s->suspended == req)
                s->suspended = req->next;
        if (req->next)
                req->next->prev = req->prev;
        req->prev = req->next = NULL;
}

static int queue_response(RestRequest *req, unsigned status, struct MHD_Response *resp) {
        if (req->suspended) {
                /* We are in a D-Bus reply callback: park the response and
                 * let MHD call the access handler again. */
                req->pending = resp;
                req->pending_status = status;
                req->suspended = false;
                suspended_unlink(req);
                (void) MHD_set_connection_option(req->connection, MHD_CONNECTION_OPTION_TIMEOUT,
                                                 req->server->timeout_secs);
                MHD_resume_connection(req->connection);
                /* MHD has no wake-up channel in external polling mode: run it
                 * once more from this loop iteration. */
                (void) sd_event_source_set_enabled(req->server->resume_source, SD_EVENT_ONESHOT);
                return 0;
        }
        if (req->queued || req->pending) {
                MHD_destroy_response(resp);
                return -EALREADY;
        }
        if (MHD_queue_response(req->connection, status, resp) != MHD_YES) {
                MHD_destroy_response(resp);
                return -EIO;
        }
        MHD_destroy_response(resp);
        req->queued = true;
        req->status = status;
        return 0;
}

/* ---------------- Idempotency-Key ----------------
 *
 * A request that creates something and carries a valid key hashes its
 * method, path, query and body as they arrive. Once it is whole, the key is
 * looked up (rest_idem_begin()): a new key is claimed on disk and the route
 * runs; a kept answer is replayed; while the key's first request is still in
 * flight the retry waits, suspended like a D-Bus call, for that answer. The
 * first request's answer is kept when forkd was asked (idem_sent): before
 * that nothing was done, and the key is free again. */

static int reply_replay(RestRequest *req, unsigned status, const char *content_type, const char *body, size_t len) {
        struct MHD_Response *resp;

        resp = MHD_create_response_from_buffer(len, (void *) body, MHD_RESPMEM_MUST_COPY);
        if (!resp)
                return -ENOMEM;
        if (content_type && *content_type)
                (void) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        (void) MHD_add_response_header(resp, IDEM_REPLAYED_HEADER, "true");
        req->server->idem_replays++;
        return queue_response(req, status, resp);
}

static int reply_unkept(RestRequest *req, unsigned status, size_t len) {
        return rest_reply_error(req, 409,
                                "the first request with this Idempotency-Key was answered %u with a body of %zu bytes, "
                                "more than forkd-rest keeps; its answer cannot be replayed",
                                status, len);
}

static int reply_interrupted(RestRequest *req) {
        return rest_reply_error(req, 409,
                                "a request with this Idempotency-Key was interrupted by a restart of forkd-rest; "
                                "its outcome is unknown");
}

static void idem_waiter_unlink(RestRequest *req) {
        RestRequest **w = (RestRequest **) &req->idem_wait->waiters;

        while (*w && *w != req)
                w = &(*w)->idem_next;
        if (*w)
                *w = req->idem_next;
        req->idem_next = NULL;
        req->idem_wait = NULL;
}

/* Every answer passes here before it goes to MHD. body NULL: an answer that
 * cannot be kept (a file, a stream), of len bytes. */
static void idem_settle(RestRequest *req, unsigned status, const char *content_type, const char *body, size_t len) {
        RestServer *s = req->server;
        RestRequest *waiters;
        RestIdemEntry *e;
        int r;

        if (req->idem_wait)
                idem_waiter_unlink(req); /* its own answer: a replay, or an error */
        if (!req->idem)
                return;
        e = TAKE_PTR(req->idem);
        waiters = e->waiters;
        e->waiters = NULL;
        if (s->stopping)
                /* The 503 of a shutdown is no outcome: forkd may finish the
                 * work. The record stays pending. */
                rest_idem_abandon(s->idem, e, false);
        else if (!req->idem_sent)
                rest_idem_abandon(s->idem, e, true);
        else {
                r = rest_idem_finish(s->idem, e, status, content_type, body, len);
                if (r < 0)
                        log_warning_errno(r, "Cannot keep the answer to a request with an Idempotency-Key: %m");
        }
        while (waiters) {
                RestRequest *w = waiters;

                waiters = w->idem_next;
                w->idem_next = NULL;
                w->idem_wait = NULL;
                if (body)
                        (void) reply_replay(w, status, content_type, body, len);
                else
                        (void) reply_unkept(w, status, len);
        }
}

/* The key's first request ends without an answer (its connection failed). */
static void idem_drop(RestRequest *req) {
        RestServer *s = req->server;
        RestRequest *waiters;
        RestIdemEntry *e;
        bool sent = req->idem_sent && !s->stopping;

        if (req->idem_wait)
                idem_waiter_unlink(req);
        if (!req->idem)
                return;
        e = TAKE_PTR(req->idem);
        waiters = e->waiters;
        e->waiters = NULL;
        rest_idem_abandon(s->idem, e, !req->idem_sent);
        while (waiters) {
                RestRequest *w = waiters;

                waiters = w->idem_next;
                w->idem_next = NULL;
                w->idem_wait = NULL;
                if (sent)
                        (void) reply_interrupted(w);
                else
                        (void) rest_reply_error(w, 503, "the first request with this Idempotency-Key ended without "
                                                        "an answer before anything was done; retry");
        }
}

int rest_reply_raw(RestRequest *req, unsigned status, const char *content_type, const char *body, size_t len) {
        struct MHD_Response *resp;

        idem_settle(req, status, content_type, body, len);
        resp = MHD_create_response_from_buffer(len, (void *) body, MHD_RESPMEM_MUST_COPY);
        if (!resp)
                return -ENOMEM;
        if (content_type)
                (void) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        if (status == 401)
                (void) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
        if (status == 405 && req->route && req->route->allow)
                (void) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, req->route->allow);
        return queue_response(req, status, resp);
}

int rest_reply_fd(RestRequest *req, unsigned status, const char *content_type, int fd, uint64_t size) {
        struct MHD_Response *resp;

        idem_settle(req, status, content_type, NULL, (size_t) MIN(size, (uint64_t) SIZE_MAX));
        resp = MHD_create_response_from_fd_at_offset64(size, fd, 0);
        if (!resp) {
                safe_close(fd);
                return -ENOMEM;
        }
        if (content_type)
                (void) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        return queue_response(req, status, resp);
}

int rest_reply_json(RestRequest *req, unsigned status, struct json_object *body) {
        const char *s;
        size_t len;

        s = rest_json_string(body, &len);
        if (!s)
                return -ENOMEM;
        return rest_reply_raw(req, status, "application/json", s, len);
}

int rest_reply_no_content(RestRequest *req) {
        return rest_reply_raw(req, 204, NULL, "", 0);
}

static int reply_error_string(RestRequest *req, unsigned status, const char *msg) {
        _cleanup_json_ struct json_object *o = NULL;
        struct json_object *m;

        o = json_object_new_object();
        if (!o)
                return -ENOMEM;
        /* json-c escapes control bytes; invalid UTF-8 from a peer is replaced */
        m = json_object_new_string(utf8_is_valid_n(msg, strlen(msg)) ? msg : "(message not valid UTF-8)");
        if (!m || json_object_object_add(o, "error", m) < 0) {
                json_object_put(m);
                return -ENOMEM;
        }
        return rest_reply_json(req, status, o);
}

int rest_reply_error(RestRequest *req, unsigned status, const char *fmt, ...) {
        char msg[1024];
        va_list ap;

        va_start(ap, fmt);
        (void) vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        return reply_error_string(req, status, msg);
}

int rest_reply_bus_error(RestRequest *req, const sd_bus_error *e, unsigned override_exists_status) {
        unsigned status = rest_status_from_bus_error(e ? e->name : NULL);

        if (override_exists_status && e && e->name && !strcmp(e->name, FORKD_ERROR_SNAPSHOT_EXISTS))
                status = override_exists_status;
        if (e && rest_bus_error_is_unavailable(e->name))
                return rest_reply_error(req, status, "forkd daemon unavailable: %s",
                                        e->message ?: e->name);
        return reply_error_string(req, status, e && e->message && *e->message ? e->message
                                              : e && e->name                   ? e->name
                                                                               : "internal error");
}

/* ---------------- D-Bus calls ---------------- */

int rest_new_call(RestRequest *req, const char *path, const char *interface, const char *member,
                  sd_bus_message **ret) {
        RestServer *s = req->server;
        sd_bus *bus;
        int r;

        r = bus_ensure(s);
        if (r < 0)
                return log_debug_errno(r, "Cannot connect to the bus: %m");
        bus = call_bus(s);
        /* A direct connection has no names: no destination. */
        return sd_bus_message_new_method_call(bus, ret, bus == s->bus ? "org.forkd.Manager" : NULL, path,
                                              interface, member);
}

int rest_new_manager_call(RestRequest *req, const char *member, sd_bus_message **ret) {
        return rest_new_call(req, "/org/forkd/Manager", "org.forkd.Manager", member, ret);
}

static int on_bus_reply(sd_bus_message *reply, void *userdata, sd_bus_error *ret_error) {
        RestRequest *req = userdata;
        RestServer *s = req->server;
        int r;

        req->slot = sd_bus_slot_unref(req->slot);
        s->calls_in_flight--;

        r = req->on_reply(req, reply);
        if (r < 0 && req->suspended)
                (void) rest_reply_error(req, 500, "failed to translate the daemon's reply: %s", strerror(-r));
        if (req->suspended) /* a handler that forgot to answer */
                (void) rest_reply_error(req, 500, "no reply produced");
        return 0;
}

int rest_call(RestRequest *req, sd_bus_message *m, uint64_t timeout_usec, rest_reply_func on_reply) {
        RestServer *s = req->server;
        int r;

        if (s->calls_in_flight >= s->calls_max) {
                s->calls_rejected++;
                return -EBUSY;
        }
        r = sd_bus_call_async(sd_bus_message_get_bus(m), &req->slot, m, on_bus_reply, req, timeout_usec);
        if (r < 0)
                return log_debug_errno(r, "Failed to send D-Bus call: %m");

        s->calls_in_flight++;
        s->calls_total++;
        if (sd_bus_message_get_bus(m) == s->direct)
                s->calls_direct++;
        req->idem_sent = true;
        req->on_reply = on_reply;
        req->suspended = true;
        req->next = s->suspended;
        if (s->suspended)
                s->suspended->prev = req;
        s->suspended = req;
        /* No idle timeout while we wait for the daemon: the D-Bus call has its own. */
        (void) MHD_set_connection_option(req->connection, MHD_CONNECTION_OPTION_TIMEOUT, 0);
        MHD_suspend_connection(req->connection);
        return 0;
}

static int on_bus_reply_detached(sd_bus_message *reply, void *userdata, sd_bus_error *ret_error) {
        RestRequest *req = userdata;

        req->slot = sd_bus_slot_unref(req->slot);
        req->server->calls_in_flight--;
        (void) req->on_reply(req, reply);
        return 0;
}

int rest_call_detached(RestRequest *req, sd_bus_message *m, uint64_t timeout_usec, rest_reply_func on_reply) {
        RestServer *s = req->server;
        int r;

        if (s->calls_in_flight >= s->calls_max) {
                s->calls_rejected++;
                return -EBUSY;
        }
        r = sd_bus_call_async(sd_bus_message_get_bus(m), &req->slot, m, on_bus_reply_detached, req, timeout_usec);
        if (r < 0)
                return log_debug_errno(r, "Failed to send D-Bus call: %m");
        s->calls_in_flight++;
        s->calls_total++;
        if (sd_bus_message_get_bus(m) == s->direct)
                s->calls_direct++;
        req->idem_sent = true;
        req->on_reply = on_reply;
        return 0;
}

void rest_request_wait(RestRequest *req) {
        RestServer *s = req->server;

        req->suspended = true;
        req->next = s->suspended;
        if (s->suspended)
                s->suspended->prev = req;
        s->suspended = req;
        (void) MHD_set_connection_option(req->connection, MHD_CONNECTION_OPTION_TIMEOUT, 0);
        MHD_suspend_connection(req->connection);
}

void rest_request_set_data(RestRequest *req, void *data, void (*free_data)(void *)) {
        req->data = data;
        req->free_data = free_data;
}

void *rest_request_data(RestRequest *req) {
        return req->data;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
        RestRequest *req = cls;
        ssize_t n;

        if (req->stream_abort)
                return MHD_CONTENT_READER_END_WITH_ERROR;
        n = req->stream_read(req, buf, max);
        if (n > 0)
                return n;
        if (n == REST_STREAM_END)
                return MHD_CONTENT_READER_END_OF_STREAM;
        if (n == REST_STREAM_AGAIN) {
                /* Allowed from a content reader (microhttpd.h); rest_stream_resume() undoes it. */
                req->stream_suspended = true;
                MHD_suspend_connection(req->connection);
                return 0;
        }
        return MHD_CONTENT_READER_END_WITH_ERROR;
}

int rest_reply_stream(RestRequest *req, unsigned status, const char *content_type, rest_stream_read_func read) {
        RestServer *s = req->server;
        struct MHD_Response *resp;
        int r;

        idem_settle(req, status, content_type, NULL, 0);
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_reader, req, NULL);
        if (!resp)
                return -ENOMEM;
        if (content_type)
                (void) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        req->stream_read = read;
        r = queue_response(req, status, resp);
        if (r < 0)
                return r;
        req->streaming = true;
        req->stream_next = s->streams;
        if (s->streams)
                s->streams->stream_prev = req;
        s->streams = req;
        return 0;
}

void rest_stream_resume(RestRequest *req) {
        if (!req->stream_suspended)
                return;
        req->stream_suspended = false;
        MHD_resume_connection(req->connection);
        (void) sd_event_source_set_enabled(req->server->resume_source, SD_EVENT_ONESHOT);
}

/* ---------------- request accessors ---------------- */

const char *rest_request_param(RestRequest *req) {
        return req->has_param ? req->param : NULL;
}

int rest_request_body_fd(RestRequest *req) {
        if (req->body_fd < 0) {
                /* On disk where we may (a bundle may be larger than forkd-rest's MemoryMax=),
                 * else in memory. Unlinked from birth either way. */
                const char *dir = getenv("TMPDIR");

                req->body_fd = open(dir && dir[0] == '/' ? dir : "/var/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
                if (req->body_fd < 0)
                        req->body_fd = memfd_create("forkd-rest-body", MFD_CLOEXEC);
                if (req->body_fd < 0)
                        return -errno;
        }
        if (lseek(req->body_fd, 0, SEEK_SET) < 0)
                return -errno;
        return req->body_fd;
}

const char *rest_request_body(RestRequest *req, size_t *ret_len) {
        *ret_len = req->body_len;
        return req->body ?: "";
}

const char *rest_request_query(RestRequest *req, const char *key) {
        return MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, key);
}

RestServer *rest_request_server(RestRequest *req) {
        return req->server;
}

int rest_request_parse_json(RestRequest *req, bool allow_empty, struct json_object **ret) {
        const char *err = NULL;
        struct json_object *o;
        size_t i;
        int r;

        for (i = 0; i < req->body_len; i++)
                if (!strchr(" \t\r\n", req->body[i]))
                        break;
        if (i == req->body_len) {
                if (!allow_empty) {
                        (void) rest_reply_error(req, 400, "request body must be a JSON object");
                        return -EBADMSG;
                }
                o = json_object_new_object();
                if (!o)
                        return -ENOMEM;
                *ret = o;
                return 0;
        }

        r = json_parse_strict(req->body, req->body_len, req->server->body_max, REST_JSON_DEPTH_MAX, &o, &err);
        if (r < 0) {
                (void) rest_reply_error(req, r == -EMSGSIZE ? 413 : 400, "malformed JSON body: %s",
                                        err ?: "parse error");
                return r;
        }
        *ret = o;
        return 0;
}

/* ---------------- routing ---------------- */

static bool route_match(const char *pattern, const char *url, char *param, size_t param_size, bool *has_param) {
        const char *p = pattern, *u = url;

        *has_param = false;
        while (*p && *u) {
                if (*p == '%') {
                        size_t n = strcspn(u, "/");

                        if (n == 0)
                                return false;
                        if (n >= param_size)
                                n = param_size - 1; /* too long: validation refuses it later */
                        memcpy(param, u, n);
                        param[n] = 0;
                        *has_param = true;
                        u += strcspn(u, "/");
                        p++;
                        continue;
                }
                if (*p != *u)
                        return false;
                p++, u++;
        }
        return *p == 0 && *u == 0;
}

static int method_index(const char *m) {
        for (int i = 0; i < METHOD_OTHER; i++)
                if (!strcmp(m, method_names[i]))
                        return i;
        return METHOD_OTHER;
}

static bool check_auth(RestRequest *req) {
        RestServer *s = req->server;
        const char *h;
        size_t n;

        if (!s->token || (req->route_index < (int) rest_routes_count && rest_routes[req->route_index].no_auth))
                return true;
        h = MHD_lookup_connection_value(req->connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        if (!h || strncasecmp(h, "Bearer ", 7) != 0)
                return false;
        h += 7;
        h += strspn(h, " ");
        n = strlen(h);
        while (n > 0 && h[n - 1] == ' ')
                n--;
        return rest_secret_equal(h, n, s->token, s->token_len);
}

static enum MHD_Result count_idem_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
        if (key && !strcasecmp(key, IDEM_HEADER))
                (*(unsigned *) cls)++;
        return MHD_YES;
}

static enum MHD_Result hash_query_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
        sha256_ctx *c = cls;

        rest_idem_hash_field(c, key ?: "", key ? strlen(key) : 0);
        rest_idem_hash_field(c, value ? "=" : "", value ? 1 : 0); /* "?a" is not "?a=" */
        if (value)
                rest_idem_hash_field(c, value, strlen(value));
        return MHD_YES;
}

/* A route that creates something: take its Idempotency-Key, if any, and
 * start the request's hash. Returns 0, or a queued 400's result. */
static int idem_request_begin(RestRequest *req, const char *url, const char *method) {
        const char *key;
        unsigned n = 0;

        if (!rest_idem_applies(method, url))
                return 0; /* elsewhere the header means nothing and is ignored */
        (void) MHD_get_connection_values(req->connection, MHD_HEADER_KIND, count_idem_header, &n);
        if (n == 0)
                return 0;
        if (n > 1)
                return MIN(rest_reply_error(req, 400, "more than one Idempotency-Key header"), -EINVAL);
        key = MHD_lookup_connection_value(req->connection, MHD_HEADER_KIND, IDEM_HEADER);
        if (!key || !rest_idem_key_is_valid(key))
                return MIN(rest_reply_error(req, 400,
                                            "invalid Idempotency-Key: it must be 1 to %u printable ASCII characters",
                                            REST_IDEM_KEY_MAX),
                           -EINVAL);
        req->idem_key = strdup(key);
        if (!req->idem_key)
                return MIN(rest_reply_error(req, 500, "out of memory"), -ENOMEM);
        sha256_init(&req->idem_hash);
        rest_idem_hash_field(&req->idem_hash, method, strlen(method));
        rest_idem_hash_field(&req->idem_hash, url, strlen(url));
        (void) MHD_get_connection_values(req->connection, MHD_GET_ARGUMENT_KIND, hash_query_arg, &req->idem_hash);
        return 0;
}

/* The whole request is in. Returns 1 when the route is to run (the key is
 * new and now this request's), 0 when it was answered or waits, or the
 * failed reply's negative errno. */
static int idem_request_claim(RestRequest *req) {
        RestServer *s = req->server;
        _cleanup_free_ char *buf = NULL;
        uint8_t hash[SHA256_DIGEST_SIZE];
        RestIdemEntry *e = NULL;
        RestIdemRecord rec;
        int r;

        if (!s->idem)
                return rest_reply_error(req, 503, "Idempotency-Key is not available: forkd-rest has no state directory");
        sha256_final(&req->idem_hash, hash);
        r = rest_idem_begin(s->idem, req->idem_key, hash, &e, &rec, &buf);
        switch (r) {
        case REST_IDEM_LOOKUP_NEW:
                req->idem = e;
                return 1;
        case REST_IDEM_LOOKUP_WAIT:
                req->idem_wait = e;
                req->idem_next = e->waiters;
                e->waiters = req;
                s->idem_waits++;
                rest_request_wait(req);
                return 0;
        case REST_IDEM_LOOKUP_REPLAY:
                return reply_replay(req, rec.status, rec.content_type, rec.body, rec.body_len);
        case REST_IDEM_LOOKUP_UNKEPT:
                return reply_unkept(req, rec.status, rec.body_len);
        case REST_IDEM_LOOKUP_INTERRUPTED:
                return reply_interrupted(req);
        case REST_IDEM_LOOKUP_DAMAGED:
                return rest_reply_error(req, 409,
                                        "the record of this Idempotency-Key cannot be read; the outcome of its "
                                        "request is unknown");
        case REST_IDEM_LOOKUP_MISMATCH:
                return rest_reply_error(req, 422,
                                        "this Idempotency-Key was used with another request (method, path, query "
                                        "or body differ)");
        case -ENOBUFS:
                return rest_reply_error(req, 503, "too many Idempotency-Key records (%u, each kept 24 hours); retry later",
                                        rest_idem_records(s->idem));
        default:
                return rest_reply_error(req, 503, "cannot keep a record of the Idempotency-Key: %s",
                                        strerror(r < 0 ? -r : EIO));
        }
}

/* The first call for a request: headers are in. Route, authenticate, check
 * the announced body size. A response may be queued right here. */
static enum MHD_Result request_begin(RestRequest *req, const char *url, const char *method) {
        RestServer *s = req->server;
        const char *cl;
        size_t body_max;

        req->route_index = (int) rest_routes_count;
        req->method_index = method_index(method);
        for (size_t i = 0; i < rest_routes_count; i++)
                if (route_match(rest_routes[i].pattern, url, req->param, sizeof req->param, &req->has_param)) {
                        req->route = &rest_routes[i];
                        req->route_index = (int) i;
                        break;
                }
        if (!req->route)
                req->has_param = false;

        if (req->conn)
                req->conn->deadline = now_usec() + s->timeout_secs * USEC_PER_SEC; /* now for the body */

        if (!check_auth(req)) {
                /* Podflare's body (seed 002); the forkd documents give none. */
                return rest_reply_error(req, 401, "invalid api key") < 0 ? MHD_NO : MHD_YES;
        }
        if (!req->route) {
                return rest_reply_error(req, 404, "no route for %s %s", method, url) < 0 ? MHD_NO : MHD_YES;
        }
        for (size_t i = 0; i < ELEMENTSOF(req->route->methods) && req->route->methods[i].method; i++)
                if (!strcmp(req->route->methods[i].method, method)) {
                        req->method = &req->route->methods[i];
                        break;
                }
        if (!req->method) {
                return rest_reply_error(req, 405, "method %s not allowed on %s", method, url) < 0 ? MHD_NO : MHD_YES;
        }

        body_max = rest_method_body_fd_max(req->method) ?: s->body_max;
        cl = MHD_lookup_connection_value(req->connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
                char *end;
                unsigned long long v;

                errno = 0;
                v = strtoull(cl, &end, 10);
                if (errno || end == cl || *end) {
                        return rest_reply_error(req, 400, "invalid Content-Length") < 0 ? MHD_NO : MHD_YES;
                }
                if (v > body_max) {
                        return rest_reply_error(req, 413, "request body larger than %zu bytes", body_max) < 0 ? MHD_NO : MHD_YES;
                }
        }
        return idem_request_begin(req, url, method) < 0 && !req->queued ? MHD_NO : MHD_YES;
}

static enum MHD_Result handle_access(void *cls, struct MHD_Connection *connection, const char *url,
                                     const char *method, const char *version, const char *upload_data,
                                     size_t *upload_data_size, void **con_cls) {
        RestServer *s = cls;
        RestRequest *req = *con_cls;
        int r;

        if (!req) {
                const union MHD_ConnectionInfo *ci;

                req = calloc(1, sizeof *req);
                if (!req)
                        return MHD_NO;
                req->server = s;
                req->body_fd = -EBADF;
                req->connection = connection;
                req->start = now_usec();
                ci = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
                req->conn = ci ? ci->socket_context : NULL;
                *con_cls = req;
                return request_begin(req, url, method);
        }

        if (req->pending) {
                /* resumed after the D-Bus reply */
                struct MHD_Response *resp = TAKE_PTR(req->pending);

                if (MHD_queue_response(connection, req->pending_status, resp) != MHD_YES) {
                        MHD_destroy_response(resp);
                        return MHD_NO;
                }
                MHD_destroy_response(resp);
                req->queued = true;
                req->status = req->pending_status;
                return MHD_YES;
        }

        if (*upload_data_size > 0) {
                size_t n = *upload_data_size;

                *upload_data_size = 0;
                if (req->queued)
                        return MHD_YES; /* answered early: discard */
                if (req->too_large)
                        return MHD_YES; /* discard; the request deadline bounds how long */
                if (req->idem_key)
                        sha256_update(&req->idem_hash, upload_data, n);
                if (req->method && rest_method_body_fd_max(req->method) > 0) {
                        if (n > rest_method_body_fd_max(req->method) - req->body_len) {
                                req->body_fd = safe_close(req->body_fd);
                                req->too_large = true;
                                return MHD_YES;
                        }
                        if (rest_request_body_fd(req) < 0)
                                return MHD_NO;
                        for (size_t w = 0; w < n;) {
                                ssize_t k = pwrite(req->body_fd, upload_data + w, n - w, (off_t) (req->body_len + w));
                                if (k < 0)
                                        return MHD_NO;
                                w += (size_t) k;
                        }
                        req->body_len += n;
                        if (req->conn && req->conn->deadline > 0) {
                                uint64_t d = req->start + s->timeout_secs * USEC_PER_SEC +
                                             req->body_len * USEC_PER_SEC / REST_UPLOAD_MIN_RATE;

                                req->conn->deadline = MAX(req->conn->deadline, d);
                        }
                        return MHD_YES;
                }
                if (n > s->body_max - req->body_len) {
                        /* Chunked, or more than Content-Length said: refuse
                         * before buffering. MHD does not take a response in
                         * the middle of an upload, so drop the rest and
                         * answer 413 once the client is done. */
                        free(req->body);
                        req->body = NULL;
                        req->body_len = req->body_alloc = 0;
                        req->too_large = true;
                        return MHD_YES;
                }
                if (req->body_len + n + 1 > req->body_alloc) {
                        size_t a = MAX(req->body_alloc * 2, req->body_len + n + 1);
                        char *b;

                        a = MIN(a, s->body_max + 1);
                        b = realloc(req->body, a);
                        if (!b)
                                return MHD_NO;
                        req->body = b;
                        req->body_alloc = a;
                }
                memcpy(req->body + req->body_len, upload_data, n);
                req->body_len += n;
                req->body[req->body_len] = 0;
                return MHD_YES;
        }

        if (req->queued || req->suspended)
                return MHD_YES;

        if (!req->method) /* an early answer could not be queued */
                return MHD_NO;

        /* The whole request is in. */
        if (req->conn)
                req->conn->deadline = 0;
        if (req->too_large) {
                r = rest_reply_error(req, 413, "request body larger than %zu bytes",
                                     rest_method_body_fd_max(req->method) ?: s->body_max);
                return r < 0 ? MHD_NO : MHD_YES;
        }
        if (req->idem_key) {
                r = idem_request_claim(req);
                if (r <= 0)
                        return r < 0 && !req->queued && !req->suspended && !req->pending ? MHD_NO : MHD_YES;
        }
        r = req->method->handler(req);
        if (!req->queued && !req->suspended && !req->pending) {
                if (r == -EBUSY)
                        r = rest_reply_error(req, 503, "too many requests in flight to the daemon, retry later");
                else if (r < 0)
                        r = rest_reply_error(req, 503, "forkd daemon unavailable: %s", strerror(-r));
                else
                        r = rest_reply_error(req, 500, "internal error: no response");
                if (r < 0)
                        return MHD_NO;
        }
        return MHD_YES;
}

static void record_metrics(RestServer *s, RestRequest *req) {
        size_t code = CODE_OTHER;
        double secs;
        size_t b;

        if (req->route_index < 0 || req->route_index >= ROUTES_MAX)
                return;
        for (size_t i = 0; i < ELEMENTSOF(metric_codes); i++)
                if (metric_codes[i] == req->status) {
                        code = i;
                        break;
                }
        s->requests[req->route_index][req->method_index][code]++;

        secs = (double) (now_usec() - req->start) / 1e6;
        for (b = 0; b < BUCKETS; b++)
                if (secs <= latency_buckets[b])
                        break;
        s->hist[req->route_index][b]++;
        s->hist_sum[req->route_index] += secs;
        s->hist_count[req->route_index]++;
}

static void handle_completed(void *cls, struct MHD_Connection *connection, void **con_cls,
                             enum MHD_RequestTerminationCode toe) {
        RestServer *s = cls;
        RestRequest *req = *con_cls;

        if (!req)
                return;
        if (req->queued)
                record_metrics(s, req);
        if (req->slot) {
                req->slot = sd_bus_slot_unref(req->slot); /* cancels the call */
                s->calls_in_flight--;
        }
        if (req->suspended)
                suspended_unlink(req);
        idem_drop(req);
        if (req->streaming) {
                if (req->stream_prev)
                        req->stream_prev->stream_next = req->stream_next;
                else if (s->streams == req)
                        s->streams = req->stream_next;
                if (req->stream_next)
                        req->stream_next->stream_prev = req->stream_prev;
        }
        if (req->free_data)
                req->free_data(req->data);
        if (req->pending)
                MHD_destroy_response(req->pending);
        if (req->conn) /* the next request on this connection has its own deadline */
                req->conn->deadline = now_usec() + s->timeout_secs * USEC_PER_SEC;
        free(req->body);
        free(req->idem_key);
        safe_close(req->body_fd);
        free(req);
        *con_cls = NULL;
}

static void handle_connection(void *cls, struct MHD_Connection *connection, void **socket_context,
                              enum MHD_ConnectionNotificationCode toe) {
        RestServer *s = cls;
        RestConn *c;

        if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
                const union MHD_ConnectionInfo *ci;

                c = calloc(1, sizeof *c);
                if (!c)
                        return; /* no deadline for this one; the idle timeout still applies */
                c->server = s;
                ci = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
                c->fd = ci ? ci->connect_fd : -1;
                c->deadline = now_usec() + s->timeout_secs * USEC_PER_SEC;
                c->next = s->conns;
                if (s->conns)
                        s->conns->prev = c;
                s->conns = c;
                s->conns_active++;
                s->conns_total++;
                *socket_context = c;
                return;
        }

        c = *socket_context;
        if (!c)
                return;
        if (c->prev)
                c->prev->next = c->next;
        else
                s->conns = c->next;
        if (c->next)
                c->next->prev = c->prev;
        s->conns_active--;
        free(c);
        *socket_context = NULL;
}

/* ---------------- event loop glue ---------------- */

static int dispatch_http_io(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        RestServer *s = userdata;
        unsigned before = s->conns_active;

        if (MHD_run(s->daemon) != MHD_YES)
                log_debug("MHD_run() failed");
        /* MHD drops the listening socket from its epoll set while at the
         * connection limit and puts it back only at the start of the next
         * run; with nothing else pending that run would never come. */
        if (s->conns_active < before)
                (void) MHD_run(s->daemon);
        return 0;
}

static int dispatch_http_defer(sd_event_source *es, void *userdata) {
        return dispatch_http_io(NULL, -1, 0, userdata);
}

static int dispatch_http_timer(sd_event_source *es, uint64_t usec, void *userdata) {
        return dispatch_http_io(NULL, -1, 0, userdata);
}

/* Before each poll: when does MHD want to run again? "At once" (it has
 * buffered work, or a keep-alive connection just finished a response) goes
 * through the defer source, which costs no syscall; a real timeout arms the
 * timer, which is reprogrammed only when MHD needs it earlier (or much
 * later): every timerfd_settime() is a syscall that shows up in the round
 * trip, and MHD's idle timeouts move a little on every iteration. Firing
 * early is harmless: MHD_run() finds nothing to do and we ask again. */
static int prepare_http(sd_event_source *es, void *userdata) {
        RestServer *s = userdata;
        MHD_UNSIGNED_LONG_LONG ms;
        uint64_t now, deadline, current;
        int enabled, r;

        if (MHD_get_timeout(s->daemon, &ms) != MHD_YES)
                return sd_event_source_set_enabled(s->timer_source, SD_EVENT_OFF);
        if (ms == 0)
                return sd_event_source_set_enabled(s->resume_source, SD_EVENT_ONESHOT);

        r = sd_event_now(s->event, CLOCK_MONOTONIC, &now);
        if (r < 0)
                return r;
        deadline = now + MIN(ms, 3600000ULL) * 1000ULL;
        if (sd_event_source_get_enabled(s->timer_source, &enabled) >= 0 && enabled != SD_EVENT_OFF &&
            sd_event_source_get_time(s->timer_source, &current) >= 0 && current <= deadline &&
            deadline - current < USEC_PER_SEC)
                return 0;
        r = sd_event_source_set_time(s->timer_source, deadline);
        if (r < 0)
                return r;
        return sd_event_source_set_enabled(s->timer_source, SD_EVENT_ONESHOT);
}

/* Slow clients: MHD's timeout is an idle timeout, so a client that trickles
 * a byte now and then would stay forever. Every request must arrive whole
 * within timeout_secs; past that its socket is shut down and MHD closes it. */
static int dispatch_deadlines(sd_event_source *es, uint64_t usec, void *userdata) {
        RestServer *s = userdata;
        uint64_t now = now_usec();

        for (RestConn *c = s->conns; c; c = c->next)
                if (c->deadline > 0 && now > c->deadline && c->fd >= 0) {
                        (void) shutdown(c->fd, SHUT_RDWR);
                        c->deadline = 0;
                        s->conns_cut++;
                }

        (void) sd_event_source_set_time_relative(es, 250000);
        return sd_event_source_set_enabled(es, SD_EVENT_ONESHOT);
}

/* %HH decoding of the path and query, except that %00 stays as it is: a NUL
 * would silently cut the path short ("/v1/snapshots/x%00/info" must not
 * become "/v1/snapshots/x"); left encoded, validation refuses it. */
static size_t unescape_uri(void *cls, struct MHD_Connection *c, char *uri) {
        char *w = uri;

        for (const char *r = uri; *r;) {
                int hi, lo;

                if (r[0] == '%' && (hi = unhexchar(r[1])) >= 0 && (lo = unhexchar(r[2])) >= 0 && (hi | lo) != 0) {
                        *w++ = (char) (hi << 4 | lo);
                        r += 3;
                } else
                        *w++ = *r++;
        }
        *w = 0;
        return (size_t) (w - uri);
}

static void mhd_logger(void *cls, const char *fmt, va_list ap) {
        char msg[512];

        (void) vsnprintf(msg, sizeof msg, fmt, ap);
        msg[strcspn(msg, "\n")] = 0;
        log_debug("microhttpd: %s", msg);
}

int rest_server_new(sd_event *event, const RestConfig *config, RestServer **ret) {
        _cleanup_(rest_server_freep) RestServer *s = NULL;
        unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
        struct MHD_OptionItem opts[16];
        const union MHD_DaemonInfo *info;
        size_t n = 0;
        int fd = config->listen_fd, r;

        s = calloc(1, sizeof *s);
        if (!s) {
                safe_close(fd);
                return -ENOMEM;
        }
        s->event = sd_event_ref(event);
        s->timeout_secs = config->timeout_secs ?: REST_TIMEOUT_SECS_DEFAULT;
        s->body_max = config->body_max ?: REST_BODY_MAX_DEFAULT;
        s->calls_max = config->calls_max ?: REST_CALLS_MAX_DEFAULT;
        s->no_direct = config->no_direct;
        if (config->bus_address && !(s->bus_address = strdup(config->bus_address))) {
                safe_close(fd);
                return -ENOMEM;
        }
        if (config->token) {
                s->token = strdup(config->token);
                if (!s->token) {
                        safe_close(fd);
                        return -ENOMEM;
                }
                s->token_len = strlen(s->token);
        }
        if (config->state_dir) {
                r = rest_idem_new(event, config->state_dir, config->state_dir_create, config->token, &s->idem);
                if (r < 0) {
                        safe_close(fd);
                        return log_debug_errno(r, "Cannot open the state directory %s: %m", config->state_dir);
                }
        }

        r = fcntl(fd, F_GETFL);
        if (r < 0 || fcntl(fd, F_SETFL, r | O_NONBLOCK) < 0) {
                r = negative_errno();
                safe_close(fd);
                return r;
        }

        opts[n++] = (struct MHD_OptionItem) { MHD_OPTION_EXTERNAL_LOGGER, (intptr_t) mhd_logger, NULL };
        opts[n++] = (struct MHD_OptionItem) { MHD_OPTION_LISTEN_SOCKET, fd, NULL };
        opts[n++] = (struct MHD_OptionItem) { MHD_OPTION_CONNECTION_LIMIT,
                                              config->connection_limit ?: REST_CONNECTION_LIMIT_DEFAULT, NULL };
        opts[n++] = (struct MHD_OptionItem) { MHD_OPTION_CONNECTION_TIMEOUT, s->timeout_secs, NULL };
        opts[n++] = (struct MHD_OptionItem) { MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                              (intptr_t) (config->memory_limit ?: REST_MEMORY_LIMIT_DEFAULT),
                                              NULL };
        opts[n++] = (struct MHD_OptionItem) { MHD_OPTION_NOTIFY_COMPLETED, (intptr_t) handle_completed, s };
        opts[n++] = (struct MHD_OptionItem) { MHD_OPTION_NOTIFY_CONNECTION, (intptr_t) handle_connection, s };
        opts[n++] = (struct MHD_OptionItem) { MHD_OPTION_STRICT_FOR_CLIENT, 1, NULL };
        opts[n++] = (struct MHD_OptionItem) { MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t) unescape_uri, NULL };
        if (config->tls_cert_pem && config->tls_key_pem) {
                s->tls_cert = strdup(config->tls_cert_pem);
                s->tls_key = strdup(config->tls_key_pem);
                if (!s->tls_cert || !s->tls_key) {
                        safe_close(fd);
                        return -ENOMEM;
                }
                flags |= MHD_USE_TLS;
                opts[n++] = (struct MHD_OptionItem) { MHD_OPTION_HTTPS_MEM_CERT, 0, s->tls_cert };
                opts[n++] = (struct MHD_OptionItem) { MHD_OPTION_HTTPS_MEM_KEY, 0, s->tls_key };
        }
        opts[n++] = (struct MHD_OptionItem) { MHD_OPTION_END, 0, NULL };

        s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, handle_access, s, MHD_OPTION_ARRAY, opts,
                                     MHD_OPTION_END);
        if (!s->daemon) {
                safe_close(fd);
                return -EINVAL;
        }

        info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_EPOLL_FD);
        if (!info)
                return -EINVAL;
        r = sd_event_add_io(event, &s->io_source, info->epoll_fd, EPOLLIN, dispatch_http_io, s);
        if (r < 0)
                return r;
        r = sd_event_source_set_prepare(s->io_source, prepare_http);
        if (r < 0)
                return r;
        /* accuracy 1us: 0 would mean sd-event's default of 250ms, and MHD
         * asks for "at once" whenever it has buffered data to process */
        r = sd_event_add_time(event, &s->timer_source, CLOCK_MONOTONIC, 0, 1, dispatch_http_timer, s);
        if (r < 0)
                return r;
        r = sd_event_source_set_enabled(s->timer_source, SD_EVENT_OFF);
        if (r < 0)
                return r;
        r = sd_event_add_defer(event, &s->resume_source, dispatch_http_defer, s);
        if (r < 0)
                return r;
        r = sd_event_source_set_enabled(s->resume_source, SD_EVENT_OFF);
        if (r < 0)
                return r;
        r = sd_event_add_time_relative(event, &s->deadline_source, CLOCK_MONOTONIC, 250000, 0,
                                       dispatch_deadlines, s);
        if (r < 0)
                return r;

        /* Connect early so the first request does not pay for it; failure is
         * not fatal (the daemon side may come up later). */
        r = bus_ensure(s);
        if (r < 0)
                log_warning_errno(r, "Cannot connect to the bus yet, will retry per request: %m");
        else
                direct_query_start(s);

        *ret = TAKE_PTR(s);
        return 0;
}

RestServer *rest_server_free(RestServer *s) {
        if (!s)
                return NULL;

        s->stopping = true;
        if (s->daemon) {
                /* Resume whatever waits for the daemon, with a 503, so MHD
                 * can close every connection cleanly. */
                /* Streams are cut: MHD must not stop with a suspended connection. */
                for (RestRequest *req = s->streams; req; req = req->stream_next) {
                        req->stream_abort = true;
                        if (req->stream_suspended) {
                                req->stream_suspended = false;
                                MHD_resume_connection(req->connection);
                        }
                }
                while (s->suspended) {
                        RestRequest *req = s->suspended;

                        if (req->slot) {
                                req->slot = sd_bus_slot_unref(req->slot);
                                s->calls_in_flight--;
                        }
                        (void) rest_reply_error(req, 503, "forkd-rest is shutting down");
                        if (req->suspended) { /* could not even reply */
                                req->suspended = false;
                                suspended_unlink(req);
                                MHD_resume_connection(req->connection);
                        }
                }
                (void) MHD_run(s->daemon);
                MHD_stop_daemon(s->daemon);
        }
        sd_event_source_unref(s->io_source);
        sd_event_source_unref(s->timer_source);
        sd_event_source_unref(s->deadline_source);
        sd_event_source_unref(s->resume_source);
        sd_bus_slot_unref(s->direct_query);
        sd_bus_flush_close_unref(s->direct);
        sd_bus_flush_close_unref(s->bus);
        rest_idem_free(s->idem);
        sd_event_unref(s->event);
        free(s->bus_address);
        if (s->token)
                explicit_bzero(s->token, s->token_len);
        free(s->token);
        if (s->tls_key)
                explicit_bzero(s->tls_key, strlen(s->tls_key));
        free(s->tls_key);
        free(s->tls_cert);
        free(s);
        return NULL;
}

/* ---------------- metrics ---------------- */

int rest_metrics_format(RestServer *s, FILE *f) {
        size_t nroutes = MIN(rest_routes_count + 1, (size_t) ROUTES_MAX);

        fputs("# HELP forkd_rest_requests_total HTTP requests answered by forkd-rest, by route, method and status.\n"
              "# TYPE forkd_rest_requests_total counter\n",
              f);
        for (size_t r = 0; r < nroutes; r++)
                for (size_t m = 0; m < _METHOD_MAX; m++)
                        for (size_t c = 0; c < CODES_MAX; c++) {
                                if (!s->requests[r][m][c])
                                        continue;
                                fprintf(f, "forkd_rest_requests_total{route=\"%s\",method=\"%s\",code=\"",
                                        r < rest_routes_count ? rest_routes[r].pattern : "unknown", method_names[m]);
                                if (c < CODE_OTHER)
                                        fprintf(f, "%u", metric_codes[c]);
                                else
                                        fputs("other", f);
                                fprintf(f, "\"} %" PRIu64 "\n", s->requests[r][m][c]);
                        }

        fputs("# HELP forkd_rest_request_duration_seconds Time from request headers to response, by route.\n"
              "# TYPE forkd_rest_request_duration_seconds histogram\n",
              f);
        for (size_t r = 0; r < nroutes; r++) {
                const char *name = r < rest_routes_count ? rest_routes[r].pattern : "unknown";
                uint64_t cum = 0;

                if (!s->hist_count[r])
                        continue;
                for (size_t b = 0; b < BUCKETS; b++) {
                        cum += s->hist[r][b];
                        fprintf(f, "forkd_rest_request_duration_seconds_bucket{route=\"%s\",le=\"%g\"} %" PRIu64 "\n",
                                name, latency_buckets[b], cum);
                }
                fprintf(f, "forkd_rest_request_duration_seconds_bucket{route=\"%s\",le=\"+Inf\"} %" PRIu64 "\n",
                        name, s->hist_count[r]);
                fprintf(f, "forkd_rest_request_duration_seconds_sum{route=\"%s\"} %.6f\n", name, s->hist_sum[r]);
                fprintf(f, "forkd_rest_request_duration_seconds_count{route=\"%s\"} %" PRIu64 "\n", name,
                        s->hist_count[r]);
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
                s->calls_in_flight, s->calls_total, s->calls_direct, s->calls_rejected, s->conns_active, s->conns_total,
                s->conns_cut, s->idem ? rest_idem_records(s->idem) : 0u, s->idem_replays, s->idem_waits);
        return ferror(f) ? -EIO : 0;
}
