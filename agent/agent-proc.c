/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The process table (agent-proc.h): proc_start and its five companions.
 *
 * A process runs in its own session (its own process group, which signals and
 * the timeout kill go to), with stdout and stderr on pipes, or with a pty whose
 * slave is its stdin, stdout, stderr and controlling tty. The loop drains every
 * output fd into the process's ring at once, whoever reads, and writes the
 * queued stdin as the pipe (or the pty) takes it.
 *
 * A proc_read with nothing to give waits (a long poll) in the table's waiters:
 * answered in agent_proc_tick() when output came, at the process's end or at
 * its deadline; dropped unanswered when the channel that asked was replaced,
 * as exec's answers are.
 */

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "agent-proc-internal.h"
#include "agent-spawn.h"
#include "agent.h"
#include "base64.h"
#include "json-util.h"
#include "macro.h"
#include "strv.h"

static const char *const stream_names[] = { "stdout", "stderr" };

/* ---- the table ---- */

ProcEntry *proc_entry_free(ProcEntry *e) {
        if (!e)
                return NULL;
        safe_close(e->out_fd);
        safe_close(e->err_fd);
        safe_close(e->in_fd);
        free(e->inq);
        strv_free(e->argv);
        free(e->cwd);
        ring_done(&e->ring);
        free(e);
        return NULL;
}

ProcTable *proc_table_free(ProcTable *t) {
        if (!t)
                return NULL;
        for (unsigned i = 0; i < t->n; i++)
                proc_entry_free(t->entries[i]);
        free(t);
        return NULL;
}

ProcTable *proc_table(Agent *a) {
        if (!a->procs)
                a->procs = calloc(1, sizeof *a->procs);
        return a->procs;
}

static ProcEntry *proc_find(const Agent *a, int64_t pid) {
        if (!a->procs)
                return NULL;
        for (unsigned i = 0; i < a->procs->n; i++)
                if (a->procs->entries[i]->pid == pid)
                        return a->procs->entries[i];
        return NULL;
}

/* Output fds closed and reaped: nothing more will come. */
static bool proc_done(const ProcEntry *e) {
        return e->exited && e->out_fd < 0 && e->err_fd < 0;
}

static void proc_kill(ProcEntry *e, int sig) {
        if (e->exited)
                return;
        /* its own session: pgid == pid; the leader alone if the group is gone already */
        if (kill(-e->pid, sig) < 0)
                (void) kill(e->pid, sig);
}

static void proc_close_stdin(ProcEntry *e) {
        e->in_fd = safe_close(e->in_fd);
        e->inq = mfree(e->inq);
        e->inq_start = e->inq_end = 0;
        e->in_open = false;
}

static void proc_close_output(ProcEntry *e, int fd) {
        if (fd == e->out_fd) {
                e->out_fd = safe_close(e->out_fd);
                if (e->pty)
                        proc_close_stdin(e); /* the master was stdin too */
        } else if (fd == e->err_fd)
                e->err_fd = safe_close(e->err_fd);
}

/* Drain fd into the ring; a bounded amount per call, so that a flood does not
 * starve the loop. */
static void proc_drain(ProcEntry *e, int fd, unsigned stream) {
        static uint8_t buf[AGENT_READ_CHUNK];

        for (unsigned i = 0; i < 16; i++) {
                ssize_t k = read(fd, buf, sizeof buf);

                if (k > 0) {
                        ring_append(&e->ring, buf, (size_t) k, stream);
                        continue;
                }
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0 && errno == EAGAIN)
                        return;
                proc_close_output(e, fd); /* EOF, or EIO: a pty whose slave is closed everywhere */
                return;
        }
}

static int stdin_fd(const ProcEntry *e) {
        return e->pty ? e->out_fd : e->in_fd;
}

static void proc_flush_stdin(ProcEntry *e) {
        int fd = stdin_fd(e);

        while (fd >= 0 && e->inq_start < e->inq_end) {
                ssize_t k = write(fd, e->inq + e->inq_start, e->inq_end - e->inq_start);

                if (k > 0) {
                        e->inq_start += (size_t) k;
                        continue;
                }
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0 && errno == EAGAIN)
                        return;
                /* EPIPE: the reading end is gone; nothing queued can go anywhere now */
                if (e->pty) {
                        e->inq_start = e->inq_end = 0;
                        return;
                }
                proc_close_stdin(e);
                return;
        }
        e->inq_start = e->inq_end = 0;
        if (e->in_eof && !e->pty)
                proc_close_stdin(e);
}

