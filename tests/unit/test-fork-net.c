/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The pure parts of forking with a network: which fork options a
 * snapshot with or without a NIC takes, the sandbox record's netns, the
 * guest_addr of an agent_tcp sandbox, and the spawn batch with taps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agent-tcp-port.h"
#include "fork-op.h"
#include "sandbox.h"
#include "vmm-client.h"

static void test_resolve_without_nic(void **state) {
        struct fork_options o = { .memory_limit_mib = 64 }, before;
        const char *why = NULL;

        assert_int_equal(fork_options_resolve_network(&o, false, false, &why), 0);
        assert_false(o.net);
        assert_null(why);

        /* A policy for a snapshot without NIC: refused, naming the fix; o untouched. */
        o.net_policy = NETNS_POLICY_EGRESS;
        o.net_policy_given = true;
        before = o;
        assert_int_equal(fork_options_resolve_network(&o, false, false, &why), -EINVAL);
        assert_non_null(why);
        assert_non_null(strstr(why, "no NIC"));
        assert_memory_equal(&o, &before, sizeof(o));

        /* per_child_netns keeps working as before without a NIC. */
        o = (struct fork_options) { .per_child_netns = true };
        assert_int_equal(fork_options_resolve_network(&o, false, true, &why), 0);
        assert_false(o.net);
        assert_false(o.agent_tcp);
}

static void test_resolve_with_nic(void **state) {
        struct fork_options o = {}, before;
        const char *why = NULL;

        /* Default: none, and agent_tcp from the snapshot. */
        assert_int_equal(fork_options_resolve_network(&o, true, true, &why), 0);
        assert_true(o.net);
        assert_int_equal(o.net_policy, NETNS_POLICY_NONE);
        assert_true(o.agent_tcp);

        o = (struct fork_options) { .net_policy = NETNS_POLICY_EGRESS, .net_policy_given = true };
        assert_int_equal(fork_options_resolve_network(&o, true, false, &why), 0);
        assert_true(o.net);
        assert_int_equal(o.net_policy, NETNS_POLICY_EGRESS);
        assert_false(o.agent_tcp);

        o = (struct fork_options) { .per_child_netns = true };
        before = o;
        assert_int_equal(fork_options_resolve_network(&o, true, false, &why), -EINVAL);
        assert_non_null(strstr(why, "per_child_netns"));
        assert_memory_equal(&o, &before, sizeof(o));
}

static void test_policy_strings(void **state) {
        assert_int_equal(netns_policy_from_string("none"), NETNS_POLICY_NONE);
        assert_int_equal(netns_policy_from_string("egress"), NETNS_POLICY_EGRESS);
        assert_true(netns_policy_from_string("Egress") < 0);
        assert_true(netns_policy_from_string("") < 0);
}

static void test_record_netns(void **state) {
        struct sandbox_params p = {
                .id = "sb-abcdef-0000", .snapshot_tag = "net", .netns = "forkd-child-7", .netns_owned = true,
        };
        char *json = NULL;

        assert_int_equal(sandbox_record_format(&p, &json), 0);
        assert_non_null(strstr(json, "\"netns\":\"forkd-child-7\""));
        free(json);

        /* A pre-made namespace (per_child_netns) is not forkd's: not recorded, as before. */
        p.netns_owned = false;
        assert_int_equal(sandbox_record_format(&p, &json), 0);
        assert_null(strstr(json, "netns"));
        free(json);
}

static void test_guest_addr(void **state) {
        char *a = NULL, expect[64];

        snprintf(expect, sizeof(expect), "10.200.0.2:%u", (unsigned) AGENT_TCP_PORT);
        assert_int_equal(sandbox_guest_addr("sb-1", "10.200.0.2", true, &a), 0);
        assert_string_equal(a, expect);
        free(a);
        assert_int_equal(sandbox_guest_addr("sb-1", "10.200.0.2", false, &a), 0);
        assert_string_equal(a, "agent:sb-1");
        free(a);
        assert_int_equal(sandbox_guest_addr("sb-1", NULL, true, &a), 0);
        assert_string_equal(a, "agent:sb-1");
        free(a);
}

static void test_batch_size(void **state) {
        /* 100 a request, and never more than 253 fds (SCM_MAX_FD) in one message. */
        assert_int_equal(vmm_spawn_batch_size(false, false, false, false), 100);
        assert_int_equal(vmm_spawn_batch_size(true, false, false, false), 100);
        assert_int_equal(vmm_spawn_batch_size(true, true, false, false), 84);
        assert_int_equal(vmm_spawn_batch_size(true, false, true, true), 63);
        assert_int_equal(vmm_spawn_batch_size(true, true, true, true), 50);
        for (unsigned m = 0; m < 16; m++) {
                bool c = m & 1, g = m & 2, n = m & 4, t = m & 8;
                assert_true(vmm_spawn_batch_size(c, g, n, t) * (1u + c + g + n + t) <= 253);
        }
        /* with a stats page: 6 fds a child at most */
        assert_int_equal(vmm_spawn_batch_size_fds(2), 100);
        assert_int_equal(vmm_spawn_batch_size_fds(6), 42);
        for (unsigned per = 1; per <= 6; per++)
                assert_true(vmm_spawn_batch_size_fds(per) * per <= 253);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_resolve_without_nic),
                cmocka_unit_test(test_resolve_with_nic),
                cmocka_unit_test(test_policy_strings),
                cmocka_unit_test(test_record_netns),
                cmocka_unit_test(test_guest_addr),
                cmocka_unit_test(test_batch_size),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
