/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd: the D-Bus service org.forkd.Manager. main() and the lifecycle only;
 * the registry is manager.c, the bus faces are *-dbus.c.
 */
#include <getopt.h>
#include <pwd.h>
#include <signal.h>
#include <sys/resource.h>
#include <systemd/sd-daemon.h>

#include "cgroup.h"
#include "doctor.h"
#include "hooks.h"
#include "direct-listener.h"
#include "vmm-client.h"
#include "macro.h"
#include "time-util.h"
#include "manager-dbus.h"
#include "manager.h"
#include "polkit.h"
#include "pushpull-op.h"
#include "userns-pool.h"
#include "worker.h"
#include "snapshot-meta.h"

#ifndef FORKD_VMM_DEFAULT
#define FORKD_VMM_DEFAULT "/usr/libexec/forkd/forkd-vmm"
#endif

#ifndef FORKD_OCI_DEFAULT
#define FORKD_OCI_DEFAULT "/usr/libexec/forkd/forkd-oci"
#endif
#ifndef FORKD_IMAGE_AGENT_DEFAULT
#define FORKD_IMAGE_AGENT_DEFAULT "/usr/libexec/forkd/forkd-agent-portable"
#endif

#define EXIT_GRACE_USEC (20 * USEC_PER_SEC)

static const char *arg_state_dir = "/var/lib/forkd";
static const char *arg_runtime_dir = NULL; /* --runtime-dir; NULL: the state directory */
static const char *arg_vmm = NULL;
static const char *arg_bus_address = NULL;
static const char *arg_cgroup_root = NULL;
static unsigned arg_max_operations = OPERATIONS_MAX_DEFAULT;
static unsigned arg_max_branches = BRANCHES_MAX_DEFAULT;
static unsigned arg_control_timeout_sec = CONTROL_TIMEOUT_DEFAULT_SEC;
static unsigned arg_netns_pool = 0;
static const char *arg_default_mem_mib = NULL; /* --default-mem-mib, else $FORKD_DEFAULT_MEM_MIB */
static const char *arg_default_vcpus = NULL; /* --default-vcpus, else $FORKD_DEFAULT_VCPUS */
static const char *arg_default_kernel = NULL;  /* --default-kernel, else $FORKD_DEFAULT_KERNEL */
static const char *arg_default_initrd = NULL;  /* --default-initrd, else $FORKD_DEFAULT_INITRD */
static const char *arg_registry_config = NULL; /* --registry-config, else $FORKD_REGISTRY_CONFIG */
static bool arg_confine = true;
static uid_t arg_vmm_uid = VMM_USER_DEFAULT_UID;
static gid_t arg_vmm_gid = VMM_USER_DEFAULT_GID;
static const char *arg_vmm_uid_range = NULL; /* --vmm-uid-range, else $FORKD_VMM_UID_RANGE */
static const char *arg_bridge_user = NULL; /* --trusted-bridge-user, resolved in run() */

