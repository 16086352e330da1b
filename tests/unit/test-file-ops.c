/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* src/shared/file-ops.c: forkd's checks of a guest's read_file and write_file
 * answers, which come from the guest and are hostile. A refused answer leaves
 * the output parameters and the buffer untouched. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base64.h"
#include "file-ops.h"

static struct json_object *parse(const char *s) {
        struct json_object *o = json_tokener_parse(s);

        assert_non_null(o);
        return o;
}

static uint8_t *buf_new(void) {
        uint8_t *b = malloc(FILE_OP_MAX);

        assert_non_null(b);
        memset(b, 0xa5, FILE_OP_MAX);
        return b;
}

static void test_read_ok(void **state) {
        struct json_object *o = parse("{\"path\": \"/a\", \"data_b64\": \"AP9hYg==\", \"size\": 4}");
        uint8_t *b = buf_new();
        const char *why = NULL;
        size_t len = 0;

        (void) state;
        assert_int_equal(file_read_answer_decode(o, b, &len, &why), 0);
        assert_int_equal(len, 4);
        assert_memory_equal(b, "\x00\xff" "ab", 4);
        json_object_put(o);
        /* an empty file */
        o = parse("{\"data_b64\": \"\", \"size\": 0}");
        assert_int_equal(file_read_answer_decode(o, b, &len, &why), 0);
        assert_int_equal(len, 0);
        json_object_put(o);
        free(b);
}

static void test_read_refused(void **state) {
        static const char *const bad[] = {
                "{}",
                "{\"data_b64\": \"AA==\"}",
                "{\"size\": 1}",
                "{\"data_b64\": 5, \"size\": 1}",
                "{\"data_b64\": null, \"size\": 0}",
                "{\"data_b64\": \"AA==\", \"size\": \"1\"}",
                "{\"data_b64\": \"AA==\", \"size\": 1.0}",
                "{\"data_b64\": \"AA==\", \"size\": 2}",    /* disagrees */
                "{\"data_b64\": \"AA==\", \"size\": -1}",
                "{\"data_b64\": \"AA=\", \"size\": 1}",     /* not base64 */
                "{\"data_b64\": \"AB==\", \"size\": 1}",    /* not canonical */
                "{\"data_b64\": \"A A=\", \"size\": 1}",
                "[1]",
        };
        uint8_t *b = buf_new();

        (void) state;
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                struct json_object *o = parse(bad[i]);
                const char *why = NULL;
                size_t len = 77;

                assert_int_equal(file_read_answer_decode(o, b, &len, &why), -EBADMSG);
                assert_non_null(why);
                assert_int_equal(len, 77);
                assert_int_equal(b[0], 0xa5);
                json_object_put(o);
        }
        free(b);
}

static void test_read_cap(void **state) {
        size_t n = FILE_OP_MAX + 1, len = 77;
        uint8_t *data = calloc(1, n), *b = buf_new();
        char *b64 = malloc(BASE64_ENCODED_SIZE(n) + 1);
        struct json_object *o;
        const char *why = NULL;

        (void) state;
        assert_non_null(data);
        assert_non_null(b64);
        /* one byte over: refused before anything is decoded */
        b64[base64_encode(data, n, b64)] = 0;
        o = json_object_new_object();
        json_object_object_add(o, "data_b64", json_object_new_string(b64));
        json_object_object_add(o, "size", json_object_new_int64((int64_t) n));
        assert_int_equal(file_read_answer_decode(o, b, &len, &why), -EBADMSG);
        assert_string_equal(why, "more than 524288 bytes");
        assert_int_equal(len, 77);
        assert_int_equal(b[0], 0xa5);
        json_object_put(o);
        /* exactly the cap */
        b64[base64_encode(data, n - 1, b64)] = 0;
        o = json_object_new_object();
        json_object_object_add(o, "data_b64", json_object_new_string(b64));
        json_object_object_add(o, "size", json_object_new_int64((int64_t) (n - 1)));
        assert_int_equal(file_read_answer_decode(o, b, &len, &why), 0);
        assert_int_equal(len, FILE_OP_MAX);
        assert_int_equal(b[0], 0);
        json_object_put(o);
        free(b64);
        free(data);
        free(b);
}

static void test_write_answer(void **state) {
        static const char *const bad[] = {
                "{}", "{\"size\": 3}", "{\"size\": -5}", "{\"size\": \"5\"}", "{\"size\": 5.0}", "[5]",
        };
        const char *why = NULL;
        struct json_object *o;

        (void) state;
        o = parse("{\"path\": \"/a\", \"size\": 5}");
        assert_int_equal(file_write_answer_check(o, 5, &why), 0);
        json_object_put(o);
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                o = parse(bad[i]);
                why = NULL;
                assert_int_equal(file_write_answer_check(o, 5, &why), -EBADMSG);
                assert_non_null(why);
                json_object_put(o);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_read_ok),
                cmocka_unit_test(test_read_refused),
                cmocka_unit_test(test_read_cap),
                cmocka_unit_test(test_write_answer),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
