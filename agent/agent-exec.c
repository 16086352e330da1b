/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * exec: argv runs as a child in its own session (so its own process group),
 * stdin /dev/null, stdout and stderr on pipes that the poll loop drains. At
 * the deadline the whole group gets SIGKILL. The reply is sent once the child
 * was reaped and both pipes reached end of file, or AGENT_EXEC_DRAIN_USEC
 * after the child exited when something it left behind keeps a pipe open.
 *
 * Limits: a process that calls setsid() itself leaves the group and survives
 * the timeout kill; it is not the agent's to chase (a VM is the sandbox).
 */

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include "agent-proc.h"
#include "agent-python.h"
#include "agent-spawn.h"
#include "agent.h"
#include "json-util.h"
#include "macro.h"
#include "strv.h"

extern char **environ;

typedef struct Capture {
        int fd;
        char *buf;
        size_t len, cap;
        bool truncated;
} Capture;

struct ExecJob {
        uint32_t id;
        uint64_t conn_gen;
        uint64_t tcp_conn;       /* asked on a TCP connection (agent-tcp.c); 0: on the channel */
        pid_t pid;
        bool exited;
        int status;
        Capture out, err;
        uint64_t deadline_usec;  /* kill at */
        uint64_t exited_usec;    /* when it was reaped */
        bool timed_out;
        uint64_t start_usec;
};

ExecJob *exec_job_free(ExecJob *j) {
        if (!j)
                return NULL;
        safe_close(j->out.fd);
        safe_close(j->err.fd);
        free(j->out.buf);
        free(j->err.buf);
        free(j);
        return NULL;
}

static void exec_job_freep(ExecJob **j) {
        if (*j)
                exec_job_free(*j);
}

/* ---- arguments ---- */

typedef struct ExecArgs {
        struct json_object *args;
        uint32_t timeout_secs;
        char *cwd;
        char *user;
        struct json_object *env;
} ExecArgs;

static int dispatch_ignore(struct json_object *v, void *field, const char **ret_error) {
        return 0;
}

static int dispatch_borrow(struct json_object *v, void *field, const char **ret_error) {
        *(struct json_object **) field = v;
        return 0;
}

static const struct json_dispatch exec_table[] = {
        { "op", JSON_KIND_STRING, dispatch_ignore, 0, 0, JSON_MANDATORY },
        { "args", JSON_KIND_ARRAY, NULL, offsetof(ExecArgs, args), 0, JSON_MANDATORY },
        { "timeout_secs", JSON_KIND_UINT32, NULL, offsetof(ExecArgs, timeout_secs), 0, 0 },
        { "cwd", JSON_KIND_STRING, NULL, offsetof(ExecArgs, cwd), 0, JSON_NULLABLE },
        { "user", JSON_KIND_STRING, NULL, offsetof(ExecArgs, user), 0, JSON_NULLABLE },
        { "env", JSON_KIND_OBJECT, dispatch_borrow, offsetof(ExecArgs, env), 0, JSON_NULLABLE },
        {}
};

/* The request's "env", {"NAME": "value"}: NAME=value strings. */
static int exec_env(struct json_object *env, char ***ret, const char **ret_error) {
        _cleanup_strv_free_ char **l = NULL;
        size_t n = 0;

        l = calloc((size_t) json_object_object_length(env) + 1, sizeof *l);
        if (!l)
                return -ENOMEM;
        json_object_object_foreach(env, k, v) {
                if (!k[0] || strchr(k, '=')) {
                        *ret_error = "env names must be non-empty and without '='";
                        return -EINVAL;
                }
                if (!json_object_is_type(v, json_type_string) ||
                    strlen(json_object_get_string(v)) != (size_t) json_object_get_string_len(v)) {
                        *ret_error = "env values must be strings without NUL";
                        return -EINVAL;
                }
                if (asprintf(&l[n++], "%s=%s", k, json_object_get_string(v)) < 0) {
                        l[n - 1] = NULL;
                        return -ENOMEM;
                }
        }
        *ret = TAKE_PTR(l);
        return 0;
}

