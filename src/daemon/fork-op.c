/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/random.h>
#include <time.h>

#include "agent-proto.h"
#include "cgroup.h"
#include "fork-op.h"
#include "fs-util.h"
#include "image.h"
#include "macro.h"
#include "time-util.h"
#include "usage.h"
#include "netns-batch.h"
#include "bus-info.h"
#include "sandbox.h"
#include "vm-template.h"
#include "vmm-client.h"
#include "userns-pool.h"
#include "vmm-userns.h"
#include "worker.h"

#define PING_TIMEOUT_USEC (60 * USEC_PER_SEC)
#define SPAWN_EVENTS_MAX 8192u

static int fork_run(ForkOp *f);

static void set_ping_error(ForkOp *f, const char *fmt, ...) _printf_(2, 3);
static void set_ping_error(ForkOp *f, const char *fmt, ...) {
        va_list ap;

        if (f->ping_error)
                return; /* the first one says it */
        va_start(ap, fmt);
        if (vasprintf(&f->ping_error, fmt, ap) < 0)
                f->ping_error = NULL;
        va_end(ap);
}

/* Starting sandboxes of f stop telling it how they end. */
static void detach_sandboxes(ForkOp *f) {
        if (!f->ids)
                return;
        for (unsigned i = 0; i < f->n; i++) {
                Sandbox *s = f->ids[i] ? hashmap_get(f->manager->sandboxes, f->ids[i]) : NULL;
                if (s && s->fork_op == f)
                        s->fork_op = NULL;
        }
}

ForkOp *fork_op_free(ForkOp *f) {
        if (!f)
                return NULL;
        detach_sandboxes(f);
        if (f->manager->cgroups)
                cgroup_cancel(f->manager->cgroups, f);
        if (f->template && f->state == FORK_WAITING)
                for (ForkOp **p = &f->template->waiters; *p; p = &(*p)->next_waiter)
                        if (*p == f) {
                                *p = f->next_waiter;
                                break;
                        }
        if (f->reserved)
                f->manager->n_sandboxes_reserved -= f->n;
        if (f->image)
                f->image->n_users--;
        if (f->early)
                for (unsigned i = 0; i < f->n; i++)
                        sandbox_early_free(f->early[i]);
        free(f->early);
        free(f->pinged);
        if (f->agent_fds)
                for (unsigned i = 0; i < f->n; i++)
                        safe_close(f->agent_fds[i]);
        if (f->control_fds)
                for (unsigned i = 0; i < f->n; i++)
                        safe_close(f->control_fds[i]);
        for (unsigned i = 0; i < f->n_net_picked; i++) {
                netns_child_done(&f->net[i]);
                if (f->net_made[i])
                        sandbox_netns_destroy(f->manager, f->net[i].name, f->net_index[i]);
                else if (f->net_index[i] > 0)
                        netns_release(f->net_index[i]);
        }
        free(f->net);
        free(f->net_made);
        free(f->net_index);
        if (f->stats)
                for (unsigned i = 0; i < f->n; i++)
                        usage_stats_page_free(f->stats[i]);
        if (f->stats_fds)
                for (unsigned i = 0; i < f->n; i++)
                        safe_close(f->stats_fds[i]);
        free(f->stats);
        free(f->stats_fds);
        if (f->vmm_uids)
                for (unsigned i = 0; i < f->n; i++)
                        uid_range_free(&f->manager->vmm_uids, f->vmm_uids[i]);
        if (f->userns_fds)
                for (unsigned i = 0; i < f->n; i++)
                        safe_close(f->userns_fds[i]);
        free(f->vmm_uids);
        free(f->userns_fds);
        free(f->agent_fds);
        free(f->control_fds);
        free(f->pids);
        strv_free_n(f->ids, f->n);
        strv_free_n(f->cgroup_parents, f->n);
        strv_free_n(f->netns, f->n);
        strv_free_n(f->events, f->n_events);
        free(f->has_cgroup);
        free(f->vmm_path);
        free(f->overlay_dir);
        free(f->sandboxes_dir);
        free(f->error);
        free(f->slots);
        free(f->ping_error);
        free(f);
        return NULL;
}

/* Undo what belongs to children that never became sandboxes. */
static void cleanup_unowned(ForkOp *f) {
        Manager *m = f->manager;

        for (unsigned i = 0; i < f->n; i++) {
                if (hashmap_get(m->sandboxes, f->ids[i]))
                        continue; /* the sandbox cleans up after itself */
                if (f->records_written) {
                        char path[4096];
                        snprintf(path, sizeof(path), "%s/%s.json", m->sandboxes_dir, f->ids[i]);
                        (void) unlink(path);
                }
                if (f->has_cgroup[i]) {
                        (void) cgroup_remove(m->cgroups, f->ids[i]);
                        f->has_cgroup[i] = false;
                }
                if (i < f->n_net_picked && f->net_made[i]) {
                        netns_child_done(&f->net[i]);
                        sandbox_netns_destroy(m, f->net[i].name, f->net_index[i]);
                        f->net_made[i] = false;
                        f->net_index[i] = 0;
                }
        }
}

