/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* forkd-rest writes D-Bus replies straight into JSON text (rest-json-text.c):
 * the text must be byte for byte what the json-c path made of the same reply,
 * for every type the interface uses, strings that need escaping, the
 * "expires_at" null, types it skips, and a truncated message; and the NDJSON
 * line of a process's output, against json-c's making of it. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <json-c/json.h>
#include <systemd/sd-bus.h>

#include "base64.h"
#include "json-util.h"
#include "rest-json-text.h"
#include "rest-util.h"

static sd_bus *bus;

static int setup(void **state) {
        int fds[2];

        (void) state;
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) < 0 || sd_bus_new(&bus) < 0 ||
            sd_bus_set_fd(bus, fds[0], fds[0]) < 0 || sd_bus_start(bus) < 0)
                return -1;
        close(fds[1]);
        return 0;
}

static int teardown(void **state) {
        (void) state;
        sd_bus_flush_close_unref(bus);
        return 0;
}

static sd_bus_message *new_message(void) {
        sd_bus_message *m = NULL;

        assert_int_equal(sd_bus_message_new_method_call(bus, &m, "org.forkd.Manager", "/org/forkd/Manager",
                                                        "org.forkd.Manager", "X"),
                         0);
        return m;
}

static void seal(sd_bus_message *m) {
        assert_true(sd_bus_message_seal(m, 1, 0) >= 0);
        assert_true(sd_bus_message_rewind(m, true) >= 0);
}

/* Both conversions of the sealed message m (a{sv} or aa{sv}); returns the text. */
static char *both(sd_bus_message *m, bool array) {
        struct json_object *o = NULL;
        RestJsonText t = {};
        const char *want;
        size_t len;

        assert_int_equal(array ? rest_bus_read_dict_array_json(m, &o) : rest_bus_read_dict_json(m, &o), 0);
        want = rest_json_string(o, &len);
        assert_non_null(want);
        assert_true(sd_bus_message_rewind(m, true) >= 0);
        assert_int_equal(array ? rest_bus_write_dict_array_json(m, &t) : rest_bus_write_dict_json(m, &t), 0);
        assert_int_equal(sd_bus_message_at_end(m, true), 1);
        assert_string_equal(t.buf, want);
        assert_int_equal(t.len, len);
        json_object_put(o);
        return t.buf;
}

