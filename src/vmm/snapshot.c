/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <dirent.h>
#include <stdarg.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <time.h>

#include "chain.h"
#include "serial.h"
#include "snapshot.h"
#include "virtio-blk.h"
#include "virtio-mmio.h"
#include "x86.h"

/* For the tests: FORKD_TEST_BRANCH_STALL_MS=<ms> makes a snapshot wait that
 * long once its staging directory exists, so that a branch is reliably "in
 * flight" (and a restarted forkd finds it being written). */
static void test_stall(void) {
        const char *e = getenv("FORKD_TEST_BRANCH_STALL_MS");
        unsigned long ms;

        if (!e || !*e)
                return;
        ms = strtoul(e, NULL, 10);
        if (ms > 0 && ms <= 600000)
                (void) nanosleep(&(struct timespec) { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L }, NULL);
}

/* Fault injection for the crash-safety test: FORKD_TEST_CRASH_SNAPSHOT=<stage>
 * kills the process right after that stage, as a power cut would. */
static void test_crash_point(const char *stage) {
        const char *e = getenv("FORKD_TEST_CRASH_SNAPSHOT");
        if (e && strcmp(e, stage) == 0)
                _exit(99);
}

int snapshot_write_all(int fd, const void *buf, size_t len, off_t off) {
        const uint8_t *p = buf;

        while (len > 0) {
                ssize_t n = pwrite(fd, p, MIN(len, (size_t) 1 << 30), off);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                p += n;
                off += n;
                len -= n;
        }
        return 0;
}

static bool page_is_zero(const uint8_t *p) {
        const uint64_t *q = (const uint64_t *) p;
        for (unsigned i = 0; i < 4096 / 8; i++)
                if (q[i])
                        return false;
        return true;
}

/* The next part of a booted VM's RAM (a memfd) that the guest may have written,
 * [*off, *end), page-aligned: what it never touched is a hole of the memfd, and
 * reading it through the mapping would only allocate zeroed pages to scan.
 * Returns false when nothing is left. Without a memfd, or where SEEK_DATA
 * fails, the rest of RAM is one such part. */
static bool next_written(const struct vmm *vmm, uint64_t *off, uint64_t *end) {
        off_t data, hole;

        *end = vmm->mem_size;
        if (vmm->mem_fd < 0)
                return *off < vmm->mem_size;
        data = lseek(vmm->mem_fd, (off_t) *off, SEEK_DATA);
        if (data < 0)
                return errno != ENXIO && *off < vmm->mem_size; /* ENXIO: holes to the end */
        hole = lseek(vmm->mem_fd, data, SEEK_HOLE);
        *off = (uint64_t) data & ~(uint64_t) 4095;
        if (hole >= 0 && (uint64_t) hole < vmm->mem_size)
                *end = ((uint64_t) hole + 4095) & ~(uint64_t) 4095;
        return *off < vmm->mem_size;
}

