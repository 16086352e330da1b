/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* Tests for the strict JSON helpers (json-util) and snapshot.json (snapshot-meta). */

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "json-util.h"
#include "macro.h"
#include "snapshot-meta.h"

/* ---- json_parse_strict ---- */

static int parse_n(const char *buf, size_t len, int max_depth, const char **ret_error) {
        struct json_object *sentinel = (struct json_object *) 0x1, *obj = sentinel;
        const char *error = NULL;
        int r;

        r = json_parse_strict(buf, len, 4096, max_depth, &obj, &error);
        if (r < 0) {
                assert_ptr_equal(obj, sentinel); /* untouched on failure */
                assert_non_null(error);
        } else {
                assert_non_null(obj);
                assert_true(json_object_is_type(obj, json_type_object));
                json_object_put(obj);
        }
        if (ret_error)
                *ret_error = error;
        return r;
}

static int parse(const char *s, int max_depth) {
        return parse_n(s, strlen(s), max_depth, NULL);
}

static void assert_parse_fails(const char *s, const char *expected_error) {
        const char *error = NULL;

        if (parse_n(s, strlen(s), 8, &error) != -EBADMSG)
                fail_msg("accepted: %s", s);
        if (expected_error)
                assert_string_equal(error, expected_error);
}

static void test_utf8(void **state) {
        static const char *const bad[] = {
                "\x80",                 /* stray continuation */
                "\xbf",
                "\xc3",                 /* truncated 2-byte */
                "\xc3\x28",             /* bad continuation */
                "\xc0\x80",             /* overlong NUL */
                "\xc1\xbf",             /* overlong 2-byte */
                "\xe0\x80\x80",         /* overlong 3-byte */
                "\xe0\x9f\xbf",
                "\xe2\x82",             /* truncated 3-byte */
                "\xed\xa0\x80",         /* U+D800, a surrogate */
                "\xed\xbf\xbf",         /* U+DFFF */
                "\xf0\x80\x80\x80",     /* overlong 4-byte */
                "\xf0\x8f\xbf\xbf",
                "\xf0\x9f\x98",         /* truncated 4-byte */
                "\xf4\x90\x80\x80",     /* U+110000 */
                "\xf5\x80\x80\x80",
                "\xf8\x88\x80\x80\x80", /* 5-byte form */
                "\xfe",
                "\xff",
        };
        static const char *const good[] = {
                "",
                "plain ascii",
                "\xc3\xa9",             /* U+00E9 */
                "\xe2\x82\xac",         /* U+20AC */
                "\xed\x9f\xbf",         /* U+D7FF */
                "\xee\x80\x80",         /* U+E000 */
                "\xf0\x9f\x98\x80",     /* U+1F600 */
                "\xf4\x8f\xbf\xbf",     /* U+10FFFF */
        };
        char json[64];

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                assert_false(utf8_is_valid_n(bad[i], strlen(bad[i])));
                snprintf(json, sizeof(json), "{\"a\":\"%s\"}", bad[i]);
                assert_parse_fails(json, "JSON input is not valid UTF-8");
                /* in a key, too */
                snprintf(json, sizeof(json), "{\"%s\":1}", bad[i]);
                assert_parse_fails(json, "JSON input is not valid UTF-8");
        }
        for (size_t i = 0; i < ELEMENTSOF(good); i++) {
                assert_true(utf8_is_valid_n(good[i], strlen(good[i])));
                snprintf(json, sizeof(json), "{\"a\":\"%s\"}", good[i]);
                assert_int_equal(parse(json, 8), 0);
        }
        /* each one after 0..17 ASCII bytes and before 9: the checker takes ASCII eight
         * bytes at a time, so every alignment of the sequence against those words */
        for (size_t k = 0; k <= 17; k++) {
                char buf[48];

                for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                        snprintf(buf, sizeof(buf), "%.*s%s%s", (int) k, "abcdefghijklmnopqrstuvwxyz", bad[i],
                                 "012345678");
                        assert_false(utf8_is_valid_n(buf, strlen(buf)));
                }
                for (size_t i = 0; i < ELEMENTSOF(good); i++) {
                        snprintf(buf, sizeof(buf), "%.*s%s%s", (int) k, "abcdefghijklmnopqrstuvwxyz", good[i],
                                 "012345678");
                        assert_true(utf8_is_valid_n(buf, strlen(buf)));
                }
        }
}

static void test_parse_nul_and_escapes(void **state) {
        static const char nul_in_string[] = "{\"a\":\"x\0y\"}";
        static const char nul_after[] = "{}\0";
        const char *error;

        assert_int_equal(parse_n(nul_in_string, sizeof(nul_in_string) - 1, 8, &error), -EBADMSG);
        assert_string_equal(error, "NUL byte in JSON input");
        assert_int_equal(parse_n(nul_after, sizeof(nul_after) - 1, 8, &error), -EBADMSG);

        assert_parse_fails("{\"a\":\"\\u0000\"}", "escaped NUL in JSON string");
        assert_parse_fails("{\"a\":\"\\ud800\"}", "unpaired surrogate escape in JSON string");
        assert_parse_fails("{\"a\":\"\\udc00\"}", "unpaired surrogate escape in JSON string");
        assert_parse_fails("{\"a\":\"\\ud800\\u0041\"}", "unpaired surrogate escape in JSON string");
        assert_parse_fails("{\"a\":\"\\ud800x\"}", "unpaired surrogate escape in JSON string");
        assert_parse_fails("{\"a\":\"x\ty\"}", "control character in JSON string");
        assert_parse_fails("{\"a\":\"x\ny\"}", "control character in JSON string");

        assert_int_equal(parse("{\"a\":\"\\ud83d\\ude00\"}", 8), 0);
        assert_int_equal(parse("{\"a\":\"\\u00e9\\n\\t\\\"\\\\\\/\"}", 8), 0);
        assert_int_equal(parse("{\"a\":\"\\\\u0000\"}", 8), 0); /* an escaped backslash, then text */
}

static void test_parse_trailing(void **state) {
        assert_int_equal(parse("{}", 8), 0);
        assert_int_equal(parse(" \t\r\n{ \"a\" : 1 } \n\t ", 8), 0);

        assert_parse_fails("{} x", NULL);
        assert_parse_fails("{}{}", NULL);
        assert_parse_fails("{}]", NULL);
        assert_parse_fails("{},", NULL);
        assert_parse_fails("{}0", NULL);
        assert_parse_fails("{\"a\":1}\"", NULL);
}

static void test_parse_syntax(void **state) {
        assert_parse_fails("{", "truncated JSON");
        assert_parse_fails("{\"a\":", "truncated JSON");
        assert_parse_fails("{\"a\"}", NULL);
        assert_parse_fails("{\"a\":1,}", NULL);
        assert_parse_fails("{'a':1}", NULL);
        assert_parse_fails("{\"a\":'x'}", NULL);
        assert_parse_fails("{\"a\":/* c */1}", NULL);
        assert_parse_fails("{\"a\":1 // c\n}", NULL);
        assert_parse_fails("{\"a\":NaN}", NULL);
        assert_parse_fails("{\"a\":Infinity}", NULL);
        assert_parse_fails("{\"a\":-Infinity}", NULL);
        assert_parse_fails("{\"a\":True}", NULL);
        assert_parse_fails("{\"a\":nul}", NULL);
        assert_parse_fails("{\"a\":01}", NULL);
        assert_parse_fails("{\"a\":\"\\x41\"}", NULL);
        assert_parse_fails("{a:1}", NULL);
}

