/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * proc_start (agent-proc.h): the arguments checked, the program looked up on
 * the PATH it runs with, pipes or a pty, then agent_spawn() (as exec does for
 * another user) in a session of its own.
 */

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "agent-proc-internal.h"
#include "agent-spawn.h"
#include "agent.h"
#include "macro.h"
#include "strv.h"

extern char **environ;

typedef struct ProcStartArgs {
        struct json_object *args;
        char *cmd;
        char *cwd;
        struct json_object *env;
        char *user;
        struct json_object *pty;
        struct json_object *read;
        uint32_t timeout_secs;
        bool stdin;
} ProcStartArgs;

/* proc_start's "read": {"max", "wait_ms"}, as proc_read takes them. */
typedef struct ProcStartRead {
        uint32_t max;
        uint32_t wait_ms;
} ProcStartRead;

static int proc_start_read_args(struct json_object *o, ProcStartRead *ret, const char **ret_error) {
        static const struct json_dispatch table[] = {
                { "max", JSON_KIND_UINT32, NULL, offsetof(ProcStartRead, max), 0, 0 },
                { "wait_ms", JSON_KIND_UINT32, NULL, offsetof(ProcStartRead, wait_ms), 0, 0 },
                {}
        };
        const char *field = NULL;

        *ret = (ProcStartRead) { .max = AGENT_PROC_READ_DEFAULT };
        if (json_dispatch_full(o, table, JSON_REJECT_UNKNOWN, ret, &field, ret_error) < 0 || ret->max < 1 ||
            ret->max > AGENT_PROC_READ_MAX || ret->wait_ms > AGENT_PROC_WAIT_MAX_MS) {
                *ret_error = "must be {\"max\": 1 .. 262144, \"wait_ms\": 0 .. 60000}";
                return -EINVAL;
        }
        return 0;
}

static void proc_start_args_done(ProcStartArgs *p) {
        free(p->cmd);
        free(p->cwd);
        free(p->user);
}

/* A copy of the request's argv ("args", or "cmd" run by /bin/sh -c). */
static int proc_argv(const ProcStartArgs *p, char ***ret, const char **ret_field, const char **ret_error) {
        _cleanup_strv_free_ char **argv = NULL;
        size_t n, total = 0;

        if (!!p->args == !!p->cmd) {
                *ret_field = p->args ? "cmd" : "args";
                *ret_error = "exactly one of 'args' and 'cmd' is needed";
                return -EINVAL;
        }
        *ret_field = p->args ? "args" : "cmd";
        if (p->cmd) {
                if (strlen(p->cmd) + sizeof "/bin/sh" + sizeof "-c" + 1 > AGENT_PROC_MAX_ARGS_BYTES) {
                        *ret_error = "more than 128 KiB";
                        return -E2BIG;
                }
                argv = calloc(4, sizeof *argv);
                if (!argv)
                        return -ENOMEM;
                argv[0] = strdup("/bin/sh");
                argv[1] = strdup("-c");
                argv[2] = strdup(p->cmd);
                if (!argv[0] || !argv[1] || !argv[2])
                        return -ENOMEM;
                *ret = TAKE_PTR(argv);
                return 0;
        }

        n = json_object_array_length(p->args);
        if (n < 1) {
                *ret_error = "must hold at least one string";
                return -EINVAL;
        }
        if (n > AGENT_PROC_MAX_ARGS) {
                *ret_error = "more than 4096 strings";
                return -E2BIG;
        }
        argv = calloc(n + 1, sizeof *argv);
        if (!argv)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct json_object *v = json_object_array_get_idx(p->args, i);
                size_t l;

                if (!v || !json_object_is_type(v, json_type_string)) {
                        *ret_error = "must hold strings";
                        return -EINVAL;
                }
                l = (size_t) json_object_get_string_len(v);
                if (strlen(json_object_get_string(v)) != l) {
                        *ret_error = "must not contain NUL";
                        return -EINVAL;
                }
                total += l + 1;
                if (total > AGENT_PROC_MAX_ARGS_BYTES) {
                        *ret_error = "more than 128 KiB";
                        return -E2BIG;
                }
                argv[i] = strdup(json_object_get_string(v));
                if (!argv[i])
                        return -ENOMEM;
        }
        if (!argv[0][0]) {
                *ret_error = "args[0] is empty";
                return -EINVAL;
        }
        *ret = TAKE_PTR(argv);
        return 0;
}

