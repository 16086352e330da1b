/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <string.h>

#include "bus-json.h"
#include "macro.h"

/* Replies come from forkd and are small; still, refuse absurd nesting. */
#define BUS_JSON_DEPTH_MAX 16

static int read_json(sd_bus_message *m, const char *sig, unsigned depth, struct json_object **ret);

static int read_container(sd_bus_message *m, char type, const char *contents, unsigned depth,
                          struct json_object **ret) {
        _cleanup_json_ struct json_object *j = NULL;
        bool dict = false;
        int r;

        r = sd_bus_message_enter_container(m, type, contents);
        if (r < 0)
                return r;
        if (r == 0)
                return -EBADMSG;

        if (type == 'a' && contents[0] == '{' && contents[1] == 's')
                dict = true;

        j = dict ? json_object_new_object() : json_object_new_array();
        if (!j)
                return -ENOMEM;

        for (;;) {
                _cleanup_json_ struct json_object *v = NULL;
                const char *key = NULL, *elem_contents;
                char elem_type;

                r = sd_bus_message_peek_type(m, &elem_type, &elem_contents);
                if (r < 0)
                        return r;
                if (r == 0)
                        break; /* end of this container */

                if (dict) {
                        /* elem is a dict entry {s?}: key, then the value */
                        char vsig[256];
                        const char *value_sig = contents + 2;
                        size_t l = strlen(value_sig);

                        if (l < 2 || l - 1 >= sizeof vsig)
                                return -EBADMSG;
                        memcpy(vsig, value_sig, l - 1); /* drop the closing '}' */
                        vsig[l - 1] = 0;

                        r = sd_bus_message_enter_container(m, 'e', elem_contents);
                        if (r <= 0)
                                return r < 0 ? r : -EBADMSG;
                        r = sd_bus_message_read(m, "s", &key);
                        if (r <= 0)
                                return r < 0 ? r : -EBADMSG;
                        r = read_json(m, vsig, depth + 1, &v);
                        if (r < 0)
                                return r;
                        r = sd_bus_message_exit_container(m);
                        if (r < 0)
                                return r;
                        if (json_object_object_add(j, key, TAKE_PTR(v)) < 0)
                                return -ENOMEM;
                } else {
                        char sig[256];
                        size_t l;

                        if (elem_type == 'a' || elem_type == 'v' || elem_type == 'r' || elem_type == 'e') {
                                /* peek gave us the container type and its contents; rebuild the signature */
                                l = strlen(elem_contents);
                                if (l + 3 > sizeof sig)
                                        return -EBADMSG;
                                if (elem_type == 'a')
                                        snprintf(sig, sizeof sig, "a%s", elem_contents);
                                else if (elem_type == 'v')
                                        snprintf(sig, sizeof sig, "v");
                                else if (elem_type == 'r')
                                        snprintf(sig, sizeof sig, "(%s)", elem_contents);
                                else
                                        snprintf(sig, sizeof sig, "{%s}", elem_contents);
                        } else {
                                sig[0] = elem_type;
                                sig[1] = 0;
                        }
                        r = read_json(m, sig, depth + 1, &v);
                        if (r < 0)
                                return r;
                        if (json_object_array_add(j, TAKE_PTR(v)) < 0)
                                return -ENOMEM;
                }
        }

        r = sd_bus_message_exit_container(m);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(j);
        return 0;
}

