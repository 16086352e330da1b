/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * GET /v1/sandboxes/:id/processes/:pid/tty: a process's terminal over a
 * WebSocket (RFC 6455, framing in rest-websocket.c). Before the upgrade the
 * request is checked (pid, Upgrade, Connection, Sec-WebSocket-Version 13,
 * Sec-WebSocket-Key: 400) and forkd opens the output stream
 * (OpenSandboxOutputStream: its errors are the HTTP answer). After it, the
 * socket is ours, on sd-event beside MHD's loop:
 *
 *   client binary message    -> WriteSandboxStdin, in chunks of 64 KiB, one
 *                               call at a time (Busy: retried)
 *   client text message      {"resize": [cols, rows]} -> ResizeSandboxPty
 *   ping                     -> pong; close -> close, and the end
 *   forkd's stream frames    -> binary messages of the output; its exit ->
 *                               close 1000 "exit_code N" or "signal N"
 *
 * Bounds: one client message (1 MiB at most) is held while it goes to stdin,
 * and the client's socket is not read meanwhile; one of forkd's frames is
 * held until the client took it, and forkd's stream is not read meanwhile.
 */

#include <fcntl.h>
#include <microhttpd.h>
#include <strings.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "forkd-bus.h"
#include "json-util.h"
#include "macro.h"
#include "proc-stream.h"
#include "rest-bus.h"
#include "rest-reply.h"
#include "rest-routes-common.h"
#include "rest-routes-processes.h"
#include "rest-util.h"
#include "rest-websocket.h"

#define TTY_STDIN_CHUNK (64u * 1024u)
#define TTY_READ_SIZE (16u * 1024u)
#define TTY_STREAM_IN (64u * 1024u)
#define TTY_BUSY_RETRY_USEC (50 * USEC_PER_MSEC)
#define TTY_JSON_DEPTH 4

typedef struct Tty {
        RestServer *server;
        bool slot;
        char id[REST_TAG_MAX + 1];
        uint32_t pid;
        char accept[WS_ACCEPT_SIZE];

        /* forkd */
        sd_bus *bus;
        char *destination;          /* forkd's name on the bus; NULL on its direct socket */
        sd_bus_slot *call;          /* one WriteSandboxStdin or ResizeSandboxPty at a time */
        sd_event_source *retry;

        /* the client */
        RestUpgrade *upgrade;
        sd_event *event;
        int sock;
        sd_event_source *sock_io;
        WsDecoder ws;
        uint8_t rbuf[TTY_READ_SIZE];
        size_t r_len, r_pos;
        const uint8_t *stdin_data;  /* a binary message going to stdin (in ws's buffer) */
        size_t stdin_len, stdin_pos, stdin_chunk;
        uint8_t *wbuf;              /* to the client */
        size_t w_len, w_pos, w_alloc;
        bool close_sent, finished;

        /* the output */
        int out_fd;
        sd_event_source *out_io;
        ProcStreamDecoder dec;
        bool dec_ready;
        uint8_t *in;
        size_t in_len, in_pos;
} Tty;

static void tty_free(Tty *t) {
        if (!t)
                return;
        t->call = sd_bus_slot_unref(t->call);
        sd_event_source_disable_unref(t->retry);
        sd_event_source_disable_unref(t->sock_io);
        sd_event_source_disable_unref(t->out_io);
        safe_close(t->out_fd);
        if (t->dec_ready)
                proc_stream_decoder_done(&t->dec);
        ws_decoder_done(&t->ws);
        free(t->in);
        free(t->wbuf);
        free(t->destination);
        sd_bus_unref(t->bus);
        sd_event_unref(t->event);
        if (t->upgrade)
                rest_upgrade_close(t->upgrade); /* MHD closes the socket */
        if (t->slot)
                rest_stream_slot_release(t->server);
        free(t);
}

static void tty_free_void(void *p) {
        tty_free(p);
}

static void tty_update(Tty *t);

static int wbuf_add(Tty *t, const void *a, size_t an, const void *b, size_t bn) {
        if (t->w_pos == t->w_len)
                t->w_pos = t->w_len = 0;
        if (t->w_len + an + bn > t->w_alloc) {
                size_t n = MAX(t->w_alloc * 2, t->w_len + an + bn);
                uint8_t *d = realloc(t->wbuf, n);

                if (!d)
                        return -ENOMEM;
                t->wbuf = d;
                t->w_alloc = n;
        }
        memcpy(t->wbuf + t->w_len, a, an);
        if (bn > 0)
                memcpy(t->wbuf + t->w_len + an, b, bn);
        t->w_len += an + bn;
        return 0;
}

