/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd doctor: devices, the kernel and file systems (kvm, tun, cgroup,
 * userfaultfd, reflink, vmm).
 */
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/kvm.h>
#include <linux/magic.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/utsname.h>

#include "cgroup-detect.h"
#include "doctor.h"
#include "macro.h"

#ifndef FORKD_VMM_DEFAULT
#define FORKD_VMM_DEFAULT "/usr/libexec/forkd/forkd-vmm"
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#ifndef UFFD_FEATURE_WP_HUGETLBFS_SHMEM
#define UFFD_FEATURE_WP_HUGETLBFS_SHMEM (1 << 12)
#endif
#ifndef XFS_SUPER_MAGIC
#define XFS_SUPER_MAGIC 0x58465342
#endif

static bool module_loaded(const char *name) {
        char path[128];

        snprintf(path, sizeof(path), "/sys/module/%s", name);
        return access(path, F_OK) >= 0;
}

/* "vmx", "svm" or NULL, from the first flags line of /proc/cpuinfo. */
static const char *cpu_virt_flag(void) {
        _cleanup_fclose_ FILE *f = fopen("/proc/cpuinfo", "re");
        char line[8192];

        if (!f)
                return NULL;
        while (fgets(line, sizeof(line), f)) {
                if (strncmp(line, "flags", 5) != 0)
                        continue;
                for (char *save = NULL, *t = strtok_r(line, " \t\n", &save); t; t = strtok_r(NULL, " \t\n", &save))
                        if (strcmp(t, "vmx") == 0 || strcmp(t, "svm") == 0)
                                return t[0] == 'v' ? "vmx" : "svm";
                return NULL;
        }
        return NULL;
}

static void kvm_modules(char *buf, size_t size) {
        static const char *const mods[] = { "kvm", "kvm_intel", "kvm_amd", "kvm_pvm" };
        size_t n = 0;

        buf[0] = 0;
        for (size_t i = 0; i < ELEMENTSOF(mods); i++)
                if (module_loaded(mods[i]) && n < size)
                        n += (size_t) snprintf(buf + n, size - n, "%s%s", n ? ", " : "", mods[i]);
        if (!buf[0])
                snprintf(buf, size, "none");
}

static void kvm_none(DoctorCheck *c, const char *why) {
        const char *flag = cpu_virt_flag();
        char mods[128], fix[512];

        kvm_modules(mods, sizeof(mods));
        if (flag)
                snprintf(fix, sizeof(fix),
                         "load the hardware module: modprobe %s (the CPU has %s); for the test suite on a machine "
                         "without KVM, the tests that need it run in the test host (tests/host-vm/run)",
                         strcmp(flag, "vmx") == 0 ? "kvm_intel" : "kvm_amd", flag);
        else
                snprintf(fix, sizeof(fix),
                         "run forkd on a host with VMX or SVM and load kvm_intel or kvm_amd (in a VM, enable nested "
                         "virtualization); for the test suite, the tests that need KVM run in the test host "
                         "(tests/host-vm/run)");
        doctor_set(c, DOCTOR_FAIL, fix, "%s (kvm modules loaded: %s; CPU flags: %s)", why, mods,
                   flag ?: "no vmx or svm");
}

