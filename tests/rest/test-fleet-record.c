/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A fleet node's record read back (fleet_record_parse()): a good one, hostile
 * ones refused with their reason, and the placement of forks over records. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fleet-record.h"
#include "macro.h"

#define HASH_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define HASH_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

/* A record of node name with running/max and a snapshot list (JSON array text). */
static char *record(const char *name, const char *url, int running, int max, const char *snapshots) {
        char *s = NULL;

        assert_true(asprintf(&s,
                             "{\"format\":1,\"name\":\"%s\",\"url\":\"%s\",\"ready\":true,"
                             "\"capacity\":{\"cores\":4,\"memory_available_kib\":1000000,"
                             "\"sandboxes_running\":%d,\"sandboxes_max\":%d},"
                             "\"snapshots\":%s,\"updated_unix\":1796191600}",
                             name, url, running, max, snapshots) > 0);
        return s;
}

static int parse(const char *name, const char *text, FleetRecord *r, const char **why) {
        char key[128];

        snprintf(key, sizeof(key), FLEET_KEY_PREFIX "nodes/%s", name);
        return fleet_record_parse(key, text, strlen(text), r, why);
}

static const char *const CHAIN =
        "[{\"tag\":\"base\",\"parent\":null,\"parent_content_hash\":null,\"vcpus\":1,\"mem_size\":67108864},"
        "{\"tag\":\"warm\",\"parent\":\"base\",\"parent_content_hash\":\"" HASH_A "\",\"vcpus\":1,"
        "\"mem_size\":67108864}]";

static void test_good(void **state) {
        _cleanup_free_ char *text = record("node-a", "http://127.0.0.1:8889", 3, 20, CHAIN);
        const char *why = NULL;
        FleetRecord r = {};

        assert_int_equal(parse("node-a", text, &r, &why), 0);
        assert_string_equal(r.name, "node-a");
        assert_string_equal(r.url, "http://127.0.0.1:8889");
        assert_true(r.ready);
        assert_int_equal(r.cores, 4);
        assert_int_equal(r.sandboxes_running, 3);
        assert_int_equal(r.sandboxes_max, 20);
        assert_int_equal(fleet_room(&r), 17);
        assert_int_equal(r.n_snapshots, 2);
        assert_non_null(fleet_record_snapshot(&r, "warm"));
        assert_string_equal(fleet_record_snapshot(&r, "warm")->parent_content_hash, HASH_A);
        assert_string_equal(fleet_record_snapshot(&r, "base")->parent, "");
        assert_null(fleet_record_snapshot(&r, "cold"));
        assert_true(fleet_holds_chain(&r, &r, "warm"));
        fleet_record_done(&r);

        /* a newer node's keys are ignored */
        free(text);
        text = strdup("{\"format\":1,\"name\":\"n\",\"url\":\"https://[::1]:443\",\"ready\":false,\"zone\":\"x\","
                      "\"capacity\":{\"cores\":1,\"memory_available_kib\":0,\"sandboxes_running\":0,"
                      "\"sandboxes_max\":1,\"gpus\":0},\"snapshots\":[]}");
        assert_int_equal(parse("n", text, &r, &why), 0);
        assert_int_equal(fleet_room(&r), 0); /* not ready */
        fleet_record_done(&r);
}