/* Guest RAM, sparse: runs of non-zero pages are written, zero pages stay holes. */
static int write_memory(int dfd, const struct vmm *vmm) {
        _cleanup_close_ int fd = -EBADF;
        uint64_t off = 0, part_end;
        int r;

        fd = openat(dfd, SNAPSHOT_MEMORY_FILE, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        if (fd < 0)
                return -errno;
        if (ftruncate(fd, vmm->mem_size) < 0)
                return -errno;

        while (next_written(vmm, &off, &part_end)) {
                while (off < part_end) {
                        uint64_t end;

                        if (page_is_zero(vmm->mem + off)) {
                                off += 4096;
                                continue;
                        }
                        for (end = off + 4096; end < part_end && !page_is_zero(vmm->mem + end); end += 4096)
                                ;
                        r = snapshot_write_all(fd, vmm->mem + off, end - off, off);
                        if (r < 0)
                                return r;
                        off = end;
                }
        }
        if (fsync(fd) < 0)
                return -errno;
        return 0;
}

static int write_file_at(int dfd, const char *name, const void *buf, size_t len) {
        _cleanup_close_ int fd = -EBADF;
        int r;

        fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        if (fd < 0)
                return -errno;
        r = snapshot_write_all(fd, buf, len, 0);
        if (r < 0)
                return r;
        return fsync(fd) < 0 ? -errno : 0;
}

static int add_dev(struct vmstate *s, uint32_t kind, int (*save)(void *dev, void *buf, size_t cap, size_t *len),
                   void *dev) {
        struct vmstate_dev *d;
        size_t len;
        int r;

        if (s->n_devs >= VMSTATE_MAX_DEVS)
                return -E2BIG;
        d = &s->devs[s->n_devs];
        r = save(dev, d->blob, sizeof(d->blob), &len);
        if (r < 0)
                return r;
        d->kind = kind;
        d->len = (uint32_t) len;
        s->n_devs++;
        return 0;
}

static int save_serial(void *dev, void *buf, size_t cap, size_t *len) {
        return serial_save(dev, buf, cap, len);
}
static int save_virtio(void *dev, void *buf, size_t cap, size_t *len) {
        return virtio_mmio_save(dev, buf, cap, len);
}

static int collect_state(struct vmm *vmm, struct vmstate *s) {
        int r;

        memset(s, 0, sizeof(*s));
        s->memory.mem_size = vmm->mem_size;
        s->memory.tsc_khz = vmm->tsc_khz;
        s->memory.generation = vmm->generation;
        s->n_vcpus = vmm->n_vcpus;

        /* MP state is read first inside x86_vcpu_save, as Firecracker does.
         * The caller stopped every vCPU (vmm_vcpus_stop()). */
        for (unsigned i = 0; i < vmm->n_vcpus; i++) {
                r = x86_vcpu_save(vmm, i, vmm->cpuid, &s->vcpus[i]);
                if (r < 0)
                        return r;
        }
        r = x86_vm_save(vmm, s);
        if (r < 0)
                return r;
        r = add_dev(s, VMSTATE_DEV_SERIAL, save_serial, vmm->serial);
        if (r >= 0)
                r = add_dev(s, VMSTATE_DEV_VIRTIO_BLK, save_virtio, vmm->blk);
        if (r >= 0)
                r = add_dev(s, VMSTATE_DEV_VIRTIO_CONSOLE, save_virtio, vmm->console);
        /* Only a VM with a NIC gets the section: the vmstate of one without
         * stays byte for byte what it always was. */
        if (r >= 0 && vmm->net)
                r = add_dev(s, VMSTATE_DEV_VIRTIO_NET, save_virtio, vmm->net);
        /* The volumes last, in their order (machine.c restores them so). */
        for (unsigned i = 0; r >= 0 && i < vmm->n_volumes; i++)
                r = add_dev(s, VMSTATE_DEV_VIRTIO_BLK, save_virtio, vmm->volumes[i]);
        return r;
}

static void remove_dir_files(const char *dir) {
        DIR *d = opendir(dir);
        struct dirent *de;

        if (!d)
                return;
        while ((de = readdir(d)))
                if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, ".."))
                        (void) unlinkat(dirfd(d), de->d_name, 0);
        closedir(d);
        (void) rmdir(dir);
}

int snapshot_collect(struct vmm *vmm, void **ret_buf, size_t *ret_len) {
        _cleanup_free_ struct vmstate *s = NULL;
        int r;

        s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        r = collect_state(vmm, s);
        if (r < 0)
                return log_debug_errno(r, "Failed to collect VM state: %m");
        return vmstate_encode(s, ret_buf, ret_len);
}

int snapshot_write(struct vmm *vmm, const char *dir, const char *tag, const char *kernel) {
        _cleanup_free_ void *vbuf = NULL;
        size_t vlen;
        int r;

        if (!dir || dir[0] != '/' || strlen(dir) >= PATH_MAX - 32 || !snapshot_tag_is_valid(tag))
                return -EINVAL;
        if (access(dir, F_OK) == 0)
                return -EEXIST;
        r = snapshot_collect(vmm, &vbuf, &vlen);
        if (r < 0)
                return r;
        return snapshot_write_collected(vmm, dir, tag, kernel, vbuf, vlen, false, NULL, NULL);
}

