/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * Processes in a sandbox, forkd's REST API v1 (docs/rest-api.md, "Processes"):
 *
 *   POST /v1/sandboxes/:id/processes                  StartSandboxProcess   201 {"pid"}
 *   GET  /v1/sandboxes/:id/processes                  ListSandboxProcesses  200 {"processes": [...]}
 *   GET  /v1/sandboxes/:id/processes/:pid/output      ReadSandboxOutput, or with ?follow=true
 *                                                     OpenSandboxOutputStream: 200 NDJSON, chunked
 *   POST /v1/sandboxes/:id/processes/:pid/stdin       WriteSandboxStdin     200 {"written"}
 *   POST /v1/sandboxes/:id/processes/:pid/signal      SignalSandboxProcess  204
 *   POST /v1/sandboxes/:id/processes/:pid/resize      ResizeSandboxPty      204
 *   POST /v1/sandboxes/:id/exec with "stream": true   StartSandboxProcessStream: the output as with follow
 *
 * (the terminal, GET .../tty, is rest-proc-tty.c). Every argument is checked
 * here before any D-Bus call; forkd checks again. An NDJSON stream holds at
 * most one of forkd's answers or frames at a time, converted: MHD pulls
 * lines as the client reads, and only then is the next read asked for.
 */

#include <fcntl.h>
#include <inttypes.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "base64.h"
#include "forkd-bus.h"
#include "json-util.h"
#include "macro.h"
#include "proc-stream.h"
#include "rest-bus.h"
#include "rest-json-text.h"
#include "rest-reply.h"
#include "rest-routes-common.h"
#include "rest-routes-processes.h"
#include "rest-util.h"

#define PROC_ARGV_MAX 4096u
#define PROC_STRINGS_BYTES_MAX (128u * 1024u)
#define PROC_ENV_MAX 1024u
#define PROC_TIMEOUT_MAX 86400
#define PROC_STDIN_MAX (64u * 1024u)
#define PROC_PTY_MAX 1000
#define PROC_STREAM_IN_MAX (64u * 1024u)

/* ---------------- shared checks ---------------- */

int rest_proc_path(RestRequest *req, const char **ret_id, uint32_t *ret_pid) {
        const char *id, *p = rest_request_param2(req);
        uint64_t v = 0;
        int r;

        id = rest_param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        if (!p || !*p || strlen(p) > 7 || p[0] == '0')
                goto bad;
        for (const char *c = p; *c; c++) {
                if (*c < '0' || *c > '9')
                        goto bad;
                v = v * 10 + (uint64_t) (*c - '0');
        }
        if (v < 1 || v > REST_PROC_PID_MAX)
                goto bad;
        *ret_id = id;
        *ret_pid = (uint32_t) v;
        return 1;
bad:
        r = rest_reply_error(req, 400, "invalid pid");
        return MIN(r, 0);
}

int rest_proc_query_offset(RestRequest *req, uint64_t *ret) {
        const char *s = rest_request_query(req, "offset");
        uint64_t v = 0;
        int r;

        *ret = 0;
        if (!s)
                return 1;
        if (!*s || strlen(s) > 19 || (s[0] == '0' && s[1]))
                goto bad;
        for (const char *c = s; *c; c++) {
                if (*c < '0' || *c > '9')
                        goto bad;
                v = v * 10 + (uint64_t) (*c - '0');
        }
        if (v > INT64_MAX)
                goto bad;
        *ret = v;
        return 1;
bad:
        r = rest_reply_error(req, 400, "invalid offset: must be a decimal byte offset");
        return MIN(r, 0);
}

int rest_proc_reply_bus_error(RestRequest *req, const sd_bus_error *e) {
        if (e && e->name && !strcmp(e->name, FORKD_ERROR_NO_SUCH_PROCESS))
                return rest_reply_error(req, 404, "process not found");
        if (e && e->name && !strcmp(e->name, FORKD_ERROR_NO_SUCH_SANDBOX))
                return rest_reply_error(req, 404, "sandbox not found");
        return rest_reply_bus_error(req, e, 0);
}

static int on_reply_empty(RestRequest *req, sd_bus_message *reply) {
        const sd_bus_error *e = sd_bus_message_get_error(reply);

        if (e)
                return rest_proc_reply_bus_error(req, e);
        return rest_reply_no_content(req);
}

/* A JSON value of the body, borrowed (JSON_KIND_*, dispatched as it is). */
static int dispatch_borrow(struct json_object *v, void *field, const char **ret_error) {
        *(struct json_object **) field = v;
        return 0;
}

/* A string of an array or object: no NUL (the parser refuses escaped ones
 * already), valid UTF-8. */
