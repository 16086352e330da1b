/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * mount_volumes: mount the ext4 volumes forkd attached after the root disk
 * (virtio-blk vdb, vdc, ...), each at its path, made first with its parents.
 * forkd sends it once, right after the boot and before the snapshot, so the
 * mounts are part of the snapshot and every child has them.
 *
 *   {"op":"mount_volumes","volumes":[{"device":"/dev/vdb","path":"/data","ro":true}, ...]}
 *   -> {"mounted":["/data", ...],"failed":[{"path":"/x","device":"/dev/vdc","error":"..."}]}
 *
 * A bad request (not 1..24 entries, a device other than /dev/vdb../dev/vdy, a
 * path snapshot_volume_guest_path_is_valid() refuses) is answered with an
 * error and mounts nothing.
 */

#include <errno.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "agent.h"
#include "json-util.h"
#include "macro.h"
#include "snapshot-meta.h"

static bool volume_device_is_valid(const char *dev) {
        return dev && strlen(dev) == 8 && strncmp(dev, "/dev/vd", 7) == 0 && dev[7] >= 'b' &&
               dev[7] < 'b' + (int) SNAPSHOT_VOLUMES_MAX;
}

/* mkdir -p, 0755. */
static int mkdir_parents_and_self(const char *path) {
        char buf[SNAPSHOT_VOLUME_PATH_MAX];
        size_t n = strlen(path);

        if (n >= sizeof(buf))
                return -ENAMETOOLONG;
        memcpy(buf, path, n + 1);
        for (char *p = buf + 1;; p++) {
                if (*p == '/' || *p == 0) {
                        char c = *p;

                        *p = 0;
                        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
                                return -errno;
                        *p = c;
                        if (c == 0)
                                break;
                }
        }
        return 0;
}

struct volume_arg {
        char device[16];
        char path[SNAPSHOT_VOLUME_PATH_MAX];
        bool ro;
};

static const struct json_dispatch volume_table[] = {
        { "device", JSON_KIND_STRING, NULL, offsetof(struct volume_arg, device),
          JSON_FIELD_SIZE(struct volume_arg, device), JSON_MANDATORY },
        { "path", JSON_KIND_STRING, NULL, offsetof(struct volume_arg, path),
          JSON_FIELD_SIZE(struct volume_arg, path), JSON_MANDATORY },
        { "ro", JSON_KIND_BOOL, NULL, offsetof(struct volume_arg, ro), 0, JSON_MANDATORY },
        {}
};

static int dispatch_ignore(struct json_object *v, void *field, const char **ret_error) {
        return 0;
}

struct mount_args {
        struct json_object *volumes;
};

static const struct json_dispatch mount_table[] = {
        { "op", JSON_KIND_STRING, dispatch_ignore, 0, 0, JSON_MANDATORY },
        { "volumes", JSON_KIND_ARRAY, NULL, offsetof(struct mount_args, volumes), 0, JSON_MANDATORY },
        {}
};

int agent_op_mount_volumes(Agent *a, uint32_t id, struct json_object *req) {
        struct volume_arg v[SNAPSHOT_VOLUMES_MAX] = {};
        struct mount_args args = {};
        const char *field = NULL, *err = NULL;
        struct json_object *reply, *mounted, *failed;
        size_t n;
        int r;

        r = json_dispatch_full(req, mount_table, JSON_REJECT_UNKNOWN, &args, &field, &err);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return agent_send_error(a, id, "bad argument '%s': %s", field ?: "?", err ?: strerror(-r)), 0;
        n = json_object_array_length(args.volumes);
        if (n < 1 || n > SNAPSHOT_VOLUMES_MAX)
                return agent_send_error(a, id, "bad argument 'volumes': 1 to %u entries", SNAPSHOT_VOLUMES_MAX), 0;
        for (size_t i = 0; i < n; i++) {
                r = json_dispatch_full(json_object_array_get_idx(args.volumes, i), volume_table, JSON_REJECT_UNKNOWN,
                                       &v[i], &field, &err);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return agent_send_error(a, id, "bad argument 'volumes': entry %zu: '%s': %s", i,
                                                field ?: "?", err ?: strerror(-r)), 0;
                if (!volume_device_is_valid(v[i].device))
                        return agent_send_error(a, id, "bad argument 'volumes': entry %zu: device must be "
                                                "/dev/vdb .. /dev/vdy", i), 0;
                if (!snapshot_volume_guest_path_is_valid(v[i].path))
                        return agent_send_error(a, id, "bad argument 'volumes': entry %zu: path must be absolute, "
                                                "normalized, not /, and not under /proc, /sys, /dev, /run or "
                                                "/.forkd", i), 0;
        }

        reply = json_object_new_object();
        mounted = json_object_new_array();
        failed = json_object_new_array();
        if (!reply || !mounted || !failed) {
                json_object_put(reply);
                json_object_put(mounted);
                json_object_put(failed);
                return -ENOMEM;
        }
        json_object_object_add(reply, "mounted", mounted);
        json_object_object_add(reply, "failed", failed);
        for (size_t i = 0; i < n; i++) {
                struct json_object *f;

                r = mkdir_parents_and_self(v[i].path);
                if (r >= 0 && mount(v[i].device, v[i].path, "ext4", v[i].ro ? MS_RDONLY : 0, NULL) < 0)
                        r = -errno;
                if (r >= 0) {
                        log_info("Mounted %s at %s%s.", v[i].device, v[i].path, v[i].ro ? " (read-only)" : "");
                        json_object_array_add(mounted, json_object_new_string(v[i].path));
                        continue;
                }
                log_warning("Cannot mount %s at %s: %s", v[i].device, v[i].path, strerror(-r));
                f = json_object_new_object();
                if (!f)
                        break;
                json_object_object_add(f, "path", json_object_new_string(v[i].path));
                json_object_object_add(f, "device", json_object_new_string(v[i].device));
                json_object_object_add(f, "error", json_object_new_string(strerror(-r)));
                json_object_array_add(failed, f);
        }
        return agent_send_json(a, FKA_RESPONSE, id, reply);
}
