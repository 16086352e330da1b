/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "hash-cache.h"
#include "json-util.h"
#include "macro.h"
#include "pack-internal.h"

#define IO_CHUNK (256u * 1024u)
#define PAGE 4096u

static const uint8_t zeros[IO_CHUNK];

/* ---- SHA-256 over a logical file content (holes read as zeros) ---- */

typedef struct hasher {
        EVP_MD_CTX *ctx;
} hasher;

static int hasher_init(hasher *h) {
        h->ctx = EVP_MD_CTX_new();
        if (!h->ctx || EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1)
                return -ENOMEM;
        return 0;
}

static void hasher_update(hasher *h, const void *p, size_t n) {
        (void) EVP_DigestUpdate(h->ctx, p, n);
}

static void hasher_zeros(hasher *h, uint64_t n) {
        while (n > 0) {
                size_t k = n > sizeof(zeros) ? sizeof(zeros) : (size_t) n;
                hasher_update(h, zeros, k);
                n -= k;
        }
}

static void hasher_final(hasher *h, char hex[SNAPSHOT_HASH_LEN + 1]) {
        uint8_t d[32];
        unsigned n = 0;

        (void) EVP_DigestFinal_ex(h->ctx, d, &n);
        for (unsigned i = 0; i < 32; i++)
                snprintf(hex + 2 * i, 3, "%02x", d[i]);
        EVP_MD_CTX_free(h->ctx);
        h->ctx = NULL;
}

static void hasher_done(hasher *h) {
        if (h->ctx)
                EVP_MD_CTX_free(h->ctx);
        h->ctx = NULL;
}

/* The data extents of fd, from SEEK_DATA/SEEK_HOLE: calls fn for every data
 * range and hole range in order. */
typedef int (*extent_fn)(void *userdata, uint64_t offset, uint64_t length, bool hole);

static int walk_extents(int fd, uint64_t size, extent_fn fn, void *userdata) {
        uint64_t pos = 0;
        int r;

        while (pos < size) {
                off_t data = lseek(fd, (off_t) pos, SEEK_DATA), hole;

                if (data < 0 && errno == ENXIO)
                        data = (off_t) size; /* only a hole left */
                else if (data < 0)
                        return -errno;
                if ((uint64_t) data > size)
                        data = (off_t) size;
                if ((uint64_t) data > pos) {
                        r = fn(userdata, pos, (uint64_t) data - pos, true);
                        if (r < 0)
                                return r;
                        pos = (uint64_t) data;
                }
                if (pos >= size)
                        break;
                hole = lseek(fd, (off_t) pos, SEEK_HOLE);
                if (hole < 0)
                        return -errno;
                if ((uint64_t) hole > size)
                        hole = (off_t) size;
                r = fn(userdata, pos, (uint64_t) hole - pos, false);
                if (r < 0)
                        return r;
                pos = (uint64_t) hole;
        }
        return 0;
}

struct copy_ctx {
        int fd;
        hasher *h;                 /* hash the content */
        struct archive *a;         /* write the content */
        struct archive_entry *e;   /* add the sparse map */
        uint8_t *buf;
        char **ret_error;
};

static int extent_hash(void *userdata, uint64_t offset, uint64_t length, bool hole) {
        struct copy_ctx *c = userdata;

        if (hole) {
                hasher_zeros(c->h, length);
                return 0;
        }
        while (length > 0) {
                size_t k = length > IO_CHUNK ? IO_CHUNK : (size_t) length;
                ssize_t n = pread(c->fd, c->buf, k, (off_t) offset);

                if (n < 0)
                        return -errno;
                if (n == 0)
                        return -EIO; /* shrank under us */
                hasher_update(c->h, c->buf, (size_t) n);
                offset += (uint64_t) n;
                length -= (uint64_t) n;
        }
        return 0;
}

static int extent_sparse(void *userdata, uint64_t offset, uint64_t length, bool hole) {
        struct copy_ctx *c = userdata;

        if (!hole)
                archive_entry_sparse_add_entry(c->e, (la_int64_t) offset, (la_int64_t) length);
        return 0;
}

/* libarchive's pax writer takes the whole logical content and drops what
 * falls into the holes of the sparse map. */
