/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd-vmm on the real /dev/kvm with the test guest: boot, snapshot, fork,
 * copy-on-write isolation of memory and disk, identity, corrupt snapshots,
 * kill -9 of one child, crash during snapshot writing, a guest that
 * triple-faults while booting.
 */
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include <cmocka.h>
#include <json-c/json.h>

#include "agent-proto.h"
#include "console-tail.h"
#include "macro.h"
#include "vmm-client.h"

#define CALL_TIMEOUT (30 * 1000000ull)

static const char *vmm_path, *guest_path;
static char workdir[256], snapdir[512], diskpath[512];

/* One request over an agent fd; returns the parsed response object. */
static struct json_object *call(int fd, const char *fmt, ...) _printf_(2, 3);
static struct json_object *call(int fd, const char *fmt, ...) {
        _cleanup_free_ char *req = NULL, *resp = NULL;
        struct json_object *o;
        uint16_t type = 0;
        va_list ap;
        int r;

        va_start(ap, fmt);
        assert_true(vasprintf(&req, fmt, ap) >= 0);
        va_end(ap);
        r = fka_call(fd, req, CALL_TIMEOUT, &resp, &type);
        if (r < 0)
                fail_msg("agent call %s failed: %s", req, strerror(-r));
        assert_int_equal(type, FKA_RESPONSE);
        o = json_tokener_parse(resp);
        assert_non_null(o);
        return o;
}

static const char *field_str(struct json_object *o, const char *k) {
        struct json_object *v;
        assert_true(json_object_object_get_ex(o, k, &v));
        return json_object_get_string(v);
}

static int64_t field_int(struct json_object *o, const char *k) {
        struct json_object *v;
        assert_true(json_object_object_get_ex(o, k, &v));
        assert_true(json_object_is_type(v, json_type_int));
        return json_object_get_int64(v);
}

static void checksum_file(const char *path, char out[17]) {
        uint64_t h = 0xcbf29ce484222325ull;
        uint8_t buf[65536];
        ssize_t n;
        int fd = open(path, O_RDONLY | O_CLOEXEC);

        assert_true(fd >= 0);
        while ((n = read(fd, buf, sizeof(buf))) > 0)
                for (ssize_t i = 0; i < n; i++)
                        h = (h ^ buf[i]) * 0x100000001b3ull;
        close(fd);
        snprintf(out, 17, "%016llx", (unsigned long long) h);
}

static void checksum_pattern(uint32_t pattern, size_t bytes, char out[17]) {
        uint64_t h = 0xcbf29ce484222325ull;

        for (size_t i = 0; i < bytes; i++)
                h = (h ^ ((pattern >> (8 * (i % 4))) & 0xff)) * 0x100000001b3ull;
        snprintf(out, 17, "%016llx", (unsigned long long) h);
}

static int run_cmd(const char *fmt, ...) _printf_(1, 2);
static int run_cmd(const char *fmt, ...) {
        _cleanup_free_ char *cmd = NULL;
        va_list ap;
        int r;

        va_start(ap, fmt);
        if (vasprintf(&cmd, fmt, ap) < 0)
                cmd = NULL;
        va_end(ap);
        assert_non_null(cmd);
        r = system(cmd);
        return WIFEXITED(r) ? WEXITSTATUS(r) : -1;
}

