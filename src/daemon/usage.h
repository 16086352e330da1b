/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * What a sandbox uses: its VMM's CPU time and memory (from its cgroup or
 * /proc), and its devices' counters (the stats page it shares with forkd,
 * vmm-stats.h). Each figure is cheap to read: one small file or a copy of a
 * page, never smaps, never a request to the VMM.
 */

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "vmm-stats.h"

typedef struct SandboxUsage {
        bool have_cpu, have_memory, have_stats, have_cpu_throttled;
        uint64_t cpu_usec;
        uint64_t memory_private_kib;    /* anonymous resident: what this VM alone costs */
        uint64_t memory_shared_kib;     /* file-backed resident: the snapshot's pages in the page cache */
        uint64_t cpu_throttled_usec;
        struct vmm_stats stats;         /* a copy, with have_stats */
} SandboxUsage;

/* A stats page for one VMM: a sealed memfd of VMM_STATS_SIZE (sent to the VMM)
 * and forkd's read-only mapping of it. Safe from a worker thread. */
int usage_stats_page_new(int *ret_fd, const struct vmm_stats **ret_map);
/* Unmap a page of usage_stats_page_new(). Accepts NULL, returns NULL. */
const struct vmm_stats *usage_stats_page_free(const struct vmm_stats *map);
/* A copy of the counters, if the VMM stamped the page: 0, or -ENODATA. */
int usage_stats_read(const struct vmm_stats *map, struct vmm_stats *ret);

/* "usage_usec N" and "throttled_usec N" of a cgroup v2 cpu.stat, or v1's
 * "throttled_time N" (ns) for the throttled time; any pointer may be NULL.
 * -ENODATA when usage_usec is missing (v1), the throttled time set still. */
int usage_parse_cpu_stat(const char *text, uint64_t *ret_usage, bool *ret_have_throttled, uint64_t *ret_throttled);
/* The CPU-time clock of process pid (every thread's time), for clock_gettime(). */
clockid_t usage_process_cpu_clock(pid_t pid);
/* resident and shared of /proc/PID/statm, in pages. */
int usage_parse_statm(const char *text, uint64_t *ret_resident, uint64_t *ret_shared);
/* The cgroup v2 path of a "0::<path>" line of /proc/PID/cgroup into a new string. */
int usage_parse_proc_cgroup(const char *text, char **ret);

/* The files a sandbox's usage is read from, kept open between reads (each fd
 * -EBADF until then), for the VMM pid they were opened for. */
typedef struct UsageFiles {
        int cpu_stat_fd, statm_fd;
        pid_t pid;
} UsageFiles;
#define USAGE_FILES_INIT ((UsageFiles) { .cpu_stat_fd = -EBADF, .statm_fd = -EBADF })
void usage_files_close(UsageFiles *f);

/* Read what pid uses. cpu_stat_path: its own cgroup's cpu.stat, or NULL
 * (then its process CPU clock). stats: its page, or NULL. files: where the
 * files it opens stay open for the next read (another pid closes them first),
 * or NULL (opened and closed each time). Fields it could not read stay unset
 * (their have_ false). */
void usage_read(pid_t pid, const char *cpu_stat_path, const struct vmm_stats *stats, UsageFiles *files,
                SandboxUsage *ret);
/* The cpu.stat of the cgroup v2 pid is in ("/sys/fs/cgroup<path>/cpu.stat") into a new string,
 * if that cgroup is named leaf (the sandbox's own); else -ENOENT (on a host
 * whose v2 hierarchy is not the one forkd limits, pid shares its v2 cgroup). */
int usage_cpu_stat_path(pid_t pid, const char *leaf, char **ret);
