/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>

#include "bus-util.h"
#include "macro.h"

static inline void bus_flush_close_unrefp(sd_bus **b) {
        sd_bus_flush_close_unref(*b);
}

int forkctl_bus_open(const char *addr, sd_bus **ret) {
        _cleanup_(bus_flush_close_unrefp) sd_bus *bus = NULL;
        int r;

        if (addr) {
                r = sd_bus_new(&bus);
                if (r >= 0)
                        r = sd_bus_set_address(bus, addr);
                if (r >= 0)
                        r = sd_bus_set_bus_client(bus, 1);
                if (r >= 0)
                        r = sd_bus_start(bus);
        } else
                r = sd_bus_open_system(&bus);
        if (r < 0)
                return r;

        r = sd_bus_set_method_call_timeout(bus, FORKCTL_CALL_TIMEOUT_USEC);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(bus);
        return 0;
}

const char *forkctl_bus_address(const char *arg) {
        const char *e;

        if (arg)
                return arg;
        e = getenv("FORKD_BUS_ADDRESS");
        return e && *e ? e : NULL;
}
