/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include "fs-util.h"
#include "io-util.h"
#include "macro.h"

int mkdir_parents_and_self(const char *path, mode_t mode) {
        _cleanup_free_ char *p = strdup(path);

        if (!p)
                return -ENOMEM;
        for (char *s = p + 1; *s; s++) {
                if (*s != '/')
                        continue;
                *s = 0;
                if (mkdir(p, mode) < 0 && errno != EEXIST)
                        return -errno;
                *s = '/';
        }
        if (mkdir(p, mode) < 0 && errno != EEXIST)
                return -errno;
        return 0;
}

int fsync_path(const char *path) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);

        if (fd < 0)
                return -errno;
        if (fsync(fd) < 0)
                return -errno;
        return 0;
}

/* content in a new file .#NAME.TID of dfd (its name in tmp), to be renamed
 * over name; the file's fd, or -errno with nothing left behind. */
static int write_tmp_at(int dfd, const char *name, const char *content, size_t len, char tmp[static 128]) {
        int fd, r;

        snprintf(tmp, 128, ".#%s.%d", name, (int) gettid());
        fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
        if (fd < 0)
                return -errno;
        r = loop_write(fd, content, len);
        if (r < 0) {
                (void) unlinkat(dfd, tmp, 0);
                safe_close(fd);
                return r;
        }
        return fd;
}

int write_file_new_at(int dfd, const char *name, const char *content, size_t len) {
        _cleanup_close_ int fd = -EBADF;
        char proc[64], tmp[128];
        int r;

        if (strlen(name) > 80 || strchr(name, '/'))
                return -EINVAL;
        fd = openat(dfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0640);
        if (fd >= 0) {
                r = loop_write(fd, content, len);
                if (r < 0)
                        return r;
                /* Through /proc rather than AT_EMPTY_PATH, which needs CAP_DAC_READ_SEARCH. */
                snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
                if (linkat(AT_FDCWD, proc, dfd, name, AT_SYMLINK_FOLLOW) >= 0)
                        return 0;
                if (errno == EEXIST || errno == ENOSPC || errno == EDQUOT)
                        return -errno;
                fd = safe_close(fd); /* no /proc: the long way below */
        } else if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
                return -errno;

        fd = write_tmp_at(dfd, name, content, len, tmp);
        if (fd < 0)
                return fd;
        if (renameat2(dfd, tmp, dfd, name, RENAME_NOREPLACE) < 0) {
                r = -errno;
                (void) unlinkat(dfd, tmp, 0);
                return r;
        }
        return 0;
}

int write_file_atomic(const char *dir, const char *name, const char *content, size_t len, unsigned flags) {
        _cleanup_close_ int dfd = -EBADF, fd = -EBADF;
        char tmp[128];
        int r;

        if (strlen(name) > 80 || strchr(name, '/'))
                return -EINVAL;
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;
        fd = write_tmp_at(dfd, name, content, len, tmp);
        if (fd < 0)
                return fd;
        if ((flags & WRITE_SYNC_DATA) && fsync(fd) < 0) {
                r = -errno;
                goto fail;
        }
        if (renameat(dfd, tmp, dfd, name) < 0) {
                r = -errno;
                goto fail;
        }
        if ((flags & WRITE_SYNC_DIR) && fsync(dfd) < 0)
                return -errno;
        return 0;
fail:
        (void) unlinkat(dfd, tmp, 0);
        return r;
}

static int rm_rf_children(int dfd, dev_t dev, unsigned depth) {
        DIR *d;
        struct dirent *de;
        int r = 0;

        if (depth > 16) {
                safe_close(dfd);
                return -ELOOP;
        }
        d = fdopendir(dfd);
        if (!d) {
                r = -errno;
                safe_close(dfd);
                return r;
        }
        while ((errno = 0, de = readdir(d))) {
                struct stat st;

                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                        if (errno != ENOENT && r == 0)
                                r = -errno;
                        continue;
                }
                if (S_ISDIR(st.st_mode)) {
                        int cfd;

                        if (st.st_dev != dev)
                                continue; /* a mount point: leave it alone */
                        cfd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (cfd >= 0) {
                                int k = rm_rf_children(cfd, dev, depth + 1);
                                if (k < 0 && r == 0)
                                        r = k;
                        }
                        if (unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR) < 0 && errno != ENOENT && r == 0)
                                r = -errno;
                } else if (unlinkat(dirfd(d), de->d_name, 0) < 0 && errno != ENOENT && r == 0)
                        r = -errno;
        }
        closedir(d);
        return r;
}