/* The request's "env", {"NAME": "value"}: NAME=value strings. */
static int proc_env(struct json_object *env, char ***ret, const char **ret_error) {
        _cleanup_strv_free_ char **l = NULL;
        size_t n = 0, total = 0;

        if ((size_t) json_object_object_length(env) > AGENT_PROC_MAX_ENV) {
                *ret_error = "more than 1024 entries";
                return -E2BIG;
        }
        l = calloc((size_t) json_object_object_length(env) + 1, sizeof *l);
        if (!l)
                return -ENOMEM;
        json_object_object_foreach(env, k, v) {
                if (!k[0] || strchr(k, '=')) {
                        *ret_error = "names must be non-empty and without '=' or NUL";
                        return -EINVAL;
                }
                if (!json_object_is_type(v, json_type_string) ||
                    strlen(json_object_get_string(v)) != (size_t) json_object_get_string_len(v)) {
                        *ret_error = "values must be strings without NUL";
                        return -EINVAL;
                }
                total += strlen(k) + (size_t) json_object_get_string_len(v) + 2;
                if (total > AGENT_PROC_MAX_ENV_BYTES) {
                        *ret_error = "more than 128 KiB";
                        return -E2BIG;
                }
                if (asprintf(&l[n++], "%s=%s", k, json_object_get_string(v)) < 0) {
                        l[n - 1] = NULL;
                        return -ENOMEM;
                }
        }
        *ret = TAKE_PTR(l);
        return 0;
}

typedef struct PtySize {
        uint32_t cols, rows;
} PtySize;

static int proc_pty_size(struct json_object *pty, PtySize *ret, const char **ret_error) {
        static const struct json_dispatch table[] = {
                { "cols", JSON_KIND_UINT32, NULL, offsetof(PtySize, cols), 0, JSON_MANDATORY },
                { "rows", JSON_KIND_UINT32, NULL, offsetof(PtySize, rows), 0, JSON_MANDATORY },
                {}
        };
        const char *field = NULL;
        int r;

        r = json_dispatch_full(pty, table, JSON_REJECT_UNKNOWN, ret, &field, ret_error);
        if (r < 0) {
                if (!*ret_error || (field && r == -EADDRNOTAVAIL))
                        *ret_error = "must be {\"cols\": 1 .. 1000, \"rows\": 1 .. 1000}";
                return -EINVAL;
        }
        if (ret->cols < 1 || ret->cols > AGENT_PROC_PTY_MAX || ret->rows < 1 || ret->rows > AGENT_PROC_PTY_MAX) {
                *ret_error = "cols and rows must be 1 .. 1000";
                return -EINVAL;
        }
        return 0;
}

static int proc_open_pty(const PtySize *size, int *ret_master, int *ret_slave) {
        _cleanup_close_ int m = -EBADF, s = -EBADF;
        struct winsize ws = { .ws_col = (unsigned short) size->cols, .ws_row = (unsigned short) size->rows };
        char name[64];
        int r;

        m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (m < 0)
                return -errno;
        if (grantpt(m) < 0 || unlockpt(m) < 0)
                return -errno;
        r = ptsname_r(m, name, sizeof name);
        if (r != 0)
                return -r;
        s = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (s < 0)
                return -errno;
        if (ioctl(m, TIOCSWINSZ, &ws) < 0)
                return -errno;
        *ret_master = TAKE_FD(m);
        *ret_slave = TAKE_FD(s);
        return 0;
}

/* Refuse with the errno, naming the field. */
#define REFUSE(err, field, ...) \
        return agent_send_error_errno(a, id, (err), "bad argument '%s': %s", (field), __VA_ARGS__), 0

