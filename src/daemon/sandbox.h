/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* A sandbox: one child VM of a template, its agent channel and its cgroup.
 * No D-Bus here (sandbox-dbus.c). */

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "fork-options.h"
#include "manager.h"
#include "usage.h"

struct json_object;
struct agent_call;
typedef struct fka_client fka_client;

typedef enum SandboxState {
        SANDBOX_STARTING,    /* spawned, its agent has not answered yet; not on the bus */
        SANDBOX_RUNNING,
        SANDBOX_TERMINATING, /* killed, waiting for its exit */
        _SANDBOX_STATE_MAX,
} SandboxState;

/* One TerminateSandboxes call: answered once every sandbox it killed is gone
 * (terminate_group_done() from sandbox_free()). */
typedef struct TerminateGroup {
        sd_bus_message *message;
        unsigned pending;  /* sandboxes still to go */
        char **unknown;    /* the ids that named no sandbox, for the reply */
} TerminateGroup;

#define SANDBOX_TERMINATE_GROUPS_MAX 4u

struct Sandbox {
        Manager *manager;
        char *id;             /* public: the bus object, the REST path; key of manager->sandboxes */
        /* The name its VMM was spawned under: the template's exit events, the
         * cgroup (or scope forkd-<vm_id>.scope) and the record file
         * state_dir/sandboxes/<vm_id>.json. Key of manager->vms. It equals id
         * until a merge moves another sandbox's id onto this VM. */
        char *vm_id;
        char *snapshot_tag;
        char *netns;          /* NULL: none */
        /* A namespace forkd made for it (netns.c; the snapshot has a NIC):
         * removed when the sandbox goes. */
        bool netns_owned;
        unsigned netns_index; /* its index, reserved by netns_pick_free() */
        char *host_addr;      /* the host end of its veth; NULL: no NIC */
        char *inside_addr;    /* the address the host dials to reach its guest */
        char *guest_addr;
        uint32_t pid;
        uint64_t created_at;  /* unix seconds */
        uint32_t memory_limit_mib; /* 0: none */
        struct sandbox_limits limits; /* cpu_limit, disk_rate, net_rate (fork-options.h) */
        uid_t owner_uid;      /* the caller that forked it (a merge keeps the id's owner) */
        uid_t vmm_uid;        /* the id of --vmm-uid-range its VMM runs under, held till it goes; 0: none */
        bool has_cgroup;
        bool live_fork;
        bool killed;          /* by us: the exit reason is "terminated" */
        bool stopped;         /* by forkd stopping: the reason is "daemon-stop" */
        /* Replaced by a merge: off the bus and out of manager->sandboxes, its VM
         * killed; no signal when it goes. merge_reply is sent once it is gone. */
        bool retired;
        /* The call that retired it (a merge, a pause): sent once its VM is gone. */
        sd_bus_message *retire_reply;
        bool pausing;         /* a pause is in flight (paused.c) */
        char *origin_tag;     /* NULL: snapshot_tag; else what it is shown to come from (a resume) */
        int net_policy;       /* with netns_owned: its NetnsPolicy */
        /* Its deadline (timeout_secs): CLOCK_REALTIME usec, 0: none; past it the
         * sandbox is killed (reason "timeout") or, timeout_pause, paused. */
        uint64_t expires_at;
        bool timeout_pause;
        bool timed_out;
        sd_event_source *deadline_source;
        /* Terminate calls answered once the VMM is gone, so that a caller
         * that sees the reply never finds the sandbox listed any more. */
        sd_bus_message *terminate_waiters[16];
        unsigned n_terminate_waiters;
        TerminateGroup *terminate_groups[SANDBOX_TERMINATE_GROUPS_MAX];
        unsigned n_terminate_groups;
        SandboxState state;

        int agent_fd;
        fka_client *client;
        /* The VMM's control socket (SOCK_SEQPACKET, forkd-vmm(8) CONTROL);
         * the VMM stops when it closes. Requests wait for their replies in
         * order: ctl_waiters, FIFO (branch.c). */
        int control_fd;
        sd_event_source *control_source;
        ControlWaiter *ctl_waiters;
        sd_event_source *control_timer; /* armed while a request waits (--control-timeout-sec) */
        sd_event_source *io_source, *timer_source;
        int agent_error;  /* why the agent channel broke, once it did */
        bool pump_again; /* completions may be waiting in the client: the timer fires at once */
        bool hangup_seen; /* the agent channel reported EPOLLHUP/EPOLLERR (once: edge-triggered) */
        struct agent_call *calls;

        VmTemplate *template;
        Sandbox *tpl_next, *tpl_prev;

        /* While starting: the fork that waits for its first answer, told why
         * it ended if it ends first. Cleared by the fork when it finishes. */
        ForkOp *fork_op;
        bool fork_awaits_exit; /* its agent channel closed: the fork counts it at its exit */

        /* Its VMM's stats page (usage.h), read-only; NULL: none. Unmapped when it goes. */
        const struct vmm_stats *stats;
        /* Its own cgroup's cpu.stat, once looked up (has_cgroup); NULL: not yet or none. */
        char *cpu_stat_path;
        bool cpu_stat_looked_up;
        UsageFiles usage_files;  /* its cpu.stat and /proc/PID/statm, kept open between reads */
};

