/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * forkd's JSON-line agent protocol, served on TCP beside the framed channel
 * (agent-tcp.h). Each connection carries one request: a line is read (at
 * most AGENT_TCP_MAX_LINE bytes, or what came before end of stream), parsed
 * strictly, mapped onto an op of the agent's own (ping, exec, or eval in a
 * fresh namespace as forkd's agent does it), and the answer goes back as one
 * line, after which the agent half-closes, reads and discards what the
 * client still sends for a moment (so that the close does not turn into a
 * reset that eats the reply), and closes.
 *
 * exec is asynchronous as on the framed channel; eval blocks the loop as it
 * does there. Connections past AGENT_TCP_MAX_CONNECTIONS wait in the listen
 * backlog; a connection that does not finish its request, or does not take
 * its reply, within AGENT_TCP_IO_TIMEOUT_USEC is closed.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <sys/socket.h>

#include "agent-python.h"
#include "agent-tcp.h"
#include "agent.h"
#include "json-util.h"
#include "macro.h"

#define TCP_READ_CHUNK (64u * 1024u)
#define TCP_REQUEST_ID 1u /* every request of a connection has this id; the connection routes the reply */

typedef enum TcpState {
        TCP_READING,    /* the request line is coming in */
        TCP_BUSY,       /* an op runs (exec) */
        TCP_WRITING,    /* the reply goes out */
        TCP_LINGERING,  /* reply sent and write side shut: discard input until EOF */
} TcpState;

typedef enum TcpAction {
        TCP_ACTION_NONE,
        TCP_ACTION_PING,
        TCP_ACTION_EXEC,
        TCP_ACTION_EVAL,
} TcpAction;

typedef struct TcpConn {
        uint64_t serial;        /* never reused: an exec answer for a closed connection finds none */
        int fd;
        TcpState state;
        TcpAction action;
        char *in;
        size_t in_len, in_cap;
        char *out;
        size_t out_len, out_done;
        uint64_t deadline_usec; /* UINT64_MAX: none */
} TcpConn;

struct AgentTcp {
        int listen_fd;
        uint64_t next_serial;
        TcpConn *conns[AGENT_TCP_MAX_CONNECTIONS];
        unsigned n_conns;
};

static TcpConn *tcp_conn_free(TcpConn *c) {
        if (!c)
                return NULL;
        safe_close(c->fd);
        free(c->in);
        free(c->out);
        free(c);
        return NULL;
}

AgentTcp *agent_tcp_free(AgentTcp *t) {
        if (!t)
                return NULL;
        for (unsigned i = 0; i < t->n_conns; i++)
                tcp_conn_free(t->conns[i]);
        safe_close(t->listen_fd);
        free(t);
        return NULL;
}

static void agent_tcp_freep(AgentTcp **t) {
        if (*t)
                (void) agent_tcp_free(*t);
}

static TcpConn *tcp_find(AgentTcp *t, uint64_t serial) {
        for (unsigned i = 0; i < t->n_conns; i++)
                if (t->conns[i]->serial == serial)
                        return t->conns[i];
        return NULL;
}

static void tcp_close(AgentTcp *t, uint64_t serial) {
        for (unsigned i = 0; i < t->n_conns; i++)
                if (t->conns[i]->serial == serial) {
                        tcp_conn_free(t->conns[i]);
                        t->conns[i] = t->conns[--t->n_conns];
                        return;
                }
}

/* ---- listening ---- */

static int parse_port(const char *s, uint16_t *ret) {
        char *end;
        unsigned long v;

        if (!*s || *s == '-' || *s == '+')
                return -EINVAL;
        errno = 0;
        v = strtoul(s, &end, 10);
        if (errno != 0 || *end || v > 65535)
                return -EINVAL;
        *ret = (uint16_t) v;
        return 0;
}

