/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* forkd's latency histograms (src/daemon/histogram.c) and what a sandbox's
 * usage is read from (src/daemon/usage.c): cpu.stat, a process's CPU clock, statm,
 * /proc/PID/cgroup, and the stats page shared with a VMM; and a batch of
 * usages read beside a list's reply (usage-batch.c). */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "histogram.h"
#include "usage-batch.h"
#include "usage.h"

static void test_histogram_buckets(void **state) {
        Histogram h = {};
        uint64_t cum[HISTOGRAM_N_BOUNDS + 1];

        /* bounds are strictly increasing */
        for (unsigned i = 1; i < HISTOGRAM_N_BOUNDS; i++)
                assert_true(histogram_bounds_usec[i] > histogram_bounds_usec[i - 1]);

        histogram_observe(&h, 0);        /* <= 1 ms */
        histogram_observe(&h, 1000);     /* exactly on the first bound: in it */
        histogram_observe(&h, 1001);     /* the second */
        histogram_observe(&h, 60000000); /* the last bound */
        histogram_observe(&h, 60000001); /* above all: +Inf only */
        assert_int_equal(h.count, 5);
        assert_int_equal(h.sum_usec, 0 + 1000 + 1001 + 60000000 + 60000001);
        assert_int_equal(h.buckets[0], 2);
        assert_int_equal(h.buckets[1], 1);
        assert_int_equal(h.buckets[HISTOGRAM_N_BOUNDS - 1], 1);
        assert_int_equal(h.buckets[HISTOGRAM_N_BOUNDS], 1);

        histogram_cumulative(&h, cum);
        assert_int_equal(cum[0], 2);
        assert_int_equal(cum[1], 3);
        assert_int_equal(cum[HISTOGRAM_N_BOUNDS - 2], 3);
        assert_int_equal(cum[HISTOGRAM_N_BOUNDS - 1], 4);
        assert_int_equal(cum[HISTOGRAM_N_BOUNDS], h.count);
        for (unsigned i = 1; i <= HISTOGRAM_N_BOUNDS; i++)
                assert_true(cum[i] >= cum[i - 1]);
}

static void test_histogram_every_bound(void **state) {
        Histogram h = {};
        uint64_t cum[HISTOGRAM_N_BOUNDS + 1];

        /* one observation on each bound and one just above: bucket i holds two
         * (bound i-1 + 1 and bound i), bucket 0 one */
        for (unsigned i = 0; i < HISTOGRAM_N_BOUNDS; i++) {
                histogram_observe(&h, histogram_bounds_usec[i]);
                histogram_observe(&h, histogram_bounds_usec[i] + 1);
        }
        histogram_cumulative(&h, cum);
        for (unsigned i = 0; i < HISTOGRAM_N_BOUNDS; i++)
                assert_int_equal(cum[i], 2 * i + 1);
        assert_int_equal(cum[HISTOGRAM_N_BOUNDS], 2 * HISTOGRAM_N_BOUNDS);
}

static void test_parse_cpu_stat(void **state) {
        uint64_t u = 0, t = 0;
        bool ht = true;

        assert_int_equal(usage_parse_cpu_stat("usage_usec 1234\nuser_usec 1000\nsystem_usec 234\n"
                                              "nr_periods 5\nnr_throttled 2\nthrottled_usec 77\n", &u, &ht, &t), 0);
        assert_int_equal(u, 1234);
        assert_true(ht);
        assert_int_equal(t, 77);
        /* without the cpu controller: no throttled_usec */
        assert_int_equal(usage_parse_cpu_stat("usage_usec 9\nuser_usec 5\nsystem_usec 4\n", &u, &ht, &t), 0);
        assert_int_equal(u, 9);
        assert_false(ht);
        assert_int_equal(t, 0);
        /* a key that only ends like another is not it */
        assert_int_equal(usage_parse_cpu_stat("xusage_usec 5\n", &u, NULL, NULL), -ENODATA);
        assert_int_equal(usage_parse_cpu_stat("", &u, NULL, NULL), -ENODATA);
        /* cgroup v1's cpu.stat: no usage, the throttled time in ns */
        assert_int_equal(usage_parse_cpu_stat("nr_periods 12\nnr_throttled 3\nthrottled_time 4567890\n"
                                              "nr_bursts 0\nburst_time 0\n", &u, &ht, &t), -ENODATA);
        assert_true(ht);
        assert_int_equal(t, 4567);
        /* v2's throttled_usec wins over a throttled_time */
        assert_int_equal(usage_parse_cpu_stat("usage_usec 1\nthrottled_time 9000\nthrottled_usec 2\n", &u, &ht, &t),
                         0);
        assert_int_equal(t, 2);
}

