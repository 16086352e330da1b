/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Unit tests for forkctl mcp without forkd: the framing of mcp_serve() at its
 * limits (a line of exactly MCP_LINE_MAX bytes, one byte more, CRLF, no final
 * newline), the JSON-RPC envelope, and argument checks that answer before any
 * bus is needed. test-forkctl-mcp.py drives the tools against the real stack. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "json-util.h"
#include "macro.h"
#include "mcp-args.h"
#include "mcp-tools.h"
#include "mcp.h"

#define NO_BUS "unix:path=/nonexistent/forkctl-mcp-test-bus"

static int memfd_with(const char *data, size_t n) {
        int fd = memfd_create("mcp-test", MFD_CLOEXEC);

        assert_true(fd >= 0);
        for (size_t done = 0; done < n;) {
                ssize_t k = write(fd, data + done, n - done);
                assert_true(k > 0);
                done += (size_t) k;
        }
        assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
        return fd;
}

/* Runs the server on input; returns its output lines parsed, as an array. */
static struct json_object *serve(const char *input, size_t n) {
        struct mcp_server s = { .bus_address = NO_BUS };
        _cleanup_close_ int in = memfd_with(input, n), out = memfd_with("", 0);
        struct json_object *replies = json_object_new_array();
        _cleanup_free_ char *buf = NULL;
        off_t size;
        char *p, *nl;

        assert_int_equal(mcp_serve(&s, in, out), 0);
        mcp_server_done(&s);
        size = lseek(out, 0, SEEK_END);
        assert_true(size >= 0);
        buf = calloc(1, (size_t) size + 1);
        assert_non_null(buf);
        assert_int_equal(pread(out, buf, (size_t) size, 0), size);
        /* every line one JSON-RPC message, the output ends with a newline */
        assert_true(size == 0 || buf[size - 1] == '\n');
        for (p = buf; (nl = strchr(p, '\n')); p = nl + 1) {
                struct json_object *m = NULL;
                assert_int_equal(json_parse_strict(p, (size_t) (nl - p), SIZE_MAX, 64, &m, NULL), 0);
                assert_string_equal(json_object_get_string(json_object_object_get(m, "jsonrpc")), "2.0");
                json_object_array_add(replies, m);
        }
        return replies;
}

static int64_t error_code(struct json_object *reply) {
        struct json_object *e;

        if (!json_object_object_get_ex(reply, "error", &e))
                return 0;
        return json_object_get_int64(json_object_object_get(e, "code"));
}

#define INIT "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2024-11-05\"}}\n"

/* A ping with id, padded to exactly len bytes. */
static char *ping_of_length(int id, size_t len) {
        static const char head[] = "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"ping\",\"params\":{\"pad\":\"";
        char h[128];
        size_t hl = (size_t) snprintf(h, sizeof h, head, id);
        char *s = malloc(len + 1);

        assert_non_null(s);
        assert_true(len > hl + 3);
        memcpy(s, h, hl);
        memset(s + hl, 'x', len - hl - 3);
        memcpy(s + len - 3, "\"}}", 3);
        s[len] = 0;
        return s;
}

static void test_line_limits(void **state) {
        _cleanup_free_ char *exact = ping_of_length(1, MCP_LINE_MAX), *over = ping_of_length(2, MCP_LINE_MAX + 1),
                            *input = NULL;
        struct json_object *r;
        size_t n;
        FILE *f = open_memstream(&input, &n);

        assert_non_null(f);
        fputs(INIT, f);
        fprintf(f, "%s\n%s\n", exact, over);
        fputs("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}\r\n", f);
        fputs("\n\n", f);
        fputs("{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ping\"}", f); /* no newline before EOF */
        assert_int_equal(fclose(f), 0);

        r = serve(input, n);
        assert_int_equal(json_object_array_length(r), 5);
        assert_int_equal(json_object_get_int(json_object_object_get(json_object_array_get_idx(r, 1), "id")), 1);
        assert_int_equal(error_code(json_object_array_get_idx(r, 1)), 0);
        assert_int_equal(error_code(json_object_array_get_idx(r, 2)), JSONRPC_INVALID_REQUEST);
        assert_true(json_object_is_type(json_object_object_get(json_object_array_get_idx(r, 2), "id"), json_type_null));
        assert_int_equal(json_object_get_int(json_object_object_get(json_object_array_get_idx(r, 3), "id")), 3);
        assert_int_equal(json_object_get_int(json_object_object_get(json_object_array_get_idx(r, 4), "id")), 4);
        json_object_put(r);
}

