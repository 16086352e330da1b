/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* The token buckets behind disk_rate and net_rate (src/vmm/ratelimit.c), and
 * the checks of cpu_limit, disk_rate and net_rate (fork-options.c). */

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fork-options.h"
#include "ratelimit.h"
#include "vmm-limits.h"
#include "vmm.h"
#include "time-util.h"

#define T0 (1000 * USEC_PER_SEC)

static void test_unlimited(void **state) {
        struct rate_limiter rl;
        uint64_t waited;

        (void) state;
        rate_limiter_configure(&rl, &(struct rate_limit) {}, T0);
        assert_false(rate_limiter_active(&rl));
        for (int i = 0; i < 1000; i++)
                assert_int_equal(rate_limiter_consume(&rl, UINT64_MAX, T0, &waited), 0);
        assert_int_equal(waited, 0);
}

static void test_refill(void **state) {
        struct rate_limiter rl;
        uint64_t w;

        (void) state;
        /* 1 MiB/s, bucket of one second: full at the start */
        rate_limiter_configure(&rl, &(struct rate_limit) { .bandwidth = 1 << 20 }, T0);
        assert_true(rate_limiter_active(&rl));
        assert_int_equal(rate_limiter_consume(&rl, 1 << 20, T0, NULL), 0);
        /* empty: 64 KiB takes 1/16 s */
        w = rate_limiter_consume(&rl, 64 << 10, T0, NULL);
        assert_int_equal(w, USEC_PER_SEC / 16);
        /* half of it later: half left to wait */
        w = rate_limiter_consume(&rl, 64 << 10, T0 + USEC_PER_SEC / 32, NULL);
        assert_int_equal(w, USEC_PER_SEC / 32);
        assert_int_equal(rate_limiter_consume(&rl, 64 << 10, T0 + USEC_PER_SEC / 16, NULL), 0);
        assert_int_equal(rl.bytes.tokens, 0);

        /* fractions of a token add up over many small steps */
        for (uint64_t t = 1; t <= USEC_PER_SEC; t++)
                token_bucket_refill(&rl.bytes, T0 + USEC_PER_SEC / 16 + t);
        assert_int_equal(rl.bytes.tokens, 1 << 20);

        /* a long idle time fills it, never more */
        token_bucket_take(&rl.bytes, 1 << 20);
        token_bucket_refill(&rl.bytes, T0 + 3600 * USEC_PER_SEC);
        assert_int_equal(rl.bytes.tokens, 1 << 20);
}

static void test_burst(void **state) {
        struct rate_limiter rl;

        (void) state;
        /* 4 KiB/s with a burst of 1 MiB: the first MiB passes at once */
        rate_limiter_configure(&rl, &(struct rate_limit) { .bandwidth = 4096, .burst = 1 << 20 }, T0);
        for (int i = 0; i < 256; i++)
                assert_int_equal(rate_limiter_consume(&rl, 4096, T0, NULL), 0);
        assert_int_equal(rate_limiter_consume(&rl, 4096, T0, NULL), USEC_PER_SEC);

        /* a request larger than the bucket passes once it is full, leaving debt */
        rate_limiter_configure(&rl, &(struct rate_limit) { .bandwidth = 4096, .burst = 8192 }, T0);
        assert_int_equal(rate_limiter_consume(&rl, 4096, T0, NULL), 0);
        assert_int_equal(rate_limiter_consume(&rl, 65536, T0, NULL), USEC_PER_SEC);
        assert_int_equal(rate_limiter_consume(&rl, 65536, T0 + USEC_PER_SEC, NULL), 0);
        assert_int_equal(rl.bytes.tokens, 8192 - 65536);
        /* the debt is paid before the next byte passes */
        assert_int_equal(rate_limiter_consume(&rl, 1, T0 + USEC_PER_SEC, NULL), (57345 * USEC_PER_SEC + 4095) / 4096);
}

