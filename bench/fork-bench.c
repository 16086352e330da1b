/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * bench/fork: fork N children of the test guest from one snapshot and measure
 * time-to-ready (every child has answered ping) and host memory per idle
 * child (the VMMs' own pages, and the whole host's: /proc/meminfo); cold-boot
 * the same guest in the same run for the ratio.
 */
#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "agent-proto.h"
#include "macro.h"
#include "vmm-client.h"
#include "vmm-userns.h"

static const char *arg_vmm, *arg_guest, *arg_workdir;
static unsigned arg_n = 100, arg_mem_mib = 64, arg_rounds = 3, arg_vcpus = 1;
static bool arg_json, arg_confine, arg_uid_range, arg_emulated;

/* --uid-range: the ids of the children, from forkd's default --vmm-uid-range. */
#define BENCH_UID_FIRST UINT32_C(0x70000000)

/* Per round: the children's user namespaces (--uid-range), or none. */
static bool round_userns;

/* How long memory may settle before the whole host's memory is read: after the
 * boot VM's exit (its teardown frees late) and after the children answered
 * (first page faults). */
#define SETTLE_USEC (1000 * 1000)
/* What prime_page_lists() touches and frees on each CPU. */
#define PRIME_BYTES (64u << 20)

struct run {
        unsigned n;
        int *agent_fds;
        pid_t *pids;
        fka_client **clients;
        uint64_t *answered_at;
        uint64_t t0;
        int ep;
        unsigned ready;
};

static void help(void) {
        printf("Usage: fork-bench --vmm PATH --guest ELF [--n N] [--mem-mib M] [--work-dir DIR] [--json]\n"
               "                  [--confine [--uid-range] [--rounds R]] [--emulated]\n"
               "Forks N (1..1000, default 100) children of the test guest from one snapshot, measures\n"
               "time until all have answered ping and host memory per idle child, and cold-boots\n"
               "the same guest for comparison. --json prints one JSON object on the last line.\n"
               "--confine: in the same run, R rounds (default 3, 1..20) each of an unconfined and a\n"
               "confined template (forkd-vmm --confine, as forkd starts them; uid %u), taking turns;\n"
               "prints the medians of both and their ratio (root only).\n"
               "--vcpus N: also fork N children of a snapshot of N vCPUs (2..32; the test guest's APs\n"
               "count in a loop) and compare with the 1-vCPU fork (not with --confine).\n"
               "--uid-range: with --confine, the rounds are of confined templates both, whose children\n"
               "run as the template's uid, or each under an id of its own (a user namespace made per\n"
               "child, as forkd --vmm-uid-range makes them, timed with the fork), taking turns.\n"
               "--emulated: say that the figures come from the QEMU test host (bench/in-test-host.sh).\n",
               VMM_USER_DEFAULT_UID);
}

static int parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *ret) {
        char *end;
        unsigned long v;

        errno = 0;
        v = strtoul(s, &end, 10);
        if (errno || *end || end == s || v < lo || v > hi)
                return -EINVAL;
        *ret = (unsigned) v;
        return 0;
}

