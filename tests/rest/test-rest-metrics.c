/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* forkd-rest's series per sandbox (--metrics-per-sandbox, rest-metrics.c): one
 * line per sandbox with a usage and per series, at most the cap of them, and
 * the gauge of those left out. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <json-c/json.h>

#include "rest-metrics.h"

static struct json_object *sandbox(unsigned i, bool with_usage) {
        struct json_object *o = json_object_new_object(), *u = json_object_new_object();
        char id[32];

        snprintf(id, sizeof id, "sb-%06u", i);
        json_object_object_add(o, "id", json_object_new_string(id));
        json_object_object_add(u, "cpu_usec", json_object_new_uint64(1500000));
        json_object_object_add(u, "memory_private_kib", json_object_new_uint64(4));
        json_object_object_add(u, "memory_shared_kib", json_object_new_uint64(8));
        json_object_object_add(u, "disk_read_bytes", json_object_new_uint64(512));
        if (with_usage)
                json_object_object_add(o, "usage", u);
        else
                json_object_put(u);
        return o;
}

static char *format(struct json_object *list, unsigned max) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);

        assert_non_null(f);
        assert_int_equal(rest_metrics_format_sandboxes(list, max, f), 0);
        assert_int_equal(fclose(f), 0);
        return buf;
}

static unsigned count(const char *text, const char *needle) {
        unsigned n = 0;

        for (const char *p = text; (p = strstr(p, needle)); p++)
                n++;
        return n;
}

static void test_series(void **state) {
        struct json_object *list = json_object_new_array();
        char *text;

        json_object_array_add(list, sandbox(1, true));
        json_object_array_add(list, sandbox(2, false)); /* paused: no usage, no series */
        json_object_array_add(list, json_object_new_object()); /* no id */
        text = format(list, 10);
        assert_non_null(strstr(text, "# TYPE forkd_sandbox_cpu_seconds_total counter\n"));
        assert_non_null(strstr(text, "forkd_sandbox_cpu_seconds_total{id=\"sb-000001\"} 1.500000\n"));
        assert_non_null(strstr(text, "forkd_sandbox_memory_private_bytes{id=\"sb-000001\"} 4096\n"));
        assert_non_null(strstr(text, "forkd_sandbox_memory_shared_bytes{id=\"sb-000001\"} 8192\n"));
        assert_non_null(strstr(text, "forkd_sandbox_disk_read_bytes_total{id=\"sb-000001\"} 512\n"));
        /* a figure the sandbox has not: no line */
        assert_null(strstr(text, "forkd_sandbox_net_rx_bytes_total{"));
        assert_null(strstr(text, "sb-000002"));
        assert_non_null(strstr(text, "forkd_rest_metrics_sandboxes_left_out 0\n"));
        free(text);
        json_object_put(list);
}

static void test_cap(void **state) {
        struct json_object *list = json_object_new_array();
        char *text;

        for (unsigned i = 0; i < REST_METRICS_SANDBOXES_MAX + 3; i++)
                json_object_array_add(list, sandbox(i, true));
        text = format(list, REST_METRICS_SANDBOXES_MAX);
        assert_int_equal(count(text, "forkd_sandbox_cpu_seconds_total{"), REST_METRICS_SANDBOXES_MAX);
        assert_int_equal(count(text, "forkd_sandbox_disk_read_bytes_total{"), REST_METRICS_SANDBOXES_MAX);
        assert_non_null(strstr(text, "forkd_rest_metrics_sandboxes_left_out 3\n"));
        /* the first ones in the list are the ones shown */
        assert_non_null(strstr(text, "{id=\"sb-000000\"}"));
        assert_null(strstr(text, "{id=\"sb-001002\"}"));
        free(text);
        json_object_put(list);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_series),
                cmocka_unit_test(test_cap),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
