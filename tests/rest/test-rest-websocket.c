/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* The WebSocket framing of forkd-rest's terminal (src/rest/rest-websocket.c):
 * the handshake's accept value, server frame headers, and the decoder of
 * client frames against hostile input: unmasked frames, reserved bits,
 * unknown opcodes, long or fragmented control frames, oversized lengths,
 * bad continuations, invalid text, and every frame split at every byte. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rest-websocket.h"

/* A client frame: FIN as given, masked with a fixed key. Returns its size. */
static size_t client_frame(uint8_t *out, uint8_t opcode, bool fin, const void *data, size_t len) {
        static const uint8_t mask[4] = { 0x37, 0xfa, 0x21, 0x3d };
        size_t p = 2;

        out[0] = (uint8_t) ((fin ? 0x80 : 0) | opcode);
        if (len < 126)
                out[1] = 0x80 | (uint8_t) len;
        else if (len <= 0xffff) {
                out[1] = 0x80 | 126;
                out[2] = (uint8_t) (len >> 8);
                out[3] = (uint8_t) len;
                p = 4;
        } else {
                out[1] = 0x80 | 127;
                for (unsigned i = 0; i < 8; i++)
                        out[2 + i] = (uint8_t) ((uint64_t) len >> (56 - 8 * i));
                p = 10;
        }
        memcpy(out + p, mask, 4);
        p += 4;
        for (size_t i = 0; i < len; i++)
                out[p + i] = ((const uint8_t *) data)[i] ^ mask[i & 3];
        return p + len;
}

/* Feed all of buf; the first error, else the count of messages, the last in *last. */
static int feed_all(WsDecoder *d, const uint8_t *buf, size_t n, size_t step, WsMessage *last, uint8_t *copy) {
        int count = 0;

        for (size_t off = 0; off < n;) {
                size_t k = n - off < step ? n - off : step, used = 0;

                while (k > 0) {
                        WsMessage m;
                        int r = ws_decoder_feed(d, buf + off, k, &used, &m);

                        if (r < 0)
                                return r;
                        off += used;
                        k -= used;
                        if (r == 1) {
                                count++;
                                *last = m;
                                if (copy)
                                        memcpy(copy, m.data, m.len);
                        }
                }
        }
        return count;
}

