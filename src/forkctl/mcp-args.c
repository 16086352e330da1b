/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The arguments of forkctl mcp's tools: a table of struct mcp_param per tool
 * is both the tool's inputSchema (mcp_params_schema()) and the check of a
 * call's arguments (mcp_args_parse()), so the two cannot disagree. The check
 * is strict, as the schema says: JSON types exactly (an integer is not 2.0 or
 * "2", null is not a value), ranges, lengths in characters, tags and ids by
 * their pattern, required arguments, and no others.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "json-util.h"
#include "mcp-args.h"
#include "mcp.h"
#include "snapshot-meta.h"

char *mcp_asprintf(const char *fmt, ...) {
        va_list ap;
        char *s;
        int r;

        va_start(ap, fmt);
        r = vasprintf(&s, fmt, ap);
        va_end(ap);
        return r < 0 ? NULL : s;
}

/* Characters (code points) of a valid UTF-8 string, as JSON Schema's
 * minLength/maxLength count them. */
static size_t utf8_chars(const char *s) {
        size_t n = 0;

        for (; *s; s++)
                if (((unsigned char) *s & 0xc0) != 0x80)
                        n++;
        return n;
}

/* ---- schemas --------------------------------------------------------------- */

int mcp_json_add(struct json_object *o, const char *key, struct json_object *v) {
        if (!v)
                return -ENOMEM;
        if (json_object_object_add(o, key, v) < 0) {
                json_object_put(v);
                return -ENOMEM;
        }
        return 0;
}

/* disk_rate, net_rate: forkd's rate object; its bounds are forkd's (the tool checks them). */
static int rate_schema(struct json_object *o) {
        _cleanup_json_ struct json_object *props = json_object_new_object();
        int r;

        if (!props)
                return -ENOMEM;
        r = mcp_json_add(o, "type", json_object_new_string("object"));
        for (size_t k = 0; r >= 0 && k < 3; k++) {
                static const char *const keys[] = { "bandwidth", "ops", "burst" };
                _cleanup_json_ struct json_object *i = json_object_new_object();

                if (!i)
                        return -ENOMEM;
                r = mcp_json_add(i, "type", json_object_new_string("integer"));
                if (r >= 0)
                        r = mcp_json_add(i, "minimum", json_object_new_int64(0));
                if (r >= 0)
                        r = mcp_json_add(props, keys[k], TAKE_PTR(i));
        }
        if (r >= 0)
                r = mcp_json_add(o, "properties", TAKE_PTR(props));
        if (r >= 0)
                r = mcp_json_add(o, "minProperties", json_object_new_int64(1));
        if (r >= 0)
                r = mcp_json_add(o, "additionalProperties", json_object_new_boolean(0));
        return r;
}

