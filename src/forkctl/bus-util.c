/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>

#include "bus-open.h"
#include "bus-util.h"
#include "macro.h"

static inline void bus_flush_close_unrefp(sd_bus **b) {
        sd_bus_flush_close_unref(*b);
}

int forkctl_bus_open(const char *addr, sd_bus **ret) {
        _cleanup_(bus_flush_close_unrefp) sd_bus *bus = NULL;
        int r;

        r = bus_open_address(addr, NULL, &bus);
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
