/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * WriteFile and ReadFile: one file's contents in and out of a sandbox, the
 * agent ops write_file and read_file (docs/agent-protocol.md, file-ops.h).
 *
 * The arguments are checked here before anything reaches the guest: the
 * path absolute and normalized (hash_path_is_valid()), the data at most
 * FILE_OP_MAX bytes, the mode at most 07777. Then the same polkit action and
 * ownership rule as Exec (org.forkd.run-code, verbs "write-file" and
 * "read-file"). The guest's answer is hostile input: a read's data must be
 * canonical base64 of at most FILE_OP_MAX bytes and agree with its size.
 *
 * A refusal that the guest's agent gives with an errno name becomes a D-Bus
 * error that says what happened to the file (forkd-bus.h):
 *   ENOENT, ENOTDIR            org.forkd.Error.NoSuchFile
 *   EISDIR, ELOOP, EINVAL      org.forkd.Error.NotRegularFile (a directory, a
 *                              symbolic link at the final component, a fifo...)
 *   EFBIG, EMSGSIZE            org.forkd.Error.FileTooLarge (EMSGSIZE: the
 *                              request is over the guest's frame limit)
 *   ENAMETOOLONG               org.freedesktop.DBus.Error.InvalidArgs
 *   anything else              org.forkd.Error.GuestError
 */

#include <json-c/json.h>

#include "agent-proto.h"
#include "base64.h"
#include "file-hashes.h"
#include "file-ops.h"
#include "json-util.h"
#include "macro.h"
#include "time-util.h"
#include "sandbox-dbus.h"
#include "sandbox.h"

#define FILE_OP_TIMEOUT_USEC (60 * USEC_PER_SEC)

#define IN_SET_CONN(r) ((r) == -ECONNRESET || (r) == -EPIPE || (r) == -ENOTCONN || (r) == -ESHUTDOWN)

typedef struct FileCall {
        sd_bus_message *message;
        uint64_t size;   /* a write's: what the answer must say */
        bool read;
} FileCall;

static void file_call_free(FileCall *c) {
        if (!c)
                return;
        sd_bus_message_unref(c->message);
        free(c);
}

static const struct {
        const char *errno_name;
        const char *bus_error;
} errno_map[] = {
        { "ENOENT", FORKD_ERROR_NO_SUCH_FILE },
        { "ENOTDIR", FORKD_ERROR_NO_SUCH_FILE },
        { "EISDIR", FORKD_ERROR_NOT_REGULAR_FILE },
        { "ELOOP", FORKD_ERROR_NOT_REGULAR_FILE },
        { "EINVAL", FORKD_ERROR_NOT_REGULAR_FILE },
        { "EFBIG", FORKD_ERROR_FILE_TOO_LARGE },
        { "EMSGSIZE", FORKD_ERROR_FILE_TOO_LARGE },
        { "ENAMETOOLONG", SD_BUS_ERROR_INVALID_ARGS },
};

/* The D-Bus error for a guest's error frame. */
static const char *bus_error_for(struct json_object *obj) {
        struct json_object *e;
        const char *name;

        if (!obj || !json_object_object_get_ex(obj, "errno", &e) || !json_object_is_type(e, json_type_string))
                return FORKD_ERROR_GUEST_ERROR;
        name = json_object_get_string(e);
        for (size_t i = 0; i < ELEMENTSOF(errno_map); i++)
                if (strcmp(errno_map[i].errno_name, name) == 0)
                        return errno_map[i].bus_error;
        return FORKD_ERROR_GUEST_ERROR;
}

static int reply_read(sd_bus_message *message, struct json_object *obj) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_free_ uint8_t *data = NULL;
        const char *why = NULL;
        size_t len = 0;
        int r;

        data = malloc(FILE_OP_MAX);
        if (!data)
                return sd_bus_reply_method_errno(message, -ENOMEM, NULL);
        r = file_read_answer_decode(obj, data, &len, &why);
        if (r < 0)
                return sd_bus_reply_method_errorf(message, FORKD_ERROR_GUEST_ERROR,
                                                  "The guest sent an invalid read_file answer (%s).", why);
        r = sd_bus_message_new_method_return(message, &reply);
        if (r >= 0)
                r = sd_bus_message_append_array(reply, 'y', data, len);
        if (r >= 0)
                r = sd_bus_send(NULL, reply, NULL);
        if (r < 0)
                return sd_bus_reply_method_errno(message, r, NULL);
        return 0;
}

static int reply_write(sd_bus_message *message, struct json_object *obj, uint64_t want) {
        const char *why = NULL;

        if (file_write_answer_check(obj, want, &why) < 0)
                return sd_bus_reply_method_errorf(message, FORKD_ERROR_GUEST_ERROR,
                                                  "The guest sent an invalid write_file answer (%s).", why);
        return sd_bus_reply_method_return(message, "t", want);
}

