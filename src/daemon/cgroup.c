/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>

#include "cgroup.h"
#include "cgroup-detect.h"
#include "fs-util.h"
#include "macro.h"
#include "snapshot-meta.h"

#define REMOVAL_RETRY_USEC (20 * 1000ull)
#define REMOVAL_GIVE_UP_USEC (60 * 1000000ull)
/* How long systemd may take to start a sandbox's scope (StartTransientUnit, then the job's
 * JobRemoved) before the fork that waits for it fails instead of waiting for ever. */
#define SCOPE_START_TIMEOUT_USEC (90 * 1000000ull)
/* How long a fork template waits for systemd's job to move it into its scope. */
#define TEMPLATE_SCOPE_WAIT_MS 5000u

struct cgroup_removal {
        char *path;
        uint64_t deadline;
        struct cgroup_removal *next;
};

/* ---- shared helpers ---- */

static int write_string_file(const char *path, const char *s) {
        _cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW);
        size_t n = strlen(s);

        if (fd < 0)
                return -errno;
        if (write(fd, s, n) != (ssize_t) n)
                return negative_errno();
        return 0;
}

int cgroup_parse_oom_kill(const char *text, uint64_t *ret) {
        for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
                unsigned long long v;
                char *end;

                if (strncmp(p, "oom_kill ", 9) != 0)
                        continue;
                errno = 0;
                v = strtoull(p + 9, &end, 10);
                if (errno != 0 || end == p + 9 || (*end != '\n' && *end != 0))
                        return -EBADMSG;
                *ret = v;
                return 0;
        }
        return -ENODATA;
}

static int read_oom_kill_file(const char *path, uint64_t *ret) {
        _cleanup_free_ char *text = NULL;
        int r = read_small_file(path, 4096, &text, NULL);

        if (r < 0)
                return r;
        return cgroup_parse_oom_kill(text, ret);
}

uint64_t cgroup_attribute_ooms(uint64_t *accounted, bool direct_ok, uint64_t direct, bool slice_ok,
                               uint64_t slice_now) {
        if (direct_ok) {
                *accounted += direct;
                return direct;
        }
        if (slice_ok && slice_now > *accounted) {
                *accounted += 1;
                return 1;
        }
        return 0;
}

/* memory.events of the directory that holds the scope's cgroup (forkd.slice). */
static int slice_oom_kills(const char *scope_cgroup, uint64_t *ret) {
        const char *slash = strrchr(scope_cgroup, '/');
        char path[4200];

        if (!slash || slash == scope_cgroup)
                return -EINVAL;
        snprintf(path, sizeof(path), "%.*s/memory.events", (int) (slash - scope_cgroup), scope_cgroup);
        return read_oom_kill_file(path, ret);
}

static void removal_free_all(CGroupManager *c) {
        while (c->removals) {
                struct cgroup_removal *x = c->removals;
                c->removals = x->next;
                free(x->path);
                free(x);
        }
        c->n_removals = 0;
}

static int on_removal_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        CGroupManager *c = userdata;
        uint64_t now = 0;

        (void) sd_event_now(c->event, CLOCK_MONOTONIC, &now);
        for (struct cgroup_removal **p = &c->removals; *p;) {
                struct cgroup_removal *x = *p;
                bool drop = false;

                if (rmdir(x->path) >= 0 || errno == ENOENT)
                        drop = true;
                else if (errno != EBUSY) {
                        log_warning_errno(errno, "Failed to remove cgroup %s, leaving it: %m", x->path);
                        drop = true;
                } else if (now >= x->deadline) {
                        log_warning("Cgroup %s still holds tasks after %llus, leaving it.", x->path,
                                    (unsigned long long) (REMOVAL_GIVE_UP_USEC / 1000000));
                        drop = true;
                }
                if (drop) {
                        *p = x->next;
                        free(x->path);
                        free(x);
                        c->n_removals--;
                } else
                        p = &x->next;
        }
        if (c->removals) {
                (void) sd_event_source_set_time_relative(s, REMOVAL_RETRY_USEC);
                (void) sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
        }
        return 0;
}

