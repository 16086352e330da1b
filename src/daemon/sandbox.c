/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <assert.h>
#include <dirent.h>
#include <poll.h>
#include <signal.h>

#include <json-c/json.h>

#include "agent-proto.h"
#include "agent-tcp-port.h"
#include "cgroup.h"
#include "fs-util.h"
#include "image.h"
#include "json-util.h"
#include "macro.h"
#include "sandbox.h"
#include "snapshot-meta.h"
#include "time-util.h"
#include "usage.h"
#include "vm-template.h"
#include "worker.h"

#define RECORD_MAX 4096u

struct agent_call {
        Sandbox *sandbox;
        agent_reply_t cb;
        void *userdata;
        uint64_t started_usec; /* for the agent call latency histogram */
        struct agent_call *next, *prev;
};

static const char *const state_table[_SANDBOX_STATE_MAX] = {
        [SANDBOX_STARTING] = "starting",
        [SANDBOX_RUNNING] = "running",
        [SANDBOX_TERMINATING] = "terminating",
};

const char *sandbox_state_to_string(SandboxState s) {
        return s >= 0 && s < _SANDBOX_STATE_MAX ? state_table[s] : NULL;
}

int sandbox_object_path(const char *id, char **ret) {
        return sd_bus_path_encode(FORKD_SANDBOX_PREFIX, id, ret);
}

static void call_unlink(Sandbox *s, struct agent_call *c) {
        if (c->prev)
                c->prev->next = c->next;
        else
                s->calls = c->next;
        if (c->next)
                c->next->prev = c->prev;
        c->next = c->prev = NULL;
}

static void call_link(Sandbox *s, struct agent_call *c) {
        c->sandbox = s;
        c->prev = NULL;
        c->next = s->calls;
        if (s->calls)
                s->calls->prev = c;
        s->calls = c;
}

static void fail_all_calls(Sandbox *s, int error) {
        while (s->calls) {
                struct agent_call *c = s->calls;
                call_unlink(s, c);
                c->cb(error, 0, NULL, NULL, c->userdata);
                free(c);
        }
}

static int on_agent_io(sd_event_source *es, int fd, uint32_t revents, void *userdata);
static void update_io(Sandbox *s);

/*
 * The agent channel of s, watched in the event loop edge-triggered: sd-event
 * dispatches one source per iteration and asks epoll again in between, and a
 * level-triggered fd that waits for its turn is polled and copied out on
 * every one of those waits. When the agents of a
 * fork of 1000 answer their pings at once (or their VMMs exit at once), that
 * was a thousand ready fds polled a thousand times: a fifth of forkd's CPU.
 * The price: pump() reads until EAGAIN or comes back by the timer
 * (pump_again), and a hang-up, reported once, is remembered (hangup_seen).
 * What stays unread while no request waits is seen when the next request
 * re-arms the mask (update_io(): EPOLLIN again, epoll_ctl MOD reports it).
 */
#define AGENT_EPOLL_FLAGS EPOLLET

static int watch_agent(Sandbox *s) {
        int r = sd_event_add_io(s->manager->event, &s->io_source, s->agent_fd, EPOLLIN | AGENT_EPOLL_FLAGS,
                                on_agent_io, s);

        if (r >= 0)
                (void) sd_event_source_set_description(s->io_source, "agent");
        return r;
}

struct SandboxEarly {
        fka_client *client;
        struct agent_call *call;
};

int sandbox_early_call(int agent_fd, const char *json, uint64_t timeout_usec, agent_reply_t cb, void *userdata,
                       SandboxEarly **ret) {
        SandboxEarly *e;
        int r;

        e = calloc(1, sizeof(*e));
        if (!e)
                return -ENOMEM;
        e->call = calloc(1, sizeof(*e->call));
        r = e->call ? fka_client_new(agent_fd, AGENT_CALLS_MAX, &e->client) : -ENOMEM;
        if (r >= 0) {
                *e->call = (struct agent_call) { .cb = cb, .userdata = userdata }; /* .sandbox: once it exists */
                r = fka_client_send(e->client, json, SIZE_MAX, fka_now_usec() + timeout_usec, e->call);
        }
        if (r < 0) {
                sandbox_early_free(e);
                return r;
        }
        *ret = e;
        return 0;
}

