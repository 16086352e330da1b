/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "io-util.h"
#include "macro.h"
#include "time-util.h"
#include "usage.h"

#define USAGE_FILE_MAX 4096

int usage_stats_page_new(int *ret_fd, const struct vmm_stats **ret_map) {
        _cleanup_close_ int fd = memfd_create("forkd-vmm-stats", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        void *p;

        if (fd < 0)
                return -errno;
        if (ftruncate(fd, VMM_STATS_SIZE) < 0)
                return -errno;
        /* The VMM may write the page, never make it smaller than forkd maps it. */
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) < 0)
                return -errno;
        p = mmap(NULL, VMM_STATS_SIZE, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
                return -errno;
        *ret_map = p;
        *ret_fd = TAKE_FD(fd);
        return 0;
}

const struct vmm_stats *usage_stats_page_free(const struct vmm_stats *map) {
        if (map)
                (void) munmap((void *) map, VMM_STATS_SIZE);
        return NULL;
}

int usage_stats_read(const struct vmm_stats *map, struct vmm_stats *ret) {
        if (!map || __atomic_load_n(&map->magic, __ATOMIC_ACQUIRE) != VMM_STATS_MAGIC ||
            vmm_stats_get(&map->version) != VMM_STATS_VERSION)
                return -ENODATA;
        *ret = (struct vmm_stats) {
                .magic = VMM_STATS_MAGIC,
                .version = VMM_STATS_VERSION,
                .disk_read_bytes = vmm_stats_get(&map->disk_read_bytes),
                .disk_written_bytes = vmm_stats_get(&map->disk_written_bytes),
                .disk_read_ops = vmm_stats_get(&map->disk_read_ops),
                .disk_write_ops = vmm_stats_get(&map->disk_write_ops),
                .disk_throttled_usec = vmm_stats_get(&map->disk_throttled_usec),
                .net_rx_bytes = vmm_stats_get(&map->net_rx_bytes),
                .net_tx_bytes = vmm_stats_get(&map->net_tx_bytes),
                .net_rx_packets = vmm_stats_get(&map->net_rx_packets),
                .net_tx_packets = vmm_stats_get(&map->net_tx_packets),
                .net_throttled_usec = vmm_stats_get(&map->net_throttled_usec),
        };
        return 0;
}

/* The number after "key " at the start of a line of text. */
static bool find_key(const char *text, const char *key, uint64_t *ret) {
        size_t n = strlen(key);

        for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
                char *end;

                if (strncmp(l, key, n) != 0 || l[n] != ' ')
                        continue;
                errno = 0;
                *ret = strtoull(l + n + 1, &end, 10);
                return errno == 0 && end != l + n + 1;
        }
        return false;
}

int usage_parse_cpu_stat(const char *text, uint64_t *ret_usage, bool *ret_have_throttled, uint64_t *ret_throttled) {
        uint64_t u = 0, t = 0;
        bool hu, ht;

        hu = find_key(text, "usage_usec", &u);
        ht = find_key(text, "throttled_usec", &t);
        if (!ht && find_key(text, "throttled_time", &t)) { /* v1: ns */
                ht = true;
                t /= 1000;
        }
        if (ret_usage)
                *ret_usage = u;
        if (ret_have_throttled)
                *ret_have_throttled = ht;
        if (ret_throttled)
                *ret_throttled = ht ? t : 0;
        return hu ? 0 : -ENODATA;
}

clockid_t usage_process_cpu_clock(pid_t pid) {
        /* The kernel's encoding of a process's CPU clock (CPUCLOCK_SCHED: the time its
         * threads ran, in ns), as glibc's clock_getcpuclockid() makes it, without that
         * function's extra clock_getres() call. */
        return (clockid_t) ((~(unsigned) pid) << 3) | 2;
}

int usage_parse_statm(const char *text, uint64_t *ret_resident, uint64_t *ret_shared) {
        unsigned long long size, res, shared;

        if (sscanf(text, "%llu %llu %llu", &size, &res, &shared) != 3 || shared > res)
                return -EBADMSG;
        *ret_resident = res;
        *ret_shared = shared;
        return 0;
}

