/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io-util.h"
#include "macro.h"

int loop_write(int fd, const void *buf, size_t len) {
        const uint8_t *p = buf;

        while (len > 0) {
                ssize_t k = write(fd, p, len);

                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN) {
                                struct pollfd pfd = { .fd = fd, .events = POLLOUT };

                                (void) poll(&pfd, 1, -1);
                                continue;
                        }
                        return negative_errno();
                }
                p += k;
                len -= (size_t) k;
        }
        return 0;
}

int pread_exact(int fd, void *buf, size_t len, uint64_t off) {
        uint8_t *p = buf;

        while (len > 0) {
                ssize_t k = pread(fd, p, len, (off_t) off);

                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return negative_errno();
                }
                if (k == 0)
                        return -EIO;
                p += k;
                off += (uint64_t) k;
                len -= (size_t) k;
        }
        return 0;
}

int pwrite_all(int fd, const void *buf, size_t len, uint64_t off) {
        const uint8_t *p = buf;

        while (len > 0) {
                ssize_t k = pwrite(fd, p, len, (off_t) off);

                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return negative_errno();
                }
                if (k == 0)
                        return -EIO;
                p += k;
                off += (uint64_t) k;
                len -= (size_t) k;
        }
        return 0;
}

ssize_t loop_read(int fd, void *buf, size_t len) {
        uint8_t *p = buf;
        size_t n = 0;

        while (n < len) {
                ssize_t k = read(fd, p + n, len - n);

                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return negative_errno();
                }
                if (k == 0)
                        break;
                n += (size_t) k;
        }
        return (ssize_t) n;
}

int read_file_capped_at(int dfd, const char *path, size_t max, char **ret_buf, size_t *ret_len) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        ssize_t n;

        if (max > SIZE_MAX - 2)
                return -EINVAL;
        fd = openat(dfd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return negative_errno();
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (S_ISDIR(st.st_mode))
                return -EISDIR;
        if (!S_ISREG(st.st_mode))
                return -EBADFD;

        buf = malloc(max + 2); /* one more byte to see oversize, one for the NUL */
        if (!buf)
                return -ENOMEM;
        n = loop_read(fd, buf, max + 1);
        if (n < 0)
                return (int) n;
        if ((size_t) n > max)
                return -EMSGSIZE;
        buf[n] = 0;

        *ret_buf = TAKE_PTR(buf);
        if (ret_len)
                *ret_len = (size_t) n;
        return 0;
}