static void test_hostile(void **state) {
        static const struct {
                const char *text, *why;
        } cases[] = {
                { "not json", "strict JSON" },
                { "{\"format\":1}", "malformed or missing" },
                { "{\"format\":2,\"name\":\"n\",\"url\":\"http://h:1\",\"ready\":true,\"capacity\":{},\"snapshots\":[]}",
                  "format" },
                { "{\"format\":1,\"name\":\"other\",\"url\":\"http://h:1\",\"ready\":true,"
                  "\"capacity\":{\"cores\":1,\"memory_available_kib\":0,\"sandboxes_running\":0,\"sandboxes_max\":1},"
                  "\"snapshots\":[]}", "name is not its key's" },
                { "{\"format\":1,\"name\":\"n\",\"url\":\"file:///etc/passwd\",\"ready\":true,"
                  "\"capacity\":{\"cores\":1,\"memory_available_kib\":0,\"sandboxes_running\":0,\"sandboxes_max\":1},"
                  "\"snapshots\":[]}", "url" },
                { "{\"format\":1,\"name\":\"n\",\"url\":\"http://h:1/x\",\"ready\":true,"
                  "\"capacity\":{\"cores\":1,\"memory_available_kib\":0,\"sandboxes_running\":0,\"sandboxes_max\":1},"
                  "\"snapshots\":[]}", "url" },
                { "{\"format\":1,\"name\":\"n\",\"url\":\"http://a:1,http://b:2\",\"ready\":true,"
                  "\"capacity\":{\"cores\":1,\"memory_available_kib\":0,\"sandboxes_running\":0,\"sandboxes_max\":1},"
                  "\"snapshots\":[]}", "url" },
                { "{\"format\":1,\"name\":\"n\",\"url\":\"http://h:1\",\"ready\":true,"
                  "\"capacity\":{\"cores\":1,\"memory_available_kib\":0,\"sandboxes_running\":0,"
                  "\"sandboxes_max\":4000000000},\"snapshots\":[]}", "capacity is out of range" },
                { "{\"format\":1,\"name\":\"n\",\"url\":\"http://h:1\",\"ready\":true,"
                  "\"capacity\":{\"cores\":1,\"memory_available_kib\":0,\"sandboxes_running\":0,"
                  "\"sandboxes_max\":99999999999999999999},\"snapshots\":[]}", "strict JSON" },
                { "{\"format\":1,\"name\":\"n\",\"url\":\"http://h:1\",\"ready\":true,"
                  "\"capacity\":{\"cores\":-1,\"memory_available_kib\":0,\"sandboxes_running\":0,\"sandboxes_max\":1},"
                  "\"snapshots\":[]}", "capacity is malformed" },
                { "{\"format\":1,\"name\":\"n\",\"url\":\"http://h:1\",\"ready\":true,"
                  "\"capacity\":{\"cores\":1,\"memory_available_kib\":0,\"sandboxes_running\":0,\"sandboxes_max\":1},"
                  "\"snapshots\":{}}", "malformed or missing" },
                { "{\"format\":1,\"name\":\"n\",\"url\":\"http://h:1\",\"ready\":true,"
                  "\"capacity\":{\"cores\":1,\"memory_available_kib\":0,\"sandboxes_running\":0,\"sandboxes_max\":1},"
                  "\"snapshots\":[7]}", "snapshot entry is malformed" },
                { "{\"format\":1,\"name\":\"n\",\"url\":\"http://h:1\",\"ready\":true,"
                  "\"capacity\":{\"cores\":1,\"memory_available_kib\":0,\"sandboxes_running\":0,\"sandboxes_max\":1},"
                  "\"snapshots\":[{\"tag\":\"../x\",\"vcpus\":1,\"mem_size\":1}]}", "not a tag" },
                { "{\"format\":1,\"name\":\"n\",\"url\":\"http://h:1\",\"ready\":true,"
                  "\"capacity\":{\"cores\":1,\"memory_available_kib\":0,\"sandboxes_running\":0,\"sandboxes_max\":1},"
                  "\"snapshots\":[{\"tag\":\"a\",\"parent_content_hash\":\"XYZ\",\"vcpus\":1,\"mem_size\":1}]}",
                  "parent_content_hash" },
                { "{\"format\":1,\"name\":\"n\",\"url\":\"http://h:1\",\"ready\":true,"
                  "\"capacity\":{\"cores\":1,\"memory_available_kib\":0,\"sandboxes_running\":0,\"sandboxes_max\":1},"
                  "\"snapshots\":[{\"tag\":\"a\",\"vcpus\":99,\"mem_size\":1}]}", "out of range" },
                { "{\"format\":1,\"name\":\"n\",\"url\":\"http://h:1\",\"ready\":true,"
                  "\"capacity\":{\"cores\":1,\"memory_available_kib\":0,\"sandboxes_running\":0,\"sandboxes_max\":1},"
                  "\"snapshots\":[{\"tag\":\"a\",\"vcpus\":1,\"mem_size\":1},{\"tag\":\"a\",\"vcpus\":1,"
                  "\"mem_size\":1}]}", "twice" },
                { "{\"format\":1,\"name\":\"n\",\"url\":\"http://h:1\",\"ready\":true,"
                  "\"capacity\":{\"cores\":1,\"memory_available_kib\":0,\"sandboxes_running\":0,\"sandboxes_max\":1},"
                  "\"snapshots\":[[[[[]]]]]}", "strict JSON" },
        };
        const char *why;
        FleetRecord r = {};

        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                why = NULL;
                if (parse("n", cases[i].text, &r, &why) >= 0) {
                        fprintf(stderr, "case %zu was taken: %s\n", i, cases[i].text);
                        fail();
                }
                if (!why || !strstr(why, cases[i].why)) {
                        fprintf(stderr, "case %zu: '%s' does not say '%s'\n", i, why ?: "(null)", cases[i].why);
                        fail();
                }
        }
        /* a key that is not a node's, and a record over 1 MiB */
        assert_int_equal(fleet_record_parse("/forkd/other/n", "{}", 2, &r, &why), -EINVAL);
        char *big = malloc(FLEET_RECORD_MAX + 2);
        assert_non_null(big);
        memset(big, ' ', FLEET_RECORD_MAX + 1);
        big[0] = '{';
        big[FLEET_RECORD_MAX] = '}';
        big[FLEET_RECORD_MAX + 1] = 0;
        assert_int_equal(parse("n", big, &r, &why), -EMSGSIZE);
        free(big);
}

