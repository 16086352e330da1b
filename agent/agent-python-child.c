/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * eval and run_code of the portable agent: the image's own python3 as one
 * persistent child (agent-pychild.c), started before the agent says ready,
 * so that it is warm in every fork of a snapshot. The replies have the
 * shapes of the embedded interpreter's (agent-python.c).
 */

#include <errno.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>

#include "agent-pychild.h"
#include "agent-python.h"
#include "agent.h"
#include "json-util.h"
#include "macro.h"

#define NO_PYTHON "this image has no python3 (3.8 or later): run_code needs one; exec works"

static struct {
        PyChild child;
        bool have;              /* a python3 was found and spoke our bootstrap once */
        bool ready;             /* the child runs */
        char *python;           /* its path */
        char *version;
        char *numpy_version;
        const AgentDefaults *defaults;
} pc = { .child = { .to_fd = -EBADF, .from_fd = -EBADF } };

void agent_python_set_defaults(const struct AgentDefaults *d) {
        pc.defaults = d;
}

bool agent_python_ready(void) {
        return pc.have;
}

const char *agent_python_numpy_version(void) {
        return pc.numpy_version;
}

void agent_python_describe(struct json_object *o) {
        json_object_object_add(o, "python_path", pc.python ? json_object_new_string(pc.python) : NULL);
        json_object_object_add(o, "python_version", pc.version ? json_object_new_string(pc.version) : NULL);
}

void agent_python_reaped(pid_t pid, int status) {
        (void) pychild_reaped(&pc.child, pid, status);
}

static char *strdup_or_null(const char *s) {
        return s ? strdup(s) : NULL;
}

static int child_start(void) {
        const AgentDefaults *d = pc.defaults;
        extern char **environ;
        int r;

        r = pychild_start(&pc.child, pc.python, d && d->env ? d->env : environ,
                          d ? d->image.working_dir : NULL, d && d->have_user ? &d->user : NULL);
        if (r < 0)
                return r;
        pc.ready = true;
        if (!pc.version) { /* the first start that answered */
                pc.version = strdup_or_null(pc.child.version);
                pc.numpy_version = strdup_or_null(pc.child.numpy_version);
        }
        return 0;
}

int agent_python_init(void) {
        const AgentDefaults *d = pc.defaults;
        extern char **environ;
        const char *path;
        int r;

        path = env_get(d && d->env ? d->env : environ, "PATH");
        r = pychild_find(path ?: DEFAULT_PATH, &pc.python);
        if (r < 0) {
                log_info("No python3 on PATH: eval and run_code are not available.");
                return r;
        }
        r = child_start();
        if (r == -ETIMEDOUT) {
                /* Slow, not absent (a loaded host, numpy's import): the first eval or
                 * run_code starts it again rather than calling it missing for good. */
                log_warning("%s did not answer within %u s; eval and run_code start it again at their first call.",
                            pc.python, (unsigned) (PYCHILD_HELLO_USEC / USEC_PER_SEC));
                pc.have = true;
                return 0;
        }
        if (r == -EPROTONOSUPPORT) {
                log_warning("%s is older than 3.8 or cannot run the agent's bootstrap: eval and run_code are not available.",
                            pc.python);
                pc.python = mfree(pc.python);
                return r;
        }
        if (r < 0) {
                log_error_errno(r, "Failed to start %s: %m", pc.python);
                pc.python = mfree(pc.python);
                return r;
        }
        pc.have = true;
        if (!pc.numpy_version)
                log_info("numpy is not importable; continuing without it.");
        return 0;
}

void agent_python_reseed(void) {
        _cleanup_(json_object_putp) struct json_object *reply = NULL;
        int status;

        if (!pc.ready)
                return;
        if (pychild_call(&pc.child, "reseed", NULL, 5, &reply, &status) < 0) {
                log_warning("Failed to reseed Python's generators: python3 is gone.");
                pc.ready = false;
        }
}