static int proc_queue_stdin(ProcEntry *e, const void *data, size_t n) {
        if (e->inq_end + n > AGENT_PROC_STDIN_QUEUE && e->inq_start > 0) {
                memmove(e->inq, e->inq + e->inq_start, e->inq_end - e->inq_start);
                e->inq_end -= e->inq_start;
                e->inq_start = 0;
        }
        if (!e->inq) {
                e->inq = malloc(AGENT_PROC_STDIN_QUEUE);
                if (!e->inq)
                        return -ENOMEM;
        }
        memcpy(e->inq + e->inq_end, data, n);
        e->inq_end += n;
        return 0;
}

/* ---- answers ---- */

static void add_exit_status(struct json_object *o, const ProcEntry *e) {
        bool code = e->exited && WIFEXITED(e->status), sig = e->exited && WIFSIGNALED(e->status);

        json_object_object_add(o, "exit_code", code ? json_object_new_int(WEXITSTATUS(e->status)) : NULL);
        json_object_object_add(o, "signal", sig ? json_object_new_int(WTERMSIG(e->status)) : NULL);
}

/* The chunks from max(offset, ring start), at most max bytes and within the
 * reply's payload limit. */
static struct json_object *proc_read_reply(ProcEntry *e, uint64_t offset, uint32_t max) {
        _cleanup_json_ struct json_object *o = NULL;
        _cleanup_free_ uint8_t *raw = NULL;
        _cleanup_free_ char *b64 = NULL;
        const ProcRing *r = &e->ring;
        struct json_object *chunks;
        uint64_t pos = MAX(offset, r->start);
        size_t budget = max, room = AGENT_MAX_PAYLOAD - 4096;
        bool end;

        o = json_object_new_object();
        chunks = json_object_new_array();
        if (!o || !chunks || json_object_object_add(o, "chunks", chunks) < 0) {
                json_object_put(chunks);
                return NULL;
        }
        if (pos < r->end) {
                raw = malloc(max);
                b64 = malloc(BASE64_ENCODED_SIZE(max) + 1);
                if (!raw || !b64)
                        return NULL;
        }
        for (size_t i = pos < r->end ? ring_find(r, pos) : 0; pos < r->end && budget > 0; i++) {
                uint64_t run_end = i + 1 < r->n_segs ? ring_seg(r, i + 1) >> 1 : r->end;
                size_t len = (size_t) MIN(run_end - pos, (uint64_t) budget), first, at;
                struct json_object *c;

                if (room < 128)
                        break;
                len = MIN(len, (room - 128) / 4 * 3);
                if (len == 0)
                        break;
                at = (size_t) (pos & (r->cap - 1));
                first = MIN(len, r->cap - at);
                memcpy(raw, r->buf + at, first);
                memcpy(raw + first, r->buf, len - first);
                c = json_object_new_object();
                if (!c || json_object_array_add(chunks, c) < 0) {
                        json_object_put(c);
                        return NULL;
                }
                json_object_object_add(c, "stream", json_object_new_string(stream_names[ring_seg(r, i) & 1]));
                json_object_object_add(c, "offset", json_object_new_int64((int64_t) pos));
                json_object_object_add(c, "data_b64",
                                       json_object_new_string_len(b64, (int) base64_encode(raw, len, b64)));
                pos += len;
                budget -= len;
                room -= 128 + BASE64_ENCODED_SIZE(len);
                if (pos < run_end)
                        break;
        }
        end = proc_done(e) && pos == r->end;
        json_object_object_add(o, "next_offset", json_object_new_int64((int64_t) pos));
        json_object_object_add(o, "gap", json_object_new_int64(offset < r->start ? (int64_t) (r->start - offset) : 0));
        json_object_object_add(o, "exited", json_object_new_boolean(e->exited));
        add_exit_status(o, e);
        json_object_object_add(o, "end", json_object_new_boolean(end));
        if (end)
                e->end_read = true; /* kept for readers to come, but the first to give way */
        return TAKE_PTR(o);
}

/* ---- requests ---- */

int proc_dispatch_ignore(struct json_object *v, void *field, const char **ret_error) {
        return 0;
}

int proc_dispatch_borrow(struct json_object *v, void *field, const char **ret_error) {
        *(struct json_object **) field = v;
        return 0;
}

