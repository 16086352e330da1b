/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The inside of cgroup.h: the table of functions each backend fills in, the
 * manager state they share, and the helpers of the front end (cgroup.c) and of
 * the OOM accounting (cgroup-oom.c) that the backends call. One file per
 * backend: cgroup-fs.c (cgroupfs v2 and v1), cgroup-systemd.c (transient
 * scopes); "none" is the empty table in cgroup.c.
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include "cgroup.h"

/* A fork template's cgroup is tpl-<pid> (cgroupfs), its scope forkd-tpl-<pid>.scope. */
#define TEMPLATE_CGROUP_PREFIX "tpl-"

typedef struct CGroupBackend {
        const char *name;
        int (*init)(CGroupManager *c);
        void (*done)(CGroupManager *c);
        /* 1 and *ret_parent: ready now; 0: done() follows (unless cancelled); < 0: failed. */
        int (*prepare)(CGroupManager *c, const char *id, uint64_t limit_bytes, double cpus,
                       cgroup_prepare_done_t done, void *userdata, char **ret_parent);
        /* cgroup_set_limits(); NULL: -EOPNOTSUPP. */
        int (*set_limits)(CGroupManager *c, const char *id, uint64_t memory_bytes, double cpus);
        /* Forget the pending prepares made with this userdata. */
        void (*cancel)(CGroupManager *c, void *userdata);
        /* cgroup_attached() */
        void (*attached)(CGroupManager *c, const char *id, pid_t pid);
        int (*oom_kills)(CGroupManager *c, const char *id, uint64_t *ret);
        /* Remove, retrying in the background while the cgroup holds dying tasks. */
        int (*remove)(CGroupManager *c, const char *id);
        /* At start: remove what a previous daemon left. */
        int (*sweep)(CGroupManager *c);
        /* A fork template's own cgroup (cgroup_template_join()), and its removal
         * once it is gone (none where the backend's owner collects it). */
        int (*template_join)(CGroupManager *c, pid_t pid);
        int (*template_remove)(CGroupManager *c, pid_t pid);
} CGroupBackend;

struct cgroup_removal;
struct scope_unit;

struct CGroupManager {
        const CGroupBackend *backend;
        sd_event *event;
        char *root;     /* cgroupfs: directory holding one cgroup per sandbox */
        int version;    /* cgroupfs: 1 or 2 */
        bool cpu;       /* cpu_limit can be set (cgroup_manager_cpu_supported()) */
        /* cgroupfs v1 with cpu: the cpu hierarchy's directory of sandbox cgroups;
         * NULL on v2, without cpu, or where cpu is mounted with memory (root's
         * cgroups hold both) */
        char *cpu_root;

        struct cgroup_removal *removals;
        unsigned n_removals;
        sd_event_source *removal_timer;

        /* systemd-scope */
        sd_bus *system_bus;
        sd_bus_slot *job_removed_slot;
        struct scope_unit *units;
        /* cgroup v2: oom_kill of forkd.slice (hierarchical) already accounted to
         * exited sandboxes, for a scope whose cgroup systemd removed first. */
        uint64_t slice_ooms;
        bool slice_ooms_known;
};

extern const CGroupBackend cgroup_backend_cgroupfs;     /* cgroup-fs.c */
extern const CGroupBackend cgroup_backend_scope;        /* cgroup-systemd.c */

/* cgroup.c */
/* s to an existing file (a cgroup's control file): 0 or -errno. */
int cgroup_write_string_file(const char *path, const char *s);
/* Whether the comma-separated controller list (a /proc/<pid>/cgroup field) has name. */
bool cgroup_controllers_have(const char *list, const char *name);
/* rmdir now, or keep retrying from the event loop while tasks are dying. */
int cgroup_remove_dir(CGroupManager *c, const char *path);

/* cgroup-oom.c */
/* The oom_kill count of memory.events or memory.oom_control at path. */
int cgroup_read_oom_kill_file(const char *path, uint64_t *ret);
/* memory.events of the directory that holds the scope's cgroup (forkd.slice). */
int cgroup_slice_oom_kills(const char *scope_cgroup, uint64_t *ret);
