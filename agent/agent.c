/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <poll.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <termios.h>

#include "agent-init.h"
#include "agent-proc.h"
#include "agent-python.h"
#include "agent-tcp.h"
#include "agent.h"
#include "json-util.h"
#include "macro.h"

#define READ_CHUNK (64u * 1024u)
#define TTY_REOPEN_USEC (100u * 1000u)
#define POLL_MAX (3u + 2u * AGENT_EXEC_MAX_IN_FLIGHT + AGENT_PROC_POLL_MAX + 1u + AGENT_TCP_MAX_CONNECTIONS)

/* ---- output queue ---- */

static size_t outq_size(const OutQueue *q) {
        return q->end - q->start;
}

static int outq_append(OutQueue *q, const void *data, size_t n) {
        if (q->start > 0 && (q->start >= q->cap / 2 || q->cap - q->end < n)) {
                memmove(q->buf, q->buf + q->start, q->end - q->start);
                q->end -= q->start;
                q->start = 0;
        }
        if (q->cap - q->end < n) {
                size_t want = MAX(q->cap * 2, q->end + n);
                uint8_t *b;

                want = MAX(want, (size_t) 4096);
                b = realloc(q->buf, want);
                if (!b)
                        return -ENOMEM;
                q->buf = b;
                q->cap = want;
        }
        memcpy(q->buf + q->end, data, n);
        q->end += n;
        return 0;
}

static void outq_clear(OutQueue *q) {
        q->start = q->end = 0;
        if (q->cap > 1024 * 1024) { /* give back what a burst took */
                free(q->buf);
                q->buf = NULL;
                q->cap = 0;
        }
}

/* ---- frames out ---- */

static int agent_send_raw(Agent *a, uint16_t type, uint32_t id, const char *json, size_t len) {
        uint8_t hdr[FKA_HDR_SIZE];
        int r;

        if (len > AGENT_MAX_PAYLOAD)
                return -EMSGSIZE;
        fka_encode_header(hdr, type, id, (uint32_t) len);
        r = outq_append(&a->out, hdr, sizeof hdr);
        if (r < 0)
                return r;
        r = outq_append(&a->out, json, len);
        if (r < 0) {
                a->out.end -= sizeof hdr; /* never leave half a frame queued */
                return r;
        }
        return 0;
}

static int agent_send_errorv(Agent *a, uint32_t id, int err, const char *fmt, va_list ap) {
        _cleanup_json_ struct json_object *o = NULL;
        _cleanup_free_ char *msg = NULL;
        const char *s, *name;
        size_t len;

        if (vasprintf(&msg, fmt, ap) < 0) {
                msg = NULL;
                return -ENOMEM;
        }
        o = json_object_new_object();
        if (!o || json_object_object_add(o, "error", json_string_sanitized(msg, strlen(msg))) < 0)
                return -ENOMEM;
        name = err > 0 ? strerrorname_np(err) : NULL;
        if (name && json_object_object_add(o, "errno", json_object_new_string(name)) < 0)
                return -ENOMEM;
        if (a->reply_tcp)
                return agent_tcp_reply(a, a->reply_tcp, FKA_ERROR, o);
        s = json_plain(o, &len);
        if (!s)
                return -ENOMEM;
        if (len > AGENT_MAX_PAYLOAD)
                return -EMSGSIZE;
        return agent_send_raw(a, FKA_ERROR, id, s, len);
}

int agent_send_error(Agent *a, uint32_t id, const char *fmt, ...) {
        va_list ap;
        int r;

        va_start(ap, fmt);
        r = agent_send_errorv(a, id, 0, fmt, ap);
        va_end(ap);
        return r;
}

int agent_send_error_errno(Agent *a, uint32_t id, int err, const char *fmt, ...) {
        va_list ap;
        int r;

        va_start(ap, fmt);
        r = agent_send_errorv(a, id, err, fmt, ap);
        va_end(ap);
        return r;
}

