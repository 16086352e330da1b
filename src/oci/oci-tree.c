/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The tree around the layers: hard-link copies for the layer cache, the guest's
 * own files, the size of it all, and the ext4 made from it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <search.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <json-c/json.h>

#include "io-util.h"
#include "oci.h"

/* Same choices as tools/mkimage's mke2fs.conf: the file system does not depend on
 * how the host configures mke2fs. */
static const char mke2fs_conf[] =
        "[defaults]\n"
        "\tbase_features = sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr\n"
        "\tdefault_mntopts = acl,user_xattr\n"
        "\tblocksize = 4096\n"
        "\tinode_size = 256\n"
        "\tinode_ratio = 16384\n"
        "\n"
        "[fs_types]\n"
        "\text4 = {\n"
        "\t\tfeatures = has_journal,extent,huge_file,flex_bg,metadata_csum,64bit,dir_nlink,extra_isize\n"
        "\t}\n";

static void closedirp(DIR **d) {
        if (*d)
                closedir(*d);
}

/* Owner, mode, xattrs and times of the directory src onto dst. */
static int copy_dir_meta(int src, int dst) {
        struct stat st;
        char names[65536];
        ssize_t n;

        if (fstat(src, &st) < 0)
                return -errno;
        if (fchown(dst, st.st_uid, st.st_gid) < 0 && (geteuid() == 0 || errno != EPERM))
                return -errno;
        if (fchmod(dst, st.st_mode & 07777) < 0)
                return -errno;
        n = flistxattr(src, names, sizeof(names));
        for (ssize_t i = 0; n > 0 && i < n; i += (ssize_t) strlen(names + i) + 1) {
                char value[65536];
                ssize_t k = fgetxattr(src, names + i, value, sizeof(value));

                if (k >= 0 && fsetxattr(dst, names + i, value, (size_t) k, 0) < 0 && errno != EOPNOTSUPP &&
                    (geteuid() == 0 || errno != EPERM))
                        return -errno;
        }
        return futimens(dst, (struct timespec[2]) { st.st_atim, st.st_mtim }) < 0 ? -errno : 0;
}