void doctor_check_kvm(const DoctorOptions *o, DoctorCheck *c) {
        _cleanup_close_ int fd = -EBADF, vm = -EBADF;
        const char *path = "/dev/kvm", *flag;
        char why[256];
        struct stat st;
        int version;

        if (stat(path, &st) < 0) {
                snprintf(why, sizeof(why), "%s: %s", path, strerror(errno));
                return kvm_none(c, why);
        }
        if (!S_ISCHR(st.st_mode)) {
                snprintf(why, sizeof(why), "%s is not a character device", path);
                return kvm_none(c, why);
        }
        fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY);
        if (fd < 0) {
                if ((errno == EACCES || errno == EPERM) && geteuid() != 0)
                        return doctor_set(c, DOCTOR_SKIP, "run the doctor as root, as forkd runs",
                                          "cannot open %s read-write as uid %u (%s); forkd opens it as root", path,
                                          (unsigned) geteuid(), strerror(errno));
                snprintf(why, sizeof(why), "cannot open %s read-write: %s", path, strerror(errno));
                return kvm_none(c, why);
        }
        version = ioctl(fd, KVM_GET_API_VERSION, 0);
        if (version < 0) {
                snprintf(why, sizeof(why), "%s: KVM_GET_API_VERSION failed: %s", path, strerror(errno));
                return kvm_none(c, why);
        }
        if (version != KVM_API_VERSION) {
                snprintf(why, sizeof(why), "%s: KVM API version %d, forkd-vmm needs %d", path, version, KVM_API_VERSION);
                return kvm_none(c, why);
        }
        vm = ioctl(fd, KVM_CREATE_VM, 0);
        if (vm < 0) {
                snprintf(why, sizeof(why), "%s: KVM_CREATE_VM failed: %s", path, strerror(errno));
                return kvm_none(c, why);
        }

        if (module_loaded("kvm_pvm"))
                return doctor_set(c, DOCTOR_WARN,
                                  "run forkd on a host with hardware KVM (VMX or SVM: kvm_intel or kvm_amd) for Linux "
                                  "guests; here the test guest runs, and the Linux tests run in the test host "
                                  "(tests/host-vm/run)",
                                  "%s is PVM (kvm_pvm), API 12, KVM_CREATE_VM works: the test guest runs here, Linux "
                                  "guests cannot boot", path);
        flag = cpu_virt_flag();
        doctor_set(c, DOCTOR_OK, NULL, "%s is hardware KVM (%s%s%s), API 12, KVM_CREATE_VM works", path,
                   module_loaded("kvm_intel") ? "kvm_intel" : module_loaded("kvm_amd") ? "kvm_amd" : "kvm",
                   flag ? ", CPU flag " : "", flag ?: "");
}

void doctor_check_tun(const DoctorOptions *o, DoctorCheck *c) {
        _cleanup_close_ int fd = -EBADF;
        const char *path = "/dev/net/tun";
        struct stat st;

        if (stat(path, &st) < 0)
                return doctor_set(c, DOCTOR_FAIL,
                                  "modprobe tun; if the device node is still missing: mkdir -p /dev/net && "
                                  "mknod -m 0666 /dev/net/tun c 10 200",
                                  "%s: %s (sandboxes with a network device need a tap)", path, strerror(errno));
        if (!S_ISCHR(st.st_mode))
                return doctor_set(c, DOCTOR_FAIL, "replace it with the device: mknod -m 0666 /dev/net/tun c 10 200",
                                  "%s is not a character device", path);
        fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY);
        if (fd < 0) {
                if ((errno == EACCES || errno == EPERM) && geteuid() != 0)
                        return doctor_set(c, DOCTOR_SKIP, "run the doctor as root, as forkd runs",
                                          "cannot open %s as uid %u (%s); forkd opens it as root", path,
                                          (unsigned) geteuid(), strerror(errno));
                return doctor_set(c, DOCTOR_FAIL, "modprobe tun, and check that no device cgroup or policy denies it",
                                  "cannot open %s: %s", path, strerror(errno));
        }
        doctor_set(c, DOCTOR_OK, NULL, "%s opens read-write", path);
}

