/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A confined VMM's user of its own (forkd's src/daemon/vmm-userns.c, forkd-vmm's
 * jail_enter_user() and jail_seal_identity()): a process with the template's
 * uid and no capability enters the namespace forkd made and runs as the
 * sandbox's id, its gid, the template's group as its one supplementary group,
 * without any capability; then a set*id() call kills it. Needs root and user
 * namespaces: skipped without. */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <grp.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "jail.h"
#include "vmm-userns.h"

#define TEMPLATE_UID 65533
#define SANDBOX_ID 1879048197u

static char *status_line(pid_t pid, const char *key) {
        char path[64], line[512];
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/status", (int) pid);
        f = fopen(path, "re");
        assert_non_null(f);
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, key, strlen(key)) == 0 && line[strlen(key)] == ':') {
                        fclose(f);
                        line[strcspn(line, "\n")] = 0;
                        while (strlen(line) > 0 && line[strlen(line) - 1] == ' ')
                                line[strlen(line) - 1] = 0;
                        return strdup(line + strlen(key) + 1 + strspn(line + strlen(key) + 1, " \t"));
                }
        fclose(f);
        return NULL;
}

static void assert_status(pid_t pid, const char *key, const char *want) {
        char *v = status_line(pid, key);

        assert_non_null(v);
        if (strcmp(v, want) != 0)
                fail_msg("%s: '%s', not '%s'", key, v, want);
        free(v);
}

/* As a confined template: the template's ids, no capability, no_new_privs. */
static void become_template(void) {
        gid_t g = TEMPLATE_UID;

        if (setgroups(1, &g) < 0 || setresgid(g, g, g) < 0 || setresuid(TEMPLATE_UID, TEMPLATE_UID, TEMPLATE_UID) < 0 ||
            prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
                _exit(90);
}

static void test_switch(void **state) {
        int fd = -1, p[2], r;
        pid_t pid;
        char c;

        if (geteuid() != 0)
                skip();
        r = vmm_userns_new(TEMPLATE_UID, SANDBOX_ID, TEMPLATE_UID, &fd);
        if (r == -EPERM || r == -ENOSPC || r == -EINVAL || r == -ENOSYS) {
                print_message("no user namespaces here (%s): skipped\n", strerror(-r));
                skip();
        }
        assert_int_equal(r, 0);
        assert_int_equal(pipe2(p, O_CLOEXEC), 0);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                become_template();
                jail.enabled = jail.template = true;
                if (jail_enter_user(fd) < 0)
                        _exit(91);
                if (jail_seal_identity() < 0)
                        _exit(92);
                (void) write(p[1], "x", 1);
                pause();
                _exit(0);
        }
        close(p[1]);
        assert_int_equal(read(p[0], &c, 1), 1);
        assert_status(pid, "Uid", "1879048197\t1879048197\t1879048197\t1879048197");
        assert_status(pid, "Gid", "1879048197\t1879048197\t1879048197\t1879048197");
        assert_status(pid, "Groups", "65533");
        assert_status(pid, "CapEff", "0000000000000000");
        assert_status(pid, "CapPrm", "0000000000000000");
        assert_status(pid, "CapBnd", "0000000000000000");
        assert_status(pid, "Seccomp", "2");
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_int_equal(waitpid(pid, NULL, 0), pid);
        close(p[0]);
        close(fd);
}

/* As forkd.service runs forkd: without CAP_SYS_PTRACE (not in its bounding set),
 * which opening /proc/PID/ns/user of a process of another uid would take. The
 * namespace still comes back, owned by the template's uid, with the maps. */
static void test_without_ptrace(void **state) {
        int status;
        pid_t pid;

        if (geteuid() != 0)
                skip();
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                int fd = -1, r;
                char map[64] = "";
                ssize_t n;

                struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
                struct __user_cap_data_struct d[2];

                if (prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0) < 0 || syscall(SYS_capget, &h, d) < 0)
                        _exit(90);
                d[0].effective &= ~(1u << CAP_SYS_PTRACE);
                d[0].permitted &= ~(1u << CAP_SYS_PTRACE);
                d[0].inheritable &= ~(1u << CAP_SYS_PTRACE);
                if (syscall(SYS_capset, &h, d) < 0)
                        _exit(90);
                r = vmm_userns_new(TEMPLATE_UID, SANDBOX_ID, TEMPLATE_UID, &fd);
                if (r == -EPERM || r == -ENOSPC || r == -EINVAL || r == -ENOSYS)
                        _exit(77);
                if (r < 0)
                        _exit(91);
                /* A process that enters it sees the map forkd wrote. */
                if (fork() == 0) {
                        int m;

                        if (setns(fd, CLONE_NEWUSER) < 0)
                                _exit(92);
                        m = open("/proc/self/uid_map", O_RDONLY | O_CLOEXEC);
                        n = m < 0 ? -1 : read(m, map, sizeof(map) - 1);
                        _exit(n > 0 && strstr(map, "1879048197") ? 0 : 93);
                }
                if (wait(&status) < 0 || !WIFEXITED(status))
                        _exit(94);
                _exit(WEXITSTATUS(status));
        }
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        if (WEXITSTATUS(status) == 77)
                skip();
        assert_int_equal(WEXITSTATUS(status), 0);
}

