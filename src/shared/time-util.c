/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <time.h>

#include "time-util.h"

static uint64_t clock_usec(clockid_t clock) {
        struct timespec ts;

        (void) clock_gettime(clock, &ts);
        return (uint64_t) ts.tv_sec * USEC_PER_SEC + (uint64_t) ts.tv_nsec / NSEC_PER_USEC;
}

uint64_t now_usec(void) {
        return clock_usec(CLOCK_MONOTONIC);
}

uint64_t now_realtime_usec(void) {
        return clock_usec(CLOCK_REALTIME);
}