int usage_parse_proc_cgroup(const char *text, char **ret) {
        for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
                const char *e;
                char *s;

                if (strncmp(l, "0::/", 4) != 0)
                        continue;
                e = strchrnul(l, '\n');
                s = strndup(l + 3, (size_t) (e - l - 3));
                if (!s)
                        return -ENOMEM;
                *ret = s;
                return 0;
        }
        return -ENOENT;
}

int usage_cpu_stat_path(pid_t pid, const char *leaf, char **ret) {
        _cleanup_free_ char *text = NULL, *cg = NULL;
        const char *base;
        char path[64];
        int r;

        snprintf(path, sizeof(path), "/proc/%d/cgroup", (int) pid);
        r = read_file_capped_at(AT_FDCWD, path, USAGE_FILE_MAX, &text, NULL);
        if (r < 0)
                return r;
        r = usage_parse_proc_cgroup(text, &cg);
        if (r < 0)
                return r;
        base = strrchr(cg, '/');
        if (strcmp(cg, "/") == 0 || strstr(cg, "/../") || !base || strcmp(base + 1, leaf) != 0)
                return -ENOENT;
        return asprintf(ret, "/sys/fs/cgroup%s/cpu.stat", cg) < 0 ? -ENOMEM : 0;
}

void usage_files_close(UsageFiles *f) {
        if (!f)
                return;
        f->cpu_stat_fd = safe_close(f->cpu_stat_fd);
        f->statm_fd = safe_close(f->statm_fd);
        f->pid = 0;
}

/* The text of a small file at offset 0 into buf: from the kept fd when there is one,
 * else opened, and kept when files asks for it (a /proc or cgroup file reads anew
 * at every pread() from 0). A kept fd that fails is dropped. */
static ssize_t read_small(int *kept, const char *path, char *buf, size_t size) {
        int fd = kept && *kept >= 0 ? *kept : open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        ssize_t n = fd >= 0 ? pread(fd, buf, size - 1, 0) : -1;

        if (n <= 0 || !kept) {
                safe_close(fd);
                if (kept)
                        *kept = -EBADF;
                return n > 0 ? n : -1;
        }
        *kept = fd;
        return n;
}

void usage_read(pid_t pid, const char *cpu_stat_path, const struct vmm_stats *stats, UsageFiles *files,
                SandboxUsage *ret) {
        char path[64], buf[USAGE_FILE_MAX];
        uint64_t res, shared;
        ssize_t n;
        long page_kib = sysconf(_SC_PAGESIZE) / 1024;

        *ret = (SandboxUsage) {};
        ret->have_stats = usage_stats_read(stats, &ret->stats) >= 0;
        if (files && files->pid != pid) {
                usage_files_close(files);
                files->pid = pid;
        }

        /* One read of a small file each: no buffered I/O, no allocation. */
        if (cpu_stat_path) {
                n = read_small(files ? &files->cpu_stat_fd : NULL, cpu_stat_path, buf, sizeof(buf));
                if (n > 0) {
                        buf[n] = '\0';
                        ret->have_cpu = usage_parse_cpu_stat(buf, &ret->cpu_usec, &ret->have_cpu_throttled,
                                                             &ret->cpu_throttled_usec) >= 0;
                }
        }
        if (pid > 0 && !ret->have_cpu) {
                struct timespec ts;

                /* Its threads' time from its CPU clock: one system call, no text, where
                 * /proc/PID/stat costs forkd a formatted line of 52 fields. */
                if (clock_gettime(usage_process_cpu_clock(pid), &ts) >= 0) {
                        ret->cpu_usec = (uint64_t) ts.tv_sec * USEC_PER_SEC + (uint64_t) ts.tv_nsec / 1000;
                        ret->have_cpu = true;
                }
        }
        if (pid > 0) {
                snprintf(path, sizeof(path), "/proc/%d/statm", (int) pid);
                n = read_small(files ? &files->statm_fd : NULL, path, buf, sizeof(buf));
                if (n > 0) {
                        buf[n] = '\0';
                        if (usage_parse_statm(buf, &res, &shared) >= 0) {
                                ret->memory_private_kib = (res - shared) * (uint64_t) page_kib;
                                ret->memory_shared_kib = shared * (uint64_t) page_kib;
                                ret->have_memory = true;
                        }
                }
        }
}
