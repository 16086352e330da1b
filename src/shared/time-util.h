/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Clocks and units, in microseconds as sd-event counts them. */

#include <stdint.h>

#define NSEC_PER_USEC 1000ULL
#define USEC_PER_MSEC 1000ULL
#define USEC_PER_SEC 1000000ULL
#define MSEC_PER_SEC 1000ULL

uint64_t now_usec(void);          /* CLOCK_MONOTONIC */
uint64_t now_realtime_usec(void); /* CLOCK_REALTIME */