int agent_op_proc_start(Agent *a, uint32_t id, struct json_object *req) {
        static const struct json_dispatch table[] = {
                PROC_OP_FIELD,
                { "args", JSON_KIND_ARRAY, NULL, offsetof(ProcStartArgs, args), 0, 0 },
                { "cmd", JSON_KIND_STRING, NULL, offsetof(ProcStartArgs, cmd), 0, 0 },
                { "cwd", JSON_KIND_STRING, NULL, offsetof(ProcStartArgs, cwd), 0, JSON_NULLABLE },
                { "env", JSON_KIND_OBJECT, proc_dispatch_borrow, offsetof(ProcStartArgs, env), 0, JSON_NULLABLE },
                { "user", JSON_KIND_STRING, NULL, offsetof(ProcStartArgs, user), 0, JSON_NULLABLE },
                { "pty", JSON_KIND_OBJECT, proc_dispatch_borrow, offsetof(ProcStartArgs, pty), 0, JSON_NULLABLE },
                { "read", JSON_KIND_OBJECT, proc_dispatch_borrow, offsetof(ProcStartArgs, read), 0, JSON_NULLABLE },
                { "timeout_secs", JSON_KIND_UINT32, NULL, offsetof(ProcStartArgs, timeout_secs), 0, 0 },
                { "stdin", JSON_KIND_BOOL, NULL, offsetof(ProcStartArgs, stdin), 0, 0 },
                {}
        };
        _cleanup_(proc_start_args_done) ProcStartArgs args = { .stdin = true };
        _cleanup_strv_free_ char **argv = NULL, **req_env = NULL, **env = NULL;
        _cleanup_(proc_entry_freep) ProcEntry *e = NULL;
        _cleanup_close_ int child_in = -EBADF, child_out = -EBADF, child_err = -EBADF;
        _cleanup_(user_ids_done) UserIds uids = {};
        _cleanup_free_ char *exe = NULL, *cwd = NULL;
        const UserIds *as = a->defaults.have_user ? &a->defaults.user : NULL;
        char *const *envp = a->defaults.env ?: environ;
        const char *field = NULL, *err = NULL;
        ProcStartRead rd = {};
        PtySize size = {};
        struct timespec ts;
        ProcTable *t;
        pid_t pid;
        int r;

        r = proc_dispatch(a, id, req, table, &args);
        if (r <= 0)
                return r;
        r = proc_argv(&args, &argv, &field, &err);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                REFUSE(-r, field, err);
        if (args.timeout_secs > AGENT_PROC_TIMEOUT_MAX_SECS)
                REFUSE(EINVAL, "timeout_secs", "must be 0 .. 86400");
        if (args.pty && proc_pty_size(args.pty, &size, &err) < 0)
                REFUSE(EINVAL, "pty", err);
        if (args.read && proc_start_read_args(args.read, &rd, &err) < 0)
                REFUSE(EINVAL, "read", err);
        if (args.env) {
                r = proc_env(args.env, &req_env, &err);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        REFUSE(-r, "env", err);
                env = env_merge(envp, req_env);
                if (!env)
                        return -ENOMEM;
                envp = env;
        }
        if (args.user && args.user[0]) {
                r = user_resolve("/", args.user, &uids);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        REFUSE(EINVAL, "user", r == -ESRCH ? "no such user or group" : "not name, uid, uid:gid or name:group");
                as = &uids;
        }
        t = proc_table(a);
        if (!t)
                return -ENOMEM;
        if (t->n >= AGENT_PROC_MAX && !proc_table_evict_read(t))
                return agent_send_error_errno(a, id, EAGAIN, "too many processes (%u)", AGENT_PROC_MAX), 0;

        cwd = args.cwd ? strdup(args.cwd) : a->defaults.image.working_dir ? strdup(a->defaults.image.working_dir)
                                                                         : getcwd(NULL, 0);
        if (!cwd)
                return -ENOMEM;
        /* the program is looked up on the PATH it will run with */
        r = find_in_path(argv[0], env_get(envp, "PATH"), &exe);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return agent_send_error_errno(a, id, -r, "%s: %s", argv[0], strerror(-r)), 0;

        e = calloc(1, sizeof *e);
        if (!e)
                return -ENOMEM;
        e->out_fd = e->err_fd = e->in_fd = -EBADF;
        e->pty = args.pty;
        e->cols = size.cols;
        e->rows = size.rows;

        if (e->pty) {
                r = proc_open_pty(&size, &e->out_fd, &child_out);
                if (r < 0)
                        return agent_send_error_errno(a, id, -r, "cannot open a pty: %s", strerror(-r)), 0;
        } else {
                int p[2];

                if (pipe2(p, O_CLOEXEC) < 0)
                        return agent_send_error_errno(a, id, errno, "cannot make a pipe: %m"), 0;
                e->out_fd = p[0];
                child_out = p[1];
                if (pipe2(p, O_CLOEXEC) < 0)
                        return agent_send_error_errno(a, id, errno, "cannot make a pipe: %m"), 0;
                e->err_fd = p[0];
                child_err = p[1];
                if (args.stdin) {
                        if (pipe2(p, O_CLOEXEC) < 0)
                                return agent_send_error_errno(a, id, errno, "cannot make a pipe: %m"), 0;
                        child_in = p[0];
                        e->in_fd = p[1];
                }
        }

        SpawnParams p = SPAWN_PARAMS_INIT;
        p.path = exe;
        p.argv = argv;
        p.envp = envp;
        p.cwd = cwd;
        p.user = as;
        p.stdin_fd = e->pty ? child_out : child_in;
        p.stdout_fd = child_out;
        p.stderr_fd = e->pty ? child_out : child_err;
        p.new_session = true;
        p.controlling_tty = e->pty;
        r = agent_spawn(&p, &pid);
        if (r < 0)
                return agent_send_error_errno(a, id, -r, "%s: %s", argv[0], strerror(-r)), 0;

        child_in = safe_close(child_in);
        child_out = safe_close(child_out);
        child_err = safe_close(child_err);
        (void) fcntl(e->out_fd, F_SETFL, O_NONBLOCK);
        if (e->err_fd >= 0)
                (void) fcntl(e->err_fd, F_SETFL, O_NONBLOCK);
        if (e->in_fd >= 0)
                (void) fcntl(e->in_fd, F_SETFL, O_NONBLOCK);
        e->in_open = e->pty || e->in_fd >= 0;
        e->pid = pid;
        e->argv = TAKE_PTR(argv);
        e->cwd = TAKE_PTR(cwd);
        (void) clock_gettime(CLOCK_REALTIME, &ts);
        e->started_ns = (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
        if (args.timeout_secs > 0)
                e->deadline_usec = now_usec() + (uint64_t) args.timeout_secs * USEC_PER_SEC;
        t->entries[t->n++] = TAKE_PTR(e);
        if (args.read) /* the start's answer carries its first read (docs/agent-protocol.md) */
                return proc_start_read(a, id, t->entries[t->n - 1], rd.max, rd.wait_ms);

        struct json_object *o = json_object_new_object();
        if (!o)
                return -ENOMEM;
        json_object_object_add(o, "pid", json_object_new_int(pid));
        return agent_send_json(a, FKA_RESPONSE, id, o);
}