/* Build argv (pointers into req, which outlives the spawn). */
static int exec_argv(struct json_object *args, const char ***ret, const char **ret_error) {
        _cleanup_free_ const char **argv = NULL;
        size_t n, total = 0;

        n = json_object_array_length(args);
        if (n < 1 || n > AGENT_EXEC_MAX_ARGS) {
                *ret_error = "args must hold 1 to 256 strings";
                return -EINVAL;
        }
        argv = calloc(n + 1, sizeof *argv);
        if (!argv)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct json_object *v = json_object_array_get_idx(args, i);
                const char *s;
                size_t l;

                if (!v || !json_object_is_type(v, json_type_string)) {
                        *ret_error = "args must be strings";
                        return -EINVAL;
                }
                s = json_object_get_string(v);
                l = (size_t) json_object_get_string_len(v);
                if (strlen(s) != l) {
                        *ret_error = "args must not contain NUL";
                        return -EINVAL;
                }
                total += l + 1;
                if (total > AGENT_EXEC_MAX_ARGS_BYTES) {
                        *ret_error = "args exceed 64 KiB";
                        return -E2BIG;
                }
                argv[i] = s;
        }
        if (argv[0][0] == 0) {
                *ret_error = "args[0] is empty";
                return -EINVAL;
        }
        *ret = TAKE_PTR(argv);
        return 0;
}

/* ---- replies ---- */

static int exit_code_of(const ExecJob *j, int *ret_signal) {
        *ret_signal = 0;
        if (j->timed_out) {
                *ret_signal = SIGKILL;
                return 124;
        }
        if (WIFEXITED(j->status))
                return WEXITSTATUS(j->status);
        if (WIFSIGNALED(j->status)) {
                *ret_signal = WTERMSIG(j->status);
                return 128 + WTERMSIG(j->status);
        }
        return 255;
}

static struct json_object *exec_reply(const ExecJob *j, size_t out_len, size_t err_len, bool truncated) {
        _cleanup_json_ struct json_object *o = NULL;
        int sig, code = exit_code_of(j, &sig);
        struct json_object *so, *se;

        o = json_object_new_object();
        so = json_string_sanitized(j->out.buf ?: "", out_len);
        se = json_string_sanitized(j->err.buf ?: "", err_len);
        if (!o || !so || !se) {
                json_object_put(so);
                json_object_put(se);
                return NULL;
        }
        json_object_object_add(o, "stdout", so);
        json_object_object_add(o, "stderr", se);
        json_object_object_add(o, "exit_code", json_object_new_int(code));
        json_object_object_add(o, "signal", sig ? json_object_new_int(sig) : NULL);
        json_object_object_add(o, "truncated", json_object_new_boolean(truncated));
        json_object_object_add(o, "timed_out", json_object_new_boolean(j->timed_out));
        json_object_object_add(o, "duration_ms",
                               json_object_new_int64((int64_t) ((now_usec() - j->start_usec) / 1000)));
        return TAKE_PTR(o);
}

/* Shrink the captures until the reply fits the payload limit (escaping can
 * make the JSON up to six times the raw bytes). */
static void exec_job_answer_now(Agent *a, ExecJob *j) {
        size_t out_len = j->out.len, err_len = j->err.len;
        bool truncated = j->out.truncated || j->err.truncated;

        for (unsigned attempt = 0; attempt < 16; attempt++) {
                struct json_object *o = exec_reply(j, out_len, err_len, truncated);
                size_t len;

                if (!o || !json_plain(o, &len)) {
                        json_object_put(o);
                        (void) agent_send_error(a, j->id, "out of memory");
                        return;
                }
                if (len + 64 <= AGENT_MAX_PAYLOAD) {
                        (void) agent_send_json(a, FKA_RESPONSE, j->id, o);
                        return;
                }
                json_object_put(o);

                /* cut the larger stream by the excess (each raw byte is >= 1 JSON byte) */
                size_t excess = len + 64 - AGENT_MAX_PAYLOAD + 16;
                size_t *big = out_len >= err_len ? &out_len : &err_len;
                const char *buf = big == &out_len ? j->out.buf : j->err.buf;

                *big = *big > excess ? utf8_prefix(buf, *big - excess) : 0;
                truncated = true;
        }
        (void) agent_send_error(a, j->id, "reply too large");
}

