/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* The snapshot routes: create from a kernel and rootfs, list, info, delete,
 * compact. */

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>

#include "boot-files.h"
#include "json-util.h"
#include "macro.h"
#include "rest-bus.h"
#include "rest-reply.h"
#include "rest-routes-common.h"
#include "rest-routes-snapshots.h"
#include "rest-util.h"
#include "snapshot-meta.h"
#include "time-util.h"

#define BOOT_WAIT_DEFAULT 30
#define BOOT_WAIT_MAX 600

static int on_reply_snapshot_created(RestRequest *req, sd_bus_message *reply) {
        /* forkd's REST API v1 says 400 for "snapshot already exists" here. */
        return rest_on_reply_dict(req, reply, 201, 400);
}

static int on_reply_snapshot_info(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *o = NULL;
        int r;

        r = rest_reply_bus_result(req, reply, 0);
        if (r <= 0)
                return r;
        r = rest_bus_read_dict_json(reply, &o);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        /* forkd's REST API v1 always carries these three; the daemon may omit empty ones. */
        if (!json_object_object_get_ex(o, "ancestors", NULL))
                json_object_object_add(o, "ancestors", json_object_new_array());
        if (!json_object_object_get_ex(o, "dependents", NULL))
                json_object_object_add(o, "dependents", json_object_new_array());
        if (!json_object_object_get_ex(o, "chain_depth", NULL))
                json_object_object_add(o, "chain_depth", json_object_new_int64(0));
        return rest_reply_json(req, 200, o);
}

/* ---- snapshots ---- */

/* 1 with the file open, else the request was answered: 400 with the file and
 * why (forkd's REST API v1: "missing kernel/rootfs"). */
static int open_boot_file(RestRequest *req, const char *what, const char *path, int *ret_fd) {
        int r = boot_file_open(path, ret_fd);

        if (r == -EISDIR || r == -EINVAL)
                return rest_reply_error(req, 400, "%s %s is not a regular file", what, path);
        if (r < 0)
                return rest_reply_error(req, 400, "cannot open %s %s as forkd-rest's user (uid %u): %s", what, path,
                                        (unsigned) geteuid(), strerror(-r));
        return 1;
}

/* 1 with the OCI image open, else the request was answered (400). */
static int open_image(RestRequest *req, const char *path, int *ret_fd) {
        int r = boot_image_open(path, ret_fd);

        if (r == -EINVAL)
                return rest_reply_error(req, 400, "image %s is neither a directory (an OCI image layout) nor a file "
                                                  "(an oci-archive or docker-archive)", path);
        if (r < 0)
                return rest_reply_error(req, 400, "cannot open image %s as forkd-rest's user (uid %u): %s", path,
                                        (unsigned) geteuid(), strerror(-r));
        return 1;
}

#define REST_VOLUMES_MAX 24

struct rest_volume {
        char host_path[PATH_MAX];
        char guest_path[256];
        char mode[4];
};

struct snapshot_create_args {
        char tag[REST_TAG_MAX + 2];
        char kernel[PATH_MAX];
        char rootfs[PATH_MAX];
        char image[PATH_MAX];
        int64_t boot_wait_secs;
        int64_t mem_mib;
        int64_t vcpus;  /* 0: not given (forkd's default, 1) */
        bool rw;
        bool network;   /* "network": true */
        bool agent_tcp;
        bool start_cmd;
        struct rest_volume volumes[REST_VOLUMES_MAX];
        unsigned n_volumes;
};

/* "volumes": up to 24 of {"host_path": "/abs/file.ext4", "guest_path": "/data",
 * "mode": "ro"|"cow"|"rw"} (mode optional, ro), checked as forkd checks them. */
