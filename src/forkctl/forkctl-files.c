/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base64.h"
#include "file-hashes.h"
#include "file-ops.h"
#include "forkctl.h"
#include "forkctl-files.h"
#include "io-util.h"
#include "json-util.h"
#include "macro.h"
#include "time-util.h"

#define FILES_CALL_TIMEOUT_USEC (90 * USEC_PER_SEC) /* forkd waits 60 s for the guest */

static int check_path(const char *path) {
        if (hash_path_is_valid(path))
                return 0;
        fprintf(stderr,
                "forkctl: '%.64s%s' is not an absolute, normalized path in the sandbox (at most %u bytes; no '.', "
                "'..', '//', trailing '/' or control characters)\nTry 'forkctl --help'.\n",
                path, strlen(path) > 64 ? "..." : "", HASH_PATH_MAX);
        return -2;
}

int parse_file_mode(const char *s, uint32_t *ret) {
        uint32_t v = 0;

        if (!s || !*s || strlen(s) > 5)
                return -EINVAL;
        for (const char *p = s; *p; p++) {
                if (*p < '0' || *p > '7')
                        return -EINVAL;
                v = v * 8 + (uint32_t) (*p - '0');
        }
        if (v > FILE_OP_MODE_MAX)
                return -EINVAL;
        *ret = v;
        return 0;
}

/* All of fd, at most FILE_OP_MAX bytes (-EFBIG beyond). */
static int read_local(int fd, uint8_t *buf, size_t *ret_size) {
        ssize_t n = loop_read(fd, buf, FILE_OP_MAX + 1);

        if (n < 0)
                return (int) n;
        if ((size_t) n > FILE_OP_MAX)
                return -EFBIG;
        *ret_size = (size_t) n;
        return 0;
}

int forkctl_write_file(sd_bus *bus, const char *id, const char *path, const char *local, uint32_t mode, bool json) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "write-file", .id = id };
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ uint8_t *data = NULL;
        bool from_stdin = !local || strcmp(local, "-") == 0;
        const char *what = from_stdin ? "standard input" : local;
        uint64_t size = 0;
        size_t n = 0;
        int r;

        r = check_path(path);
        if (r < 0)
                return r;
        if (!from_stdin) {
                fd = open(local, O_RDONLY | O_NOCTTY | O_CLOEXEC);
                if (fd < 0) {
                        fprintf(stderr, "forkctl: cannot open %s: %s\n", local, strerror(errno));
                        return -1;
                }
        }
        data = malloc(FILE_OP_MAX + 1);
        if (!data)
                return -1;
        r = read_local(from_stdin ? STDIN_FILENO : fd, data, &n);
        if (r == -EFBIG) {
                fprintf(stderr, "forkctl: %s holds more than %u bytes, the most one write takes\n", what, FILE_OP_MAX);
                return -1;
        }
        if (r < 0) {
                fprintf(stderr, "forkctl: cannot read %s: %s\n", what, strerror(-r));
                return -1;
        }

        r = sd_bus_message_new_method_call(bus, &m, BUS_NAME, BUS_PATH, BUS_INTERFACE,
                                           "WriteFile");
        if (r >= 0)
                r = sd_bus_message_append(m, "ss", id, path);
        if (r >= 0)
                r = sd_bus_message_append_array(m, 'y', data, n);
        if (r >= 0)
                r = sd_bus_message_append(m, "u", mode);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        r = sd_bus_call(bus, m, FILES_CALL_TIMEOUT_USEC, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = sd_bus_message_read(reply, "t", &size);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (json) {
                _cleanup_json_ struct json_object *o = json_object_new_object();

                if (!o)
                        return -1;
                json_object_object_add(o, "path", json_object_new_string(path));
                json_object_object_add(o, "size", json_object_new_uint64(size));
                puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE));
        }
        return 0;
}

int forkctl_read_file(sd_bus *bus, const char *id, const char *path, bool json) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "read-file", .id = id };
        const void *data;
        size_t n = 0;
        int r;

        r = check_path(path);
        if (r < 0)
                return r;
        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "ReadFile", &error,
                               &reply, "ss", id, path);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = sd_bus_message_read_array(reply, 'y', &data, &n);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (json) {
                _cleanup_json_ struct json_object *o = json_object_new_object();
                _cleanup_free_ char *b64 = malloc(BASE64_ENCODED_SIZE(n) + 1);

                if (!o || !b64)
                        return -1;
                b64[base64_encode(data, n, b64)] = 0;
                json_object_object_add(o, "path", json_object_new_string(path));
                json_object_object_add(o, "data_b64", json_object_new_string(b64));
                json_object_object_add(o, "size", json_object_new_uint64(n));
                puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE));
                return 0;
        }
        if (n > 0 && fwrite(data, 1, n, stdout) != n) {
                fprintf(stderr, "forkctl: failed to write the output: %s\n", strerror(errno));
                return -1;
        }
        return 0;
}