static void test_ops(void **state) {
        struct rate_limiter rl;
        uint64_t waited;

        (void) state;
        rate_limiter_configure(&rl, &(struct rate_limit) { .ops = 10 }, T0);
        for (int i = 0; i < 10; i++)
                assert_int_equal(rate_limiter_consume(&rl, 1 << 30, T0, NULL), 0);
        assert_int_equal(rate_limiter_consume(&rl, 0, T0, &waited), USEC_PER_SEC / 10);
        assert_int_equal(waited, 0);
        assert_true(rl.waiting);
        assert_int_equal(rate_limiter_consume(&rl, 0, T0 + 50000, &waited), 50000);
        assert_int_equal(rate_limiter_consume(&rl, 0, T0 + 100000, &waited), 0);
        /* how long the refused request waited, counted once */
        assert_int_equal(waited, 100000);
        assert_false(rl.waiting);

        /* both dimensions: neither bucket is charged when one refuses */
        rate_limiter_configure(&rl, &(struct rate_limit) { .bandwidth = 4096, .ops = 1 }, T0);
        assert_int_equal(rate_limiter_consume(&rl, 100, T0, NULL), 0);
        assert_int_equal(rate_limiter_consume(&rl, 100, T0, NULL), USEC_PER_SEC);
        assert_int_equal(rl.bytes.tokens, 4096 - 100);
}

static void test_clock_backward(void **state) {
        struct rate_limiter rl;
        uint64_t waited;

        (void) state;
        rate_limiter_configure(&rl, &(struct rate_limit) { .bandwidth = 4096 }, T0);
        assert_int_equal(rate_limiter_consume(&rl, 4096, T0, NULL), 0);
        assert_true(rate_limiter_consume(&rl, 4096, T0, NULL) > 0);
        /* backward: nothing refilled, nothing breaks, the reference moves back */
        assert_int_equal(rate_limiter_consume(&rl, 4096, T0 - 10 * USEC_PER_SEC, &waited), USEC_PER_SEC);
        assert_int_equal(rl.bytes.tokens, 0);
        assert_int_equal(rate_limiter_consume(&rl, 4096, T0 - 9 * USEC_PER_SEC, &waited), 0);
        /* the wait began after the time it passed: no negative or huge figure */
        assert_int_equal(waited, 0);
        /* and time 0 itself */
        assert_true(rate_limiter_consume(&rl, 4096, 0, NULL) > 0);
        assert_int_equal(rate_limiter_consume(&rl, 4096, USEC_PER_SEC, NULL), 0);
}

static void test_bounds(void **state) {
        struct rate_limiter rl;
        uint64_t w;

        (void) state;
        /* the largest figures: no overflow, whatever the time */
        rate_limiter_configure(&rl, &(struct rate_limit) { .bandwidth = RATE_BANDWIDTH_MAX, .ops = RATE_OPS_MAX,
                                                          .burst = RATE_BURST_MAX }, 0);
        assert_int_equal(rate_limiter_consume(&rl, RATE_BURST_MAX, 0, NULL), 0);
        w = rate_limiter_consume(&rl, RATE_BURST_MAX, 0, NULL);
        assert_int_equal(w, USEC_PER_SEC);
        assert_int_equal(rate_limiter_consume(&rl, UINT64_MAX, UINT64_MAX - 1, NULL), 0);
        /* UINT64_MAX bytes are charged as the most a bucket counts: the debt is bounded */
        assert_true(rl.bytes.tokens >= -(int64_t) RATE_BURST_MAX);
        w = rate_limiter_consume(&rl, UINT64_MAX, UINT64_MAX - 1, NULL);
        assert_true(w > 0 && w <= 2 * USEC_PER_SEC);
        token_bucket_refill(&rl.bytes, UINT64_MAX);
        assert_true(rl.bytes.tokens <= (int64_t) RATE_BURST_MAX);

        /* the smallest: 4096 B/s, 1 op/s, refilled one microsecond at a time */
        rate_limiter_configure(&rl, &(struct rate_limit) { .bandwidth = RATE_BANDWIDTH_MIN, .ops = RATE_OPS_MIN }, 0);
        assert_int_equal(rate_limiter_consume(&rl, 4096, 0, NULL), 0);
        for (uint64_t t = 1; t < USEC_PER_SEC; t++)
                token_bucket_refill(&rl.ops, t);
        assert_int_equal(rl.ops.tokens, 0);
        token_bucket_refill(&rl.ops, USEC_PER_SEC);
        assert_int_equal(rl.ops.tokens, 1);
        /* and more than the figures allow is held to them */
        token_bucket_configure(&rl.bytes, UINT64_MAX, UINT64_MAX, 0);
        assert_int_equal(rl.bytes.capacity, RATE_BURST_MAX);
        token_bucket_take(&rl.bytes, UINT64_MAX);
        token_bucket_take(&rl.bytes, UINT64_MAX);
        assert_int_equal(rl.bytes.tokens, -(int64_t) RATE_BURST_MAX);
        assert_true(token_bucket_wait(&rl.bytes, UINT64_MAX) > 0);
}

