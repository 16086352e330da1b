/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The daemon's state: snapshots (Image), sandboxes, templates, operations.
 * Everything here lives in the event loop thread; worker threads only ever
 * see the private job structures handed to them. */

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include "fork-options.h"
#include "forkd-bus.h"
#include "hashmap.h"
#include "histogram.h"
#include "uid-range.h"
#include "netns-pool.h"
#include "userns-pool.h"


/* Limits on what callers control */
#define SANDBOXES_MAX 4096u           /* live sandboxes, all snapshots together */
#define SNAPSHOTS_MAX 1024u
#define FORK_N_MAX 1000u
#define OPERATIONS_MAX_DEFAULT 4u
#define OPERATIONS_MAX_LIMIT 64u
#define BRANCHES_MAX_DEFAULT 4u           /* branches in flight at once (Busy beyond; 503 in forkd's REST API v1) */
#define BRANCHES_MAX_LIMIT 64u
#define CONTROL_TIMEOUT_DEFAULT_SEC 30u   /* a VMM's answer to branch or fork */
#define CONTROL_TIMEOUT_MAX_SEC 3600u
#define PATH_ARG_MAX 4096u            /* kernel and rootfs paths */
#define CODE_MAX (256u * 1024u)       /* Eval/RunCode code */
#define EXEC_ARGS_MAX 1024u
#define EXEC_ARGS_BYTES_MAX (256u * 1024u)
#define EXEC_TIMEOUT_DEFAULT 30u
#define EXEC_TIMEOUT_MAX 3600u
#define BOOT_WAIT_MAX 600u
#define MEM_MIB_MAX 3072u

/* A guest RAM size CreateSnapshot takes (and forkd --default-mem-mib): 0 for the default, or even, 16..MEM_MIB_MAX. */
static inline bool mem_mib_is_valid(unsigned v) {
        return v == 0 || (v >= 16 && v <= MEM_MIB_MAX && v % 2 == 0);
}
#define AGENT_CALLS_MAX 64u           /* requests in flight per sandbox */
#define AGENT_COMPLETIONS_PER_DISPATCH 64u /* agent answers handled per event-loop turn and sandbox */

typedef struct Manager Manager;
typedef struct Image Image;
typedef struct Sandbox Sandbox;
typedef struct VmTemplate VmTemplate;
typedef struct ForkOp ForkOp;
typedef struct Operation Operation;
typedef struct BranchOp BranchOp;
typedef struct ControlWaiter ControlWaiter;
typedef struct CGroupManager CGroupManager;
typedef struct WorkerPool WorkerPool;
typedef struct ProcStream ProcStream;
struct polkit_registry;

/* What the layers above the models (operations: branches, forks, pauses; the
 * bus faces) do at points of the models' life. The models call these and know
 * nothing else of them; daemon_hooks (hooks.c) is installed by forkd.c right
 * after manager_new(). */
typedef struct ManagerHooks {
        /* manager_startup(), before the snapshots directory is scanned: watch it. */
        int (*watch_snapshots)(Manager *m);
        /* A staging directory that is no snapshot: 1 if an operation adopted it. */
        int (*adopt_staging)(Manager *m, const char *name);
        /* manager_startup(), after the snapshots are loaded. */
        int (*load_paused)(Manager *m);
        /* manager_free(), after the sandboxes: the branches, then the operations. */
        void (*free_operations)(Manager *m);
        /* manager_free(), after the templates and before the snapshots. */
        void (*free_paused)(Manager *m);
        /* sandbox_free(): requests still waiting for its VMM fail. */
        void (*sandbox_gone)(Sandbox *s);
        /* sandbox_exited() of a starting sandbox with its fork: true when the fork
         * waits for this exit, and then child_gone() once the sandbox is freed. */
        bool (*fork_child_exited)(ForkOp *f, Sandbox *s, int code, int sig);
        void (*fork_child_gone)(ForkOp *f);
        /* sandbox_exited(): the snapshot tag it ran from is no longer used by it. */
        bool (*snapshot_is_forkds)(const char *tag);
        void (*snapshot_released)(Manager *m, const char *tag);
        /* Its deadline with on_timeout "pause": pause s, nobody to answer. */
        int (*pause)(Sandbox *s);
        /* The bus faces: SandboxRemoved, State's PropertiesChanged, and the
         * direct connections' end in manager_free(). */
        void (*sandbox_removed)(Sandbox *s, const char *reason);
        void (*sandbox_state_changed)(Sandbox *s);
        void (*close_direct)(Manager *m);
} ManagerHooks;

#define FORKD_DIRECT_CONNECTIONS_MAX 16U

struct Manager {
        sd_event *event;
        sd_bus *bus;
        const ManagerHooks *hooks;

