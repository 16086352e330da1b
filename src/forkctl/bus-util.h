/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Connecting to the bus forkd is on, shared by forkctl's verbs and its MCP
 * server (mcp.c). */

#include <stdint.h>
#include <systemd/sd-bus.h>

#include "time-util.h"

/* Large enough for a Fork of 1000 children or a slow snapshot boot. */
#define FORKCTL_CALL_TIMEOUT_USEC (UINT64_C(5) * 60 * USEC_PER_SEC)

/* addr: a D-Bus address, or NULL for the system bus. Connects as the calling
 * user (so forkd asks polkit about us), with forkctl's method call timeout.
 * Returns a negative errno and leaves *ret untouched on failure. */
int forkctl_bus_open(const char *addr, sd_bus **ret);

/* The address to use: arg (--bus-address) if set, else $FORKD_BUS_ADDRESS if
 * set and not empty, else NULL (the system bus). */
const char *forkctl_bus_address(const char *arg);
