/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The jail: forkd-vmm confines itself the way Firecracker's jailer confines
 * Firecracker, but in-process, while it is still root and before any guest
 * code runs (forkd passes --confine UID:GID --jail-bind STATE_DIR; forkd
 * --no-confine passes neither, and then nothing here runs).
 *
 * 1. Files first. main.c opens /dev/kvm, and "boot" opens the kernel, initrd
 *    and disk, before anything below; those fds stay usable.
 * 2. jail_enter(), as root: a private mount namespace (everything made
 *    private, so nothing leaks back to the host), a new empty tmpfs as root
 *    holding only a /proc of our own (the branch code reads /proc/self/fd and
 *    /proc/self/pagemap) and the --jail-bind directories at their own paths,
 *    nosuid, nodev, noexec; pivot_root into it, the old root detached, the
 *    new root made read-only. forkd binds nothing: it names, with
 *    --jail-link, the directories of the snapshot's own chain, the overlay
 *    directory and the console directory, and each becomes, at its own path
 *    in the new root, a symbolic link to /proc/self/fd/N, N a descriptor of
 *    the directory opened here, before the switch, and never closed (every
 *    fork has it at the same number). So the VMM sees no other snapshot, and
 *    what it opens through those links lies on forkd's own mount of the state
 *    directory: a branch's writer may linkat() the parent's disk and its own
 *    frozen overlay into the new snapshot directory, which forkd makes and
 *    hands over as a descriptor (src/vmm/branch.c), and forkd may link what
 *    the writer may not (fs.protected_hardlinks). The VMM user may not pass
 *    through forkd's snapshots directory itself (root's, 0700), so ".." out
 *    of a linked snapshot leads nowhere. Then a new network namespace with
 *    nothing but a down lo, which a template's children share (step 3).
 * 3. Then, before it reads anything of the snapshot, every process drops
 *    everything (jail_drop_privileges()): no supplementary groups, the VMM's
 *    gid and uid, an empty bounding set, no capabilities in any set (ambient
 *    included), no_new_privs. The template does this too, and keeps no
 *    capability at all. A child that forkd sent a user namespace then
 *    switches to its sandbox's own id there (jail_enter_user()): the
 *    namespace is owned by the template's uid, and the owner of a user
 *    namespace has every capability in it and in no other, so the template
 *    needs none to send its child there, and may still kill it, and the
 *    kernel lets its death signal it, without CAP_KILL (as it may a child of
 *    its own uid, when there is no namespace). A child needs no privilege of
 *    its own: it joins its cgroup by writing to a cgroup.procs fd that forkd opened
 *    (the kernel checks the opener's rights) and its NIC is a tap fd that
 *    forkd opened in the sandbox's namespace. So a confined child never
 *    enters a network namespace (setns() needs CAP_SYS_ADMIN): it stays in
 *    its template's empty one, and it may not make a socket anyway.
 * 4. The VMM seccomp allow-list (jail_apply_seccomp()): the template loads it
 *    once, before it parses the snapshot, and its children inherit it, so a
 *    child is filtered from its first instruction and loads nothing itself;
 *    "boot" loads it right before its first KVM_RUN (jail_confine_vmm()).
 *    Branch copies and the frozen templates of a running sandbox's fork are
 *    fork()s of a confined process: they inherit all of it.
 *
 * The allow-lists kill the whole process on anything else
 * (SCMP_ACT_KILL_PROCESS); forkd sees a VMM killed by SIGSYS and reports its
 * sandbox as crashed. ioctl() is allowed only for the KVM requests the run
 * loop, the snapshot/branch code and a restore use, and the few terminal and
 * file ioctls the C library makes.
 *
 * 5. Every confined child of a template seals its identity after the switch
 *    (jail_seal_identity()): a second filter kills the calls of the switch,
 *    which the template's own filter has to allow.
 *
 * What this does not do: the VMMs share the VMM group, and the sandboxes of
 * one snapshot share its template's view, so a VMM that escapes its guest and
 * then its filters could read its own chain's snapshots and the console logs
 * (not another snapshot, nor another sandbox's files, memory or /proc
 * entries). "compact" and "check" run no guest and are not confined.
 */
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/fs.h>
#include <linux/if_tun.h>
#include <linux/kvm.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>
#include <assert.h>
#include <grp.h>
#include <limits.h>
#include <stddef.h>

#include "jail.h"
#include "macro.h"

struct jail jail;

/* mkdir -p of path under dfd (path without its leading '/'). */
static int mkdir_p_at(int dfd, const char *path) {
        char buf[PATH_MAX];
        size_t n = strlen(path);

        if (n >= sizeof(buf))
                return -ENAMETOOLONG;
        memcpy(buf, path, n + 1);
        for (char *p = buf;; p++) {
                if (*p == '/' || *p == 0) {
                        char c = *p;

                        *p = 0;
                        if (buf[0] && mkdirat(dfd, buf, 0755) < 0 && errno != EEXIST)
                                return -errno;
                        if (c == 0)
                                return 0;
                        *p = c;
                }
        }
}

static bool bind_path_is_valid(const char *p) {
        return p[0] == '/' && p[1] != 0 && strlen(p) < PATH_MAX - 16 && !strstr(p, "/../") &&
               !strstr(p, "/./") && strcmp(p + strlen(p) - 3, "/..") != 0 && strcmp(p + strlen(p) - 2, "/.") != 0;
}

#define JAIL_ROOT "/tmp"

/* a is b, or a directory above it */
static bool path_is_prefix(const char *a, const char *b) {
        size_t n = strlen(a);

        return strncmp(a, b, n) == 0 && (b[n] == 0 || b[n] == '/');
}

/* Every --jail-link a plain path that no other link or bind lies under or
 * above: mkdir_p_at() must never walk through one of the links. */
static int links_check(void) {
        for (unsigned i = 0; i < jail.n_links; i++) {
                if (!bind_path_is_valid(jail.links[i]))
                        return log_error_errno(EINVAL, "jail: --jail-link %s is not a plain absolute path",
                                               jail.links[i]);
                for (unsigned k = 0; k < jail.n_links; k++)
                        if (k != i && path_is_prefix(jail.links[k], jail.links[i]))
                                return log_error_errno(EINVAL, "jail: --jail-link %s lies in --jail-link %s",
                                                       jail.links[i], jail.links[k]);
                for (unsigned k = 0; k < jail.n_binds; k++)
                        if (path_is_prefix(jail.binds[k], jail.links[i]) ||
                            path_is_prefix(jail.links[i], jail.binds[k]))
                                return log_error_errno(EINVAL, "jail: --jail-link %s overlaps --jail-bind %s",
                                                       jail.links[i], jail.binds[k]);
        }
        return 0;
}

/* Opens each --jail-link directory, as root, into a descriptor at
 * JAIL_LINK_FD_MIN or above (where the limit allows) that stays open. */
static int links_open(int *fds) {
        for (unsigned i = 0; i < jail.n_links; i++) {
                int fd = open(jail.links[i], O_PATH | O_DIRECTORY | O_CLOEXEC), k;

                if (fd < 0)
                        return log_error_errno(errno, "jail: cannot open %s: %m", jail.links[i]);
                k = fcntl(fd, F_DUPFD_CLOEXEC, JAIL_LINK_FD_MIN);
                if (k >= 0) {
                        safe_close(fd);
                        fd = k;
                }
                fds[i] = fd;
        }
        return 0;
}

/* In the new root (root), at each link's path: a symbolic link to its descriptor. */
static int links_make(int root, const int *fds) {
        for (unsigned i = 0; i < jail.n_links; i++) {
                char target[64], parent[PATH_MAX];
                const char *slash = strrchr(jail.links[i], '/');
                int r;

                snprintf(parent, sizeof(parent), "%.*s", (int) (slash - jail.links[i]), jail.links[i]);
                r = parent[0] ? mkdir_p_at(root, parent + 1) : 0;
                if (r < 0)
                        return log_error_errno(r, "jail: cannot make %s: %m", parent);
                snprintf(target, sizeof(target), "/proc/self/fd/%d", fds[i]);
                if (symlinkat(target, root, jail.links[i] + 1) < 0)
                        return log_error_errno(errno, "jail: cannot link %s: %m", jail.links[i]);
        }
        return 0;
}

int jail_enter(void) {
        int src[JAIL_BINDS_MAX], links[JAIL_LINKS_MAX];
        _cleanup_close_ int root = -EBADF;
        int r = 0;

        for (unsigned i = 0; i < jail.n_binds; i++)
                src[i] = -EBADF;
        for (unsigned i = 0; i < jail.n_links; i++)
                links[i] = -EBADF;
        r = links_check();
        if (r < 0)
                return r;
        /* Before the new mount namespace: the descriptors keep forkd's own mounts,
         * on which forkd's directories (a branch's) lie too. */
        r = links_open(links);
        if (r < 0)
                goto out;

        if (unshare(CLONE_NEWNS) < 0) {
                r = log_error_errno(errno, "jail: unshare(CLONE_NEWNS) failed: %m");
                goto out;
        }
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
                r = log_error_errno(errno, "jail: making / private failed: %m");
                goto out;
        }

        /* Open what is bound before the tmpfs hides anything (a bind may live under /tmp). */
        for (unsigned i = 0; i < jail.n_binds; i++) {
                if (!bind_path_is_valid(jail.binds[i])) {
                        r = log_error_errno(EINVAL, "jail: --jail-bind %s is not a plain absolute path",
                                            jail.binds[i]);
                        goto out;
                }
                src[i] = open(jail.binds[i], O_PATH | O_DIRECTORY | O_CLOEXEC);
                if (src[i] < 0) {
                        r = log_error_errno(errno, "jail: cannot open %s: %m", jail.binds[i]);
                        goto out;
                }
        }

        if (mount("tmpfs", JAIL_ROOT, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k") < 0) {
                r = log_error_errno(errno, "jail: mounting its tmpfs failed: %m");
                goto out;
        }
        root = open(JAIL_ROOT, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (root < 0) {
                r = log_error_errno(errno, "jail: %m");
                goto out;
        }

        for (unsigned i = 0; i < jail.n_binds; i++) {
                char from[64], to[PATH_MAX];

                r = mkdir_p_at(root, jail.binds[i] + 1);
                if (r < 0) {
                        log_error_errno(r, "jail: cannot make %s: %m", jail.binds[i]);
                        goto out;
                }
                snprintf(from, sizeof(from), "/proc/self/fd/%d", src[i]);
                snprintf(to, sizeof(to), JAIL_ROOT "%s", jail.binds[i]);
                if (mount(from, to, NULL, MS_BIND | MS_REC, NULL) < 0 ||
                    mount(NULL, to, NULL, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) {
                        r = log_error_errno(errno, "jail: binding %s failed: %m", jail.binds[i]);
                        goto out;
                }
        }

        r = links_make(root, links);
        if (r < 0)
                goto out;

        /* A procfs of our own: process directories only, other users' hidden. */
        if (mkdirat(root, "proc", 0555) < 0) {
                r = log_error_errno(errno, "jail: %m");
                goto out;
        }
        if (mount("proc", JAIL_ROOT "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  "hidepid=invisible,subset=pid") < 0 &&
            mount("proc", JAIL_ROOT "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) {
                r = log_error_errno(errno, "jail: mounting /proc failed: %m");
                goto out;
        }

        if (chdir(JAIL_ROOT) < 0 || syscall(SYS_pivot_root, ".", ".") < 0) {
                r = log_error_errno(errno, "jail: pivot_root failed: %m");
                goto out;
        }
        /* The old root sits on top of the new one now: detach it. */
        if (umount2(".", MNT_DETACH) < 0 || chdir("/") < 0) {
                r = log_error_errno(errno, "jail: detaching the old root failed: %m");
                goto out;
        }
        if (mount(NULL, "/", NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k") <
            0) {
                r = log_error_errno(errno, "jail: making the root read-only failed: %m");
                goto out;
        }
        if (unshare(CLONE_NEWNET) < 0) {
                r = log_error_errno(errno, "jail: unshare(CLONE_NEWNET) failed: %m");
                goto out;
        }
out:
        for (unsigned i = 0; i < jail.n_binds; i++)
                safe_close(src[i]);
        /* The links' descriptors stay open for good, unless the jail failed. */
        for (unsigned i = 0; r < 0 && i < jail.n_links; i++)
                safe_close(links[i]);
        return r;
}

/* ---- capabilities ---- */

static int caps_set(uint64_t keep) {
        struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
        struct __user_cap_data_struct d[2] = {
                { .effective = (uint32_t) keep, .permitted = (uint32_t) keep, .inheritable = 0 },
                { .effective = (uint32_t) (keep >> 32), .permitted = (uint32_t) (keep >> 32), .inheritable = 0 },
        };

        return syscall(SYS_capset, &h, d) < 0 ? -errno : 0;
}

/* The highest capability this kernel knows, once bounding_set_keep() met the end; -1 until then. */
static int cap_last = -1;

/* Drops every capability not in keep from the bounding set (needs CAP_SETPCAP). */
static int bounding_set_keep(uint64_t keep) {
        for (unsigned long c = 0; c < 64; c++) {
                int in = prctl(PR_CAPBSET_READ, c, 0, 0, 0);

                if (in < 0) {
                        cap_last = (int) c - 1; /* past the last capability this kernel knows */
                        break;
                }
                if (in > 0 && !(keep & (UINT64_C(1) << c)) && prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0)
                        return -errno;
        }
        return 0;
}

/* Empties a bounding set known to be full: entering a user namespace gives every
 * capability the kernel knows. A drop each and no read: each call commits new
 * credentials, and a child that reads as well spends twice as long here. */
static int bounding_set_clear_full(void) {
        if (cap_last < 0)
                return bounding_set_keep(0);
        for (int c = 0; c <= cap_last; c++)
                if (prctl(PR_CAPBSET_DROP, (unsigned long) c, 0, 0, 0) < 0)
                        return -errno;
        return 0;
}

int jail_drop_privileges(void) {
        pid_t parent = getppid();
        int pdeath = 0, r;

        if (jail.dropped)
                return 0;
        /* A change of uid clears the parent-death signal: note it, to set it again below. */
        (void) prctl(PR_GET_PDEATHSIG, &pdeath, 0, 0, 0);
        /* The bounding set only limits what an execve() could gain; nothing here execs. */
        r = bounding_set_keep(0);
        if (r < 0)
                return log_error_errno(r, "jail: emptying the bounding set failed: %m");
        if (setgroups(1, &jail.gid) < 0 || setresgid(jail.gid, jail.gid, jail.gid) < 0 ||
            setresuid(jail.uid, jail.uid, jail.uid) < 0)
                return log_error_errno(errno, "jail: switching to %u:%u failed: %m", (unsigned) jail.uid,
                                       (unsigned) jail.gid);
        /* Leaving uid 0 cleared the permitted and effective sets already; say so anyway. */
        r = caps_set(0);
        if (r < 0)
                return log_error_errno(r, "jail: capset failed: %m");
        if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
                return log_error_errno(errno, "jail: clearing the ambient set failed: %m");
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
                return log_error_errno(errno, "jail: no_new_privs failed: %m");
        if (pdeath > 0) {
                if (prctl(PR_SET_PDEATHSIG, pdeath, 0, 0, 0) < 0)
                        return log_error_errno(errno, "jail: setting the parent-death signal again failed: %m");
                if (getppid() != parent)
                        return log_error_errno(ESRCH, "jail: the parent died while this process dropped its privileges");
        }
        jail.dropped = true;
        return 0;
}

/* ---- seccomp ---- */

/* What every profile allows: memory, signals, time, fd I/O on what is open,
 * sockets already connected, files under the jail's binds, fork and exit. */
static const int syscalls_vmm[] = {
        SCMP_SYS(read), SCMP_SYS(write), SCMP_SYS(readv), SCMP_SYS(writev), SCMP_SYS(pread64),
        SCMP_SYS(pwrite64), SCMP_SYS(lseek), SCMP_SYS(close), SCMP_SYS(fstat), SCMP_SYS(newfstatat),
        SCMP_SYS(statx), SCMP_SYS(fcntl), SCMP_SYS(dup), SCMP_SYS(dup3), SCMP_SYS(fsync), SCMP_SYS(fdatasync),
        SCMP_SYS(ftruncate), SCMP_SYS(copy_file_range), SCMP_SYS(getdents64),
        /* files: the console log, the overlay (O_TMPFILE), a branch's snapshot directory */
        SCMP_SYS(openat), SCMP_SYS(mkdirat), SCMP_SYS(unlinkat), SCMP_SYS(renameat), SCMP_SYS(renameat2),
        SCMP_SYS(linkat), SCMP_SYS(faccessat), SCMP_SYS(faccessat2), SCMP_SYS(access), SCMP_SYS(open),
        SCMP_SYS(mkdir), SCMP_SYS(unlink), SCMP_SYS(rename), SCMP_SYS(link), SCMP_SYS(rmdir),
        /* memory; memfd_create: the frozen template of a running sandbox's fork copies
         * each disk layer's map into one (virtio_blk_open_layers()) */
        SCMP_SYS(mmap), SCMP_SYS(munmap), SCMP_SYS(mprotect), SCMP_SYS(mremap), SCMP_SYS(madvise),
        SCMP_SYS(brk), SCMP_SYS(memfd_create),
        /* sockets: agent and control channels, fds received with SCM_RIGHTS */
        SCMP_SYS(sendmsg), SCMP_SYS(recvmsg), SCMP_SYS(sendto), SCMP_SYS(recvfrom), SCMP_SYS(poll),
        SCMP_SYS(ppoll), SCMP_SYS(accept4), SCMP_SYS(pipe2), SCMP_SYS(shutdown),
        /* signals: SIGIO kicks the vCPU; the frozen template's signalfd */
        SCMP_SYS(rt_sigaction), SCMP_SYS(rt_sigprocmask), SCMP_SYS(rt_sigreturn), SCMP_SYS(sigaltstack),
        SCMP_SYS(tgkill), SCMP_SYS(kill), SCMP_SYS(signalfd4), SCMP_SYS(restart_syscall),
        /* processes: branch and fork copies, the frozen template's children */
        SCMP_SYS(clone), SCMP_SYS(clone3), SCMP_SYS(fork), SCMP_SYS(wait4), SCMP_SYS(waitid),
        SCMP_SYS(set_robust_list), SCMP_SYS(rseq), SCMP_SYS(exit), SCMP_SYS(exit_group), SCMP_SYS(getpid),
        SCMP_SYS(gettid), SCMP_SYS(getppid), SCMP_SYS(getuid), SCMP_SYS(geteuid), SCMP_SYS(getgid),
        SCMP_SYS(getegid), SCMP_SYS(sched_yield), SCMP_SYS(futex),
        /* time and entropy (the identity event) */
        SCMP_SYS(clock_gettime), SCMP_SYS(gettimeofday), SCMP_SYS(time), SCMP_SYS(nanosleep),
        SCMP_SYS(clock_nanosleep), SCMP_SYS(getrandom),
        SCMP_SYS(timer_create), SCMP_SYS(timer_settime), SCMP_SYS(timer_delete), /* disk_rate, net_rate */
#ifdef __SANITIZE_ADDRESS__
        /* what ASan and UBSan make on their own: reports, shadow memory, exit */
        SCMP_SYS(readlink), SCMP_SYS(readlinkat), SCMP_SYS(sched_getaffinity), SCMP_SYS(prlimit64),
        SCMP_SYS(getrlimit), SCMP_SYS(setrlimit), SCMP_SYS(uname), SCMP_SYS(munlock), SCMP_SYS(mlock),
        SCMP_SYS(ptrace), SCMP_SYS(prctl), SCMP_SYS(personality), SCMP_SYS(msync), SCMP_SYS(mincore),
        SCMP_SYS(sysinfo),
#endif
};

/* The ioctls: KVM's, for creating and restoring a VM, running it and saving its state. */
static const unsigned long ioctls_kvm[] = {
        KVM_GET_API_VERSION, KVM_CREATE_VM, KVM_GET_VCPU_MMAP_SIZE, KVM_GET_SUPPORTED_CPUID,
        KVM_CREATE_VCPU, KVM_SET_USER_MEMORY_REGION, KVM_SET_TSS_ADDR, KVM_SET_IDENTITY_MAP_ADDR,
        KVM_CREATE_IRQCHIP, KVM_CREATE_PIT2, KVM_IRQ_LINE, KVM_GET_IRQCHIP, KVM_SET_IRQCHIP, KVM_GET_PIT2,
        KVM_SET_PIT2, KVM_GET_CLOCK, KVM_SET_CLOCK, KVM_RUN, KVM_GET_REGS, KVM_SET_REGS, KVM_GET_SREGS,
        KVM_SET_SREGS, KVM_GET_MSRS, KVM_SET_MSRS, KVM_SET_CPUID2, KVM_GET_LAPIC, KVM_SET_LAPIC,
        KVM_GET_MP_STATE, KVM_SET_MP_STATE, KVM_GET_VCPU_EVENTS, KVM_SET_VCPU_EVENTS, KVM_GET_DEBUGREGS,
        KVM_SET_DEBUGREGS, KVM_GET_XSAVE, KVM_SET_XSAVE, KVM_GET_XCRS, KVM_SET_XCRS, KVM_KVMCLOCK_CTRL,
        KVM_GET_TSC_KHZ,
        /* a block device as the disk (virtio-blk's size); the C library's own: isatty(), FIONBIO */
        BLKGETSIZE64, TCGETS, FIONBIO,
        /* virtio_net_check_backend(): a tap's flags and vnet header size, read
         * (never set) when a NIC gets its tap; in a template's children and in
         * the frozen template of a running sandbox's fork, that is under a filter */
        TUNGETIFF, TUNGETVNETHDRSZ,
};

/* A template's, for its children's switch to a user of their own
 * (jail_enter_user()) and the filter that seals it (jail_seal_identity()),
 * which kills each of these again. */
static const int syscalls_template[] = {
        SCMP_SYS(setns), SCMP_SYS(setresuid), SCMP_SYS(setresgid), SCMP_SYS(setgroups), SCMP_SYS(capset),
        SCMP_SYS(seccomp),
};
static const int prctls_template[] = { PR_CAPBSET_READ, PR_CAPBSET_DROP, PR_CAP_AMBIENT };

/* prctl() options the VMM uses after its filter is on (the dumpable flag: chain.c's
 * open_self_pagemap()). */
static const int prctls_vmm[] = { PR_SET_NAME, PR_GET_NAME, PR_SET_PDEATHSIG, PR_GET_PDEATHSIG, PR_GET_DUMPABLE,
                                  PR_SET_DUMPABLE };

static int add_all(scmp_filter_ctx ctx, const int *nrs, size_t n) {
        for (size_t i = 0; i < n; i++) {
                int r;

                if (nrs[i] < 0)
                        continue; /* not on this architecture (__NR_SCMP_ERROR) */
                r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nrs[i], 0);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int build_filter(scmp_filter_ctx *ret) {
        scmp_filter_ctx ctx;
        int r;

        ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
        if (!ctx)
                return -ENOMEM;
        /* A binary tree of syscall numbers rather than a list: fewer BPF steps per syscall. */
        (void) seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);
        r = add_all(ctx, syscalls_vmm, ELEMENTSOF(syscalls_vmm));
        for (size_t i = 0; r >= 0 && i < ELEMENTSOF(ioctls_kvm); i++)
                r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(ioctl), 1,
                                     SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, ioctls_kvm[i] & 0xffffffffu));
        for (size_t i = 0; r >= 0 && i < ELEMENTSOF(prctls_vmm); i++)
                r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(prctl), 1,
                                     SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t) prctls_vmm[i], 0));
        if (r >= 0 && jail.template)
                r = add_all(ctx, syscalls_template, ELEMENTSOF(syscalls_template));
        for (size_t i = 0; r >= 0 && jail.template && i < ELEMENTSOF(prctls_template); i++)
                r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(prctl), 1,
                                     SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t) prctls_template[i], 0));
        if (r < 0) {
                seccomp_release(ctx);
                return r;
        }
        *ret = ctx;
        return 0;
}

