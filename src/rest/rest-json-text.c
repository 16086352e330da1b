/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "json-util.h"
#include "macro.h"
#include "rest-json-text.h"
#include "rest-util.h"

void rest_json_text_done(RestJsonText *t) {
        free(t->buf);
        *t = (RestJsonText) {};
}

/* Room for n more bytes and the NUL after them. */
static int reserve(RestJsonText *t, size_t n) {
        size_t need, size;
        char *p;

        if (n > SIZE_MAX - 1 - t->len)
                return -ENOMEM;
        need = t->len + n + 1;
        if (need <= t->size)
                return 0;
        size = MAX(t->size, (size_t) 4096);
        while (size < need) {
                if (size > SIZE_MAX / 2)
                        return -ENOMEM;
                size *= 2;
        }
        p = realloc(t->buf, size);
        if (!p)
                return -ENOMEM;
        t->buf = p;
        t->size = size;
        return 0;
}

static int append(RestJsonText *t, const char *s, size_t n) {
        int r = reserve(t, n);

        if (r < 0)
                return r;
        memcpy(t->buf + t->len, s, n);
        t->len += n;
        t->buf[t->len] = 0;
        return 0;
}

static int append_char(RestJsonText *t, char c) {
        return append(t, &c, 1);
}

int rest_json_text_append_string(RestJsonText *t, const char *s) {
        return rest_json_text_append_string_n(t, s, strlen(s));
}

int rest_json_text_append_string_n(RestJsonText *t, const char *s, size_t len) {
        static const char hex[] = "0123456789abcdef";
        const char *run = s, *end = s + len;
        int r;

        r = reserve(t, len + 2); /* at least this much: one realloc for most strings */
        if (r >= 0)
                r = append_char(t, '"');
        for (const char *p = s; r >= 0 && p < end; p++) {
                unsigned char c = (unsigned char) *p;
                char esc[6] = { '\\', 0 };
                size_t n = 2;

                if (c >= 0x20 && c != '"' && c != '\\')
                        continue;
                switch (c) {
                case '"': esc[1] = '"'; break;
                case '\\': esc[1] = '\\'; break;
                case '\b': esc[1] = 'b'; break;
                case '\f': esc[1] = 'f'; break;
                case '\n': esc[1] = 'n'; break;
                case '\r': esc[1] = 'r'; break;
                case '\t': esc[1] = 't'; break;
                default:
                        memcpy(esc + 1, "u00", 3);
                        esc[4] = hex[c >> 4];
                        esc[5] = hex[c & 0xf];
                        n = 6;
                }
                r = append(t, run, (size_t) (p - run));
                if (r >= 0)
                        r = append(t, esc, n);
                run = p + 1;
        }
        if (r >= 0)
                r = append(t, run, (size_t) (end - run));
        return r < 0 ? r : append_char(t, '"');
}

static int append_u64(RestJsonText *t, uint64_t v) {
        char buf[24], *p = buf + sizeof(buf);

        /* by hand: snprintf() was a tenth of a list's time */
        do {
                *--p = (char) ('0' + v % 10);
                v /= 10;
        } while (v > 0);
        return append(t, p, (size_t) (buf + sizeof(buf) - p));
}


static int append_i64(RestJsonText *t, int64_t v) {
        int r;

        if (v >= 0)
                return append_u64(t, (uint64_t) v);
        r = append_char(t, '-');
        /* the magnitude in unsigned arithmetic: -INT64_MIN overflows int64_t */
        return r < 0 ? r : append_u64(t, UINT64_C(0) - (uint64_t) v);
}

/* A double as json-c prints it (its own format and its special values). */
static int append_double(RestJsonText *t, double d) {
        struct json_object *o = json_object_new_double(d);
        const char *s;
        size_t n;
        int r;

        if (!o)
                return -ENOMEM;
        s = rest_json_string(o, &n);
        r = s ? append(t, s, n) : -ENOMEM;
        json_object_put(o);
        return r;
}

static int write_basic(sd_bus_message *m, char type, RestJsonText *t) {
        union {
                uint8_t y;
                int b;
                int16_t n;
                uint16_t q;
                int32_t i;
                uint32_t u;
                int64_t x;
                uint64_t t;
                double d;
                const char *s;
        } v;
        int r;

        r = sd_bus_message_read_basic(m, type, &v);
        if (r < 0)
                return r;
        switch (type) {
        case 'y': return append_u64(t, v.y);
        case 'b': return v.b ? append(t, "true", 4) : append(t, "false", 5);
        case 'n': return append_i64(t, v.n);
        case 'q': return append_u64(t, v.q);
        case 'i': return append_i64(t, v.i);
        case 'u': return append_u64(t, v.u);
        case 'x': return append_i64(t, v.x);
        case 't': return append_u64(t, v.t);
        case 'd': return append_double(t, v.d);
        case 's':
        case 'o':
        case 'g': return rest_json_text_append_string(t, v.s);
        default: return -EOPNOTSUPP;
        }
}

/* An array (the message at it, of signature element) as a JSON array, each element
 * written by one(m, arg, t). */
static int write_array(sd_bus_message *m, const char *element, int (*one)(sd_bus_message *m, char arg, RestJsonText *t),
                       char arg, RestJsonText *t) {
        int r;

        r = sd_bus_message_enter_container(m, 'a', element);
        if (r >= 0)
                r = append_char(t, '[');
        for (bool first = true; r >= 0; first = false) {
                r = sd_bus_message_at_end(m, false);
                if (r != 0)
                        break;
                r = first ? 0 : append_char(t, ',');
                if (r >= 0)
                        r = one(m, arg, t);
        }
        if (r >= 0)
                r = append_char(t, ']');
        if (r >= 0)
                r = sd_bus_message_exit_container(m);
        return MIN(r, 0);
}

