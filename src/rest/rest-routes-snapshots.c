/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* The snapshot routes: create from a kernel and rootfs, list, info, delete,
 * compact. */

#include <limits.h>

#include "boot-files.h"
#include "json-util.h"
#include "macro.h"
#include "rest-bus.h"
#include "rest-reply.h"
#include "rest-routes-common.h"
#include "rest-routes-snapshots.h"
#include "rest-util.h"
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

struct snapshot_create_args {
        char tag[REST_TAG_MAX + 2];
        char kernel[PATH_MAX];
        char rootfs[PATH_MAX];
        char image[PATH_MAX];
        int64_t boot_wait_secs;
        int64_t mem_mib;
        bool rw;
        bool network;   /* "network": true */
        bool agent_tcp;
        bool start_cmd;
};

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
                /* accepted for compatibility; forkd has no rw switch here */
                { "rw", JSON_KIND_BOOL, NULL, offsetof(struct snapshot_create_args, rw), 0, JSON_NULLABLE },
                { "network", JSON_KIND_BOOL, NULL, offsetof(struct snapshot_create_args, network), 0, 0 },
                { "agent_tcp", JSON_KIND_BOOL, NULL, offsetof(struct snapshot_create_args, agent_tcp), 0, 0 },
                /* checked, no effect yet (parse_tap()) */
                { "tap", JSON_KIND_ANY, parse_tap, 0, 0, JSON_NULLABLE },
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        struct snapshot_create_args a = { .boot_wait_secs = BOOT_WAIT_DEFAULT };
        _cleanup_close_ int kernel_fd = -EBADF, rootfs_fd = -EBADF, initrd_fd = -EBADF;
        char initrd[PATH_MAX];
        int r;

        r = rest_parse_body(req, false, table, &a, &(struct rest_body_rules) { .tag = "tag", .tag_value = a.tag }, &o);
        if (r <= 0)
                return r;
        if (json_object_object_get_ex(o, "image", NULL)) {
                if (json_object_object_get_ex(o, "rootfs", NULL))
                        return rest_reply_error(req, 400, "image and rootfs are mutually exclusive");
                if (!a.image[0])
                        return rest_reply_error(req, 400, "image must not be empty");
        } else if (!json_object_object_get_ex(o, "kernel", NULL) || !json_object_object_get_ex(o, "rootfs", NULL))
                return rest_reply_error(req, 400, "missing kernel/rootfs (or image)");
        else if (!a.kernel[0] || !a.rootfs[0])
                return rest_reply_error(req, 400, "kernel and rootfs must not be empty");
        if (a.start_cmd && !a.image[0])
                return rest_reply_error(req, 400, "start_cmd needs image");
        if (a.boot_wait_secs < 1 || a.boot_wait_secs > BOOT_WAIT_MAX)
                return rest_reply_error(req, 400, "boot_wait_secs must be between 1 and %d", BOOT_WAIT_MAX);
        if (a.mem_mib < 0 || a.mem_mib > 1024 * 1024)
                return rest_reply_error(req, 400, "mem_mib out of range");
        if (a.agent_tcp && !a.network)
                return rest_reply_error(req, 400, "agent_tcp needs network: true (the guest agent's TCP port is "
                                                  "reached through the NIC)");

        /* Opened here, with forkd-rest's own credentials, and handed to forkd as
         * descriptors: forkd never opens a path for the bridge. */
        if (a.kernel[0]) {
                r = open_boot_file(req, "kernel", a.kernel, &kernel_fd);
                if (r <= 0)
                        return r;
                if (boot_initrd_beside(a.kernel, initrd, sizeof(initrd)) > 0) {
                        r = open_boot_file(req, "initrd (beside the kernel)", initrd, &initrd_fd);
                        if (r <= 0)
                                return r;
                }
        }
        /* An absolute path is an image on this host; anything else a reference
         * (host[:port]/repo:tag) that forkd pulls from a registry it knows. */
        if (a.image[0] == '/') {
                r = open_image(req, a.image, &rootfs_fd);
                if (r <= 0)
                        return r;
        } else if (!a.image[0]) {
                r = open_boot_file(req, "rootfs", a.rootfs, &rootfs_fd);
                if (r <= 0)
                        return r;
        }

        if (a.image[0] == '/') {
                r = rest_new_manager_call(req, "CreateSnapshotFromImage", &m);
                if (r < 0)
                        return rest_reply_call_failed(req, r);
                r = sd_bus_message_append(m, "shuu", a.tag, rootfs_fd, (uint32_t) a.mem_mib,
                                          (uint32_t) a.boot_wait_secs);
        } else if (a.image[0]) {
                r = rest_new_manager_call(req, "CreateSnapshotFromImageRef", &m);
                if (r < 0)
                        return rest_reply_call_failed(req, r);
                r = sd_bus_message_append(m, "ssuu", a.tag, a.image, (uint32_t) a.mem_mib,
                                          (uint32_t) a.boot_wait_secs);
        } else {
                r = rest_new_manager_call(req, "CreateSnapshotFromFds", &m);
                if (r < 0)
                        return rest_reply_call_failed(req, r);
                r = sd_bus_message_append(m, "shhuu", a.tag, kernel_fd, rootfs_fd, (uint32_t) a.mem_mib,
                                          (uint32_t) a.boot_wait_secs);
        }
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0 && a.image[0] && kernel_fd >= 0)
                r = sd_bus_message_append(m, "{sv}", "kernel", "h", kernel_fd);
        if (r >= 0 && initrd_fd >= 0)
                r = sd_bus_message_append(m, "{sv}", "initrd", "h", initrd_fd);
        /* Only when asked: a forkd of before networking knows neither. */
        if (r >= 0 && a.network)
                r = sd_bus_message_append(m, "{sv}", "network", "b", 1);
        if (r >= 0 && a.agent_tcp)
                r = sd_bus_message_append(m, "{sv}", "agent_tcp", "b", 1);
        if (r >= 0 && a.start_cmd)
                r = sd_bus_message_append(m, "{sv}", "start_cmd", "b", 1);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        /* An image is unpacked and written as a disk first: more time than a boot. */
        r = rest_call(req, m, (uint64_t) (a.boot_wait_secs + (a.image[0] ? 1800 : 120)) * USEC_PER_SEC,
                      on_reply_snapshot_created);
        if (r < 0)
                return rest_reply_call_failed(req, r);
        return 0;
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

