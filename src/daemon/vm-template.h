/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The per-snapshot template process (forkd-vmm template): started by the
 * first fork of a snapshot, reused by the next ones, stopped when its
 * snapshot is deleted and its last sandbox is gone.
 *
 * Its control socket belongs to the event loop (exit events of children),
 * except while a worker spawns children through it ("busy"): then the loop
 * leaves it alone and the worker hands over the events it met. Forks of the
 * same snapshot take turns.
 */

#include <stdbool.h>

#include "manager.h"
#include "vmm-client.h"

struct VmTemplate {
        Manager *manager;
        Image *image;            /* NULL once the snapshot was deleted */
        char *tag;
        char *snapshot_dir;
        char **jail_links;       /* what the confined template reaches: its chain (confine_jail_links()) */

        struct vmm_template vt;  /* vt.pid == 0: no process */
        pid_t cgroup_pid;        /* its cgroup is tpl-<this> (cgroup_template_join()); 0: none */
        /* The frozen copy of a running sandbox: the id of --vmm-uid-range that
         * sandbox's VMM, and so this copy and its children, run under, held
         * till the copy goes; 0: none (a snapshot's template runs as
         * --vmm-user and gives each child an id of its own). */
        uid_t vmm_uid;
        bool cgroup_tried;       /* cgroup_template_join() was called for this process, once */
        int pidfd;
        sd_event_source *io_source, *pid_source;
        bool busy;

        ForkOp *waiters;         /* forks waiting for their turn, FIFO */
        Sandbox *sandboxes;
        unsigned n_sandboxes;

        VmTemplate *next, *prev;
};

/* The template of image i, created (not started) if needed. */
int vm_template_get(Image *i, VmTemplate **ret);
/* A template that runs already, of no snapshot: the frozen copy of a running
 * sandbox (ForkSandbox), pid (not our child), its control socket control_fd
 * (taken). Its children's snapshot_tag is tag. It goes once its last
 * sandbox is gone (vm_template_maybe_gc()). */
int vm_template_new_running(Manager *m, const char *tag, pid_t pid, int control_fd, uint64_t generation,
                            VmTemplate **ret);
/* Free without waiting (shutdown). */
VmTemplate *vm_template_free(VmTemplate *t);
void vm_template_detach_image(VmTemplate *t);

/* A worker is about to use t->vt / has finished with it. */
void vm_template_begin_work(VmTemplate *t);
void vm_template_end_work(VmTemplate *t);

/* From a worker (between begin and end work): starts forkd-vmm template for
 * t's snapshot and waits for it to be ready; on failure t is left not running
 * and *ret_error says why (forkd-vmm's words when it gave them). */
int vm_template_start(VmTemplate *t, const char *vmm_path, const char *overlay_dir, char **ret_error);
/* From the worker, before the template forks anything: its own cgroup (or scope).
 * Tried once per template process: without one (no memory limits, or a failure,
 * which is no reason to refuse the fork) it stays where it is. */
void vm_template_join_cgroup(VmTemplate *t);

/* A template event (JSON text) from the socket or collected by a worker. */
void vm_template_handle_event(VmTemplate *t, const char *json);

/* Close the control socket: the template kills its children and exits. */
void vm_template_stop(VmTemplate *t);

/* Stop a running template that serves no sandbox and no fork, now: the next
 * fork of its snapshot starts it again. */
void vm_template_stop_idle(VmTemplate *t);

/* Stop and free if the snapshot is gone and nothing uses the template. */
void vm_template_maybe_gc(VmTemplate *t);

/* Starts the template of i on a worker, ahead of its first fork, so that the
 * first fork costs what the next ones do; a fork that comes meanwhile waits
 * for it as for another fork. Nothing if it runs already. A template that does
 * not start is logged and tried again by the first fork. */
int vm_template_warm(Manager *m, Image *i);
/* The same, and then(m, userdata) once the start ended, well or not: returns 1.
 * 0 when nothing was started (running or busy already), then() not called;
 * < 0 on failure, then() not called. */
int vm_template_warm_then(Manager *m, Image *i, void (*then)(Manager *m, void *userdata), void *userdata);

void vm_template_add_sandbox(VmTemplate *t, Sandbox *s);
void vm_template_remove_sandbox(VmTemplate *t, Sandbox *s);
