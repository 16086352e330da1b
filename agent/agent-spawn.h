/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * fork + exec for children that posix_spawn cannot make: another user (its
 * groups, then its uid), or extra fds at 3 and 4. The child gets a clean
 * signal mask and default dispositions, stdin /dev/null (unless given), and
 * its own session when asked (with stdin, a terminal, as its controlling
 * tty when asked too). A failure before exec comes back as its errno.
 */

#include <stdbool.h>
#include <sys/types.h>

#include "agent-image.h"

typedef struct SpawnParams {
        const char *path;          /* what execve() runs: looked up already */
        char *const *argv;
        char *const *envp;
        const char *cwd;           /* NULL: the agent's */
        const UserIds *user;       /* NULL: the agent's */
        int stdin_fd;              /* < 0: /dev/null */
        int stdout_fd, stderr_fd;  /* < 0: the agent's */
        int fd3, fd4;              /* < 0: none */
        bool new_session;
        bool controlling_tty;      /* with new_session: stdin (a tty) becomes the session's controlling tty */
} SpawnParams;

#define SPAWN_PARAMS_INIT { .stdin_fd = -1, .stdout_fd = -1, .stderr_fd = -1, .fd3 = -1, .fd4 = -1 }

/* 0 and the pid, or the negative errno of the step that failed in the child
 * (chdir, setuid, execve...). */
int agent_spawn(const SpawnParams *p, pid_t *ret_pid);
