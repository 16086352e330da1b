/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The user namespace of one confined VMM: a helper, a clone() of the calling
 * thread that shares its memory (CLONE_VM: no copy of forkd's page tables),
 * takes the template's uid as its effective one, keeping its capabilities
 * (SECBIT_NO_SETUID_FIXUP), so that the namespace it then unshares is owned by
 * that uid, opens that namespace into forkd's fd table (CLONE_FILES), leaves that
 * table for an empty one of its own, and stops itself, with SIGKILL as its
 * parent-death signal. forkd writes the maps of the stopped helper and kills it:
 * the fd keeps the namespace. The helper opens the fd itself because forkd may
 * not open /proc/PID/ns/user of a process of another uid: that takes
 * CAP_SYS_PTRACE, which forkd.service does not grant.
 *
 * It leaves forkd's fd table as soon as the fd is there because a task's files
 * are let go only after its memory on the way out: a helper that shared both
 * with a forkd killed under it was the last user of forkd's address space, and
 * until that was torn down (seconds, under AddressSanitizer) forkd's bus
 * connection and its state directory's lock lived on in the helper.
 *
 * The helper runs on a stack of its own beside a thread of the C library
 * without being one, so it makes raw system calls only; set*id() of the C
 * library would signal every thread of forkd to switch with it.
 */
#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/securebits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "macro.h"
#include "vmm-userns.h"

#define HELPER_STACK (64u << 10)

enum {
        HELPER_EXIT_SECUREBITS = 10,
        HELPER_EXIT_SETUID,
        HELPER_EXIT_UNSHARE,
        HELPER_EXIT_NSFD,
        HELPER_EXIT_FILES,
        HELPER_EXIT_PARENT,
};

struct helper_args {
        uid_t owner;
        pid_t parent;
        int ns_fd; /* set by the helper, in the fd table it shares with forkd */
};

static int helper(void *userdata) {
        struct helper_args *a = userdata;
        long fd;

        if (syscall(SYS_prctl, PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP, 0, 0, 0) < 0)
                syscall(SYS_exit, HELPER_EXIT_SECUREBITS);
        if (syscall(SYS_setresuid, (uid_t) -1, a->owner, (uid_t) -1) < 0)
                syscall(SYS_exit, HELPER_EXIT_SETUID);
        if (syscall(SYS_unshare, CLONE_NEWUSER) < 0)
                syscall(SYS_exit, HELPER_EXIT_UNSHARE);
        fd = syscall(SYS_openat, AT_FDCWD, "/proc/self/ns/user", O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                syscall(SYS_exit, HELPER_EXIT_NSFD);
        a->ns_fd = (int) fd;
        /* Out of forkd's fd table, into an empty one of its own. */
        if (syscall(SYS_close_range, 0U, ~0U, CLOSE_RANGE_UNSHARE) < 0) {
                /* Before Linux 5.9: a copy of the table, each of its fds closed. */
                struct rlimit rl = { .rlim_cur = 65536 };

                if (syscall(SYS_unshare, CLONE_FILES) < 0)
                        syscall(SYS_exit, HELPER_EXIT_FILES);
                (void) syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, NULL, &rl);
                for (unsigned long i = 0; i < rl.rlim_cur && i < (1ul << 20); i++)
                        (void) syscall(SYS_close, i);
        }
        /* Stopped, it would outlive a killed forkd, holding forkd's memory: it
         * dies with forkd. Set here, after the switch of uid, which clears it. */
        if (syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || syscall(SYS_getppid) != a->parent)
                syscall(SYS_exit, HELPER_EXIT_PARENT);
        syscall(SYS_kill, syscall(SYS_getpid), SIGSTOP);
        syscall(SYS_exit, 0);
        return 0;
}

static int write_map(pid_t pid, const char *which, const char *map) {
        _cleanup_close_ int fd = -EBADF;
        char path[64];
        ssize_t n;

        snprintf(path, sizeof(path), "/proc/%d/%s", (int) pid, which);
        fd = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return -errno;
        /* One write(), whole, as the kernel wants a map. */
        n = write(fd, map, strlen(map));
        if (n < 0)
                return -errno;
        return (size_t) n == strlen(map) ? 0 : -EIO;
}

int vmm_userns_new(uid_t owner, uid_t id, gid_t group, int *ret_fd) {
        _cleanup_free_ void *stack = NULL;
        struct helper_args args = { .owner = owner, .parent = getpid(), .ns_fd = -EBADF };
        char uid_map[64], gid_map[96];
        int status, r = 0;
        pid_t pid;

        stack = malloc(HELPER_STACK);
        if (!stack)
                return -ENOMEM;
        /* No exit signal: forkd's own SIGCHLD handling never sees it (waited with __WALL). */
        pid = clone(helper, (uint8_t *) stack + HELPER_STACK, CLONE_VM | CLONE_FILES, &args);
        if (pid < 0)
                return -errno;
        while (waitpid(pid, &status, WUNTRACED | __WALL) < 0)
                if (errno != EINTR) {
                        r = -errno;
                        (void) kill(pid, SIGKILL);
                        goto reap;
                }
        if (!WIFSTOPPED(status)) {
                safe_close(args.ns_fd);
                r = WIFEXITED(status) && WEXITSTATUS(status) == HELPER_EXIT_UNSHARE ? -EPERM : -ECHILD;
                return log_debug_errno(r, "The user namespace helper ended with %d before it made one.",
                                       WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        }
        snprintf(uid_map, sizeof(uid_map), "0 %u 1\n", (unsigned) id);
        snprintf(gid_map, sizeof(gid_map), "0 %u 1\n1 %u 1\n", (unsigned) id, (unsigned) group);
        r = write_map(pid, "uid_map", uid_map);
        if (r >= 0)
                r = write_map(pid, "gid_map", gid_map);
        (void) kill(pid, SIGKILL);
reap:
        while (waitpid(pid, &status, __WALL) < 0 && errno == EINTR)
                ;
        if (r < 0) {
                safe_close(args.ns_fd);
                return r;
        }
        *ret_fd = args.ns_fd;
        return 0;
}
