/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* org.forkd.Manager's CreateSnapshot* methods: the boot files (or the image)
 * checked and taken over, the job run in a worker, the snapshot registered. */
#include <fcntl.h>
#include <inttypes.h>
#include <sys/stat.h>
#include <unistd.h>

#include "boot-files.h"
#include "fs-util.h"
#include "image-dbus.h"
#include "confine.h"
#include "image.h"
#include "macro.h"
#include "manager-dbus.h"
#include "operation.h"
#include "polkit.h"
#include "snapshot-meta.h"
#include "vm-template.h"

#define IMAGE_REF_MAX 512u


/* A boot file handed over as fd: forkd's own copy of the descriptor once it
 * is a readable regular file within the limit. The fd's path is never looked at. */
static int take_boot_fd(const char *what, int fd, uint64_t max, int *ret_fd, uint64_t *ret_size,
                        sd_bus_error *error) {
        uint64_t size = 0;
        int r, copy;

        r = boot_fd_check(fd, max, &size);
        if (r == -EBADF)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "The %s descriptor is not open for reading.", what);
        if (r == -EINVAL)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "The %s is not a regular file.", what);
        if (r == -EFBIG)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "The %s is larger than %" PRIu64 " MiB.", what, max >> 20);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Cannot inspect the %s descriptor: %m", what);
        copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (copy < 0)
                return sd_bus_error_set_errnof(error, errno, "Cannot duplicate the %s descriptor: %m", what);
        *ret_fd = copy;
        *ret_size = size;
        return 0;
}

/* CreateSnapshot (paths, root only): the files opened with forkd's privileges,
 * the initramfs found beside the kernel as Debian names it. */
static int open_boot_path(const char *what, const char *path, uint64_t max, int *ret_fd, uint64_t *ret_size,
                          sd_bus_error *error) {
        _cleanup_close_ int fd = -EBADF;
        int r;

        if (path[0] != '/' || strlen(path) >= PATH_ARG_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "%s must be an absolute path.", what);
        r = boot_file_open(path, &fd);
        if (r == -EISDIR || r == -EINVAL)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "%s %s is not a regular file.", what, path);
        if (r < 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "%s %s: %s.", what, path, strerror(-r));
        return take_boot_fd(what, fd, max, ret_fd, ret_size, error);
}

static int create_work(void *userdata) {
        Operation *o = userdata;
        /* Worker thread: only o->create, which nobody else touches meanwhile. */
        return image_create_work(o->create);
}

static void create_done(int r, void *userdata) {
        Operation *o = userdata;
        Manager *m = o->manager;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        const char *reason = NULL;
        Image *i = NULL;

        if (r >= 0) {
                r = image_write_meta(o->create->dir, o->owner_uid, o->create->agent_tcp ? 1 : 0,
                                     o->create->image_config);
                if (r < 0)
                        reason = r == -EINVAL ? "forkd-vmm recorded no NIC for agent_tcp" :
                                                "cannot record its owner in snapshot.json";
                else
                        r = image_load(m, o->tag, &i, &reason);
                if (r < 0) {
                        log_error_errno(r, "The new snapshot %s does not load: %s", o->tag, reason ?: "?");
                        (void) rm_rf(o->create->dir);
                        (void) sd_bus_reply_method_errorf(o->message, FORKD_ERROR_FAILED,
                                                          "The new snapshot does not load: %s", reason ?: strerror(-r));
                        operation_free(o);
                        return;
                }
        } else {
                log_error_errno(r, "Creating snapshot %s failed: %s", o->tag, o->create->error ?: strerror(-r));
                (void) sd_bus_reply_method_errorf(o->message,
                                                  o->create->error_invalid_args ? SD_BUS_ERROR_INVALID_ARGS :
                                                                                  FORKD_ERROR_FAILED,
                                                  "%s", o->create->error ?: strerror(-r));
                operation_free(o);
                return;
        }

        log_info("Snapshot %s created.", i->tag);
        image_send_signal(m, i->tag, true);
        r = vm_template_warm(m, i);
        if (r < 0)
                log_warning_errno(r, "Could not start the template of %s ahead of its first fork: %m", i->tag);
        r = sd_bus_message_new_method_return(o->message, &reply);
        if (r >= 0)
                r = image_append_info(reply, i, false);
        if (r >= 0)
                r = sd_bus_send(NULL, reply, NULL);
        if (r < 0)
                (void) sd_bus_reply_method_errno(o->message, r, NULL);
        operation_free(o);
}

