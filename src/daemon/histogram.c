/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "histogram.h"

const uint64_t histogram_bounds_usec[HISTOGRAM_N_BOUNDS] = {
        1000,    2500,    5000,     10000,    25000,    50000,    100000,    250000,
        500000,  1000000, 2500000,  5000000,  10000000, 20000000, 30000000,  60000000,
};

void histogram_observe(Histogram *h, uint64_t usec) {
        unsigned lo = 0, hi = HISTOGRAM_N_BOUNDS;

        /* the first bound >= usec; HISTOGRAM_N_BOUNDS when above them all */
        while (lo < hi) {
                unsigned mid = (lo + hi) / 2;

                if (histogram_bounds_usec[mid] < usec)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        h->buckets[lo]++;
        h->sum_usec += usec;
        h->count++;
}

void histogram_cumulative(const Histogram *h, uint64_t ret[static HISTOGRAM_N_BOUNDS + 1]) {
        uint64_t c = 0;

        for (unsigned i = 0; i <= HISTOGRAM_N_BOUNDS; i++) {
                c += h->buckets[i];
                ret[i] = c;
        }
}