static int parse_volumes(struct json_object *v, void *field, const char **ret_error) {
        static const struct json_dispatch vtable[] = {
                { "host_path", JSON_KIND_STRING, NULL, offsetof(struct rest_volume, host_path),
                  JSON_FIELD_SIZE(struct rest_volume, host_path), JSON_MANDATORY },
                { "guest_path", JSON_KIND_STRING, NULL, offsetof(struct rest_volume, guest_path),
                  JSON_FIELD_SIZE(struct rest_volume, guest_path), JSON_MANDATORY },
                { "mode", JSON_KIND_STRING, NULL, offsetof(struct rest_volume, mode),
                  JSON_FIELD_SIZE(struct rest_volume, mode), 0 },
                {}
        };
        struct snapshot_create_args *a = (struct snapshot_create_args *) ((uint8_t *) field -
                                                                          offsetof(struct snapshot_create_args, volumes));
        size_t n = json_object_array_length(v);

        if (n > REST_VOLUMES_MAX) {
                *ret_error = "volumes: at most 24";
                return -EINVAL;
        }
        for (size_t i = 0; i < n; i++) {
                struct rest_volume *vol = &a->volumes[i];
                const char *f = NULL;

                memset(vol, 0, sizeof(*vol));
                if (json_dispatch(json_object_array_get_idx(v, i), vtable, JSON_REJECT_UNKNOWN, vol, &f) < 0) {
                        *ret_error = "volumes: each entry is an object of host_path, guest_path and mode (strings)";
                        return -EINVAL;
                }
                if (!vol->mode[0])
                        snprintf(vol->mode, sizeof(vol->mode), "ro");
                if (snapshot_volume_mode_from_string(vol->mode) < 0) {
                        *ret_error = "volumes: mode must be \"ro\", \"cow\" or \"rw\"";
                        return -EINVAL;
                }
                if (vol->host_path[0] != '/') {
                        *ret_error = "volumes: host_path must be an absolute path";
                        return -EINVAL;
                }
                if (!snapshot_volume_guest_path_is_valid(vol->guest_path)) {
                        *ret_error = "volumes: guest_path must be absolute and normalized, not /, without \"..\", "
                                     "at most 255 bytes, and not under /proc, /sys, /dev, /run or /.forkd";
                        return -EINVAL;
                }
                for (size_t k = 0; k < i; k++)
                        if (streq(a->volumes[k].guest_path, vol->guest_path)) {
                                *ret_error = "volumes: two volumes have the same guest_path";
                                return -EINVAL;
                        }
        }
        a->n_volumes = (unsigned) n;
        return 0;
}

/* 1 with the volume open (ro, cow: for reading; rw: and writing) as forkd-rest's
 * user, else the request was answered: 400 naming the file. */