static const char *const OTHER =
        "[{\"tag\":\"base\",\"parent\":null,\"vcpus\":1,\"mem_size\":67108864},"
        "{\"tag\":\"warm\",\"parent\":\"base\",\"parent_content_hash\":\"" HASH_B "\",\"vcpus\":1,"
        "\"mem_size\":67108864}]";
static const char *const BASE = "[{\"tag\":\"base\",\"parent\":null,\"vcpus\":1,\"mem_size\":67108864}]";

/* Three nodes: a holds warm's chain, b the list b_snapshots, c nothing. */
static void three(FleetRecord nodes[3], int run_a, int run_b, const char *b_snapshots, int run_c) {
        _cleanup_free_ char *a = record("a", "http://127.0.0.1:1", run_a, 20, CHAIN),
                            *b = record("b", "http://127.0.0.1:2", run_b, 20, b_snapshots),
                            *c = record("c", "http://127.0.0.1:3", run_c, 20, "[]");
        const char *why;

        assert_int_equal(parse("a", a, &nodes[0], &why), 0);
        assert_int_equal(parse("b", b, &nodes[1], &why), 0);
        assert_int_equal(parse("c", c, &nodes[2], &why), 0);
}

static void done3(FleetRecord nodes[3]) {
        for (int i = 0; i < 3; i++)
                fleet_record_done(&nodes[i]);
}