void doctor_check_cgroup(const DoctorOptions *o, DoctorCheck *c) {
        CGroupDetection d;
        const char *sd;
        int r;

        r = cgroup_detect(NULL, &d);
        if (r < 0)
                return doctor_set(c, DOCTOR_FAIL, "mount cgroup2 on /sys/fs/cgroup",
                                  "cannot tell the cgroup layout: %s", strerror(-r));
        sd = d.systemd ? "systemd is PID 1" : "systemd is not PID 1 (no scope backend)";
        switch (d.kind) {
        case CGROUP_BACKEND_SCOPE:
                return doctor_set(c, DOCTOR_OK, NULL,
                                  "memory limits by systemd scopes (MemoryMax=, memory on cgroup v%d); %s",
                                  d.version, sd);
        case CGROUP_BACKEND_CGROUPFS:
                /* forkd creates its root directory when it starts; what exists now is its parent. */
                if (geteuid() == 0) {
                        char parent[sizeof(d.root)];
                        char *slash;

                        strcpy(parent, d.root);
                        slash = strrchr(parent, '/');
                        if (slash && slash != parent)
                                *slash = 0;
                        if (access(parent, W_OK) < 0)
                                return doctor_set(c, DOCTOR_WARN,
                                                  "remount the cgroup hierarchy read-write (a container may mount it "
                                                  "read-only), or give forkd --cgroup-root a delegated directory",
                                                  "memory limits by cgroupfs v%d under %s, but %s is not writable: %s",
                                                  d.version, d.root, parent, strerror(errno));
                }
                return doctor_set(c, DOCTOR_OK, NULL, "memory limits by cgroupfs v%d under %s%s; %s", d.version,
                                  d.root, d.version == 1 && !d.v2_memory ? " (the memory controller is v1 here)" : "",
                                  sd);
        default:
                return doctor_set(c, DOCTOR_WARN,
                                  "mount cgroup2 on /sys/fs/cgroup with the memory controller (or a v1 memory "
                                  "hierarchy on /sys/fs/cgroup/memory); forks with a memory limit fail until then",
                                  "no memory controller: neither cgroup v2 with memory nor a v1 memory hierarchy; %s",
                                  sd);
        }
}

/* A memfd page registered for write-protect and protected: what live branches do. */
static int uffd_wp_probe(int uffd) {
        _cleanup_close_ int mfd = -EBADF;
        long page = sysconf(_SC_PAGESIZE);
        struct uffdio_register reg = {};
        struct uffdio_writeprotect wp = {};
        void *p;
        int r = 0;

        mfd = memfd_create("forkd-doctor", MFD_CLOEXEC);
        if (mfd < 0)
                return -errno;
        if (ftruncate(mfd, page) < 0)
                return -errno;
        p = mmap(NULL, (size_t) page, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
        if (p == MAP_FAILED)
                return -errno;
        memset(p, 0x5a, (size_t) page);
        reg.range.start = (unsigned long) p;
        reg.range.len = (unsigned long) page;
        reg.mode = UFFDIO_REGISTER_MODE_WP;
        wp.range = reg.range;
        wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
        if (ioctl(uffd, UFFDIO_REGISTER, &reg) < 0 || ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) < 0)
                r = -errno;
        /* Nothing writes to the page: no fault can wait for an answer. */
        (void) munmap(p, (size_t) page);
        return r;
}

