/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * hash_files: the SHA-256 of every regular file at or under the requested
 * paths, for the host's diff of two sandboxes (file-hashes.h).
 *
 *   {"op": "hash_files", "paths": ["/root", "/tmp"], "timeout_secs": 30}
 *   -> {"files": {"/root/a.txt": "<64 hex>", ...}}
 *
 * Symbolic links are not followed (neither the requested paths' last
 * component nor anything below), only regular files are hashed, and
 * directories of pseudo file systems (proc, sysfs, cgroup, ...) are not
 * entered. A path that does not exist adds nothing. Names that are not valid
 * UTF-8, or hold control characters, are skipped (they cannot be JSON keys
 * faithfully). Limits: HASH_PATHS_MAX paths, HASH_FILES_MAX files, 64
 * directory levels, the timeout (default 30 s) and the reply's 1 MiB: each
 * one exceeded fails the request with an error rather than answering a list
 * the host would compare wrongly. Synchronous, like eval.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include "agent.h"
#include "file-hashes.h"
#include "json-util.h"
#include "macro.h"
#include "sha256.h"

#define HASH_DEPTH_MAX 64u
#define HASH_CHUNK (64u * 1024u)

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

typedef struct Walk {
        struct json_object *files;
        unsigned n_files;
        uint64_t deadline;
        uint8_t *buf;
        const char *error; /* static: why the walk stopped */
} Walk;

static bool is_pseudo_fs(int fd) {
        struct statfs sf;

        if (fstatfs(fd, &sf) < 0)
                return false;
        switch ((unsigned long) sf.f_type) {
        case PROC_SUPER_MAGIC:
        case SYSFS_MAGIC:
        case CGROUP_SUPER_MAGIC:
        case CGROUP2_SUPER_MAGIC:
        case DEBUGFS_MAGIC:
        case TRACEFS_MAGIC:
        case SECURITYFS_MAGIC:
        case BPF_FS_MAGIC:
        case DEVPTS_SUPER_MAGIC:
                return true;
        default:
                return false;
        }
}

static int hash_fd(Walk *w, int fd, char hex[SHA256_HEX_SIZE]) {
        uint8_t digest[SHA256_DIGEST_SIZE];
        sha256_ctx c;

        sha256_init(&c);
        for (;;) {
                ssize_t k = read(fd, w->buf, HASH_CHUNK);

                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (k == 0)
                        break;
                sha256_update(&c, w->buf, (size_t) k);
                if (now_usec() > w->deadline) {
                        w->error = "timed out";
                        return -ETIMEDOUT;
                }
        }
        sha256_final(&c, digest);
        sha256_hex(digest, hex);
        return 0;
}

/* fd: an open regular file (taken). */
static int add_file(Walk *w, const char *path, int fd) {
        _cleanup_close_ int f = fd;
        char hex[SHA256_HEX_SIZE];
        int r;

        if (!hash_path_is_valid(path))
                return 0; /* not representable: skipped */
        if (json_object_object_get_ex(w->files, path, NULL))
                return 0; /* requested twice (a path and one under it) */
        if (w->n_files >= HASH_FILES_MAX) {
                w->error = "more than 10000 files under the paths";
                return -E2BIG;
        }
        r = hash_fd(w, f, hex);
        if (r == -ETIMEDOUT)
                return r;
        if (r < 0)
                return 0; /* unreadable (EIO, ...): left out, as a vanished file is */
        if (json_object_object_add(w->files, path, json_object_new_string(hex)) < 0)
                return -ENOMEM;
        w->n_files++;
        return 0;
}