static void help(void) {
        printf("Usage: forkd [OPTIONS]\n"
               "       forkd doctor [--json] [--state-dir DIR] [--prefix DIR] [--token-file FILE]\n\n"
               "The forkd service: owns org.forkd.Manager on the system bus and forks\n"
               "KVM microVMs copy-on-write from snapshots. 'forkd doctor' checks what this\n"
               "host can do for it instead (forkd doctor --help).\n\n"
               "  -h --help               Show this help\n"
               "     --version            Show the version\n"
               "     --state-dir DIR      Registry location (default /var/lib/forkd)\n"
               "     --runtime-dir DIR    Where the records of live sandboxes go, DIR/sandboxes\n"
               "                          (default: the state directory); a tmpfs such as\n"
               "                          /run/forkd (the unit's) spares a file system write\n"
               "                          per forked child\n"
               "     --vmm PATH           forkd-vmm binary (default $FORKD_VMM, else %s)\n"
               "     --bus-address ADDR   Connect to this bus instead of the system bus\n"
               "     --cgroup-root DIR    Use cgroupfs under DIR for memory limits\n"
               "                          (default: systemd scopes where systemd is PID 1,\n"
               "                          else /sys/fs/cgroup/forkd or /sys/fs/cgroup/memory/forkd)\n"
               "     --max-operations N   Long operations at once, 1..%u (default %u)\n"
               "     --max-branches N     Branches of running sandboxes in flight at once, 1..%u\n"
               "                          (default %u; beyond it BranchSandbox answers Busy)\n"
               "     --control-timeout-sec N\n"
               "                          How long a VMM may take to answer a branch or a fork,\n"
               "                          1..%u s (default %u); past it the call fails and the\n"
               "                          sandbox is killed\n"
               "     --netns-pool N       Keep N network namespaces ready per network policy\n"
               "                          (none, egress) that forks asked for, made ahead of\n"
               "                          time, so a fork with a NIC does not wait for them;\n"
               "                          0..%u (default 0: each fork makes its own)\n"
               "     --default-mem-mib N  Guest RAM of a snapshot whose request names none: 0, or\n"
               "                          an even number from 16 to %u (default 0: forkd-vmm's,\n"
               "                          %u MiB; also FORKD_DEFAULT_MEM_MIB=N)\n"
               "     --default-vcpus N    vCPUs of a snapshot whose request names none: 1..32\n"
               "                          (default 1; also FORKD_DEFAULT_VCPUS=N)\n"
               "     --default-kernel PATH\n"
               "                          The Linux kernel of a snapshot of a container image whose\n"
               "                          request names none (CreateSnapshotFromImage); its\n"
               "                          initramfs is the one beside it (vmlinuz-V: initrd.img-V)\n"
               "                          unless --default-initrd names one (also\n"
               "                          FORKD_DEFAULT_KERNEL, FORKD_DEFAULT_INITRD; default: none)\n"
               "     --default-initrd PATH\n"
               "                          The initramfs that goes with --default-kernel\n"
               "     --registry-config FILE\n"
               "                          The OCI registries images are pulled from and snapshots\n"
               "                          pushed to and pulled from, with their credentials and CAs\n"
               "                          (JSON, read at each use; forkd(8), REGISTRIES; default\n"
               "                          " REGISTRY_CONFIG_DEFAULT ": none when it does not exist;\n"
               "                          also FORKD_REGISTRY_CONFIG)\n"
               "     --vmm-user UID[:GID] The user (and group) confined VMMs run as (default %u:%u,\n"
               "                          in no /etc/passwd; see forkd-vmm(8), CONFINEMENT)\n"
               "     --vmm-uid-range FIRST:COUNT|shared\n"
               "                          The ids confined VMMs run under, one a sandbox, as uid\n"
               "                          and gid; no user or group may have one (default\n"
               "                          %u:%u, or 'shared' with a warning where a user or\n"
               "                          group has an id in it; 'shared': every VMM runs as\n"
               "                          --vmm-user; also FORKD_VMM_UID_RANGE; see forkd(8),\n"
               "                          VMM USERS)\n"
               "     --no-confine         Run VMMs as forkd itself, without their jail, seccomp\n"
               "                          filter or user (for measurements and debugging;\n"
               "                          also FORKD_NO_CONFINE=1)\n"
               "     --trusted-bridge-user NAME|UID\n"
               "                          Trust this user (forkd-rest's, not root, not the VMM user) on\n"
               "                          the direct socket: its calls there need no polkit check,\n"
               "                          except org.forkd.manage-all (default: none; an empty\n"
               "                          value: none; see forkd(8), THE REST BRIDGE)\n",
               FORKD_VMM_DEFAULT, OPERATIONS_MAX_LIMIT, OPERATIONS_MAX_DEFAULT, BRANCHES_MAX_LIMIT,
               BRANCHES_MAX_DEFAULT, CONTROL_TIMEOUT_MAX_SEC, CONTROL_TIMEOUT_DEFAULT_SEC, NETNS_POOL_MAX, MEM_MIB_MAX,
               VMM_MEM_MIB_DEFAULT, VMM_USER_DEFAULT_UID,
               VMM_USER_DEFAULT_GID, VMM_UID_RANGE_DEFAULT_FIRST, VMM_UID_RANGE_DEFAULT_COUNT);
}

