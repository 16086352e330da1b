/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * fleet-place [--nodes N] [--snapshots S] [--decisions D] [--json]: the time of
 * one placement decision (fleet_place(), src/rest/fleet-record.h) over N node
 * records (default 3) of S snapshots each (default 1000: chains of one to four
 * links), as the records come from etcd (JSON text, parsed first: that time is
 * reported apart). Each decision forks 1..32 children of a random head, with
 * the nodes part full. Prints p50 and p99 over D decisions (default 10000);
 * with --json one object on the last line. bench/fleet runs it.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fleet-record.h"
#include "macro.h"

static uint64_t now_ns(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

        return x < y ? -1 : x > y;
}

/* Node i's record: snapshots s0..s(S-1), every fourth a base, the others each the
 * child of the one before; node i lacks every (i+2)-th one. */
static char *make_record(unsigned i, unsigned snapshots, unsigned running) {
        size_t cap = 256 + (size_t) snapshots * 200, len = 0;
        char *s = malloc(cap);

        if (!s)
                return NULL;
        len += (size_t) snprintf(s + len, cap - len,
                                 "{\"format\":1,\"name\":\"node-%u\",\"url\":\"http://127.0.0.1:%u\",\"ready\":true,"
                                 "\"capacity\":{\"cores\":16,\"memory_available_kib\":100000000,"
                                 "\"sandboxes_running\":%u,\"sandboxes_max\":1000},\"snapshots\":[",
                                 i, 9000 + i, running);
        for (unsigned k = 0, first = 1; k < snapshots; k++) {
                if (k % (i + 2) == i + 1)
                        continue;
                if (k % 4 == 0)
                        len += (size_t) snprintf(s + len, cap - len,
                                                 "%s{\"tag\":\"s%u\",\"parent\":null,\"parent_content_hash\":null,"
                                                 "\"vcpus\":2,\"mem_size\":268435456}",
                                                 first ? "" : ",", k);
                else
                        len += (size_t) snprintf(s + len, cap - len,
                                                 "%s{\"tag\":\"s%u\",\"parent\":\"s%u\",\"parent_content_hash\":"
                                                 "\"%064x\",\"vcpus\":2,\"mem_size\":268435456}",
                                                 first ? "" : ",", k, k - 1, k - 1);
                first = 0;
        }
        snprintf(s + len, cap - len, "],\"updated_unix\":1796191600}");
        return s;
}

int main(int argc, char *argv[]) {
        static const struct option opts[] = {
                { "nodes", required_argument, NULL, 'n' },
                { "snapshots", required_argument, NULL, 's' },
                { "decisions", required_argument, NULL, 'd' },
                { "json", no_argument, NULL, 'j' },
                {}
        };
        unsigned nodes = 3, snapshots = 1000, decisions = 10000, placed = 0, refused = 0;
        bool json = false;
        FleetRecord *recs;
        FleetPlacement *out;
        uint64_t *t, parse_ns = 0;
        int c;

        while ((c = getopt_long(argc, argv, "", opts, NULL)) >= 0)
                switch (c) {
                case 'n': nodes = (unsigned) strtoul(optarg, NULL, 10); break;
                case 's': snapshots = (unsigned) strtoul(optarg, NULL, 10); break;
                case 'd': decisions = (unsigned) strtoul(optarg, NULL, 10); break;
                case 'j': json = true; break;
                default: return 2;
                }
        if (nodes < 1 || nodes > 1024 || snapshots < 1 || snapshots > FLEET_SNAPSHOTS_MAX || decisions < 100 ||
            decisions > 10000000) {
                fprintf(stderr, "fleet-place: --nodes 1..1024, --snapshots 1..4096, --decisions 100..10000000\n");
                return 2;
        }
        recs = calloc(nodes, sizeof(FleetRecord));
        out = calloc(nodes, sizeof(FleetPlacement));
        t = calloc(decisions, sizeof(uint64_t));
        if (!recs || !out || !t)
                return 1;
        for (unsigned i = 0; i < nodes; i++) {
                _cleanup_free_ char *text = make_record(i, snapshots, 200 + 300 * (i % 3));
                char key[64];
                const char *why = NULL;
                uint64_t t0;

                snprintf(key, sizeof(key), FLEET_KEY_PREFIX "nodes/node-%u", i);
                t0 = now_ns();
                if (!text || fleet_record_parse(key, text, strlen(text), &recs[i], &why) < 0) {
                        fprintf(stderr, "fleet-place: record %u refused: %s\n", i, why ?: "out of memory");
                        return 1;
                }
                parse_ns += now_ns() - t0;
        }
        srand(1);
        for (unsigned d = 0; d < decisions; d++) {
                char tag[16];
                size_t n = 0;
                uint64_t t0;
                int r;

                snprintf(tag, sizeof(tag), "s%u", (unsigned) rand() % snapshots);
                t0 = now_ns();
                r = fleet_place(recs, nodes, tag, 1 + (uint32_t) (rand() % 32), out, &n);
                t[d] = now_ns() - t0;
                if (r >= 0)
                        placed++;
                else {
                        refused++;
                        if (getenv("FLEET_PLACE_DEBUG"))
                                fprintf(stderr, "%s: %d\n", tag, r);
                }
        }
        qsort(t, decisions, sizeof(uint64_t), cmp_u64);
        printf("fleet-place: %u nodes, %u snapshots each, %u decisions (%u placed, %u without a holder)\n", nodes,
               snapshots, decisions, placed, refused);
        printf("placement decision p50 %.4f ms, p99 %.4f ms, max %.4f ms; parsing the records %.3f ms in all\n",
               t[decisions / 2] / 1e6, t[decisions * 99 / 100] / 1e6, t[decisions - 1] / 1e6, parse_ns / 1e6);
        if (json)
                printf("{\"nodes\":%u,\"snapshots\":%u,\"decisions\":%u,\"placement_p50_ms\":%.4f,"
                       "\"placement_p99_ms\":%.4f,\"records_parse_ms\":%.3f}\n",
                       nodes, snapshots, decisions, t[decisions / 2] / 1e6, t[decisions * 99 / 100] / 1e6,
                       parse_ns / 1e6);
        for (unsigned i = 0; i < nodes; i++)
                fleet_record_done(&recs[i]);
        free(recs);
        free(out);
        free(t);
        return 0;
}