static int send_message(Tty *t, uint8_t opcode, const void *data, size_t len) {
        uint8_t h[10];

        return wbuf_add(t, h, ws_frame_header(h, opcode, len), data, len);
}

/* The last frame: once it is written, the end. */
static void send_close(Tty *t, uint16_t code, const char *reason) {
        uint8_t c[2 + WS_CONTROL_MAX];

        if (t->close_sent)
                return;
        t->close_sent = true;
        if (wbuf_add(t, c, ws_close_frame(c, code, reason), NULL, 0) < 0)
                t->finished = true;
}

/* ---- to forkd ---- */

static int tty_call(Tty *t, const char *member, sd_bus_message_handler_t cb, sd_bus_message **ret) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        int r;

        r = sd_bus_message_new_method_call(t->bus, &m, t->destination, "/org/forkd/Manager", "org.forkd.Manager",
                                           member);
        if (r >= 0)
                r = sd_bus_message_append(m, "su", t->id, t->pid);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(m);
        return 0;
}

static void stdin_next(Tty *t);

static int on_retry(sd_event_source *es, uint64_t usec, void *userdata) {
        Tty *t = userdata;

        t->retry = sd_event_source_disable_unref(t->retry);
        stdin_next(t);
        tty_update(t);
        return 0;
}

/* The process ended while input was on its way: not the terminal's failure. Its
 * output stream brings the exit status, and the close that says it. */
static bool process_gone(const sd_bus_error *e) {
        return e && e->name && streq(e->name, FORKD_ERROR_NO_SUCH_PROCESS);
}

static int on_reply_write(sd_bus_message *reply, void *userdata, sd_bus_error *ret_error) {
        Tty *t = userdata;
        const sd_bus_error *e = sd_bus_message_get_error(reply);

        t->call = sd_bus_slot_unref(t->call);
        if (e && e->name && !strcmp(e->name, FORKD_ERROR_BUSY)) {
                /* stdin is full: the same chunk again, a little later */
                if (sd_event_add_time_relative(t->event, &t->retry, CLOCK_MONOTONIC, TTY_BUSY_RETRY_USEC, 0,
                                               on_retry, t) < 0)
                        send_close(t, WS_CLOSE_INTERNAL_ERROR, "cannot retry stdin");
        } else if (process_gone(e)) {
                t->stdin_data = NULL; /* nobody to read the rest */
        } else if (e) {
                send_close(t, WS_CLOSE_INTERNAL_ERROR, e->message ?: e->name);
        } else {
                t->stdin_pos += t->stdin_chunk;
                if (t->stdin_pos >= t->stdin_len)
                        t->stdin_data = NULL;
                else
                        stdin_next(t);
        }
        tty_update(t);
        return 0;
}

/* The next chunk of the message in flight to stdin. */
static void stdin_next(Tty *t) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        int r;

        t->stdin_chunk = MIN(t->stdin_len - t->stdin_pos, (size_t) TTY_STDIN_CHUNK);
        r = tty_call(t, "WriteSandboxStdin", on_reply_write, &m);
        if (r >= 0)
                r = sd_bus_message_append_array(m, 'y', t->stdin_data + t->stdin_pos, t->stdin_chunk);
        if (r >= 0)
                r = sd_bus_message_append(m, "b", 0);
        if (r >= 0)
                r = sd_bus_call_async(t->bus, &t->call, m, on_reply_write, t, REST_CALL_TIMEOUT_SHORT);
        if (r < 0) {
                t->stdin_data = NULL;
                send_close(t, WS_CLOSE_INTERNAL_ERROR, "cannot reach forkd");
        }
}

static int on_reply_resize(sd_bus_message *reply, void *userdata, sd_bus_error *ret_error) {
        Tty *t = userdata;
        const sd_bus_error *e = sd_bus_message_get_error(reply);

        t->call = sd_bus_slot_unref(t->call);
        if (e && !process_gone(e))
                send_close(t, WS_CLOSE_INTERNAL_ERROR, e->message ?: e->name);
        tty_update(t);
        return 0;
}

