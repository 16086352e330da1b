/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkctl mcp: the JSON-RPC side of the MCP server (framing, the lifecycle,
 * the methods). The tools are in mcp-tools.c.
 *
 * One message a line. A request gets exactly one response; a notification
 * none; a line that is not a message (bad JSON, a batch, too long) gets an
 * error response with id null. Nothing a client sends ends the server but
 * EOF.
 */

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "bus-util.h"
#include "io-util.h"
#include "json-util.h"
#include "macro.h"
#include "mcp-tools.h"
#include "mcp.h"

#define READ_CHUNK (64u * 1024u)

/* Newest first: what we answer a client that asks for a version we do not know. */
static const char *const protocol_versions[] = { "2025-06-18", "2025-03-26", "2024-11-05" };

void mcp_server_done(struct mcp_server *s) {
        s->bus = sd_bus_flush_close_unref(s->bus);
}

int mcp_server_bus(struct mcp_server *s, sd_bus **ret) {
        int r;

        /* The bus may have gone away (dbus-daemon restarted): connect afresh. */
        if (s->bus && sd_bus_is_open(s->bus) <= 0)
                s->bus = sd_bus_flush_close_unref(s->bus);
        if (!s->bus) {
                r = forkctl_bus_open(s->bus_address, &s->bus);
                if (r < 0)
                        return r;
        }
        *ret = s->bus;
        return 0;
}

/* ---- responses --------------------------------------------------------------- */

static int response_new(struct json_object *id, struct json_object **ret) {
        _cleanup_json_ struct json_object *o = json_object_new_object();

        if (!o || json_object_object_add(o, "jsonrpc", json_object_new_string("2.0")) < 0 ||
            json_object_object_add(o, "id", json_object_get(id)) < 0)
                return -ENOMEM;
        *ret = TAKE_PTR(o);
        return 0;
}

static int reply_result(struct json_object *id, struct json_object *result, struct json_object **ret) {
        _cleanup_json_ struct json_object *o = NULL, *res = result;
        int r;

        if (!res)
                return -ENOMEM;
        r = response_new(id, &o);
        if (r < 0)
                return r;
        if (json_object_object_add(o, "result", TAKE_PTR(res)) < 0)
                return -ENOMEM;
        *ret = TAKE_PTR(o);
        return 0;
}

static int reply_error(struct json_object *id, int code, const char *message, struct json_object **ret) {
        _cleanup_json_ struct json_object *o = NULL, *e = json_object_new_object();
        int r;

        if (!e)
                return -ENOMEM;
        r = response_new(id, &o);
        if (r < 0)
                return r;
        if (json_object_object_add(e, "code", json_object_new_int(code)) < 0 ||
            json_object_object_add(e, "message", json_object_new_string(message)) < 0 ||
            json_object_object_add(o, "error", TAKE_PTR(e)) < 0)
                return -ENOMEM;
        log_debug("answering error %d: %s", code, message);
        *ret = TAKE_PTR(o);
        return 0;
}

static int reply_errorf(struct json_object *id, int code, struct json_object **ret, const char *fmt, ...)
        _printf_(4, 5);
static int reply_errorf(struct json_object *id, int code, struct json_object **ret, const char *fmt, ...) {
        _cleanup_free_ char *msg = NULL;
        va_list ap;
        int r;

        va_start(ap, fmt);
        r = vasprintf(&msg, fmt, ap);
        va_end(ap);
        if (r < 0)
                return -ENOMEM;
        return reply_error(id, code, msg, ret);
}

/* ---- methods ------------------------------------------------------------------- */

