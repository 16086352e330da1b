/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* D-Bus replies written straight into JSON text: the same text that the json-c
 * path (rest_bus_read_dict_json() and rest_json_string()) makes of them, with
 * no tree of JSON objects in between. A list of 1000 sandboxes is the largest
 * reply forkd-rest serves, and most of what it cost was building, printing and
 * freeing that tree. */

#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

typedef struct RestJsonText {
        char *buf; /* NUL-terminated once anything was written */
        size_t len;
        size_t size;
} RestJsonText;

void rest_json_text_done(RestJsonText *t);

/* Append a{sv} as a JSON object, or aa{sv} as a JSON array of objects. The
 * message must be positioned at it; on failure t holds a partial text (free it
 * with rest_json_text_done()). */
int rest_bus_write_dict_json(sd_bus_message *m, RestJsonText *t);
int rest_bus_write_dict_array_json(sd_bus_message *m, RestJsonText *t);

/* The string as JSON (quoted and escaped as json-c escapes it, '/' left as it is);
 * _n: len bytes, NULs among them (as \u0000). */
int rest_json_text_append_string(RestJsonText *t, const char *s);
int rest_json_text_append_string_n(RestJsonText *t, const char *s, size_t len);
/* A line of a process's output as the NDJSON streams carry it: {"stream", "offset",
 * "data"} when the bytes are UTF-8, else with "data_b64". */
int rest_json_text_output_chunk(RestJsonText *t, const char *stream, uint64_t offset, const void *data, size_t len);