int proc_dispatch(Agent *a, uint32_t id, struct json_object *req, const struct json_dispatch *table,
                         void *args) {
        const char *field = NULL, *err = NULL;
        int r;

        r = json_dispatch_full(req, table, JSON_REJECT_UNKNOWN, args, &field, &err);
        if (r == -ENOMEM)
                return r;
        if (r < 0) {
                (void) agent_send_error_errno(a, id, EINVAL, "bad argument '%s': %s", field ?: "?",
                                              err ?: strerror(-r));
                return 0;
        }
        return 1;
}

static bool pid_valid(int64_t pid) {
        return pid > 0 && pid <= INT32_MAX;
}

/* The entry, or an ESRCH answer (NULL). */
static ProcEntry *proc_lookup(Agent *a, uint32_t id, int64_t pid) {
        ProcEntry *e = pid_valid(pid) ? proc_find(a, pid) : NULL;

        if (!e)
                (void) agent_send_error_errno(a, id, ESRCH, "no process %" PRIi64 " in the table", pid);
        return e;
}

static int reply_ok(Agent *a, uint32_t id) {
        struct json_object *o = json_object_new_object();

        if (!o)
                return -ENOMEM;
        json_object_object_add(o, "ok", json_object_new_boolean(1));
        return agent_send_json(a, FKA_RESPONSE, id, o);
}

typedef struct ProcPidArgs {
        int64_t pid;
        int64_t signal;
        uint32_t cols, rows;
        char *data_b64;
        bool eof;
        uint64_t offset;
        uint32_t max;
        uint32_t wait_ms;
} ProcPidArgs;

#define PID_FIELD { "pid", JSON_KIND_INT64, NULL, offsetof(ProcPidArgs, pid), 0, JSON_MANDATORY }

/* A string cut to at most max bytes (not inside a UTF-8 sequence). */
static struct json_object *json_string_cut(const char *s, size_t max) {
        size_t n = strlen(s);

        return json_string_sanitized(s, n <= max ? n : utf8_prefix(s, max));
}

/* The list; with cut, args (in all) and cwd are cut to cut bytes each. */
static struct json_object *proc_list_reply(const ProcTable *t, size_t cut) {
        _cleanup_json_ struct json_object *o = json_object_new_object();
        struct json_object *list = json_object_new_array();

        if (!o || !list || json_object_object_add(o, "processes", list) < 0) {
                json_object_put(list);
                return NULL;
        }
        for (unsigned i = 0; t && i < t->n; i++) {
                const ProcEntry *e = t->entries[i];
                struct json_object *p = json_object_new_object(), *args = json_object_new_array();
                size_t room = cut ?: SIZE_MAX;

                if (!p || !args || json_object_array_add(list, p) < 0) {
                        json_object_put(p);
                        json_object_put(args);
                        return NULL;
                }
                json_object_object_add(p, "pid", json_object_new_int(e->pid));
                json_object_object_add(p, "args", args);
                for (char **s = e->argv; *s && room > 0; s++) {
                        size_t l = strlen(*s);

                        if (json_object_array_add(args, json_string_cut(*s, room)) < 0)
                                return NULL;
                        room -= MIN(l + 1, room); /* an empty string counts too */
                }
                json_object_object_add(p, "cwd", json_string_cut(e->cwd, cut ?: SIZE_MAX));
                json_object_object_add(p, "pty", json_object_new_boolean(e->pty));
                json_object_object_add(p, "running", json_object_new_boolean(!e->exited));
                add_exit_status(p, e);
                json_object_object_add(p, "end_offset", json_object_new_int64((int64_t) e->ring.end));
                json_object_object_add(p, "started_ns", json_object_new_int64((int64_t) e->started_ns));
        }
        return TAKE_PTR(o);
}

int agent_op_proc_list(Agent *a, uint32_t id, struct json_object *req) {
        static const struct json_dispatch table[] = { PROC_OP_FIELD, {} };
        /* a full table of long command lines does not fit one reply: cut them until it does */
        static const size_t cuts[] = { 0, 1024, 128 };
        int r;

        r = proc_dispatch(a, id, req, table, NULL);
        if (r <= 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(cuts); i++) {
                struct json_object *o = proc_list_reply(a->procs, cuts[i]);
                size_t len;

                if (!o || !json_plain(o, &len)) {
                        json_object_put(o);
                        return -ENOMEM;
                }
                if (len + 64 <= AGENT_MAX_PAYLOAD || i + 1 == ELEMENTSOF(cuts))
                        return agent_send_json(a, FKA_RESPONSE, id, o);
                json_object_put(o);
        }
        return 0;
}