/* The checks of CreateSnapshot and CreateSnapshotFromFds that come before polkit. */
static int check_create_args(const char *tag, uint32_t mem_mib, uint32_t boot_wait, sd_bus_error *error) {
        int r = bus_check_tag(tag, "snapshot tag", error);

        if (r < 0)
                return r;
        if (!mem_mib_is_valid(mem_mib))
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "mem_mib must be 0 (default) or an even number from 16 to %u.", MEM_MIB_MAX);
        if (boot_wait < 1 || boot_wait > BOOT_WAIT_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "boot_wait_secs must be from 1 to %u.",
                                         BOOT_WAIT_MAX);
        return 0;
}

/* After the prelude, with the boot files in c (taken over, freed on failure too). */
static int create_snapshot_start(Manager *m, sd_bus_message *message, const char *tag, uint32_t mem_mib,
                                 uint32_t boot_wait, ImageCreate *c, sd_bus_error *error) {
        Operation *o = NULL;
        struct stat st;
        char dir[4096];
        int r;

        snprintf(dir, sizeof(dir), "%s/%s", m->snapshots_dir, tag);
        if (lstat(dir, &st) >= 0) {
                image_create_free(c);
                return sd_bus_error_setf(error, FORKD_ERROR_SNAPSHOT_EXISTS,
                                         "%s exists on disk (a snapshot that failed to load?); remove it first.", dir);
        }
        if (hashmap_size(m->images) + hashmap_size(m->creating) >= SNAPSHOTS_MAX) {
                image_create_free(c);
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "At most %u snapshots.", SNAPSHOTS_MAX);
        }

        r = operation_begin(m, message, tag, &o, error);
        if (r < 0) {
                image_create_free(c);
                return r;
        }
        o->create = c;
        c->netns_prefix = m->netns_prefix;
        c->mem_mib = mem_mib ?: m->default_mem_mib;
        c->vcpus = c->vcpus ?: m->default_vcpus;
        c->boot_wait_secs = boot_wait;
        c->vmm_path = strdup(m->vmm_path);
        c->tag = strdup(tag);
        c->dir = strdup(dir);
        c->overlay_dir = strdup(m->overlay_dir);
        if (asprintf(&c->console_log, "%s/%s.boot.log", m->log_dir, tag) < 0)
                c->console_log = NULL;
        if (asprintf(&c->staging, "%s/" IMAGE_BOOT_STAGING_PREFIX "%s", m->snapshots_dir, tag) < 0)
                c->staging = NULL;
        /* The boot VMM reaches the overlay and console directories only, and
         * writes the snapshot into a directory forkd makes for it. */
        c->snapshots_dir = strdup(m->snapshots_dir);
        c->writer_uid = m->confine ? m->vmm_uid : (uid_t) -1;
        c->writer_gid = m->vmm_gid;
        if (!c->vmm_path || !c->tag || !c->dir || !c->overlay_dir || !c->console_log || !c->staging ||
            !c->snapshots_dir || confine_jail_links(m, NULL, &c->jail_links) < 0) {
                operation_free(o);
                return -ENOMEM;
        }
        r = operation_submit(o, create_work, create_done);
        if (r > 0)
                log_info("Creating snapshot %s for uid %u.", tag, (unsigned) o->owner_uid);
        return r;
}

/* Both create methods: the arguments, then the prelude (org.forkd.manage-snapshots,
 * the tag free). Returns 0 while polkit has not answered yet (the message is
 * dispatched again). */
static int verify_create(Manager *m, sd_bus_message *message, const char *tag, uint32_t mem_mib, uint32_t boot_wait,
                         sd_bus_error *error) {
        int r;

        r = check_create_args(tag, mem_mib, boot_wait, error);
        if (r < 0)
                return r;
        return operation_prelude(m, message,
                                 &(OperationPrelude) { .action = "org.forkd.manage-snapshots", .verb = "create",
                                                       .snapshot = tag,
                                                       .tag = tag },
                                 error);
}