static int parse_argv(int argc, char *argv[]) {
        static const struct option opts[] = {
                { "vmm", required_argument, NULL, 'v' },   { "guest", required_argument, NULL, 'g' },
                { "n", required_argument, NULL, 'n' },     { "mem-mib", required_argument, NULL, 'm' },
                { "work-dir", required_argument, NULL, 'w' }, { "json", no_argument, NULL, 'j' },
                { "confine", no_argument, NULL, 'c' },     { "rounds", required_argument, NULL, 'r' },
                { "emulated", no_argument, NULL, 'e' },    { "help", no_argument, NULL, 'h' },
                { "vcpus", required_argument, NULL, 'C' },
                { "uid-range", no_argument, NULL, 'u' },
                {}
        };
        int c;

        while ((c = getopt_long(argc, argv, "h", opts, NULL)) >= 0)
                switch (c) {
                case 'v': arg_vmm = optarg; break;
                case 'g': arg_guest = optarg; break;
                case 'w': arg_workdir = optarg; break;
                case 'j': arg_json = true; break;
                case 'c': arg_confine = true; break;
                case 'u': arg_uid_range = true; break;
                case 'e': arg_emulated = true; break;
                case 'r':
                        if (parse_uint(optarg, 1, 20, &arg_rounds) < 0)
                                return log_error_errno(EINVAL, "--rounds must be 1..20");
                        break;
                case 'n':
                        if (parse_uint(optarg, 1, 1000, &arg_n) < 0)
                                return log_error_errno(EINVAL, "--n must be 1..1000");
                        break;
                case 'm':
                        if (parse_uint(optarg, 16, 3072, &arg_mem_mib) < 0 || arg_mem_mib % 2)
                                return log_error_errno(EINVAL, "--mem-mib must be even, 16..3072");
                        break;
                case 'C':
                        if (parse_uint(optarg, 2, 32, &arg_vcpus) < 0)
                                return log_error_errno(EINVAL, "--vcpus must be 2..32");
                        break;
                case 'h': help(); return 0;
                default: return -EINVAL;
                }
        if (!arg_vmm || !arg_guest)
                return log_error_errno(EINVAL, "--vmm and --guest are required");
        if (arg_confine && arg_vcpus > 1)
                return log_error_errno(EINVAL, "--vcpus and --confine exclude each other");
        if (arg_confine && geteuid() != 0)
                return log_error_errno(EPERM, "--confine needs root (the VMM's jail)");
        if (arg_uid_range && !arg_confine)
                return log_error_errno(EINVAL, "--uid-range needs --confine");
        return 1;
}

static void send_pings(size_t first, size_t k, void *userdata) {
        struct run *run = userdata;

        for (size_t i = first; i < first + k; i++) {
                struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t) i };

                if (fka_client_new(run->agent_fds[i], 4, &run->clients[i]) < 0)
                        continue;
                if (fka_client_send(run->clients[i], "{\"op\":\"ping\"}", SIZE_MAX, 0, NULL) < 0)
                        continue;
                (void) epoll_ctl(run->ep, EPOLL_CTL_ADD, run->agent_fds[i], &ev);
        }
}

static int wait_ready(struct run *run, uint64_t timeout_usec) {
        uint64_t deadline = now_usec() + timeout_usec;
        struct epoll_event evs[64];

        while (run->ready < run->n && now_usec() < deadline) {
                int k = epoll_wait(run->ep, evs, ELEMENTSOF(evs), 100);
                if (k < 0 && errno != EINTR)
                        return -errno;
                for (int j = 0; j < k; j++) {
                        unsigned i = evs[j].data.u32;
                        fka_completion comp = {};
                        int r;

                        if (!run->clients[i])
                                continue;
                        while ((r = fka_client_next(run->clients[i], &comp)) > 0) {
                                if (comp.type == FKA_RESPONSE && comp.error == 0 && !run->answered_at[i]) {
                                        run->answered_at[i] = now_usec();
                                        run->ready++;
                                }
                                fka_completion_done(&comp);
                        }
                        if (r < 0 || run->answered_at[i])
                                (void) epoll_ctl(run->ep, EPOLL_CTL_DEL, run->agent_fds[i], NULL);
                }
        }
        return 0;
}

/* Private dirty memory plus page tables, in KiB. */
static long child_kib(pid_t pid) {
        char path[64], line[256];
        long priv = -1, pte = -1;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/smaps_rollup", (int) pid);
        f = fopen(path, "re");
        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "Private_Dirty: %ld kB", &priv) == 1)
                        break;
        fclose(f);
        snprintf(path, sizeof(path), "/proc/%d/status", (int) pid);
        f = fopen(path, "re");
        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "VmPTE: %ld kB", &pte) == 1)
                        break;
        fclose(f);
        return priv < 0 || pte < 0 ? -1 : priv + pte;
}

