/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * Processes in a sandbox over D-Bus: StartProcess, ListProcesses,
 * SignalProcess, WriteStdin, ResizePty, ReadOutput and OpenOutputStream
 * (dbus/org.forkd.Manager.xml), the agent ops proc_* (docs/agent-protocol.md).
 *
 * Every argument is checked here before anything reaches the guest; then the
 * polkit action and ownership rule of Exec (org.forkd.run-code, sandbox_verify()).
 * The guest's answers are hostile input and are checked before they become a
 * reply. A refusal that the agent gives with an errno name becomes:
 *   ESRCH                      org.forkd.Error.NoSuchProcess
 *   EAGAIN                     org.forkd.Error.Busy (too many processes, stdin full)
 *   EINVAL, E2BIG, ENOTTY      org.freedesktop.DBus.Error.InvalidArgs
 *   ENOENT, EACCES, ENOEXEC,   org.freedesktop.DBus.Error.InvalidArgs: a program
 *   ENOTDIR                    that cannot be started (not found, a bad cwd)
 *   EOPNOTSUPP                 org.forkd.Error.NotSupported (an agent without processes)
 *   anything else              org.forkd.Error.GuestError
 *
 * OpenOutputStream's streams are sandbox-proc-stream.c's.
 */

#include <inttypes.h>

#include <json-c/json.h>

#include "agent-proto.h"
#include "base64.h"
#include "json-util.h"
#include "macro.h"
#include "proc-stream.h"
#include "sandbox-dbus.h"
#include "sandbox-proc-dbus.h"
#include "sandbox-proc-internal.h"
#include "sandbox.h"
#include "time-util.h"

static const char *const proc_op_name[] = {
        [PROC_OP_START] = "proc_start",   [PROC_OP_LIST] = "proc_list",     [PROC_OP_SIGNAL] = "proc_signal",
        [PROC_OP_STDIN] = "proc_stdin",   [PROC_OP_RESIZE] = "proc_resize", [PROC_OP_READ] = "proc_read",
};

typedef struct ProcCall {
        sd_bus_message *message;
        ProcOp op;
        uint64_t offset; /* a read's */
        uint32_t max;
} ProcCall;

/* ---- errors ---- */

static const struct {
        const char *errno_name;
        const char *bus_error;
} errno_map[] = {
        { "ESRCH", FORKD_ERROR_NO_SUCH_PROCESS },
        { "EAGAIN", FORKD_ERROR_BUSY },
        { "EINVAL", SD_BUS_ERROR_INVALID_ARGS },
        { "E2BIG", SD_BUS_ERROR_INVALID_ARGS },
        { "ENOTTY", SD_BUS_ERROR_INVALID_ARGS },
        { "ENOENT", SD_BUS_ERROR_INVALID_ARGS },
        { "EACCES", SD_BUS_ERROR_INVALID_ARGS },
        { "ENOEXEC", SD_BUS_ERROR_INVALID_ARGS },
        { "ENOTDIR", SD_BUS_ERROR_INVALID_ARGS },
        { "EOPNOTSUPP", FORKD_ERROR_NOT_SUPPORTED },
};

static const char *bus_error_for(struct json_object *obj) {
        struct json_object *e;

        if (!obj || !json_object_object_get_ex(obj, "errno", &e) || !json_object_is_type(e, json_type_string))
                return FORKD_ERROR_GUEST_ERROR;
        for (size_t i = 0; i < ELEMENTSOF(errno_map); i++)
                if (streq(errno_map[i].errno_name, json_object_get_string(e)))
                        return errno_map[i].bus_error;
        return FORKD_ERROR_GUEST_ERROR;
}