void doctor_check_userfaultfd(const DoctorOptions *o, DoctorCheck *c) {
        const uint64_t want = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
        _cleanup_close_ int fd = -EBADF, fd2 = -EBADF;
        struct uffdio_api api = { .api = UFFD_API };
        bool root = geteuid() == 0;
        struct utsname u = {};
        int flags = O_CLOEXEC | O_NONBLOCK | (root ? 0 : UFFD_USER_MODE_ONLY);
        int r;

        (void) uname(&u);
        fd = (int) syscall(__NR_userfaultfd, flags);
        if (fd < 0) {
                if (!root && (errno == EPERM || errno == EINVAL))
                        return doctor_set(c, DOCTOR_SKIP, "run the doctor as root, as forkd runs",
                                          "userfaultfd(UFFD_USER_MODE_ONLY) refused as uid %u (%s); forkd uses it as root",
                                          (unsigned) geteuid(), strerror(errno));
                return doctor_set(c, DOCTOR_WARN,
                                  "a kernel built with CONFIG_USERFAULTFD, Linux >= 5.19 for write-protect on memfd; "
                                  "full and diff branches work without it",
                                  "userfaultfd() failed on Linux %s: %s (live branches need it)", u.release,
                                  strerror(errno));
        }
        /* Asking for no feature answers with every feature the kernel has. */
        if (ioctl(fd, UFFDIO_API, &api) < 0)
                return doctor_set(c, DOCTOR_WARN, "a kernel with UFFDIO_API (Linux >= 5.19 for write-protect on memfd)",
                                  "UFFDIO_API failed on Linux %s: %s (live branches need it)", u.release, strerror(errno));
        if ((api.features & want) != want)
                return doctor_set(c, DOCTOR_WARN,
                                  "Linux >= 5.19 (write-protect of shmem/memfd memory); full and diff branches work "
                                  "without it",
                                  "userfaultfd on Linux %s lacks%s%s (live branches need both)", u.release,
                                  api.features & UFFD_FEATURE_PAGEFAULT_FLAG_WP ? "" : " UFFD_FEATURE_PAGEFAULT_FLAG_WP",
                                  api.features & UFFD_FEATURE_WP_HUGETLBFS_SHMEM ? "" : " UFFD_FEATURE_WP_HUGETLBFS_SHMEM");

        fd2 = (int) syscall(__NR_userfaultfd, flags);
        if (fd2 < 0)
                return doctor_set(c, DOCTOR_WARN, NULL, "a second userfaultfd() failed: %s", strerror(errno));
        api = (struct uffdio_api) { .api = UFFD_API, .features = want };
        if (ioctl(fd2, UFFDIO_API, &api) < 0)
                return doctor_set(c, DOCTOR_WARN, "Linux >= 5.19", "UFFDIO_API with write-protect features failed: %s",
                                  strerror(errno));
        r = uffd_wp_probe(fd2);
        if (r < 0)
                return doctor_set(c, DOCTOR_WARN, "Linux >= 5.19 with CONFIG_PTE_MARKER_UFFD_WP",
                                  "userfaultfd has write-protect features, but write-protecting a memfd page failed: %s",
                                  strerror(-r));
        doctor_set(c, DOCTOR_OK, NULL, "userfaultfd with write-protect on memfd memory works (Linux %s%s)", u.release,
                   root ? "" : ", user-mode only");
}

static const char *fs_name(long type) {
        switch ((unsigned long) type) {
        case EXT4_SUPER_MAGIC: return "ext4";
        case BTRFS_SUPER_MAGIC: return "btrfs";
        case XFS_SUPER_MAGIC: return "xfs";
        case TMPFS_MAGIC: return "tmpfs";
        case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
        case NFS_SUPER_MAGIC: return "nfs";
        default: return NULL;
        }
}

static bool reflink_unsupported(int e) {
        return e == EOPNOTSUPP || e == ENOTTY || e == EINVAL || e == EXDEV || e == ENOSYS;
}

/* An unnamed temporary file in dir, or a named one unlinked at once. */
static int open_tmpfile(const char *dir) {
        char path[1100];
        int fd;

        fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR))
                return fd >= 0 ? fd : -errno;
        if ((size_t) snprintf(path, sizeof(path), "%s/.forkd-doctor-XXXXXX", dir) >= sizeof(path))
                return -ENAMETOOLONG;
        fd = mkostemp(path, O_CLOEXEC);
        if (fd < 0)
                return -errno;
        (void) unlink(path);
        return fd;
}

