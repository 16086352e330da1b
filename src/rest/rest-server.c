/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* forkd-rest's HTTP server: libmicrohttpd's loop on sd-event, routing,
 * authentication, the body cap and request deadlines. */

#include <fcntl.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <unistd.h>

#include "macro.h"
#include "rest-idem-glue.h"
#include "rest-server-internal.h"
#include "io-util.h"
#include "rest-server.h"
#include "rest-util.h"
#include "time-util.h"

/* A body with a limit of its own (a bundle) takes longer to arrive than
 * timeout_secs allows a request: its deadline grows by a second for each
 * REST_UPLOAD_MIN_RATE bytes that arrive, so a client that keeps up this rate
 * is never cut, and a slower one still is. */
#define REST_UPLOAD_MIN_RATE (1024u * 1024u)

/* ---------------- routing ---------------- */

/* '%' matches one segment; the first two go to params[0] and params[1]. */
static bool route_match(const char *pattern, const char *url, char params[static 2][REST_PARAM_MAX],
                        unsigned *ret_n_params) {
        const char *p = pattern, *u = url;
        unsigned n_params = 0;

        *ret_n_params = 0;
        while (*p && *u) {
                if (*p == '%') {
                        size_t n = strcspn(u, "/");

                        if (n == 0 || n_params >= 2)
                                return false;
                        if (n >= REST_PARAM_MAX)
                                n = REST_PARAM_MAX - 1; /* too long: validation refuses it later */
                        memcpy(params[n_params], u, n);
                        params[n_params][n] = 0;
                        n_params++;
                        u += strcspn(u, "/");
                        p++;
                        continue;
                }
                if (*p != *u)
                        return false;
                p++, u++;
        }
        *ret_n_params = n_params;
        return *p == 0 && *u == 0;
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

static enum MHD_Result request_begin(RestRequest *req, const char *url, const char *method) {
        RestServer *s = req->server;
        const char *cl;
        size_t body_max;

        req->route_index = (int) rest_routes_count;
        req->method_index = rest_metrics_method_index(method);
        for (size_t i = 0; i < rest_routes_count; i++) {
                char params[2][REST_PARAM_MAX];
                unsigned n_params;

                if (route_match(rest_routes[i].pattern, url, params, &n_params)) {
                        req->route = &rest_routes[i];
                        req->route_index = (int) i;
                        req->has_param = n_params >= 1;
                        req->has_param2 = n_params >= 2;
                        memcpy(req->param, params[0], sizeof req->param);
                        memcpy(req->param2, params[1], sizeof req->param2);
                        break;
                }
        }

        if (req->conn)
                req->conn->deadline = now_usec() + s->timeout_secs * USEC_PER_SEC; /* now for the body */

        if (!check_auth(req)) {
                /* Podflare's body; the forkd documents give none. */
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

        body_max = req->method->body_fd_max ?: s->body_max;
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
        return rest_request_idem_begin(req, url, method) < 0 && !req->queued ? MHD_NO : MHD_YES;
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
                if (req->method && req->method->body_fd_max > 0) {
                        if (n > req->method->body_fd_max - req->body_len) {
                                req->body_fd = safe_close(req->body_fd);
                                req->too_large = true;
                                return MHD_YES;
                        }
                        if (rest_request_body_fd(req) < 0)
                                return MHD_NO;
                        if (pwrite_all(req->body_fd, upload_data, n, req->body_len) < 0)
                                return MHD_NO;
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
                return rest_body_append(&req->body, &req->body_len, &req->body_alloc, s->body_max, upload_data, n) < 0
                               ? MHD_NO
                               : MHD_YES;
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
                                     req->method->body_fd_max ?: s->body_max);
                return r < 0 ? MHD_NO : MHD_YES;
        }
        if (req->idem_key) {
                r = rest_request_idem_claim(req);
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

static void handle_completed(void *cls, struct MHD_Connection *connection, void **con_cls,
                             enum MHD_RequestTerminationCode toe) {
        RestServer *s = cls;
        RestRequest *req = *con_cls;

        if (!req)
                return;
        if (req->queued)
                rest_metrics_record(s, req);
        if (req->slot) {
                req->slot = sd_bus_slot_unref(req->slot); /* cancels the call */
                s->calls_in_flight--;
        }
        if (req->suspended)
                rest_request_suspended_unlink(req);
        rest_request_idem_drop(req);
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
        free(req->upgrade); /* an upgrade that did not happen */
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
                s->metrics.conns_total++;
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
                if (c->deadline > 0 && now > c->deadline && c->fd >= 0 && !c->upgraded) {
                        (void) shutdown(c->fd, SHUT_RDWR);
                        c->deadline = 0;
                        s->metrics.conns_cut++;
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
        unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_ALLOW_UPGRADE | MHD_USE_ERROR_LOG;
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
        s->metrics_per_sandbox = config->metrics_per_sandbox;
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
        r = rest_bus_ensure(s);
        if (r < 0)
                log_warning_errno(r, "Cannot connect to the bus yet, will retry per request: %m");
        else
                rest_bus_direct_query_start(s);

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
                /* Upgraded connections (terminals) are closed by their owners. */
                while (s->upgrades) {
                        RestUpgrade *u = s->upgrades;

                        u->on_stop(u->userdata);
                        if (s->upgrades == u)
                                rest_upgrade_close(u);
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
                                rest_request_suspended_unlink(req);
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