static void exec_job_answer(Agent *a, ExecJob *j) {
        uint64_t saved = a->reply_tcp;

        if (j->tcp_conn == 0 && j->conn_gen != a->conn_gen)
                return; /* asked on a connection that is gone */

        a->reply_tcp = j->tcp_conn; /* a TCP connection that is gone drops it */
        exec_job_answer_now(a, j);
        a->reply_tcp = saved;
}

/* ---- start ---- */

int agent_exec_start(Agent *a, uint32_t id, struct json_object *req) {
        _cleanup_(exec_job_freep) ExecJob *j = NULL;
        _cleanup_free_ const char **argv = NULL;
        ExecArgs args = { .timeout_secs = AGENT_TIMEOUT_DEFAULT_SECS };
        _cleanup_close_ int out_w = -EBADF, err_w = -EBADF;
        const char *field = NULL, *err = NULL;
        posix_spawn_file_actions_t fa;
        posix_spawnattr_t attr;
        int out_p[2], err_p[2];
        sigset_t all, none;
        pid_t pid;
        int r;

        r = json_dispatch_full(req, exec_table, JSON_REJECT_UNKNOWN, &args, &field, &err);
        if (r < 0) {
                free(args.cwd);
                free(args.user);
                return agent_send_error(a, id, "bad argument '%s': %s", field ?: "?", err ?: strerror(-r)), 0;
        }
        _cleanup_free_ char *cwd = args.cwd, *user = args.user, *exe = NULL;
        _cleanup_strv_free_ char **req_env = NULL, **env = NULL;
        _cleanup_(user_ids_done) UserIds uids = {};
        const UserIds *as = a->defaults.have_user ? &a->defaults.user : NULL;
        char *const *envp = a->defaults.env ?: environ;

        if (args.timeout_secs < 1 || args.timeout_secs > AGENT_TIMEOUT_MAX_SECS)
                return agent_send_error(a, id, "bad argument 'timeout_secs': must be 1 .. 3600"), 0;
        r = exec_argv(args.args, &argv, &err);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return agent_send_error(a, id, "bad argument 'args': %s", err), 0;
        if (a->n_jobs >= AGENT_EXEC_MAX_IN_FLIGHT)
                return agent_send_error(a, id, "too many exec requests in flight (limit %u)",
                                        AGENT_EXEC_MAX_IN_FLIGHT), 0;

        /* image.json's defaults (agent-defaults.c), which the request overrides */
        if (args.env) {
                r = exec_env(args.env, &req_env, &err);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return agent_send_error(a, id, "bad argument 'env': %s", err), 0;
                env = env_merge(envp, req_env);
                if (!env)
                        return -ENOMEM;
                envp = env;
        }
        if (user && user[0]) {
                r = user_resolve("/", user, &uids);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return agent_send_error(a, id, "bad argument 'user': %s",
                                                r == -ESRCH ? "no such user or group" : "not name, uid, uid:gid or name:group"), 0;
                as = &uids;
        }
        if (!cwd && a->defaults.image.working_dir) {
                cwd = strdup(a->defaults.image.working_dir);
                if (!cwd)
                        return -ENOMEM;
        }
        /* the program is looked up on the PATH it will run with */
        if (envp != environ || as) {
                r = find_in_path(argv[0], env_get(envp, "PATH"), &exe);
                if (r == -ENOMEM)
                        return r;
        }

        j = calloc(1, sizeof *j);
        if (!j)
                return -ENOMEM;
        j->out.fd = j->err.fd = -EBADF;
        j->id = id;
        j->conn_gen = a->conn_gen;
        j->tcp_conn = a->reply_tcp;

        if (pipe2(out_p, O_CLOEXEC) < 0)
                return -errno;
        j->out.fd = out_p[0];
        out_w = out_p[1];
        if (pipe2(err_p, O_CLOEXEC) < 0)
                return -errno;
        j->err.fd = err_p[0];
        err_w = err_p[1];

        if (as) {
                /* another user: posix_spawn cannot switch; the same setup by hand */
                char msg[256];
                int n;

                SpawnParams p = SPAWN_PARAMS_INIT;
                p.path = exe ?: argv[0];
                p.argv = (char *const *) argv;
                p.envp = envp;
                p.cwd = cwd;
                p.user = as;
                p.stdout_fd = out_w;
                p.stderr_fd = err_w;
                p.new_session = true;
                r = exe ? agent_spawn(&p, &pid) : -ENOENT;
                j->start_usec = now_usec();
                if (r >= 0)
                        goto started;
                n = snprintf(msg, sizeof msg, "forkd-agent: %s: %s\n", argv[0], strerror(-r));
                j->err.buf = strndup(msg, (size_t) MAX(n, 0));
                j->err.len = j->err.buf ? strlen(j->err.buf) : 0;
                j->exited = true;
                j->status = (r == -ENOENT ? 127 : 126) << 8;
                exec_job_answer(a, j);
                return 0;
        }

        r = posix_spawn_file_actions_init(&fa);
        if (r != 0)
                return -r;
        r = posix_spawnattr_init(&attr);
        if (r != 0) {
                posix_spawn_file_actions_destroy(&fa);
                return -r;
        }
        sigfillset(&all);
        sigemptyset(&none);
        r = posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
        if (r == 0)
                r = posix_spawn_file_actions_adddup2(&fa, out_w, STDOUT_FILENO);
        if (r == 0)
                r = posix_spawn_file_actions_adddup2(&fa, err_w, STDERR_FILENO);
        if (r == 0 && cwd)
                r = posix_spawn_file_actions_addchdir_np(&fa, cwd);
        if (r == 0)
                r = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK |
                                                            POSIX_SPAWN_SETSIGDEF);
        if (r == 0)
                r = posix_spawnattr_setsigmask(&attr, &none);
        if (r == 0)
                r = posix_spawnattr_setsigdefault(&attr, &all);
        if (r == 0)
                r = posix_spawnp(&pid, exe ?: argv[0], &fa, &attr, (char *const *) argv, envp);
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&attr);

        j->start_usec = now_usec();
        if (r != 0) {
                /* report like a shell would: 127 (not found) or 126 (not executable) */
                char msg[256];
                int n = snprintf(msg, sizeof msg, "forkd-agent: %s: %s\n", argv[0], strerror(r));

                j->err.buf = strndup(msg, (size_t) MAX(n, 0));
                j->err.len = j->err.buf ? strlen(j->err.buf) : 0;
                j->exited = true;
                j->status = (r == ENOENT ? 127 : 126) << 8; /* as WIFEXITED */
                exec_job_answer(a, j);
                return 0;
        }

