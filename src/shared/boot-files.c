/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>

#include "boot-files.h"
#include "macro.h"

int boot_file_open(const char *path, int *ret_fd) {
        struct stat st;
        int fd;

        if (!path || !path[0] || !ret_fd)
                return -EINVAL;
        /* Look before opening: opening a device or FIFO can have side effects. */
        if (stat(path, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return -errno;
        if (fstat(fd, &st) < 0) {
                int r = -errno;
                safe_close(fd);
                return r;
        }
        if (!S_ISREG(st.st_mode)) {
                safe_close(fd);
                return S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
        }
        *ret_fd = fd;
        return 0;
}

int boot_initrd_beside(const char *kernel, char *buf, size_t size) {
        const char *base = strrchr(kernel, '/');
        size_t dir_len = base ? (size_t) (base - kernel) + 1 : 0;
        const char *name = kernel + dir_len, *suffix;
        struct stat st;
        int n;

        if (strncmp(name, "vmlinu", 6) != 0 || (name[6] != 'z' && name[6] != 'x'))
                return 0;
        suffix = name + 7;
        if (*suffix != 0 && *suffix != '-')
                return 0;
        n = snprintf(buf, size, "%.*sinitrd.img%s", (int) dir_len, kernel, suffix);
        if (n < 0 || (size_t) n >= size || stat(buf, &st) < 0)
                return 0;
        return 1;
}

int boot_fd_check(int fd, uint64_t max, uint64_t *ret_size) {
        struct stat st;
        int flags;

        flags = fcntl(fd, F_GETFL);
        if (flags < 0)
                return -errno;
        if ((flags & O_PATH) || (flags & O_ACCMODE) == O_WRONLY)
                return -EBADF;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EINVAL;
        if ((uint64_t) st.st_size > max)
                return -EFBIG;
        if (ret_size)
                *ret_size = (uint64_t) st.st_size;
        return 0;
}

int boot_image_open(const char *path, int *ret_fd) {
        struct stat st;
        int fd;

        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return -errno;
        if (fstat(fd, &st) < 0 || (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))) {
                close(fd);
                return -EINVAL;
        }
        *ret_fd = fd;
        return 0;
}
