/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* src/shared's basics and the fork options' checks: the words forkd and
 * forkd-rest both answer with (fork-options.c), the string vectors, the I/O
 * loops with their caps, the clocks. */

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

#include "fork-options.h"
#include "io-util.h"
#include "strv.h"
#include "time-util.h"

static void test_fork_option_words(void **state) {
        char err[FORK_OPTION_ERROR_MAX];

        (void) state;
        assert_int_equal(fork_option_check_timeout_secs(1, err), 0);
        assert_int_equal(fork_option_check_timeout_secs(SANDBOX_TIMEOUT_SECS_MAX, err), 0);
        assert_int_equal(fork_option_check_timeout_secs(0, err), -EINVAL);
        assert_string_equal(err, "timeout_secs must be an integer between 1 and 86400");
        assert_int_equal(fork_option_check_timeout_secs(86401, err), -EINVAL);
        assert_int_equal(fork_option_check_timeout_secs(INT64_MIN, err), -EINVAL);

        assert_int_equal(fork_option_check_on_timeout("kill", err), 0);
        assert_int_equal(fork_option_check_on_timeout("pause", err), 0);
        assert_int_equal(fork_option_check_on_timeout("later", err), -EINVAL);
        assert_string_equal(err, "on_timeout must be \"kill\" or \"pause\"");
        assert_int_equal(fork_option_check_on_timeout("", err), -EINVAL);
        assert_int_equal(fork_option_check_on_timeout(NULL, err), -EINVAL);

        assert_int_equal(fork_option_check_memory_limit_mib(MEMORY_LIMIT_MIB_MIN, err), 0);
        assert_int_equal(fork_option_check_memory_limit_mib(MEMORY_LIMIT_MIB_MAX, err), 0);
        assert_int_equal(fork_option_check_memory_limit_mib(15, err), -EINVAL);
        assert_string_equal(err, "memory_limit_mib must be an integer between 16 and 1048576");
        assert_int_equal(fork_option_check_memory_limit_mib(-1, err), -EINVAL);
        assert_int_equal(fork_option_check_memory_limit_mib((int64_t) UINT32_MAX + 1, err), -EINVAL);

        assert_int_equal(fork_option_check_network("none", err), 0);
        assert_int_equal(fork_option_check_network("egress", err), 0);
        assert_int_equal(fork_option_check_network("Egress", err), -EINVAL);
        assert_string_equal(err, "network must be \"none\" or \"egress\"");
}

static void test_fork_option_deadline(void **state) {
        char err[FORK_OPTION_ERROR_MAX];

        (void) state;
        /* nothing given: no deadline, fine unless one is required (SetTimeout) */
        assert_int_equal(fork_option_check_deadline(false, 0, NULL, false, err), 0);
        assert_int_equal(fork_option_check_deadline(false, 0, "", false, err), 0);
        assert_int_equal(fork_option_check_deadline(false, 0, NULL, true, err), -EINVAL);
        assert_string_equal(err, "timeout_secs must be an integer between 1 and 86400");
        /* on_timeout alone */
        assert_int_equal(fork_option_check_deadline(false, 0, "kill", false, err), -EINVAL);
        assert_string_equal(err, "on_timeout needs timeout_secs");
        /* a bad on_timeout is named before the missing timeout_secs */
        assert_int_equal(fork_option_check_deadline(false, 0, "soon", false, err), -EINVAL);
        assert_string_equal(err, "on_timeout must be \"kill\" or \"pause\"");
        /* both fine; the empty on_timeout keeps the current action */
        assert_int_equal(fork_option_check_deadline(true, 5, "pause", false, err), 0);
        assert_int_equal(fork_option_check_deadline(true, 5, "", true, err), 0);
        /* timeout_secs given out of range, whatever on_timeout says */
        assert_int_equal(fork_option_check_deadline(true, 0, "kill", false, err), -EINVAL);
        assert_string_equal(err, "timeout_secs must be an integer between 1 and 86400");
}

static void test_strv(void **state) {
        char **l = calloc(4, sizeof(char *));

        (void) state;
        assert_non_null(l);
        l[0] = strdup("a");
        l[1] = strdup("b");
        assert_int_equal(strv_length(l), 2);
        assert_int_equal(strv_length(NULL), 0);
        assert_null(strv_free(l));
        assert_null(strv_free(NULL));

        l = calloc(3, sizeof(char *));
        assert_non_null(l);
        l[0] = strdup("x");
        l[2] = strdup("z"); /* counted: a NULL in the middle is allowed */
        strv_free_n(l, 3);
        strv_free_n(NULL, 5);
}

static void test_io_loops(void **state) {
        char path[] = "/tmp/forkd-test-basics.XXXXXX", buf[16], *data = NULL;
        int fd = mkstemp(path);
        size_t len = 0;

        (void) state;
        assert_true(fd >= 0);
        assert_int_equal(loop_write(fd, "hello, world", 12), 0);
        assert_int_equal(pwrite_all(fd, "W", 1, 7), 0);
        assert_int_equal(pread_exact(fd, buf, 5, 7), 0);
        assert_memory_equal(buf, "World", 5);
        assert_int_equal(pread_exact(fd, buf, 6, 7), -EIO); /* the file ends first */
        assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
        assert_int_equal(loop_read(fd, buf, sizeof buf), 12);

        assert_int_equal(read_file_capped_at(AT_FDCWD, path, 12, &data, &len), 0);
        assert_int_equal(len, 12);
        assert_string_equal(data, "hello, World");
        free(data);
        data = NULL;
        assert_int_equal(read_file_capped_at(AT_FDCWD, path, 11, &data, &len), -EMSGSIZE);
        assert_null(data);
        assert_int_equal(read_file_capped_at(AT_FDCWD, "/tmp", 11, &data, NULL), -EISDIR);
        assert_int_equal(read_file_capped_at(AT_FDCWD, "/dev/null", 11, &data, NULL), -EBADFD);
        assert_int_equal(read_file_capped_at(AT_FDCWD, "/nonexistent/forkd", 11, &data, NULL), -ENOENT);
        close(fd);
        unlink(path);
}

static void test_clocks(void **state) {
        uint64_t a = now_usec(), b = now_usec();

        (void) state;
        assert_true(a > 0 && b >= a);
        assert_true(now_realtime_usec() > 1600000000ULL * USEC_PER_SEC);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fork_option_words), cmocka_unit_test(test_fork_option_deadline),
                cmocka_unit_test(test_strv),              cmocka_unit_test(test_io_loops),
                cmocka_unit_test(test_clocks),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