int bus_manager_method_create_snapshot(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        const char *tag, *kernel, *rootfs;
        uint32_t mem_mib, boot_wait;
        ImageCreate *c = NULL;
        char initrd[PATH_ARG_MAX + 16];
        uid_t uid;
        int r;

        r = sd_bus_message_rewind(message, true); /* polkit may dispatch it twice */
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "sssuu", &tag, &kernel, &rootfs, &mem_mib, &boot_wait);
        if (r < 0)
                return r;
        r = verify_create(m, message, tag, mem_mib, boot_wait, error);
        if (r <= 0)
                return r < 0 ? r : 1; /* 0: polkit answers later and dispatches it again */

        /* forkd would open these paths with its own privileges: for root only.
         * Everyone else opens the files and passes descriptors. */
        r = bus_message_sender_uid(message, &m->polkit_registry, &uid);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Cannot determine the caller's credentials: %m");
        if (uid != 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_ACCESS_DENIED,
                                         "Access denied: CreateSnapshot opens kernel and rootfs with forkd's privileges "
                                         "and is for root only; uid %u must open the files itself and pass them to "
                                         "CreateSnapshotFromFds (forkctl snapshot create does).",
                                         (unsigned) uid);

        c = image_create_new();
        if (!c)
                return -ENOMEM;
        r = open_boot_path("kernel", kernel, BOOT_KERNEL_SIZE_MAX, &c->kernel_fd, &c->kernel_size, error);
        if (r >= 0)
                r = open_boot_path("rootfs", rootfs, BOOT_ROOTFS_SIZE_MAX, &c->rootfs_fd, &c->rootfs_size, error);
        if (r >= 0 && boot_initrd_beside(kernel, initrd, sizeof(initrd)) > 0)
                r = open_boot_path("initrd", initrd, BOOT_INITRD_SIZE_MAX, &c->initrd_fd, &c->initrd_size, error);
        if (r < 0) {
                image_create_free(c);
                return r;
        }
        return create_snapshot_start(m, message, tag, mem_mib, boot_wait, c, error);
}

/* The options of CreateSnapshotFromFds and CreateSnapshotFromImage (image:
 * also kernel and start_cmd). The fds are borrowed from the message. */
struct create_options {
        int kernel_fd, initrd_fd;
        int network, agent_tcp, start_cmd;
        uint32_t vcpus; /* 0: not given */
        struct image_volume volumes[SNAPSHOT_VOLUMES_MAX]; /* fds borrowed */
        unsigned n_volumes;
};

/* Option "volumes", a(hss): (fd, guest_path, mode) each. */
static int read_volumes(sd_bus_message *message, struct create_options *o, sd_bus_error *error) {
        int r;

        r = sd_bus_message_enter_container(message, 'v', "a(hss)");
        if (r < 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Option volumes must be of type a(hss).");
        r = sd_bus_message_enter_container(message, 'a', "(hss)");
        if (r < 0)
                return r;
        for (;;) {
                struct image_volume *v;
                const char *path, *mode;
                int fd, k;

                r = sd_bus_message_read(message, "(hss)", &fd, &path, &mode);
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                if (o->n_volumes >= SNAPSHOT_VOLUMES_MAX)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "At most %u volumes.",
                                                 SNAPSHOT_VOLUMES_MAX);
                if (!snapshot_volume_guest_path_is_valid(path))
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "Volume %u: guest_path \"%.255s\" must be absolute and normalized, "
                                                 "not /, without \"..\", at most 255 bytes, and not under /proc, "
                                                 "/sys, /dev, /run or /.forkd.", o->n_volumes, path);
                k = snapshot_volume_mode_from_string(mode);
                if (k < 0)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "Volume %s: mode \"%.16s\" must be ro, cow or rw.", path, mode);
                for (unsigned i = 0; i < o->n_volumes; i++)
                        if (streq(o->volumes[i].guest_path, path))
                                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                         "Volume %s is given twice.", path);
                v = &o->volumes[o->n_volumes++];
                v->fd = fd;
                v->mode = k;
                snprintf(v->guest_path, sizeof(v->guest_path), "%s", path);
        }
        r = sd_bus_message_exit_container(message);
        if (r >= 0)
                r = sd_bus_message_exit_container(message);
        return r;
}

/* Each volume's fd: a regular file of at most 64 GiB, open for reading (rw:
 * and writing); forkd's own copies in c. */
