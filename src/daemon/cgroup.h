/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Per-sandbox memory and cpu limits, behind a small table of backends (cgroup-backend.h;
 * cgroup-fs.c, cgroup-systemd.c):
 *
 *   cgroupfs-v2   <root>/<id>/memory.max, <root>/<id>/cpu.max
 *   cgroupfs-v1   <root>/<id>/memory.limit_in_bytes (+ memory.memsw.limit_in_bytes), and
 *                 <cpu root>/<id>/cpu.cfs_quota_us in the cpu hierarchy beside it, which
 *                 forkd moves the VMM into (cgroup_attached())
 *   systemd-scope a transient scope forkd-<id>.scope (MemoryMax=, CPUQuota=, Delegate=yes)
 *                 started with StartTransientUnit and tracked through JobRemoved;
 *                 the VMM child joins the sub-cgroup <scope>/<id>
 *   none          every call -EOPNOTSUPP
 *
 * The VMM child of sandbox id joins "<parent>/<id>" before it restores, where
 * parent is what prepare() hands back.
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

typedef struct CGroupManager CGroupManager;

typedef void (*cgroup_prepare_done_t)(int r, const char *id, const char *parent, void *userdata);

/* root: an explicit cgroupfs directory (--cgroup-root), or NULL to choose:
 * the systemd scope backend when systemd is PID 1 on a unified hierarchy,
 * else cgroupfs v2 /sys/fs/cgroup/forkd, else v1 /sys/fs/cgroup/memory/forkd,
 * else none. */
int cgroup_manager_new(sd_event *e, const char *root, CGroupManager **ret);
CGroupManager *cgroup_manager_free(CGroupManager *c);

bool cgroup_manager_supported(const CGroupManager *c);
const char *cgroup_manager_name(const CGroupManager *c);

/* limit_bytes: the memory limit (0: none); cpus: cpu_limit (0: none; needs
 * cgroup_manager_cpu_supported()). */
int cgroup_prepare(CGroupManager *c, const char *id, uint64_t limit_bytes, double cpus, cgroup_prepare_done_t done,
                   void *userdata, char **ret_parent);
/* Whether a sandbox's cgroup can hold cpu_limit: cgroupfs v2 with the cpu
 * controller, cgroupfs v1 with a cpu hierarchy mounted beside the memory one
 * (cpu.cfs_quota_us), or systemd scopes (CPUQuota=). */
bool cgroup_manager_cpu_supported(const CGroupManager *c);
/* Change the limits of a sandbox's cgroup while it runs: memory_bytes 0
 * leaves the memory limit, cpus 0 the cpu limit, cpus < 0 removes it.
 * cgroupfs writes the files now; systemd-scope asks systemd to
 * (SetUnitProperties, runtime), which applies them right after. */
int cgroup_set_limits(CGroupManager *c, const char *id, uint64_t memory_bytes, double cpus);
void cgroup_cancel(CGroupManager *c, void *userdata);
/* The sandbox id's VMM pid is running: cgroupfs v1 moves it into its cgroup
 * of the cpu hierarchy (the memory one it joined itself before it restored),
 * systemd-scope marks the scope as populated. Called as soon as the VMM is
 * there and again once it answered; each call may repeat. */
void cgroup_attached(CGroupManager *c, const char *id, pid_t pid);
/* The cpu.stat of sandbox id's cgroup where the backend knows it without
 * asking /proc (cgroupfs v1's cpu hierarchy): a new string, or -ENOENT. */
int cgroup_cpu_stat_path(CGroupManager *c, const char *id, char **ret);
int cgroup_oom_kills(CGroupManager *c, const char *id, uint64_t *ret);
int cgroup_remove(CGroupManager *c, const char *id);
int cgroup_sweep(CGroupManager *c);
/* Move pid (a sandbox VMM's frozen copy: a branch writer or a fork template)
 * out of the sandbox's cgroup into forkd's own, in every hierarchy where
 * sandboxes get cgroups, so that it outlives the sandbox and does not keep its
 * cgroup busy. Returns how many hierarchies it moved in. */
int cgroup_detach(CGroupManager *c, pid_t pid);
/* The fork template pid gets a cgroup of its own before it forks anything; its
 * children without a memory limit stay in it. cgroupfs: <root>/tpl-<pid>, made
 * and joined here; systemd-scope: a transient forkd-tpl-<pid>.scope in
 * forkd.slice, started on a bus connection of its own, returning once the pid is
 * in it (a synchronous D-Bus call: not from the main loop). Changes nothing in c:
 * safe from a worker thread. -EOPNOTSUPP without memory limits (backend none:
 * the template stays in forkd's cgroup). */
int cgroup_template_join(CGroupManager *c, pid_t pid);
/* Once template pid is gone (main thread): its cgroup goes, retried while its
 * children are still dying (cgroupfs; systemd collects an empty scope itself). */
int cgroup_template_remove(CGroupManager *c, pid_t pid);
/* Removals still being retried. */
unsigned cgroup_pending_removals(const CGroupManager *c);

/* Parse the "oom_kill N" line of memory.events (v2) or memory.oom_control (v1). */
int cgroup_parse_oom_kill(const char *text, uint64_t *ret);

/* The OOM kills to report for one exited sandbox: its own cgroup's count when
 * that could be read (direct_ok); else, when its cgroup is gone already (systemd
 * removes an empty scope's cgroup, which can happen before forkd reads it), one
 * kill if the parent's hierarchical count (slice_now, when slice_ok) is above
 * what earlier exits accounted for. *accounted follows both. */
uint64_t cgroup_attribute_ooms(uint64_t *accounted, bool direct_ok, uint64_t direct, bool slice_ok,
                               uint64_t slice_now);
