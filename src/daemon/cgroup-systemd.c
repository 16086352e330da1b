/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The systemd-scope backend: each sandbox in a transient scope
 * forkd-<id>.scope in forkd.slice (MemoryMax=, Delegate=yes), started with
 * StartTransientUnit and tracked through JobRemoved, its VMM in the sub-cgroup
 * <scope>/<id>; a fork template in forkd-tpl-<pid>.scope. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cgroup-backend.h"
#include "fork-options.h"
#include "fs-util.h"
#include "macro.h"
#include "snapshot-meta.h"
#include "time-util.h"

/* How long systemd may take to start a sandbox's scope (StartTransientUnit, then the job's
 * JobRemoved) before the fork that waits for it fails instead of waiting for ever. */
#define SCOPE_START_TIMEOUT_USEC (90 * USEC_PER_SEC)
/* How long a fork template waits for systemd's job to move it into its scope. */
#define TEMPLATE_SCOPE_WAIT_MS 5000u

struct scope_unit {
        CGroupManager *manager;
        char id[SNAPSHOT_TAG_MAX + 1];
        char unit[SNAPSHOT_TAG_MAX + 32];
        char *job;          /* job path while starting */
        char *cgroup;       /* the scope's cgroup holding the memory limit, once started */
        char *track[4];     /* the scope's cgroups in the other hierarchies (unified, name=systemd) */
        unsigned n_track;
        pid_t placeholder;  /* keeps the scope populated until the sandbox is removed */
        sd_bus_slot *slot;  /* the StartTransientUnit call */
        sd_event_source *start_timer; /* SCOPE_START_TIMEOUT_USEC, while starting */
        cgroup_prepare_done_t done;
        void *userdata;     /* NULL once done() was called or cancelled */
        struct scope_unit *next;
};

static void scope_kill_placeholder(struct scope_unit *u) {
        if (u->placeholder <= 0)
                return;
        (void) kill(u->placeholder, SIGKILL);
        (void) waitpid(u->placeholder, NULL, 0); /* a process that only sleeps dies at once */
        u->placeholder = 0;
}

static struct scope_unit *scope_unit_free(struct scope_unit *u) {
        if (!u)
                return NULL;
        scope_kill_placeholder(u);
        sd_bus_slot_unref(u->slot);
        sd_event_source_disable_unref(u->start_timer);
        free(u->job);
        free(u->cgroup);
        for (unsigned i = 0; i < u->n_track; i++)
                free(u->track[i]);
        free(u);
        return NULL;
}

static void scope_unlink(CGroupManager *c, struct scope_unit *u) {
        for (struct scope_unit **p = &c->units; *p; p = &(*p)->next)
                if (*p == u) {
                        *p = u->next;
                        return;
                }
}

static struct scope_unit *scope_find(CGroupManager *c, const char *id) {
        for (struct scope_unit *u = c->units; u; u = u->next)
                if (strcmp(u->id, id) == 0)
                        return u;
        return NULL;
}

static void scope_finish(struct scope_unit *u, int r) {
        cgroup_prepare_done_t done = u->done;
        void *userdata = u->userdata;

        u->done = NULL;
        u->userdata = NULL;
        u->start_timer = sd_event_source_disable_unref(u->start_timer);
        if (done)
                done(r, u->id, r >= 0 ? u->cgroup : NULL, userdata);
}

static int on_scope_start_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        struct scope_unit *u = userdata;

        log_warning("systemd has not started %s within %llu s (%s); giving up on it.", u->unit,
                    SCOPE_START_TIMEOUT_USEC / USEC_PER_SEC,
                    u->job ? "its job did not finish" : "StartTransientUnit did not return");
        scope_finish(u, -ETIMEDOUT);
        return 0;
}

/* Where the placeholder sits, in every hierarchy in which the scope has a cgroup
 * of its own: the memory one (v2: the unified hierarchy; v1: the memory
 * hierarchy, with systemd applying MemoryMax= as memory.limit_in_bytes) holds
 * the limit; the others (the unified hierarchy of a hybrid layout, name=systemd)
 * are how systemd tracks the scope, so the VMM joins those too. */