static void fork_fail(ForkOp *f, int r, const char *name, const char *fmt, ...) _printf_(4, 5);
static void fork_fail(ForkOp *f, int r, const char *name, const char *fmt, ...) {
        _cleanup_free_ char *msg = NULL;
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(&msg, fmt, ap) < 0)
                msg = NULL;
        va_end(ap);

        /* Children that exist are killed; each removes itself when its exit is reported. */
        for (unsigned i = 0; i < f->n; i++) {
                Sandbox *s = hashmap_get(f->manager->sandboxes, f->ids[i]);
                if (s && s->state == SANDBOX_STARTING)
                        (void) sandbox_kill(s);
        }
        cleanup_unowned(f);
        detach_sandboxes(f);
        f->state = FORK_DONE;
        log_warning("Fork of %s failed: %s", f->image ? f->image->tag : "?", msg ?: "out of memory");
        f->done(f, r, name, msg ?: "Out of memory", f->userdata); /* may free f */
}

static uint64_t span(uint64_t from, uint64_t to) {
        return from && to > from ? to - from : 0;
}

/* One line per fork: how long each stage took, in ms. The records are written
 * beside the template start and spawn (fork_work()); a stage not reached,
 * such as the start of a template that was running, counts 0. */
static void fork_log_stages(const uint64_t t[static FORK_T_MAX], unsigned n, const char *what) {
        uint64_t spawn_from = t[FORK_T_TEMPLATE] ?: t[FORK_T_QUEUED];
        uint64_t worker_end = MAX(t[FORK_T_SPAWNED], t[FORK_T_RECORDS]);
        const struct {
                const char *name;
                uint64_t us;
        } st[] = {
                { "cgroups/queue", span(t[FORK_T_START], t[FORK_T_QUEUED]) },
                { "records", span(t[FORK_T_QUEUED], t[FORK_T_RECORDS]) },
                { "template", span(t[FORK_T_QUEUED], t[FORK_T_TEMPLATE]) },
                { "spawn", span(spawn_from, t[FORK_T_SPAWNED]) },
                { "register", span(worker_end, t[FORK_T_REGISTERED]) },
                { "ping", span(t[FORK_T_REGISTERED], t[FORK_T_ANSWERED]) },
                { "announce", span(t[FORK_T_ANSWERED], t[FORK_T_ANNOUNCED]) },
                { "reply", span(t[FORK_T_ANNOUNCED], t[FORK_T_REPLIED]) },
        };
        uint64_t total = span(t[FORK_T_START], t[FORK_T_REPLIED]);
        char buf[512];
        size_t len = 0;

        for (size_t k = 0; k < ELEMENTSOF(st); k++) {
                int w = snprintf(buf + len, sizeof(buf) - len, "%s %s %" PRIu64 ".%03" PRIu64, k ? "," : "",
                                 st[k].name, st[k].us / 1000, st[k].us % 1000);
                if (w < 0 || (size_t) w >= sizeof(buf) - len)
                        break;
                len += (size_t) w;
        }
        log_info("Forked %u sandbox(es) of %s in %" PRIu64 ".%03" PRIu64 " ms:%s (ms; records beside template "
                 "and spawn).", n, what, total / 1000, total % 1000, buf);
}

static void fork_succeed(ForkOp *f) {
        Manager *m = f->manager;
        uint64_t t[FORK_T_MAX];
        char what[80];
        unsigned n = f->n;

        for (unsigned i = 0; i < f->n; i++) {
                Sandbox *s = hashmap_get(m->sandboxes, f->ids[i]);
                s->state = SANDBOX_RUNNING;
                s->fork_op = NULL;
                if (f->opts.timeout_secs > 0 &&
                    sandbox_set_deadline(s, now_realtime_usec() + f->opts.timeout_secs * USEC_PER_SEC,
                                         f->opts.timeout_pause) < 0)
                        log_warning("Failed to arm the deadline of sandbox %s.", s->id);
                sandbox_send_new_signal(s);
        }
        f->state = FORK_DONE;
        f->t[FORK_T_ANNOUNCED] = now_usec();
        snprintf(what, sizeof(what), "%s", f->image ? f->image->tag : "a running sandbox");
        memcpy(t, f->t, sizeof(t));
        /* Ready: every child answered and is announced. */
        histogram_observe(&m->fork_latency, t[FORK_T_ANNOUNCED] - t[FORK_T_START]);
        f->done(f, 0, NULL, NULL, f->userdata); /* may free f */
        t[FORK_T_REPLIED] = now_usec();
        fork_log_stages(t, n, what);
}

