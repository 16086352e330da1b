/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The Manager's Fork and TerminateSandboxes: see manager-dbus.h. */
#include <fcntl.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <string.h>
#include <sys/ioctl.h>

#include "volumes.h"
#include "cgroup.h"
#include "branch.h"
#include "chain.h"
#include "fork-op.h"
#include "fork-options-bus.h"
#include "image-dbus.h"
#include "image.h"
#include "macro.h"
#include "manager-dbus.h"
#include "operation.h"
#include "paused.h"
#include "polkit.h"
#include "sandbox-dbus.h"
#include "sandbox.h"
#include "snapshot-meta.h"

/* ---- Fork ---- */

static void fork_done(ForkOp *f, int r, const char *error_name, const char *error_message, void *userdata) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Operation *o = userdata;
        Manager *m = o->manager;

        if (r < 0) {
                (void) sd_bus_reply_method_errorf(o->message, error_name ?: FORKD_ERROR_FAILED, "%s",
                                                  error_message ?: strerror(-r));
                operation_free(o);
                return;
        }
        r = sd_bus_message_new_method_return(o->message, &reply);
        if (r >= 0)
                r = sandbox_append_infos(reply, m, f->ids, f->n);
        if (r >= 0)
                r = sd_bus_send(NULL, reply, NULL);
        if (r < 0)
                (void) sd_bus_reply_method_errno(o->message, r, NULL);
        operation_free(o);
}

int bus_manager_method_fork(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        struct fork_options opts = {};
        Manager *m = userdata;
        const char *tag, *why = NULL;
        Operation *o = NULL;
        uint32_t n;
        Image *i = NULL;
        int r;

        r = sd_bus_message_rewind(message, true); /* polkit may dispatch it twice */
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "su", &tag, &n);
        if (r < 0)
                return r;
        r = parse_fork_options_full(message, &opts, false, error);
        if (r < 0)
                return r;
        r = bus_check_tag(tag, "snapshot tag", error);
        if (r < 0)
                return r;
        if (n < 1 || n > FORK_N_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "n must be from 1 to %u, not %u.",
                                         FORK_N_MAX, n);
        if (opts.per_child_netns)
                for (uint32_t k = 1; k <= n; k++) {
                        _cleanup_close_ int fd = -EBADF;
                        char path[64];

                        snprintf(path, sizeof(path), "/run/netns/forkd-child-%u", k);
                        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
                        if (fd < 0)
                                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                         "per_child_netns needs the network namespaces forkd-child-1 "
                                                         "to forkd-child-%u under /run/netns; %s %s.", n, path,
                                                         errno == ENOENT ? "is missing" : strerror(errno));
                        /* Checked here, before anything runs: a confined child never opens it. */
                        if (ioctl(fd, NS_GET_NSTYPE) != CLONE_NEWNET)
                                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                         "per_child_netns: %s is not a network namespace "
                                                         "(see tools/netns-setup).", path);
                }
        if (opts.memory_limit_mib > 0 && !cgroup_manager_supported(m->cgroups))
                return sd_bus_error_setf(error, FORKD_ERROR_NOT_SUPPORTED,
                                         "Memory limits are not available on this host (no usable cgroup backend).");
        if (branch_in_flight(m, tag))
                return sd_bus_error_setf(error, FORKD_ERROR_NOT_READY,
                                         "Snapshot %s is still being written by a branch; retry once it is ready.",
                                         tag);
        r = bus_manager_get_image(m, tag, &i, error);
        if (r < 0)
                return r;
        r = chain_check_restorable(m, i, error);
        if (r < 0)
                return r;
        r = fork_options_resolve_network(&opts, i->meta.network, i->meta.agent_tcp, &why);
        if (r < 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Cannot fork %s: %s.", tag, why);
        r = bus_check_limits(m, opts.memory_limit_mib, &opts.limits, i->meta.vcpus, error);
        if (r < 0)
                return r;
        r = volumes_check_fork(m, i, n, error);
        if (r < 0)
                return r;

        r = operation_prelude(m, message,
                              &(OperationPrelude) { .action = "org.forkd.fork", .verb = "fork",
                                                    .snapshot = tag,
                                                    .timeout_pause = opts.timeout_pause },
                              error);
        if (r <= 0)
                return r < 0 ? r : 1;
        r = operation_begin(m, message, NULL, &o, error);
        if (r < 0)
                return r;
        opts.owner_uid = o->owner_uid;
        r = fork_op_start(m, i, n, &opts, fork_done, o, &o->fork);
        if (r < 0) {
                operation_free(o);
                if (r == -EUSERS)
                        return sd_bus_error_setf(error, FORKD_ERROR_BUSY,
                                                 "At most %u sandboxes may exist at once.", SANDBOXES_MAX);
                if (r == -EOPNOTSUPP)
                        return sd_bus_error_setf(error, FORKD_ERROR_NOT_SUPPORTED, "%s limits are not available.",
                                                 opts.memory_limit_mib > 0 ? "Memory" : "CPU");
                return sd_bus_error_set_errnof(error, r, "Failed to start the fork: %m");
        }
        log_info("Forking %u sandbox(es) of %s%s%s.", n, tag, opts.net ? ", network " : "",
                 opts.net ? netns_policy_to_string(opts.net_policy) : "");
        return 1;
}

