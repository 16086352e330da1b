/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <systemd/sd-bus.h>

#include "fork-options.h"

/* A rate as forkd's limits a{sv} holds it: key ("disk_rate", "net_rate") to a
 * variant of a{st} with bandwidth, ops and burst, into an open a{sv} (fork's
 * options, SetSandboxLimits's). */
int bus_append_rate(sd_bus_message *m, const char *key, const struct rate_limit *l);
