/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * read_file and write_file: one file's contents in and out of the guest
 * (E2B's files.read/files.write; limits in src/shared/file-ops.h).
 *
 *   {"op": "write_file", "path": "/root/a.txt", "data_b64": "aGk=", "mode": 420}
 *   -> {"path": "/root/a.txt", "size": 2}
 *   {"op": "read_file", "path": "/root/a.txt"}
 *   -> {"path": "/root/a.txt", "data_b64": "aGk=", "size": 2}
 *
 * A write creates or replaces the file atomically: the data goes to a new
 * file beside it (same directory, so the same file system), which is synced,
 * given its mode and renamed over the path. A reader sees the old contents or
 * the new, never a part; a failure leaves the old file as it was and no
 * temporary behind. The parent directory must exist. The final component is
 * never followed when it is a symbolic link (ELOOP), and only a regular file
 * is replaced (a directory: EISDIR; anything else: EINVAL). Directories
 * above it are resolved as usual.
 *
 * A read opens with O_NOFOLLOW and reads a regular file only, up to
 * FILE_OP_MAX bytes: a bigger file (or one that grows past it while being
 * read) is an error, never a partial answer. The size stat() reports is not
 * trusted (files in /proc say 0), the reading is.
 *
 * Refusals from the file system are error frames that carry the symbolic
 * errno ("errno": "ENOENT"), which forkd maps to its D-Bus errors. Synchronous,
 * like hash_files: 512 KiB of I/O does not hold the loop for long.
 */

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "agent.h"
#include "base64.h"
#include "file-hashes.h"
#include "file-ops.h"
#include "json-util.h"
#include "macro.h"

#define TEMP_TRIES 16
#define SYMLINK_WHY "Too many levels of symbolic links (the final component is one, and is not followed)"

/* An error frame for errno err about path: {"error": "PATH: WHY", "errno": "ENAME"}. */
static int send_errno(Agent *a, uint32_t id, int err, const char *path, const char *why) {
        return agent_send_error_errno(a, id, err, "%s: %s", path, why ?: strerror(err));
}

static int dispatch_ignore(struct json_object *v, void *field, const char **ret_error) {
        return 0;
}

/* Borrow the string object (the request outlives its use). */
static int dispatch_borrow(struct json_object *v, void *field, const char **ret_error) {
        *(struct json_object **) field = v;
        return 0;
}

typedef struct FileArgs {
        char path[HASH_PATH_MAX + 2]; /* one more than allowed, so that too long is seen as such */
        struct json_object *data_b64;
        uint32_t mode;
} FileArgs;

static const struct json_dispatch write_table[] = {
        { "op", JSON_KIND_STRING, dispatch_ignore, 0, 0, JSON_MANDATORY },
        { "path", JSON_KIND_STRING, NULL, offsetof(FileArgs, path), JSON_FIELD_SIZE(FileArgs, path), JSON_MANDATORY },
        { "data_b64", JSON_KIND_STRING, dispatch_borrow, offsetof(FileArgs, data_b64), 0, JSON_MANDATORY },
        { "mode", JSON_KIND_UINT32, NULL, offsetof(FileArgs, mode), 0, 0 },
        {}
};

static const struct json_dispatch read_table[] = {
        { "op", JSON_KIND_STRING, dispatch_ignore, 0, 0, JSON_MANDATORY },
        { "path", JSON_KIND_STRING, NULL, offsetof(FileArgs, path), JSON_FIELD_SIZE(FileArgs, path), JSON_MANDATORY },
        {}
};

/* 1 with args filled; 0 when a bad-argument error was queued; negative errno. */
static int parse_args(Agent *a, uint32_t id, struct json_object *req, const struct json_dispatch *table,
                      FileArgs *args) {
        const char *field = NULL, *err = NULL;
        int r;

        r = json_dispatch_full(req, table, JSON_REJECT_UNKNOWN, args, &field, &err);
        if (r == -ENOMEM)
                return r;
        if (r == -ENAMETOOLONG && field && streq(field, "path"))
                return agent_send_error(a, id, "bad argument 'path': longer than %u bytes", HASH_PATH_MAX), 0;
        if (r < 0)
                return agent_send_error(a, id, "bad argument '%s': %s", field ?: "?", err ?: strerror(-r)), 0;
        if (!hash_path_is_valid(args->path))
                return agent_send_error(a, id,
                                        "bad argument 'path': not an absolute, normalized path (no '.', '..', '//', "
                                        "trailing '/' or control characters)"), 0;
        if (args->mode > FILE_OP_MODE_MAX)
                return agent_send_error(a, id, "bad argument 'mode': must be 0 .. 07777"), 0;
        return 1;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
        while (n > 0) {
                ssize_t k = write(fd, p, n);

                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (k == 0)
                        return -EIO;
                p += k;
                n -= (size_t) k;
        }
        return 0;
}

/* Create a temporary file in dfd: its fd, and its name in name. */
static int open_temp(int dfd, char name[static 32]) {
        for (unsigned i = 0; i < TEMP_TRIES; i++) {
                uint64_t rnd;
                int fd;

                if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != sizeof rnd)
                        rnd = now_usec() * 6364136223846793005ull + i;
                snprintf(name, 32, ".forkd-write.%016" PRIx64, rnd);
                fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, 0600);
                if (fd >= 0)
                        return fd;
                if (errno != EEXIST)
                        return -errno;
        }
        return -EEXIST;
}

