/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Branching a running sandbox into a new snapshot (BranchSandbox).
 *
 *   pausing  the request went to the sandbox's VMM on its control socket
 *            (forkd-vmm "branch", with the write end of a result socket); the
 *            VMM pauses the vCPU, saves its state, freezes the disk overlay,
 *            fork(2)s and answers with the measured pause; the sandbox runs on
 *   writing  the frozen copy writes snapshots/<tag> atomically and reports on
 *            the result socket; mode "live" with wait false has been answered
 *            (status "writing", listed by ListSnapshots, forks refused with
 *            NotReady) and the others wait for this
 *   done     registered like any snapshot (independent of the sandbox from
 *            now on), or failed
 *
 * At most manager->max_branches run at once (Busy beyond); a tag in flight
 * is taken (SnapshotExists).
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <systemd/sd-bus.h>

#include "manager.h"

struct json_object;

/* A request on a sandbox's control socket waiting for its reply. reply() runs
 * once: with the reply, or with NULL and why when the sandbox or its VMM
 * went away first. */
struct ControlWaiter {
        void (*reply)(ControlWaiter *w, struct json_object *o, const char *why);
        ControlWaiter *next;
};

/* Send request (JSON text), with fd (SCM_RIGHTS) if fd >= 0, to the
 * sandbox's VMM; w waits for the answer, in order. */
int sandbox_control_send(Sandbox *s, const char *request, int fd, ControlWaiter *w);

/* The VMM's reply to "branch" and to "fork": {"ok":true,"pause_us":N,"pid":P} gives 0 with
 * *ret_pause_us and *ret_pid (the frozen copy); {"ok":false,...} gives -EPERM with *ret_reason
 * (its "error", or "no reason given"); anything else gives -EBADMSG. */
int control_pause_reply_parse(struct json_object *o, uint64_t *ret_pause_us, pid_t *ret_pid,
                              const char **ret_reason);

/* An internal branch's end (a pause): r 0 with the registered, unannounced
 * snapshot i, else r < 0 and why. Runs once; the BranchOp is gone by then. */
typedef void (*branch_done_t)(Manager *m, int r, Image *i, uint64_t pause_us, const char *why, void *userdata);

struct BranchOp {
        ControlWaiter waiter;      /* first: the source's FIFO of requests awaiting a control reply */
        Manager *manager;
        sd_bus_message *message;   /* the call, until answered */
        Sandbox *sandbox;          /* while pausing: the source */
        char *source_id, *tag, *dir;
        char *parent_tag, *parent_dir; /* mode diff: the source's snapshot */
        char mode[8];
        bool wait;
        uid_t owner_uid;           /* the caller: it owns the new snapshot (0 for one adopted after a restart) */
        bool source_has_cgroup;    /* the frozen copy leaves the source's cgroup */
        bool source_agent_tcp;     /* its guest answers on AGENT_TCP_PORT: so does the branch's */
        char *image_config;        /* its snapshot's "image" (snapshot.json), NULL: none */
        int result_fd;
        /* The directory in snapshots/ the writer writes into (confine_staging_dir()),
         * until forkd renamed it into place; -EBADF/NULL: none (yet) */
        int staging_fd;
        char *staging_name;
        sd_event_source *result_source;
        pid_t copy_pid;
        uint64_t pause_us, started_at;
        enum { BRANCH_PAUSING, BRANCH_WRITING, BRANCH_FAILED } state;
        char *error;               /* failed: why */
        branch_done_t done;        /* set: no message; done() instead of the reply */
        void *userdata;
};

/* Branch s into tag (mode "full", "diff" or "live"; wait false only with
 * live), owned by owner: checks what BranchSandbox checks after its
 * operation_prelude() (SnapshotExists, Busy, ...) into error. message (may be NULL
 * with done) is answered with the snapshot's info once it is registered;
 * with done, done() is called instead and message is left alone. 0 when the
 * request is on its way. */
int branch_start(Sandbox *s, const char *tag, const char *mode, bool wait, uid_t owner, sd_bus_message *message,
                 branch_done_t done, void *userdata, sd_bus_error *error);


/* The owner of the failed branch of tag (see branch_failed()). */
uid_t branch_failed_owner(Manager *m, const char *tag);

/* The sandbox goes away: requests still waiting for its VMM fail. */
void branch_sandbox_gone(Sandbox *s);

/* A branch of tag is being written. */
bool branch_in_flight(Manager *m, const char *tag);

/* A live branch answered "writing" failed afterwards: it is listed with
 * status "failed" (at most BRANCH_FAILED_MAX of them, until forkd restarts)
 * until DeleteSnapshot of its tag or a new branch to it. */
#define BRANCH_FAILED_MAX 64u
bool branch_failed(Manager *m, const char *tag);
void branch_forget_failed(Manager *m, const char *tag);

/* ListSnapshots: an entry (status "writing") for every branch in flight, and
 * one (status "failed", with error) for every failed one still listed. */
int branch_append_in_flight(sd_bus_message *reply, Manager *m);

/* At start: name is "<tag>.tmp.<pid>" in the snapshots directory. If pid is
 * the frozen copy of a branch (of a predecessor killed meanwhile) still
 * writing it, adopt it: the branch is listed as writing and registered once
 * the copy is done. Returns 1 if adopted, 0 if not (remove the directory). */
int branch_adopt_staging(Manager *m, const char *name);

/* Watch the snapshots directory: a complete snapshot directory renamed into
 * place that nobody here is creating or branching to (the writer of a branch
 * a killed predecessor started, which finished before it had staged its
 * directory or after the scan) is registered then. */
int branch_watch_snapshots(Manager *m);

/* Shutdown: forget every branch (their frozen copies finish on their own). */
void branch_free_all(Manager *m);