static void test_parse_integer_literals(void **state) {
        assert_int_equal(parse("{\"a\":18446744073709551615}", 8), 0);
        assert_int_equal(parse("{\"a\":-9223372036854775808}", 8), 0);
        assert_int_equal(parse("{\"a\":[0,-0,1e400,1.5]}", 8), 0);
        assert_parse_fails("{\"a\":18446744073709551616}", "JSON integer literal out of range");
        assert_parse_fails("{\"a\":99999999999999999999999}", "JSON integer literal out of range");
        assert_parse_fails("{\"a\":-9223372036854775809}", "JSON integer literal out of range");
        assert_parse_fails("{\"a\":[1,-18446744073709551615]}", "JSON integer literal out of range");
}

static void test_parse_depth(void **state) {
        assert_int_equal(parse("{}", 1), 0);
        assert_int_equal(parse("{\"a\":1}", 1), 0);
        assert_int_equal(parse("{\"a\":{\"b\":[]}}", 3), 0);
        assert_int_equal(parse("{\"a\":{\"b\":[]}}", 2), -EBADMSG);
        assert_int_equal(parse("{\"a\":[[[]]]}", 3), -EBADMSG);
        assert_int_equal(parse("{\"a\":[[[]]]}", 4), 0);
        assert_int_equal(parse("{\"a\":[],\"b\":[],\"c\":{}}", 2), 0); /* siblings do not add up */
        assert_int_equal(parse("{\"a\":\"[[[[{{{{\"}", 1), 0);          /* brackets in strings do not count */
        assert_int_equal(parse("{\"a\\\"\":\"[[[[\"}", 1), 0);

        /* deep nesting is refused before json-c sees it */
        {
                char deep[2 * 1000 + 16];
                size_t n = 0;

                deep[n++] = '{';
                memcpy(deep + n, "\"a\":", 4), n += 4;
                for (int i = 0; i < 1000; i++)
                        deep[n++] = '[';
                for (int i = 0; i < 1000; i++)
                        deep[n++] = ']';
                deep[n++] = '}';
                const char *error;
                assert_int_equal(parse_n(deep, n, 64, &error), -EBADMSG);
                assert_string_equal(error, "JSON nesting too deep");
        }

        assert_int_equal(json_parse_strict("{}", 2, 16, 0, &(struct json_object *) { NULL }, NULL), -EINVAL);
}

static void test_parse_not_object(void **state) {
        assert_parse_fails("[]", "JSON top level is not an object");
        assert_parse_fails("[{}]", "JSON top level is not an object");
        assert_parse_fails("1", "JSON top level is not an object");
        assert_parse_fails("\"s\"", "JSON top level is not an object");
        assert_parse_fails("null", "JSON top level is not an object");
        assert_parse_fails("true", "JSON top level is not an object");
        assert_parse_fails("", "empty JSON input");
        assert_parse_fails("  \n", "empty JSON input");
}

static void test_parse_size_limit(void **state) {
        struct json_object *obj = NULL;
        const char *error = NULL;
        char buf[64];

        memset(buf, ' ', sizeof(buf));
        buf[0] = '{';
        buf[sizeof(buf) - 1] = '}';
        assert_int_equal(json_parse_strict(buf, sizeof(buf), sizeof(buf), 4, &obj, &error), 0);
        json_object_put(obj);
        obj = NULL;
        assert_int_equal(json_parse_strict(buf, sizeof(buf), sizeof(buf) - 1, 4, &obj, &error), -EMSGSIZE);
        assert_null(obj);
        assert_string_equal(error, "JSON input too large");
}

/* ---- json_dispatch ---- */

struct rec {
        char name[8];
        char *heap;
        int64_t i64;
        uint64_t u64;
        uint32_t u32;
        int i;
        bool b;
        char nullable[8];
        struct json_object *obj, *arr;
        uint32_t even;
};

static int parse_even(struct json_object *v, void *field, const char **ret_error) {
        int64_t x = json_object_get_int64(v);

        if (x < 0 || x > UINT32_MAX || x % 2 != 0) {
                *ret_error = "must be an even 32-bit number";
                return -EDOM;
        }
        *(uint32_t *) field = (uint32_t) x;
        return 0;
}

static const struct json_dispatch rec_table[] = {
        { "name", JSON_KIND_STRING, NULL, offsetof(struct rec, name), JSON_FIELD_SIZE(struct rec, name), JSON_MANDATORY },
        { "heap", JSON_KIND_STRING, NULL, offsetof(struct rec, heap), 0, 0 },
        { "i64", JSON_KIND_INT64, NULL, offsetof(struct rec, i64), 0, 0 },
        { "u64", JSON_KIND_UINT64, NULL, offsetof(struct rec, u64), 0, 0 },
        { "u32", JSON_KIND_UINT32, NULL, offsetof(struct rec, u32), 0, 0 },
        { "i", JSON_KIND_INT, NULL, offsetof(struct rec, i), 0, 0 },
        { "b", JSON_KIND_BOOL, NULL, offsetof(struct rec, b), 0, 0 },
        { "nullable", JSON_KIND_STRING, NULL, offsetof(struct rec, nullable), JSON_FIELD_SIZE(struct rec, nullable), JSON_NULLABLE },
        { "obj", JSON_KIND_OBJECT, NULL, offsetof(struct rec, obj), 0, 0 },
        { "arr", JSON_KIND_ARRAY, NULL, offsetof(struct rec, arr), 0, 0 },
        { "even", JSON_KIND_INT64, parse_even, offsetof(struct rec, even), 0, 0 },
        {}
};

static struct json_object *last_obj = NULL;

static int dispatch(const char *json, unsigned flags, struct rec *rec, const char **ret_field, const char **ret_error) {
        const char *field = NULL, *error = NULL;
        int r;

        if (last_obj) {
                json_object_put(last_obj);
                last_obj = NULL;
        }
        assert_int_equal(json_parse_strict(json, strlen(json), 4096, 4, &last_obj, &error), 0);
        r = json_dispatch_full(last_obj, rec_table, flags, rec, &field, &error);
        if (r < 0) {
                assert_non_null(error);
                assert_non_null(field);
        }
        if (ret_field)
                *ret_field = field;
        if (ret_error)
                *ret_error = error;
        return r;
}

static void assert_dispatch_fails(const char *json, int expected_r, const char *expected_field) {
        struct rec rec = {};
        const char *field = NULL;

        strcpy(rec.name, "keep");
        if (dispatch(json, JSON_REJECT_UNKNOWN, &rec, &field, NULL) != expected_r)
                fail_msg("unexpected result for %s", json);
        assert_string_equal(field, expected_field);
        free(rec.heap);
}

static void test_dispatch_ok(void **state) {
        struct rec rec = {};
        const char *field = NULL;

        assert_int_equal(dispatch("{\"name\":\"abc\",\"heap\":\"a longer heap string\",\"i64\":-5,"
                                  "\"u64\":18446744073709551615,\"u32\":4294967295,\"i\":-2147483648,"
                                  "\"b\":true,\"nullable\":\"n\",\"obj\":{\"x\":1},\"arr\":[1,2],\"even\":42}",
                                  JSON_REJECT_UNKNOWN, &rec, &field, NULL), 0);
        assert_string_equal(rec.name, "abc");
        assert_string_equal(rec.heap, "a longer heap string");
        assert_int_equal(rec.i64, -5);
        assert_true(rec.u64 == UINT64_MAX);
        assert_int_equal(rec.u32, UINT32_MAX);
        assert_int_equal(rec.i, INT32_MIN);
        assert_true(rec.b);
        assert_string_equal(rec.nullable, "n");
        assert_non_null(rec.obj);
        assert_true(json_object_is_type(rec.obj, json_type_object));
        assert_int_equal(json_object_array_length(rec.arr), 2);
        assert_int_equal(rec.even, 42);

        /* a second dispatch replaces the heap string; null resets a nullable field */
        assert_int_equal(dispatch("{\"name\":\"\",\"heap\":\"x\",\"nullable\":null,\"i64\":-9223372036854775808}",
                                  JSON_REJECT_UNKNOWN, &rec, NULL, NULL), 0);
        assert_string_equal(rec.name, "");
        assert_string_equal(rec.heap, "x");
        assert_string_equal(rec.nullable, "");
        assert_true(rec.i64 == INT64_MIN);
        free(rec.heap);

        /* absent optional fields are left alone */
        memset(&rec, 0, sizeof(rec));
        rec.u32 = 77;
        assert_int_equal(dispatch("{\"name\":\"a\"}", JSON_REJECT_UNKNOWN, &rec, NULL, NULL), 0);
        assert_int_equal(rec.u32, 77);

        /* json-c keeps the last of duplicate keys */
        assert_int_equal(dispatch("{\"name\":\"a\",\"name\":\"b\"}", JSON_REJECT_UNKNOWN, &rec, NULL, NULL), 0);
        assert_string_equal(rec.name, "b");

        /* multi-byte characters count as bytes: 7 bytes fit in char[8] */
        assert_int_equal(dispatch("{\"name\":\"\xc3\xa9\xc3\xa9\xc3\xa9x\"}", JSON_REJECT_UNKNOWN, &rec, NULL, NULL), 0);
}