/* {"resize": [cols, rows]}, each 1..1000. */
static void on_text(Tty *t, const uint8_t *data, size_t len) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct json_object *a, *c, *rw;
        int64_t cols, rows;
        int r;

        if (json_parse_strict((const char *) data, len, len, TTY_JSON_DEPTH, &o, NULL) < 0 ||
            !json_object_object_get_ex(o, "resize", &a) || !json_object_is_type(a, json_type_array) ||
            json_object_array_length(a) != 2 || !(c = json_object_array_get_idx(a, 0)) ||
            !(rw = json_object_array_get_idx(a, 1)) || !json_object_is_type(c, json_type_int) ||
            !json_object_is_type(rw, json_type_int)) {
                send_close(t, WS_CLOSE_INVALID_DATA, "expected {\"resize\": [cols, rows]}");
                return;
        }
        cols = json_object_get_int64(c);
        rows = json_object_get_int64(rw);
        if (cols < 1 || cols > 1000 || rows < 1 || rows > 1000) {
                send_close(t, WS_CLOSE_INVALID_DATA, "cols and rows must be between 1 and 1000");
                return;
        }
        r = tty_call(t, "ResizeSandboxPty", on_reply_resize, &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "qq", (uint16_t) cols, (uint16_t) rows);
        if (r >= 0)
                r = sd_bus_call_async(t->bus, &t->call, m, on_reply_resize, t, REST_CALL_TIMEOUT_SHORT);
        if (r < 0)
                send_close(t, WS_CLOSE_INTERNAL_ERROR, "cannot reach forkd");
}

/* ---- from the client ---- */

/* Feed what was read until a message needs forkd (then wait for it). */
static void client_feed(Tty *t) {
        while (!t->close_sent && !t->call && !t->retry && !t->stdin_data && t->r_pos < t->r_len) {
                WsMessage msg;
                size_t used = 0;
                int r;

                r = ws_decoder_feed(&t->ws, t->rbuf + t->r_pos, t->r_len - t->r_pos, &used, &msg);
                t->r_pos += used;
                if (r < 0) {
                        send_close(t, ws_close_code_for_error(r), "invalid frame");
                        return;
                }
                if (r == 0)
                        continue;
                switch (msg.opcode) {
                case WS_OP_BINARY:
                        if (msg.len > 0) {
                                t->stdin_data = msg.data;
                                t->stdin_len = msg.len;
                                t->stdin_pos = 0;
                                stdin_next(t);
                        }
                        break;
                case WS_OP_TEXT:
                        on_text(t, msg.data, msg.len);
                        break;
                case WS_OP_PING:
                        if (send_message(t, WS_OP_PONG, msg.data, msg.len) < 0)
                                send_close(t, WS_CLOSE_INTERNAL_ERROR, "out of memory");
                        break;
                case WS_OP_CLOSE: {
                        /* echo its code (one a peer may send); the end once it is written */
                        uint16_t code = msg.len >= 2 ? (uint16_t) (msg.data[0] << 8 | msg.data[1]) : WS_CLOSE_NORMAL;

                        if (code < 1000 || code > 4999 || code == 1004 || code == 1005 || code == 1006 ||
                            code == 1015)
                                code = WS_CLOSE_PROTOCOL_ERROR;
                        send_close(t, code, NULL);
                        break;
                }
                default: /* pong */
                        break;
                }
        }
}

static bool client_wants_read(Tty *t) {
        return !t->close_sent && !t->call && !t->retry && !t->stdin_data && t->r_pos == t->r_len &&
               t->w_len - t->w_pos < TTY_STDIN_CHUNK;
}

/* ---- the output ---- */

/* forkd's frames into messages, while nothing waits for the client. */
static void output_pump(Tty *t) {
        while (!t->close_sent && t->w_pos == t->w_len) {
                ProcStreamFrame f;
                size_t used = 0;
                ssize_t n;
                int r;

                if (t->in_pos == t->in_len) {
                        n = read(t->out_fd, t->in, TTY_STREAM_IN);
                        if (n < 0 && (errno == EAGAIN || errno == EINTR))
                                return;
                        if (n <= 0) {
                                send_close(t, WS_CLOSE_GOING_AWAY, "the output stream ended");
                                return;
                        }
                        t->in_pos = 0;
                        t->in_len = (size_t) n;
                }
                r = proc_stream_decoder_feed(&t->dec, t->in + t->in_pos, t->in_len - t->in_pos, &used, &f);
                t->in_pos += used;
                if (r < 0) {
                        send_close(t, WS_CLOSE_INTERNAL_ERROR, "invalid output stream");
                        return;
                }
                if (r == 0)
                        continue;
                if ((f.kind == PROC_STREAM_STDOUT || f.kind == PROC_STREAM_STDERR) && f.len > 0) {
                        if (send_message(t, WS_OP_BINARY, f.data, f.len) < 0)
                                send_close(t, WS_CLOSE_INTERNAL_ERROR, "out of memory");
                } else if (f.kind == PROC_STREAM_EXIT) {
                        char reason[32];

                        if (f.signal > 0)
                                (void) snprintf(reason, sizeof reason, "signal %d", f.signal);
                        else
                                (void) snprintf(reason, sizeof reason, "exit_code %d", f.exit_code);
                        send_close(t, WS_CLOSE_NORMAL, reason);
                }
                /* a gap: the terminal goes on with what follows */
        }
}