/* Sealed: the switch's own calls kill the process. */
static void test_sealed(void **state) {
        int fd = -1, status, r;
        pid_t pid;

        if (geteuid() != 0)
                skip();
        r = vmm_userns_new(TEMPLATE_UID, SANDBOX_ID, TEMPLATE_UID, &fd);
        if (r < 0)
                skip();
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                become_template();
                jail.enabled = jail.template = true;
                if (jail_enter_user(fd) < 0 || jail_seal_identity() < 0)
                        _exit(91);
                (void) setresuid((uid_t) -1, (uid_t) -1, (uid_t) -1);
                _exit(0);
        }
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status));
        assert_int_equal(WTERMSIG(status), SIGSYS);
        close(fd);
}

/* The template's uid owns the namespace: without it a process may not enter. */
static void test_owner_only(void **state) {
        int fd = -1, status, r;
        pid_t pid;

        if (geteuid() != 0)
                skip();
        r = vmm_userns_new(TEMPLATE_UID, SANDBOX_ID, TEMPLATE_UID, &fd);
        if (r < 0)
                skip();
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                gid_t g = 65534;

                if (setgroups(1, &g) < 0 || setresgid(g, g, g) < 0 || setresuid(65534, 65534, 65534) < 0)
                        _exit(90);
                jail.enabled = jail.template = true;
                _exit(jail_enter_user(fd) < 0 ? 0 : 1);
        }
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        close(fd);
}

/* The helper that makes a namespace leaves the caller's fd table before it stops
 * for its maps: had it kept that table, a caller killed under it would have its
 * files (forkd's bus connection, the state directory's lock) held on until the
 * helper's exit had torn down the caller's whole address space. A thread makes
 * namespaces while this one looks at every helper it finds stopped. */
struct maker {
        pid_t tid;
        int made;
        volatile int done;
};

static void *make_many(void *userdata) {
        struct maker *m = userdata;

        __atomic_store_n(&m->tid, (pid_t) syscall(SYS_gettid), __ATOMIC_SEQ_CST);
        for (int i = 0; i < 2000; i++) {
                int fd = -1;

                if (vmm_userns_new(TEMPLATE_UID, SANDBOX_ID, TEMPLATE_UID, &fd) < 0)
                        break;
                close(fd);
                m->made++;
        }
        m->done = 1;
        return NULL;
}

static int count_fds(pid_t pid) {
        char path[64];
        struct dirent *de;
        DIR *d;
        int n = 0;

        snprintf(path, sizeof(path), "/proc/%d/fd", (int) pid);
        d = opendir(path);
        if (!d)
                return -1;
        while ((de = readdir(d)))
                if (de->d_name[0] != '.')
                        n++;
        closedir(d);
        return n;
}

static void test_helper_own_files(void **state) {
        struct maker m = {};
        char path[96];
        pthread_t t;
        int fd = -1, seen = 0, with_fds = 0;

        if (geteuid() != 0 || vmm_userns_new(TEMPLATE_UID, SANDBOX_ID, TEMPLATE_UID, &fd) < 0)
                skip();
        close(fd);
        assert_int_equal(pthread_create(&t, NULL, make_many, &m), 0);
        while (!__atomic_load_n(&m.tid, __ATOMIC_SEQ_CST))
                ;
        snprintf(path, sizeof(path), "/proc/self/task/%d/children", (int) m.tid);
        while (!m.done) {
                FILE *f = fopen(path, "re");
                int pid;

                if (!f)
                        continue;
                while (fscanf(f, "%d", &pid) == 1) {
                        char stat_path[64], line[512], *p;
                        FILE *g;
                        int n;

                        snprintf(stat_path, sizeof(stat_path), "/proc/%d/stat", pid);
                        g = fopen(stat_path, "re");
                        if (!g)
                                continue;
                        p = fgets(line, sizeof(line), g) ? strrchr(line, ')') : NULL;
                        fclose(g);
                        if (!p || p[1] != ' ' || p[2] != 'T')
                                continue; /* not stopped for its maps yet */
                        n = count_fds(pid);
                        if (n < 0)
                                continue; /* gone meanwhile */
                        seen++;
                        if (n > 0)
                                with_fds++;
                }
                fclose(f);
        }
        assert_int_equal(pthread_join(t, NULL), 0);
        print_message("%d namespaces made, %d stopped helpers seen, %d of them with fds\n", m.made, seen, with_fds);
        assert_int_equal(m.made, 2000);
        assert_true(seen > 0);
        assert_int_equal(with_fds, 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_switch),
                cmocka_unit_test(test_without_ptrace),
                cmocka_unit_test(test_sealed),
                cmocka_unit_test(test_owner_only),
                cmocka_unit_test(test_helper_own_files),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
