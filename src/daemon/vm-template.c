/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <json-c/json.h>

#include "snapshot-meta.h"
#include "volumes.h"
#include "cgroup.h"
#include "confine.h"
#include "fork-op.h"
#include "image.h"
#include "json-util.h"
#include "macro.h"
#include "sandbox.h"
#include "strv.h"
#include "vm-template.h"
#include "worker.h"

#define TEMPLATE_MSG_MAX (64u << 10)

static int pidfd_open_(pid_t pid) {
        return (int) syscall(SYS_pidfd_open, pid, 0);
}

/* The template process is gone: so goes its cgroup, once its children are. */
static void forget_cgroup(VmTemplate *t) {
        if (t->cgroup_pid <= 0)
                return;
        int r = cgroup_template_remove(t->manager->cgroups, t->cgroup_pid);
        if (r < 0)
                log_warning_errno(r, "Failed to remove the cgroup of template %s: %m", t->tag);
        t->cgroup_pid = 0;
}

int vm_template_get(Image *i, VmTemplate **ret) {
        Manager *m = i->manager;
        VmTemplate *t;

        if (i->template) {
                *ret = i->template;
                return 0;
        }
        t = calloc(1, sizeof(*t));
        if (!t)
                return -ENOMEM;
        t->manager = m;
        t->image = i;
        t->pidfd = -EBADF;
        t->vt.control_fd = -EBADF;
        t->tag = strdup(i->tag);
        t->snapshot_dir = strdup(i->dir);
        if (!t->tag || !t->snapshot_dir || confine_jail_links(m, i, &t->jail_links) < 0) {
                free(t->tag);
                free(t->snapshot_dir);
                free(t);
                return -ENOMEM;
        }
        t->next = m->templates;
        if (m->templates)
                m->templates->prev = t;
        m->templates = t;
        i->template = t;
        *ret = t;
        return 0;
}

int vm_template_new_running(Manager *m, const char *tag, pid_t pid, int control_fd, uint64_t generation,
                            VmTemplate **ret) {
        VmTemplate *t;

        t = calloc(1, sizeof(*t));
        if (!t)
                return -ENOMEM;
        t->manager = m;
        t->pidfd = -EBADF;
        t->tag = strdup(tag);
        t->snapshot_dir = strdup("");
        if (!t->tag || !t->snapshot_dir) {
                free(t->tag);
                free(t->snapshot_dir);
                free(t);
                return -ENOMEM;
        }
        t->vt = (struct vmm_template) { .pid = pid, .control_fd = control_fd, .generation = generation };
        t->next = m->templates;
        if (m->templates)
                m->templates->prev = t;
        m->templates = t;
        *ret = t;
        return 0;
}

VmTemplate *vm_template_free(VmTemplate *t) {
        Manager *m;

        if (!t)
                return NULL;
        m = t->manager;
        if (t->image)
                t->image->template = NULL;
        /* Sandboxes point here; they are freed before templates at shutdown. */
        for (Sandbox *s = t->sandboxes; s; s = s->tpl_next)
                s->template = NULL;
        sd_event_source_disable_unref(t->io_source);
        sd_event_source_disable_unref(t->pid_source);
        safe_close(t->pidfd);
        /* EOF on its control socket makes the template kill its children and exit. */
        safe_close(t->vt.control_fd);
        /* Still running here only at shutdown; the next start sweeps what stays. */
        forget_cgroup(t);
        if (t->prev)
                t->prev->next = t->next;
        else if (m->templates == t)
                m->templates = t->next;
        if (t->next)
                t->next->prev = t->prev;
        uid_range_free(&m->vmm_uids, t->vmm_uid);
        free(t->tag);
        free(t->snapshot_dir);
        strv_free(t->jail_links);
        free(t);
        return NULL;
}

void vm_template_detach_image(VmTemplate *t) {
        t->image = NULL;
        vm_template_maybe_gc(t);
}

