/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "bus-open.h"
#include "macro.h"

int bus_open_address(const char *address, const char *description, sd_bus **ret) {
        _cleanup_(sd_bus_unrefp) sd_bus *bus = NULL;
        int r;

        if (!address)
                return description ? sd_bus_open_system_with_description(ret, description) : sd_bus_open_system(ret);
        r = sd_bus_new(&bus);
        if (r >= 0)
                r = sd_bus_set_address(bus, address);
        if (r >= 0)
                r = sd_bus_set_bus_client(bus, true);
        if (r >= 0 && description)
                (void) sd_bus_set_description(bus, description);
        if (r >= 0)
                r = sd_bus_start(bus);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(bus);
        return 0;
}