static void check_pings_done(ForkOp *f) {
        unsigned missing = 0;

        if (f->n_answered + f->n_failed < f->n)
                return;
        /* A child may have answered and died since. */
        for (unsigned i = 0; i < f->n; i++)
                if (!hashmap_get(f->manager->sandboxes, f->ids[i]))
                        missing++;
        f->t[FORK_T_ANSWERED] = now_usec();
        /* The children are up: the next fork's namespaces are made now, off its path. */
        if (f->vmm_uids)
                userns_pool_fill(f->manager, f->n);
        if (f->n_failed > 0 || missing > 0) {
                fork_fail(f, -EIO, FORKD_ERROR_FAILED, "%u of %u children did not come up (%s); none was kept",
                          MAX(f->n_failed, missing), f->n, f->ping_error ?: "exited after answering");
                return;
        }
        fork_succeed(f);
}

static void on_ping(int r, uint16_t type, const char *json, struct json_object *obj, void *userdata) {
        struct ping_slot *slot = userdata;
        ForkOp *f = slot->op;
        Sandbox *s = hashmap_get(f->manager->sandboxes, f->ids[slot->index]);

        if (f->state != FORK_PINGING)
                /* An early ping (fork_on_batch()) failed as its sandbox went, while
                 * fork_work_done() still registers: its loop counts the child then. */
                return;
        if (r >= 0 && type == FKA_RESPONSE) {
                f->n_answered++;
                /* The sandbox owns the cgroup by now (fork_work_done cleared has_cgroup[]);
                 * the child joined it before it could answer. */
                if (s && s->has_cgroup)
                        cgroup_attached(f->manager->cgroups, s->vm_id, (pid_t) s->pid);
        } else {
                if ((r == -ECONNRESET || r == -EPIPE) && s && s->fork_op == f && s->state == SANDBOX_STARTING) {
                        /* Its agent channel closed but its exit is not reported yet (it
                         * would have been freed first): wait for it, it says why. The
                         * kill makes sure it comes; a VMM that ended already keeps its
                         * exit status. */
                        s->fork_awaits_exit = true;
                        (void) sandbox_kill(s);
                        return;
                }
                f->n_failed++;
                if (!f->ping_error) {
                        if (r < 0)
                                set_ping_error(f, "%s: %s", f->ids[slot->index],
                                                r == -ECONNRESET ? "the VM exited" : strerror(-r));
                        else
                                set_ping_error(f, "%s: the agent refused ping", f->ids[slot->index]);
                }
        }
        check_pings_done(f);
}

bool fork_op_child_exited(ForkOp *f, Sandbox *s, int code, int sig) {
        if (sig == 0)
                switch (code) {
                case VMM_CHILD_EXIT_NETNS:
                        set_ping_error(f, "%s could not enter its network namespace %s, see the log of forkd",
                                       s->id, s->netns ?: "(none)");
                        break;
                case VMM_CHILD_EXIT_CGROUP:
                        set_ping_error(f, "%s could not join its cgroup, see the log of forkd", s->id);
                        break;
                case VMM_CHILD_EXIT_RESTORE:
                        set_ping_error(f, "%s could not restore the snapshot, see the log of forkd", s->id);
                        break;
                default:
                        break;
                }
        if (!s->fork_awaits_exit)
                return false;
        set_ping_error(f, "%s: the VM exited", s->id);
        return true;
}

void fork_op_child_gone(ForkOp *f) {
        f->n_failed++;
        check_pings_done(f); /* may free f */
}

/* ---- worker ---- */

static void on_spawn_event(const char *json, void *userdata) {
        ForkOp *f = userdata;
        char **l;

        if (f->n_events >= SPAWN_EVENTS_MAX)
                return;
        l = realloc(f->events, (f->n_events + 1) * sizeof(char *));
        if (!l)
                return;
        f->events = l;
        l[f->n_events] = strdup(json);
        if (l[f->n_events])
                f->n_events++;
}

static int fork_work_error(ForkOp *f, int r, const char *what) {
        free(f->error);
        if (asprintf(&f->error, "%s: %s", what, strerror(-r)) < 0)
                f->error = NULL;
        return r;
}

/* The sandbox records: one file per child, then one fsync of the directory.
 * Not synced one by one: a killed forkd needs no fsync (the page cache keeps
 * them), and a power loss ends the VMMs, cgroups and namespaces they name
 * anyway; a record a power loss broke is ignored at the next start. On the
 * tmpfs of the unit's /run/forkd one costs about 0.02 ms (on ext4, after many
 * files were deleted, up to a millisecond: ext4 scans for recently freed
 * inodes; hence --runtime-dir). */
struct records_job {
        ForkOp *f;
        int r;
        const char *what; /* why r < 0 */
};