static bool string_ok(struct json_object *v) {
        return v && json_object_is_type(v, json_type_string) &&
               utf8_is_valid_n(json_object_get_string(v), (size_t) json_object_get_string_len(v)) &&
               strlen(json_object_get_string(v)) == (size_t) json_object_get_string_len(v);
}

/* ---------------- POST /v1/sandboxes/:id/processes ---------------- */

typedef struct StartArgs {
        struct json_object *args, *cmd, *cwd, *env, *user, *pty;
        int64_t timeout_secs;
        bool stdin_open;
} StartArgs;

static const struct json_dispatch start_table[] = {
        { "args", JSON_KIND_ARRAY, dispatch_borrow, offsetof(StartArgs, args), 0, JSON_NULLABLE },
        { "cmd", JSON_KIND_STRING, dispatch_borrow, offsetof(StartArgs, cmd), 0, JSON_NULLABLE },
        { "cwd", JSON_KIND_STRING, dispatch_borrow, offsetof(StartArgs, cwd), 0, JSON_NULLABLE },
        { "env", JSON_KIND_OBJECT, dispatch_borrow, offsetof(StartArgs, env), 0, JSON_NULLABLE },
        { "user", JSON_KIND_STRING, dispatch_borrow, offsetof(StartArgs, user), 0, JSON_NULLABLE },
        { "pty", JSON_KIND_OBJECT, dispatch_borrow, offsetof(StartArgs, pty), 0, JSON_NULLABLE },
        { "timeout_secs", JSON_KIND_INT64, NULL, offsetof(StartArgs, timeout_secs), 0, 0 },
        { "stdin", JSON_KIND_BOOL, NULL, offsetof(StartArgs, stdin_open), 0, 0 },
        {}
};

/* args: 1..4096 strings, 128 KiB in all. */
static int check_args(RestRequest *req, struct json_object *args) {
        size_t n = json_object_array_length(args), bytes = 0;

        if (n == 0 || n > PROC_ARGV_MAX)
                return rest_reply_error(req, 400, "args must hold 1 to %u strings", PROC_ARGV_MAX);
        for (size_t i = 0; i < n; i++) {
                struct json_object *e = json_object_array_get_idx(args, i);

                if (!string_ok(e))
                        return rest_reply_error(req, 400, "args[%zu]: expected a string without NUL bytes", i);
                bytes += (size_t) json_object_get_string_len(e) + 1;
        }
        if (bytes > PROC_STRINGS_BYTES_MAX)
                return rest_reply_error(req, 400, "args must be at most %u bytes in all", PROC_STRINGS_BYTES_MAX);
        return 1;
}

/* env: at most 1024 strings, 128 KiB in all; no '=' in a name. */
static int check_env(RestRequest *req, struct json_object *env) {
        size_t n = 0, bytes = 0;

        json_object_object_foreach(env, k, v) {
                if (!*k || strchr(k, '='))
                        return rest_reply_error(req, 400, "env: invalid name \"%.64s\": must be non-empty, without '='",
                                                k);
                if (!string_ok(v))
                        return rest_reply_error(req, 400, "env[\"%.64s\"]: expected a string without NUL bytes", k);
                n++;
                bytes += strlen(k) + (size_t) json_object_get_string_len(v) + 2;
        }
        if (n > PROC_ENV_MAX)
                return rest_reply_error(req, 400, "env must hold at most %u variables", PROC_ENV_MAX);
        if (bytes > PROC_STRINGS_BYTES_MAX)
                return rest_reply_error(req, 400, "env must be at most %u bytes in all", PROC_STRINGS_BYTES_MAX);
        return 1;
}

/* pty: {"cols", "rows"}, 1..1000 each. */
static int pty_size(struct json_object *o, const char *key, uint32_t *ret) {
        struct json_object *v;
        int64_t x;

        if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_int))
                return -EINVAL;
        errno = 0;
        x = json_object_get_int64(v);
        if (errno != 0 || x < 1 || x > PROC_PTY_MAX)
                return -ERANGE;
        *ret = (uint32_t) x;
        return 0;
}