int agent_op_proc_signal(Agent *a, uint32_t id, struct json_object *req) {
        static const struct json_dispatch table[] = {
                PROC_OP_FIELD, PID_FIELD,
                { "signal", JSON_KIND_INT64, NULL, offsetof(ProcPidArgs, signal), 0, JSON_MANDATORY },
                {}
        };
        ProcPidArgs args = {};
        ProcEntry *e;
        int r;

        r = proc_dispatch(a, id, req, table, &args);
        if (r <= 0)
                return r;
        if (args.signal < 1 || args.signal > 64)
                return agent_send_error_errno(a, id, EINVAL, "bad argument 'signal': %" PRIi64 " is not 1 .. 64",
                                              args.signal), 0;
        e = proc_lookup(a, id, args.pid);
        if (!e)
                return 0;
        if (e->exited)
                return agent_send_error_errno(a, id, ESRCH, "process %d has exited", e->pid), 0;
        proc_kill(e, (int) args.signal);
        return reply_ok(a, id);
}

int agent_op_proc_stdin(Agent *a, uint32_t id, struct json_object *req) {
        static const struct json_dispatch table[] = {
                PROC_OP_FIELD, PID_FIELD,
                { "data_b64", JSON_KIND_STRING, NULL, offsetof(ProcPidArgs, data_b64), 0, JSON_MANDATORY },
                { "eof", JSON_KIND_BOOL, NULL, offsetof(ProcPidArgs, eof), 0, 0 },
                {}
        };
        ProcPidArgs args = {};
        _cleanup_free_ uint8_t *data = NULL;
        ProcEntry *e;
        size_t n = 0, len;
        int r;

        r = proc_dispatch(a, id, req, table, &args);
        _cleanup_free_ char *b64 = args.data_b64;
        if (r <= 0)
                return r;
        len = strlen(b64);
        if (base64_decoded_size(b64, len, &n) < 0)
                return agent_send_error_errno(a, id, EINVAL, "bad argument 'data_b64': not base64 "
                                              "(RFC 4648, padded, no whitespace)"), 0;
        if (n > AGENT_PROC_STDIN_CHUNK)
                return agent_send_error_errno(a, id, EINVAL, "bad argument 'data_b64': %zu bytes, more than %u",
                                              n, AGENT_PROC_STDIN_CHUNK), 0;
        e = proc_lookup(a, id, args.pid);
        if (!e)
                return 0;
        if (!e->in_open)
                return agent_send_error_errno(a, id, EPIPE, "stdin of process %d is closed", e->pid), 0;
        if (e->exited)
                return agent_send_error_errno(a, id, ESRCH, "process %d has exited", e->pid), 0;
        if (e->inq_end - e->inq_start + n + (args.eof && e->pty) > AGENT_PROC_STDIN_QUEUE)
                return agent_send_error_errno(a, id, EAGAIN, "stdin is full; retry"), 0;
        data = malloc(MAX(n, (size_t) 1));
        if (!data)
                return -ENOMEM;
        r = base64_decode(b64, len, data, n, &n);
        if (r < 0)
                return r;
        r = proc_queue_stdin(e, data, n);
        if (r >= 0 && args.eof) {
                if (e->pty) {
                        struct termios t;
                        uint8_t veof = 4; /* ^D */

                        if (tcgetattr(e->out_fd, &t) >= 0 && t.c_cc[VEOF] != _POSIX_VDISABLE)
                                veof = t.c_cc[VEOF];
                        r = proc_queue_stdin(e, &veof, 1);
                } else {
                        e->in_eof = true;
                        e->in_open = false;
                }
        }
        if (r < 0)
                return r;
        proc_flush_stdin(e);

        struct json_object *o = json_object_new_object();
        if (!o)
                return -ENOMEM;
        json_object_object_add(o, "written", json_object_new_int64((int64_t) n));
        return agent_send_json(a, FKA_RESPONSE, id, o);
}

