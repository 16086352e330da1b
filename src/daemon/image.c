/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <json-c/json.h>

#include "agent-proto.h"
#include "agent-tcp-port.h"
#include "console-tail.h"
#include "fs-util.h"
#include "confine.h"
#include "image.h"
#include "strv.h"
#include "netns-batch.h"
#include "macro.h"
#include "time-util.h"
#include "vm-template.h"
#include "vmm-client.h"

int image_object_path(const char *tag, char **ret) {
        return sd_bus_path_encode(FORKD_SNAPSHOT_PREFIX, tag, ret);
}

static int check_file(int dfd, const char *name, uint64_t *ret_size) {
        struct stat st;

        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EBADF;
        if (ret_size)
                *ret_size = (uint64_t) st.st_size;
        return 0;
}

int image_load(Manager *m, const char *tag, Image **ret, const char **ret_reason) {
        _cleanup_free_ char *dir = NULL, *meta_path = NULL;
        _cleanup_close_ int dfd = -EBADF;
        struct snapshot_meta meta;
        const char *reason = NULL;
        uint64_t size = 0;
        Image *i;
        int r;

        if (!snapshot_tag_is_valid(tag)) {
                reason = "not a valid tag";
                r = -EINVAL;
                goto refuse;
        }
        if (hashmap_get(m->images, tag))
                return -EEXIST;
        if (asprintf(&dir, "%s/%s", m->snapshots_dir, tag) < 0 || asprintf(&meta_path, "%s/snapshot.json", dir) < 0)
                return -ENOMEM;
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd < 0) {
                r = -errno;
                reason = "cannot open the directory";
                goto refuse;
        }
        r = snapshot_meta_read_file(meta_path, &meta, &reason);
        if (r < 0) {
                reason = reason ?: "cannot read snapshot.json";
                goto refuse;
        }
        if (strcmp(meta.tag, tag) != 0) {
                r = -EINVAL;
                reason = "snapshot.json names another tag";
                goto refuse;
        }
        r = check_file(dfd, meta.memory_file, &size);
        if (r >= 0 && size != meta.mem_size)
                r = -EINVAL;
        if (r < 0) {
                reason = "the memory file is missing or has the wrong size";
                goto refuse;
        }
        r = check_file(dfd, meta.vmstate_file, NULL);
        if (r < 0) {
                reason = "the vmstate file is missing";
                goto refuse;
        }
        r = check_file(dfd, meta.disk_file, &size);
        if (r >= 0 && size != meta.disk_size)
                r = -EINVAL;
        if (r < 0) {
                reason = "the disk file is missing or has the wrong size";
                goto refuse;
        }
        r = confine_adopt_snapshot(m, dfd);
        if (r < 0)
                log_warning_errno(r, "Failed to hand %s to the VMM user; a confined VMM may fail to branch from it: %m",
                                  dir);

        i = calloc(1, sizeof(*i));
        if (!i)
                return -ENOMEM;
        i->manager = m;
        i->meta = meta;
        i->dir = TAKE_PTR(dir);
        i->tag = strdup(tag);
        if (!i->tag) {
                free(i->dir);
                free(i);
                return -ENOMEM;
        }
        r = hashmap_put(m->images, i->tag, i);
        if (r < 0) {
                free(i->tag);
                free(i->dir);
                free(i);
                return r;
        }
        if (ret)
                *ret = i;
        return 0;
refuse:
        if (ret_reason)
                *ret_reason = reason ?: "invalid";
        return r;
}

int image_write_owner(const char *dir, uid_t owner_uid) {
        return image_write_meta(dir, owner_uid, -1, NULL);
}

int image_write_meta(const char *dir, uid_t owner_uid, int agent_tcp, const char *image_config) {
        _cleanup_free_ char *path = NULL, *json = NULL;
        struct snapshot_meta meta;
        int r;

        if (owner_uid == (uid_t) UINT32_MAX)
                return -EINVAL;
        if (asprintf(&path, "%s/snapshot.json", dir) < 0)
                return -ENOMEM;
        r = snapshot_meta_read_file(path, &meta, NULL);
        if (r < 0)
                return r;
        if (agent_tcp < 0)
                agent_tcp = meta.agent_tcp;
        if (agent_tcp && !meta.network)
                return -EINVAL;
        if (image_config && strlen(image_config) >= sizeof(meta.image_config))
                return -E2BIG;
        if (meta.owner_uid == owner_uid && meta.agent_tcp == (agent_tcp > 0) &&
            (!image_config || streq(meta.image_config, image_config)))
                return 0;
        meta.owner_uid = (uint32_t) owner_uid;
        meta.agent_tcp = agent_tcp > 0;
        if (image_config)
                snprintf(meta.image_config, sizeof(meta.image_config), "%s", image_config);
        r = snapshot_meta_format(&meta, &json);
        if (r < 0)
                return r;
        return write_file_atomic(dir, "snapshot.json", json, strlen(json), WRITE_SYNC_DATA | WRITE_SYNC_DIR);
}