static int take_volumes(const struct create_options *o, ImageCreate *c, sd_bus_error *error) {
        for (unsigned i = 0; i < o->n_volumes; i++) {
                const struct image_volume *v = &o->volumes[i];
                struct stat st;
                int flags, copy;

                flags = fcntl(v->fd, F_GETFL);
                if (flags < 0 || fstat(v->fd, &st) < 0)
                        return sd_bus_error_set_errnof(error, errno, "Cannot inspect the descriptor of volume %s: %m",
                                                       v->guest_path);
                if (!S_ISREG(st.st_mode) || (flags & O_PATH))
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "Volume %s is not a regular file.", v->guest_path);
                if ((flags & O_ACCMODE) == O_WRONLY ||
                    (v->mode == SNAPSHOT_VOLUME_RW && (flags & O_ACCMODE) != O_RDWR))
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "The descriptor of volume %s is not open for %s.", v->guest_path,
                                                 v->mode == SNAPSHOT_VOLUME_RW ? "reading and writing" : "reading");
                if ((uint64_t) st.st_size > SNAPSHOT_VOLUME_SIZE_MAX)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "Volume %s is larger than 64 GiB.", v->guest_path);
                copy = fcntl(v->fd, F_DUPFD_CLOEXEC, 3);
                if (copy < 0)
                        return sd_bus_error_set_errnof(error, errno, "Cannot duplicate the descriptor of volume %s: %m",
                                                       v->guest_path);
                c->volumes[c->n_volumes] = *v;
                c->volumes[c->n_volumes++].fd = copy;
        }
        return 0;
}

static int read_create_options(sd_bus_message *message, bool image, struct create_options *o,
                               sd_bus_error *error) {
        int r;

        r = sd_bus_message_enter_container(message, 'a', "{sv}");
        if (r < 0)
                return r;
        for (;;) {
                const char *key;
                char type;
                int *b = NULL, *h = NULL;
                uint32_t *u = NULL;

                r = sd_bus_message_enter_container(message, 'e', "sv");
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                r = sd_bus_message_read(message, "s", &key);
                if (r < 0)
                        return r;
                if (streq(key, "volumes")) {
                        r = read_volumes(message, o, error);
                        if (r >= 0)
                                r = sd_bus_message_exit_container(message);
                        if (r < 0)
                                return r;
                        continue;
                }
                if (streq(key, "network"))
                        b = &o->network;
                else if (streq(key, "agent_tcp"))
                        b = &o->agent_tcp;
                else if (image && streq(key, "start_cmd"))
                        b = &o->start_cmd;
                else if (streq(key, "initrd"))
                        h = &o->initrd_fd;
                else if (image && streq(key, "kernel"))
                        h = &o->kernel_fd;
                else if (streq(key, "vcpus"))
                        u = &o->vcpus;
                else
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "Unknown option \"%.64s\" (known: %s).", key,
                                                 image ? "kernel, initrd, start_cmd, network, agent_tcp, volumes, vcpus" :
                                                         "initrd, network, agent_tcp, volumes, vcpus");
                type = b ? 'b' : u ? 'u' : 'h';
                r = sd_bus_message_enter_container(message, 'v', b ? "b" : u ? "u" : "h");
                if (r < 0)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Option %s must be of type %c.",
                                                 key, type);
                r = sd_bus_message_read_basic(message, type, b ? (void *) b : u ? (void *) u : (void *) h);
                if (r >= 0 && u && (*u < 1 || *u > SNAPSHOT_VCPUS_MAX))
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "Option vcpus must be from 1 to %u.", SNAPSHOT_VCPUS_MAX);
                if (r >= 0)
                        r = sd_bus_message_exit_container(message);
                if (r >= 0)
                        r = sd_bus_message_exit_container(message);
                if (r < 0)
                        return r;
        }
        r = sd_bus_message_exit_container(message);
        if (r < 0)
                return r;
        if (o->agent_tcp && !o->network)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "Option agent_tcp needs network: the guest agent's TCP port is reached "
                                         "through the NIC.");
        return 0;
}