struct sandbox_params {
        const char *id, *snapshot_tag, *netns;
        bool netns_owned;     /* netns is forkd's (forkd-child-<i>), removed at the end */
        const char *host_addr, *inside_addr; /* with netns_owned */
        bool agent_tcp;       /* guest_addr is inside_addr:AGENT_TCP_PORT */
        const char *vm_id;    /* NULL: id */
        uint32_t pid;
        uint64_t created_at;
        uint32_t memory_limit_mib;
        struct sandbox_limits limits;
        uid_t owner_uid;
        uid_t vmm_uid;        /* an id of --vmm-uid-range, taken over by the sandbox; 0: none */
        bool has_cgroup, live_fork;
        int net_policy;       /* with netns_owned */
};

/* Takes agent_fd (closed on failure too). Registers the sandbox in the manager. */
int sandbox_new(Manager *m, const struct sandbox_params *p, int agent_fd, Sandbox **ret);

/*
 * A request sent before its sandbox exists: a fork pings each child as soon as
 * the template has its spawn request, from the fork's worker thread (touches
 * nothing of the manager), so the answer is on its way while forkd registers
 * the sandboxes. sandbox_new_early() then takes the client, and the call is
 * answered through cb like sandbox_call()'s, from the event loop.
 */
typedef void (*agent_reply_t)(int r, uint16_t type, const char *json, struct json_object *obj, void *userdata);
typedef struct SandboxEarly SandboxEarly;
int sandbox_early_call(int agent_fd, const char *json, uint64_t timeout_usec, agent_reply_t cb, void *userdata,
                       SandboxEarly **ret);
/* Free an early call never handed to sandbox_new_early() (cb is not called);
 * the agent fd stays the caller's. Accepts NULL, returns NULL. */
SandboxEarly *sandbox_early_free(SandboxEarly *e);
/* sandbox_new() with e's client and its call in flight; takes agent_fd and e
 * (both freed on failure, cb not called). */
int sandbox_new_early(Manager *m, const struct sandbox_params *p, int agent_fd, SandboxEarly *e, Sandbox **ret);
/* Unregister and free. Calls in flight fail with -ECONNRESET. Unless the
 * daemon is exiting, the record and the cgroup are removed. No signal. */
Sandbox *sandbox_free(Sandbox *s);

/* The VMM exited (code, or signal sig): decide the reason, announce it if
 * the sandbox was on the bus, and free it. */
void sandbox_exited(Sandbox *s, int code, int sig);

/* SIGKILL the VMM; teardown and the exit event follow. Idempotent. */
int sandbox_kill(Sandbox *s);
/* One sandbox of g gone (or never waited for): g answered and freed at the last. */
void terminate_group_done(TerminateGroup *g);
void terminate_group_free(TerminateGroup *g);

/* Send one agent request. cb runs exactly once, from the event loop, also
 * when the sandbox goes away first (-ECONNRESET). r < 0: no answer; else
 * type is FKA_RESPONSE or FKA_ERROR with the payload (json, obj). cb must not
 * free the sandbox. -EBUSY when AGENT_CALLS_MAX requests are in flight. */
int sandbox_call(Sandbox *s, const char *json, uint64_t timeout_usec, agent_reply_t cb, void *userdata);

/* Merge: the public id of p moves to w's VM (w's own id is dropped), p's VM
 * is killed and p retired; it is freed, silently, once its VMM is gone.
 * *ret_old_id: w's id before (the caller announces its removal). Rewrites
 * w's record first; on failure nothing changed. */
int sandbox_merge(Sandbox *p, Sandbox *w, char **ret_old_id);

/* Arm (expires_at CLOCK_REALTIME usec) or clear (0) s's deadline. */
int sandbox_set_deadline(Sandbox *s, uint64_t expires_at, bool pause);
/* expires_at as RFC 3339 UTC with milliseconds into buf (64 bytes); "" for 0. */
const char *deadline_format(uint64_t expires_at, char buf[static 64]);

const char *sandbox_state_to_string(SandboxState s);
/* Is the sandbox visible (on the bus, listed): running or terminating? */
bool sandbox_is_visible(const Sandbox *s);
int sandbox_object_path(const char *id, char **ret);

/* What it uses now (usage.h): a few small reads, no request to the VMM. */
void sandbox_read_usage(Sandbox *s, SandboxUsage *ret);

/* The record state_dir/sandboxes/<id>.json (for the next start's cleanup). */
int sandbox_record_format(const struct sandbox_params *p, char **ret);
/* The guest_addr of a sandbox: "<inside_addr>:<AGENT_TCP_PORT>" for a
 * snapshot made with agent_tcp, else "agent:<id>". */
int sandbox_guest_addr(const char *id, const char *inside_addr, bool agent_tcp, char **ret);

/* Remove a namespace forkd made (netns_child_destroy(), in a worker unless
 * the daemon stops) and release its index. */
void sandbox_netns_destroy(Manager *m, const char *name, unsigned index);

/* At start: remove what the records of a previous daemon name. */
int sandbox_cleanup_records(Manager *m);