/* ---- the loop ---- */

static int on_sock(sd_event_source *es, int fd, uint32_t revents, void *userdata);
static int on_output(sd_event_source *es, int fd, uint32_t revents, void *userdata);

/* After every event: write what waits, read what may be read, and arm the
 * sources for the rest; the end once the close frame is out. */
static void tty_update(Tty *t) {
        uint32_t events = 0;

        for (unsigned round = 0; round < 4 && !t->finished; round++) {
                while (t->w_pos < t->w_len) {
                        ssize_t n = send(t->sock, t->wbuf + t->w_pos, t->w_len - t->w_pos, MSG_NOSIGNAL | MSG_DONTWAIT);

                        if (n < 0 && errno == EINTR)
                                continue;
                        if (n < 0 && errno == EAGAIN)
                                break;
                        if (n <= 0) {
                                t->finished = true;
                                break;
                        }
                        t->w_pos += (size_t) n;
                }
                if (t->finished || (t->close_sent && t->w_pos == t->w_len)) {
                        t->finished = true;
                        break;
                }
                client_feed(t);
                output_pump(t);
                if (t->w_pos == t->w_len && !t->close_sent && !client_wants_read(t))
                        break;
                if (t->w_pos < t->w_len && round > 0)
                        break;
        }
        if (t->finished) {
                tty_free(t);
                return;
        }
        if (client_wants_read(t))
                events |= EPOLLIN;
        if (t->w_pos < t->w_len)
                events |= EPOLLOUT;
        if (events == 0)
                (void) sd_event_source_set_enabled(t->sock_io, SD_EVENT_OFF);
        else {
                (void) sd_event_source_set_io_events(t->sock_io, events);
                (void) sd_event_source_set_enabled(t->sock_io, SD_EVENT_ON);
        }
        (void) sd_event_source_set_enabled(t->out_io, !t->close_sent && t->w_pos == t->w_len ? SD_EVENT_ON
                                                                                              : SD_EVENT_OFF);
}

static int on_sock(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        Tty *t = userdata;

        if ((revents & (EPOLLIN | EPOLLHUP | EPOLLERR)) && client_wants_read(t)) {
                ssize_t n = recv(t->sock, t->rbuf, sizeof t->rbuf, MSG_DONTWAIT);

                if (n < 0 && (errno == EAGAIN || errno == EINTR))
                        n = -1;
                else if (n <= 0) {
                        t->finished = true; /* the client went */
                        n = -1;
                }
                if (n > 0) {
                        t->r_pos = 0;
                        t->r_len = (size_t) n;
                }
        }
        tty_update(t);
        return 0;
}

static int on_output(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        tty_update(userdata);
        return 0;
}

static void tty_on_upgrade(RestUpgrade *u, int fd, const char *extra, size_t extra_len, void *userdata) {
        Tty *t = userdata;
        int r;

        t->upgrade = u;
        t->sock = fd;
        r = fcntl(fd, F_GETFL);
        if (r >= 0)
                (void) fcntl(fd, F_SETFL, r | O_NONBLOCK);
        r = sd_event_add_io(t->event, &t->sock_io, fd, EPOLLIN, on_sock, t);
        if (r >= 0)
                r = sd_event_add_io(t->event, &t->out_io, t->out_fd, EPOLLIN, on_output, t);
        if (r < 0) {
                tty_free(t);
                return;
        }
        if (extra_len > 0) {
                /* a client that did not wait for the 101 */
                if (extra_len > sizeof t->rbuf) {
                        send_close(t, WS_CLOSE_TOO_BIG, NULL);
                } else {
                        memcpy(t->rbuf, extra, extra_len);
                        t->r_pos = 0;
                        t->r_len = extra_len;
                }
        }
        tty_update(t);
}

static void tty_on_stop(void *userdata) {
        tty_free(userdata);
}

/* ---- the request ---- */