int agent_send_json(Agent *a, uint16_t type, uint32_t id, struct json_object *payload) {
        _cleanup_json_ struct json_object *o = payload;
        const char *s;
        size_t len;
        int r;

        if (!o)
                return agent_send_error(a, id, "out of memory");
        s = json_plain(o, &len);
        if (!s)
                return agent_send_error(a, id, "out of memory");
        if (len > AGENT_MAX_PAYLOAD)
                return agent_send_error(a, id, "reply too large (%zu bytes)", len);
        if (a->reply_tcp)
                return agent_tcp_reply(a, a->reply_tcp, type, o);
        r = agent_send_raw(a, type, id, s, len);
        if (r < 0)
                log_error_errno(r, "Failed to queue the reply to request %" PRIu32 ": %m", id);
        return r;
}

/* ---- requests ---- */

static int dispatch_ignore(struct json_object *v, void *field, const char **ret_error) {
        return 0;
}

static const struct json_dispatch no_arguments[] = {
        { "op", JSON_KIND_STRING, dispatch_ignore, 0, 0, JSON_MANDATORY },
        {}
};

static int check_no_arguments(Agent *a, uint32_t id, struct json_object *req) {
        const char *field = NULL, *err = NULL;
        int r;

        r = json_dispatch_full(req, no_arguments, JSON_REJECT_UNKNOWN, NULL, &field, &err);
        if (r < 0) {
                (void) agent_send_error(a, id, "bad argument '%s': %s", field ?: "?", err ?: strerror(-r));
                return 0;
        }
        return 1;
}

static int op_ping(Agent *a, uint32_t id, struct json_object *req) {
        struct json_object *o;
        const char *np;

        if (check_no_arguments(a, id, req) <= 0)
                return 0;

        np = agent_python_numpy_version();
        o = json_object_new_object();
        if (!o)
                return -ENOMEM;
        json_object_object_add(o, "pong", json_object_new_boolean(1));
        json_object_object_add(o, "numpy_version", np ? json_object_new_string(np) : NULL);
        json_object_object_add(o, "pid", json_object_new_int64(getpid()));
        json_object_object_add(o, "agent", json_object_new_string(AGENT_NAME));
        json_object_object_add(o, "version", json_object_new_string(AGENT_VERSION));
        json_object_object_add(o, "python", json_object_new_boolean(agent_python_ready()));
        agent_python_describe(o);
        return agent_send_json(a, FKA_RESPONSE, id, o);
}

static int op_identity(Agent *a, uint32_t id, struct json_object *req) {
        if (check_no_arguments(a, id, req) <= 0)
                return 0;
        return agent_op_identity(a, id);
}

static int op_shutdown(Agent *a, uint32_t id, struct json_object *req) {
        struct json_object *o;
        int r;

        if (check_no_arguments(a, id, req) <= 0)
                return 0;
        o = json_object_new_object();
        if (!o)
                return -ENOMEM;
        json_object_object_add(o, "ok", json_object_new_boolean(1));
        r = agent_send_json(a, FKA_RESPONSE, id, o);
        if (r < 0)
                return r;

        log_info("Shutdown requested.");
        (void) agent_flush(a, true, 2 * 1000 * 1000);
        agent_exec_kill_all(a);
        agent_proc_kill_all(a);
        if (a->config.pid1)
                agent_poweroff(true); /* does not return */
        a->quit = true;
        return 0;
}

typedef int (*op_handler)(Agent *a, uint32_t id, struct json_object *req);

static const struct {
        const char *name;
        op_handler handler;
} ops[] = {
        { "ping", op_ping },
        { "identity", op_identity },
        { "exec", agent_exec_start },
        { "eval", agent_op_eval },
        { "run_code", agent_op_run_code },
        { "hash_files", agent_op_hash_files },
        { "write_file", agent_op_write_file },
        { "read_file", agent_op_read_file },
        { "shutdown", op_shutdown },
        { "mount_volumes", agent_op_mount_volumes },
        { "proc_start", agent_op_proc_start },
        { "proc_list", agent_op_proc_list },
        { "proc_signal", agent_op_proc_signal },
        { "proc_stdin", agent_op_proc_stdin },
        { "proc_resize", agent_op_proc_resize },
        { "proc_read", agent_op_proc_read },
};