void vm_template_add_sandbox(VmTemplate *t, Sandbox *s) {
        s->template = t;
        s->tpl_prev = NULL;
        s->tpl_next = t->sandboxes;
        if (t->sandboxes)
                t->sandboxes->tpl_prev = s;
        t->sandboxes = s;
        t->n_sandboxes++;
}

void vm_template_remove_sandbox(VmTemplate *t, Sandbox *s) {
        if (s->tpl_prev)
                s->tpl_prev->tpl_next = s->tpl_next;
        else
                t->sandboxes = s->tpl_next;
        if (s->tpl_next)
                s->tpl_next->tpl_prev = s->tpl_prev;
        s->tpl_next = s->tpl_prev = NULL;
        s->template = NULL;
        t->n_sandboxes--;
}

void vm_template_handle_event(VmTemplate *t, const char *json) {
        _cleanup_json_ struct json_object *o = NULL;
        struct json_object *ev, *v;
        const char *id;
        int pid, code = -1, sig = 0;
        Sandbox *s;

        if (json_parse_strict(json, strlen(json), TEMPLATE_MSG_MAX, 4, &o, NULL) < 0) {
                log_warning("Template of %s sent a malformed message, ignoring it.", t->tag);
                return;
        }
        if (!json_object_object_get_ex(o, "event", &ev) || !json_object_is_type(ev, json_type_string))
                return; /* a stray reply: nobody waits for it */
        if (strcmp(json_object_get_string(ev), "exit") != 0)
                return;
        if (!json_object_object_get_ex(o, "id", &v) || !json_object_is_type(v, json_type_string))
                return;
        id = json_object_get_string(v);
        if (!json_object_object_get_ex(o, "pid", &v) || !json_object_is_type(v, json_type_int))
                return;
        pid = json_object_get_int(v);
        if (json_object_object_get_ex(o, "code", &v) && json_object_is_type(v, json_type_int))
                code = json_object_get_int(v);
        if (json_object_object_get_ex(o, "signal", &v) && json_object_is_type(v, json_type_int))
                sig = json_object_get_int(v);

        s = hashmap_get(t->manager->vms, id); /* the name it was spawned under */
        if (!s || s->template != t || s->pid != (uint32_t) pid) {
                log_debug("Exit event for unknown child %s (pid %d), ignoring.", id, pid);
                return;
        }
        sandbox_exited(s, code, sig);
}

static void drain_events(VmTemplate *t) {
        _cleanup_free_ char *buf = malloc(TEMPLATE_MSG_MAX + 1);

        if (!buf)
                return;
        while (t->vt.control_fd >= 0) {
                ssize_t n = recv(t->vt.control_fd, buf, TEMPLATE_MSG_MAX + 1, MSG_DONTWAIT);

                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno != EAGAIN)
                                log_debug_errno(errno, "Template control socket of %s: %m", t->tag);
                        return;
                }
                if (n == 0) {
                        /* The template is going away: its pidfd tells when it is gone. */
                        if (t->io_source)
                                (void) sd_event_source_set_enabled(t->io_source, SD_EVENT_OFF);
                        return;
                }
                if ((size_t) n > TEMPLATE_MSG_MAX)
                        continue;
                buf[n] = 0;
                vm_template_handle_event(t, buf);
        }
}

static int on_template_io(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        drain_events(userdata);
        return 0;
}

static void template_died(VmTemplate *t) {
        int status_code = -1;

        /* Events written before it died still tell how its children ended. */
        drain_events(t);
        t->io_source = sd_event_source_disable_unref(t->io_source);
        t->pid_source = sd_event_source_disable_unref(t->pid_source);
        t->pidfd = safe_close(t->pidfd);
        t->vt.control_fd = safe_close(t->vt.control_fd);
        t->vt.pid = 0;
        forget_cgroup(t);
        if (t->image || t->n_sandboxes > 0)
                log_warning("Template of snapshot %s exited; its %u sandbox(es) went with it.", t->tag, t->n_sandboxes);
        /* Its children died with it (PR_SET_PDEATHSIG). */
        while (t->sandboxes)
                sandbox_exited(t->sandboxes, status_code, SIGKILL);
        vm_template_maybe_gc(t);
}