/* A decimal number from min to max, digits only. */
static int parse_bounded(const char *s, unsigned min, unsigned max, unsigned *ret) {
        unsigned long v;
        char *end;

        if (!(*s >= '0' && *s <= '9'))
                return -EINVAL;
        errno = 0;
        v = strtoul(s, &end, 10);
        if (errno != 0 || *end || v < min || v > max)
                return -EINVAL;
        *ret = (unsigned) v;
        return 0;
}

/* What snapshots of OCI images need: checked here, used only when one is asked for. */
static int setup_image_paths(Manager *m) {
        const char *kernel = arg_default_kernel ?: getenv("FORKD_DEFAULT_KERNEL");
        const char *initrd = arg_default_initrd ?: getenv("FORKD_DEFAULT_INITRD");

        if (kernel && !kernel[0])
                kernel = NULL;
        if (initrd && !initrd[0])
                initrd = NULL;
        if ((kernel && (kernel[0] != '/' || strlen(kernel) >= PATH_ARG_MAX)) ||
            (initrd && (initrd[0] != '/' || strlen(initrd) >= PATH_ARG_MAX)))
                return log_error_errno(EINVAL, "--default-kernel and --default-initrd take absolute paths.");
        if (initrd && !kernel)
                return log_error_errno(EINVAL, "--default-initrd needs --default-kernel.");
        if (kernel && !(m->default_kernel = strdup(kernel)))
                return log_oom();
        if (initrd && !(m->default_initrd = strdup(initrd)))
                return log_oom();
        m->oci_path = strdup(getenv("FORKD_OCI") ?: FORKD_OCI_DEFAULT);
        m->image_agent_path = strdup(getenv("FORKD_IMAGE_AGENT") ?: FORKD_IMAGE_AGENT_DEFAULT);
        if (!m->oci_path || !m->image_agent_path || asprintf(&m->oci_cache_dir, "%s/oci-layers", m->state_dir) < 0)
                return log_oom();
        return 0;
}