static int open_volume(RestRequest *req, const struct rest_volume *v, int *ret_fd) {
        bool rw = streq(v->mode, "rw");
        struct stat st;
        int fd;

        fd = open(v->host_path, (rw ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return rest_reply_error(req, 400, "cannot open volume %s as forkd-rest's user (uid %u)%s: %s",
                                        v->host_path, (unsigned) geteuid(), rw ? " for reading and writing" : "",
                                        strerror(errno));
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                safe_close(fd);
                return rest_reply_error(req, 400, "volume %s is not a regular file", v->host_path);
        }
        *ret_fd = fd;
        return 1;
}

/* The "tap" of forkd's REST API v1 (a host tap as the guest's eth0 there): a
 * string under 64 bytes, a boolean or null is accepted, other types are
 * refused. It does not give the snapshot a NIC yet: our own tests send
 * forkd's request, with "tap", everywhere, and every fork of those snapshots
 * would then make a namespace per child and refuse per_child_netns.
 * Ask for a NIC with "network": true. */
static int parse_tap(struct json_object *v, void *field, const char **ret_error) {
        if (!v || json_object_is_type(v, json_type_boolean))
                return 0;
        if (json_object_is_type(v, json_type_string)) {
                if (json_object_get_string_len(v) >= 64) {
                        *ret_error = "tap must be shorter than 64 bytes";
                        return -ENAMETOOLONG;
                }
                return 0;
        }
        *ret_error = "tap must be a string, a boolean or null";
        return -EINVAL;
}

int rest_route_snapshots_create(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "tag", JSON_KIND_STRING, NULL, offsetof(struct snapshot_create_args, tag),
                  JSON_FIELD_SIZE(struct snapshot_create_args, tag), JSON_MANDATORY },
                { "kernel", JSON_KIND_STRING, NULL, offsetof(struct snapshot_create_args, kernel),
                  JSON_FIELD_SIZE(struct snapshot_create_args, kernel), 0 },
                { "rootfs", JSON_KIND_STRING, NULL, offsetof(struct snapshot_create_args, rootfs),
                  JSON_FIELD_SIZE(struct snapshot_create_args, rootfs), 0 },
                /* an OCI image instead of a rootfs: kernel then optional */
                { "image", JSON_KIND_STRING, NULL, offsetof(struct snapshot_create_args, image),
                  JSON_FIELD_SIZE(struct snapshot_create_args, image), 0 },
                { "start_cmd", JSON_KIND_BOOL, NULL, offsetof(struct snapshot_create_args, start_cmd), 0, 0 },
                { "boot_wait_secs", JSON_KIND_INT64, NULL, offsetof(struct snapshot_create_args, boot_wait_secs), 0, 0 },
                { "mem_mib", JSON_KIND_INT64, NULL, offsetof(struct snapshot_create_args, mem_mib), 0, JSON_NULLABLE },
                { "vcpus", JSON_KIND_INT64, NULL, offsetof(struct snapshot_create_args, vcpus), 0, 0 },
                /* accepted for compatibility; forkd has no rw switch here */
                { "rw", JSON_KIND_BOOL, NULL, offsetof(struct snapshot_create_args, rw), 0, JSON_NULLABLE },
                { "network", JSON_KIND_BOOL, NULL, offsetof(struct snapshot_create_args, network), 0, 0 },
                { "agent_tcp", JSON_KIND_BOOL, NULL, offsetof(struct snapshot_create_args, agent_tcp), 0, 0 },
                /* checked, no effect yet (parse_tap()) */
                { "tap", JSON_KIND_ANY, parse_tap, 0, 0, JSON_NULLABLE },
                { "volumes", JSON_KIND_ARRAY, parse_volumes, offsetof(struct snapshot_create_args, volumes), 0, 0 },
                {}
        };
        int vol_fds[REST_VOLUMES_MAX];
        unsigned n_vol_fds = 0;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        _cleanup_free_ struct snapshot_create_args *ap = calloc(1, sizeof(*ap));
        _cleanup_close_ int kernel_fd = -EBADF, rootfs_fd = -EBADF, initrd_fd = -EBADF;
        char initrd[PATH_MAX];
        int r;

        if (!ap)
                return rest_reply_error(req, 500, "out of memory");
        ap->boot_wait_secs = BOOT_WAIT_DEFAULT;
        r = rest_parse_body(req, false, table, ap, &(struct rest_body_rules) { .tag = "tag", .tag_value = ap->tag }, &o);
        if (r <= 0)
                return r;
        if (json_object_object_get_ex(o, "image", NULL)) {
                if (json_object_object_get_ex(o, "rootfs", NULL))
                        return rest_reply_error(req, 400, "image and rootfs are mutually exclusive");
                if (!ap->image[0])
                        return rest_reply_error(req, 400, "image must not be empty");
        } else if (!json_object_object_get_ex(o, "kernel", NULL) || !json_object_object_get_ex(o, "rootfs", NULL))
                return rest_reply_error(req, 400, "missing kernel/rootfs (or image)");
        else if (!ap->kernel[0] || !ap->rootfs[0])
                return rest_reply_error(req, 400, "kernel and rootfs must not be empty");
        if (ap->start_cmd && !ap->image[0])
                return rest_reply_error(req, 400, "start_cmd needs image");
        if (ap->boot_wait_secs < 1 || ap->boot_wait_secs > BOOT_WAIT_MAX)
                return rest_reply_error(req, 400, "boot_wait_secs must be between 1 and %d", BOOT_WAIT_MAX);
        if (ap->mem_mib < 0 || ap->mem_mib > 1024 * 1024)
                return rest_reply_error(req, 400, "mem_mib out of range");
        if (json_object_object_get_ex(o, "vcpus", NULL) && (ap->vcpus < 1 || ap->vcpus > SNAPSHOT_VCPUS_MAX))
                return rest_reply_error(req, 400, "vcpus must be between 1 and %u", SNAPSHOT_VCPUS_MAX);
        if (ap->agent_tcp && !ap->network)
                return rest_reply_error(req, 400, "agent_tcp needs network: true (the guest agent's TCP port is "
                                                  "reached through the NIC)");

        /* Opened here, with forkd-rest's own credentials, and handed to forkd as
         * descriptors: forkd never opens a path for the bridge. */
        if (ap->kernel[0]) {
                r = open_boot_file(req, "kernel", ap->kernel, &kernel_fd);
                if (r <= 0)
                        return r;
                if (boot_initrd_beside(ap->kernel, initrd, sizeof(initrd)) > 0) {
                        r = open_boot_file(req, "initrd (beside the kernel)", initrd, &initrd_fd);
                        if (r <= 0)
                                return r;
                }
        }
        /* An absolute path is an image on this host; anything else a reference
         * (host[:port]/repo:tag) that forkd pulls from a registry it knows. */
        if (ap->image[0] == '/') {
                r = open_image(req, ap->image, &rootfs_fd);
                if (r <= 0)
                        return r;
        } else if (!ap->image[0]) {
                r = open_boot_file(req, "rootfs", ap->rootfs, &rootfs_fd);
                if (r <= 0)
                        return r;
        }

        for (unsigned i = 0; i < ap->n_volumes; i++) {
                r = open_volume(req, &ap->volumes[i], &vol_fds[i]);
                if (r <= 0)
                        goto out;
                n_vol_fds++;
        }

        if (ap->image[0] == '/') {
                r = rest_new_manager_call(req, "CreateSnapshotFromImage", &m);
                if (r < 0)
                        goto call_failed;
                r = sd_bus_message_append(m, "shuu", ap->tag, rootfs_fd, (uint32_t) ap->mem_mib,
                                          (uint32_t) ap->boot_wait_secs);
        } else if (ap->image[0]) {
                r = rest_new_manager_call(req, "CreateSnapshotFromImageRef", &m);
                if (r < 0)
                        goto call_failed;
                r = sd_bus_message_append(m, "ssuu", ap->tag, ap->image, (uint32_t) ap->mem_mib,
                                          (uint32_t) ap->boot_wait_secs);
        } else {
                r = rest_new_manager_call(req, "CreateSnapshotFromFds", &m);
                if (r < 0)
                        goto call_failed;
                r = sd_bus_message_append(m, "shhuu", ap->tag, kernel_fd, rootfs_fd, (uint32_t) ap->mem_mib,
                                          (uint32_t) ap->boot_wait_secs);
        }
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0 && ap->image[0] && kernel_fd >= 0)
                r = sd_bus_message_append(m, "{sv}", "kernel", "h", kernel_fd);
        if (r >= 0 && initrd_fd >= 0)
                r = sd_bus_message_append(m, "{sv}", "initrd", "h", initrd_fd);
        /* Only when asked: a forkd of before networking knows neither. */
        if (r >= 0 && ap->network)
                r = sd_bus_message_append(m, "{sv}", "network", "b", 1);
        if (r >= 0 && ap->agent_tcp)
                r = sd_bus_message_append(m, "{sv}", "agent_tcp", "b", 1);
        if (r >= 0 && ap->start_cmd)
                r = sd_bus_message_append(m, "{sv}", "start_cmd", "b", 1);
        if (r >= 0 && ap->vcpus > 0)
                r = sd_bus_message_append(m, "{sv}", "vcpus", "u", (uint32_t) ap->vcpus);
        if (r >= 0 && ap->n_volumes > 0) {
                r = sd_bus_message_open_container(m, 'e', "sv");
                if (r >= 0)
                        r = sd_bus_message_append(m, "s", "volumes");
                if (r >= 0)
                        r = sd_bus_message_open_container(m, 'v', "a(hss)");
                if (r >= 0)
                        r = sd_bus_message_open_container(m, 'a', "(hss)");
                for (unsigned i = 0; r >= 0 && i < ap->n_volumes; i++)
                        r = sd_bus_message_append(m, "(hss)", vol_fds[i], ap->volumes[i].guest_path,
                                                  ap->volumes[i].mode);
                for (unsigned k = 0; r >= 0 && k < 3; k++)
                        r = sd_bus_message_close_container(m);
        }
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0) {
                r = rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
                goto out;
        }
        /* An image is unpacked and written as a disk first: more time than a boot. */
        r = rest_call(req, m, (uint64_t) (ap->boot_wait_secs + (ap->image[0] ? 1800 : 120)) * USEC_PER_SEC,
                      on_reply_snapshot_created);
        if (r < 0)
                goto call_failed;
        r = 0;
        goto out;
