/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* The routes that reach into a running sandbox's guest: ping, exec, eval,
 * run_code, ports and the diff of two sandboxes' files. */

#include "file-hashes.h"
#include "json-util.h"
#include "macro.h"
#include "rest-bus.h"
#include "rest-reply.h"
#include "rest-routes-common.h"
#include "rest-routes-guest.h"
#include "rest-routes-processes.h"
#include "rest-util.h"
#include "time-util.h"

#define EXEC_TIMEOUT_MAX 3600
#define EXEC_ARGS_MAX 4096
#define CODE_MAX (256 * 1024)
#define CALL_TIMEOUT_DIFF (120 * USEC_PER_SEC)

/* Ping, Exec, Eval: the agent's JSON, passed through unchanged. */
static int on_reply_agent(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *o = NULL;
        const char *s;
        int r;

        r = rest_reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        r = sd_bus_message_read_basic(reply, 's', &s);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        r = json_parse_strict(s, strlen(s), 16 * 1024 * 1024, 64, &o, NULL);
        if (r < 0)
                return rest_reply_error(req, 500, "the guest agent's reply is not a JSON object");
        return rest_reply_raw(req, 200, "application/json", s, strlen(s));
}

int rest_route_sandbox_ping(RestRequest *req) {
        const char *id = rest_param_or_reply(req, "sandbox id");

        if (!id)
                return 0;
        return rest_call_manager(req, "Ping", REST_CALL_TIMEOUT_SHORT, on_reply_agent, "s", id);
}

struct exec_args {
        struct json_object *args;
        int64_t timeout_secs;
        bool stream;
};

int rest_route_sandbox_exec(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "args", JSON_KIND_ARRAY, NULL, offsetof(struct exec_args, args), 0, JSON_MANDATORY },
                { "timeout_secs", JSON_KIND_INT64, NULL, offsetof(struct exec_args, timeout_secs), 0, 0 },
                /* the output as NDJSON while it runs (rest-routes-processes.c) */
                { "stream", JSON_KIND_BOOL, NULL, offsetof(struct exec_args, stream), 0, 0 },
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct exec_args a = {};
        const char *id;
        size_t n;
        int r;

        id = rest_param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        r = rest_parse_body(req, false, table, &a, NULL, &o);
        if (r <= 0)
                return r;
        n = json_object_array_length(a.args);
        if (n == 0 || n > EXEC_ARGS_MAX)
                return rest_reply_error(req, 400, "args must hold 1 to %d strings", EXEC_ARGS_MAX);
        if (a.timeout_secs < 0 || a.timeout_secs > EXEC_TIMEOUT_MAX)
                return rest_reply_error(req, 400, "timeout_secs must be between 0 and %d", EXEC_TIMEOUT_MAX);
        if (a.stream) {
                for (size_t i = 0; i < n; i++) {
                        struct json_object *e = json_object_array_get_idx(a.args, i);
                        const char *s;
                        size_t len;

                        if (!e || !json_object_is_type(e, json_type_string))
                                return rest_reply_error(req, 400, "args[%zu]: expected a string", i);
                        s = json_object_get_string(e);
                        len = (size_t) json_object_get_string_len(e);
                        if (memchr(s, 0, len) || !utf8_is_valid_n(s, len))
                                return rest_reply_error(req, 400, "args[%zu]: invalid string", i);
                }
                return rest_proc_exec_stream(req, id, a.args, (uint32_t) a.timeout_secs);
        }

        r = rest_new_manager_call(req, "Exec", &m);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        r = sd_bus_message_append(m, "s", id);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "s");
        for (size_t i = 0; r >= 0 && i < n; i++) {
                struct json_object *e = json_object_array_get_idx(a.args, i);
                const char *s;
                size_t len;

                if (!e || !json_object_is_type(e, json_type_string))
                        return rest_reply_error(req, 400, "args[%zu]: expected a string", i);
                s = json_object_get_string(e);
                len = (size_t) json_object_get_string_len(e);
                if (memchr(s, 0, len) || !utf8_is_valid_n(s, len))
                        return rest_reply_error(req, 400, "args[%zu]: invalid string", i);
                r = sd_bus_message_append_basic(m, 's', s);
        }
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r >= 0)
                r = sd_bus_message_append(m, "u", (uint32_t) a.timeout_secs);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, (uint64_t) ((a.timeout_secs ?: 30) + 30) * USEC_PER_SEC, on_reply_agent);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        return 0;
}

