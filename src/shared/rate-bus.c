/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include "rate-bus.h"

int bus_append_rate(sd_bus_message *m, const char *key, const struct rate_limit *l) {
        int r;

        r = sd_bus_message_open_container(m, 'e', "sv");
        if (r >= 0)
                r = sd_bus_message_append(m, "s", key);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'v', "a{st}");
        if (r >= 0)
                r = sd_bus_message_append(m, "a{st}", 3, "bandwidth", l->bandwidth, "ops", l->ops, "burst", l->burst);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        return r;
}