static int scope_read_cgroup(struct scope_unit *u) {
        CGroupManager *c = u->manager;
        _cleanup_free_ char *text = NULL;
        char path[64], sub[4200];
        char *line, *next;
        size_t ul = strlen(u->unit);
        int r;

        snprintf(path, sizeof(path), "/proc/%d/cgroup", (int) u->placeholder);
        r = read_small_file(path, 64 * 1024, &text, NULL);
        if (r < 0)
                return r;
        for (line = text; line && *line; line = next) {
                char *ctrl, *cg, *dir = NULL;
                const char *mnt;
                bool is_memory;
                size_t cl;

                next = strchr(line, '\n');
                if (next)
                        *next++ = 0;
                ctrl = strchr(line, ':');
                if (!ctrl)
                        continue;
                ctrl++;
                cg = strchr(ctrl, ':');
                if (!cg)
                        continue;
                *cg++ = 0;
                cl = strlen(cg);
                /* Only the hierarchies where the scope is realized. */
                if (cl <= ul || cg[cl - ul - 1] != '/' || strcmp(cg + cl - ul, u->unit) != 0)
                        continue;
                if (*ctrl == 0) {
                        mnt = c->version == 2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/unified";
                        is_memory = c->version == 2;
                        r = asprintf(&dir, "%s%s", mnt, cg);
                } else if (strcmp(ctrl, "name=systemd") == 0) {
                        is_memory = false;
                        r = asprintf(&dir, "/sys/fs/cgroup/systemd%s", cg);
                } else if (c->version == 1 && cgroup_controllers_have(ctrl, "memory")) {
                        is_memory = true;
                        r = asprintf(&dir, "/sys/fs/cgroup/%s%s", ctrl, cg);
                } else
                        continue;
                if (r < 0)
                        return -ENOMEM;
                if (access(dir, F_OK) < 0) {
                        free(dir);
                        continue;
                }
                /* Delegate=yes: the sub-cgroups are ours to make. The limit sits on the scope. */
                snprintf(sub, sizeof(sub), "%s/%s", dir, u->id);
                if (mkdir(sub, 0755) < 0 && errno != EEXIST) {
                        r = -errno;
                        free(dir);
                        return r;
                }
                if (is_memory && !u->cgroup) {
                        u->cgroup = dir;
                        /* The slice's count before any sandbox of ours was OOM-killed. */
                        if (c->version == 2 && !c->slice_ooms_known &&
                            cgroup_slice_oom_kills(dir, &c->slice_ooms) >= 0)
                                c->slice_ooms_known = true;
                }
                else if (!is_memory && u->n_track < ELEMENTSOF(u->track))
                        u->track[u->n_track++] = dir;
                else
                        free(dir);
        }
        if (!u->cgroup) {
                log_warning("Scope %s has no cgroup in the memory hierarchy.", u->unit);
                return -ENOMEDIUM;
        }
        return 0;
}

static int on_job_removed(sd_bus_message *m, void *userdata, sd_bus_error *ret_error) {
        CGroupManager *c = userdata;
        const char *job, *unit, *result;
        uint32_t jid;
        int r;

        r = sd_bus_message_read(m, "uoss", &jid, &job, &unit, &result);
        if (r < 0)
                return 0;
        for (struct scope_unit *u = c->units; u; u = u->next) {
                if (!u->job || strcmp(u->job, job) != 0)
                        continue;
                free(u->job);
                u->job = NULL;
                if (strcmp(result, "done") != 0) {
                        log_warning("Scope %s failed to start: %s", unit, result);
                        scope_finish(u, -EIO);
                } else
                        scope_finish(u, scope_read_cgroup(u));
                break;
        }
        return 0;
}

