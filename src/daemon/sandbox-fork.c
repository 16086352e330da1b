/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Forking a running sandbox: see sandbox-fork.h. */
#include <sys/socket.h>

#include <json-c/json.h>

#include "branch.h"
#include "cgroup.h"
#include "fork-op.h"
#include "macro.h"
#include "operation.h"
#include "bus-info.h"
#include "sandbox-fork.h"
#include "volumes.h"
#include "fork-options-bus.h"
#include "image.h"
#include "sandbox.h"
#include "vm-template.h"

typedef struct SandboxFork {
        ControlWaiter waiter; /* first */
        Manager *manager;
        Operation *operation; /* holds the call and counts against --max-operations */
        char *source_id, *tag;
        unsigned n;
        uint32_t memory_limit_mib;
        struct sandbox_limits limits;
        uint32_t timeout_secs;
        bool timeout_pause;
        bool source_has_cgroup;
        /* The source has a NIC (a namespace forkd made): so has every copy,
         * each in a namespace of its own with policy none. */
        bool net, agent_tcp;
        int tpl_fd;
        pid_t pid;
        uint64_t pause_us;
        uid_t vmm_uid;        /* the source's id of --vmm-uid-range, held for the frozen copy; 0: none */
} SandboxFork;

/* Freed with its operation (operation_free()). */
static void sandbox_fork_release(void *p) {
        SandboxFork *f = p;

        safe_close(f->tpl_fd); /* a template we never adopted ends with its children */
        uid_range_free(&f->manager->vmm_uids, f->vmm_uid);
        free(f->source_id);
        free(f->tag);
        free(f);
}

/* Done: free the operation, its fork and f. */
static void sandbox_fork_free(SandboxFork *f) {
        operation_free(f->operation);
}

static void sandbox_fork_fail(SandboxFork *f, const char *name, const char *fmt, ...) _printf_(3, 4);
static void sandbox_fork_fail(SandboxFork *f, const char *name, const char *fmt, ...) {
        _cleanup_free_ char *msg = NULL;
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(&msg, fmt, ap) < 0)
                msg = NULL;
        va_end(ap);
        log_warning("Fork of the running sandbox %s failed: %s", f->source_id, msg ?: "out of memory");
        (void) sd_bus_reply_method_errorf(f->operation->message, name ?: FORKD_ERROR_FAILED, "%s",
                                          msg ?: "Out of memory");
        sandbox_fork_free(f);
}

static void on_fork_done(ForkOp *op, int r, const char *error_name, const char *error_message, void *userdata) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        SandboxFork *f = userdata;
        Manager *m = f->manager;

        if (r < 0) {
                if (op->template) {
                        /* Nobody else stops it: it never got a child. */
                        VmTemplate *t = op->template;
                        op->template = NULL;
                        vm_template_maybe_gc(t);
                }
                (void) sd_bus_reply_method_errorf(f->operation->message, error_name ?: FORKD_ERROR_FAILED, "%s",
                                                  error_message ?: strerror(-r));
                sandbox_fork_free(f);
                return;
        }
        r = sd_bus_message_new_method_return(f->operation->message, &reply);
        if (r >= 0)
                r = sandbox_append_infos(reply, m, op->ids, op->n);
        if (r >= 0)
                r = sd_bus_message_append(reply, "t", f->pause_us);
        if (r >= 0)
                r = sd_bus_send(NULL, reply, NULL);
        if (r < 0)
                (void) sd_bus_reply_method_errno(f->operation->message, r, NULL);
        log_info("Forked the running sandbox %s into %u (paused %llu us).", f->source_id, op->n,
                 (unsigned long long) f->pause_us);
        sandbox_fork_free(f);
}

/* The frozen copy is a template from now on (its "ready" event, read by the
 * spawn like any other event, is not waited for: a copy that fails to become
 * one closes the socket, and the spawn says so). */
static void start_fork(SandboxFork *f) {
        struct fork_options opts = { .memory_limit_mib = f->memory_limit_mib, .limits = f->limits,
                                     .owner_uid = f->operation->owner_uid,
                                     .net = f->net, .net_policy = NETNS_POLICY_NONE, .agent_tcp = f->agent_tcp,
                                     .timeout_secs = f->timeout_secs, .timeout_pause = f->timeout_pause };
        Manager *m = f->manager;
        VmTemplate *t = NULL;
        int r;

        r = vm_template_new_running(m, f->tag, f->pid, f->tpl_fd, 0, &t);
        if (r < 0) {
                sandbox_fork_fail(f, NULL, "Failed to set up the template: %s", strerror(-r));
                return;
        }
        f->tpl_fd = -EBADF; /* the template's now */
        t->vmm_uid = f->vmm_uid; /* and so is the id */
        f->vmm_uid = 0;
        r = fork_op_start_template(m, t, f->n, &opts, on_fork_done, f, &f->operation->fork);
        if (r < 0) {
                if (r == -EUSERS)
                        sandbox_fork_fail(f, FORKD_ERROR_BUSY, "At most %u sandboxes may exist at once.",
                                          SANDBOXES_MAX);
                else
                        sandbox_fork_fail(f, NULL, "Failed to start the fork: %s", strerror(-r));
        }
}