static int group_setup(void **state) {
        struct vmm_proc boot;
        _cleanup_free_ char *reply = NULL, *req = NULL, *log = NULL;
        int fd, r;

        snprintf(workdir, sizeof(workdir), "%s/forkd-test-vmm.XXXXXX", getenv("TMPDIR") ?: "/var/tmp");
        if (!mkdtemp(workdir))
                return -1;
        snprintf(diskpath, sizeof(diskpath), "%s/disk.img", workdir);
        snprintf(snapdir, sizeof(snapdir), "%s/snap", workdir);
        fd = open(diskpath, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
        if (fd < 0 || ftruncate(fd, 8u << 20) < 0)
                return -1;
        /* A recognisable block 3 in the base image. */
        uint32_t pat[1024];
        for (unsigned i = 0; i < 1024; i++)
                pat[i] = 0xb10cb10c;
        if (pwrite(fd, pat, sizeof(pat), 3 * 4096) != sizeof(pat))
                return -1;
        close(fd);

        assert_true(asprintf(&log, "%s/boot.log", workdir) > 0);
        struct vmm_boot_args a = { .vmm_path = vmm_path, .kernel = guest_path, .disk = diskpath, .mem_mib = 64,
                                   .id = "parent", .console_log = log, .overlay_dir = workdir };
        r = vmm_client_boot(&a, &boot);
        if (r < 0)
                return -1;
        r = fka_call(boot.agent_fd, "{\"op\":\"ping\"}", CALL_TIMEOUT, NULL, NULL);
        if (r < 0) {
                fprintf(stderr, "boot ping failed: %s\n", strerror(-r));
                run_cmd("cat %s >&2", log);
                return -1;
        }
        /* Parent state that children must inherit: pages 0..3 of scratch. */
        r = fka_call(boot.agent_fd, "{\"op\":\"mem_write\",\"offset_pages\":0,\"pages\":4,\"pattern\":287454020}",
                     CALL_TIMEOUT, NULL, NULL);
        if (r < 0)
                return -1;
        assert_true(asprintf(&req, "{\"op\":\"snapshot\",\"dir\":\"%s\",\"tag\":\"base\"}", snapdir) > 0);
        r = vmm_client_control(boot.control_fd, req, CALL_TIMEOUT, &reply);
        if (r < 0) {
                fprintf(stderr, "snapshot failed: %s\n", reply ?: strerror(-r));
                return -1;
        }
        vmm_proc_stop(&boot, 2000000);
        return 0;
}

static int group_teardown(void **state) {
        if (workdir[0])
                run_cmd("rm -rf '%s'", workdir);
        return 0;
}

struct fleet {
        struct vmm_template t;
        unsigned n;
        int agent[16];
        int control[16];
        pid_t pid[16];
};

static void fleet_start(struct fleet *f, unsigned n, const char *snap) {
        _cleanup_free_ char *err = NULL;
        const char *ids[16];
        char names[16][32];
        int r;

        assert_true(n <= 16);
        for (unsigned i = 0; i < n; i++) {
                snprintf(names[i], sizeof(names[i]), "sb-test-%u", i);
                ids[i] = names[i];
        }
        r = vmm_client_template_start(vmm_path, snap, workdir, &f->t, &err);
        if (r < 0)
                fail_msg("template: %s", err ?: strerror(-r));
        f->n = n;
        r = vmm_client_template_spawn(&f->t, ids, n, workdir, NULL, f->agent, f->control, f->pid, NULL, NULL);
        assert_int_equal(r, 0);
}

static void fleet_stop(struct fleet *f) {
        for (unsigned i = 0; i < f->n; i++) {
                safe_close(f->agent[i]);
                safe_close(f->control[i]);
        }
        vmm_template_stop(&f->t);
}

static void test_fork_ten_all_answer(void **state) {
        struct fleet f;

        fleet_start(&f, 10, snapdir);
        for (unsigned i = 0; i < 10; i++) {
                struct json_object *o = call(f.agent[i], "{\"op\":\"ping\"}");
                assert_true(json_object_get_boolean(json_object_object_get(o, "pong")));
                assert_int_equal(field_int(o, "pid"), 1);
                json_object_put(o);
        }
        fleet_stop(&f);
}

static void test_identity_differs(void **state) {
        char seeds[10][65], ids[10][65];
        struct fleet f;
        struct timespec now;

        fleet_start(&f, 10, snapdir);
        clock_gettime(CLOCK_REALTIME, &now);
        for (unsigned i = 0; i < 10; i++) {
                struct json_object *o = call(f.agent[i], "{\"op\":\"identity\"}");
                int64_t wall = field_int(o, "wall_ns");
                int64_t host = (int64_t) now.tv_sec * 1000000000LL + now.tv_nsec;

                snprintf(ids[i], sizeof(ids[i]), "%s", field_str(o, "id"));
                snprintf(seeds[i], sizeof(seeds[i]), "%s", field_str(o, "seed"));
                assert_int_equal(field_int(o, "generation"), 1);
                assert_int_equal(strlen(seeds[i]), 64);
                /* The child's clock is the host's, not the snapshot's. */
                assert_true(llabs(wall - host) < 5 * 1000000000LL);
                json_object_put(o);
                for (unsigned j = 0; j < i; j++) {
                        assert_string_not_equal(ids[i], ids[j]);
                        assert_string_not_equal(seeds[i], seeds[j]);
                }
        }
        fleet_stop(&f);
}

static void test_memory_cow_isolation(void **state) {
        char before[17], inherited[17], path[PATH_MAX], sum[17];
        struct fleet f;
        struct json_object *o;

        snprintf(path, sizeof(path), "%s/memory.bin", snapdir);
        checksum_file(path, before);

        fleet_start(&f, 3, snapdir);
        /* Every child sees the parent's pages. */
        o = call(f.agent[0], "{\"op\":\"mem_checksum\",\"offset_pages\":0,\"pages\":4}");
        snprintf(inherited, sizeof(inherited), "%s", field_str(o, "checksum"));
        json_object_put(o);
        {
                char expect[17];
                checksum_pattern(287454020u, 4 * 4096, expect);
                assert_string_equal(inherited, expect);
        }
        for (unsigned i = 1; i < 3; i++) {
                o = call(f.agent[i], "{\"op\":\"mem_checksum\",\"offset_pages\":0,\"pages\":4}");
                assert_string_equal(field_str(o, "checksum"), inherited);
                json_object_put(o);
        }
        /* Child 0 overwrites them; its siblings still see the parent's. */
        o = call(f.agent[0], "{\"op\":\"mem_write\",\"offset_pages\":0,\"pages\":4,\"pattern\":1}");
        json_object_put(o);
        o = call(f.agent[0], "{\"op\":\"mem_checksum\",\"offset_pages\":0,\"pages\":4}");
        assert_string_not_equal(field_str(o, "checksum"), inherited);
        json_object_put(o);
        for (unsigned i = 1; i < 3; i++) {
                o = call(f.agent[i], "{\"op\":\"mem_checksum\",\"offset_pages\":0,\"pages\":4}");
                assert_string_equal(field_str(o, "checksum"), inherited);
                json_object_put(o);
        }
        fleet_stop(&f);

        /* The snapshot's memory.bin is untouched by all of it. */
        checksum_file(path, sum);
        assert_string_equal(sum, before);
}

static void test_disk_cow_isolation(void **state) {
        char path[PATH_MAX], before[17], sum[17];
        struct fleet f;
        struct json_object *o;

        snprintf(path, sizeof(path), "%s/disk.img", snapdir);
        checksum_file(path, before);

        fleet_start(&f, 3, snapdir);
        o = call(f.agent[0], "{\"op\":\"disk_read\",\"block\":3}");
        assert_int_equal(field_int(o, "first"), 0xb10cb10c);
        json_object_put(o);

        o = call(f.agent[0], "{\"op\":\"disk_write\",\"block\":3,\"pattern\":42}");
        json_object_put(o);
        o = call(f.agent[0], "{\"op\":\"disk_read\",\"block\":3}");
        assert_int_equal(field_int(o, "first"), 42);
        json_object_put(o);

        for (unsigned i = 1; i < 3; i++) {
                o = call(f.agent[i], "{\"op\":\"disk_read\",\"block\":3}");
                assert_int_equal(field_int(o, "first"), 0xb10cb10c);
                json_object_put(o);
        }
        fleet_stop(&f);

        checksum_file(path, sum);
        assert_string_equal(sum, before);
        /* The user's original image was never written either. */
        {
                uint32_t w;
                int fd = open(diskpath, O_RDONLY | O_CLOEXEC);
                assert_true(fd >= 0);
                assert_int_equal(pread(fd, &w, 4, 3 * 4096), 4);
                close(fd);
                assert_int_equal(w, 0xb10cb10c);
        }
}

static void test_kill_one_child(void **state) {
        struct fleet f;
        int status;

        fleet_start(&f, 4, snapdir);
        for (unsigned i = 0; i < 4; i++)
                json_object_put(call(f.agent[i], "{\"op\":\"ping\"}"));

        assert_int_equal(kill(f.pid[1], SIGKILL), 0);
        /* The agent channel of the killed child ends... */
        {
                char b;
                assert_int_equal(read(f.agent[1], &b, 1), 0);
        }
        /* ...and its siblings carry on. */
        for (unsigned i = 0; i < 4; i++) {
                if (i == 1)
                        continue;
                struct json_object *o = call(f.agent[i], "{\"op\":\"ping\"}");
                assert_true(json_object_get_boolean(json_object_object_get(o, "pong")));
                json_object_put(o);
        }
        (void) status;
        fleet_stop(&f);
}

static void copy_snapshot(const char *dst) {
        assert_int_equal(run_cmd("rm -rf '%s' && cp -a --sparse=always '%s' '%s'", dst, snapdir, dst), 0);
}

static int vmm_check(const char *dir) {
        return run_cmd("'%s' check '%s' >/dev/null 2>&1", vmm_path, dir);
}

static void expect_refused(const char *dir) {
        struct vmm_template t;
        _cleanup_free_ char *err = NULL;

        assert_int_not_equal(vmm_check(dir), 0);
        assert_true(vmm_client_template_start(vmm_path, dir, workdir, &t, &err) < 0);
}

static void test_corrupt_snapshots_refused(void **state) {
        char bad[PATH_MAX];

        snprintf(bad, sizeof(bad), "%s/bad", workdir);
        assert_int_equal(vmm_check(snapdir), 0);

        /* A flipped byte in vmstate (CRC). */
        copy_snapshot(bad);
        assert_int_equal(run_cmd("printf '\\377' | dd of='%s/vmstate' bs=1 seek=100 conv=notrunc status=none", bad), 0);
        expect_refused(bad);

        /* A truncated vmstate. */
        copy_snapshot(bad);
        assert_int_equal(run_cmd("truncate -s 20 '%s/vmstate'", bad), 0);
        expect_refused(bad);

        /* A wrong version (byte 8 of the header). */
        copy_snapshot(bad);
        assert_int_equal(run_cmd("printf '\\011' | dd of='%s/vmstate' bs=1 seek=8 conv=notrunc status=none", bad), 0);
        expect_refused(bad);

        /* A truncated memory.bin. */
        copy_snapshot(bad);
        assert_int_equal(run_cmd("truncate -s 1M '%s/memory.bin'", bad), 0);
        expect_refused(bad);

        /* snapshot.json that is not JSON, or lies about the size. */
        copy_snapshot(bad);
        assert_int_equal(run_cmd("printf '{\"format\":' > '%s/snapshot.json'", bad), 0);
        expect_refused(bad);
        copy_snapshot(bad);
        assert_int_equal(run_cmd("sed -i 's/\"mem_size\": [0-9]*/\"mem_size\": 4194304/' '%s/snapshot.json'", bad), 0);
        expect_refused(bad);

        /* A missing disk. */
        copy_snapshot(bad);
        assert_int_equal(run_cmd("rm '%s/disk.img'", bad), 0);
        expect_refused(bad);

        run_cmd("rm -rf '%s'", bad);
}

static void test_crash_during_snapshot(void **state) {
        static const char *const stages[] = { "memory", "vmstate", "disk", "meta" };

        for (unsigned i = 0; i < ELEMENTSOF(stages); i++) {
                _cleanup_free_ char *req = NULL, *reply = NULL;
                char dir[PATH_MAX], log[PATH_MAX];
                struct vmm_proc boot;
                struct stat st;
                int r;

                snprintf(dir, sizeof(dir), "%s/crash-%s", workdir, stages[i]);
                snprintf(log, sizeof(log), "%s/crash-%s.log", workdir, stages[i]);
                struct vmm_boot_args a = { .vmm_path = vmm_path, .kernel = guest_path, .disk = diskpath,
                                           .mem_mib = 64, .id = "crash", .console_log = log,
                                           .overlay_dir = workdir };
                setenv("FORKD_TEST_CRASH_SNAPSHOT", stages[i], 1);
                r = vmm_client_boot(&a, &boot);
                unsetenv("FORKD_TEST_CRASH_SNAPSHOT");
                assert_int_equal(r, 0);
                assert_int_equal(fka_call(boot.agent_fd, "{\"op\":\"ping\"}", CALL_TIMEOUT, NULL, NULL), 0);

                assert_true(asprintf(&req, "{\"op\":\"snapshot\",\"dir\":\"%s\",\"tag\":\"crash\"}", dir) > 0);
                r = vmm_client_control(boot.control_fd, req, CALL_TIMEOUT, &reply);
                /* The VMM died mid-write: no reply, and nothing under the final name. */
                assert_true(r < 0);
                assert_int_equal(stat(dir, &st), -1);
                assert_int_equal(errno, ENOENT);
                vmm_proc_stop(&boot, 1000000);
        }
}

/* A guest that triple-faults while booting (tests/guest/triple-fault.S, built
 * beside the test guest): forkd-vmm exits with VMM_EXIT_TRIPLE_FAULT, and its
 * console log keeps what the guest printed. No mem_mib: forkd-vmm's default. */
static void test_triple_fault_at_boot(void **state) {
        _cleanup_free_ char *elf = NULL, *log = NULL, *tail = NULL;
        const char *slash = strrchr(guest_path, '/');
        struct vmm_proc p;
        int status = 0;

        assert_true(asprintf(&elf, "%.*s/forkd-triple-fault.elf", slash ? (int) (slash - guest_path) : 1,
                             slash ? guest_path : ".") > 0);
        if (access(elf, R_OK) < 0)
                fail_msg("%s is not built: %s", elf, strerror(errno));
        assert_true(asprintf(&log, "%s/triple-fault.log", workdir) > 0);
        struct vmm_boot_args a = { .vmm_path = vmm_path, .kernel = elf, .disk = diskpath, .id = "tf",
                                   .console_log = log, .overlay_dir = workdir };
        assert_int_equal(vmm_client_boot(&a, &p), 0);
        assert_int_equal(vmm_proc_wait(&p, CALL_TIMEOUT, &status), 0);
        assert_int_equal(p.pid, 0); /* reaped */
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), VMM_EXIT_TRIPLE_FAULT);
        assert_int_equal(console_tail(log, 5, &tail), 0);
        assert_string_equal(tail, "  forkd-triple-fault: started\n"
                                  "  forkd-triple-fault: loading an empty IDT, then faulting");
        vmm_proc_stop(&p, 0);

        /* A VM that is still running is left alone: -ETIMEDOUT. */
        struct vmm_boot_args g = { .vmm_path = vmm_path, .kernel = guest_path, .disk = diskpath, .mem_mib = 64,
                                   .id = "alive", .overlay_dir = workdir };
        assert_int_equal(vmm_client_boot(&g, &p), 0);
        status = -1;
        assert_int_equal(vmm_proc_wait(&p, 100 * 1000, &status), -ETIMEDOUT);
        assert_int_equal(status, -1);
        assert_true(p.pid > 0);
        vmm_proc_stop(&p, 1000000);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fork_ten_all_answer),
                cmocka_unit_test(test_identity_differs),
                cmocka_unit_test(test_memory_cow_isolation),
                cmocka_unit_test(test_disk_cow_isolation),
                cmocka_unit_test(test_kill_one_child),
                cmocka_unit_test(test_corrupt_snapshots_refused),
                cmocka_unit_test(test_crash_during_snapshot),
                cmocka_unit_test(test_triple_fault_at_boot),
        };
        int fd;

        vmm_path = getenv("FORKD_VMM");
        guest_path = getenv("FORKD_TEST_GUEST");
        if (!vmm_path || !guest_path) {
                fprintf(stderr, "FORKD_VMM and FORKD_TEST_GUEST must be set (meson test sets them)\n");
                return 1;
        }
        fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
        if (fd < 0) {
                printf("1..0 # SKIP /dev/kvm is not usable: %s\n", strerror(errno));
                return 77;
        }
        close(fd);
        signal(SIGPIPE, SIG_IGN);
        return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