static void test_dispatch_type_mismatch(void **state) {
        /* string where an integer is expected */
        assert_dispatch_fails("{\"name\":\"a\",\"u32\":\"12\"}", -EINVAL, "u32");
        assert_dispatch_fails("{\"name\":\"a\",\"i64\":\"-1\"}", -EINVAL, "i64");
        assert_dispatch_fails("{\"name\":\"a\",\"u64\":\"1\"}", -EINVAL, "u64");
        assert_dispatch_fails("{\"name\":\"a\",\"i\":\"0x10\"}", -EINVAL, "i");
        /* double where an integer is expected */
        assert_dispatch_fails("{\"name\":\"a\",\"u32\":1.0}", -EINVAL, "u32");
        assert_dispatch_fails("{\"name\":\"a\",\"i64\":1e3}", -EINVAL, "i64");
        assert_dispatch_fails("{\"name\":\"a\",\"u64\":1.5}", -EINVAL, "u64");
        /* bool vs int */
        assert_dispatch_fails("{\"name\":\"a\",\"b\":1}", -EINVAL, "b");
        assert_dispatch_fails("{\"name\":\"a\",\"b\":\"true\"}", -EINVAL, "b");
        assert_dispatch_fails("{\"name\":\"a\",\"i\":true}", -EINVAL, "i");
        assert_dispatch_fails("{\"name\":\"a\",\"u32\":false}", -EINVAL, "u32");
        /* other kinds */
        assert_dispatch_fails("{\"name\":1}", -EINVAL, "name");
        assert_dispatch_fails("{\"name\":[\"a\"]}", -EINVAL, "name");
        assert_dispatch_fails("{\"name\":\"a\",\"obj\":[]}", -EINVAL, "obj");
        assert_dispatch_fails("{\"name\":\"a\",\"arr\":{}}", -EINVAL, "arr");
        assert_dispatch_fails("{\"name\":\"a\",\"even\":\"2\"}", -EINVAL, "even");
        /* null where not allowed */
        assert_dispatch_fails("{\"name\":null}", -EINVAL, "name");
        assert_dispatch_fails("{\"name\":\"a\",\"u32\":null}", -EINVAL, "u32");
}

static void test_dispatch_range(void **state) {
        assert_dispatch_fails("{\"name\":\"a\",\"u32\":4294967296}", -ERANGE, "u32");
        assert_dispatch_fails("{\"name\":\"a\",\"u32\":-1}", -ERANGE, "u32");
        assert_dispatch_fails("{\"name\":\"a\",\"u64\":-1}", -ERANGE, "u64");
        assert_dispatch_fails("{\"name\":\"a\",\"i\":2147483648}", -ERANGE, "i");
        assert_dispatch_fails("{\"name\":\"a\",\"i\":-2147483649}", -ERANGE, "i");
        assert_dispatch_fails("{\"name\":\"a\",\"i64\":9223372036854775808}", -ERANGE, "i64");
}

static void test_dispatch_missing_unknown(void **state) {
        struct rec rec = {};
        const char *field = NULL, *error = NULL;

        assert_dispatch_fails("{}", -ENXIO, "name");
        assert_dispatch_fails("{\"u32\":1}", -ENXIO, "name");
        assert_dispatch_fails("{\"name\":\"a\",\"bogus\":1}", -EADDRNOTAVAIL, "bogus");
        assert_dispatch_fails("{\"bogus\":1,\"name\":\"a\"}", -EADDRNOTAVAIL, "bogus");
        assert_dispatch_fails("{\"Name\":\"a\"}", -EADDRNOTAVAIL, "Name");

        /* unknown keys pass without JSON_REJECT_UNKNOWN */
        assert_int_equal(dispatch("{\"name\":\"a\",\"bogus\":1}", 0, &rec, &field, &error), 0);
        assert_string_equal(rec.name, "a");

        /* not an object at all */
        struct json_object *arr = json_object_new_array();
        field = "x";
        assert_int_equal(json_dispatch(arr, rec_table, 0, &rec, &field), -EINVAL);
        assert_null(field);
        json_object_put(arr);
}

static void test_dispatch_strings(void **state) {
        struct rec rec = {};
        const char *error = NULL;

        assert_int_equal(dispatch("{\"name\":\"1234567\"}", JSON_REJECT_UNKNOWN, &rec, NULL, NULL), 0);
        assert_string_equal(rec.name, "1234567");
        assert_dispatch_fails("{\"name\":\"12345678\"}", -ENAMETOOLONG, "name");
        assert_dispatch_fails("{\"name\":\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"}", -ENAMETOOLONG, "name");
        assert_dispatch_fails("{\"name\":\"a\",\"nullable\":\"too long!\"}", -ENAMETOOLONG, "nullable");

        /* an overlong string leaves the buffer alone */
        strcpy(rec.name, "keep");
        assert_int_equal(dispatch("{\"name\":\"much too long\"}", 0, &rec, NULL, &error), -ENAMETOOLONG);
        assert_string_equal(error, "string too long");
        assert_string_equal(rec.name, "keep");

        /* json_string_to_buf directly */
        char buf[4] = "abc";
        struct json_object *v = json_object_new_string("abcd");
        assert_int_equal(json_string_to_buf(v, buf, sizeof(buf), &error), -ENAMETOOLONG);
        assert_string_equal(buf, "abc");
        json_object_put(v);
        v = json_object_new_int(1);
        assert_int_equal(json_string_to_buf(v, buf, sizeof(buf), &error), -EINVAL);
        json_object_put(v);
        /* a NUL that json-c let in through the API is refused */
        v = json_object_new_string_len("a\0b", 3);
        assert_int_equal(json_string_to_buf(v, buf, sizeof(buf), &error), -EINVAL);
        json_object_put(v);
}

static void test_dispatch_custom(void **state) {
        struct rec rec = {};
        const char *field = NULL, *error = NULL;

        assert_int_equal(dispatch("{\"name\":\"a\",\"even\":3}", 0, &rec, &field, &error), -EDOM);
        assert_string_equal(field, "even");
        assert_string_equal(error, "must be an even 32-bit number");
        assert_int_equal(dispatch("{\"name\":\"a\",\"even\":4}", 0, &rec, &field, &error), 0);
        assert_int_equal(rec.even, 4);
}

/* ---- snapshot-meta ---- */

