/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* A registered snapshot (state_dir/snapshots/<tag>/), and the job that
 * creates one. Named "image" so that it does not clash with src/vmm/snapshot.c. */

#include <stdint.h>

#include "manager.h"
#include "snapshot-meta.h"
#include "strv.h"

struct Image {
        Manager *manager;
        char *tag;
        char *dir;
        struct snapshot_meta meta;
        VmTemplate *template; /* NULL until the first fork */
        unsigned n_users;     /* forks in progress */
};

/* Validate state_dir/snapshots/<tag> and register it. -EEXIST if registered.
 * *ret_reason (optional) says what is wrong with a refused directory. */
int image_load(Manager *m, const char *tag, Image **ret, const char **ret_reason);
/* Record owner_uid in dir/snapshot.json (atomically, fsynced), before the
 * snapshot is registered; nothing is written when it says so already (root:
 * absent). Also drops the owner an unpacked bundle brought along. */
int image_write_owner(const char *dir, uid_t owner_uid);
/* The same, and agent_tcp (1 or 0; -1 keeps what forkd-vmm wrote, which is
 * its parent's for a diff snapshot). agent_tcp 1 needs the NIC forkd-vmm
 * recorded: -EINVAL without. image_config (snapshot.json "image", checked
 * already; NULL: keep what is there): the config of the OCI image it comes from. */
int image_write_meta(const char *dir, uid_t owner_uid, int agent_tcp, const char *image_config);
static inline uid_t image_owner(const Image *i) {
        return (uid_t) i->meta.owner_uid;
}

/* Unregister (the files stay). Accepts NULL, returns NULL. */
Image *image_free(Image *i);
/* Remove the files (atomically: rename out of the way, then delete) and free. */
int image_delete(Image *i);

/* Tags of the registered snapshots whose parent_tag is tag; NULL-terminated
 * (free with strv_free()); *ret NULL-free even when empty. */
int image_dependents(Manager *m, const char *tag, char ***ret);

int image_object_path(const char *tag, char **ret);

/* A chain held for a long operation (pack, push): chain[0] is its head; *ret_tags
 * and *ret_dirs get its tags and directories root first (NULL-terminated), and
 * each link's n_users goes up, so that DeleteSnapshot refuses it meanwhile.
 * *ret_n counts the links held, also when it fails half-way (-ENOMEM): release
 * them with image_release_chain() then too. */
int image_hold_chain(Image **chain, size_t n, char ***ret_tags, char ***ret_dirs, size_t *ret_n);
/* Undo image_hold_chain() for the n first tags: the links still registered. */
void image_release_chain(Manager *m, char **tags, size_t n);

/* On-disk sizes for GetSnapshotInfo. */
struct image_sizes {
        uint64_t memory_logical, memory_physical, vmstate;
};
int image_sizes(Image *i, struct image_sizes *ret);

/* Creating a snapshot: runs in a worker thread, touches nothing shared. */
/* Where a snapshot being created keeps the copies it boots from
 * (snapshots/.boot-<tag>/): removed after the boot, and at start. */
#define IMAGE_BOOT_STAGING_PREFIX ".boot-"
/* A compact's staging directory (chain.c), and an unpack's (pack-op.c):
 * ".unpack-XXXXXX". */
#define COMPACT_STAGING_PREFIX ".compact-staging-"
#define PACK_STAGING_PREFIX ".unpack-"

/* A volume of a snapshot being created: the caller's file (forkd's copy of the
 * descriptor), where the agent mounts it, and its mode. */
struct image_volume {
        int fd;
        enum snapshot_volume_mode mode;
        char guest_path[SNAPSHOT_VOLUME_PATH_MAX];
};

typedef struct ImageCreate {
        char *vmm_path, *tag, *dir, *overlay_dir, *console_log;
        char *staging;                     /* snapshots/.boot-<tag> */
        char *snapshots_dir;
        char **jail_links;                 /* the boot VMM's --jail-link (confine_jail_links()); NULL: none */
        uid_t writer_uid;                  /* owns the directory the snapshot is written into; -1: root */
        gid_t writer_gid;
        int kernel_fd, initrd_fd, rootfs_fd; /* checked by the caller; initrd_fd may be -EBADF */
        uint64_t kernel_size, initrd_size, rootfs_size;
        uint64_t mem_mib;
        unsigned vcpus;                    /* CreateSnapshotFrom* option "vcpus"; 0: 1 */
        unsigned boot_wait_secs;
        /* network: boot with a NIC, its tap in a throwaway namespace made for
         * the boot (netns.c, policy none) and removed after; agent_tcp: and
         * with AGENT_TCP_CMDLINE_SWITCH on the kernel command line. */
        bool network, agent_tcp;
        NetnsPrefix netns_prefix;
        /* A snapshot of an OCI image (image_fd >= 0, a directory or a tar; no
         * rootfs_fd): forkd-oci writes the root disk (image-oci.c). */
        int image_fd;
        char *image_ref, *registry_config; /* or a reference forkd-oci pulls (no image_fd) */
        bool start_cmd;
        char *oci_path, *image_agent, *oci_cache;
        char *image_config; /* out: the image's config (snapshot.json "image") */
        /* Volumes (CreateSnapshotFrom* option "volumes"): attached after the
         * root disk in this order, mounted by a Linux guest's agent before the
         * snapshot; forkd-vmm writes them into it (volume-N.img; rw: the path). */
        struct image_volume volumes[SNAPSHOT_VOLUMES_MAX];
        unsigned n_volumes;
        char *error; /* out: what went wrong, for the caller */
        bool error_invalid_args; /* out: the caller's input was refused (InvalidArgs) */
} ImageCreate;

/* The kernel command line switch that runs the image's agent as PID 1. */
#define IMAGE_AGENT_CMDLINE_SWITCH "forkd.init=/.forkd/forkd-agent"

/* A new job with its fds at -EBADF. */
ImageCreate *image_create_new(void);
ImageCreate *image_create_free(ImageCreate *c);
/* worker_fn_t: copy kernel, initramfs and root disk into c->staging, boot
 * from there, wait for the agent, snapshot into c->dir, stop the VM, remove
 * the staging directory. No VMM ever opens a caller's path. */
int image_create_work(void *userdata);

/* Sets c->error (printf-style) and returns r. */
int image_create_set_error(ImageCreate *c, int r, const char *fmt, ...) _printf_(3, 4);

/* Run forkd-oci on c->image_fd, writing the root disk to rootfs (in
 * c->staging) and c->image_config. Closes c->image_fd. On failure c->error
 * says why, and c->error_invalid_args when the image was refused. */
int image_oci_build(ImageCreate *c, const char *rootfs);