/* An agent call that brought no answer (r < 0) or a refusal (FKA_ERROR) into error. */
int proc_agent_error(int r, struct json_object *obj, sd_bus_error *error) {
        struct json_object *e;

        if (r >= 0) {
                const char *msg = "the guest refused the request";

                if (obj && json_object_object_get_ex(obj, "error", &e) && json_object_is_type(e, json_type_string))
                        msg = json_object_get_string(e);
                return sd_bus_error_setf(error, bus_error_for(obj), "%s", msg);
        }
        if (r == -ETIMEDOUT)
                return sd_bus_error_setf(error, FORKD_ERROR_TIMEOUT, "The guest did not answer in time.");
        if (IN_SET_CONN(r))
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "The sandbox exited before it answered.");
        if (r == -EBADMSG || r == -EMSGSIZE || r == -EPROTO)
                return sd_bus_error_setf(error, FORKD_ERROR_GUEST_ERROR, "The guest sent an invalid answer (%s).",
                                         strerror(-r));
        return sd_bus_error_setf(error, FORKD_ERROR_FAILED, "Agent request failed: %s", strerror(-r));
}

int proc_invalid_answer(sd_bus_message *message, ProcOp op, const char *why) {
        return sd_bus_reply_method_errorf(message, FORKD_ERROR_GUEST_ERROR, "The guest sent an invalid %s answer (%s).",
                                          proc_op_name[op], why);
}

/* ---- reading the guest's answers ---- */

/* An integer member: absent or null gives def; else in [min, max]. */
static int get_int(struct json_object *o, const char *key, bool nullable, int64_t min, int64_t max, int64_t def,
                   int64_t *ret) {
        struct json_object *v;
        int64_t x;

        if (!json_object_object_get_ex(o, key, &v) || !v) {
                if (!nullable)
                        return -EINVAL;
                *ret = def;
                return 0;
        }
        if (!json_object_is_type(v, json_type_int))
                return -EINVAL;
        errno = 0;
        x = json_object_get_int64(v);
        if (errno != 0 || x < min || x > max)
                return -ERANGE;
        *ret = x;
        return 0;
}

static int get_bool(struct json_object *o, const char *key, bool *ret) {
        struct json_object *v;

        if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_boolean))
                return -EINVAL;
        *ret = json_object_get_boolean(v);
        return 0;
}

void proc_read_answer_done(ProcReadAnswer *a) {
        for (size_t i = 0; i < a->n_chunks; i++)
                free(a->chunks[i].data);
        free(a->chunks);
        *a = (ProcReadAnswer) {};
}

/* A proc_read answer for a read at offset of at most max bytes: the chunks
 * contiguous from offset + gap, within max, next_offset at their end. */