static const char valid_json[] =
        "{\n"
        "  \"format\": 1,\n"
        "  \"tag\": \"base-1.0_x\",\n"
        "  \"created_at_unix\": 1700000000,\n"
        "  \"mem_size\": 268435456,\n"
        "  \"vcpus\": 1,\n"
        "  \"generation\": 3,\n"
        "  \"memory_file\": \"memory.bin\",\n"
        "  \"vmstate_file\": \"vmstate.bin\",\n"
        "  \"disk_file\": \"disk.img\",\n"
        "  \"disk_size\": 1073741824,\n"
        "  \"kernel\": \"/usr/lib/forkd/vmlinux\",\n"
        "  \"guest\": \"linux\",\n"
        "  \"parent_tag\": \"base\",\n"
        "  \"parent_content_hash\": \"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"\n"
        "}\n";

static const char *const meta_keys[] = {
        "format", "tag", "created_at_unix", "mem_size", "vcpus", "generation", "memory_file",
        "vmstate_file", "disk_file", "disk_size", "kernel", "guest", "parent_tag", "parent_content_hash",
};

static const char *const meta_values[] = {
        "1", "\"snap\"", "1700000000", "268435456", "1", "0", "\"memory.bin\"", "\"vmstate.bin\"",
        "\"disk.img\"", "1073741824", "\"/boot/vmlinuz\"", "\"test\"", "null", "null",
};

/* snapshot.json with key `key` set to the raw JSON `value` (NULL: key left out),
 * plus an extra raw member if extra is not NULL. */
static char *meta_json_with(const char *key, const char *value, const char *extra) {
        size_t size = 1024 + (value ? strlen(value) : 0) + (extra ? strlen(extra) : 0), n = 0;
        char *buf = malloc(size);
        bool first = true;

        assert_non_null(buf);
        n += (size_t) snprintf(buf + n, size - n, "{");
        for (size_t i = 0; i < ELEMENTSOF(meta_keys); i++) {
                const char *v = meta_values[i];

                if (key && strcmp(key, meta_keys[i]) == 0) {
                        if (!value)
                                continue;
                        v = value;
                }
                n += (size_t) snprintf(buf + n, size - n, "%s\"%s\": %s", first ? "" : ", ", meta_keys[i], v);
                first = false;
        }
        if (extra)
                n += (size_t) snprintf(buf + n, size - n, ", %s", extra);
        snprintf(buf + n, size - n, "}");
        return buf;
}

static int meta_parse(const char *json, struct snapshot_meta *ret, const char **ret_error) {
        struct snapshot_meta sentinel;
        const char *error = NULL;
        int r;

        memset(&sentinel, 0xa5, sizeof(sentinel));
        memcpy(ret, &sentinel, sizeof(sentinel));
        r = snapshot_meta_parse(json, strlen(json), ret, &error);
        if (r < 0) {
                assert_non_null(error);
                assert_memory_equal(ret, &sentinel, sizeof(sentinel)); /* untouched */
        }
        if (ret_error)
                *ret_error = error;
        return r;
}

/* vcpus takes 1..32, and a snapshot of several vCPUs says so when written back. */
static void test_meta_vcpus_range(void **state) {
        static const unsigned counts[] = { 1, 2, 32 };

        for (size_t i = 0; i < ELEMENTSOF(counts); i++) {
                char json[sizeof(valid_json) + 8], needle[32], *p, *out = NULL;
                struct snapshot_meta m;

                p = strstr(valid_json, "\"vcpus\": 1,");
                assert_non_null(p);
                snprintf(json, sizeof(json), "%.*s\"vcpus\": %u,%s", (int) (p - valid_json), valid_json, counts[i],
                         p + strlen("\"vcpus\": 1,"));
                assert_int_equal(meta_parse(json, &m, NULL), 0);
                assert_int_equal(m.vcpus, counts[i]);
                assert_int_equal(snapshot_meta_format(&m, &out), 0);
                snprintf(needle, sizeof(needle), "\"vcpus\": %u,", counts[i]);
                assert_non_null(strstr(out, needle));
                free(out);
        }
}

