/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* Tests for console_tail(): the last lines of a guest's console for an error message. */

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

#include "console-tail.h"
#include "macro.h"

static char tmpdir[] = "/tmp/test-console-tail.XXXXXX";
static char path[sizeof(tmpdir) + 16];

static int setup(void **state) {
        (void) state;
        if (!mkdtemp(tmpdir))
                return -1;
        snprintf(path, sizeof(path), "%s/console.log", tmpdir);
        return 0;
}

static int teardown(void **state) {
        (void) state;
        (void) unlink(path);
        return rmdir(tmpdir);
}

static void write_log(const char *data, size_t len) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

        assert_true(fd >= 0);
        assert_int_equal(write(fd, data, len), (ssize_t) len);
        close(fd);
}

static char *tail_of(const char *data, unsigned n_lines) {
        char *t = NULL;

        write_log(data, strlen(data));
        assert_int_equal(console_tail(path, n_lines, &t), 0);
        assert_non_null(t);
        return t;
}

static void expect_tail(const char *data, unsigned n_lines, const char *expected) {
        _cleanup_free_ char *t = tail_of(data, n_lines);

        assert_string_equal(t, expected);
}

static void test_last_lines(void **state) {
        (void) state;
        expect_tail("one\ntwo\nthree\n", 2, "  two\n  three");
        expect_tail("one\ntwo\nthree\n", 10, "  one\n  two\n  three");
        /* the last line need not end with a newline */
        expect_tail("one\ntwo\nthree", 1, "  three");
        expect_tail("only", 3, "  only");
}

static void test_empty(void **state) {
        (void) state;
        expect_tail("", 5, "");
        expect_tail("\n\n  \r\n\t\n", 5, "");
}

static void test_blank_lines_and_cr_dropped(void **state) {
        (void) state;
        /* Linux writes CR LF on a serial console */
        expect_tail("a\r\n\r\nb\r\n\n\n", 2, "  a\n  b");
        expect_tail("x\ry\n", 1, "  xy");
}

static void test_unprintable(void **state) {
        _cleanup_free_ char *t = NULL;

        (void) state;
        /* escapes, NUL, UTF-8 and DEL become '?'; a tab a space */
        write_log("\x1b[0mok\t\x7f\xc3\xa9\0z\n", 12);
        assert_int_equal(console_tail(path, 1, &t), 0);
        assert_string_equal(t, "  ?[0mok ????z");
}

static void test_long_line_cut(void **state) {
        char line[CONSOLE_TAIL_LINE_MAX + 50], expected[CONSOLE_TAIL_LINE_MAX + 8];

        (void) state;
        memset(line, 'x', sizeof(line) - 2);
        line[sizeof(line) - 2] = '\n';
        line[sizeof(line) - 1] = 0;
        expected[0] = expected[1] = ' ';
        memset(expected + 2, 'x', CONSOLE_TAIL_LINE_MAX);
        strcpy(expected + 2 + CONSOLE_TAIL_LINE_MAX, "...");
        expect_tail(line, 1, expected);

        /* exactly CONSOLE_TAIL_LINE_MAX characters: not cut */
        line[CONSOLE_TAIL_LINE_MAX] = 0;
        expected[2 + CONSOLE_TAIL_LINE_MAX] = 0;
        expect_tail(line, 1, expected);
}

static void test_big_file(void **state) {
        /* Much more than CONSOLE_TAIL_READ_MAX: only the end is read, and the
         * line cut by the read window is not shown. */
        size_t size = 4 * CONSOLE_TAIL_READ_MAX, o = 0;
        _cleanup_free_ char *big = malloc(size + 64), *t = NULL;
        char expected[64];
        unsigned i = 0;

        (void) state;
        assert_non_null(big);
        while (o < size)
                o += (size_t) sprintf(big + o, "line %u\n", i++);
        write_log(big, o);
        assert_int_equal(console_tail(path, 3, &t), 0);
        snprintf(expected, sizeof(expected), "  line %u\n  line %u\n  line %u", i - 3, i - 2, i - 1);
        assert_string_equal(t, expected);
        free(t);
        t = NULL;

        /* Ask for every line: those of the read window, the cut one left out. */
        assert_int_equal(console_tail(path, CONSOLE_TAIL_LINES_MAX, &t), 0);
        assert_true(strncmp(t, "  line ", 7) == 0);
        assert_true(strlen(t) < CONSOLE_TAIL_READ_MAX + 2 * CONSOLE_TAIL_LINES_MAX);
        assert_non_null(strstr(t, expected));
}

static void test_errors_leave_ret_alone(void **state) {
        char *sentinel = (char *) 0x1, *t = sentinel;
        char missing[sizeof(path) + 8];

        (void) state;
        snprintf(missing, sizeof(missing), "%s/nope", tmpdir);
        assert_int_equal(console_tail(missing, 3, &t), -ENOENT);
        assert_ptr_equal(t, sentinel);
        assert_int_equal(console_tail(tmpdir, 3, &t), -EBADF);
        assert_ptr_equal(t, sentinel);
        write_log("x\n", 2);
        assert_int_equal(console_tail(path, 0, &t), -EINVAL);
        assert_int_equal(console_tail(path, CONSOLE_TAIL_LINES_MAX + 1, &t), -EINVAL);
        assert_ptr_equal(t, sentinel);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_last_lines),
                cmocka_unit_test(test_empty),
                cmocka_unit_test(test_blank_lines_and_cr_dropped),
                cmocka_unit_test(test_unprintable),
                cmocka_unit_test(test_long_line_cut),
                cmocka_unit_test(test_big_file),
                cmocka_unit_test(test_errors_leave_ret_alone),
        };

        return cmocka_run_group_tests(tests, setup, teardown);
}