int agent_op_proc_resize(Agent *a, uint32_t id, struct json_object *req) {
        static const struct json_dispatch table[] = {
                PROC_OP_FIELD, PID_FIELD,
                { "cols", JSON_KIND_UINT32, NULL, offsetof(ProcPidArgs, cols), 0, JSON_MANDATORY },
                { "rows", JSON_KIND_UINT32, NULL, offsetof(ProcPidArgs, rows), 0, JSON_MANDATORY },
                {}
        };
        ProcPidArgs args = {};
        struct winsize ws = {};
        ProcEntry *e;
        int r;

        r = proc_dispatch(a, id, req, table, &args);
        if (r <= 0)
                return r;
        if (args.cols < 1 || args.cols > AGENT_PROC_PTY_MAX || args.rows < 1 || args.rows > AGENT_PROC_PTY_MAX)
                return agent_send_error_errno(a, id, EINVAL, "bad argument '%s': must be 1 .. %u",
                                              args.cols < 1 || args.cols > AGENT_PROC_PTY_MAX ? "cols" : "rows",
                                              AGENT_PROC_PTY_MAX), 0;
        e = proc_lookup(a, id, args.pid);
        if (!e)
                return 0;
        if (!e->pty)
                return agent_send_error_errno(a, id, ENOTTY, "process %d has no pty", e->pid), 0;
        if (e->exited || e->out_fd < 0)
                return agent_send_error_errno(a, id, ESRCH, "process %d has exited", e->pid), 0;
        ws.ws_col = (unsigned short) args.cols;
        ws.ws_row = (unsigned short) args.rows;
        if (ioctl(e->out_fd, TIOCSWINSZ, &ws) < 0)
                return agent_send_error_errno(a, id, errno, "cannot resize the pty: %m"), 0;
        e->cols = args.cols;
        e->rows = args.rows;
        return reply_ok(a, id);
}

static void proc_answer_read(Agent *a, uint32_t id, uint64_t tcp_conn, ProcEntry *e, uint64_t offset,
                             uint32_t max, bool start) {
        uint64_t saved = a->reply_tcp;
        struct json_object *o = proc_read_reply(e, offset, max);

        if (o && start) {
                /* a proc_start's answer: the pid, and the read in it */
                struct json_object *w = json_object_new_object();

                if (w) {
                        json_object_object_add(w, "pid", json_object_new_int(e->pid));
                        json_object_object_add(w, "read", o);
                }
                o = w ?: (json_object_put(o), NULL);
        }
        a->reply_tcp = tcp_conn;
        if (o)
                (void) agent_send_json(a, FKA_RESPONSE, id, o);
        else
                (void) agent_send_error(a, id, "out of memory");
        a->reply_tcp = saved;
}

/* Remove the entries that expired or were evicted. */
static void proc_sweep(Agent *a) {
        ProcTable *t = a->procs;

        for (unsigned i = 0; t && i < t->n;) {
                if (!t->entries[i]->drop) {
                        i++;
                        continue;
                }
                proc_entry_free(t->entries[i]);
                memmove(t->entries + i, t->entries + i + 1, (t->n - i - 1) * sizeof *t->entries);
                t->n--;
        }
}

/* A full table makes room by dropping the exited entry read to its end the
 * longest ago exited; false when there is none (every entry runs or is unread). */
bool proc_table_evict_read(ProcTable *t) {
        unsigned best = UINT_MAX;

        for (unsigned i = 0; i < t->n; i++)
                if (t->entries[i]->end_read && (best == UINT_MAX ||
                                                t->entries[i]->exited_usec < t->entries[best]->exited_usec))
                        best = i;
        if (best == UINT_MAX)
                return false;
        proc_entry_free(t->entries[best]);
        memmove(t->entries + best, t->entries + best + 1, (t->n - best - 1) * sizeof *t->entries);
        t->n--;
        return true;
}