static void handle_request(Agent *a, uint32_t id, const char *payload, size_t len) {
        _cleanup_json_ struct json_object *req = NULL;
        const char *err = NULL;
        int r;

        if (id == 0) {
                (void) agent_send_error(a, 0, "request id 0");
                return;
        }

        r = json_parse_strict(payload, len, AGENT_MAX_PAYLOAD, FKA_JSON_MAX_DEPTH, &req, &err);
        if (r < 0) {
                (void) agent_send_error(a, id, "payload is not a JSON object: %s", err ?: strerror(-r));
                return;
        }
        agent_dispatch_op(a, id, req);
}

void agent_dispatch_op(Agent *a, uint32_t id, struct json_object *req) {
        struct json_object *opv;
        const char *op;
        int r;

        if (!json_object_object_get_ex(req, "op", &opv) || !json_object_is_type(opv, json_type_string)) {
                (void) agent_send_error(a, id, "missing or non-string op");
                return;
        }
        op = json_object_get_string(opv);

        for (size_t i = 0; i < ELEMENTSOF(ops); i++) {
                if (!streq(op, ops[i].name))
                        continue;
                r = ops[i].handler(a, id, req);
                if (r < 0)
                        (void) agent_send_error(a, id, "%s failed: %s", ops[i].name, strerror(-r));
                return;
        }
        (void) agent_send_error(a, id, "unknown op");
}

static void handle_event(Agent *a, const char *payload, size_t len) {
        _cleanup_json_ struct json_object *ev = NULL;
        struct json_object *opv;
        const char *err = NULL;
        int r;

        /* Events are not answered: a bad one is logged and dropped. */
        r = json_parse_strict(payload, len, AGENT_MAX_PAYLOAD, FKA_JSON_MAX_DEPTH, &ev, &err);
        if (r < 0) {
                log_warning_errno(r, "Ignoring an event that is not a JSON object: %s", err ?: "?");
                return;
        }
        if (!json_object_object_get_ex(ev, "op", &opv) || !json_object_is_type(opv, json_type_string) ||
            !streq(json_object_get_string(opv), "identity")) {
                log_warning("Ignoring an event with an unknown op.");
                return;
        }
        r = agent_identity_event(a, ev);
        if (r < 0)
                log_warning_errno(r, "Ignoring a malformed identity event: %m");
}

/* Feed bytes; stop early (returning how much was consumed) when the output
 * queue is above its high-water mark, unless all is true. */
static size_t agent_feed_some(Agent *a, const void *data, size_t size, bool all) {
        const void *p = data;
        size_t n = size;

        while (n > 0 && (all || outq_size(&a->out) < AGENT_OUTQ_HIGH)) {
                fka_frame f = {};
                int r;

                r = fka_decoder_feed(a->decoder, &p, &n, &f);
                if (r == 0)
                        break;
                if (r == -EMSGSIZE) {
                        (void) agent_send_error_errno(a, f.id, EMSGSIZE,
                                                      "payload too large (%" PRIu32 " bytes, limit %u)", f.len,
                                                      AGENT_MAX_PAYLOAD);
                        continue;
                }
                if (r == -EBADMSG) {
                        (void) agent_send_error(a, 0, "bad frame header");
                        continue;
                }
                if (r < 0) {
                        log_warning_errno(r, "Dropped a frame: %m");
                        continue;
                }

                if (f.type == FKA_REQUEST)
                        handle_request(a, f.id, f.payload, f.len);
                else if (f.type == FKA_EVENT)
                        handle_event(a, f.payload, f.len);
                /* responses and errors from the host are not expected: dropped */
                fka_frame_done(&f);
        }
        return size - n;
}

void agent_feed(Agent *a, const void *data, size_t size) {
        (void) agent_feed_some(a, data, size, true);
}

/* ---- the channel ---- */

static int agent_reset_decoder(Agent *a) {
        fka_decoder *d;
        int r;

        r = fka_decoder_new(AGENT_MAX_PAYLOAD, &d);
        if (r < 0)
                return r;
        fka_decoder_free(a->decoder);
        a->decoder = d;
        return 0;
}

static void agent_connected(Agent *a, int fd) {
        a->fd = fd;
        a->conn_gen++;
        a->in_start = a->in_end = 0;
        outq_clear(&a->out);
        if (agent_reset_decoder(a) < 0)
                log_oom();
}

