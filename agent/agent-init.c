/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "agent-init.h"
#include "agent.h"
#include "macro.h"

extern char **environ;

static const struct {
        const char *source, *target, *type, *options;
        unsigned long flags;
} mounts[] = {
        { "proc", "/proc", "proc", NULL, MS_NOSUID | MS_NODEV | MS_NOEXEC },
        { "sysfs", "/sys", "sysfs", NULL, MS_NOSUID | MS_NODEV | MS_NOEXEC },
        { "devtmpfs", "/dev", "devtmpfs", "mode=0755", MS_NOSUID },
        { "devpts", "/dev/pts", "devpts", "mode=0620,ptmxmode=0666", MS_NOSUID | MS_NOEXEC },
        { "tmpfs", "/dev/shm", "tmpfs", "mode=1777", MS_NOSUID | MS_NODEV },
        { "tmpfs", "/tmp", "tmpfs", "mode=1777", MS_NOSUID | MS_NODEV },
        { "tmpfs", "/run", "tmpfs", "mode=0755", MS_NOSUID | MS_NODEV },
};

static const struct {
        const char *target, *path;
} dev_links[] = {
        { "/proc/self/fd", "/dev/fd" },
        { "/proc/self/fd/0", "/dev/stdin" },
        { "/proc/self/fd/1", "/dev/stdout" },
        { "/proc/self/fd/2", "/dev/stderr" },
};

/* Is path a mount point? From /proc/self/mountinfo once /proc is there (it
 * sees bind mounts too); before that, a mount point sits on another device
 * than its parent. */
static bool is_mount_point(const char *path) {
        _cleanup_fclose_ FILE *f = NULL;
        char parent[PATH_MAX], line[4096];
        struct stat a, b;

        f = fopen("/proc/self/mountinfo", "re");
        if (f) {
                while (fgets(line, sizeof line, f)) {
                        char mp[PATH_MAX];

                        /* id parent major:minor root mount-point ... */
                        if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) == 1 && streq(mp, path))
                                return true;
                }
                return false;
        }

        if (stat(path, &a) < 0)
                return false;
        if (snprintf(parent, sizeof parent, "%s/..", path) >= (int) sizeof parent)
                return false;
        if (stat(parent, &b) < 0)
                return false;
        return a.st_dev != b.st_dev || a.st_ino == b.st_ino;
}

static void ensure_std_fds(void) {
        for (int fd = 0; fd <= 2; fd++) {
                int n;

                if (fcntl(fd, F_GETFD) >= 0)
                        continue;
                n = open(fd == 0 ? "/dev/null" : "/dev/console", fd == 0 ? O_RDONLY : O_WRONLY | O_NOCTTY);
                if (n < 0 && fd > 0)
                        n = open("/dev/null", O_WRONLY);
                if (n >= 0 && n != fd) {
                        (void) dup2(n, fd);
                        (void) close(n);
                }
        }
}

void pid1_setup(void) {
        for (size_t i = 0; i < ELEMENTSOF(mounts); i++) {
                if (mkdir(mounts[i].target, 0755) < 0 && errno != EEXIST)
                        log_debug_errno(errno, "mkdir %s: %m", mounts[i].target);
                if (is_mount_point(mounts[i].target))
                        continue;
                if (mount(mounts[i].source, mounts[i].target, mounts[i].type, mounts[i].flags,
                          mounts[i].options) < 0 && errno != EBUSY)
                        log_warning_errno(errno, "Failed to mount %s on %s: %m", mounts[i].type,
                                          mounts[i].target);
        }
        for (size_t i = 0; i < ELEMENTSOF(dev_links); i++)
                if (symlink(dev_links[i].target, dev_links[i].path) < 0 && errno != EEXIST)
                        log_debug_errno(errno, "symlink %s: %m", dev_links[i].path);
        if (access("/dev/ptmx", F_OK) < 0)
                (void) symlink("pts/ptmx", "/dev/ptmx");

        ensure_std_fds();
        (void) umask(0022);
        (void) chdir("/");

        /* what the kernel hands init is nearly empty */
        (void) setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
        (void) setenv("HOME", "/root", 0);
        (void) setenv("LANG", "C.UTF-8", 0);
        (void) setenv("TERM", "dumb", 0);

        /* Ctrl-Alt-Del sends SIGINT to init (ignored) instead of rebooting */
        (void) reboot(RB_DISABLE_CAD);
}

