/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <json-c/json.h>

#include "chain.h"
#include "compact.h"
#include "jail.h"
#include "kvm.h"
#include "machine.h"
#include "run.h"
#include "snapshot-meta.h"
#include "snapshot.h"
#include "template.h"
#include "virtio-net.h"
#include "vmm-client.h"

static const char *arg_initrd, *arg_cmdline;
static const char *arg_kernel, *arg_disk, *arg_snapshot, *arg_console_log, *arg_agent_socket,
        *arg_control_socket, *arg_overlay_dir, *arg_id = "vm", *arg_tag;
static uint64_t arg_mem_mib = VMM_MEM_MIB_DEFAULT;
static unsigned arg_vcpus = 1;
static int arg_agent_fd = -1, arg_control_fd = -1, arg_net_tap_fd = -1;
static uint8_t arg_net_mac[VIRTIO_NET_MAC_LEN] = VIRTIO_NET_MAC_DEFAULT;
static bool arg_net_mac_set;
/* --volume FILE:MODE[:GUEST] and --volume-fd N[:MODE[:GUEST]], in device order */
static struct arg_volume {
        const char *path; /* NULL: fd */
        int fd;
        int mode;         /* enum snapshot_volume_mode, -1: not given (--volume-fd N) */
        const char *guest_path;
} arg_volumes[VMM_VOLUMES_MAX];
static unsigned arg_n_volumes;
static int rw_volume_fds[VMM_VOLUMES_MAX];

static void help(void) {
        printf("Usage:\n"
               "  forkd-vmm boot --kernel IMAGE --disk IMG [OPTIONS] boot a guest image (ELF test guest\n"
               "                                                     or Linux bzImage)\n"
               "  forkd-vmm restore --snapshot DIR [OPTIONS]         restore one VM from a snapshot\n"
               "  forkd-vmm template --snapshot DIR --control-fd N   fork VMs from a snapshot on request\n"
               "  forkd-vmm check DIR                                validate a snapshot directory\n"
               "  forkd-vmm compact --snapshot DIR --tag TAG OUT     write a flat copy of a chain head as\n"
               "                                                     snapshot TAG in OUT\n"
               "\n"
               "forkd's virtual machine monitor: one process per microVM on /dev/kvm.\n"
               "\n"
               "Options:\n"
               "  --mem-mib N           guest RAM in MiB, 16..3072, even (boot; default %u)\n"
               "  --vcpus N             vCPUs, 1..32 (boot; default 1); restore and template take\n"
               "                        the snapshot's\n"
               "  --initrd PATH         initramfs for a Linux guest (default: where Debian puts it,\n"
               "                        beside the kernel: vmlinuz[-V] -> initrd.img[-V], if present)\n"
               "  --cmdline TEXT        kernel command line for a Linux guest (default\n"
               "                        \"" MACHINE_LINUX_CMDLINE "\")\n"
               "  --id ID               sandbox id told to the guest (default \"vm\")\n"
               "  --console-log PATH    append the guest's serial console to PATH\n"
               "  --agent-socket PATH   listen on a unix stream socket for the agent channel\n"
               "  --agent-fd N          use the connected stream socket N as the agent channel\n"
               "  --control-socket PATH listen on a unix seqpacket socket for control requests\n"
               "  --control-fd N        use the connected seqpacket socket N for control requests;\n"
               "                        the VM stops when the other end hangs up\n"
               "  --net-tap-fd N        a NIC (virtio-net) on the tap N (IFF_TAP|IFF_NO_PI|IFF_VNET_HDR,\n"
               "                        vnet header size 12) (boot); the tap for the NIC of the\n"
               "                        snapshot (restore), which a snapshot with a NIC needs\n"
               "  --net-mac MAC         the NIC's MAC (boot; default 02:66:6b:64:00:01)\n"
               "  --volume FILE:MODE[:GUEST]\n"
               "                        attach the ext4 image FILE as the next virtio-blk after the\n"
               "                        root disk (vdb, vdc, ...; boot; up to 24); MODE ro (read-only\n"
               "                        device), cow (private copy-on-write overlay) or rw (writes go\n"
               "                        to FILE); GUEST is where the agent mounts it, recorded in\n"
               "                        snapshots (default /mnt/volume<i>)\n"
               "  --volume-fd N[:MODE[:GUEST]]\n"
               "                        boot: as --volume, on the inherited fd N (read-write for rw);\n"
               "                        restore, template: the fd of the snapshot's next rw volume\n"
               "  --overlay-dir DIR     directory for the copy-on-write disk overlay (default $TMPDIR or /var/tmp)\n"
               "  --tag TAG             the compacted snapshot's tag (compact)\n"
               "  --confine UID[:GID]   confine the VMM (boot, restore, template): a private mount\n"
               "                        namespace holding only the --jail-bind directories, no\n"
               "                        network, then the user UID, no capabilities and a seccomp\n"
               "                        allow-list before the guest runs (see forkd-vmm(8))\n"
               "  --jail-bind DIR       with --confine: a directory the VMM reaches at the same path,\n"
               "                        read-write (up to 8)\n"
               "  --jail-link DIR       with --confine: a directory the VMM reaches at the same path\n"
               "                        through a descriptor held open, not a mount (up to 72)\n"
               "  -h --help             show this help\n"
               "     --version          show the version\n"
               "\n"
               "Control requests (JSON): {\"op\":\"status\"}, {\"op\":\"pause\"}, {\"op\":\"resume\"},\n"
               "{\"op\":\"shutdown\"}, {\"op\":\"snapshot\",\"dir\":\"/abs/path\",\"tag\":\"name\"}.\n"
               "See forkd-vmm(8).\n",
               VMM_MEM_MIB_DEFAULT);
}

