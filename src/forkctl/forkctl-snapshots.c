/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkctl snapshot create, ls, info, rm, compact and diff.
 */

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "boot-files.h"
#include "bus-json.h"
#include "forkctl.h"
#include "snapshot-meta.h"
#include "time-util.h"

int check_snapshot_create(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis) {
        if (o->image && o->rootfs)
                return usage_error("--image and --rootfs are mutually exclusive; usage: forkctl %s", synopsis);
        if (o->image ? !*o->image || (o->kernel && !*o->kernel) : !o->kernel || !*o->kernel || !o->rootfs || !*o->rootfs)
                return usage_error("snapshot create needs --kernel and --rootfs, or --image; usage: forkctl %s",
                                   synopsis);
        if (o->start_cmd && !o->image)
                return usage_error("--start-cmd needs --image");
        if (!(o->given & OPT_BOOT_WAIT))
                o->boot_wait = 60;
        return 0;
}

int check_snapshot_compact(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis) {
        if (!o->to)
                return usage_error("snapshot compact needs --to; usage: forkctl %s", synopsis);
        if (!snapshot_tag_is_valid(o->to))
                return usage_error("--to must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$, not '%.64s'", o->to);
        if (strcmp(o->to, args[0]) == 0)
                return usage_error("--to must name a new snapshot, not '%s' itself", o->to);
        return 0;
}

int check_snapshot_diff(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis) {
        if (!o->from || !o->exec || !(o->given & OPT_TAG))
                return usage_error("snapshot diff needs --from, --tag and --exec; usage: forkctl %s", synopsis);
        if (!snapshot_tag_is_valid(o->from) || !snapshot_tag_is_valid(o->tag))
                return usage_error("--from and --tag must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$");
        if (strcmp(o->from, o->tag) == 0)
                return usage_error("--tag must name a new snapshot, not '%s' itself", o->tag);
        return 0;
}

static int open_image(const char *path, int *ret_fd) {
        int r = boot_image_open(path, ret_fd);

        if (r == -EINVAL)
                fprintf(stderr, "forkctl: snapshot create: the image %s is neither a directory (an OCI image layout) "
                                "nor a file (an oci-archive or docker-archive)\n", path);
        else if (r < 0)
                fprintf(stderr, "forkctl: snapshot create: cannot open the image %s: %s\n", path, strerror(-r));
        return r < 0 ? -1 : 0;
}

static int open_boot_file(const char *what, const char *path, int *ret_fd) {
        int r = boot_file_open(path, ret_fd);

        if (r == -EISDIR || r == -EINVAL) {
                fprintf(stderr, "forkctl: snapshot create: the %s %s is not a regular file\n", what, path);
                return -1;
        }
        if (r < 0) {
                fprintf(stderr, "forkctl: snapshot create: cannot open the %s %s: %s\n", what, path, strerror(-r));
                return -1;
        }
        return 0;
}