static int on_template_exit(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        VmTemplate *t = userdata;
        siginfo_t si = {};

        int r;

        if (t->vt.pid <= 0)
                return 0;
        r = waitid(P_PID, (id_t) t->vt.pid, &si, WEXITED | WNOHANG);
        if (r < 0 && errno != ECHILD)
                return 0;
        if (r >= 0 && si.si_pid == 0)
                return 0; /* not yet */
        (void) sd_event_source_set_enabled(s, SD_EVENT_OFF);
        if (t->busy) {
                /* The worker finds out by itself; end_work() finishes. */
                t->vt.pid = -t->vt.pid;
                return 0;
        }
        template_died(t);
        return 0;
}

static int attach(VmTemplate *t) {
        int r;

        if (t->pid_source)
                return 0;
        t->pidfd = pidfd_open_(t->vt.pid);
        if (t->pidfd < 0)
                return log_error_errno(errno, "pidfd_open(%d) failed: %m", (int) t->vt.pid);
        r = sd_event_add_io(t->manager->event, &t->pid_source, t->pidfd, EPOLLIN, on_template_exit, t);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(t->pid_source, "template-exit");
        r = sd_event_add_io(t->manager->event, &t->io_source, t->vt.control_fd, EPOLLIN, on_template_io, t);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(t->io_source, "template-control");
        return 0;
}

int vm_template_start(VmTemplate *t, const char *vmm_path, const char *overlay_dir, char **ret_error) {
        int rw_fds[SNAPSHOT_VOLUMES_MAX];
        unsigned n_rw = 0;
        int r;

        /* A snapshot's rw volumes, reopened as it recorded them (volumes.h). */
        r = volumes_open_rw(t->snapshot_dir, rw_fds, &n_rw, ret_error);
        if (r >= 0) {
                r = vmm_client_template_start_links(vmm_path, t->snapshot_dir, overlay_dir, rw_fds, n_rw,
                                                    (const char *const *) t->jail_links, &t->vt, ret_error);
                for (unsigned k = 0; k < n_rw; k++)
                        safe_close(rw_fds[k]);
        }
        if (r < 0) {
                t->vt.pid = 0;
                t->vt.control_fd = -EBADF;
                return r;
        }
        /* Ready and idle: it forks nothing before the spawn request that follows. */
        t->cgroup_tried = false;
        vm_template_join_cgroup(t);
        return r;
}

void vm_template_join_cgroup(VmTemplate *t) {
        if (t->cgroup_tried || t->vt.pid <= 0)
                return;
        t->cgroup_tried = true;
        if (cgroup_template_join(t->manager->cgroups, t->vt.pid) >= 0)
                t->cgroup_pid = t->vt.pid;
}

void vm_template_begin_work(VmTemplate *t) {
        t->busy = true;
        if (t->io_source)
                (void) sd_event_source_set_enabled(t->io_source, SD_EVENT_OFF);
}

void vm_template_end_work(VmTemplate *t) {
        t->busy = false;
        if (t->vt.pid < 0) {
                /* Died while the worker used it. */
                t->vt.pid = 0;
                template_died(t);
                return;
        }
        if (t->vt.pid == 0)
                return;
        if (attach(t) < 0) {
                /* Without a way to watch it, the template is useless: stop it. */
                vm_template_stop(t);
                return;
        }
        (void) sd_event_source_set_enabled(t->io_source, SD_EVENT_ON);
        /* Anything queued meanwhile. */
        drain_events(t);
}