void doctor_check_reflink(const DoctorOptions *o, DoctorCheck *c) {
        static const char fix[] = "put the state directory on btrfs or XFS (mkfs.xfs -m reflink=1, or a btrfs "
                                  "subvolume) and start forkd with --state-dir; without reflink diff chains still work, "
                                  "compact deep chains";
        _cleanup_close_ int src = -EBADF, dst = -EBADF;
        char dir[1100], note[1200] = "", fsbuf[32];
        const char *fs;
        struct statfs sfs;
        char block[4096];

        /* forkd creates the state directory: until then, what matters is the file system it lands on. */
        snprintf(dir, sizeof(dir), "%s", o->state_dir);
        while (access(dir, F_OK) < 0) {
                char *slash = strrchr(dir, '/');
                if (!slash)
                        break;
                if (slash == dir) {
                        dir[1] = 0;
                        break;
                }
                *slash = 0;
        }
        if (strcmp(dir, o->state_dir) != 0)
                snprintf(note, sizeof(note), "; %s does not exist yet, checked %s", o->state_dir, dir);
        if (statfs(dir, &sfs) < 0)
                return doctor_set(c, DOCTOR_FAIL, "create the state directory, or choose one with --state-dir",
                                  "%s: %s", dir, strerror(errno));
        fs = fs_name((long) sfs.f_type);
        if (!fs) {
                snprintf(fsbuf, sizeof(fsbuf), "fs 0x%lx", (unsigned long) sfs.f_type);
                fs = fsbuf;
        }

        src = open_tmpfile(dir);
        if (src < 0) {
                if ((src == -EACCES || src == -EPERM || src == -EROFS) && geteuid() != 0)
                        return doctor_set(c, DOCTOR_SKIP, "run the doctor as root, as forkd runs",
                                          "cannot create a temporary file in %s as uid %u (%s)%s", dir,
                                          (unsigned) geteuid(), strerror(-src), note);
                return doctor_set(c, DOCTOR_FAIL, "make the state directory writable for root (forkd writes snapshots there)",
                                  "cannot create a temporary file in %s (%s): %s%s", dir, fs, strerror(-src), note);
        }
        dst = open_tmpfile(dir);
        if (dst < 0)
                return doctor_set(c, DOCTOR_FAIL, NULL, "cannot create a second temporary file in %s: %s", dir,
                                  strerror(-dst));
        memset(block, 0x5a, sizeof(block));
        if (write(src, block, sizeof(block)) != (ssize_t) sizeof(block))
                return doctor_set(c, DOCTOR_FAIL, "free space in the state directory's file system",
                                  "cannot write a temporary file in %s: %s", dir, strerror(errno ?: EIO));
        if (ioctl(dst, FICLONE, src) < 0) {
                if (reflink_unsupported(errno))
                        return doctor_set(c, DOCTOR_WARN, fix, "%s is on %s: no reflink, FICLONE: %s%s", o->state_dir,
                                          fs, strerror(errno), note);
                return doctor_set(c, DOCTOR_WARN, fix, "FICLONE in %s (%s) failed: %s%s", dir, fs, strerror(errno), note);
        }
        doctor_set(c, DOCTOR_OK, NULL, "%s is on %s: reflink (FICLONE) works%s", o->state_dir, fs, note);
}

void doctor_check_vmm(const DoctorOptions *o, DoctorCheck *c) {
        char path[1100];
        const char *env = getenv("FORKD_VMM");
        struct stat st;

        if (o->vmm)
                snprintf(path, sizeof(path), "%s", o->vmm);
        else if (env && *env)
                snprintf(path, sizeof(path), "%s", env);
        else if (o->prefix)
                snprintf(path, sizeof(path), "%s/libexec/forkd/forkd-vmm", o->prefix);
        else
                snprintf(path, sizeof(path), "%s", FORKD_VMM_DEFAULT);
        if (stat(path, &st) < 0)
                return doctor_set(c, DOCTOR_FAIL,
                                  "install forkd (meson install), or point forkd at the binary with --vmm or $FORKD_VMM",
                                  "%s: %s (forkd starts a forkd-vmm for every VM)", path, strerror(errno));
        if (!S_ISREG(st.st_mode) || access(path, X_OK) < 0)
                return doctor_set(c, DOCTOR_FAIL, "chmod 0755 it, or reinstall forkd", "%s is not an executable file",
                                  path);
        doctor_set(c, DOCTOR_OK, NULL, "%s is executable", path);
}
