/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * snapshot.json: the metadata file of a snapshot directory.
 *
 * A JSON object with exactly these keys (unknown or missing keys are refused):
 *
 *   format               1
 *   tag                  ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$
 *   created_at_unix      integer seconds, >= 0
 *   mem_size             bytes, non-zero multiple of 2 MiB, <= 3 GiB
 *   vcpus                1..SNAPSHOT_VCPUS_MAX (32): the VM's vCPUs, fixed when the
 *                        snapshot is created; every fork and branch keeps it
 *   generation           unsigned integer
 *   memory_file          plain file name inside the snapshot directory
 *   vmstate_file         plain file name
 *   disk_file            plain file name
 *   disk_size            bytes (unsigned integer)
 *   kernel               non-empty path, < 1024 bytes, no control characters
 *   guest                "test" or "linux"
 *   parent_tag           null or a tag
 *   parent_content_hash  null or 64 lowercase hex digits
 *   disk_layers          optional, 1..SNAPSHOT_DISK_LAYERS_MAX (absent: 0): read-only
 *                        copy-on-write layers over disk_file, oldest first, in the
 *                        files "disk.layer.<i>" (blocks at their own offsets) and
 *                        "disk.layer.<i>.map" (a bitmap of the 4 KiB blocks they hold,
 *                        little-endian 64-bit words, disk_size / 4096 / 64 + 1 of them)
 *   branched_from        optional: the id of the sandbox a branch was made of
 *   pause_us             optional, only with branched_from: the source's pause
 *   owner_uid            optional (absent: 0, root): the uid that made the snapshot,
 *                        written by forkd once the snapshot is in place; never
 *                        4294967295 ((uid_t) -1). Snapshots made before forkd
 *                        recorded owners have none: they belong to root
 *   network              optional boolean (absent: false): the VM had a NIC
 *                        (virtio-net) when it was snapshotted; written by forkd-vmm
 *   agent_tcp            optional boolean (absent: false), only with network: the
 *                        guest was booted with forkd.agent_tcp=1 and its agent
 *                        answers on AGENT_TCP_PORT (agent-tcp-port.h); written by forkd
 *   volumes              optional, 1..SNAPSHOT_VOLUMES_MAX entries (absent: none): the
 *                        disks attached after the root disk, in device order (vdb, vdc,
 *                        ...), each an object with exactly
 *                          file        a plain file name in the snapshot directory
 *                                      (ro, cow), null for rw
 *                          guest_path  where the agent mounted it (snapshot_volume_guest_path_is_valid())
 *                          mode        "ro", "cow" or "rw"
 *                          host_path   rw only: the absolute path of the host file
 *                          dev, ino    rw only: its device and inode when it was attached
 *                        no two with the same guest_path or file
 *
 * A plain file name is 1..64 bytes, not "." or "..", without '/' and
 * without control characters.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SNAPSHOT_META_FORMAT 1
#define SNAPSHOT_TAG_MAX 64
#define SNAPSHOT_VCPUS_MAX 32u
#define SNAPSHOT_FILE_NAME_MAX 64
#define SNAPSHOT_KERNEL_PATH_MAX 1024 /* buffer size, including the NUL */
#define SNAPSHOT_HASH_LEN 64
/* forkd-vmm's cache of a file's SHA-256 beside it (chain.h); never packed. */
#define SNAPSHOT_HASH_CACHE_SUFFIX ".sha256"
#define SNAPSHOT_DISK_LAYERS_MAX 256u
#define SNAPSHOT_MEM_ALIGN (UINT64_C(2) << 20)
#define SNAPSHOT_MEM_MAX (UINT64_C(3) << 30)
#define SNAPSHOT_PAUSE_US_MAX (UINT64_C(3600) * 1000000) /* pause_us beyond an hour is refused */
#define SNAPSHOT_META_FILE_MAX (64u * 1024u) /* a larger snapshot.json is refused */
/* In a staging directory that forkd made (a branch's), written by the writer
 * once the snapshot is whole when forkd was not there to take it: the next
 * forkd renames such a directory into place. Never in a snapshot. */
#define SNAPSHOT_STAGING_WHOLE_FILE ".whole"

#define SNAPSHOT_VOLUMES_MAX 24u
#define SNAPSHOT_VOLUME_PATH_MAX 256  /* guest_path buffer, including the NUL */
#define SNAPSHOT_VOLUME_HOST_PATH_MAX 1024 /* host_path buffer, including the NUL */
#define SNAPSHOT_VOLUME_SIZE_MAX (UINT64_C(64) << 30)

enum snapshot_volume_mode {
        SNAPSHOT_VOLUME_RO,
        SNAPSHOT_VOLUME_COW,
        SNAPSHOT_VOLUME_RW,
        _SNAPSHOT_VOLUME_MODE_MAX,
};