static int on_start_reply(sd_bus_message *m, void *userdata, sd_bus_error *ret_error) {
        struct scope_unit *u = userdata;
        const sd_bus_error *e = sd_bus_message_get_error(m);
        const char *job;
        int r;

        u->slot = sd_bus_slot_unref(u->slot);
        if (e) {
                log_warning("StartTransientUnit(%s) failed: %s", u->unit, e->message ?: e->name);
                scope_finish(u, -sd_bus_error_get_errno(e) ?: -EIO);
                return 0;
        }
        r = sd_bus_message_read(m, "o", &job);
        if (r < 0) {
                scope_finish(u, r);
                return 0;
        }
        u->job = strdup(job);
        if (!u->job)
                scope_finish(u, -ENOMEM);
        return 0;
}

static int scope_init(CGroupManager *c) {
        int r;

        r = sd_bus_open_system(&c->system_bus);
        if (r < 0)
                return r;
        r = sd_bus_attach_event(c->system_bus, c->event, 0);
        if (r < 0)
                return r;
        r = sd_bus_match_signal_async(c->system_bus, &c->job_removed_slot, "org.freedesktop.systemd1",
                                      "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager", "JobRemoved",
                                      on_job_removed, NULL, c);
        if (r < 0)
                return r;
        c->cpu = true; /* CPUQuota=: systemd enables the cpu controller where it is needed */
        return sd_bus_call_method_async(c->system_bus, NULL, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                                        "org.freedesktop.systemd1.Manager", "Subscribe", NULL, NULL, NULL);
}

/* CPUQuota= as systemd's property: CPU time per second of wall time. */
static uint64_t cpu_quota_per_sec_usec(double cpus) {
        return cpus < 0 ? UINT64_MAX : cpu_limit_quota_usec(cpus) * (USEC_PER_SEC / CPU_LIMIT_PERIOD_USEC);
}

static int on_set_properties_reply(sd_bus_message *m, void *userdata, sd_bus_error *ret_error) {
        const sd_bus_error *e = sd_bus_message_get_error(m);

        if (e)
                log_warning("Failed to change the limits of %s: %s", (const char *) userdata, e->message);
        free(userdata);
        return 0;
}

/* Runtime properties of the running scope: systemd writes the cgroup files. */
static int scope_set_limits(CGroupManager *c, const char *id, uint64_t memory_bytes, double cpus) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        struct scope_unit *u = scope_find(c, id);
        char *unit;
        int r;

        if (!u || !u->cgroup)
                return -ENOENT;
        r = sd_bus_message_new_method_call(c->system_bus, &m, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                                           "org.freedesktop.systemd1.Manager", "SetUnitProperties");
        if (r >= 0)
                r = sd_bus_message_append(m, "sb", u->unit, 1);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "(sv)");
        if (r >= 0 && memory_bytes > 0)
                r = sd_bus_message_append(m, "(sv)", "MemoryMax", "t", memory_bytes);
        if (r >= 0 && cpus != 0)
                r = sd_bus_message_append(m, "(sv)", "CPUQuotaPerSecUSec", "t", cpu_quota_per_sec_usec(cpus));
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return r;
        unit = strdup(u->unit);
        if (!unit)
                return -ENOMEM;
        r = sd_bus_call_async(c->system_bus, NULL, m, on_set_properties_reply, unit, 0);
        if (r < 0)
                free(unit);
        return r;
}

static void scope_done(CGroupManager *c) {
        while (c->units) {
                struct scope_unit *u = c->units;
                c->units = u->next;
                scope_unit_free(u);
        }
        c->job_removed_slot = sd_bus_slot_unref(c->job_removed_slot);
        c->system_bus = sd_bus_flush_close_unref(c->system_bus);
}

