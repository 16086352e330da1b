/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The OOM kills forkd reports for an exited sandbox (src/daemon/cgroup-oom.c): the
 * oom_kill line of memory.events / memory.oom_control, and the fallback to the
 * slice's hierarchical count when systemd removed the scope's cgroup first. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cgroup.h"

static void test_parse(void **state) {
        uint64_t v = 99;

        assert_int_equal(cgroup_parse_oom_kill("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n", &v), 0);
        assert_int_equal(v, 2);
        assert_int_equal(cgroup_parse_oom_kill("oom_kill_disable 0\nunder_oom 0\noom_kill 7", &v), 0);
        assert_int_equal(v, 7);
        assert_true(cgroup_parse_oom_kill("low 0\nhigh 0\n", &v) < 0);
        assert_true(cgroup_parse_oom_kill("oom_kill x\n", &v) < 0);
        assert_true(cgroup_parse_oom_kill("", &v) < 0);
}

static void test_attribute(void **state) {
        uint64_t accounted = 5; /* the slice's count when the first scope started */

        /* the scope's own count read: reported as it is, and accounted */
        assert_int_equal(cgroup_attribute_ooms(&accounted, true, 0, false, 0), 0);
        assert_int_equal(accounted, 5);
        assert_int_equal(cgroup_attribute_ooms(&accounted, true, 1, true, 6), 1);
        assert_int_equal(accounted, 6);
        /* its cgroup gone, the slice counted a kill nobody was given: this one */
        assert_int_equal(cgroup_attribute_ooms(&accounted, false, 0, true, 7), 1);
        assert_int_equal(accounted, 7);
        /* gone, and every kill of the slice accounted already: none */
        assert_int_equal(cgroup_attribute_ooms(&accounted, false, 0, true, 7), 0);
        assert_int_equal(accounted, 7);
        /* two kills, two exits with their cgroups gone: one each, then none */
        assert_int_equal(cgroup_attribute_ooms(&accounted, false, 0, true, 9), 1);
        assert_int_equal(cgroup_attribute_ooms(&accounted, false, 0, true, 9), 1);
        assert_int_equal(cgroup_attribute_ooms(&accounted, false, 0, true, 9), 0);
        assert_int_equal(accounted, 9);
        /* nothing readable at all: none */
        assert_int_equal(cgroup_attribute_ooms(&accounted, false, 0, false, 100), 0);
        assert_int_equal(accounted, 9);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_parse),
                cmocka_unit_test(test_attribute),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