struct snapshot_volume {
        char file[SNAPSHOT_FILE_NAME_MAX + 1];            /* "": null (rw) */
        char guest_path[SNAPSHOT_VOLUME_PATH_MAX];
        char mode[4];                                      /* "ro", "cow" or "rw" */
        char host_path[SNAPSHOT_VOLUME_HOST_PATH_MAX];     /* rw only */
        uint64_t dev, ino;                                 /* rw only */
};

/* The container image config a snapshot was made from (compact JSON, NUL included). */
#define SNAPSHOT_IMAGE_CONFIG_MAX (16u * 1024u)

struct snapshot_meta {
        int format;
        char tag[SNAPSHOT_TAG_MAX + 1];
        int64_t created_at_unix;
        uint64_t mem_size;
        uint32_t vcpus;
        uint64_t generation;
        char memory_file[SNAPSHOT_FILE_NAME_MAX + 1];
        char vmstate_file[SNAPSHOT_FILE_NAME_MAX + 1];
        char disk_file[SNAPSHOT_FILE_NAME_MAX + 1];
        uint64_t disk_size;
        char kernel[SNAPSHOT_KERNEL_PATH_MAX];
        char guest[16];                                    /* "test" or "linux" */
        char parent_tag[SNAPSHOT_TAG_MAX + 1];             /* "" means null */
        char parent_content_hash[SNAPSHOT_HASH_LEN + 1];   /* "" means null */
        uint32_t disk_layers;                              /* 0: absent */
        /* A branch of a running sandbox: its id and the pause (absent otherwise). */
        char branched_from[SNAPSHOT_TAG_MAX + 1];          /* "": absent */
        uint64_t pause_us;                                 /* only with branched_from */
        uint32_t owner_uid;                                /* 0 (root) when absent */
        bool network;                                      /* false when absent */
        bool agent_tcp;                                    /* false when absent; needs network */
        /* A snapshot of an OCI image: its config as a compact JSON object with only
         * env, working_dir, user, entrypoint, cmd and start_cmd ("": absent). */
        char image_config[SNAPSHOT_IMAGE_CONFIG_MAX];
        uint32_t n_volumes;
        struct snapshot_volume volumes[SNAPSHOT_VOLUMES_MAX];
};

struct json_object;
/* Check an image config object (the "image" of snapshot.json; forkd-oci's
 * "config") and write it compact into buf: env, entrypoint and cmd arrays of
 * at most 256 strings (env entries NAME=VALUE), working_dir "" or absolute,
 * user a string, start_cmd a boolean, nothing else. -EINVAL (or -E2BIG when it
 * does not fit) with a static reason. */
int snapshot_image_config_normalize(struct json_object *v, char *buf, size_t size, const char **ret_error);

/* ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$ */
bool snapshot_tag_is_valid(const char *tag);

/* 1..64 bytes, not "." or "..", no '/', no control characters. */
bool snapshot_file_name_is_valid(const char *name);

/* "ro", "cow", "rw" -> the mode; -EINVAL for anything else. */
int snapshot_volume_mode_from_string(const char *s);
const char *snapshot_volume_mode_to_string(enum snapshot_volume_mode m);

/* Where a volume may be mounted in the guest: absolute, normalized (no "//",
 * no "." or ".." components, no trailing '/'), not "/", at most 255 bytes,
 * no control characters, valid UTF-8, and not /proc, /sys, /dev, /run, /.forkd
 * or below them. */
bool snapshot_volume_guest_path_is_valid(const char *path);

/* Exactly 64 lowercase hex digits. */
bool snapshot_content_hash_is_valid(const char *hash);

/* Check every field of m against the rules above. */
int snapshot_meta_validate(const struct snapshot_meta *m, const char **ret_error);

/* Parse and validate json[0..len). Returns -EMSGSIZE if len exceeds
 * SNAPSHOT_META_FILE_MAX, -EBADMSG for malformed JSON, -EINVAL (or the
 * dispatcher's errno) for a bad field; *ret is untouched on failure and
 * *ret_error (if not NULL) is a static reason. */
int snapshot_meta_parse(const char *json, size_t len, struct snapshot_meta *ret, const char **ret_error);

/* Pretty-print m (validated first; -EINVAL if invalid) with keys in the
 * order listed above and a trailing newline. *ret_json is malloc()ed. */
int snapshot_meta_format(const struct snapshot_meta *m, char **ret_json);

/* Read (at most SNAPSHOT_META_FILE_MAX bytes, -EMSGSIZE if larger) and parse. */
int snapshot_meta_read_file(const char *path, struct snapshot_meta *ret, const char **ret_error);