SandboxEarly *sandbox_early_free(SandboxEarly *e) {
        if (!e)
                return NULL;
        fka_client_free(e->client);
        free(e->call);
        free(e);
        return NULL;
}

static int sandbox_new_full(Manager *m, const struct sandbox_params *p, int agent_fd, fka_client *client,
                            Sandbox **ret);

static void sandbox_free_strings(Sandbox *s) {
        free(s->id);
        free(s->vm_id);
        free(s->snapshot_tag);
        free(s->origin_tag);
        free(s->netns);
        free(s->host_addr);
        free(s->inside_addr);
        free(s->guest_addr);
}

int sandbox_new(Manager *m, const struct sandbox_params *p, int agent_fd, Sandbox **ret) {
        return sandbox_new_full(m, p, agent_fd, NULL, ret);
}

int sandbox_new_early(Manager *m, const struct sandbox_params *p, int agent_fd, SandboxEarly *e, Sandbox **ret) {
        struct agent_call *c = e->call;
        Sandbox *s;
        int r;

        r = sandbox_new_full(m, p, agent_fd, TAKE_PTR(e->client), &s);
        if (r < 0) {
                sandbox_early_free(e);
                return r;
        }
        e->call = NULL;
        free(e);
        call_link(s, c);
        r = watch_agent(s);
        if (r < 0) {
                /* Nothing would read the answer: the VMM goes, and its exit fails
                 * the call (-ECONNRESET), as for a VM that died. */
                log_warning_errno(r, "Failed to watch the agent of %s, killing it: %m", s->id);
                (void) sandbox_kill(s);
        } else
                update_io(s);
        *ret = s;
        return 0;
}

/* client: made already (sandbox_new_early()), owned from here on; NULL: made here. */
static int sandbox_new_full(Manager *m, const struct sandbox_params *p, int agent_fd, fka_client *client,
                            Sandbox **ret) {
        Sandbox *s;
        int r;

        s = calloc(1, sizeof(*s));
        if (!s) {
                fka_client_free(client);
                safe_close(agent_fd);
                return -ENOMEM;
        }
        s->client = client;
        s->manager = m;
        s->agent_fd = agent_fd;
        s->control_fd = -EBADF;
        s->usage_files = USAGE_FILES_INIT;
        s->pid = p->pid;
        s->created_at = p->created_at;
        s->memory_limit_mib = p->memory_limit_mib;
        s->limits = p->limits;
        s->owner_uid = p->owner_uid;
        s->vmm_uid = p->vmm_uid;
        s->has_cgroup = p->has_cgroup;
        s->live_fork = p->live_fork;
        s->net_policy = p->net_policy;
        s->state = SANDBOX_STARTING;
        s->id = strdup(p->id);
        s->vm_id = strdup(p->vm_id ?: p->id);
        s->snapshot_tag = strdup(p->snapshot_tag);
        s->netns = p->netns ? strdup(p->netns) : NULL;
        s->host_addr = p->host_addr ? strdup(p->host_addr) : NULL;
        s->inside_addr = p->inside_addr ? strdup(p->inside_addr) : NULL;
        if (!s->id || !s->vm_id || !s->snapshot_tag || (p->netns && !s->netns) || (p->host_addr && !s->host_addr) ||
            (p->inside_addr && !s->inside_addr) ||
            sandbox_guest_addr(p->id, p->inside_addr, p->agent_tcp, &s->guest_addr) < 0) {
                r = -ENOMEM;
                goto fail;
        }
        if (p->netns_owned && netns_child_index_from_name(p->netns, &s->netns_index) >= 0)
                s->netns_owned = true;
        if (!s->client) {
                r = fka_client_new(agent_fd, AGENT_CALLS_MAX, &s->client);
                if (r < 0)
                        goto fail;
        }
        r = hashmap_put(m->vms, s->vm_id, s);
        if (r < 0)
                goto fail;
        r = hashmap_put(m->sandboxes, s->id, s);
        if (r < 0) {
                hashmap_remove(m->vms, s->vm_id);
                goto fail;
        }
        *ret = s;
        return 0;
fail:
        /* Nothing is ours yet: the caller keeps the cgroup and the record. */
        s->has_cgroup = false;
        fka_client_free(s->client);
        s->client = NULL;
        safe_close(s->agent_fd);
        sandbox_free_strings(s);
        free(s);
        return r;
}