static int parse_fd(const char *s, int *ret) {
        char *end;
        long v;

        errno = 0;
        v = strtol(s, &end, 10);
        if (errno || *end || end == s || v < 3 || v > INT_MAX)
                return -EINVAL;
        if (fcntl((int) v, F_GETFD) < 0)
                return -EBADF;
        *ret = (int) v;
        return 0;
}

/* FILE:MODE[:GUEST] (FILE may hold ':'), or for an fd N[:MODE[:GUEST]]. */
static int parse_volume(char *s, bool is_fd, struct arg_volume *ret) {
        struct arg_volume v = { .fd = -EBADF, .mode = -1 };
        char *c = strrchr(s, ':');

        if (c && c[1] == '/') {
                if (!snapshot_volume_guest_path_is_valid(c + 1))
                        return -EINVAL;
                v.guest_path = c + 1;
                *c = 0;
                c = strrchr(s, ':');
                if (!c)
                        return -EINVAL;
        }
        if (c) {
                v.mode = snapshot_volume_mode_from_string(c + 1);
                if (v.mode < 0)
                        return -EINVAL;
                *c = 0;
        } else if (!is_fd)
                return -EINVAL;
        if (is_fd) {
                if (parse_fd(s, &v.fd) < 0)
                        return -EINVAL;
        } else if (!s[0])
                return -EINVAL;
        else
                v.path = s;
        *ret = v;
        return 0;
}

