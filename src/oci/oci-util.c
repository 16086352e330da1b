/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "oci.h"

static char error_message[OCI_ERROR_MAX];
volatile int oci_interrupted;

int oci_check_interrupted(void) {
        return oci_interrupted ? oci_fail(-EINTR, "Interrupted by a signal") : 0;
}

static void set_message(const char *fmt, va_list ap) {
        if (error_message[0])
                return;
        vsnprintf(error_message, sizeof(error_message), fmt, ap);
        /* One line: whatever the image named is shown, its newlines are not. */
        for (char *p = error_message; *p; p++)
                if (*p == '\n' || *p == '\r')
                        *p = ' ';
}

int oci_refuse(const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        set_message(fmt, ap);
        va_end(ap);
        return -EBADMSG;
}

int oci_fail(int r, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        set_message(fmt, ap);
        va_end(ap);
        return r < 0 ? r : -EIO;
}

const char *oci_error_message(void) {
        return error_message;
}

void oci_error_replace(const char *m) {
        snprintf(error_message, sizeof(error_message), "%s", m);
}

struct oci_hash {
        EVP_MD_CTX *ctx;
};

oci_hash *oci_hash_new(void) {
        oci_hash *h = calloc(1, sizeof(*h));

        if (!h)
                return NULL;
        h->ctx = EVP_MD_CTX_new();
        if (!h->ctx || EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1)
                return oci_hash_free(h);
        return h;
}

void oci_hash_update(oci_hash *h, const void *p, size_t n) {
        (void) EVP_DigestUpdate(h->ctx, p, n);
}

void oci_hash_final(oci_hash *h, char out[OCI_DIGEST_LEN + 1]) {
        uint8_t d[32];
        unsigned n = 0;

        (void) EVP_DigestFinal_ex(h->ctx, d, &n);
        memcpy(out, "sha256:", 7);
        for (unsigned i = 0; i < 32; i++)
                snprintf(out + 7 + 2 * i, 3, "%02x", d[i]);
}

oci_hash *oci_hash_free(oci_hash *h) {
        if (h) {
                EVP_MD_CTX_free(h->ctx);
                free(h);
        }
        return NULL;
}

int oci_path_normalize(const char *in, char **ret, const char **ret_reason) {
        _cleanup_free_ char *out = NULL;
        size_t len = strlen(in), n = 0;
        const char *p = in;

        if (len > OCI_PATH_MAX) {
                *ret_reason = "path too long";
                return -EBADMSG;
        }
        if (in[0] == '/') {
                *ret_reason = "absolute path";
                return -EBADMSG;
        }
        out = malloc(len + 1);
        if (!out)
                return -ENOMEM;
        while (*p) {
                size_t k = strcspn(p, "/");

                if (k == 0 || (k == 1 && p[0] == '.')) {
                        /* empty or "." */
                } else if (k == 2 && p[0] == '.' && p[1] == '.') {
                        *ret_reason = "path leaves the image root";
                        return -EBADMSG;
                } else if (k > OCI_NAME_MAX) {
                        *ret_reason = "name too long";
                        return -EBADMSG;
                } else {
                        if (n > 0)
                                out[n++] = '/';
                        memcpy(out + n, p, k);
                        n += k;
                }
                p += k;
                if (*p == '/')
                        p++;
        }
        out[n] = 0;
        *ret = TAKE_PTR(out);
        return 0;
}

/* The parent of rel in one system call, where it is there and no symlink is on
 * the way: -errno otherwise, and the caller walks it step by step to see why. */
static int open_parent_fast(int root, const char *rel, const char *last) {
        struct open_how how = {
                .flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
                .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        };
        char dir[OCI_PATH_MAX + 1];
        size_t len = (size_t) (last - rel);
        int fd;

        if (len == 0)
                fd = fcntl(root, F_DUPFD_CLOEXEC, 3);
        else if (len > OCI_PATH_MAX)
                return -ENAMETOOLONG;
        else {
                memcpy(dir, rel, len - 1); /* less the slash */
                dir[len - 1] = 0;
                fd = (int) syscall(SYS_openat2, root, dir, &how, sizeof(how));
        }
        return fd < 0 ? -errno : fd;
}

int oci_open_parent(int root, const char *rel, bool create, int *ret_fd, const char **ret_name) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *copy = NULL;
        const char *last = strrchr(rel, '/');
        char *p, *slash;

        if (!rel[0])
                return -EINVAL;
        last = last ? last + 1 : rel;
        fd = open_parent_fast(root, rel, last);
        if (fd >= 0) {
                *ret_name = last;
                *ret_fd = TAKE_FD(fd);
                return 0;
        }
        copy = strdup(rel);
        if (!copy)
                return -ENOMEM;
        fd = fcntl(root, F_DUPFD_CLOEXEC, 3);
        if (fd < 0)
                return -errno;
        for (p = copy; (slash = strchr(p, '/')); p = slash + 1) {
                int next;

                *slash = 0;
                next = openat(fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (next < 0 && errno == ENOENT && create) {
                        if (mkdirat(fd, p, 0755) < 0 && errno != EEXIST)
                                return -errno;
                        next = openat(fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                }
                if (next < 0) {
                        struct stat st;

                        if ((errno == ENOTDIR || errno == ELOOP) && fstatat(fd, p, &st, AT_SYMLINK_NOFOLLOW) >= 0)
                                return S_ISLNK(st.st_mode) ? -ELOOP : -ENOTDIR;
                        return -errno;
                }
                safe_close(fd);
                fd = next;
        }
        *ret_name = rel + (p - copy);
        *ret_fd = TAKE_FD(fd);
        return 0;
}

static int rm_rf_children(int dfd) {
        DIR *d = fdopendir(dfd);
        struct dirent *de;
        int r = 0;

        if (!d) {
                safe_close(dfd);
                return -errno;
        }
        while ((errno = 0, de = readdir(d))) {
                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                r = oci_rm_rf_at(dirfd(d), de->d_name);
                if (r < 0)
                        break;
        }
        if (r >= 0 && errno > 0)
                r = -errno;
        closedir(d);
        return r;
}

int oci_rm_rf_at(int dirfd, const char *name) {
        struct stat st;
        int fd, r;

        if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (!S_ISDIR(st.st_mode))
                return unlinkat(dirfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
        fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        r = rm_rf_children(fd);
        if (r < 0)
                return r;
        return unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT ? -errno : 0;
}
