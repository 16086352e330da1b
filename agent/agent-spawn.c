/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent-spawn.h"
#include "io-util.h"
#include "macro.h"

/* In the child: move fd to at least 10, so that the dup2()s below never clobber a source */
static int lift(int fd) {
        return fd < 0 ? fd : fcntl(fd, F_DUPFD_CLOEXEC, 10);
}

static _Noreturn void child_fail(int err_fd, int err) {
        (void) !write(err_fd, &err, sizeof err);
        _exit(127);
}

static _Noreturn void spawn_child(const SpawnParams *p, int err_fd) {
        struct sigaction sa = { .sa_handler = SIG_DFL };
        int src[5] = { p->stdin_fd, p->stdout_fd, p->stderr_fd, p->fd3, p->fd4 };
        sigset_t none;

        for (int sig = 1; sig < _NSIG; sig++)
                (void) sigaction(sig, &sa, NULL);
        sigemptyset(&none);
        (void) sigprocmask(SIG_SETMASK, &none, NULL);
        if (p->new_session && setsid() < 0)
                child_fail(err_fd, errno);

        if (src[0] < 0)
                src[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (src[0] < 0)
                child_fail(err_fd, errno);
        for (int i = 0; i < 5; i++)
                if (src[i] >= 0) {
                        src[i] = lift(src[i]);
                        if (src[i] < 0)
                                child_fail(err_fd, errno);
                }
        for (int i = 0; i < 5; i++)
                if (src[i] >= 0 && dup2(src[i], i) < 0) /* dup2 clears FD_CLOEXEC on the copy */
                        child_fail(err_fd, errno);
        if (p->new_session && p->controlling_tty && ioctl(STDIN_FILENO, TIOCSCTTY, 0) < 0)
                child_fail(err_fd, errno);

        if (p->user) {
                if (setgroups(p->user->n_groups, p->user->groups) < 0 ||
                    setresgid(p->user->gid, p->user->gid, p->user->gid) < 0 ||
                    setresuid(p->user->uid, p->user->uid, p->user->uid) < 0)
                        child_fail(err_fd, errno);
        }
        if (p->cwd && chdir(p->cwd) < 0)
                child_fail(err_fd, errno);
        execve(p->path, p->argv, p->envp);
        child_fail(err_fd, errno);
}

int agent_spawn(const SpawnParams *p, pid_t *ret_pid) {
        int err_pipe[2], err = 0;
        ssize_t n;
        pid_t pid;

        if (pipe2(err_pipe, O_CLOEXEC) < 0)
                return -errno;
        pid = fork();
        if (pid < 0) {
                err = errno;
                safe_close(err_pipe[0]);
                safe_close(err_pipe[1]);
                return -err;
        }
        if (pid == 0) {
                safe_close(err_pipe[0]);
                spawn_child(p, err_pipe[1]);
        }
        safe_close(err_pipe[1]);
        n = loop_read(err_pipe[0], &err, sizeof err);
        safe_close(err_pipe[0]);
        if (n == (ssize_t) sizeof err) {
                /* it failed before exec: reap it here, nobody else knows it */
                while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                        ;
                return -(err ?: EIO);
        }
        *ret_pid = pid;
        return 0;
}
