/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* A registered snapshot (state_dir/snapshots/<tag>/), and the job that
 * creates one. Named "image" so that it does not clash with src/vmm/snapshot.c. */

#include <stdint.h>

#include "manager.h"
#include "snapshot-meta.h"

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
/* Unregister (the files stay). Accepts NULL, returns NULL. */
Image *image_free(Image *i);
/* Remove the files (atomically: rename out of the way, then delete) and free. */
int image_delete(Image *i);

/* Tags of the registered snapshots whose parent_tag is tag; NULL-terminated
 * (free with strv_free()); *ret NULL-free even when empty. */
int image_dependents(Manager *m, const char *tag, char ***ret);
char **strv_free(char **l);
static inline void strv_freep(char ***l) {
        strv_free(*l);
}

int image_object_path(const char *tag, char **ret);

/* On-disk sizes for GetSnapshotInfo. */
struct image_sizes {
        uint64_t memory_logical, memory_physical, vmstate;
};
int image_sizes(Image *i, struct image_sizes *ret);

/* Creating a snapshot: runs in a worker thread, touches nothing shared. */
typedef struct ImageCreate {
        char *vmm_path, *tag, *kernel, *rootfs, *dir, *overlay_dir, *console_log;
        uint64_t mem_mib;
        unsigned boot_wait_secs;
        char *error; /* out: what went wrong, for the caller */
} ImageCreate;

ImageCreate *image_create_free(ImageCreate *c);
/* worker_fn_t: boot, wait for the agent, snapshot into c->dir, stop the VM. */
int image_create_work(void *userdata);