static void test_checks(void **state) {
        char err[FORK_OPTION_ERROR_MAX];

        (void) state;
        assert_int_equal(fork_option_check_cpu_limit(0.01, 1, err), 0);
        assert_int_equal(fork_option_check_cpu_limit(1, 1, err), 0);
        assert_int_equal(fork_option_check_cpu_limit(3.5, 4, err), 0);
        assert_int_equal(fork_option_check_cpu_limit(1.01, 1, err), -EINVAL);
        assert_string_equal(err, "cpu_limit must be a number between 0.01 and 1");
        assert_int_equal(fork_option_check_cpu_limit(0.001, 4, err), -EINVAL);
        assert_string_equal(err, "cpu_limit must be a number between 0.01 and 4");
        assert_int_equal(fork_option_check_cpu_limit(NAN, 4, err), -EINVAL);
        assert_int_equal(fork_option_check_cpu_limit(INFINITY, 4, err), -EINVAL);

        assert_int_equal(fork_option_check_rate("disk_rate", &(struct rate_limit) { .bandwidth = 4096 },
                                                RATE_KEY_BANDWIDTH, err), 0);
        assert_int_equal(fork_option_check_rate("disk_rate", &(struct rate_limit) {}, RATE_KEY_OPS, err), 0);
        assert_int_equal(fork_option_check_rate("net_rate", &(struct rate_limit) {}, 0, err), -EINVAL);
        assert_string_equal(err, "net_rate needs at least one of bandwidth, ops and burst");
        assert_int_equal(fork_option_check_rate("disk_rate", &(struct rate_limit) { .bandwidth = 4095 },
                                                RATE_KEY_BANDWIDTH, err), -EINVAL);
        assert_string_equal(err, "disk_rate.bandwidth must be 0 or between 4096 and 1099511627776");
        assert_int_equal(fork_option_check_rate("disk_rate", &(struct rate_limit) { .ops = 10000001 },
                                                RATE_KEY_OPS, err), -EINVAL);
        assert_string_equal(err, "disk_rate.ops must be 0 or between 1 and 10000000");
        assert_int_equal(fork_option_check_rate("net_rate", &(struct rate_limit) { .bandwidth = 4096,
                                                .burst = RATE_BURST_MAX + 1 }, RATE_KEY_BANDWIDTH | RATE_KEY_BURST,
                                                err), -EINVAL);
        assert_string_equal(err, "net_rate.burst must be at most 1099511627776");
        assert_int_equal(fork_option_check_rate("net_rate", &(struct rate_limit) { .burst = 8192 }, RATE_KEY_BURST,
                                                err), -EINVAL);
        assert_string_equal(err, "net_rate.burst needs net_rate.bandwidth");
}

/* The VMM's side: a request refused waits, the timer brings it back, the
 * time it waited is counted; set_limits and the spawn's keys are checked
 * whole. */