static void test_long_line_at_eof(void **state) {
        _cleanup_free_ char *over = ping_of_length(1, MCP_LINE_MAX + 100);
        struct json_object *r = serve(over, strlen(over));

        /* no newline, more than the limit, then EOF: one error, exit 0 */
        assert_int_equal(json_object_array_length(r), 1);
        assert_int_equal(error_code(json_object_array_get_idx(r, 0)), JSONRPC_INVALID_REQUEST);
        json_object_put(r);
}

static void test_many_values(void **state) {
        _cleanup_free_ char *input = NULL;
        struct json_object *r;
        size_t n;
        FILE *f = open_memstream(&input, &n);

        /* a small line of many values: refused before json-c allocates them */
        assert_non_null(f);
        fputs(INIT "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{\"a\":[", f);
        for (unsigned i = 0; i < MCP_JSON_VALUES_MAX; i++)
                fputs(i ? ",{}" : "{}", f);
        fputs("]}}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\",\"params\":{\"s\":\"{,[,{,[\"}}\n", f);
        assert_int_equal(fclose(f), 0);

        r = serve(input, n);
        assert_int_equal(json_object_array_length(r), 3);
        assert_int_equal(error_code(json_object_array_get_idx(r, 1)), JSONRPC_INVALID_REQUEST);
        assert_non_null(strstr(json_object_to_json_string(json_object_array_get_idx(r, 1)), "JSON values"));
        /* braces and commas inside strings are not values */
        assert_int_equal(error_code(json_object_array_get_idx(r, 2)), 0);
        json_object_put(r);
}

static struct json_object *handle(struct mcp_server *s, const char *msg) {
        struct json_object *reply = (struct json_object *) 0x1;

        assert_int_equal(mcp_server_handle(s, msg, strlen(msg), &reply), 0);
        return reply;
}

static void test_envelope(void **state) {
        struct mcp_server s = { .bus_address = NO_BUS };
        struct json_object *r, *v;
        static const struct {
                const char *msg;
                int code;
        } bad[] = {
                { "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}", JSONRPC_NOT_INITIALIZED },
                { "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",}", JSONRPC_PARSE_ERROR },
                { "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}{}", JSONRPC_PARSE_ERROR },
                { "\"ping\"", JSONRPC_PARSE_ERROR },
                { "[]", JSONRPC_INVALID_REQUEST },
                { "{\"jsonrpc\":2.0,\"id\":1,\"method\":\"ping\"}", JSONRPC_INVALID_REQUEST },
                { "{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"ping\"}", JSONRPC_INVALID_REQUEST },
                { "{\"jsonrpc\":\"2.0\",\"id\":true,\"method\":\"ping\"}", JSONRPC_INVALID_REQUEST },
                { "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x/y\"}", JSONRPC_METHOD_NOT_FOUND },
                { "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":\"p\"}", JSONRPC_INVALID_PARAMS },
                { "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":5}}",
                  JSONRPC_INVALID_PARAMS },
        };

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                r = handle(&s, bad[i].msg);
                assert_non_null(r);
                if (error_code(r) != bad[i].code)
                        fail_msg("%s: %s", bad[i].msg, json_object_to_json_string(r));
                json_object_put(r);
        }

        /* notifications and responses: no reply (and *ret_reply is set to NULL) */
        assert_null(handle(&s, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}"));
        assert_null(handle(&s, "{\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{}}"));
        assert_null(handle(&s, "   "));
        assert_false(s.initialized);

        r = handle(&s, "{\"jsonrpc\":\"2.0\",\"id\":\"i\",\"method\":\"initialize\",\"params\":{\"protocolVersion\":"
                       "\"2025-03-26\",\"capabilities\":{}}}");
        assert_true(json_object_object_get_ex(r, "result", &v));
        assert_string_equal(json_object_get_string(json_object_object_get(v, "protocolVersion")), "2025-03-26");
        assert_string_equal(json_object_get_string(json_object_object_get(r, "id")), "i");
        json_object_put(r);
        assert_true(s.initialized);

        /* argument checks answer before the bus is needed (there is none) */
        r = handle(&s, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"exec\","
                       "\"arguments\":{\"sandbox_id\":\"sb-1\",\"args\":[\"ls\"],\"timeout_secs\":-1}}}");
        assert_true(json_object_object_get_ex(r, "result", &v));
        assert_true(json_object_get_boolean(json_object_object_get(v, "isError")));
        assert_non_null(strstr(json_object_to_json_string(v), "from 0 to 3600, not -1"));
        json_object_put(r);

        /* valid arguments reach the bus, which is not there: still a tool error */
        r = handle(&s, "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"name\":\"kill_sandbox\","
                       "\"arguments\":{\"sandbox_id\":\"sb-1\"}}}");
        assert_true(json_object_object_get_ex(r, "result", &v));
        assert_true(json_object_get_boolean(json_object_object_get(v, "isError")));
        assert_non_null(strstr(json_object_to_json_string(v), "cannot connect to the bus"));
        json_object_put(r);
        mcp_server_done(&s);
}