static int parse_argv(int argc, char *argv[]) {
        enum { ARG_KERNEL = 0x100, ARG_DISK, ARG_SNAPSHOT, ARG_MEM, ARG_ID, ARG_CONSOLE, ARG_ASOCK, ARG_AFD,
               ARG_CSOCK, ARG_CFD, ARG_OVERLAY, ARG_VERSION, ARG_INITRD, ARG_CMDLINE, ARG_TAG,
               ARG_CONFINE, ARG_JAIL_BIND, ARG_JAIL_LINK, ARG_NET_TAP_FD, ARG_NET_MAC, ARG_VOLUME, ARG_VOLUME_FD, ARG_VCPUS };
        static const struct option opts[] = {
                { "kernel", required_argument, NULL, ARG_KERNEL },
                { "disk", required_argument, NULL, ARG_DISK },
                { "initrd", required_argument, NULL, ARG_INITRD },
                { "cmdline", required_argument, NULL, ARG_CMDLINE },
                { "snapshot", required_argument, NULL, ARG_SNAPSHOT },
                { "mem-mib", required_argument, NULL, ARG_MEM },
                { "vcpus", required_argument, NULL, ARG_VCPUS },
                { "id", required_argument, NULL, ARG_ID },
                { "console-log", required_argument, NULL, ARG_CONSOLE },
                { "agent-socket", required_argument, NULL, ARG_ASOCK },
                { "agent-fd", required_argument, NULL, ARG_AFD },
                { "control-socket", required_argument, NULL, ARG_CSOCK },
                { "control-fd", required_argument, NULL, ARG_CFD },
                { "overlay-dir", required_argument, NULL, ARG_OVERLAY },
                { "tag", required_argument, NULL, ARG_TAG },
                { "confine", required_argument, NULL, ARG_CONFINE },
                { "jail-bind", required_argument, NULL, ARG_JAIL_BIND },
                { "jail-link", required_argument, NULL, ARG_JAIL_LINK },
                { "net-tap-fd", required_argument, NULL, ARG_NET_TAP_FD },
                { "net-mac", required_argument, NULL, ARG_NET_MAC },
                { "volume", required_argument, NULL, ARG_VOLUME },
                { "volume-fd", required_argument, NULL, ARG_VOLUME_FD },
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, ARG_VERSION },
                {}
        };
        int c;

        while ((c = getopt_long(argc, argv, "h", opts, NULL)) >= 0) {
                switch (c) {
                case 'h':
                        help();
                        return 0;
                case ARG_VERSION:
                        printf("forkd-vmm %s\n", FORKD_VERSION);
                        return 0;
                case ARG_KERNEL:
                        arg_kernel = optarg;
                        break;
                case ARG_DISK:
                        arg_disk = optarg;
                        break;
                case ARG_INITRD:
                        arg_initrd = optarg;
                        break;
                case ARG_CMDLINE:
                        if (strlen(optarg) >= 4096)
                                return log_error_errno(E2BIG, "--cmdline is longer than 4095 bytes");
                        arg_cmdline = optarg;
                        break;
                case ARG_SNAPSHOT:
                        arg_snapshot = optarg;
                        break;
                case ARG_MEM: {
                        char *end;
                        errno = 0;
                        unsigned long long v = strtoull(optarg, &end, 10);
                        if (errno || *end || end == optarg || v < 16 || v > 3072 || v % 2)
                                return log_error_errno(EINVAL, "--mem-mib must be an even number from 16 to 3072");
                        arg_mem_mib = v;
                        break;
                }
                case ARG_VCPUS: {
                        char *end;
                        errno = 0;
                        unsigned long v = strtoul(optarg, &end, 10);
                        if (errno || *end || end == optarg || optarg[0] == '-' || v < 1 || v > VMM_VCPUS_MAX)
                                return log_error_errno(EINVAL, "--vcpus must be a number from 1 to %u", VMM_VCPUS_MAX);
                        arg_vcpus = (unsigned) v;
                        break;
                }
                case ARG_ID:
                        if (!snapshot_tag_is_valid(optarg))
                                return log_error_errno(EINVAL, "--id must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$");
                        arg_id = optarg;
                        break;
                case ARG_CONSOLE:
                        arg_console_log = optarg;
                        break;
                case ARG_ASOCK:
                        arg_agent_socket = optarg;
                        break;
                case ARG_AFD:
                        if (parse_fd(optarg, &arg_agent_fd) < 0)
                                return log_error_errno(EINVAL, "--agent-fd must name an open fd >= 3");
                        break;
                case ARG_CSOCK:
                        arg_control_socket = optarg;
                        break;
                case ARG_CFD:
                        if (parse_fd(optarg, &arg_control_fd) < 0)
                                return log_error_errno(EINVAL, "--control-fd must name an open fd >= 3");
                        break;
                case ARG_OVERLAY:
                        arg_overlay_dir = optarg;
                        break;
                case ARG_TAG:
                        if (!snapshot_tag_is_valid(optarg))
                                return log_error_errno(EINVAL, "--tag must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$");
                        arg_tag = optarg;
                        break;
                case ARG_CONFINE:
                        if (vmm_parse_user(optarg, &jail.uid, &jail.gid) < 0)
                                return log_error_errno(EINVAL, "--confine takes UID[:GID], numbers other than 0");
                        jail.enabled = true;
                        break;
                case ARG_JAIL_BIND:
                        if (jail.n_binds >= JAIL_BINDS_MAX)
                                return log_error_errno(E2BIG, "At most %u --jail-bind directories", JAIL_BINDS_MAX);
                        if (optarg[0] != '/')
                                return log_error_errno(EINVAL, "--jail-bind takes an absolute path");
                        jail.binds[jail.n_binds++] = optarg;
                        break;
                case ARG_JAIL_LINK:
                        if (jail.n_links >= JAIL_LINKS_MAX)
                                return log_error_errno(E2BIG, "At most %u --jail-link directories", JAIL_LINKS_MAX);
                        if (optarg[0] != '/')
                                return log_error_errno(EINVAL, "--jail-link takes an absolute path");
                        jail.links[jail.n_links++] = optarg;
                        break;
                case ARG_NET_TAP_FD:
                        if (parse_fd(optarg, &arg_net_tap_fd) < 0)
                                return log_error_errno(EINVAL, "--net-tap-fd must name an open fd >= 3");
                        break;
                case ARG_NET_MAC:
                        if (virtio_net_parse_mac(optarg, arg_net_mac) < 0)
                                return log_error_errno(EINVAL, "--net-mac takes a unicast MAC other than all zeros, "
                                                               "as xx:xx:xx:xx:xx:xx");
                        arg_net_mac_set = true;
                        break;
                case ARG_VOLUME:
                case ARG_VOLUME_FD:
                        if (arg_n_volumes >= VMM_VOLUMES_MAX)
                                return log_error_errno(E2BIG, "At most %u volumes", VMM_VOLUMES_MAX);
                        if (parse_volume(optarg, c == ARG_VOLUME_FD, &arg_volumes[arg_n_volumes]) < 0)
                                return log_error_errno(EINVAL, "--%s takes %s:ro|cow|rw[:GUEST_PATH], GUEST_PATH "
                                                               "absolute and normalized: %s",
                                                       c == ARG_VOLUME ? "volume" : "volume-fd",
                                                       c == ARG_VOLUME ? "FILE" : "N", optarg);
                        arg_n_volumes++;
                        break;
                case '?':
                        return -EINVAL;
                default:
                        return -EINVAL;
                }
        }
        if (arg_agent_socket && arg_agent_fd >= 0)
                return log_error_errno(EINVAL, "--agent-socket and --agent-fd exclude each other");
        if (arg_control_socket && arg_control_fd >= 0)
                return log_error_errno(EINVAL, "--control-socket and --control-fd exclude each other");
        if (jail.n_binds > 0 && !jail.enabled)
                return log_error_errno(EINVAL, "--jail-bind needs --confine");
        if (arg_net_mac_set && arg_net_tap_fd < 0)
                return log_error_errno(EINVAL, "--net-mac needs --net-tap-fd");
        if (arg_net_tap_fd >= 0) {
                int r = virtio_net_check_backend(arg_net_tap_fd);
                if (r < 0)
                        return log_error_errno(r, "--net-tap-fd %d is not a tap with IFF_TAP|IFF_NO_PI|IFF_VNET_HDR "
                                                  "and a vnet header size of 12 (or a datagram socket): %m",
                                               arg_net_tap_fd);
        }
        if (!arg_overlay_dir)
                arg_overlay_dir = getenv("TMPDIR") ?: "/var/tmp";
        return 1;
}