static void agent_disconnect(Agent *a) {
        a->fd = safe_close(a->fd);
        a->in_start = a->in_end = 0;
        outq_clear(&a->out);
}

static int agent_send_ready(Agent *a) {
        struct json_object *o = json_object_new_object();

        if (!o)
                return -ENOMEM;
        json_object_object_add(o, "op", json_object_new_string("ready"));
        json_object_object_add(o, "agent", json_object_new_string(AGENT_NAME));
        json_object_object_add(o, "version", json_object_new_string(AGENT_VERSION));
        return agent_send_json(a, FKA_EVENT, 0, o);
}

static int open_tty(Agent *a) {
        _cleanup_close_ int fd = -EBADF;
        struct termios t;

        fd = open(a->path, O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0)
                return -errno;
        if (isatty(fd)) {
                if (tcgetattr(fd, &t) < 0)
                        return -errno;
                cfmakeraw(&t);
                t.c_cc[VMIN] = 1;
                t.c_cc[VTIME] = 0;
                if (tcsetattr(fd, TCSANOW, &t) < 0)
                        return -errno;
                (void) tcflush(fd, TCIOFLUSH);
        }
        agent_connected(a, TAKE_FD(fd));
        a->reopen_usec = 0;
        /* The tty dropped whatever the host sent before this open (and the flush
         * above drops the rest): say that we listen now, so that the host sends
         * its request again (docs/agent-protocol.md, "ready"). */
        if (agent_send_ready(a) < 0)
                log_oom();
        return 0;
}

static int listen_unix(Agent *a) {
        _cleanup_close_ int fd = -EBADF;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        size_t l = strlen(a->path);

        if (l == 0 || l >= sizeof sa.sun_path)
                return -EINVAL;
        memcpy(sa.sun_path, a->path, l);

        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        (void) unlink(a->path);
        if (bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0)
                return -errno;
        if (listen(fd, 4) < 0)
                return -errno;
        a->listen_fd = TAKE_FD(fd);
        return 0;
}

int agent_open_channel(Agent *a) {
        int r, fl;

        switch (a->kind) {
        case CHANNEL_TTY:
                r = open_tty(a);
                if (r < 0) {
                        log_warning_errno(r, "Failed to open %s, retrying: %m", a->path);
                        a->reopen_usec = now_usec() + TTY_REOPEN_USEC;
                }
                return 0;
        case CHANNEL_UNIX:
                r = listen_unix(a);
                if (r < 0)
                        return log_error_errno(r, "Failed to listen on %s: %m", a->path);
                return 0;
        case CHANNEL_FD:
                fl = fcntl(a->fd, F_GETFL);
                if (fl < 0)
                        return log_error_errno(errno, "Channel fd %d: %m", a->fd);
                if (fcntl(a->fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(a->fd, F_SETFD, FD_CLOEXEC) < 0)
                        return log_error_errno(errno, "Channel fd %d: %m", a->fd);
                agent_connected(a, a->fd);
                return 0;
        }
        return -EINVAL;
}

static void agent_channel_eof(Agent *a) {
        switch (a->kind) {
        case CHANNEL_FD:
                agent_disconnect(a);
                if (!a->config.pid1)
                        a->quit = true;
                else
                        log_error("Channel closed; nothing left to serve.");
                break;
        case CHANNEL_UNIX:
                agent_disconnect(a);
                break;
        case CHANNEL_TTY:
                agent_disconnect(a);
                a->reopen_usec = now_usec() + TTY_REOPEN_USEC;
                break;
        }
}

int agent_flush(Agent *a, bool block, uint64_t timeout_usec) {
        uint64_t deadline = now_usec() + timeout_usec;

        while (a->fd >= 0 && outq_size(&a->out) > 0) {
                ssize_t k = write(a->fd, a->out.buf + a->out.start, outq_size(&a->out));

                if (k > 0) {
                        a->out.start += (size_t) k;
                        continue;
                }
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0 && errno == EAGAIN) {
                        struct pollfd p = { .fd = a->fd, .events = POLLOUT };
                        uint64_t now = now_usec();

                        if (!block || now >= deadline)
                                return 0;
                        (void) poll(&p, 1, (int) MIN((deadline - now) / 1000 + 1, (uint64_t) 1000));
                        continue;
                }
                log_warning_errno(k < 0 ? errno : EIO, "Failed to write to the channel: %m");
                agent_channel_eof(a);
                return -EIO;
        }
        if (outq_size(&a->out) == 0)
                a->out.start = a->out.end = 0;
        return 0;
}