static int extent_write(void *userdata, uint64_t offset, uint64_t length, bool hole) {
        struct copy_ctx *c = userdata;

        while (length > 0) {
                size_t k = length > IO_CHUNK ? IO_CHUNK : (size_t) length;
                const void *p = zeros;
                la_ssize_t w;

                if (!hole) {
                        ssize_t n = pread(c->fd, c->buf, k, (off_t) offset);
                        if (n < 0)
                                return -errno;
                        if (n == 0)
                                return -EIO;
                        k = (size_t) n;
                        p = c->buf;
                }
                w = archive_write_data(c->a, p, k);
                if (w < 0 || (size_t) w != k)
                        return pack_set_error(c->ret_error, -EIO, "Cannot write the bundle: %s",
                                       archive_error_string(c->a) ?: "short write");
                offset += k;
                length -= k;
        }
        return 0;
}

/* ---- the bundle's fd: a file, or a pipe to a peer that may stall ---- */

struct pack_io {
        int fd;
        bool stream;  /* a pipe or socket: wait with a timeout, never block in write() */
        bool socket;
        uint8_t buf[IO_CHUNK];
};

static struct pack_io *pack_io_new(int fd) {
        struct pack_io *io = malloc(sizeof(*io));
        struct stat st;

        if (!io)
                return NULL;
        io->fd = fd;
        io->stream = io->socket = false;
        if (fstat(fd, &st) >= 0) {
                io->socket = S_ISSOCK(st.st_mode);
                io->stream = io->socket || S_ISFIFO(st.st_mode);
        }
        return io;
}

/* Wait until fd is ready, at most PACK_STALL_TIMEOUT_MS: a peer that stops
 * reading or writing does not hold a worker thread for ever. */
static int wait_fd(struct archive *a, int fd, short events) {
        struct pollfd p = { .fd = fd, .events = events };
        int n;

        do
                n = poll(&p, 1, PACK_STALL_TIMEOUT_MS);
        while (n < 0 && errno == EINTR);
        if (n <= 0) {
                archive_set_error(a, n == 0 ? ETIMEDOUT : errno,
                                  "no progress on the bundle's file descriptor for %d s", PACK_STALL_TIMEOUT_MS / 1000);
                return -1;
        }
        return 0;
}

