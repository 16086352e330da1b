/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Driving forkd-vmm from another process: boot a VM, talk to its control
 * socket, start a template and have it fork children. Used by the daemon, the
 * benchmarks and the integration tests.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "time-util.h"

struct rate_limit; /* fork-options.h */

struct vmm_proc {
        pid_t pid;
        int control_fd; /* SOCK_SEQPACKET, ours */
        int agent_fd;   /* SOCK_STREAM, ours */
};

/* Guest RAM in MiB when the caller names none (mem_mib 0 here and in
 * CreateSnapshot, forkd-vmm boot without --mem-mib): what Debian's cloud
 * kernel and its initramfs need (in 64 MiB they triple-fault). memory.bin is
 * sparse, so a snapshot stores only the pages the guest wrote. */
#define VMM_MEM_MIB_DEFAULT 256u

/* A Linux guest's kernel command line when the caller names none (forkd-vmm
 * boot without --cmdline). */
#define VMM_LINUX_CMDLINE_DEFAULT "console=ttyS0 reboot=k panic=-1 root=/dev/vda rw quiet"

#define VMM_CLIENT_VOLUMES_MAX 24

struct vmm_boot_args {
        const char *vmm_path;    /* forkd-vmm binary */
        const char *kernel;
        const char *disk;
        uint64_t mem_mib;        /* 0: forkd-vmm's default, VMM_MEM_MIB_DEFAULT */
        unsigned vcpus;          /* 0: forkd-vmm's default, 1 */
        const char *id;
        const char *console_log; /* may be NULL */
        const char *overlay_dir; /* may be NULL */
        const char *cmdline;     /* a Linux guest's kernel command line; NULL: the default */
        /* with_net: a NIC on net_tap_fd (forkd-vmm boot --net-tap-fd), which
         * stays the caller's (the VMM gets a copy). */
        bool with_net;
        int net_tap_fd;
        /* Volumes (forkd-vmm boot --volume-fd N:MODE:GUEST), in device order:
         * the fds stay the caller's. */
        const struct vmm_volume_arg {
                int fd;
                const char *mode;       /* "ro", "cow" or "rw" */
                const char *guest_path;
        } *volumes;
        unsigned n_volumes;
        /* With confinement (vmm_client_set_confine()): the directories the VMM
         * reaches (forkd-vmm --jail-link), in place of the --jail-bind ones;
         * NULL-terminated, or NULL for those. */
        const char *const *jail_links;
};

/* The most --jail-link directories forkd-vmm takes. */
#define VMM_CLIENT_JAIL_LINKS_MAX 72u

/* The default identity of a confined VMM (forkd --vmm-user): 65533, from the
 * block 65520..65533 that systemd's UID allocation leaves unused, so it is no
 * user in /etc/passwd and no dynamic service user, and no user needs creating. */
#define VMM_USER_DEFAULT_UID 65533
#define VMM_USER_DEFAULT_GID 65533

/* "UID[:GID]", decimal numbers, neither 0 nor -1; GID defaults to UID. */
int vmm_parse_user(const char *s, uid_t *ret_uid, gid_t *ret_gid);

/* Confinement of every forkd-vmm this process starts from now on (boot and
 * template; forkd-vmm(8), CONFINEMENT): forkd-vmm gets --confine UID:GID and
 * --jail-bind for each directory (unless the caller names --jail-link ones
 * for that VMM). NULL (the default): none, as before. The
 * strings are copied. Call it before any thread starts VMMs. */
struct vmm_confine {
        uid_t uid;
        gid_t gid;
        const char *binds[4]; /* directories bound read-write at their own paths */
        unsigned n_binds;
};
int vmm_client_set_confine(const struct vmm_confine *c);

/* Start "forkd-vmm boot" with a fresh agent and control socket pair. */
int vmm_client_boot(const struct vmm_boot_args *a, struct vmm_proc *ret);

/* Send one JSON control request and wait up to timeout_usec for its reply.
 * Template events ({"event":...}) met on the way are skipped. */
int vmm_client_control(int control_fd, const char *request, uint64_t timeout_usec, char **ret_reply);
/* The same, with fd (>= 0) sent along (SCM_RIGHTS). */
int vmm_client_control_fd(int control_fd, const char *request, int fd, uint64_t timeout_usec, char **ret_reply);

/* Wait up to timeout_usec for a VM process to exit by itself, and reap it:
 * *ret_status gets its waitpid() status. -ETIMEDOUT if it still runs (it is
 * left alone; vmm_proc_stop() ends it). */
int vmm_proc_wait(struct vmm_proc *p, uint64_t timeout_usec, int *ret_status);

/* Stop a VM process: close our ends (a VM started with a control fd stops
 * when it hangs up), SIGKILL after grace_usec, reap. */
void vmm_proc_stop(struct vmm_proc *p, uint64_t grace_usec);

struct vmm_template {
        pid_t pid;
        int control_fd;
        uint64_t generation; /* of the snapshot */
        unsigned n_exits;    /* exit events seen so far */
        /* Optional: called (from the thread that waits in
         * vmm_client_template_spawn()) with the JSON text of every template
         * event met while collecting spawn replies, so that a caller watching
         * the control socket itself loses none. The text is valid during the
         * call only. */
        void (*on_event)(const char *json, void *userdata);
        void *event_userdata;
};