/* Write data to path atomically. On failure *ret_why may name a static reason. */
static int write_atomic(const char *path, const uint8_t *data, size_t size, mode_t mode, const char **ret_why) {
        _cleanup_free_ char *dir = NULL;
        _cleanup_close_ int dfd = -EBADF, fd = -EBADF;
        const char *base = strrchr(path, '/') + 1; /* the path is absolute */
        char temp[32];
        struct stat st;
        int r;

        if (!*base)
                return -EISDIR; /* "/" */
        dir = base - path > 1 ? strndup(path, (size_t) (base - path - 1)) : strdup("/");
        if (!dir)
                return -ENOMEM;
        dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;

        if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) >= 0) {
                if (S_ISLNK(st.st_mode)) {
                        *ret_why = SYMLINK_WHY;
                        return -ELOOP;
                }
                if (S_ISDIR(st.st_mode))
                        return -EISDIR;
                if (!S_ISREG(st.st_mode)) {
                        *ret_why = "Not a regular file";
                        return -EINVAL;
                }
        } else if (errno != ENOENT)
                return -errno;

        fd = open_temp(dfd, temp);
        if (fd < 0)
                return fd;
        r = write_all(fd, data, size);
        if (r >= 0 && fchmod(fd, mode) < 0)
                r = -errno;
        if (r >= 0 && fsync(fd) < 0)
                r = -errno;
        if (r >= 0 && close(TAKE_FD(fd)) < 0)
                r = -errno;
        /* rename() replaces a symbolic link or a file that appeared meanwhile
         * rather than following it; a directory that appeared makes it fail. */
        if (r >= 0 && renameat(dfd, temp, dfd, base) < 0)
                r = -errno;
        if (r < 0)
                (void) unlinkat(dfd, temp, 0);
        return r;
}

int agent_op_write_file(Agent *a, uint32_t id, struct json_object *req) {
        FileArgs args = { .mode = FILE_OP_MODE_DEFAULT };
        _cleanup_free_ uint8_t *data = NULL;
        struct json_object *o;
        const char *b64, *why = NULL;
        size_t n, size;
        int r;

        r = parse_args(a, id, req, write_table, &args);
        if (r <= 0)
                return r;
        b64 = json_object_get_string(args.data_b64);
        n = (size_t) json_object_get_string_len(args.data_b64);
        r = base64_decoded_size(b64, n, &size);
        if (r < 0)
                return agent_send_error(a, id, "bad argument 'data_b64': not base64 (RFC 4648, padded, no whitespace)"), 0;
        if (size > FILE_OP_MAX)
                return send_errno(a, id, EFBIG, args.path, "File too large (at most 524288 bytes in one write)"), 0;
        data = malloc(MAX(size, (size_t) 1));
        if (!data)
                return -ENOMEM;
        r = base64_decode(b64, n, data, size, &size);
        if (r < 0)
                return agent_send_error(a, id, "bad argument 'data_b64': %s", strerror(-r)), 0;

        r = write_atomic(args.path, data, size, (mode_t) args.mode, &why);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return send_errno(a, id, -r, args.path, why), 0;

        o = json_object_new_object();
        if (!o)
                return -ENOMEM;
        json_object_object_add(o, "path", json_object_new_string(args.path));
        json_object_object_add(o, "size", json_object_new_int64((int64_t) size));
        return agent_send_json(a, FKA_RESPONSE, id, o);
}

/* Read all of fd, at most FILE_OP_MAX bytes: -EFBIG beyond. */
static int read_capped(int fd, uint8_t *buf, size_t *ret_size) {
        size_t n = 0;

        for (;;) {
                ssize_t k = read(fd, buf + n, FILE_OP_MAX + 1 - n);

                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (k == 0)
                        break;
                n += (size_t) k;
                if (n > FILE_OP_MAX)
                        return -EFBIG;
        }
        *ret_size = n;
        return 0;
}

int agent_op_read_file(Agent *a, uint32_t id, struct json_object *req) {
        FileArgs args = {};
        _cleanup_free_ uint8_t *data = NULL;
        _cleanup_free_ char *b64 = NULL;
        _cleanup_close_ int fd = -EBADF;
        struct json_object *o;
        struct stat st;
        size_t size = 0, len;
        int r;

        r = parse_args(a, id, req, read_table, &args);
        if (r <= 0)
                return r;

        fd = open(args.path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0 && errno == ELOOP)
                return send_errno(a, id, ELOOP, args.path,
                                  SYMLINK_WHY), 0;
        if (fd < 0)
                return send_errno(a, id, errno, args.path, NULL), 0;
        if (fstat(fd, &st) < 0)
                return send_errno(a, id, errno, args.path, NULL), 0;
        if (S_ISDIR(st.st_mode))
                return send_errno(a, id, EISDIR, args.path, NULL), 0;
        if (!S_ISREG(st.st_mode))
                return send_errno(a, id, EINVAL, args.path, "Not a regular file"), 0;
        if (st.st_size > (off_t) FILE_OP_MAX)
                return send_errno(a, id, EFBIG, args.path, "File too large (at most 524288 bytes in one read)"), 0;

        data = malloc(FILE_OP_MAX + 1);
        if (!data)
                return -ENOMEM;
        r = read_capped(fd, data, &size);
        if (r == -EFBIG)
                return send_errno(a, id, EFBIG, args.path, "File too large (at most 524288 bytes in one read)"), 0;
        if (r < 0)
                return send_errno(a, id, -r, args.path, NULL), 0;

        len = BASE64_ENCODED_SIZE(size);
        b64 = malloc(len + 1);
        if (!b64)
                return -ENOMEM;
        b64[base64_encode(data, size, b64)] = 0;

        o = json_object_new_object();
        if (!o)
                return -ENOMEM;
        json_object_object_add(o, "path", json_object_new_string(args.path));
        json_object_object_add(o, "data_b64", json_object_new_string_len(b64, (int) len));
        json_object_object_add(o, "size", json_object_new_int64((int64_t) size));
        return agent_send_json(a, FKA_RESPONSE, id, o);
}
