/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* What PID 1 does besides serving the channel. */

#include <stdbool.h>

/* Mount /proc, /sys, /dev, /dev/pts, /dev/shm, /tmp and /run where not yet
 * mounted, set up the /dev symlinks, make sure fds 0-2 are open and set a
 * sane environment (PATH, HOME, LANG). Failures are logged, never fatal. */
void pid1_setup(void);

/* Load kernel modules with modprobe (busybox or kmod), waiting for it. */
void pid1_modprobe(char *const *modules, unsigned n);

/* Signal dispositions: SIGCHLD to a handler that writes to pipe_fd; as PID 1
 * also SIGTERM, SIGINT, SIGHUP and SIGPIPE to a handler that does nothing
 * (handlers, unlike SIG_IGN, do not survive exec into children); not PID 1,
 * only SIGPIPE. */
int signals_setup(int pipe_fd, bool pid1);

/* sync, then power off (PID 1) or exit(0). Does not return. */
_Noreturn void agent_poweroff(bool pid1);

/* A boolean switch of the kernel command line: 1 for "key", "key=1|yes|true|on",
 * 0 for "key=0|no|false|off", -ENOENT when absent, -EINVAL for another value.
 * The last occurrence counts, as the kernel's own parameters. */
int cmdline_get_bool(const char *cmdline, const char *key);

/* /proc/cmdline (at most 4 KiB), NUL-terminated. */
int proc_cmdline_read(char **ret);