int bus_manager_method_create_snapshot_from_fds(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        const char *tag;
        struct create_options opt = { .kernel_fd = -EBADF, .initrd_fd = -EBADF };
        int kernel_fd, rootfs_fd;
        uint32_t mem_mib, boot_wait;
        ImageCreate *c = NULL;
        int r;

        r = sd_bus_message_rewind(message, true); /* polkit may dispatch it twice */
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "shhuu", &tag, &kernel_fd, &rootfs_fd, &mem_mib, &boot_wait);
        if (r < 0)
                return r;
        r = read_create_options(message, false, &opt, error);
        if (r < 0)
                return r;
        r = verify_create(m, message, tag, mem_mib, boot_wait, error);
        if (r <= 0)
                return r < 0 ? r : 1; /* 0: polkit answers later and dispatches it again */

        c = image_create_new();
        if (!c)
                return -ENOMEM;
        c->network = opt.network;
        c->agent_tcp = opt.agent_tcp;
        c->vcpus = opt.vcpus;
        r = take_boot_fd("kernel", kernel_fd, BOOT_KERNEL_SIZE_MAX, &c->kernel_fd, &c->kernel_size, error);
        if (r >= 0)
                r = take_boot_fd("rootfs", rootfs_fd, BOOT_ROOTFS_SIZE_MAX, &c->rootfs_fd, &c->rootfs_size, error);
        if (r >= 0 && opt.initrd_fd >= 0)
                r = take_boot_fd("initrd", opt.initrd_fd, BOOT_INITRD_SIZE_MAX, &c->initrd_fd, &c->initrd_size,
                                 error);
        if (r >= 0)
                r = take_volumes(&opt, c, error);
        if (r < 0) {
                image_create_free(c);
                return r;
        }
        return create_snapshot_start(m, message, tag, mem_mib, boot_wait, c, error);
}

/* The image: a directory (an OCI image layout) or a regular file (an
 * oci-archive or docker-archive tar), open for reading; forkd's own copy. */
static int take_image_fd(int fd, int *ret_fd, sd_bus_error *error) {
        struct stat st;
        int flags, copy;

        flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fstat(fd, &st) < 0)
                return sd_bus_error_set_errnof(error, errno, "Cannot inspect the image descriptor: %m");
        if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "The image must be a directory (an OCI image layout) or a file (an "
                                         "oci-archive or docker-archive tar).");
        if ((S_ISREG(st.st_mode) && (flags & O_PATH)) || (flags & O_ACCMODE) == O_WRONLY)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "The image descriptor is not open for "
                                                                           "reading.");
        if (S_ISREG(st.st_mode) && (uint64_t) st.st_size > BOOT_IMAGE_SIZE_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "The image is larger than %" PRIu64 " GiB.",
                                         BOOT_IMAGE_SIZE_MAX >> 30);
        copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (copy < 0)
                return sd_bus_error_set_errnof(error, errno, "Cannot duplicate the image descriptor: %m");
        *ret_fd = copy;
        return 0;
}

/* The kernel (and initramfs) of a snapshot of an image: the caller's, else
 * the ones forkd was configured with (--default-kernel, --default-initrd). */
static int image_boot_files(Manager *m, const struct create_options *opt, ImageCreate *c, sd_bus_error *error) {
        char initrd[PATH_ARG_MAX + 16];
        int r;

        if (opt->kernel_fd >= 0) {
                r = take_boot_fd("kernel", opt->kernel_fd, BOOT_KERNEL_SIZE_MAX, &c->kernel_fd, &c->kernel_size,
                                 error);
                if (r >= 0 && opt->initrd_fd >= 0)
                        r = take_boot_fd("initrd", opt->initrd_fd, BOOT_INITRD_SIZE_MAX, &c->initrd_fd,
                                         &c->initrd_size, error);
                return r;
        }
        if (opt->initrd_fd >= 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Option initrd needs option kernel.");
        if (!m->default_kernel)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "No kernel: pass option kernel, or start forkd with --default-kernel.");
        r = open_boot_path("default kernel", m->default_kernel, BOOT_KERNEL_SIZE_MAX, &c->kernel_fd,
                           &c->kernel_size, error);
        if (r < 0)
                return r;
        if (m->default_initrd)
                return open_boot_path("default initrd", m->default_initrd, BOOT_INITRD_SIZE_MAX, &c->initrd_fd,
                                      &c->initrd_size, error);
        if (boot_initrd_beside(m->default_kernel, initrd, sizeof(initrd)) > 0)
                return open_boot_path("initrd", initrd, BOOT_INITRD_SIZE_MAX, &c->initrd_fd, &c->initrd_size,
                                      error);
        return 0;
}