static int param_schema(const struct mcp_param *p, struct json_object **ret) {
        _cleanup_json_ struct json_object *o = json_object_new_object(), *e = NULL;
        int r = 0;

        if (!o)
                return -ENOMEM;
        switch (p->type) {
        case MCP_NAME:
                r = mcp_json_add(o, "type", json_object_new_string("string"));
                if (r >= 0)
                        r = mcp_json_add(o, "pattern", json_object_new_string(MCP_NAME_PATTERN));
                break;
        case MCP_PATH:
                r = mcp_json_add(o, "type", json_object_new_string("string"));
                if (r >= 0)
                        r = mcp_json_add(o, "pattern", json_object_new_string("^/"));
                if (r >= 0)
                        r = mcp_json_add(o, "maxLength", json_object_new_int64(MCP_PATH_LENGTH_MAX));
                break;
        case MCP_TEXT:
                r = mcp_json_add(o, "type", json_object_new_string("string"));
                if (r >= 0)
                        r = mcp_json_add(o, "minLength", json_object_new_int64(p->min));
                if (r >= 0)
                        r = mcp_json_add(o, "maxLength", json_object_new_int64(p->max));
                break;
        case MCP_ENUM:
                r = mcp_json_add(o, "type", json_object_new_string("string"));
                e = json_object_new_array();
                if (!e)
                        return -ENOMEM;
                for (const char *const *v = p->values; r >= 0 && *v; v++)
                        if (json_object_array_add(e, json_object_new_string(*v)) < 0)
                                r = -ENOMEM;
                if (r >= 0)
                        r = mcp_json_add(o, "enum", TAKE_PTR(e));
                if (r >= 0 && p->def_str)
                        r = mcp_json_add(o, "default", json_object_new_string(p->def_str));
                break;
        case MCP_INTEGER:
                r = mcp_json_add(o, "type", json_object_new_string("integer"));
                if (r >= 0)
                        r = mcp_json_add(o, "minimum", json_object_new_int64(p->min));
                if (r >= 0)
                        r = mcp_json_add(o, "maximum", json_object_new_int64(p->max));
                if (r >= 0 && p->has_default)
                        r = mcp_json_add(o, "default", json_object_new_int64(p->def));
                break;
        case MCP_BOOLEAN:
                r = mcp_json_add(o, "type", json_object_new_string("boolean"));
                if (r >= 0 && p->has_default)
                        r = mcp_json_add(o, "default", json_object_new_boolean(p->def != 0));
                break;
        case MCP_STRING_ARRAY:
                r = mcp_json_add(o, "type", json_object_new_string("array"));
                e = json_object_new_object();
                if (!e)
                        return -ENOMEM;
                if (r >= 0)
                        r = mcp_json_add(e, "type", json_object_new_string("string"));
                if (r >= 0)
                        r = mcp_json_add(o, "items", TAKE_PTR(e));
                if (r >= 0)
                        r = mcp_json_add(o, "minItems", json_object_new_int64(p->min));
                if (r >= 0)
                        r = mcp_json_add(o, "maxItems", json_object_new_int64(p->max));
                break;
        case MCP_NUMBER:
                r = mcp_json_add(o, "type", json_object_new_string("number"));
                if (r >= 0)
                        r = mcp_json_add(o, "exclusiveMinimum", json_object_new_int64(p->min));
                break;
        case MCP_RATE:
                r = rate_schema(o);
                break;
        }
        if (r >= 0)
                r = mcp_json_add(o, "description", json_object_new_string(p->description));
        if (r < 0)
                return r;
        *ret = TAKE_PTR(o);
        return 0;
}

int mcp_params_schema(const struct mcp_param *params, struct json_object **ret) {
        _cleanup_json_ struct json_object *schema = json_object_new_object(), *props = json_object_new_object(),
                                          *required = json_object_new_array();
        int r;

        if (!schema || !props || !required)
                return -ENOMEM;
        for (const struct mcp_param *p = params; p->name; p++) {
                struct json_object *s = NULL;

                r = param_schema(p, &s);
                if (r >= 0)
                        r = mcp_json_add(props, p->name, s);
                if (r >= 0 && p->required && json_object_array_add(required, json_object_new_string(p->name)) < 0)
                        r = -ENOMEM;
                if (r < 0)
                        return r;
        }
        r = mcp_json_add(schema, "type", json_object_new_string("object"));
        if (r >= 0)
                r = mcp_json_add(schema, "properties", TAKE_PTR(props));
        if (r >= 0 && json_object_array_length(required) > 0)
                r = mcp_json_add(schema, "required", TAKE_PTR(required));
        if (r >= 0)
                r = mcp_json_add(schema, "additionalProperties", json_object_new_boolean(0));
        if (r < 0)
                return r;
        *ret = TAKE_PTR(schema);
        return 0;
}

static char *enum_values(const char *const *values) {
        char *s = NULL;
        size_t n = 0;
        FILE *f = open_memstream(&s, &n);

        if (!f)
                return NULL;
        for (const char *const *v = values; *v; v++)
                fprintf(f, "%s%s", v == values ? "" : ", ", *v);
        if (fclose(f) != 0) {
                free(s);
                return NULL;
        }
        return s;
}

