/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Forking n sandboxes of a snapshot, as a state machine driven by the event loop:
 *
 *   cgroups    prepare one cgroup per child (may wait for systemd)
 *   waiting    for the template, if another fork of the snapshot uses it
 *   spawning   worker: write the records, start the template if needed, spawn
 *   pinging    every child's agent must answer ping
 *   done       done() is called once, with the result
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "manager.h"
#include "netns.h"
#include "sandbox.h"

struct fork_options {
        bool per_child_netns;
        /* The snapshot has a NIC: every child gets a namespace of its own,
         * made by forkd with this policy, and its tap (netns.c). */
        bool net;
        NetnsPolicy net_policy;
        bool net_policy_given;     /* the caller named one (refused for a snapshot without NIC) */
        bool agent_tcp;            /* guest_addr: inside address and AGENT_TCP_PORT */
        uint32_t memory_limit_mib; /* 0: none */
        struct sandbox_limits limits; /* cpu_limit, disk_rate, net_rate */
        bool live_fork;
        uid_t owner_uid;           /* the caller: owner of every child */
        const char *id;            /* n 1: this id, not a new one (a resume); borrowed until done() */
        uint64_t created_at;       /* with id: the sandbox's first creation (unix s); 0: now */
        uint32_t timeout_secs;     /* 0: no deadline; else each child's, from its fork's answer */
        bool timeout_pause;        /* on_timeout "pause" (default "kill") */
        bool on_timeout_given;
};

/* The network part of a fork of a snapshot with (has_nic) or without a NIC:
 * fills o->net and o->agent_tcp, or returns -EINVAL with *ret_why saying what
 * to change (a policy for a snapshot without NIC; per_child_netns with one). */
int fork_options_resolve_network(struct fork_options *o, bool has_nic, bool agent_tcp, const char **ret_why);

/* r >= 0: every child answered; the sandboxes are f->ids[0..n) in the
 * manager, running and announced. r < 0: error_name/error_message say why. */
typedef void (*fork_done_t)(ForkOp *f, int r, const char *error_name, const char *error_message, void *userdata);

/* The stages of a fork, in order; each timestamp marks the end of its stage. */
enum {
        FORK_T_START,      /* the request was taken (D-Bus parsed, polkit answered) */
        FORK_T_QUEUED,     /* cgroups ready, template free: the worker gets it */
        FORK_T_RECORDS,    /* worker: sandbox records written, directory synced */
        FORK_T_TEMPLATE,   /* worker: template started (when it was not running) */
        FORK_T_SPAWNED,    /* worker: the template forked every child */
        FORK_T_REGISTERED, /* main loop: sandboxes registered, pings sent */
        FORK_T_ANSWERED,   /* every agent answered ping */
        FORK_T_ANNOUNCED,  /* sandboxes running, their signals queued */
        FORK_T_REPLIED,    /* done() returned: the caller's reply is sent */
        FORK_T_MAX,
};

struct ping_slot {
        ForkOp *op;
        unsigned index;
};

struct ForkOp {
        Manager *manager;
        Image *image;
        VmTemplate *template;
        unsigned n;
        struct fork_options opts;
        uint64_t created_at;
        char **ids;
        char **cgroup_parents;     /* per child; NULL: none */
        char **netns;              /* per child (per_child_netns, net); NULL: none */
        /* opts.net: per child, what netns_child_create() made (tap_fd -1 once
         * sent), whether it made it, and the index it reserved. */
        NetnsChild *net;
        bool *net_made;
        unsigned *net_index;
        unsigned n_net_picked;     /* indices reserved: net_index[0..n) */
        NetnsPrefix net_prefix;
        bool *has_cgroup;
        unsigned n_cgroups_pending;
        /* Per child, its id of --vmm-uid-range, held until its sandbox takes it
         * (0 then); NULL: none (shared, unconfined, or the children of a
         * frozen copy, which run under its id). Each gets a user namespace owned
         * by userns_owner, the template's uid (vmm-userns.h): one the pool made
         * ahead of time (userns-pool.h), or one the worker makes. */
        uid_t *vmm_uids;
        uid_t userns_owner;
        gid_t userns_group;
        int *userns_fds;         /* with vmm_uids: each child's namespace, from the pool or made in the spawn */
        int cgroup_error;
        bool reserved;             /* n counted in manager->n_sandboxes_reserved */

        /* handed to the worker */
        bool need_start;
        bool spawn_failed;
        bool records_written;
        char *vmm_path, *overlay_dir, *sandboxes_dir;
        int *agent_fds;
        int *control_fds;
        /* per child: its stats page (usage.h), the memfd until spawned and
         * forkd's mapping until its sandbox takes it */
        int *stats_fds;
        const struct vmm_stats **stats;
        pid_t *pids;
        char **events;
        unsigned n_events;
        char *error;

        struct ping_slot *slots;
        /* Pings sent from the worker as each spawn batch left (sandbox_early_call()),
         * until sandbox_new_early() takes them; pinged[i]: child i's ping is out. */
        SandboxEarly **early;
        bool *pinged;
        unsigned n_answered, n_failed;
        char *ping_error;

        /* When each stage ended (now_usec(), 0: not reached), for the breakdown
         * that forkd logs once a fork is answered (fork_log_stages()). */
        uint64_t t[FORK_T_MAX];

        enum { FORK_CGROUPS, FORK_WAITING, FORK_SPAWNING, FORK_PINGING, FORK_DONE } state;
        ForkOp *next_waiter;
        fork_done_t done;
        void *userdata;
};

/* Validates nothing the caller must check (n, limits, netns); returns
 * -EUSERS when the sandbox limit would be exceeded, -EOPNOTSUPP when memory
 * limits are unavailable. On success done() follows later, never from here. */
int fork_op_start(Manager *m, Image *i, unsigned n, const struct fork_options *o, fork_done_t done, void *userdata,
                  ForkOp **ret);
/* The same from a template that runs already (vm_template_new_running()),
 * not from a snapshot. */
int fork_op_start_template(Manager *m, VmTemplate *t, unsigned n, const struct fork_options *o, fork_done_t done,
                           void *userdata, ForkOp **ret);
/* Cancel (shutdown) or release after done(). Accepts NULL, returns NULL. */
ForkOp *fork_op_free(ForkOp *f);

/* A child of f ended before it answered (sandbox_exited() of a starting
 * sandbox, before it is freed): remember why, for the fork's error. Returns
 * true when its ping already ended with its agent channel and the fork waits
 * for this exit: then call fork_op_child_gone() once the sandbox is freed. */
bool fork_op_child_exited(ForkOp *f, Sandbox *s, int code, int sig);
void fork_op_child_gone(ForkOp *f);

/* On the fork's worker (fork-netns.c): the network namespace of every child
 * (opts.net), the pool's first. On failure f->error says why and what was
 * made stays in f->net (net_made[]) for the fork's cleanup. */
int fork_op_make_namespaces(ForkOp *f);

/* The template became free: run the next waiting fork. */
void fork_op_run_next(VmTemplate *t);

