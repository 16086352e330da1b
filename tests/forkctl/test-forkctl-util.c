/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Unit tests for forkctl's bus-free helpers and the D-Bus -> JSON conversion. */

#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "bus-json.h"
#include "fork-options.h"
#include "forkctl-util.h"
#include "macro.h"
#include "table.h"

static void test_parse_u32(void **state) {
        uint32_t v = 4242;

        assert_int_equal(parse_u32("1000", 1, 1000, &v), 0);
        assert_int_equal(v, 1000);

        v = 4242;
        assert_int_equal(parse_u32("1001", 1, 1000, &v), -ERANGE);
        assert_int_equal(parse_u32("0", 1, 1000, &v), -ERANGE);
        assert_int_equal(parse_u32("", 1, 1000, &v), -EINVAL);
        assert_int_equal(parse_u32("-1", 0, 1000, &v), -EINVAL);
        assert_int_equal(parse_u32("+1", 0, 1000, &v), -EINVAL);
        assert_int_equal(parse_u32(" 1", 0, 1000, &v), -EINVAL);
        assert_int_equal(parse_u32("1x", 0, 1000, &v), -EINVAL);
        assert_int_equal(parse_u32("99999999999999999999", 0, UINT32_MAX, &v), -ERANGE);
        assert_int_equal(parse_u32(NULL, 0, 1, &v), -EINVAL);
        /* the output parameter is untouched on every failure */
        assert_int_equal(v, 4242);

        assert_int_equal(parse_u32("4294967295", 0, UINT32_MAX, &v), 0);
        assert_int_equal(v, UINT32_MAX);
}

static void check_message(const char *name, const char *msg, const struct error_context *ctx,
                          const char *expect, int code) {
        sd_bus_error e = SD_BUS_ERROR_MAKE_CONST(name, msg);
        _cleanup_free_ char *s = forkctl_error_message(&e, ctx);

        assert_non_null(s);
        if (!strstr(s, expect))
                fail_msg("'%s' does not contain '%s'", s, expect);
        assert_int_equal(forkctl_error_exit_code(&e), code);
}

static void test_error_messages(void **state) {
        struct error_context snap = { .verb = "fork", .tag = "base" };
        struct error_context box = { .verb = "ping", .id = "sb-1" };

        check_message(FORKD_ERROR_NO_SUCH_SNAPSHOT, "nope", &snap,
                      "no snapshot 'base'; list them with 'forkctl snapshot ls'", 3);
        check_message(FORKD_ERROR_NO_SUCH_SANDBOX, "nope", &box, "no sandbox 'sb-1'", 3);
        check_message(FORKD_ERROR_NO_SUCH_SANDBOX, "nope", &box, "'forkctl ls'", 3);
        check_message(SD_BUS_ERROR_ACCESS_DENIED, "Access denied: polkit does not allow uid 1000", &snap,
                      "polkit does not allow uid 1000; ask an administrator to add you to the forkd group", 4);
        check_message(SD_BUS_ERROR_SERVICE_UNKNOWN, "The name is not activatable", &snap,
                      "forkd is not running; start it with 'systemctl start forkd' or 'tools/forkd-stack up'", 5);
        check_message(SD_BUS_ERROR_NAME_HAS_NO_OWNER, "x", &snap, "forkd is not running", 5);
        check_message(FORKD_ERROR_SNAPSHOT_EXISTS, "x", &snap, "'forkctl snapshot rm base'", 1);
        check_message(FORKD_ERROR_HAS_DEPENDENTS, "x", &snap, "--cascade", 1);
        check_message(FORKD_ERROR_HAS_DEPENDENTS,
                      "snapshot `base` is the parent of 2 chained snapshot(s): [d1, d2]; rerun with `?cascade=true` "
                      "to delete the whole subtree, or `?force=true` to orphan the children", &snap,
                      "snapshot `base` is the parent of 2 chained snapshot(s): [d1, d2]; rerun with 'forkctl snapshot "
                      "rm --cascade base' to delete the whole subtree, or with --force to orphan the children", 1);
        check_message(FORKD_ERROR_CHAIN_BROKEN, "chain `d2` references `d1` content `aa...`", &snap,
                      "chain `d2` references `d1` content `aa...`", 1);
        check_message(FORKD_ERROR_BUSY, "x", &snap, "retry", 1);
        check_message(SD_BUS_ERROR_INVALID_ARGS, "n must be 1..1000", &snap, "invalid argument: n must be 1..1000", 1);
        check_message(FORKD_ERROR_TIMEOUT, "x", &box, "'forkctl ping sb-1'", 1);
        check_message("org.example.Weird", "strange", &snap, "fork failed: strange org.example.Weird", 1);
        check_message(FORKD_ERROR_PAUSED, "sandbox sb-1 is paused", &box,
                      "ping: sandbox 'sb-1' is paused; resume it with 'forkctl resume sb-1', or fork it as it is with "
                      "'forkctl fork-sandbox sb-1'", 1);
        /* merge, diff: forkd names the paused one, which may be the other id */
        check_message(FORKD_ERROR_PAUSED, "sandbox sb-2 is paused", &box, "'sb-2' is paused; resume it with "
                      "'forkctl resume sb-2'", 1);
        check_message(FORKD_ERROR_PAUSED, "sandbox  is paused", &box, "'sb-1' is paused", 1);
        check_message(FORKD_ERROR_PAUSED, NULL, &box, "'sb-1' is paused", 1);
        check_message(FORKD_ERROR_NOT_PAUSED, "sandbox sb-1 is not paused", &box,
                      "ping: sandbox 'sb-1' is not paused; pause it with 'forkctl pause sb-1'", 1);
}

