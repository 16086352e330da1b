/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* Tests for the output stream frames of processes in sandboxes (src/shared/proc-stream.c):
 * every kind round trip, hostile headers, frames split at every byte, and signal names. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "macro.h"
#include "proc-stream.h"

/* A stream of every kind: stdout "hello", stderr "oops!!", a gap of 7, an
 * empty stdout, a stdout at the maximum size, the exit. */
static size_t build_stream(uint8_t **ret) {
        size_t cap = 6 * PROC_STREAM_HDR_SIZE + 16 + 5 + 6 + PROC_STREAM_DATA_MAX, n = 0;
        uint8_t *b = malloc(cap);

        assert_non_null(b);
        proc_stream_header_encode(b + n, PROC_STREAM_STDOUT, 5, 0);
        memcpy(b + n + PROC_STREAM_HDR_SIZE, "hello", 5);
        n += PROC_STREAM_HDR_SIZE + 5;
        proc_stream_header_encode(b + n, PROC_STREAM_STDERR, 6, 5);
        memcpy(b + n + PROC_STREAM_HDR_SIZE, "oops!!", 6);
        n += PROC_STREAM_HDR_SIZE + 6;
        n += proc_stream_encode_gap(b + n, 18, 7);
        proc_stream_header_encode(b + n, PROC_STREAM_STDOUT, 0, 18);
        n += PROC_STREAM_HDR_SIZE;
        proc_stream_header_encode(b + n, PROC_STREAM_STDOUT, PROC_STREAM_DATA_MAX, 18);
        for (size_t i = 0; i < PROC_STREAM_DATA_MAX; i++)
                b[n + PROC_STREAM_HDR_SIZE + i] = (uint8_t) (i * 7);
        n += PROC_STREAM_HDR_SIZE + PROC_STREAM_DATA_MAX;
        n += proc_stream_encode_exit(b + n, 18 + PROC_STREAM_DATA_MAX, -1, 9);
        assert_true(n <= cap);
        *ret = b;
        return n;
}

static void check_frame(unsigned i, const ProcStreamFrame *f) {
        switch (i) {
        case 0:
                assert_int_equal(f->kind, PROC_STREAM_STDOUT);
                assert_int_equal(f->len, 5);
                assert_int_equal(f->offset, 0);
                assert_memory_equal(f->data, "hello", 5);
                break;
        case 1:
                assert_int_equal(f->kind, PROC_STREAM_STDERR);
                assert_int_equal(f->len, 6);
                assert_int_equal(f->offset, 5);
                assert_memory_equal(f->data, "oops!!", 6);
                break;
        case 2:
                assert_int_equal(f->kind, PROC_STREAM_GAP);
                assert_int_equal(f->offset, 18);
                assert_int_equal(f->dropped, 7);
                break;
        case 3:
                assert_int_equal(f->kind, PROC_STREAM_STDOUT);
                assert_int_equal(f->len, 0);
                break;
        case 4:
                assert_int_equal(f->kind, PROC_STREAM_STDOUT);
                assert_int_equal(f->len, PROC_STREAM_DATA_MAX);
                for (size_t k = 0; k < PROC_STREAM_DATA_MAX; k += 4099)
                        assert_int_equal(f->data[k], (uint8_t) (k * 7));
                assert_int_equal(f->data[PROC_STREAM_DATA_MAX - 1], (uint8_t) ((PROC_STREAM_DATA_MAX - 1) * 7));
                break;
        case 5:
                assert_int_equal(f->kind, PROC_STREAM_EXIT);
                assert_int_equal(f->offset, 18 + PROC_STREAM_DATA_MAX);
                assert_int_equal(f->exit_code, -1);
                assert_int_equal(f->signal, 9);
                break;
        default:
                fail_msg("frame %u is one too many", i);
        }
}