static void append_info(sd_bus_message *m, const char *id, bool usage) {
        static const char *const ss[] = { "a", "b/c", NULL };
        uint32_t au[] = { 1, 4000000000u };

        assert_true(sd_bus_message_open_container(m, 'a', "{sv}") >= 0);
        assert_true(sd_bus_message_append(m, "{sv}{sv}{sv}{sv}{sv}{sv}{sv}{sv}{sv}{sv}", "id", "s", id, "owner_uid", "u",
                                          (uint32_t) 1000, "created_at_unix", "t", UINT64_MAX, "delta", "x",
                                          INT64_MIN, "small", "n", (int16_t) -3, "q", "q", (uint16_t) 65535, "byte",
                                          "y", (uint8_t) 255, "int", "i", (int32_t) -7, "running", "b", 1, "off", "b",
                                          0) >= 0);
        assert_true(sd_bus_message_append(m, "{sv}{sv}{sv}", "cpu_limit", "d", 0.5, "tenth", "d", 0.1, "path", "o",
                                          "/org/forkd/Sandbox/x") >= 0);
        assert_true(sd_bus_message_append(m, "{sv}", "expires_at", "s", "") >= 0);
        assert_true(sd_bus_message_append(m, "{sv}", "sig", "g", "a{sv}") >= 0);
        assert_true(sd_bus_message_open_container(m, 'e', "sv") >= 0);
        assert_true(sd_bus_message_append(m, "s", "names") >= 0);
        assert_true(sd_bus_message_open_container(m, 'v', "as") >= 0);
        assert_true(sd_bus_message_append_strv(m, (char **) ss) >= 0);
        assert_true(sd_bus_message_close_container(m) >= 0);
        assert_true(sd_bus_message_close_container(m) >= 0);
        assert_true(sd_bus_message_open_container(m, 'e', "sv") >= 0);
        assert_true(sd_bus_message_append(m, "s", "au") >= 0);
        assert_true(sd_bus_message_open_container(m, 'v', "au") >= 0);
        assert_true(sd_bus_message_append_array(m, 'u', au, sizeof(au)) >= 0);
        assert_true(sd_bus_message_close_container(m) >= 0);
        assert_true(sd_bus_message_close_container(m) >= 0);
        /* a type the interface does not use: skipped by both */
        assert_true(sd_bus_message_append(m, "{sv}", "pair", "(ss)", "x", "y") >= 0);
        assert_true(sd_bus_message_append(m, "{sv}", "empty", "as", 0) >= 0);
        assert_true(sd_bus_message_append(m, "{sv}", "disk_rate", "a{st}", 2, "bandwidth", UINT64_C(10485760), "ops",
                                          UINT64_C(0)) >= 0);
        assert_true(sd_bus_message_append(m, "{sv}", "nothing", "a{sv}", 0) >= 0);
        if (usage) {
                assert_true(sd_bus_message_open_container(m, 'e', "sv") >= 0);
                assert_true(sd_bus_message_append(m, "s", "usage") >= 0);
                assert_true(sd_bus_message_open_container(m, 'v', "a{sv}") >= 0);
                assert_true(sd_bus_message_open_container(m, 'a', "{sv}") >= 0);
                assert_true(sd_bus_message_append(m, "{sv}{sv}{sv}", "cpu_usec", "t", UINT64_C(1213), "throttled_usec",
                                                  "a{st}", 2, "disk", UINT64_C(0), "net", UINT64_C(5),
                                                  "expires_at", "s", "2026-12-02T00:00:00Z") >= 0);
                assert_true(sd_bus_message_close_container(m) >= 0);
                assert_true(sd_bus_message_close_container(m) >= 0);
                assert_true(sd_bus_message_close_container(m) >= 0);
        }
        assert_true(sd_bus_message_open_container(m, 'e', "sv") >= 0);
        assert_true(sd_bus_message_append(m, "s", "volumes") >= 0);
        assert_true(sd_bus_message_open_container(m, 'v', "aa{sv}") >= 0);
        assert_true(sd_bus_message_open_container(m, 'a', "a{sv}") >= 0);
        assert_true(sd_bus_message_append(m, "a{sv}", 2, "guest", "s", "/data", "mode", "s", "ro") >= 0);
        assert_true(sd_bus_message_append(m, "a{sv}", 0) >= 0);
        assert_true(sd_bus_message_close_container(m) >= 0);
        assert_true(sd_bus_message_close_container(m) >= 0);
        assert_true(sd_bus_message_close_container(m) >= 0);
        assert_true(sd_bus_message_close_container(m) >= 0);
}

static void test_sandbox_info(void **state) {
        sd_bus_message *m = new_message();
        char *text;

        (void) state;
        append_info(m, "sb-1", true);
        seal(m);
        text = both(m, false);
        assert_non_null(strstr(text, "\"expires_at\":null"));
        assert_non_null(strstr(text, "\"created_at_unix\":18446744073709551615"));
        assert_null(strstr(text, "pair"));
        free(text);
        sd_bus_message_unref(m);
}

static void test_list(void **state) {
        sd_bus_message *m = new_message();
        char *text;

        (void) state;
        assert_true(sd_bus_message_open_container(m, 'a', "a{sv}") >= 0);
        for (unsigned i = 0; i < 50; i++) {
                char id[16];

                snprintf(id, sizeof(id), "sb-%u", i);
                append_info(m, id, i % 2);
        }
        assert_true(sd_bus_message_close_container(m) >= 0);
        seal(m);
        free(both(m, true));
        sd_bus_message_unref(m);

        m = new_message();
        assert_true(sd_bus_message_append(m, "aa{sv}", 0) >= 0);
        seal(m);
        text = both(m, true);
        assert_string_equal(text, "[]");
        free(text);
        sd_bus_message_unref(m);
}