static char *param_names(const struct mcp_param *params) {
        char *s = NULL;
        size_t n = 0;
        FILE *f = open_memstream(&s, &n);

        if (!f)
                return NULL;
        for (const struct mcp_param *p = params; p->name; p++)
                fprintf(f, "%s%s", p == params ? "" : ", ", p->name);
        if (params[0].name == NULL)
                fputs("no arguments", f);
        if (fclose(f) != 0) {
                free(s);
                return NULL;
        }
        return s;
}

static const char *type_name(struct json_object *v) {
        switch (json_object_get_type(v)) {
        case json_type_null: return "null";
        case json_type_boolean: return "a boolean";
        case json_type_double: return "a number with a fraction";
        case json_type_int: return "an integer";
        case json_type_object: return "an object";
        case json_type_array: return "an array";
        case json_type_string: return "a string";
        }
        return "?";
}

/* Checks v against p and stores it in a; on failure a message in *ret_error. */
static int param_parse(const char *tool, const struct mcp_param *p, struct json_object *v,
                       struct mcp_args *a, char **ret_error) {
        void *field = (uint8_t *) a + p->offset;
        const char *s;
        int64_t i;

        switch (p->type) {
        case MCP_NAME:
        case MCP_PATH:
        case MCP_TEXT:
        case MCP_ENUM:
                if (!json_object_is_type(v, json_type_string))
                        goto wrong_type;
                s = json_object_get_string(v);
                if (p->type == MCP_NAME && !snapshot_tag_is_valid(s)) {
                        *ret_error = mcp_asprintf("%s: argument '%s' must match %s, not \"%.*s\"", tool, p->name,
                                                  MCP_NAME_PATTERN, mcp_quote_len(s, 80), s);
                        return -EINVAL;
                }
                if (p->type == MCP_PATH && (s[0] != '/' || strlen(s) > MCP_PATH_LENGTH_MAX)) {
                        *ret_error = mcp_asprintf("%s: argument '%s' must be an absolute path of at most %d bytes, "
                                                  "not \"%.*s\"", tool, p->name, MCP_PATH_LENGTH_MAX,
                                                  mcp_quote_len(s, 80), s);
                        return -EINVAL;
                }
                if (p->type == MCP_TEXT) {
                        size_t n = utf8_chars(s);
                        if ((int64_t) n < p->min || (int64_t) n > p->max) {
                                *ret_error = mcp_asprintf("%s: argument '%s' must be %" PRId64 " to %" PRId64
                                                          " characters long, not %zu", tool, p->name, p->min,
                                                          p->max, n);
                                return -EINVAL;
                        }
                }
                if (p->type == MCP_ENUM) {
                        bool found = false;
                        for (const char *const *e = p->values; *e; e++)
                                if (strcmp(*e, s) == 0)
                                        found = true;
                        if (!found) {
                                _cleanup_free_ char *list = enum_values(p->values);
                                *ret_error = mcp_asprintf("%s: argument '%s' must be one of %s, not \"%.*s\"", tool,
                                                          p->name, list ?: "its values", mcp_quote_len(s, 80), s);
                                return -EINVAL;
                        }
                }
                *(const char **) field = s;
                return 0;

        case MCP_INTEGER:
                if (!json_object_is_type(v, json_type_int))
                        goto wrong_type;
                i = json_object_get_int64(v);
                /* json-c clamps what is beyond int64 to INT64_MAX: still out of range here */
                if (i < p->min || i > p->max) {
                        *ret_error = mcp_asprintf("%s: argument '%s' must be an integer from %" PRId64 " to %" PRId64
                                                  ", not %s", tool, p->name, p->min, p->max,
                                                  json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN));
                        return -ERANGE;
                }
                *(uint32_t *) field = (uint32_t) i;
                return 0;

        case MCP_BOOLEAN:
                if (!json_object_is_type(v, json_type_boolean))
                        goto wrong_type;
                *(bool *) field = json_object_get_boolean(v);
                return 0;

        case MCP_NUMBER: {
                double d;

                if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
                        goto wrong_type;
                d = json_object_get_double(v);
                if (!(d > (double) p->min)) {
                        *ret_error = mcp_asprintf("%s: argument '%s' must be a number above %" PRId64 ", not %s", tool,
                                                  p->name, p->min,
                                                  json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN));
                        return -ERANGE;
                }
                *(double *) field = d;
                return 0;
        }

        case MCP_RATE:
                if (!json_object_is_type(v, json_type_object))
                        goto wrong_type;
                *(struct json_object **) field = v;
                return 0;

        case MCP_STRING_ARRAY: {
                size_t n;

                if (!json_object_is_type(v, json_type_array))
                        goto wrong_type;
                n = json_object_array_length(v);
                if ((int64_t) n < p->min || (int64_t) n > p->max) {
                        *ret_error = mcp_asprintf("%s: argument '%s' must have %" PRId64 " to %" PRId64
                                                  " items, not %zu", tool, p->name, p->min, p->max, n);
                        return -EINVAL;
                }
                for (size_t k = 0; k < n; k++) {
                        struct json_object *e = json_object_array_get_idx(v, k);
                        if (!json_object_is_type(e, json_type_string)) {
                                *ret_error = mcp_asprintf("%s: argument '%s' must be an array of strings; item %zu is %s",
                                                          tool, p->name, k, type_name(e));
                                return -EINVAL;
                        }
                }
                *(struct json_object **) field = v;
                return 0;
        }
        }