static int parse_argv(int argc, char *argv[]) {
        enum { ARG_VERSION = 0x100, ARG_STATE_DIR, ARG_RUNTIME_DIR, ARG_VMM, ARG_BUS_ADDRESS, ARG_CGROUP_ROOT, ARG_MAX_OPERATIONS,
               ARG_MAX_BRANCHES, ARG_CONTROL_TIMEOUT, ARG_VMM_USER, ARG_VMM_UID_RANGE, ARG_NO_CONFINE,
               ARG_TRUSTED_BRIDGE_USER, ARG_NETNS_POOL, ARG_DEFAULT_MEM_MIB, ARG_DEFAULT_VCPUS, ARG_DEFAULT_KERNEL, ARG_DEFAULT_INITRD,
               ARG_REGISTRY_CONFIG };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, ARG_VERSION },
                { "state-dir", required_argument, NULL, ARG_STATE_DIR },
                { "runtime-dir", required_argument, NULL, ARG_RUNTIME_DIR },
                { "vmm", required_argument, NULL, ARG_VMM },
                { "bus-address", required_argument, NULL, ARG_BUS_ADDRESS },
                { "cgroup-root", required_argument, NULL, ARG_CGROUP_ROOT },
                { "max-operations", required_argument, NULL, ARG_MAX_OPERATIONS },
                { "max-branches", required_argument, NULL, ARG_MAX_BRANCHES },
                { "control-timeout-sec", required_argument, NULL, ARG_CONTROL_TIMEOUT },
                { "vmm-user", required_argument, NULL, ARG_VMM_USER },
                { "vmm-uid-range", required_argument, NULL, ARG_VMM_UID_RANGE },
                { "no-confine", no_argument, NULL, ARG_NO_CONFINE },
                { "trusted-bridge-user", required_argument, NULL, ARG_TRUSTED_BRIDGE_USER },
                { "netns-pool", required_argument, NULL, ARG_NETNS_POOL },
                { "default-mem-mib", required_argument, NULL, ARG_DEFAULT_MEM_MIB },
                { "default-vcpus", required_argument, NULL, ARG_DEFAULT_VCPUS },
                { "default-kernel", required_argument, NULL, ARG_DEFAULT_KERNEL },
                { "default-initrd", required_argument, NULL, ARG_DEFAULT_INITRD },
                { "registry-config", required_argument, NULL, ARG_REGISTRY_CONFIG },
                {},
        };
        int c;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                switch (c) {
                case 'h':
                        help();
                        return 0;
                case ARG_VERSION:
                        printf("forkd %s\n", FORKD_VERSION);
                        return 0;
                case ARG_STATE_DIR:
                        if (optarg[0] != '/' || strlen(optarg) > 1024)
                                return log_error_errno(EINVAL, "--state-dir needs an absolute path of at most 1024 bytes.");
                        arg_state_dir = optarg;
                        break;
                case ARG_RUNTIME_DIR:
                        if (optarg[0] != '/' || strlen(optarg) > 1024)
                                return log_error_errno(EINVAL, "--runtime-dir needs an absolute path of at most 1024 bytes.");
                        arg_runtime_dir = optarg;
                        break;
                case ARG_VMM:
                        arg_vmm = optarg;
                        break;
                case ARG_BUS_ADDRESS:
                        arg_bus_address = optarg;
                        break;
                case ARG_CGROUP_ROOT:
                        if (optarg[0] != '/' || strlen(optarg) > 1024)
                                return log_error_errno(EINVAL, "--cgroup-root needs an absolute path of at most 1024 bytes.");
                        arg_cgroup_root = optarg;
                        break;
                case ARG_MAX_OPERATIONS:
                        if (parse_bounded(optarg, 1, OPERATIONS_MAX_LIMIT, &arg_max_operations) < 0)
                                return log_error_errno(EINVAL, "--max-operations takes a number from 1 to %u.",
                                                       OPERATIONS_MAX_LIMIT);
                        break;
                case ARG_MAX_BRANCHES:
                        if (parse_bounded(optarg, 1, BRANCHES_MAX_LIMIT, &arg_max_branches) < 0)
                                return log_error_errno(EINVAL, "--max-branches takes a number from 1 to %u.",
                                                       BRANCHES_MAX_LIMIT);
                        break;
                case ARG_CONTROL_TIMEOUT:
                        if (parse_bounded(optarg, 1, CONTROL_TIMEOUT_MAX_SEC, &arg_control_timeout_sec) < 0)
                                return log_error_errno(EINVAL, "--control-timeout-sec takes a number from 1 to %u.",
                                                       CONTROL_TIMEOUT_MAX_SEC);
                        break;
                case ARG_NETNS_POOL:
                        if (parse_bounded(optarg, 0, NETNS_POOL_MAX, &arg_netns_pool) < 0)
                                return log_error_errno(EINVAL, "--netns-pool takes a number from 0 to %u.",
                                                       NETNS_POOL_MAX);
                        break;
                case ARG_DEFAULT_KERNEL:
                        arg_default_kernel = optarg;
                        break;
                case ARG_DEFAULT_INITRD:
                        arg_default_initrd = optarg;
                        break;
                case ARG_REGISTRY_CONFIG:
                        if (optarg[0] != '/' || strlen(optarg) > 1024)
                                return log_error_errno(EINVAL, "--registry-config needs an absolute path of at most "
                                                       "1024 bytes.");
                        arg_registry_config = optarg;
                        break;
                case ARG_DEFAULT_MEM_MIB:
                        arg_default_mem_mib = optarg;
                        break;
                case ARG_DEFAULT_VCPUS:
                        arg_default_vcpus = optarg;
                        break;
                case ARG_VMM_USER:
                        if (vmm_parse_user(optarg, &arg_vmm_uid, &arg_vmm_gid) < 0)
                                return log_error_errno(EINVAL, "--vmm-user takes UID[:GID], numbers other than 0.");
                        break;
                case ARG_VMM_UID_RANGE:
                        arg_vmm_uid_range = optarg;
                        break;
                case ARG_NO_CONFINE:
                        arg_confine = false;
                        break;
                case ARG_TRUSTED_BRIDGE_USER:
                        arg_bridge_user = optarg;
                        break;
                case '?':
                        return -EINVAL;
                default:
                        return -EINVAL;
                }
        if (optind < argc) {
                if (strcmp(argv[optind], "doctor") == 0)
                        return log_error_errno(EINVAL, "doctor comes first: forkd doctor [OPTIONS].");
                return log_error_errno(EINVAL, "forkd takes no positional arguments.");
        }
        return 1;
}

