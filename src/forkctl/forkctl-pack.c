/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkctl pack and unpack: a snapshot chain to a bundle file (tar + zstd) and
 * back, forkd doing the work on a file descriptor we open as ourselves; push
 * and pull: the same chain to and from an OCI registry, forkd's to reach.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bus-json.h"
#include "forkctl.h"

int verb_pack(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *doc = NULL, *tags = NULL;
        struct error_context ctx = { .verb = "pack", .tag = o->tag };
        _cleanup_free_ char *what = NULL;
        _cleanup_close_ int fd = -EBADF;
        uint64_t bytes = 0;
        bool regular = false;
        struct stat st;
        size_t n = 0;
        int r;

        if (!o->tag[0] || !o->out || !o->out[0])
                return usage_error("pack needs --tag and --out; usage: forkctl pack --tag T --out F");
        fd = open(o->out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0644);
        if (fd < 0) {
                fprintf(stderr, "forkctl: cannot create %s: %s\n", o->out, strerror(errno));
                return -1;
        }
        /* A half-written file is removed on failure; a pipe or device (--out /dev/stdout) is not. */
        regular = fstat(fd, &st) >= 0 && S_ISREG(st.st_mode);
        r = new_call(bus, "PackSnapshot", &m);
        if (r < 0)
                goto fail;
        r = sd_bus_message_append(m, "sh", o->tag, fd);
        if (r < 0) {
                report_error(NULL, r, &ctx);
                goto fail;
        }
        fd = safe_close(fd); /* forkd has its own copy; ours would keep nothing open */
        if (asprintf(&what, "Packing snapshot '%s'", o->tag) < 0)
                goto fail;
        r = call_with_progress(bus, o, m, what, &error, &reply);
        if (r < 0) {
                int k = report_error(&error, r, &ctx);
                if (regular)
                        (void) unlink(o->out); /* not a bundle */
                return k;
        }
        tags = json_object_new_array();
        if (!tags)
                goto fail;
        r = sd_bus_message_enter_container(reply, 'a', "s");
        while (r >= 0) {
                const char *t;
                r = sd_bus_message_read(reply, "s", &t);
                if (r <= 0)
                        break;
                json_object_array_add(tags, json_object_new_string(t));
                n++;
        }
        if (r >= 0)
                r = sd_bus_message_exit_container(reply);
        if (r >= 0)
                r = sd_bus_message_read(reply, "t", &bytes);
        if (r < 0) {
                report_error(NULL, r, &ctx);
                goto fail;
        }
        if (!o->json) {
                char b[32];
                fprintf(stderr, "Wrote %s (%s) with %zu chain link%s:", o->out, format_bytes(b, sizeof b, bytes), n,
                        n == 1 ? "" : "s");
                for (size_t i = 0; i < n; i++)
                        fprintf(stderr, " %s", json_object_get_string(json_object_array_get_idx(tags, i)));
                fputc('\n', stderr);
                return 0;
        }
        doc = json_object_new_object();
        if (!doc || json_object_object_add(doc, "out", json_object_new_string(o->out)) < 0 ||
            json_object_object_add(doc, "bytes", json_object_new_uint64(bytes)) < 0 ||
            json_object_object_add(doc, "chain", TAKE_PTR(tags)) < 0)
                return -1;
        return print_json(doc);
fail:
        if (regular)
                (void) unlink(o->out); /* not a bundle */
        return -1;
}