static int listen_inet(const char *spec) {
        _cleanup_close_ int fd = -EBADF;
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY) };
        const char *colon = strrchr(spec, ':');
        uint16_t port;
        int one = 1, r;

        if (colon) {
                char addr[INET_ADDRSTRLEN];
                size_t l = (size_t) (colon - spec);

                if (l == 0 || l >= sizeof addr)
                        return -EINVAL;
                memcpy(addr, spec, l);
                addr[l] = 0;
                if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
                        return -EINVAL;
                spec = colon + 1;
        }
        r = parse_port(spec, &port);
        if (r < 0)
                return r;
        sa.sin_port = htons(port);

        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
                return -errno;
        if (bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0)
                return -errno;
        if (listen(fd, AGENT_TCP_BACKLOG) < 0)
                return -errno;
        return TAKE_FD(fd);
}

static int listen_inherited(const char *num) {
        int fd, v = 0, fl;
        socklen_t l = sizeof v;
        char *end;
        long n;

        errno = 0;
        n = strtol(num, &end, 10);
        if (errno != 0 || end == num || *end || n < 3 || n > INT32_MAX)
                return -EINVAL;
        fd = (int) n;
        if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &l) < 0)
                return -errno;
        if (!v)
                return -EINVAL; /* not a listening socket */
        fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
                return -errno;
        return fd;
}

int agent_tcp_listen(Agent *a, const char *spec) {
        _cleanup_(agent_tcp_freep) AgentTcp *t = NULL;
        struct sockaddr_in sa = {};
        socklen_t l = sizeof sa;
        char addr[INET_ADDRSTRLEN] = "?";

        if (a->tcp)
                return -EBUSY;
        t = calloc(1, sizeof *t);
        if (!t)
                return -ENOMEM;
        t->listen_fd = startswith(spec, "fd:") ? listen_inherited(spec + 3) : listen_inet(spec);
        if (t->listen_fd < 0)
                return t->listen_fd;
        t->next_serial = 1;

        if (getsockname(t->listen_fd, (struct sockaddr *) &sa, &l) == 0 && sa.sin_family == AF_INET)
                (void) inet_ntop(AF_INET, &sa.sin_addr, addr, sizeof addr);
        log_info("Serving forkd's JSON-line protocol on %s:%u (compatibility mode, no authentication).", addr,
                 (unsigned) ntohs(sa.sin_port));
        a->tcp = TAKE_PTR(t);
        return 0;
}

static void tcp_accept(AgentTcp *t) {
        _cleanup_close_ int fd = -EBADF;
        TcpConn *c;

        if (t->n_conns >= AGENT_TCP_MAX_CONNECTIONS)
                return;
        fd = accept4(t->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
                if (errno != EAGAIN && errno != EINTR)
                        log_debug_errno(errno, "accept() on the TCP listener failed: %m");
                return;
        }
        c = calloc(1, sizeof *c);
        if (!c)
                return (void) log_oom();
        c->fd = TAKE_FD(fd);
        c->serial = t->next_serial++;
        c->state = TCP_READING;
        c->deadline_usec = now_usec() + AGENT_TCP_IO_TIMEOUT_USEC;
        t->conns[t->n_conns++] = c;
}

/* ---- replies ---- */

/* Queue obj (borrowed) and a newline as the connection's one reply. */
static int tcp_queue(TcpConn *c, struct json_object *obj) {
        const char *s;
        size_t len;
        char *b;

        if (c->state == TCP_WRITING || c->state == TCP_LINGERING)
                return -EALREADY;
        s = json_plain(obj, &len);
        if (!s)
                return -ENOMEM;
        b = malloc(len + 1);
        if (!b)
                return -ENOMEM;
        memcpy(b, s, len);
        b[len] = '\n';
        free(c->out);
        c->out = b;
        c->out_len = len + 1;
        c->out_done = 0;
        c->state = TCP_WRITING;
        c->deadline_usec = now_usec() + AGENT_TCP_IO_TIMEOUT_USEC;
        /* the request is done with */
        free(c->in);
        c->in = NULL;
        c->in_len = c->in_cap = 0;
        return 0;
}