/* --default-mem-mib (or its variable): 0, or what CreateSnapshot's mem_mib may be. */
static int parse_default_mem_mib(const char *s, unsigned *ret) {
        unsigned v;

        if (parse_bounded(s, 0, MEM_MIB_MAX, &v) < 0 || !mem_mib_is_valid(v))
                return -EINVAL;
        *ret = v;
        return 0;
}

/* --trusted-bridge-user: a decimal uid, or a user name looked up in the user
 * database. "" is none (OWNER_UID_INVALID). -EINVAL for anything malformed, root
 * or (uid_t) -1; -ENOENT for a well-formed name with no such user. */
static int setup_shared(Manager *m) {
        log_info("Every confined VMM runs as %u:%u (--vmm-uid-range shared).", (unsigned) m->vmm_uid,
                 (unsigned) m->vmm_gid);
        return 0;
}

/* forkd --vmm-uid-range (forkd(8), VMM USERS): refused whole if it holds a
 * reserved id, the --vmm-user, or any user's or group's id; then the ids of
 * the range that a process still runs under (a VMM of a forkd that went away,
 * not dead yet) are marked used. Without the option (spec NULL), the default
 * range, or 'shared' with a warning where the default range is refused. */
static int setup_vmm_uid_range(Manager *m, const char *spec) {
        _cleanup_free_ char *what = NULL;
        uid_t first = VMM_UID_RANGE_DEFAULT_FIRST, id = 0;
        uint32_t count = VMM_UID_RANGE_DEFAULT_COUNT;
        bool implicit = !spec;
        int r;

        if (spec && streq(spec, "shared"))
                return setup_shared(m);
        if (spec && uid_range_parse(spec, &first, &count) < 0)
                return log_error_errno(EINVAL, "--vmm-uid-range (FORKD_VMM_UID_RANGE) takes FIRST:COUNT, decimal "
                                       "numbers, COUNT from 1 to %u, or 'shared', not '%s'.",
                                       VMM_UID_RANGE_COUNT_MAX, spec);
        r = uid_range_check(first, count, m->vmm_uid, &id);
        if (r >= 0) /* the VMM group is every such VMM's too */
                r = uid_range_check(first, count, m->vmm_gid, &id);
        if (r == -EEXIST && implicit) {
                log_warning("The default --vmm-uid-range %u:%u holds %u, the --vmm-user's uid or gid: every "
                            "confined VMM runs as --vmm-user instead (shared).", (unsigned) first, (unsigned) count,
                            (unsigned) id);
                return setup_shared(m);
        }
        if (r == -EEXIST)
                return log_error_errno(r, "--vmm-uid-range %u:%u holds %u, which no VMM may run as (root, nobody, "
                                       "65533, or the --vmm-user's uid or gid).", (unsigned) first, (unsigned) count,
                                       (unsigned) id);
        if (r < 0)
                return log_error_errno(r, "--vmm-uid-range %u:%u goes past the last uid, %u.", (unsigned) first,
                                       (unsigned) count, (unsigned) ((uid_t) -1 - 1));
        r = uid_range_check_databases(first, count, &what);
        if (r < 0 && implicit) {
                log_warning("The default --vmm-uid-range %u:%u holds the id of %s: every confined VMM runs as "
                            "--vmm-user instead (shared); pick a free range with --vmm-uid-range.",
                            (unsigned) first, (unsigned) count, what);
                return setup_shared(m);
        }
        if (r < 0)
                return log_error_errno(r, "--vmm-uid-range %u:%u holds the id of %s; pick a range no user or group "
                                       "has an id in.", (unsigned) first, (unsigned) count, what);
        r = uid_range_init(&m->vmm_uids, first, count);
        if (r < 0)
                return log_oom();
        log_info("Each sandbox's confined VMM runs under an id of its own from --vmm-uid-range %u:%u.",
                 (unsigned) first, (unsigned) count);
        r = uid_range_reserve_running(&m->vmm_uids, "/proc");
        if (r < 0)
                return log_error_errno(r, "Failed to read /proc for processes that run under an id of "
                                       "--vmm-uid-range: %m");
        if (r > 0)
                log_info("%d id(s) of --vmm-uid-range still in use by a running process: kept out of use.", r);
        r = userns_pool_init(m);
        if (r < 0)
                return log_oom();
        return 0;
}