int verb_unpack(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *list = NULL, *doc = NULL;
        struct error_context ctx = { .verb = "unpack", .tag = o->tag[0] ? o->tag : NULL };
        _cleanup_free_ char *what = NULL;
        _cleanup_close_ int fd = -EBADF;
        int r;

        fd = open(args[0], O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0) {
                fprintf(stderr, "forkctl: cannot open %s: %s\n", args[0], strerror(errno));
                return -1;
        }
        r = new_call(bus, "UnpackSnapshot", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "hs", fd, o->tag);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (asprintf(&what, "Unpacking %s", args[0]) < 0)
                return -1;
        r = call_with_progress(bus, o, m, what, &error, &reply);
        if (r < 0 && sd_bus_error_is_set(&error)) {
                /* forkd's message names the tag or the member at fault. */
                fprintf(stderr, "forkctl: unpack: %s\n", error.message ?: error.name);
                return -forkctl_error_exit_code(&error);
        }
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!o->json) {
                size_t n = json_object_array_length(list);
                for (size_t i = 0; i < n; i++) {
                        struct json_object *link = json_object_array_get_idx(list, i);
                        const char *parent = jstr(link, "parent_tag");
                        fprintf(stderr, "Link '%s' at %s%s%s%s\n", jstr(link, "tag") ?: "?", jstr(link, "dir") ?: "?",
                                parent ? " (chain parent: " : "", parent ?: "", parent ? ")" : "");
                }
                fprintf(stderr, "Unpacked %zu chain link%s, head '%s'.\n", n, n == 1 ? "" : "s",
                        n ? jstr(json_object_array_get_idx(list, n - 1), "tag") ?: "?" : "?");
                return print_snapshot_table(list);
        }
        doc = json_object_new_object();
        if (!doc || json_object_object_add(doc, "snapshots", TAKE_PTR(list)) < 0)
                return -1;
        return print_json(doc);
}

/* forkctl push TAG REF: the chain of TAG to an OCI registry forkd's admin configured. */
int verb_push(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *doc = NULL;
        struct error_context ctx = { .verb = "push", .tag = args[0] };
        _cleanup_free_ char *what = NULL;
        struct json_object *v;
        int r;

        r = new_call(bus, "PushSnapshot", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "ssa{sv}", args[0], args[1], 0);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (asprintf(&what, "Pushing snapshot '%s' to %s", args[0], args[1]) < 0)
                return -1;
        r = call_with_progress(bus, o, m, what, &error, &reply);
        if (r < 0 && sd_bus_error_is_set(&error) && !sd_bus_error_has_name(&error, "org.forkd.Error.NoSuchSnapshot")) {
                /* forkd's message names the registry, the link or the file at fault. */
                fprintf(stderr, "forkctl: push: %s\n", error.message ?: error.name);
                return -forkctl_error_exit_code(&error);
        }
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_json(reply, &doc);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!o->json) {
                char b[32];
                uint64_t sent = json_object_object_get_ex(doc, "bytes_sent", &v) ? (uint64_t) json_object_get_int64(v) : 0;

                fprintf(stderr, "Pushed %s as %s: %" PRIi64 " chain link%s, %" PRIi64 " blob%s (%s) sent.\n", args[1],
                        jstr(doc, "digest") ?: "?",
                        json_object_object_get_ex(doc, "links", &v) ? json_object_get_int64(v) : 0,
                        json_object_object_get_ex(doc, "links", &v) && json_object_get_int64(v) == 1 ? "" : "s",
                        json_object_object_get_ex(doc, "blobs_sent", &v) ? json_object_get_int64(v) : 0,
                        json_object_object_get_ex(doc, "blobs_sent", &v) && json_object_get_int64(v) == 1 ? "" : "s",
                        format_bytes(b, sizeof b, sent));
                printf("%s\n", jstr(doc, "digest") ?: "");
                return 0;
        }
        return print_json(doc);
}

/* forkctl pull REF [--tag T]: register the chain REF names (T: the head's tag here). */
int verb_pull(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *list = NULL, *doc = NULL;
        struct error_context ctx = { .verb = "pull", .tag = o->tag[0] ? o->tag : NULL };
        _cleanup_free_ char *what = NULL;
        int r;

        r = new_call(bus, "PullSnapshot", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "ssa{sv}", args[0], o->tag, 0);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (asprintf(&what, "Pulling %s", args[0]) < 0)
                return -1;
        r = call_with_progress(bus, o, m, what, &error, &reply);
        if (r < 0 && sd_bus_error_is_set(&error)) {
                /* forkd's message names the registry, the tag or the blob at fault. */
                fprintf(stderr, "forkctl: pull: %s\n", error.message ?: error.name);
                return -forkctl_error_exit_code(&error);
        }
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!o->json) {
                size_t n = json_object_array_length(list);

                fprintf(stderr, "Pulled %zu chain link%s, head '%s'.\n", n, n == 1 ? "" : "s",
                        n ? jstr(json_object_array_get_idx(list, n - 1), "tag") ?: "?" : "?");
                return print_snapshot_table(list);
        }
        doc = json_object_new_object();
        if (!doc || json_object_object_add(doc, "snapshots", TAKE_PTR(list)) < 0)
                return -1;
        return print_json(doc);
}