/* Start "forkd-vmm template" for a snapshot and wait until it is ready. */
int vmm_client_template_start(const char *vmm_path, const char *snapshot_dir, const char *overlay_dir,
                              struct vmm_template *ret, char **ret_error);
/* The same for a snapshot with rw volumes: their fds, in order (forkd-vmm
 * template --volume-fd); they stay the caller's. */
int vmm_client_template_start_volumes(const char *vmm_path, const char *snapshot_dir, const char *overlay_dir,
                                      const int *rw_fds, unsigned n_rw, struct vmm_template *ret, char **ret_error);
/* The same, and with confinement, jail_links (NULL-terminated; NULL: none) as
 * its --jail-link directories in place of the --jail-bind ones: what every
 * child of the template reaches. */
int vmm_client_template_start_links(const char *vmm_path, const char *snapshot_dir, const char *overlay_dir,
                                    const int *rw_fds, unsigned n_rw, const char *const *jail_links,
                                    struct vmm_template *ret, char **ret_error);

/* Fork n children. For each: a connected agent socket is returned in
 * agent_fds[i], a control socket in control_fds[i] if control_fds is not NULL,
 * and its pid in pids[i]. Requests are pipelined in batches of 100; on_batch (if
 * not NULL) is called as soon as a batch is sent, so the caller can start
 * talking to those children while the template still forks the rest. */
typedef void (*vmm_batch_sent_t)(size_t first, size_t n, void *userdata);
struct vmm_spawn_options {
        /* Each child logs its console to <console_dir>/<id>.log. May be NULL. */
        const char *console_dir;
        /* Each child joins <cgroup_parent>/<id>, which the caller has created,
         * before it restores anything; the caller opens its cgroup.procs and
         * sends the fd. May be NULL. */
        const char *cgroup_parent;
        /* NULL, or one entry per id: child i enters the network namespace
         * /run/netns/<netns[i]> (NULL entry: stays in the template's) before it
         * restores anything; the caller opens it and sends the fd. Names must pass the template's check (1 to 64 of
         * [A-Za-z0-9_.-], no leading '.', no ".."); a bad one fails the spawn.
         * Ignored when VMMs are confined (vmm_client_set_confine()): a confined
         * child has no right to enter a namespace and stays in its template's
         * empty one; its NIC is its tap, opened in its namespace. */
        const char *const *netns;
        /* NULL, or one tap fd per id (a snapshot with a NIC needs them, one
         * without refuses them; forkd-vmm(8), NETWORK): sent after the netns
         * fd, "with_tap":true. They stay the caller's, to close once the call
         * returned. */
        const int *tap_fds;
        /* NULL, or disk_rate and net_rate for every child (the spawn request's
         * "disk_rate" and "net_rate"): set before its guest runs. */
        const struct rate_limit *disk_rate, *net_rate;
        /* NULL, or one stats memfd per id (vmm-stats.h: VMM_STATS_SIZE bytes
         * at least), sent last, "with_stats":true: the child counts its
         * devices' work in it. They stay the caller's, like tap_fds. */
        const int *stats_fds;
        /* NULL, or one user namespace fd per id (a confined template only;
         * vmm_userns_new() makes them): child i runs under the ids it
         * maps (forkd-vmm(8), CONFINEMENT). Sent last (after the stats memfd), "with_userns":true;
         * they stay the caller's. */
        const int *userns_fds;
};

/* How many children one spawn request carries, given which fds go along per
 * child: at most 100, and at most SCM_MAX_FD (253) fds a message. */
size_t vmm_spawn_batch_size(bool with_control, bool with_cgroup, bool with_netns, bool with_tap);
/* The same for a child with per_child fds in all (1 to 6). */
size_t vmm_spawn_batch_size_fds(unsigned per_child);
int vmm_client_template_spawn_with(struct vmm_template *t, const char *const *ids, size_t n,
                                   const struct vmm_spawn_options *o, int *agent_fds, int *control_fds, pid_t *pids,
                                   vmm_batch_sent_t on_batch, void *userdata);
/* The same, with console_dir and cgroup_parent only (each may be NULL). */
int vmm_client_template_spawn(struct vmm_template *t, const char *const *ids, size_t n, const char *console_dir,
                              const char *cgroup_parent,
                              int *agent_fds, int *control_fds, pid_t *pids, vmm_batch_sent_t on_batch,
                              void *userdata);

/* Exit statuses of forkd-vmm (forkd-vmm(8), EXIT STATUS). 1, 5 and 6 come
 * from any VM process (boot, restore, a template's child); 2 to 4 from a
 * template's child only (boot and restore exit with 2 on bad usage). */
enum {
        VMM_CHILD_EXIT_FAILED = 1,  /* the run loop failed */
        VMM_CHILD_EXIT_RESTORE = 2, /* the snapshot could not be restored */
        VMM_CHILD_EXIT_CGROUP = 3,  /* could not join its cgroup; never ran */
        VMM_CHILD_EXIT_NETNS = 4,   /* could not enter its network namespace; never ran */
        VMM_EXIT_TRIPLE_FAULT = 5,  /* the guest crashed: triple fault (KVM_EXIT_SHUTDOWN) */
        VMM_EXIT_HALTED = 6,        /* the guest crashed: halted with no way to wake up */
};

void vmm_template_stop(struct vmm_template *t);

/* Microseconds on CLOCK_MONOTONIC, and on CLOCK_REALTIME (deadlines). */