/* A child that spins for a while, then waits to be killed: its CPU clock, read
 * from here, moves, and agrees with what it used by its own clock. */
static void test_process_cpu_clock(void **state) {
        struct timespec a, b, own;
        int pipefd[2];
        uint64_t used_ns, seen_ns;
        pid_t pid;

        assert_int_equal(pipe(pipefd), 0);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                struct timespec s, e;

                (void) clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &s);
                do
                        (void) clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &e);
                while ((e.tv_sec - s.tv_sec) * 1000000000L + (e.tv_nsec - s.tv_nsec) < 50000000L);
                if (write(pipefd[1], &e, sizeof(e)) != sizeof(e))
                        _exit(1);
                pause();
                _exit(0);
        }
        assert_int_equal(read(pipefd[0], &own, sizeof(own)), sizeof(own));
        assert_int_equal(clock_gettime(usage_process_cpu_clock(pid), &a), 0);
        used_ns = (uint64_t) own.tv_sec * 1000000000u + (uint64_t) own.tv_nsec;
        seen_ns = (uint64_t) a.tv_sec * 1000000000u + (uint64_t) a.tv_nsec;
        assert_true(seen_ns >= used_ns && seen_ns < used_ns + 1000000000u);
        assert_int_equal(clock_gettime(usage_process_cpu_clock(pid), &b), 0);
        assert_true(b.tv_sec > a.tv_sec || (b.tv_sec == a.tv_sec && b.tv_nsec >= a.tv_nsec));
        /* This process's clock is the one it reads as CLOCK_PROCESS_CPUTIME_ID. */
        assert_int_equal(clock_gettime(usage_process_cpu_clock(getpid()), &a), 0);
        assert_true(a.tv_sec > 0 || a.tv_nsec > 0);
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_int_equal(waitpid(pid, NULL, 0), pid);
        /* A process that is gone has no clock. */
        assert_int_equal(clock_gettime(usage_process_cpu_clock(pid), &a), -1);
        close(pipefd[0]);
        close(pipefd[1]);
}

static void test_parse_statm(void **state) {
        uint64_t res = 0, shared = 0;

        assert_int_equal(usage_parse_statm("1000 300 120 10 0 200 0\n", &res, &shared), 0);
        assert_int_equal(res, 300);
        assert_int_equal(shared, 120);
        assert_int_equal(usage_parse_statm("1000 3 120 10 0 200 0\n", &res, &shared), -EBADMSG);
        assert_int_equal(usage_parse_statm("", &res, &shared), -EBADMSG);
}

static void test_parse_proc_cgroup(void **state) {
        char *p = NULL;

        assert_int_equal(usage_parse_proc_cgroup("0::/forkd.slice/forkd-sb-1.scope/sb-1\n", &p), 0);
        assert_string_equal(p, "/forkd.slice/forkd-sb-1.scope/sb-1");
        free(p);
        p = NULL;
        assert_int_equal(usage_parse_proc_cgroup("12:memory:/forkd/sb-1\n0::/forkd/sb-1", &p), 0);
        assert_string_equal(p, "/forkd/sb-1");
        free(p);
        assert_int_equal(usage_parse_proc_cgroup("12:memory:/forkd/sb-1\n", &p), -ENOENT);
}