/* Nanoseconds the task has run on a CPU (schedstat), or -1. */
static long long task_cpu_ns(pid_t pid) {
        char path[64];
        long long ns = -1;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/schedstat", (int) pid);
        f = fopen(path, "re");
        if (!f)
                return -1;
        if (fscanf(f, "%lld", &ns) != 1)
                ns = -1;
        fclose(f);
        return ns;
}

/* What the whole host has given up, from /proc/meminfo (KiB). */
struct meminfo {
        long available, slab, page_tables;
};

/* The kernel keeps freed pages in per-CPU lists (tens of MiB in the test host)
 * that MemFree, and so MemAvailable, does not count, and serves allocations from
 * them first: children fed from what a teardown left there would look free.
 * Touching and freeing PRIME_BYTES on every CPU we may run on fills those lists
 * before each reading, so that they hold about the same each time. */
static void prime_page_lists(void) {
        cpu_set_t all, one;

        if (sched_getaffinity(0, sizeof(all), &all) < 0)
                return;
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
                void *p;

                if (!CPU_ISSET(cpu, &all))
                        continue;
                CPU_ZERO(&one);
                CPU_SET(cpu, &one);
                if (sched_setaffinity(0, sizeof(one), &one) < 0)
                        continue;
                p = mmap(NULL, PRIME_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (p == MAP_FAILED)
                        continue;
                (void) madvise(p, PRIME_BYTES, MADV_NOHUGEPAGE); /* 4 KiB pages, the lists a fork draws on */
                memset(p, 1, PRIME_BYTES);
                (void) munmap(p, PRIME_BYTES);
        }
        (void) sched_setaffinity(0, sizeof(all), &all);
}

static int read_meminfo(struct meminfo *ret) {
        _cleanup_(fclosep) FILE *f = NULL;
        struct meminfo m = { -1, -1, -1 };
        char line[256];

        prime_page_lists();
        f = fopen("/proc/meminfo", "re");
        if (!f)
                return -errno;
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "MemAvailable: %ld kB", &m.available) != 1 && sscanf(line, "Slab: %ld kB", &m.slab) != 1)
                        (void) sscanf(line, "PageTables: %ld kB", &m.page_tables);
        if (m.available < 0 || m.slab < 0 || m.page_tables < 0)
                return -EIO;
        *ret = m;
        return 0;
}

/* Drop in MemAvailable plus growth of Slab and PageTables, per child (KiB). */
static double host_kib_per_child(const struct meminfo *before, const struct meminfo *after, unsigned n) {
        return (double) ((before->available - after->available) + (after->slab - before->slab) +
                         (after->page_tables - before->page_tables)) / n;
}

static int make_disk(const char *path) {
        _cleanup_close_ int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
        if (fd < 0 || ftruncate(fd, 16u << 20) < 0)
                return -errno;
        return 0;
}

/* What one round of forking measures. */
struct result {
        unsigned ready;
        uint64_t template_start_us, spawn_us, ready_us;
        double per_child_kib, host_kib_per_child, cpu_per_child_ms, template_cpu_ms;
};

/* dir, and what is in it and in its directories, to uid:gid. */
static int chown_tree(const char *dir, uid_t uid, gid_t gid) {
        _cleanup_close_ int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        struct dirent *de;
        DIR *d;
        int r = 0;

        if (fd < 0 || fchown(fd, uid, gid) < 0)
                return -errno;
        d = fdopendir(fd);
        if (!d)
                return -errno;
        TAKE_FD(fd);
        while (r >= 0 && (de = readdir(d))) {
                char path[PATH_MAX];

                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                if (snprintf(path, sizeof(path), "%s/%s", dir, de->d_name) >= (int) sizeof(path))
                        r = -ENAMETOOLONG;
                else if (de->d_type == DT_DIR)
                        r = chown_tree(path, uid, gid);
                else if (lchown(path, uid, gid) < 0)
                        r = -errno;
        }
        closedir(d);
        return r;
}

