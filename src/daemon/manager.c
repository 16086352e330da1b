/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "cgroup.h"
#include "confine.h"
#include "fs-util.h"
#include "image.h"
#include "manager.h"
#include "pushpull-op.h"
#include "macro.h"
#include "time-util.h"
#include "polkit.h"
#include "sandbox.h"
#include "vm-template.h"
#include "worker.h"

void random_hex(char *buf, size_t n_digits) {
        static const char hex[] = "0123456789abcdef";
        uint8_t bytes[64];
        size_t n = (n_digits + 1) / 2;

        if (n > sizeof(bytes))
                n = sizeof(bytes);
        if (getrandom(bytes, n, 0) != (ssize_t) n)
                for (size_t i = 0; i < n; i++)
                        bytes[i] = (uint8_t) random();
        for (size_t i = 0; i < n_digits && i / 2 < n; i++)
                buf[i] = hex[(bytes[i / 2] >> ((i & 1) ? 0 : 4)) & 15];
        buf[n_digits] = 0;
}

/* flock_briefly(): 2 s at most. */
#define LOCK_WAIT_TRIES 40u
#define LOCK_WAIT_STEP_USEC (50 * 1000)

int manager_new(Manager **ret) {
        Manager *m = calloc(1, sizeof(*m));
        int r;

        if (!m)
                return -ENOMEM;
        m->lock_fd = -EBADF;
        m->runtime_lock_fd = -EBADF;
        m->direct_fd = -EBADF;
        m->bridge_uid = OWNER_UID_INVALID;
        m->snapshots_watch_fd = -EBADF;
        m->max_operations = OPERATIONS_MAX_DEFAULT;
        m->max_branches = BRANCHES_MAX_DEFAULT;
        m->control_timeout_usec = CONTROL_TIMEOUT_DEFAULT_SEC * USEC_PER_SEC;
        r = netns_prefix_parse(NETNS_DEFAULT_PREFIX, &m->netns_prefix);
        if (r >= 0)
                r = hashmap_new(&m->images);
        if (r >= 0)
                r = hashmap_new(&m->creating);
        if (r >= 0)
                r = hashmap_new(&m->branching);
        if (r >= 0)
                r = hashmap_new(&m->sandboxes);
        if (r >= 0)
                r = hashmap_new(&m->vms);
        if (r >= 0)
                r = hashmap_new(&m->paused);
        if (r >= 0)
                r = sd_event_default(&m->event);
        if (r < 0) {
                manager_free(m);
                return r;
        }
        *ret = m;
        return 0;
}

Manager *manager_free(Manager *m) {
        if (!m)
                return NULL;
        m->exiting = m->freeing = true;

        /* Workers first: after this nobody else touches templates. */
        m->workers = worker_pool_free(m->workers);
        /* After the workers (forks take from it), before the namespaces' users go. */
        m->netns_pool = netns_pool_free(m->netns_pool);
        userns_pool_done(m); /* after the workers too, before the range */
        m->polkit_registry = polkit_registry_free(m->polkit_registry);

        /* Sandboxes before operations: a fork waits for their answers. */
        while (hashmap_size(m->vms) > 0)
                sandbox_free(hashmap_first(m->vms));
        if (m->hooks) /* none when manager_new() failed */
                m->hooks->free_operations(m);
        while (m->templates)
                vm_template_free(m->templates);
        if (m->hooks)
                m->hooks->free_paused(m);
        while (hashmap_size(m->images) > 0)
                image_free(hashmap_first(m->images));

        m->cgroups = cgroup_manager_free(m->cgroups);
        uid_range_done(&m->vmm_uids);
        m->images = hashmap_free(m->images);
        m->creating = hashmap_free(m->creating);
        m->branching = hashmap_free(m->branching);
        m->sandboxes = hashmap_free(m->sandboxes);
        m->vms = hashmap_free(m->vms);
        m->paused = hashmap_free(m->paused);
        for (unsigned i = 0; i < m->n_stale_ids; i++) {
                free(m->stale_ids[i]);
                free(m->stale_records[i]);
        }
        free(m->stale_ids);
        free(m->stale_records);

        sd_event_source_disable_unref(m->exit_timer);
        sd_event_source_disable_unref(m->exit_poll);
        sd_event_source_disable_unref(m->snapshots_watch);
        safe_close(m->snapshots_watch_fd);
        if (m->hooks)
                m->hooks->close_direct(m);
        m->bus = sd_bus_flush_close_unref(m->bus);
        m->event = sd_event_unref(m->event);
        safe_close(m->lock_fd);
        free(m->state_dir);
        free(m->snapshots_dir);
        free(m->sandboxes_dir);
        free(m->runtime_dir);
        safe_close(m->runtime_lock_fd);
        free(m->overlay_dir);
        free(m->log_dir);
        free(m->vmm_path);
        free(m->default_kernel);
        free(m->default_initrd);
        free(m->oci_path);
        free(m->image_agent_path);
        free(m->oci_cache_dir);
        manager_free_registries(m);
        free(m);
        return NULL;
}