/* forkd's error shape: {"error": "...", "exit_code": 1} */
static int tcp_error(TcpConn *c, const char *fmt, ...) _printf_(2, 3);
static int tcp_error(TcpConn *c, const char *fmt, ...) {
        _cleanup_json_ struct json_object *o = NULL;
        _cleanup_free_ char *msg = NULL;
        va_list ap;
        int r;

        va_start(ap, fmt);
        r = vasprintf(&msg, fmt, ap);
        va_end(ap);
        if (r < 0) {
                msg = NULL;
                return -ENOMEM;
        }
        o = json_object_new_object();
        if (!o)
                return -ENOMEM;
        if (json_object_object_add(o, "error", json_string_sanitized(msg, strlen(msg))) < 0 ||
            json_object_object_add(o, "exit_code", json_object_new_int(1)) < 0)
                return -ENOMEM;
        return tcp_queue(c, o);
}

static struct json_object *get_ref(struct json_object *o, const char *key) {
        struct json_object *v;

        if (!json_object_object_get_ex(o, key, &v) || !v)
                return NULL;
        return json_object_get(v);
}

/* The agent's eval reply, in forkd's shape: {"result": repr, "exit_code": 0},
 * or {"error": "Type: message", "traceback": ..., "exit_code": N}. What the
 * code printed is added as "stdout" (forkd's agent lets it go to its console). */
static struct json_object *eval_reply(struct json_object *payload) {
        _cleanup_json_ struct json_object *o = json_object_new_object();
        struct json_object *err;
        bool failed;

        if (!o)
                return NULL;
        failed = json_object_object_get_ex(payload, "error", &err) && err;
        if (failed) {
                json_object_object_add(o, "error", json_object_get(err));
                json_object_object_add(o, "traceback", get_ref(payload, "stderr"));
        } else
                json_object_object_add(o, "result", get_ref(payload, "result"));
        json_object_object_add(o, "exit_code", get_ref(payload, "exit_code"));
        json_object_object_add(o, "stdout", get_ref(payload, "stdout"));
        json_object_object_add(o, "timed_out", get_ref(payload, "timed_out"));
        return TAKE_PTR(o);
}

int agent_tcp_reply(Agent *a, uint64_t serial, uint16_t type, struct json_object *payload) {
        _cleanup_json_ struct json_object *o = NULL;
        struct json_object *msg;
        TcpConn *c;

        c = a->tcp ? tcp_find(a->tcp, serial) : NULL;
        if (!c || c->state != TCP_BUSY)
                return 0; /* the client went away, or was answered already: dropped */

        if (type == FKA_ERROR) {
                if (!json_object_object_get_ex(payload, "error", &msg) || !json_object_is_type(msg, json_type_string))
                        return tcp_error(c, "error");
                return tcp_error(c, "%s", json_object_get_string(msg));
        }
        if (type != FKA_RESPONSE)
                return 0;

        switch (c->action) {
        case TCP_ACTION_PING:
        case TCP_ACTION_EXEC:
                /* the agent's reply is a superset of forkd's: pong, numpy_version, pid;
                 * stdout, stderr, exit_code */
                return tcp_queue(c, payload);
        case TCP_ACTION_EVAL:
                o = eval_reply(payload);
                if (!o)
                        return tcp_error(c, "out of memory");
                return tcp_queue(c, o);
        default:
                return tcp_error(c, "internal error: a reply without a request");
        }
}

/* ---- requests ---- */

/* forkd's requests: unknown keys are ignored, as forkd's agent ignores them */

typedef struct TcpArgs {
        char action[16];
        struct json_object *args;       /* borrowed from the request */
        struct json_object *code;       /* borrowed */
        uint32_t timeout_secs;
} TcpArgs;

static int dispatch_ignore(struct json_object *v, void *field, const char **ret_error) {
        return 0;
}

static int dispatch_borrow(struct json_object *v, void *field, const char **ret_error) {
        *(struct json_object **) field = v;
        return 0;
}