static int scope_prepare(CGroupManager *c, const char *id, uint64_t limit, double cpus, cgroup_prepare_done_t done,
                         void *userdata, char **ret_parent) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        struct scope_unit *u;
        pid_t parent = getpid();
        char desc[128];
        int r;

        if (scope_find(c, id))
                return -EEXIST;
        u = calloc(1, sizeof(*u));
        if (!u)
                return -ENOMEM;
        u->manager = c;
        snprintf(u->id, sizeof(u->id), "%s", id);
        snprintf(u->unit, sizeof(u->unit), "forkd-%s.scope", id);
        u->done = done;
        u->userdata = userdata;

        /* A scope is created around existing processes: a placeholder holds it
         * until the VMM child has joined its sub-cgroup. */
        u->placeholder = fork();
        if (u->placeholder < 0) {
                r = -errno;
                u->placeholder = 0;
                goto fail;
        }
        if (u->placeholder == 0) {
                (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != parent)
                        _exit(0);
                for (;;)
                        pause();
        }

        snprintf(desc, sizeof(desc), "forkd sandbox %s", id);
        r = sd_bus_message_new_method_call(c->system_bus, &m, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                                           "org.freedesktop.systemd1.Manager", "StartTransientUnit");
        if (r >= 0)
                r = sd_bus_message_append(m, "ss", u->unit, "fail");
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "(sv)");
        if (r >= 0)
                r = sd_bus_message_append(m, "(sv)(sv)(sv)(sv)(sv)",
                                          "Description", "s", desc,
                                          "Slice", "s", "forkd.slice",
                                          "PIDs", "au", 1, (uint32_t) u->placeholder,
                                          "Delegate", "b", 1,
                                          "CollectMode", "s", "inactive-or-failed");
        if (r >= 0 && limit > 0)
                r = sd_bus_message_append(m, "(sv)", "MemoryMax", "t", limit);
        /* cpu_limit alone: the scope still needs its cgroup in the memory
         * hierarchy, which the VMM joins (cgroup v1 has one only with
         * accounting on). */
        if (r >= 0 && limit == 0)
                r = sd_bus_message_append(m, "(sv)", "MemoryAccounting", "b", 1);
        if (r >= 0 && cpus > 0)
                r = sd_bus_message_append(m, "(sv)", "CPUQuotaPerSecUSec", "t", cpu_quota_per_sec_usec(cpus));
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r >= 0)
                r = sd_bus_message_append(m, "a(sa(sv))", 0);
        if (r >= 0)
                r = sd_bus_call_async(c->system_bus, &u->slot, m, on_start_reply, u, 0);
        if (r >= 0)
                r = sd_event_add_time_relative(c->event, &u->start_timer, CLOCK_MONOTONIC,
                                               SCOPE_START_TIMEOUT_USEC, 0, on_scope_start_timeout, u);
        if (r < 0)
                goto fail;

        u->next = c->units;
        c->units = u;
        return 0;
fail:
        scope_unit_free(u);
        return r;
}

static void scope_cancel(CGroupManager *c, void *userdata) {
        for (struct scope_unit *u = c->units; u; u = u->next)
                if (u->userdata == userdata) {
                        u->done = NULL;
                        u->userdata = NULL;
                }
}

/* The VMM joined <memory cgroup>/<id>; make it join the same sub-cgroup in the
 * hierarchies systemd tracks the scope with, so that the unit shows it. The
 * placeholder stays until removal: if the scope emptied when the VMM dies,
 * systemd would stop it and remove its cgroups before the daemon could read
 * the OOM count. */
static void scope_attached(CGroupManager *c, const char *id, pid_t pid) {
        struct scope_unit *u = scope_find(c, id);
        _cleanup_free_ char *procs = NULL;
        char path[4200];

        if (!u || !u->cgroup || u->n_track == 0)
                return;
        snprintf(path, sizeof(path), "%s/%s/cgroup.procs", u->cgroup, u->id);
        if (read_small_file(path, 64 * 1024, &procs, NULL) < 0)
                return;
        for (unsigned i = 0; i < u->n_track; i++) {
                _cleanup_free_ char *copy = strdup(procs);
                char *save = NULL;

                if (!copy)
                        return;
                snprintf(path, sizeof(path), "%s/%s/cgroup.procs", u->track[i], u->id);
                for (char *t = strtok_r(copy, "\n", &save); t; t = strtok_r(NULL, "\n", &save)) {
                        int r = cgroup_write_string_file(path, t);
                        if (r < 0)
                                log_warning_errno(r, "Failed to move %s into %s: %m", t, path);
                }
        }
}