static void test_place(void **state) {
        FleetRecord nodes[3] = {};
        FleetPlacement p[3];
        size_t n = 0;

        /* room on a, which holds the chain: all there, no fetch */
        three(nodes, 0, 0, BASE, 0);
        assert_true(fleet_holds_chain(&nodes[1], &nodes[0], "base"));
        assert_false(fleet_holds_chain(&nodes[1], &nodes[0], "warm"));
        assert_int_equal(fleet_place(nodes, 3, "warm", 5, p, &n), 0);
        assert_int_equal(n, 1);
        assert_int_equal(p[0].node, 0);
        assert_int_equal(p[0].n, 5);
        assert_false(p[0].fetch);
        done3(nodes);

        /* a nearly full: the rest lands on the least loaded other node, which fetches from a;
         * b, which has base (part of warm's chain), takes none: the fetch ships the whole chain */
        three(nodes, 18, 0, BASE, 10);
        assert_int_equal(fleet_place(nodes, 3, "warm", 10, p, &n), 0);
        assert_int_equal(n, 2);
        assert_int_equal(p[0].node, 0);
        assert_int_equal(p[0].n, 2);
        assert_false(p[0].fetch);
        assert_int_equal(p[1].node, 2); /* c, though b runs nothing */
        assert_int_equal(p[1].n, 8);
        assert_true(p[1].fetch);
        assert_int_equal(p[1].source, 0);
        done3(nodes);

        /* the least loaded of the nodes without any of the chain */
        three(nodes, 18, 5, "[]", 1);
        assert_int_equal(fleet_place(nodes, 3, "warm", 10, p, &n), 0);
        assert_int_equal(n, 2);
        assert_int_equal(p[1].node, 2); /* c: 1 of 20 running, less loaded than b's 5 */
        assert_true(p[1].fetch);
        done3(nodes);

        /* over several nodes, and more than the fleet has room for: nothing placed */
        three(nodes, 18, 15, "[]", 15);
        assert_int_equal(fleet_place(nodes, 3, "warm", 13, p, &n), -ENOSPC);
        assert_int_equal(fleet_place(nodes, 3, "warm", 12, p, &n), 0);
        assert_int_equal(n, 3);
        done3(nodes);
        /* base: a and b hold it, most room first */
        three(nodes, 18, 15, BASE, 15);
        assert_int_equal(fleet_place(nodes, 3, "warm", 8, p, &n), -ENOSPC); /* b has part of it: 2 + 5 */
        assert_int_equal(fleet_place(nodes, 3, "base", 6, p, &n), 0);
        assert_int_equal(n, 2);
        assert_int_equal(p[0].node, 1);
        assert_false(p[0].fetch || p[1].fetch);
        done3(nodes);

        /* b's warm is another snapshot under the same tag: b takes none of a's */
        three(nodes, 10, 15, OTHER, 15);
        assert_false(fleet_holds_chain(&nodes[1], &nodes[0], "warm"));
        assert_int_equal(fleet_place(nodes, 3, "warm", 16, p, &n), -ENOSPC);
        assert_int_equal(fleet_place(nodes, 3, "warm", 15, p, &n), 0);
        assert_int_equal(n, 2);
        assert_int_equal(p[0].node, 0);
        assert_int_equal(p[1].node, 2);
        done3(nodes);

        /* b has warm as a has it, but not its parent: part of the chain, so it takes none */
        {
                static const char *const head_only =
                        "[{\"tag\":\"warm\",\"parent\":\"base\",\"parent_content_hash\":\"" HASH_A "\","
                        "\"vcpus\":1,\"mem_size\":67108864}]";

                three(nodes, 20, 0, head_only, 20);
                assert_false(fleet_holds_chain(&nodes[1], &nodes[0], "warm"));
                nodes[0].sandboxes_running = 19; /* room for one on a */
                assert_int_equal(fleet_place(nodes, 3, "warm", 5, p, &n), -ENOSPC);
                assert_int_equal(fleet_place(nodes, 3, "warm", 1, p, &n), 0);
                assert_int_equal(n, 1);
                assert_int_equal(p[0].node, 0);
                done3(nodes);
        }

        /* a tag no node has; not-ready holders are no source */
        three(nodes, 0, 0, OTHER, 0);
        assert_int_equal(fleet_place(nodes, 3, "cold", 1, p, &n), -ENOENT);
        nodes[0].ready = false;
        nodes[1].ready = false;
        assert_int_equal(fleet_place(nodes, 3, "warm", 1, p, &n), -ENOENT);
        done3(nodes);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_good),
                cmocka_unit_test(test_hostile),
                cmocka_unit_test(test_place),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