int proc_read_answer_parse(struct json_object *o, uint64_t offset, uint32_t max, ProcReadAnswer *ret,
                           const char **why) {
        _cleanup_(proc_read_answer_done) ProcReadAnswer a = {};
        struct json_object *chunks;
        int64_t next, gap, code, sig;
        uint64_t at;
        size_t n;

        if (!json_object_object_get_ex(o, "chunks", &chunks) || !json_object_is_type(chunks, json_type_array))
                return *why = "no chunks array", -EINVAL;
        if (get_int(o, "next_offset", false, 0, INT64_MAX, 0, &next) < 0 ||
            get_int(o, "gap", false, 0, INT64_MAX, 0, &gap) < 0)
                return *why = "next_offset or gap missing or out of range", -EINVAL;
        if (get_bool(o, "exited", &a.exited) < 0 || get_bool(o, "end", &a.end) < 0)
                return *why = "exited or end missing", -EINVAL;
        if (get_int(o, "exit_code", true, INT32_MIN, INT32_MAX, -1, &code) < 0 ||
            get_int(o, "signal", true, 0, 64, 0, &sig) < 0)
                return *why = "exit_code or signal invalid", -EINVAL;
        if ((uint64_t) gap > UINT64_MAX - offset)
                return *why = "gap out of range", -EINVAL;
        n = json_object_array_length(chunks);
        if (n > max)
                return *why = "more chunks than bytes asked for", -EINVAL;
        a.chunks = n > 0 ? calloc(n, sizeof(ProcChunk)) : NULL;
        if (n > 0 && !a.chunks)
                return *why = "out of memory", -ENOMEM;
        at = offset + (uint64_t) gap;
        for (size_t i = 0; i < n; i++) {
                struct json_object *c = json_object_array_get_idx(chunks, i), *v;
                ProcChunk *k = &a.chunks[i];
                const char *stream, *b64;
                int64_t off;
                size_t len;

                if (!json_object_is_type(c, json_type_object) ||
                    !json_object_object_get_ex(c, "stream", &v) || !json_object_is_type(v, json_type_string))
                        return *why = "a chunk without stream", -EINVAL;
                stream = json_object_get_string(v);
                if (streq(stream, "stdout"))
                        k->kind = PROC_STREAM_STDOUT;
                else if (streq(stream, "stderr"))
                        k->kind = PROC_STREAM_STDERR;
                else
                        return *why = "a chunk of an unknown stream", -EINVAL;
                if (get_int(c, "offset", false, 0, INT64_MAX, 0, &off) < 0 || (uint64_t) off != at)
                        return *why = "chunks not contiguous from the offset", -EINVAL;
                if (!json_object_object_get_ex(c, "data_b64", &v) || !json_object_is_type(v, json_type_string))
                        return *why = "a chunk without data_b64", -EINVAL;
                b64 = json_object_get_string(v);
                if (base64_decoded_length(b64, (size_t) json_object_get_string_len(v), &len) < 0)
                        return *why = "a chunk's data_b64 is not base64", -EINVAL;
                if (len > max - a.bytes)
                        return *why = "more bytes than asked for", -EINVAL;
                k->data = malloc(MAX(len, (size_t) 1));
                if (!k->data)
                        return *why = "out of memory", -ENOMEM;
                a.n_chunks = i + 1;
                if (base64_decode(b64, (size_t) json_object_get_string_len(v), k->data, len, &k->len) < 0)
                        return *why = "a chunk's data_b64 is not base64", -EINVAL;
                k->offset = at;
                at += k->len;
                a.bytes += k->len;
        }
        if ((uint64_t) next != at)
                return *why = "next_offset is not the end of the chunks", -EINVAL;
        if (a.end && !a.exited)
                return *why = "end without exited", -EINVAL;
        a.next_offset = (uint64_t) next;
        a.gap = (uint64_t) gap;
        a.exit_code = a.exited ? (int32_t) code : -1;
        a.signal = a.exited ? (int32_t) sig : 0;
        if (a.signal != 0)
                a.exit_code = -1;
        *ret = a;
        a = (ProcReadAnswer) {};
        return 0;
}

static int append_strings(sd_bus_message *reply, struct json_object *arr) {
        int r = sd_bus_message_open_container(reply, 'a', "s");

        for (size_t i = 0; r >= 0 && i < json_object_array_length(arr); i++) {
                struct json_object *v = json_object_array_get_idx(arr, i);

                if (!json_object_is_type(v, json_type_string))
                        return -EINVAL;
                r = sd_bus_message_append_basic(reply, 's', json_object_get_string(v));
        }
        return r < 0 ? r : sd_bus_message_close_container(reply);
}

/* One entry of proc_list as a{sv}. -EINVAL: the entry is not what the agent sends. */
static int append_process(sd_bus_message *reply, struct json_object *p) {
        struct json_object *args, *cwd;
        int64_t pid, code, sig, end, started;
        bool pty, running;
        int r;

        if (!json_object_is_type(p, json_type_object) ||
            get_int(p, "pid", false, 1, INT32_MAX, 0, &pid) < 0 ||
            get_int(p, "exit_code", true, INT32_MIN, INT32_MAX, -1, &code) < 0 ||
            get_int(p, "signal", true, 0, 64, 0, &sig) < 0 ||
            get_int(p, "end_offset", false, 0, INT64_MAX, 0, &end) < 0 ||
            get_int(p, "started_ns", false, 0, INT64_MAX, 0, &started) < 0 ||
            get_bool(p, "pty", &pty) < 0 || get_bool(p, "running", &running) < 0 ||
            !json_object_object_get_ex(p, "args", &args) || !json_object_is_type(args, json_type_array) ||
            !json_object_object_get_ex(p, "cwd", &cwd) || !json_object_is_type(cwd, json_type_string))
                return -EINVAL;
        if (running || sig != 0)
                code = -1;
        r = sd_bus_message_open_container(reply, 'a', "{sv}");
        if (r >= 0)
                r = sd_bus_message_append(reply, "{sv}", "pid", "u", (uint32_t) pid);
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'e', "sv");
        if (r >= 0)
                r = sd_bus_message_append_basic(reply, 's', "args");
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'v', "as");
        if (r >= 0)
                r = append_strings(reply, args);
        if (r >= 0)
                r = sd_bus_message_close_container(reply);
        if (r >= 0)
                r = sd_bus_message_close_container(reply);
        if (r >= 0)
                r = sd_bus_message_append(reply, "{sv}{sv}{sv}{sv}{sv}{sv}{sv}", "cwd", "s",
                                          json_object_get_string(cwd), "pty", "b", (int) pty, "running", "b",
                                          (int) running, "exit_code", "i", (int32_t) code, "signal", "i",
                                          (int32_t) sig, "end_offset", "t", (uint64_t) end, "started_usec", "t",
                                          (uint64_t) started / NSEC_PER_USEC);
        if (r >= 0)
                r = sd_bus_message_close_container(reply);
        return r;
}