/* The socket is bound under a side name and renamed into place once it listens, so a
 * client that sees the path can connect: between bind() and listen() it would be refused. */
static int listen_unix(const char *path, int type) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        _cleanup_close_ int fd = -EBADF;
        struct stat st;

        if (strlen(path) + 1 >= sizeof(sa.sun_path))
                return log_error_errno(ENAMETOOLONG, "Socket path too long (at most %zu bytes): %s",
                                       sizeof(sa.sun_path) - 2, path);
        /* Replace a stale socket, never any other kind of file. */
        if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
                return log_error_errno(EEXIST, "%s exists and is not a socket", path);
        stpcpy(stpcpy(sa.sun_path, path), "~");
        if (lstat(sa.sun_path, &st) == 0) {
                if (!S_ISSOCK(st.st_mode))
                        return log_error_errno(EEXIST, "%s exists and is not a socket", sa.sun_path);
                (void) unlink(sa.sun_path);
        }
        fd = socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 || listen(fd, 4) < 0)
                return log_error_errno(errno, "Failed to listen on %s: %m", path);
        if (rename(sa.sun_path, path) < 0) {
                int e = errno;
                (void) unlink(sa.sun_path);
                return log_error_errno(e, "Failed to put socket %s in place: %m", path);
        }
        return TAKE_FD(fd);
}