        char *state_dir;
        char *snapshots_dir;  /* state_dir/snapshots */
        char *runtime_dir;    /* --runtime-dir; NULL: state_dir */
        char *sandboxes_dir;  /* (runtime_dir or state_dir)/sandboxes: one record per live sandbox */
        int runtime_lock_fd;  /* flock on runtime_dir/sandboxes.lock, with a runtime_dir */
        char *overlay_dir;    /* state_dir/overlays: unlinked copy-on-write disk files */
        char *log_dir;        /* state_dir/logs: boot consoles */
        char *vmm_path;
        /* Snapshots of OCI images: the kernel and initramfs when the caller names
         * none (forkd --default-kernel, --default-initrd; NULL: none), forkd-oci,
         * the agent it installs, and its layer cache (state_dir/oci-layers). */
        char *default_kernel, *default_initrd;
        char *oci_path, *image_agent_path, *oci_cache_dir;
        /* forkd --registry-config: the registries images are pulled from and
         * snapshots pushed to and pulled from (read at each use). */
        char *registry_config_path;
        int lock_fd;          /* flock on state_dir/.lock: one daemon per state dir */
        bool confine;         /* VMMs run confined (confine.c; forkd --no-confine: false) */
        uid_t vmm_uid;        /* their user and group (forkd --vmm-user) */
        gid_t vmm_gid;
        /* forkd --vmm-uid-range FIRST:COUNT: the ids a VMM of its own may run
         * under (uid-range.c), checked and recovered at start; count 0 with
         * --vmm-uid-range shared, or unconfined. */
        UidRange vmm_uids;
        UsernsPool userns_pool; /* user namespaces of the range's ids made ahead of time */

        Hashmap *images;      /* tag -> Image */
        Hashmap *creating;    /* tag -> Operation: snapshots being created */
        Hashmap *branching;   /* tag -> BranchOp: branches of running sandboxes in flight */
        unsigned max_branches;
        unsigned default_mem_mib; /* guest RAM when CreateSnapshot names none (forkd --default-mem-mib); 0: forkd-vmm's */
        unsigned default_vcpus;   /* vCPUs when a create request names none (forkd --default-vcpus); 0: 1 */
        uint64_t control_timeout_usec; /* a VMM's control reply; past it the sandbox is killed */
        Hashmap *sandboxes;   /* id -> Sandbox, starting ones included */
        Hashmap *vms;         /* vm_id -> Sandbox: every sandbox, retired ones (merged away) too */
        Hashmap *paused;      /* id -> Paused (paused.c): sandboxes without a VM, kept across restarts */
        unsigned n_sandboxes_reserved; /* by forks in progress, not yet in the map */
        VmTemplate *templates;

        Operation *operations;
        unsigned n_operations, max_operations;
        WorkerPool *workers;

        CGroupManager *cgroups;
        struct polkit_registry *polkit_registry;

        /* Per-child network namespaces (netns.c): the /30s of the children of
         * snapshots with a NIC come from here (NETNS_DEFAULT_PREFIX). */
        NetnsPrefix netns_prefix;
        /* --netns-pool: namespaces made ahead of time per policy (netns-pool.c);
         * NULL when the size is 0 or forkd is not root. */
        unsigned netns_pool_size;
        NetnsPool *netns_pool;

        /* Direct (peer-to-peer) D-Bus connections from root and the trusted REST
         * bridge, without the bus daemon in between: state_dir/bus.sock
         * (manager-dbus.c). bridge_uid: OWNER_UID_INVALID when none is trusted. */
        uid_t bridge_uid;
        int direct_fd;
        char *direct_path;
        bool direct_activated;  /* direct_fd came from forkd.socket: systemd owns the path */
        sd_event_source *direct_source;
        sd_bus *direct[FORKD_DIRECT_CONNECTIONS_MAX];
        bool direct_started[FORKD_DIRECT_CONNECTIONS_MAX]; /* ready, and its early bytes processed */
        unsigned n_direct;
        sd_event_source *direct_kick; /* post source while a connection is still authenticating */

        /* Sandboxes recorded by the previous daemon, announced once on the bus. */
        char **stale_ids;
        char **stale_records; /* their record files: removed once SandboxRemoved went out */
        unsigned n_stale_ids;

        bool exiting;         /* asked to stop: exit once no operation runs */
        bool freeing;         /* in manager_free(): leave records and cgroups to the next start */
        sd_event_source *exit_timer;
        sd_event_source *exit_poll;   /* stopping: waiting for cgroups to empty */
        /* inotify on snapshots_dir: a snapshot renamed into place by a branch
         * writer of a predecessor (branch.c) is registered when it lands. */
        int snapshots_watch_fd;
        sd_event_source *snapshots_watch;
        /* Latencies since start, for GetMetrics(): each Fork call to its reply
         * (ready), each branch's pause of its source, each answered agent call. */
        Histogram fork_latency, branch_pause, agent_call;
        /* Output streams of processes in sandboxes (sandbox-proc-dbus.c). */
        ProcStream *proc_streams;
        unsigned n_proc_streams;
};

int manager_new(Manager **ret);
Manager *manager_free(Manager *m);
static inline void manager_freep(Manager **m) {
        if (*m)
                manager_free(*m);
}

/* Create the state directory layout, take the lock, clean up what a killed
 * daemon left behind and load the snapshots. */
int manager_startup(Manager *m);

/* Called when the bus name is ours. */
void manager_announce_restart(Manager *m);

/* Number of sandboxes that are visible (running or terminating). */
unsigned manager_n_visible_sandboxes(const Manager *m);

/* Exit the loop once no operation runs any more. */
void manager_check_idle_exit(Manager *m);

/* Random lowercase hex. */
void random_hex(char *buf, size_t n_digits);