/* Shared with the output route (rest-routes-processes.h). */
int rest_proc_take_stream(RestRequest *req, sd_bus_message *reply, int *ret_fd) {
        const sd_bus_error *e = sd_bus_message_get_error(reply);
        int fd, r;

        if (e)
                return MIN(rest_proc_reply_bus_error(req, e), 0);
        r = sd_bus_message_read(reply, "h", &fd);
        if (r < 0)
                return MIN(rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r)), 0);
        *ret_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (*ret_fd < 0)
                return MIN(rest_reply_error(req, 500, "cannot take the output stream: %s", strerror(errno)), 0);
        r = fcntl(*ret_fd, F_GETFL);
        if (r < 0 || fcntl(*ret_fd, F_SETFL, r | O_NONBLOCK) < 0)
                return MIN(rest_reply_error(req, 500, "cannot take the output stream: %s", strerror(errno)), 0);
        return 1;
}

static int on_reply_tty_stream(RestRequest *req, sd_bus_message *reply) {
        Tty *t = rest_request_data(req);
        const char *sender;
        int r;

        r = rest_proc_take_stream(req, reply, &t->out_fd);
        if (r <= 0)
                return r;
        t->in = malloc(TTY_STREAM_IN);
        if (!t->in || proc_stream_decoder_init(&t->dec) < 0)
                return rest_reply_error(req, 500, "out of memory");
        t->dec_ready = true;
        /* The calls after the upgrade go where this one went. */
        t->bus = sd_bus_ref(sd_bus_message_get_bus(reply));
        t->event = sd_event_ref(sd_bus_get_event(t->bus));
        sender = sd_bus_message_get_sender(reply);
        if (sender && !(t->destination = strdup(sender)))
                return rest_reply_error(req, 500, "out of memory");
        r = rest_reply_upgrade(req, "websocket", t->accept, tty_on_upgrade, tty_on_stop);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot upgrade: %s", strerror(-r));
        return 0;
}

/* Does the comma-separated header value hold token (case-insensitively)? */
static bool header_has_token(const char *v, const char *token) {
        size_t n = strlen(token);

        while (v && *v) {
                size_t k;

                v += strspn(v, " \t,");
                k = strcspn(v, ",");
                while (k > 0 && (v[k - 1] == ' ' || v[k - 1] == '\t'))
                        k--;
                if (k == n && strncasecmp(v, token, n) == 0)
                        return true;
                v += strcspn(v, ",");
        }
        return false;
}

int rest_route_process_tty(RestRequest *req) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        const char *id, *key, *version;
        uint64_t offset;
        uint32_t pid;
        Tty *t;
        int r;

        r = rest_proc_path(req, &id, &pid);
        if (r <= 0)
                return r;
        r = rest_proc_query_offset(req, &offset);
        if (r <= 0)
                return r;
        if (!header_has_token(rest_request_header(req, "Upgrade"), "websocket") ||
            !header_has_token(rest_request_header(req, "Connection"), "upgrade"))
                return rest_reply_error(req, 400, "a WebSocket upgrade is required (Upgrade: websocket)");
        version = rest_request_header(req, "Sec-WebSocket-Version");
        if (!version || strcmp(version, "13") != 0)
                return rest_reply_error(req, 400, "Sec-WebSocket-Version must be 13");
        key = rest_request_header(req, "Sec-WebSocket-Key");
        if (!ws_key_is_valid(key))
                return rest_reply_error(req, 400, "invalid Sec-WebSocket-Key");

        t = calloc(1, sizeof *t);
        if (!t)
                return rest_reply_error(req, 500, "out of memory");
        t->server = rest_request_server(req);
        t->out_fd = -EBADF;
        t->sock = -EBADF;
        t->pid = pid;
        (void) snprintf(t->id, sizeof t->id, "%s", id);
        ws_decoder_init(&t->ws);
        if (ws_accept_for_key(key, t->accept) < 0) {
                tty_free(t);
                return rest_reply_error(req, 500, "cannot compute Sec-WebSocket-Accept");
        }
        if (!rest_stream_slot_take(t->server)) {
                tty_free(t);
                return rest_reply_error(req, 503, "too many streams");
        }
        t->slot = true;
        rest_request_set_data(req, t, tty_free_void);

        r = rest_new_manager_call(req, "OpenSandboxOutputStream", &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "sut", id, pid, offset);
        if (r >= 0)
                r = rest_call_detached(req, m, REST_CALL_TIMEOUT_SHORT, on_reply_tty_stream);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        rest_request_wait(req);
        return 0;
}