static int run_vm(struct vmm *vmm, const char *kernel) {
        struct vmm_host host = { .agent_listen_fd = -1, .control_listen_fd = -1, .control_fd = arg_control_fd,
                                 .exit_on_control_eof = arg_control_fd >= 0, .kernel = kernel };
        int r;

        if (arg_agent_socket) {
                host.agent_listen_fd = listen_unix(arg_agent_socket, SOCK_STREAM);
                if (host.agent_listen_fd < 0)
                        return host.agent_listen_fd;
        }
        if (arg_control_socket) {
                host.control_listen_fd = listen_unix(arg_control_socket, SOCK_SEQPACKET);
                if (host.control_listen_fd < 0)
                        return host.control_listen_fd;
        }
        r = vmm_install_signals();
        if (r < 0)
                return log_error_errno(r, "Failed to install signal handlers: %m");
        /* Everything is open: from here on the guest runs, confined. */
        if (jail.enabled) {
                r = jail_enter();
                if (r >= 0)
                        r = jail_confine_vmm();
                if (r < 0)
                        return r;
        }
        r = vmm_run(vmm, &host);
        safe_close(host.agent_listen_fd);
        safe_close(host.control_listen_fd);
        safe_close(host.control_fd);
        if (arg_agent_socket)
                (void) unlink(arg_agent_socket);
        if (arg_control_socket)
                (void) unlink(arg_control_socket);
        if (r == -ECANCELED)
                return log_error_errno(r, "The guest crashed: %s (see its console log)",
                                       vmm_exit_status(vmm) == VMM_EXIT_TRIPLE_FAULT ? "triple fault" :
                                                                                      "halted for good");
        return r;
}

/* The volumes of boot: open each (or take its fd) and describe it for snapshot.json. */
static int boot_volumes(struct machine_volume *vols, struct snapshot_volume *meta) {
        for (unsigned i = 0; i < arg_n_volumes; i++) {
                struct arg_volume *a = &arg_volumes[i];
                struct snapshot_volume *m = &meta[i];
                char path[64];
                struct stat st;
                int flags;

                if (a->mode < 0)
                        return log_error_errno(EINVAL, "--volume-fd %d needs a mode on boot (N:ro|cow|rw)", a->fd);
                if (a->path) {
                        a->fd = open(a->path, (a->mode == SNAPSHOT_VOLUME_RW ? O_RDWR : O_RDONLY) | O_CLOEXEC);
                        if (a->fd < 0)
                                return log_error_errno(errno, "Failed to open volume %s: %m", a->path);
                }
                flags = fcntl(a->fd, F_GETFL);
                if (flags < 0 || fstat(a->fd, &st) < 0)
                        return log_error_errno(errno, "Volume %u: %m", i);
                if (!S_ISREG(st.st_mode) || (uint64_t) st.st_size > SNAPSHOT_VOLUME_SIZE_MAX)
                        return log_error_errno(EINVAL, "Volume %u is not a regular file of at most 64 GiB", i);
                if (a->mode == SNAPSHOT_VOLUME_RW && (flags & O_ACCMODE) != O_RDWR)
                        return log_error_errno(EBADF, "The rw volume %u is not open read-write", i);
                snprintf(m->mode, sizeof(m->mode), "%s", snapshot_volume_mode_to_string(a->mode));
                if (a->guest_path)
                        snprintf(m->guest_path, sizeof(m->guest_path), "%s", a->guest_path);
                else
                        snprintf(m->guest_path, sizeof(m->guest_path), "/mnt/volume%u", i);
                if (a->mode == SNAPSHOT_VOLUME_RW) {
                        ssize_t n;

                        /* recorded for forkd, which reopens it by path after a restart */
                        snprintf(path, sizeof(path), "/proc/self/fd/%d", a->fd);
                        n = readlink(path, m->host_path, sizeof(m->host_path) - 1);
                        if (n <= 0 || m->host_path[0] != '/' || (size_t) n >= sizeof(m->host_path) - 1)
                                return log_error_errno(ENAMETOOLONG, "Cannot tell the path of the rw volume %u", i);
                        m->host_path[n] = 0;
                        m->dev = (uint64_t) st.st_dev;
                        m->ino = (uint64_t) st.st_ino;
                }
                vols[i] = (struct machine_volume) { .fd = a->fd, .meta = m };
        }
        return 0;
}

