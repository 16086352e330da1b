/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Pausing, resuming and forking paused sandboxes: see pause-op.h. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "volumes.h"
#include "branch.h"
#include "cgroup.h"
#include "chain.h"
#include "fork-op.h"
#include "fork-options-bus.h"
#include "hashmap.h"
#include "image.h"
#include "macro.h"
#include "operation.h"
#include "pause-op.h"
#include "bus-info.h"
#include "paused.h"
#include "sandbox.h"
#include "snapshot-meta.h"
#include "time-util.h"
#include "vm-template.h"

/* sd_bus_reply_method_errorf() for a call that may be none (a deadline's pause). */
static int reply_error(sd_bus_message *call, const char *name, const char *fmt, ...) _printf_(3, 4);
static int reply_error(sd_bus_message *call, const char *name, const char *fmt, ...) {
        _cleanup_free_ char *msg = NULL;
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(&msg, fmt, ap) < 0)
                msg = NULL;
        va_end(ap);
        if (!call) {
                log_warning("%s", msg ?: name);
                return 0;
        }
        return sd_bus_reply_method_errorf(call, name, "%s", msg ?: "Out of memory");
}

typedef struct PauseOp {
        Manager *manager;
        sd_bus_message *message;
        char *id, *vm_id, *origin_tag;
} PauseOp;

static void pause_op_free(PauseOp *op) {
        sd_bus_message_unref(op->message);
        free(op->id);
        free(op->vm_id);
        free(op->origin_tag);
        free(op);
}

/* How many templates of paused sandboxes may wait, warm and idle. */
#define PAUSED_WARM_MAX 8

/* The paused sandbox's VM, kept until its snapshot's template is ready (see
 * paused_warm()), goes now; the caller hears once it is gone. */
static void pause_kill_vm(Manager *m, void *userdata) {
        char *vm_id = userdata;
        Sandbox *s = hashmap_get(m->vms, vm_id);

        if (s && s->retired && !s->killed) {
                int r = sandbox_kill(s);
                if (r < 0)
                        log_warning_errno(r, "Failed to kill the VM of the paused sandbox %s: %m", s->id);
        }
        free(vm_id);
}

/* Start the template of a new paused snapshot before its VM goes and the pause
 * answers, so that the sandbox's resume and its first fork, which may come the
 * moment the pause answers, find it running. Started beside the VM's teardown
 * instead, it took 15-22 ms rather than 6 on two cores and a fork sent right
 * after the reply waited for it (bench/lifecycle's first batch 1.6x, not 1.0x);
 * this way the reply waits for the start, which costs a pause less than the
 * teardown's competition did. One waiting template costs about 1 MiB (PSS,
 * mostly shared pages): beyond PAUSED_WARM_MAX, the templates of older pauses
 * that serve nothing stop, and their next fork starts them again. Then kills
 * the VM of sandbox s (at once when no start was needed or it could not begin). */
static void paused_warm(Manager *m, Image *i, Sandbox *s) {
        unsigned n = 1;
        char *vm_id;
        int r;

        /* Newest first: m->templates is in the order they were made. */
        for (VmTemplate *t = m->templates, *next; t; t = next) {
                next = t->next;
                if (t->image == i || !t->image || !snapshot_tag_is_forkds(t->tag) || t->vt.pid <= 0 ||
                    t->busy || t->waiters || t->n_sandboxes > 0)
                        continue;
                if (++n > PAUSED_WARM_MAX)
                        vm_template_stop_idle(t);
        }
        vm_id = strdup(s->vm_id);
        r = vm_id ? vm_template_warm_then(m, i, pause_kill_vm, vm_id) : -ENOMEM;
        if (r > 0)
                return;
        if (r < 0)
                log_warning_errno(r, "Could not start the template of %s ahead of its resume: %m", i->tag);
        if (vm_id)
                pause_kill_vm(m, vm_id); /* frees it */
        else if (sandbox_kill(s) < 0)
                log_warning("Failed to kill the VM of the paused sandbox %s.", s->id);
}