static int append_start_options(sd_bus_message *m, const StartArgs *a, uint32_t cols, uint32_t rows) {
        int r;

        r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0 && a->cmd)
                r = sd_bus_message_append(m, "{sv}", "cmd", "s", json_object_get_string(a->cmd));
        if (r >= 0 && a->cwd)
                r = sd_bus_message_append(m, "{sv}", "cwd", "s", json_object_get_string(a->cwd));
        if (r >= 0 && a->user)
                r = sd_bus_message_append(m, "{sv}", "user", "s", json_object_get_string(a->user));
        if (r >= 0 && a->pty)
                r = sd_bus_message_append(m, "{sv}", "pty", "(uu)", cols, rows);
        if (r >= 0 && a->timeout_secs > 0)
                r = sd_bus_message_append(m, "{sv}", "timeout_secs", "u", (uint32_t) a->timeout_secs);
        if (r >= 0)
                r = sd_bus_message_append(m, "{sv}", "stdin", "b", (int) a->stdin_open);
        if (r >= 0 && a->env) {
                r = sd_bus_message_open_container(m, 'e', "sv");
                if (r >= 0)
                        r = sd_bus_message_append_basic(m, 's', "env");
                if (r >= 0)
                        r = sd_bus_message_open_container(m, 'v', "a{ss}");
                if (r >= 0)
                        r = sd_bus_message_open_container(m, 'a', "{ss}");
                json_object_object_foreach(a->env, k, v) {
                        if (r < 0)
                                break;
                        r = sd_bus_message_append(m, "{ss}", k, json_object_get_string(v));
                }
                for (unsigned i = 0; r >= 0 && i < 3; i++)
                        r = sd_bus_message_close_container(m);
        }
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        return r;
}

static int append_argv(sd_bus_message *m, struct json_object *args) {
        int r = sd_bus_message_open_container(m, 'a', "s");

        for (size_t i = 0; r >= 0 && args && i < json_object_array_length(args); i++)
                r = sd_bus_message_append_basic(m, 's', json_object_get_string(json_object_array_get_idx(args, i)));
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        return r;
}

static int on_reply_start(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *o = NULL;
        const sd_bus_error *e = sd_bus_message_get_error(reply);
        uint32_t pid;
        int r;

        if (e)
                return rest_proc_reply_bus_error(req, e);
        r = sd_bus_message_read(reply, "u", &pid);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        o = json_object_new_object();
        if (!o || json_object_object_add(o, "pid", json_object_new_int64(pid)) < 0)
                return rest_reply_error(req, 500, "out of memory");
        return rest_reply_json(req, 201, o);
}

int rest_route_processes_start(RestRequest *req) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        StartArgs a = { .stdin_open = true };
        uint32_t cols = 0, rows = 0;
        const char *id;
        int r;

        id = rest_param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        r = rest_parse_body(req, false, start_table, &a, NULL, &o);
        if (r <= 0)
                return r;
        if (!!a.args == !!a.cmd)
                return rest_reply_error(req, 400, "exactly one of args and cmd is required");
        if (a.args && (r = check_args(req, a.args)) <= 0)
                return MIN(r, 0);
        if (a.cmd && (json_object_get_string_len(a.cmd) == 0 ||
                      (size_t) json_object_get_string_len(a.cmd) >= PROC_STRINGS_BYTES_MAX))
                return rest_reply_error(req, 400, "cmd must be 1 to %u bytes", PROC_STRINGS_BYTES_MAX - 1);
        if (a.cwd && json_object_get_string_len(a.cwd) == 0)
                return rest_reply_error(req, 400, "cwd must not be empty");
        if (a.user && json_object_get_string_len(a.user) == 0)
                return rest_reply_error(req, 400, "user must not be empty");
        if (a.env && (r = check_env(req, a.env)) <= 0)
                return MIN(r, 0);
        if (a.pty && (pty_size(a.pty, "cols", &cols) < 0 || pty_size(a.pty, "rows", &rows) < 0))
                return rest_reply_error(req, 400, "pty must be {\"cols\", \"rows\"}, each an integer 1 to %d",
                                        PROC_PTY_MAX);
        if (a.timeout_secs < 0 || a.timeout_secs > PROC_TIMEOUT_MAX)
                return rest_reply_error(req, 400, "timeout_secs must be between 0 and %d", PROC_TIMEOUT_MAX);

        r = rest_new_manager_call(req, "StartSandboxProcess", &m);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        r = sd_bus_message_append(m, "s", id);
        if (r >= 0)
                r = append_argv(m, a.args);
        if (r >= 0)
                r = append_start_options(m, &a, cols, rows);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, REST_CALL_TIMEOUT_SHORT, on_reply_start);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        return 0;
}

/* ---------------- GET /v1/sandboxes/:id/processes ---------------- */

/* forkd's entry (pid u, args as, cwd s, pty b, running b, exit_code i,
 * signal i, end_offset t, started_usec t) as the API's. */
