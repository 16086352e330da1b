/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * What one forkd-vmm counts of its devices, in a page it shares with forkd.
 *
 * forkd makes a memfd of VMM_STATS_SIZE bytes for each sandbox, sends it to the
 * VMM with the sandbox's other fds, and maps it read-only; the VMM maps it
 * read-write and updates the counters as its devices work. Reading a
 * sandbox's usage is then a copy of one page, never a request to its VMM.
 *
 * Every field is written by the VMM only, with relaxed atomic adds to whole
 * 64-bit values (each counter is monotonic on its own; a reader may see one
 * counter a little ahead of another, never a torn value). The reader checks
 * magic and version and treats anything else as "no figures" (a hostile or
 * broken VMM can only lie about its own sandbox's figures, never make forkd
 * read out of bounds).
 */

#include <stdint.h>

#define VMM_STATS_MAGIC UINT64_C(0x3173746174646b66) /* "fkdstat1", little-endian */
#define VMM_STATS_VERSION 1
#define VMM_STATS_SIZE 4096

struct vmm_stats {
        uint64_t magic;                 /* VMM_STATS_MAGIC once the VMM has set it up */
        uint64_t version;               /* VMM_STATS_VERSION */
        /* the root disk and every volume together */
        uint64_t disk_read_bytes;
        uint64_t disk_written_bytes;
        uint64_t disk_read_ops;
        uint64_t disk_write_ops;
        uint64_t disk_throttled_usec;   /* time requests waited for disk_rate's tokens */
        /* the NIC (zero without one) */
        uint64_t net_rx_bytes;          /* to the guest */
        uint64_t net_tx_bytes;          /* from the guest */
        uint64_t net_rx_packets;
        uint64_t net_tx_packets;
        uint64_t net_throttled_usec;    /* time frames waited for net_rate's tokens */
        uint64_t reserved[20];          /* zero; room for more without a new version */
};

_Static_assert(sizeof(struct vmm_stats) <= VMM_STATS_SIZE, "vmm_stats must fit its page");

/* Add v to a counter of the shared page (relaxed: a counter, not a lock; any
 * thread of the VMM may add). */
static inline void vmm_stats_add(uint64_t *counter, uint64_t v) {
        __atomic_fetch_add(counter, v, __ATOMIC_RELAXED);
}

/* A counter as the reader sees it. */
static inline uint64_t vmm_stats_get(const uint64_t *counter) {
        return __atomic_load_n(counter, __ATOMIC_RELAXED);
}
