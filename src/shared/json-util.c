/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "json-util.h"
#include "macro.h"

static void set_error(const char **ret_error, const char *e) {
        if (ret_error)
                *ret_error = e;
}

bool utf8_is_valid_n(const char *s, size_t len) {
        const uint8_t *p = (const uint8_t *) s;
        size_t i = 0;

        while (i < len) {
                uint8_t c;
                uint32_t cp, min;
                size_t n;

                /* ASCII, eight bytes at a time: most of what is checked here (a
                 * process's output in base64, JSON keys) is nothing else */
                while (len - i >= 8) {
                        uint64_t w;

                        memcpy(&w, p + i, sizeof(w));
                        if (w & UINT64_C(0x8080808080808080))
                                break;
                        i += 8;
                }
                if (i >= len)
                        break;
                c = p[i];
                if (c < 0x80) {
                        i++;
                        continue;
                }

                if ((c & 0xe0) == 0xc0) {
                        n = 2, cp = c & 0x1f, min = 0x80;
                } else if ((c & 0xf0) == 0xe0) {
                        n = 3, cp = c & 0x0f, min = 0x800;
                } else if ((c & 0xf8) == 0xf0) {
                        n = 4, cp = c & 0x07, min = 0x10000;
                } else
                        return false; /* stray continuation byte, or 0xf8..0xff */

                if (len - i < n)
                        return false;

                for (size_t k = 1; k < n; k++) {
                        if ((p[i + k] & 0xc0) != 0x80)
                                return false;
                        cp = (cp << 6) | (p[i + k] & 0x3f);
                }

                if (cp < min)                     /* overlong */
                        return false;
                if (cp >= 0xd800 && cp <= 0xdfff) /* UTF-16 surrogate */
                        return false;
                if (cp > 0x10ffff)
                        return false;

                i += n;
        }

        return true;
}