/* rmdir now, or keep retrying from the event loop while tasks are dying. */
static int remove_cgroup_dir(CGroupManager *c, const char *path) {
        struct cgroup_removal *x;
        uint64_t now = 0;
        int r;

        if (rmdir(path) >= 0 || errno == ENOENT)
                return 0;
        if (errno != EBUSY)
                return -errno;

        x = calloc(1, sizeof(*x));
        if (!x)
                return -ENOMEM;
        x->path = strdup(path);
        if (!x->path) {
                free(x);
                return -ENOMEM;
        }
        (void) sd_event_now(c->event, CLOCK_MONOTONIC, &now);
        x->deadline = now + REMOVAL_GIVE_UP_USEC;
        x->next = c->removals;
        c->removals = x;
        c->n_removals++;

        if (!c->removal_timer) {
                r = sd_event_add_time_relative(c->event, &c->removal_timer, CLOCK_MONOTONIC, REMOVAL_RETRY_USEC, 0,
                                               on_removal_timer, c);
                if (r < 0)
                        return r;
                (void) sd_event_source_set_description(c->removal_timer, "cgroup-removal");
        } else {
                (void) sd_event_source_set_time_relative(c->removal_timer, REMOVAL_RETRY_USEC);
                (void) sd_event_source_set_enabled(c->removal_timer, SD_EVENT_ONESHOT);
        }
        return 0;
}

/* ---- cgroupfs (v1 and v2) ---- */

#define TEMPLATE_CGROUP_PREFIX "tpl-"

/* tpl-<digits>: a fork template's cgroup (cgroup_template_join()). */
static bool is_template_cgroup(const char *name) {
        const char *pid;

        if (strncmp(name, TEMPLATE_CGROUP_PREFIX, strlen(TEMPLATE_CGROUP_PREFIX)) != 0)
                return false;
        pid = name + strlen(TEMPLATE_CGROUP_PREFIX);
        return *pid && strspn(pid, "0123456789") == strlen(pid);
}

static int cgroupfs_init(CGroupManager *c) {
        char path[4096];
        int r;

        r = mkdir_parents_and_self(c->root, 0755);
        if (r < 0)
                return log_debug_errno(r, "Failed to create cgroup %s: %m", c->root);
        if (c->version == 2) {
                /* The sandboxes' cgroups need the memory controller from their parent. */
                snprintf(path, sizeof(path), "%s/cgroup.subtree_control", c->root);
                r = write_string_file(path, "+memory");
                if (r < 0)
                        return log_debug_errno(r, "Failed to enable the memory controller in %s: %m", c->root);
        }
        return 0;
}

static int cgroupfs_prepare(CGroupManager *c, const char *id, uint64_t limit, cgroup_prepare_done_t done,
                            void *userdata, char **ret_parent) {
        char dir[4096], file[4200], value[32];
        char *parent;
        int r;

        snprintf(dir, sizeof(dir), "%s/%s", c->root, id);
        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
                return -errno;
        snprintf(value, sizeof(value), "%llu", (unsigned long long) limit);
        if (c->version == 2) {
                snprintf(file, sizeof(file), "%s/memory.max", dir);
                r = write_string_file(file, value);
                if (r >= 0) {
                        /* No swap either, so that the limit is the limit. Optional. */
                        snprintf(file, sizeof(file), "%s/memory.swap.max", dir);
                        (void) write_string_file(file, "0");
                }
        } else {
                snprintf(file, sizeof(file), "%s/memory.limit_in_bytes", dir);
                r = write_string_file(file, value);
                if (r >= 0) {
                        /* memsw must be >= the memory limit, so it comes second. Absent without swap accounting. */
                        snprintf(file, sizeof(file), "%s/memory.memsw.limit_in_bytes", dir);
                        if (access(file, F_OK) >= 0)
                                r = write_string_file(file, value);
                }
        }
        if (r < 0) {
                (void) rmdir(dir);
                return r;
        }
        parent = strdup(c->root);
        if (!parent) {
                (void) rmdir(dir);
                return -ENOMEM;
        }
        *ret_parent = parent;
        return 1;
}

