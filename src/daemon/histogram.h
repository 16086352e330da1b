/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * A latency histogram with fixed buckets, in microseconds, shaped for
 * Prometheus' histogram type: bucket i counts the observations <= bound i (the
 * last, +Inf, all of them), with their sum and count. Recording is a search
 * of a small table and three adds; nothing is allocated.
 */

#include <stdint.h>

/* The upper bounds, in usec, shared by every histogram of forkd: 1 ms to 60 s. */
#define HISTOGRAM_N_BOUNDS 16u
extern const uint64_t histogram_bounds_usec[HISTOGRAM_N_BOUNDS];

typedef struct Histogram {
        uint64_t buckets[HISTOGRAM_N_BOUNDS + 1]; /* per bucket, not cumulative; the last: above every bound */
        uint64_t sum_usec;
        uint64_t count;
} Histogram;

void histogram_observe(Histogram *h, uint64_t usec);
/* The cumulative counts (Prometheus' "le" buckets), HISTOGRAM_N_BOUNDS + 1 of them, the last the count. */
void histogram_cumulative(const Histogram *h, uint64_t ret[static HISTOGRAM_N_BOUNDS + 1]);