static int method_initialize(struct mcp_server *s, struct json_object *id, struct json_object *params,
                             struct json_object **ret) {
        _cleanup_json_ struct json_object *res = json_object_new_object(), *caps = json_object_new_object(),
                                          *tools = json_object_new_object(), *info = json_object_new_object();
        struct json_object *v;
        const char *version = protocol_versions[0];

        if (s->initialized)
                return reply_error(id, JSONRPC_INVALID_REQUEST, "already initialized: initialize is sent once", ret);
        if (!params || !json_object_object_get_ex(params, "protocolVersion", &v) ||
            !json_object_is_type(v, json_type_string))
                return reply_error(id, JSONRPC_INVALID_PARAMS,
                                   "initialize: params.protocolVersion must be a string (e.g. \"2025-06-18\")", ret);
        /* Echo the client's version when we speak it, else offer our newest. */
        for (size_t i = 0; i < ELEMENTSOF(protocol_versions); i++)
                if (strcmp(json_object_get_string(v), protocol_versions[i]) == 0)
                        version = protocol_versions[i];
        if (json_object_object_get_ex(params, "capabilities", &v) && !json_object_is_type(v, json_type_object))
                return reply_error(id, JSONRPC_INVALID_PARAMS, "initialize: params.capabilities must be an object",
                                   ret);

        if (!res || !caps || !tools || !info ||
            json_object_object_add(tools, "listChanged", json_object_new_boolean(0)) < 0 ||
            json_object_object_add(caps, "tools", TAKE_PTR(tools)) < 0 ||
            json_object_object_add(info, "name", json_object_new_string("forkctl")) < 0 ||
            json_object_object_add(info, "title", json_object_new_string("forkd (forkctl mcp)")) < 0 ||
            json_object_object_add(info, "version", json_object_new_string(FORKD_VERSION)) < 0 ||
            json_object_object_add(res, "protocolVersion", json_object_new_string(version)) < 0 ||
            json_object_object_add(res, "capabilities", TAKE_PTR(caps)) < 0 ||
            json_object_object_add(res, "serverInfo", TAKE_PTR(info)) < 0 ||
            json_object_object_add(res, "instructions", json_object_new_string(
                    "forkd runs copy-on-write microVM sandboxes. Pick a snapshot with list_snapshots (or make one "
                    "with create_snapshot), start sandboxes with spawn_sandboxes, work in them with run_code "
                    "(globals persist), exec and eval; fan out from a sandbox's current state with fork_sandbox, "
                    "keep it as a snapshot with branch_sandbox, and kill_sandbox what you no longer need.")) < 0)
                return -ENOMEM;

        s->initialized = true;
        s->protocol_version = version;
        return reply_result(id, TAKE_PTR(res), ret);
}

static int method_ping(struct mcp_server *s, struct json_object *id, struct json_object *params,
                       struct json_object **ret) {
        return reply_result(id, json_object_new_object(), ret);
}

static int method_tools_list(struct mcp_server *s, struct json_object *id, struct json_object *params,
                             struct json_object **ret) {
        _cleanup_json_ struct json_object *res = json_object_new_object();
        struct json_object *list = NULL, *cursor;
        int r;

        /* One page: a cursor can only be one we never handed out. */
        if (params && json_object_object_get_ex(params, "cursor", &cursor))
                return reply_error(id, JSONRPC_INVALID_PARAMS, "tools/list: unknown cursor (the list has one page)",
                                   ret);
        if (!res)
                return -ENOMEM;
        r = mcp_tools_list(&list);
        if (r < 0)
                return r;
        if (json_object_object_add(res, "tools", list) < 0)
                return -ENOMEM;
        return reply_result(id, TAKE_PTR(res), ret);
}

static int method_tools_call(struct mcp_server *s, struct json_object *id, struct json_object *params,
                             struct json_object **ret) {
        struct json_object *name, *arguments = NULL, *result = NULL;
        int r;

        if (!params || !json_object_object_get_ex(params, "name", &name) ||
            !json_object_is_type(name, json_type_string))
                return reply_error(id, JSONRPC_INVALID_PARAMS, "tools/call: params.name must be a string", ret);
        if (!mcp_tool_exists(json_object_get_string(name)))
                return reply_errorf(id, JSONRPC_INVALID_PARAMS, ret,
                                    "tools/call: unknown tool \"%.*s\"; tools/list lists the tools",
                                    mcp_quote_len(json_object_get_string(name), 64), json_object_get_string(name));
        (void) json_object_object_get_ex(params, "arguments", &arguments);

        r = mcp_tools_call(s, json_object_get_string(name), arguments, &result);
        if (r < 0)
                return r;
        return reply_result(id, result, ret);
}

struct method {
        const char *name;
        bool before_initialize;
        int (*run)(struct mcp_server *s, struct json_object *id, struct json_object *params, struct json_object **ret);
};