/* One template of snap, n children of it until all answered, torn down again. */
static int fork_round(const char *snap, const char *dir, struct result *res) {
        struct vmm_template t = { .control_fd = -1 };
        struct run run = { .ep = -1 };
        struct meminfo mem_before, mem_after;
        _cleanup_free_ char *err = NULL;
        char **ids = NULL;
        long kib_sum = 0, kib_n = 0;
        long long cpu_ns_sum = 0, cpu_n = 0;
        int *userns = NULL;
        uint64_t t0;
        int r;

        *res = (struct result) {};
        t0 = now_usec();
        r = vmm_client_template_start(arg_vmm, snap, dir, &t, &err);
        if (r < 0)
                return log_error_errno(r, "Template failed: %s", err ?: strerror(-r));
        res->template_start_us = now_usec() - t0;

        run.n = arg_n;
        run.agent_fds = calloc(arg_n, sizeof(int));
        run.pids = calloc(arg_n, sizeof(pid_t));
        run.clients = calloc(arg_n, sizeof(fka_client *));
        run.answered_at = calloc(arg_n, sizeof(uint64_t));
        ids = calloc(arg_n, sizeof(char *));
        run.ep = epoll_create1(EPOLL_CLOEXEC);
        if (!run.agent_fds || !run.pids || !run.clients || !run.answered_at || !ids || run.ep < 0) {
                r = log_oom();
                goto finish;
        }
        for (unsigned i = 0; i < arg_n; i++) {
                run.agent_fds[i] = -EBADF;
                if (asprintf(&ids[i], "sb-bench-%04u", i) < 0) {
                        ids[i] = NULL;
                        r = log_oom();
                        goto finish;
                }
        }

        (void) usleep(SETTLE_USEC);
        r = read_meminfo(&mem_before);
        if (r < 0) {
                log_error_errno(r, "Failed to read /proc/meminfo: %m");
                goto finish;
        }
        run.t0 = now_usec();
        if (round_userns) {
                /* As forkd's fork does, before it sends the first spawn request. */
                userns = calloc(arg_n, sizeof(int));
                if (!userns) {
                        r = log_oom();
                        goto finish;
                }
                for (unsigned i = 0; i < arg_n; i++)
                        userns[i] = -EBADF;
                for (unsigned i = 0; i < arg_n; i++) {
                        r = vmm_userns_new(VMM_USER_DEFAULT_UID, BENCH_UID_FIRST + i, VMM_USER_DEFAULT_GID,
                                           &userns[i]);
                        if (r < 0) {
                                log_error_errno(r, "Failed to make a user namespace: %m");
                                goto finish;
                        }
                }
        }
        const struct vmm_spawn_options so = { .userns_fds = userns };
        r = vmm_client_template_spawn_with(&t, (const char *const *) ids, arg_n, &so, run.agent_fds, NULL, run.pids,
                                           send_pings, &run);
        res->spawn_us = now_usec() - run.t0;
        if (r < 0) {
                log_error_errno(r, "Spawn failed: %m");
                goto finish;
        }
        r = wait_ready(&run, 60 * 1000000ull);
        if (r < 0)
                goto finish;
        res->ready = run.ready;
        for (unsigned i = 0; i < arg_n; i++)
                if (run.answered_at[i] && run.answered_at[i] - run.t0 > res->ready_us)
                        res->ready_us = run.answered_at[i] - run.t0;
        for (unsigned i = 0; i < arg_n; i++) {
                long k = run.pids[i] > 0 ? child_kib(run.pids[i]) : -1;
                long long ns = run.pids[i] > 0 ? task_cpu_ns(run.pids[i]) : -1;

                if (k >= 0) {
                        kib_sum += k;
                        kib_n++;
                }
                if (ns >= 0) {
                        cpu_ns_sum += ns;
                        cpu_n++;
                }
        }
        res->per_child_kib = kib_n ? (double) kib_sum / kib_n : -1;
        res->cpu_per_child_ms = cpu_n ? cpu_ns_sum / 1e6 / cpu_n : -1.0;
        res->template_cpu_ms = task_cpu_ns(t.pid) / 1e6;
        (void) usleep(SETTLE_USEC);
        r = read_meminfo(&mem_after);
        if (r < 0) {
                log_error_errno(r, "Failed to read /proc/meminfo: %m");
                goto finish;
        }
        res->host_kib_per_child = host_kib_per_child(&mem_before, &mem_after, arg_n);
        r = run.ready == arg_n ? 0 : -EIO;
finish:
        if (t.pid > 0)
                vmm_template_stop(&t);
        for (unsigned i = 0; i < run.n; i++) {
                if (run.clients && run.clients[i])
                        fka_client_free(run.clients[i]);
                if (run.agent_fds)
                        safe_close(run.agent_fds[i]);
                if (ids)
                        free(ids[i]);
        }
        free(ids);
        for (unsigned i = 0; userns && i < arg_n; i++)
                safe_close(userns[i]);
        free(userns);
        free(run.agent_fds);
        free(run.pids);
        free(run.clients);
        free(run.answered_at);
        safe_close(run.ep);
        return r;
}

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return x < y ? -1 : x > y;
}