/* Feed b[0..n) in chunks of step bytes (the last one shorter); returns the frames seen. */
static unsigned feed_in_steps(const uint8_t *b, size_t n, size_t step) {
        ProcStreamDecoder d;
        unsigned frames = 0;

        assert_int_equal(proc_stream_decoder_init(&d), 0);
        for (size_t pos = 0; pos < n;) {
                size_t chunk = MIN(step, n - pos), off = 0;

                while (off < chunk) {
                        ProcStreamFrame f;
                        size_t used = 0;
                        int r = proc_stream_decoder_feed(&d, b + pos + off, chunk - off, &used, &f);

                        assert_true(r >= 0);
                        assert_true(used > 0 || chunk - off == 0);
                        off += used;
                        if (r == 1)
                                check_frame(frames++, &f);
                        else
                                assert_int_equal(off, chunk);
                }
                pos += chunk;
        }
        assert_true(proc_stream_decoder_idle(&d));
        proc_stream_decoder_done(&d);
        return frames;
}

static void test_every_kind_whole(void **state) {
        _cleanup_free_ uint8_t *b = NULL;
        size_t n = build_stream(&b);

        (void) state;
        assert_int_equal(feed_in_steps(b, n, n), 6);
}

static void test_split_reads(void **state) {
        static const size_t steps[] = { 1, 2, 3, 7, 15, 16, 17, 23, 4096, 65537 };
        _cleanup_free_ uint8_t *b = NULL;
        size_t n = build_stream(&b);

        (void) state;
        for (size_t i = 0; i < ELEMENTSOF(steps); i++)
                assert_int_equal(feed_in_steps(b, n, steps[i]), 6);
}

static void test_partial_is_not_idle(void **state) {
        uint8_t h[PROC_STREAM_HDR_SIZE + 3];
        ProcStreamDecoder d;
        ProcStreamFrame f;
        size_t used;

        (void) state;
        proc_stream_header_encode(h, PROC_STREAM_STDERR, 10, 42);
        memcpy(h + PROC_STREAM_HDR_SIZE, "abc", 3);
        assert_int_equal(proc_stream_decoder_init(&d), 0);
        assert_true(proc_stream_decoder_idle(&d));
        assert_int_equal(proc_stream_decoder_feed(&d, h, 5, &used, &f), 0);
        assert_int_equal(used, 5);
        assert_false(proc_stream_decoder_idle(&d));
        assert_int_equal(proc_stream_decoder_feed(&d, h + 5, sizeof(h) - 5, &used, &f), 0);
        assert_int_equal(used, sizeof(h) - 5);
        assert_false(proc_stream_decoder_idle(&d));
        proc_stream_decoder_done(&d);
}

static void expect_refused(const uint8_t h[PROC_STREAM_HDR_SIZE]) {
        ProcStreamHeader hdr = { .kind = 77, .len = 77, .offset = 77 };
        ProcStreamDecoder d;
        ProcStreamFrame f;
        size_t used = 0;

        assert_int_equal(proc_stream_header_decode(h, &hdr), -EBADMSG);
        /* untouched on error */
        assert_int_equal(hdr.kind, 77);
        assert_int_equal(hdr.len, 77);
        assert_int_equal(hdr.offset, 77);

        assert_int_equal(proc_stream_decoder_init(&d), 0);
        assert_int_equal(proc_stream_decoder_feed(&d, h, PROC_STREAM_HDR_SIZE, &used, &f), -EBADMSG);
        /* sticky: a good frame after it is refused too */
        uint8_t good[PROC_STREAM_HDR_SIZE];
        proc_stream_header_encode(good, PROC_STREAM_STDOUT, 0, 0);
        assert_int_equal(proc_stream_decoder_feed(&d, good, sizeof(good), &used, &f), -EBADMSG);
        assert_false(proc_stream_decoder_idle(&d));
        proc_stream_decoder_done(&d);
}

