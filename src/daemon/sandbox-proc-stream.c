/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * Output streams of processes in sandboxes (org.forkd.Sandbox.OpenOutputStream).
 *
 * The call is answered with one end of a SOCK_STREAM socketpair once the
 * agent answered a first read (an unknown pid is an error, not an empty
 * stream). forkd then long-polls the agent (proc_read with wait_ms) and writes
 * each answer as frames (proc-stream.h) to its end; the next read is sent only
 * once those frames are written in full, so a slow reader costs forkd at most
 * one answer (PROC_STREAM_READ_BYTES and headers). The stream ends after the
 * exit frame, when the caller closes its end, or when the sandbox goes
 * (sandbox_free(): proc_streams_sandbox_gone()). At most
 * PROC_STREAMS_PER_SANDBOX_MAX per sandbox and PROC_STREAMS_MAX in all.
 *
 * StartProcessStream starts the process and opens its stream in one call: the
 * proc_start asks for the first read too ("read", PROC_START_READ_WAIT_MS), so
 * that a short command's whole run comes in one round trip to the agent; an
 * agent that does not know "read" refuses it, and gets the start alone, then a
 * read, as OpenOutputStream's first.
 */

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <json-c/json.h>

#include "agent-proto.h"
#include "json-util.h"
#include "macro.h"
#include "proc-stream.h"
#include "sandbox-proc-dbus.h"
#include "sandbox-proc-internal.h"
#include "sandbox.h"
#include "time-util.h"

#define PROC_STREAM_WAIT_MS 30000u                  /* one long poll */
#define PROC_STREAM_READ_BYTES (64u * 1024u)        /* one read */
#define PROC_STREAM_IDLE_USEC (250 * USEC_PER_MSEC) /* after an answer that brought nothing */
#define PROC_START_READ_WAIT_MS 50u                 /* a start's read: the end of a short command */

struct ProcStream {
        Manager *manager;
        Sandbox *sandbox;         /* NULL once stopped */
        ProcStream *next, *prev;  /* manager->proc_streams, while not stopped */
        char *id;                 /* the sandbox's, for the log */
        uint32_t pid;
        uint64_t offset;          /* where the next read starts */
        int fd;                   /* forkd's end */
        sd_event_source *io, *timer;
        uint8_t *buf;             /* frames still to write */
        size_t len, done;
        bool in_call;             /* a proc_read in flight: its answer frees a stopped stream */
        bool ending;              /* buf ends with the exit frame */
        bool stopped;
        sd_bus_message *open;     /* the OpenOutputStream call, until the first answer */
        bool reply_pid;           /* StartProcessStream's: the call is answered (pid, fd) */
        char *start;              /* its proc_start without "read", for an agent that refuses "read" */
};


static void stream_unlink(ProcStream *ps) {
        Manager *m = ps->manager;

        if (!ps->sandbox)
                return;
        if (ps->prev)
                ps->prev->next = ps->next;
        else
                m->proc_streams = ps->next;
        if (ps->next)
                ps->next->prev = ps->prev;
        ps->next = ps->prev = NULL;
        m->n_proc_streams--;
        ps->sandbox = NULL;
}

static void stream_free(ProcStream *ps) {
        free(ps->start);
        stream_unlink(ps);
        ps->io = sd_event_source_disable_unref(ps->io);
        ps->timer = sd_event_source_disable_unref(ps->timer);
        safe_close(ps->fd);
        sd_bus_message_unref(ps->open);
        free(ps->buf);
        free(ps->id);
        free(ps);
}

/* The stream ends (its socket closes); freed now, or by its call's answer. */
static void stream_stop(ProcStream *ps, const char *why) {
        if (ps->stopped)
                return;
        log_debug("Output stream of process %u in sandbox %s ends: %s.", ps->pid, ps->id, why);
        ps->stopped = true;
        if (ps->open) {
                (void) sd_bus_reply_method_errorf(ps->open, FORKD_ERROR_NO_SUCH_SANDBOX, "Sandbox %s has exited.",
                                                  ps->id);
                ps->open = sd_bus_message_unref(ps->open);
        }
        stream_unlink(ps);
        ps->io = sd_event_source_disable_unref(ps->io);
        ps->timer = sd_event_source_disable_unref(ps->timer);
        ps->fd = safe_close(ps->fd);
        if (!ps->in_call)
                stream_free(ps);
}