static uint64_t median_ready(const struct result *rs, unsigned n, uint64_t (*get)(const struct result *)) {
        uint64_t v[20];

        for (unsigned i = 0; i < n; i++)
                v[i] = get(&rs[i]);
        qsort(v, n, sizeof(v[0]), cmp_u64);
        return v[n / 2];
}

static uint64_t get_ready(const struct result *r) {
        return r->ready_us;
}

static uint64_t get_start(const struct result *r) {
        return r->template_start_us;
}

/* The round whose time to ready is median_us (the last such), for the other figures. */
static struct result median_round(const struct result *rs, unsigned n, uint64_t median_us) {
        struct result m = rs[0];

        for (unsigned i = 0; i < n; i++)
                if (rs[i].ready_us == median_us)
                        m = rs[i];
        return m;
}

/* Each round's time to all ready, a's and b's. */
static void print_rounds(const char *what, const struct result *a, const struct result *b, unsigned n) {
        printf("rounds (ms to all ready, %s):", what);
        for (unsigned i = 0; i < n; i++)
                printf(" %.1f/%.1f", a[i].ready_us / 1000.0, b[i].ready_us / 1000.0);
        printf("\n");
}

static void print_result(const char *what, const struct result *res, uint64_t cold_boot_us) {
        printf("%s\n", what);
        printf("  %-34s %12u\n", "children forked", arg_n);
        printf("  %-34s %12u\n", "children that answered ping", res->ready);
        printf("  %-34s %12.1f\n", "time to all ready (ms)", res->ready_us / 1000.0);
        printf("  %-34s %12.1f\n", "template spawn replies (ms)", res->spawn_us / 1000.0);
        printf("  %-34s %12.3f\n", "per child, amortised (ms)", res->ready_us / 1000.0 / arg_n);
        printf("  %-34s %12.1f\n", "cold boot to first ping (ms)", cold_boot_us / 1000.0);
        printf("  %-34s %12.1f\n", "cold boot / amortised fork", cold_boot_us / ((double) res->ready_us / arg_n));
        printf("  %-34s %12.1f\n", "host memory per idle child (KiB)", res->per_child_kib);
        printf("  %-34s %12.1f\n", "whole host per child (KiB)", res->host_kib_per_child);
        printf("  %-34s %12.3f\n", "CPU per child until ready (ms)", res->cpu_per_child_ms);
        printf("  %-34s %12.1f\n", "template start (ms)", res->template_start_us / 1000.0);
        printf("  %-34s %12.1f\n", "template CPU (ms)", res->template_cpu_ms);
}