/* What both image methods share once the image (fd or reference) is in c. */
static int create_from_image(Manager *m, sd_bus_message *message, const char *tag, uint32_t mem_mib,
                             uint32_t boot_wait, const struct create_options *opt, ImageCreate *c,
                             sd_bus_error *error) {
        int r;

        c->network = opt->network;
        c->agent_tcp = opt->agent_tcp;
        c->start_cmd = opt->start_cmd;
        c->vcpus = opt->vcpus;
        r = image_boot_files(m, opt, c, error);
        if (r >= 0)
                r = take_volumes(opt, c, error);
        if (r >= 0) {
                c->oci_path = strdup(m->oci_path);
                c->image_agent = strdup(m->image_agent_path);
                c->oci_cache = strdup(m->oci_cache_dir);
                if (!c->oci_path || !c->image_agent || !c->oci_cache)
                        r = -ENOMEM;
        }
        if (r < 0) {
                image_create_free(c);
                return r;
        }
        return create_snapshot_start(m, message, tag, mem_mib, boot_wait, c, error);
}

/* host[:port]/repo[:tag|@digest]: forkd-oci parses it; here only what a reference
 * can never hold. */
static bool image_ref_is_plausible(const char *ref) {
        size_t n = strlen(ref);

        if (n == 0 || n > IMAGE_REF_MAX || ref[0] == '/' || ref[0] == '-' || !strchr(ref, '/'))
                return false;
        for (const char *p = ref; *p; p++)
                if ((unsigned char) *p <= ' ' || (unsigned char) *p >= 0x7f)
                        return false;
        return true;
}

/* CreateSnapshotFromImage (image an fd) and CreateSnapshotFromImageRef (a reference). */
static int create_snapshot_from_image(sd_bus_message *message, Manager *m, bool by_ref, sd_bus_error *error) {
        struct create_options opt = { .kernel_fd = -EBADF, .initrd_fd = -EBADF };
        const char *tag, *ref = NULL;
        uint32_t mem_mib, boot_wait;
        ImageCreate *c = NULL;
        int image_fd = -EBADF, r;

        r = sd_bus_message_rewind(message, true); /* polkit may dispatch it twice */
        if (r < 0)
                return r;
        if (by_ref)
                r = sd_bus_message_read(message, "ssuu", &tag, &ref, &mem_mib, &boot_wait);
        else
                r = sd_bus_message_read(message, "shuu", &tag, &image_fd, &mem_mib, &boot_wait);
        if (r < 0)
                return r;
        r = read_create_options(message, true, &opt, error);
        if (r < 0)
                return r;
        if (ref && !image_ref_is_plausible(ref))
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "\"%.128s\" is not an image reference (host[:port]/repo[:tag] or "
                                         "host[:port]/repo@sha256:...).", ref);
        if (ref && access(m->registry_config_path, R_OK) < 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "Cannot pull %.128s: no registries are configured: %s: %m (forkd "
                                         "--registry-config).", ref, m->registry_config_path);
        r = verify_create(m, message, tag, mem_mib, boot_wait, error);
        if (r <= 0)
                return r < 0 ? r : 1; /* 0: polkit answers later and dispatches it again */

        c = image_create_new();
        if (!c)
                return -ENOMEM;
        if (ref) {
                c->image_ref = strdup(ref);
                c->registry_config = strdup(m->registry_config_path);
                r = c->image_ref && c->registry_config ? 0 : -ENOMEM;
        } else
                r = take_image_fd(image_fd, &c->image_fd, error);
        if (r < 0) {
                image_create_free(c);
                return r;
        }
        return create_from_image(m, message, tag, mem_mib, boot_wait, &opt, c, error);
}

int bus_manager_method_create_snapshot_from_image(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return create_snapshot_from_image(message, userdata, false, error);
}

int bus_manager_method_create_snapshot_from_image_ref(sd_bus_message *message, void *userdata,
                                                      sd_bus_error *error) {
        return create_snapshot_from_image(message, userdata, true, error);
}