/* The volumes into dfd and meta: ro and cow as volume-<i>.img, the disk as the
 * guest sees it (an ro one hard-linked where link allows: its base is never
 * written), rw as the host file's path, device and inode. */
static int write_volumes(struct vmm *vmm, int dfd, bool link, struct snapshot_meta *meta) {
        for (unsigned i = 0; i < vmm->n_volumes; i++) {
                struct snapshot_volume *v = &meta->volumes[i];
                _cleanup_close_ int fd = -EBADF;
                int r;

                *v = vmm->volume_meta[i];
                if (snapshot_volume_mode_from_string(v->mode) == SNAPSHOT_VOLUME_RW) {
                        v->file[0] = 0;
                        continue;
                }
                snprintf(v->file, sizeof(v->file), "volume-%u.img", i);
                if (link && snapshot_volume_mode_from_string(v->mode) == SNAPSHOT_VOLUME_RO &&
                    virtio_blk_link_base(vmm->volumes[i], dfd, v->file) >= 0)
                        continue;
                fd = openat(dfd, v->file, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
                if (fd < 0)
                        return -errno;
                r = virtio_blk_export(vmm->volumes[i], fd);
                if (r < 0)
                        return r;
                if (fsync(fd) < 0)
                        return -errno;
        }
        meta->n_volumes = vmm->n_volumes;
        return 0;
}

/* A branch's writer hands forkd the files it may not link (snapshot.h). */
static struct snapshot_handoff *handoff;

static int handoff_take(int fd, int dfd, const char *name) {
        struct stat st;
        int k;

        if (!handoff || handoff->n >= SNAPSHOT_HANDOFF_MAX || strlen(name) >= sizeof(handoff->names[0]))
                return -EXDEV;
        /* A regular file only. Which user owns it says little here: in a sandbox's
         * user namespace the VMM user's files show as the overflow uid, as root's
         * do; forkd looks at the owner (and copies what is not a VMM's). */
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
                return -EXDEV;
        k = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (k < 0)
                return -errno;
        handoff->fds[handoff->n] = k;
        snprintf(handoff->names[handoff->n], sizeof(handoff->names[0]), "%s", name);
        handoff->n++;
        return 0;
}

/* The size of name in dfd, or of the file handed over for it. */
static int stat_written(int dfd, const char *name, struct stat *ret) {
        if (fstatat(dfd, name, ret, AT_SYMLINK_NOFOLLOW) >= 0)
                return 0;
        for (unsigned i = 0; handoff && i < handoff->n; i++)
                if (strcmp(handoff->names[i], name) == 0)
                        return fstat(handoff->fds[i], ret) < 0 ? -errno : 0;
        return -errno;
}

/* Everything of the snapshot into the directory dfd, synced. */
static int write_into(struct vmm *vmm, int dfd, const char *tag, const char *kernel, const void *vbuf, size_t vlen,
                      bool link_disk, const struct snapshot_parent *diff, const struct snapshot_origin *origin) {
        _cleanup_free_ char *json = NULL;
        _cleanup_close_ int disk_fd = -EBADF;
        struct snapshot_meta meta = {};
        struct stat st;
        int r;

        test_stall();

        if (diff) {
                _cleanup_close_ int pdfd = -EBADF, pmem = -EBADF;
                struct snapshot_meta pm;
                const char *err = NULL;
                char path[PATH_MAX];

                /* The parent: the snapshot the VM was restored from, unchanged since. */
                snprintf(path, sizeof(path), "%s/%s", diff->dir, SNAPSHOT_META_FILE);
                r = snapshot_meta_read_file(path, &pm, &err);
                if (r < 0)
                        return r;
                if (strcmp(pm.tag, diff->tag) != 0 || pm.mem_size != vmm->mem_size)
                        return -EBADMSG;
                pdfd = open(diff->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                pmem = pdfd < 0 ? -EBADF : openat(pdfd, pm.memory_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                if (pmem < 0)
                        return -errno;
                r = chain_hash_file_cached(pdfd, pm.memory_file, pmem, meta.parent_content_hash);
                if (r < 0)
                        return r;
                snprintf(meta.parent_tag, sizeof(meta.parent_tag), "%s", diff->tag);
                /* The guest's agent keeps the TCP port its parent was booted with. */
                meta.agent_tcp = pm.agent_tcp && vmm->net;
                r = chain_write_memory_diff(dfd, vmm);
        } else
                r = write_memory(dfd, vmm);
        if (r < 0)
                return r;
        test_crash_point("memory");

        r = write_file_at(dfd, SNAPSHOT_VMSTATE_FILE, vbuf, vlen);
        if (r < 0)
                return r;
        test_crash_point("vmstate");

        if (link_disk) {
                unsigned n = handoff ? handoff->n : 0;

                r = virtio_blk_link_layers(vmm->blk, dfd, SNAPSHOT_DISK_FILE, &meta.disk_layers);
                /* Exported after all: nothing of the disk is forkd's to link. */
                while (r < 0 && handoff && handoff->n > n)
                        safe_close(handoff->fds[--handoff->n]);
        }
        if (link_disk && r >= 0) {
                r = stat_written(dfd, SNAPSHOT_DISK_FILE, &st);
                if (r < 0)
                        return r;
        } else {
                meta.disk_layers = 0;
                disk_fd = openat(dfd, SNAPSHOT_DISK_FILE, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
                if (disk_fd < 0)
                        return -errno;
                r = virtio_blk_export(vmm->blk, disk_fd);
                if (r < 0)
                        return r;
                if (fsync(disk_fd) < 0 || fstat(disk_fd, &st) < 0)
                        return -errno;
        }
        r = write_volumes(vmm, dfd, link_disk, &meta);
        if (r < 0)
                return r;
        test_crash_point("disk");

        meta.format = 1;
        snprintf(meta.tag, sizeof(meta.tag), "%s", tag);
        if (origin && origin->branched_from) {
                snprintf(meta.branched_from, sizeof(meta.branched_from), "%s", origin->branched_from);
                meta.pause_us = MIN(origin->pause_us, SNAPSHOT_PAUSE_US_MAX);
        }
        meta.created_at_unix = (int64_t) time(NULL);
        meta.mem_size = vmm->mem_size;
        meta.vcpus = vmm->n_vcpus;
        meta.generation = vmm->generation;
        snprintf(meta.memory_file, sizeof(meta.memory_file), "%s", SNAPSHOT_MEMORY_FILE);
        snprintf(meta.vmstate_file, sizeof(meta.vmstate_file), "%s", SNAPSHOT_VMSTATE_FILE);
        snprintf(meta.disk_file, sizeof(meta.disk_file), "%s", SNAPSHOT_DISK_FILE);
        meta.disk_size = (uint64_t) st.st_size;
        snprintf(meta.kernel, sizeof(meta.kernel), "%s", kernel ?: "");
        snprintf(meta.guest, sizeof(meta.guest), "%s", vmm->guest_kind[0] ? vmm->guest_kind : "test");
        meta.network = vmm->net != NULL; /* restoring it needs a tap (forkd-vmm(8), NETWORK) */
        r = snapshot_meta_format(&meta, &json);
        if (r < 0)
                return r;
        r = write_file_at(dfd, SNAPSHOT_META_FILE, json, strlen(json));
        if (r < 0)
                return r;
        test_crash_point("meta");

        return fsync(dfd) < 0 ? -errno : 0;
}

int snapshot_write_collected(struct vmm *vmm, const char *dir, const char *tag, const char *kernel, const void *vbuf,
                             size_t vlen, bool link_disk, const struct snapshot_parent *diff,
                             const struct snapshot_origin *origin) {
        _cleanup_free_ char *staging = NULL, *parent = NULL;
        _cleanup_close_ int dfd = -EBADF, pfd = -EBADF;
        char *slash;
        int r;

        if (!dir || dir[0] != '/' || strlen(dir) >= PATH_MAX - 32 || !snapshot_tag_is_valid(tag))
                return -EINVAL;
        if (access(dir, F_OK) == 0)
                return -EEXIST;

        parent = strdup(dir);
        if (!parent || asprintf(&staging, "%s.tmp.%d", dir, (int) getpid()) < 0)
                return -ENOMEM;
        slash = strrchr(parent, '/');
        if (slash == parent)
                parent[1] = 0;
        else
                *slash = 0;

        pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (pfd < 0)
                return log_debug_errno(errno, "Failed to open %s: %m", parent);

        remove_dir_files(staging); /* a leftover from a crashed run of this pid */
        if (mkdir(staging, 0750) < 0)
                return log_debug_errno(errno, "Failed to create %s: %m", staging);
        dfd = open(staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) {
                r = -errno;
                goto fail;
        }
        r = write_into(vmm, dfd, tag, kernel, vbuf, vlen, link_disk, diff, origin);
        if (r < 0)
                goto fail;
        if (rename(staging, dir) < 0) {
                r = -errno;
                goto fail;
        }
        test_crash_point("rename");
        if (fsync(pfd) < 0)
                return -errno;
        return 0;
fail:
        remove_dir_files(staging);
        return r;
}

int snapshot_write_handoff(struct vmm *vmm, int dfd, const char *tag, const char *kernel, const void *vbuf,
                           size_t vlen, bool link_disk, const struct snapshot_parent *diff,
                           const struct snapshot_origin *origin, struct snapshot_handoff *h) {
        int r;

        if (dfd < 0 || !snapshot_tag_is_valid(tag))
                return -EINVAL;
        if (h) {
                h->n = 0;
                handoff = h;
                virtio_blk_on_link_refused(handoff_take);
        }
        r = write_into(vmm, dfd, tag, kernel, vbuf, vlen, link_disk, diff, origin);
        virtio_blk_on_link_refused(NULL);
        handoff = NULL;
        if (r >= 0)
                test_crash_point("rename"); /* written, not yet the caller's to rename */
        if (r < 0 && h)
                snapshot_handoff_done(h);
        return r;
}

int snapshot_write_at(struct vmm *vmm, int dfd, const char *tag, const char *kernel) {
        _cleanup_free_ void *vbuf = NULL;
        size_t vlen;
        int r;

        r = snapshot_collect(vmm, &vbuf, &vlen);
        if (r < 0)
                return r;
        return snapshot_write_handoff(vmm, dfd, tag, kernel, vbuf, vlen, false, NULL, NULL, NULL);
}

void snapshot_handoff_done(struct snapshot_handoff *h) {
        for (unsigned i = 0; i < h->n; i++)
                safe_close(h->fds[i]);
        h->n = 0;
}

/* A copy of the data of fd (from 0 to its size) as dfd/name, holes kept where the source has them. */
static int copy_file_at(int fd, int dfd, const char *name) {
        _cleanup_close_ int out = -EBADF;
        struct stat st;
        off_t off = 0;

        if (fstat(fd, &st) < 0)
                return -errno;
        out = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        if (out < 0 || ftruncate(out, st.st_size) < 0)
                return -errno;
        while (off < st.st_size) {
                off_t data = lseek(fd, off, SEEK_DATA), hole;

                if (data < 0 && errno == ENXIO)
                        break; /* a hole to the end */
                if (data < 0)
                        return -errno;
                hole = lseek(fd, data, SEEK_HOLE);
                if (hole < 0)
                        return -errno;
                for (off_t in = data, o = data; in < hole;) {
                        ssize_t n = copy_file_range(fd, &in, out, &o, (size_t) MIN(hole - in, (off_t) 1 << 30), 0);

                        if (n < 0 && errno == EINTR)
                                continue;
                        if (n < 0)
                                return -errno;
                        if (n == 0)
                                return -EIO;
                }
                off = hole;
        }
        return fsync(out) < 0 ? -errno : 0;
}

int snapshot_handoff_copy(struct snapshot_handoff *h, int dfd) {
        for (unsigned i = 0; i < h->n; i++) {
                int r = copy_file_at(h->fds[i], dfd, h->names[i]);

                if (r < 0)
                        return r;
        }
        snapshot_handoff_done(h);
        return fsync(dfd) < 0 ? -errno : 0;
}

static int set_error(char **ret_error, const char *fmt, ...) _printf_(2, 3);
static int set_error(char **ret_error, const char *fmt, ...) {
        va_list ap;

        if (ret_error) {
                free(*ret_error);
                va_start(ap, fmt);
                if (vasprintf(ret_error, fmt, ap) < 0)
                        *ret_error = NULL;
                va_end(ap);
        }
        return -EBADMSG;
}

static int open_regular(int dfd, const char *name, uint64_t expect_size, char **ret_error, int *ret_fd) {
        _cleanup_close_ int fd = -EBADF;
        struct stat st;

        fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return set_error(ret_error, "%s: cannot open: %s", name, strerror(errno));
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
                return set_error(ret_error, "%s: not a regular file", name);
        if ((uint64_t) st.st_size != expect_size)
                return set_error(ret_error, "%s: size %lld, expected %llu (truncated or corrupt)", name,
                                 (long long) st.st_size, (unsigned long long) expect_size);
        *ret_fd = TAKE_FD(fd);
        return 0;
}

void snapshot_volumes_init(struct snapshot *s) {
        for (unsigned i = 0; i < SNAPSHOT_VOLUMES_MAX; i++)
                s->volumes[i] = (struct snapshot_volume_disk) { .fd = -EBADF };
}

void snapshot_volumes_close(struct snapshot *s) {
        for (unsigned i = 0; i < SNAPSHOT_VOLUMES_MAX; i++) {
                struct snapshot_volume_disk *d = &s->volumes[i];

                safe_close(d->fd);
                for (unsigned k = 0; k < d->n_layers; k++) {
                        safe_close(d->layer_fds[k]);
                        safe_close(d->map_fds[k]);
                }
                free(d->layer_fds);
                free(d->map_fds);
                *d = (struct snapshot_volume_disk) { .fd = -EBADF };
        }
}

int snapshot_load(const char *dir, struct snapshot **ret, char **ret_error) {
        struct snapshot *snap = NULL;
        _cleanup_close_ int dfd = -EBADF, fd = -EBADF;
        const char *err = NULL;
        char path[PATH_MAX];
        int r;

        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) {
                r = -errno;
                set_error(ret_error, "%s: cannot open snapshot directory: %s", dir, strerror(-r));
                return r;
        }

        snap = calloc(1, sizeof(*snap));
        if (!snap)
                return -ENOMEM;
        snap->mem_fd = snap->disk_fd = -EBADF;
        for (unsigned i = 0; i < SNAPSHOT_DISK_LAYERS_MAX; i++)
                snap->layer_fds[i] = snap->layer_map_fds[i] = -EBADF;
        snapshot_volumes_init(snap);
        snap->dir = strdup(dir);
        snap->state = calloc(1, sizeof(*snap->state));
        if (!snap->dir || !snap->state) {
                r = -ENOMEM;
                goto fail;
        }

        snprintf(path, sizeof(path), "%s/%s", dir, SNAPSHOT_META_FILE);
        r = snapshot_meta_read_file(path, &snap->meta, &err);
        if (r < 0) {
                r = set_error(ret_error, "%s: %s", SNAPSHOT_META_FILE, err ?: strerror(-r));
                goto fail;
        }

        snprintf(path, sizeof(path), "%s/%s", dir, snap->meta.vmstate_file);
        r = vmstate_read_file(path, snap->state, &err);
        if (r < 0) {
                r = set_error(ret_error, "%s: %s", snap->meta.vmstate_file, err ?: strerror(-r)) ;
                goto fail;
        }
        if (snap->state->memory.mem_size != snap->meta.mem_size || snap->state->n_vcpus != snap->meta.vcpus) {
                r = set_error(ret_error, "vmstate and snapshot.json disagree about the machine");
                goto fail;
        }

        r = open_regular(dfd, snap->meta.memory_file, snap->meta.mem_size, ret_error, &snap->mem_fd);
        if (r < 0)
                goto fail;
        r = open_regular(dfd, snap->meta.disk_file, snap->meta.disk_size, ret_error, &snap->disk_fd);
        if (r < 0)
                goto fail;
        r = chain_load(snap, ret_error);
        if (r < 0)
                goto fail;
        for (unsigned i = 0; i < snap->meta.disk_layers; i++) {
                char name[64];

                snprintf(name, sizeof(name), "disk.layer.%u", i + 1);
                snap->layer_fds[i] = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                if (snap->layer_fds[i] < 0) {
                        r = set_error(ret_error, "%s: cannot open: %s", name, strerror(errno));
                        goto fail;
                }
                snap->n_layers = i + 1;
                snprintf(name, sizeof(name), "disk.layer.%u.map", i + 1);
                r = open_regular(dfd, name, (snap->meta.disk_size / 512 * 512 + 4095) / 4096 / 64 * 8 + 8,
                                 ret_error, &snap->layer_map_fds[i]);
                if (r < 0)
                        goto fail;
        }

        for (unsigned i = 0; i < snap->meta.n_volumes; i++) {
                const struct snapshot_volume *v = &snap->meta.volumes[i];
                struct stat st;

                if (!v->file[0])
                        continue; /* rw: the caller's fd */
                snap->volumes[i].fd = openat(dfd, v->file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                if (snap->volumes[i].fd < 0) {
                        r = set_error(ret_error, "%s: cannot open: %s", v->file, strerror(errno));
                        goto fail;
                }
                if (fstat(snap->volumes[i].fd, &st) < 0 || !S_ISREG(st.st_mode) ||
                    (uint64_t) st.st_size > SNAPSHOT_VOLUME_SIZE_MAX) {
                        r = set_error(ret_error, "%s: not a regular file of at most 64 GiB", v->file);
                        goto fail;
                }
        }

        *ret = snap;
        return 0;
fail:
        snapshot_free(snap);
        return r;
}

enum virtio_blk_mode snapshot_volume_blk_mode(const struct snapshot_volume *v) {
        switch (snapshot_volume_mode_from_string(v->mode)) {
        case SNAPSHOT_VOLUME_RW:
                return VIRTIO_BLK_DIRECT;
        case SNAPSHOT_VOLUME_COW:
                return VIRTIO_BLK_COPY_ON_WRITE;
        default:
                return VIRTIO_BLK_READ_ONLY;
        }
}

int snapshot_set_rw_volumes(struct snapshot *s, const int *fds, unsigned n, char **ret_error) {
        unsigned k = 0;

        for (unsigned i = 0; i < s->meta.n_volumes; i++) {
                const struct snapshot_volume *v = &s->meta.volumes[i];
                struct stat st;
                int flags;

                if (v->file[0])
                        continue;
                if (k >= n)
                        return set_error(ret_error, "the rw volume %s (%s) needs a --volume-fd", v->guest_path,
                                         v->host_path);
                flags = fcntl(fds[k], F_GETFL);
                if (flags < 0 || (flags & O_ACCMODE) != O_RDWR || fstat(fds[k], &st) < 0 || !S_ISREG(st.st_mode))
                        return set_error(ret_error, "--volume-fd %d for %s is not a regular file open read-write",
                                         fds[k], v->host_path);
                if ((uint64_t) st.st_dev != v->dev || (uint64_t) st.st_ino != v->ino)
                        return set_error(ret_error, "--volume-fd %d is not %s (device %llu, inode %llu) that the "
                                         "snapshot was made with", fds[k], v->host_path,
                                         (unsigned long long) v->dev, (unsigned long long) v->ino);
                s->volumes[i].fd = safe_close(s->volumes[i].fd);
                s->volumes[i].fd = fcntl(fds[k], F_DUPFD_CLOEXEC, 3);
                if (s->volumes[i].fd < 0)
                        return -errno;
                k++;
        }
        if (k != n)
                return set_error(ret_error, "%u --volume-fd given, the snapshot has %u rw volumes", n, k);
        return 0;
}

struct snapshot *snapshot_free(struct snapshot *s) {
        if (!s)
                return NULL;
        safe_close(s->mem_fd);
        safe_close(s->disk_fd);
        chain_free(s);
        for (unsigned i = 0; i < SNAPSHOT_DISK_LAYERS_MAX; i++) {
                safe_close(s->layer_fds[i]);
                safe_close(s->layer_map_fds[i]);
        }
        snapshot_volumes_close(s);
        free(s->state);
        free(s->dir);
        free(s);
        return NULL;
}