static bool is_staging_name(const char *name) {
        /* forkd-vmm stages a snapshot as "<tag>.tmp.<pid>". */
        const char *p = strstr(name, ".tmp.");
        const char *last = NULL;

        while (p) {
                last = p;
                p = strstr(p + 1, ".tmp.");
        }
        if (!last || last == name || !last[5])
                return false;
        for (const char *d = last + 5; *d; d++)
                if (*d < '0' || *d > '9')
                        return false;
        return true;
}

/* A branch's writer that outlived forkd and marked its directory whole
 * (SNAPSHOT_STAGING_WHOLE_FILE): renamed into place and registered. 1 if so. */
static int staging_finish(Manager *m, const char *name) {
        _cleanup_free_ char *tag = NULL;
        const char *last = strstr(name, ".tmp.");
        int r;

        for (const char *p = last; p; p = strstr(p + 1, ".tmp."))
                last = p;
        tag = last ? strndup(name, (size_t) (last - name)) : NULL;
        if (!tag || !snapshot_tag_is_valid(tag) || hashmap_get(m->images, tag) ||
            !confine_staging_is_whole(m->snapshots_dir, name))
                return 0;
        r = confine_staging_finish(m->snapshots_dir, name, tag);
        if (r >= 0)
                r = image_load(m, tag, NULL, NULL);
        if (r < 0)
                return 0;
        log_info("Registered %s, which a branch finished after forkd stopped.", tag);
        return 1;
}

static int load_snapshots(Manager *m) {
        DIR *d = opendir(m->snapshots_dir);
        struct dirent *de;

        if (!d)
                return log_error_errno(errno, "Failed to open %s: %m", m->snapshots_dir);
        while ((de = readdir(d))) {
                _cleanup_free_ char *path = NULL;
                const char *reason = NULL;
                int r;

                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                if (asprintf(&path, "%s/%s", m->snapshots_dir, de->d_name) < 0) {
                        closedir(d);
                        return log_oom();
                }
                if (strncmp(de->d_name, COMPACT_STAGING_PREFIX, strlen(COMPACT_STAGING_PREFIX)) == 0) {
                        log_info("Removing the unfinished compact %s.", path);
                        r = rm_rf(path);
                        if (r < 0)
                                log_warning_errno(r, "Failed to remove %s: %m", path);
                        continue;
                }
                if (strncmp(de->d_name, ".deleted-", 9) == 0 ||
                    strncmp(de->d_name, IMAGE_BOOT_STAGING_PREFIX, strlen(IMAGE_BOOT_STAGING_PREFIX)) == 0 ||
                    strncmp(de->d_name, SNAPSHOT_STAGING_HIDDEN_PREFIX, strlen(SNAPSHOT_STAGING_HIDDEN_PREFIX)) == 0 ||
                    strncmp(de->d_name, PACK_STAGING_PREFIX, strlen(PACK_STAGING_PREFIX)) == 0) {
                        log_info("Finishing the deletion of %s.", path);
                        r = rm_rf(path);
                        if (r < 0)
                                log_warning_errno(r, "Failed to remove %s: %m", path);
                        continue;
                }
                if (hashmap_size(m->images) >= SNAPSHOTS_MAX) {
                        log_warning("More than %u snapshots, ignoring %s.", SNAPSHOTS_MAX, path);
                        continue;
                }
                r = image_load(m, de->d_name, NULL, &reason);
                if (r >= 0) {
                        log_debug("Loaded snapshot %s.", de->d_name);
                        continue;
                }
                if (r == -ENOMEM) {
                        closedir(d);
                        return log_oom();
                }
                if (is_staging_name(de->d_name) && m->hooks->adopt_staging(m, de->d_name) > 0) {
                        log_info("A branch is still writing %s; it is registered once written.", path);
                        continue;
                }
                if (is_staging_name(de->d_name) && staging_finish(m, de->d_name) > 0)
                        continue;
                if (is_staging_name(de->d_name)) {
                        /* A snapshot that was being written when its VMM died: never complete. */
                        log_info("Removing the unfinished snapshot %s.", path);
                        r = rm_rf(path);
                        if (r < 0)
                                log_warning_errno(r, "Failed to remove %s: %m", path);
                        continue;
                }
                log_warning("Skipping %s: %s.", path, reason ?: "not a snapshot");
        }
        closedir(d);
        (void) fsync_path(m->snapshots_dir);
        log_info("Loaded %u snapshot(s) from %s.", hashmap_size(m->images), m->snapshots_dir);
        return 0;
}

