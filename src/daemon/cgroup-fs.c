/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The cgroupfs backend: one cgroup per sandbox under the root directory, with
 * memory.max and cpu.max (v2) or memory.limit_in_bytes (v1), and a fork
 * template's tpl-<pid> cgroup next to them. On v1, cpu_limit is
 * cpu.cfs_quota_us in a cgroup of the same name in the cpu hierarchy
 * (c->cpu_root, made for every sandbox that has a cgroup, so that a limit can
 * come later), which forkd moves the VMM into once it runs. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <linux/magic.h>
#include <unistd.h>

#include "cgroup-backend.h"
#include "cgroup-detect.h"
#include "fs-util.h"
#include "macro.h"
#include "fork-options.h"
#include "snapshot-meta.h"

/* tpl-<digits>: a fork template's cgroup (cgroup_template_join()). */
static bool is_template_cgroup(const char *name) {
        const char *pid;

        if (strncmp(name, TEMPLATE_CGROUP_PREFIX, strlen(TEMPLATE_CGROUP_PREFIX)) != 0)
                return false;
        pid = name + strlen(TEMPLATE_CGROUP_PREFIX);
        return *pid && strspn(pid, "0123456789") == strlen(pid);
}

static bool is_cgroup_v1(const char *path) {
        long type;

        return cgroup_fs_type(path, &type) >= 0 && type == CGROUP_SUPER_MAGIC;
}

/* v1: the cpu hierarchy's counterpart of root (a directory in the memory
 * hierarchy): the memory hierarchy's mount point is root's topmost cgroupfs
 * ancestor, and the cpu one is "cpu" beside it (cpu,cpuacct where the two are
 * mounted together, through the usual link). *ret NULL: memory's own
 * hierarchy holds cpu. -EOPNOTSUPP: no cpu hierarchy. */
static int v1_cpu_root(const char *root, char **ret) {
        char mount[PATH_MAX], cpu[PATH_MAX + 8], file[PATH_MAX + 32];
        const char *rel;
        char *slash;

        if (strlen(root) >= sizeof(mount) || root[0] != '/')
                return -EINVAL;
        strcpy(mount, root);
        /* up while the parent is cgroupfs too; root itself may not exist yet */
        for (;;) {
                slash = strrchr(mount, '/');
                if (!slash || slash == mount)
                        return -EOPNOTSUPP;
                *slash = 0;
                if (is_cgroup_v1(mount)) {
                        char parent[PATH_MAX];

                        strcpy(parent, mount);
                        *strrchr(parent, '/') = 0;
                        if (!is_cgroup_v1(*parent ? parent : "/"))
                                break;
                }
        }
        snprintf(file, sizeof(file), "%s/cpu.cfs_quota_us", mount);
        if (access(file, F_OK) >= 0) {
                *ret = NULL;
                return 0;
        }
        rel = root + strlen(mount);
        slash = strrchr(mount, '/');
        *slash = 0;
        snprintf(cpu, sizeof(cpu), "%s/cpu", mount);
        snprintf(file, sizeof(file), "%s/cpu.cfs_quota_us", cpu);
        if (!is_cgroup_v1(cpu) || access(file, F_OK) < 0)
                return -EOPNOTSUPP;
        if (asprintf(ret, "%s%s", cpu, rel) < 0)
                return -ENOMEM;
        return 0;
}

static int cgroupfs_init(CGroupManager *c) {
        char path[4096];
        int r;

        r = mkdir_parents_and_self(c->root, 0755);
        if (r < 0)
                return log_debug_errno(r, "Failed to create cgroup %s: %m", c->root);
        if (c->version == 2) {
                /* The sandboxes' cgroups need the memory controller from their parent. */
                snprintf(path, sizeof(path), "%s/cgroup.subtree_control", c->root);
                r = cgroup_write_string_file(path, "+memory");
                if (r < 0)
                        return log_debug_errno(r, "Failed to enable the memory controller in %s: %m", c->root);
                /* And cpu for cpu_limit, where the parent hands it down. */
                r = cgroup_write_string_file(path, "+cpu");
                if (r < 0)
                        log_info_errno(r, "cpu_limit is not available: cannot enable the cpu controller in %s: %m",
                                       c->root);
                c->cpu = r >= 0;
        } else {
                r = v1_cpu_root(c->root, &c->cpu_root);
                if (r >= 0 && c->cpu_root) {
                        r = mkdir_parents_and_self(c->cpu_root, 0755);
                        if (r < 0) {
                                log_info_errno(r, "cpu_limit is not available: cannot create the cgroup %s: %m",
                                               c->cpu_root);
                                free(c->cpu_root);
                                c->cpu_root = NULL;
                        }
                } else if (r == -EOPNOTSUPP)
                        log_info("cpu_limit is not available: no cgroup v1 cpu hierarchy beside %s.", c->root);
                else if (r < 0)
                        log_info_errno(r, "cpu_limit is not available beside %s: %m", c->root);
                c->cpu = r >= 0;
                if (c->cpu)
                        log_info("cpu_limit: cgroup v1 cpu.cfs_quota_us under %s.", c->cpu_root ?: c->root);
        }
        return 0;
}

