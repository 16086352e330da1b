/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The boot files of CreateSnapshotFromFds: opening them as the caller
 * (src/shared/boot-files.c), checking a handed-over descriptor, finding a
 * Debian initramfs beside its kernel, and forkd's sparse copy into the
 * staging directory (copy_file_sparse(), src/daemon/fs-util.c).
 */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cmocka.h>

#include "boot-files.h"
#include "fs-util.h"
#include "macro.h"

static char dir[64];

static int setup(void **state) {
        snprintf(dir, sizeof(dir), "/tmp/test-boot-files.XXXXXX");
        return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
        return rm_rf(dir) < 0 ? -1 : 0;
}

static char *path_of(const char *name) {
        char *p = NULL;
        assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
        return p;
}

static void write_at(int fd, uint64_t off, char c, size_t n) {
        char buf[4096];

        memset(buf, c, sizeof(buf));
        while (n > 0) {
                size_t k = MIN(n, sizeof(buf));
                assert_int_equal(pwrite(fd, buf, k, (off_t) off), (ssize_t) k);
                off += k;
                n -= k;
        }
}

static void test_open(void **state) {
        _cleanup_free_ char *f = path_of("kernel");
        int fd = 12345, r;

        assert_int_equal(boot_file_open("/nonexistent/kernel", &fd), -ENOENT);
        assert_int_equal(fd, 12345); /* untouched on failure */
        assert_int_equal(boot_file_open(dir, &fd), -EISDIR);
        assert_int_equal(boot_file_open("/dev/null", &fd), -EINVAL);
        assert_int_equal(boot_file_open("", &fd), -EINVAL);
        fd = open(f, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        safe_close(fd);
        r = boot_file_open(f, &fd);
        assert_int_equal(r, 0);
        assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
        assert_int_equal(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
        safe_close(fd);
}

static void test_fd_check(void **state) {
        _cleanup_free_ char *f = path_of("rootfs");
        _cleanup_close_ int w = -EBADF, rd = -EBADF, p = -EBADF, d = -EBADF;
        uint64_t size = 7;

        w = open(f, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(w >= 0);
        write_at(w, 0, 'x', 10000);
        rd = open(f, O_RDONLY | O_CLOEXEC);
        p = open(f, O_PATH | O_CLOEXEC);
        d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(rd >= 0 && p >= 0 && d >= 0);

        assert_int_equal(boot_fd_check(w, 1 << 20, &size), -EBADF);  /* write-only */
        assert_int_equal(boot_fd_check(p, 1 << 20, &size), -EBADF);  /* O_PATH: no reading */
        assert_int_equal(boot_fd_check(d, 1 << 20, &size), -EINVAL); /* not a regular file */
        assert_int_equal(boot_fd_check(rd, 9999, &size), -EFBIG);
        assert_int_equal(size, 7); /* untouched on failure */
        assert_int_equal(boot_fd_check(rd, 10000, &size), 0);
        assert_int_equal(size, 10000);
        assert_int_equal(boot_fd_check(-1, 10000, &size), -EBADF);
}

static void test_initrd_beside(void **state) {
        _cleanup_free_ char *k = path_of("vmlinuz-6.1.0-cloud"), *i = path_of("initrd.img-6.1.0-cloud"),
                            *k2 = path_of("vmlinuz"), *b = path_of("bzImage");
        char buf[256];
        int fd;

        fd = open(i, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        safe_close(fd);
        assert_int_equal(boot_initrd_beside(k, buf, sizeof(buf)), 1);
        assert_string_equal(buf, i);
        assert_int_equal(boot_initrd_beside(k2, buf, sizeof(buf)), 0); /* no initrd.img beside it */
        assert_int_equal(boot_initrd_beside(b, buf, sizeof(buf)), 0);  /* not a Debian name */
        assert_int_equal(boot_initrd_beside("vmlinuzz", buf, sizeof(buf)), 0);
        assert_int_equal(boot_initrd_beside(k, buf, 8), 0);             /* does not fit */
}

static void test_copy_sparse(void **state) {
        _cleanup_free_ char *src = path_of("disk"), *a = NULL, *b = NULL;
        _cleanup_close_ int s = -EBADF, dfd = -EBADF, c = -EBADF;
        const uint64_t size = 8u << 20;
        struct stat st_src, st_copy;
        _cleanup_free_ char *x = malloc(size), *y = malloc(size);

        assert_non_null(x);
        assert_non_null(y);
        s = open(src, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        assert_true(s >= 0);
        write_at(s, 0, 'a', 4096);
        write_at(s, 3u << 20, 'b', 64 * 1024);
        assert_int_equal(ftruncate(s, (off_t) size), 0); /* a hole at the end */
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(dfd >= 0);

        assert_int_equal(copy_file_sparse(s, dfd, "copy", size, 0640), 0);
        c = openat(dfd, "copy", O_RDONLY | O_CLOEXEC);
        assert_true(c >= 0);
        assert_int_equal(fstat(s, &st_src), 0);
        assert_int_equal(fstat(c, &st_copy), 0);
        assert_int_equal(st_copy.st_size, (off_t) size);
        assert_int_equal(st_copy.st_mode & 07777, 0640);
        /* holes stay holes (a reflink shares the blocks, a copy has no more than the source) */
        assert_true(st_copy.st_blocks <= st_src.st_blocks + 8);
        assert_true(st_copy.st_blocks < (blkcnt_t) (size / 512 / 4));
        assert_int_equal(pread(s, x, size, 0), (ssize_t) size);
        assert_int_equal(pread(c, y, size, 0), (ssize_t) size);
        assert_memory_equal(x, y, size);

        /* never over an existing file, and that file stays */
        assert_int_equal(copy_file_sparse(s, dfd, "copy", size, 0640), -EEXIST);
        assert_int_equal(faccessat(dfd, "copy", F_OK, 0), 0);

        /* only the first size bytes */
        assert_int_equal(copy_file_sparse(s, dfd, "head", 4096, 0640), 0);
        assert_int_equal(fstatat(dfd, "head", &st_copy, 0), 0);
        assert_int_equal(st_copy.st_size, 4096);

}

/* Another file system (tmpfs to the test's dir): copy_file_range() may refuse
 * (EXDEV), and the pread()/pwrite() fallback must give the same bytes. */
static void test_copy_cross_fs(void **state) {
        char src[] = "/dev/shm/test-boot-files.XXXXXX";
        _cleanup_close_ int s = -EBADF, dfd = -EBADF, c = -EBADF;
        const size_t size = (3u << 20) + 123;
        _cleanup_free_ char *x = malloc(size), *y = malloc(size);
        struct statfs a, b;

        assert_non_null(x);
        assert_non_null(y);
        s = mkostemp(src, O_CLOEXEC);
        if (s < 0)
                skip();
        (void) unlink(src);
        for (size_t i = 0; i < size; i++)
                x[i] = (char) (i * 7 + i / 4096);
        assert_int_equal(pwrite(s, x, size, 0), (ssize_t) size);
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(dfd >= 0);
        assert_int_equal(fstatfs(s, &a), 0);
        assert_int_equal(fstatfs(dfd, &b), 0);
        if (a.f_type == b.f_type)
                skip(); /* the same kind of file system: nothing to fall back from */
        assert_int_equal(copy_file_sparse(s, dfd, "cross", size, 0600), 0);
        c = openat(dfd, "cross", O_RDONLY | O_CLOEXEC);
        assert_true(c >= 0);
        assert_int_equal(pread(c, y, size, 0), (ssize_t) size);
        assert_memory_equal(x, y, size);
}

static unsigned dir_entries(const char *path) {
        DIR *d = opendir(path);
        struct dirent *de;
        unsigned n = 0;

        assert_non_null(d);
        while ((de = readdir(d)))
                if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
                        n++;
        closedir(d);
        return n;
}

/* write_file_new_at(), which writes the sandbox records: whole or not at all,
 * never over an existing file, nothing else left in the directory. */
static void test_write_new(void **state) {
        _cleanup_free_ char *sub = path_of("records"), *p = path_of("records/a.json");
        _cleanup_close_ int dfd = -EBADF;
        char buf[64] = {};
        int fd;

        assert_int_equal(mkdir(sub, 0755), 0);
        dfd = open(sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(dfd >= 0);
        assert_int_equal(write_file_new_at(dfd, "a.json", "{\"x\":1}", 7), 0);
        fd = open(p, O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(read(fd, buf, sizeof(buf)), 7);
        close(fd);
        assert_string_equal(buf, "{\"x\":1}");
        assert_int_equal(write_file_new_at(dfd, "a.json", "other", 5), -EEXIST);
        memset(buf, 0, sizeof(buf));
        fd = open(p, O_RDONLY | O_CLOEXEC);
        assert_int_equal(read(fd, buf, sizeof(buf)), 7);
        close(fd);
        assert_string_equal(buf, "{\"x\":1}");
        assert_int_equal(write_file_new_at(dfd, "../escape", "x", 1), -EINVAL);
        assert_int_equal(write_file_new_at(dfd, "", "x", 1) < 0, true);
        assert_int_equal(write_file_new_at(dfd, "b.json", "", 0), 0);
        assert_int_equal(dir_entries(sub), 2); /* a.json, b.json: no temporary left */
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_open),
                cmocka_unit_test(test_fd_check),
                cmocka_unit_test(test_initrd_beside),
                cmocka_unit_test(test_copy_sparse),
                cmocka_unit_test(test_copy_cross_fs),
                cmocka_unit_test(test_write_new),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