/* --vcpus N: boot, snapshot and fork the same guest with N vCPUs; print it
 * beside the 1-vCPU fork (one). */
static int smp_round(const char *dir, const char *disk, uint64_t cold_boot_us, const struct result *one) {
        struct vmm_proc boot = { .pid = 0, .control_fd = -EBADF, .agent_fd = -EBADF };
        _cleanup_free_ char *reply = NULL;
        char snap[PATH_MAX], log[PATH_MAX], req[PATH_MAX + 64];
        struct result smp = {};
        uint64_t t0, smp_boot_us;
        int r;

        snprintf(snap, sizeof(snap), "%s/snap-smp", dir);
        snprintf(log, sizeof(log), "%s/boot-smp.log", dir);
        struct vmm_boot_args a = { .vmm_path = arg_vmm, .kernel = arg_guest, .disk = disk, .mem_mib = arg_mem_mib,
                                   .vcpus = arg_vcpus, .id = "bench-smp", .console_log = log, .overlay_dir = dir };
        t0 = now_usec();
        r = vmm_client_boot(&a, &boot);
        if (r < 0)
                return log_error_errno(r, "Failed to start forkd-vmm --vcpus %u: %m", arg_vcpus);
        r = fka_call(boot.agent_fd, "{\"op\":\"ping\"}", 60 * 1000000ull, NULL, NULL);
        if (r < 0) {
                log_error_errno(r, "The %u-vCPU guest did not answer ping: %m (console: %s)", arg_vcpus, log);
                vmm_proc_stop(&boot, 1000000ull);
                return r;
        }
        smp_boot_us = now_usec() - t0;
        snprintf(req, sizeof(req), "{\"op\":\"snapshot\",\"dir\":\"%s\",\"tag\":\"bench-smp\"}", snap);
        r = vmm_client_control(boot.control_fd, req, 60 * 1000000ull, &reply);
        vmm_proc_stop(&boot, 2 * 1000000ull);
        if (r < 0)
                return log_error_errno(r, "Snapshot of the %u-vCPU guest failed: %s", arg_vcpus, reply ?: strerror(-r));
        r = fork_round(snap, dir, &smp);
        if (r < 0 || smp.ready_us == 0)
                return r < 0 ? r : -ETIMEDOUT;
        printf("%u vCPUs:\n", arg_vcpus);
        print_result("unconfined", &smp, smp_boot_us);
        printf("%-36s %12.3f\n", "N vCPUs / 1 vCPU, time to ready", (double) smp.ready_us / one->ready_us);
        if (arg_json)
                printf("{\"n\": %u, \"ready\": %u, \"ready_ms\": %.2f, \"per_child_kib\": %.1f, "
                       "\"host_kib_per_child\": %.1f, \"cold_boot_ms\": %.2f, \"vcpus\": %u, "
                       "\"smp\": {\"ready\": %u, \"ready_ms\": %.2f, \"per_child_kib\": %.1f, "
                       "\"host_kib_per_child\": %.1f, \"cold_boot_ms\": %.2f}, \"smp_ratio\": %.3f, \"emulated\": %s}\n",
                       arg_n, one->ready, one->ready_us / 1000.0, one->per_child_kib, one->host_kib_per_child,
                       cold_boot_us / 1000.0, arg_vcpus, smp.ready, smp.ready_us / 1000.0, smp.per_child_kib,
                       smp.host_kib_per_child, smp_boot_us / 1000.0, (double) smp.ready_us / one->ready_us,
                       arg_emulated ? "true" : "false");
        return 0;
}