call_failed:
        r = rest_reply_call_failed(req, r);
out:
        for (unsigned i = 0; i < n_vol_fds; i++)
                safe_close(vol_fds[i]);
        return r;
}

int rest_route_snapshots_list(RestRequest *req) {
        return rest_call_manager(req, "ListSnapshots", REST_CALL_TIMEOUT_SHORT, rest_on_reply_array_200, NULL);
}

int rest_route_snapshot_delete(RestRequest *req) {
        const char *tag = rest_param_or_reply(req, "tag");
        int cascade, force;

        if (!tag)
                return 0;
        cascade = rest_parse_bool_arg(rest_request_query(req, "cascade"));
        force = rest_parse_bool_arg(rest_request_query(req, "force"));
        if (cascade < 0 || force < 0)
                return rest_reply_error(req, 400, "cascade and force take true or false");
        if (cascade && force)
                return rest_reply_error(req, 400, "?cascade=true and ?force=true are mutually exclusive");
        return rest_call_manager(req, "DeleteSnapshot", REST_CALL_TIMEOUT_FORK, rest_on_reply_empty_204, "sbb", tag,
                                 cascade, force);
}

int rest_route_snapshot_info(RestRequest *req) {
        const char *tag = rest_param_or_reply(req, "tag");

        if (!tag)
                return 0;
        return rest_call_manager(req, "GetSnapshotInfo", REST_CALL_TIMEOUT_SHORT, on_reply_snapshot_info, "s", tag);
}

struct compact_args {
        char to[REST_TAG_MAX + 2];
};

int rest_route_snapshot_compact(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "to", JSON_KIND_STRING, NULL, offsetof(struct compact_args, to), JSON_FIELD_SIZE(struct compact_args, to),
                  JSON_MANDATORY },
                {}
        };
        _cleanup_json_ struct json_object *o = NULL;
        struct compact_args a = {};
        const char *tag;
        int r;

        tag = rest_param_or_reply(req, "tag");
        if (!tag)
                return 0;
        r = rest_parse_body(req, false, table, &a, &(struct rest_body_rules) { .tag = "to", .tag_value = a.to }, &o);
        if (r <= 0)
                return r;
        if (!strcmp(a.to, tag))
                return rest_reply_error(req, 400, "to must name a new snapshot, not '%s' itself", tag);
        /* 201 SnapshotInfo of the flat snapshot; 409 when to exists or the chain is broken, 404 unknown tag */
        return rest_call_manager(req, "CompactSnapshot", REST_CALL_TIMEOUT_FORK, rest_on_reply_dict_201, "ss", tag,
                                 a.to);
}