static void test_parse_rfc3339_utc(void **state) {
        uint64_t t = 4242;

        assert_int_equal(parse_rfc3339_utc("1970-01-01T00:00:00Z", &t), 0);
        assert_true(t == 0);
        assert_int_equal(parse_rfc3339_utc("2026-05-20T08:08:46.123Z", &t), 0);
        assert_true(t == 1779264526);
        assert_int_equal(parse_rfc3339_utc("2024-02-29T23:59:59.123456789Z", &t), 0);
        assert_true(t == 1709251199);
        assert_int_equal(parse_rfc3339_utc("2000-03-01T00:00:00Z", &t), 0);
        assert_true(t == 951868800);

        t = 4242;
        assert_int_equal(parse_rfc3339_utc("", &t), -EINVAL);
        assert_int_equal(parse_rfc3339_utc(NULL, &t), -EINVAL);
        assert_int_equal(parse_rfc3339_utc("2026-05-20T08:08:46", &t), -EINVAL);          /* no zone */
        assert_int_equal(parse_rfc3339_utc("2026-05-20T08:08:46+02:00", &t), -EINVAL);    /* UTC only */
        assert_int_equal(parse_rfc3339_utc("2026-05-20T08:08:46.Z", &t), -EINVAL);
        assert_int_equal(parse_rfc3339_utc("2026-05-20T08:08:46.1234567890Z", &t), -EINVAL);
        assert_int_equal(parse_rfc3339_utc("2026-05-20T08:08:46ZZ", &t), -EINVAL);
        assert_int_equal(parse_rfc3339_utc("2026-05-20 08:08:46Z", &t), -EINVAL);
        assert_int_equal(parse_rfc3339_utc("2026-13-20T08:08:46Z", &t), -EINVAL);
        assert_int_equal(parse_rfc3339_utc("2025-02-29T08:08:46Z", &t), -EINVAL);          /* not a leap year */
        assert_int_equal(parse_rfc3339_utc("1900-02-29T08:08:46Z", &t), -EINVAL);
        assert_int_equal(parse_rfc3339_utc("2026-04-31T08:08:46Z", &t), -EINVAL);
        assert_int_equal(parse_rfc3339_utc("2026-05-20T24:00:00Z", &t), -EINVAL);
        assert_int_equal(parse_rfc3339_utc("2026-05-20T08:08:60Z", &t), -EINVAL);          /* leap second */
        assert_int_equal(parse_rfc3339_utc("1969-12-31T23:59:59Z", &t), -EINVAL);
        assert_int_equal(parse_rfc3339_utc("2026-0a-20T08:08:46Z", &t), -EINVAL);
        assert_int_equal(parse_rfc3339_utc("+026-05-20T08:08:46Z", &t), -EINVAL);
        /* the output parameter is untouched on every failure */
        assert_true(t == 4242);
}

static void test_format(void **state) {
        char buf[32];

        assert_string_equal(format_bytes(buf, sizeof buf, 512), "512B");
        assert_string_equal(format_bytes(buf, sizeof buf, 64ULL << 20), "64.0M");
        assert_string_equal(format_bytes(buf, sizeof buf, 3ULL << 29), "1.5G");
        assert_string_equal(format_unix_time(buf, sizeof buf, 0), "-");
}