static void test_accept(void **state) {
        char out[WS_ACCEPT_SIZE];

        /* RFC 6455, section 1.3 */
        assert_int_equal(ws_accept_for_key("dGhlIHNhbXBsZSBub25jZQ==", out), 0);
        assert_string_equal(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_true(ws_key_is_valid("AAAAAAAAAAAAAAAAAAAAAA=="));
        assert_false(ws_key_is_valid(NULL));
        assert_false(ws_key_is_valid(""));
        assert_false(ws_key_is_valid("dGhlIHNhbXBsZSBub25jZQ"));     /* no padding */
        assert_false(ws_key_is_valid("dGhlIHNhbXBsZSBub25jZQ==x"));
        assert_false(ws_key_is_valid("dGhlIHNhbXBsZSBub25j!Q=="));
        assert_false(ws_key_is_valid("dGhlIHNhbXBsZSBub25jZR==")); /* non-zero padding bits */
        assert_false(ws_key_is_valid("aGVsbG8gd29ybGQgaGVsbG8h"));  /* 18 bytes */
        assert_int_equal(ws_accept_for_key("short", out), -EINVAL);
}

static void test_server_header(void **state) {
        uint8_t h[10], c[2 + WS_CONTROL_MAX];
        char big[200];

        assert_int_equal(ws_frame_header(h, WS_OP_BINARY, 5), 2);
        assert_int_equal(h[0], 0x82);
        assert_int_equal(h[1], 5);
        assert_int_equal(ws_frame_header(h, WS_OP_TEXT, 126), 4);
        assert_int_equal(h[0], 0x81);
        assert_int_equal(h[1], 126);
        assert_int_equal(h[2] << 8 | h[3], 126);
        assert_int_equal(ws_frame_header(h, WS_OP_BINARY, 70000), 10);
        assert_int_equal(h[1], 127);
        assert_int_equal(h[7] << 16 | h[8] << 8 | h[9], 70000);

        assert_int_equal(ws_close_frame(c, 1000, "exit_code 0"), 4 + 11);
        assert_int_equal(c[0], 0x88);
        assert_int_equal(c[1], 13);
        assert_int_equal(c[2] << 8 | c[3], 1000);
        assert_memory_equal(c + 4, "exit_code 0", 11);
        memset(big, 'x', sizeof big - 1);
        big[sizeof big - 1] = 0;
        assert_int_equal(ws_close_frame(c, 1000, big), 2 + WS_CONTROL_MAX);
        assert_int_equal(c[1], WS_CONTROL_MAX);
}

/* A sequence of every kind, fed whole and split at every step size. */
static void test_round_trip(void **state) {
        static const char text[] = "{\"resize\": [80, 24]}";
        size_t cap = 300000, n = 0;
        uint8_t *buf = malloc(cap), *big = malloc(70000), *copy = malloc(WS_MESSAGE_MAX);
        const size_t steps[] = { 1, 2, 3, 7, 13, 64, 4096, 300000 };

        assert_non_null(buf);
        assert_non_null(big);
        assert_non_null(copy);
        for (size_t i = 0; i < 70000; i++)
                big[i] = (uint8_t) (i * 13);
        n += client_frame(buf + n, WS_OP_TEXT, true, text, strlen(text));
        n += client_frame(buf + n, WS_OP_BINARY, false, "ab", 2);
        n += client_frame(buf + n, WS_OP_PING, true, "p", 1);           /* between fragments */
        n += client_frame(buf + n, WS_OP_CONTINUATION, false, "", 0);
        n += client_frame(buf + n, WS_OP_CONTINUATION, true, "cd", 2);
        n += client_frame(buf + n, WS_OP_BINARY, true, big, 70000);
        n += client_frame(buf + n, WS_OP_BINARY, true, "", 0);
        n += client_frame(buf + n, WS_OP_BINARY, true, big, 300);
        n += client_frame(buf + n, WS_OP_CLOSE, true, "\x03\xe8", 2);
        assert_true(n <= cap);

        for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
                WsDecoder d;
                size_t off = 0;
                int got = 0;

                ws_decoder_init(&d);
                while (off < n) {
                        size_t k = n - off < steps[s] ? n - off : steps[s];

                        while (k > 0) {
                                WsMessage m;
                                size_t used = 0;
                                int r = ws_decoder_feed(&d, buf + off, k, &used, &m);

                                assert_true(r >= 0);
                                off += used;
                                k -= used;
                                if (r == 0)
                                        continue;
                                switch (got++) {
                                case 0:
                                        assert_int_equal(m.opcode, WS_OP_TEXT);
                                        assert_int_equal(m.len, strlen(text));
                                        assert_memory_equal(m.data, text, m.len);
                                        break;
                                case 1:
                                        assert_int_equal(m.opcode, WS_OP_PING);
                                        assert_int_equal(m.len, 1);
                                        assert_memory_equal(m.data, "p", 1);
                                        break;
                                case 2:
                                        assert_int_equal(m.opcode, WS_OP_BINARY);
                                        assert_int_equal(m.len, 4);
                                        assert_memory_equal(m.data, "abcd", 4);
                                        break;
                                case 3:
                                        assert_int_equal(m.opcode, WS_OP_BINARY);
                                        assert_int_equal(m.len, 70000);
                                        assert_memory_equal(m.data, big, 70000);
                                        break;
                                case 4:
                                        assert_int_equal(m.opcode, WS_OP_BINARY);
                                        assert_int_equal(m.len, 0);
                                        break;
                                case 5:
                                        assert_int_equal(m.len, 300);
                                        assert_memory_equal(m.data, big, 300);
                                        break;
                                case 6:
                                        assert_int_equal(m.opcode, WS_OP_CLOSE);
                                        assert_int_equal(m.len, 2);
                                        assert_int_equal(m.data[0] << 8 | m.data[1], 1000);
                                        break;
                                default:
                                        fail();
                                }
                        }
                }
                assert_int_equal(got, 7);
                ws_decoder_done(&d);
        }
        free(buf);
        free(big);
        free(copy);
}

/* One hostile input: fed whole and byte by byte, it ends in error. */
static void expect_error(const uint8_t *buf, size_t n, int error) {
        for (unsigned pass = 0; pass < 2; pass++) {
                WsDecoder d;
                WsMessage m;
                int r;

                ws_decoder_init(&d);
                r = feed_all(&d, buf, n, pass == 0 ? n : 1, &m, NULL);
                assert_int_equal(r, error);
                /* sticky */
                {
                        size_t used = 1;
                        assert_int_equal(ws_decoder_feed(&d, "x", 1, &used, &m), error);
                        assert_int_equal(used, 0);
                }
                ws_decoder_done(&d);
        }
}