static int scope_oom_kills(CGroupManager *c, const char *id, uint64_t *ret) {
        struct scope_unit *u = scope_find(c, id);
        char path[4200];

        uint64_t a = 0, b = 0;
        int ra, rb;

        if (!u || !u->cgroup)
                return -ENOENT;
        if (c->version == 2) {
                uint64_t slice = 0;
                bool slice_ok;

                /* Hierarchical: counts the kills in <scope>/<id> too. */
                snprintf(path, sizeof(path), "%s/memory.events", u->cgroup);
                ra = cgroup_read_oom_kill_file(path, &a);
                if (!c->slice_ooms_known)
                        return ra < 0 ? ra : (*ret = a, 0);
                slice_ok = ra < 0 && cgroup_slice_oom_kills(u->cgroup, &slice) >= 0;
                *ret = cgroup_attribute_ooms(&c->slice_ooms, ra >= 0, a, slice_ok, slice);
                return ra >= 0 || slice_ok ? 0 : ra;
        }
        /* v1 counts a kill in one memcg only (the victim's on recent kernels, the
         * one over its limit on older ones): add the sub-cgroup and the scope. */
        snprintf(path, sizeof(path), "%s/%s/memory.oom_control", u->cgroup, u->id);
        ra = cgroup_read_oom_kill_file(path, &a);
        snprintf(path, sizeof(path), "%s/memory.oom_control", u->cgroup);
        rb = cgroup_read_oom_kill_file(path, &b);
        if (ra < 0 && rb < 0)
                return ra;
        *ret = (ra >= 0 ? a : 0) + (rb >= 0 ? b : 0);
        return 0;
}

/* Remove the cgroup <dir>/<id> (dir itself when id is NULL); *r keeps the first error. */
static void remove_cgroup_keep_first(CGroupManager *c, const char *dir, const char *id, int *r) {
        char path[4200];
        int k;

        snprintf(path, sizeof(path), "%s%s%s", dir, id ? "/" : "", id ?: "");
        k = cgroup_remove_dir(c, path);
        if (k < 0 && *r == 0)
                *r = k;
}

static void scope_stop_unit(CGroupManager *c, const char *unit) {
        (void) sd_bus_call_method_async(c->system_bus, NULL, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                                        "org.freedesktop.systemd1.Manager", "StopUnit", NULL, NULL, "ss", unit,
                                        "fail");
}

/* The scope of a sandbox of a killed predecessor (from its record): its VMM
 * may have died after systemd found the scope empty in the hierarchy it tracks
 * (the VMM had not yet joined it there) and failed to remove the cgroups the VMM
 * still held. Stop the unit, kill what is left in it, remove its cgroups. */
static int scope_remove_stale(CGroupManager *c, const char *id) {
        static const char *const v1_roots[] = { "/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified",
                                                "/sys/fs/cgroup/systemd" };
        static const char *const v2_roots[] = { "/sys/fs/cgroup" };
        const char *const *roots = c->version == 2 ? v2_roots : v1_roots;
        size_t n_roots = c->version == 2 ? ELEMENTSOF(v2_roots) : ELEMENTSOF(v1_roots);
        char unit[SNAPSHOT_TAG_MAX + 32];
        int r = 0;

        snprintf(unit, sizeof(unit), "forkd-%s.scope", id);
        scope_stop_unit(c, unit);
        for (size_t i = 0; i < n_roots; i++) {
                char dir[4096], sub[4200];

                snprintf(dir, sizeof(dir), "%s/forkd.slice/%s", roots[i], unit);
                if (access(dir, F_OK) < 0)
                        continue;
                snprintf(sub, sizeof(sub), "%s/%s", dir, id);
                for (int pass = 0; pass < 2; pass++) {
                        _cleanup_free_ char *procs = NULL;
                        char file[4300];

                        snprintf(file, sizeof(file), "%s/cgroup.procs", pass == 0 ? sub : dir);
                        if (read_small_file(file, 64 * 1024, &procs, NULL) < 0)
                                continue;
                        for (char *t = procs, *end; *t; t = end) {
                                long pid = strtol(t, &end, 10);
                                if (end == t)
                                        break;
                                if (pid > 1)
                                        (void) kill((pid_t) pid, SIGKILL);
                        }
                }
                log_info("Removing stale cgroup %s.", dir);
                /* The sub-cgroup first; the scope's own one is retried until it is empty. */
                remove_cgroup_keep_first(c, dir, id, &r);
                remove_cgroup_keep_first(c, dir, NULL, &r);
        }
        return r;
}

