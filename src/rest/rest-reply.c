/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* forkd-rest's answers: JSON and error bodies, files and streams, each
 * passing the Idempotency-Key glue (rest-idem-glue.c) before it goes to MHD,
 * and D-Bus errors as HTTP statuses (rest_status_from_bus_error()). */

#include <assert.h>
#include <stdarg.h>

#include "forkd-bus.h"
#include "json-util.h"
#include "macro.h"
#include "rest-idem-glue.h"
#include "rest-reply.h"
#include "rest-server-internal.h"
#include "rest-util.h"

/* ---------------- responses ---------------- */

int rest_queue_response(RestRequest *req, unsigned status, struct MHD_Response *resp) {
        if (req->suspended) {
                /* We are in a D-Bus reply callback: park the response and
                 * let MHD call the access handler again. */
                req->pending = resp;
                req->pending_status = status;
                req->suspended = false;
                rest_request_suspended_unlink(req);
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

int rest_reply_raw(RestRequest *req, unsigned status, const char *content_type, const char *body, size_t len) {
        struct MHD_Response *resp;

        rest_request_idem_settle(req, status, content_type, body, len);
        resp = MHD_create_response_from_buffer(len, (void *) body, MHD_RESPMEM_MUST_COPY);
        if (!resp)
                return -ENOMEM;
        if (content_type)
                (void) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        if (status == 401)
                (void) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
        if (status == 405 && req->route && req->route->allow)
                (void) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, req->route->allow);
        return rest_queue_response(req, status, resp);
}

int rest_reply_fd(RestRequest *req, unsigned status, const char *content_type, int fd, uint64_t size) {
        struct MHD_Response *resp;

        rest_request_idem_settle(req, status, content_type, NULL, (size_t) MIN(size, (uint64_t) SIZE_MAX));
        resp = MHD_create_response_from_fd_at_offset64(size, fd, 0);
        if (!resp) {
                safe_close(fd);
                return -ENOMEM;
        }
        if (content_type)
                (void) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        return rest_queue_response(req, status, resp);
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

int rest_reply_stream(RestRequest *req, unsigned status, const char *content_type, const char *header,
                      const char *value, rest_stream_read_func read) {
        RestServer *s = req->server;
        struct MHD_Response *resp;
        int r;

        rest_request_idem_settle(req, status, content_type, NULL, 0);
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_reader, req, NULL);
        if (!resp)
                return -ENOMEM;
        if (content_type)
                (void) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        if (header && MHD_add_response_header(resp, header, value) != MHD_YES) {
                MHD_destroy_response(resp);
                return -ENOMEM;
        }
        req->stream_read = read;
        r = rest_queue_response(req, status, resp);
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

bool rest_stream_slot_take(RestServer *s) {
        if (s->streams_open >= REST_STREAMS_MAX)
                return false;
        s->streams_open++;
        return true;
}

void rest_stream_slot_release(RestServer *s) {
        assert(s->streams_open > 0);
        s->streams_open--;
}

static void upgrade_handler(void *cls, struct MHD_Connection *connection, void *con_cls, const char *extra_in,
                            size_t extra_in_size, MHD_socket sock, struct MHD_UpgradeResponseHandle *urh) {
        RestRequest *req = con_cls;
        RestUpgrade *u = req->upgrade;
        RestServer *s = req->server;

        /* The request is done with: its data goes to the new protocol. */
        if (req->conn)
                req->conn->upgraded = true;
        req->upgrade = NULL;
        u->urh = urh;
        u->userdata = req->data;
        req->data = NULL;
        req->free_data = NULL;
        u->next = s->upgrades;
        if (s->upgrades)
                s->upgrades->prev = u;
        s->upgrades = u;
        u->on_upgrade(u, sock, extra_in, extra_in_size, u->userdata);
}

int rest_reply_upgrade(RestRequest *req, const char *protocol, const char *accept, rest_upgrade_func on_upgrade,
                       rest_upgrade_stop_func on_stop) {
        struct MHD_Response *resp;
        RestUpgrade *u;
        int r;

        u = calloc(1, sizeof *u);
        if (!u)
                return -ENOMEM;
        *u = (RestUpgrade) { .server = req->server, .on_upgrade = on_upgrade, .on_stop = on_stop };
        resp = MHD_create_response_for_upgrade(upgrade_handler, NULL);
        if (!resp) {
                free(u);
                return -ENOMEM;
        }
        if (MHD_add_response_header(resp, MHD_HTTP_HEADER_UPGRADE, protocol) != MHD_YES ||
            (accept && MHD_add_response_header(resp, "Sec-WebSocket-Accept", accept) != MHD_YES)) {
                MHD_destroy_response(resp);
                free(u);
                return -ENOMEM;
        }
        free(req->upgrade);
        req->upgrade = u;
        r = rest_queue_response(req, MHD_HTTP_SWITCHING_PROTOCOLS, resp);
        if (r < 0) {
                free(req->upgrade);
                req->upgrade = NULL;
        }
        return r;
}

void rest_upgrade_close(RestUpgrade *u) {
        RestServer *s;

        if (!u)
                return;
        s = u->server;
        if (u->prev)
                u->prev->next = u->next;
        else if (s->upgrades == u)
                s->upgrades = u->next;
        if (u->next)
                u->next->prev = u->prev;
        (void) MHD_upgrade_action(u->urh, MHD_UPGRADE_ACTION_CLOSE);
        /* MHD closes it on its next run. */
        if (!s->stopping)
                (void) sd_event_source_set_enabled(s->resume_source, SD_EVENT_ONESHOT);
        free(u);
}