int verb_snapshot_create(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *info = NULL;
        struct error_context ctx = { .verb = "snapshot create", .tag = args[0] };
        _cleanup_free_ char *what = NULL;
        _cleanup_close_ int kernel_fd = -EBADF, rootfs_fd = -EBADF, initrd_fd = -EBADF;
        char initrd[PATH_MAX];
        const char *ref;
        int vol_fds[ELEMENTSOF(o->volumes)];
        unsigned n_vol_fds = 0;
        int r;

        if (o->network)
                return usage_error("snapshot create --network takes no value (the policy is fork's: fork --network %s)",
                                   o->network);
        if (o->agent_tcp && !(o->given & OPT_NETWORK))
                return usage_error("--agent-tcp needs --network: the agent's TCP port is reached through the NIC");

        /* Opened here, with our own credentials: forkd reads only what we could. */
        r = 0;
        if (o->kernel) {
                r = open_boot_file("kernel", o->kernel, &kernel_fd);
                if (r >= 0 && boot_initrd_beside(o->kernel, initrd, sizeof initrd) > 0)
                        r = open_boot_file("initrd (found beside the kernel)", initrd, &initrd_fd);
        }
        /* A path (absolute, ./relative, or a file that is there) is an image on this
         * host; anything else a reference forkd pulls from a registry it knows. */
        ref = o->image && o->image[0] != '/' && o->image[0] != '.' && access(o->image, F_OK) < 0 ? o->image : NULL;
        if (r >= 0 && !ref)
                r = o->image ? open_image(o->image, &rootfs_fd) : open_boot_file("rootfs", o->rootfs, &rootfs_fd);
        if (r < 0)
                return r;
        /* The volumes too: ro and cow read-only, rw read-write. */
        for (unsigned i = 0; i < o->n_volumes; i++) {
                bool rw = streq(o->volumes[i].mode, "rw");
                struct stat st;
                int fd = open(o->volumes[i].host, (rw ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);

                if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                        if (fd < 0)
                                fprintf(stderr, "forkctl: snapshot create: cannot open the volume %s%s: %s\n",
                                        o->volumes[i].host, rw ? " for reading and writing" : "", strerror(errno));
                        else
                                fprintf(stderr, "forkctl: snapshot create: the volume %s is not a regular file\n",
                                        o->volumes[i].host);
                        safe_close(fd);
                        for (unsigned k = 0; k < n_vol_fds; k++)
                                safe_close(vol_fds[k]);
                        return -EXIT_USAGE;
                }
                vol_fds[n_vol_fds++] = fd;
        }

        r = new_call(bus, ref ? "CreateSnapshotFromImageRef" : o->image ? "CreateSnapshotFromImage" :
                                                                       "CreateSnapshotFromFds", &m);
        if (r < 0)
                return -1;
        if (ref)
                r = sd_bus_message_append(m, "ssuu", args[0], ref, o->mem_mib, o->boot_wait);
        else if (o->image)
                r = sd_bus_message_append(m, "shuu", args[0], rootfs_fd, o->mem_mib, o->boot_wait);
        else
                r = sd_bus_message_append(m, "shhuu", args[0], kernel_fd, rootfs_fd, o->mem_mib, o->boot_wait);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0 && o->image && kernel_fd >= 0)
                r = sd_bus_message_append(m, "{sv}", "kernel", "h", kernel_fd);
        if (r >= 0 && o->start_cmd)
                r = sd_bus_message_append(m, "{sv}", "start_cmd", "b", 1);
        if (r >= 0 && initrd_fd >= 0)
                r = sd_bus_message_append(m, "{sv}", "initrd", "h", initrd_fd);
        if (r >= 0 && (o->given & OPT_NETWORK))
                r = sd_bus_message_append(m, "{sv}", "network", "b", 1);
        if (r >= 0 && o->agent_tcp)
                r = sd_bus_message_append(m, "{sv}", "agent_tcp", "b", 1);
        if (r >= 0 && (o->given & OPT_VCPUS))
                r = sd_bus_message_append(m, "{sv}", "vcpus", "u", o->vcpus);
        if (r >= 0 && o->n_volumes > 0) {
                r = sd_bus_message_open_container(m, 'e', "sv");
                if (r >= 0)
                        r = sd_bus_message_append(m, "s", "volumes");
                if (r >= 0)
                        r = sd_bus_message_open_container(m, 'v', "a(hss)");
                if (r >= 0)
                        r = sd_bus_message_open_container(m, 'a', "(hss)");
                for (unsigned i = 0; r >= 0 && i < o->n_volumes; i++)
                        r = sd_bus_message_append(m, "(hss)", vol_fds[i], o->volumes[i].guest, o->volumes[i].mode);
                for (unsigned k = 0; r >= 0 && k < 3; k++)
                        r = sd_bus_message_close_container(m);
        }
        for (unsigned k = 0; k < n_vol_fds; k++)
                safe_close(vol_fds[k]);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return report_error(NULL, r, &ctx);

        if (asprintf(&what, "Creating snapshot '%s'", args[0]) < 0)
                return -1;
        r = call_with_progress(bus, o, m, what, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);

        r = bus_message_read_dict_json(reply, &info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (o->json)
                return print_json(info);
        fprintf(stderr, "Created snapshot '%s'.\n", args[0]);
        return print_info(info, snapshot_keys);
}

int verb_snapshot_ls(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *list = NULL, *doc = NULL;
        struct error_context ctx = { .verb = "snapshot ls" };
        int r;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "ListSnapshots", &error, &reply, "");
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!o->json)
                return print_snapshot_table(list);
        doc = json_object_new_object();
        if (!doc || json_object_object_add(doc, "snapshots", TAKE_PTR(list)) < 0)
                return -1;
        return print_json(doc);
}

int verb_snapshot_info(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *info = NULL;
        struct error_context ctx = { .verb = "snapshot info", .tag = args[0] };
        int r;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "GetSnapshotInfo", &error, &reply,
                               "s", args[0]);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_json(reply, &info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        return o->json ? print_json(info) : print_info(info, snapshot_keys);
}

int verb_snapshot_rm(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "snapshot rm", .tag = args[0] };
        int r;

        if (o->cascade && o->force)
                return usage_error("--cascade and --force exclude each other");

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "DeleteSnapshot", &error, NULL,
                               "sbb", args[0], (int) o->cascade, (int) o->force);
        if (r < 0)
                return report_error(&error, r, &ctx);
        if (o->json) {
                _cleanup_json_ struct json_object *doc = json_object_new_object();
                if (!doc || json_object_object_add(doc, "deleted", json_object_new_string(args[0])) < 0)
                        return -1;
                return print_json(doc);
        }
        fprintf(stderr, "Deleted snapshot '%s'.\n", args[0]);
        return 0;
}

