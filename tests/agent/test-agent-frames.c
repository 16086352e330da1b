/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * In-process tests of forkd-agent's frame and JSON handling: the Agent is
 * fed bytes directly (agent_feed) and everything it queues is decoded and
 * checked. No channel, no Python (eval and run_code answer errors), so this
 * runs clean under ASan/UBSan with leak detection on. Then a fuzz pass:
 * random bytes, mutated frames and random JSON, and the same checks.
 */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <json-c/json.h>
#include <stdlib.h>

#include "agent-init.h"
#include "agent-proto.h"
#include "agent.h"
#include "json-util.h"
#include "macro.h"

typedef struct Reply {
        uint16_t type;
        uint32_t id;
        struct json_object *obj;
} Reply;

#define REPLIES_MAX 4096

static Agent *new_agent(void) {
        AgentConfig c = { .channel = NULL, .python = false };
        Agent *a = NULL;

        assert_int_equal(agent_new(&c, &a), 0);
        return a;
}

/* Decode all queued output into replies; every frame must be well-formed. */
static size_t drain(Agent *a, Reply *out, size_t max) {
        _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
        const void *p = a->out.buf + a->out.start;
        size_t n = a->out.end - a->out.start, k = 0;

        assert_int_equal(fka_decoder_new(FKA_MAX_PAYLOAD, &d), 0);
        while (n > 0) {
                fka_frame f = {};
                struct json_object *o = NULL;
                const char *err = NULL;
                int r = fka_decoder_feed(d, &p, &n, &f);

                assert_int_equal(r, 1);
                assert_true(f.type == FKA_RESPONSE || f.type == FKA_ERROR);
                assert_int_equal(json_parse_strict(f.payload, f.len, FKA_MAX_PAYLOAD, FKA_JSON_MAX_DEPTH, &o, &err), 0);
                if (f.type == FKA_ERROR) {
                        struct json_object *e;

                        assert_true(json_object_object_get_ex(o, "error", &e));
                        assert_true(json_object_is_type(e, json_type_string));
                }
                if (k < max)
                        out[k++] = (Reply) { .type = f.type, .id = f.id, .obj = o };
                else
                        json_object_put(o);
                fka_frame_done(&f);
        }
        assert_int_equal(fka_decoder_eof(d), 0);
        a->out.start = a->out.end = 0;
        return k;
}

static void replies_free(Reply *r, size_t n) {
        for (size_t i = 0; i < n; i++)
                json_object_put(r[i].obj);
}

static void send_frame(Agent *a, uint16_t type, uint16_t flags, uint32_t id, const char *json, size_t len) {
        uint8_t hdr[FKA_HDR_SIZE];

        fka_encode_header(hdr, type, id, (uint32_t) len);
        hdr[6] = (uint8_t) flags;
        hdr[7] = (uint8_t) (flags >> 8);
        agent_feed(a, hdr, sizeof hdr);
        if (len > 0)
                agent_feed(a, json, len);
}

static void send_req(Agent *a, uint32_t id, const char *json) {
        send_frame(a, FKA_REQUEST, 0, id, json, strlen(json));
}

/* Exactly one reply, of this type and id; returns its object (borrowed until replies_free). */
static void expect_one(Agent *a, uint16_t type, uint32_t id) {
        Reply r[4];
        size_t n = drain(a, r, 4);

        assert_int_equal(n, 1);
        assert_int_equal(r[0].type, type);
        assert_int_equal(r[0].id, id);
        replies_free(r, n);
}

static void test_ping(void **state) {
        Agent *a = new_agent();
        Reply r[2];
        struct json_object *v;

        send_req(a, 7, "{\"op\":\"ping\"}");
        assert_int_equal(drain(a, r, 2), 1);
        assert_int_equal(r[0].type, FKA_RESPONSE);
        assert_int_equal(r[0].id, 7);
        assert_true(json_object_object_get_ex(r[0].obj, "pong", &v) && json_object_get_boolean(v));
        assert_true(json_object_object_get_ex(r[0].obj, "numpy_version", &v) && v == NULL);
        assert_true(json_object_object_get_ex(r[0].obj, "pid", &v) && json_object_get_int64(v) == getpid());
        replies_free(r, 1);
        agent_free(a);
}

static void test_byte_at_a_time(void **state) {
        Agent *a = new_agent();
        uint8_t buf[64];
        const char *j = "{\"op\":\"ping\"}";
        size_t l = strlen(j);

        fka_encode_header(buf, FKA_REQUEST, 3, (uint32_t) l);
        memcpy(buf + FKA_HDR_SIZE, j, l);
        for (size_t i = 0; i < FKA_HDR_SIZE + l; i++) {
                assert_int_equal(a->out.end - a->out.start, 0);
                agent_feed(a, buf + i, 1);
        }
        expect_one(a, FKA_RESPONSE, 3);
        agent_free(a);
}