static int dispatch_action(struct json_object *v, void *field, const char **ret_error) {
        /* a name too long for the buffer is an unknown action, not a type error */
        if (json_string_to_buf(v, field, JSON_FIELD_SIZE(TcpArgs, action), ret_error) == -ENAMETOOLONG)
                strcpy(field, "?");
        return 0;
}

/* "timeout": seconds, a fraction rounds up; null is forkd's "none", here the maximum */
static int dispatch_timeout(struct json_object *v, void *field, const char **ret_error) {
        uint32_t *t = field;
        double d;

        if (!v) {
                *t = AGENT_TIMEOUT_MAX_SECS;
                return 0;
        }
        if (json_object_is_type(v, json_type_int))
                d = (double) json_object_get_int64(v);
        else if (json_object_is_type(v, json_type_double))
                d = json_object_get_double(v);
        else {
                *ret_error = "expected a number of seconds";
                return -EINVAL;
        }
        if (!(d > 0) || d > AGENT_TIMEOUT_MAX_SECS) {
                *ret_error = "must be more than 0 and at most 3600 seconds";
                return -ERANGE;
        }
        *t = (uint32_t) MAX(ceil(d), 1.0);
        return 0;
}

static const struct json_dispatch action_table[] = {
        { "action", JSON_KIND_STRING, dispatch_action, offsetof(TcpArgs, action), 0, JSON_MANDATORY },
        {}
};

static const struct json_dispatch exec_table[] = {
        { "action", JSON_KIND_STRING, dispatch_ignore, 0, 0, JSON_MANDATORY },
        { "args", JSON_KIND_ARRAY, dispatch_borrow, offsetof(TcpArgs, args), 0, JSON_MANDATORY },
        { "timeout", JSON_KIND_ANY, dispatch_timeout, offsetof(TcpArgs, timeout_secs), 0, JSON_NULLABLE },
        {}
};

static const struct json_dispatch eval_table[] = {
        { "action", JSON_KIND_STRING, dispatch_ignore, 0, 0, JSON_MANDATORY },
        { "code", JSON_KIND_STRING, dispatch_borrow, offsetof(TcpArgs, code), 0, JSON_MANDATORY },
        {}
};

static const struct {
        const char *name;
        TcpAction action;
        const struct json_dispatch *table;
} actions[] = {
        { "ping", TCP_ACTION_PING, NULL },
        { "exec", TCP_ACTION_EXEC, exec_table },
        { "eval", TCP_ACTION_EVAL, eval_table },
};

/* Build the agent's own request for a forkd one. On a refusal the reply is queued and *ret stays NULL. */
static int tcp_translate(TcpConn *c, struct json_object *req, struct json_object **ret) {
        _cleanup_json_ struct json_object *op = NULL;
        TcpArgs args = { .timeout_secs = AGENT_TIMEOUT_DEFAULT_SECS };
        const char *field = NULL, *err = NULL;
        size_t i;
        int r;

        r = json_dispatch_full(req, action_table, 0, &args, &field, &err);
        if (r < 0)
                return tcp_error(c, "bad request: '%s': %s", field ?: "action", err ?: strerror(-r));
        for (i = 0; i < ELEMENTSOF(actions); i++)
                if (streq(args.action, actions[i].name))
                        break;
        if (i >= ELEMENTSOF(actions))
                return tcp_error(c, "unknown action: %s", args.action);
        c->action = actions[i].action;
        if (actions[i].table) {
                r = json_dispatch_full(req, actions[i].table, 0, &args, &field, &err);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return tcp_error(c, "bad request: '%s': %s", field ?: "?", err ?: strerror(-r));
        }

        op = json_object_new_object();
        if (!op || json_object_object_add(op, "op", json_object_new_string(actions[i].name)) < 0)
                return -ENOMEM;
        switch (c->action) {
        case TCP_ACTION_EXEC:
                /* the channel's exec checks args further (1..256 strings, 64 KiB) */
                if (json_object_object_add(op, "args", json_object_get(args.args)) < 0 ||
                    json_object_object_add(op, "timeout_secs", json_object_new_int64(args.timeout_secs)) < 0)
                        return -ENOMEM;
                break;
        case TCP_ACTION_EVAL:
                /* forkd's eval has no timeout; its client waits 35 s */
                if (json_object_object_add(op, "code", json_object_get(args.code)) < 0 ||
                    json_object_object_add(op, "timeout_secs", json_object_new_int64(AGENT_TIMEOUT_DEFAULT_SECS)) < 0)
                        return -ENOMEM;
                break;
        default:
                break;
        }
        *ret = TAKE_PTR(op);
        return 0;
}