static void test_meta_valid_roundtrip(void **state) {
        struct snapshot_meta m, m2;
        char *json = NULL, *json2 = NULL;

        assert_int_equal(meta_parse(valid_json, &m, NULL), 0);
        assert_int_equal(m.format, 1);
        assert_string_equal(m.tag, "base-1.0_x");
        assert_int_equal(m.created_at_unix, 1700000000);
        assert_int_equal(m.mem_size, 256u << 20);
        assert_int_equal(m.vcpus, 1);
        assert_int_equal(m.generation, 3);
        assert_string_equal(m.memory_file, "memory.bin");
        assert_string_equal(m.vmstate_file, "vmstate.bin");
        assert_string_equal(m.disk_file, "disk.img");
        assert_int_equal(m.disk_size, 1u << 30);
        assert_string_equal(m.kernel, "/usr/lib/forkd/vmlinux");
        assert_string_equal(m.guest, "linux");
        assert_string_equal(m.parent_tag, "base");
        assert_string_equal(m.parent_content_hash, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");

        /* formatting gives back exactly the canonical text */
        assert_int_equal(snapshot_meta_format(&m, &json), 0);
        assert_string_equal(json, valid_json);

        /* and parsing that gives back the same struct */
        assert_int_equal(meta_parse(json, &m2, NULL), 0);
        assert_memory_equal(&m, &m2, sizeof(m));
        assert_int_equal(snapshot_meta_format(&m2, &json2), 0);
        assert_string_equal(json, json2);
        free(json);
        free(json2);

        /* nulls round-trip as nulls; big numbers survive */
        char *j = meta_json_with("generation", "18446744073709551615", NULL);
        assert_int_equal(meta_parse(j, &m, NULL), 0);
        assert_true(m.generation == UINT64_MAX);
        assert_string_equal(m.parent_tag, "");
        assert_string_equal(m.parent_content_hash, "");
        assert_int_equal(snapshot_meta_format(&m, &json), 0);
        assert_non_null(strstr(json, "\"parent_tag\": null"));
        assert_non_null(strstr(json, "\"parent_content_hash\": null"));
        assert_non_null(strstr(json, "18446744073709551615"));
        assert_int_equal(meta_parse(json, &m2, NULL), 0);
        assert_memory_equal(&m, &m2, sizeof(m));
        free(json);
        free(j);

        /* kernel paths with characters JSON escapes */
        memset(&m2, 0, sizeof(m2));
        m2 = m;
        strcpy(m2.kernel, "/a \"quoted\" \\ path/\xc3\xa9");
        assert_int_equal(snapshot_meta_format(&m2, &json), 0);
        assert_int_equal(meta_parse(json, &m, NULL), 0);
        assert_string_equal(m.kernel, m2.kernel);
        free(json);
}

struct meta_case {
        const char *key, *value;
};

static void test_meta_invalid_fields(void **state) {
        static const struct meta_case cases[] = {
                { "format", "2" }, { "format", "0" }, { "format", "\"1\"" }, { "format", "1.0" },
                { "format", "null" }, { "format", "true" },
                { "tag", "\"\"" }, { "tag", "\"../x\"" }, { "tag", "\"a/b\"" }, { "tag", "\".hidden\"" },
                { "tag", "\"-x\"" }, { "tag", "\"a b\"" }, { "tag", "\"caf\\u00e9\"" }, { "tag", "5" },
                { "tag", "null" },
                { "tag", "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"" }, /* 65 */
                { "created_at_unix", "-1" }, { "created_at_unix", "\"0\"" }, { "created_at_unix", "1.5" },
                { "mem_size", "0" }, { "mem_size", "1048576" }, { "mem_size", "2101248" },
                { "mem_size", "3223322624" }, /* 3 GiB + 2 MiB */
                { "mem_size", "-2097152" }, { "mem_size", "\"2097152\"" }, { "mem_size", "18446744073709551616" },
                { "vcpus", "0" }, { "vcpus", "33" }, { "vcpus", "4294967297" }, { "vcpus", "-1" },
                { "vcpus", "1.0" },
                { "generation", "-1" }, { "generation", "\"1\"" },
                { "memory_file", "\"\"" }, { "memory_file", "\".\"" }, { "memory_file", "\"..\"" },
                { "memory_file", "\"a/b\"" }, { "memory_file", "\"/abs\"" }, { "memory_file", "\"a\\u0001b\"" },
                { "memory_file", "\"a\\nb\"" }, { "memory_file", "\"a\\u007fb\"" }, { "memory_file", "null" },
                { "memory_file", "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"" }, /* 65 */
                { "vmstate_file", "\"\"" }, { "vmstate_file", "\"..\"" }, { "vmstate_file", "\"x/\"" },
                { "disk_file", "\"\"" }, { "disk_file", "\"../disk.img\"" }, { "disk_file", "7" },
                { "disk_size", "-1" }, { "disk_size", "1.0" }, { "disk_size", "null" },
                { "kernel", "\"\"" }, { "kernel", "\"/boot/\\u0007\"" }, { "kernel", "null" }, { "kernel", "[]" },
                { "guest", "\"windows\"" }, { "guest", "\"\"" }, { "guest", "\"Linux\"" }, { "guest", "\"test \"" },
                { "guest", "\"linuxlinuxlinuxlinux\"" },
                { "parent_tag", "\"\"" }, { "parent_tag", "\"../x\"" }, { "parent_tag", "5" },
                { "parent_tag", "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"" },
                { "parent_content_hash", "\"\"" }, { "parent_content_hash", "\"abc\"" },
                { "parent_content_hash", "\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\"" },
                { "parent_content_hash", "\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0\"" },
                { "parent_content_hash", "\"0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef\"" },
                { "parent_content_hash", "\"g123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"" },
                { "parent_content_hash", "0" },
        };
        struct snapshot_meta m;

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                char *json = meta_json_with(cases[i].key, cases[i].value, NULL);
                const char *error = NULL;

                if (meta_parse(json, &m, &error) >= 0)
                        fail_msg("accepted %s = %s", cases[i].key, cases[i].value);
                free(json);
        }

        /* a very long kernel path */
        char *kernel = malloc(SNAPSHOT_KERNEL_PATH_MAX + 3);
        assert_non_null(kernel);
        kernel[0] = '"';
        memset(kernel + 1, 'k', SNAPSHOT_KERNEL_PATH_MAX);
        strcpy(kernel + 1 + SNAPSHOT_KERNEL_PATH_MAX, "\"");
        char *json = meta_json_with("kernel", kernel, NULL);
        assert_int_equal(meta_parse(json, &m, NULL), -ENAMETOOLONG);
        free(json);
        /* one byte shorter fits */
        strcpy(kernel + SNAPSHOT_KERNEL_PATH_MAX, "\"");
        json = meta_json_with("kernel", kernel, NULL);
        assert_int_equal(meta_parse(json, &m, NULL), 0);
        free(json);
        free(kernel);
}

static void test_meta_valid_variants(void **state) {
        static const struct meta_case cases[] = {
                { "tag", "\"_\"" }, { "tag", "\"0\"" }, { "tag", "\"A.b-c_d\"" },
                { "tag", "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"" }, /* 64 */
                { "mem_size", "2097152" }, { "mem_size", "3221225472" },
                { "created_at_unix", "0" }, { "generation", "18446744073709551615" }, { "disk_size", "0" },
                { "memory_file", "\"m\\u00e9moire .bin\"" }, { "memory_file", "\"...\"" }, { "memory_file", "\".m\"" },
                { "memory_file", "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"" }, /* 64 */
                { "guest", "\"linux\"" }, { "guest", "\"test\"" },
                { "parent_tag", "\"p\"" },
                { "parent_content_hash", "\"ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff\"" },
        };
        struct snapshot_meta m;

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                char *json = meta_json_with(cases[i].key, cases[i].value, NULL);
                const char *error = NULL;

                if (meta_parse(json, &m, &error) < 0)
                        fail_msg("refused %s = %s: %s", cases[i].key, cases[i].value, error);
                free(json);
        }
}

/* disk_layers: optional; 1..256 when present; formatted only when non-zero. */
static void test_meta_disk_layers(void **state) {
        static const char *const bad[] = { "0", "257", "-1", "1.5", "\"2\"", "null" };
        struct snapshot_meta m, m2;
        const char *error = NULL;
        char *json, *out = NULL;

        json = meta_json_with(NULL, NULL, "\"disk_layers\": 3");
        assert_int_equal(meta_parse(json, &m, &error), 0);
        assert_int_equal(m.disk_layers, 3);
        free(json);
        assert_int_equal(snapshot_meta_format(&m, &out), 0);
        assert_non_null(strstr(out, "\"disk_layers\": 3"));
        assert_int_equal(snapshot_meta_parse(out, strlen(out), &m2, NULL), 0);
        assert_int_equal(m2.disk_layers, 3);
        free(out);
        out = NULL;

        json = meta_json_with(NULL, NULL, NULL);
        assert_int_equal(meta_parse(json, &m, NULL), 0);
        assert_int_equal(m.disk_layers, 0);
        free(json);
        assert_int_equal(snapshot_meta_format(&m, &out), 0);
        assert_null(strstr(out, "disk_layers"));
        free(out);

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                char extra[64];

                snprintf(extra, sizeof(extra), "\"disk_layers\": %s", bad[i]);
                json = meta_json_with(NULL, NULL, extra);
                error = NULL;
                if (meta_parse(json, &m, &error) >= 0)
                        fail_msg("accepted disk_layers = %s", bad[i]);
                assert_non_null(error);
                free(json);
        }
}

/* branched_from and pause_us: optional, a branch's source id and its pause;
 * pause_us never without branched_from, formatted only with it. */
static void test_meta_branched_from(void **state) {
        static const char *const bad[] = {
                "\"branched_from\": \"\"", "\"branched_from\": null", "\"branched_from\": \"../x\"",
                "\"branched_from\": 7", "\"pause_us\": 5", "\"branched_from\": \"sb-1\", \"pause_us\": -1",
                "\"branched_from\": \"sb-1\", \"pause_us\": 3600000001",
                "\"branched_from\": \"sb-1\", \"pause_us\": \"5\"",
                "\"branched_from\": \"sb-0123456789012345678901234567890123456789012345678901234567890123\"",
        };
        struct snapshot_meta m, m2;
        const char *error = NULL;
        char *json, *out = NULL;

        json = meta_json_with(NULL, NULL, "\"branched_from\": \"sb-67a1b3-0000\", \"pause_us\": 1820");
        assert_int_equal(meta_parse(json, &m, &error), 0);
        assert_string_equal(m.branched_from, "sb-67a1b3-0000");
        assert_int_equal(m.pause_us, 1820);
        free(json);
        assert_int_equal(snapshot_meta_format(&m, &out), 0);
        assert_non_null(strstr(out, "\"branched_from\": \"sb-67a1b3-0000\""));
        assert_non_null(strstr(out, "\"pause_us\": 1820"));
        assert_int_equal(snapshot_meta_parse(out, strlen(out), &m2, NULL), 0);
        assert_string_equal(m2.branched_from, "sb-67a1b3-0000");
        assert_int_equal(m2.pause_us, 1820);
        free(out);
        out = NULL;

        json = meta_json_with(NULL, NULL, NULL);
        assert_int_equal(meta_parse(json, &m, NULL), 0);
        assert_string_equal(m.branched_from, "");
        free(json);
        assert_int_equal(snapshot_meta_format(&m, &out), 0);
        assert_null(strstr(out, "branched_from"));
        assert_null(strstr(out, "pause_us"));
        free(out);
        m.pause_us = 3;
        assert_int_equal(snapshot_meta_format(&m, &out), -EINVAL);

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                json = meta_json_with(NULL, NULL, bad[i]);
                error = NULL;
                if (meta_parse(json, &m, &error) >= 0)
                        fail_msg("accepted %s", bad[i]);
                assert_non_null(error);
                free(json);
        }
}

/* owner_uid: optional, absent means root (0, and formatted as absent); never
 * (uid_t) -1, never negative, never a string. */
static void test_meta_owner_uid(void **state) {
        static const char *const bad[] = {
                "\"owner_uid\": 4294967295", "\"owner_uid\": -1", "\"owner_uid\": 4294967296",
                "\"owner_uid\": \"1000\"", "\"owner_uid\": null", "\"owner_uid\": 1.5",
        };
        struct snapshot_meta m, m2;
        const char *error = NULL;
        char *json, *out = NULL;

        json = meta_json_with(NULL, NULL, "\"owner_uid\": 61781");
        assert_int_equal(meta_parse(json, &m, &error), 0);
        assert_int_equal(m.owner_uid, 61781);
        free(json);
        assert_int_equal(snapshot_meta_format(&m, &out), 0);
        assert_non_null(strstr(out, "\"owner_uid\": 61781"));
        assert_int_equal(snapshot_meta_parse(out, strlen(out), &m2, NULL), 0);
        assert_memory_equal(&m, &m2, sizeof(m));
        free(out);
        out = NULL;

        /* absent and 0 are root's, and 0 formats as absent */
        json = meta_json_with(NULL, NULL, "\"owner_uid\": 0");
        assert_int_equal(meta_parse(json, &m, NULL), 0);
        assert_int_equal(m.owner_uid, 0);
        free(json);
        json = meta_json_with(NULL, NULL, NULL);
        assert_int_equal(meta_parse(json, &m2, NULL), 0);
        assert_int_equal(m2.owner_uid, 0);
        free(json);
        assert_int_equal(snapshot_meta_format(&m, &out), 0);
        assert_null(strstr(out, "owner_uid"));
        free(out);
        m.owner_uid = UINT32_MAX;
        assert_int_equal(snapshot_meta_format(&m, &out), -EINVAL);

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                json = meta_json_with(NULL, NULL, bad[i]);
                error = NULL;
                if (meta_parse(json, &m, &error) >= 0)
                        fail_msg("accepted %s", bad[i]);
                assert_non_null(error);
                free(json);
        }
}

/* network and agent_tcp: optional booleans, absent means false and false
 * formats as absent (old snapshots read and write as before); agent_tcp
 * only with network. */
static void test_meta_network(void **state) {
        static const char *const bad[] = {
                "\"network\": 1", "\"network\": \"true\"", "\"network\": null",
                "\"agent_tcp\": true", "\"network\": false, \"agent_tcp\": true",
        };
        struct snapshot_meta m, m2;
        const char *error = NULL;
        char *json, *out = NULL;

        json = meta_json_with(NULL, NULL, "\"network\": true, \"agent_tcp\": true");
        assert_int_equal(meta_parse(json, &m, &error), 0);
        assert_true(m.network);
        assert_true(m.agent_tcp);
        free(json);
        assert_int_equal(snapshot_meta_format(&m, &out), 0);
        assert_non_null(strstr(out, "\"network\": true"));
        assert_non_null(strstr(out, "\"agent_tcp\": true"));
        assert_int_equal(snapshot_meta_parse(out, strlen(out), &m2, NULL), 0);
        assert_memory_equal(&m, &m2, sizeof(m));
        free(out);
        out = NULL;

        json = meta_json_with(NULL, NULL, NULL);
        assert_int_equal(meta_parse(json, &m, NULL), 0);
        assert_false(m.network);
        assert_false(m.agent_tcp);
        free(json);
        assert_int_equal(snapshot_meta_format(&m, &out), 0);
        assert_null(strstr(out, "network"));
        assert_null(strstr(out, "agent_tcp"));
        free(out);
        out = NULL;

        json = meta_json_with(NULL, NULL, "\"network\": false");
        assert_int_equal(meta_parse(json, &m, NULL), 0);
        assert_false(m.network);
        free(json);

        /* the output parameter stays untouched on failure */
        m.agent_tcp = true;
        m.network = false;
        assert_int_equal(snapshot_meta_format(&m, &out), -EINVAL);
        assert_null(out);

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                json = meta_json_with(NULL, NULL, bad[i]);
                error = NULL;
                if (meta_parse(json, &m, &error) >= 0) /* it checks that m stays untouched */
                        fail_msg("accepted %s", bad[i]);
                assert_non_null(error);
                free(json);
        }
}

static void test_meta_volumes(void **state) {
        static const char *const bad[] = {
                "\"volumes\": []",
                "\"volumes\": {}",
                "\"volumes\": [1]",
                "\"volumes\": null",
                "\"volumes\": [{\"file\": \"v.img\", \"guest_path\": \"/data\"}]",
                "\"volumes\": [{\"file\": \"v.img\", \"guest_path\": \"/data\", \"mode\": \"RW\"}]",
                "\"volumes\": [{\"file\": \"v.img\", \"guest_path\": \"/data\", \"mode\": \"ro\", \"x\": 1}]",
                "\"volumes\": [{\"file\": \"\", \"guest_path\": \"/data\", \"mode\": \"ro\"}]",
                "\"volumes\": [{\"file\": null, \"guest_path\": \"/data\", \"mode\": \"ro\"}]",
                "\"volumes\": [{\"file\": \"../v.img\", \"guest_path\": \"/data\", \"mode\": \"ro\"}]",
                "\"volumes\": [{\"file\": \"disk.img\", \"guest_path\": \"/data\", \"mode\": \"ro\"}]",
                "\"volumes\": [{\"file\": \"v.img\", \"guest_path\": \"/\", \"mode\": \"ro\"}]",
                "\"volumes\": [{\"file\": \"v.img\", \"guest_path\": \"data\", \"mode\": \"ro\"}]",
                "\"volumes\": [{\"file\": \"v.img\", \"guest_path\": \"/a/../b\", \"mode\": \"ro\"}]",
                "\"volumes\": [{\"file\": \"v.img\", \"guest_path\": \"/a//b\", \"mode\": \"ro\"}]",
                "\"volumes\": [{\"file\": \"v.img\", \"guest_path\": \"/a/\", \"mode\": \"ro\"}]",
                "\"volumes\": [{\"file\": \"v.img\", \"guest_path\": \"/proc/x\", \"mode\": \"ro\"}]",
                "\"volumes\": [{\"file\": \"v.img\", \"guest_path\": \"/.forkd\", \"mode\": \"ro\"}]",
                "\"volumes\": [{\"file\": \"v.img\", \"guest_path\": \"/a\\u0001\", \"mode\": \"ro\"}]",
                "\"volumes\": [{\"file\": \"v.img\", \"guest_path\": \"/data\", \"mode\": \"ro\", "
                "\"host_path\": \"/x\", \"dev\": 1, \"ino\": 2}]",
                "\"volumes\": [{\"file\": \"v.img\", \"guest_path\": \"/data\", \"mode\": \"rw\", "
                "\"host_path\": \"/x\", \"dev\": 1, \"ino\": 2}]",
                "\"volumes\": [{\"file\": null, \"guest_path\": \"/data\", \"mode\": \"rw\"}]",
                "\"volumes\": [{\"file\": null, \"guest_path\": \"/data\", \"mode\": \"rw\", "
                "\"host_path\": \"x\", \"dev\": 1, \"ino\": 2}]",
                "\"volumes\": [{\"file\": null, \"guest_path\": \"/data\", \"mode\": \"rw\", "
                "\"host_path\": \"/x\", \"dev\": -1, \"ino\": 2}]",
                "\"volumes\": [{\"file\": \"a.img\", \"guest_path\": \"/data\", \"mode\": \"ro\"}, "
                "{\"file\": \"b.img\", \"guest_path\": \"/data\", \"mode\": \"cow\"}]",
                "\"volumes\": [{\"file\": \"a.img\", \"guest_path\": \"/a\", \"mode\": \"ro\"}, "
                "{\"file\": \"a.img\", \"guest_path\": \"/b\", \"mode\": \"cow\"}]",
        };
        struct snapshot_meta m, m2;
        const char *error = NULL;
        char *json, *out = NULL, big[8192];
        size_t n;

        json = meta_json_with(NULL, NULL,
                              "\"volumes\": [{\"file\": \"volume-0.img\", \"guest_path\": \"/data\", \"mode\": \"ro\"}, "
                              "{\"file\": \"volume-1.img\", \"guest_path\": \"/srv/cache\", \"mode\": \"cow\"}, "
                              "{\"file\": null, \"guest_path\": \"/home/u\", \"mode\": \"rw\", "
                              "\"host_path\": \"/var/lib/vol.ext4\", \"dev\": 2049, \"ino\": 12345}]");
        assert_int_equal(meta_parse(json, &m, &error), 0);
        free(json);
        assert_int_equal(m.n_volumes, 3);
        assert_string_equal(m.volumes[0].file, "volume-0.img");
        assert_string_equal(m.volumes[1].mode, "cow");
        assert_string_equal(m.volumes[1].guest_path, "/srv/cache");
        assert_string_equal(m.volumes[2].file, "");
        assert_string_equal(m.volumes[2].host_path, "/var/lib/vol.ext4");
        assert_int_equal(m.volumes[2].dev, 2049);
        assert_int_equal(m.volumes[2].ino, 12345);
        assert_int_equal(snapshot_meta_format(&m, &out), 0);
        assert_non_null(strstr(out, "\"file\": null"));
        assert_int_equal(snapshot_meta_parse(out, strlen(out), &m2, NULL), 0);
        assert_memory_equal(&m, &m2, sizeof(m));
        free(out);
        out = NULL;

        /* absent: none, and none is written */
        json = meta_json_with(NULL, NULL, NULL);
        assert_int_equal(meta_parse(json, &m, NULL), 0);
        free(json);
        assert_int_equal(m.n_volumes, 0);
        assert_int_equal(snapshot_meta_format(&m, &out), 0);
        assert_null(strstr(out, "volumes"));
        free(out);
        out = NULL;

        /* 24 is the most */
        for (unsigned k = 24; k <= 25; k++) {
                n = (size_t) snprintf(big, sizeof big, "\"volumes\": [");
                for (unsigned i = 0; i < k; i++)
                        n += (size_t) snprintf(big + n, sizeof big - n,
                                               "%s{\"file\": \"v%u\", \"guest_path\": \"/v%u\", \"mode\": \"ro\"}",
                                               i ? ", " : "", i, i);
                snprintf(big + n, sizeof big - n, "]");
                json = meta_json_with(NULL, NULL, big);
                assert_int_equal(meta_parse(json, &m, NULL) == 0, k == 24);
                free(json);
        }

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                json = meta_json_with(NULL, NULL, bad[i]);
                error = NULL;
                if (meta_parse(json, &m, &error) >= 0)
                        fail_msg("accepted %s", bad[i]);
                assert_non_null(error);
                free(json);
        }

        assert_true(snapshot_volume_guest_path_is_valid("/data"));
        assert_true(snapshot_volume_guest_path_is_valid("/srv/a.b/c"));
        assert_true(snapshot_volume_guest_path_is_valid("/process"));
        assert_true(snapshot_volume_guest_path_is_valid("/.forkdx"));
        assert_false(snapshot_volume_guest_path_is_valid("/dev"));
        assert_false(snapshot_volume_guest_path_is_valid("/run/x"));
        assert_false(snapshot_volume_guest_path_is_valid("/sys/"));
        assert_false(snapshot_volume_guest_path_is_valid("/a/./b"));
        assert_false(snapshot_volume_guest_path_is_valid("/.."));
        memset(big, 'a', 300);
        big[0] = '/';
        big[256] = 0;
        assert_false(snapshot_volume_guest_path_is_valid(big)); /* 256 bytes */
        big[255] = 0;
        assert_true(snapshot_volume_guest_path_is_valid(big));
        assert_int_equal(snapshot_volume_mode_from_string("cow"), SNAPSHOT_VOLUME_COW);
        assert_int_equal(snapshot_volume_mode_from_string("rwx"), -EINVAL);
        assert_string_equal(snapshot_volume_mode_to_string(SNAPSHOT_VOLUME_RW), "rw");
}