static void *fork_write_records(void *userdata) {
        struct records_job *j = userdata;
        ForkOp *f = j->f;
        _cleanup_close_ int dfd = open(f->sandboxes_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

        if (dfd < 0) {
                j->r = -errno;
                j->what = "Failed to open the sandbox records' directory";
                return NULL;
        }
        for (unsigned i = 0; i < f->n; i++) {
                struct sandbox_params p = {
                        .id = f->ids[i], .snapshot_tag = f->template->tag, .created_at = f->created_at,
                        .memory_limit_mib = f->opts.memory_limit_mib, .has_cgroup = f->has_cgroup[i],
                        .limits = f->opts.limits,
                        .live_fork = f->opts.live_fork, .owner_uid = f->opts.owner_uid,
                        .netns = f->opts.net ? f->netns[i] : NULL, .netns_owned = f->opts.net,
                };
                _cleanup_free_ char *json = NULL;
                char name[128];

                j->r = sandbox_record_format(&p, &json);
                if (j->r < 0) {
                        j->what = "Failed to format a sandbox record";
                        return NULL;
                }
                j->r = snprintf(name, sizeof(name), "%s.json", f->ids[i]) < (int) sizeof(name) ?
                               write_file_new_at(dfd, name, json, strlen(json)) : -ENAMETOOLONG;
                if (j->r < 0) {
                        j->what = "Failed to write a sandbox record";
                        return NULL;
                }
        }
        j->r = fsync(dfd) < 0 ? -errno : 0;
        if (j->r < 0)
                j->what = "Failed to sync the sandbox records";
        f->t[FORK_T_RECORDS] = now_usec();
        return NULL;
}

struct spawn_batch {
        ForkOp *f;
        unsigned base; /* index in f of the spawn request's first child */
};

/* A batch of spawn requests left: ping those children now (the engine's way,
 * bench/fork-bench.c), so that they answer while the template forks the rest
 * and forkd registers them. A ping that cannot go now goes after registering. */
static void fork_on_batch(size_t first, size_t k, void *userdata) {
        struct spawn_batch *b = userdata;
        ForkOp *f = b->f;

        for (size_t j = first; j < first + k; j++) {
                unsigned i = b->base + (unsigned) j;

                f->slots[i] = (struct ping_slot) { .op = f, .index = i };
                if (sandbox_early_call(f->agent_fds[i], "{\"op\":\"ping\"}", PING_TIMEOUT_USEC, on_ping, &f->slots[i],
                                       &f->early[i]) < 0)
                        f->early[i] = NULL;
        }
}

/* Start the template if it is not running, and have it fork the children. */
/* Each child's user namespace (vmm-userns.c) that the pool did not give, before
 * the first is spawned. */
static int fork_make_userns(ForkOp *f) {
        for (unsigned k = 0; k < f->n; k++) {
                int r;

                if (f->userns_fds[k] >= 0)
                        continue;
                r = vmm_userns_new(f->userns_owner, f->vmm_uids[k], f->userns_group, &f->userns_fds[k]);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int fork_spawn(ForkOp *f, const int *taps) {
        VmTemplate *t = f->template;
        const int *userns = f->vmm_uids ? f->userns_fds : NULL;
        int r = 0;

        if (userns) {
                r = fork_make_userns(f);
                if (r < 0)
                        return fork_work_error(f, r, "Failed to make the user namespaces of the VMMs");
        }

        if (f->need_start) {
                _cleanup_free_ char *err = NULL;

                r = vm_template_start(t, f->vmm_path, f->overlay_dir, &err);
                if (r < 0) {
                        free(f->error);
                        if ((r == -ESTALE || r == -ENOLINK) && err)
                                f->error = TAKE_PTR(err); /* a broken chain: forkd-vmm's words */
                        else if (asprintf(&f->error, "Failed to start the template of %s: %s", t->tag,
                                          err ?: strerror(-r)) < 0)
                                f->error = NULL;
                        return r;
                }
                f->t[FORK_T_TEMPLATE] = now_usec();
        } else
                /* The frozen copy of a running sandbox (ForkSandbox) on its first fork. */
                vm_template_join_cgroup(t);
        t->vt.on_event = on_spawn_event;
        t->vt.event_userdata = f;
        /* One spawn request per run of children with the same cgroup parent; network
         * namespaces go per child. */
        for (unsigned start = 0; start < f->n;) {
                unsigned end = start + 1;
                const char *parent = f->cgroup_parents[start];
                struct vmm_spawn_options so = {
                        .cgroup_parent = parent,
                        .netns = f->netns ? (const char *const *) f->netns + start : NULL,
                        .tap_fds = taps ? taps + start : NULL,
                        .disk_rate = rate_limit_is_set(&f->opts.limits.disk_rate) ? &f->opts.limits.disk_rate : NULL,
                        .net_rate = rate_limit_is_set(&f->opts.limits.net_rate) ? &f->opts.limits.net_rate : NULL,
                        .stats_fds = f->stats_fds + start,
                        .userns_fds = userns ? userns + start : NULL,
                };

                while (end < f->n && ((!parent && !f->cgroup_parents[end]) ||
                                      (parent && f->cgroup_parents[end] && strcmp(parent, f->cgroup_parents[end]) == 0)))
                        end++;
                struct spawn_batch batch = { .f = f, .base = start };

                r = vmm_client_template_spawn_with(&t->vt, (const char *const *) f->ids + start, end - start, &so,
                                                   f->agent_fds + start, f->control_fds + start, f->pids + start,
                                                   fork_on_batch, &batch);
                if (r < 0) {
                        f->spawn_failed = true;
                        break;
                }
                start = end;
        }
        t->vt.on_event = NULL;
        t->vt.event_userdata = NULL;
        /* The namespaces live on in the children that entered them. */
        for (unsigned k = 0; userns && k < f->n; k++)
                f->userns_fds[k] = safe_close(f->userns_fds[k]);
        /* The children have their taps (or never will): forkd's copies go. */
        for (unsigned i = 0; i < f->n_net_picked; i++)
                netns_child_done(&f->net[i]);
        /* The children have their pages: only the mappings stay. */
        for (unsigned i = 0; i < f->n; i++)
                f->stats_fds[i] = safe_close(f->stats_fds[i]);
        if (r < 0)
                return fork_work_error(f, r, "The template failed to spawn children");
        f->t[FORK_T_SPAWNED] = now_usec();
        return 0;
}

static int fork_work(void *userdata) {
        ForkOp *f = userdata;
        struct records_job job = { .f = f };
        _cleanup_free_ int *taps = NULL;
        pthread_t records;
        bool threaded;
        int r;

        if (f->opts.net) {
                r = fork_op_make_namespaces(f);
                if (r < 0)
                        return r;
                taps = calloc(f->n, sizeof(int));
                if (!taps)
                        return fork_work_error(f, -ENOMEM, "Failed to hand over the taps");
                for (unsigned i = 0; i < f->n; i++)
                        taps[i] = f->net[i].tap_fd;
        }

        /* A stats page per child: the VMM counts its devices' work there. */
        for (unsigned i = 0; i < f->n; i++) {
                r = usage_stats_page_new(&f->stats_fds[i], &f->stats[i]);
                if (r < 0)
                        return fork_work_error(f, r, "Failed to make the stats pages");
        }

        /*
         * The records go beside the spawn, on a thread of their own (creating a file
         * cost 0.35 ms on ext4 here: 35 ms of a fork of 100). They exist for the next
         * start of a killed forkd: its children die with it (PR_SET_PDEATHSIG), the
         * records say which sandboxes to announce as gone and what to remove, and the
         * start sweeps cgroups and namespaces too. Nobody hears of a sandbox before
         * both are done: the fork is answered after the join.
         */
        f->records_written = true; /* from here on, cleanup_unowned() removes them */
        threaded = pthread_create(&records, NULL, fork_write_records, &job) == 0;
        if (!threaded)
                (void) fork_write_records(&job);
        r = fork_spawn(f, taps);
        if (threaded)
                (void) pthread_join(records, NULL);
        if (r >= 0 && job.r < 0) {
                /* Children without records: they go before anyone hears of them. */
                for (unsigned i = 0; i < f->n; i++)
                        if (f->pids[i] > 0)
                                (void) kill(f->pids[i], SIGKILL);
                r = fork_work_error(f, job.r, job.what);
        }
        return r;
}

static void fork_work_done(int r, void *userdata) {
        ForkOp *f = userdata;
        VmTemplate *t = f->template;
        Manager *m = f->manager;

        if (r >= 0) {
                for (unsigned i = 0; i < f->n; i++) {
                        struct sandbox_params p = {
                                .id = f->ids[i], .snapshot_tag = t->tag,
                                .netns = f->netns ? f->netns[i] : NULL, .pid = (uint32_t) f->pids[i],
                                .created_at = f->created_at, .memory_limit_mib = f->opts.memory_limit_mib,
                                .limits = f->opts.limits,
                                .has_cgroup = f->has_cgroup[i], .live_fork = f->opts.live_fork,
                                .owner_uid = f->opts.owner_uid,
                                .vmm_uid = f->vmm_uids ? f->vmm_uids[i] : 0,
                                .netns_owned = f->opts.net, .net_policy = f->opts.net_policy,
                                .host_addr = f->opts.net ? f->net[i].host_addr : NULL,
                                .inside_addr = f->opts.net ? f->net[i].inside_addr : NULL,
                                .agent_tcp = f->opts.agent_tcp,
                        };
                        Sandbox *s;
                        int k;

                        if (f->pids[i] <= 0) {
                                /* The template could not fork this one. */
                                f->early[i] = sandbox_early_free(f->early[i]);
                                f->agent_fds[i] = safe_close(f->agent_fds[i]);
                                f->control_fds[i] = safe_close(f->control_fds[i]);
                                continue;
                        }
                        if (f->early[i]) {
                                k = sandbox_new_early(m, &p, TAKE_FD(f->agent_fds[i]), TAKE_PTR(f->early[i]), &s);
                                f->pinged[i] = k >= 0;
                        } else
                                k = sandbox_new(m, &p, TAKE_FD(f->agent_fds[i]), &s);
                        if (k < 0) {
                                log_warning_errno(k, "Failed to register sandbox %s: %m", f->ids[i]);
                                (void) kill(f->pids[i], SIGKILL);
                                continue;
                        }
                        /* Owned by the sandbox now, its namespace and its id included. */
                        s->control_fd = TAKE_FD(f->control_fds[i]);
                        s->stats = TAKE_PTR(f->stats[i]);
                        if (f->vmm_uids)
                                f->vmm_uids[i] = 0;
                        if (f->opts.net) {
                                f->net_made[i] = false;
                                f->net_index[i] = 0;
                        }
                        f->has_cgroup[i] = false;
                        s->fork_op = f;
                        vm_template_add_sandbox(t, s);
                        /* Early, so that the service manager sees the VMM in its scope as soon as
                         * possible; again once it answered, when it has surely joined its cgroup. */
                        if (s->has_cgroup)
                                cgroup_attached(m->cgroups, s->vm_id, (pid_t) s->pid);
                }
                m->n_sandboxes_reserved -= f->n;
                f->reserved = false;
        }

        /* Exits the worker met while spawning, then the template's own state. */
        for (unsigned i = 0; i < f->n_events; i++)
                vm_template_handle_event(t, f->events[i]);
        vm_template_end_work(t);

        if (r < 0) {
                if (f->spawn_failed) {
                        /* Children of unknown pids may exist: only stopping the template ends them. */
                        log_error("Spawning failed; stopping the template of %s and its children.", t->tag);
                        vm_template_stop(t);
                }
                f->template = NULL;
                fork_op_run_next(t);
                vm_template_maybe_gc(t);
                fork_fail(f, r, r == -ESTALE || r == -ENOLINK ? FORKD_ERROR_CHAIN_BROKEN : FORKD_ERROR_FAILED, "%s",
                          f->error ?: "spawning failed");
                return;
        }

        f->template = NULL;
        fork_op_run_next(t);

        f->state = FORK_PINGING;
        log_info("Spawned %u VM(s) of %s; waiting for their agents.", f->n,
                 f->image ? f->image->tag : "a running sandbox");
        f->n_failed = 0;
        for (unsigned i = 0; i < f->n; i++) {
                Sandbox *s = hashmap_get(m->sandboxes, f->ids[i]);
                int k;

                if (!s || f->pids[i] <= 0 || s->pid != (uint32_t) f->pids[i]) {
                        /* Not forked, not registered, or already gone. */
                        f->n_failed++;
                        if (!f->ping_error)
                                set_ping_error(f, "%s: the VM exited before it answered", f->ids[i]);
                        continue;
                }
                if (f->pinged[i])
                        continue; /* sent as its spawn batch left (fork_on_batch()) */
                f->slots[i] = (struct ping_slot) { .op = f, .index = i };
                k = sandbox_call(s, "{\"op\":\"ping\"}", PING_TIMEOUT_USEC, on_ping, &f->slots[i]);
                if (k < 0) {
                        f->n_failed++;
                        if (!f->ping_error)
                                set_ping_error(f, "%s: %s", f->ids[i], strerror(-k));
                }
        }
        f->t[FORK_T_REGISTERED] = now_usec();
        check_pings_done(f);
}

static int fork_run(ForkOp *f) {
        VmTemplate *t = f->template;
        int r;

        if (t->busy) {
                ForkOp **p = &t->waiters;
                while (*p)
                        p = &(*p)->next_waiter;
                *p = f;
                f->state = FORK_WAITING;
                return 0;
        }
        f->state = FORK_SPAWNING;
        f->need_start = t->vt.pid == 0;
        f->t[FORK_T_QUEUED] = now_usec();
        vm_template_begin_work(t);
        r = worker_pool_submit(f->manager->workers, fork_work, fork_work_done, f);
        if (r < 0) {
                vm_template_end_work(t);
                f->template = NULL;
                vm_template_maybe_gc(t);
                return r;
        }
        return 0;
}

void fork_op_run_next(VmTemplate *t) {
        ForkOp *f = t->waiters;
        int r;

        if (!f || t->busy)
                return;
        t->waiters = f->next_waiter;
        f->next_waiter = NULL;
        f->state = FORK_SPAWNING;
        r = fork_run(f);
        if (r < 0)
                fork_fail(f, r, FORKD_ERROR_FAILED, "Failed to queue the fork: %s", strerror(-r));
}

static void cgroups_ready(ForkOp *f) {
        Image *i = f->image;
        int r;

        if (f->cgroup_error < 0) {
                fork_fail(f, f->cgroup_error, FORKD_ERROR_FAILED, "Failed to set up the memory limits: %s",
                          strerror(-f->cgroup_error));
                return;
        }
        if (!f->template) {
                r = vm_template_get(i, &f->template);
                if (r < 0) {
                        fork_fail(f, r, FORKD_ERROR_FAILED, "Failed to set up the template: %s", strerror(-r));
                        return;
                }
        }
        r = fork_run(f);
        if (r < 0)
                fork_fail(f, r, FORKD_ERROR_FAILED, "Failed to queue the fork: %s", strerror(-r));
}

static void on_cgroup_ready(int r, const char *id, const char *parent, void *userdata) {
        ForkOp *f = userdata;

        for (unsigned i = 0; i < f->n; i++) {
                if (strcmp(f->ids[i], id) != 0 || f->cgroup_parents[i])
                        continue;
                if (r >= 0) {
                        f->cgroup_parents[i] = strdup(parent);
                        if (!f->cgroup_parents[i])
                                r = -ENOMEM;
                }
                if (r < 0 && f->cgroup_error == 0)
                        f->cgroup_error = r;
                break;
        }
        if (--f->n_cgroups_pending == 0)
                cgroups_ready(f);
}

static int fork_op_start_full(Manager *m, Image *i, VmTemplate *t, unsigned n, const struct fork_options *o,
                              fork_done_t done, void *userdata, ForkOp **ret);

int fork_op_start(Manager *m, Image *i, unsigned n, const struct fork_options *o, fork_done_t done, void *userdata,
                  ForkOp **ret) {
        return fork_op_start_full(m, i, NULL, n, o, done, userdata, ret);
}

int fork_op_start_template(Manager *m, VmTemplate *t, unsigned n, const struct fork_options *o, fork_done_t done,
                           void *userdata, ForkOp **ret) {
        return fork_op_start_full(m, NULL, t, n, o, done, userdata, ret);
}

static int fork_op_start_full(Manager *m, Image *i, VmTemplate *t, unsigned n, const struct fork_options *o,
                              fork_done_t done, void *userdata, ForkOp **ret) {
        ForkOp *f;
        char prefix[7];
        int r;

        if (n == 0 || n > FORK_N_MAX)
                return -EINVAL;
        if (hashmap_size(m->sandboxes) + m->n_sandboxes_reserved + n > SANDBOXES_MAX)
                return -EUSERS;
        if (o->memory_limit_mib > 0 && !cgroup_manager_supported(m->cgroups))
                return -EOPNOTSUPP;
        if (o->limits.cpu_limit > 0 && !cgroup_manager_cpu_supported(m->cgroups))
                return -EOPNOTSUPP;

        f = calloc(1, sizeof(*f));
        if (!f)
                return -ENOMEM;
        f->manager = m;
        f->n = n;
        f->opts = *o;
        f->done = done;
        f->userdata = userdata;
        f->created_at = o->created_at > 0 ? o->created_at : (uint64_t) time(NULL);
        f->t[FORK_T_START] = now_usec();
        f->image = i;
        if (i)
                i->n_users++;
        f->template = t;
        f->reserved = true;
        m->n_sandboxes_reserved += n;
        f->ids = calloc(n, sizeof(char *));
        f->cgroup_parents = calloc(n, sizeof(char *));
        f->has_cgroup = calloc(n, sizeof(bool));
        f->agent_fds = calloc(n, sizeof(int));
        f->control_fds = calloc(n, sizeof(int));
        f->pids = calloc(n, sizeof(pid_t));
        f->slots = calloc(n, sizeof(struct ping_slot));
        f->early = calloc(n, sizeof(SandboxEarly *));
        f->pinged = calloc(n, sizeof(bool));
        f->stats_fds = calloc(n, sizeof(int));
        for (unsigned k = 0; f->stats_fds && k < n; k++)
                f->stats_fds[k] = -EBADF; /* before any way to fork_op_free() */
        f->stats = calloc(n, sizeof(struct vmm_stats *));
        f->vmm_path = strdup(m->vmm_path);
        f->overlay_dir = strdup(m->overlay_dir);
        f->sandboxes_dir = strdup(m->sandboxes_dir);
        if (!f->ids || !f->cgroup_parents || !f->has_cgroup || !f->agent_fds || !f->control_fds || !f->pids || !f->slots || !f->early || !f->pinged ||
            !f->stats_fds || !f->stats ||
            !f->vmm_path || !f->overlay_dir || !f->sandboxes_dir) {
                r = -ENOMEM;
                goto fail;
        }
        for (unsigned k = 0; k < n; k++)
                f->agent_fds[k] = f->control_fds[k] = -EBADF;

        /* A resume: the paused sandbox's own id. */
        if (o->id) {
                if (n != 1 || hashmap_get(m->sandboxes, o->id) || hashmap_get(m->vms, o->id)) {
                        r = -EEXIST;
                        goto fail;
                }
                f->ids[0] = strdup(o->id);
                if (!f->ids[0]) {
                        r = -ENOMEM;
                        goto fail;
                }
        }
        /* sb-<6 hex>-<4 digits>: one random prefix per fork, unused by any live or paused sandbox. */
        for (unsigned attempt = 0; !o->id; attempt++) {
                char probe[32];

                random_hex(prefix, 6);
                snprintf(probe, sizeof(probe), "sb-%s-0000", prefix);
                if (!hashmap_get(m->sandboxes, probe) && !hashmap_get(m->vms, probe) && !hashmap_get(m->paused, probe))
                        break;
                if (attempt > 16) {
                        r = -EADDRINUSE;
                        goto fail;
                }
        }
        for (unsigned k = 0; k < n && !o->id; k++)
                if (asprintf(&f->ids[k], "sb-%s-%04u", prefix, k) < 0) {
                        f->ids[k] = NULL;
                        r = -ENOMEM;
                        goto fail;
                }
        if (o->net) {
                f->net_prefix = m->netns_prefix;
                f->netns = calloc(n, sizeof(char *));
                f->net = calloc(n, sizeof(NetnsChild));
                f->net_made = calloc(n, sizeof(bool));
                f->net_index = calloc(n, sizeof(unsigned));
                if (!f->netns || !f->net || !f->net_made || !f->net_index) {
                        r = -ENOMEM;
                        goto fail;
                }
                for (unsigned k = 0; k < n; k++)
                        f->net[k].tap_fd = -EBADF;
        }
        /* per_child_netns: the i-th child of this call (from 1, as the ids count from
         * 0000) goes into the pre-provisioned namespace forkd-child-<i>, whose
         * existence the caller checked. */
        if (o->per_child_netns && !o->net) {
                f->netns = calloc(n, sizeof(char *));
                if (!f->netns) {
                        r = -ENOMEM;
                        goto fail;
                }
                for (unsigned k = 0; k < n; k++)
                        if (asprintf(&f->netns[k], "forkd-child-%u", k + 1) < 0) {
                                f->netns[k] = NULL;
                                r = -ENOMEM;
                                goto fail;
                        }
        }

        /* Each child of a snapshot's template gets an id of its own; a frozen
         * copy's children (t) run under the copy's (vm-template.h). */
        if (m->vmm_uids.count > 0 && !t) {
                f->vmm_uids = calloc(n, sizeof(uid_t));
                f->userns_fds = malloc(n * sizeof(int));
                for (unsigned k = 0; f->userns_fds && k < n; k++)
                        f->userns_fds[k] = -EBADF;
                if (!f->vmm_uids || !f->userns_fds) {
                        r = -ENOMEM;
                        goto fail;
                }
                for (unsigned k = 0; k < n; k++) {
                        /* A namespace made ahead of time, with its id; else an id, its
                         * namespace made in the spawn. The range full: the pool's ids too. */
                        if (userns_pool_take(m, &f->vmm_uids[k], &f->userns_fds[k]) >= 0)
                                continue;
                        r = uid_range_alloc(&m->vmm_uids, &f->vmm_uids[k]);
                        if (r < 0 && m->userns_pool.n > 0) {
                                userns_pool_drain(m);
                                r = uid_range_alloc(&m->vmm_uids, &f->vmm_uids[k]);
                        }
                        if (r < 0) {
                                log_warning("All %u ids of --vmm-uid-range are in use: no VMM may start.",
                                            m->vmm_uids.count);
                                r = -EUSERS;
                                goto fail;
                        }
                }
                f->userns_owner = m->vmm_uid;
                f->userns_group = m->vmm_gid;
        }

        /* Either limit gives each child a cgroup of its own. */
        if (o->memory_limit_mib > 0 || o->limits.cpu_limit > 0) {
                uint64_t bytes = (uint64_t) o->memory_limit_mib << 20;

                for (unsigned k = 0; k < n; k++) {
                        char *parent = NULL;

                        r = cgroup_prepare(m->cgroups, f->ids[k], bytes, o->limits.cpu_limit, on_cgroup_ready, f,
                                           &parent);
                        if (r < 0) {
                                log_warning_errno(r, "Failed to create the cgroup of %s: %m", f->ids[k]);
                                goto fail;
                        }
                        f->has_cgroup[k] = true;
                        if (r > 0)
                                f->cgroup_parents[k] = parent;
                        else
                                f->n_cgroups_pending++;
                }
        }

        if (f->n_cgroups_pending > 0)
                f->state = FORK_CGROUPS;
        else {
                if (!f->template) {
                        r = vm_template_get(i, &f->template);
                        if (r < 0)
                                goto fail;
                }
                r = fork_run(f);
                if (r < 0)
                        goto fail;
        }
        *ret = f;
        return 0;
fail:
        if (f->has_cgroup)
                for (unsigned k = 0; k < n; k++)
                        if (f->has_cgroup[k])
                                (void) cgroup_remove(m->cgroups, f->ids[k]);
        if (t && f->template == t) {
                /* A running template of nobody else's: it goes unless something uses it. */
                f->template = NULL;
                fork_op_free(f);
                vm_template_maybe_gc(t);
                return r;
        }
        fork_op_free(f);
        return r;
}