int sandbox_guest_addr(const char *id, const char *inside_addr, bool agent_tcp, char **ret) {
        char *a;

        if (agent_tcp && inside_addr) {
                if (asprintf(&a, "%s:%u", inside_addr, (unsigned) AGENT_TCP_PORT) < 0)
                        return -ENOMEM;
        } else if (asprintf(&a, "agent:%s", id) < 0)
                return -ENOMEM;
        *ret = a;
        return 0;
}

/* ---- its network namespace ---- */

struct netns_gone {
        char name[NETNS_NAME_MAX];
        unsigned index;
};

static int netns_gone_work(void *userdata) {
        struct netns_gone *g = userdata;

        return netns_child_destroy(g->name);
}

static void netns_gone_done(int r, void *userdata) {
        struct netns_gone *g = userdata;

        if (r < 0)
                log_warning_errno(r, "Failed to remove the network namespace %s: %m", g->name);
        netns_release(g->index);
        free(g);
}

/* Removes a namespace forkd made, off the event loop (it is netlink work)
 * unless the daemon stops: then here, before it exits. */
void sandbox_netns_destroy(Manager *m, const char *name, unsigned index) {
        struct netns_gone *g;
        int r;

        g = m->freeing || !m->workers ? NULL : calloc(1, sizeof(*g));
        if (g) {
                snprintf(g->name, sizeof(g->name), "%s", name);
                g->index = index;
                if (worker_pool_submit(m->workers, netns_gone_work, netns_gone_done, g) >= 0)
                        return;
                free(g);
        }
        r = netns_child_destroy(name);
        if (r < 0)
                log_warning_errno(r, "Failed to remove the network namespace %s: %m", name);
        netns_release(index);
}

Sandbox *sandbox_free(Sandbox *s) {
        Manager *m;

        if (!s)
                return NULL;
        m = s->manager;
        if (hashmap_get(m->sandboxes, s->id) == s)
                hashmap_remove(m->sandboxes, s->id);
        if (hashmap_get(m->vms, s->vm_id) == s)
                hashmap_remove(m->vms, s->vm_id);
        if (s->template)
                vm_template_remove_sandbox(s->template, s);

        /* Its record goes (and its cgroup is on its way) before a Terminate or
         * a merge waiting for this is answered. */
        if (!m->freeing) {
                char path[4096];

                snprintf(path, sizeof(path), "%s/%s.json", m->sandboxes_dir, s->vm_id);
                if (unlink(path) < 0 && errno != ENOENT)
                        log_warning_errno(errno, "Failed to remove %s: %m", path);
                if (s->has_cgroup) {
                        int r = cgroup_remove(m->cgroups, s->vm_id);
                        if (r < 0)
                                log_warning_errno(r, "Failed to remove the cgroup of %s: %m", s->vm_id);
                }
        }

        s->io_source = sd_event_source_disable_unref(s->io_source);
        s->timer_source = sd_event_source_disable_unref(s->timer_source);
        s->deadline_source = sd_event_source_disable_unref(s->deadline_source);
        for (unsigned i = 0; i < s->n_terminate_waiters; i++) {
                (void) sd_bus_reply_method_return(s->terminate_waiters[i], NULL);
                sd_bus_message_unref(s->terminate_waiters[i]);
        }
        s->n_terminate_waiters = 0;
        for (unsigned i = 0; i < s->n_terminate_groups; i++)
                terminate_group_done(s->terminate_groups[i]);
        s->n_terminate_groups = 0;
        if (s->retire_reply) {
                /* The merge or pause that retired it: answered now that its VM is gone. */
                (void) sd_bus_send(NULL, s->retire_reply, NULL);
                s->retire_reply = sd_bus_message_unref(s->retire_reply);
        }
        fail_all_calls(s, -ECONNRESET);
        /* Its VMM is gone (or killed, at shutdown): another may have its id. */
        uid_range_free(&m->vmm_uids, s->vmm_uid);
        m->hooks->sandbox_gone(s);
        s->control_source = sd_event_source_disable_unref(s->control_source);
        s->control_timer = sd_event_source_disable_unref(s->control_timer);
        s->control_fd = safe_close(s->control_fd);
        fka_client_free(s->client);
        safe_close(s->agent_fd);
        /* Its VMM is gone or going (its tap keeps the namespace alive until then):
         * the namespace goes, also when forkd stops (the record stays for the
         * next start, which finds nothing left to remove). */
        if (s->netns_owned)
                sandbox_netns_destroy(m, s->netns, s->netns_index);

        s->stats = usage_stats_page_free(s->stats);
        usage_files_close(&s->usage_files);
        free(s->cpu_stat_path);
        sandbox_free_strings(s);
        free(s);
        return NULL;
}