/* An exclusive lock, waiting a little: a killed forkd's lock stays held until
 * the last copy of its descriptor goes, and a child it had just forked holds
 * one until its exec (closed there, O_CLOEXEC). Another forkd's is not let go:
 * -1 with errno EWOULDBLOCK after the wait. */
static int flock_briefly(int fd) {
        for (unsigned k = 0;; k++) {
                if (flock(fd, LOCK_EX | LOCK_NB) >= 0)
                        return 0;
                if (errno != EWOULDBLOCK || k >= LOCK_WAIT_TRIES)
                        return -1;
                (void) usleep(LOCK_WAIT_STEP_USEC);
        }
}

int manager_startup(Manager *m) {
        _cleanup_free_ char *lock = NULL;
        int r;

        if (asprintf(&m->snapshots_dir, "%s/snapshots", m->state_dir) < 0 ||
            asprintf(&m->sandboxes_dir, "%s/sandboxes", m->runtime_dir ?: m->state_dir) < 0 ||
            asprintf(&m->overlay_dir, "%s/overlays", m->state_dir) < 0 ||
            asprintf(&m->log_dir, "%s/logs", m->state_dir) < 0 || asprintf(&lock, "%s/.lock", m->state_dir) < 0)
                return log_oom();

        r = mkdir_parents_and_self(m->state_dir, 0750);
        if (r < 0)
                return log_error_errno(r, "Failed to create %s: %m", m->state_dir);
        m->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (m->lock_fd < 0)
                return log_error_errno(errno, "Failed to open %s: %m", lock);
        if (flock_briefly(m->lock_fd) < 0)
                return log_error_errno(errno, "Another forkd uses %s (%m).", m->state_dir);
        if (m->runtime_dir) {
                /* The records of live sandboxes: on a tmpfs (the unit's /run/forkd), no
                 * file system write per child, and a reboot ends them with their VMMs. */
                _cleanup_free_ char *rlock = NULL;

                r = mkdir_parents_and_self(m->runtime_dir, 0711);
                if (r < 0)
                        return log_error_errno(r, "Failed to create %s: %m", m->runtime_dir);
                if (asprintf(&rlock, "%s/sandboxes.lock", m->runtime_dir) < 0)
                        return log_oom();
                m->runtime_lock_fd = open(rlock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (m->runtime_lock_fd < 0)
                        return log_error_errno(errno, "Failed to open %s: %m", rlock);
                if (flock_briefly(m->runtime_lock_fd) < 0)
                        return log_error_errno(errno, "Another forkd uses the runtime directory %s (%m).",
                                               m->runtime_dir);
        }

        const char *dirs[] = { m->snapshots_dir, m->sandboxes_dir, m->overlay_dir, m->log_dir };
        for (size_t i = 0; i < ELEMENTSOF(dirs); i++)
                if (mkdir(dirs[i], 0750) < 0 && errno != EEXIST)
                        return log_error_errno(errno, "Failed to create %s: %m", dirs[i]);
        r = confine_setup(m);
        if (r < 0)
                return r;

        /* The namespaces forkd marked as its own, and fkd* veths, except those
         * whose mark names a forkd that is still running (another state
         * directory's, as tests run them side by side). Before the records,
         * whose namespaces this removes already (their removal below then finds
         * nothing, which is fine). Only root can have made any. */
        if (geteuid() == 0) {
                r = netns_cleanup_leftovers();
                if (r < 0)
                        log_warning_errno(r, "Failed to remove the network namespaces of a previous forkd: %m");
                else if (r > 0)
                        log_info("Removed %d network namespace(s) a previous forkd left.", r);
                if (m->netns_pool_size > 0) {
                        r = netns_pool_new(&m->netns_prefix, m->netns_pool_size, &m->netns_pool);
                        if (r < 0)
                                log_warning_errno(r, "Failed to start the network namespace pool, forks make "
                                                  "their own: %m");
                }
        } else if (m->netns_pool_size > 0)
                log_warning("--netns-pool needs root, as networking does; no pool.");

        /* What a killed predecessor left: its VMMs died with it (PR_SET_PDEATHSIG),
         * so its sandboxes are gone; their records and cgroups go now. */
        r = sandbox_cleanup_records(m);
        if (r < 0)
                return log_error_errno(r, "Failed to read %s: %m", m->sandboxes_dir);
        r = cgroup_sweep(m->cgroups);
        if (r < 0)
                log_warning_errno(r, "Failed to sweep stale cgroups: %m");

        /* Before the scan, so that nothing lands unseen in between. */
        r = m->hooks->watch_snapshots(m);
        if (r < 0)
                log_warning_errno(r, "Failed to watch %s; branches written across a restart are registered at "
                                  "the next start only: %m", m->snapshots_dir);
        r = load_snapshots(m);
        if (r < 0)
                return r;
        r = m->hooks->load_paused(m);
        if (r < 0)
                log_warning_errno(r, "Failed to load the paused sandboxes: %m");
        return 0;
}

void manager_announce_restart(Manager *m) {
        int r = 0;

        for (unsigned i = 0; i < m->n_stale_ids; i++) {
                _cleanup_free_ char *p = NULL;

                r = sandbox_object_path(m->stale_ids[i], &p);
                if (r >= 0)
                        r = sd_bus_emit_signal(m->bus, FORKD_MANAGER_PATH, FORKD_BUS_NAME, "SandboxRemoved", "sos",
                                               m->stale_ids[i], p, "daemon-restart");
                if (r < 0)
                        break;
        }
        /* Only once the signals are out do the records go (a kill -9 before this
         * point leaves them to the next start, which announces them again). */
        if (r >= 0 && m->n_stale_ids > 0)
                r = sd_bus_flush(m->bus);
        if (r < 0)
                log_warning_errno(r, "Failed to announce the sandboxes of the previous forkd; the next start "
                                  "announces them: %m");
        for (unsigned i = 0; i < m->n_stale_ids; i++) {
                if (r >= 0 && unlink(m->stale_records[i]) < 0 && errno != ENOENT)
                        log_warning_errno(errno, "Failed to remove %s: %m", m->stale_records[i]);
                free(m->stale_ids[i]);
                free(m->stale_records[i]);
        }
        if (r >= 0 && m->n_stale_ids > 0)
                (void) fsync_path(m->sandboxes_dir);
        free(m->stale_ids);
        free(m->stale_records);
        m->stale_ids = NULL;
        m->stale_records = NULL;
        m->n_stale_ids = 0;
}

unsigned manager_n_visible_sandboxes(const Manager *m) {
        HashmapIter it = {};
        unsigned n = 0;
        void *v;

        while (hashmap_iterate(m->sandboxes, &it, &v))
                if (sandbox_is_visible(v))
                        n++;
        return n + hashmap_size(m->paused);
}

static int on_exit_poll(sd_event_source *s, uint64_t usec, void *userdata) {
        manager_check_idle_exit(userdata);
        return 0;
}

/* Stopping (SIGTERM, systemctl stop): once the running operations end, every
 * sandbox ends as a TerminateSandbox would end it, announced with the reason
 * "daemon-stop", its record and cgroup removed, so that nothing outlives forkd
 * but its snapshots. forkd.c's exit timer bounds the wait. */
void manager_check_idle_exit(Manager *m) {
        HashmapIter it = {};
        void *v;

        if (!m->exiting || m->freeing || m->n_operations > 0 || !m->event)
                return;
        if (hashmap_size(m->vms) > 0) {
                while (hashmap_iterate(m->vms, &it, &v)) {
                        Sandbox *s = v;

                        if (!s->killed) {
                                s->stopped = true;
                                (void) sandbox_kill(s);
                        }
                }
                return; /* sandbox_exited() calls again */
        }
        /* The templates, idle now: gone here, so that their cgroups go before forkd does. */
        for (VmTemplate *t = m->templates; t; t = t->next)
                vm_template_stop_idle(t);
        /* Cgroups still emptying, and the workers' last jobs (a sandbox's namespace removal). */
        if (cgroup_pending_removals(m->cgroups) > 0 || worker_pool_pending(m->workers) > 0) {
                if (!m->exit_poll)
                        (void) sd_event_add_time_relative(m->event, &m->exit_poll, CLOCK_MONOTONIC, 20 * 1000, 0,
                                                          on_exit_poll, m);
                else {
                        (void) sd_event_source_set_time_relative(m->exit_poll, 20 * 1000);
                        (void) sd_event_source_set_enabled(m->exit_poll, SD_EVENT_ONESHOT);
                }
                return;
        }
        (void) sd_event_exit(m->event, 0);
}