static int process_entry_json(struct json_object *in, struct json_object **ret) {
        _cleanup_json_ struct json_object *o = json_object_new_object();
        struct json_object *v;
        bool running = false;
        int64_t code = -1, sig = 0;

        if (!o)
                return -ENOMEM;
        if (json_object_object_get_ex(in, "running", &v))
                running = json_object_get_boolean(v);
        if (json_object_object_get_ex(in, "exit_code", &v))
                code = json_object_get_int64(v);
        if (json_object_object_get_ex(in, "signal", &v))
                sig = json_object_get_int64(v);
        if (json_object_object_get_ex(in, "pid", &v) && json_object_object_add(o, "pid", json_object_get(v)) < 0)
                return -ENOMEM;
        if (json_object_object_add(o, "args", json_object_object_get_ex(in, "args", &v) ? json_object_get(v)
                                                                                        : json_object_new_array()) < 0 ||
            json_object_object_add(o, "cwd", json_object_object_get_ex(in, "cwd", &v) ? json_object_get(v)
                                                                                      : json_object_new_string("")) < 0 ||
            json_object_object_add(o, "pty", json_object_new_boolean(json_object_object_get_ex(in, "pty", &v) &&
                                                                     json_object_get_boolean(v))) < 0 ||
            json_object_object_add(o, "running", json_object_new_boolean(running)) < 0 ||
            json_object_object_add(o, "exit_code", running || code < 0 ? NULL : json_object_new_int64(code)) < 0 ||
            json_object_object_add(o, "signal", running || sig <= 0 ? NULL : json_object_new_int64(sig)) < 0 ||
            json_object_object_add(o, "end_offset", json_object_object_get_ex(in, "end_offset", &v)
                                                            ? json_object_get(v)
                                                            : json_object_new_int64(0)) < 0)
                return -ENOMEM;
        if (json_object_object_get_ex(in, "started_usec", &v) &&
            json_object_object_add(o, "started_at_unix",
                                   json_object_new_int64((int64_t) (json_object_get_uint64(v) / USEC_PER_SEC))) < 0)
                return -ENOMEM;
        *ret = TAKE_PTR(o);
        return 0;
}

static int on_reply_list(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *in = NULL, *out = NULL, *list = NULL;
        const sd_bus_error *e = sd_bus_message_get_error(reply);
        int r;

        if (e)
                return rest_proc_reply_bus_error(req, e);
        r = rest_bus_read_dict_array_json(reply, &in);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        out = json_object_new_object();
        list = json_object_new_array();
        if (!out || !list)
                return rest_reply_error(req, 500, "out of memory");
        for (size_t i = 0; i < json_object_array_length(in); i++) {
                struct json_object *p = NULL;

                if (process_entry_json(json_object_array_get_idx(in, i), &p) < 0 ||
                    json_object_array_add(list, p) < 0) {
                        json_object_put(p);
                        return rest_reply_error(req, 500, "out of memory");
                }
        }
        if (json_object_object_add(out, "processes", TAKE_PTR(list)) < 0)
                return rest_reply_error(req, 500, "out of memory");
        return rest_reply_json(req, 200, out);
}

int rest_route_processes_list(RestRequest *req) {
        const char *id = rest_param_or_reply(req, "sandbox id");

        if (!id)
                return 0;
        return rest_call_manager(req, "ListSandboxProcesses", REST_CALL_TIMEOUT_SHORT, on_reply_list, "s", id);
}

/* ---------------- stdin, signal, resize ---------------- */

typedef struct StdinArgs {
        struct json_object *data, *data_b64;
        bool eof;
} StdinArgs;

static int on_reply_stdin(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *o = NULL;
        const sd_bus_error *e = sd_bus_message_get_error(reply);
        uint32_t n;
        int r;

        if (e)
                return rest_proc_reply_bus_error(req, e);
        r = sd_bus_message_read(reply, "u", &n);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        o = json_object_new_object();
        if (!o || json_object_object_add(o, "written", json_object_new_int64(n)) < 0)
                return rest_reply_error(req, 500, "out of memory");
        return rest_reply_json(req, 200, o);
}

int rest_route_process_stdin(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "data", JSON_KIND_STRING, dispatch_borrow, offsetof(StdinArgs, data), 0, JSON_NULLABLE },
                { "data_b64", JSON_KIND_STRING, dispatch_borrow, offsetof(StdinArgs, data_b64), 0, JSON_NULLABLE },
                { "eof", JSON_KIND_BOOL, NULL, offsetof(StdinArgs, eof), 0, 0 },
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        _cleanup_free_ uint8_t *buf = NULL;
        StdinArgs a = {};
        const uint8_t *data = (const uint8_t *) "";
        size_t len = 0;
        const char *id;
        uint32_t pid;
        int r;

        r = rest_proc_path(req, &id, &pid);
        if (r <= 0)
                return r;
        r = rest_parse_body(req, false, table, &a, NULL, &o);
        if (r <= 0)
                return r;
        if (a.data && a.data_b64)
                return rest_reply_error(req, 400, "data and data_b64 are mutually exclusive");
        if (a.data) {
                data = (const uint8_t *) json_object_get_string(a.data);
                len = (size_t) json_object_get_string_len(a.data);
                if (len > PROC_STDIN_MAX)
                        return rest_reply_error(req, 400, "data must be at most %u bytes", PROC_STDIN_MAX);
        } else if (a.data_b64) {
                const char *s = json_object_get_string(a.data_b64);
                size_t n = (size_t) json_object_get_string_len(a.data_b64);

                buf = malloc(PROC_STDIN_MAX + 1);
                if (!buf)
                        return rest_reply_error(req, 500, "out of memory");
                r = base64_decode(s, n, buf, PROC_STDIN_MAX, &len);
                if (r == -EFBIG)
                        return rest_reply_error(req, 400, "data_b64 must decode to at most %u bytes", PROC_STDIN_MAX);
                if (r < 0)
                        return rest_reply_error(req, 400, "data_b64 is not valid base64");
                data = buf;
        }

        r = rest_new_manager_call(req, "WriteSandboxStdin", &m);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        r = sd_bus_message_append(m, "su", id, pid);
        if (r >= 0)
                r = sd_bus_message_append_array(m, 'y', data, len);
        if (r >= 0)
                r = sd_bus_message_append(m, "b", (int) a.eof);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, REST_CALL_TIMEOUT_SHORT, on_reply_stdin);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        return 0;
}