static void test_meta_keys(void **state) {
        struct snapshot_meta m;
        const char *error;
        char *json;

        /* the template itself is valid */
        json = meta_json_with(NULL, NULL, NULL);
        assert_int_equal(meta_parse(json, &m, NULL), 0);
        free(json);

        /* every key is mandatory */
        for (size_t i = 0; i < ELEMENTSOF(meta_keys); i++) {
                json = meta_json_with(meta_keys[i], NULL, NULL);
                assert_int_equal(meta_parse(json, &m, &error), -ENXIO);
                assert_non_null(strstr(error, meta_keys[i]));
                free(json);
        }

        /* unknown keys are refused */
        json = meta_json_with(NULL, NULL, "\"extra\": 1");
        assert_int_equal(meta_parse(json, &m, &error), -EADDRNOTAVAIL);
        assert_string_equal(error, "snapshot.json: unknown field");
        free(json);
        json = meta_json_with(NULL, NULL, "\"Tag\": \"x\"");
        assert_int_equal(meta_parse(json, &m, NULL), -EADDRNOTAVAIL);
        free(json);

        /* not an object, not JSON, nested values */
        assert_int_equal(meta_parse("[]", &m, NULL), -EBADMSG);
        assert_int_equal(meta_parse("", &m, NULL), -EBADMSG);
        assert_int_equal(meta_parse("{\"format\":1", &m, NULL), -EBADMSG);
        json = meta_json_with("tag", "{\"a\":{\"b\":{\"c\":{}}}}", NULL);
        assert_int_equal(meta_parse(json, &m, NULL), -EBADMSG);
        free(json);
        json = meta_json_with("tag", "{}", NULL);
        assert_int_equal(meta_parse(json, &m, NULL), -EINVAL);
        free(json);
}