void proc_streams_sandbox_gone(Sandbox *s) {
        ProcStream *ps = s->manager->proc_streams, *next;

        for (; ps; ps = next) {
                next = ps->next;
                if (ps->sandbox == s)
                        stream_stop(ps, "the sandbox is gone");
        }
}

/* The frames of an answer into ps->buf. */
static int stream_frames(ProcStream *ps, const ProcReadAnswer *a) {
        size_t cap = a->bytes + (a->n_chunks + 2) * (PROC_STREAM_HDR_SIZE + PROC_STREAM_FIXED_LEN), n = 0;
        uint8_t *b;

        b = malloc(MAX(cap, (size_t) 1));
        if (!b)
                return -ENOMEM;
        if (a->gap > 0)
                n += proc_stream_encode_gap(b + n, ps->offset + a->gap, a->gap);
        for (size_t i = 0; i < a->n_chunks; i++) {
                const ProcChunk *k = &a->chunks[i];

                proc_stream_header_encode(b + n, k->kind, (uint32_t) k->len, k->offset);
                memcpy(b + n + PROC_STREAM_HDR_SIZE, k->data, k->len);
                n += PROC_STREAM_HDR_SIZE + k->len;
        }
        if (a->end) {
                n += proc_stream_encode_exit(b + n, a->next_offset, a->exit_code, a->signal);
                ps->ending = true;
        }
        free(ps->buf);
        ps->buf = b;
        ps->len = n;
        ps->done = 0;
        ps->offset = a->next_offset;
        return 0;
}

static void stream_reply(int r, uint16_t type, const char *json, struct json_object *obj, void *userdata);

static int stream_read(ProcStream *ps, uint32_t wait_ms) {
        _cleanup_json_ struct json_object *req = proc_read_request(ps->pid, ps->offset, PROC_STREAM_READ_BYTES, wait_ms);
        Sandbox *s = ps->sandbox;
        int r;

        if (!req)
                return -ENOMEM;
        if (!s || s->state != SANDBOX_RUNNING)
                return -ECONNRESET;
        json_object_object_add(req, "op", json_object_new_string("proc_read"));
        r = sandbox_call(s, json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN),
                         (uint64_t) wait_ms * USEC_PER_MSEC + PROC_CALL_TIMEOUT_USEC, stream_reply, ps);
        if (r < 0)
                return r;
        ps->in_call = true;
        return 0;
}

static void stream_next(ProcStream *ps) {
        int r = stream_read(ps, PROC_STREAM_WAIT_MS);

        if (r < 0) {
                log_debug_errno(r, "Cannot read the output of process %u in sandbox %s: %m", ps->pid, ps->id);
                stream_stop(ps, "the read could not be sent");
        }
}

static int on_stream_timer(sd_event_source *source, uint64_t usec, void *userdata) {
        ProcStream *ps = userdata;

        ps->timer = sd_event_source_disable_unref(ps->timer);
        stream_next(ps);
        return 0;
}

/* The next read after usec, from the event loop: never from inside the
 * sandbox's dispatch of an answer. An accuracy of 1 us: sd-event's default (0)
 * lets a timer fire up to 250 ms late, to coalesce wakeups, and every read of a
 * process that prints would wait that long. */
static void stream_schedule(ProcStream *ps, uint64_t usec) {
        int r = sd_event_add_time_relative(ps->manager->event, &ps->timer, CLOCK_MONOTONIC, usec, 1, on_stream_timer,
                                           ps);
        if (r < 0)
                stream_stop(ps, "out of resources");
}

