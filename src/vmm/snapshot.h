/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Snapshot directories:
 *   snapshot.json  metadata (src/shared/snapshot-meta.h)
 *   vmstate        vCPU, VM and device state (vmstate.h)
 *   memory.bin     guest RAM, sparse
 *   disk.img       the root disk as the guest saw it
 * A snapshot is written into "<dir>.tmp.<pid>" and renamed into place only
 * once every file and the directory are fsynced, so a crash never leaves a
 * directory that looks complete.
 */

#include "snapshot-meta.h"
#include "vmm.h"
#include "virtio-blk.h"
#include "vmstate.h"

#define SNAPSHOT_META_FILE "snapshot.json"
#define SNAPSHOT_VMSTATE_FILE "vmstate"
#define SNAPSHOT_MEMORY_FILE "memory.bin"
#define SNAPSHOT_DISK_FILE "disk.img"

struct snapshot {
        char *dir;
        struct snapshot_meta meta;
        struct vmstate *state;
        int mem_fd;  /* memory.bin, O_RDONLY */
        int disk_fd; /* disk.img, O_RDONLY */
        /* disk.layer.<i> and their maps, O_RDONLY (meta.disk_layers of them) */
        int layer_fds[SNAPSHOT_DISK_LAYERS_MAX], layer_map_fds[SNAPSHOT_DISK_LAYERS_MAX];
        unsigned n_layers;
        /* The volumes of meta.volumes: volume-N.img (ro, cow) opened read-only;
         * for rw, -EBADF until the caller sets a read-write fd of the host file
         * (snapshot_set_rw_volumes()). A frozen copy of a running VM (branch.c)
         * also carries the frozen copy-on-write layers of its cow volumes. */
        struct snapshot_volume_disk {
                int fd;
                int *layer_fds, *map_fds;  /* n_layers each, malloc()ed */
                unsigned n_layers;
        } volumes[SNAPSHOT_VOLUMES_MAX];
        /* A diff snapshot's chain, root first, this snapshot last (chain.h):
         * memory.bin fds, and the page maps of the links (NULL for the root). */
        int chain_mem_fds[64];
        uint64_t *chain_maps[64];
        unsigned n_chain;
};

/* Load and validate a snapshot directory. On failure *ret_error (if given)
 * says what is wrong in words a user can act on. */
int snapshot_load(const char *dir, struct snapshot **ret, char **ret_error);
struct snapshot *snapshot_free(struct snapshot *s);
/* All volume fds -EBADF, no layers; and closing them (snapshot_free() does). */
void snapshot_volumes_init(struct snapshot *s);
void snapshot_volumes_close(struct snapshot *s);
/* Give the snapshot's rw volumes their fds (duplicated), in the order of
 * meta.volumes: exactly as many as it has, each a regular file open read-write
 * with the device and inode snapshot.json recorded. */
int snapshot_set_rw_volumes(struct snapshot *s, const int *fds, unsigned n, char **ret_error);
/* What the guest's writes to a volume of this mode do. */
enum virtio_blk_mode snapshot_volume_blk_mode(const struct snapshot_volume *v);
static inline void snapshot_freep(struct snapshot **s) {
        snapshot_free(*s);
}

/* Write a snapshot of a stopped (not inside KVM_RUN) VM to dir, atomically. */
int snapshot_write(struct vmm *vmm, const char *dir, const char *tag, const char *kernel);

/* The two halves of snapshot_write(), for a branch of a running VM:
 * snapshot_collect() saves the vCPU, VM and device state (KVM ioctls, so in
 * the process that made the VM, while it is not inside KVM_RUN) into an
 * encoded vmstate (*ret_buf malloc()ed); snapshot_write_collected() writes the
 * directory from it and from vmm's memory and disk, without any KVM call, so a
 * fork(2)ed copy of the VMM can do it while the VM runs on. With link_disk
 * (the disk's overlay is frozen: virtio_blk_freeze_overlay()) the disk is not
 * copied: its base and frozen layers are hard-linked into dir as disk.img and
 * disk.layer.<i> (snapshot.json's disk_layers), where the filesystem allows;
 * else, and without link_disk, the merged disk is exported into disk.img. */
/* pwrite(2) all of buf at off, in pieces of at most 1 GiB, again after EINTR. */
int snapshot_write_all(int fd, const void *buf, size_t len, off_t off);
int snapshot_collect(struct vmm *vmm, void **ret_buf, size_t *ret_len);
/* diff (may be NULL): write a chain link instead of the whole memory: the
 * pages that differ from the parent, the snapshot in diff->dir (tag
 * diff->tag) that the VM was restored from (chain.h). */
struct snapshot_parent {
        const char *dir, *tag;
};
/* origin (may be NULL): a branch of a running sandbox, recorded in
 * snapshot.json as branched_from and pause_us. */
struct snapshot_origin {
        const char *branched_from;
        uint64_t pause_us;
};
int snapshot_write_collected(struct vmm *vmm, const char *dir, const char *tag, const char *kernel, const void *vbuf,
                             size_t vlen, bool link_disk, const struct snapshot_parent *diff,
                             const struct snapshot_origin *origin);

/* What a writer leaves to forkd: the files of a snapshot it may not link
 * itself (fs.protected_hardlinks: a file of the VMM user, not of the
 * sandbox's own id; or one on another mount), each as a name in the snapshot
 * directory and a descriptor of the file (a regular one), for forkd (root, on
 * its own mount) to link. */
#define SNAPSHOT_HANDOFF_MAX 250u /* one message's descriptors (SCM_MAX_FD 253) */
struct snapshot_handoff {
        unsigned n;
        int fds[SNAPSHOT_HANDOFF_MAX];
        char names[SNAPSHOT_HANDOFF_MAX][32];
};

/* As snapshot_write_collected(), into the directory dfd that forkd made
 * (and renames into place once written, so this renames nothing): every file
 * synced, snapshot.json last. With h, the links refused are handed over in it
 * (snapshot_handoff_done() closes them); without, they are exported. */
int snapshot_write_handoff(struct vmm *vmm, int dfd, const char *tag, const char *kernel, const void *vbuf,
                           size_t vlen, bool link_disk, const struct snapshot_parent *diff,
                           const struct snapshot_origin *origin, struct snapshot_handoff *h);
/* snapshot_collect() and snapshot_write_handoff(), without links: the
 * "snapshot" control request with a directory from forkd. */
int snapshot_write_at(struct vmm *vmm, int dfd, const char *tag, const char *kernel);
void snapshot_handoff_done(struct snapshot_handoff *h);
/* When nobody takes them (forkd went away): each handed-over file copied
 * into dfd under its name (holes kept), then closed. */
int snapshot_handoff_copy(struct snapshot_handoff *h, int dfd);
