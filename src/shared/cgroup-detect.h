/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Which memory backend forkd uses on this host, read only: nothing is created
 * or written. forkd's CGroupManager (src/daemon/cgroup.c) and the doctor
 * (src/shared/doctor*.c) both decide with this, so they cannot disagree.
 */

#include <stdbool.h>

typedef enum CGroupBackendKind {
        CGROUP_BACKEND_NONE,
        CGROUP_BACKEND_CGROUPFS,   /* <root>/<id>/memory.max or memory.limit_in_bytes */
        CGROUP_BACKEND_SCOPE,      /* systemd transient scopes with MemoryMax= */
} CGroupBackendKind;

typedef struct CGroupDetection {
        CGroupBackendKind kind;
        int version;               /* 1 or 2: the hierarchy holding the memory controller; 0 for none */
        char root[4096];           /* cgroupfs: the directory holding one cgroup per sandbox */
        bool systemd;              /* systemd is PID 1 (/run/systemd/system exists) */
        bool v2_memory;            /* /sys/fs/cgroup is cgroup2 with the memory controller */
        bool v1_memory;            /* /sys/fs/cgroup/memory is a v1 memory hierarchy */
} CGroupDetection;

/* root: an explicit cgroupfs directory (forkd --cgroup-root), or NULL to choose:
 * systemd scopes where systemd is PID 1 and memory is controlled (v2, else v1),
 * else cgroupfs v2 /sys/fs/cgroup/forkd, else v1 /sys/fs/cgroup/memory/forkd, else
 * none. -ENOTDIR/-ENOENT: root given but not on a cgroup file system; -ENAMETOOLONG. */
int cgroup_detect(const char *root, CGroupDetection *ret);

const char *cgroup_backend_kind_to_string(CGroupBackendKind k);

/* The file system type (statfs's f_type: CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, ...)
 * that holds path. */
int cgroup_fs_type(const char *path, long *ret);
