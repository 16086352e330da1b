/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * A node's answer as a fleet's front end reads it: front_parse_answer() on any
 * bytes, and what it takes renamed (fleet_answer_rename()) as the front end
 * renames a node's sandboxes. Every id it leaves must be "<forkd id>.node-b"
 * with no other '.', or null: never a name that routes to another node.
 */

#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fleet-http.h"
#include "snapshot-meta.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_id(struct json_object *id) {
        const char *s, *dot;

        if (!id)
                return;
        if (!json_object_is_type(id, json_type_string))
                abort();
        s = json_object_get_string(id);
        dot = strchr(s, '.');
        if (!dot || strcmp(dot, ".node-b") != 0 || dot == s)
                abort();
}

static void check(struct json_object *o) {
        struct json_object *v;

        if (json_object_is_type(o, json_type_array)) {
                for (size_t i = 0; i < json_object_array_length(o); i++)
                        check(json_object_array_get_idx(o, i));
                return;
        }
        if (!json_object_is_type(o, json_type_object))
                return;
        if (json_object_object_get_ex(o, "id", &v))
                check_id(v);
        if (json_object_object_get_ex(o, "children", &v) && json_object_is_type(v, json_type_array))
                for (size_t i = 0; i < json_object_array_length(v); i++)
                        check_id(json_object_array_get_idx(v, i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        struct json_object *o = NULL;
        char *body = malloc(size + 1);

        if (!body)
                return 0;
        memcpy(body, data, size);
        body[size] = 0;
        if (front_parse_answer(body, size, &o) == 0) {
                fleet_answer_rename(o, "node-b");
                check(o);
                if (!json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN))
                        abort();
                json_object_put(o);
        }
        free(body);
        return 0;
}
