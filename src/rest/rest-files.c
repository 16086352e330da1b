/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* Files in a sandbox (E2B's files.write/files.read), over forkd's WriteFile
 * and ReadFile:
 *
 *   POST /v1/sandboxes/:id/files/write  {"path": "/abs", "data_b64": "...", "mode": 420}
 *        -> 200 {"path": "/abs", "size": N}
 *   POST /v1/sandboxes/:id/files/read   {"path": "/abs"}
 *        -> 200 {"path": "/abs", "data_b64": "...", "size": N}
 *
 * 400: a bad body (path not absolute and normalized, data_b64 not base64,
 * mode outside 0..07777); 404: no such sandbox, or no such file in it; 409:
 * the path is a directory, a symbolic link or another file that is not a
 * regular one; 413: more than FILE_OP_MAX bytes (file-ops.h); the agent's
 * failures and timeouts as on the other agent routes (GuestError 500,
 * Timeout 504). The mapping is rest-util.c's table. */

#include "base64.h"
#include "file-hashes.h"
#include "file-ops.h"
#include "json-util.h"
#include "macro.h"
#include "rest-bus.h"
#include "rest-files.h"
#include "rest-reply.h"
#include "rest-util.h"

#define CALL_TIMEOUT_FILES (90ULL * 1000000ULL) /* forkd waits 60 s for the guest */

static int reply_call_failed(RestRequest *req, int r) {
        if (r == -EBUSY)
                return rest_reply_error(req, 503, "too many requests in flight to the daemon, retry later");
        if (r == -ENOMEM)
                return rest_reply_error(req, 500, "out of memory");
        return rest_reply_error(req, 503, "forkd daemon unavailable: cannot reach the bus: %s", strerror(-r));
}

typedef struct FilesArgs {
        char path[HASH_PATH_MAX + 2]; /* one more than allowed: too long is seen as such */
        struct json_object *data_b64;
        int64_t mode;
} FilesArgs;

/* Borrow the string (the body object outlives its use). */
static int dispatch_borrow(struct json_object *v, void *field, const char **ret_error) {
        *(struct json_object **) field = v;
        return 0;
}

/* null or absent: the default */
static int dispatch_mode(struct json_object *v, void *field, const char **ret_error) {
        int64_t m = v ? json_object_get_int64(v) : FILE_OP_MODE_DEFAULT;

        if (m < 0 || m > FILE_OP_MODE_MAX) {
                *ret_error = "must be between 0 and 4095 (0o7777)";
                return -ERANGE;
        }
        *(int64_t *) field = m;
        return 0;
}

/* The body, dispatched into a. 1 when it parsed; otherwise the error is
 * queued and this returns 0 (or the reply's negative errno). */
static int parse_files_body(RestRequest *req, const struct json_dispatch *table, FilesArgs *a,
                            struct json_object **ret_obj) {
        const char *field = NULL, *reason = NULL;
        int r;

        if (rest_request_parse_json(req, false, ret_obj) < 0)
                return 0;
        /* Unknown fields are ignored, as on every other route (docs/rest-api.md). */
        r = json_dispatch_full(*ret_obj, table, 0, a, &field, &reason);
        if (r == -ENOMEM)
                r = rest_reply_error(req, 500, "out of memory");
        else if (r == -ENAMETOOLONG && field && !strcmp(field, "path"))
                r = rest_reply_error(req, 400, "path: longer than %u bytes", HASH_PATH_MAX);
        else if (r < 0 && field)
                r = rest_reply_error(req, 400, "field '%s': %s", field, reason ?: "invalid value");
        else if (r < 0)
                r = rest_reply_error(req, 400, "request body: %s", reason ?: "invalid");
        else if (!hash_path_is_valid(a->path))
                r = rest_reply_error(req, 400,
                                     "path '%.64s%s': expected an absolute, normalized path (no '.', '..', '//', "
                                     "trailing '/' or control characters)",
                                     a->path, strlen(a->path) > 64 ? "..." : "");
        else
                return 1;
        return MIN(r, 0);
}

static int on_reply_write(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *o = NULL;
        const sd_bus_error *e = sd_bus_message_get_error(reply);
        const char *path = rest_request_data(req);
        uint64_t size;
        int r;

        if (e)
                return rest_reply_bus_error(req, e, 0);
        r = sd_bus_message_read(reply, "t", &size);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        o = json_object_new_object();
        if (!o || json_object_object_add(o, "path", json_object_new_string(path)) < 0 ||
            json_object_object_add(o, "size", json_object_new_uint64(size)) < 0)
                return rest_reply_error(req, 500, "out of memory");
        return rest_reply_json(req, 200, o);
}

static int on_reply_read(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *o = NULL;
        _cleanup_free_ char *b64 = NULL;
        const sd_bus_error *e = sd_bus_message_get_error(reply);
        const char *path = rest_request_data(req);
        const void *data;
        size_t size = 0;
        int r;

        if (e)
                return rest_reply_bus_error(req, e, 0);
        r = sd_bus_message_read_array(reply, 'y', &data, &size);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        if (size > FILE_OP_MAX)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %zu bytes", size);
        b64 = malloc(BASE64_ENCODED_SIZE(size) + 1);
        if (!b64)
                return rest_reply_error(req, 500, "out of memory");
        b64[base64_encode(data, size, b64)] = 0;
        o = json_object_new_object();
        if (!o || json_object_object_add(o, "path", json_object_new_string(path)) < 0 ||
            json_object_object_add(o, "data_b64", json_object_new_string(b64)) < 0 ||
            json_object_object_add(o, "size", json_object_new_uint64(size)) < 0)
                return rest_reply_error(req, 500, "out of memory");
        return rest_reply_json(req, 200, o);
}

/* Keep the path for the reply: the body goes away with the parsed object. */
static int keep_path(RestRequest *req, const char *path) {
        char *p = strdup(path);

        if (!p)
                return -ENOMEM;
        rest_request_set_data(req, p, free);
        return 0;
}

static int send_call(RestRequest *req, sd_bus_message *m, rest_reply_func cb) {
        int r = rest_call(req, m, CALL_TIMEOUT_FILES, cb);

        if (r < 0)
                return reply_call_failed(req, r);
        return 0;
}

int rest_route_sandbox_files_write(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "path", JSON_KIND_STRING, NULL, offsetof(FilesArgs, path), JSON_FIELD_SIZE(FilesArgs, path),
                  JSON_MANDATORY },
                { "data_b64", JSON_KIND_STRING, dispatch_borrow, offsetof(FilesArgs, data_b64), 0, JSON_MANDATORY },
                { "mode", JSON_KIND_INT64, dispatch_mode, offsetof(FilesArgs, mode), 0, JSON_NULLABLE },
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        _cleanup_free_ uint8_t *data = NULL;
        _cleanup_free_ FilesArgs *a = NULL;
        const char *id = rest_request_param(req), *b64;
        size_t n, size;
        int r;

        if (!rest_tag_is_valid(id))
                return rest_reply_error(req, 400, "invalid sandbox id: must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$");
        a = calloc(1, sizeof(*a));
        if (!a)
                return rest_reply_error(req, 500, "out of memory");
        a->mode = FILE_OP_MODE_DEFAULT;
        r = parse_files_body(req, table, a, &o);
        if (r <= 0)
                return r;

        b64 = json_object_get_string(a->data_b64);
        n = (size_t) json_object_get_string_len(a->data_b64);
        r = base64_decoded_size(b64, n, &size);
        if (r < 0)
                return rest_reply_error(req, 400, "data_b64: not base64 (RFC 4648 standard alphabet, padded, no "
                                                  "whitespace)");
        if (size > FILE_OP_MAX)
                return rest_reply_error(req, 413, "%s: %zu bytes is more than the %u a write takes", a->path, size,
                                        FILE_OP_MAX);
        data = malloc(MAX(size, (size_t) 1));
        if (!data)
                return rest_reply_error(req, 500, "out of memory");
        r = base64_decode(b64, n, data, size, &size);
        if (r < 0)
                return rest_reply_error(req, 400, "data_b64: %s", strerror(-r));

        if (keep_path(req, a->path) < 0)
                return rest_reply_error(req, 500, "out of memory");
        r = rest_new_manager_call(req, "WriteFile", &m);
        if (r < 0)
                return reply_call_failed(req, r);
        r = sd_bus_message_append(m, "ss", id, a->path);
        if (r >= 0)
                r = sd_bus_message_append_array(m, 'y', data, size);
        if (r >= 0)
                r = sd_bus_message_append(m, "u", (uint32_t) a->mode);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        return send_call(req, m, on_reply_write);
}

int rest_route_sandbox_files_read(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "path", JSON_KIND_STRING, NULL, offsetof(FilesArgs, path), JSON_FIELD_SIZE(FilesArgs, path),
                  JSON_MANDATORY },
                {}
        };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *o = NULL;
        _cleanup_free_ FilesArgs *a = NULL;
        const char *id = rest_request_param(req);
        int r;

        if (!rest_tag_is_valid(id))
                return rest_reply_error(req, 400, "invalid sandbox id: must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$");
        a = calloc(1, sizeof(*a));
        if (!a)
                return rest_reply_error(req, 500, "out of memory");
        r = parse_files_body(req, table, a, &o);
        if (r <= 0)
                return r;

        if (keep_path(req, a->path) < 0)
                return rest_reply_error(req, 500, "out of memory");
        r = rest_new_manager_call(req, "ReadFile", &m);
        if (r < 0)
                return reply_call_failed(req, r);
        r = sd_bus_message_append(m, "ss", id, a->path);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        return send_call(req, m, on_reply_read);
}