int agent_op_proc_read(Agent *a, uint32_t id, struct json_object *req) {
        static const struct json_dispatch table[] = {
                PROC_OP_FIELD, PID_FIELD,
                { "offset", JSON_KIND_UINT64, NULL, offsetof(ProcPidArgs, offset), 0, 0 },
                { "max", JSON_KIND_UINT32, NULL, offsetof(ProcPidArgs, max), 0, 0 },
                { "wait_ms", JSON_KIND_UINT32, NULL, offsetof(ProcPidArgs, wait_ms), 0, 0 },
                {}
        };
        ProcPidArgs args = { .max = AGENT_PROC_READ_DEFAULT };
        ProcEntry *e;
        ProcTable *t;
        int r;

        r = proc_dispatch(a, id, req, table, &args);
        if (r <= 0)
                return r;
        if (args.max < 1 || args.max > AGENT_PROC_READ_MAX)
                return agent_send_error_errno(a, id, EINVAL, "bad argument 'max': must be 1 .. %u",
                                              AGENT_PROC_READ_MAX), 0;
        if (args.wait_ms > AGENT_PROC_WAIT_MAX_MS)
                return agent_send_error_errno(a, id, EINVAL, "bad argument 'wait_ms': must be 0 .. %u",
                                              AGENT_PROC_WAIT_MAX_MS), 0;
        e = proc_lookup(a, id, args.pid);
        if (!e)
                return 0;
        if (args.offset > e->ring.end)
                return agent_send_error_errno(a, id, EINVAL,
                                              "offset %" PRIu64 " is beyond the end of the output (%" PRIu64 ")",
                                              args.offset, e->ring.end), 0;

        t = a->procs;
        if (args.wait_ms == 0 || e->ring.end > args.offset || proc_done(e)) {
                proc_answer_read(a, id, a->reply_tcp, e, args.offset, args.max, false);
                proc_sweep(a);
                return 0;
        }
        if (t->n_waiters >= AGENT_PROC_MAX_WAITERS)
                return agent_send_error_errno(a, id, EAGAIN, "too many pending reads (%u)",
                                              AGENT_PROC_MAX_WAITERS), 0;
        t->waiters[t->n_waiters++] = (ProcWaiter) {
                .id = id,
                .conn_gen = a->conn_gen,
                .tcp_conn = a->reply_tcp,
                .pid = e->pid,
                .offset = args.offset,
                .max = args.max,
                .deadline_usec = now_usec() + (uint64_t) args.wait_ms * USEC_PER_MSEC,
        };
        return 0;
}

int proc_start_read(Agent *a, uint32_t id, ProcEntry *e, uint32_t max, uint32_t wait_ms) {
        ProcTable *t = a->procs;

        if (wait_ms == 0 || e->ring.end >= max || proc_done(e) || t->n_waiters >= AGENT_PROC_MAX_WAITERS) {
                /* (with every waiter taken, what there is now: the host reads on) */
                proc_answer_read(a, id, a->reply_tcp, e, 0, max, true);
                return 0;
        }
        t->waiters[t->n_waiters++] = (ProcWaiter) {
                .id = id,
                .conn_gen = a->conn_gen,
                .tcp_conn = a->reply_tcp,
                .pid = e->pid,
                .max = max,
                .deadline_usec = now_usec() + (uint64_t) wait_ms * USEC_PER_MSEC,
                .start = true,
        };
        return 0;
}

/* ---- the loop's side ---- */

bool agent_proc_reaped(Agent *a, pid_t pid, int status) {
        ProcEntry *e = proc_find(a, pid);

        if (!e || e->exited)
                return false;
        e->exited = true;
        e->status = status;
        e->exited_usec = now_usec();
        if (!e->pty)
                proc_close_stdin(e);
        e->in_open = false;
        return true;
}

size_t agent_proc_pollfds(Agent *a, struct pollfd *fds, size_t max) {
        ProcTable *t = a->procs;
        size_t n = 0;

        if (!t)
                return 0;
        max = MIN(max, (size_t) AGENT_PROC_POLL_MAX);
        for (unsigned i = 0; i < t->n; i++) {
                ProcEntry *e = t->entries[i];
                bool queued = e->inq_start < e->inq_end;

                if (e->out_fd >= 0 && n < max) {
                        t->owners[n] = e;
                        fds[n++] = (struct pollfd) {
                                .fd = e->out_fd,
                                .events = (short) (POLLIN | (e->pty && queued ? POLLOUT : 0)),
                        };
                }
                if (e->err_fd >= 0 && n < max) {
                        t->owners[n] = e;
                        fds[n++] = (struct pollfd) { .fd = e->err_fd, .events = POLLIN };
                }
                if (e->in_fd >= 0 && queued && n < max) {
                        t->owners[n] = e;
                        fds[n++] = (struct pollfd) { .fd = e->in_fd, .events = POLLOUT };
                }
        }
        t->n_owners = n;
        return n;
}