static void test_vmm_limits(void **state) {
        struct vmm vmm = {};
        struct rate_limit disk, net;
        bool has_disk, has_net;
        char err[FORK_OPTION_ERROR_MAX];
        struct json_object *req, *reply;

        (void) state;
        signal(SIGIO, SIG_IGN); /* the timer's signal, aimed at this thread */
        vmm.stats = &vmm.own_stats;
        assert_true(vmm_limits_disk_take(&vmm, 1 << 20)); /* none set: no state at all */
        assert_null(vmm.limits);

        req = json_tokener_parse("{\"op\":\"set_limits\",\"disk_rate\":{\"ops\":1}}");
        reply = json_object_new_object();
        assert_int_equal(vmm_limits_set_json(&vmm, req, reply, err), 0);
        assert_string_equal(json_object_to_json_string_ext(reply, JSON_C_TO_STRING_PLAIN),
                            "{\"disk_rate\":{\"ops\":1}}");
        json_object_put(req);
        json_object_put(reply);
        assert_true(vmm_limits_disk_take(&vmm, 4096));
        assert_false(vmm_limits_disk_take(&vmm, 4096)); /* waits: the timer is armed */
        assert_true(vmm_limits_net_tx_take(&vmm, 1500)); /* net_rate: none */
        usleep(20000);
        assert_false(vmm_limits_disk_take(&vmm, 4096));
        /* lifted: it passes, and the time it waited is counted */
        assert_int_equal(vmm_limits_set(&vmm, &(struct rate_limit) {}, NULL), 0);
        assert_true(vmm_limits_disk_take(&vmm, 4096));
        vmm_limits_service(&vmm); /* kicks no device: there is none */
        assert_int_equal(vmm_stats_get(&vmm.stats->disk_throttled_usec), 0); /* reconfigured, not passed */
        assert_int_equal(vmm_limits_set(&vmm, &(struct rate_limit) { .ops = 1 }, NULL), 0);
        assert_true(vmm_limits_disk_take(&vmm, 0));
        assert_false(vmm_limits_disk_take(&vmm, 0));
        usleep(1100000);
        assert_true(vmm_limits_disk_take(&vmm, 0));
        assert_true(vmm_stats_get(&vmm.stats->disk_throttled_usec) >= 1000000);

        /* rx: admitted without a charge, then charged its size */
        assert_int_equal(vmm_limits_set(&vmm, NULL, &(struct rate_limit) { .bandwidth = 4096 }), 0);
        assert_true(vmm_limits_net_rx_take(&vmm));
        vmm_limits_net_rx_charge(&vmm, 8192); /* in debt */
        assert_false(vmm_limits_net_rx_take(&vmm));
        assert_true(vmm_limits_net_rx_waiting(&vmm));

        /* refused whole: a bad net_rate beside a good disk_rate changes nothing */
        req = json_tokener_parse("{\"disk_rate\":{\"bandwidth\":8192},\"net_rate\":{\"ops\":0.5}}");
        reply = json_object_new_object();
        assert_int_equal(vmm_limits_set_json(&vmm, req, reply, err), -EINVAL);
        assert_string_equal(err, "net_rate.ops must be a non-negative integer");
        vmm_limits_get(&vmm, &disk, &net);
        assert_true(disk.bandwidth == 0 && disk.ops == 1 && net.bandwidth == 4096);
        json_object_put(req);
        json_object_put(reply);
        req = json_tokener_parse("{\"disk_rate\":null,\"net_rate\":{\"bandwidth\":4096,\"burst\":65536}}");
        assert_int_equal(vmm_limits_parse_json(req, &disk, &has_disk, &net, &has_net, err), 0);
        assert_true(!has_disk && has_net && net.burst == 65536);
        json_object_put(req);
        req = json_tokener_parse("{\"disk_rate\":[1]}");
        assert_int_equal(vmm_limits_parse_json(req, &disk, &has_disk, &net, &has_net, err), -EINVAL);
        assert_string_equal(err, "disk_rate must be an object with bandwidth, ops or burst");
        json_object_put(req);
        vmm_limits_free(&vmm);
        assert_null(vmm.limits);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_unlimited),      cmocka_unit_test(test_refill), cmocka_unit_test(test_burst),
                cmocka_unit_test(test_ops),            cmocka_unit_test(test_clock_backward),
                cmocka_unit_test(test_bounds),         cmocka_unit_test(test_checks),
                cmocka_unit_test(test_vmm_limits),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