static void pause_branch_done(Manager *m, int r, Image *i, uint64_t pause_us, const char *why, void *userdata) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        PauseOp *op = userdata;
        Sandbox *s = hashmap_get(m->sandboxes, op->id);
        Paused *p = NULL;

        if (s && strcmp(s->vm_id, op->vm_id) != 0)
                s = NULL; /* another VM took the id meanwhile */
        if (s)
                s->pausing = false;
        if (r < 0) {
                (void) reply_error(op->message, FORKD_ERROR_FAILED, "Failed to pause sandbox %s: %s",
                                                  op->id, why ?: strerror(-r));
                goto finish;
        }
        if (!s || s->killed || s->state != SANDBOX_RUNNING) {
                (void) image_delete(i);
                (void) reply_error(op->message, FORKD_ERROR_NO_SUCH_SANDBOX,
                                                  "Sandbox %s ended during its pause.", op->id);
                goto finish;
        }

        p = calloc(1, sizeof(*p));
        if (p) {
                *p = (Paused) {
                        .manager = m, .id = strdup(s->id), .tag = strdup(i->tag), .origin_tag = strdup(op->origin_tag),
                        .owner_uid = s->owner_uid, .created_at = s->created_at, .paused_at = (uint64_t) time(NULL),
                        .memory_limit_mib = s->memory_limit_mib, .net_policy = s->netns_owned ? s->net_policy : -1,
                        .limits = s->limits,
                };
                p->pause_us = pause_us;
                /* Its deadline goes with it, unless this pause is what it asked for. */
                if (s->expires_at > 0 && !(s->timeout_pause && s->expires_at <= now_realtime_usec())) {
                        p->expires_at = s->expires_at;
                        p->timeout_pause = s->timeout_pause;
                }
                r = p->id && p->tag && p->origin_tag ? 0 : -ENOMEM;
        } else
                r = -ENOMEM;
        if (r >= 0)
                r = paused_record_write(p);
        if (r >= 0)
                r = hashmap_put(m->paused, p->id, p);
        if (r >= 0)
                r = paused_arm(p);
        if (r >= 0 && op->message)
                r = bus_sandbox_info_reply(op->message, p, NULL, &reply);
        if (r < 0) {
                if (p)
                        (void) paused_record_remove(m, p->id, true);
                paused_free(p);
                (void) image_delete(i);
                (void) reply_error(op->message, FORKD_ERROR_FAILED,
                                                  "Failed to record the pause of sandbox %s: %s", op->id,
                                                  strerror(-r));
                goto finish;
        }

        /* Paused from now on, after any crash too: the VM goes, silently (the id lives on),
         * and the caller hears once it is gone. */
        hashmap_remove(m->sandboxes, s->id);
        s->retired = true;
        s->retire_reply = TAKE_PTR(reply);
        log_info("Sandbox %s paused into forkd's snapshot %s (guest paused %llu us).", p->id, p->tag,
                 (unsigned long long) pause_us);
        paused_warm(m, i, s);
finish:
        pause_op_free(op);
}