static void test_hostile_headers(void **state) {
        uint8_t h[PROC_STREAM_HDR_SIZE];

        (void) state;
        /* kinds 0, 5 and 255 */
        for (unsigned k = 0; k < 256; k++) {
                if (k >= PROC_STREAM_STDOUT && k <= PROC_STREAM_EXIT)
                        continue;
                proc_stream_header_encode(h, (uint8_t) k, 0, 0);
                expect_refused(h);
        }
        /* every pad byte */
        for (unsigned i = 1; i < 4; i++) {
                proc_stream_header_encode(h, PROC_STREAM_STDOUT, 1, 0);
                h[i] = 1;
                expect_refused(h);
        }
        /* a length one over, and the largest */
        proc_stream_header_encode(h, PROC_STREAM_STDOUT, PROC_STREAM_DATA_MAX + 1, 0);
        expect_refused(h);
        proc_stream_header_encode(h, PROC_STREAM_STDERR, UINT32_MAX, 0);
        expect_refused(h);
        /* gap and exit payloads other than 8 */
        static const uint32_t lens[] = { 0, 4, 7, 9, 16, PROC_STREAM_DATA_MAX };
        for (size_t i = 0; i < ELEMENTSOF(lens); i++) {
                proc_stream_header_encode(h, PROC_STREAM_GAP, lens[i], 0);
                expect_refused(h);
                proc_stream_header_encode(h, PROC_STREAM_EXIT, lens[i], 0);
                expect_refused(h);
        }
}

static void test_header_fields(void **state) {
        uint8_t h[PROC_STREAM_HDR_SIZE];
        ProcStreamHeader hdr;

        (void) state;
        proc_stream_header_encode(h, PROC_STREAM_STDERR, PROC_STREAM_DATA_MAX, UINT64_C(0x0102030405060708));
        /* little-endian on the wire */
        assert_int_equal(h[0], PROC_STREAM_STDERR);
        assert_int_equal(h[4], 0x00);
        assert_int_equal(h[6], 0x04);
        assert_int_equal(h[8], 0x08);
        assert_int_equal(h[15], 0x01);
        assert_int_equal(proc_stream_header_decode(h, &hdr), 0);
        assert_int_equal(hdr.kind, PROC_STREAM_STDERR);
        assert_int_equal(hdr.len, PROC_STREAM_DATA_MAX);
        assert_true(hdr.offset == UINT64_C(0x0102030405060708));

        uint8_t e[PROC_STREAM_HDR_SIZE + 8];
        assert_int_equal(proc_stream_encode_exit(e, UINT64_MAX, 0, 0), sizeof(e));
        assert_int_equal(proc_stream_header_decode(e, &hdr), 0);
        assert_true(hdr.offset == UINT64_MAX);
        assert_int_equal(proc_stream_encode_gap(e, 1, UINT64_MAX), sizeof(e));
        for (unsigned i = 0; i < 8; i++)
                assert_int_equal(e[PROC_STREAM_HDR_SIZE + i], 0xff);
}

static void test_signals(void **state) {
        (void) state;
        assert_int_equal(proc_signal_from_string("SIGTERM"), 15);
        assert_int_equal(proc_signal_from_string("TERM"), 15);
        assert_int_equal(proc_signal_from_string("KILL"), 9);
        assert_int_equal(proc_signal_from_string("SIGHUP"), 1);
        assert_int_equal(proc_signal_from_string("SIGWINCH"), 28);
        assert_int_equal(proc_signal_from_string("1"), 1);
        assert_int_equal(proc_signal_from_string("64"), 64);
        assert_int_equal(proc_signal_from_string("0"), -EINVAL);
        assert_int_equal(proc_signal_from_string("65"), -EINVAL);
        assert_int_equal(proc_signal_from_string("99999999999999999999"), -EINVAL);
        assert_int_equal(proc_signal_from_string("15x"), -EINVAL);
        assert_int_equal(proc_signal_from_string("-9"), -EINVAL);
        assert_int_equal(proc_signal_from_string(""), -EINVAL);
        assert_int_equal(proc_signal_from_string("SIG"), -EINVAL);
        assert_int_equal(proc_signal_from_string("term"), -EINVAL);
        assert_int_equal(proc_signal_from_string("SIGSIGTERM"), -EINVAL);
        assert_int_equal(proc_signal_from_string(NULL), -EINVAL);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_every_kind_whole),
                cmocka_unit_test(test_split_reads),
                cmocka_unit_test(test_partial_is_not_idle),
                cmocka_unit_test(test_hostile_headers),
                cmocka_unit_test(test_header_fields),
                cmocka_unit_test(test_signals),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
