/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* One layer applied to the tree: every member checked, every write an *at() call
 * from a directory fd inside the tree that no symlink led to. */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "io-util.h"
#include "oci.h"

#define CHUNK (256u * 1024u)
#define WHITEOUT_PREFIX ".wh."
#define WHITEOUT_OPAQUE ".wh..wh..opq"

typedef struct DirTime {
        char *path;
        struct timespec ts[2];
} DirTime;

typedef struct LayerCtx {
        int root;
        OciLayer *layer;
        OciBudget *budget;
        bool privileged;
        const OciBlobSource *src;
        uint64_t blob_bytes;    /* of the blob, as read so far */
        oci_hash *blob_hash;    /* of those bytes: the blob's digest */
        const char *blob_error; /* why the blob could not be read further */
        bool blob_too_long;     /* more bytes than its descriptor says */
        const char *tar_error;  /* why the decompressed stream could not be read further */
        struct archive *dec;    /* the blob decompressed (libarchive's raw format) */
        bool compressed;        /* else the blob is the tar, and its digest the diff_id */
        oci_hash *tar_hash;     /* of the decompressed bytes: the diff_id */
        uint8_t *buf;
        void *written;          /* tsearch() set of the paths this layer wrote */
        DirTime *dir_times;
        size_t n_dir_times, size_dir_times;
        const char *member;     /* for messages */
} LayerCtx;

static int cmp_str(const void *a, const void *b) {
        return strcmp(a, b);
}

/* The blob's next bytes, hashed: 0 at its end, -1 with c->blob_error set. An
 * archive's member is read where the archive stands, its bytes in order. */
static la_ssize_t blob_read(LayerCtx *c, const void **ret) {
        const void *p = c->buf;
        ssize_t n;

        if (c->blob_error)
                return -1;
        if (c->src->archive) {
                size_t len = 0;
                la_int64_t off = 0;
                int r = archive_read_data_block(c->src->archive, &p, &len, &off);

                if (r == ARCHIVE_EOF)
                        n = 0;
                else if (r != ARCHIVE_OK) {
                        c->blob_error = "the image archive is damaged";
                        return -1;
                } else if (off < 0 || (uint64_t) off != c->blob_bytes) {
                        c->blob_error = "its blob is a sparse member of the image archive";
                        return -1;
                } else
                        n = (ssize_t) len;
        } else {
                do
                        n = read(c->src->fd, c->buf, CHUNK);
                while (n < 0 && errno == EINTR);
                if (n < 0) {
                        c->blob_error = "cannot read its blob";
                        return -1;
                }
        }
        if (c->layer->size >= 0 && (uint64_t) n > (uint64_t) c->layer->size - c->blob_bytes) {
                c->blob_too_long = true;
                c->blob_error = "its blob is larger than its descriptor says";
                return -1;
        }
        if (oci_interrupted) {
                c->blob_error = "interrupted";
                return -1;
        }
        oci_hash_update(c->blob_hash, p, (size_t) n);
        c->blob_bytes += (uint64_t) n;
        *ret = p;
        return n;
}

static la_ssize_t dec_read_cb(struct archive *a, void *userdata, const void **ret) {
        LayerCtx *c = userdata;
        la_ssize_t n = blob_read(c, ret);

        if (n < 0)
                archive_set_error(a, EIO, "%s", c->blob_error);
        return n;
}

/* The tar's next bytes: the blob decompressed, and hashed when it was compressed.
 * Their count is capped: a small blob can decompress to any size. */
static la_ssize_t tar_read_cb(struct archive *a, void *userdata, const void **ret) {
        LayerCtx *c = userdata;
        const void *p;
        size_t len;
        la_int64_t off;
        int r = archive_read_data_block(c->dec, &p, &len, &off);

        if (r == ARCHIVE_EOF)
                return 0;
        if (r != ARCHIVE_OK) {
                c->tar_error = c->blob_error ?: "cannot decompress it";
                archive_set_error(a, EIO, "%s", c->tar_error);
                return -1;
        }
        if (len > c->budget->stream) {
                c->tar_error = "the image is larger than the size limit";
                archive_set_error(a, EFBIG, "%s", c->tar_error);
                return -1;
        }
        c->budget->stream -= len;
        if (c->compressed)
                oci_hash_update(c->tar_hash, p, len);
        *ret = p;
        return (la_ssize_t) len;
}