int paused_pause(Sandbox *s, sd_bus_message *message, sd_bus_error *error) {
        _cleanup_(sd_bus_error_free) sd_bus_error local = SD_BUS_ERROR_NULL;
        Manager *m = s->manager;
        char tag[SNAPSHOT_TAG_MAX + 1];
        const char *mode;
        PauseOp *op;
        int r;

        if (!error)
                error = &local;
        if (s->pausing)
                return bus_sandbox_error_pausing(s->id, error);
        if (s->state != SANDBOX_RUNNING)
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "Sandbox %s is %s.", s->id,
                                         sandbox_state_to_string(s->state));
        for (unsigned k = 0;; k++) {
                char dir[4096];

                if (k == 0)
                        snprintf(tag, sizeof(tag), PAUSED_TAG_PREFIX "%s.%lld", s->id, (long long) time(NULL));
                else
                        snprintf(tag, sizeof(tag), PAUSED_TAG_PREFIX "%s.%lld-%u", s->id, (long long) time(NULL), k);
                snprintf(dir, sizeof(dir), "%s/%s", m->snapshots_dir, tag);
                if (!hashmap_get(m->images, tag) && !branch_in_flight(m, tag) && access(dir, F_OK) < 0)
                        break;
                if (k >= 16)
                        return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "No free snapshot tag for the pause of %s.",
                                                 s->id);
        }
        if (!snapshot_tag_is_valid(tag))
                return sd_bus_error_setf(error, FORKD_ERROR_FAILED, "Cannot make a snapshot tag from %s.", s->id);
        /* Only what differs from the snapshot it came from, when that is its memory's base. */
        mode = !s->live_fork && hashmap_get(m->images, s->snapshot_tag) ? "diff" : "full";

        op = calloc(1, sizeof(*op));
        if (!op)
                return -ENOMEM;
        op->manager = m;
        op->id = strdup(s->id);
        op->vm_id = strdup(s->vm_id);
        op->origin_tag = strdup(s->origin_tag ?: s->snapshot_tag);
        if (!op->id || !op->vm_id || !op->origin_tag) {
                pause_op_free(op);
                return -ENOMEM;
        }
        r = branch_start(s, tag, mode, true, s->owner_uid, NULL, pause_branch_done, op, error);
        if (r < 0) {
                pause_op_free(op);
                return r;
        }
        op->message = sd_bus_message_ref(message);
        s->pausing = true;
        log_info("Pausing sandbox %s (a %s branch to %s).", s->id, mode, tag);
        return 0;
}

/* -- resume and fork -- */

typedef struct PausedFork {
        char *id;         /* the paused sandbox */
        char *origin_tag;
        bool resume;
} PausedFork;

static void paused_fork_release(void *userdata) {
        PausedFork *pf = userdata;

        free(pf->id);
        free(pf->origin_tag);
        free(pf);
}

static void paused_fork_done(ForkOp *f, int r, const char *error_name, const char *error_message, void *userdata) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Operation *o = userdata;
        PausedFork *pf = o->extra;
        Manager *m = o->manager;
        Paused *p = hashmap_get(m->paused, pf->id);

        if (pf->resume && p)
                p->resuming = false;
        if (r < 0 && pf->resume && p)
                (void) paused_arm(p); /* a deadline that came during the resume counts again */
        if (r < 0) {
                (void) sd_bus_reply_method_errorf(o->message, error_name ?: FORKD_ERROR_FAILED, "%s",
                                                  error_message ?: strerror(-r));
                goto finish;
        }
        /* Shown as what they came from, not as forkd's snapshot. */
        for (unsigned k = 0; k < f->n; k++) {
                Sandbox *s = hashmap_get(m->sandboxes, f->ids[k]);

                if (s && !s->origin_tag)
                        s->origin_tag = strdup(pf->origin_tag);
        }
        if (pf->resume) {
                Sandbox *s = hashmap_get(m->sandboxes, pf->id);

                if (s && p && p->expires_at > 0)
                        (void) sandbox_set_deadline(s, p->expires_at, p->timeout_pause);
                /* Running again: the record goes (a crash before this finds it paused). */
                r = paused_record_remove(m, pf->id, false);
                if (r < 0)
                        log_warning_errno(r, "Failed to remove the pause record of %s: %m", pf->id);
                paused_free(p);
                log_info("Sandbox %s resumed.", pf->id);
                r = bus_sandbox_info_reply(o->message, NULL, hashmap_get(m->sandboxes, pf->id), &reply);
        } else {
                r = sd_bus_message_new_method_return(o->message, &reply);
                if (r >= 0)
                        r = sandbox_append_infos(reply, m, f->ids, f->n);
                if (r >= 0)
                        r = sd_bus_message_append(reply, "t", (uint64_t) 0);
        }
        if (r >= 0)
                r = sd_bus_send(NULL, reply, NULL);
        if (r < 0)
                (void) sd_bus_reply_method_errno(o->message, r, NULL);