/* cmd_boot() and cmd_restore() return the process's exit status. */
static int cmd_boot(int kvm_fd) {
        struct machine_config cfg = { .id = arg_id, .console_log = arg_console_log, .overlay_dir = arg_overlay_dir,
                                      .agent_fd = arg_agent_fd, .initrd = arg_initrd, .cmdline = arg_cmdline,
                                      .vcpus = arg_vcpus };
        struct machine_net net = { .tap_fd = arg_net_tap_fd };
        struct vmm *vmm = NULL;
        int r;

        _cleanup_free_ struct snapshot_volume *vol_meta = NULL;
        struct machine_volume vols[VMM_VOLUMES_MAX];

        if (!arg_kernel || !arg_disk)
                return log_error_errno(EINVAL, "boot needs --kernel and --disk"), 1;
        vol_meta = calloc(VMM_VOLUMES_MAX, sizeof(*vol_meta));
        if (!vol_meta)
                return log_oom(), 1;
        if (boot_volumes(vols, vol_meta) < 0)
                return 1;
        cfg.volumes = vols;
        cfg.n_volumes = arg_n_volumes;
        if (arg_net_tap_fd >= 0) {
                memcpy(net.mac, arg_net_mac, sizeof net.mac);
                cfg.net = &net;
        }
        r = machine_boot(kvm_fd, arg_kernel, arg_disk, arg_mem_mib << 20, &cfg, &vmm);
        arg_net_tap_fd = safe_close(arg_net_tap_fd); /* the NIC has its own */
        for (unsigned i = 0; i < arg_n_volumes; i++)
                arg_volumes[i].fd = safe_close(arg_volumes[i].fd); /* and so have the volumes */
        if (r < 0)
                return log_error_errno(r, "Failed to boot %s: %m", arg_kernel), 1;
        r = run_vm(vmm, arg_kernel);
        r = r >= 0 || r == -ECANCELED ? vmm_exit_status(vmm) : 1;
        machine_free(vmm);
        return r;
}