int rest_route_process_signal(RestRequest *req) {
        _cleanup_json_ struct json_object *o = NULL;
        struct json_object *v;
        char num[16];
        const char *id, *sig;
        uint32_t pid;
        int r;

        r = rest_proc_path(req, &id, &pid);
        if (r <= 0)
                return r;
        if (rest_request_parse_json(req, false, &o) < 0)
                return 0;
        if (!json_object_object_get_ex(o, "signal", &v))
                return rest_reply_error(req, 400, "field 'signal': missing");
        if (json_object_is_type(v, json_type_int)) {
                int64_t n = json_object_get_int64(v);

                if (n < 1 || n > 64)
                        return rest_reply_error(req, 400, "unknown signal \"%s\"", json_object_get_string(v));
                (void) snprintf(num, sizeof num, "%" PRIi64, n);
                sig = num;
        } else if (json_object_is_type(v, json_type_string)) {
                sig = json_object_get_string(v);
                if (proc_signal_from_string(sig) < 0)
                        return rest_reply_error(req, 400, "unknown signal \"%.64s\"", sig);
        } else
                return rest_reply_error(req, 400, "field 'signal': expected a name (\"SIGTERM\", \"TERM\") or a number");
        return rest_call_manager(req, "SignalSandboxProcess", REST_CALL_TIMEOUT_SHORT, on_reply_empty, "sus", id, pid,
                                 sig);
}

typedef struct ResizeArgs {
        int64_t cols, rows;
} ResizeArgs;

int rest_route_process_resize(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "cols", JSON_KIND_INT64, NULL, offsetof(ResizeArgs, cols), 0, JSON_MANDATORY },
                { "rows", JSON_KIND_INT64, NULL, offsetof(ResizeArgs, rows), 0, JSON_MANDATORY },
                {}
        };
        _cleanup_json_ struct json_object *o = NULL;
        ResizeArgs a = {};
        const char *id;
        uint32_t pid;
        int r;

        r = rest_proc_path(req, &id, &pid);
        if (r <= 0)
                return r;
        r = rest_parse_body(req, false, table, &a, NULL, &o);
        if (r <= 0)
                return r;
        if (a.cols < 1 || a.cols > PROC_PTY_MAX || a.rows < 1 || a.rows > PROC_PTY_MAX)
                return rest_reply_error(req, 400, "cols and rows must be between 1 and %d", PROC_PTY_MAX);
        return rest_call_manager(req, "ResizeSandboxPty", REST_CALL_TIMEOUT_SHORT, on_reply_empty, "suqq", id, pid,
                                 (uint16_t) a.cols, (uint16_t) a.rows);
}

/* ---------------- the output as NDJSON ---------------- */

typedef struct LineBuf {
        char *data;
        size_t len, pos, alloc;
} LineBuf;

/* One line's text s[0..n) and its newline. */
static int lines_add_text(LineBuf *b, const char *s, size_t n) {
        if (b->pos == b->len)
                b->pos = b->len = 0;
        if (b->len + n + 1 > b->alloc) {
                size_t a = MAX(b->alloc * 2, b->len + n + 1);
                char *d = realloc(b->data, a);

                if (!d)
                        return -ENOMEM;
                b->data = d;
                b->alloc = a;
        }
        memcpy(b->data + b->len, s, n);
        b->data[b->len + n] = '\n';
        b->len += n + 1;
        return 0;
}

/* One object and its newline. */
static int lines_add(LineBuf *b, struct json_object *o) {
        const char *s;
        size_t n;

        if (!o)
                return -ENOMEM;
        s = rest_json_string(o, &n);
        if (!s)
                return -ENOMEM;
        return lines_add_text(b, s, n);
}