static void test_hostile_headers(void **state) {
        Agent *a = new_agent();
        Reply r[8];
        size_t n;

        /* garbage, then a ping: one error (id 0), then the answer */
        agent_feed(a, "not a frame at all", 18);
        send_req(a, 5, "{\"op\":\"ping\"}");
        n = drain(a, r, 8);
        assert_int_equal(n, 2);
        assert_int_equal(r[0].type, FKA_ERROR);
        assert_int_equal(r[0].id, 0);
        assert_int_equal(r[1].type, FKA_RESPONSE);
        assert_int_equal(r[1].id, 5);
        replies_free(r, n);

        send_frame(a, FKA_REQUEST, 1, 9, "{}", 2); /* flags */
        expect_one(a, FKA_ERROR, 0);
        send_req(a, 6, "{\"op\":\"ping\"}");
        expect_one(a, FKA_RESPONSE, 6);

        send_frame(a, 77, 0, 9, "{}", 2); /* type */
        expect_one(a, FKA_ERROR, 0);
        send_req(a, 6, "{\"op\":\"ping\"}");
        expect_one(a, FKA_RESPONSE, 6);

        /* oversized: answered with its id, payload skipped */
        {
                uint8_t hdr[FKA_HDR_SIZE];
                _cleanup_free_ char *junk = calloc(1, FKA_MAX_PAYLOAD + 1);

                assert_non_null(junk);
                fka_encode_header(hdr, FKA_REQUEST, 11, FKA_MAX_PAYLOAD + 1);
                agent_feed(a, hdr, sizeof hdr);
                expect_one(a, FKA_ERROR, 11);
                agent_feed(a, junk, FKA_MAX_PAYLOAD + 1);
                assert_int_equal(a->out.end - a->out.start, 0);
                send_req(a, 12, "{\"op\":\"ping\"}");
                expect_one(a, FKA_RESPONSE, 12);
        }

        /* request id 0 */
        send_req(a, 0, "{\"op\":\"ping\"}");
        expect_one(a, FKA_ERROR, 0);

        /* responses, errors and unknown events from the host: dropped */
        send_frame(a, FKA_RESPONSE, 0, 3, "{}", 2);
        send_frame(a, FKA_ERROR, 0, 3, "{}", 2);
        send_frame(a, FKA_EVENT, 0, 0, "{\"op\":\"x\"}", 10);
        send_frame(a, FKA_EVENT, 0, 0, "zz", 2);
        assert_int_equal(a->out.end - a->out.start, 0);
        agent_free(a);
}

static void test_bad_requests(void **state) {
        static const char *const bad[] = {
                "", "{", "[]", "1", "null", "{\"op\":\"ping\"}x", "{\"op\":1}", "{}", "{\"op\":null}",
                "{\"op\":\"nope\"}", "{\"op\":\"ping\",\"x\":1}", "{\"op\":\"identity\",\"a\":[]}",
                "{\"op\":\"exec\"}", "{\"op\":\"exec\",\"args\":\"ls\"}", "{\"op\":\"exec\",\"args\":[]}",
                "{\"op\":\"exec\",\"args\":[1]}", "{\"op\":\"exec\",\"args\":[\"\"]}",
                "{\"op\":\"exec\",\"args\":[\"true\"],\"timeout_secs\":0}",
                "{\"op\":\"exec\",\"args\":[\"true\"],\"timeout_secs\":3601}",
                "{\"op\":\"exec\",\"args\":[\"true\"],\"timeout_secs\":\"1\"}",
                "{\"op\":\"exec\",\"args\":[\"true\"],\"timeout_secs\":1e3}",
                "{\"op\":\"exec\",\"args\":[\"true\"],\"cwd\":5}",
                "{\"op\":\"exec\",\"args\":[\"a\\u0000b\"]}",
                "{\"op\":\"eval\"}", "{\"op\":\"eval\",\"code\":1}", "{\"op\":\"run_code\",\"code\":[]}",
                "{\"op\":\"eval\",\"code\":\"1\"}", /* no Python here */
                "{\"op\":\"ping\",\"op\":\"nope\"}", "{\"op\":\"\\ud800\"}", "{\"op\":\"ping\"\x01}",
                "\xff{}", "{'op':'ping'}", "{\"op\":\"ping\",\"n\":18446744073709551616}",
        };

        Agent *a = new_agent();

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                send_req(a, (uint32_t) i + 1, bad[i]);
                expect_one(a, FKA_ERROR, (uint32_t) i + 1);
        }
        agent_free(a);
}