static void tcp_request(Agent *a, TcpConn *c, const char *line, size_t len) {
        _cleanup_json_ struct json_object *req = NULL, *op = NULL;
        const char *err = NULL;
        uint64_t serial = c->serial;
        int r;

        r = json_parse_strict(line, len, AGENT_TCP_MAX_LINE, FKA_JSON_MAX_DEPTH, &req, &err);
        if (r < 0) {
                (void) tcp_error(c, "bad request: not a JSON object on one line: %s", err ?: strerror(-r));
                return;
        }
        r = tcp_translate(c, req, &op);
        if (r < 0 || !op) {
                if (r < 0)
                        (void) tcp_error(c, "%s", strerror(-r));
                return;
        }

        c->state = TCP_BUSY;
        c->deadline_usec = UINT64_MAX; /* exec has a timeout of its own */
        a->reply_tcp = serial;
        if (c->action == TCP_ACTION_EVAL) {
                r = agent_op_eval_fresh(a, TCP_REQUEST_ID, op);
                if (r < 0)
                        (void) agent_send_error(a, TCP_REQUEST_ID, "eval failed: %s", strerror(-r));
        } else
                agent_dispatch_op(a, TCP_REQUEST_ID, op);
        a->reply_tcp = 0;

        /* ping and eval answer at once, exec when its child is done */
        c = tcp_find(a->tcp, serial);
        if (c && c->state == TCP_BUSY && c->action != TCP_ACTION_EXEC)
                (void) tcp_error(c, "internal error: no reply");
}

/* Read what is there. Returns false when the connection is to be closed. */
static bool tcp_read(Agent *a, TcpConn *c) {
        for (;;) {
                size_t room, scan_from;
                char *nl;
                ssize_t k;

                if (c->in_len == c->in_cap) {
                        size_t want = MIN(MAX(c->in_cap * 2, (size_t) 4096), (size_t) AGENT_TCP_MAX_LINE + 1);
                        char *b;

                        if (want <= c->in_cap) {
                                /* full and no newline: more than a line may hold */
                                (void) tcp_error(c, "bad request: the line exceeds %u bytes", AGENT_TCP_MAX_LINE);
                                return c->state != TCP_READING;
                        }
                        b = realloc(c->in, want);
                        if (!b) {
                                log_oom();
                                return false;
                        }
                        c->in = b;
                        c->in_cap = want;
                }
                room = MIN(c->in_cap - c->in_len, (size_t) TCP_READ_CHUNK);
                k = read(c->fd, c->in + c->in_len, room);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0 && errno == EAGAIN)
                        return true;
                if (k < 0)
                        return false; /* reset: nobody to answer */
                if (k == 0) {
                        /* end of stream: the request is what came (forkd's agent does the same) */
                        if (c->in_len == 0)
                                return false;
                        tcp_request(a, c, c->in, c->in_len);
                        return c->state != TCP_READING; /* not even an error could be queued: give up */
                }
                scan_from = c->in_len;
                c->in_len += (size_t) k;
                nl = memchr(c->in + scan_from, '\n', c->in_len - scan_from);
                if (nl) {
                        /* one request per connection: anything after the newline is ignored */
                        tcp_request(a, c, c->in, (size_t) (nl - c->in));
                        return c->state != TCP_READING;
                }
        }
}