static int add_int(struct json_object *o, const char *k, int64_t v) {
        return json_object_object_add(o, k, json_object_new_int64(v));
}

static int lines_add_chunk(LineBuf *b, const char *stream, uint64_t offset, const uint8_t *data, size_t len) {
        RestJsonText t = {};
        int r = rest_json_text_output_chunk(&t, stream, offset, data, len);

        if (r >= 0)
                r = lines_add_text(b, t.buf, t.len);
        rest_json_text_done(&t);
        return r < 0 ? -ENOMEM : 0;
}

static int lines_add_gap(LineBuf *b, uint64_t dropped, uint64_t offset) {
        _cleanup_json_ struct json_object *o = json_object_new_object();

        if (!o || add_int(o, "gap", (int64_t) dropped) < 0 || add_int(o, "offset", (int64_t) offset) < 0)
                return -ENOMEM;
        return lines_add(b, o);
}

static int lines_add_exit(LineBuf *b, int32_t exit_code, int32_t sig) {
        _cleanup_json_ struct json_object *o = json_object_new_object();

        if (!o ||
            json_object_object_add(o, "exit_code", exit_code < 0 ? NULL : json_object_new_int64(exit_code)) < 0 ||
            json_object_object_add(o, "signal", sig <= 0 ? NULL : json_object_new_int64(sig)) < 0)
                return -ENOMEM;
        return lines_add(b, o);
}

typedef struct OutputStream {
        RestServer *server;
        bool slot;                   /* holds one of REST_STREAMS_MAX */
        char id[REST_TAG_MAX + 1];
        uint32_t pid;
        uint64_t offset;             /* the next ReadSandboxOutput's */
        bool follow, reading, done, failed;
        bool exec;                   /* exec's "stream": its answer names the pid (REST_PID_HEADER) */
        bool exited;                 /* the last ReadSandboxOutput said so, with: */
        int32_t exit_code, signal;
        LineBuf out;
        /* follow: forkd's stream */
        int fd;
        sd_event_source *io;
        ProcStreamDecoder dec;
        bool dec_ready;
        uint8_t *in;
        size_t in_len, in_pos;
} OutputStream;

static void output_stream_free(void *p) {
        OutputStream *os = p;

        if (!os)
                return;
        sd_event_source_disable_unref(os->io);
        safe_close(os->fd);
        if (os->dec_ready)
                proc_stream_decoder_done(&os->dec);
        free(os->in);
        free(os->out.data);
        if (os->slot)
                rest_stream_slot_release(os->server);
        free(os);
}

static OutputStream *output_stream_new(RestRequest *req, const char *id, uint32_t pid, uint64_t offset, bool follow) {
        OutputStream *os = calloc(1, sizeof *os);

        if (!os)
                return NULL;
        os->server = rest_request_server(req);
        os->fd = -EBADF;
        (void) snprintf(os->id, sizeof os->id, "%s", id);
        os->pid = pid;
        os->offset = offset;
        os->follow = follow;
        return os;
}

static ssize_t lines_take(LineBuf *b, char *buf, size_t max) {
        size_t n = MIN(max, b->len - b->pos);

        memcpy(buf, b->data + b->pos, n);
        b->pos += n;
        return (ssize_t) n;
}

static int output_read_next(RestRequest *req);

/* Frames from forkd's stream into lines, until one is there. 1: lines, 0:
 * nothing now (the io source is armed), -1: the end, -2: a failure. */
static int follow_pump(OutputStream *os) {
        while (os->out.pos == os->out.len) {
                if (os->in_pos < os->in_len) {
                        ProcStreamFrame f;
                        size_t used = 0;
                        int r;

                        r = proc_stream_decoder_feed(&os->dec, os->in + os->in_pos, os->in_len - os->in_pos, &used,
                                                     &f);
                        os->in_pos += used;
                        if (r < 0)
                                return -2;
                        if (r == 0)
                                continue;
                        if (f.kind == PROC_STREAM_STDOUT || f.kind == PROC_STREAM_STDERR)
                                r = f.len == 0 ? 0
                                               : lines_add_chunk(&os->out,
                                                                 f.kind == PROC_STREAM_STDOUT ? "stdout" : "stderr",
                                                                 f.offset, f.data, f.len);
                        else if (f.kind == PROC_STREAM_GAP)
                                r = lines_add_gap(&os->out, f.dropped, f.offset);
                        else {
                                r = lines_add_exit(&os->out, f.exit_code, f.signal);
                                os->done = true;
                        }
                        if (r < 0)
                                return -2;
                        continue;
                }
                if (os->done)
                        return -1;
                ssize_t n = read(os->fd, os->in, PROC_STREAM_IN_MAX);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0 && errno == EAGAIN) {
                        (void) sd_event_source_set_enabled(os->io, SD_EVENT_ONESHOT);
                        return 0;
                }
                if (n <= 0)
                        return -2; /* cut before its exit frame: the sandbox went */
                os->in_pos = 0;
                os->in_len = (size_t) n;
        }
        return 1;
}