Image *image_free(Image *i) {
        if (!i)
                return NULL;
        hashmap_remove(i->manager->images, i->tag);
        if (i->template)
                vm_template_detach_image(i->template);
        free(i->tag);
        free(i->dir);
        free(i);
        return NULL;
}

int image_delete(Image *i) {
        _cleanup_free_ char *trash = NULL;
        char rnd[9];
        int r;

        random_hex(rnd, 8);
        if (asprintf(&trash, "%s/.deleted-%s.%s", i->manager->snapshots_dir, i->tag, rnd) < 0)
                return -ENOMEM;
        /* After the rename the tag is gone for good, whatever happens to the removal. */
        if (rename(i->dir, trash) < 0)
                return -errno;
        (void) fsync_path(i->manager->snapshots_dir);
        r = rm_rf(trash);
        if (r < 0)
                log_warning_errno(r, "Failed to remove %s, the next start retries: %m", trash);
        image_free(i);
        return 0;
}

int image_dependents(Manager *m, const char *tag, char ***ret) {
        HashmapIter it = {};
        char **l = NULL;
        size_t n = 0;
        void *v;

        l = calloc(1, sizeof(char *));
        if (!l)
                return -ENOMEM;
        while (hashmap_iterate(m->images, &it, &v)) {
                Image *i = v;
                char **nl;

                if (strcmp(i->meta.parent_tag, tag) != 0)
                        continue;
                nl = realloc(l, (n + 2) * sizeof(char *));
                if (!nl)
                        goto oom;
                l = nl;
                l[n] = strdup(i->tag);
                if (!l[n])
                        goto oom;
                l[++n] = NULL;
        }
        *ret = l;
        return (int) n;
oom:
        strv_free(l);
        return -ENOMEM;
}