int rm_rf(const char *path) {
        struct stat st;
        int fd, r;

        if (lstat(path, &st) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (!S_ISDIR(st.st_mode))
                return unlink(path) < 0 && errno != ENOENT ? -errno : 0;
        fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        r = rm_rf_children(fd, st.st_dev, 0);
        if (rmdir(path) < 0 && errno != ENOENT && r == 0)
                r = -errno;
        return r;
}

int read_small_file(const char *path, size_t max, char **ret, size_t *ret_len) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW);
        _cleanup_free_ char *buf = NULL;
        size_t n = 0;

        if (fd < 0)
                return -errno;
        buf = malloc(max + 1);
        if (!buf)
                return -ENOMEM;
        for (;;) {
                ssize_t k = read(fd, buf + n, max + 1 - n);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (k == 0)
                        break;
                n += (size_t) k;
                if (n > max)
                        return -EFBIG;
        }
        buf[n] = 0;
        if (ret_len)
                *ret_len = n;
        *ret = TAKE_PTR(buf);
        return 0;
}

/* Copy [off, end) of src into dst at the same offsets: copy_file_range(), or
 * pread()/pwrite() where the kernel cannot (another file system, ...). */
static int copy_range(int src, int dst, uint64_t off, uint64_t end) {
        _cleanup_free_ char *chunk = NULL;
        const size_t chunk_size = 1u << 20;

        while (off < end) {
                size_t want = (size_t) MIN(end - off, (uint64_t) 1 << 30);
                ssize_t n;

                if (!chunk) {
                        loff_t in = (loff_t) off, out = (loff_t) off;

                        n = copy_file_range(src, &in, dst, &out, want, 0);
                        if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP ||
                                      errno == EBADF)) {
                                chunk = malloc(chunk_size);
                                if (!chunk)
                                        return -ENOMEM;
                                continue;
                        }
                } else {
                        n = pread(src, chunk, MIN(want, chunk_size), (off_t) off);
                        if (n > 0) {
                                int r = pwrite_all(dst, chunk, (size_t) n, off);

                                if (r < 0)
                                        return r;
                        }
                }
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        return -ENODATA; /* the file shrank under us */
                off += (uint64_t) n;
        }
        return 0;
}

int copy_file_sparse(int src_fd, int dir_fd, const char *name, uint64_t size, mode_t mode) {
        _cleanup_close_ int dst = -EBADF;
        uint64_t off = 0;
        int r;

        dst = openat(dir_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
        if (dst < 0)
                return -errno;
        if (ioctl(dst, FICLONE, src_fd) >= 0) {
                struct stat st;

                /* A clone takes the whole file; it must be what was checked. */
                if (fstat(dst, &st) >= 0 && (uint64_t) st.st_size == size)
                        return 0;
                if (ftruncate(dst, 0) < 0) {
                        r = -errno;
                        goto fail;
                }
        }
        while (off < size) {
                off_t data = lseek(src_fd, (off_t) off, SEEK_DATA), hole;

                if (data < 0 && errno == ENXIO)
                        break; /* only a hole is left */
                if (data < 0) {
                        /* No SEEK_DATA here: copy it all. */
                        r = copy_range(src_fd, dst, off, size);
                        if (r < 0)
                                goto fail;
                        break;
                }
                if ((uint64_t) data >= size)
                        break;
                hole = lseek(src_fd, data, SEEK_HOLE);
                if (hole < 0 || (uint64_t) hole > size)
                        hole = (off_t) size;
                r = copy_range(src_fd, dst, (uint64_t) data, (uint64_t) hole);
                if (r < 0)
                        goto fail;
                off = (uint64_t) hole;
        }
        if (ftruncate(dst, (off_t) size) < 0) {
                r = -errno;
                goto fail;
        }
        return 0;
fail:
        (void) unlinkat(dir_fd, name, 0);
        return r;
}