static bool is_json_ws(char c) {
        return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Does the integer literal digits[0..n) (no sign) fit below or at limit? */
static bool digits_fit(const char *digits, size_t n, const char *limit) {
        size_t l = strlen(limit);

        while (n > 1 && digits[0] == '0')
                digits++, n--;

        if (n != l)
                return n < l;
        return memcmp(digits, limit, n) <= 0;
}

/* If p starts with "uXXXX", return the code unit, else -1. */
static int parse_u_escape(const char *p, size_t n) {
        int v = 0;

        if (n < 5 || p[0] != 'u')
                return -1;
        for (size_t i = 1; i < 5; i++) {
                char c = p[i];
                int d = unhexchar(c);

                if (d < 0)
                        return -1;
                v = v * 16 + d;
        }
        return v;
}

/* The bytes that end a run of plain ones inside a JSON string. */
static const bool string_stop[256] = {
        [0x00 ... 0x1f] = true,
        ['"'] = true,
        ['\\'] = true,
};

/* One pass over the raw bytes for what json-c does not check itself (or not
 * strictly enough): encoding, NUL bytes, integer overflow, nesting depth. */
static int json_prescan(const char *buf, size_t len, int max_depth, const char **ret_error) {
        bool in_string = false;
        int depth = 0;

        if (memchr(buf, 0, len)) {
                set_error(ret_error, "NUL byte in JSON input");
                return -EBADMSG;
        }
        if (!utf8_is_valid_n(buf, len)) {
                set_error(ret_error, "JSON input is not valid UTF-8");
                return -EBADMSG;
        }

        for (size_t i = 0; i < len; i++) {
                char c = buf[i];

                if (in_string) {
                        /* a string's plain bytes at once (a base64 field is all of them) */
                        while (i < len && !string_stop[(unsigned char) buf[i]])
                                i++;
                        if (i >= len)
                                break;
                        c = buf[i];
                        if ((unsigned char) c < 0x20) {
                                set_error(ret_error, "control character in JSON string");
                                return -EBADMSG;
                        }
                        if (c == '"')
                                in_string = false;
                        else if (c == '\\' && i + 1 < len) {
                                int u = parse_u_escape(buf + i + 1, len - i - 1);

                                if (u < 0) { /* not a \uXXXX escape; json-c checks the rest */
                                        i++;
                                        continue;
                                }
                                if (u == 0) {
                                        set_error(ret_error, "escaped NUL in JSON string");
                                        return -EBADMSG;
                                }
                                if (u >= 0xdc00 && u <= 0xdfff) {
                                        set_error(ret_error, "unpaired surrogate escape in JSON string");
                                        return -EBADMSG;
                                }
                                i += 5;
                                if (u >= 0xd800 && u <= 0xdbff) {
                                        int lo = -1;

                                        if (i + 2 < len && buf[i + 1] == '\\')
                                                lo = parse_u_escape(buf + i + 2, len - i - 2);
                                        if (lo < 0xdc00 || lo > 0xdfff) {
                                                set_error(ret_error, "unpaired surrogate escape in JSON string");
                                                return -EBADMSG;
                                        }
                                        i += 6;
                                }
                        }
                        continue;
                }

                if (!strchr(" \t\n\r{}[]:,\"-+.0123456789eEtruefalsn", c)) {
                        /* Outside strings JSON has only structure, numbers and
                         * true/false/null; this refuses json-c's extensions
                         * (single quotes, comments, NaN, Infinity). */
                        set_error(ret_error, "unexpected character in JSON input");
                        return -EBADMSG;
                }

                if (c == '"')
                        in_string = true;
                else if (c == '{' || c == '[') {
                        if (++depth > max_depth) {
                                set_error(ret_error, "JSON nesting too deep");
                                return -EBADMSG;
                        }
                } else if (c == '}' || c == ']') {
                        if (depth > 0)
                                depth--;
                } else if (c == '-' || (c >= '0' && c <= '9')) {
                        /* A number token: if it is an integer literal, make
                         * sure it fits, since json-c clamps silently. */
                        size_t j = i, start;
                        bool neg = c == '-', integer = true;

                        if (neg)
                                j++;
                        start = j;
                        for (; j < len && strchr("+-0123456789.eE", buf[j]); j++)
                                if (!(buf[j] >= '0' && buf[j] <= '9'))
                                        integer = false;

                        if (integer && j > start &&
                            !digits_fit(buf + start, j - start, neg ? "9223372036854775808" : "18446744073709551615")) {
                                set_error(ret_error, "JSON integer literal out of range");
                                return -EBADMSG;
                        }
                        i = j - 1;
                }
        }

        return 0;
}

int json_parse_strict(const char *buf, size_t len, size_t max_len, int max_depth,
                      struct json_object **ret, const char **ret_error) {
        _cleanup_json_ struct json_object *obj = NULL;
        struct json_tokener *tok;
        enum json_tokener_error jerr;
        size_t start = 0, end = len, parsed;
        int r;

        if (!buf && len > 0)
                return -EINVAL;
        if (max_depth < 1 || max_depth > INT_MAX - 2)
                return -EINVAL;

        if (len > max_len || len > INT_MAX) {
                set_error(ret_error, "JSON input too large");
                return -EMSGSIZE;
        }

        r = json_prescan(buf, len, max_depth, ret_error);
        if (r < 0)
                return r;

        while (start < len && is_json_ws(buf[start]))
                start++;
        while (end > start && is_json_ws(buf[end - 1]))
                end--;

        if (start == end) {
                set_error(ret_error, "empty JSON input");
                return -EBADMSG;
        }
        if (buf[start] != '{') {
                set_error(ret_error, "JSON top level is not an object");
                return -EBADMSG;
        }

        /* The prescan enforces the depth; json-c's own limit is only a backstop. */
        tok = json_tokener_new_ex(max_depth + 2);
        if (!tok)
                return -ENOMEM;
        json_tokener_set_flags(tok, JSON_TOKENER_STRICT);

        obj = json_tokener_parse_ex(tok, buf + start, (int) (end - start));
        jerr = json_tokener_get_error(tok);
        parsed = json_tokener_get_parse_end(tok);
        json_tokener_free(tok);

        if (jerr == json_tokener_continue) {
                set_error(ret_error, "truncated JSON");
                return -EBADMSG;
        }
        if (jerr != json_tokener_success || !obj) {
                set_error(ret_error, "invalid JSON syntax");
                return -EBADMSG;
        }
        if (parsed != end - start) {
                set_error(ret_error, "trailing bytes after JSON value");
                return -EBADMSG;
        }
        if (!json_object_is_type(obj, json_type_object)) {
                set_error(ret_error, "JSON top level is not an object");
                return -EBADMSG;
        }

        *ret = TAKE_PTR(obj);
        return 0;
}

static int json_string_check(struct json_object *v, const char **ret_s, size_t *ret_len, const char **ret_error) {
        const char *s;
        size_t n;

        if (!json_object_is_type(v, json_type_string)) {
                set_error(ret_error, "expected a string");
                return -EINVAL;
        }

        s = json_object_get_string(v);
        n = (size_t) json_object_get_string_len(v);
        if (!s || strlen(s) != n) { /* "\u0000" */
                set_error(ret_error, "string contains a NUL character");
                return -EINVAL;
        }
        if (!utf8_is_valid_n(s, n)) { /* escapes that json-c decoded into junk */
                set_error(ret_error, "string is not valid UTF-8");
                return -EINVAL;
        }

        *ret_s = s;
        *ret_len = n;
        return 0;
}

int json_string_to_buf(struct json_object *v, char *buf, size_t size, const char **ret_error) {
        const char *s;
        size_t n;
        int r;

        r = json_string_check(v, &s, &n, ret_error);
        if (r < 0)
                return r;
        if (n >= size) {
                set_error(ret_error, "string too long");
                return -ENAMETOOLONG;
        }

        memcpy(buf, s, n);
        buf[n] = 0;
        return 0;
}

/* json-c clamps out-of-range reads instead of failing; undo that. */
static int json_get_int64(struct json_object *v, int64_t *ret) {
        int64_t i = json_object_get_int64(v);

        if (i == INT64_MAX && json_object_get_uint64(v) != (uint64_t) INT64_MAX)
                return -ERANGE;
        *ret = i;
        return 0;
}

static int json_get_uint64(struct json_object *v, uint64_t *ret) {
        if (json_object_get_int64(v) < 0)
                return -ERANGE;
        *ret = json_object_get_uint64(v);
        return 0;
}

static bool json_kind_matches(enum json_kind kind, struct json_object *v) {
        switch (kind) {
        case JSON_KIND_ANY:
                return true;
        case JSON_KIND_STRING:
                return json_object_is_type(v, json_type_string);
        case JSON_KIND_INT:
        case JSON_KIND_INT64:
        case JSON_KIND_UINT64:
        case JSON_KIND_UINT32:
                return json_object_is_type(v, json_type_int);
        case JSON_KIND_BOOL:
                return json_object_is_type(v, json_type_boolean);
        case JSON_KIND_OBJECT:
                return json_object_is_type(v, json_type_object);
        case JSON_KIND_ARRAY:
                return json_object_is_type(v, json_type_array);
        default:
                return false;
        }
}

static const char *const json_kind_expected[_JSON_KIND_MAX] = {
        [JSON_KIND_ANY] = "unexpected value",
        [JSON_KIND_STRING] = "expected a string",
        [JSON_KIND_INT] = "expected an integer",
        [JSON_KIND_INT64] = "expected an integer",
        [JSON_KIND_UINT64] = "expected an unsigned integer",
        [JSON_KIND_UINT32] = "expected an unsigned 32-bit integer",
        [JSON_KIND_BOOL] = "expected a boolean",
        [JSON_KIND_OBJECT] = "expected an object",
        [JSON_KIND_ARRAY] = "expected an array",
};

static int json_field_reset(const struct json_dispatch *d, void *field, const char **ret_error) {
        switch (d->type) {
        case JSON_KIND_STRING:
                if (d->size > 0)
                        *(char *) field = 0;
                else {
                        free(*(char **) field);
                        *(char **) field = NULL;
                }
                return 0;
        case JSON_KIND_INT:
                *(int *) field = 0;
                return 0;
        case JSON_KIND_INT64:
                *(int64_t *) field = 0;
                return 0;
        case JSON_KIND_UINT64:
                *(uint64_t *) field = 0;
                return 0;
        case JSON_KIND_UINT32:
                *(uint32_t *) field = 0;
                return 0;
        case JSON_KIND_BOOL:
                *(bool *) field = false;
                return 0;
        case JSON_KIND_OBJECT:
        case JSON_KIND_ARRAY:
                *(struct json_object **) field = NULL;
                return 0;
        default:
                set_error(ret_error, "field has no parser");
                return -EINVAL;
        }
}

static int json_field_store(const struct json_dispatch *d, struct json_object *v, void *field,
                            const char **ret_error) {
        int64_t i;
        uint64_t u;

        switch (d->type) {
        case JSON_KIND_STRING:
                if (d->size > 0)
                        return json_string_to_buf(v, field, d->size, ret_error);
                else {
                        const char *s;
                        size_t n;
                        char *copy;
                        int r;

                        r = json_string_check(v, &s, &n, ret_error);
                        if (r < 0)
                                return r;
                        copy = strndup(s, n);
                        if (!copy)
                                return -ENOMEM;
                        free(*(char **) field);
                        *(char **) field = copy;
                        return 0;
                }

        case JSON_KIND_INT:
                if (json_get_int64(v, &i) < 0 || i < INT_MIN || i > INT_MAX)
                        break;
                *(int *) field = (int) i;
                return 0;

        case JSON_KIND_INT64:
                if (json_get_int64(v, &i) < 0)
                        break;
                *(int64_t *) field = i;
                return 0;

        case JSON_KIND_UINT64:
                if (json_get_uint64(v, &u) < 0)
                        break;
                *(uint64_t *) field = u;
                return 0;

        case JSON_KIND_UINT32:
                if (json_get_uint64(v, &u) < 0 || u > UINT32_MAX)
                        break;
                *(uint32_t *) field = (uint32_t) u;
                return 0;

        case JSON_KIND_BOOL:
                *(bool *) field = json_object_get_boolean(v);
                return 0;

        case JSON_KIND_OBJECT:
        case JSON_KIND_ARRAY:
                *(struct json_object **) field = v;
                return 0;

        default:
                set_error(ret_error, "field has no parser");
                return -EINVAL;
        }

        set_error(ret_error, "integer out of range");
        return -ERANGE;
}

static const struct json_dispatch *json_dispatch_find(const struct json_dispatch *table, const char *name) {
        for (const struct json_dispatch *d = table; d->name; d++)
                if (strcmp(d->name, name) == 0)
                        return d;
        return NULL;
}

int json_dispatch_full(struct json_object *obj, const struct json_dispatch *table, unsigned flags,
                       void *base, const char **ret_error_field, const char **ret_error) {
        const char *error = NULL;
        int r;

        if (!json_object_is_type(obj, json_type_object)) {
                set_error(ret_error_field, NULL);
                set_error(ret_error, "expected an object");
                return -EINVAL;
        }

        if (flags & JSON_REJECT_UNKNOWN) {
                json_object_object_foreach(obj, key, val) {
                        (void) val;
                        if (!json_dispatch_find(table, key)) {
                                set_error(ret_error_field, key);
                                set_error(ret_error, "unknown field");
                                return -EADDRNOTAVAIL;
                        }
                }
        }

        for (const struct json_dispatch *d = table; d->name; d++) {
                void *field = (uint8_t *) base + d->offset;
                struct json_object *v;

                if (!json_object_object_get_ex(obj, d->name, &v)) {
                        if (d->flags & JSON_MANDATORY) {
                                set_error(ret_error_field, d->name);
                                set_error(ret_error, "mandatory field missing");
                                return -ENXIO;
                        }
                        continue;
                }

                if (!v) { /* JSON null */
                        if (!(d->flags & JSON_NULLABLE)) {
                                error = "null not allowed";
                                r = -EINVAL;
                        } else if (d->parse)
                                r = d->parse(NULL, field, &error);
                        else
                                r = json_field_reset(d, field, &error);
                } else if (d->type >= _JSON_KIND_MAX || !json_kind_matches(d->type, v)) {
                        error = d->type < _JSON_KIND_MAX ? json_kind_expected[d->type] : "unexpected value";
                        r = -EINVAL;
                } else if (d->parse)
                        r = d->parse(v, field, &error);
                else
                        r = json_field_store(d, v, field, &error);

                if (r < 0) {
                        set_error(ret_error_field, d->name);
                        set_error(ret_error, error ?: "invalid value");
                        return r;
                }
        }

        return 0;
}