static void on_control_reply(ControlWaiter *w, struct json_object *o, const char *why) {
        SandboxFork *f = (SandboxFork *) w;
        const char *reason;
        int r;

        if (!o) {
                sandbox_fork_fail(f, NULL, "%s", why);
                return;
        }
        r = control_pause_reply_parse(o, &f->pause_us, &f->pid, &reason);
        if (r == -EPERM) {
                sandbox_fork_fail(f, NULL, "The VMM of %s refused the fork: %s", f->source_id, reason);
                return;
        }
        if (r < 0) {
                sandbox_fork_fail(f, NULL, "Malformed control reply from the VMM of %s.", f->source_id);
                return;
        }
        /* The template outlives its parent: out of the parent's cgroup with it. */
        if (f->source_has_cgroup)
                (void) cgroup_detach(f->manager->cgroups, f->pid);
        start_fork(f);
}

int sandbox_fork_start(Sandbox *s, sd_bus_message *message, unsigned n, const struct fork_options *topts,
                       sd_bus_error *error) {
        Manager *m = s->manager;
        SandboxFork *f;
        Operation *o = NULL;
        int r, sv[2];

        if (s->control_fd < 0)
                return sd_bus_error_setf(error, FORKD_ERROR_FAILED, "Sandbox %s has no control channel.", s->id);
        r = volumes_check_running_fork(m, s, error);
        if (r < 0)
                return r;
        if (hashmap_size(m->sandboxes) + m->n_sandboxes_reserved + n > SANDBOXES_MAX)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "At most %u sandboxes may exist at once.",
                                         SANDBOXES_MAX);
        {
                struct sandbox_limits l = s->limits;
                Image *i = hashmap_get(m->images, s->snapshot_tag);

                sandbox_limits_override(&l, &topts->limits);
                r = bus_check_limits(m, s->memory_limit_mib, &l, i ? i->meta.vcpus : 1, error);
                if (r < 0)
                        return r;
        }
        r = operation_begin(m, message, NULL, &o, error);
        if (r < 0)
                return r;

        f = calloc(1, sizeof(*f));
        if (!f) {
                operation_free(o);
                return -ENOMEM;
        }
        f->manager = m;
        f->operation = o;
        o->extra = f;
        o->free_extra = sandbox_fork_release;
        f->n = n;
        f->tpl_fd = -EBADF;
        f->memory_limit_mib = s->memory_limit_mib;
        /* The copies keep the source's limits, but for those the call names. */
        f->limits = s->limits;
        sandbox_limits_override(&f->limits, &topts->limits);
        f->timeout_secs = topts->timeout_secs;
        f->timeout_pause = topts->timeout_pause;
        f->source_has_cgroup = s->has_cgroup;
        f->net = s->netns_owned;
        f->agent_tcp = s->netns_owned && strncmp(s->guest_addr, "agent:", 6) != 0;
        f->waiter.reply = on_control_reply;
        f->source_id = strdup(s->id);
        f->tag = strdup(s->snapshot_tag);
        if (!f->source_id || !f->tag) {
                sandbox_fork_free(f);
                return -ENOMEM;
        }
        /* The frozen copy is a fork of the source's VMM: it runs under the
         * same id, and so do its children, which it cannot switch (the
         * source sealed its identity). Held until the copy goes, whenever the
         * source goes. */
        if (s->vmm_uid != 0) {
                r = uid_range_ref(&m->vmm_uids, s->vmm_uid);
                if (r < 0) {
                        sandbox_fork_free(f);
                        return r;
                }
                f->vmm_uid = s->vmm_uid;
        }
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
                r = -errno;
                sandbox_fork_free(f);
                return r;
        }
        f->tpl_fd = sv[0];
        r = sandbox_control_send(s, "{\"op\":\"fork\"}", sv[1], &f->waiter);
        safe_close(sv[1]);
        if (r < 0) {
                sandbox_fork_free(f);
                return sd_bus_error_set_errnof(error, r, "Failed to ask the VMM of %s for a fork: %m", s->id);
        }
        log_info("Forking the running sandbox %s into %u.", s->id, n);
        return 1;
}