void sandbox_read_usage(Sandbox *s, SandboxUsage *ret) {
        /* Its cgroup once: the VMM joined it before it answered (has_cgroup). */
        if (s->has_cgroup && !s->cpu_stat_looked_up && s->state == SANDBOX_RUNNING && s->pid > 0) {
                s->cpu_stat_looked_up = true;
                if (cgroup_cpu_stat_path(s->manager->cgroups, s->vm_id, &s->cpu_stat_path) < 0 &&
                    usage_cpu_stat_path((pid_t) s->pid, s->vm_id, &s->cpu_stat_path) < 0)
                        s->cpu_stat_path = NULL;
        }
        usage_read((pid_t) s->pid, s->has_cgroup ? s->cpu_stat_path : NULL, s->stats, &s->usage_files, ret);
        if (!s->has_cgroup)
                ret->have_cpu_throttled = false; /* the template's cgroup: not its own */
}

void sandbox_exited(Sandbox *s, int code, int sig) {
        Manager *m = s->manager;
        const char *reason;
        uint64_t ooms = 0;
        VmTemplate *t = s->template;
        ForkOp *f = NULL;

        /* Asked for every exit: the scope backend accounts each kill to one sandbox. */
        if (s->has_cgroup && cgroup_oom_kills(m->cgroups, s->vm_id, &ooms) < 0)
                ooms = 0;
        if (s->stopped)
                reason = "daemon-stop";
        else if (s->timed_out)
                reason = "timeout";
        else if (s->killed)
                reason = "terminated";
        else if (ooms > 0)
                reason = "oom-killed";
        else if (sig != 0 || code != 0)
                reason = "crashed";
        else
                reason = "exited";

        if (s->retired) {
                /* Its id lives on in the merge's winner: nothing to announce. */
                log_debug("The VM %s that sandbox %s had before its merge is gone.", s->vm_id, s->id);
        } else if (s->state == SANDBOX_STARTING) {
                log_debug("Sandbox %s ended before it was ready (%s, code %d, signal %d).", s->id, reason, code, sig);
                if (s->fork_op && m->hooks->fork_child_exited(s->fork_op, s, code, sig))
                        f = s->fork_op; /* its ping is over: count it once it is gone */
        } else {
                if (sig == SIGSYS)
                        log_warning("The VMM of sandbox %s made a system call its seccomp filter forbids, and was "
                                    "killed.", s->id);
                log_info("Sandbox %s removed: %s (code %d, signal %d).", s->id, reason, code, sig);
                m->hooks->sandbox_removed(s, reason);
        }
        _cleanup_free_ char *forkds_tag = m->hooks->snapshot_is_forkds(s->snapshot_tag) ? strdup(s->snapshot_tag) : NULL;
        sandbox_free(s);
        if (forkds_tag)
                m->hooks->snapshot_released(m, forkds_tag);
        if (f)
                m->hooks->fork_child_gone(f);
        if (t)
                vm_template_maybe_gc(t);
        manager_check_idle_exit(m);
}

bool sandbox_is_visible(const Sandbox *s) {
        return s->state == SANDBOX_RUNNING || s->state == SANDBOX_TERMINATING;
}

void terminate_group_free(TerminateGroup *g) {
        if (!g)
                return;
        sd_bus_message_unref(g->message);
        strv_free(g->unknown);
        free(g);
}

void terminate_group_done(TerminateGroup *g) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;

        assert(g->pending > 0);
        if (--g->pending > 0)
                return;
        if (sd_bus_message_new_method_return(g->message, &reply) >= 0 &&
            sd_bus_message_append_strv(reply, g->unknown) >= 0)
                (void) sd_bus_send(NULL, reply, NULL);
        else
                (void) sd_bus_reply_method_errno(g->message, ENOMEM, NULL);
        terminate_group_free(g);
}

const char *deadline_format(uint64_t expires_at, char buf[static 64]) {
        time_t secs = (time_t) (expires_at / 1000000);
        struct tm tm;

        if (expires_at == 0 || !gmtime_r(&secs, &tm)) {
                buf[0] = 0;
                return buf;
        }
        snprintf(buf, 64, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                 tm.tm_hour, tm.tm_min, tm.tm_sec, (unsigned) (expires_at % 1000000 / 1000));
        return buf;
}