int image_sizes(Image *i, struct image_sizes *ret) {
        _cleanup_close_ int dfd = open(i->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        struct stat st;

        if (dfd < 0)
                return -errno;
        if (fstatat(dfd, i->meta.memory_file, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return -errno;
        ret->memory_logical = (uint64_t) st.st_size;
        ret->memory_physical = (uint64_t) st.st_blocks * 512u;
        if (fstatat(dfd, i->meta.vmstate_file, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return -errno;
        ret->vmstate = (uint64_t) st.st_size;
        return 0;
}

/* ---- creation (worker thread) ---- */

ImageCreate *image_create_new(void) {
        ImageCreate *c = calloc(1, sizeof(*c));

        if (!c)
                return NULL;
        c->kernel_fd = c->initrd_fd = c->rootfs_fd = c->image_fd = -EBADF;
        for (unsigned i = 0; i < SNAPSHOT_VOLUMES_MAX; i++)
                c->volumes[i].fd = -EBADF;
        return c;
}

ImageCreate *image_create_free(ImageCreate *c) {
        if (!c)
                return NULL;
        safe_close(c->kernel_fd);
        safe_close(c->initrd_fd);
        safe_close(c->rootfs_fd);
        safe_close(c->image_fd);
        for (unsigned i = 0; i < c->n_volumes; i++)
                safe_close(c->volumes[i].fd);
        if (c->staging)
                (void) rm_rf(c->staging);
        free(c->staging);
        free(c->snapshots_dir);
        strv_free(c->jail_links);
        free(c->vmm_path);
        free(c->tag);
        free(c->dir);
        free(c->overlay_dir);
        free(c->console_log);
        free(c->oci_path);
        free(c->image_ref);
        free(c->registry_config);
        free(c->image_agent);
        free(c->oci_cache);
        free(c->image_config);
        free(c->error);
        free(c);
        return NULL;
}

int image_create_set_error(ImageCreate *c, int r, const char *fmt, ...) {
        va_list ap;

        free(c->error);
        c->error = NULL;
        va_start(ap, fmt);
        if (vasprintf(&c->error, fmt, ap) < 0)
                c->error = NULL;
        va_end(ap);
        return r;
}

/* How many console lines a failed boot's error quotes. */
#define BOOT_ERROR_CONSOLE_LINES 10

/* The error for a boot that failed: what went wrong, then the last lines of
 * the guest's console (the whole log stays where it is, for the user). */
static int set_boot_error(ImageCreate *c, int r, const char *fmt, ...) _printf_(3, 4);
static int set_boot_error(ImageCreate *c, int r, const char *fmt, ...) {
        _cleanup_free_ char *what = NULL, *tail = NULL;
        va_list ap;
        int k;

        va_start(ap, fmt);
        k = vasprintf(&what, fmt, ap);
        va_end(ap);
        if (k < 0)
                return image_create_set_error(c, r, "The VM did not come up");
        if (!c->console_log)
                return image_create_set_error(c, r, "%s", what);
        /* Name the log only when it has something to read. */
        if (console_tail(c->console_log, BOOT_ERROR_CONSOLE_LINES, &tail) < 0 || !tail[0])
                return image_create_set_error(c, r, "%s; the guest printed nothing on its console", what);
        return image_create_set_error(c, r, "%s. The last lines of its console (%s):\n%s", what, c->console_log, tail);
}

/* Why a VM process that was booting exited, from its waitpid() status
 * (forkd-vmm(8), EXIT STATUS). */
static void describe_boot_exit(int status, char *buf, size_t size) {
        if (WIFSIGNALED(status))
                /* sigdescr_np(), not strsignal(): this runs in a worker thread. */
                snprintf(buf, size, "forkd-vmm was killed by signal %d (%s)", WTERMSIG(status),
                         sigdescr_np(WTERMSIG(status)) ?: "unknown");
        else if (WEXITSTATUS(status) == VMM_EXIT_TRIPLE_FAULT)
                snprintf(buf, size, "the guest crashed during boot (triple fault)");
        else if (WEXITSTATUS(status) == VMM_EXIT_HALTED)
                snprintf(buf, size, "the guest crashed during boot (it halted with interrupts off)");
        else if (WEXITSTATUS(status) == 0)
                snprintf(buf, size, "the guest reset or powered off during boot");
        else
                snprintf(buf, size, "forkd-vmm failed with exit status %d (see forkd's log)", WEXITSTATUS(status));
}

/* The caller's files, copied into c->staging (the VMM opens these copies only). */
static int stage_boot_files(ImageCreate *c, char **ret_kernel, char **ret_disk) {
        static const char *const names[] = { "vmlinuz", "initrd.img", "rootfs.img" };
        const char *what[] = { "kernel", "initrd", "rootfs" };
        int fds[] = { c->kernel_fd, c->initrd_fd, c->rootfs_fd };
        uint64_t sizes[] = { c->kernel_size, c->initrd_size, c->rootfs_size };
        _cleanup_close_ int dfd = -EBADF;
        int r;

        r = rm_rf(c->staging); /* a dead daemon's, if any */
        if (r < 0)
                return image_create_set_error(c, r, "Cannot remove the old %s: %s", c->staging, strerror(-r));
        if (mkdir(c->staging, 0750) < 0)
                return image_create_set_error(c, -errno, "Cannot create %s: %s", c->staging, strerror(errno));
        dfd = open(c->staging, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd < 0)
                return image_create_set_error(c, -errno, "Cannot open %s: %s", c->staging, strerror(errno));
        for (unsigned k = 0; k < ELEMENTSOF(fds); k++) {
                if (fds[k] < 0)
                        continue;
                r = copy_file_sparse(fds[k], dfd, names[k], sizes[k], 0640);
                if (r < 0)
                        return image_create_set_error(c, r, "Cannot copy the %s into %s: %s", what[k], c->staging, strerror(-r));
        }
        if (asprintf(ret_kernel, "%s/%s", c->staging, names[0]) < 0)
                return -ENOMEM;
        if (asprintf(ret_disk, "%s/%s", c->staging, names[2]) < 0) {
                free(*ret_kernel);
                *ret_kernel = NULL;
                return -ENOMEM;
        }
        return 0;
}

/* The ro and cow volumes, copied into c->staging as the root disk is (the
 * caller's file may change meanwhile): c->volumes[i].fd becomes the copy's. */
static int stage_volumes(ImageCreate *c) {
        _cleanup_close_ int dfd = -EBADF;
        int r;

        dfd = open(c->staging, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd < 0)
                return image_create_set_error(c, -errno, "Cannot open %s: %s", c->staging, strerror(errno));
        for (unsigned i = 0; i < c->n_volumes; i++) {
                struct image_volume *v = &c->volumes[i];
                char name[32];
                struct stat st;
                int fd;

                if (v->mode == SNAPSHOT_VOLUME_RW)
                        continue;
                if (fstat(v->fd, &st) < 0)
                        return image_create_set_error(c, -errno, "Cannot inspect volume %s: %s", v->guest_path,
                                                      strerror(errno));
                snprintf(name, sizeof(name), "volume-%u.img", i);
                r = copy_file_sparse(v->fd, dfd, name, (uint64_t) st.st_size, 0640);
                if (r < 0)
                        return image_create_set_error(c, r, "Cannot copy volume %s into %s: %s", v->guest_path,
                                                      c->staging, strerror(-r));
                fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
                if (fd < 0)
                        return image_create_set_error(c, -errno, "Cannot open %s: %s", name, strerror(errno));
                safe_close(v->fd);
                v->fd = fd;
        }
        return 0;
}

/* Whether the staged kernel is a Linux bzImage ("HdrS" at 0x202): only a Linux
 * guest mounts volumes; the test guest has no driver for them. */
static bool kernel_is_linux(const char *kernel) {
        _cleanup_close_ int fd = open(kernel, O_RDONLY | O_CLOEXEC);
        char magic[4];

        return fd >= 0 && pread(fd, magic, sizeof(magic), 0x202) == (ssize_t) sizeof(magic) &&
               memcmp(magic, "HdrS", 4) == 0;
}

/* Ask the agent to mount every volume (op mount_volumes), before the snapshot. */
static int mount_volumes(ImageCreate *c, int agent_fd) {
        _cleanup_free_ char *reply = NULL;
        struct json_object *req, *a, *o = NULL, *failed, *e;
        uint16_t type = 0;
        int r;

        req = json_object_new_object();
        a = json_object_new_array();
        if (!req || !a) {
                json_object_put(req);
                json_object_put(a);
                return -ENOMEM;
        }
        json_object_object_add(req, "op", json_object_new_string("mount_volumes"));
        json_object_object_add(req, "volumes", a);
        for (unsigned i = 0; i < c->n_volumes; i++) {
                struct json_object *v = json_object_new_object();
                char dev[16];

                snprintf(dev, sizeof(dev), "/dev/vd%c", 'b' + (int) i);
                json_object_object_add(v, "device", json_object_new_string(dev));
                json_object_object_add(v, "path", json_object_new_string(c->volumes[i].guest_path));
                json_object_object_add(v, "ro", json_object_new_boolean(c->volumes[i].mode == SNAPSHOT_VOLUME_RO));
                json_object_array_add(a, v);
        }
        r = fka_call(agent_fd, json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN),
                     (uint64_t) c->boot_wait_secs * USEC_PER_SEC, &reply, &type);
        json_object_put(req);
        if (r < 0)
                return image_create_set_error(c, r, "The guest's agent did not mount the volumes: %s", strerror(-r));
        o = reply ? json_tokener_parse(reply) : NULL;
        if (type != FKA_RESPONSE) {
                const char *why = o && json_object_object_get_ex(o, "error", &e) ? json_object_get_string(e) : NULL;

                image_create_set_error(c, -EPROTO, "The guest's agent did not mount the volumes: %s",
                                       why ?: "it refused mount_volumes");
                json_object_put(o);
                return -EPROTO;
        }
        if (o && json_object_object_get_ex(o, "failed", &failed) && json_object_is_type(failed, json_type_array) &&
            json_object_array_length(failed) > 0) {
                struct json_object *f = json_object_array_get_idx(failed, 0), *p = NULL, *why = NULL;

                (void) json_object_object_get_ex(f, "path", &p);
                (void) json_object_object_get_ex(f, "error", &why);
                image_create_set_error(c, -EINVAL, "Volume %s could not be mounted in the guest (an ext4 image is "
                                       "needed): %s", p ? json_object_get_string(p) : "?",
                                       why ? json_object_get_string(why) : "?");
                c->error_invalid_args = true;
                json_object_put(o);
                return -EINVAL;
        }
        json_object_put(o);
        return 0;
}

int image_create_work(void *userdata) {
        ImageCreate *c = userdata;
        _cleanup_free_ char *kernel = NULL, *disk = NULL;
        struct vmm_boot_args a = {
                .vmm_path = c->vmm_path,
                .mem_mib = c->mem_mib,
                .vcpus = c->vcpus,
                .id = c->tag,
                .console_log = c->console_log,
                .overlay_dir = c->overlay_dir,
        };
        struct vmm_proc p = { .pid = 0, .control_fd = -EBADF, .agent_fd = -EBADF };
        _cleanup_free_ char *reply = NULL, *staging_name = NULL;
        struct json_object *req = NULL, *o = NULL, *e;
        NetnsChild net = { .tap_fd = -EBADF };
        int staging_fd = -EBADF;
        unsigned net_index = 0;
        uint16_t type = 0;
        int r;

        if (c->console_log)
                (void) unlink(c->console_log); /* forkd-vmm appends */

        /* Every return before the boot removes the staging directory itself: the
         * caller is answered before image_create_free() runs, and must find
         * nothing half-written (test-faults' full disk). */
        r = stage_boot_files(c, &kernel, &disk);
        if (r < 0) {
                (void) rm_rf(c->staging);
                return c->error ? r : image_create_set_error(c, r, "Cannot stage the boot files: %s", strerror(-r));
        }
        r = stage_volumes(c);
        if (r < 0) {
                (void) rm_rf(c->staging);
                return r;
        }
        /* The caller's descriptors are done with. */
        c->kernel_fd = safe_close(c->kernel_fd);
        c->initrd_fd = safe_close(c->initrd_fd);
        c->rootfs_fd = safe_close(c->rootfs_fd);
        if (c->image_fd >= 0 || c->image_ref) {
                r = image_oci_build(c, disk);
                if (r < 0) {
                        (void) rm_rf(c->staging);
                        return r;
                }
        }
        a.kernel = kernel;
        a.disk = disk;

        if (c->network) {
                const char *step = NULL;
                bool made = false;

                /* A namespace of its own for the boot VM's tap, as a child would have. */
                r = netns_pick_free(&c->netns_prefix, 1, &net_index);
                if (r < 0) {
                        (void) rm_rf(c->staging);
                        return image_create_set_error(c, r, "No free network namespace for the boot VM: %s", strerror(-r));
                }
                /* One of a batch: another index when someone made this one meanwhile. */
                r = netns_children_create(&c->netns_prefix, &net_index, 1, NETNS_POLICY_NONE, 1, &net, &made, NULL,
                                          &step);
                if (r < 0) {
                        netns_release(net_index);
                        (void) rm_rf(c->staging);
                        return image_create_set_error(c, r, "Cannot create the boot VM's network namespace (%s): %s",
                                         step ?: "?", strerror(-r));
                }
                /* Root only dials it (an earlier child of the index may have allowed more). */
                r = netns_children_allow(&net, 1, 0);
                if (r < 0) {
                        netns_child_done(&net);
                        (void) netns_child_destroy(net.name);
                        netns_release(net_index);
                        (void) rm_rf(c->staging);
                        return image_create_set_error(c, r, "Cannot set who may dial the boot VM (nftables): %s", strerror(-r));
                }
                a.with_net = true;
                a.net_tap_fd = net.tap_fd;
        }
        if (c->image_config)
                a.cmdline = c->agent_tcp ? VMM_LINUX_CMDLINE_DEFAULT " " IMAGE_AGENT_CMDLINE_SWITCH " "
                                                   AGENT_TCP_CMDLINE_SWITCH :
                                           VMM_LINUX_CMDLINE_DEFAULT " " IMAGE_AGENT_CMDLINE_SWITCH;
        else if (c->agent_tcp)
                a.cmdline = VMM_LINUX_CMDLINE_DEFAULT " " AGENT_TCP_CMDLINE_SWITCH;

        struct vmm_volume_arg vols[SNAPSHOT_VOLUMES_MAX];
        for (unsigned i = 0; i < c->n_volumes; i++)
                vols[i] = (struct vmm_volume_arg) { .fd = c->volumes[i].fd,
                                                    .mode = snapshot_volume_mode_to_string(c->volumes[i].mode),
                                                    .guest_path = c->volumes[i].guest_path };
        a.volumes = vols;
        a.n_volumes = c->n_volumes;
        a.jail_links = (const char *const *) c->jail_links;
        r = vmm_client_boot(&a, &p);
        netns_child_done(&net); /* the VMM has its own copy */
        if (r < 0) {
                image_create_set_error(c, r, "Failed to start %s: %s", c->vmm_path, strerror(-r));
                goto finish;
        }

        r = fka_wait_ready(p.agent_fd, (uint64_t) c->boot_wait_secs * 1000000u, &type);
        if (r == -ETIMEDOUT) {
                set_boot_error(c, r, "The guest's agent did not answer within %us", c->boot_wait_secs);
                goto finish;
        }
        if (r < 0 || type != FKA_RESPONSE) {
                char why[128];
                int status;

                /* The agent channel closed: forkd-vmm's exit status says why. */
                if (r < 0 && vmm_proc_wait(&p, 2 * USEC_PER_SEC, &status) >= 0)
                        describe_boot_exit(status, why, sizeof(why));
                else
                        snprintf(why, sizeof(why), "%s", r < 0 ? strerror(-r) : "the agent refused ping");
                r = r < 0 ? r : -EPROTO;
                set_boot_error(c, r, "The VM did not come up: %s", why);
                goto finish;
        }

        if (c->n_volumes > 0 && kernel_is_linux(kernel)) {
                r = mount_volumes(c, p.agent_fd);
                if (r < 0)
                        goto finish;
        }

        req = json_object_new_object();
        if (!req) {
                r = -ENOMEM;
                goto finish;
        }
        json_object_object_add(req, "op", json_object_new_string("snapshot"));
        json_object_object_add(req, "dir", json_object_new_string(c->dir));
        json_object_object_add(req, "tag", json_object_new_string(c->tag));
        /* Into "<tag>.tmp.<pid>", which forkd makes and renames into place: the VMM may not reach snapshots/. */
        json_object_object_add(req, "staging", json_object_new_boolean(true));
        r = c->snapshots_dir ? confine_staging_dir(c->snapshots_dir, c->tag, p.pid, c->writer_uid, c->writer_gid,
                                                   &staging_name, &staging_fd) : -EINVAL;
        if (r < 0) {
                image_create_set_error(c, r, "Cannot make the directory for the snapshot: %s", strerror(-r));
                goto finish;
        }
        r = vmm_client_control_fd(p.control_fd, json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN),
                                  staging_fd, 300 * USEC_PER_SEC, &reply);
        if (r >= 0) {
                r = confine_staging_finish(c->snapshots_dir, staging_name, c->tag);
                if (r < 0)
                        image_create_set_error(c, r, "Cannot move the snapshot into place: %s", strerror(-r));
                else {
                        free(staging_name);
                        staging_name = NULL; /* in place: nothing to remove */
                }
        } else {
                const char *why = NULL;

                if (reply) {
                        o = json_tokener_parse(reply);
                        if (o && json_object_object_get_ex(o, "error", &e) && json_object_is_type(e, json_type_string))
                                why = json_object_get_string(e);
                }
                image_create_set_error(c, r, "The VMM could not write the snapshot: %s", why ?: strerror(-r));
        }
finish:
        json_object_put(req);
        json_object_put(o);
        vmm_proc_stop(&p, 2 * USEC_PER_SEC);
        safe_close(staging_fd);
        if (staging_name) {
                _cleanup_free_ char *path = NULL;

                if (asprintf(&path, "%s/%s", c->snapshots_dir, staging_name) >= 0)
                        (void) rm_rf(path);
        }
        (void) rm_rf(c->staging); /* the snapshot holds its own copy of the disk */
        if (net_index > 0) {
                /* The snapshot is written or the boot failed: the namespace goes. */
                int k = netns_child_destroy(net.name);
                if (k < 0)
                        log_warning_errno(k, "Failed to remove the boot VM's network namespace %s: %m", net.name);
                netns_release(net_index);
        }
        return r;
}

int image_hold_chain(Image **chain, size_t n, char ***ret_tags, char ***ret_dirs, size_t *ret_n) {
        *ret_tags = calloc(n + 1, sizeof(char *));
        *ret_dirs = calloc(n + 1, sizeof(char *));
        if (!*ret_tags || !*ret_dirs)
                return -ENOMEM;
        for (size_t k = 0; k < n; k++) {
                Image *i = chain[n - 1 - k];

                (*ret_tags)[k] = strdup(i->tag);
                (*ret_dirs)[k] = strdup(i->dir);
                if (!(*ret_tags)[k] || !(*ret_dirs)[k])
                        return -ENOMEM;
                i->n_users++;
                *ret_n = k + 1;
        }
        return 0;
}

void image_release_chain(Manager *m, char **tags, size_t n) {
        for (size_t k = 0; tags && k < n; k++) {
                Image *i = hashmap_get(m->images, tags[k]);

                if (i && i->n_users > 0)
                        i->n_users--;
        }
}