int verb_snapshot_compact(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *info = NULL;
        struct error_context ctx = { .verb = "snapshot compact", .tag = o->to };
        _cleanup_free_ char *what = NULL;
        int r;

        r = new_call(bus, "CompactSnapshot", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "ss", args[0], o->to);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (asprintf(&what, "Compacting snapshot '%s' into '%s'", args[0], o->to) < 0)
                return -1;
        r = call_with_progress(bus, o, m, what, &error, &reply);
        if (r < 0) {
                /* NoSuchSnapshot names the source, everything else the target */
                if (sd_bus_error_has_name(&error, FORKD_ERROR_NO_SUCH_SNAPSHOT))
                        ctx.tag = args[0];
                return report_error(&error, r, &ctx);
        }
        r = bus_message_read_dict_json(reply, &info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (o->json)
                return print_json(info);
        fprintf(stderr, "Compacted '%s' into the flat snapshot '%s'.\n", args[0], o->to);
        return print_info(info, snapshot_keys);
}

/* snapshot diff from the existing calls: Fork, Exec, BranchSandbox (diff),
 * TerminateSandbox; the sandbox goes whatever happens. */
static int snapshot_diff_in(sd_bus *bus, const struct forkctl_options *o, const char *id,
                            struct json_object **ret_info) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *res = NULL;
        struct error_context ctx = { .verb = "snapshot diff", .id = id, .tag = o->tag };
        const char *argv[] = { "sh", "-c", o->exec, NULL }, *text;
        struct json_object *code, *err;
        _cleanup_free_ char *what = NULL;
        int r;

        r = new_call(bus, "Exec", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "s", id);
        if (r >= 0)
                r = sd_bus_message_append_strv(m, (char **) argv);
        if (r >= 0)
                r = sd_bus_message_append(m, "u", o->exec_timeout);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!o->json && !o->no_progress)
                fprintf(stderr, "forkctl: running '%s' in sandbox '%s'...\n", o->exec, id);
        r = sd_bus_call(bus, m, ((uint64_t) o->exec_timeout + 60) * USEC_PER_SEC, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = sd_bus_message_read(reply, "s", &text);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        res = json_tokener_parse(text);
        if (!res || !json_object_object_get_ex(res, "exit_code", &code) || !json_object_is_type(code, json_type_int)) {
                fprintf(stderr, "forkctl: snapshot diff: the sandbox's answer to exec has no exit_code: %.200s\n",
                        text);
                return -1;
        }
        if (json_object_get_int64(code) != 0) {
                fprintf(stderr, "forkctl: snapshot diff: '%s' exited with status %" PRId64 "; no snapshot '%s' was "
                        "made. Its stderr:\n%s\n", o->exec, json_object_get_int64(code), o->tag,
                        json_object_object_get_ex(res, "stderr", &err) && json_object_is_type(err, json_type_string) ?
                                json_object_get_string(err) : "(none)");
                return -1;
        }

        sd_bus_message_unref(TAKE_PTR(m));
        sd_bus_message_unref(TAKE_PTR(reply));
        r = new_call(bus, "BranchSandbox", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "sssb", id, o->tag, "diff", 1);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (asprintf(&what, "Taking the diff snapshot '%s'", o->tag) < 0)
                return -1;
        r = call_with_progress(bus, o, m, what, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_json(reply, ret_info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        return 0;
}

int verb_snapshot_diff(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *list = NULL, *info = NULL;
        struct error_context ctx = { .verb = "snapshot diff", .tag = o->from };
        _cleanup_free_ char *id = NULL;
        struct json_object *v;
        int r, k;

        r = new_call(bus, "Fork", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "sua{sv}", o->from, (uint32_t) 1, 0);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        r = call_with_progress(bus, o, m, "Forking a sandbox for the diff", &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0 || json_object_array_length(list) != 1 ||
            !json_object_object_get_ex(json_object_array_get_idx(list, 0), "id", &v))
                return report_error(NULL, r < 0 ? r : -EBADMSG, &ctx);
        id = strdup(json_object_get_string(v));
        if (!id)
                return -1;

        r = snapshot_diff_in(bus, o, id, &info);

        sd_bus_error_free(&error);
        k = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "TerminateSandbox", &error, NULL, "s", id);
        if (k < 0 && !sd_bus_error_has_name(&error, FORKD_ERROR_NO_SUCH_SANDBOX))
                fprintf(stderr, "forkctl: snapshot diff: failed to remove sandbox '%s': %s\n", id,
                        error.message ?: strerror(-k));
        if (r < 0)
                return r;
        if (o->json)
                return print_json(info);
        fprintf(stderr, "Made the diff snapshot '%s' of '%s'.\n", o->tag, o->from);
        return print_info(info, snapshot_keys);
}