static int on_deadline(sd_event_source *es, uint64_t usec, void *userdata) {
        Sandbox *s = userdata;
        int r;

        s->deadline_source = sd_event_source_disable_unref(s->deadline_source);
        if (s->killed || s->retired)
                return 0;
        if (s->timeout_pause) {
                if (s->pausing)
                        return 0;
                r = s->manager->hooks->pause(s);
                if (r >= 0) {
                        log_info("Sandbox %s reached its deadline: pausing it.", s->id);
                        return 0;
                }
                log_warning_errno(r, "Sandbox %s reached its deadline and cannot be paused, killing it: %m", s->id);
        } else
                log_info("Sandbox %s reached its deadline: killing it.", s->id);
        s->timed_out = true;
        (void) sandbox_kill(s);
        return 0;
}

int sandbox_set_deadline(Sandbox *s, uint64_t expires_at, bool pause) {
        int r;

        s->expires_at = expires_at;
        s->timeout_pause = pause;
        if (expires_at == 0) {
                s->deadline_source = sd_event_source_disable_unref(s->deadline_source);
                return 0;
        }
        if (s->deadline_source) {
                r = sd_event_source_set_time(s->deadline_source, expires_at);
                if (r >= 0)
                        r = sd_event_source_set_enabled(s->deadline_source, SD_EVENT_ONESHOT);
                return r;
        }
        /* Within 100 ms of the deadline; wall clock, as the caller sees expires_at. */
        r = sd_event_add_time(s->manager->event, &s->deadline_source, CLOCK_REALTIME, expires_at, 100 * 1000,
                              on_deadline, s);
        if (r >= 0)
                (void) sd_event_source_set_description(s->deadline_source, "sandbox-deadline");
        return r;
}

int sandbox_kill(Sandbox *s) {
        if (s->killed)
                return 0;
        s->killed = true;
        if (s->state == SANDBOX_RUNNING) {
                s->state = SANDBOX_TERMINATING;
                if (!s->retired)
                        s->manager->hooks->sandbox_state_changed(s);
        }
        /* The exit event of the template finishes the job; the kernel tears
         * the VM down off our critical path. */
        if (s->pid > 0 && kill((pid_t) s->pid, SIGKILL) < 0 && errno != ESRCH)
                return -errno;
        return 0;
}

/* ---- agent channel ---- */

static void pump(Sandbox *s, bool hangup);

static int on_agent_timer(sd_event_source *es, uint64_t usec, void *userdata) {
        Sandbox *s = userdata;

        /* The requests that timed out come out of the client as completions:
         * answer them now, the socket may stay silent for ever. */
        (void) fka_client_expire(s->client, fka_now_usec());
        pump(s, s->hangup_seen);
        update_io(s);
        return 0;
}

/* Hand out at most AGENT_COMPLETIONS_PER_DISPATCH completions, so that a guest
 * that floods its channel (events, answers) cannot hold the event loop: if
 * more may be waiting, s->pump_again arms the timer to come back at once,
 * after the other sources had their turn. With no request waiting, read only
 * after a hang-up (to see the end of the stream): what the guest sends unasked
 * stays in the socket. */
static void pump(Sandbox *s, bool hangup) {
        s->pump_again = false;
        for (unsigned k = 0;; k++) {
                fka_completion comp = {};
                struct agent_call *c;
                int r;

                if (!hangup && fka_client_in_flight(s->client) == 0)
                        return;
                if (k >= AGENT_COMPLETIONS_PER_DISPATCH) {
                        s->pump_again = true;
                        return;
                }
                r = fka_client_next(s->client, &comp);

                if (r < 0) {
                        /* Broken: every call came out already. Stop watching. */
                        s->agent_error = r;
                        if (s->io_source)
                                (void) sd_event_source_set_enabled(s->io_source, SD_EVENT_OFF);
                        fail_all_calls(s, r);
                        return;
                }
                if (r == 0) {
                        /* Stopped short of EAGAIN: no new edge may come for the rest. */
                        if (fka_client_yielded(s->client))
                                s->pump_again = true;
                        return;
                }
                c = comp.userdata;
                if (c) {
                        call_unlink(s, c);
                        if (comp.error >= 0 && c->started_usec > 0)
                                histogram_observe(&s->manager->agent_call, now_usec() - c->started_usec);
                        c->cb(comp.error, comp.type, comp.json, comp.obj, c->userdata);
                        free(c);
                }
                fka_completion_done(&comp);
        }
}