void pid1_modprobe(char *const *modules, unsigned n) {
        _cleanup_free_ char **argv = NULL;
        int status;
        pid_t pid;
        int r;

        if (n == 0)
                return;
        argv = calloc(n + 4, sizeof *argv);
        if (!argv)
                return (void) log_oom();
        argv[0] = (char *) "modprobe";
        argv[1] = (char *) "-q";
        argv[2] = (char *) "-a";
        for (unsigned i = 0; i < n; i++)
                argv[3 + i] = modules[i];

        r = posix_spawnp(&pid, "modprobe", NULL, NULL, argv, environ);
        if (r != 0)
                return (void) log_warning_errno(r, "Failed to run modprobe: %m");
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                log_warning("modprobe failed for some modules.");
}

int cmdline_get_bool(const char *cmdline, const char *key) {
        size_t klen = strlen(key);
        const char *p = cmdline;
        int ret = -ENOENT;

        while (*p) {
                size_t wlen;

                p += strspn(p, " \t\n");
                wlen = strcspn(p, " \t\n");
                if (wlen == 0)
                        break;
                if (wlen >= klen && strncmp(p, key, klen) == 0) {
                        const char *v = p + klen;
                        size_t vlen = wlen - klen;

                        if (vlen == 0)
                                ret = 1;
                        else if (*v == '=') {
                                static const char *const yes[] = { "1", "yes", "true", "on" };
                                static const char *const no[] = { "0", "no", "false", "off" };

                                v++;
                                vlen--;
                                ret = -EINVAL;
                                for (size_t i = 0; i < ELEMENTSOF(yes); i++) {
                                        if (strlen(yes[i]) == vlen && strncmp(v, yes[i], vlen) == 0)
                                                ret = 1;
                                        if (strlen(no[i]) == vlen && strncmp(v, no[i], vlen) == 0)
                                                ret = 0;
                                }
                        }
                        /* else a longer key with this one as prefix: not ours */
                }
                p += wlen;
        }
        return ret;
}

int proc_cmdline_read(char **ret) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        size_t n = 0;
        const size_t max = 4096;

        fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        buf = malloc(max + 1);
        if (!buf)
                return -ENOMEM;
        while (n < max) {
                ssize_t k = read(fd, buf + n, max - n);

                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                if (k == 0)
                        break;
                n += (size_t) k;
        }
        buf[n] = 0;
        *ret = TAKE_PTR(buf);
        return 0;
}

static int sigchld_pipe_fd = -1;

static void on_sigchld(int sig) {
        int saved = errno;
        char c = 0;

        (void) !write(sigchld_pipe_fd, &c, 1); /* nonblocking; a full pipe already wakes the loop */
        errno = saved;
}

static void on_ignored(int sig) {
}

int signals_setup(int pipe_fd, bool pid1) {
        struct sigaction chld = { .sa_handler = on_sigchld, .sa_flags = SA_RESTART | SA_NOCLDSTOP };
        struct sigaction nop = { .sa_handler = on_ignored, .sa_flags = SA_RESTART };
        sigset_t none;

        sigchld_pipe_fd = pipe_fd;
        sigemptyset(&chld.sa_mask);
        sigemptyset(&nop.sa_mask);
        if (sigaction(SIGCHLD, &chld, NULL) < 0)
                return -errno;
        if (sigaction(SIGPIPE, &nop, NULL) < 0)
                return -errno;
        if (pid1) {
                (void) sigaction(SIGTERM, &nop, NULL);
                (void) sigaction(SIGINT, &nop, NULL);
                (void) sigaction(SIGHUP, &nop, NULL);
                (void) sigaction(SIGUSR1, &nop, NULL);
                (void) sigaction(SIGUSR2, &nop, NULL);
        }
        sigemptyset(&none);
        (void) sigprocmask(SIG_SETMASK, &none, NULL);
        return 0;
}

_Noreturn void agent_poweroff(bool pid1) {
        sync();
        if (pid1) {
                (void) kill(-1, SIGKILL);
                sync();
                /* forkd-vmm's machine has hardware-reduced ACPI with no sleep
                 * registers, so RB_POWER_OFF would only halt the CPU. A reset
                 * (the kernel's reboot=k writes 0xFE to the i8042) is what
                 * makes the VMM stop cleanly. */
                (void) reboot(RB_AUTOBOOT);
                log_error_errno(errno, "Reset failed: %m");
                for (;;)
                        pause(); /* PID 1 must not exit */
        }
        exit(EXIT_SUCCESS);
}