static int cmd_restore(int kvm_fd) {
        struct machine_config cfg = { .id = arg_id, .console_log = arg_console_log, .overlay_dir = arg_overlay_dir,
                                      .agent_fd = arg_agent_fd };
        struct machine_net net = { .tap_fd = arg_net_tap_fd };
        _cleanup_(snapshot_freep) struct snapshot *snap = NULL;
        _cleanup_free_ char *err = NULL;
        struct vmm *vmm = NULL;
        uint8_t *mem;
        int r;

        if (!arg_snapshot)
                return log_error_errno(EINVAL, "restore needs --snapshot"), 1;
        if (arg_net_mac_set)
                return log_error_errno(EINVAL, "--net-mac is for boot: a restored NIC keeps the snapshot's MAC"), 1;
        r = snapshot_load(arg_snapshot, &snap, &err);
        if (r >= 0)
                r = snapshot_set_rw_volumes(snap, rw_volume_fds, arg_n_volumes, &err);
        if (r < 0)
                return log_error_errno(r, "Refusing snapshot %s: %s", arg_snapshot, err ?: strerror(-r)), 1;
        r = machine_state_net(snap->state, NULL);
        if (r < 0)
                return log_error_errno(r, "Refusing snapshot %s: its NIC state is invalid", arg_snapshot), 1;
        if (r > 0 && arg_net_tap_fd < 0)
                return log_error_errno(ENONET, "Snapshot %s has a NIC: restoring it needs --net-tap-fd", arg_snapshot), 1;
        if (r == 0 && arg_net_tap_fd >= 0)
                return log_error_errno(ENODEV, "Snapshot %s has no NIC: --net-tap-fd is for snapshots made with one",
                                       arg_snapshot), 1;
        if (arg_net_tap_fd >= 0)
                cfg.net = &net;

        r = snapshot_map_memory(snap, &mem);
        if (r < 0)
                return log_error_errno(r, "Failed to map memory.bin: %m"), 1;
        r = machine_restore(kvm_fd, snap, mem, &cfg, &vmm);
        arg_net_tap_fd = safe_close(arg_net_tap_fd); /* the NIC has its own */
        if (r < 0)
                return log_error_errno(r, "Failed to restore %s: %m", arg_snapshot), 1;
        r = run_vm(vmm, snap->meta.kernel);
        r = r >= 0 || r == -ECANCELED ? vmm_exit_status(vmm) : 1;
        machine_free(vmm);
        munmap(mem, snap->meta.mem_size);
        return r;
}

static int cmd_check(const char *dir) {
        _cleanup_(snapshot_freep) struct snapshot *snap = NULL;
        _cleanup_free_ char *err = NULL;
        uint8_t mac[VIRTIO_NET_MAC_LEN];
        char net[64] = "";
        int r;

        r = snapshot_load(dir, &snap, &err);
        if (r < 0)
                return log_error_errno(r, "Snapshot %s is not usable: %s", dir, err ?: strerror(-r));
        r = machine_state_net(snap->state, mac);
        if (r < 0)
                return log_error_errno(r, "Snapshot %s is not usable: its NIC state is invalid", dir);
        if (r > 0) {
                char s[VIRTIO_NET_MAC_STRING_MAX];

                virtio_net_format_mac(mac, s);
                snprintf(net, sizeof net, ",\"net\":{\"mac\":\"%s\"}", s);
        }
        printf("{\"tag\":\"%s\",\"generation\":%llu,\"mem_size\":%llu,\"disk_size\":%llu%s}\n", snap->meta.tag,
               (unsigned long long) snap->meta.generation, (unsigned long long) snap->meta.mem_size,
               (unsigned long long) snap->meta.disk_size, net);
        return 0;
}