static const struct method methods[] = {
        { "initialize", true, method_initialize },
        { "ping", true, method_ping },
        { "tools/list", false, method_tools_list },
        { "tools/call", false, method_tools_call },
};

static void notification(struct mcp_server *s, const char *method) {
        /* notifications/initialized, notifications/cancelled (a call is never in
         * flight while we read: nothing to cancel), and whatever else: no reply. */
        log_debug("notification %s", method);
}

/* ---- messages ------------------------------------------------------------------ */

/* An upper bound of the number of values in the JSON text s[0..n): one, plus
 * one for each ',', '{' and '[' outside strings. json-c spends a few hundred
 * bytes on each value, so this bounds what parsing a line may allocate. */
static size_t json_values_max(const char *s, size_t n) {
        bool in_string = false;
        size_t count = 1;

        for (size_t i = 0; i < n; i++) {
                char c = s[i];

                if (in_string) {
                        if (c == '\\')
                                i++;
                        else if (c == '"')
                                in_string = false;
                } else if (c == '"')
                        in_string = true;
                else if (c == ',' || c == '{' || c == '[')
                        count++;
        }
        return count;
}

int mcp_server_handle(struct mcp_server *s, const char *line, size_t len, struct json_object **ret_reply) {
        _cleanup_json_ struct json_object *msg = NULL;
        struct json_object *jsonrpc, *id = NULL, *method, *params = NULL;
        const char *error = NULL, *name;
        size_t i = 0;
        int r;

        *ret_reply = NULL;
        while (i < len && strchr(" \t\r", line[i]))
                i++;
        if (i == len)
                return 0; /* an empty line: nothing */
        if (line[i] == '[')
                return reply_error(NULL, JSONRPC_INVALID_REQUEST,
                                   "batch requests are not supported: send one JSON-RPC message a line", ret_reply);

        if (json_values_max(line, len) > MCP_JSON_VALUES_MAX)
                return reply_errorf(NULL, JSONRPC_INVALID_REQUEST, ret_reply,
                                    "invalid request: a message of more than %u JSON values", MCP_JSON_VALUES_MAX);

        r = json_parse_strict(line, len, MCP_LINE_MAX, MCP_JSON_DEPTH_MAX, &msg, &error);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return reply_errorf(NULL, JSONRPC_PARSE_ERROR, ret_reply, "parse error: %s; one JSON-RPC 2.0 "
                                    "message (an object) a line", error ?: "invalid JSON");

        /* A usable id first, so that the other errors can name it. */
        if (json_object_object_get_ex(msg, "id", &id) &&
            !json_object_is_type(id, json_type_string) && !json_object_is_type(id, json_type_int))
                return reply_error(NULL, JSONRPC_INVALID_REQUEST, "invalid request: id must be a string or an integer",
                                   ret_reply);

        if (!json_object_object_get_ex(msg, "jsonrpc", &jsonrpc) || !json_object_is_type(jsonrpc, json_type_string) ||
            strcmp(json_object_get_string(jsonrpc), "2.0") != 0)
                return reply_error(id, JSONRPC_INVALID_REQUEST, "invalid request: jsonrpc must be \"2.0\"", ret_reply);

        if (!json_object_object_get_ex(msg, "method", &method)) {
                if (id && (json_object_object_get_ex(msg, "result", NULL) || json_object_object_get_ex(msg, "error", NULL))) {
                        /* a response: we send no requests, so it answers none of ours */
                        log_debug("ignoring a response the client sent");
                        return 0;
                }
                return reply_error(id, JSONRPC_INVALID_REQUEST, "invalid request: method is missing", ret_reply);
        }
        if (!json_object_is_type(method, json_type_string))
                return reply_error(id, JSONRPC_INVALID_REQUEST, "invalid request: method must be a string", ret_reply);
        name = json_object_get_string(method);

        if (!id) {
                notification(s, name);
                return 0;
        }

        if (json_object_object_get_ex(msg, "params", &params) && !json_object_is_type(params, json_type_object))
                return reply_errorf(id, JSONRPC_INVALID_PARAMS, ret_reply, "invalid params: %.*s takes its params "
                                    "as an object", mcp_quote_len(name, 64), name);

        for (size_t k = 0; k < ELEMENTSOF(methods); k++) {
                if (strcmp(methods[k].name, name) != 0)
                        continue;
                if (!s->initialized && !methods[k].before_initialize)
                        return reply_errorf(id, JSONRPC_NOT_INITIALIZED, ret_reply,
                                            "not initialized: send initialize before %s", name);
                return methods[k].run(s, id, params, ret_reply);
        }
        if (strncmp(name, "notifications/", 14) == 0)
                return reply_errorf(id, JSONRPC_INVALID_REQUEST, ret_reply,
                                    "invalid request: %.*s is a notification, sent without an id",
                                    mcp_quote_len(name, 64), name);
        return reply_errorf(id, JSONRPC_METHOD_NOT_FOUND, ret_reply,
                            "method not found: %.*s (this server has initialize, ping, tools/list, tools/call)",
                            mcp_quote_len(name, 64), name);
}

