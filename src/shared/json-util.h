/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Strict JSON on top of json-c.
 *
 * json-c is permissive: it accepts invalid UTF-8, silently converts between
 * types (json_object_get_int("12abc") == 12), clamps integer literals that
 * overflow and happily stops in the middle of a buffer. Everything here
 * refuses instead.
 *
 *   json_parse_strict()  buffer -> top-level object, with size and depth limits
 *   json_dispatch()      object -> C struct, driven by a table of fields
 *
 * Errors: negative errno plus, where a ret_error parameter exists, a static
 * human-readable reason (never NULL on failure when requested).
 */

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Parse buf[0..len) as exactly one JSON object followed only by whitespace.
 * Refuses (-EMSGSIZE) len > max_len, and (-EBADMSG): invalid UTF-8 (overlong
 * forms, surrogates, > U+10FFFF), NUL bytes, integer literals outside
 * int64/uint64, nesting deeper than max_depth (the top-level object is depth
 * 1), a top level that is not an object, syntax errors and trailing bytes.
 * On success *ret holds a new reference; on failure *ret is untouched. */
int json_parse_strict(const char *buf, size_t len, size_t max_len, int max_depth,
                      struct json_object **ret, const char **ret_error);

/* Validate UTF-8 strictly (no overlongs, no surrogates, nothing above
 * U+10FFFF). NUL bytes are valid UTF-8; callers that care check separately. */
bool utf8_is_valid_n(const char *s, size_t len);

enum json_kind {
        JSON_KIND_ANY,     /* no type check; needs a custom parse() */
        JSON_KIND_STRING,  /* size > 0: char[size] at offset; size == 0: char * (malloc()ed) */
        JSON_KIND_INT,     /* int */
        JSON_KIND_INT64,   /* int64_t */
        JSON_KIND_UINT64,  /* uint64_t */
        JSON_KIND_UINT32,  /* uint32_t */
        JSON_KIND_BOOL,    /* bool */
        JSON_KIND_OBJECT,  /* struct json_object * (borrowed from the dispatched object) */
        JSON_KIND_ARRAY,   /* struct json_object * (borrowed from the dispatched object) */
        _JSON_KIND_MAX,
};

/* Per-field flags */
#define JSON_MANDATORY (1u << 0) /* the key must be present */
#define JSON_NULLABLE  (1u << 1) /* null is accepted (see json_dispatch()) */

/* Flags for json_dispatch() */
#define JSON_REJECT_UNKNOWN (1u << 0) /* a key not in the table is an error */

/* Custom field parser: v is the value (NULL for JSON null, only ever passed
 * when the entry is JSON_NULLABLE), field points at base + offset. The type
 * has already been checked against the entry's kind. Returns >= 0 or a
 * negative errno and then sets *ret_error to a static reason. */
typedef int (*json_parse_func)(struct json_object *v, void *field, const char **ret_error);

struct json_dispatch {
        const char *name;
        enum json_kind type;
        json_parse_func parse; /* optional; replaces the built-in store for this kind */
        size_t offset;
        size_t size;           /* JSON_KIND_STRING: buffer size including the NUL */
        unsigned flags;        /* JSON_MANDATORY, JSON_NULLABLE */
};

#define JSON_FIELD_SIZE(type, member) sizeof(((type *) 0)->member)

/*
 * Fill the struct at base from the object obj, following table (terminated
 * by an entry with name == NULL). Types are checked explicitly: integers must
 * be JSON integers (not doubles, not strings) in range of the C type, strings
 * must be strings without NUL and of valid UTF-8, and fixed-size strings must
 * fit their buffer. A JSON null is refused unless the entry is JSON_NULLABLE;
 * then the field is reset (empty string, NULL pointer, 0, false) or, with a
 * custom parser, parse() is called with v == NULL.
 *
 * json-c keeps only the last of duplicate keys; so does this.
 *
 * Errors: -EINVAL wrong type or null, -ERANGE integer out of range,
 * -ENAMETOOLONG string too long for its buffer, -ENXIO mandatory key missing,
 * -EADDRNOTAVAIL unknown key (with JSON_REJECT_UNKNOWN), -ENOMEM, or whatever
 * a custom parser returns. *ret_error_field is set to the offending key (for
 * unknown keys this points into obj, valid as long as obj lives) or NULL if
 * obj itself is not an object.
 *
 * Fields are written in table order, so on failure base may be partially
 * filled (heap strings already stored there stay owned by base): dispatch
 * into a temporary and copy on success.
 */
int json_dispatch_full(struct json_object *obj, const struct json_dispatch *table, unsigned flags,
                       void *base, const char **ret_error_field, const char **ret_error);

static inline int json_dispatch(struct json_object *obj, const struct json_dispatch *table, unsigned flags,
                                void *base, const char **ret_error_field) {
        return json_dispatch_full(obj, table, flags, base, ret_error_field, NULL);
}

/* Copy the JSON string v into buf[size] with the same checks as
 * JSON_KIND_STRING. For custom parsers. buf is untouched on failure. */
int json_string_to_buf(struct json_object *v, char *buf, size_t size, const char **ret_error);

static inline void json_object_putp(struct json_object **p) {
        if (*p)
                json_object_put(*p);
}
#define _cleanup_json_ __attribute__((cleanup(json_object_putp)))
