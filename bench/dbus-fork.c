/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * bench/dbus-fork: one Fork(tag, n, options) through forkd's D-Bus API from a C
 * client (sd-bus, as forkctl), for bench/fork-stack-bench.py.
 *
 *   dbus-fork ADDRESS TAG N [--s KEY=VALUE]... [--u KEY=NUMBER]...
 *
 * Connects to the bus at ADDRESS first; the clock runs from just before the
 * call until its reply is read whole into JSON (every SandboxInfo, each field
 * of type s, o, u, t, i, x or b), as a client that uses the answer would. Prints
 * one line: {"ms": M, "kids": [SandboxInfo...]}. On a D-Bus error: its name and
 * message on stderr, exit 1; a usage error, exit 2.
 *
 * The Python client of the bench (tests/lib/dbusmini.py) decodes a reply of
 * 1000 SandboxInfos in about 140 ms on these machines: its own cost, not
 * forkd's, and no user's with sd-bus, dbus-python or forkctl.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <json-c/json.h>
#include <systemd/sd-bus.h>

#include "time-util.h"

#define N_MAX 1000u
#define OPTS_MAX 8

struct opt {
        char type; /* 's' or 'u' */
        const char *key, *value;
};

static int usage(void) {
        fprintf(stderr, "usage: dbus-fork ADDRESS TAG N [--s KEY=VALUE]... [--u KEY=NUMBER]...\n");
        return 2;
}

/* The fields of one SandboxInfo (inside its a{sv}) into a JSON object. */
static int read_info(sd_bus_message *m, struct json_object *o) {
        int r;

        while ((r = sd_bus_message_enter_container(m, 'e', "sv")) > 0) {
                const char *key, *contents;
                struct json_object *v = NULL;
                char type;

                r = sd_bus_message_read(m, "s", &key);
                if (r < 0)
                        return r;
                r = sd_bus_message_peek_type(m, &type, &contents);
                if (r < 0)
                        return r;
                if (contents[0] && !contents[1] && strchr("soutixb", contents[0])) {
                        union {
                                const char *s;
                                uint32_t u;
                                uint64_t t;
                                int32_t i;
                                int64_t x;
                                int b;
                        } x;

                        r = sd_bus_message_enter_container(m, 'v', contents);
                        if (r < 0)
                                return r;
                        r = sd_bus_message_read_basic(m, contents[0], &x);
                        if (r < 0)
                                return r;
                        switch (contents[0]) {
                        case 's':
                        case 'o': v = json_object_new_string(x.s); break;
                        case 'u': v = json_object_new_int64(x.u); break;
                        case 't': v = json_object_new_uint64(x.t); break;
                        case 'i': v = json_object_new_int64(x.i); break;
                        case 'x': v = json_object_new_int64(x.x); break;
                        default: v = json_object_new_boolean(x.b); break;
                        }
                        r = sd_bus_message_exit_container(m);
                        if (r < 0)
                                return r;
                        if (!v || json_object_object_add(o, key, v) < 0)
                                return -ENOMEM;
                } else {
                        r = sd_bus_message_skip(m, "v");
                        if (r < 0)
                                return r;
                }
                r = sd_bus_message_exit_container(m);
                if (r < 0)
                        return r;
        }
        return r;
}

int main(int argc, char **argv) {
        sd_bus_error error = SD_BUS_ERROR_NULL;
        sd_bus_message *call = NULL, *reply = NULL;
        struct json_object *doc = NULL, *kids = NULL;
        struct opt opts[OPTS_MAX];
        unsigned n_opts = 0;
        sd_bus *bus = NULL;
        uint64_t t0, t1;
        char *end;
        unsigned long n;
        int r;

        if (argc < 4)
                return usage();
        errno = 0;
        n = strtoul(argv[3], &end, 10);
        if (errno || *end || n < 1 || n > N_MAX)
                return usage();
        for (int i = 4; i < argc; i += 2) {
                const char *eq;

                if (i + 1 >= argc || n_opts >= OPTS_MAX ||
                    (strcmp(argv[i], "--s") != 0 && strcmp(argv[i], "--u") != 0))
                        return usage();
                eq = strchr(argv[i + 1], '=');
                if (!eq || eq == argv[i + 1])
                        return usage();
                argv[i + 1][eq - argv[i + 1]] = 0;
                opts[n_opts++] = (struct opt) { .type = argv[i][2], .key = argv[i + 1], .value = eq + 1 };
        }

        r = sd_bus_new(&bus);
        if (r >= 0)
                r = sd_bus_set_address(bus, argv[1]);
        if (r >= 0)
                r = sd_bus_set_bus_client(bus, 1);
        if (r >= 0)
                r = sd_bus_start(bus);
        if (r < 0) {
                fprintf(stderr, "dbus-fork: cannot connect to %s: %s\n", argv[1], strerror(-r));
                return 1;
        }
        r = sd_bus_message_new_method_call(bus, &call, "org.forkd.Manager", "/org/forkd/Manager",
                                           "org.forkd.Manager", "Fork");
        if (r >= 0)
                r = sd_bus_message_append(call, "su", argv[2], (uint32_t) n);
        if (r >= 0)
                r = sd_bus_message_open_container(call, 'a', "{sv}");
        for (unsigned k = 0; r >= 0 && k < n_opts; k++) {
                if (opts[k].type == 's')
                        r = sd_bus_message_append(call, "{sv}", opts[k].key, "s", opts[k].value);
                else {
                        unsigned long v;

                        errno = 0;
                        v = strtoul(opts[k].value, &end, 10);
                        if (errno || *end || v > UINT32_MAX)
                                return usage();
                        r = sd_bus_message_append(call, "{sv}", opts[k].key, "u", (uint32_t) v);
                }
        }
        if (r >= 0)
                r = sd_bus_message_close_container(call);
        if (r < 0) {
                fprintf(stderr, "dbus-fork: cannot build the call: %s\n", strerror(-r));
                return 1;
        }

        t0 = now_usec();
        r = sd_bus_call(bus, call, 300 * 1000000ull, &error, &reply);
        if (r < 0) {
                fprintf(stderr, "dbus-fork: %s: %s\n", error.name ?: "error", error.message ?: strerror(-r));
                return 1;
        }
        kids = json_object_new_array();
        r = kids ? sd_bus_message_enter_container(reply, 'a', "a{sv}") : -ENOMEM;
        while (r >= 0) {
                struct json_object *o;

                r = sd_bus_message_enter_container(reply, 'a', "{sv}");
                if (r <= 0)
                        break; /* 0: the end of the array */
                o = json_object_new_object();
                if (!o || json_object_array_add(kids, o) < 0) {
                        json_object_put(o);
                        r = -ENOMEM;
                        break;
                }
                r = read_info(reply, o);
                if (r >= 0)
                        r = sd_bus_message_exit_container(reply);
        }
        t1 = now_usec();
        if (r < 0) {
                fprintf(stderr, "dbus-fork: cannot read the reply: %s\n", strerror(-r));
                return 1;
        }

        doc = json_object_new_object();
        if (!doc || json_object_object_add(doc, "ms", json_object_new_double((double) (t1 - t0) / 1000.0)) < 0 ||
            json_object_object_add(doc, "kids", kids) < 0)
                return 1;
        puts(json_object_to_json_string_ext(doc, JSON_C_TO_STRING_PLAIN));
        json_object_put(doc);
        sd_bus_message_unref(reply);
        sd_bus_message_unref(call);
        sd_bus_unref(bus);
        return 0;
}