static bool tcp_write(TcpConn *c) {
        while (c->out_done < c->out_len) {
                ssize_t k = send(c->fd, c->out + c->out_done, c->out_len - c->out_done, MSG_NOSIGNAL);

                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0 && errno == EAGAIN)
                        return true;
                if (k < 0)
                        return false;
                c->out_done += (size_t) k;
        }
        /* all out: say so, and read what the client still sends until it closes */
        (void) shutdown(c->fd, SHUT_WR);
        free(c->out);
        c->out = NULL;
        c->state = TCP_LINGERING;
        c->deadline_usec = now_usec() + AGENT_TCP_LINGER_USEC;
        return true;
}

static bool tcp_discard(TcpConn *c) {
        for (;;) {
                char buf[4096];
                ssize_t k = read(c->fd, buf, sizeof buf);

                if (k > 0)
                        continue;
                if (k < 0 && errno == EINTR)
                        continue;
                return k < 0 && errno == EAGAIN;
        }
}

/* ---- loop ---- */

size_t agent_tcp_pollfds(Agent *a, struct pollfd *fds, size_t max) {
        AgentTcp *t = a->tcp;
        size_t n = 0;

        if (!t)
                return 0;
        if (t->n_conns < AGENT_TCP_MAX_CONNECTIONS && n < max)
                fds[n++] = (struct pollfd) { .fd = t->listen_fd, .events = POLLIN };
        for (unsigned i = 0; i < t->n_conns && n < max; i++) {
                TcpConn *c = t->conns[i];
                short ev = c->state == TCP_READING || c->state == TCP_LINGERING ? POLLIN
                           : c->state == TCP_WRITING ? POLLOUT : 0;

                if (ev)
                        fds[n++] = (struct pollfd) { .fd = c->fd, .events = ev };
        }
        return n;
}

void agent_tcp_io(Agent *a, const struct pollfd *fds, size_t n) {
        AgentTcp *t = a->tcp;
        uint64_t serials[AGENT_TCP_MAX_CONNECTIONS];
        unsigned n_ready = 0;
        bool accept_ready = false;

        if (!t)
                return;
        /* note which connections are ready first: handling one may add or drop others */
        for (size_t i = 0; i < n; i++) {
                if (!fds[i].revents)
                        continue;
                if (fds[i].fd == t->listen_fd) {
                        accept_ready = true;
                        continue;
                }
                for (unsigned j = 0; j < t->n_conns; j++)
                        if (t->conns[j]->fd == fds[i].fd && n_ready < ELEMENTSOF(serials))
                                serials[n_ready++] = t->conns[j]->serial;
        }

        for (unsigned i = 0; i < n_ready; i++) {
                TcpConn *c = tcp_find(t, serials[i]);
                bool keep = true;

                if (!c)
                        continue;
                switch (c->state) {
                case TCP_READING:
                        keep = tcp_read(a, c);
                        break;
                case TCP_WRITING:
                        keep = tcp_write(c);
                        break;
                case TCP_LINGERING:
                        keep = tcp_discard(c);
                        break;
                case TCP_BUSY:
                        break;
                }
                if (!keep)
                        tcp_close(t, serials[i]);
        }
        if (accept_ready)
                tcp_accept(t);
}

uint64_t agent_tcp_next_deadline(const Agent *a) {
        uint64_t d = UINT64_MAX;

        if (!a->tcp)
                return d;
        for (unsigned i = 0; i < a->tcp->n_conns; i++)
                d = MIN(d, a->tcp->conns[i]->deadline_usec);
        return d;
}

void agent_tcp_tick(Agent *a, uint64_t now) {
        AgentTcp *t = a->tcp;

        if (!t)
                return;
        for (unsigned i = 0; i < t->n_conns;) {
                TcpConn *c = t->conns[i];

                if (now < c->deadline_usec) {
                        i++;
                        continue;
                }
                if (c->state == TCP_READING &&
                    tcp_error(c, "bad request: no complete line within %u s", AGENT_TCP_IO_TIMEOUT_USEC / 1000000u) >= 0) {
                        i++;
                        continue;
                }
                /* a reply nobody takes, or the linger is over */
                tcp_conn_free(c);
                t->conns[i] = t->conns[--t->n_conns];
        }
}