struct eval_args {
        char *code;
};

int rest_route_sandbox_eval(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "code", JSON_KIND_STRING, NULL, offsetof(struct eval_args, code), 0, JSON_MANDATORY },
                {}
        };
        _cleanup_json_ struct json_object *o = NULL;
        struct eval_args a = {};
        const char *field = NULL, *reason = NULL, *id;
        int r;

        id = rest_param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        if (rest_request_parse_json(req, false, &o) < 0)
                return 0;
        r = json_dispatch_full(o, table, REST_BODY_FLAGS, &a, &field, &reason);
        if (r < 0) {
                free(a.code);
                return rest_reply_dispatch_error(req, r, field, reason);
        }
        r = rest_call_manager(req, "Eval", REST_CALL_TIMEOUT_SHORT, on_reply_agent, "ss", id, a.code);
        free(a.code);
        return r;
}

/* run_code: the four fields of forkd's REST API v1, checked, plus the agent's truncated and
 * timed_out flags where it sends them. */
static int on_reply_run_code(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *o = NULL, *out = NULL;
        struct json_object *v;
        const char *s;
        int r;

        r = rest_reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        r = sd_bus_message_read_basic(reply, 's', &s);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        r = json_parse_strict(s, strlen(s), 16 * 1024 * 1024, 64, &o, NULL);
        if (r < 0)
                return rest_reply_error(req, 500, "the guest agent's reply is not a JSON object");
        out = json_object_new_object();
        if (!out)
                return rest_reply_error(req, 500, "out of memory");
        for (unsigned i = 0; i < 2; i++) {
                const char *k = i == 0 ? "stdout" : "stderr";

                if (!json_object_object_get_ex(o, k, &v) || !json_object_is_type(v, json_type_string))
                        return rest_reply_error(req, 500, "the guest agent's reply has no %s string", k);
                json_object_object_add(out, k, json_object_get(v));
        }
        if (!json_object_object_get_ex(o, "error", &v) ||
            (v && !json_object_is_type(v, json_type_string)))
                return rest_reply_error(req, 500, "the guest agent's reply has no error string or null");
        json_object_object_add(out, "error", json_object_get(v));
        if (!json_object_object_get_ex(o, "exit_code", &v) || !json_object_is_type(v, json_type_int))
                return rest_reply_error(req, 500, "the guest agent's reply has no integer exit_code");
        json_object_object_add(out, "exit_code", json_object_get(v));
        for (unsigned i = 0; i < 2; i++) {
                const char *k = i == 0 ? "truncated" : "timed_out";

                if (json_object_object_get_ex(o, k, &v) && json_object_is_type(v, json_type_boolean))
                        json_object_object_add(out, k, json_object_get(v));
        }
        return rest_reply_json(req, 200, out);
}

struct run_code_args {
        char *code;
        int64_t timeout_secs;
};

int rest_route_sandbox_run_code(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "code", JSON_KIND_STRING, NULL, offsetof(struct run_code_args, code), 0, JSON_MANDATORY },
                { "timeout_secs", JSON_KIND_INT64, NULL, offsetof(struct run_code_args, timeout_secs), 0,
                  JSON_NULLABLE },
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct run_code_args a = {};
        const char *field = NULL, *reason = NULL, *id;
        int r;

        id = rest_param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        if (rest_request_parse_json(req, false, &o) < 0)
                return 0;
        r = json_dispatch_full(o, table, REST_BODY_FLAGS, &a, &field, &reason);
        _cleanup_free_ char *code = a.code;
        if (r < 0)
                return rest_reply_dispatch_error(req, r, field, reason);
        if (strlen(code) > CODE_MAX)
                return rest_reply_error(req, 400, "code is longer than %d bytes", CODE_MAX);
        if (strlen(code) != (size_t) json_object_get_string_len(json_object_object_get(o, "code")))
                return rest_reply_error(req, 400, "code must not contain NUL characters");
        if (a.timeout_secs < 0 || a.timeout_secs > EXEC_TIMEOUT_MAX)
                return rest_reply_error(req, 400, "timeout_secs must be between 0 and %d", EXEC_TIMEOUT_MAX);

        r = rest_new_manager_call(req, "RunCode", &m);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        r = sd_bus_message_append(m, "ssu", id, code, (uint32_t) a.timeout_secs);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, (uint64_t) ((a.timeout_secs ?: 30) + 30) * USEC_PER_SEC, on_reply_run_code);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        return 0;
}

