/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The ids of confined VMMs (src/daemon/uid-range.c): forkd --vmm-uid-range's
 * parsing and checks, and handing ids out and back. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "uid-range.h"

static void test_parse(void **state) {
        uid_t first = 0;
        uint32_t count = 0;

        assert_int_equal(uid_range_parse("1879048192:65536", &first, &count), 0);
        assert_int_equal(first, 1879048192u);
        assert_int_equal(count, 65536);
        assert_int_equal(uid_range_parse("100000:1", &first, &count), 0);
        assert_int_equal(first, 100000);
        assert_int_equal(count, 1);
        assert_int_equal(uid_range_parse("100000", &first, &count), -EINVAL);
        assert_int_equal(uid_range_parse("100000:0", &first, &count), -EINVAL);
        assert_int_equal(uid_range_parse(":5", &first, &count), -EINVAL);
        assert_int_equal(uid_range_parse("5:", &first, &count), -EINVAL);
        assert_int_equal(uid_range_parse("-5:5", &first, &count), -EINVAL);
        assert_int_equal(uid_range_parse("5:+5", &first, &count), -EINVAL);
        assert_int_equal(uid_range_parse("5:5:5", &first, &count), -EINVAL);
        assert_int_equal(uid_range_parse("4294967296:1", &first, &count), -ERANGE);
        assert_int_equal(uid_range_parse("12345678901:1", &first, &count), -EINVAL);
        assert_int_equal(uid_range_parse("100000:16777216", &first, &count), 0);
        assert_int_equal(uid_range_parse("100000:16777217", &first, &count), -EINVAL);
}

static void test_check(void **state) {
        uid_t id = 1;

        assert_int_equal(uid_range_check(VMM_UID_RANGE_DEFAULT_FIRST, VMM_UID_RANGE_DEFAULT_COUNT, 65533, &id), 0);
        assert_int_equal(uid_range_check(0, 10, (uid_t) -1, &id), -EEXIST);
        assert_int_equal(id, 0);
        assert_int_equal(uid_range_check(65000, 1000, (uid_t) -1, &id), -EEXIST);
        assert_int_equal(id, 65533);
        assert_int_equal(uid_range_check(65534, 1, (uid_t) -1, &id), -EEXIST);
        assert_int_equal(id, 65534);
        assert_int_equal(uid_range_check(100000, 100, 100099, &id), -EEXIST);
        assert_int_equal(id, 100099);
        assert_int_equal(uid_range_check(100000, 100, 100100, &id), 0);
        /* (uid_t) -1 is no id; the last one below it is */
        assert_int_equal(uid_range_check(4294967294u, 1, (uid_t) -1, &id), 0);
        assert_int_equal(uid_range_check(4294967294u, 2, (uid_t) -1, &id), -ERANGE);
        assert_int_equal(uid_range_check(4294967000u, 1000, (uid_t) -1, &id), -ERANGE);
        assert_int_equal(uid_range_check(100000, VMM_UID_RANGE_COUNT_MAX + 1, (uid_t) -1, &id), -EINVAL);
        assert_int_equal(uid_range_check(100000, 0, (uid_t) -1, &id), -EINVAL);
}

static void test_databases(void **state) {
        char *what = NULL;

        /* root is in every passwd database */
        assert_int_equal(uid_range_check_databases(0, 1, &what), -EEXIST);
        assert_non_null(what);
        assert_non_null(strstr(what, "(0)"));
        free(what);
        what = NULL;
        /* nobody in the default range */
        assert_int_equal(uid_range_check_databases(VMM_UID_RANGE_DEFAULT_FIRST, VMM_UID_RANGE_DEFAULT_COUNT, &what),
                         0);
        assert_null(what);
}

static void test_alloc(void **state) {
        UidRange r;
        uid_t a, b, c, d;

        assert_int_equal(uid_range_init(&r, 100000, 3), 0);
        assert_int_equal(uid_range_alloc(&r, &a), 0);
        assert_int_equal(uid_range_alloc(&r, &b), 0);
        assert_int_equal(uid_range_alloc(&r, &c), 0);
        assert_int_equal(a, 100000);
        assert_int_equal(b, 100001);
        assert_int_equal(c, 100002);
        assert_int_equal(uid_range_alloc(&r, &d), -EBUSY);
        uid_range_free(&r, b);
        uid_range_free(&r, b); /* twice: ignored */
        uid_range_free(&r, 5); /* outside: ignored */
        assert_int_equal(r.n_used, 2);
        assert_int_equal(uid_range_alloc(&r, &d), 0);
        assert_int_equal(d, b);
        assert_int_equal(uid_range_reserve(&r, b), -EEXIST);
        assert_int_equal(uid_range_reserve(&r, 100003), -ERANGE);
        /* a second holder: free once more before it goes */
        assert_int_equal(uid_range_ref(&r, a), 0);
        uid_range_free(&r, a);
        assert_int_equal(r.n_used, 3);
        assert_int_equal(uid_range_reserve(&r, a), -EEXIST);
        uid_range_free(&r, a);
        assert_int_equal(r.n_used, 2);
        assert_int_equal(uid_range_ref(&r, a), -ENOENT);
        assert_int_equal(uid_range_ref(&r, 5), -ERANGE);
        for (unsigned i = 1; i < 255; i++)
                assert_int_equal(uid_range_ref(&r, c), 0);
        assert_int_equal(uid_range_ref(&r, c), -EOVERFLOW);
        uid_range_done(&r);
}

/* A freed id goes to the back of the line. */
static void test_alloc_round_robin(void **state) {
        UidRange r;
        uid_t u, first;

        assert_int_equal(uid_range_init(&r, 200000, 130), 0);
        assert_int_equal(uid_range_reserve(&r, 200064), 0);
        for (unsigned i = 0; i < 129; i++) {
                assert_int_equal(uid_range_alloc(&r, &u), 0);
                assert_int_not_equal(u, 200064);
                assert_true(u >= 200000 && u < 200130);
        }
        assert_int_equal(r.n_used, 130);
        assert_int_equal(uid_range_alloc(&r, &u), -EBUSY);
        uid_range_free(&r, 200010);
        uid_range_free(&r, 200100);
        /* next points past 200129, so the search wraps to 200010 first */
        assert_int_equal(uid_range_alloc(&r, &first), 0);
        assert_int_equal(first, 200010);
        assert_int_equal(uid_range_alloc(&r, &u), 0);
        assert_int_equal(u, 200100);
        uid_range_free(&r, 200129);
        assert_int_equal(uid_range_alloc(&r, &u), 0);
        assert_int_equal(u, 200129);
        uid_range_done(&r);
}

static void test_reserve_running(void **state) {
        UidRange r;
        uid_t self = getuid();

        /* this process runs under its uid: a range holding it gets it marked */
        assert_int_equal(uid_range_init(&r, self > 0 ? self - 1 : self, 3), 0);
        assert_true(uid_range_reserve_running(&r, "/proc") >= 1);
        assert_int_equal(uid_range_reserve(&r, self), -EEXIST);
        uid_range_done(&r);
        assert_int_equal(uid_range_init(&r, 100000, 3), 0);
        assert_true(uid_range_reserve_running(&r, "/nonexistent") < 0);
        uid_range_done(&r);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_parse),
                cmocka_unit_test(test_check),
                cmocka_unit_test(test_databases),
                cmocka_unit_test(test_alloc),
                cmocka_unit_test(test_alloc_round_robin),
                cmocka_unit_test(test_reserve_running),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