static ssize_t output_read(RestRequest *req, char *buf, size_t max) {
        OutputStream *os = rest_request_data(req);
        int r;

        if (os->out.pos < os->out.len)
                return lines_take(&os->out, buf, max);
        if (os->failed)
                return REST_STREAM_ERROR;
        if (os->follow) {
                r = follow_pump(os);
                if (r > 0)
                        return lines_take(&os->out, buf, max);
                return r == 0 ? REST_STREAM_AGAIN : r == -1 ? REST_STREAM_END : REST_STREAM_ERROR;
        }
        if (os->done)
                return REST_STREAM_END;
        if (os->reading)
                return REST_STREAM_AGAIN;
        r = output_read_next(req);
        return r < 0 ? REST_STREAM_ERROR : REST_STREAM_AGAIN;
}

static int on_stream_readable(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        rest_stream_resume(userdata);
        return 0;
}

/* A ReadSandboxOutput answer into lines. Sets done once next_offset did
 * not move. */
static int read_reply_lines(OutputStream *os, sd_bus_message *reply) {
        uint64_t next, gap;
        int exited, code, sig, r;

        /* the gap first: it comes before the chunks it explains */
        r = sd_bus_message_skip(reply, "a(stay)");
        if (r >= 0)
                r = sd_bus_message_read(reply, "ttbii", &next, &gap, &exited, &code, &sig);
        if (r >= 0)
                r = sd_bus_message_rewind(reply, true);
        if (r >= 0 && gap > 0)
                r = lines_add_gap(&os->out, gap, os->offset + gap);
        if (r >= 0)
                r = sd_bus_message_enter_container(reply, 'a', "(stay)");
        if (r < 0)
                return r;
        while ((r = sd_bus_message_enter_container(reply, 'r', "stay")) > 0) {
                const char *stream;
                uint64_t offset;
                const void *data;
                size_t len;

                r = sd_bus_message_read(reply, "st", &stream, &offset);
                if (r >= 0)
                        r = sd_bus_message_read_array(reply, 'y', &data, &len);
                if (r >= 0)
                        r = sd_bus_message_exit_container(reply);
                if (r < 0)
                        return r;
                if (strcmp(stream, "stdout") && strcmp(stream, "stderr"))
                        return -EBADMSG;
                if (len > 0 && (r = lines_add_chunk(&os->out, stream, offset, data, len)) < 0)
                        return r;
        }
        if (r < 0)
                return r;
        os->exited = exited;
        os->exit_code = code;
        os->signal = sig;
        /* The end: a read that gave nothing new. An exited process's read
         * that gave bytes is not: an agent may answer fewer than max (its
         * payload limit, its own cap), so only the next read can tell. */
        if (next == os->offset && gap == 0) {
                os->done = true;
                if (exited)
                        r = lines_add_exit(&os->out, code, sig);
        }
        os->offset = next;
        return r;
}

static int on_reply_read_more(RestRequest *req, sd_bus_message *reply) {
        OutputStream *os = rest_request_data(req);

        os->reading = false;
        if (os->exited && sd_bus_message_is_method_error(reply, FORKD_ERROR_NO_SUCH_PROCESS)) {
                /* the last read returned its end, and the guest let it go since */
                os->done = true;
                if (lines_add_exit(&os->out, os->exit_code, os->signal) < 0)
                        os->failed = true;
        } else if (sd_bus_message_is_method_error(reply, NULL) || read_reply_lines(os, reply) < 0)
                os->failed = true; /* the client sees the body cut */
        rest_stream_resume(req);
        return 0;
}

static int read_call(RestRequest *req, rest_reply_func cb) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        OutputStream *os = rest_request_data(req);
        int r;

        r = rest_new_manager_call(req, "ReadSandboxOutput", &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "sutu", os->id, os->pid, os->offset, (uint32_t) REST_PROC_READ_MAX);
        if (r >= 0)
                r = rest_call_detached(req, m, REST_CALL_TIMEOUT_SHORT, cb);
        if (r >= 0)
                os->reading = true;
        return r;
}

static int output_read_next(RestRequest *req) {
        return read_call(req, on_reply_read_more);
}

static int start_ndjson(RestRequest *req) {
        OutputStream *os = rest_request_data(req);
        char pid[16];
        int r;

        snprintf(pid, sizeof(pid), "%" PRIu32, os->pid);
        r = rest_reply_stream(req, 200, "application/x-ndjson", os->exec ? REST_PID_HEADER : NULL, pid, output_read);

        if (r < 0)
                return rest_reply_error(req, 500, "cannot stream the output: %s", strerror(-r));
        return 0;
}