static int resolve_bridge_user(const char *s, uid_t *ret) {
        struct passwd pw, *found = NULL;
        char buf[4096];
        int r;

        if (!*s) {
                *ret = OWNER_UID_INVALID;
                return 0;
        }
        if (strlen(s) > 64)
                return -EINVAL;
        if (s[0] >= '0' && s[0] <= '9') {
                unsigned long long v;
                char *end;

                errno = 0;
                v = strtoull(s, &end, 10);
                if (errno || *end || v == 0 || v >= UINT32_MAX)
                        return -EINVAL;
                *ret = (uid_t) v;
                return 0;
        }
        /* POSIX's portable user name characters only: no '/', ':', spaces or control
         * bytes reach the lookup or the log. */
        if (s[0] == '-' || s[strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")] != '\0')
                return -EINVAL;
        r = getpwnam_r(s, &pw, buf, sizeof buf, &found);
        if (r != 0)
                return -r;
        if (!found)
                return -ENOENT;
        if (found->pw_uid == 0 || found->pw_uid == OWNER_UID_INVALID)
                return -EINVAL;
        *ret = found->pw_uid;
        return 0;
}

static int on_exit_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Manager *m = userdata;

        log_warning("Operations still running after %llus, exiting anyway.",
                    (unsigned long long) (EXIT_GRACE_USEC / 1000000));
        return sd_event_exit(m->event, 0);
}

static int on_term(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata) {
        Manager *m = userdata;

        if (m->exiting)
                return 0;
        log_info("Received SIG%s, stopping once the running operations end.", sigabbrev_np((int) si->ssi_signo));
        (void) sd_notify(false, "STOPPING=1");
        m->exiting = true;
        (void) sd_event_add_time_relative(m->event, &m->exit_timer, CLOCK_MONOTONIC, EXIT_GRACE_USEC, 0,
                                          on_exit_timer, m);
        manager_check_idle_exit(m);
        return 0;
}

static int connect_bus(Manager *m) {
        int r;

        if (arg_bus_address) {
                r = sd_bus_new(&m->bus);
                if (r < 0)
                        return r;
                r = sd_bus_set_address(m->bus, arg_bus_address);
                if (r >= 0)
                        r = sd_bus_set_bus_client(m->bus, true);
                if (r >= 0)
                        r = sd_bus_start(m->bus);
        } else
                r = sd_bus_open_system(&m->bus);
        if (r < 0)
                return r;
        r = sd_bus_attach_event(m->bus, m->event, 0);
        if (r < 0)
                return r;
        return sd_bus_set_exit_on_disconnect(m->bus, true);
}

static void raise_nofile(void) {
        struct rlimit rl;

        /* Four fds per sandbox (its agent and control sockets, its cpu.stat and
         * /proc statm kept open for its usage), up to SANDBOXES_MAX of them. */
        if (getrlimit(RLIMIT_NOFILE, &rl) >= 0 && rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                (void) setrlimit(RLIMIT_NOFILE, &rl);
        }
        if (getrlimit(RLIMIT_NOFILE, &rl) >= 0 && rl.rlim_cur < 4 * SANDBOXES_MAX + 256)
                log_warning("RLIMIT_NOFILE is %llu: fewer than %u sandboxes may fit.", (unsigned long long) rl.rlim_cur,
                            SANDBOXES_MAX);
}

static int run(int argc, char *argv[]) {
        _cleanup_(manager_freep) Manager *m = NULL;
        sigset_t ss;
        int r;

        log_prefix = "forkd";
        if (getenv("FORKD_LOG_DEBUG"))
                log_max_level = LOG_LVL_DEBUG;
        r = parse_argv(argc, argv);
        if (r <= 0)
                return r;

        /* Before any thread exists: the loop takes these through signalfd. */
        sigemptyset(&ss);
        sigaddset(&ss, SIGTERM);
        sigaddset(&ss, SIGINT);
        if (sigprocmask(SIG_BLOCK, &ss, NULL) < 0)
                return log_error_errno(errno, "sigprocmask failed: %m");
        (void) signal(SIGPIPE, SIG_IGN);
        raise_nofile();

        r = manager_new(&m);
        if (r < 0)
                return log_error_errno(r, "Failed to allocate the manager: %m");
        m->hooks = &daemon_hooks;
        m->max_operations = arg_max_operations;
        m->max_branches = arg_max_branches;
        m->control_timeout_usec = arg_control_timeout_sec * USEC_PER_SEC;
        m->netns_pool_size = arg_netns_pool;
        if (!arg_default_mem_mib)
                arg_default_mem_mib = getenv("FORKD_DEFAULT_MEM_MIB");
        if (arg_default_mem_mib && parse_default_mem_mib(arg_default_mem_mib, &m->default_mem_mib) < 0)
                return log_error_errno(EINVAL, "--default-mem-mib (FORKD_DEFAULT_MEM_MIB) takes 0 or an even number "
                                       "from 16 to %u, not '%s'.", MEM_MIB_MAX, arg_default_mem_mib);
        if (!arg_default_vcpus)
                arg_default_vcpus = getenv("FORKD_DEFAULT_VCPUS");
        if (arg_default_vcpus && parse_bounded(arg_default_vcpus, 1, SNAPSHOT_VCPUS_MAX, &m->default_vcpus) < 0)
                return log_error_errno(EINVAL, "--default-vcpus (FORKD_DEFAULT_VCPUS) takes a number from 1 to %u, "
                                       "not '%s'.", SNAPSHOT_VCPUS_MAX, arg_default_vcpus);
        m->confine = arg_confine && !(getenv("FORKD_NO_CONFINE") && strcmp(getenv("FORKD_NO_CONFINE"), "1") == 0);
        m->vmm_uid = arg_vmm_uid;
        m->vmm_gid = arg_vmm_gid;
        if (m->confine) {
                r = setup_vmm_uid_range(m, arg_vmm_uid_range ?: getenv("FORKD_VMM_UID_RANGE"));
                if (r < 0)
                        return r;
        }
        if (arg_bridge_user) {
                uid_t uid;

                r = resolve_bridge_user(arg_bridge_user, &uid);
                if (r == -ENOENT)
                        /* Fail closed but keep serving: the bridge goes through the bus and polkit. */
                        log_warning("--trusted-bridge-user: no user %s; no bridge is trusted.", arg_bridge_user);
                else if (r < 0)
                        return log_error_errno(r, "--trusted-bridge-user takes a user name or a uid, not root "
                                               "(or an empty value for none).");
                else if (uid != OWNER_UID_INVALID) {
                        r = manager_trust_bridge(m, uid);
                        if (r == -EEXIST && uid != m->vmm_uid)
                                return log_error_errno(r, "--trusted-bridge-user: uid %u is one of --vmm-uid-range; "
                                                       "a confined VMM must not pass for the bridge.",
                                                       (unsigned) uid);
                        if (r == -EEXIST)
                                return log_error_errno(r, "--trusted-bridge-user: uid %u is the VMM user "
                                                       "(--vmm-user); a confined VMM must not pass for the bridge.",
                                                       (unsigned) uid);
                        if (r < 0)
                                return log_error_errno(r, "Cannot trust the bridge uid %u: %m", (unsigned) uid);
                        log_info("Trusting uid %u (%s) as the REST bridge on the direct socket.", (unsigned) uid,
                                 arg_bridge_user);
                }
        }
        m->state_dir = strdup(arg_state_dir);
        if (arg_runtime_dir && !(m->runtime_dir = strdup(arg_runtime_dir)))
                return log_oom();
        m->vmm_path = strdup(arg_vmm ?: getenv("FORKD_VMM") ?: FORKD_VMM_DEFAULT);
        if (!m->state_dir || !m->vmm_path)
                return log_oom();
        if (access(m->vmm_path, X_OK) < 0)
                return log_error_errno(errno, "Cannot execute %s (set --vmm or $FORKD_VMM): %m", m->vmm_path);
        r = setup_image_paths(m);
        if (r < 0)
                return r;
        if (!arg_registry_config)
                arg_registry_config = getenv("FORKD_REGISTRY_CONFIG");
        r = manager_load_registries(m, arg_registry_config ?: REGISTRY_CONFIG_DEFAULT, !!arg_registry_config);
        if (r < 0)
                return r;

        (void) manager_take_activated_direct(m); /* before anything is spawned */

        r = cgroup_manager_new(m->event, arg_cgroup_root, &m->cgroups);
        if (r < 0)
                return log_error_errno(r, "Failed to set up memory limits: %m");
        r = manager_startup(m);
        if (r < 0)
                return r;
        r = worker_pool_new(m->event, m->max_operations, &m->workers);
        if (r < 0)
                return log_error_errno(r, "Failed to start the worker threads: %m");

        r = sd_event_add_signal(m->event, NULL, SIGTERM, on_term, m);
        if (r >= 0)
                r = sd_event_add_signal(m->event, NULL, SIGINT, on_term, m);
        if (r < 0)
                return log_error_errno(r, "Failed to watch signals: %m");
        r = sd_event_set_watchdog(m->event, true);
        if (r < 0)
                log_warning_errno(r, "Failed to enable the watchdog: %m");

        r = connect_bus(m);
        if (r < 0)
                return log_error_errno(r, "Failed to connect to the bus: %m");
        r = manager_add_bus_objects(m);
        if (r < 0)
                return r;
        (void) manager_listen_direct(m); /* the bus stays the way in when this fails */
        r = sd_bus_request_name(m->bus, FORKD_BUS_NAME, 0);
        if (r < 0)
                return log_error_errno(r, "Failed to own the bus name %s: %m", FORKD_BUS_NAME);
        manager_announce_restart(m);

        log_info("forkd %s ready: state %s, vmm %s, at most %u operations.", FORKD_VERSION, m->state_dir, m->vmm_path,
                 m->max_operations);
        (void) sd_notify(false, "READY=1\nSTATUS=Serving org.forkd.Manager.");

        r = sd_event_loop(m->event);
        if (r < 0)
                return log_error_errno(r, "Event loop failed: %m");
        (void) sd_notify(false, "STOPPING=1");
        if (worker_pool_pending(m->workers) > 0) {
                /* A worker is blocked in a long boot; its VMM dies with us (PR_SET_PDEATHSIG). */
                log_warning("Exiting with operations still running.");
                /* The pool's thread is no worker's: its namespaces go now, not at the next start. */
                m->netns_pool = netns_pool_free(m->netns_pool);
                fflush(stderr);
                _exit(EXIT_SUCCESS);
        }
        return 0;
}

int main(int argc, char *argv[]) {
        int r;

        /* forkd doctor: the host checks, the same as forkctl doctor (src/shared/doctor.c). */
        if (argc > 1 && strcmp(argv[1], "doctor") == 0)
                return doctor_main("forkd", argc - 1, argv + 1);

        r = run(argc, argv);
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