static void file_reply(int r, uint16_t type, const char *json, struct json_object *obj, void *userdata) {
        FileCall *c = userdata;
        struct json_object *e;

        if (r >= 0 && type == FKA_RESPONSE) {
                if (c->read)
                        (void) reply_read(c->message, obj);
                else
                        (void) reply_write(c->message, obj, c->size);
        } else if (r >= 0 && type == FKA_ERROR) {
                const char *msg = "the guest refused the request";

                if (obj && json_object_object_get_ex(obj, "error", &e) && json_object_is_type(e, json_type_string))
                        msg = json_object_get_string(e);
                (void) sd_bus_reply_method_errorf(c->message, bus_error_for(obj), "%s", msg);
        } else if (r == -ETIMEDOUT)
                (void) sd_bus_reply_method_errorf(c->message, FORKD_ERROR_TIMEOUT, "The guest did not answer in time.");
        else if (IN_SET_CONN(r))
                (void) sd_bus_reply_method_errorf(c->message, FORKD_ERROR_NO_SUCH_SANDBOX,
                                                  "The sandbox exited before it answered.");
        else if (r == -EBADMSG || r == -EMSGSIZE || r == -EPROTO)
                (void) sd_bus_reply_method_errorf(c->message, FORKD_ERROR_GUEST_ERROR,
                                                  "The guest sent an invalid answer (%s).", strerror(-r));
        else
                (void) sd_bus_reply_method_errorf(c->message, FORKD_ERROR_FAILED, "Agent request failed: %s",
                                                  strerror(-r));
        file_call_free(c);
}

static int start_file_call(sd_bus_message *message, Sandbox *s, struct json_object *req, bool read, uint64_t size,
                           sd_bus_error *error) {
        FileCall *c;
        const char *json;
        int r;

        if (s->state != SANDBOX_RUNNING)
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "Sandbox %s is being terminated.", s->id);
        json = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        if (!json)
                return -ENOMEM;
        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        *c = (FileCall) { .message = sd_bus_message_ref(message), .size = size, .read = read };
        r = sandbox_call(s, json, FILE_OP_TIMEOUT_USEC, file_reply, c);
        if (r < 0)
                file_call_free(c);
        if (r == -EBUSY || r == -ENOBUFS)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "Too many requests in flight for sandbox %s.", s->id);
        if (IN_SET_CONN(r))
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "Sandbox %s has exited.", s->id);
        if (r == -EBADMSG || r == -EPROTO)
                return sd_bus_error_setf(error, FORKD_ERROR_GUEST_ERROR,
                                         "The agent channel of sandbox %s is broken: its guest sent an invalid frame (%s).",
                                         s->id, strerror(-r));
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Failed to send the request to %s: %m", s->id);
        return 1;
}

static int check_path(const char *path, sd_bus_error *error) {
        if (!hash_path_is_valid(path))
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "Path \"%.64s%s\" is not absolute and normalized (at most %u bytes; no \".\", "
                                         "\"..\", \"//\", trailing '/' or control characters).",
                                         path, strlen(path) > 64 ? "..." : "", HASH_PATH_MAX);
        return 0;
}

int bus_sandbox_method_write_file(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ struct json_object *req = NULL;
        _cleanup_free_ char *b64 = NULL;
        Sandbox *s = userdata;
        const char *path;
        const void *data;
        size_t size = 0;
        uint32_t mode;
        int r;

        r = sd_bus_message_read(message, "s", &path);
        if (r < 0)
                return r;
        r = sd_bus_message_read_array(message, 'y', &data, &size);
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "u", &mode);
        if (r < 0)
                return r;
        r = check_path(path, error);
        if (r < 0)
                return r;
        if (size > FILE_OP_MAX)
                return sd_bus_error_setf(error, FORKD_ERROR_FILE_TOO_LARGE,
                                         "%s: %zu bytes is more than the %u a write takes.", path, size, FILE_OP_MAX);
        if (mode > FILE_OP_MODE_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Mode %#o is not between 0 and 07777.",
                                         mode);

        r = sandbox_verify(message, s, "org.forkd.run-code", "write-file", error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1;

        b64 = malloc(BASE64_ENCODED_SIZE(size) + 1);
        if (!b64)
                return -ENOMEM;
        b64[base64_encode(data, size, b64)] = 0;
        req = json_object_new_object();
        if (!req)
                return -ENOMEM;
        if (json_object_object_add(req, "op", json_object_new_string("write_file")) < 0 ||
            json_object_object_add(req, "path", json_object_new_string(path)) < 0 ||
            json_object_object_add(req, "data_b64", json_object_new_string(b64)) < 0 ||
            json_object_object_add(req, "mode", json_object_new_int64(mode)) < 0)
                return -ENOMEM;
        return start_file_call(message, s, req, false, size, error);
}

int bus_sandbox_method_read_file(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ struct json_object *req = NULL;
        Sandbox *s = userdata;
        const char *path;
        int r;

        r = sd_bus_message_read(message, "s", &path);
        if (r < 0)
                return r;
        r = check_path(path, error);
        if (r < 0)
                return r;

        r = sandbox_verify(message, s, "org.forkd.run-code", "read-file", error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1;

        req = json_object_new_object();
        if (!req)
                return -ENOMEM;
        if (json_object_object_add(req, "op", json_object_new_string("read_file")) < 0 ||
            json_object_object_add(req, "path", json_object_new_string(path)) < 0)
                return -ENOMEM;
        return start_file_call(message, s, req, true, 0, error);
}