static void test_schemas(void **state) {
        struct json_object *list = NULL;

        assert_int_equal(mcp_tools_list(&list), 0);
        assert_int_equal(json_object_array_length(list), 12);
        assert_true(mcp_tool_exists("pause_sandbox") && mcp_tool_exists("resume_sandbox"));
        for (size_t i = 0; i < json_object_array_length(list); i++) {
                struct json_object *t = json_object_array_get_idx(list, i), *sc, *props, *req;

                assert_true(mcp_tool_exists(json_object_get_string(json_object_object_get(t, "name"))));
                assert_true(json_object_object_get_ex(t, "inputSchema", &sc));
                assert_string_equal(json_object_get_string(json_object_object_get(sc, "type")), "object");
                assert_true(json_object_object_get_ex(sc, "properties", &props));
                assert_true(json_object_is_type(props, json_type_object));
                assert_false(json_object_get_boolean(json_object_object_get(sc, "additionalProperties")));
                if (json_object_object_get_ex(sc, "required", &req))
                        for (size_t k = 0; k < json_object_array_length(req); k++)
                                assert_true(json_object_object_get_ex(
                                        props, json_object_get_string(json_object_array_get_idx(req, k)), NULL));
        }
        assert_false(mcp_tool_exists("rm"));
        json_object_put(list);
}

/* MCP_NUMBER and MCP_RATE: JSON types exactly; the values' bounds are forkd's,
 * checked by the tools (test-forkctl-mcp). */
static void test_number_and_rate(void **state) {
        static const struct mcp_param params[] = {
                { .name = "cpu_limit", .type = MCP_NUMBER, .min = 0, .offset = ARG(cpu_limit), .description = "c" },
                { .name = "disk_rate", .type = MCP_RATE, .offset = ARG(disk_rate), .description = "d" },
                {}
        };
        static const struct {
                const char *json;
                int r;
                const char *error;
        } cases[] = {
                { "{}", 0, NULL },
                { "{\"cpu_limit\": 0.5, \"disk_rate\": {\"ops\": 5}}", 0, NULL },
                { "{\"cpu_limit\": 2}", 0, NULL },
                { "{\"cpu_limit\": 0}", -ERANGE, "must be a number above 0, not 0" },
                { "{\"cpu_limit\": -1.5}", -ERANGE, "above 0" },
                { "{\"cpu_limit\": \"1\"}", -EINVAL, "'cpu_limit' must be a number, not a string" },
                { "{\"cpu_limit\": true}", -EINVAL, "must be a number, not a boolean" },
                { "{\"disk_rate\": 5}", -EINVAL, "'disk_rate' must be an object, not an integer" },
                { "{\"disk_rate\": [1]}", -EINVAL, "must be an object, not an array" },
        };
        struct json_object *schema = NULL, *p;

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                struct json_object *o = json_tokener_parse(cases[i].json);
                struct mcp_args a = {};
                char *error = NULL;

                assert_non_null(o);
                assert_int_equal(mcp_args_parse("t", params, o, &a, &error), cases[i].r);
                if (cases[i].error) {
                        assert_non_null(error);
                        assert_non_null(strstr(error, cases[i].error));
                } else {
                        assert_null(error);
                        assert_true(a.cpu_limit == 0 || a.cpu_limit == 0.5 || a.cpu_limit == 2);
                        assert_true(!a.disk_rate || json_object_is_type(a.disk_rate, json_type_object));
                }
                free(error);
                json_object_put(o);
        }
        assert_int_equal(mcp_params_schema(params, &schema), 0);
        p = json_object_object_get(json_object_object_get(schema, "properties"), "cpu_limit");
        assert_string_equal(json_object_get_string(json_object_object_get(p, "type")), "number");
        assert_int_equal(json_object_get_int(json_object_object_get(p, "exclusiveMinimum")), 0);
        p = json_object_object_get(json_object_object_get(schema, "properties"), "disk_rate");
        assert_string_equal(json_object_get_string(json_object_object_get(p, "type")), "object");
        assert_false(json_object_get_boolean(json_object_object_get(p, "additionalProperties")));
        assert_non_null(json_object_object_get(json_object_object_get(p, "properties"), "burst"));
        json_object_put(schema);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_line_limits),
                cmocka_unit_test(test_long_line_at_eof),
                cmocka_unit_test(test_many_values),
                cmocka_unit_test(test_envelope),
                cmocka_unit_test(test_schemas),
                cmocka_unit_test(test_number_and_rate),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