int jail_apply_seccomp(void) {
        scmp_filter_ctx ctx;
        int r;

        if (jail.filtered)
                return 0;
        r = build_filter(&ctx);
        if (r >= 0) {
                r = seccomp_load(ctx);
                seccomp_release(ctx);
        }
        if (r < 0)
                return log_error_errno(r, "jail: loading the seccomp filter failed: %m");
        jail.filtered = true;
        return 0;
}

int jail_enter_user(int userns_fd) {
        const gid_t group = 1; /* the template's group in the namespace */
        pid_t parent = getppid();
        int pdeath = 0, r;

        (void) prctl(PR_GET_PDEATHSIG, &pdeath, 0, 0, 0);
        if (setns(userns_fd, CLONE_NEWUSER) < 0)
                return log_error_errno(errno, "jail: entering the sandbox's user namespace failed: %m");
        if (setgroups(1, &group) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
                return log_error_errno(errno, "jail: switching to the sandbox's user failed: %m");
        /* Entering gave every capability, in the namespace only: none stays. */
        r = bounding_set_clear_full();
        if (r >= 0)
                r = caps_set(0);
        if (r < 0)
                return log_error_errno(r, "jail: dropping the namespace's capabilities failed: %m");
        if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
                return log_error_errno(errno, "jail: clearing the ambient set failed: %m");
        if (pdeath > 0) {
                if (prctl(PR_SET_PDEATHSIG, pdeath, 0, 0, 0) < 0)
                        return log_error_errno(errno, "jail: setting the parent-death signal again failed: %m");
                if (getppid() != parent)
                        return log_error_errno(ESRCH, "jail: the template died while this child switched users");
        }
        return 0;
}

int jail_seal_identity(void) {
        /* Kill on the calls of syscalls_template[], their older relatives, and
         * the prctl() options of prctls_template[]; allow the rest (the first
         * filter still applies). */
        static const int nrs[] = {
                __NR_setns, __NR_setresuid, __NR_setresgid, __NR_setgroups, __NR_capset, __NR_seccomp,
                __NR_setuid, __NR_setgid, __NR_setreuid, __NR_setregid, __NR_setfsuid, __NR_setfsgid, __NR_unshare,
        };
        struct sock_filter f[3 + 1 + 2 * ELEMENTSOF(nrs) + 8];
        struct sock_fprog prog = { .filter = f };
        unsigned n = 0;

        if (!jail.template || !jail.enabled || jail.sealed)
                return 0;
        f[n++] = (struct sock_filter) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
        f[n++] = (struct sock_filter) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
        f[n++] = (struct sock_filter) BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
        f[n++] = (struct sock_filter) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
        for (size_t i = 0; i < ELEMENTSOF(nrs); i++) {
                f[n++] = (struct sock_filter) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t) nrs[i], 0, 1);
                f[n++] = (struct sock_filter) BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
        }
        /* prctl(): its option, the low word of args[0] (x86-64 is little-endian) */
        f[n++] = (struct sock_filter) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_prctl, 0, 6);
        f[n++] = (struct sock_filter) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]));
        f[n++] = (struct sock_filter) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PR_CAPBSET_READ, 3, 0);
        f[n++] = (struct sock_filter) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PR_CAPBSET_DROP, 2, 0);
        f[n++] = (struct sock_filter) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PR_CAP_AMBIENT, 1, 0);
        f[n++] = (struct sock_filter) BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
        f[n++] = (struct sock_filter) BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
        f[n++] = (struct sock_filter) BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
        assert(n <= ELEMENTSOF(f));
        prog.len = (unsigned short) n;
        if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0)
                return log_error_errno(errno, "jail: loading the filter that seals the child's user failed: %m");
        jail.sealed = true;
        return 0;
}