static int on_agent_io(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        Sandbox *s = userdata;

        if (revents & (EPOLLHUP | EPOLLERR))
                s->hangup_seen = true;
        pump(s, s->hangup_seen);
        update_io(s);
        return 0;
}

static void update_io(Sandbox *s) {
        uint64_t deadline;
        short ev;

        if (!s->io_source || sd_event_source_get_enabled(s->io_source, NULL) <= 0)
                return;
        /* Read only while a request waits for its answer: what a guest sends
         * unasked (events, floods) then stays in the VMM's bounded backlog and
         * costs forkd nothing. A hang-up is reported whatever the mask. */
        ev = fka_client_events(s->client);
        (void) sd_event_source_set_io_events(s->io_source,
                                             (fka_client_in_flight(s->client) > 0 ? EPOLLIN : 0) |
                                             ((ev & POLLOUT) ? EPOLLOUT : 0) | AGENT_EPOLL_FLAGS);

        deadline = s->pump_again ? 1 : fka_client_next_deadline(s->client);
        if (deadline == UINT64_MAX) {
                if (s->timer_source)
                        (void) sd_event_source_set_enabled(s->timer_source, SD_EVENT_OFF);
                return;
        }
        if (!s->timer_source) {
                if (sd_event_add_time(s->manager->event, &s->timer_source, CLOCK_MONOTONIC, deadline, 1000,
                                      on_agent_timer, s) < 0)
                        return;
                (void) sd_event_source_set_description(s->timer_source, "agent-timeout");
        } else {
                (void) sd_event_source_set_time(s->timer_source, deadline);
                (void) sd_event_source_set_enabled(s->timer_source, SD_EVENT_ONESHOT);
        }
}

int sandbox_call(Sandbox *s, const char *json, uint64_t timeout_usec, agent_reply_t cb, void *userdata) {
        struct agent_call *c;
        int r;

        if (!s->io_source) {
                r = watch_agent(s);
                if (r < 0)
                        return r;
        } else if (sd_event_source_get_enabled(s->io_source, NULL) <= 0)
                /* the channel broke: the VM is gone or going (-ECONNRESET), or the
                 * guest sent what no agent sends (-EBADMSG, -EPROTO) */
                return s->agent_error < 0 ? s->agent_error : -ECONNRESET;

        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        *c = (struct agent_call) { .cb = cb, .userdata = userdata, .started_usec = now_usec() };
        r = fka_client_send(s->client, json, SIZE_MAX, fka_now_usec() + timeout_usec, c);
        if (r < 0) {
                free(c);
                return r;
        }
        call_link(s, c);
        /* Completions come out of the loop, never from here. */
        update_io(s);
        return 0;
}

/* ---- merge ---- */