static int cgroupfs_oom_kills(CGroupManager *c, const char *id, uint64_t *ret) {
        char path[4200];

        snprintf(path, sizeof(path), "%s/%s/%s", c->root, id, c->version == 2 ? "memory.events" : "memory.oom_control");
        return read_oom_kill_file(path, ret);
}

static int cgroupfs_remove(CGroupManager *c, const char *id) {
        char dir[4096];

        snprintf(dir, sizeof(dir), "%s/%s", c->root, id);
        return remove_cgroup_dir(c, dir);
}

static int cgroupfs_sweep(CGroupManager *c) {
        DIR *d = opendir(c->root);
        struct dirent *de;
        int r = 0;

        if (!d)
                return errno == ENOENT ? 0 : -errno;
        while ((de = readdir(d))) {
                char dir[4096];

                /* Only what looks like ours: sandbox ids are sb-<hex>-<digits>, templates tpl-<pid>. */
                if (de->d_type != DT_DIR ||
                    !((strncmp(de->d_name, "sb-", 3) == 0 && snapshot_tag_is_valid(de->d_name)) ||
                      is_template_cgroup(de->d_name)))
                        continue;
                snprintf(dir, sizeof(dir), "%s/%s", c->root, de->d_name);
                log_info("Removing stale cgroup %s.", dir);
                int k = remove_cgroup_dir(c, dir);
                if (k < 0 && r == 0)
                        r = k;
        }
        closedir(d);
        return r;
}

/* A fork template's cgroup: <root>/tpl-<pid>, made and joined here. */
static int cgroupfs_template_join(CGroupManager *c, pid_t pid) {
        char dir[4096], file[4200], value[32];
        int r;

        snprintf(dir, sizeof(dir), "%s/" TEMPLATE_CGROUP_PREFIX "%d", c->root, (int) pid);
        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
                return -errno;
        snprintf(file, sizeof(file), "%s/cgroup.procs", dir);
        snprintf(value, sizeof(value), "%d", (int) pid);
        r = write_string_file(file, value);
        if (r < 0)
                (void) rmdir(dir);
        return r;
}

static int cgroupfs_template_remove(CGroupManager *c, pid_t pid) {
        char name[32];

        snprintf(name, sizeof(name), TEMPLATE_CGROUP_PREFIX "%d", (int) pid);
        return cgroupfs_remove(c, name);
}

static const CGroupBackend backend_cgroupfs = {
        .name = "cgroupfs",
        .init = cgroupfs_init,
        .prepare = cgroupfs_prepare,
        .oom_kills = cgroupfs_oom_kills,
        .remove = cgroupfs_remove,
        .sweep = cgroupfs_sweep,
        .template_join = cgroupfs_template_join,
        .template_remove = cgroupfs_template_remove,
};

/* ---- systemd transient scopes ---- */

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
                    SCOPE_START_TIMEOUT_USEC / 1000000ull,
                    u->job ? "its job did not finish" : "StartTransientUnit did not return");
        scope_finish(u, -ETIMEDOUT);
        return 0;
}

static bool controllers_have(const char *list, const char *name) {
        size_t n = strlen(name);

        for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
                if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == 0))
                        return true;
        return false;
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
                } else if (c->version == 1 && controllers_have(ctrl, "memory")) {
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
                            slice_oom_kills(dir, &c->slice_ooms) >= 0)
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
        return sd_bus_call_method_async(c->system_bus, NULL, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                                        "org.freedesktop.systemd1.Manager", "Subscribe", NULL, NULL, NULL);
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