static int reply_list(sd_bus_message *message, struct json_object *o) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        struct json_object *procs;
        int r;

        if (!json_object_object_get_ex(o, "processes", &procs) || !json_object_is_type(procs, json_type_array))
                return proc_invalid_answer(message, PROC_OP_LIST, "no processes array");
        r = sd_bus_message_new_method_return(message, &reply);
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'a', "a{sv}");
        for (size_t i = 0; r >= 0 && i < json_object_array_length(procs); i++)
                r = append_process(reply, json_object_array_get_idx(procs, i));
        if (r == -EINVAL)
                return proc_invalid_answer(message, PROC_OP_LIST, "a process entry is malformed");
        if (r >= 0)
                r = sd_bus_message_close_container(reply);
        if (r >= 0)
                r = sd_bus_send(NULL, reply, NULL);
        return r < 0 ? sd_bus_reply_method_errno(message, r, NULL) : 0;
}

static int reply_read(sd_bus_message *message, struct json_object *o, uint64_t offset, uint32_t max) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(proc_read_answer_done) ProcReadAnswer a = {};
        const char *why = NULL;
        int r;

        r = proc_read_answer_parse(o, offset, max, &a, &why);
        if (r < 0)
                return proc_invalid_answer(message, PROC_OP_READ, why);
        r = sd_bus_message_new_method_return(message, &reply);
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'a', "(stay)");
        for (size_t i = 0; r >= 0 && i < a.n_chunks; i++) {
                r = sd_bus_message_open_container(reply, 'r', "stay");
                if (r >= 0)
                        r = sd_bus_message_append(reply, "st",
                                                  a.chunks[i].kind == PROC_STREAM_STDOUT ? "stdout" : "stderr",
                                                  a.chunks[i].offset);
                if (r >= 0)
                        r = sd_bus_message_append_array(reply, 'y', a.chunks[i].data, a.chunks[i].len);
                if (r >= 0)
                        r = sd_bus_message_close_container(reply);
        }
        if (r >= 0)
                r = sd_bus_message_close_container(reply);
        if (r >= 0)
                r = sd_bus_message_append(reply, "ttbii", a.next_offset, a.gap, (int) a.exited, a.exit_code, a.signal);
        if (r >= 0)
                r = sd_bus_send(NULL, reply, NULL);
        return r < 0 ? sd_bus_reply_method_errno(message, r, NULL) : 0;
}

static int reply_answer(ProcCall *c, struct json_object *o) {
        struct json_object *v;
        int64_t x;

        switch (c->op) {
        case PROC_OP_START:
                if (get_int(o, "pid", false, 1, INT32_MAX, 0, &x) < 0)
                        return proc_invalid_answer(c->message, c->op, "no valid pid");
                return sd_bus_reply_method_return(c->message, "u", (uint32_t) x);
        case PROC_OP_LIST:
                return reply_list(c->message, o);
        case PROC_OP_SIGNAL:
        case PROC_OP_RESIZE:
                if (!json_object_object_get_ex(o, "ok", &v) || !json_object_is_type(v, json_type_boolean) ||
                    !json_object_get_boolean(v))
                        return proc_invalid_answer(c->message, c->op, "no \"ok\": true");
                return sd_bus_reply_method_return(c->message, NULL);
        case PROC_OP_STDIN:
                if (get_int(o, "written", false, 0, PROC_STDIN_CHUNK_MAX, 0, &x) < 0)
                        return proc_invalid_answer(c->message, c->op, "no valid written");
                return sd_bus_reply_method_return(c->message, "u", (uint32_t) x);
        case PROC_OP_READ:
                return reply_read(c->message, o, c->offset, c->max);
        }
        return -EINVAL;
}