void vm_template_stop(VmTemplate *t) {
        t->io_source = sd_event_source_disable_unref(t->io_source);
        t->vt.control_fd = safe_close(t->vt.control_fd);
        if (t->vt.pid > 0 && !t->pid_source) {
                /* Not watched: kill and reap, it has not forked anything we know of. */
                (void) kill(t->vt.pid, SIGKILL);
                (void) waitpid(t->vt.pid, NULL, 0);
                t->vt.pid = 0;
                forget_cgroup(t);
        }
}

void vm_template_stop_idle(VmTemplate *t) {
        if (t->vt.pid <= 0 || t->busy || t->waiters || t->n_sandboxes > 0)
                return;
        /* It has no child to kill: unwatched, vm_template_stop() kills and reaps
         * it here, so that the next fork of its snapshot finds no process and
         * starts one, never a closed socket. */
        log_debug("Template of snapshot %s (pid %d) stopped, idle.", t->tag, (int) t->vt.pid);
        t->pid_source = sd_event_source_disable_unref(t->pid_source);
        t->pidfd = safe_close(t->pidfd);
        vm_template_stop(t);
}

void vm_template_maybe_gc(VmTemplate *t) {
        if (t->image || t->n_sandboxes > 0 || t->busy || t->waiters)
                return;
        if (t->vt.pid > 0) {
                /* Its pidfd fires once it is gone; then we come back here. */
                vm_template_stop(t);
                if (t->vt.pid > 0)
                        return;
        }
        vm_template_free(t);
}

typedef struct TemplateWarm {
        VmTemplate *t;
        char *vmm_path, *overlay_dir, *error;
        void (*then)(Manager *m, void *userdata);
        void *userdata;
} TemplateWarm;

static int warm_work(void *userdata) {
        TemplateWarm *w = userdata;

        return vm_template_start(w->t, w->vmm_path, w->overlay_dir, &w->error);
}

static void warm_done(int r, void *userdata) {
        TemplateWarm *w = userdata;
        VmTemplate *t = w->t;

        if (r < 0 && !t->image)
                log_debug("The template of %s did not start: its snapshot went meanwhile.", t->tag);
        else if (r < 0)
                log_warning("The template of %s did not start ahead of its first fork (%s); that fork starts it.",
                            t->tag, w->error ?: strerror(-r));
        else
                log_info("Template of %s started ahead of its first fork (pid %d).", t->tag, (int) t->vt.pid);
        vm_template_end_work(t);
        fork_op_run_next(t);
        if (w->then)
                w->then(t->manager, w->userdata);
        vm_template_maybe_gc(t);
        free(w->vmm_path);
        free(w->overlay_dir);
        free(w->error);
        free(w);
}

int vm_template_warm_then(Manager *m, Image *i, void (*then)(Manager *m, void *userdata), void *userdata) {
        TemplateWarm *w;
        VmTemplate *t;
        int r;

        r = vm_template_get(i, &t);
        if (r < 0)
                return r;
        if (t->vt.pid != 0 || t->busy)
                return 0;
        w = calloc(1, sizeof(*w));
        if (!w)
                return -ENOMEM;
        w->t = t;
        w->then = then;
        w->userdata = userdata;
        w->vmm_path = strdup(m->vmm_path);
        w->overlay_dir = strdup(m->overlay_dir);
        if (!w->vmm_path || !w->overlay_dir) {
                r = -ENOMEM;
                goto fail;
        }
        vm_template_begin_work(t);
        r = worker_pool_submit(m->workers, warm_work, warm_done, w);
        if (r < 0) {
                vm_template_end_work(t);
                goto fail;
        }
        return 1;
fail:
        free(w->vmm_path);
        free(w->overlay_dir);
        free(w);
        vm_template_maybe_gc(t);
        return r;
}

int vm_template_warm(Manager *m, Image *i) {
        int r = vm_template_warm_then(m, i, NULL, NULL);

        return r < 0 ? r : 0;
}