static void test_stats_page(void **state) {
        const struct vmm_stats *map = NULL;
        struct vmm_stats copy;
        struct vmm_stats *rw;
        int fd = -1;

        assert_int_equal(usage_stats_page_new(&fd, &map), 0);
        assert_true(fd >= 0);
        /* nothing until the VMM stamps it */
        assert_int_equal(usage_stats_read(map, &copy), -ENODATA);
        assert_int_equal(usage_stats_read(NULL, &copy), -ENODATA);
        /* sealed: it cannot shrink under forkd's mapping */
        assert_true(ftruncate(fd, 0) < 0);

        /* the VMM's side: a shared read-write mapping of the same memfd */
        rw = mmap(NULL, VMM_STATS_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        assert_true(rw != MAP_FAILED);
        rw->version = VMM_STATS_VERSION;
        rw->magic = VMM_STATS_MAGIC;
        vmm_stats_add(&rw->disk_read_bytes, 4096);
        vmm_stats_add(&rw->net_tx_bytes, 60);
        vmm_stats_add(&rw->net_throttled_usec, 5);
        assert_int_equal(usage_stats_read(map, &copy), 0);
        assert_int_equal(copy.disk_read_bytes, 4096);
        assert_int_equal(copy.net_tx_bytes, 60);
        assert_int_equal(copy.net_throttled_usec, 5);
        /* a wrong version is no figures */
        rw->version = VMM_STATS_VERSION + 1;
        assert_int_equal(usage_stats_read(map, &copy), -ENODATA);

        munmap(rw, VMM_STATS_SIZE);
        usage_stats_page_free(map);
        close(fd);
}

static void test_cpu_stat_path(void **state) {
        char *p = NULL;

        /* a cgroup not named as the sandbox is not its own: no path */
        assert_int_equal(usage_cpu_stat_path(getpid(), "sb-no-such-leaf", &p), -ENOENT);
        assert_null(p);
}

static void test_read_self(void **state) {
        SandboxUsage u;

        /* This process: CPU from its clock, memory from /proc, no stats page. */
        usage_read(getpid(), NULL, NULL, NULL, &u);
        assert_true(u.have_cpu);
        assert_true(u.have_memory);
        assert_false(u.have_stats);
        assert_false(u.have_cpu_throttled);
        assert_true(u.memory_private_kib + u.memory_shared_kib > 0);
}

/* Usage read twice through kept files: the second read uses the same fds and still
 * sees the process; another pid closes them first; a pid that is gone reads nothing
 * and keeps no fd. */
static void test_read_kept_files(void **state) {
        UsageFiles files = USAGE_FILES_INIT;
        SandboxUsage u;
        int fd;
        pid_t pid;

        usage_read(getpid(), NULL, NULL, &files, &u);
        assert_true(u.have_cpu && u.have_memory);
        assert_true(files.statm_fd >= 0);
        assert_true(files.cpu_stat_fd < 0); /* no cgroup path given */
        fd = files.statm_fd;
        usage_read(getpid(), NULL, NULL, &files, &u);
        assert_true(u.have_memory);
        assert_int_equal(files.statm_fd, fd);

        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                pause();
                _exit(0);
        }
        usage_read(pid, NULL, NULL, &files, &u);
        assert_true(u.have_memory);
        assert_int_equal(files.pid, pid);
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_int_equal(waitpid(pid, NULL, 0), pid);
        usage_read(pid, NULL, NULL, &files, &u);
        assert_false(u.have_memory);
        assert_false(u.have_cpu);
        assert_true(files.statm_fd < 0);
        usage_files_close(&files);
        assert_true(files.statm_fd < 0 && files.cpu_stat_fd < 0);
}

/* The batch's reader: item i is an unsigned count of its reads; the figure says which item it is. */
static void count_read(void *item, SandboxUsage *ret) {
        unsigned *reads = item;

        __atomic_add_fetch(reads, 1, __ATOMIC_RELAXED);
        *ret = (SandboxUsage) { .have_cpu = true, .cpu_usec = (uint64_t) (uintptr_t) reads };
}

static void check_batch(size_t n, size_t taken) {
        unsigned *reads = calloc(n ? n : 1, sizeof(unsigned));
        void **items = calloc(n ? n : 1, sizeof(void *));
        UsageBatch b;

        assert_non_null(reads);
        assert_non_null(items);
        for (size_t i = 0; i < n; i++)
                items[i] = &reads[i];
        assert_int_equal(usage_batch_start(&b, items, n, count_read), 0);
        assert_int_equal(b.threaded, n >= USAGE_BATCH_THREAD_MIN);
        for (size_t i = 0; i < taken; i++) {
                const SandboxUsage *u = usage_batch_get(&b, i);

                assert_true(u->have_cpu);
                assert_int_equal(u->cpu_usec, (uint64_t) (uintptr_t) &reads[i]);
        }
        usage_batch_done(&b);
        /* each item read at most once, every one the caller took exactly once, none after done */
        for (size_t i = 0; i < n; i++) {
                assert_true(reads[i] <= 1);
                if (i < taken)
                        assert_int_equal(reads[i], 1);
        }
        free(items);
        free(reads);
}

static void test_batch(void **state) {
        (void) state;
        check_batch(0, 0);
        check_batch(1, 1);
        check_batch(USAGE_BATCH_THREAD_MIN - 1, USAGE_BATCH_THREAD_MIN - 1);
        check_batch(USAGE_BATCH_THREAD_MIN, USAGE_BATCH_THREAD_MIN);
        check_batch(1000, 1000);
        /* a caller that stops early (a failed append) still joins the reader */
        check_batch(5000, 17);
        check_batch(5000, 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_histogram_buckets),
                cmocka_unit_test(test_histogram_every_bound),
                cmocka_unit_test(test_parse_cpu_stat),
                cmocka_unit_test(test_process_cpu_clock),
                cmocka_unit_test(test_parse_statm),
                cmocka_unit_test(test_parse_proc_cgroup),
                cmocka_unit_test(test_stats_page),
                cmocka_unit_test(test_cpu_stat_path),
                cmocka_unit_test(test_read_self),
                cmocka_unit_test(test_read_kept_files),
                cmocka_unit_test(test_batch),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