/* ---- the stdio transport ------------------------------------------------------- */

static int send_reply(int out_fd, struct json_object *reply) {
        const char *s;
        size_t n;
        int r;

        /* json-c escapes control characters: the message stays one line */
        s = json_object_to_json_string_length(reply, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &n);
        if (!s)
                return -ENOMEM;
        r = loop_write(out_fd, s, n);
        if (r >= 0)
                r = loop_write(out_fd, "\n", 1);
        return r;
}

static int handle_line(struct mcp_server *s, int out_fd, const char *line, size_t len) {
        _cleanup_json_ struct json_object *reply = NULL;
        int r;

        r = mcp_server_handle(s, line, len, &reply);
        if (r < 0)
                return log_error_errno(r, "Failed to handle a message: %m");
        if (!reply)
                return 0;
        r = send_reply(out_fd, reply);
        if (r < 0)
                return log_error_errno(r, "Failed to write to stdout: %m");
        return 0;
}

static int too_long(struct mcp_server *s, int out_fd) {
        _cleanup_json_ struct json_object *reply = NULL;
        int r;

        log_warning("Skipping a message of more than %u bytes.", MCP_LINE_MAX);
        r = reply_errorf(NULL, JSONRPC_INVALID_REQUEST, &reply,
                         "invalid request: a message of more than %u bytes; it was skipped", MCP_LINE_MAX);
        if (r < 0)
                return r;
        r = send_reply(out_fd, reply);
        if (r < 0)
                return log_error_errno(r, "Failed to write to stdout: %m");
        return 0;
}

int mcp_serve(struct mcp_server *s, int in_fd, int out_fd) {
        _cleanup_free_ char *buf = NULL;
        size_t len = 0, cap = MCP_LINE_MAX + READ_CHUNK;
        bool skipping = false; /* inside a line that is too long, until its newline */
        int r;

        buf = malloc(cap);
        if (!buf)
                return log_oom();

        for (;;) {
                size_t start = 0;
                ssize_t n;
                char *nl;

                n = read(in_fd, buf + len, cap - len);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN) {
                                struct pollfd pfd = { .fd = in_fd, .events = POLLIN };
                                (void) poll(&pfd, 1, -1);
                                continue;
                        }
                        return log_error_errno(errno, "Failed to read stdin: %m");
                }
                if (n == 0) {
                        /* EOF: a last message without its newline still counts */
                        if (len > 0 && !skipping) {
                                if (len > MCP_LINE_MAX)
                                        return too_long(s, out_fd);
                                return handle_line(s, out_fd, buf, len);
                        }
                        return 0;
                }
                len += (size_t) n;

                while ((nl = memchr(buf + start, '\n', len - start))) {
                        size_t l = (size_t) (nl - (buf + start));

                        if (skipping)
                                skipping = false; /* the end of the long line: answered already */
                        else {
                                r = l > MCP_LINE_MAX ? too_long(s, out_fd) : handle_line(s, out_fd, buf + start, l);
                                if (r < 0)
                                        return r;
                        }
                        start += l + 1;
                }
                memmove(buf, buf + start, len - start);
                len -= start;

                if (len > MCP_LINE_MAX) {
                        /* no newline within the limit: answer now, drop the rest of the line */
                        if (!skipping) {
                                r = too_long(s, out_fd);
                                if (r < 0)
                                        return r;
                        }
                        skipping = true;
                        len = 0;
                } else if (skipping)
                        len = 0;
        }
}
