/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * A fleet node's record as etcd hands it to the rest of the fleet:
 * fleet_record_parse() on any bytes. What it takes must hold its promises (a
 * valid name that is the key's, at most 4096 snapshots sorted by tag and none
 * twice, capacity in range), and a placement over it, a chain walk of each of
 * its tags included, must end.
 */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fleet-record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        FleetRecord r, nodes[2];
        FleetPlacement p[2];
        const char *why = NULL;
        size_t n = 0;

        if (fleet_record_parse(FLEET_KEY_PREFIX "nodes/n", (const char *) data, size, &r, &why) < 0) {
                if (!why)
                        abort(); /* a refusal always says why */
                return 0;
        }
        if (strcmp(r.name, "n") != 0 || r.n_snapshots > FLEET_SNAPSHOTS_MAX || r.sandboxes_max < 1 ||
            r.sandboxes_max > FLEET_SANDBOXES_MAX || r.cores < 1)
                abort();
        for (size_t i = 1; i < r.n_snapshots; i++)
                if (strcmp(r.snapshots[i - 1].tag, r.snapshots[i].tag) >= 0)
                        abort();
        nodes[0] = r;
        nodes[1] = r;
        nodes[1].ready = !r.ready;
        for (size_t i = 0; i < r.n_snapshots && i < 64; i++) {
                if (fleet_record_snapshot(&r, r.snapshots[i].tag) != &r.snapshots[i])
                        abort();
                (void) fleet_holds_chain(&r, &r, r.snapshots[i].tag);
                if (fleet_place(nodes, 2, r.snapshots[i].tag, 1 + (uint32_t) i, p, &n) == 0 && n > 2)
                        abort();
        }
        fleet_record_done(&r);
        return 0;
}
