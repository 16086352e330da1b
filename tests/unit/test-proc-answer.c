/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* forkd's check of a guest's proc_read answer (proc_read_answer_parse(),
 * src/daemon/sandbox-proc-dbus.c): what ReadOutput and the output streams
 * pass on, and the hostile answers they refuse. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <json-c/json.h>

#include "json-util.h"
#include "proc-stream.h"
#include "sandbox-proc-internal.h"

static int parse(const char *json, uint64_t offset, uint32_t max, ProcReadAnswer *a, const char **why) {
        _cleanup_json_ struct json_object *o = json_tokener_parse(json);

        assert_non_null(o);
        return proc_read_answer_parse(o, offset, max, a, why);
}

static void test_chunks_and_end(void **state) {
        ProcReadAnswer a = {};
        const char *why = NULL;

        (void) state;
        /* "hello" on stdout at 10, "oops" on stderr at 15; ended by SIGTERM */
        assert_int_equal(parse("{\"chunks\": [{\"stream\": \"stdout\", \"offset\": 10, \"data_b64\": \"aGVsbG8=\"},"
                               " {\"stream\": \"stderr\", \"offset\": 15, \"data_b64\": \"b29wcw==\"}],"
                               " \"next_offset\": 19, \"gap\": 0, \"exited\": true, \"exit_code\": null,"
                               " \"signal\": 15, \"end\": true}", 10, 100, &a, &why), 0);
        assert_int_equal(a.n_chunks, 2);
        assert_int_equal(a.bytes, 9);
        assert_int_equal(a.chunks[0].kind, PROC_STREAM_STDOUT);
        assert_int_equal(a.chunks[0].offset, 10);
        assert_memory_equal(a.chunks[0].data, "hello", 5);
        assert_int_equal(a.chunks[1].kind, PROC_STREAM_STDERR);
        assert_int_equal(a.chunks[1].offset, 15);
        assert_memory_equal(a.chunks[1].data, "oops", 4);
        assert_int_equal(a.next_offset, 19);
        assert_true(a.exited && a.end);
        assert_int_equal(a.exit_code, -1);
        assert_int_equal(a.signal, 15);
        proc_read_answer_done(&a);
}

static void test_running_and_gap(void **state) {
        ProcReadAnswer a = {};
        const char *why = NULL;

        (void) state;
        /* a reader at 0 behind a ring that starts at 100: nothing new yet */
        assert_int_equal(parse("{\"chunks\": [], \"next_offset\": 100, \"gap\": 100, \"exited\": false,"
                               " \"exit_code\": null, \"signal\": null, \"end\": false}", 0, 65536, &a, &why), 0);
        assert_int_equal(a.n_chunks, 0);
        assert_int_equal(a.gap, 100);
        assert_int_equal(a.next_offset, 100);
        assert_false(a.exited);
        assert_int_equal(a.exit_code, -1);
        assert_int_equal(a.signal, 0);
        proc_read_answer_done(&a);

        /* an exit code of an exited process, the chunk after the gap */
        assert_int_equal(parse("{\"chunks\": [{\"stream\": \"stdout\", \"offset\": 7, \"data_b64\": \"eA==\"}],"
                               " \"next_offset\": 8, \"gap\": 2, \"exited\": true, \"exit_code\": 3,"
                               " \"signal\": null, \"end\": false}", 5, 1, &a, &why), 0);
        assert_int_equal(a.exit_code, 3);
        assert_int_equal(a.signal, 0);
        assert_int_equal(a.chunks[0].offset, 7);
        proc_read_answer_done(&a);
}

static void test_hostile(void **state) {
        static const struct {
                const char *json;
                uint64_t offset;
                uint32_t max;
        } bad[] = {
                /* not contiguous from offset + gap */
                { "{\"chunks\": [{\"stream\": \"stdout\", \"offset\": 1, \"data_b64\": \"eA==\"}], \"next_offset\": 2,"
                  " \"gap\": 0, \"exited\": false, \"end\": false}", 0, 10 },
                /* a hole between two chunks */
                { "{\"chunks\": [{\"stream\": \"stdout\", \"offset\": 0, \"data_b64\": \"eA==\"},"
                  " {\"stream\": \"stdout\", \"offset\": 2, \"data_b64\": \"eA==\"}], \"next_offset\": 3,"
                  " \"gap\": 0, \"exited\": false, \"end\": false}", 0, 10 },
                /* next_offset elsewhere than the chunks' end */
                { "{\"chunks\": [{\"stream\": \"stdout\", \"offset\": 0, \"data_b64\": \"eA==\"}], \"next_offset\": 5,"
                  " \"gap\": 0, \"exited\": false, \"end\": false}", 0, 10 },
                /* more bytes than asked for */
                { "{\"chunks\": [{\"stream\": \"stdout\", \"offset\": 0, \"data_b64\": \"aGVsbG8=\"}],"
                  " \"next_offset\": 5, \"gap\": 0, \"exited\": false, \"end\": false}", 0, 4 },
                /* not base64, an unknown stream, a missing field */
                { "{\"chunks\": [{\"stream\": \"stdout\", \"offset\": 0, \"data_b64\": \"e A=\"}], \"next_offset\": 1,"
                  " \"gap\": 0, \"exited\": false, \"end\": false}", 0, 10 },
                { "{\"chunks\": [{\"stream\": \"stdin\", \"offset\": 0, \"data_b64\": \"eA==\"}], \"next_offset\": 1,"
                  " \"gap\": 0, \"exited\": false, \"end\": false}", 0, 10 },
                { "{\"chunks\": [], \"gap\": 0, \"exited\": false, \"end\": false}", 0, 10 },
                { "{\"chunks\": {}, \"next_offset\": 0, \"gap\": 0, \"exited\": false, \"end\": false}", 0, 10 },
                /* wrong types and ranges */
                { "{\"chunks\": [], \"next_offset\": -1, \"gap\": 0, \"exited\": false, \"end\": false}", 0, 10 },
                { "{\"chunks\": [], \"next_offset\": 0, \"gap\": \"0\", \"exited\": false, \"end\": false}", 0, 10 },
                { "{\"chunks\": [], \"next_offset\": 0, \"gap\": 0, \"exited\": 0, \"end\": false}", 0, 10 },
                { "{\"chunks\": [], \"next_offset\": 0, \"gap\": 0, \"exited\": true, \"signal\": 65,"
                  " \"end\": true}", 0, 10 },
                /* the end of a process that has not exited */
                { "{\"chunks\": [], \"next_offset\": 0, \"gap\": 0, \"exited\": false, \"end\": true}", 0, 10 },
        };
        ProcReadAnswer a = { .next_offset = 77 };

        (void) state;
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                const char *why = NULL;

                assert_int_equal(parse(bad[i].json, bad[i].offset, bad[i].max, &a, &why), -EINVAL);
                assert_non_null(why);
                assert_int_equal(a.next_offset, 77); /* untouched on error */
                assert_null(a.chunks);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_chunks_and_end),
                cmocka_unit_test(test_running_and_gap),
                cmocka_unit_test(test_hostile),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