/* dfd: an open directory (taken); path: its name. */
static int walk_dir(Walk *w, const char *path, int dfd, unsigned depth) {
        DIR *d;
        struct dirent *de;
        int r = 0;

        if (depth > HASH_DEPTH_MAX) {
                safe_close(dfd);
                w->error = "directories nested more than 64 deep";
                return -ELOOP;
        }
        if (is_pseudo_fs(dfd)) {
                safe_close(dfd);
                return 0;
        }
        d = fdopendir(dfd);
        if (!d) {
                safe_close(dfd);
                return 0;
        }
        while (r >= 0 && (errno = 0, de = readdir(d))) {
                _cleanup_free_ char *child = NULL;
                struct stat st;
                int fd;

                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                if (now_usec() > w->deadline) {
                        w->error = "timed out";
                        r = -ETIMEDOUT;
                        break;
                }
                if (asprintf(&child, "%s%s%s", path, streq(path, "/") ? "" : "/", de->d_name) < 0) {
                        child = NULL;
                        r = -ENOMEM;
                        break;
                }
                if (strlen(child) > HASH_PATH_MAX)
                        continue;
                if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        continue; /* gone meanwhile */
                if (S_ISDIR(st.st_mode)) {
                        fd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (fd >= 0)
                                r = walk_dir(w, child, fd, depth + 1);
                } else if (S_ISREG(st.st_mode)) {
                        fd = openat(dirfd(d), de->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
                        if (fd >= 0 && fstat(fd, &st) >= 0 && S_ISREG(st.st_mode))
                                r = add_file(w, child, fd);
                        else
                                safe_close(fd);
                }
        }
        closedir(d);
        return r;
}

static int walk_path(Walk *w, const char *path) {
        struct stat st;
        int fd;

        fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0)
                return 0; /* missing, a symlink, unreadable: nothing to add */
        if (fstat(fd, &st) < 0) {
                safe_close(fd);
                return 0;
        }
        if (S_ISDIR(st.st_mode))
                return walk_dir(w, path, fd, 0);
        if (S_ISREG(st.st_mode))
                return add_file(w, path, fd);
        safe_close(fd);
        return 0;
}

typedef struct HashArgs {
        struct json_object *paths;
        uint32_t timeout_secs;
} HashArgs;

static int dispatch_ignore(struct json_object *v, void *field, const char **ret_error) {
        return 0;
}

static const struct json_dispatch hash_table[] = {
        { "op", JSON_KIND_STRING, dispatch_ignore, 0, 0, JSON_MANDATORY },
        { "paths", JSON_KIND_ARRAY, NULL, offsetof(HashArgs, paths), 0, JSON_MANDATORY },
        { "timeout_secs", JSON_KIND_UINT32, NULL, offsetof(HashArgs, timeout_secs), 0, 0 },
        {}
};

int agent_op_hash_files(Agent *a, uint32_t id, struct json_object *req) {
        HashArgs args = { .timeout_secs = AGENT_TIMEOUT_DEFAULT_SECS };
        const char *field = NULL, *err = NULL;
        _cleanup_json_ struct json_object *reply = NULL;
        _cleanup_free_ uint8_t *buf = NULL;
        Walk w = {};
        size_t n;
        int r;

        r = json_dispatch_full(req, hash_table, JSON_REJECT_UNKNOWN, &args, &field, &err);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return agent_send_error(a, id, "bad argument '%s': %s", field ?: "?", err ?: strerror(-r)), 0;
        if (args.timeout_secs < 1 || args.timeout_secs > AGENT_TIMEOUT_MAX_SECS)
                return agent_send_error(a, id, "bad argument 'timeout_secs': must be 1 .. 3600"), 0;
        n = json_object_array_length(args.paths);
        if (n > HASH_PATHS_MAX)
                return agent_send_error(a, id, "bad argument 'paths': at most %u paths", HASH_PATHS_MAX), 0;
        for (size_t i = 0; i < n; i++) {
                struct json_object *p = json_object_array_get_idx(args.paths, i);

                if (!json_object_is_type(p, json_type_string) ||
                    strlen(json_object_get_string(p)) != (size_t) json_object_get_string_len(p) ||
                    !hash_path_is_valid(json_object_get_string(p)))
                        return agent_send_error(a, id,
                                                "bad argument 'paths': element %zu is not an absolute, normalized path",
                                                i), 0;
        }

        buf = malloc(HASH_CHUNK);
        reply = json_object_new_object();
        w.files = json_object_new_object();
        if (!buf || !reply || !w.files) {
                json_object_put(w.files);
                return -ENOMEM;
        }
        json_object_object_add(reply, "files", w.files);
        w.buf = buf;
        w.deadline = now_usec() + (uint64_t) args.timeout_secs * 1000000u;
        r = 0;
        for (size_t i = 0; i < n && r >= 0; i++)
                r = walk_path(&w, json_object_get_string(json_object_array_get_idx(args.paths, i)));
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return agent_send_error(a, id, "hash_files: %s", w.error ?: strerror(-r)), 0;
        return agent_send_json(a, FKA_RESPONSE, id, TAKE_PTR(reply));
}