/* ---- eval / run_code ---- */

typedef struct CodeArgs {
        char *code;
        uint32_t timeout_secs;
} CodeArgs;

static int dispatch_ignore(struct json_object *v, void *field, const char **ret_error) {
        return 0;
}

static int dispatch_code(struct json_object *v, void *field, const char **ret_error) {
        char **p = field;
        size_t n = (size_t) json_object_get_string_len(v);

        if (n > AGENT_CODE_MAX) {
                *ret_error = "code exceeds 256 KiB";
                return -E2BIG;
        }
        if (strlen(json_object_get_string(v)) != n) {
                *ret_error = "code contains NUL";
                return -EINVAL;
        }
        *p = strdup(json_object_get_string(v));
        return *p ? 0 : -ENOMEM;
}

static const struct json_dispatch code_table[] = {
        { "op", JSON_KIND_STRING, dispatch_ignore, 0, 0, JSON_MANDATORY },
        { "code", JSON_KIND_STRING, dispatch_code, offsetof(CodeArgs, code), 0, JSON_MANDATORY },
        { "timeout_secs", JSON_KIND_UINT32, NULL, offsetof(CodeArgs, timeout_secs), 0, 0 },
        {}
};

static void describe_status(int status, char *buf, size_t size) {
        if (status == -1)
                (void) snprintf(buf, size, "it exited");
        else if (WIFSIGNALED(status))
                (void) snprintf(buf, size, "killed by signal %d", WTERMSIG(status));
        else
                (void) snprintf(buf, size, "it exited with status %d", WEXITSTATUS(status));
}

static const char *get_str(struct json_object *o, const char *key, size_t *ret_len) {
        struct json_object *v;

        *ret_len = 0;
        if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
                return NULL;
        *ret_len = (size_t) json_object_get_string_len(v);
        return json_object_get_string(v);
}

static bool get_bool(struct json_object *o, const char *key) {
        struct json_object *v;

        return json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_boolean) &&
               json_object_get_boolean(v);
}

static struct json_object *str_or_null(const char *s, size_t n) {
        return s ? json_string_sanitized(s, n) : NULL;
}

/* The child's reply, as the embedded agent shapes it: the same keys, trimmed to the payload limit */
static int reply_from_child(Agent *a, uint32_t id, struct json_object *c, bool is_eval, bool restarted) {
        const char *src[3], *error;
        size_t lens[3], error_len;
        struct json_object *v;
        bool truncated;
        int exit_code = 1;

        src[0] = get_str(c, "stdout", &lens[0]);
        src[1] = get_str(c, "stderr", &lens[1]);
        src[2] = get_str(c, "result", &lens[2]);
        error = get_str(c, "error", &error_len);
        if (json_object_object_get_ex(c, "exit_code", &v) && json_object_is_type(v, json_type_int))
                exit_code = json_object_get_int(v);
        truncated = get_bool(c, "truncated");
        if (error_len > 4096)
                error_len = utf8_prefix(error, 4096);

        for (unsigned attempt = 0; attempt < 16; attempt++) {
                struct json_object *j = json_object_new_object();
                size_t len, excess, big = 0;

                if (!j)
                        return -ENOMEM;
                if (is_eval)
                        json_object_object_add(j, "result", str_or_null(src[2], lens[2]));
                json_object_object_add(j, "error", str_or_null(error, error_len));
                json_object_object_add(j, "exit_code", json_object_new_int(exit_code));
                json_object_object_add(j, "stdout", json_string_sanitized(src[0] ?: "", lens[0]));
                json_object_object_add(j, "stderr", json_string_sanitized(src[1] ?: "", lens[1]));
                json_object_object_add(j, "truncated", json_object_new_boolean(truncated));
                json_object_object_add(j, "timed_out", json_object_new_boolean(get_bool(c, "timed_out")));
                if (restarted)
                        json_object_object_add(j, "python_restarted", json_object_new_boolean(true));
                if (!json_plain(j, &len)) {
                        json_object_put(j);
                        return -ENOMEM;
                }
                if (len + 64 <= AGENT_MAX_PAYLOAD)
                        return agent_send_json(a, FKA_RESPONSE, id, j);
                json_object_put(j);

                excess = len + 64 - AGENT_MAX_PAYLOAD + 16;
                for (unsigned k = 1; k < 3; k++)
                        if (lens[k] > lens[big])
                                big = k;
                lens[big] = lens[big] > excess ? utf8_prefix(src[big], lens[big] - excess) : 0;
                truncated = true;
        }
        return agent_send_error(a, id, "reply too large"), 0;
}

