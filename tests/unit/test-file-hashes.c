/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* file-hashes.c: path validation, checking a guest's hash_files answer
 * (hostile input), and the diff of two answers. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "file-hashes.h"
#include "json-util.h"

#define H1 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define H2 "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

static struct json_object *parse(const char *s) {
        struct json_object *o = NULL;

        assert_int_equal(json_parse_strict(s, strlen(s), 1 << 20, 8, &o, NULL), 0);
        return o;
}

static void test_paths(void **state) {
        static char longest[HASH_PATH_MAX + 2];

        (void) state;
        assert_true(hash_path_is_valid("/"));
        assert_true(hash_path_is_valid("/root"));
        assert_true(hash_path_is_valid("/root/a.txt"));
        assert_true(hash_path_is_valid("/root/.hidden/..x/x.."));
        assert_true(hash_path_is_valid("/r\xc3\xa9sum\xc3\xa9"));
        assert_false(hash_path_is_valid(""));
        assert_false(hash_path_is_valid("root"));
        assert_false(hash_path_is_valid("/root/"));
        assert_false(hash_path_is_valid("//root"));
        assert_false(hash_path_is_valid("/a//b"));
        assert_false(hash_path_is_valid("/a/./b"));
        assert_false(hash_path_is_valid("/a/../b"));
        assert_false(hash_path_is_valid("/a/.."));
        assert_false(hash_path_is_valid("/."));
        assert_false(hash_path_is_valid("/a\nb"));
        assert_false(hash_path_is_valid("/a\x7f"));
        assert_false(hash_path_is_valid("/\xff"));
        assert_false(hash_path_is_valid("/\xed\xa0\x80")); /* a surrogate */
        memset(longest, 'x', sizeof longest - 1);
        longest[0] = '/';
        longest[HASH_PATH_MAX] = 0;
        assert_true(hash_path_is_valid(longest));
        longest[HASH_PATH_MAX] = 'x';
        assert_false(hash_path_is_valid(longest));
}

static void test_check(void **state) {
        static const char *const bad[] = {
                "{}",
                "{\"files\":[]}",
                "{\"files\":null}",
                "{\"files\":{\"relative\":\"" H1 "\"}}",
                "{\"files\":{\"/a/../b\":\"" H1 "\"}}",
                "{\"files\":{\"/a\":1}}",
                "{\"files\":{\"/a\":\"" H1 "0\"}}",
                "{\"files\":{\"/a\":\"E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855\"}}",
                "{\"files\":{\"/a\":\"g3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\"}}",
        };
        struct json_object *files = (struct json_object *) 0x1;
        const char *why = NULL;

        (void) state;
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                struct json_object *o = parse(bad[i]);

                assert_int_equal(file_hashes_check(o, &files, &why), -EBADMSG);
                assert_non_null(why);
                assert_ptr_equal(files, (struct json_object *) 0x1); /* untouched on failure */
                json_object_put(o);
        }
        struct json_object *o = parse("{\"files\":{\"/a\":\"" H1 "\",\"/b/c\":\"" H2 "\"},\"extra\":1}");
        assert_int_equal(file_hashes_check(o, &files, &why), 0);
        assert_int_equal(json_object_object_length(files), 2);
        json_object_put(o);
}

static void test_too_many(void **state) {
        struct json_object *o = json_object_new_object(), *f = json_object_new_object(), *files = NULL;
        const char *why = NULL;
        char name[32];

        (void) state;
        json_object_object_add(o, "files", f);
        for (unsigned i = 0; i < HASH_FILES_MAX; i++) {
                snprintf(name, sizeof name, "/f%u", i);
                json_object_object_add(f, name, json_object_new_string(H1));
        }
        assert_int_equal(file_hashes_check(o, &files, &why), 0);
        json_object_object_add(f, "/one-more", json_object_new_string(H1));
        assert_int_equal(file_hashes_check(o, &files, &why), -EBADMSG);
        json_object_put(o);
}

static void assert_list(char **l, size_t n, const char *const *want, size_t n_want) {
        assert_int_equal(n, n_want);
        for (size_t i = 0; i < n; i++)
                assert_string_equal(l[i], want[i]);
}

static void test_diff(void **state) {
        struct json_object *a = parse("{\"/root/a.txt\":\"" H1 "\",\"/tmp/same\":\"" H1 "\",\"/tmp/m\":\"" H1
                                      "\",\"/z\":\"" H2 "\",\"/b\":\"" H2 "\"}");
        struct json_object *b = parse("{\"/root/b.txt\":\"" H1 "\",\"/tmp/same\":\"" H1 "\",\"/tmp/m\":\"" H2
                                      "\",\"/a\":\"" H2 "\"}");
        FileDiff d = {};

        (void) state;
        assert_int_equal(file_hashes_diff(a, b, &d), 0);
        assert_list(d.added, d.n_added, (const char *[]) { "/a", "/root/b.txt" }, 2);
        assert_list(d.removed, d.n_removed, (const char *[]) { "/b", "/root/a.txt", "/z" }, 3);
        assert_list(d.modified, d.n_modified, (const char *[]) { "/tmp/m" }, 1);
        file_diff_done(&d);
        assert_null(d.added);
        assert_int_equal(file_hashes_diff(a, a, &d), 0);
        assert_int_equal(d.n_added + d.n_removed + d.n_modified, 0);
        file_diff_done(&d);
        json_object_put(a);
        json_object_put(b);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_paths),
                cmocka_unit_test(test_check),
                cmocka_unit_test(test_too_many),
                cmocka_unit_test(test_diff),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