static void agent_read(Agent *a) {
        ssize_t k;

        if (a->in_start < a->in_end)
                return; /* still processing what came before */

        k = read(a->fd, a->in, sizeof a->in);
        if (k > 0) {
                a->in_start = 0;
                a->in_end = (size_t) k;
                return;
        }
        if (k < 0 && (errno == EAGAIN || errno == EINTR))
                return;
        if (k < 0)
                log_debug_errno(errno, "Channel read failed: %m");
        agent_channel_eof(a);
}

static void agent_accept(Agent *a) {
        int fd;

        fd = accept4(a->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
                if (errno != EAGAIN && errno != EINTR)
                        log_warning_errno(errno, "accept() failed: %m");
                return;
        }
        if (a->fd >= 0) {
                /* one client at a time: the newer one replaces the older */
                log_info("New connection on %s replaces the previous one.", a->path);
                agent_disconnect(a);
        }
        agent_connected(a, fd);
}

static void drain_pipe(int fd) {
        char buf[256];

        while (read(fd, buf, sizeof buf) > 0)
                ;
}

int agent_run(Agent *a) {
        while (!a->quit) {
                struct pollfd fds[POLL_MAX];
                ExecJob *owners[POLL_MAX];
                size_t n = 0, chan = SIZE_MAX, lst = SIZE_MAX, sig, first_job, first_proc, n_proc, first_tcp, n_tcp;
                uint64_t deadline, now;
                int timeout, r;

                /* process buffered input first, within the output high-water mark */
                if (a->fd >= 0 && a->in_start < a->in_end)
                        a->in_start += agent_feed_some(a, a->in + a->in_start, a->in_end - a->in_start, false);
                if (a->quit)
                        break;

                if (a->fd >= 0) {
                        chan = n;
                        fds[n++] = (struct pollfd) {
                                .fd = a->fd,
                                .events = (short) ((a->in_start == a->in_end && outq_size(&a->out) < AGENT_OUTQ_HIGH
                                                            ? POLLIN : 0) |
                                                   (outq_size(&a->out) > 0 ? POLLOUT : 0)),
                        };
                }
                if (a->listen_fd >= 0) {
                        lst = n;
                        fds[n++] = (struct pollfd) { .fd = a->listen_fd, .events = POLLIN };
                }
                sig = n;
                fds[n++] = (struct pollfd) { .fd = a->sigchld_pipe[0], .events = POLLIN };
                first_job = n;
                n += agent_exec_pollfds(a, fds + n, owners + n, POLL_MAX - n);
                first_proc = n;
                n_proc = agent_proc_pollfds(a, fds + n, POLL_MAX - n);
                n += n_proc;
                first_tcp = n;
                n_tcp = agent_tcp_pollfds(a, fds + n, POLL_MAX - n);
                n += n_tcp;

                deadline = MIN(agent_exec_next_deadline(a), agent_tcp_next_deadline(a));
                deadline = MIN(deadline, agent_proc_next_deadline(a));
                if (a->reopen_usec > 0)
                        deadline = MIN(deadline, a->reopen_usec);
                if (a->fd >= 0 && a->in_start < a->in_end && outq_size(&a->out) < AGENT_OUTQ_HIGH)
                        deadline = 0;
                now = now_usec();
                /* with children running, look now and then even without a SIGCHLD: user code
                 * in the interpreter may have replaced the handler */
                if (a->n_jobs > 0)
                        deadline = MIN(deadline, now + 250 * 1000);
                if (deadline == UINT64_MAX)
                        timeout = -1;
                else if (deadline <= now)
                        timeout = 0;
                else
                        timeout = (int) MIN((deadline - now + 999) / 1000, (uint64_t) INT32_MAX);

                r = poll(fds, n, timeout);
                if (r < 0) {
                        if (errno == EINTR)
                                continue;
                        log_error_errno(errno, "poll() failed: %m");
                        (void) poll(NULL, 0, 100); /* keep serving, but do not spin */
                        continue;
                }

                if (fds[sig].revents)
                        drain_pipe(a->sigchld_pipe[0]);
                /* reap on every turn: cheap, and covers a signal that raced the pipe */
                agent_reap(a);

                for (size_t i = first_job; i < first_proc; i++)
                        if (fds[i].revents)
                                agent_exec_io(a, owners[i], fds[i].fd, fds[i].revents);
                agent_proc_io(a, fds + first_proc, n_proc);

                if (chan != SIZE_MAX && a->fd == fds[chan].fd) {
                        short ev = fds[chan].revents;

                        if (ev & POLLOUT)
                                (void) agent_flush(a, false, 0);
                        if (a->fd >= 0 && (ev & (POLLIN | POLLHUP | POLLERR)))
                                agent_read(a);
                        if (a->fd >= 0 && (ev & POLLNVAL))
                                agent_channel_eof(a);
                }
                if (lst != SIZE_MAX && (fds[lst].revents & POLLIN))
                        agent_accept(a);
                agent_tcp_io(a, fds + first_tcp, n_tcp);

                now = now_usec();
                agent_exec_tick(a, now);
                agent_proc_tick(a, now);
                agent_tcp_tick(a, now);

                if (a->kind == CHANNEL_TTY && a->fd < 0 && a->reopen_usec > 0 && now >= a->reopen_usec) {
                        if (open_tty(a) < 0)
                                a->reopen_usec = now + TTY_REOPEN_USEC;
                }

                /* send what the turn produced right away */
                if (a->fd >= 0 && outq_size(&a->out) > 0)
                        (void) agent_flush(a, false, 0);
        }
        return 0;
}