static int link_children(int src, int dst) {
        _cleanup_(closedirp) DIR *d = NULL;
        struct dirent *de;
        int fd, r;

        fd = fcntl(src, F_DUPFD_CLOEXEC, 3);
        if (fd < 0)
                return -errno;
        d = fdopendir(fd);
        if (!d) {
                safe_close(fd);
                return -errno;
        }
        while ((errno = 0, de = readdir(d))) {
                struct stat st;

                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                if (fstatat(src, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        return -errno;
                if (S_ISDIR(st.st_mode)) {
                        r = oci_tree_link_copy(src, dst, de->d_name);
                        if (r < 0)
                                return r;
                } else if (linkat(src, de->d_name, dst, de->d_name, 0) < 0)
                        return -errno;
        }
        return errno > 0 ? -errno : 0;
}

/* cp -al of src_parent/name to dst_parent/name: directories are new, with the
 * same owner, mode, xattrs and times; everything else is a hard link. */
int oci_tree_link_copy(int src_parent, int dst_parent, const char *name) {
        _cleanup_close_ int s = -EBADF, d = -EBADF;
        int r;

        s = openat(src_parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (s < 0)
                return -errno;
        if (mkdirat(dst_parent, name, 0700) < 0)
                return -errno;
        d = openat(dst_parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (d < 0)
                return -errno;
        r = link_children(s, d);
        if (r < 0)
                return r;
        return copy_dir_meta(s, d);
}

/* A new file name under dirfd (whatever was there is removed) with content. */
static int write_new_file(int dirfd, const char *name, int src, const char *data, size_t len, mode_t mode) {
        _cleanup_close_ int fd = -EBADF;
        int r;

        r = oci_rm_rf_at(dirfd, name);
        if (r < 0)
                return r;
        fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        if (src >= 0) {
                char buf[65536];
                ssize_t n;

                while ((n = loop_read(src, buf, sizeof(buf))) > 0) {
                        r = loop_write(fd, buf, (size_t) n);
                        if (r < 0)
                                return r;
                }
                if (n < 0)
                        return (int) n;
        } else {
                r = loop_write(fd, data, len);
                if (r < 0)
                        return r;
        }
        if (fchown(fd, 0, 0) < 0 && (geteuid() == 0 || errno != EPERM))
                return -errno;
        return fchmod(fd, mode) < 0 ? -errno : 0;
}

static json_object *strv_to_json(char **l) {
        json_object *a = json_object_new_array();

        for (char **s = l; a && s && *s; s++)
                json_object_array_add(a, json_object_new_string(*s));
        return a;
}

json_object *oci_config_to_json(const OciConfig *c) {
        json_object *o = json_object_new_object();

        if (!o)
                return NULL;
        json_object_object_add(o, "env", strv_to_json(c->env));
        json_object_object_add(o, "working_dir", json_object_new_string(c->working_dir ?: ""));
        json_object_object_add(o, "user", json_object_new_string(c->user ?: ""));
        json_object_object_add(o, "entrypoint", strv_to_json(c->entrypoint));
        json_object_object_add(o, "cmd", strv_to_json(c->cmd));
        json_object_object_add(o, "start_cmd", json_object_new_boolean(c->start_cmd));
        return o;
}

int oci_tree_install_guest(int root, const char *agent_path, const OciConfig *c) {
        static const struct {
                const char *name;
                mode_t mode;
        } mounts[] = {
                { "proc", 0555 }, { "sys", 0555 }, { "dev", 0755 },
                { "tmp", 01777 }, { "run", 0755 }, { "root", 0700 },
        };
        _cleanup_close_ int dir = -EBADF, agent = -EBADF;
        json_object *j;
        const char *s;
        struct stat st;
        int r;

        for (size_t i = 0; i < ELEMENTSOF(mounts); i++) {
                if (fstatat(root, mounts[i].name, &st, AT_SYMLINK_NOFOLLOW) >= 0)
                        continue;
                if (errno != ENOENT)
                        return oci_fail(-errno, "Cannot look at /%s of the tree: %m", mounts[i].name);
                if (mkdirat(root, mounts[i].name, 0700) < 0 || fchmodat(root, mounts[i].name, mounts[i].mode, 0) < 0)
                        return oci_fail(-errno, "Cannot make /%s in the tree: %m", mounts[i].name);
        }

        if (fstatat(root, ".forkd", &st, AT_SYMLINK_NOFOLLOW) >= 0 && !S_ISDIR(st.st_mode)) {
                r = oci_rm_rf_at(root, ".forkd");
                if (r < 0)
                        return oci_fail(r, "Cannot replace /.forkd in the tree: %s", strerror(-r));
        }
        if (mkdirat(root, ".forkd", 0755) < 0 && errno != EEXIST)
                return oci_fail(-errno, "Cannot make /.forkd in the tree: %m");
        dir = openat(root, ".forkd", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dir < 0)
                return oci_fail(-errno, "Cannot open /.forkd in the tree: %m");
        if ((fchown(dir, 0, 0) < 0 && (geteuid() == 0 || errno != EPERM)) || fchmod(dir, 0755) < 0)
                return oci_fail(-errno, "Cannot set the owner of /.forkd: %m");

        agent = open(agent_path, O_RDONLY | O_CLOEXEC);
        if (agent < 0 || fstat(agent, &st) < 0)
                return oci_fail(-errno, "Cannot open the agent %s: %m", agent_path);
        if (!S_ISREG(st.st_mode))
                return oci_fail(-EINVAL, "The agent %s is not a regular file", agent_path);
        r = write_new_file(dir, "forkd-agent", agent, NULL, 0, 0755);
        if (r < 0)
                return oci_fail(r, "Cannot install the agent: %s", strerror(-r));

        j = oci_config_to_json(c);
        if (!j)
                return -ENOMEM;
        s = json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        r = write_new_file(dir, "image.json", -EBADF, s, strlen(s), 0644);
        json_object_put(j);
        return r < 0 ? oci_fail(r, "Cannot write /.forkd/image.json: %s", strerror(-r)) : 0;
}

/* ---- size: as du --apparent-size -b counts it, a hard-linked inode once ---- */

typedef struct InodeKey {
        dev_t dev;
        ino_t ino;
} InodeKey;

static int cmp_inode(const void *a, const void *b) {
        const InodeKey *x = a, *y = b;

        if (x->dev != y->dev)
                return x->dev < y->dev ? -1 : 1;
        return x->ino < y->ino ? -1 : x->ino > y->ino ? 1 : 0;
}

static int count_dir(int dfd, void **seen, uint64_t *total) {
        _cleanup_(closedirp) DIR *d = NULL;
        struct dirent *de;
        int fd, r;

        fd = fcntl(dfd, F_DUPFD_CLOEXEC, 3);
        if (fd < 0)
                return -errno;
        d = fdopendir(fd);
        if (!d) {
                safe_close(fd);
                return -errno;
        }
        while ((errno = 0, de = readdir(d))) {
                struct stat st;

                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        return -errno;
                if (st.st_nlink > 1 && !S_ISDIR(st.st_mode)) {
                        InodeKey *k = malloc(sizeof(*k)), **slot;

                        if (!k)
                                return -ENOMEM;
                        *k = (InodeKey) { st.st_dev, st.st_ino };
                        slot = tsearch(k, seen, cmp_inode);
                        if (!slot) {
                                free(k);
                                return -ENOMEM;
                        }
                        if (*slot != k) {
                                free(k);
                                continue;
                        }
                }
                *total += (uint64_t) st.st_size;
                if (S_ISDIR(st.st_mode)) {
                        _cleanup_close_ int sub = openat(dfd, de->d_name,
                                                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (sub < 0)
                                return -errno;
                        r = count_dir(sub, seen, total);
                        if (r < 0)
                                return r;
                }
        }
        return errno > 0 ? -errno : 0;
}

int oci_tree_bytes(int root, uint64_t *ret) {
        void *seen = NULL;
        struct stat st;
        uint64_t total;
        int r;

        if (fstat(root, &st) < 0)
                return -errno;
        total = (uint64_t) st.st_size;
        r = count_dir(root, &seen, &total);
        tdestroy(seen, free);
        if (r >= 0)
                *ret = total;
        return r;
}

/* ---- the file system ---- */

static void last_line(const char *log_path, char *buf, size_t size) {
        _cleanup_free_ char *text = NULL;
        char *end, *start;

        buf[0] = 0;
        if (read_file_capped_at(AT_FDCWD, log_path, 1 << 20, &text, NULL) < 0)
                return;
        end = text + strlen(text);
        while (end > text && (end[-1] == '\n' || end[-1] == ' '))
                *--end = 0;
        start = strrchr(text, '\n');
        snprintf(buf, size, "%s", start ? start + 1 : text);
}

int oci_mkfs(const char *tree_path, const char *work_path, const char *out_path, uint64_t tree_bytes) {
        _cleanup_free_ char *conf = NULL, *log = NULL;
        _cleanup_close_ int fd = -EBADF;
        char size_arg[32], line[512];
        uint64_t size_mib = (tree_bytes / 2 * 3) / (1024 * 1024) + 64;
        int status, r;
        pid_t pid;

        if (asprintf(&conf, "%s/mke2fs.conf", work_path) < 0 || asprintf(&log, "%s/mke2fs.log", work_path) < 0)
                return -ENOMEM;
        fd = open(conf, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0)
                return oci_fail(-errno, "Cannot write %s: %m", conf);
        r = loop_write(fd, mke2fs_conf, strlen(mke2fs_conf));
        if (r < 0)
                return oci_fail(r, "Cannot write %s: %s", conf, strerror(-r));
        fd = safe_close(fd);
        snprintf(size_arg, sizeof(size_arg), "%" PRIu64 "M", size_mib);
        /* A new file, all holes: mke2fs need not write zeros into its inode tables and
         * journal (assume_storage_prezeroed), and they stay holes. */
        if (unlink(out_path) < 0 && errno != ENOENT)
                return oci_fail(-errno, "Cannot remove %s: %m", out_path);

        pid = fork();
        if (pid < 0)
                return oci_fail(-errno, "Cannot start mke2fs: %m");
        if (pid == 0) {
                char *argv[] = {
                        (char *) "mke2fs", (char *) "-q", (char *) "-F", (char *) "-t", (char *) "ext4",
                        (char *) "-L", (char *) "forkd-root", (char *) "-m", (char *) "0",
                        (char *) "-E",
                        (char *) "root_owner=0:0,lazy_itable_init=0,nodiscard,assume_storage_prezeroed=1",
                        (char *) "-d", (char *) tree_path, (char *) out_path, size_arg, NULL,
                };
                int out = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

                if (out < 0 || dup2(out, STDOUT_FILENO) < 0 || dup2(out, STDERR_FILENO) < 0)
                        _exit(127);
                setenv("MKE2FS_CONFIG", conf, 1);
                execvp("mke2fs", argv);
                execv("/usr/sbin/mke2fs", argv);
                execv("/sbin/mke2fs", argv);
                fprintf(stderr, "cannot run mke2fs: %m\n");
                _exit(127);
        }
        while (waitpid(pid, &status, 0) < 0) {
                if (errno != EINTR)
                        return oci_fail(-errno, "Cannot wait for mke2fs: %m");
                if (oci_interrupted)
                        (void) kill(pid, SIGTERM); /* and wait for it: then the output goes */
        }
        r = oci_check_interrupted();
        if (r < 0)
                return r;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                last_line(log, line, sizeof(line));
                return oci_fail(-EIO, "mke2fs failed: %s", line[0] ? line : "no message");
        }
        return 0;
}