static int refuse(LayerCtx *c, const char *reason) {
        return oci_refuse("layer %s: member \"%.512s\": %s", c->layer->name, c->member, reason);
}

static int fail(LayerCtx *c, int r, const char *what) {
        return oci_fail(r, "layer %s: member \"%.512s\": %s: %s", c->layer->name, c->member, what, strerror(-r));
}

static int remember(LayerCtx *c, const char *path) {
        char *p = strdup(path), **slot;

        if (!p)
                return -ENOMEM;
        slot = tsearch(p, &c->written, cmp_str);
        if (!slot) {
                free(p);
                return -ENOMEM;
        }
        if (*slot != p)
                free(p);
        return 0;
}

static int parent_error(LayerCtx *c, int r) {
        if (r == -ELOOP)
                return refuse(c, "its parent path goes through a symlink");
        if (r == -ENOTDIR)
                return refuse(c, "its parent path is not a directory");
        return fail(c, r, "cannot open its parent");
}

/* Owner, mode, xattrs of what fd holds; a non-root run keeps its own ids. */
static int set_meta(LayerCtx *c, int fd, struct archive_entry *e, bool dir) {
        mode_t mode = archive_entry_perm(e) & 07777;
        const char *name;
        const void *value;
        size_t size;

        if (fchown(fd, (uid_t) archive_entry_uid(e), (gid_t) archive_entry_gid(e)) < 0 &&
            (c->privileged || errno != EPERM))
                return fail(c, -errno, "cannot set its owner");
        if (!c->privileged && dir)
                mode |= 0700; /* or this run could not write into it, nor remove it */
        if (fchmod(fd, mode) < 0)
                return fail(c, -errno, "cannot set its mode");
        archive_entry_xattr_reset(e);
        while (archive_entry_xattr_next(e, &name, &value, &size) == ARCHIVE_OK) {
                if (!name || !name[0] || strlen(name) > XATTR_NAME_MAX)
                        return refuse(c, "an extended attribute with a bad name");
                if (fsetxattr(fd, name, value, size, 0) < 0 && errno != EOPNOTSUPP &&
                    (c->privileged || errno != EPERM))
                        return fail(c, -errno, "cannot set an extended attribute");
        }
        return 0;
}

static void entry_times(struct archive_entry *e, struct timespec ts[2]) {
        ts[1] = (struct timespec) { .tv_sec = archive_entry_mtime(e), .tv_nsec = archive_entry_mtime_nsec(e) };
        if (archive_entry_atime_is_set(e))
                ts[0] = (struct timespec) { .tv_sec = archive_entry_atime(e), .tv_nsec = archive_entry_atime_nsec(e) };
        else
                ts[0] = ts[1];
        if (ts[0].tv_nsec < 0 || ts[0].tv_nsec >= 1000000000)
                ts[0].tv_nsec = 0;
        if (ts[1].tv_nsec < 0 || ts[1].tv_nsec >= 1000000000)
                ts[1].tv_nsec = 0;
}

/* ".wh..wh..opq" in dir: what lower layers put there goes, this layer's stays. */
static int apply_opaque(LayerCtx *c, const char *dir) {
        _cleanup_close_ int dfd = -EBADF, parent = -EBADF;
        char **names = NULL;
        size_t n = 0, size = 0;
        struct dirent *de;
        DIR *d;
        int r = 0;

        if (dir[0]) {
                const char *name;

                r = oci_open_parent(c->root, dir, true, &parent, &name);
                if (r < 0)
                        return parent_error(c, r);
                dfd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (dfd < 0 && errno == ENOENT)
                        return 0;
        } else
                dfd = fcntl(c->root, F_DUPFD_CLOEXEC, 3);
        if (dfd < 0)
                return errno == ENOTDIR || errno == ELOOP ? refuse(c, "its directory is not a directory")
                                                          : fail(c, -errno, "cannot open its directory");
        d = fdopendir(fcntl(dfd, F_DUPFD_CLOEXEC, 3));
        if (!d)
                return fail(c, -errno, "cannot list its directory");
        while ((de = readdir(d))) {
                _cleanup_free_ char *full = NULL;

                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                if (asprintf(&full, "%s%s%s", dir, dir[0] ? "/" : "", de->d_name) < 0) {
                        r = -ENOMEM;
                        break;
                }
                if (tfind(full, &c->written, cmp_str))
                        continue;
                if (n == size) {
                        char **nn = realloc(names, (size = size * 2 + 16) * sizeof(char *));
                        if (!nn) {
                                r = -ENOMEM;
                                break;
                        }
                        names = nn;
                }
                names[n] = strdup(de->d_name);
                if (!names[n]) {
                        r = -ENOMEM;
                        break;
                }
                n++;
        }
        closedir(d);
        for (size_t i = 0; i < n; i++) {
                if (r >= 0)
                        r = oci_rm_rf_at(dfd, names[i]);
                free(names[i]);
        }
        free(names);
        return r < 0 ? fail(c, r, "cannot empty its directory") : 0;
}

