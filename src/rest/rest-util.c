/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <strings.h>

#include "macro.h"
#include "forkd-bus.h"
#include "rest-util.h"

static void json_putp(struct json_object **p) {
        if (*p)
                json_object_put(*p);
}

static bool tag_char_first(char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

bool rest_tag_is_valid(const char *s) {
        size_t n;

        if (!s || !tag_char_first(s[0]))
                return false;
        for (n = 1; s[n]; n++) {
                if (n >= REST_TAG_MAX)
                        return false;
                if (!tag_char_first(s[n]) && s[n] != '.' && s[n] != '-')
                        return false;
        }
        return true;
}

bool rest_secret_equal(const void *a, size_t a_len, const void *b, size_t b_len) {
        const volatile unsigned char *x = a, *y = b;
        size_t n = MAX(a_len, b_len);
        unsigned char d = 0;

        /* Walk the longer length; out-of-range bytes compare against a
         * constant so the loop does the same work whatever the contents. */
        for (size_t i = 0; i < n; i++) {
                unsigned char cx = i < a_len ? x[i] : 0, cy = i < b_len ? y[i] : 0xff;
                d |= cx ^ cy;
        }
        return (d | (unsigned char) (a_len != b_len)) == 0 && n > 0;
}

int rest_parse_bool_arg(const char *s) {
        if (!s || !*s)
                return 0;
        if (!strcasecmp(s, "true") || !strcmp(s, "1") || !strcasecmp(s, "yes"))
                return 1;
        if (!strcasecmp(s, "false") || !strcmp(s, "0") || !strcasecmp(s, "no"))
                return 0;
        return -EINVAL;
}

static const struct {
        const char *name;
        unsigned status;
} error_table[] = {
        { "org.freedesktop.DBus.Error.InvalidArgs", 400 },
        { "org.freedesktop.DBus.Error.AccessDenied", 403 },
        { "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired", 403 },
        { FORKD_ERROR_NO_SUCH_SNAPSHOT, 404 },
        { FORKD_ERROR_NO_SUCH_SANDBOX, 404 },
        { FORKD_ERROR_NO_SUCH_PROCESS, 404 },
        { FORKD_ERROR_SNAPSHOT_EXISTS, 409 },
        { FORKD_ERROR_HAS_DEPENDENTS, 409 },
        { FORKD_ERROR_CHAIN_BROKEN, 409 },
        { FORKD_ERROR_NOT_READY, 409 },
        { FORKD_ERROR_VOLUME_BUSY, 409 },
        { FORKD_ERROR_NO_NETWORK, 409 },
        { FORKD_ERROR_PAUSED, 409 },
        { FORKD_ERROR_NOT_PAUSED, 409 },
        { FORKD_ERROR_NO_SUCH_FILE, 404 },
        { FORKD_ERROR_NOT_REGULAR_FILE, 409 },
        { FORKD_ERROR_FILE_TOO_LARGE, 413 },
        { FORKD_ERROR_BUSY, 503 },
        { FORKD_ERROR_NOT_SUPPORTED, 501 },
        { FORKD_ERROR_TIMEOUT, 504 },
        { "org.freedesktop.DBus.Error.Timeout", 504 },
        { "org.freedesktop.DBus.Error.TimedOut", 504 },
        { FORKD_ERROR_GUEST_ERROR, 500 },
        { FORKD_ERROR_FAILED, 500 },
        /* the daemon is not there, or went away mid-call */
        { "org.freedesktop.DBus.Error.ServiceUnknown", 503 },
        { "org.freedesktop.DBus.Error.NameHasNoOwner", 503 },
        { "org.freedesktop.DBus.Error.NoReply", 503 },
        { "org.freedesktop.DBus.Error.Disconnected", 503 },
        { "org.freedesktop.DBus.Error.NoServer", 503 },
        { "org.freedesktop.DBus.Error.UnknownObject", 503 },
        { "org.freedesktop.DBus.Error.UnknownInterface", 503 },
        { "org.freedesktop.DBus.Error.UnknownMethod", 501 },
};

unsigned rest_status_from_bus_error(const char *name) {
        if (!name)
                return 500;
        for (size_t i = 0; i < ELEMENTSOF(error_table); i++)
                if (!strcmp(error_table[i].name, name))
                        return error_table[i].status;
        return 500;
}

bool rest_bus_error_is_unavailable(const char *name) {
        static const char *const names[] = {
                "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner",
                "org.freedesktop.DBus.Error.NoReply",        "org.freedesktop.DBus.Error.Disconnected",
                "org.freedesktop.DBus.Error.NoServer",
        };
        if (!name)
                return false;
        for (size_t i = 0; i < ELEMENTSOF(names); i++)
                if (!strcmp(names[i], name))
                        return true;
        return false;
}

static int read_basic_json(sd_bus_message *m, char type, struct json_object **ret) {
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
        struct json_object *o;
        int r;

        r = sd_bus_message_read_basic(m, type, &v);
        if (r < 0)
                return r;
        switch (type) {
        case 'y': o = json_object_new_int64(v.y); break;
        case 'b': o = json_object_new_boolean(v.b); break;
        case 'n': o = json_object_new_int64(v.n); break;
        case 'q': o = json_object_new_int64(v.q); break;
        case 'i': o = json_object_new_int64(v.i); break;
        case 'u': o = json_object_new_int64(v.u); break;
        case 'x': o = json_object_new_int64(v.x); break;
        case 't': o = json_object_new_uint64(v.t); break;
        case 'd': o = json_object_new_double(v.d); break;
        case 's':
        case 'o':
        case 'g': o = json_object_new_string(v.s); break;
        default: return -EOPNOTSUPP;
        }
        if (!o)
                return -ENOMEM;
        *ret = o;
        return 0;
}

static bool is_basic(char c) {
        return c && strchr("ybnqiuxtdsog", c);
}

/* An array of one basic type, as a JSON array. */
static int read_basic_array_json(sd_bus_message *m, const char *contents, struct json_object **ret) {
        _cleanup_(json_putp) struct json_object *o = NULL;
        int r;

        r = sd_bus_message_enter_container(m, 'a', contents + 1);
        if (r < 0)
                return r;
        o = json_object_new_array();
        if (!o)
                return -ENOMEM;
        for (;;) {
                struct json_object *e = NULL;

                r = sd_bus_message_at_end(m, false);
                if (r < 0)
                        return r;
                if (r > 0)
                        break;
                r = read_basic_json(m, contents[1], &e);
                if (r < 0)
                        return r;
                if (json_object_array_add(o, e) < 0) {
                        json_object_put(e);
                        return -ENOMEM;
                }
        }
        r = sd_bus_message_exit_container(m);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(o);
        return 0;
}

/* A dictionary of one basic type (SandboxInfo "disk_rate", "usage", a{st}), as a JSON object. */
static int read_basic_dict_json(sd_bus_message *m, const char *contents, struct json_object **ret) {
        _cleanup_(json_putp) struct json_object *o = NULL;
        const char entry[3] = { 's', contents[3], 0 };
        int r;

        r = sd_bus_message_enter_container(m, 'a', contents + 1);
        if (r < 0)
                return r;
        o = json_object_new_object();
        if (!o)
                return -ENOMEM;
        while ((r = sd_bus_message_enter_container(m, 'e', entry)) > 0) {
                struct json_object *e = NULL;
                const char *key;

                r = sd_bus_message_read_basic(m, 's', &key);
                if (r < 0)
                        return r;
                r = read_basic_json(m, contents[3], &e);
                if (r < 0)
                        return r;
                if (json_object_object_add(o, key, e) < 0) {
                        json_object_put(e);
                        return -ENOMEM;
                }
                r = sd_bus_message_exit_container(m);
                if (r < 0)
                        return r;
        }
        if (r < 0)
                return r;
        r = sd_bus_message_exit_container(m);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(o);
        return 0;
}

bool rest_bus_variant_type_supported(const char *contents) {
        return (is_basic(contents[0]) && contents[1] == 0) ||
               (contents[0] == 'a' && is_basic(contents[1]) && contents[2] == 0) ||
               (contents[0] == 'a' && contents[1] == '{' && contents[2] == 's' && is_basic(contents[3]) &&
                contents[4] == '}' && contents[5] == 0) ||
               streq(contents, "a{sv}") || streq(contents, "aa{sv}");
}

int rest_bus_read_variant_json(sd_bus_message *m, struct json_object **ret) {
        _cleanup_(json_putp) struct json_object *o = NULL;
        const char *contents;
        char type;
        int r;

        r = sd_bus_message_peek_type(m, &type, &contents);
        if (r < 0)
                return r;
        if (r == 0 || type != 'v')
                return -EBADMSG;

        if (!rest_bus_variant_type_supported(contents)) {
                /* Nothing in the interface uses other types; skip them. */
                r = sd_bus_message_skip(m, "v");
                if (r < 0)
                        return r;
                *ret = NULL;
                return 0;
        }

        r = sd_bus_message_enter_container(m, 'v', contents);
        if (r < 0)
                return r;
        if (contents[0] != 'a')
                r = read_basic_json(m, contents[0], &o);
        else if (contents[1] != '{' && contents[1] != 'a')
                r = read_basic_array_json(m, contents, &o);
        else if (streq(contents, "a{sv}"))
                /* A nested dictionary (SnapshotInfo "image"). */
                r = rest_bus_read_dict_json(m, &o);
        else if (streq(contents, "aa{sv}"))
                /* A list of dictionaries (SnapshotInfo and SandboxInfo "volumes"). */
                r = rest_bus_read_dict_array_json(m, &o);
        else
                r = read_basic_dict_json(m, contents, &o);
        if (r < 0)
                return r;
        r = sd_bus_message_exit_container(m);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(o);
        return 0;
}

int rest_bus_read_dict_json(sd_bus_message *m, struct json_object **ret) {
        _cleanup_(json_putp) struct json_object *o = NULL;
        int r;

        r = sd_bus_message_enter_container(m, 'a', "{sv}");
        if (r < 0)
                return r;
        o = json_object_new_object();
        if (!o)
                return -ENOMEM;

        while ((r = sd_bus_message_enter_container(m, 'e', "sv")) > 0) {
                struct json_object *v = NULL;
                const char *key;

                r = sd_bus_message_read_basic(m, 's', &key);
                if (r < 0)
                        return r;
                r = rest_bus_read_variant_json(m, &v);
                if (r < 0)
                        return r;
                /* forkd says "no deadline" with "" (a variant cannot be null); forkd's REST API v1 with null. */
                if (v && strcmp(key, "expires_at") == 0 && json_object_is_type(v, json_type_string) &&
                    json_object_get_string_len(v) == 0) {
                        json_object_put(v);
                        r = json_object_object_add(o, key, NULL);
                        if (r < 0)
                                return -ENOMEM;
                } else if (v && json_object_object_add(o, key, v) < 0) {
                        json_object_put(v);
                        return -ENOMEM;
                }
                r = sd_bus_message_exit_container(m);
                if (r < 0)
                        return r;
        }
        if (r < 0)
                return r;
        r = sd_bus_message_exit_container(m);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(o);
        return 0;
}

int rest_bus_read_dict_array_json(sd_bus_message *m, struct json_object **ret) {
        _cleanup_(json_putp) struct json_object *a = NULL;
        int r;

        r = sd_bus_message_enter_container(m, 'a', "a{sv}");
        if (r < 0)
                return r;
        a = json_object_new_array();
        if (!a)
                return -ENOMEM;
        for (;;) {
                struct json_object *o = NULL;

                r = sd_bus_message_at_end(m, false);
                if (r < 0)
                        return r;
                if (r > 0)
                        break;
                r = rest_bus_read_dict_json(m, &o);
                if (r < 0)
                        return r;
                if (json_object_array_add(a, o) < 0) {
                        json_object_put(o);
                        return -ENOMEM;
                }
        }
        r = sd_bus_message_exit_container(m);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(a);
        return 0;
}

const char *rest_json_string(struct json_object *o, size_t *ret_len) {
        return json_object_to_json_string_length(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE,
                                                  ret_len);
}

int rest_body_append(char **body, size_t *len, size_t *alloc, size_t max, const void *data, size_t n) {
        if (*len + n + 1 > *alloc) {
                size_t a = MIN(MAX(*alloc * 2, *len + n + 1), max + 1);
                char *b = realloc(*body, a);

                if (!b)
                        return -ENOMEM;
                *body = b;
                *alloc = a;
        }
        memcpy(*body + *len, data, n);
        *len += n;
        (*body)[*len] = 0;
        return 0;
}
