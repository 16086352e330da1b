/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * A tiny D-Bus service for test-polkit.sh: owns a name on the system bus
 * ($DBUS_SYSTEM_BUS_ADDRESS) and guards one method with bus_verify_polkit_async()
 * and the action org.forkd.fork, exactly as forkd's handlers do.
 *
 *   org.forkd.PolkitTest.Fork(s tag) -> s "authorized"
 *   org.forkd.PolkitTest.LastRuns() -> u   how often the handler ran for the
 *       last Fork message: 1 for root (no polkit round trip), 2 for everyone
 *       else (asked polkit, then re-dispatched)
 *   org.forkd.PolkitTest.Pending() -> u   queries left in the registry
 *
 * Exits cleanly on SIGTERM/SIGINT, freeing the registry (ASan checks leaks).
 */

#include <signal.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include "macro.h"
#include "polkit.h"

struct context {
        struct polkit_registry *registry;
        sd_bus_message *last;  /* the message seen last, to count re-dispatches */
        unsigned runs;
};

static int method_fork(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        struct context *c = userdata;
        const char *tag;
        int r;

        /* Count handler runs per message: a re-dispatched message is the same object. */
        if (c->last == m)
                c->runs++;
        else {
                sd_bus_message_unref(c->last);
                c->last = sd_bus_message_ref(m);
                c->runs = 1;
        }

        r = sd_bus_message_read(m, "s", &tag);
        if (r < 0)
                return r;

        r = bus_verify_polkit_async(m, "org.forkd.fork",
                                    (const char *[]) { "snapshot", tag, "verb", "fork", NULL },
                                    &c->registry, error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1; /* polkit is being asked; we run again */

        return sd_bus_reply_method_return(m, "s", "authorized");
}

static int method_runs(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        struct context *c = userdata;
        return sd_bus_reply_method_return(m, "u", c->runs);
}

static int method_pending(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        struct context *c = userdata;
        return sd_bus_reply_method_return(m, "u", polkit_registry_size(c->registry));
}

static const sd_bus_vtable test_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_METHOD_WITH_ARGS("Fork", SD_BUS_ARGS("s", tag), SD_BUS_RESULT("s", result),
                                method_fork, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("LastRuns", SD_BUS_NO_ARGS, SD_BUS_RESULT("u", runs),
                                method_runs, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Pending", SD_BUS_NO_ARGS, SD_BUS_RESULT("u", queries),
                                method_pending, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_VTABLE_END,
};

int main(int argc, char *argv[]) {
        const char *name = argc > 1 ? argv[1] : "org.forkd.PolkitTest";
        struct context c = {};
        sd_event *event = NULL;
        sd_bus *bus = NULL;
        sigset_t ss;
        int r;

        sigemptyset(&ss);
        sigaddset(&ss, SIGTERM);
        sigaddset(&ss, SIGINT);
        sigprocmask(SIG_BLOCK, &ss, NULL);

        r = sd_event_default(&event);
        if (r >= 0)
                r = sd_event_add_signal(event, NULL, SIGTERM, NULL, NULL);
        if (r >= 0)
                r = sd_event_add_signal(event, NULL, SIGINT, NULL, NULL);
        if (r >= 0)
                r = sd_bus_open_system(&bus);
        if (r >= 0)
                r = sd_bus_add_object_vtable(bus, NULL, "/org/forkd/PolkitTest", "org.forkd.PolkitTest",
                                             test_vtable, &c);
        if (r >= 0)
                r = sd_bus_request_name(bus, name, 0);
        if (r >= 0)
                r = sd_bus_attach_event(bus, event, 0);
        if (r < 0) {
                fprintf(stderr, "test-polkit-service: setup failed: %s\n", strerror(-r));
                return 1;
        }

        fprintf(stderr, "test-polkit-service: serving %s\n", name);
        r = sd_event_loop(event);

        sd_bus_message_unref(c.last);
        polkit_registry_free(c.registry);
        sd_bus_flush_close_unref(bus);
        sd_event_unref(event);
        if (r < 0) {
                fprintf(stderr, "test-polkit-service: event loop failed: %s\n", strerror(-r));
                return 1;
        }
        return 0;
}
