/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* The network namespace names a fork template accepts in a spawn request
 * (template_netns_name_is_valid()): they become /run/netns/<name>, so nothing
 * may climb out of /run/netns or name something odd inside it. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "template.h"

static void test_accepts(void **state) {
        char max[TEMPLATE_NETNS_NAME_MAX + 1];

        (void) state;
        assert_true(template_netns_name_is_valid("forkd-child-1"));
        assert_true(template_netns_name_is_valid("forkd-child-1000"));
        assert_true(template_netns_name_is_valid("a"));
        assert_true(template_netns_name_is_valid("A_b.c-9"));
        assert_true(template_netns_name_is_valid("x."));

        memset(max, 'n', TEMPLATE_NETNS_NAME_MAX);
        max[TEMPLATE_NETNS_NAME_MAX] = 0;
        assert_true(template_netns_name_is_valid(max));
}

static void test_refuses(void **state) {
        static const char *const bad[] = {
                "",
                ".",
                "..",
                "../etc",
                "a/b",
                "/run/netns/x",
                "forkd-child-1/",
                "a..b",
                "..hidden",
                ".hidden",
                "a b",
                "a\tb",
                "a\nb",
                "a:b",
                "a\\b",
                "a*",
                "caf\xc3\xa9",
                "\xff",
        };
        char longer[TEMPLATE_NETNS_NAME_MAX + 2];

        (void) state;
        assert_false(template_netns_name_is_valid(NULL));
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
                if (template_netns_name_is_valid(bad[i]))
                        fail_msg("accepted \"%s\"", bad[i]);

        memset(longer, 'n', TEMPLATE_NETNS_NAME_MAX + 1);
        longer[TEMPLATE_NETNS_NAME_MAX + 1] = 0;
        assert_false(template_netns_name_is_valid(longer));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_accepts),
                cmocka_unit_test(test_refuses),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