void agent_proc_io(Agent *a, const struct pollfd *fds, size_t n) {
        ProcTable *t = a->procs;

        if (!t)
                return;
        for (size_t i = 0; i < MIN(n, t->n_owners); i++) {
                ProcEntry *e = t->owners[i];
                short ev = fds[i].revents;
                int fd = fds[i].fd;

                if (!ev)
                        continue;
                if (fd == e->out_fd && (ev & POLLOUT))
                        proc_flush_stdin(e);
                if (fd == e->out_fd && (ev & (POLLIN | POLLHUP | POLLERR | POLLNVAL)))
                        proc_drain(e, fd, STREAM_STDOUT);
                else if (fd == e->err_fd)
                        proc_drain(e, fd, STREAM_STDERR);
                else if (fd == e->in_fd) {
                        if (ev & (POLLERR | POLLNVAL))
                                proc_close_stdin(e);
                        else
                                proc_flush_stdin(e);
                }
        }
        t->n_owners = 0;
}

static void proc_tick_entry(ProcEntry *e, uint64_t now) {
        if (!e->exited && e->deadline_usec > 0 && !e->timed_out && now >= e->deadline_usec) {
                e->timed_out = true;
                proc_kill(e, SIGKILL);
        }
        if (!e->exited)
                return;
        /* read what is left before judging the pipes */
        if (e->out_fd >= 0)
                proc_drain(e, e->out_fd, STREAM_STDOUT);
        if (e->err_fd >= 0)
                proc_drain(e, e->err_fd, STREAM_STDERR);
        if (now >= e->exited_usec + AGENT_PROC_DRAIN_USEC) {
                /* something it left behind holds the pipes: the process's output ends here */
                proc_close_output(e, e->out_fd);
                proc_close_output(e, e->err_fd);
        }
        if (now >= e->exited_usec + AGENT_PROC_EXPIRE_USEC)
                e->drop = true;
}

void agent_proc_tick(Agent *a, uint64_t now) {
        ProcTable *t = a->procs;
        bool busy;

        if (!t)
                return;
        for (unsigned i = 0; i < t->n; i++)
                proc_tick_entry(t->entries[i], now);

        /* long polls; answers with output wait while the channel's queue is above its mark */
        busy = a->out.end - a->out.start >= AGENT_OUTQ_HIGH;
        for (unsigned i = 0; i < t->n_waiters;) {
                ProcWaiter *w = t->waiters + i;
                ProcEntry *e = proc_find(a, w->pid);
                bool gone = w->tcp_conn == 0 && w->conn_gen != a->conn_gen;

                if (!gone && e) {
                        /* a start's read waits for the end (or max bytes): a short command's
                         * whole run in one answer */
                        bool ready = (w->start ? e->ring.end >= w->max : e->ring.end > w->offset) || proc_done(e) ||
                                     now >= w->deadline_usec;

                        if (!ready || busy) {
                                i++;
                                continue;
                        }
                        proc_answer_read(a, w->id, w->tcp_conn, e, w->offset, w->max, w->start);
                } else if (!gone) {
                        uint64_t saved = a->reply_tcp;

                        a->reply_tcp = w->tcp_conn;
                        (void) agent_send_error_errno(a, w->id, ESRCH, "no process %d in the table", w->pid);
                        a->reply_tcp = saved;
                }
                t->waiters[i] = t->waiters[--t->n_waiters];
        }
        proc_sweep(a);
}

uint64_t agent_proc_next_deadline(const Agent *a) {
        const ProcTable *t = a->procs;
        uint64_t d = UINT64_MAX;
        bool running = false;

        if (!t)
                return d;
        for (unsigned i = 0; i < t->n; i++) {
                const ProcEntry *e = t->entries[i];

                if (!e->exited) {
                        running = true;
                        if (e->deadline_usec > 0 && !e->timed_out)
                                d = MIN(d, e->deadline_usec);
                } else if (!proc_done(e))
                        d = MIN(d, e->exited_usec + AGENT_PROC_DRAIN_USEC);
                else
                        d = MIN(d, e->exited_usec + AGENT_PROC_EXPIRE_USEC);
        }
        for (unsigned i = 0; i < t->n_waiters; i++)
                d = MIN(d, t->waiters[i].deadline_usec);
        /* look now and then without a SIGCHLD: user code in the interpreter may own the handler */
        if (running)
                d = MIN(d, now_usec() + USEC_PER_SEC);
        return d;
}

void agent_proc_kill_all(Agent *a) {
        for (unsigned i = 0; a->procs && i < a->procs->n; i++)
                proc_kill(a->procs->entries[i], SIGKILL);
}
