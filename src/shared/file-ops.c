/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>

#include "base64.h"
#include "file-ops.h"

int file_read_answer_decode(struct json_object *answer, uint8_t *buf, size_t *ret_len, const char **ret_error) {
        struct json_object *b64, *size;
        size_t len;
        int r;

        if (!json_object_is_type(answer, json_type_object) ||
            !json_object_object_get_ex(answer, "data_b64", &b64) || !json_object_is_type(b64, json_type_string)) {
                *ret_error = "no data_b64 string";
                return -EBADMSG;
        }
        if (!json_object_object_get_ex(answer, "size", &size) || !json_object_is_type(size, json_type_int)) {
                *ret_error = "no integer size";
                return -EBADMSG;
        }
        /* validate all of it before a byte lands in buf */
        r = base64_decoded_size(json_object_get_string(b64), (size_t) json_object_get_string_len(b64), &len);
        if (r < 0) {
                *ret_error = "data_b64 is not base64";
                return -EBADMSG;
        }
        if (len > FILE_OP_MAX) {
                *ret_error = "more than 524288 bytes";
                return -EBADMSG;
        }
        if (json_object_get_int64(size) != (int64_t) len) {
                *ret_error = "size is not the length of the data";
                return -EBADMSG;
        }
        r = base64_decode(json_object_get_string(b64), (size_t) json_object_get_string_len(b64), buf, FILE_OP_MAX,
                          &len);
        if (r < 0) {
                *ret_error = "data_b64 is not base64";
                return -EBADMSG;
        }
        *ret_len = len;
        return 0;
}

int file_write_answer_check(struct json_object *answer, uint64_t want, const char **ret_error) {
        struct json_object *size;

        if (!json_object_is_type(answer, json_type_object) || !json_object_object_get_ex(answer, "size", &size) ||
            !json_object_is_type(size, json_type_int)) {
                *ret_error = "no integer size";
                return -EBADMSG;
        }
        if (json_object_get_int64(size) < 0 || (uint64_t) json_object_get_int64(size) != want) {
                *ret_error = "size is not the length written";
                return -EBADMSG;
        }
        return 0;
}