static void test_hostile(void **state) {
        uint8_t b[300];
        size_t n;

        /* unmasked client frame */
        expect_error((const uint8_t[]) { 0x82, 0x01, 'x' }, 3, -EPROTO);
        /* reserved bits, each */
        for (unsigned bit = 0x10; bit <= 0x40; bit <<= 1) {
                n = client_frame(b, WS_OP_BINARY, true, "x", 1);
                b[0] |= (uint8_t) bit;
                expect_error(b, n, -EPROTO);
        }
        /* opcodes 3..7 and 0xB..0xF */
        for (uint8_t op = 3; op <= 0xf; op++) {
                if (op == WS_OP_CLOSE || op == WS_OP_PING || op == WS_OP_PONG)
                        continue;
                n = client_frame(b, op, true, "x", 1);
                expect_error(b, n, -EPROTO);
        }
        /* control frames: fragmented, or over 125 bytes */
        n = client_frame(b, WS_OP_PING, false, "x", 1);
        expect_error(b, n, -EPROTO);
        memset(b + 100, 'y', 126);
        n = client_frame(b, WS_OP_PONG, true, b + 100, 126);
        expect_error(b, n, -EPROTO);
        /* a close with a 1-byte payload */
        n = client_frame(b, WS_OP_CLOSE, true, "x", 1);
        expect_error(b, n, -EPROTO);
        /* continuation without a message; a new message inside one */
        n = client_frame(b, WS_OP_CONTINUATION, true, "x", 1);
        expect_error(b, n, -EPROTO);
        n = client_frame(b, WS_OP_TEXT, false, "x", 1);
        n += client_frame(b + n, WS_OP_BINARY, true, "y", 1);
        expect_error(b, n, -EPROTO);
        /* lengths: top bit set, over the cap, not the shortest form */
        expect_error((const uint8_t[]) { 0x82, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4 }, 14, -EPROTO);
        expect_error((const uint8_t[]) { 0x82, 0xff, 0, 0, 0, 0, 0, 0x10, 0, 1, 1, 2, 3, 4 }, 14, -EMSGSIZE);
        expect_error((const uint8_t[]) { 0x82, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4 },
                     14, -EPROTO);
        expect_error((const uint8_t[]) { 0x82, 0xfe, 0, 5, 1, 2, 3, 4 }, 8, -EPROTO);
        expect_error((const uint8_t[]) { 0x82, 0xff, 0, 0, 0, 0, 0, 0, 0x10, 0, 1, 2, 3, 4 }, 14, -EPROTO);
        /* text that is not UTF-8 */
        n = client_frame(b, WS_OP_TEXT, true, "\xc3\x28", 2);
        expect_error(b, n, -EILSEQ);
        /* the error codes */
        assert_int_equal(ws_close_code_for_error(-EPROTO), 1002);
        assert_int_equal(ws_close_code_for_error(-EMSGSIZE), 1009);
        assert_int_equal(ws_close_code_for_error(-EILSEQ), 1007);
        assert_int_equal(ws_close_code_for_error(-ENOMEM), 1011);
}

/* Fragments that add up to exactly WS_MESSAGE_MAX are one message; one more
 * byte in a fragment after them is refused. */
static void test_cap_fragments(void **state) {
        size_t half = WS_MESSAGE_MAX / 2, n = 0;
        uint8_t *buf = malloc(WS_MESSAGE_MAX + 64), *data = calloc(1, half);
        WsDecoder d;
        WsMessage m;

        assert_non_null(buf);
        assert_non_null(data);
        n += client_frame(buf + n, WS_OP_BINARY, false, data, half);
        n += client_frame(buf + n, WS_OP_CONTINUATION, true, data, half);
        ws_decoder_init(&d);
        assert_int_equal(feed_all(&d, buf, n, 65536, &m, NULL), 1);
        assert_int_equal(m.len, WS_MESSAGE_MAX);
        ws_decoder_done(&d);

        n = 0;
        n += client_frame(buf + n, WS_OP_BINARY, false, data, half);
        n += client_frame(buf + n, WS_OP_CONTINUATION, false, data, half);
        n += client_frame(buf + n, WS_OP_CONTINUATION, true, "z", 1);
        ws_decoder_init(&d);
        assert_int_equal(feed_all(&d, buf, n, 65536, &m, NULL), -EMSGSIZE);
        ws_decoder_done(&d);
        free(buf);
        free(data);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_accept),
                cmocka_unit_test(test_server_header),
                cmocka_unit_test(test_round_trip),
                cmocka_unit_test(test_hostile),
                cmocka_unit_test(test_cap_fragments),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