static int scope_prepare(CGroupManager *c, const char *id, uint64_t limit, cgroup_prepare_done_t done,
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
                r = sd_bus_message_append(m, "(sv)(sv)(sv)(sv)(sv)(sv)",
                                          "Description", "s", desc,
                                          "Slice", "s", "forkd.slice",
                                          "PIDs", "au", 1, (uint32_t) u->placeholder,
                                          "MemoryMax", "t", limit,
                                          "Delegate", "b", 1,
                                          "CollectMode", "s", "inactive-or-failed");
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
static void scope_attached(CGroupManager *c, const char *id) {
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
                        int r = write_string_file(path, t);
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
                ra = read_oom_kill_file(path, &a);
                if (!c->slice_ooms_known)
                        return ra < 0 ? ra : (*ret = a, 0);
                slice_ok = ra < 0 && slice_oom_kills(u->cgroup, &slice) >= 0;
                *ret = cgroup_attribute_ooms(&c->slice_ooms, ra >= 0, a, slice_ok, slice);
                return ra >= 0 || slice_ok ? 0 : ra;
        }
        /* v1 counts a kill in one memcg only (the victim's on recent kernels, the
         * one over its limit on older ones): add the sub-cgroup and the scope. */
        snprintf(path, sizeof(path), "%s/%s/memory.oom_control", u->cgroup, u->id);
        ra = read_oom_kill_file(path, &a);
        snprintf(path, sizeof(path), "%s/memory.oom_control", u->cgroup);
        rb = read_oom_kill_file(path, &b);
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
        k = remove_cgroup_dir(c, path);
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
                (void) usleep(1000);
        }
        return -ETIMEDOUT;
}

static const CGroupBackend backend_scope = {
        .name = "systemd-scope",
        .init = scope_init,
        .done = scope_done,
        .prepare = scope_prepare,
        .cancel = scope_cancel,
        .attached = scope_attached,
        .oom_kills = scope_oom_kills,
        .remove = scope_remove,
        .sweep = scope_sweep,
        .template_join = scope_template_join,
};

/* ---- none ---- */

static const CGroupBackend backend_none = {
        .name = "none",
};

/* ---- selection ---- */

int cgroup_manager_new(sd_event *e, const char *root, CGroupManager **ret) {
        CGroupManager *c = calloc(1, sizeof(*c));
        CGroupDetection d;
        int r;

        if (!c)
                return -ENOMEM;
        c->event = sd_event_ref(e);

        /* The choice is cgroup_detect()'s (src/shared/cgroup-detect.c), which forkd doctor shares. */
        r = cgroup_detect(root, &d);
        if (r < 0) {
                log_error_errno(r, "%s is not on a cgroup file system: %m", root ?: "/sys/fs/cgroup");
                goto fail;
        }
        c->version = d.version;
        switch (d.kind) {
        case CGROUP_BACKEND_SCOPE:
                c->backend = &backend_scope;
                break;
        case CGROUP_BACKEND_CGROUPFS:
                c->backend = &backend_cgroupfs;
                c->root = strdup(d.root);
                break;
        default:
                c->backend = &backend_none;
        }
        if (c->backend == &backend_cgroupfs && !c->root) {
                r = -ENOMEM;
                goto fail;
        }

        if (c->backend->init) {
                r = c->backend->init(c);
                if (r < 0) {
                        log_warning_errno(r, "Memory limits are not available (%s backend): %m", c->backend->name);
                        if (c->backend->done)
                                c->backend->done(c);
                        c->backend = &backend_none;
                }
        }
        if (c->backend == &backend_cgroupfs)
                log_info("Memory limits: cgroupfs v%d under %s.", c->version, c->root);
        else
                log_info("Memory limits: %s%s.", c->backend->name,
                         c->backend != &backend_scope ? "" : c->version == 2 ? " (memory on cgroup v2)" : " (memory on cgroup v1)");
        *ret = c;
        return 0;
fail:
        cgroup_manager_free(c);
        return r;
}

CGroupManager *cgroup_manager_free(CGroupManager *c) {
        if (!c)
                return NULL;
        if (c->backend && c->backend->done)
                c->backend->done(c);
        /* Last try for removals still pending; the next start sweeps the rest. */
        for (struct cgroup_removal *x = c->removals; x; x = x->next)
                (void) rmdir(x->path);
        removal_free_all(c);
        sd_event_source_disable_unref(c->removal_timer);
        sd_event_unref(c->event);
        free(c->root);
        free(c);
        return NULL;
}