int jail_confine_vmm(void) {
        int r;

        if (!jail.enabled || jail.confined)
                return 0;
        r = jail_drop_privileges();
        if (r < 0)
                return r;
        r = jail_apply_seccomp(); /* a template's child: inherited, nothing to do */
        if (r < 0)
                return r;
        jail.confined = true;
        return 0;
}

void jail_test_hook(uint8_t what) {
        if (!jail.test_hooks)
                return;
        switch (what) {
        case JAIL_TEST_SETRESUID:
                /* The template's filter has it, for its children's switch of user; their seal kills it. */
                log_info("test hook: calling setresuid(-1, -1, -1), which the allow-list does not have");
                (void) setresuid((uid_t) -1, (uid_t) -1, (uid_t) -1);
                break;
        case JAIL_TEST_PRCTL:
                log_info("test hook: calling prctl(PR_GET_KEEPCAPS), an option the allow-list does not have");
                (void) prctl(PR_GET_KEEPCAPS, 0, 0, 0, 0);
                break;
        default:
                /* In no allow-list: the filter kills the process here (SIGSYS). */
                log_info("test hook: calling getcpu(), which no allow-list has");
                (void) syscall(SYS_getcpu, NULL, NULL, NULL);
                break;
        }
        log_error("test hook: the call returned; this VMM is not filtered");
}