static int on_reply_read_first(RestRequest *req, sd_bus_message *reply) {
        OutputStream *os = rest_request_data(req);
        const sd_bus_error *e = sd_bus_message_get_error(reply);
        int r;

        os->reading = false;
        if (e)
                return rest_proc_reply_bus_error(req, e);
        r = read_reply_lines(os, reply);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        return start_ndjson(req);
}

/* The reply's fd (next in it): the NDJSON answer begins. */
static int stream_begin(RestRequest *req, sd_bus_message *reply) {
        OutputStream *os = rest_request_data(req);
        int r;

        r = rest_proc_take_stream(req, reply, &os->fd);
        if (r <= 0)
                return r;
        os->in = malloc(PROC_STREAM_IN_MAX);
        if (!os->in || proc_stream_decoder_init(&os->dec) < 0)
                return rest_reply_error(req, 500, "out of memory");
        os->dec_ready = true;
        r = sd_event_add_io(sd_bus_get_event(sd_bus_message_get_bus(reply)), &os->io, os->fd, EPOLLIN,
                            on_stream_readable, req);
        if (r >= 0)
                r = sd_event_source_set_enabled(os->io, SD_EVENT_OFF);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot watch the output stream: %s", strerror(-r));
        return start_ndjson(req);
}

static int on_reply_open_stream(RestRequest *req, sd_bus_message *reply) {
        return stream_begin(req, reply);
}

static int open_stream_call(RestRequest *req) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        OutputStream *os = rest_request_data(req);
        int r;

        r = rest_new_manager_call(req, "OpenSandboxOutputStream", &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "sut", os->id, os->pid, os->offset);
        if (r >= 0)
                r = rest_call_detached(req, m, REST_CALL_TIMEOUT_SHORT, on_reply_open_stream);
        return r;
}

/* The stream's state as the request's, and a slot: 1, or 0 with the error queued. */
static int output_stream_attach(RestRequest *req, OutputStream *os) {
        int r;

        if (!os) {
                r = rest_reply_error(req, 500, "out of memory");
                return MIN(r, 0);
        }
        if (!rest_stream_slot_take(os->server)) {
                output_stream_free(os);
                r = rest_reply_error(req, 503, "too many streams");
                return MIN(r, 0);
        }
        os->slot = true;
        rest_request_set_data(req, os, output_stream_free);
        return 1;
}

int rest_route_process_output(RestRequest *req) {
        const char *id, *f;
        uint64_t offset;
        uint32_t pid;
        int follow, r;

        r = rest_proc_path(req, &id, &pid);
        if (r <= 0)
                return r;
        r = rest_proc_query_offset(req, &offset);
        if (r <= 0)
                return r;
        f = rest_request_query(req, "follow");
        follow = rest_parse_bool_arg(f);
        if (follow < 0 || (f && !*f))
                return rest_reply_error(req, 400, "follow must be true or false");
        r = output_stream_attach(req, output_stream_new(req, id, pid, offset, follow));
        if (r <= 0)
                return r;
        r = follow ? open_stream_call(req) : read_call(req, on_reply_read_first);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        rest_request_wait(req);
        return 0;
}

/* ---------------- exec with "stream": true ---------------- */

/* StartSandboxProcessStream's (pid, fd): one call, and for a short command one
 * round trip to the agent, where a start and an OpenSandboxOutputStream were two. */
static int on_reply_exec_start(RestRequest *req, sd_bus_message *reply) {
        OutputStream *os = rest_request_data(req);
        const sd_bus_error *e = sd_bus_message_get_error(reply);
        int r;

        if (e)
                return rest_proc_reply_bus_error(req, e);
        r = sd_bus_message_read(reply, "u", &os->pid);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        return stream_begin(req, reply);
}

int rest_proc_exec_stream(RestRequest *req, const char *id, struct json_object *args, uint32_t timeout_secs) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        int r;

        r = output_stream_attach(req, output_stream_new(req, id, 0, 0, true));
        if (r <= 0)
                return r;
        ((OutputStream *) rest_request_data(req))->exec = true;
        r = rest_new_manager_call(req, "StartSandboxProcessStream", &m);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        r = sd_bus_message_append(m, "s", id);
        if (r >= 0)
                r = append_argv(m, args);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0 && timeout_secs > 0)
                r = sd_bus_message_append(m, "{sv}", "timeout_secs", "u", timeout_secs);
        /* exec has no stdin: /dev/null, as the agent's exec gives */
        if (r >= 0)
                r = sd_bus_message_append(m, "{sv}", "stdin", "b", 0);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call_detached(req, m, REST_CALL_TIMEOUT_SHORT, on_reply_exec_start);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        rest_request_wait(req);
        return 0;
}