started:
        out_w = safe_close(out_w);
        err_w = safe_close(err_w);
        (void) fcntl(j->out.fd, F_SETFL, O_NONBLOCK);
        (void) fcntl(j->err.fd, F_SETFL, O_NONBLOCK);
        j->pid = pid;
        j->deadline_usec = j->start_usec + (uint64_t) args.timeout_secs * 1000000u;
        a->jobs[a->n_jobs++] = TAKE_PTR(j);
        return 0;
}

/* ---- the loop's side ---- */

static void capture_close(Capture *c) {
        c->fd = safe_close(c->fd);
}

static void capture_read(Capture *c) {
        for (;;) {
                char discard[16384];
                ssize_t k;

                if (c->len < AGENT_EXEC_OUTPUT_CAP) {
                        if (c->len == c->cap) { /* grow as output comes: most commands print little */
                                size_t want = MIN(MAX(c->cap * 2, (size_t) 16384), (size_t) AGENT_EXEC_OUTPUT_CAP);
                                char *b = realloc(c->buf, want);

                                if (!b) {
                                        c->truncated = true;
                                        capture_close(c);
                                        return;
                                }
                                c->buf = b;
                                c->cap = want;
                        }
                        k = read(c->fd, c->buf + c->len, c->cap - c->len);
                        if (k > 0)
                                c->len += (size_t) k;
                } else {
                        k = read(c->fd, discard, sizeof discard);
                        if (k > 0)
                                c->truncated = true;
                }
                if (k > 0)
                        continue;
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0 && errno == EAGAIN)
                        return;
                capture_close(c); /* EOF or error */
                return;
        }
}