/* Every byte that JSON must escape, and UTF-8 left as it is. */
static void test_strings(void **state) {
        char s[128], key[8] = "k";
        sd_bus_message *m = new_message();
        size_t n = 0;

        (void) state;
        for (unsigned c = 1; c < 0x80; c++)
                s[n++] = (char) c;
        s[n] = 0;
        assert_true(sd_bus_message_open_container(m, 'a', "{sv}") >= 0);
        assert_true(sd_bus_message_append(m, "{sv}{sv}{sv}", "ascii", "s", s, "utf8", "s", "gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x90\x8d",
                                          "quote\"key\\", "s", "\"/\\") >= 0);
        for (unsigned c = 1; c < 0x20; c++) {
                key[1] = (char) c;
                key[2] = 0;
                assert_true(sd_bus_message_append(m, "{sv}", key, "s", "") >= 0);
        }
        assert_true(sd_bus_message_close_container(m) >= 0);
        seal(m);
        free(both(m, false));
        sd_bus_message_unref(m);
}

/* A message whose a{sv} ends early (an entry's variant missing) fails both ways. */
static void test_bad_message(void **state) {
        RestJsonText t = {};
        sd_bus_message *m = new_message();
        struct json_object *o = NULL;

        (void) state;
        assert_true(sd_bus_message_append(m, "as", 1, "not a dict") >= 0);
        seal(m);
        assert_true(rest_bus_write_dict_json(m, &t) < 0);
        rest_json_text_done(&t);
        assert_true(sd_bus_message_rewind(m, true) >= 0);
        assert_true(rest_bus_read_dict_json(m, &o) < 0);
        assert_null(o);
        sd_bus_message_unref(m);
}

/* The chunk line as json-c makes it: the object the NDJSON streams had before. */
static void check_chunk(const char *stream, uint64_t offset, const void *data, size_t len) {
        struct json_object *o = json_object_new_object();
        RestJsonText t = {};
        const char *want;
        size_t n;

        json_object_object_add(o, "stream", json_object_new_string(stream));
        json_object_object_add(o, "offset", json_object_new_int64((int64_t) offset));
        if (utf8_is_valid_n(data, len))
                json_object_object_add(o, "data", json_object_new_string_len(data, (int) len));
        else {
                char *b64 = malloc(BASE64_ENCODED_SIZE(len) + 1);

                assert_non_null(b64);
                b64[base64_encode(data, len, b64)] = 0;
                json_object_object_add(o, "data_b64", json_object_new_string(b64));
                free(b64);
        }
        want = rest_json_string(o, &n);
        assert_int_equal(rest_json_text_output_chunk(&t, stream, offset, data, len), 0);
        assert_string_equal(t.buf, want);
        assert_int_equal(t.len, n);
        rest_json_text_done(&t);
        json_object_put(o);
}

static void test_output_chunk(void **state) {
        static char big[70000];

        (void) state;
        check_chunk("stdout", 0, "", 0);
        check_chunk("stdout", 12, "hello\n", 6);
        {
                static const char odd[] = "tab\tquote\"nul\0end\x7f";

                check_chunk("stderr", UINT64_C(1) << 40, odd, sizeof(odd) - 1);
        }
        check_chunk("stdout", 3, "\xff\xfe\n", 3);
        check_chunk("stdout", 4, "caf\xc3\xa9 \xe2\x82\xac", 9);
        check_chunk("stdout", 5, "cut \xe2\x82", 6);
        memset(big, 'x', sizeof(big));
        big[40000] = '\n';
        check_chunk("stdout", 7, big, sizeof(big));
        big[50000] = (char) 0x80;
        check_chunk("stdout", 8, big, sizeof(big));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_sandbox_info),
                cmocka_unit_test(test_list),
                cmocka_unit_test(test_strings),
                cmocka_unit_test(test_bad_message),
                cmocka_unit_test(test_output_chunk),
        };

        return cmocka_run_group_tests(tests, setup, teardown);
}