/* ---- object ---- */

static int parse_channel(Agent *a, const char *spec) {
        if (startswith(spec, "unix:")) {
                a->kind = CHANNEL_UNIX;
                a->path = strdup(spec + 5);
                return a->path ? 0 : -ENOMEM;
        }
        if (startswith(spec, "fd:")) {
                char *end;
                long v;

                errno = 0;
                v = strtol(spec + 3, &end, 10);
                if (errno != 0 || end == spec + 3 || *end || v < 0 || v > INT32_MAX)
                        return -EINVAL;
                a->kind = CHANNEL_FD;
                a->fd = (int) v;
                return 0;
        }
        if (spec[0] != '/')
                return -EINVAL;
        a->kind = CHANNEL_TTY;
        a->path = strdup(spec);
        return a->path ? 0 : -ENOMEM;
}

int agent_new(const AgentConfig *config, Agent **ret) {
        _cleanup_(agent_freep) Agent *a = NULL;
        int r;

        a = calloc(1, sizeof *a);
        if (!a)
                return -ENOMEM;
        a->config = *config;
        a->self_pid = getpid();
        a->fd = a->listen_fd = -EBADF;
        a->sigchld_pipe[0] = a->sigchld_pipe[1] = -EBADF;

        r = agent_reset_decoder(a);
        if (r < 0)
                return r;
        if (pipe2(a->sigchld_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
                return -errno;
        if (config->channel) {
                r = parse_channel(a, config->channel);
                if (r < 0)
                        return r;
        }

        *ret = TAKE_PTR(a);
        return 0;
}

Agent *agent_free(Agent *a) {
        if (!a)
                return NULL;
        agent_exec_kill_all(a);
        for (unsigned i = 0; i < a->n_jobs; i++)
                exec_job_free(a->jobs[i]);
        agent_proc_kill_all(a);
        proc_table_free(a->procs);
        agent_tcp_free(a->tcp);
        a->fd = safe_close(a->fd);
        a->listen_fd = safe_close(a->listen_fd);
        if (a->kind == CHANNEL_UNIX && a->path)
                (void) unlink(a->path);
        safe_close(a->sigchld_pipe[0]);
        safe_close(a->sigchld_pipe[1]);
        fka_decoder_free(a->decoder);
        free(a->out.buf);
        free(a->path);
        identity_done(&a->identity);
        agent_defaults_done(&a->defaults);
        free(a);
        return NULL;
}