static int read_json(sd_bus_message *m, const char *sig, unsigned depth, struct json_object **ret) {
        struct json_object *j = NULL;
        int r;

        if (depth > BUS_JSON_DEPTH_MAX)
                return -ELOOP;
        if (!sig || !sig[0])
                return -EINVAL;

        switch (sig[0]) {

        case 's':
        case 'o':
        case 'g': {
                const char *s;
                r = sd_bus_message_read_basic(m, sig[0], &s);
                if (r <= 0)
                        return r < 0 ? r : -EBADMSG;
                j = json_object_new_string(s);
                break;
        }

        case 'b': {
                int b;
                r = sd_bus_message_read_basic(m, 'b', &b);
                if (r <= 0)
                        return r < 0 ? r : -EBADMSG;
                j = json_object_new_boolean(b);
                break;
        }

        case 'y': {
                uint8_t v;
                r = sd_bus_message_read_basic(m, 'y', &v);
                if (r <= 0)
                        return r < 0 ? r : -EBADMSG;
                j = json_object_new_int64(v);
                break;
        }

        case 'n': {
                int16_t v;
                r = sd_bus_message_read_basic(m, 'n', &v);
                if (r <= 0)
                        return r < 0 ? r : -EBADMSG;
                j = json_object_new_int64(v);
                break;
        }

        case 'q': {
                uint16_t v;
                r = sd_bus_message_read_basic(m, 'q', &v);
                if (r <= 0)
                        return r < 0 ? r : -EBADMSG;
                j = json_object_new_int64(v);
                break;
        }

        case 'i': {
                int32_t v;
                r = sd_bus_message_read_basic(m, 'i', &v);
                if (r <= 0)
                        return r < 0 ? r : -EBADMSG;
                j = json_object_new_int64(v);
                break;
        }

        case 'u': {
                uint32_t v;
                r = sd_bus_message_read_basic(m, 'u', &v);
                if (r <= 0)
                        return r < 0 ? r : -EBADMSG;
                j = json_object_new_int64(v);
                break;
        }

        case 'x': {
                int64_t v;
                r = sd_bus_message_read_basic(m, 'x', &v);
                if (r <= 0)
                        return r < 0 ? r : -EBADMSG;
                j = json_object_new_int64(v);
                break;
        }

        case 't': {
                uint64_t v;
                r = sd_bus_message_read_basic(m, 't', &v);
                if (r <= 0)
                        return r < 0 ? r : -EBADMSG;
                j = json_object_new_uint64(v);
                break;
        }

        case 'd': {
                double v;
                r = sd_bus_message_read_basic(m, 'd', &v);
                if (r <= 0)
                        return r < 0 ? r : -EBADMSG;
                j = json_object_new_double(v);
                break;
        }

        case 'h': {
                int fd;
                r = sd_bus_message_read_basic(m, 'h', &fd);
                if (r <= 0)
                        return r < 0 ? r : -EBADMSG;
                j = NULL; /* fds have no JSON form */
                *ret = NULL;
                return 0;
        }

        case 'v': {
                const char *contents;
                char t;

                r = sd_bus_message_peek_type(m, &t, &contents);
                if (r <= 0)
                        return r < 0 ? r : -EBADMSG;
                if (t != 'v')
                        return -EBADMSG;
                r = sd_bus_message_enter_container(m, 'v', contents);
                if (r <= 0)
                        return r < 0 ? r : -EBADMSG;
                r = read_json(m, contents, depth + 1, &j);
                if (r < 0)
                        return r;
                r = sd_bus_message_exit_container(m);
                if (r < 0) {
                        json_object_put(j);
                        return r;
                }
                *ret = j;
                return 0;
        }

        case 'a': {
                return read_container(m, 'a', sig + 1, depth, ret);
        }

        case '(': {
                char contents[256];
                size_t l = strlen(sig);

                if (l < 2 || sig[l - 1] != ')' || l - 2 >= sizeof contents)
                        return -EBADMSG;
                memcpy(contents, sig + 1, l - 2);
                contents[l - 2] = 0;
                return read_container(m, 'r', contents, depth, ret);
        }

        default:
                return -EBADMSG;
        }

        if (!j)
                return -ENOMEM;
        *ret = j;
        return 0;
}

int bus_message_read_json(sd_bus_message *m, const char *sig, struct json_object **ret) {
        return read_json(m, sig, 0, ret);
}

int bus_message_read_dict_json(sd_bus_message *m, struct json_object **ret) {
        return read_json(m, "a{sv}", 0, ret);
}

int bus_message_read_dict_array_json(sd_bus_message *m, struct json_object **ret) {
        return read_json(m, "aa{sv}", 0, ret);
}
