/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* forkd-vmm compact: see compact.h. */
#include <dirent.h>
#include <endian.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "chain.h"
#include "compact.h"
#include "io-util.h"
#include "snapshot.h"

#define PAGE 4096u
#define DISK_BLOCK 4096u

static int set_error(char **ret_error, int r, const char *fmt, ...) _printf_(3, 4);
static int set_error(char **ret_error, int r, const char *fmt, ...) {
        va_list ap;

        if (ret_error) {
                free(*ret_error);
                va_start(ap, fmt);
                if (vasprintf(ret_error, fmt, ap) < 0)
                        *ret_error = NULL;
                va_end(ap);
        }
        return r;
}

/* FORKD_TEST_CRASH_COMPACT=<stage>: die right after that stage, as a power cut would. */
static void test_crash_point(const char *stage) {
        const char *e = getenv("FORKD_TEST_CRASH_COMPACT");
        if (e && strcmp(e, stage) == 0)
                _exit(99);
}

static bool page_is_zero(const uint8_t *p) {
        const uint64_t *q = (const uint64_t *) p;
        for (unsigned i = 0; i < PAGE / 8; i++)
                if (q[i])
                        return false;
        return true;
}

static void remove_dir_files(const char *dir) {
        DIR *d = opendir(dir);
        struct dirent *de;

        if (!d)
                return;
        while ((de = readdir(d)))
                if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
                        (void) unlinkat(dirfd(d), de->d_name, 0);
        closedir(d);
        (void) rmdir(dir);
}

