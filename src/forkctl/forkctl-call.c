/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * What every verb needs to talk to forkd: the connection, method calls and
 * their errors, and a spinner for the long ones (CreateSnapshot, Fork, ...),
 * which run through sd-event so it can turn while forkd works.
 */

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-event.h>
#include <time.h>
#include <unistd.h>

#include "forkctl.h"
#include "time-util.h"

int usage_error(const char *fmt, ...) {
        va_list ap;

        fputs("forkctl: ", stderr);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputs("\nTry 'forkctl --help'.\n", stderr);
        return -EXIT_USAGE;
}

int connect_bus(const struct forkctl_options *o, sd_bus **ret) {
        const char *addr = forkctl_bus_address(o->bus_address);
        int r;

        r = forkctl_bus_open(addr, ret);
        if (r < 0) {
                fprintf(stderr,
                        "forkctl: cannot connect to %s%s: %s\n"
                        "forkctl: is D-Bus running? Without a system bus, run 'tools/forkd-stack up' and set\n"
                        "forkctl: FORKD_BUS_ADDRESS (or --bus-address) to the address it prints.\n",
                        addr ? "the bus at " : "the system bus at ",
                        addr ?: (getenv("DBUS_SYSTEM_BUS_ADDRESS") ?: "unix:path=/run/dbus/system_bus_socket"),
                        strerror(-r));
                return -EXIT_NO_FORKD;
        }
        return 0;
}

int new_call(sd_bus *bus, const char *method, sd_bus_message **ret) {
        int r = sd_bus_message_new_method_call(bus, ret, BUS_NAME, BUS_PATH, BUS_INTERFACE, method);
        if (r < 0)
                fprintf(stderr, "forkctl: failed to build the %s call: %s\n", method, strerror(-r));
        return r;
}

int report_error(const sd_bus_error *e, int r, const struct error_context *ctx) {
        _cleanup_free_ char *msg = NULL;

        if (!sd_bus_error_is_set(e)) {
                fprintf(stderr, "forkctl: %s failed: %s\n", ctx && ctx->verb ? ctx->verb : "call",
                        strerror(-r));
                return -1;
        }
        msg = forkctl_error_message(e, ctx);
        fprintf(stderr, "forkctl: %s\n", msg ?: "out of memory");
        return -forkctl_error_exit_code(e);
}

/* ---- progress ----------------------------------------------------------- */

struct progress {
        const char *what;
        uint64_t start_usec;
        unsigned tick;
        bool tty;
        sd_bus_message *reply;
};

static int on_tick(sd_event_source *s, uint64_t usec, void *userdata) {
        static const char spinner[] = "|/-\\";
        struct progress *p = userdata;
        double elapsed = (double) (now_usec() - p->start_usec) / USEC_PER_SEC;

        fprintf(stderr, "\r%c %s... %.1fs\033[K", spinner[p->tick++ % 4], p->what, elapsed);
        fflush(stderr);
        return sd_event_source_set_time(s, usec + 100 * USEC_PER_MSEC);
}

static int on_reply(sd_bus_message *m, void *userdata, sd_bus_error *ret_error) {
        struct progress *p = userdata;

        p->reply = sd_bus_message_ref(m);
        return sd_event_exit(sd_bus_get_event(sd_bus_message_get_bus(m)), 0);
}

int call_with_progress(sd_bus *bus, const struct forkctl_options *o, sd_bus_message *m, const char *what,
                       sd_bus_error *error, sd_bus_message **ret_reply) {
        _cleanup_(sd_event_unrefp) sd_event *event = NULL;
        _cleanup_(sd_event_source_unrefp) sd_event_source *timer = NULL;
        _cleanup_(sd_bus_slot_unrefp) sd_bus_slot *slot = NULL;
        struct progress p = { .what = what, .start_usec = now_usec(), .tty = isatty(STDERR_FILENO) };
        const sd_bus_error *e;
        int r;

        if (o->no_progress)
                return sd_bus_call(bus, m, 0, error, ret_reply);

        r = sd_event_new(&event);
        if (r < 0)
                return r;
        r = sd_bus_attach_event(bus, event, 0);
        if (r < 0)
                return r;
        r = sd_bus_call_async(bus, &slot, m, on_reply, &p, 0);
        if (r < 0)
                goto finish;

        if (p.tty) {
                uint64_t t;
                r = sd_event_now(event, CLOCK_MONOTONIC, &t);
                if (r >= 0)
                        r = sd_event_add_time(event, &timer, CLOCK_MONOTONIC, t, 0, on_tick, &p);
                if (r < 0)
                        goto finish;
        } else
                fprintf(stderr, "forkctl: %s...\n", what);

        r = sd_event_loop(event);
        if (p.tty)
                fputs("\r\033[K", stderr);
        if (r < 0)
                goto finish;

        e = sd_bus_message_get_error(p.reply);
        if (e) {
                r = -sd_bus_message_get_errno(p.reply);
                sd_bus_error_copy(error, e);
                if (r >= 0)
                        r = -EIO;
                goto finish;
        }

        *ret_reply = TAKE_PTR(p.reply);
        r = 1;
finish:
        sd_bus_message_unref(p.reply);
        slot = sd_bus_slot_unref(slot);
        (void) sd_bus_detach_event(bus);
        return r;
}