/* The call ran past its timeout and python3 did not give up: it was killed */
static int reply_killed_at_timeout(Agent *a, uint32_t id, bool is_eval, unsigned timeout_secs) {
        _cleanup_(json_object_putp) struct json_object *c = json_object_new_object();
        char error[128], err[512];

        if (!c)
                return -ENOMEM;
        (void) snprintf(error, sizeof error, "TimeoutError: code ran longer than %u s", timeout_secs);
        (void) snprintf(err, sizeof err,
                        "%s\npython3 did not stop and was killed: the next call starts a new one, "
                        "without the globals of earlier calls\n", error);
        json_object_object_add(c, "error", json_object_new_string(error));
        json_object_object_add(c, "stderr", json_object_new_string(err));
        json_object_object_add(c, "exit_code", json_object_new_int(124));
        json_object_object_add(c, "timed_out", json_object_new_boolean(true));
        return reply_from_child(a, id, c, is_eval, false);
}

static int py_op(Agent *a, uint32_t id, struct json_object *req, const char *op) {
        _cleanup_(json_object_putp) struct json_object *reply = NULL;
        CodeArgs args = { .timeout_secs = AGENT_TIMEOUT_DEFAULT_SECS };
        const char *field = NULL, *err = NULL;
        bool is_eval = !streq(op, "run_code"), restarted = false;
        char why[64];
        int r, status;

        r = json_dispatch_full(req, code_table, JSON_REJECT_UNKNOWN, &args, &field, &err);
        _cleanup_free_ char *code = args.code;
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return agent_send_error(a, id, "bad argument '%s': %s", field ?: "?", err ?: strerror(-r)), 0;
        if (args.timeout_secs < 1 || args.timeout_secs > AGENT_TIMEOUT_MAX_SECS)
                return agent_send_error(a, id, "bad argument 'timeout_secs': must be 1 .. 3600"), 0;
        if (!pc.have)
                return agent_send_error(a, id, NO_PYTHON), 0;

        if (!pc.ready) {
                restarted = pc.version != NULL; /* a first start that ran out of time lost nothing */
                r = child_start();
                if (r < 0)
                        return agent_send_error(a, id, "failed to start %s again: %s", pc.python, strerror(-r)), 0;
        }

        r = pychild_call(&pc.child, op, code, args.timeout_secs, &reply, &status);
        if (r == -ENOMEM)
                return r;
        if (r == -ETIMEDOUT) {
                pc.ready = false;
                return reply_killed_at_timeout(a, id, is_eval, args.timeout_secs);
        }
        if (r < 0) {
                pc.ready = false;
                describe_status(status, why, sizeof why);
                return agent_send_error(a, id,
                                        "python3 is gone (%s): the next call starts a new one, "
                                        "without the globals of earlier calls", why), 0;
        }
        return reply_from_child(a, id, reply, is_eval, restarted);
}

int agent_op_eval(Agent *a, uint32_t id, struct json_object *req) {
        return py_op(a, id, req, "eval");
}

int agent_op_eval_fresh(Agent *a, uint32_t id, struct json_object *req) {
        return py_op(a, id, req, "eval_fresh");
}

int agent_op_run_code(Agent *a, uint32_t id, struct json_object *req) {
        return py_op(a, id, req, "run_code");
}