static void test_exec_argument_limits(void **state) {
        Agent *a = new_agent();
        struct json_object *req = json_object_new_object(), *args = json_object_new_array();
        _cleanup_free_ char *big = malloc(70000);

        assert_non_null(big);
        memset(big, 'x', 69999);
        big[69999] = 0;
        json_object_object_add(req, "op", json_object_new_string("exec"));
        for (int i = 0; i < 257; i++)
                json_object_array_add(args, json_object_new_string("true"));
        json_object_object_add(req, "args", args);
        send_req(a, 1, json_object_to_json_string(req));
        expect_one(a, FKA_ERROR, 1);

        args = json_object_new_array();
        json_object_array_add(args, json_object_new_string("true"));
        json_object_array_add(args, json_object_new_string(big));
        json_object_object_add(req, "args", args);
        send_req(a, 2, json_object_to_json_string(req));
        expect_one(a, FKA_ERROR, 2);
        json_object_put(req);
        agent_free(a);
}

static void test_identity(void **state) {
        Agent *a = new_agent();
        Reply r[2];
        struct json_object *v;
        const char *ev = "{\"op\":\"identity\",\"id\":\"sbx-1\",\"generation\":3,"
                         "\"seed\":\"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\","
                         "\"wall_ns\":1000000000000000000}";

        send_req(a, 1, "{\"op\":\"identity\"}");
        assert_int_equal(drain(a, r, 2), 1);
        assert_true(json_object_object_get_ex(r[0].obj, "id", &v) && v == NULL);
        replies_free(r, 1);

        send_frame(a, FKA_EVENT, 0, 0, ev, strlen(ev));
        assert_int_equal(a->out.end - a->out.start, 0); /* events are not answered */
        send_req(a, 2, "{\"op\":\"identity\"}");
        assert_int_equal(drain(a, r, 2), 1);
        assert_true(json_object_object_get_ex(r[0].obj, "id", &v));
        assert_string_equal(json_object_get_string(v), "sbx-1");
        assert_true(json_object_object_get_ex(r[0].obj, "generation", &v));
        assert_int_equal(json_object_get_int64(v), 3);
        assert_true(json_object_object_get_ex(r[0].obj, "seed", &v));
        assert_string_equal(json_object_get_string(v),
                            "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
        assert_true(json_object_object_get_ex(r[0].obj, "wall_ns", &v));
        assert_true(json_object_get_int64(v) >= 1000000000000000000 &&
                    json_object_get_int64(v) < 1000000000000000000 + 60 * 1000000000LL);
        replies_free(r, 1);

        /* a malformed event changes nothing */
        send_frame(a, FKA_EVENT, 0, 0, "{\"op\":\"identity\",\"id\":\"x\",\"generation\":4,\"seed\":\"00\",\"wall_ns\":1}", 66);
        send_req(a, 3, "{\"op\":\"identity\"}");
        assert_int_equal(drain(a, r, 2), 1);
        assert_true(json_object_object_get_ex(r[0].obj, "generation", &v));
        assert_int_equal(json_object_get_int64(v), 3);
        replies_free(r, 1);
        agent_free(a);
}

static void test_sanitized_strings(void **state) {
        struct json_object *o = json_string_sanitized("a\0b\xff\xc3\xa9\xed\xa0\x80", 9);
        const char *s = json_object_get_string(o);

        assert_string_equal(s, "a\xef\xbf\xbd" "b\xef\xbf\xbd\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
        json_object_put(o);

        assert_int_equal(utf8_prefix("ab\xc3\xa9", 4), 4);
        assert_int_equal(utf8_prefix("ab\xc3\xa9", 3), 2);
        assert_int_equal(utf8_prefix("\xf0\x9f\x98\x80", 3), 0);
        assert_int_equal(utf8_prefix("\xf0\x9f\x98\x80x", 5), 5);
        assert_int_equal(utf8_prefix("", 0), 0);
}

/* ---- fuzz ---- */

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint32_t rnd(void) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        return (uint32_t) (rng_state >> 11);
}

static void test_cmdline_get_bool(void **state) {
        const char *key = "forkd.agent_tcp";

        assert_int_equal(cmdline_get_bool("", key), -ENOENT);
        assert_int_equal(cmdline_get_bool("console=ttyS0 quiet", key), -ENOENT);
        assert_int_equal(cmdline_get_bool("forkd.agent_tcp", key), 1);
        assert_int_equal(cmdline_get_bool("quiet forkd.agent_tcp=1\n", key), 1);
        assert_int_equal(cmdline_get_bool("forkd.agent_tcp=yes", key), 1);
        assert_int_equal(cmdline_get_bool("forkd.agent_tcp=on rw", key), 1);
        assert_int_equal(cmdline_get_bool("forkd.agent_tcp=0", key), 0);
        assert_int_equal(cmdline_get_bool("forkd.agent_tcp=off", key), 0);
        assert_int_equal(cmdline_get_bool("forkd.agent_tcp=2", key), -EINVAL);
        assert_int_equal(cmdline_get_bool("forkd.agent_tcp=", key), -EINVAL);
        assert_int_equal(cmdline_get_bool("forkd.agent_tcp=10", key), -EINVAL);
        /* the last one counts */
        assert_int_equal(cmdline_get_bool("forkd.agent_tcp=1 forkd.agent_tcp=0", key), 0);
        assert_int_equal(cmdline_get_bool("forkd.agent_tcp=0\tforkd.agent_tcp", key), 1);
        /* other keys that start alike, or contain it, are not it */
        assert_int_equal(cmdline_get_bool("forkd.agent_tcpx=1 forkd.agent_tcp_port=1", key), -ENOENT);
        assert_int_equal(cmdline_get_bool("xforkd.agent_tcp=1 forkd.agent_args=forkd.agent_tcp=1", key), -ENOENT);
}

static void test_fuzz(void **state) {
        static const char *const templates[] = {
                "{\"op\":\"ping\"}",
                "{\"op\":\"identity\"}",
                "{\"op\":\"eval\",\"code\":\"1+1\",\"timeout_secs\":5}",
                "{\"op\":\"run_code\",\"code\":\"x=1\"}",
                "{\"op\":\"exec\",\"args\":5,\"timeout_secs\":5}",
                "{\"op\":\"identity\",\"id\":\"a\",\"generation\":1,\"seed\":"
                "\"0000000000000000000000000000000000000000000000000000000000000000\",\"wall_ns\":5}",
                "{\"op\":\"nope\",\"a\":[1,2,{\"b\":null}],\"c\":\"\\u00e9\"}",
        };
        const char *env = getenv("AGENT_FUZZ_ITERATIONS");
        unsigned iterations = env ? (unsigned) atoi(env) : 20000;
        Agent *a = new_agent();
        Reply r[REPLIES_MAX];
        uint8_t buf[512];

        for (unsigned it = 0; it < iterations; it++) {
                unsigned kind = rnd() % 4;
                size_t len = 0;

                if (kind == 0) {
                        len = rnd() % 64 + 1;
                        for (size_t i = 0; i < len; i++)
                                buf[i] = (uint8_t) rnd();
                } else {
                        const char *t = templates[rnd() % ELEMENTSOF(templates)];
                        size_t tl = strlen(t);
                        uint16_t type = (rnd() % 4) ? FKA_REQUEST : FKA_EVENT;

                        fka_encode_header(buf, type, type == FKA_EVENT ? 0 : rnd() % 100, (uint32_t) tl);
                        memcpy(buf + FKA_HDR_SIZE, t, tl);
                        len = FKA_HDR_SIZE + tl;
                        /* mutate the payload (and now and then the header, not the top bytes of len) */
                        for (unsigned m = 0, nm = kind == 1 ? 0 : rnd() % 4 + 1; m < nm; m++) {
                                size_t at = rnd() % len;

                                if (at == 14 || at == 15)
                                        continue;
                                if (at < FKA_HDR_SIZE && rnd() % 4)
                                        continue;
                                buf[at] = rnd() % 3 ? (uint8_t) rnd() : (uint8_t) "{}[]\":,\\0"[rnd() % 9];
                        }
                }
                /* in random chunk sizes */
                for (size_t off = 0; off < len;) {
                        size_t k = MIN(len - off, (size_t) rnd() % 32 + 1);

                        agent_feed(a, buf + off, k);
                        off += k;
                }
                if (a->out.end - a->out.start > 256 * 1024)
                        replies_free(r, drain(a, r, REPLIES_MAX));
        }
        replies_free(r, drain(a, r, REPLIES_MAX));

        /* whatever state it is in: filler ends any payload, then a ping is answered */
        {
                _cleanup_free_ char *zeros = calloc(1, FKA_MAX_PAYLOAD + 64);
                size_t n;
                bool found = false;

                assert_non_null(zeros);
                agent_feed(a, zeros, FKA_MAX_PAYLOAD + 64);
                send_req(a, 4242, "{\"op\":\"ping\"}");
                n = drain(a, r, REPLIES_MAX);
                for (size_t i = 0; i < n; i++)
                        if (r[i].id == 4242 && r[i].type == FKA_RESPONSE)
                                found = true;
                replies_free(r, n);
                assert_true(found);
        }
        agent_free(a);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_ping),
                cmocka_unit_test(test_byte_at_a_time),
                cmocka_unit_test(test_hostile_headers),
                cmocka_unit_test(test_bad_requests),
                cmocka_unit_test(test_exec_argument_limits),
                cmocka_unit_test(test_identity),
                cmocka_unit_test(test_sanitized_strings),
                cmocka_unit_test(test_cmdline_get_bool),
                cmocka_unit_test(test_fuzz),
        };

        log_max_level = LOG_LVL_ERR; /* the fuzz logs every bad event at warning level */
        return cmocka_run_group_tests(tests, NULL, NULL);
}