static la_ssize_t io_write(struct archive *a, void *userdata, const void *buf, size_t n) {
        struct pack_io *io = userdata;
        ssize_t k;

        for (;;) {
                if (io->stream) {
                        /* At most PIPE_BUF after POLLOUT: write() cannot block on a pipe. */
                        if (wait_fd(a, io->fd, POLLOUT) < 0)
                                return -1;
                        if (n > PIPE_BUF)
                                n = PIPE_BUF;
                }
                if (io->socket)
                        k = send(io->fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
                else
                        k = write(io->fd, buf, n);
                if (k >= 0)
                        return k;
                if (errno == EINTR || (errno == EAGAIN && io->stream))
                        continue;
                if (errno == EAGAIN && wait_fd(a, io->fd, POLLOUT) >= 0)
                        continue;
                break;
        }
        archive_set_error(a, errno, "cannot write the bundle: %s", strerror(errno));
        return -1;
}

static la_ssize_t io_read(struct archive *a, void *userdata, const void **ret) {
        struct pack_io *io = userdata;
        ssize_t k;

        *ret = io->buf;
        for (;;) {
                if (io->stream && wait_fd(a, io->fd, POLLIN) < 0)
                        return -1;
                k = io->socket ? recv(io->fd, io->buf, sizeof(io->buf), MSG_DONTWAIT)
                               : read(io->fd, io->buf, sizeof(io->buf));
                if (k >= 0)
                        return k;
                if (errno == EINTR || (errno == EAGAIN && io->stream))
                        continue;
                if (errno == EAGAIN && wait_fd(a, io->fd, POLLIN) >= 0)
                        continue;
                break;
        }
        archive_set_error(a, errno, "cannot read the bundle: %s", strerror(errno));
        return -1;
}

/* ---- packing ---- */

static int hash_file(int fd, uint64_t size, uint8_t *buf, char hex[SNAPSHOT_HASH_LEN + 1]) {
        hasher h = {};
        struct copy_ctx c = { .fd = fd, .h = &h, .buf = buf };
        int r;

        r = hasher_init(&h);
        if (r >= 0)
                r = walk_extents(fd, size, extent_hash, &c);
        if (r >= 0)
                hasher_final(&h, hex);
        hasher_done(&h);
        return r;
}

static int link_files(const char *dir, struct pack_link *l, uint8_t *buf, char **ret_error) {
        _cleanup_free_ char *meta_path = NULL;
        _cleanup_close_ int dfd = -EBADF;
        struct snapshot_meta meta;
        const char *reason = NULL;
        struct dirent **names = NULL;
        bool has_meta = false;
        int n, r = 0;

        if (asprintf(&meta_path, "%s/snapshot.json", dir) < 0)
                return -ENOMEM;
        r = snapshot_meta_read_file(meta_path, &meta, &reason);
        if (r < 0)
                return pack_set_error(ret_error, r, "Cannot read %s: %s", meta_path, reason ?: strerror(-r));
        snprintf(l->tag, sizeof(l->tag), "%s", meta.tag);
        snprintf(l->parent_tag, sizeof(l->parent_tag), "%s", meta.parent_tag);
        snprintf(l->parent_content_hash, sizeof(l->parent_content_hash), "%s", meta.parent_content_hash);

        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd < 0)
                return pack_set_error(ret_error, -errno, "Cannot open %s: %m", dir);
        n = scandir(dir, &names, NULL, alphasort);
        if (n < 0)
                return pack_set_error(ret_error, -errno, "Cannot list %s: %m", dir);
        l->files = calloc((size_t) n + 1, sizeof(struct pack_file));
        if (!l->files)
                r = -ENOMEM;
        for (int i = 0; r >= 0 && i < n; i++) {
                const char *name = names[i]->d_name;
                _cleanup_close_ int fd = -EBADF;
                struct pack_file *f;
                struct stat st;

                if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
                        continue;
                /* forkd-vmm's hash caches are this machine's (inode numbers): not part of a bundle. */
                if (strlen(name) > strlen(SNAPSHOT_HASH_CACHE_SUFFIX) &&
                    strcmp(name + strlen(name) - strlen(SNAPSHOT_HASH_CACHE_SUFFIX), SNAPSHOT_HASH_CACHE_SUFFIX) == 0)
                        continue;
                if (!snapshot_file_name_is_valid(name) || strcmp(name, PACK_MANIFEST_NAME) == 0 ||
                    l->n_files >= PACK_FILES_MAX) {
                        r = pack_set_error(ret_error, -EINVAL, "%s/%s cannot be packed (odd name, or too many files).",
                                    dir, name);
                        break;
                }
                fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
                if (fd < 0 || fstat(fd, &st) < 0) {
                        r = pack_set_error(ret_error, -errno, "Cannot open %s/%s: %m", dir, name);
                        break;
                }
                if (!S_ISREG(st.st_mode) || (uint64_t) st.st_size > PACK_FILE_SIZE_MAX) {
                        r = pack_set_error(ret_error, -EINVAL, "%s/%s is not a regular file, or too large to pack.", dir,
                                    name);
                        break;
                }
                f = &l->files[l->n_files++];
                memcpy(f->name, name, strlen(name) + 1); /* valid: at most SNAPSHOT_FILE_NAME_MAX */
                f->size = (uint64_t) st.st_size;
                if (hash_cache_get(dfd, name, fd, f->sha256) <= 0) {
                        r = hash_file(fd, f->size, buf, f->sha256);
                        if (r < 0) {
                                r = pack_set_error(ret_error, r, "Cannot read %s/%s: %s", dir, name, strerror(-r));
                                break;
                        }
                        hash_cache_put(dfd, name, fd, f->sha256);
                }
                if (strcmp(name, "snapshot.json") == 0)
                        has_meta = true;
        }
        for (int i = 0; i < n; i++)
                free(names[i]);
        free(names);
        if (r >= 0 && !has_meta)
                r = pack_set_error(ret_error, -EINVAL, "%s has no snapshot.json.", dir);
        return r;
}

static int write_member(struct archive *a, const char *path, int fd, uint64_t size, uint8_t *buf, char **ret_error) {
        struct archive_entry *e = archive_entry_new();
        struct copy_ctx c = { .fd = fd, .a = a, .e = e, .buf = buf, .ret_error = ret_error };
        int r;

        if (!e)
                return -ENOMEM;
        archive_entry_set_pathname(e, path);
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_perm(e, 0640);
        archive_entry_set_size(e, (la_int64_t) size);
        archive_entry_set_mtime(e, time(NULL), 0);
        r = walk_extents(fd, size, extent_sparse, &c);
        if (r < 0) {
                archive_entry_free(e);
                return pack_set_error(ret_error, r, "Cannot read %s: %s", path, strerror(-r));
        }
        if (archive_write_header(a, e) != ARCHIVE_OK) {
                r = pack_set_error(ret_error, -EIO, "Cannot write the bundle: %s", archive_error_string(a) ?: "?");
                archive_entry_free(e);
                return r;
        }
        archive_entry_free(e);
        c.e = NULL;
        r = walk_extents(fd, size, extent_write, &c);
        if (r < 0 && !(ret_error && *ret_error))
                pack_set_error(ret_error, r, "Cannot pack %s: %s", path, strerror(-r));
        return r;
}