/* Write what is buffered; once all is out, the next read (or the end). */
static void stream_flush(ProcStream *ps) {
        while (ps->done < ps->len) {
                ssize_t n = send(ps->fd, ps->buf + ps->done, ps->len - ps->done, MSG_NOSIGNAL | MSG_DONTWAIT);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0 && errno == EAGAIN) {
                        (void) sd_event_source_set_io_events(ps->io, EPOLLIN | EPOLLRDHUP | EPOLLOUT);
                        return;
                }
                if (n <= 0) {
                        stream_stop(ps, "the reader went away");
                        return;
                }
                ps->done += (size_t) n;
        }
        (void) sd_event_source_set_io_events(ps->io, EPOLLIN | EPOLLRDHUP);
        free(ps->buf);
        ps->buf = NULL;
        ps->len = ps->done = 0;
        if (ps->ending)
                stream_stop(ps, "the process's output ended");
        else
                stream_schedule(ps, 0);
}

static int on_stream_io(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        ProcStream *ps = userdata;
        char junk[256];

        if (revents & (EPOLLHUP | EPOLLERR)) {
                stream_stop(ps, "the reader closed its end");
                return 0;
        }
        if (revents & (EPOLLIN | EPOLLRDHUP)) {
                /* The reader has nothing to say: what it writes is dropped, its EOF ends the stream. */
                ssize_t n = recv(fd, junk, sizeof(junk), MSG_DONTWAIT);

                if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                        stream_stop(ps, "the reader closed its end");
                        return 0;
                }
        }
        if ((revents & EPOLLOUT) && ps->done < ps->len)
                stream_flush(ps);
        return 0;
}

/* The first answer: the caller gets its end of the socket. */
static int stream_open(ProcStream *ps) {
        bool with_pid = ps->reply_pid;
        _cleanup_close_ int peer = -EBADF;
        int pair[2], r;

        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, pair) < 0)
                return -errno;
        ps->fd = pair[0];
        peer = pair[1];
        /* The caller's end blocks as a plain socket does. */
        if (fcntl(peer, F_SETFL, fcntl(peer, F_GETFL) & ~O_NONBLOCK) < 0)
                return -errno;
        r = sd_event_add_io(ps->manager->event, &ps->io, ps->fd, EPOLLIN | EPOLLRDHUP, on_stream_io, ps);
        if (r < 0)
                return r;
        r = with_pid ? sd_bus_reply_method_return(ps->open, "uh", ps->pid, peer) :
                       sd_bus_reply_method_return(ps->open, "h", peer);
        if (r < 0)
                return r;
        ps->open = sd_bus_message_unref(ps->open);
        return 0;
}

static void stream_answer(ProcStream *ps, struct json_object *obj);

static void stream_reply(int r, uint16_t type, const char *json, struct json_object *obj, void *userdata) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        ProcStream *ps = userdata;

        ps->in_call = false;
        if (ps->stopped) {
                stream_free(ps);
                return;
        }
        if (r == -ETIMEDOUT && !ps->open) {
                /* A long poll the guest dropped (its channel was reset): ask again. */
                stream_schedule(ps, 0);
                return;
        }
        if (r < 0 || type != FKA_RESPONSE || !obj) {
                if (ps->open) {
                        (void) proc_agent_error(r >= 0 && type != FKA_ERROR ? -EPROTO : r, obj, &error);
                        (void) sd_bus_reply_method_error(ps->open, &error);
                        ps->open = sd_bus_message_unref(ps->open);
                }
                stream_stop(ps, r < 0 ? "the sandbox did not answer" : "the guest refused the read");
                return;
        }
        stream_answer(ps, obj);
}