/* ".wh.NAME", or the char 0:0 form at NAME itself: NAME of lower layers goes. */
static int apply_whiteout(LayerCtx *c, const char *path, const char *target) {
        _cleanup_close_ int parent = -EBADF;
        const char *name;
        int r;

        r = oci_open_parent(c->root, path, false, &parent, &name);
        if (r == -ENOENT)
                return 0;
        if (r < 0)
                return parent_error(c, r);
        r = oci_rm_rf_at(parent, target);
        return r < 0 ? fail(c, r, "cannot remove what it whites out") : 0;
}

static int write_data(LayerCtx *c, struct archive *a, int fd, int64_t size) {
        uint64_t end = 0;
        const void *buf;
        size_t len;
        la_int64_t off;
        int r;

        while ((r = archive_read_data_block(a, &buf, &len, &off)) == ARCHIVE_OK) {
                if (off < 0 || (uint64_t) off > (uint64_t) size || len > (uint64_t) size - (uint64_t) off)
                        return refuse(c, "more data than its size");
                r = pwrite_all(fd, buf, len, (uint64_t) off);
                if (r < 0)
                        return fail(c, r, "cannot write it");
                end = MAX(end, (uint64_t) off + len);
        }
        if (r != ARCHIVE_EOF)
                return oci_refuse("layer %s: member \"%.512s\": %s", c->layer->name, c->member,
                                  archive_error_string(a) ?: "unreadable");
        /* A sparse member's hole at the end */
        if (end < (uint64_t) size && ftruncate(fd, size) < 0)
                return fail(c, -errno, "cannot size it");
        return 0;
}