/* "image": the config of the OCI image a snapshot was made from. */
static void test_image_config(void **state) {
        static const char *const bad[] = {
                "[]", "1", "{\"env\": \"A=1\"}", "{\"env\": [\"NOEQUALS\"]}", "{\"env\": [\"=x\"]}",
                "{\"env\": [1]}", "{\"working_dir\": \"relative\"}", "{\"user\": 0}", "{\"start_cmd\": 1}",
                "{\"cmd\": [[\"x\"]]}", "{\"other\": 1}", "{\"user\": \"a\\nb\"}",
        };
        struct snapshot_meta m;
        const char *error = NULL;
        char *json, *out = NULL;

        json = meta_json_with(NULL, NULL, "\"image\": {\"env\": [\"PATH=/bin\", \"GREETING=hi\"], "
                                          "\"working_dir\": \"/opt/app\", \"user\": \"1000:1000\", "
                                          "\"entrypoint\": [], \"cmd\": [\"python3\"], \"start_cmd\": false}");
        assert_int_equal(meta_parse(json, &m, &error), 0);
        free(json);
        assert_string_equal(m.image_config, "{\"env\":[\"PATH=/bin\",\"GREETING=hi\"],\"working_dir\":\"/opt/app\","
                                            "\"user\":\"1000:1000\",\"entrypoint\":[],\"cmd\":[\"python3\"],"
                                            "\"start_cmd\":false}");
        /* written back as it was read */
        assert_int_equal(snapshot_meta_format(&m, &out), 0);
        assert_non_null(strstr(out, "\"image\""));
        assert_int_equal(snapshot_meta_parse(out, strlen(out), &m, NULL), 0);
        assert_non_null(strstr(m.image_config, "GREETING=hi"));
        free(out);

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                char extra[256];

                snprintf(extra, sizeof(extra), "\"image\": %s", bad[i]);
                json = meta_json_with(NULL, NULL, extra);
                error = NULL;
                assert_true(meta_parse(json, &m, &error) < 0);
                assert_non_null(error);
                free(json);
        }
}