/* A proc_read answer obj for ps: its frames, the call answered (the first), the next read. */
static void stream_answer(ProcStream *ps, struct json_object *obj) {
        _cleanup_(proc_read_answer_done) ProcReadAnswer a = {};
        const char *why = NULL;
        bool first;
        int r;

        r = proc_read_answer_parse(obj, ps->offset, PROC_STREAM_READ_BYTES, &a, &why);
        if (r < 0) {
                log_debug("Sandbox %s sent an invalid proc_read answer: %s.", ps->id, why);
                if (ps->open) {
                        (void) proc_invalid_answer(ps->open, PROC_OP_READ, why);
                        ps->open = sd_bus_message_unref(ps->open);
                }
                stream_stop(ps, "invalid answer");
                return;
        }
        first = ps->open;
        r = stream_frames(ps, &a);
        if (r >= 0 && ps->open)
                r = stream_open(ps);
        if (r < 0 && ps->open) {
                (void) sd_bus_reply_method_errnof(ps->open, r, "Failed to open the output stream: %m");
                ps->open = sd_bus_message_unref(ps->open);
        }
        if (r < 0) {
                stream_stop(ps, "out of resources");
                return;
        }
        if (ps->len > 0) {
                stream_flush(ps);
                return;
        }
        /* Nothing came: the long poll starts at once after the first read;
         * later, wait a little first, so that a guest that answers at once (a
         * process that exited, its pipe held open by another) is not asked in
         * a tight loop. */
        stream_schedule(ps, first ? 0 : PROC_STREAM_IDLE_USEC);
}

static unsigned streams_of(Manager *m, Sandbox *s) {
        unsigned n = 0;

        for (ProcStream *ps = m->proc_streams; ps; ps = ps->next)
                n += ps->sandbox == s;
        return n;
}

/* A new stream of s for the call message (verb: polkit's), linked in: 1 and *ret; 0
 * when polkit answers the call; < 0 or an error set when it may not be. */
static int stream_new(sd_bus_message *message, Sandbox *s, const char *verb, ProcStream **ret, sd_bus_error *error) {
        Manager *m = s->manager;
        ProcStream *ps;
        int r;

        if (sd_bus_can_send(sd_bus_message_get_bus(message), SD_BUS_TYPE_UNIX_FD) <= 0)
                return sd_bus_error_setf(error, FORKD_ERROR_NOT_SUPPORTED,
                                         "This connection cannot pass file descriptors; an output stream needs one.");
        r = proc_verify(message, s, verb, error);
        if (r <= 0)
                return r;
        if (s->state != SANDBOX_RUNNING)
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "Sandbox %s is being terminated.", s->id);
        if (m->n_proc_streams >= PROC_STREAMS_MAX)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "Too many output streams open (%u).",
                                         PROC_STREAMS_MAX);
        if (streams_of(m, s) >= PROC_STREAMS_PER_SANDBOX_MAX)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "Too many output streams open in sandbox %s (%u).",
                                         s->id, PROC_STREAMS_PER_SANDBOX_MAX);

        ps = calloc(1, sizeof(*ps));
        if (!ps)
                return -ENOMEM;
        *ps = (ProcStream) { .manager = m, .sandbox = s, .fd = -EBADF, .id = strdup(s->id),
                             .open = sd_bus_message_ref(message) };
        ps->next = m->proc_streams;
        if (ps->next)
                ps->next->prev = ps;
        m->proc_streams = ps;
        m->n_proc_streams++;
        if (!ps->id) {
                ps->open = sd_bus_message_unref(ps->open);
                stream_free(ps);
                return -ENOMEM;
        }
        *ret = ps;
        return 1;
}

/* The first call to the agent of a new stream could not be sent (r): the stream is
 * dropped, error says why. */
static int stream_call_failed(ProcStream *ps, int r, const char *what, sd_bus_error *error) {
        _cleanup_free_ char *id = TAKE_PTR(ps->id);

        ps->open = sd_bus_message_unref(ps->open);
        stream_free(ps);
        if (r == -EBUSY || r == -ENOBUFS)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "Too many requests in flight for sandbox %s.", id);
        if (IN_SET_CONN(r))
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "Sandbox %s has exited.", id);
        return sd_bus_error_set_errnof(error, r, "Failed to %s: %m", what);
}

int bus_sandbox_method_open_output_stream(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        ProcStream *ps = NULL;
        uint64_t offset;
        uint32_t pid;
        int r;

        r = proc_read_pid(message, &pid, error);
        if (r < 0)
                return r;
        r = proc_read_offset(message, &offset, error);
        if (r < 0)
                return r;
        r = stream_new(message, userdata, "output-stream", &ps, error);
        if (r <= 0)
                return r < 0 ? r : 1;
        ps->pid = pid;
        ps->offset = offset;
        r = stream_read(ps, 0);
        if (r < 0)
                return stream_call_failed(ps, r, "read the output of the process", error);
        return 1;
}