bool cgroup_manager_supported(const CGroupManager *c) {
        return c && c->backend->prepare;
}

const char *cgroup_manager_name(const CGroupManager *c) {
        return c->backend->name;
}

int cgroup_prepare(CGroupManager *c, const char *id, uint64_t limit_bytes, cgroup_prepare_done_t done,
                   void *userdata, char **ret_parent) {
        if (!c->backend->prepare)
                return -EOPNOTSUPP;
        return c->backend->prepare(c, id, limit_bytes, done, userdata, ret_parent);
}

void cgroup_cancel(CGroupManager *c, void *userdata) {
        if (c->backend->cancel)
                c->backend->cancel(c, userdata);
}

void cgroup_attached(CGroupManager *c, const char *id) {
        if (c->backend->attached)
                c->backend->attached(c, id);
}

int cgroup_oom_kills(CGroupManager *c, const char *id, uint64_t *ret) {
        if (!c->backend->oom_kills)
                return -EOPNOTSUPP;
        return c->backend->oom_kills(c, id, ret);
}

int cgroup_remove(CGroupManager *c, const char *id) {
        if (!c->backend->remove)
                return -EOPNOTSUPP;
        return c->backend->remove(c, id);
}

int cgroup_template_join(CGroupManager *c, pid_t pid) {
        if (!c || !c->backend->template_join || pid <= 0)
                return -EOPNOTSUPP;
        return c->backend->template_join(c, pid);
}

int cgroup_template_remove(CGroupManager *c, pid_t pid) {
        if (!c || !c->backend->template_remove || pid <= 0)
                return 0;
        return c->backend->template_remove(c, pid);
}

int cgroup_sweep(CGroupManager *c) {
        if (!c->backend->sweep)
                return 0;
        return c->backend->sweep(c);
}

unsigned cgroup_pending_removals(const CGroupManager *c) {
        return c ? c->n_removals : 0;
}

int cgroup_detach(CGroupManager *c, pid_t pid) {
        _cleanup_free_ char *text = NULL;
        char *line, *next;
        int r, moved = 0;

        if (!cgroup_manager_supported(c) || pid <= 0)
                return 0;
        r = read_small_file("/proc/self/cgroup", 64 * 1024, &text, NULL);
        if (r < 0)
                return r;
        for (line = text; line && *line; line = next) {
                _cleanup_free_ char *procs = NULL;
                char *ctrl, *cg, buf[32];
                int fd;

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
                /* The hierarchies where sandboxes get cgroups: the unified one, systemd's, memory. */
                if (*ctrl == 0)
                        r = asprintf(&procs, "%s%s/cgroup.procs",
                                     access("/sys/fs/cgroup/unified", F_OK) >= 0 ? "/sys/fs/cgroup/unified" :
                                                                                   "/sys/fs/cgroup",
                                     strcmp(cg, "/") == 0 ? "" : cg);
                else if (strcmp(ctrl, "name=systemd") == 0)
                        r = asprintf(&procs, "/sys/fs/cgroup/systemd%s/cgroup.procs", strcmp(cg, "/") == 0 ? "" : cg);
                else if (controllers_have(ctrl, "memory"))
                        r = asprintf(&procs, "/sys/fs/cgroup/%s%s/cgroup.procs", ctrl, strcmp(cg, "/") == 0 ? "" : cg);
                else
                        continue;
                if (r < 0)
                        return -ENOMEM;
                fd = open(procs, O_WRONLY | O_CLOEXEC);
                if (fd < 0)
                        continue;
                snprintf(buf, sizeof(buf), "%d", (int) pid);
                if (write(fd, buf, strlen(buf)) < 0)
                        log_debug_errno(errno, "Failed to move %d to %s: %m", (int) pid, procs);
                else
                        moved++;
                close(fd);
        }
        return moved;
}