/* Where sandbox id's cpu limit lives: its v2 cgroup, or its v1 cgroup of the
 * cpu hierarchy. */
static void cpu_dir(CGroupManager *c, const char *id, char *buf, size_t size) {
        snprintf(buf, size, "%s/%s", c->cpu_root ?: c->root, id);
}

/* cpus < 0: none. v2: cpu.max, "<quota> <period>" or "max <period>". v1:
 * cpu.cfs_period_us, then cpu.cfs_quota_us (-1: none). */
static int write_cpu_limit(const CGroupManager *c, const char *dir, double cpus) {
        char file[4200], value[64];
        int r;

        if (c->version == 1) {
                snprintf(file, sizeof(file), "%s/cpu.cfs_period_us", dir);
                snprintf(value, sizeof(value), "%u", CPU_LIMIT_PERIOD_USEC);
                r = cgroup_write_string_file(file, value);
                if (r < 0)
                        return r;
                snprintf(file, sizeof(file), "%s/cpu.cfs_quota_us", dir);
                if (cpus < 0)
                        return cgroup_write_string_file(file, "-1");
                snprintf(value, sizeof(value), "%llu", (unsigned long long) cpu_limit_quota_usec(cpus));
                return cgroup_write_string_file(file, value);
        }
        if (cpus < 0)
                snprintf(value, sizeof(value), "max %u", CPU_LIMIT_PERIOD_USEC);
        else
                snprintf(value, sizeof(value), "%llu %u", (unsigned long long) cpu_limit_quota_usec(cpus),
                         CPU_LIMIT_PERIOD_USEC);
        snprintf(file, sizeof(file), "%s/cpu.max", dir);
        return cgroup_write_string_file(file, value);
}

/* v1: the memsw limit must stay >= the memory limit, so which goes first
 * depends on the direction: try memory first, and memsw first if refused. */
static int write_memory_v1(const char *dir, uint64_t limit) {
        char file[4200], memsw[4200], value[32];
        bool has_memsw;
        int r;

        snprintf(value, sizeof(value), "%llu", (unsigned long long) limit);
        snprintf(file, sizeof(file), "%s/memory.limit_in_bytes", dir);
        snprintf(memsw, sizeof(memsw), "%s/memory.memsw.limit_in_bytes", dir);
        has_memsw = access(memsw, F_OK) >= 0; /* absent without swap accounting */
        r = cgroup_write_string_file(file, value);
        if (r >= 0)
                return has_memsw ? cgroup_write_string_file(memsw, value) : 0;
        if (r != -EINVAL || !has_memsw)
                return r;
        r = cgroup_write_string_file(memsw, value);
        return r < 0 ? r : cgroup_write_string_file(file, value);
}