/* ---- TerminateSandboxes ---- */

/* TerminateSandboxes(as ids) -> (as unknown): every sandbox named, at once.
 * The caller must be allowed to terminate each of them (one polkit check:
 * their common owner's, or manage-all when they have several), else nothing
 * is killed. A paused sandbox is deleted, as TerminateSandbox deletes one (a
 * paused one being resumed fails the whole call, Busy). Ids that name no
 * sandbox (gone already) come back in unknown.
 * Answered once every VMM killed here has exited, as TerminateSandbox is. */
int bus_manager_method_terminate_sandboxes(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_free_ Sandbox **found = NULL;
        _cleanup_free_ Paused **paused = NULL;
        _cleanup_free_ char **ids = NULL;
        TerminateGroup *g = NULL;
        Manager *m = userdata;
        size_t n = 0, n_found = 0, n_paused = 0, n_unknown = 0;
        uid_t owner = OWNER_UID_INVALID;
        char what[96];
        int r;

        r = sd_bus_message_rewind(message, true); /* polkit may dispatch it twice */
        if (r < 0)
                return r;
        r = sd_bus_message_enter_container(message, 'a', "s");
        if (r < 0)
                return r;
        ids = calloc(FORK_N_MAX + 1, sizeof(char *));
        found = calloc(FORK_N_MAX, sizeof(Sandbox *));
        paused = calloc(FORK_N_MAX, sizeof(Paused *));
        if (!ids || !found || !paused)
                return -ENOMEM;
        for (;;) {
                const char *id;

                r = sd_bus_message_read(message, "s", &id);
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                if (n >= FORK_N_MAX)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "TerminateSandboxes takes 1 to %u ids.", FORK_N_MAX);
                if (!snapshot_tag_is_valid(id))
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Invalid sandbox id \"%.64s\".",
                                                 id);
                for (size_t k = 0; k < n; k++)
                        if (strcmp(ids[k], id) == 0)
                                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                         "Sandbox id %s is named twice.", id);
                ids[n++] = (char *) id;
        }
        if (n == 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "TerminateSandboxes takes 1 to %u ids.",
                                         FORK_N_MAX);

        for (size_t k = 0; k < n; k++) {
                Sandbox *s = hashmap_get(m->sandboxes, ids[k]);
                Paused *p = NULL;
                uid_t uid;

                if (!s || !sandbox_is_visible(s)) {
                        p = hashmap_get(m->paused, ids[k]);
                        if (!p) {
                                /* unknown: moved to the front, kept in order */
                                ids[n_unknown++] = ids[k];
                                continue;
                        }
                        if (p->resuming)
                                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "Sandbox %s is being resumed.",
                                                         p->id);
                }
                uid = p ? p->owner_uid : s->owner_uid;
                if (n_found + n_paused == 0)
                        owner = uid;
                else if (owner != uid)
                        owner = OWNER_UID_INVALID;
                if (p)
                        paused[n_paused++] = p;
                else
                        found[n_found++] = s;
        }
        ids[n_unknown] = NULL;
        if (n_found + n_paused > 0) {
                const char *first = n_found > 0 ? found[0]->id : paused[0]->id;
                const char *details[] = { "sandbox", first, "verb", "terminate", NULL };

                if (n_found + n_paused == 1)
                        snprintf(what, sizeof(what), "sandbox %s", first);
                else
                        snprintf(what, sizeof(what), "%zu sandboxes", n_found + n_paused);
                r = bus_verify_owner_async(message, owner, what, "org.forkd.terminate", details, &m->polkit_registry,
                                           error);
                if (r < 0)
                        return r;
                if (r == 0)
                        return 1; /* polkit answers later; we run again then */
        }

        g = calloc(1, sizeof(*g));
        if (!g)
                return -ENOMEM;
        g->message = sd_bus_message_ref(message);
        g->pending = 1; /* this call's own, dropped below once every sandbox is counted */
        g->unknown = calloc(n_unknown + 1, sizeof(char *));
        if (!g->unknown) {
                terminate_group_free(g);
                return -ENOMEM;
        }
        for (size_t k = 0; k < n_unknown; k++) {
                g->unknown[k] = strdup(ids[k]);
                if (!g->unknown[k]) {
                        terminate_group_free(g);
                        return -ENOMEM;
                }
        }
        for (size_t k = 0; k < n_found; k++) {
                Sandbox *s = found[k];

                r = sandbox_kill(s);
                if (r < 0)
                        log_warning_errno(r, "Failed to kill sandbox %s: %m", s->id);
                if (s->n_terminate_groups < ELEMENTSOF(s->terminate_groups)) {
                        s->terminate_groups[s->n_terminate_groups++] = g;
                        g->pending++;
                }
        }
        /* A paused one has no VM: its state and record go now. */
        for (size_t k = 0; k < n_paused; k++) {
                r = paused_terminate(paused[k]);
                if (r < 0)
                        log_warning_errno(r, "Failed to delete paused sandbox %s: %m", paused[k]->id);
        }
        log_info("TerminateSandboxes: %zu sandbox(es) killed, %zu paused deleted, %zu unknown.", n_found, n_paused,
                 n_unknown);
        terminate_group_done(g); /* answers now if nothing was left to wait for */
        return 1;
}