wrong_type: {
        static const char *const expected[] = {
                [MCP_NAME] = "a string", [MCP_PATH] = "a string", [MCP_TEXT] = "a string",
                [MCP_ENUM] = "a string", [MCP_INTEGER] = "an integer", [MCP_BOOLEAN] = "a boolean",
                [MCP_STRING_ARRAY] = "an array of strings", [MCP_NUMBER] = "a number",
                [MCP_RATE] = "an object",
        };
        *ret_error = mcp_asprintf("%s: argument '%s' must be %s, not %s", tool, p->name, expected[p->type],
                                  type_name(v));
        return -EINVAL;
}
}

int mcp_args_parse(const char *tool, const struct mcp_param *params, struct json_object *arguments,
                   struct mcp_args *a, char **ret_error) {
        struct mcp_args parsed = {};

        if (arguments && !json_object_is_type(arguments, json_type_object)) {
                *ret_error = mcp_asprintf("%s: arguments must be an object, not %s", tool, type_name(arguments));
                return -EINVAL;
        }
        if (arguments) {
                json_object_object_foreach(arguments, key, val) {
                        const struct mcp_param *p;
                        (void) val;

                        for (p = params; p->name; p++)
                                if (strcmp(p->name, key) == 0)
                                        break;
                        if (!p->name) {
                                _cleanup_free_ char *names = param_names(params);
                                *ret_error = mcp_asprintf("%s: unknown argument '%.*s'; it takes %s", tool,
                                                          mcp_quote_len(key, 64), key, names ?: "other ones");
                                return -EINVAL;
                        }
                }
        }

        for (const struct mcp_param *p = params; p->name; p++) {
                void *field = (uint8_t *) &parsed + p->offset;
                struct json_object *v;
                int r;

                /* the defaults first, the schema's */
                if (p->type == MCP_INTEGER && p->has_default)
                        *(uint32_t *) field = (uint32_t) p->def;
                else if (p->type == MCP_BOOLEAN && p->has_default)
                        *(bool *) field = p->def != 0;
                else if (p->type == MCP_ENUM && p->def_str)
                        *(const char **) field = p->def_str;

                if (!arguments || !json_object_object_get_ex(arguments, p->name, &v)) {
                        if (p->required) {
                                *ret_error = mcp_asprintf("%s: missing required argument '%s'", tool, p->name);
                                return -EINVAL;
                        }
                        continue;
                }
                r = param_parse(tool, p, v, &parsed, ret_error);
                if (r < 0)
                        return r;
        }
        *a = parsed;
        return 0;
}