int sandbox_merge(Sandbox *p, Sandbox *w, char **ret_old_id) {
        Manager *m = p->manager;
        _cleanup_free_ char *id = NULL, *addr = NULL, *json = NULL, *name = NULL;
        struct sandbox_params rec = {
                .id = p->id, .vm_id = w->vm_id, .snapshot_tag = w->snapshot_tag, .created_at = w->created_at,
                .memory_limit_mib = w->memory_limit_mib, .has_cgroup = w->has_cgroup, .live_fork = w->live_fork,
                .owner_uid = p->owner_uid, /* the id keeps its owner */
                .netns = w->netns, .netns_owned = w->netns_owned,
        };
        char *old_id;
        int r;

        if (p == w || p->retired || w->retired)
                return -EINVAL;
        id = strdup(p->id);
        if (!id)
                return -ENOMEM;
        if (strncmp(w->guest_addr, "agent:", 6) != 0)
                addr = strdup(w->guest_addr); /* its own TCP address: the VM stays */
        else if (asprintf(&addr, "agent:%s", p->id) < 0)
                addr = NULL;
        if (!addr)
                return -ENOMEM;
        if (asprintf(&name, "%s.json", w->vm_id) < 0) {
                name = NULL;
                return -ENOMEM;
        }
        /* The record of w's VM names its new id, so that after a crash the
         * next start announces the id that was in use. Not synced: a lost
         * update costs only the id in that announcement. */
        r = sandbox_record_format(&rec, &json);
        if (r < 0)
                return r;
        r = write_file_atomic(m->sandboxes_dir, name, json, strlen(json), 0);
        if (r < 0)
                return r;

        hashmap_remove(m->sandboxes, w->id);
        hashmap_remove(m->sandboxes, p->id);
        old_id = w->id;
        w->id = TAKE_PTR(id);
        r = hashmap_put(m->sandboxes, w->id, w);
        if (r < 0) {
                /* Undo (the two entries just freed make room for these). */
                id = w->id;
                w->id = old_id;
                if (hashmap_put(m->sandboxes, w->id, w) < 0 || hashmap_put(m->sandboxes, p->id, p) < 0)
                        log_error("Lost track of sandboxes %s and %s after a failed merge.", p->id, w->id);
                return r;
        }
        free(w->guest_addr);
        w->guest_addr = TAKE_PTR(addr);
        w->owner_uid = p->owner_uid;

        p->retired = true;
        r = sandbox_kill(p);
        if (r < 0)
                log_warning_errno(r, "Failed to kill the VM %s that %s had before the merge: %m", p->vm_id, p->id);
        log_info("Sandbox %s merged into %s: %s now drives VM %s (pid %" PRIu32 ").", old_id, p->id, w->id,
                 w->vm_id, w->pid);
        *ret_old_id = old_id;
        return 0;
}

/* ---- records ---- */

int sandbox_record_format(const struct sandbox_params *p, char **ret) {
        _cleanup_json_ struct json_object *o = json_object_new_object();
        char *s;

        if (!o)
                return -ENOMEM;
        if (p->vm_id && strcmp(p->vm_id, p->id) != 0 &&
            json_object_object_add(o, "vm_id", json_object_new_string(p->vm_id)) < 0)
                return -ENOMEM;
        if (json_object_object_add(o, "id", json_object_new_string(p->id)) < 0 ||
            json_object_object_add(o, "snapshot_tag", json_object_new_string(p->snapshot_tag)) < 0 ||
            json_object_object_add(o, "created_at_unix", json_object_new_int64((int64_t) p->created_at)) < 0 ||
            json_object_object_add(o, "memory_limit_mib", json_object_new_int64(p->memory_limit_mib)) < 0 ||
            json_object_object_add(o, "owner_uid", json_object_new_int64((int64_t) p->owner_uid)) < 0 ||
            json_object_object_add(o, "cgroup", json_object_new_boolean(p->has_cgroup)) < 0)
                return -ENOMEM;
        /* Only a namespace forkd made: the next start removes it. */
        if (p->netns_owned && p->netns && json_object_object_add(o, "netns", json_object_new_string(p->netns)) < 0)
                return -ENOMEM;
        s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
        if (!s)
                return -ENOMEM;
        *ret = s;
        return 0;
}

struct record {
        char id[SNAPSHOT_TAG_MAX + 1];
        char vm_id[SNAPSHOT_TAG_MAX + 1]; /* "": id; the file is named after it */
        char snapshot_tag[SNAPSHOT_TAG_MAX + 1];
        int64_t created_at_unix;
        uint32_t memory_limit_mib;
        uint32_t owner_uid; /* absent (a record of an older forkd): root */
        bool cgroup;
        char netns[NETNS_NAME_MAX]; /* "": none of forkd's */
};

static const struct json_dispatch record_table[] = {
        { "id", JSON_KIND_STRING, NULL, offsetof(struct record, id), JSON_FIELD_SIZE(struct record, id), JSON_MANDATORY },
        { "vm_id", JSON_KIND_STRING, NULL, offsetof(struct record, vm_id), JSON_FIELD_SIZE(struct record, vm_id), 0 },
        { "snapshot_tag", JSON_KIND_STRING, NULL, offsetof(struct record, snapshot_tag),
          JSON_FIELD_SIZE(struct record, snapshot_tag), JSON_MANDATORY },
        { "created_at_unix", JSON_KIND_INT64, NULL, offsetof(struct record, created_at_unix), 0, 0 },
        { "memory_limit_mib", JSON_KIND_UINT32, NULL, offsetof(struct record, memory_limit_mib), 0, 0 },
        { "owner_uid", JSON_KIND_UINT32, NULL, offsetof(struct record, owner_uid), 0, 0 },
        { "cgroup", JSON_KIND_BOOL, NULL, offsetof(struct record, cgroup), 0, JSON_MANDATORY },
        { "netns", JSON_KIND_STRING, NULL, offsetof(struct record, netns), JSON_FIELD_SIZE(struct record, netns), 0 },
        {},
};

