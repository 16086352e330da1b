/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <systemd/sd-bus.h>

/* A started connection to the bus at address (a bus client: Hello is sent), or
 * to the system bus when address is NULL; description, unless NULL, names it. */
int bus_open_address(const char *address, const char *description, sd_bus **ret);