static int write_buffer_member(struct archive *a, const char *path, const char *data, size_t len,
                               char **ret_error) {
        struct archive_entry *e = archive_entry_new();
        la_ssize_t w;

        if (!e)
                return -ENOMEM;
        archive_entry_set_pathname(e, path);
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_perm(e, 0640);
        archive_entry_set_size(e, (la_int64_t) len);
        archive_entry_set_mtime(e, time(NULL), 0);
        if (archive_write_header(a, e) != ARCHIVE_OK) {
                archive_entry_free(e);
                return pack_set_error(ret_error, -EIO, "Cannot write the bundle: %s", archive_error_string(a) ?: "?");
        }
        archive_entry_free(e);
        w = archive_write_data(a, data, len);
        if (w < 0 || (size_t) w != len)
                return pack_set_error(ret_error, -EIO, "Cannot write the bundle: %s", archive_error_string(a) ?: "?");
        return 0;
}

int pack_write(int fd, const char *const *dirs, size_t n, uint64_t *ret_bytes, char **ret_error) {
        _cleanup_(pack_manifest_donep) struct pack_manifest m = {};
        _cleanup_free_ struct pack_io *io = NULL;
        _cleanup_free_ char *json = NULL;
        _cleanup_free_ uint8_t *buf = NULL;
        struct archive *a = NULL;
        int r;

        if (n == 0 || n > PACK_LINKS_MAX)
                return pack_set_error(ret_error, -EINVAL, "A bundle holds 1 to %u links.", PACK_LINKS_MAX);
        buf = malloc(IO_CHUNK);
        m.links = calloc(n, sizeof(struct pack_link));
        if (!buf || !m.links)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                m.n_links++;
                r = link_files(dirs[i], &m.links[i], buf, ret_error);
                if (r < 0)
                        return r;
        }
        r = pack_manifest_format(&m, &json);
        if (r < 0)
                return r;

        io = pack_io_new(fd);
        a = archive_write_new();
        if (!a || !io) {
                archive_write_free(a);
                return -ENOMEM;
        }
        if (archive_write_add_filter_zstd(a) != ARCHIVE_OK || archive_write_set_format_pax_restricted(a) != ARCHIVE_OK ||
            archive_write_set_bytes_in_last_block(a, 1) != ARCHIVE_OK ||
            archive_write_open2(a, io, NULL, io_write, NULL, NULL) != ARCHIVE_OK) {
                r = pack_set_error(ret_error, -EIO, "Cannot start the bundle: %s", archive_error_string(a) ?: "?");
                goto finish;
        }
        r = write_buffer_member(a, PACK_MANIFEST_NAME, json, strlen(json), ret_error);
        for (size_t i = 0; r >= 0 && i < m.n_links; i++) {
                _cleanup_close_ int dfd = open(dirs[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

                if (dfd < 0) {
                        r = pack_set_error(ret_error, -errno, "Cannot open %s: %m", dirs[i]);
                        break;
                }
                for (size_t j = 0; r >= 0 && j < m.links[i].n_files; j++) {
                        const struct pack_file *f = &m.links[i].files[j];
                        _cleanup_free_ char *path = NULL;
                        _cleanup_close_ int ffd = openat(dfd, f->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
                        struct stat st;

                        if (ffd < 0 || fstat(ffd, &st) < 0) {
                                r = pack_set_error(ret_error, -errno, "Cannot open %s/%s: %m", dirs[i], f->name);
                                break;
                        }
                        if ((uint64_t) st.st_size != f->size) {
                                r = pack_set_error(ret_error, -EBUSY, "%s/%s changed while it was packed.", dirs[i], f->name);
                                break;
                        }
                        if (asprintf(&path, "%s/%s", m.links[i].tag, f->name) < 0) {
                                r = -ENOMEM;
                                break;
                        }
                        r = write_member(a, path, ffd, f->size, buf, ret_error);
                }
        }
        if (r >= 0 && archive_write_close(a) != ARCHIVE_OK)
                r = pack_set_error(ret_error, -EIO, "Cannot finish the bundle: %s", archive_error_string(a) ?: "?");
        if (r >= 0 && ret_bytes)
                *ret_bytes = (uint64_t) archive_filter_bytes(a, -1);
finish:
        archive_write_free(a);
        return r;
}

/* ---- unpacking ---- */

static bool all_zero(const uint8_t *p, size_t n) {
        return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/* Write p[0..n) at offset, leaving the all-zero pages out (holes, as the file
 * was sparse when it was packed). */
static int write_sparse(int fd, const uint8_t *p, size_t n, uint64_t offset) {
        size_t i = 0;

        while (i < n) {
                size_t k = PAGE - (size_t) ((offset + i) % PAGE), start;

                if (k > n - i)
                        k = n - i;
                if (all_zero(p + i, k)) {
                        i += k;
                        continue;
                }
                start = i;
                i += k;
                while (i < n) {
                        k = n - i < PAGE ? n - i : PAGE;
                        if (all_zero(p + i, k))
                                break;
                        i += k;
                }
                for (size_t w = start; w < i;) {
                        ssize_t m = pwrite(fd, p + w, i - w, (off_t) (offset + w));
                        if (m < 0)
                                return -errno;
                        w += (size_t) m;
                }
        }
        return 0;
}

static int extract_member(struct archive *a, int dfd, const char *path, const char *name, const struct pack_file *f,
                          char **ret_error) {
        _cleanup_close_ int fd = -EBADF;
        char hex[SNAPSHOT_HASH_LEN + 1];
        uint64_t pos = 0;
        hasher h = {};
        int r;

        fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
        if (fd < 0)
                return pack_set_error(ret_error, -errno, "Cannot create %s: %m", path);
        r = hasher_init(&h);
        if (r < 0)
                return r;
        for (;;) {
                const void *p;
                size_t size;
                la_int64_t off;

                r = archive_read_data_block(a, &p, &size, &off);
                if (r == ARCHIVE_EOF)
                        break;
                if (r < ARCHIVE_WARN) {
                        r = pack_set_error(ret_error, -EBADMSG, "The bundle is truncated or corrupt in %s: %s", path,
                                    archive_error_string(a) ?: "?");
                        goto finish;
                }
                if (off < 0 || (uint64_t) off < pos || (uint64_t) off > f->size || size > f->size - (uint64_t) off) {
                        r = pack_set_error(ret_error, -EBADMSG, "%s holds more than the %" PRIu64 " bytes of the manifest.",
                                    path, f->size);
                        goto finish;
                }
                hasher_zeros(&h, (uint64_t) off - pos);
                hasher_update(&h, p, size);
                r = write_sparse(fd, p, size, (uint64_t) off);
                if (r < 0) {
                        r = pack_set_error(ret_error, r, "Cannot write %s: %s", path, strerror(-r));
                        goto finish;
                }
                pos = (uint64_t) off + size;
        }
        hasher_zeros(&h, f->size - pos);
        hasher_final(&h, hex);
        if (strcmp(hex, f->sha256) != 0) {
                r = pack_set_error(ret_error, -EBADMSG, "%s does not match its SHA-256 in the manifest (%.12s... instead of %.12s...).",
                            path, hex, f->sha256);
                goto finish;
        }
        if (ftruncate(fd, (off_t) f->size) < 0 || fsync(fd) < 0)
                r = pack_set_error(ret_error, -errno, "Cannot write %s: %m", path);
        else {
                /* checked just now: the first fork of a diff chain need not hash it again */
                hash_cache_put(dfd, name, fd, hex);
                r = 0;
        }
finish:
        hasher_done(&h);
        return r;
}

static int refuse_entry(struct archive_entry *e, const char *path, char **ret_error) {
        mode_t t = archive_entry_filetype(e);

        if (path[0] == '/')
                return pack_set_error(ret_error, -EBADMSG, "The bundle holds an absolute path (%.128s).", path);
        for (const char *p = path; p; p = strchr(p, '/')) {
                if (*p == '/')
                        p++;
                if (strncmp(p, "..", 2) == 0 && (p[2] == '/' || p[2] == 0))
                        return pack_set_error(ret_error, -EBADMSG, "The bundle holds a path with \"..\" (%.128s).", path);
        }
        if (archive_entry_hardlink(e))
                return pack_set_error(ret_error, -EBADMSG, "The bundle holds a hard link (%.128s).", path);
        if (t == AE_IFLNK || archive_entry_symlink(e))
                return pack_set_error(ret_error, -EBADMSG, "The bundle holds a symbolic link (%.128s).", path);
        if (t == AE_IFCHR || t == AE_IFBLK)
                return pack_set_error(ret_error, -EBADMSG, "The bundle holds a device node (%.128s).", path);
        if (t != AE_IFREG)
                return pack_set_error(ret_error, -EBADMSG, "The bundle holds %.128s, which is not a regular file.", path);
        return 0;
}

static int read_manifest(struct archive *a, struct pack_manifest *ret, char **ret_error) {
        _cleanup_free_ char *json = NULL;
        struct archive_entry *e;
        const char *path;
        la_int64_t size;
        size_t got = 0;
        int r;

        r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF)
                return pack_set_error(ret_error, -EBADMSG, "The bundle is empty: no manifest.json.");
        if (r < ARCHIVE_WARN)
                return pack_set_error(ret_error, -EBADMSG, "Not a forkd bundle (tar compressed with zstd): %s",
                               archive_error_string(a) ?: "?");
        if (archive_filter_count(a) < 2 || archive_filter_code(a, 0) != ARCHIVE_FILTER_ZSTD)
                return pack_set_error(ret_error, -EBADMSG, "Not a forkd bundle: a tar, but not compressed with zstd.");
        path = archive_entry_pathname(e) ?: "";
        if (strcmp(path, PACK_MANIFEST_NAME) != 0)
                return pack_set_error(ret_error, -EBADMSG, "The bundle's first member is %.128s, not manifest.json.", path);
        r = refuse_entry(e, path, ret_error);
        if (r < 0)
                return r;
        size = archive_entry_size(e);
        if (size < 0 || (uint64_t) size > PACK_MANIFEST_MAX)
                return pack_set_error(ret_error, -EBADMSG, "manifest.json is larger than %u bytes.", PACK_MANIFEST_MAX);
        json = malloc((size_t) size + 1);
        if (!json)
                return -ENOMEM;
        while (got < (size_t) size) {
                la_ssize_t n = archive_read_data(a, json + got, (size_t) size - got);
                if (n < 0)
                        return pack_set_error(ret_error, -EBADMSG, "Cannot read manifest.json: %s",
                                       archive_error_string(a) ?: "?");
                if (n == 0)
                        return pack_set_error(ret_error, -EBADMSG, "manifest.json is truncated.");
                got += (size_t) n;
        }
        json[got] = 0;
        return pack_manifest_parse(json, got, ret, ret_error);
}

static int check_link_meta(int staging_dfd, const char *dir, const struct pack_manifest *m, size_t index,
                           const char *new_tag, char **ret_error) {
        const struct pack_link *l = &m->links[index];
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *json = NULL, *out = NULL;
        struct snapshot_meta meta;
        const char *reason = NULL;
        const struct pack_file *f = pack_link_find_file(l, "snapshot.json");
        ssize_t n;
        int r;

        if (f->size > SNAPSHOT_META_FILE_MAX)
                return pack_set_error(ret_error, -EBADMSG, "%s/snapshot.json is too large.", l->tag);
        json = malloc(f->size + 1);
        if (!json)
                return -ENOMEM;
        fd = openat(staging_dfd, dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        {
                _cleanup_close_ int mfd = openat(fd, "snapshot.json", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
                if (mfd < 0)
                        return -errno;
                n = pread(mfd, json, f->size, 0);
                if (n < 0)
                        return -errno;
                if ((uint64_t) n != f->size)
                        return -EIO;
        }
        r = snapshot_meta_parse(json, (size_t) n, &meta, &reason);
        if (r < 0)
                return pack_set_error(ret_error, -EBADMSG, "%s/snapshot.json is invalid: %s", l->tag, reason ?: "?");
        if (strcmp(meta.tag, l->tag) != 0 || strcmp(meta.parent_tag, l->parent_tag) != 0 ||
            strcmp(meta.parent_content_hash, l->parent_content_hash) != 0)
                return pack_set_error(ret_error, -EBADMSG, "%s/snapshot.json does not name the tag and parent of the manifest.",
                               l->tag);
        if (!pack_link_find_file(l, meta.memory_file) || !pack_link_find_file(l, meta.vmstate_file) ||
            !pack_link_find_file(l, meta.disk_file))
                return pack_set_error(ret_error, -EBADMSG, "Link %s lacks its memory, vmstate or disk file.", l->tag);
        for (uint32_t k = 0; k < meta.n_volumes; k++)
                if (meta.volumes[k].file[0] && !pack_link_find_file(l, meta.volumes[k].file))
                        return pack_set_error(ret_error, -EBADMSG, "Link %s lacks its volume file %s.", l->tag,
                                              meta.volumes[k].file);
        if (index > 0) {
                const struct pack_link *p = &m->links[index - 1];
                const struct pack_file *pm;
                struct snapshot_meta pmeta;
                _cleanup_free_ char *pjson = NULL;
                _cleanup_close_ int pfd = -EBADF;
                char pdir[SNAPSHOT_TAG_MAX + 16];

                /* The parent's memory file: its digest is the link's parent_content_hash. */
                snprintf(pdir, sizeof(pdir), "%s/snapshot.json", p->tag);
                pfd = openat(staging_dfd, pdir, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
                if (pfd < 0)
                        return -errno;
                pjson = calloc(1, SNAPSHOT_META_FILE_MAX + 1);
                if (!pjson)
                        return -ENOMEM;
                n = pread(pfd, pjson, SNAPSHOT_META_FILE_MAX, 0);
                if (n < 0)
                        return -errno;
                r = snapshot_meta_parse(pjson, (size_t) n, &pmeta, &reason);
                if (r < 0)
                        return pack_set_error(ret_error, -EBADMSG, "%s/snapshot.json is invalid: %s", p->tag, reason ?: "?");
                pm = pack_link_find_file(p, pmeta.memory_file);
                if (!pm || strcmp(pm->sha256, l->parent_content_hash) != 0)
                        return pack_set_error(ret_error, -EBADMSG,
                                       "Link %s references %s content %.12s..., but the bundle's %s has content %.12s...",
                                       l->tag, p->tag, l->parent_content_hash, p->tag, pm ? pm->sha256 : "(none)");
        }
        if (!new_tag)
                return 0;
        snprintf(meta.tag, sizeof(meta.tag), "%s", new_tag);
        r = snapshot_meta_format(&meta, &out);
        if (r < 0)
                return r;
        {
                _cleanup_close_ int wfd = openat(fd, "snapshot.json.new", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
                size_t len = strlen(out);

                if (wfd < 0)
                        return -errno;
                if (write(wfd, out, len) != (ssize_t) len || fsync(wfd) < 0)
                        return -EIO;
        }
        if (renameat(fd, "snapshot.json.new", fd, "snapshot.json") < 0)
                return -errno;
        return 0;
}

int pack_read(int fd, int staging_dfd, const char *new_tag, struct pack_manifest *ret, char **ret_error) {
        return pack_read_full(fd, staging_dfd, new_tag, NULL, NULL, ret, ret_error);
}

int pack_read_full(int fd, int staging_dfd, const char *new_tag, pack_tag_check_t check, void *userdata,
                   struct pack_manifest *ret, char **ret_error) {
        _cleanup_(pack_manifest_donep) struct pack_manifest m = {};
        _cleanup_free_ struct pack_io *io = NULL;
        struct archive *a;
        struct archive_entry *e;
        int r;

        io = pack_io_new(fd);
        a = archive_read_new();
        if (!a || !io) {
                archive_read_free(a);
                return -ENOMEM;
        }
        if (archive_read_support_filter_zstd(a) != ARCHIVE_OK || archive_read_support_format_tar(a) != ARCHIVE_OK ||
            archive_read_open(a, io, NULL, io_read, NULL) != ARCHIVE_OK) {
                r = pack_set_error(ret_error, -EBADMSG, "Not a forkd bundle (tar compressed with zstd): %s",
                            archive_error_string(a) ?: "?");
                goto finish;
        }
        r = read_manifest(a, &m, ret_error);
        if (r < 0)
                goto finish;
        if (new_tag && m.n_links != 1) {
                r = pack_set_error(ret_error, -EBADMSG,
                            "A new tag is only for a bundle of one snapshot; this one holds a chain of %zu.",
                            m.n_links);
                goto finish;
        }
        if (new_tag && !snapshot_tag_is_valid(new_tag)) {
                r = pack_set_error(ret_error, -EBADMSG, "Invalid snapshot tag \"%.64s\".", new_tag);
                goto finish;
        }
        for (size_t i = 0; check && i < m.n_links; i++) {
                const char *tag = new_tag ?: m.links[i].tag;

                r = check(tag, userdata);
                if (r < 0) {
                        pack_set_error(ret_error, r, "Snapshot %s exists already; delete it first%s.", tag,
                                new_tag || m.n_links > 1 ? "" : ", or unpack it under a new tag");
                        goto finish;
                }
        }
        for (size_t i = 0; i < m.n_links; i++)
                if (mkdirat(staging_dfd, m.links[i].tag, 0750) < 0) {
                        r = pack_set_error(ret_error, -errno, "Cannot create the staging directory: %m");
                        goto finish;
                }

        for (;;) {
                _cleanup_close_ int dfd = -EBADF;
                _cleanup_free_ char *path = NULL;
                struct pack_link *l = NULL;
                struct pack_file *f = NULL;
                la_int64_t size;
                char *slash;

                r = archive_read_next_header(a, &e);
                if (r == ARCHIVE_EOF)
                        break;
                if (r < ARCHIVE_WARN) {
                        r = pack_set_error(ret_error, -EBADMSG, "The bundle is truncated or corrupt: %s",
                                    archive_error_string(a) ?: "?");
                        goto finish;
                }
                path = strdup(archive_entry_pathname(e) ?: "");
                if (!path) {
                        r = -ENOMEM;
                        goto finish;
                }
                r = refuse_entry(e, path, ret_error);
                if (r < 0)
                        goto finish;
                slash = strchr(path, '/');
                if (slash) {
                        *slash = 0;
                        for (size_t i = 0; i < m.n_links && !l; i++)
                                if (strcmp(m.links[i].tag, path) == 0)
                                        l = &m.links[i];
                        for (size_t i = 0; l && i < l->n_files && !f; i++)
                                if (strcmp(l->files[i].name, slash + 1) == 0)
                                        f = &l->files[i];
                        *slash = '/';
                }
                if (!f) {
                        r = pack_set_error(ret_error, -EBADMSG, "The bundle holds %.128s, which its manifest does not list.",
                                    path);
                        goto finish;
                }
                if (f->seen) {
                        r = pack_set_error(ret_error, -EBADMSG, "The bundle holds %.128s twice.", path);
                        goto finish;
                }
                f->seen = true;
                size = archive_entry_size(e);
                if (!archive_entry_size_is_set(e) || size < 0 || (uint64_t) size != f->size) {
                        r = pack_set_error(ret_error, -EBADMSG,
                                    "%.128s has %" PRIi64 " bytes, the manifest says %" PRIu64
                                    " (oversized or truncated).",
                                    path, (int64_t) size, f->size);
                        goto finish;
                }
                dfd = openat(staging_dfd, l->tag, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (dfd < 0) {
                        r = pack_set_error(ret_error, -errno, "Cannot open the staging directory: %m");
                        goto finish;
                }
                r = extract_member(a, dfd, path, f->name, f, ret_error);
                if (r < 0)
                        goto finish;
        }
        for (size_t i = 0; i < m.n_links; i++)
                for (size_t j = 0; j < m.links[i].n_files; j++)
                        if (!m.links[i].files[j].seen) {
                                r = pack_set_error(ret_error, -EBADMSG, "The bundle lacks %s/%s, which its manifest lists.",
                                            m.links[i].tag, m.links[i].files[j].name);
                                goto finish;
                        }
        for (size_t i = 0; i < m.n_links; i++) {
                r = check_link_meta(staging_dfd, m.links[i].tag, &m, i, new_tag, ret_error);
                if (r < 0) {
                        if (!(ret_error && *ret_error))
                                pack_set_error(ret_error, r, "Cannot check link %s: %s", m.links[i].tag, strerror(-r));
                        goto finish;
                }
        }
        if (new_tag) {
                if (renameat(staging_dfd, m.links[0].tag, staging_dfd, new_tag) < 0) {
                        r = pack_set_error(ret_error, -errno, "Cannot rename the staging directory: %m");
                        goto finish;
                }
                snprintf(m.links[0].tag, sizeof(m.links[0].tag), "%s", new_tag);
        }
        *ret = m;
        m = (struct pack_manifest) {};
        r = 0;
finish:
        archive_read_free(a);
        return r;
}