/* The answer to StartProcessStream's proc_start: {"pid", "read"} (or {"pid"} from a
 * start sent again without "read"); a refusal of "read" sends it again without. */
static void start_reply(int r, uint16_t type, const char *json, struct json_object *obj, void *userdata) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct json_object *v = NULL, *rd = NULL;
        ProcStream *ps = userdata;
        int64_t pid;

        ps->in_call = false;
        if (ps->stopped) {
                stream_free(ps);
                return;
        }
        if (r >= 0 && type == FKA_ERROR && obj && ps->start && json_object_object_get_ex(obj, "errno", &v) &&
            streq(json_object_get_string(v) ?: "", "EINVAL") && json_object_object_get_ex(obj, "error", &v) &&
            strstr(json_object_get_string(v) ?: "", "'read'")) {
                /* an agent that does not know the start's read: the start alone */
                r = sandbox_call(ps->sandbox, ps->start, PROC_CALL_TIMEOUT_USEC, start_reply, ps);
                free(ps->start);
                ps->start = NULL;
                if (r >= 0) {
                        ps->in_call = true;
                        return;
                }
        }
        if (r < 0 || type != FKA_RESPONSE || !obj) {
                (void) proc_agent_error(r >= 0 && type != FKA_ERROR ? -EPROTO : r, obj, &error);
                (void) sd_bus_reply_method_error(ps->open, &error);
                ps->open = sd_bus_message_unref(ps->open);
                stream_stop(ps, r < 0 ? "the sandbox did not answer" : "the guest refused the start");
                return;
        }
        if (!json_object_object_get_ex(obj, "pid", &v) || !json_object_is_type(v, json_type_int) ||
            (pid = json_object_get_int64(v)) < 1 || pid > INT32_MAX ||
            (json_object_object_get_ex(obj, "read", &rd) && !json_object_is_type(rd, json_type_object))) {
                (void) proc_invalid_answer(ps->open, PROC_OP_START, "no valid pid, or a read that is no object");
                ps->open = sd_bus_message_unref(ps->open);
                stream_stop(ps, "invalid answer");
                return;
        }
        ps->pid = (uint32_t) pid;
        if (rd) {
                stream_answer(ps, rd);
                return;
        }
        /* the start alone: its first read, as OpenOutputStream's */
        r = stream_read(ps, 0);
        if (r < 0) {
                (void) sd_bus_reply_method_errnof(ps->open, r, "Failed to read the output of process %u: %m", ps->pid);
                ps->open = sd_bus_message_unref(ps->open);
                stream_stop(ps, "the read could not be sent");
        }
}

int bus_sandbox_method_start_process_stream(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ struct json_object *req = NULL, *read = NULL;
        ProcStream *ps = NULL;
        Sandbox *s = userdata;
        int r;

        r = proc_start_request(message, &req, error);
        if (r < 0)
                return r;
        r = stream_new(message, s, "start-process", &ps, error);
        if (r <= 0)
                return r < 0 ? r : 1;
        json_object_object_add(req, "op", json_object_new_string("proc_start"));
        ps->reply_pid = true;
        ps->start = strdup(json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN));
        read = json_object_new_object();
        r = ps->start && read ? 0 : -ENOMEM;
        if (r >= 0) {
                json_object_object_add(read, "max", json_object_new_int64(PROC_STREAM_READ_BYTES));
                json_object_object_add(read, "wait_ms", json_object_new_int64(PROC_START_READ_WAIT_MS));
                json_object_object_add(req, "read", TAKE_PTR(read));
                r = sandbox_call(s, json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN),
                                 (uint64_t) PROC_START_READ_WAIT_MS * USEC_PER_MSEC + PROC_CALL_TIMEOUT_USEC,
                                 start_reply, ps);
        }
        if (r < 0)
                return stream_call_failed(ps, r, "start the process", error);
        ps->in_call = true;
        return 1;
}