int main(int argc, char *argv[]) {
        char tmpl[] = "/var/tmp/forkd-bench.XXXXXX", disk[PATH_MAX], snap[PATH_MAX], req[PATH_MAX + 64],
             log[PATH_MAX];
        const char *dir;
        struct vmm_proc boot = { .control_fd = -1, .agent_fd = -1 };
        struct result plain[20], jailed[20];
        _cleanup_free_ char *reply = NULL;
        uint64_t t_boot, cold_boot_us = 0;
        int r;

        log_prefix = "bench/fork";
        r = parse_argv(argc, argv);
        if (r <= 0)
                return r < 0 ? 2 : 0;
        signal(SIGPIPE, SIG_IGN);
        if (arg_emulated)
                printf("bench/fork: EMULATED: in the QEMU test host (TCG, nested SVM): these are not forkd's speeds\n");

        dir = arg_workdir;
        if (!dir) {
                dir = mkdtemp(tmpl);
                if (!dir)
                        return log_error_errno(errno, "mkdtemp failed: %m"), 1;
        }
        snprintf(disk, sizeof(disk), "%s/disk.img", dir);
        snprintf(snap, sizeof(snap), "%s/snap", dir);
        snprintf(log, sizeof(log), "%s/boot.log", dir);
        r = make_disk(disk);
        if (r < 0)
                return log_error_errno(r, "Failed to create %s: %m", disk), 1;

        /* Cold boot: process start to first answered ping. */
        struct vmm_boot_args a = { .vmm_path = arg_vmm, .kernel = arg_guest, .disk = disk, .mem_mib = arg_mem_mib,
                                   .id = "bench-parent", .console_log = log, .overlay_dir = dir };
        t_boot = now_usec();
        r = vmm_client_boot(&a, &boot);
        if (r < 0)
                return log_error_errno(r, "Failed to start forkd-vmm: %m"), 1;
        r = fka_call(boot.agent_fd, "{\"op\":\"ping\"}", 30 * 1000000ull, NULL, NULL);
        if (r < 0) {
                log_error_errno(r, "The booted guest did not answer ping: %m (console: %s)", log);
                goto finish;
        }
        cold_boot_us = now_usec() - t_boot;

        snprintf(req, sizeof(req), "{\"op\":\"snapshot\",\"dir\":\"%s\",\"tag\":\"bench\"}", snap);
        r = vmm_client_control(boot.control_fd, req, 60 * 1000000ull, &reply);
        if (r < 0) {
                log_error_errno(r, "Snapshot failed: %s", reply ?: strerror(-r));
                goto finish;
        }
        vmm_proc_stop(&boot, 2 * 1000000ull);

        if (!arg_confine) {
                r = fork_round(snap, dir, &plain[0]);
                if (plain[0].ready_us == 0)
                        goto finish;
                print_result("unconfined", &plain[0], cold_boot_us);
                if (arg_vcpus > 1) {
                        r = smp_round(dir, disk, cold_boot_us, &plain[0]);
                        goto finish;
                }
                if (arg_json)
                        printf("{\"n\": %u, \"ready\": %u, \"ready_ms\": %.2f, \"per_child_kib\": %.1f, "
                               "\"host_kib_per_child\": %.1f, \"cold_boot_ms\": %.2f, \"emulated\": %s}\n",
                               arg_n, plain[0].ready, plain[0].ready_us / 1000.0, plain[0].per_child_kib,
                               plain[0].host_kib_per_child, cold_boot_us / 1000.0, arg_emulated ? "true" : "false");
                goto finish;
        }

        /* As forkd sets it up (src/daemon/confine.c): the VMM user writes the overlays here. */
        struct vmm_confine c = { .uid = VMM_USER_DEFAULT_UID, .gid = VMM_USER_DEFAULT_GID, .binds = { dir },
                                 .n_binds = 1 };
        /* ... and the template, the VMM user too, reads the snapshot (confine_adopt_snapshot()). */
        r = chown_tree(dir, VMM_USER_DEFAULT_UID, VMM_USER_DEFAULT_GID);
        if (r < 0) {
                log_error_errno(r, "Failed to hand %s to the VMM user: %m", dir);
                goto finish;
        }
        /* --uid-range: children of other ids write their overlays here, as in
         * forkd's overlays/ (src/daemon/confine.c). */
        if (arg_uid_range && chmod(dir, 01770) < 0) {
                r = log_error_errno(errno, "Failed to open %s to the VMM group: %m", dir);
                goto finish;
        }
        for (unsigned i = 0; i < arg_rounds; i++) {
                /* --uid-range: both confined, the first as one uid, the second an id per child. */
                r = vmm_client_set_confine(arg_uid_range ? &c : NULL);
                round_userns = false;
                if (r >= 0)
                        r = fork_round(snap, dir, &plain[i]);
                if (r >= 0)
                        r = vmm_client_set_confine(&c);
                round_userns = arg_uid_range;
                if (r >= 0)
                        r = fork_round(snap, dir, &jailed[i]);
                round_userns = false;
                (void) vmm_client_set_confine(NULL);
                if (r < 0)
                        goto finish;
        }
        uint64_t p = median_ready(plain, arg_rounds, get_ready), j = median_ready(jailed, arg_rounds, get_ready);
        struct result pm = median_round(plain, arg_rounds, p), jm = median_round(jailed, arg_rounds, j);

        if (arg_uid_range) {
                print_result("confined, one uid (median round)", &pm, cold_boot_us);
                print_result("confined, an id per child (median round)", &jm, cold_boot_us);
                printf("%-36s %12.3f\n", "id per child / one uid, to ready", (double) j / p);
                print_rounds("one uid/id per child", plain, jailed, arg_rounds);
                if (arg_json)
                        printf("{\"n\": %u, \"rounds\": %u, \"shared_uid\": {\"ready\": %u, \"ready_ms\": %.2f, "
                               "\"spawn_ms\": %.2f}, \"uid_per_child\": {\"ready\": %u, \"ready_ms\": %.2f, "
                               "\"spawn_ms\": %.2f}, \"uid_ratio\": %.3f, \"cold_boot_ms\": %.2f, \"emulated\": %s}\n",
                               arg_n, arg_rounds, pm.ready, p / 1000.0, pm.spawn_us / 1000.0, jm.ready, j / 1000.0,
                               jm.spawn_us / 1000.0, (double) j / p, cold_boot_us / 1000.0,
                               arg_emulated ? "true" : "false");
        } else {
                uint64_t ps = median_ready(plain, arg_rounds, get_start), js = median_ready(jailed, arg_rounds, get_start);

                print_result("unconfined (median round)", &pm, cold_boot_us);
                print_result("confined (median round)", &jm, cold_boot_us);
                printf("%-36s %12.3f\n", "confined / unconfined, time to ready", (double) j / p);
                printf("%-36s %12.3f\n", "confined / unconfined, template start", (double) js / ps);
                print_rounds("unconfined/confined", plain, jailed, arg_rounds);
                if (arg_json)
                        printf("{\"n\": %u, \"rounds\": %u, \"ready\": %u, \"ready_ms\": %.2f, \"per_child_kib\": %.1f, "
                               "\"host_kib_per_child\": %.1f, \"cold_boot_ms\": %.2f, \"template_start_ms\": %.2f, "
                               "\"confined\": {\"ready\": %u, \"ready_ms\": %.2f, \"per_child_kib\": %.1f, "
                               "\"host_kib_per_child\": %.1f, \"template_start_ms\": %.2f}, \"confined_ratio\": %.3f, "
                               "\"emulated\": %s}\n",
                               arg_n, arg_rounds, pm.ready, p / 1000.0, pm.per_child_kib, pm.host_kib_per_child,
                               cold_boot_us / 1000.0, ps / 1000.0, jm.ready, j / 1000.0, jm.per_child_kib,
                               jm.host_kib_per_child, js / 1000.0, (double) j / p, arg_emulated ? "true" : "false");
        }

finish:
        if (boot.pid > 0)
                vmm_proc_stop(&boot, 1000000ull);
        if (!arg_workdir) {
                char cmd[PATH_MAX + 16];
                snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
                (void) system(cmd);
        }
        return r < 0 ? 1 : 0;
}