static int apply_hardlink(LayerCtx *c, int parent, const char *name, const char *raw_target) {
        _cleanup_free_ char *target = NULL;
        _cleanup_close_ int tparent = -EBADF;
        const char *tname, *reason = NULL;
        struct stat st;
        int r;

        r = oci_path_normalize(raw_target, &target, &reason);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return refuse(c, raw_target[0] == '/' ? "its hard link target leaves the image root"
                                                      : "its hard link target leaves the image root or is too long");
        if (!target[0])
                return refuse(c, "a hard link to the image root");
        r = oci_open_parent(c->root, target, false, &tparent, &tname);
        if (r == -ELOOP)
                return refuse(c, "its hard link target goes through a symlink");
        if (r < 0)
                return refuse(c, "its hard link target does not exist");
        if (fstatat(tparent, tname, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return refuse(c, "its hard link target does not exist");
        if (S_ISDIR(st.st_mode))
                return refuse(c, "a hard link to a directory");
        if (linkat(tparent, tname, parent, name, 0) < 0)
                return fail(c, -errno, "cannot link it");
        return 0;
}

static int add_dir_time(LayerCtx *c, const char *path, struct archive_entry *e) {
        if (c->n_dir_times == c->size_dir_times) {
                size_t size = c->size_dir_times * 2 + 64;
                DirTime *n = realloc(c->dir_times, size * sizeof(DirTime));

                if (!n)
                        return -ENOMEM;
                c->dir_times = n;
                c->size_dir_times = size;
        }
        c->dir_times[c->n_dir_times].path = strdup(path);
        if (!c->dir_times[c->n_dir_times].path)
                return -ENOMEM;
        entry_times(e, c->dir_times[c->n_dir_times].ts);
        c->n_dir_times++;
        return 0;
}

/* A member named .wh.*: handled (1) or not a whiteout name (0). */
static int whiteout_member(LayerCtx *c, const char *path, const char *base) {
        const char *target;
        int r;

        if (strncmp(base, WHITEOUT_PREFIX, strlen(WHITEOUT_PREFIX)) != 0)
                return 0;
        target = base + strlen(WHITEOUT_PREFIX);
        if (strcmp(base, WHITEOUT_OPAQUE) == 0) {
                _cleanup_free_ char *dir = strndup(path, (size_t) (base - path));

                if (!dir)
                        return -ENOMEM;
                if (dir[0])
                        dir[strlen(dir) - 1] = 0;
                r = apply_opaque(c, dir);
                return r < 0 ? r : 1;
        }
        if (strncmp(target, WHITEOUT_PREFIX, strlen(WHITEOUT_PREFIX)) == 0)
                return 1; /* other markers of aufs: nothing to do */
        if (!target[0] || strcmp(target, ".") == 0 || strcmp(target, "..") == 0)
                return refuse(c, "a whiteout of nothing, or of a parent");
        r = apply_whiteout(c, path, target);
        return r < 0 ? r : 1;
}

static int create_member(LayerCtx *c, struct archive *a, struct archive_entry *e, int parent, const char *name,
                         const char *path, bool exists) {
        _cleanup_close_ int fd = -EBADF;
        int64_t size = archive_entry_size(e);
        struct timespec ts[2];
        int r;

        entry_times(e, ts);
        switch (archive_entry_filetype(e)) {
        case AE_IFDIR:
                if (!exists && mkdirat(parent, name, 0700) < 0)
                        return fail(c, -errno, "cannot make it");
                fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (fd < 0)
                        return fail(c, -errno, "cannot open it");
                r = set_meta(c, fd, e, true);
                if (r < 0)
                        return r;
                return add_dir_time(c, path, e);
        case AE_IFREG:
                fd = openat(parent, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
                if (fd < 0)
                        return fail(c, -errno, "cannot create it");
                r = write_data(c, a, fd, size);
                if (r < 0)
                        return r;
                c->budget->files -= (uint64_t) size;
                r = set_meta(c, fd, e, false);
                if (r < 0)
                        return r;
                return futimens(fd, ts) < 0 ? fail(c, -errno, "cannot set its times") : 0;
        case AE_IFLNK: {
                const char *target = archive_entry_symlink(e);

                if (!target || !target[0] || strlen(target) >= OCI_PATH_MAX)
                        return refuse(c, "a symlink with an empty or overlong target");
                /* Stored as it is: it means something inside the guest, never here. */
                if (symlinkat(target, parent, name) < 0)
                        return fail(c, -errno, "cannot make it");
                if (fchownat(parent, name, (uid_t) archive_entry_uid(e), (gid_t) archive_entry_gid(e),
                             AT_SYMLINK_NOFOLLOW) < 0 && (c->privileged || errno != EPERM))
                        return fail(c, -errno, "cannot set its owner");
                return utimensat(parent, name, ts, AT_SYMLINK_NOFOLLOW) < 0 ? fail(c, -errno, "cannot set its times")
                                                                              : 0;
        }
        default: /* AE_IFIFO */
                if (mkfifoat(parent, name, 0600) < 0)
                        return fail(c, -errno, "cannot make it");
                fd = openat(parent, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
                if (fd < 0)
                        return fail(c, -errno, "cannot open it");
                r = set_meta(c, fd, e, false);
                if (r < 0)
                        return r;
                return futimens(fd, ts) < 0 ? fail(c, -errno, "cannot set its times") : 0;
        }
}

static int apply_entry(LayerCtx *c, struct archive *a, struct archive_entry *e) {
        _cleanup_free_ char *path = NULL;
        _cleanup_close_ int parent = -EBADF;
        const char *raw = archive_entry_pathname(e), *name, *base, *reason = NULL;
        mode_t type = archive_entry_filetype(e);
        const char *hardlink = archive_entry_hardlink(e);
        int64_t size = archive_entry_size(e);
        struct stat st;
        bool exists;
        int r;

        c->member = raw ?: "";
        if (!raw)
                return refuse(c, "a member without a name");
        r = oci_path_normalize(raw, &path, &reason);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return refuse(c, reason);
        if (!path[0])
                return 0; /* the root itself */
        base = strrchr(path, '/');
        base = base ? base + 1 : path;

        r = whiteout_member(c, path, base);
        if (r != 0)
                return r < 0 ? r : 0;
        if (!hardlink && (type == AE_IFCHR || type == AE_IFBLK)) {
                if (type == AE_IFCHR && archive_entry_rdevmajor(e) == 0 && archive_entry_rdevminor(e) == 0)
                        return apply_whiteout(c, path, base);
                return refuse(c, "a device node");
        }
        if (!hardlink && type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK && type != AE_IFIFO)
                return refuse(c, "not a file, directory, symlink, hard link or fifo");
        if (size < 0 || (!hardlink && type == AE_IFREG && (uint64_t) size > c->budget->files))
                return refuse(c, "larger than the size limit");

        r = oci_open_parent(c->root, path, true, &parent, &name);
        if (r < 0)
                return parent_error(c, r);
        exists = fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) >= 0;
        if (!exists && errno != ENOENT)
                return fail(c, -errno, "cannot look at it");
        /* Replace, never modify in place: the inode may be shared with the layer cache. */
        if (exists && !(S_ISDIR(st.st_mode) && type == AE_IFDIR && !hardlink)) {
                r = oci_rm_rf_at(parent, name);
                if (r < 0)
                        return fail(c, r, "cannot replace what was there");
                exists = false;
        }
        r = remember(c, path);
        if (r < 0)
                return r;
        if (hardlink)
                return apply_hardlink(c, parent, name, hardlink);
        return create_member(c, a, e, parent, name, path, exists);
}

static void apply_dir_times(LayerCtx *c) {
        for (size_t i = c->n_dir_times; i > 0; i--) {
                DirTime *t = &c->dir_times[i - 1];
                _cleanup_close_ int parent = -EBADF, fd = -EBADF;
                const char *name;

                if (oci_open_parent(c->root, t->path, false, &parent, &name) < 0)
                        continue;
                fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (fd >= 0)
                        (void) futimens(fd, t->ts);
        }
}

static void layer_ctx_done(LayerCtx *c) {
        for (size_t i = 0; i < c->n_dir_times; i++)
                free(c->dir_times[i].path);
        free(c->dir_times);
        tdestroy(c->written, free);
        if (c->dec)
                archive_read_free(c->dec);
        oci_hash_free(c->blob_hash);
        oci_hash_free(c->tar_hash);
        free(c->buf);
}

/* The rest of the decompressed stream (a tar's end blocks, what a writer put
 * after them), with decompressed; then the rest of the blob. Both count for the
 * digests. */
static int drain(LayerCtx *c, bool decompressed) {
        const void *p;
        la_ssize_t n = 0;

        while (decompressed && (n = tar_read_cb(c->dec, c, &p)) > 0)
                ;
        if (n < 0)
                return -EBADMSG;
        while ((n = blob_read(c, &p)) > 0)
                ;
        return n < 0 ? -EBADMSG : 0;
}

/* The blob as read against what the image says of it: its size and digest, and
 * with diff_id, the uncompressed tar's diff_id. Digest and size are filled in
 * where unknown. */
static int check_blob(LayerCtx *c, bool diff_id) {
        OciLayer *l = c->layer;
        char got[OCI_DIGEST_LEN + 1], diff[OCI_DIGEST_LEN + 1];

        if (c->blob_too_long)
                return oci_refuse("layer %s: the blob is more than the %" PRIi64 " bytes its descriptor says", l->name,
                                  l->size);
        if (l->size >= 0 && c->blob_bytes != (uint64_t) l->size)
                return oci_refuse("layer %s: the blob is %" PRIu64 " bytes, its descriptor says %" PRIi64, l->name,
                                  c->blob_bytes, l->size);
        oci_hash_final(c->blob_hash, got);
        if (l->digest[0] && strcmp(got, l->digest) != 0)
                return oci_refuse("layer %s: the blob's SHA-256 is %s", l->name, got);
        if (!diff_id)
                return 0;
        if (c->compressed)
                oci_hash_final(c->tar_hash, diff);
        else
                memcpy(diff, got, sizeof(diff));
        if (strcmp(diff, l->diff_id) != 0)
                return oci_refuse("layer %s: the uncompressed layer's SHA-256 is %s, the config's diff_id says %s",
                                  l->name, diff, l->diff_id);
        memcpy(l->digest, got, sizeof(got));
        l->size = (int64_t) c->blob_bytes;
        return 0;
}

/* r, a refusal of a member or of the tar: where the blob itself is not what the
 * image says (a damaged or substituted blob), that is named instead, as the cause. */
static int blame_blob(LayerCtx *c, int r) {
        char first[OCI_ERROR_MAX];
        int k;

        if (r != -EBADMSG || oci_interrupted)
                return r;
        if (drain(c, false) < 0 && !c->blob_too_long)
                return r;
        snprintf(first, sizeof(first), "%s", oci_error_message());
        oci_error_replace("");
        k = check_blob(c, !c->compressed); /* an uncompressed blob is its tar */
        if (k >= 0)
                oci_error_replace(first);
        return k < 0 ? k : r;
}

int oci_layer_apply(int root, OciLayer *layer, const OciBlobSource *src, OciBudget *budget) {
        _cleanup_(layer_ctx_done) LayerCtx c = {
                .root = root,
                .layer = layer,
                .budget = budget,
                .privileged = geteuid() == 0,
                .src = src,
        };
        struct archive *a = NULL;
        struct archive_entry *e;
        unsigned n = 0;
        int r;

        if (!src->archive && lseek(src->fd, 0, SEEK_SET) < 0)
                return oci_fail(-errno, "layer %s: cannot read it: %m", layer->name);
        c.blob_hash = oci_hash_new();
        c.tar_hash = oci_hash_new();
        c.buf = malloc(CHUNK);
        c.dec = archive_read_new();
        a = archive_read_new();
        if (!c.blob_hash || !c.tar_hash || !c.buf || !c.dec || !a) {
                if (a)
                        archive_read_free(a);
                return -ENOMEM;
        }
        /* Two readers, so that one read of the blob gives both digests: the first
         * decompresses it (libarchive's raw format, any filter), the second reads
         * the tar out of what the first gives. */
        archive_read_support_format_raw(c.dec);
        archive_read_support_filter_gzip(c.dec);
        archive_read_support_filter_zstd(c.dec);
        archive_read_support_filter_xz(c.dec);
        archive_read_support_filter_bzip2(c.dec);
        if (archive_read_open(c.dec, &c, NULL, dec_read_cb, NULL) != ARCHIVE_OK ||
            archive_read_next_header(c.dec, &e) != ARCHIVE_OK) {
                r = blame_blob(&c, oci_refuse("layer %s: cannot read it: %s", layer->name,
                                              c.blob_error ?: archive_error_string(c.dec) ?: "unreadable"));
                goto finish;
        }
        c.compressed = archive_filter_code(c.dec, 0) != ARCHIVE_FILTER_NONE;
        archive_read_support_format_tar(a);
        if (archive_read_open(a, &c, NULL, tar_read_cb, NULL) != ARCHIVE_OK) {
                r = blame_blob(&c, oci_refuse("layer %s: not a tar: %s", layer->name, archive_error_string(a) ?: "?"));
                goto finish;
        }
        for (;;) {
                r = archive_read_next_header(a, &e);
                if (r == ARCHIVE_EOF)
                        break;
                if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
                        r = blame_blob(&c, oci_refuse("layer %s: not a tar, or a damaged one: %s", layer->name,
                                                      archive_error_string(a) ?: "?"));
                        goto finish;
                }
                if (++n > OCI_MEMBERS_MAX) {
                        r = oci_refuse("layer %s: more than %u members", layer->name, OCI_MEMBERS_MAX);
                        goto finish;
                }
                r = oci_check_interrupted();
                if (r >= 0)
                        r = apply_entry(&c, a, e);
                if (r < 0) {
                        r = blame_blob(&c, r);
                        goto finish;
                }
        }
        r = drain(&c, true);
        if (r < 0)
                r = blame_blob(&c, oci_refuse("layer %s: %s", layer->name,
                                              c.tar_error ?: c.blob_error ?: "cannot read it"));
        else
                r = check_blob(&c, true);
        if (r >= 0)
                apply_dir_times(&c);
finish:
        archive_read_free(a);
        return oci_interrupted ? oci_check_interrupted() : r;
}