finish:
        operation_free(o);
}

int paused_fork_start(sd_bus_message *message, Paused *p, unsigned n, const struct fork_options *topts,
                             sd_bus_error *error) {
        struct fork_options opts = { .memory_limit_mib = p->memory_limit_mib, .limits = p->limits };
        bool resume = !topts;
        Manager *m = p->manager;
        const char *why = NULL;
        Operation *o = NULL;
        PausedFork *pf;
        Image *i;
        int r;

        if (p->resuming)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "Sandbox %s is being resumed.", p->id);
        if (resume && hashmap_get(m->vms, p->id))
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY,
                                         "The VM of sandbox %s is still stopping; retry in a moment.", p->id);
        i = hashmap_get(m->images, p->tag);
        if (!i)
                return sd_bus_error_setf(error, FORKD_ERROR_FAILED, "The state of paused sandbox %s is missing.",
                                         p->id);
        r = chain_check_restorable(m, i, error);
        if (r < 0)
                return r;
        if (p->net_policy >= 0) {
                opts.net_policy = (NetnsPolicy) p->net_policy;
                opts.net_policy_given = true;
        }
        r = fork_options_resolve_network(&opts, i->meta.network, i->meta.agent_tcp, &why);
        if (r < 0)
                return sd_bus_error_setf(error, FORKD_ERROR_FAILED, "Cannot fork paused sandbox %s: %s.", p->id, why);
        /* its rw volumes, held again (or another sandbox holds them meanwhile) */
        r = volumes_check_fork(m, i, n, error);
        if (r < 0)
                return r;
        if (opts.memory_limit_mib > 0 && !cgroup_manager_supported(m->cgroups))
                return sd_bus_error_setf(error, FORKD_ERROR_NOT_SUPPORTED,
                                         "Memory limits are not available on this host, and sandbox %s has one.",
                                         p->id);
        /* A fork keeps the paused sandbox's limits, but for those it names. */
        if (topts)
                sandbox_limits_override(&opts.limits, &topts->limits);
        r = bus_check_limits(m, opts.memory_limit_mib, &opts.limits, i->meta.vcpus, error);
        if (r < 0)
                return r;
        r = operation_begin(m, message, NULL, &o, error);
        if (r < 0)
                return r;
        pf = calloc(1, sizeof(*pf));
        if (pf) {
                pf->id = strdup(p->id);
                pf->origin_tag = strdup(p->origin_tag);
                pf->resume = resume;
                o->extra = pf;
                o->free_extra = paused_fork_release;
        }
        if (!pf || !pf->id || !pf->origin_tag) {
                operation_free(o);
                return -ENOMEM;
        }
        if (resume) {
                opts.owner_uid = p->owner_uid;
                opts.id = pf->id;
                opts.created_at = p->created_at;
        } else {
                opts.owner_uid = o->owner_uid;
                opts.timeout_secs = topts->timeout_secs;
                opts.timeout_pause = topts->timeout_pause;
        }
        r = fork_op_start(m, i, n, &opts, paused_fork_done, o, &o->fork);
        if (r < 0) {
                operation_free(o);
                if (r == -EUSERS)
                        return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "At most %u sandboxes may exist at once.",
                                                 SANDBOXES_MAX);
                return sd_bus_error_set_errnof(error, r, "Failed to start the fork: %m");
        }
        if (resume)
                p->resuming = true;
        log_info("%s paused sandbox %s%s.", resume ? "Resuming" : "Forking", p->id,
                 resume ? "" : (n == 1 ? " into 1" : " into several"));
        return 1;
}

