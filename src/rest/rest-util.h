/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Small pure helpers of forkd-rest: validation, the D-Bus error -> HTTP status
 * table, constant-time comparison, and a{sv} -> JSON conversion. No I/O. */

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <systemd/sd-bus.h>

#define REST_TAG_MAX 64

/* ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$, for snapshot tags and sandbox ids. */
bool rest_tag_is_valid(const char *s);

/* Compares a and b in time that depends only on their lengths' maximum,
 * never on where they first differ. */
/* n bytes more of a request body of at most max (the caller checked), kept
 * NUL-terminated; the buffer grows by doubling, to max + 1 at most. */
int rest_body_append(char **body, size_t *len, size_t *alloc, size_t max, const void *data, size_t n);
bool rest_secret_equal(const void *a, size_t a_len, const void *b, size_t b_len);

/* "true"/"1"/"yes" -> 1, "false"/"0"/"no"/"" -> 0, NULL -> 0, else -EINVAL. */
int rest_parse_bool_arg(const char *s);

/* HTTP status for a D-Bus error name (NULL or unknown -> 500). */
unsigned rest_status_from_bus_error(const char *name);
/* True for the errors that mean "the daemon is not there" (503). */
bool rest_bus_error_is_unavailable(const char *name);

/* The variant types forkd's interface uses, which both JSON conversions take:
 * a basic type, an array of one, a{s<basic>}, a{sv} and aa{sv}. */
bool rest_bus_variant_type_supported(const char *contents);

/* Read one variant (the message must be positioned at it) into a new JSON
 * value. Unknown types are skipped: *ret = NULL and 0 returned. */
int rest_bus_read_variant_json(sd_bus_message *m, struct json_object **ret);
/* Read a{sv} into a JSON object. *ret untouched on failure. */
int rest_bus_read_dict_json(sd_bus_message *m, struct json_object **ret);
/* Read aa{sv} into a JSON array of objects. *ret untouched on failure. */
int rest_bus_read_dict_array_json(sd_bus_message *m, struct json_object **ret);

/* Compact serialisation used for every response body. */
const char *rest_json_string(struct json_object *o, size_t *ret_len);