static int cleanup_record(Manager *m, const char *name) {
        _cleanup_free_ char *path = NULL, *text = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct record rec = {};
        const char *field = NULL;
        size_t len;
        int r;

        if (asprintf(&path, "%s/%s", m->sandboxes_dir, name) < 0)
                return -ENOMEM;
        r = read_small_file(path, RECORD_MAX, &text, &len);
        if (r >= 0)
                r = json_parse_strict(text, len, RECORD_MAX, 2, &o, NULL);
        if (r >= 0)
                r = json_dispatch(o, record_table, JSON_REJECT_UNKNOWN, &rec, &field);
        if (r >= 0 && !rec.vm_id[0])
                strcpy(rec.vm_id, rec.id);
        if (r >= 0 && (!snapshot_tag_is_valid(rec.id) || !snapshot_tag_is_valid(rec.vm_id) ||
                       strlen(rec.vm_id) + 5 != strlen(name) || strncmp(rec.vm_id, name, strlen(rec.vm_id)) != 0))
                r = -EINVAL;
        if (r >= 0 && rec.netns[0] && netns_child_index_from_name(rec.netns, &(unsigned) { 0 }) < 0)
                r = -EINVAL, field = "netns";
        if (r < 0)
                log_warning_errno(r, "Ignoring broken sandbox record %s%s%s: %m", path, field ? ", field " : "",
                                  field ?: "");
        else {
                char **l;

                /* Its VMM died with the previous daemon (PR_SET_PDEATHSIG). */
                log_info("Sandbox %s of %s did not survive the restart of forkd, cleaning up.", rec.id,
                         rec.snapshot_tag);
                if (rec.cgroup) {
                        int k = cgroup_remove(m->cgroups, rec.vm_id);
                        if (k < 0 && k != -EOPNOTSUPP)
                                log_warning_errno(k, "Failed to remove the cgroup of %s: %m", rec.vm_id);
                }
                if (rec.netns[0]) {
                        /* netns_cleanup_leftovers() ran first: usually nothing is left. */
                        int k = netns_child_destroy(rec.netns);
                        if (k < 0)
                                log_warning_errno(k, "Failed to remove the network namespace %s of %s: %m",
                                                  rec.netns, rec.vm_id);
                }
                /* The record stays until its SandboxRemoved is on the bus
                 * (manager_announce_restart()): a forkd killed again before that
                 * announces it at its next start. */
                l = realloc(m->stale_ids, (m->n_stale_ids + 1) * sizeof(char *));
                if (l)
                        m->stale_ids = l;
                l = l ? realloc(m->stale_records, (m->n_stale_ids + 1) * sizeof(char *)) : NULL;
                if (l) {
                        m->stale_records = l;
                        m->stale_ids[m->n_stale_ids] = strdup(rec.id);
                        m->stale_records[m->n_stale_ids] = m->stale_ids[m->n_stale_ids] ? TAKE_PTR(path) : NULL;
                        if (m->stale_records[m->n_stale_ids]) {
                                m->n_stale_ids++;
                                return 0;
                        }
                        free(m->stale_ids[m->n_stale_ids]);
                }
        }
        if (unlink(path) < 0 && errno != ENOENT)
                return log_warning_errno(errno, "Failed to remove %s: %m", path);
        return 0;
}

int sandbox_cleanup_records(Manager *m) {
        DIR *d = opendir(m->sandboxes_dir);
        struct dirent *de;

        if (!d)
                return -errno;
        while ((de = readdir(d))) {
                size_t l = strlen(de->d_name);

                if (de->d_name[0] == '.') {
                        /* A temporary file of an interrupted write. */
                        if (strncmp(de->d_name, ".#", 2) == 0)
                                (void) unlinkat(dirfd(d), de->d_name, 0);
                        continue;
                }
                if (l < 6 || strcmp(de->d_name + l - 5, ".json") != 0)
                        continue;
                (void) cleanup_record(m, de->d_name);
        }
        closedir(d);
        return 0;
}