static void proc_reply(int r, uint16_t type, const char *json, struct json_object *obj, void *userdata) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        ProcCall *c = userdata;

        if (r >= 0 && type == FKA_RESPONSE && obj)
                (void) reply_answer(c, obj);
        else {
                (void) proc_agent_error(r >= 0 && type != FKA_ERROR ? -EPROTO : r, obj, &error);
                (void) sd_bus_reply_method_error(c->message, &error);
        }
        sd_bus_message_unref(c->message);
        free(c);
}

/* Send req for message; the reply callback answers it. */
static int proc_send(sd_bus_message *message, Sandbox *s, ProcOp op, struct json_object *req, uint64_t offset,
                     uint32_t max, sd_bus_error *error) {
        ProcCall *c;
        int r;

        if (s->state != SANDBOX_RUNNING)
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "Sandbox %s is being terminated.", s->id);
        json_object_object_add(req, "op", json_object_new_string(proc_op_name[op]));
        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        *c = (ProcCall) { .message = sd_bus_message_ref(message), .op = op, .offset = offset, .max = max };
        r = sandbox_call(s, json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN), PROC_CALL_TIMEOUT_USEC,
                         proc_reply, c);
        if (r >= 0)
                return 1;
        sd_bus_message_unref(c->message);
        free(c);
        if (r == -EBUSY || r == -ENOBUFS)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "Too many requests in flight for sandbox %s.", s->id);
        if (IN_SET_CONN(r))
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "Sandbox %s has exited.", s->id);
        if (r == -EMSGSIZE)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Request too large.");
        return sd_bus_error_set_errnof(error, r, "Failed to send the request to %s: %m", s->id);
}

/* ---- arguments ---- */

int proc_read_pid(sd_bus_message *message, uint32_t *ret, sd_bus_error *error) {
        uint32_t pid;
        int r = sd_bus_message_read(message, "u", &pid);

        if (r < 0)
                return r;
        if (pid == 0 || pid > INT32_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Invalid pid %u.", pid);
        *ret = pid;
        return 0;
}

static int read_argv(sd_bus_message *message, struct json_object *args, size_t *ret_n, sd_bus_error *error) {
        size_t n = 0, bytes = 0;
        int r;

        r = sd_bus_message_enter_container(message, 'a', "s");
        if (r < 0)
                return r;
        for (;;) {
                const char *a;

                r = sd_bus_message_read(message, "s", &a);
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                n++;
                bytes += strlen(a) + 1;
                if (n > PROC_ARGV_MAX || bytes > PROC_ARGV_BYTES_MAX)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "argv: at most %u entries of %u bytes in all.", PROC_ARGV_MAX,
                                                 PROC_ARGV_BYTES_MAX);
                if (json_object_array_add(args, json_object_new_string(a)) < 0)
                        return -ENOMEM;
        }
        *ret_n = n;
        return sd_bus_message_exit_container(message);
}

static int read_env(sd_bus_message *message, struct json_object *env, sd_bus_error *error) {
        size_t n = 0, bytes = 0;
        int r;

        r = sd_bus_message_enter_container(message, 'a', "{ss}");
        if (r < 0)
                return r;
        for (;;) {
                const char *k, *v;

                r = sd_bus_message_read(message, "{ss}", &k, &v);
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                n++;
                bytes += strlen(k) + strlen(v) + 2;
                if (n > PROC_ENV_MAX || bytes > PROC_ENV_BYTES_MAX)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "env: at most %u entries of %u bytes in all.", PROC_ENV_MAX,
                                                 PROC_ENV_BYTES_MAX);
                if (!*k || strchr(k, '='))
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "env: invalid variable name \"%.64s\" (empty or with '=').", k);
                json_object_object_add(env, k, json_object_new_string(v));
        }
        return sd_bus_message_exit_container(message);
}