static int scope_remove(CGroupManager *c, const char *id) {
        struct scope_unit *u = scope_find(c, id);
        int r = 0;

        if (!u)
                return scope_remove_stale(c, id);
        scope_unlink(c, u);
        scope_kill_placeholder(u);
        for (unsigned i = 0; i < u->n_track; i++)
                remove_cgroup_keep_first(c, u->track[i], u->id, &r);
        if (u->cgroup)
                remove_cgroup_keep_first(c, u->cgroup, u->id, &r);
        /* An empty scope is collected by systemd anyway; stop it in case something lingers. */
        scope_stop_unit(c, u->unit);
        scope_unit_free(u);
        return r;
}

static int scope_sweep(CGroupManager *c) {
        /* The scopes of a killed daemon emptied when their VMMs died
         * (PR_SET_PDEATHSIG), and systemd collects empty transient scopes
         * (CollectMode=inactive-or-failed). Nothing to do. */
        return 0;
}

/* A fork template's scope, forkd-tpl-<pid>.scope in forkd.slice, started around
 * it on a bus connection of this call's own (the caller may be a worker thread).
 * The reply comes before systemd's job has moved the pid: wait until
 * /proc/<pid>/cgroup names the scope, so that the children forked next are born
 * in it. An empty scope is collected by systemd (CollectMode=), so nothing needs
 * removing when the template and its children are gone. */
static int scope_template_join(CGroupManager *c, pid_t pid) {
        _cleanup_(sd_bus_flush_close_unrefp) sd_bus *bus = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        char unit[64], desc[64], proc[64], needle[80];
        int r;

        snprintf(unit, sizeof(unit), "forkd-" TEMPLATE_CGROUP_PREFIX "%d.scope", (int) pid);
        snprintf(desc, sizeof(desc), "forkd fork template %d", (int) pid);
        r = sd_bus_open_system(&bus);
        if (r < 0)
                return r;
        r = sd_bus_message_new_method_call(bus, &m, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                                           "org.freedesktop.systemd1.Manager", "StartTransientUnit");
        if (r >= 0)
                r = sd_bus_message_append(m, "ss", unit, "fail");
        if (r >= 0)
                r = sd_bus_message_append(m, "a(sv)", 4,
                                          "Description", "s", desc,
                                          "Slice", "s", "forkd.slice",
                                          "PIDs", "au", 1, (uint32_t) pid,
                                          "CollectMode", "s", "inactive-or-failed");
        if (r >= 0)
                r = sd_bus_message_append(m, "a(sa(sv))", 0);
        if (r < 0)
                return r;
        r = sd_bus_call(bus, m, SCOPE_START_TIMEOUT_USEC, &error, &reply);
        if (r < 0)
                return log_debug_errno(r, "StartTransientUnit(%s) failed: %s", unit, error.message ?: "");

        snprintf(proc, sizeof(proc), "/proc/%d/cgroup", (int) pid);
        snprintf(needle, sizeof(needle), "/%s\n", unit);
        for (unsigned i = 0; i < TEMPLATE_SCOPE_WAIT_MS; i++) {
                _cleanup_free_ char *text = NULL;

                r = read_small_file(proc, 64 * 1024, &text, NULL);
                if (r < 0)
                        return r;
                if (strstr(text, needle))
                        return 0;
                (void) usleep(USEC_PER_MSEC);
        }
        return -ETIMEDOUT;
}

const CGroupBackend cgroup_backend_scope = {
        .name = "systemd-scope",
        .init = scope_init,
        .done = scope_done,
        .prepare = scope_prepare,
        .set_limits = scope_set_limits,
        .cancel = scope_cancel,
        .attached = scope_attached,
        .oom_kills = scope_oom_kills,
        .remove = scope_remove,
        .sweep = scope_sweep,
        .template_join = scope_template_join,
};