static void test_table(void **state) {
        static const char *const headers[] = { "ID", "STATE", "PID" };
        _cleanup_table_ struct table *t = table_new(3, headers);
        _cleanup_free_ char *out = NULL;
        size_t size = 0;
        FILE *f;

        assert_non_null(t);
        assert_int_equal(table_add_row(t, (const char *const[]) { "a", "running", "1" }), 0);
        assert_int_equal(table_add_row(t, (const char *const[]) { "long-id", NULL, "12345" }), 0);
        assert_int_equal(table_rows(t), 2);

        f = open_memstream(&out, &size);
        assert_non_null(f);
        assert_int_equal(table_print(t, f), 0);
        fclose(f);
        assert_string_equal(out,
                            "ID       STATE    PID\n"
                            "a        running  1\n"
                            "long-id  -        12345\n");
}

/* Builds a message as forkd would send it and converts it. */
static void test_bus_json(void **state) {
        _cleanup_(sd_bus_unrefp) sd_bus *bus = NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *j = NULL;
        struct json_object *first, *v;
        int fds[2];

        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
        assert_int_equal(sd_bus_new(&bus), 0);
        assert_int_equal(sd_bus_set_fd(bus, fds[0], fds[0]), 0);
        assert_true(sd_bus_start(bus) >= 0);
        close(fds[1]);

        assert_int_equal(sd_bus_message_new_method_call(bus, &m, "org.forkd.Manager", "/org/forkd/Manager",
                                                        "org.forkd.Manager", "X"), 0);
        assert_true(sd_bus_message_open_container(m, 'a', "a{sv}") >= 0);
        assert_true(sd_bus_message_open_container(m, 'a', "{sv}") >= 0);
        assert_true(sd_bus_message_append(m, "{sv}", "id", "s", "sb-1") >= 0);
        assert_true(sd_bus_message_append(m, "{sv}", "pid", "u", 4242) >= 0);
        assert_true(sd_bus_message_append(m, "{sv}", "created_at_unix", "t", (uint64_t) 18446744073709551615ULL) >= 0);
        assert_true(sd_bus_message_append(m, "{sv}", "live", "b", 1) >= 0);
        assert_true(sd_bus_message_append(m, "{sv}", "ancestors", "as", 2, "a", "b") >= 0);
        assert_true(sd_bus_message_close_container(m) >= 0);
        assert_true(sd_bus_message_append(m, "a{sv}", 0) >= 0);
        assert_true(sd_bus_message_close_container(m) >= 0);
        assert_true(sd_bus_message_seal(m, 1, 0) >= 0);
        assert_true(sd_bus_message_rewind(m, true) >= 0);

        assert_int_equal(bus_message_read_dict_array_json(m, &j), 0);
        assert_true(json_object_is_type(j, json_type_array));
        assert_int_equal(json_object_array_length(j), 2);
        first = json_object_array_get_idx(j, 0);
        assert_true(json_object_object_get_ex(first, "id", &v));
        assert_string_equal(json_object_get_string(v), "sb-1");
        assert_true(json_object_object_get_ex(first, "pid", &v));
        assert_int_equal(json_object_get_int64(v), 4242);
        assert_true(json_object_object_get_ex(first, "created_at_unix", &v));
        assert_true(json_object_get_uint64(v) == UINT64_MAX);
        assert_true(json_object_object_get_ex(first, "live", &v));
        assert_true(json_object_get_boolean(v));
        assert_true(json_object_object_get_ex(first, "ancestors", &v));
        assert_int_equal(json_object_array_length(v), 2);
        assert_int_equal(json_object_object_length(json_object_array_get_idx(j, 1)), 0);
        assert_string_equal(json_object_to_json_string_ext(first, JSON_C_TO_STRING_PLAIN),
                            "{\"id\":\"sb-1\",\"pid\":4242,\"created_at_unix\":18446744073709551615,"
                            "\"live\":true,\"ancestors\":[\"a\",\"b\"]}");
}