static int check_string_option(const char *key, const char *v, sd_bus_error *error) {
        if (!*v || strlen(v) > PROC_STRING_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Option %s must be 1 to %u bytes.", key,
                                         PROC_STRING_MAX);
        return 0;
}

/* StartProcess's a{sv} options into req. *has_cmd: cmd was given. */
static int read_start_options(sd_bus_message *message, struct json_object *req, bool *has_cmd, sd_bus_error *error) {
        static const struct {
                const char *key, *type;
        } known[] = {
                { "cmd", "s" },        { "cwd", "s" },          { "env", "a{ss}" }, { "user", "s" },
                { "pty", "(uu)" },     { "timeout_secs", "u" }, { "stdin", "b" },
        };
        int r;

        r = sd_bus_message_enter_container(message, 'a', "{sv}");
        if (r < 0)
                return r;
        for (;;) {
                const char *key, *type = NULL, *str;
                uint32_t u, cols, rows;
                int b;

                r = sd_bus_message_enter_container(message, 'e', "sv");
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                r = sd_bus_message_read(message, "s", &key);
                if (r < 0)
                        return r;
                for (size_t k = 0; k < ELEMENTSOF(known); k++)
                        if (streq(key, known[k].key))
                                type = known[k].type;
                if (!type)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "Unknown process option \"%.64s\" (known: cmd, cwd, env, user, pty, "
                                                 "timeout_secs, stdin).", key);
                r = sd_bus_message_enter_container(message, 'v', type);
                if (r < 0)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "Process option %s must be of type %s.", key, type);
                if (streq(key, "env")) {
                        struct json_object *env = json_object_new_object();

                        if (!env)
                                return -ENOMEM;
                        json_object_object_add(req, "env", env);
                        r = read_env(message, env, error);
                } else if (streq(key, "pty")) {
                        r = sd_bus_message_read(message, "(uu)", &cols, &rows);
                        if (r >= 0 && (cols < 1 || cols > PROC_PTY_MAX || rows < 1 || rows > PROC_PTY_MAX))
                                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                         "pty: cols and rows must be 1 to %u.", PROC_PTY_MAX);
                        if (r >= 0) {
                                struct json_object *pty = json_object_new_object();

                                if (!pty)
                                        return -ENOMEM;
                                json_object_object_add(pty, "cols", json_object_new_int64(cols));
                                json_object_object_add(pty, "rows", json_object_new_int64(rows));
                                json_object_object_add(req, "pty", pty);
                        }
                } else if (streq(key, "timeout_secs")) {
                        r = sd_bus_message_read(message, "u", &u);
                        if (r >= 0 && u > PROC_TIMEOUT_SECS_MAX)
                                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                         "timeout_secs must be at most %u.", PROC_TIMEOUT_SECS_MAX);
                        if (r >= 0)
                                json_object_object_add(req, "timeout_secs", json_object_new_int64(u));
                } else if (streq(key, "stdin")) {
                        r = sd_bus_message_read(message, "b", &b);
                        if (r >= 0)
                                json_object_object_add(req, "stdin", json_object_new_boolean(b));
                } else {
                        r = sd_bus_message_read(message, "s", &str);
                        if (r >= 0 && streq(key, "cmd")) {
                                if (!*str || strlen(str) + 1 > PROC_ARGV_BYTES_MAX)
                                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                                 "cmd must be 1 to %u bytes.",
                                                                 PROC_ARGV_BYTES_MAX - 1);
                                *has_cmd = true;
                        } else if (r >= 0 && check_string_option(key, str, error) < 0)
                                return -EINVAL;
                        if (r >= 0)
                                json_object_object_add(req, key, json_object_new_string(str));
                }
                if (r < 0)
                        return r;
                r = sd_bus_message_exit_container(message);
                if (r >= 0)
                        r = sd_bus_message_exit_container(message);
                if (r < 0)
                        return r;
        }
        return sd_bus_message_exit_container(message);
}

int proc_verify(sd_bus_message *message, Sandbox *s, const char *verb, sd_bus_error *error) {
        return sandbox_verify(message, s, "org.forkd.run-code", verb, error);
}