static void test_tag_is_valid(void **state) {
        static const char *const bad[] = {
                "", "../x", "a/b", ".", "..", ".hidden", "-x", "a b", "a\tb", "a\nb", "tag!", "x:y",
                "caf\xc3\xa9", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", /* 65 */
        };
        static const char *const good[] = {
                "a", "_", "0", "base", "snap-1.2_3", "a..b", "x-", "x.",
                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", /* 64 */
        };

        for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                if (snapshot_tag_is_valid(bad[i]))
                        fail_msg("accepted tag \"%s\"", bad[i]);
        for (size_t i = 0; i < ELEMENTSOF(good); i++)
                if (!snapshot_tag_is_valid(good[i]))
                        fail_msg("refused tag \"%s\"", good[i]);
        assert_false(snapshot_tag_is_valid(NULL));

        assert_true(snapshot_file_name_is_valid("memory.bin"));
        assert_false(snapshot_file_name_is_valid(""));
        assert_false(snapshot_file_name_is_valid("."));
        assert_false(snapshot_file_name_is_valid(".."));
        assert_false(snapshot_file_name_is_valid("a/b"));
        assert_false(snapshot_file_name_is_valid("a\x01"));

        assert_true(snapshot_content_hash_is_valid("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"));
        assert_false(snapshot_content_hash_is_valid(""));
        assert_false(snapshot_content_hash_is_valid("0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef"));
}

static void test_meta_format_refuses_invalid(void **state) {
        struct snapshot_meta m;
        char *sentinel = (char *) 0x1, *json = sentinel;

        assert_int_equal(meta_parse(valid_json, &m, NULL), 0);

#define REFUSE(mutation)                                                \
        do {                                                            \
                struct snapshot_meta c = m;                             \
                mutation;                                               \
                assert_int_equal(snapshot_meta_format(&c, &json), -EINVAL); \
                assert_ptr_equal(json, sentinel);                       \
        } while (0)

        REFUSE(c.format = 2);
        REFUSE(strcpy(c.tag, "../x"));
        REFUSE(c.mem_size = 1);
        REFUSE(c.mem_size = SNAPSHOT_MEM_MAX + SNAPSHOT_MEM_ALIGN);
        REFUSE(c.vcpus = 0);
        REFUSE(c.vcpus = SNAPSHOT_VCPUS_MAX + 1);
        REFUSE(c.created_at_unix = -1);
        REFUSE(strcpy(c.memory_file, ".."));
        REFUSE(strcpy(c.guest, "dos"));
        REFUSE(strcpy(c.parent_content_hash, "xyz"));
        REFUSE(memset(c.tag, 'a', sizeof(c.tag))); /* no NUL */
#undef REFUSE
}

static char tmpdir[] = "/tmp/test-snapshot-meta.XXXXXX";

static int setup_tmpdir(void **state) {
        return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmpdir(void **state) {
        char path[256];

        snprintf(path, sizeof(path), "%s/snapshot.json", tmpdir);
        (void) unlink(path);
        if (last_obj)
                json_object_put(last_obj);
        return rmdir(tmpdir) < 0 ? -1 : 0;
}

static void write_file(const char *path, const void *data, size_t len) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

        assert_true(fd >= 0);
        assert_int_equal(write(fd, data, len), (ssize_t) len);
        assert_int_equal(close(fd), 0);
}

static void test_meta_read_file(void **state) {
        struct snapshot_meta m, sentinel;
        const char *error = NULL;
        char path[256], *big;
        size_t n = strlen(valid_json);

        snprintf(path, sizeof(path), "%s/snapshot.json", tmpdir);
        write_file(path, valid_json, n);
        assert_int_equal(snapshot_meta_read_file(path, &m, &error), 0);
        assert_string_equal(m.tag, "base-1.0_x");

        /* padded with whitespace to exactly the cap: still fine */
        big = malloc(SNAPSHOT_META_FILE_MAX + 1);
        assert_non_null(big);
        memset(big, ' ', SNAPSHOT_META_FILE_MAX + 1);
        memcpy(big, valid_json, n);
        write_file(path, big, SNAPSHOT_META_FILE_MAX);
        assert_int_equal(snapshot_meta_read_file(path, &m, &error), 0);

        /* one byte over the cap */
        memset(&sentinel, 0xa5, sizeof(sentinel));
        m = sentinel;
        write_file(path, big, SNAPSHOT_META_FILE_MAX + 1);
        assert_int_equal(snapshot_meta_read_file(path, &m, &error), -EMSGSIZE);
        assert_non_null(error);
        assert_memory_equal(&m, &sentinel, sizeof(m));
        assert_int_equal(snapshot_meta_parse(big, SNAPSHOT_META_FILE_MAX + 1, &m, &error), -EMSGSIZE);
        assert_memory_equal(&m, &sentinel, sizeof(m));
        free(big);

        /* missing file, directory */
        snprintf(path, sizeof(path), "%s/nope.json", tmpdir);
        assert_int_equal(snapshot_meta_read_file(path, &m, &error), -ENOENT);
        assert_int_equal(snapshot_meta_read_file(tmpdir, &m, &error), -EISDIR);
        assert_memory_equal(&m, &sentinel, sizeof(m));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_utf8),
                cmocka_unit_test(test_parse_nul_and_escapes),
                cmocka_unit_test(test_parse_trailing),
                cmocka_unit_test(test_parse_syntax),
                cmocka_unit_test(test_parse_integer_literals),
                cmocka_unit_test(test_parse_depth),
                cmocka_unit_test(test_parse_not_object),
                cmocka_unit_test(test_parse_size_limit),
                cmocka_unit_test(test_dispatch_ok),
                cmocka_unit_test(test_dispatch_type_mismatch),
                cmocka_unit_test(test_dispatch_range),
                cmocka_unit_test(test_dispatch_missing_unknown),
                cmocka_unit_test(test_dispatch_strings),
                cmocka_unit_test(test_dispatch_custom),
                cmocka_unit_test(test_meta_valid_roundtrip),
                cmocka_unit_test(test_meta_vcpus_range),
                cmocka_unit_test(test_meta_invalid_fields),
                cmocka_unit_test(test_meta_valid_variants),
                cmocka_unit_test(test_meta_keys),
                cmocka_unit_test(test_meta_disk_layers),
                cmocka_unit_test(test_meta_branched_from),
                cmocka_unit_test(test_meta_owner_uid),
                cmocka_unit_test(test_meta_network),
                cmocka_unit_test(test_meta_volumes),
                cmocka_unit_test(test_image_config),
                cmocka_unit_test(test_tag_is_valid),
                cmocka_unit_test(test_meta_format_refuses_invalid),
                cmocka_unit_test(test_meta_read_file),
        };

        return cmocka_run_group_tests(tests, setup_tmpdir, teardown_tmpdir);
}