static void test_parse_volume(void **state) {
        static const char *const bad[] = {
                "", "/a.img", "/a.img:", "rel.img:/data", "/a.img:data", "/a.img:/", "/a.img:/data/../x",
                "/a.img:/proc/x", "/a.img:/data:rwx", "/a.img::ro", ":/data",
        };
        struct forkctl_volume v;
        const char *why = NULL;
        char buf[128];

        snprintf(buf, sizeof buf, "/srv/v.ext4:/data");
        assert_int_equal(forkctl_parse_volume(buf, &v, &why), 0);
        assert_string_equal(v.host, "/srv/v.ext4");
        assert_string_equal(v.guest, "/data");
        assert_string_equal(v.mode, "ro");

        snprintf(buf, sizeof buf, "/srv/a:b.img:/mnt/x:cow");
        assert_int_equal(forkctl_parse_volume(buf, &v, &why), 0);
        assert_string_equal(v.host, "/srv/a:b.img");
        assert_string_equal(v.guest, "/mnt/x");
        assert_string_equal(v.mode, "cow");

        snprintf(buf, sizeof buf, "/v.img:/home/u:rw");
        assert_int_equal(forkctl_parse_volume(buf, &v, &why), 0);
        assert_string_equal(v.mode, "rw");

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                snprintf(buf, sizeof buf, "%s", bad[i]);
                why = NULL;
                if (forkctl_parse_volume(buf, &v, &why) != -EINVAL)
                        fail_msg("accepted --volume %s", bad[i]);
                assert_non_null(why);
        }
}

/* --disk-rate, --net-rate and --cpu-limit */
static void test_parse_limits(void **state) {
        struct rate_limit l;
        char err[256];
        double d;

        (void) state;
        assert_int_equal(forkctl_parse_rate("10M", "disk_rate", &l, err, sizeof err), 0);
        assert_true(l.bandwidth == 10u << 20 && l.ops == 0 && l.burst == 0);
        assert_int_equal(forkctl_parse_rate("1G,ops=500,burst=64K", "disk_rate", &l, err, sizeof err), 0);
        assert_true(l.bandwidth == 1u << 30 && l.ops == 500 && l.burst == 64u << 10);
        assert_int_equal(forkctl_parse_rate("ops=7", "net_rate", &l, err, sizeof err), 0);
        assert_true(l.bandwidth == 0 && l.ops == 7);
        assert_int_equal(forkctl_parse_rate("bandwidth=4096,burst=1T", "net_rate", &l, err, sizeof err), 0);
        assert_true(l.bandwidth == 4096 && l.burst == UINT64_C(1) << 40);
        assert_int_equal(forkctl_parse_rate("0", "net_rate", &l, err, sizeof err), 0); /* unlimited */
        assert_true(l.bandwidth == 0 && l.ops == 0 && l.burst == 0);

        assert_int_equal(forkctl_parse_rate("", "disk_rate", &l, err, sizeof err), -EINVAL);
        assert_string_equal(err, "disk_rate needs at least one of bandwidth, ops and burst");
        assert_int_equal(forkctl_parse_rate("2T", "disk_rate", &l, err, sizeof err), -EINVAL);
        assert_string_equal(err, "disk_rate.bandwidth must be 0 or between 4096 and 1099511627776");
        assert_int_equal(forkctl_parse_rate("99999999999999999999", "disk_rate", &l, err, sizeof err), -EINVAL);
        assert_int_equal(forkctl_parse_rate("16777216T", "disk_rate", &l, err, sizeof err), -EINVAL);
        assert_int_equal(forkctl_parse_rate("-1", "disk_rate", &l, err, sizeof err), -EINVAL);
        assert_int_equal(forkctl_parse_rate("1M,ops=1.5", "disk_rate", &l, err, sizeof err), -EINVAL);
        assert_string_equal(err, "disk_rate: ops wants an integer, not '1.5'");
        assert_int_equal(forkctl_parse_rate("1M,,ops=1", "disk_rate", &l, err, sizeof err), 0); /* empty items skipped */

        assert_int_equal(forkctl_parse_cpu_limit("0.5", false, &d), 0);
        assert_true(d == 0.5);
        assert_int_equal(forkctl_parse_cpu_limit("2", false, &d), 0);
        assert_int_equal(forkctl_parse_cpu_limit("0", true, &d), 0);
        assert_int_equal(forkctl_parse_cpu_limit("0", false, &d), -ERANGE);
        assert_int_equal(forkctl_parse_cpu_limit("0.009", false, &d), -ERANGE);
        {
                static const char *const bad[] = { "", "-1", "1e2", "nan", "inf", "0x1", " 1", "1 ", "1,5", "1.2.3" };

                for (size_t k = 0; k < ELEMENTSOF(bad); k++)
                        assert_int_equal(forkctl_parse_cpu_limit(bad[k], true, &d), -EINVAL);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_parse_u32),
                cmocka_unit_test(test_error_messages),
                cmocka_unit_test(test_parse_rfc3339_utc),
                cmocka_unit_test(test_format),
                cmocka_unit_test(test_table),
                cmocka_unit_test(test_bus_json),
                cmocka_unit_test(test_parse_volume),
                cmocka_unit_test(test_parse_limits),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