static int on_reply_port(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *o = NULL;
        const char *addr;
        int r;

        r = rest_reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        r = sd_bus_message_read_basic(reply, 's', &addr);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        o = json_object_new_object();
        if (!o || json_object_object_add(o, "host_addr", json_object_new_string(addr)) < 0)
                return rest_reply_error(req, 500, "out of memory");
        return rest_reply_json(req, 200, o);
}

struct port_args {
        int64_t port;
};

/* POST /v1/sandboxes/:id/ports {"port": P}: where the host dials the guest's
 * TCP port P. 409 for a sandbox without NIC. */
int rest_route_sandbox_ports(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "port", JSON_KIND_INT64, NULL, offsetof(struct port_args, port), 0, JSON_MANDATORY },
                {}
        };
        _cleanup_json_ struct json_object *o = NULL;
        struct port_args a = {};
        const char *id;
        int r;

        id = rest_param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        r = rest_parse_body(req, false, table, &a, NULL, &o);
        if (r <= 0)
                return r;
        if (a.port < 1 || a.port > 65535)
                return rest_reply_error(req, 400, "port must be an integer between 1 and 65535");
        return rest_call_manager(req, "ExposePort", REST_CALL_TIMEOUT_SHORT, on_reply_port, "sq", id,
                                 (uint16_t) a.port);
}

static int on_reply_diff(RestRequest *req, sd_bus_message *reply) {
        static const char *const keys[3] = { "added", "removed", "modified" };
        _cleanup_json_ struct json_object *out = NULL;
        int r;

        r = rest_reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        out = json_object_new_object();
        if (!out)
                return rest_reply_error(req, 500, "out of memory");
        for (unsigned k = 0; k < 3; k++) {
                struct json_object *l = json_object_new_array();
                const char *s;

                if (!l || json_object_object_add(out, keys[k], l) < 0) {
                        json_object_put(l);
                        return rest_reply_error(req, 500, "out of memory");
                }
                r = sd_bus_message_enter_container(reply, 'a', "s");
                while (r >= 0 && (r = sd_bus_message_read_basic(reply, 's', &s)) > 0)
                        if (json_object_array_add(l, json_object_new_string(s)) < 0)
                                r = -ENOMEM;
                if (r >= 0)
                        r = sd_bus_message_exit_container(reply);
                if (r < 0)
                        return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        }
        return rest_reply_json(req, 200, out);
}

struct diff_args {
        char other[REST_TAG_MAX + 2];
        struct json_object *paths;
};

int rest_route_sandbox_diff(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "other", JSON_KIND_STRING, NULL, offsetof(struct diff_args, other),
                  JSON_FIELD_SIZE(struct diff_args, other), JSON_MANDATORY },
                { "paths", JSON_KIND_ARRAY, NULL, offsetof(struct diff_args, paths), 0, JSON_NULLABLE },
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct diff_args a = {};
        const char *id;
        size_t n = 0;
        int r;

        id = rest_param_or_reply(req, "sandbox id");
        if (!id)
                return 0;
        r = rest_parse_body(req, false, table, &a, &(struct rest_body_rules) { .tag = "other", .tag_value = a.other },
                            &o);
        if (r <= 0)
                return r;
        if (a.paths) {
                n = json_object_array_length(a.paths);
                if (n < 1 || n > HASH_PATHS_MAX)
                        return rest_reply_error(req, 400, "paths must hold 1 to %u paths (absent: /root and /tmp)",
                                                HASH_PATHS_MAX);
                for (size_t i = 0; i < n; i++) {
                        struct json_object *e = json_object_array_get_idx(a.paths, i);

                        if (!e || !json_object_is_type(e, json_type_string) ||
                            strlen(json_object_get_string(e)) != (size_t) json_object_get_string_len(e) ||
                            !hash_path_is_valid(json_object_get_string(e)))
                                return rest_reply_error(req, 400,
                                                        "paths[%zu]: expected an absolute, normalized path (no '.', "
                                                        "'..', '//' or trailing '/')", i);
                }
        }

        r = rest_new_manager_call(req, "DiffSandboxes", &m);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        r = sd_bus_message_append(m, "ss", id, a.other);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "s");
        for (size_t i = 0; r >= 0 && i < n; i++)
                r = sd_bus_message_append_basic(m, 's', json_object_get_string(json_object_array_get_idx(a.paths, i)));
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, CALL_TIMEOUT_DIFF, on_reply_diff);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        return 0;
}