static int cgroupfs_set_limits(CGroupManager *c, const char *id, uint64_t memory_bytes, double cpus) {
        char dir[4096], file[4200], value[32];
        int r;

        snprintf(dir, sizeof(dir), "%s/%s", c->root, id);
        if (access(dir, F_OK) < 0)
                return -errno;
        if (memory_bytes > 0) {
                if (c->version == 2) {
                        snprintf(value, sizeof(value), "%llu", (unsigned long long) memory_bytes);
                        snprintf(file, sizeof(file), "%s/memory.max", dir);
                        r = cgroup_write_string_file(file, value);
                } else
                        r = write_memory_v1(dir, memory_bytes);
                if (r < 0)
                        return r;
        }
        if (cpus != 0) {
                if (!c->cpu)
                        return -EOPNOTSUPP;
                cpu_dir(c, id, dir, sizeof(dir));
                r = write_cpu_limit(c, dir, cpus);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int cgroupfs_remove(CGroupManager *c, const char *id);

static int cgroupfs_prepare(CGroupManager *c, const char *id, uint64_t limit, double cpus,
                            cgroup_prepare_done_t done, void *userdata, char **ret_parent) {
        char dir[4096], file[4200], value[32];
        char *parent;
        int r = 0;

        snprintf(dir, sizeof(dir), "%s/%s", c->root, id);
        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
                return -errno;
        snprintf(value, sizeof(value), "%llu", (unsigned long long) limit);
        if (limit == 0)
                ; /* cpu_limit only */
        else if (c->version == 2) {
                snprintf(file, sizeof(file), "%s/memory.max", dir);
                r = cgroup_write_string_file(file, value);
                if (r >= 0) {
                        /* No swap either, so that the limit is the limit. Optional. */
                        snprintf(file, sizeof(file), "%s/memory.swap.max", dir);
                        (void) cgroup_write_string_file(file, "0");
                }
        } else {
                snprintf(file, sizeof(file), "%s/memory.limit_in_bytes", dir);
                r = cgroup_write_string_file(file, value);
                if (r >= 0) {
                        /* memsw must be >= the memory limit, so it comes second. Absent without swap accounting. */
                        snprintf(file, sizeof(file), "%s/memory.memsw.limit_in_bytes", dir);
                        if (access(file, F_OK) >= 0)
                                r = cgroup_write_string_file(file, value);
                }
        }
        if (r >= 0 && c->cpu_root) {
                /* its cgroup in the cpu hierarchy, limited or not, for a later limit too */
                char cdir[4096];

                cpu_dir(c, id, cdir, sizeof(cdir));
                if (mkdir(cdir, 0755) < 0 && errno != EEXIST)
                        r = -errno;
                else if (cpus > 0 && (r = write_cpu_limit(c, cdir, cpus)) < 0)
                        (void) rmdir(cdir);
        } else if (r >= 0 && cpus > 0)
                r = write_cpu_limit(c, dir, cpus);
        if (r < 0) {
                (void) rmdir(dir);
                return r;
        }
        parent = strdup(c->root);
        if (!parent) {
                (void) cgroupfs_remove(c, id);
                return -ENOMEM;
        }
        *ret_parent = parent;
        return 1;
}

/* v1: the VMM into its cgroup of the cpu hierarchy (cgroup.procs moves all
 * its threads; the ones it makes later are born there). */
static void cgroupfs_attached(CGroupManager *c, const char *id, pid_t pid) {
        char dir[4096], file[4200], value[32];
        int r;

        if (!c->cpu_root)
                return;
        cpu_dir(c, id, dir, sizeof(dir));
        snprintf(file, sizeof(file), "%s/cgroup.procs", dir);
        snprintf(value, sizeof(value), "%d", (int) pid);
        r = cgroup_write_string_file(file, value);
        if (r < 0 && r != -ENOENT && r != -ESRCH)
                log_warning_errno(r, "Failed to move the VMM of %s (%d) into %s: %m", id, (int) pid, dir);
}

static int cgroupfs_oom_kills(CGroupManager *c, const char *id, uint64_t *ret) {
        char path[4200];

        snprintf(path, sizeof(path), "%s/%s/%s", c->root, id, c->version == 2 ? "memory.events" : "memory.oom_control");
        return cgroup_read_oom_kill_file(path, ret);
}

static int cgroupfs_remove(CGroupManager *c, const char *id) {
        char dir[4096];
        int r = 0;

        if (c->cpu_root) {
                cpu_dir(c, id, dir, sizeof(dir));
                r = cgroup_remove_dir(c, dir);
        }
        snprintf(dir, sizeof(dir), "%s/%s", c->root, id);
        int k = cgroup_remove_dir(c, dir);
        return r < 0 ? r : k;
}

static int sweep_dir(CGroupManager *c, const char *root) {
        DIR *d = opendir(root);
        struct dirent *de;
        int r = 0;

        if (!d)
                return errno == ENOENT ? 0 : -errno;
        while ((de = readdir(d))) {
                char dir[4096];

                /* Only what looks like ours: sandbox ids are sb-<hex>-<digits>, templates tpl-<pid>. */
                if (de->d_type != DT_DIR ||
                    !((strncmp(de->d_name, "sb-", 3) == 0 && snapshot_tag_is_valid(de->d_name)) ||
                      is_template_cgroup(de->d_name)))
                        continue;
                snprintf(dir, sizeof(dir), "%s/%s", root, de->d_name);
                log_info("Removing stale cgroup %s.", dir);
                int k = cgroup_remove_dir(c, dir);
                if (k < 0 && r == 0)
                        r = k;
        }
        closedir(d);
        return r;
}

static int cgroupfs_sweep(CGroupManager *c) {
        int r = sweep_dir(c, c->root);

        if (c->cpu_root) {
                int k = sweep_dir(c, c->cpu_root);
                if (r == 0)
                        r = k;
        }
        return r;
}

/* A fork template's cgroup: <root>/tpl-<pid>, made and joined here. */
static int cgroupfs_template_join(CGroupManager *c, pid_t pid) {
        char dir[4096], file[4200], value[32];
        int r;

        snprintf(dir, sizeof(dir), "%s/" TEMPLATE_CGROUP_PREFIX "%d", c->root, (int) pid);
        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
                return -errno;
        snprintf(file, sizeof(file), "%s/cgroup.procs", dir);
        snprintf(value, sizeof(value), "%d", (int) pid);
        r = cgroup_write_string_file(file, value);
        if (r < 0)
                (void) rmdir(dir);
        return r;
}

static int cgroupfs_template_remove(CGroupManager *c, pid_t pid) {
        char name[32];

        snprintf(name, sizeof(name), TEMPLATE_CGROUP_PREFIX "%d", (int) pid);
        return cgroupfs_remove(c, name);
}

const CGroupBackend cgroup_backend_cgroupfs = {
        .name = "cgroupfs",
        .init = cgroupfs_init,
        .prepare = cgroupfs_prepare,
        .set_limits = cgroupfs_set_limits,
        .attached = cgroupfs_attached,
        .oom_kills = cgroupfs_oom_kills,
        .remove = cgroupfs_remove,
        .sweep = cgroupfs_sweep,
        .template_join = cgroupfs_template_join,
        .template_remove = cgroupfs_template_remove,
};