/* One JSON line on stdout for forkd: {"ok":true} or {"error":"...","errno":N}. */
static int cmd_compact(const char *out) {
        _cleanup_free_ char *err = NULL;
        struct json_object *o;
        int r;

        if (!arg_snapshot || !arg_tag)
                return log_error_errno(EINVAL, "compact needs --snapshot and --tag"), 2;
        /* forkd killed: stop too; its next start removes the staging directory */
        (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
        r = compact_snapshot(arg_snapshot, out, arg_tag, &err);
        o = json_object_new_object();
        if (r < 0) {
                log_error_errno(r, "Failed to compact %s: %s", arg_snapshot, err ?: strerror(-r));
                json_object_object_add(o, "error", json_object_new_string(err ?: strerror(-r)));
                json_object_object_add(o, "errno", json_object_new_int(-r));
        } else
                json_object_object_add(o, "ok", json_object_new_boolean(1));
        printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
        json_object_put(o);
        return r < 0 ? 1 : 0;
}

/* A confined process leaves with _exit(): nothing of ours needs exit
 * handlers, and LeakSanitizer's exit-time check (sanitizer builds) ptraces the
 * process from a thread of its own, which a confined one may not do (seen
 * hanging). Unconfined runs keep the check. */
static int leave(int status) {
        if (jail.enabled) {
                fflush(NULL);
                _exit(status);
        }
        return status;
}

int main(int argc, char *argv[]) {
        _cleanup_close_ int kvm_fd = -EBADF;
        const char *verb;
        int r;

        log_prefix = "forkd-vmm";
        if (argc < 2) {
                help();
                return 2;
        }
        verb = argv[1];
        if (strcmp(verb, "-h") == 0 || strcmp(verb, "--help") == 0) {
                help();
                return 0;
        }
        if (strcmp(verb, "--version") == 0) {
                printf("forkd-vmm %s\n", FORKD_VERSION);
                return 0;
        }

        r = parse_argv(argc - 1, argv + 1);
        if (r <= 0)
                return r < 0 ? 2 : 0;
        /* Only tests set this (tests/daemon/test-confine.py): see jail_test_hook(). */
        {
                const char *e = getenv("FORKD_VMM_TEST_HOOKS");
                jail.test_hooks = e && strcmp(e, "1") == 0;
        }

        if (strcmp(verb, "check") == 0) {
                if (optind + 1 != argc - 1)
                        return log_error_errno(EINVAL, "check takes one snapshot directory"), 2;
                return cmd_check(argv[optind + 1]) < 0 ? 1 : 0;
        }
        if (strcmp(verb, "compact") == 0) {
                if (optind + 1 != argc - 1)
                        return log_error_errno(EINVAL, "compact takes one output directory"), 2;
                return cmd_compact(argv[optind + 1]);
        }
        if (optind != argc - 1)
                return log_error_errno(EINVAL, "Unexpected argument: %s", argv[optind + 1]), 2;

        if (strcmp(verb, "boot") != 0 && strcmp(verb, "restore") != 0 && strcmp(verb, "template") != 0)
                return log_error_errno(EINVAL, "Unknown command \"%s\"; see forkd-vmm --help", verb), 2;

        if (strcmp(verb, "boot") != 0)
                for (unsigned i = 0; i < arg_n_volumes; i++) {
                        if (arg_volumes[i].path || (arg_volumes[i].mode >= 0 && arg_volumes[i].mode != SNAPSHOT_VOLUME_RW) ||
                            arg_volumes[i].guest_path)
                                return log_error_errno(EINVAL, "%s takes --volume-fd N[:rw] only: the snapshot has "
                                                               "its volumes", verb), 2;
                        rw_volume_fds[i] = arg_volumes[i].fd;
                }

        if (strcmp(verb, "template") == 0 && (arg_net_tap_fd >= 0 || arg_net_mac_set))
                return log_error_errno(EINVAL, "template takes no --net-tap-fd or --net-mac: each child gets its tap "
                                               "with its spawn request (\"with_tap\")"), 2;

        kvm_fd = vmm_open_kvm();
        if (kvm_fd < 0)
                return log_error_errno(kvm_fd, "Cannot use /dev/kvm: %m"), 1;

        if (strcmp(verb, "boot") == 0)
                return leave(cmd_boot(kvm_fd));
        if (strcmp(verb, "restore") == 0)
                return leave(cmd_restore(kvm_fd));
        if (!arg_snapshot || arg_control_fd < 0)
                return log_error_errno(EINVAL, "template needs --snapshot and --control-fd"), 2;
        if (jail.enabled) {
                /* Before the snapshot is parsed: the template runs no guest, but
                 * reads files, and its children inherit all of this. */
                jail.template = true;
                r = jail_enter();
                if (r >= 0)
                        r = jail_drop_privileges();
                if (r >= 0)
                        r = jail_apply_seccomp();
                if (r < 0)
                        return 1;
        }
        r = template_serve(kvm_fd, arg_snapshot, arg_control_fd, arg_overlay_dir, rw_volume_fds, arg_n_volumes);
        return leave(r < 0 ? 1 : 0);
}
