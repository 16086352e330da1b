/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/statfs.h>

#include "cgroup-detect.h"
#include "macro.h"

int cgroup_fs_type(const char *path, long *ret) {
        struct statfs sfs;

        if (statfs(path, &sfs) < 0)
                return -errno;
        *ret = (long) sfs.f_type;
        return 0;
}

static bool v2_has_memory(const char *dir) {
        _cleanup_close_ int fd = -EBADF;
        char path[4200], buf[4096];
        ssize_t n;

        snprintf(path, sizeof(path), "%s/cgroup.controllers", dir);
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return false;
        n = read(fd, buf, sizeof(buf) - 1);
        if (n <= 0)
                return false;
        buf[n] = 0;
        for (char *save = NULL, *t = strtok_r(buf, " \n", &save); t; t = strtok_r(NULL, " \n", &save))
                if (strcmp(t, "memory") == 0)
                        return true;
        return false;
}

/* Which cgroupfs version holds dir (or its nearest existing ancestor)? */
static int detect_version(const char *dir, int *ret) {
        char p[4096];
        long type = 0;

        if (strlen(dir) >= sizeof(p))
                return -ENAMETOOLONG;
        strcpy(p, dir);
        for (;;) {
                if (cgroup_fs_type(p, &type) >= 0)
                        break;
                char *slash = strrchr(p, '/');
                if (!slash || slash == p)
                        return -ENOENT;
                *slash = 0;
        }
        if (type == CGROUP2_SUPER_MAGIC)
                *ret = 2;
        else if (type == CGROUP_SUPER_MAGIC)
                *ret = 1;
        else
                return -ENOTDIR;
        return 0;
}

int cgroup_detect(const char *root, CGroupDetection *ret) {
        CGroupDetection d = {};
        long type = 0;
        int r;

        d.systemd = access("/run/systemd/system", F_OK) >= 0;
        d.v2_memory = cgroup_fs_type("/sys/fs/cgroup", &type) >= 0 && type == CGROUP2_SUPER_MAGIC &&
                      v2_has_memory("/sys/fs/cgroup");
        d.v1_memory = cgroup_fs_type("/sys/fs/cgroup/memory", &type) >= 0 && type == CGROUP_SUPER_MAGIC;

        if (root) {
                if (strlen(root) >= sizeof(d.root))
                        return -ENAMETOOLONG;
                r = detect_version(root, &d.version);
                if (r < 0)
                        return r;
                d.kind = CGROUP_BACKEND_CGROUPFS;
                strcpy(d.root, root);
        } else if (d.systemd && d.v2_memory) {
                d.kind = CGROUP_BACKEND_SCOPE;
                d.version = 2;
        } else if (d.systemd && d.v1_memory) {
                /* systemd on a hybrid or legacy layout: MemoryMax= lands in the v1 memory hierarchy. */
                d.kind = CGROUP_BACKEND_SCOPE;
                d.version = 1;
        } else if (d.v2_memory) {
                d.kind = CGROUP_BACKEND_CGROUPFS;
                d.version = 2;
                strcpy(d.root, "/sys/fs/cgroup/forkd");
        } else if (d.v1_memory) {
                d.kind = CGROUP_BACKEND_CGROUPFS;
                d.version = 1;
                strcpy(d.root, "/sys/fs/cgroup/memory/forkd");
        } else
                d.kind = CGROUP_BACKEND_NONE;
        *ret = d;
        return 0;
}

const char *cgroup_backend_kind_to_string(CGroupBackendKind k) {
        switch (k) {
        case CGROUP_BACKEND_CGROUPFS: return "cgroupfs";
        case CGROUP_BACKEND_SCOPE: return "systemd-scope";
        default: return "none";
        }
}