/* ---- methods ---- */

int proc_start_request(sd_bus_message *message, struct json_object **ret, sd_bus_error *error) {
        _cleanup_json_ struct json_object *req = json_object_new_object();
        struct json_object *args = json_object_new_array();
        bool has_cmd = false;
        size_t n = 0;
        int r;

        if (!req || !args) {
                json_object_put(args);
                return -ENOMEM;
        }
        r = read_argv(message, args, &n, error);
        if (r < 0) {
                json_object_put(args);
                return r;
        }
        if (n > 0)
                json_object_object_add(req, "args", args);
        else
                json_object_put(args);
        r = read_start_options(message, req, &has_cmd, error);
        if (r < 0)
                return r;
        if (n > 0 && has_cmd)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "Give either argv or the option cmd, not both.");
        if (n == 0 && !has_cmd)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "argv must not be empty (or give the option cmd).");
        *ret = TAKE_PTR(req);
        return 0;
}

int bus_sandbox_method_start_process(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ struct json_object *req = NULL;
        Sandbox *s = userdata;
        int r;

        r = proc_start_request(message, &req, error);
        if (r < 0)
                return r;
        r = proc_verify(message, s, "start-process", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        return proc_send(message, s, PROC_OP_START, req, 0, 0, error);
}

int bus_sandbox_method_list_processes(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ struct json_object *req = json_object_new_object();
        Sandbox *s = userdata;
        int r;

        if (!req)
                return -ENOMEM;
        r = proc_verify(message, s, "list-processes", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        return proc_send(message, s, PROC_OP_LIST, req, 0, 0, error);
}

int bus_sandbox_method_signal_process(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ struct json_object *req = json_object_new_object();
        Sandbox *s = userdata;
        const char *name;
        uint32_t pid;
        int r, sig;

        if (!req)
                return -ENOMEM;
        r = proc_read_pid(message, &pid, error);
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "s", &name);
        if (r < 0)
                return r;
        sig = proc_signal_from_string(name);
        if (sig < 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "unknown signal \"%.64s\"", name);
        json_object_object_add(req, "pid", json_object_new_int64(pid));
        json_object_object_add(req, "signal", json_object_new_int64(sig));

        r = proc_verify(message, s, "signal-process", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        return proc_send(message, s, PROC_OP_SIGNAL, req, 0, 0, error);
}

int bus_sandbox_method_write_stdin(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ struct json_object *req = json_object_new_object();
        _cleanup_free_ char *b64 = NULL;
        Sandbox *s = userdata;
        const void *data;
        size_t size;
        uint32_t pid;
        int r, eof;

        if (!req)
                return -ENOMEM;
        r = proc_read_pid(message, &pid, error);
        if (r < 0)
                return r;
        r = sd_bus_message_read_array(message, 'y', &data, &size);
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "b", &eof);
        if (r < 0)
                return r;
        if (size > PROC_STDIN_CHUNK_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "data is larger than %u bytes.",
                                         PROC_STDIN_CHUNK_MAX);
        b64 = malloc(BASE64_ENCODED_SIZE(size) + 1);
        if (!b64)
                return -ENOMEM;
        b64[base64_encode(data, size, b64)] = 0;
        json_object_object_add(req, "pid", json_object_new_int64(pid));
        json_object_object_add(req, "data_b64", json_object_new_string(b64));
        json_object_object_add(req, "eof", json_object_new_boolean(eof));

        r = proc_verify(message, s, "write-stdin", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        return proc_send(message, s, PROC_OP_STDIN, req, 0, 0, error);
}

int bus_sandbox_method_resize_pty(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ struct json_object *req = json_object_new_object();
        Sandbox *s = userdata;
        uint16_t cols, rows;
        uint32_t pid;
        int r;

        if (!req)
                return -ENOMEM;
        r = proc_read_pid(message, &pid, error);
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "qq", &cols, &rows);
        if (r < 0)
                return r;
        if (cols < 1 || cols > PROC_PTY_MAX || rows < 1 || rows > PROC_PTY_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "cols and rows must be 1 to %u.",
                                         PROC_PTY_MAX);
        json_object_object_add(req, "pid", json_object_new_int64(pid));
        json_object_object_add(req, "cols", json_object_new_int64(cols));
        json_object_object_add(req, "rows", json_object_new_int64(rows));

        r = proc_verify(message, s, "resize-pty", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        return proc_send(message, s, PROC_OP_RESIZE, req, 0, 0, error);
}

int proc_read_offset(sd_bus_message *message, uint64_t *ret, sd_bus_error *error) {
        uint64_t offset;
        int r = sd_bus_message_read(message, "t", &offset);

        if (r < 0)
                return r;
        if (offset > INT64_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "offset must be at most %" PRIi64 ".",
                                         INT64_MAX);
        *ret = offset;
        return 0;
}

struct json_object *proc_read_request(uint32_t pid, uint64_t offset, uint32_t max, uint32_t wait_ms) {
        struct json_object *req = json_object_new_object();

        if (!req)
                return NULL;
        json_object_object_add(req, "pid", json_object_new_int64(pid));
        json_object_object_add(req, "offset", json_object_new_int64((int64_t) offset));
        json_object_object_add(req, "max", json_object_new_int64(max));
        json_object_object_add(req, "wait_ms", json_object_new_int64(wait_ms));
        return req;
}

int bus_sandbox_method_read_output(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ struct json_object *req = NULL;
        Sandbox *s = userdata;
        uint64_t offset;
        uint32_t pid, max;
        int r;

        r = proc_read_pid(message, &pid, error);
        if (r < 0)
                return r;
        r = proc_read_offset(message, &offset, error);
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "u", &max);
        if (r < 0)
                return r;
        if (max < 1 || max > PROC_READ_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "max must be 1 to %u.", PROC_READ_MAX);
        req = proc_read_request(pid, offset, max, 0);
        if (!req)
                return -ENOMEM;

        r = proc_verify(message, s, "read-output", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        return proc_send(message, s, PROC_OP_READ, req, offset, max, error);
}

/* Object-path entry points: start reading from the beginning each time (polkit re-dispatches). */
#define OBJECT_METHOD(name)                                                                     \
        static int object_##name(sd_bus_message *message, void *userdata, sd_bus_error *error) { \
                int r = sd_bus_message_rewind(message, true);                                     \
                if (r < 0)                                                                        \
                        return r;                                                                 \
                return bus_sandbox_method_##name(message, userdata, error);                       \
        }
OBJECT_METHOD(start_process)
OBJECT_METHOD(list_processes)
OBJECT_METHOD(signal_process)
OBJECT_METHOD(write_stdin)
OBJECT_METHOD(resize_pty)
OBJECT_METHOD(read_output)
OBJECT_METHOD(open_output_stream)
OBJECT_METHOD(start_process_stream)

const sd_bus_vtable sandbox_proc_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_METHOD_WITH_ARGS("StartProcess", SD_BUS_ARGS("as", argv, "a{sv}", options), SD_BUS_RESULT("u", pid),
                                object_start_process, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ListProcesses", SD_BUS_NO_ARGS, SD_BUS_RESULT("aa{sv}", processes),
                                object_list_processes, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("SignalProcess", SD_BUS_ARGS("u", pid, "s", signal), SD_BUS_NO_RESULT,
                                object_signal_process, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("WriteStdin", SD_BUS_ARGS("u", pid, "ay", data, "b", eof), SD_BUS_RESULT("u", written),
                                object_write_stdin, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ResizePty", SD_BUS_ARGS("u", pid, "q", cols, "q", rows), SD_BUS_NO_RESULT,
                                object_resize_pty, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ReadOutput", SD_BUS_ARGS("u", pid, "t", offset, "u", max),
                                SD_BUS_RESULT("a(stay)", chunks, "t", next_offset, "t", gap, "b", exited, "i",
                                              exit_code, "i", signal),
                                object_read_output, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("OpenOutputStream", SD_BUS_ARGS("u", pid, "t", offset), SD_BUS_RESULT("h", fd),
                                object_open_output_stream, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("StartProcessStream", SD_BUS_ARGS("as", argv, "a{sv}", options),
                                SD_BUS_RESULT("u", pid, "h", fd), object_start_process_stream,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_VTABLE_END,
};
