/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The front end of cgroup.h: which backend (cgroup-fs.c, cgroup-systemd.c, or
 * none), the calls the rest of forkd makes, dispatched through its table, the
 * queue of cgroup directories whose removal is retried while their tasks die,
 * and moving a process out of a sandbox's cgroup. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cgroup-backend.h"
#include "cgroup-detect.h"
#include "fs-util.h"
#include "io-util.h"
#include "macro.h"
#include "time-util.h"

#define REMOVAL_RETRY_USEC (20 * USEC_PER_MSEC)
#define REMOVAL_GIVE_UP_USEC (60 * USEC_PER_SEC)

struct cgroup_removal {
        char *path;
        uint64_t deadline;
        struct cgroup_removal *next;
};

int cgroup_write_string_file(const char *path, const char *s) {
        _cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW);

        if (fd < 0)
                return -errno;
        return loop_write(fd, s, strlen(s));
}

bool cgroup_controllers_have(const char *list, const char *name) {
        size_t n = strlen(name);

        for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
                if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == 0))
                        return true;
        return false;
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
                                    (unsigned long long) (REMOVAL_GIVE_UP_USEC / USEC_PER_SEC));
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

int cgroup_remove_dir(CGroupManager *c, const char *path) {
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

/* No memory limits: every call -EOPNOTSUPP, or nothing to do. */
static const CGroupBackend backend_none = {
        .name = "none",
};

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
                c->backend = &cgroup_backend_scope;
                break;
        case CGROUP_BACKEND_CGROUPFS:
                c->backend = &cgroup_backend_cgroupfs;
                c->root = strdup(d.root);
                break;
        default:
                c->backend = &backend_none;
        }
        if (c->backend == &cgroup_backend_cgroupfs && !c->root) {
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
        if (c->backend == &cgroup_backend_cgroupfs)
                log_info("Memory limits: cgroupfs v%d under %s.", c->version, c->root);
        else
                log_info("Memory limits: %s%s.", c->backend->name,
                         c->backend != &cgroup_backend_scope ? "" : c->version == 2 ? " (memory on cgroup v2)" : " (memory on cgroup v1)");
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
        free(c->cpu_root);
        free(c);
        return NULL;
}

bool cgroup_manager_supported(const CGroupManager *c) {
        return c && c->backend->prepare;
}

const char *cgroup_manager_name(const CGroupManager *c) {
        return c->backend->name;
}

int cgroup_prepare(CGroupManager *c, const char *id, uint64_t limit_bytes, double cpus, cgroup_prepare_done_t done,
                   void *userdata, char **ret_parent) {
        if (!c->backend->prepare || (cpus > 0 && !c->cpu))
                return -EOPNOTSUPP;
        return c->backend->prepare(c, id, limit_bytes, cpus, done, userdata, ret_parent);
}

bool cgroup_manager_cpu_supported(const CGroupManager *c) {
        return c && c->backend->prepare && c->cpu;
}

int cgroup_set_limits(CGroupManager *c, const char *id, uint64_t memory_bytes, double cpus) {
        if (!c->backend->set_limits || (cpus != 0 && !c->cpu))
                return -EOPNOTSUPP;
        return c->backend->set_limits(c, id, memory_bytes, cpus);
}

void cgroup_cancel(CGroupManager *c, void *userdata) {
        if (c->backend->cancel)
                c->backend->cancel(c, userdata);
}

void cgroup_attached(CGroupManager *c, const char *id, pid_t pid) {
        if (c->backend->attached && pid > 0)
                c->backend->attached(c, id, pid);
}

int cgroup_cpu_stat_path(CGroupManager *c, const char *id, char **ret) {
        if (!c || !c->cpu_root || c->backend != &cgroup_backend_cgroupfs)
                return -ENOENT;
        return asprintf(ret, "%s/%s/cpu.stat", c->cpu_root, id) < 0 ? -ENOMEM : 0;
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
                _cleanup_close_ int fd = -EBADF;
                char *ctrl, *cg, buf[32];

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
                /* The hierarchies where sandboxes get cgroups: the unified one, systemd's, memory, cpu. */
                if (*ctrl == 0)
                        r = asprintf(&procs, "%s%s/cgroup.procs",
                                     access("/sys/fs/cgroup/unified", F_OK) >= 0 ? "/sys/fs/cgroup/unified" :
                                                                                   "/sys/fs/cgroup",
                                     strcmp(cg, "/") == 0 ? "" : cg);
                else if (strcmp(ctrl, "name=systemd") == 0)
                        r = asprintf(&procs, "/sys/fs/cgroup/systemd%s/cgroup.procs", strcmp(cg, "/") == 0 ? "" : cg);
                else if (cgroup_controllers_have(ctrl, "memory") || cgroup_controllers_have(ctrl, "cpu"))
                        r = asprintf(&procs, "/sys/fs/cgroup/%s%s/cgroup.procs", ctrl, strcmp(cg, "/") == 0 ? "" : cg);
                else
                        continue;
                if (r < 0) {
                        procs = NULL; /* asprintf() leaves it undefined on failure */
                        return -ENOMEM;
                }
                fd = open(procs, O_WRONLY | O_CLOEXEC);
                if (fd < 0)
                        continue;
                snprintf(buf, sizeof(buf), "%d", (int) pid);
                r = loop_write(fd, buf, strlen(buf));
                if (r < 0)
                        log_debug_errno(r, "Failed to move %d to %s: %m", (int) pid, procs);
                else
                        moved++;
        }
        return moved;
}