size_t agent_exec_pollfds(Agent *a, struct pollfd *fds, ExecJob **owners, size_t max) {
        size_t n = 0;

        for (unsigned i = 0; i < a->n_jobs; i++) {
                ExecJob *j = a->jobs[i];

                if (j->out.fd >= 0 && n < max) {
                        owners[n] = j;
                        fds[n++] = (struct pollfd) { .fd = j->out.fd, .events = POLLIN };
                }
                if (j->err.fd >= 0 && n < max) {
                        owners[n] = j;
                        fds[n++] = (struct pollfd) { .fd = j->err.fd, .events = POLLIN };
                }
        }
        return n;
}

void agent_exec_io(Agent *a, ExecJob *j, int fd, short revents) {
        for (unsigned i = 0; i < a->n_jobs; i++) {
                if (a->jobs[i] != j)
                        continue;
                if (fd == j->out.fd)
                        capture_read(&j->out);
                else if (fd == j->err.fd)
                        capture_read(&j->err);
                return;
        }
}

void agent_reap(Agent *a) {
        for (;;) {
                int status;
                pid_t pid = waitpid(-1, &status, WNOHANG);

                if (pid <= 0)
                        return; /* 0: none exited; ECHILD: no children */

                for (unsigned i = 0; i < a->n_jobs; i++) {
                        ExecJob *j = a->jobs[i];

                        if (j->pid != pid || j->exited)
                                continue;
                        j->exited = true;
                        j->status = status;
                        j->exited_usec = now_usec();
                        /* anything left in the group outlives its leader: fine, unless it holds our pipes */
                        break;
                }
                /* a process of the table, the image's service, the python3 child of the portable
                 * agent; else an orphan (PID 1 or subreaper), or a child of the embedded Python */
                if (!agent_proc_reaped(a, pid, status) && !agent_service_reaped(a, pid, status))
                        agent_python_reaped(pid, status);
        }
}

static void exec_job_kill(ExecJob *j) {
        if (j->pid > 0 && !j->exited) {
                (void) kill(-j->pid, SIGKILL); /* the session's group: pgid == pid after setsid */
                (void) kill(j->pid, SIGKILL);
        }
}

void agent_exec_tick(Agent *a, uint64_t now) {
        for (unsigned i = 0; i < a->n_jobs;) {
                ExecJob *j = a->jobs[i];

                if (!j->exited && !j->timed_out && now >= j->deadline_usec) {
                        j->timed_out = true;
                        exec_job_kill(j);
                }
                if (j->exited) {
                        /* read what is left before judging the pipes */
                        if (j->out.fd >= 0)
                                capture_read(&j->out);
                        if (j->err.fd >= 0)
                                capture_read(&j->err);
                        if (now >= j->exited_usec + AGENT_EXEC_DRAIN_USEC) {
                                capture_close(&j->out);
                                capture_close(&j->err);
                        }
                }
                if (j->exited && j->out.fd < 0 && j->err.fd < 0) {
                        exec_job_answer(a, j);
                        exec_job_free(j);
                        a->jobs[i] = a->jobs[--a->n_jobs];
                        continue;
                }
                i++;
        }
}

uint64_t agent_exec_next_deadline(const Agent *a) {
        uint64_t d = UINT64_MAX;

        for (unsigned i = 0; i < a->n_jobs; i++) {
                const ExecJob *j = a->jobs[i];

                if (j->exited)
                        d = MIN(d, j->exited_usec + AGENT_EXEC_DRAIN_USEC);
                else if (!j->timed_out)
                        d = MIN(d, j->deadline_usec);
        }
        return d;
}

void agent_exec_kill_all(Agent *a) {
        for (unsigned i = 0; i < a->n_jobs; i++)
                exec_job_kill(a->jobs[i]);
}