/* The head's whole memory, from its chain; zero pages stay holes. */
static int write_memory(int dfd, const uint8_t *mem, uint64_t size) {
        _cleanup_close_ int fd = -EBADF;
        uint64_t off = 0;
        int r;

        fd = openat(dfd, SNAPSHOT_MEMORY_FILE, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        if (fd < 0)
                return -errno;
        if (ftruncate(fd, (off_t) size) < 0)
                return -errno;
        while (off < size) {
                uint64_t end;

                if (page_is_zero(mem + off)) {
                        off += PAGE;
                        continue;
                }
                for (end = off + PAGE; end < size && !page_is_zero(mem + end); end += PAGE)
                        ;
                r = snapshot_write_all(fd, mem + off, end - off, off);
                if (r < 0)
                        return r;
                off = end;
        }
        return fsync(fd) < 0 ? -errno : 0;
}

/* len bytes at off from in to out, the same offsets; holes of in stay holes. */
static int copy_sparse(int in, int out, uint64_t off, uint64_t end) {
        while (off < end) {
                off_t data = lseek(in, (off_t) off, SEEK_DATA), hole;

                if (data < 0 && errno == ENXIO)
                        return 0; /* only a hole from here */
                if (data < 0)
                        return -errno;
                if ((uint64_t) data >= end)
                        return 0;
                hole = lseek(in, data, SEEK_HOLE);
                if (hole < 0)
                        return -errno;
                if ((uint64_t) hole > end)
                        hole = (off_t) end;
                for (loff_t i = data, o = data; i < hole;) {
                        ssize_t n = copy_file_range(in, &i, out, &o, (size_t) (hole - i), 0);
                        if (n < 0 && errno == EINTR)
                                continue;
                        if (n < 0)
                                return -errno;
                        if (n == 0)
                                return -EIO;
                }
                off = (uint64_t) hole;
        }
        return 0;
}

/* disk.img: the snapshot's base with its layers (disk.layer.<i>) applied, oldest first. */
static int write_disk(int dfd, const struct snapshot *snap) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ uint64_t *map = NULL;
        _cleanup_free_ uint8_t *buf = NULL;
        uint64_t size = snap->meta.disk_size, n_blocks = (size / 512 * 512 + DISK_BLOCK - 1) / DISK_BLOCK;
        size_t words = (size_t) ((size / 512 * 512 + DISK_BLOCK - 1) / DISK_BLOCK / 64 + 1);
        char path[64];
        int r;

        if (snap->n_layers == 0) {
                /* The base is never written: share it where the filesystem allows. */
                snprintf(path, sizeof(path), "/proc/self/fd/%d", snap->disk_fd);
                if (linkat(AT_FDCWD, path, dfd, SNAPSHOT_DISK_FILE, AT_SYMLINK_FOLLOW) >= 0)
                        return 0;
        }
        fd = openat(dfd, SNAPSHOT_DISK_FILE, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        if (fd < 0)
                return -errno;
        if (ftruncate(fd, (off_t) size) < 0)
                return -errno;
        r = copy_sparse(snap->disk_fd, fd, 0, size);
        if (r < 0)
                return r;
        map = malloc(words * sizeof(uint64_t));
        buf = malloc(DISK_BLOCK);
        if (!map || !buf)
                return -ENOMEM;
        for (unsigned l = 0; l < snap->n_layers; l++) {
                r = pread_exact(snap->layer_map_fds[l], map, words * sizeof(uint64_t), 0);
                if (r < 0)
                        return r;
                for (uint64_t b = 0; b < n_blocks; b++) {
                        uint64_t off = b * DISK_BLOCK, len = MIN((uint64_t) DISK_BLOCK, size - off);

                        if (!((le64toh(map[b / 64]) >> (b % 64)) & 1))
                                continue;
                        r = pread_exact(snap->layer_fds[l], buf, len, off);
                        if (r < 0)
                                return r;
                        r = snapshot_write_all(fd, buf, len, off);
                        if (r < 0)
                                return r;
                }
        }
        return fsync(fd) < 0 ? -errno : 0;
}

static int copy_vmstate(int dfd, const struct snapshot *snap) {
        _cleanup_close_ int in = -EBADF, out = -EBADF;
        char path[PATH_MAX];
        struct stat st;

        snprintf(path, sizeof(path), "%s/%s", snap->dir, snap->meta.vmstate_file);
        in = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (in < 0 || fstat(in, &st) < 0)
                return -errno;
        out = openat(dfd, SNAPSHOT_VMSTATE_FILE, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        if (out < 0)
                return -errno;
        for (loff_t i = 0, o = 0; i < st.st_size;) {
                ssize_t n = copy_file_range(in, &i, out, &o, (size_t) (st.st_size - i), 0);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0)
                        return -EIO;
        }
        return fsync(out) < 0 ? -errno : 0;
}

/* The ro and cow volume files, hard-linked (never written in place), else copied. */
static int copy_volumes(int dfd, const struct snapshot *snap) {
        for (uint32_t i = 0; i < snap->meta.n_volumes; i++) {
                const char *name = snap->meta.volumes[i].file;
                _cleanup_close_ int out = -EBADF;
                char path[64];
                struct stat st;

                if (!name[0])
                        continue; /* rw: the host file, by path */
                snprintf(path, sizeof(path), "/proc/self/fd/%d", snap->volumes[i].fd);
                if (linkat(AT_FDCWD, path, dfd, name, AT_SYMLINK_FOLLOW) >= 0)
                        continue;
                if (fstat(snap->volumes[i].fd, &st) < 0)
                        return -errno;
                out = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
                if (out < 0)
                        return -errno;
                for (loff_t k = 0, o = 0; k < st.st_size;) {
                        ssize_t n = copy_file_range(snap->volumes[i].fd, &k, out, &o, (size_t) (st.st_size - k), 0);
                        if (n < 0 && errno == EINTR)
                                continue;
                        if (n < 0)
                                return -errno;
                        if (n == 0)
                                return -EIO;
                }
                if (fsync(out) < 0)
                        return -errno;
        }
        return 0;
}

static int write_meta(int dfd, const struct snapshot *snap, const char *tag) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *json = NULL;
        struct snapshot_meta meta = snap->meta;
        int r;

        snprintf(meta.tag, sizeof(meta.tag), "%s", tag);
        meta.created_at_unix = (int64_t) time(NULL);
        meta.parent_tag[0] = 0;
        meta.parent_content_hash[0] = 0;
        meta.branched_from[0] = 0;
        meta.pause_us = 0;
        meta.disk_layers = 0;
        snprintf(meta.memory_file, sizeof(meta.memory_file), "%s", SNAPSHOT_MEMORY_FILE);
        snprintf(meta.vmstate_file, sizeof(meta.vmstate_file), "%s", SNAPSHOT_VMSTATE_FILE);
        snprintf(meta.disk_file, sizeof(meta.disk_file), "%s", SNAPSHOT_DISK_FILE);
        r = snapshot_meta_format(&meta, &json);
        if (r < 0)
                return r;
        fd = openat(dfd, SNAPSHOT_META_FILE, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        if (fd < 0)
                return -errno;
        r = snapshot_write_all(fd, json, strlen(json), 0);
        if (r < 0)
                return r;
        return fsync(fd) < 0 ? -errno : 0;
}

int compact_snapshot(const char *src, const char *dst, const char *tag, char **ret_error) {
        _cleanup_(snapshot_freep) struct snapshot *snap = NULL;
        _cleanup_free_ char *parent = NULL, *staging = NULL, *err = NULL;
        _cleanup_close_ int pfd = -EBADF, dfd = -EBADF;
        uint8_t *mem = NULL;
        const char *stage;
        char *slash;
        int r;

        if (!dst || dst[0] != '/' || strlen(dst) >= PATH_MAX - 64)
                return set_error(ret_error, -EINVAL, "the destination must be an absolute path");
        if (!snapshot_tag_is_valid(tag))
                return set_error(ret_error, -EINVAL, "the tag must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$");
        parent = strdup(dst);
        if (!parent)
                return -ENOMEM;
        slash = strrchr(parent, '/');
        if (slash == parent)
                parent[1] = 0;
        else
                *slash = 0;
        if (asprintf(&staging, "%s/.compact-staging-%s", parent, tag) < 0) {
                staging = NULL;
                return -ENOMEM;
        }
        if (access(dst, F_OK) == 0)
                return set_error(ret_error, -EEXIST, "%s exists already", dst);

        /* The chain is loaded as for a restore: every parent_content_hash checked. */
        r = snapshot_load(src, &snap, &err);
        if (r < 0)
                return set_error(ret_error, r, "%s", err ?: strerror(-r));
        r = snapshot_map_memory(snap, &mem);
        if (r < 0)
                return set_error(ret_error, r, "cannot map the memory of %s: %s", src, strerror(-r));

        pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (pfd < 0) {
                r = set_error(ret_error, -errno, "cannot open %s: %s", parent, strerror(errno));
                goto out;
        }
        remove_dir_files(staging); /* a leftover of a compact that died */
        if (mkdir(staging, 0750) < 0) {
                r = set_error(ret_error, -errno, "cannot create %s: %s", staging, strerror(errno));
                goto out;
        }
        dfd = open(staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) {
                r = -errno;
                stage = "open the staging directory";
                goto fail;
        }
        stage = "write memory.bin";
        r = write_memory(dfd, mem, snap->meta.mem_size);
        if (r < 0)
                goto fail;
        test_crash_point("memory");
        stage = "copy the vmstate";
        r = copy_vmstate(dfd, snap);
        if (r < 0)
                goto fail;
        stage = "write the merged disk";
        r = write_disk(dfd, snap);
        if (r < 0)
                goto fail;
        test_crash_point("disk");
        stage = "write snapshot.json";
        r = copy_volumes(dfd, snap);
        if (r < 0)
                goto fail;
        r = write_meta(dfd, snap, tag);
        if (r < 0)
                goto fail;
        stage = "sync";
        if (fsync(dfd) < 0) {
                r = -errno;
                goto fail;
        }
        test_crash_point("meta");
        stage = "rename the staging directory into place";
        if (renameat2(AT_FDCWD, staging, AT_FDCWD, dst, RENAME_NOREPLACE) < 0) {
                r = -errno;
                goto fail;
        }
        (void) fsync(pfd);
        r = 0;
        goto out;
fail:
        if (r == -EEXIST)
                set_error(ret_error, r, "%s exists already", dst);
        else
                set_error(ret_error, r, "cannot %s: %s", stage, strerror(-r));
        remove_dir_files(staging);
out:
        if (mem)
                munmap(mem, snap->meta.mem_size);
        return r;
}