/* a{st}, a{ss}, ...: a JSON object. */
static int write_basic_dict(sd_bus_message *m, const char *contents, RestJsonText *t) {
        const char entry[3] = { 's', contents[3], 0 };
        int r;

        r = sd_bus_message_enter_container(m, 'a', contents + 1);
        if (r >= 0)
                r = append_char(t, '{');
        for (bool first = true; r >= 0; first = false) {
                const char *key;

                r = sd_bus_message_enter_container(m, 'e', entry);
                if (r <= 0)
                        break;
                r = sd_bus_message_read_basic(m, 's', &key);
                if (r >= 0 && !first)
                        r = append_char(t, ',');
                if (r >= 0)
                        r = rest_json_text_append_string(t, key);
                if (r >= 0)
                        r = append_char(t, ':');
                if (r >= 0)
                        r = write_basic(m, contents[3], t);
                if (r >= 0)
                        r = sd_bus_message_exit_container(m);
        }
        if (r >= 0)
                r = append_char(t, '}');
        return r < 0 ? r : sd_bus_message_exit_container(m);
}

/* The value in a variant whose contents are supported; the message is inside it. */
static int write_contents(sd_bus_message *m, const char *contents, RestJsonText *t) {
        if (contents[0] != 'a')
                return write_basic(m, contents[0], t);
        if (contents[1] != '{' && contents[1] != 'a')
                return write_array(m, contents + 1, write_basic, contents[1], t);
        if (streq(contents, "a{sv}"))
                return rest_bus_write_dict_json(m, t);
        if (streq(contents, "aa{sv}"))
                return rest_bus_write_dict_array_json(m, t);
        return write_basic_dict(m, contents, t);
}

/* One {sv} entry, the message inside it past its key: "key":value, or nothing
 * for a variant of a type the interface does not use (as the json-c path). */
static int write_entry(sd_bus_message *m, const char *key, bool *first, RestJsonText *t) {
        const char *contents;
        char type;
        int r;

        r = sd_bus_message_peek_type(m, &type, &contents);
        if (r < 0)
                return r;
        if (r == 0 || type != 'v')
                return -EBADMSG;
        if (!rest_bus_variant_type_supported(contents))
                return sd_bus_message_skip(m, "v");

        r = sd_bus_message_enter_container(m, 'v', contents);
        if (r >= 0 && !*first)
                r = append_char(t, ',');
        if (r >= 0)
                r = rest_json_text_append_string(t, key);
        if (r >= 0)
                r = append_char(t, ':');
        if (r < 0)
                return r;
        *first = false;
        if (streq(key, "expires_at") && streq(contents, "s")) {
                const char *s;

                /* forkd says "no deadline" with "" (a variant cannot be null); forkd's REST API v1 with null. */
                r = sd_bus_message_read_basic(m, 's', &s);
                if (r >= 0)
                        r = s[0] ? rest_json_text_append_string(t, s) : append(t, "null", 4);
        } else
                r = write_contents(m, contents, t);
        return r < 0 ? r : sd_bus_message_exit_container(m);
}

int rest_bus_write_dict_json(sd_bus_message *m, RestJsonText *t) {
        bool first = true;
        int r;

        r = sd_bus_message_enter_container(m, 'a', "{sv}");
        if (r >= 0)
                r = append_char(t, '{');
        while (r >= 0) {
                const char *key;

                r = sd_bus_message_enter_container(m, 'e', "sv");
                if (r <= 0)
                        break;
                r = sd_bus_message_read_basic(m, 's', &key);
                if (r >= 0)
                        r = write_entry(m, key, &first, t);
                if (r >= 0)
                        r = sd_bus_message_exit_container(m);
        }
        if (r >= 0)
                r = append_char(t, '}');
        if (r >= 0)
                r = sd_bus_message_exit_container(m);
        return MIN(r, 0);
}

static int write_dict(sd_bus_message *m, char arg, RestJsonText *t) {
        return rest_bus_write_dict_json(m, t);
}

int rest_bus_write_dict_array_json(sd_bus_message *m, RestJsonText *t) {
        return write_array(m, "a{sv}", write_dict, 0, t);
}

#define append_lit(t, s) append((t), (s), sizeof(s) - 1)

int rest_json_text_output_chunk(RestJsonText *t, const char *stream, uint64_t offset, const void *data, size_t len) {
        int r;

        r = append_lit(t, "{\"stream\":");
        if (r >= 0)
                r = rest_json_text_append_string(t, stream);
        if (r >= 0)
                r = append_lit(t, ",\"offset\":");
        if (r >= 0)
                r = append_u64(t, offset);
        if (r >= 0 && utf8_is_valid_n(data, len)) {
                r = append_lit(t, ",\"data\":");
                if (r >= 0)
                        r = rest_json_text_append_string_n(t, data, len);
        } else if (r >= 0) {
                r = append_lit(t, ",\"data_b64\":\"");
                /* encoded in place, past what is written */
                if (r >= 0)
                        r = reserve(t, BASE64_ENCODED_SIZE(len) + 2);
                if (r >= 0) {
                        t->len += base64_encode(data, len, t->buf + t->len);
                        t->buf[t->len] = 0;
                        r = append_lit(t, "\"");
                }
        }
        return r < 0 ? r : append_lit(t, "}");
}
