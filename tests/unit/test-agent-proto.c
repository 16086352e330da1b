/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* Unit tests for the host side of the agent protocol (src/shared/agent-proto.c):
 * headers, the incremental decoder, and the client over real socketpairs
 * with a peer thread or a forked peer process. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <json-c/json.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent-proto.h"
#include "macro.h"

#define SENTINEL 0xA5

/* ---- helpers ---- */

static void *build(uint16_t type, uint32_t id, const char *json, size_t *ret_len) {
        void *buf = NULL;

        assert_int_equal(fka_frame_build(type, id, json, strlen(json), &buf, ret_len), 0);
        return buf;
}

/* Append a frame to a growing stream buffer. */
static void stream_add(uint8_t **s, size_t *n, uint16_t type, uint32_t id, const char *json) {
        _cleanup_free_ void *f = NULL;
        size_t l;

        f = build(type, id, json, &l);
        *s = realloc(*s, *n + l);
        assert_non_null(*s);
        memcpy(*s + *n, f, l);
        *n += l;
}

static void stream_add_raw(uint8_t **s, size_t *n, const void *data, size_t l) {
        *s = realloc(*s, *n + l);
        assert_non_null(*s);
        memcpy(*s + *n, data, l);
        *n += l;
}

struct expect {
        uint16_t type;
        uint32_t id;
        const char *json;
};

/* Feed data in pieces of `chunk` bytes (0: all at once); collect frames. */
static size_t feed_all(fka_decoder *d, const uint8_t *data, size_t n, size_t chunk, fka_frame *out, size_t max_out) {
        size_t got = 0;

        for (size_t off = 0; off < n;) {
                size_t k = chunk == 0 ? n - off : MIN(chunk, n - off);
                const void *p = data + off;
                size_t left = k;

                while (left > 0) {
                        fka_frame f = {};
                        int r;

                        r = fka_decoder_feed(d, &p, &left, &f);
                        assert_true(r >= 0);
                        if (r == 1) {
                                assert_true(got < max_out);
                                out[got++] = f;
                        }
                }
                off += k;
        }
        return got;
}

static void check_frames(fka_frame *f, size_t n, const struct expect *e, size_t n_expect) {
        assert_int_equal(n, n_expect);
        for (size_t i = 0; i < n; i++) {
                assert_int_equal(f[i].type, e[i].type);
                assert_int_equal(f[i].id, e[i].id);
                assert_int_equal(f[i].len, strlen(e[i].json));
                assert_non_null(f[i].payload);
                assert_string_equal(f[i].payload, e[i].json);
                fka_frame_done(&f[i]);
                assert_null(f[i].payload);
        }
}

/* Blocking: read one whole frame from fd (peer side). Returns 1, 0 on EOF. */
static int peer_read_frame(int fd, fka_decoder *d, fka_frame *ret) {
        for (;;) {
                uint8_t buf[4096];
                const void *p = buf;
                size_t want = MIN(fka_decoder_wanted(d), sizeof(buf)), n;
                ssize_t l;
                int r;

                l = read(fd, buf, want);
                if (l < 0 && errno == EINTR)
                        continue;
                if (l <= 0)
                        return (int) l;
                n = (size_t) l;
                r = fka_decoder_feed(d, &p, &n, ret);
                if (r != 0)
                        return r;
        }
}

static int write_all(int fd, const void *data, size_t n) {
        const uint8_t *p = data;

        while (n > 0) {
                ssize_t l = write(fd, p, n);

                if (l < 0 && errno == EINTR)
                        continue;
                if (l < 0)
                        return -errno;
                p += l;
                n -= (size_t) l;
        }
        return 0;
}

static int peer_write(int fd, uint16_t type, uint32_t id, const char *json) {
        uint8_t hdr[FKA_HDR_SIZE];
        int r;

        /* Raw, so that tests can send what fka_frame_build() refuses. */
        fka_encode_header(hdr, type, id, (uint32_t) strlen(json));
        r = write_all(fd, hdr, sizeof(hdr));
        if (r < 0)
                return r;
        return write_all(fd, json, strlen(json));
}

static void make_pair(int sv[2]) {
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
}

/* Drive the client until it yields a completion or fails; the test fails if
 * nothing happens for timeout_ms. Returns fka_client_next()'s result. */
static int wait_completion(fka_client *c, fka_completion *comp, int timeout_ms) {
        uint64_t give_up = fka_now_usec() + (uint64_t) timeout_ms * 1000;

        for (;;) {
                struct pollfd pfd;
                uint64_t now = fka_now_usec(), dl;
                int r, ms;

                (void) fka_client_expire(c, now);
                r = fka_client_next(c, comp);
                if (r != 0)
                        return r;

                assert_true(now < give_up);
                ms = (int) ((give_up - now) / 1000) + 1;
                dl = fka_client_next_deadline(c);
                if (dl != UINT64_MAX)
                        ms = MIN(ms, (int) ((dl > now ? dl - now : 0) / 1000) + 1);

                pfd = (struct pollfd) { .fd = fka_client_fd(c), .events = fka_client_events(c) };
                assert_true(poll(&pfd, 1, ms) >= 0 || errno == EINTR);
        }
}

/* Check that the fd has no byte to read right now. */
static void assert_no_input(int fd) {
        struct pollfd pfd = { .fd = fd, .events = POLLIN };

        assert_int_equal(poll(&pfd, 1, 0), 0);
}

/* ---- headers ---- */

static void test_header_roundtrip(void **state) {
        static const struct { uint16_t type; uint32_t id, len; } cases[] = {
                { FKA_REQUEST, 1, 0 },
                { FKA_RESPONSE, 0x7fffffffu, 17 },
                { FKA_ERROR, 0, FKA_MAX_PAYLOAD },
                { FKA_EVENT, 0, 1 },
                { FKA_ERROR, 0xffffffffu, 0x12345 },
        };
        static const uint8_t expected[FKA_HDR_SIZE] = {
                'F', 'K', 'A', '1', 0x02, 0x00, 0x00, 0x00,
                0x78, 0x56, 0x34, 0x12, 0x04, 0x03, 0x02, 0x01,
        };
        uint8_t h[FKA_HDR_SIZE];
        fka_header d;

        /* The wire layout: little-endian, magic "FKA1". */
        fka_encode_header(h, FKA_RESPONSE, 0x12345678u, 0x01020304u);
        assert_memory_equal(h, expected, sizeof(h));

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                memset(&d, SENTINEL, sizeof(d));
                fka_encode_header(h, cases[i].type, cases[i].id, cases[i].len);
                assert_int_equal(fka_decode_header(h, FKA_MAX_PAYLOAD, &d), 0);
                assert_int_equal(d.type, cases[i].type);
                assert_int_equal(d.flags, 0);
                assert_int_equal(d.id, cases[i].id);
                assert_int_equal(d.len, cases[i].len);
        }
}

static void assert_header_refused(const uint8_t h[FKA_HDR_SIZE]) {
        fka_header d, untouched;

        memset(&d, SENTINEL, sizeof(d));
        memcpy(&untouched, &d, sizeof(d));
        assert_int_equal(fka_decode_header(h, FKA_MAX_PAYLOAD, &d), -EBADMSG);
        assert_memory_equal(&d, &untouched, sizeof(d));
}

static void test_header_hostile(void **state) {
        uint8_t h[FKA_HDR_SIZE];
        fka_header d;

        /* Every single-bit error in the magic */
        for (unsigned bit = 0; bit < 32; bit++) {
                fka_encode_header(h, FKA_REQUEST, 7, 10);
                h[bit / 8] ^= (uint8_t) (1u << (bit % 8));
                assert_header_refused(h);
        }
        /* Big-endian magic is not the magic */
        fka_encode_header(h, FKA_REQUEST, 7, 10);
        h[0] = '1', h[1] = 'A', h[2] = 'K', h[3] = 'F';
        assert_header_refused(h);

        /* Any flag bit */
        for (unsigned bit = 0; bit < 16; bit++) {
                fka_encode_header(h, FKA_REQUEST, 7, 10);
                h[6 + bit / 8] |= (uint8_t) (1u << (bit % 8));
                assert_header_refused(h);
        }

        /* Unknown types */
        static const uint16_t bad_types[] = { 0, 5, 6, 0x100, 0x0102, 0xffff };
        for (size_t i = 0; i < ELEMENTSOF(bad_types); i++) {
                fka_encode_header(h, bad_types[i], 7, 10);
                assert_header_refused(h);
        }

        /* Bad magic wins over an oversized len: nothing is reported */
        fka_encode_header(h, FKA_RESPONSE, 7, 0xffffffffu);
        h[0] = 0;
        assert_header_refused(h);

        /* len = limit + 1: -EMSGSIZE, and the id is still reported */
        memset(&d, SENTINEL, sizeof(d));
        fka_encode_header(h, FKA_REQUEST, 4242, FKA_MAX_PAYLOAD + 1);
        assert_int_equal(fka_decode_header(h, FKA_MAX_PAYLOAD, &d), -EMSGSIZE);
        assert_int_equal(d.id, 4242);
        assert_int_equal(d.type, FKA_REQUEST);
        assert_int_equal(d.len, FKA_MAX_PAYLOAD + 1);

        /* len = 0xffffffff */
        memset(&d, SENTINEL, sizeof(d));
        fka_encode_header(h, FKA_RESPONSE, 99, 0xffffffffu);
        assert_int_equal(fka_decode_header(h, FKA_MAX_PAYLOAD, &d), -EMSGSIZE);
        assert_int_equal(d.id, 99);
        assert_int_equal(d.len, 0xffffffffu);

        /* The limit is the caller's: the guest's 16 KiB */
        fka_encode_header(h, FKA_REQUEST, 5, FKA_GUEST_MAX_PAYLOAD);
        assert_int_equal(fka_decode_header(h, FKA_GUEST_MAX_PAYLOAD, &d), 0);
        fka_encode_header(h, FKA_REQUEST, 5, FKA_GUEST_MAX_PAYLOAD + 1);
        assert_int_equal(fka_decode_header(h, FKA_GUEST_MAX_PAYLOAD, &d), -EMSGSIZE);
}

static void test_frame_build(void **state) {
        void *buf = NULL;
        size_t len = 0;
        fka_header d;

        assert_int_equal(fka_frame_build(FKA_REQUEST, 3, "{\"op\":\"ping\"}", 13, &buf, &len), 0);
        assert_int_equal(len, FKA_HDR_SIZE + 13);
        assert_int_equal(fka_decode_header(buf, FKA_MAX_PAYLOAD, &d), 0);
        assert_int_equal(d.type, FKA_REQUEST);
        assert_int_equal(d.id, 3);
        assert_int_equal(d.len, 13);
        assert_memory_equal((uint8_t *) buf + FKA_HDR_SIZE, "{\"op\":\"ping\"}", 13);
        free(buf);

        /* Empty payloads are framed (the receiver rejects them as JSON) */
        assert_int_equal(fka_frame_build(FKA_ERROR, 0, NULL, 0, &buf, &len), 0);
        assert_int_equal(len, FKA_HDR_SIZE);
        free(buf);
}

/* ---- the ret_ convention, explicitly ---- */

static void test_untouched_on_error(void **state) {
        void *buf = (void *) 0x1234, *buf0 = buf;
        size_t len = 777;
        fka_decoder *d = (fka_decoder *) 0x5678;
        fka_client *c = (fka_client *) 0x9abc;
        _cleanup_free_ char *big = NULL;

        /* fka_frame_build */
        assert_int_equal(fka_frame_build(0, 1, "{}", 2, &buf, &len), -EINVAL);
        assert_int_equal(fka_frame_build(5, 1, "{}", 2, &buf, &len), -EINVAL);
        assert_int_equal(fka_frame_build(FKA_REQUEST, 0, "{}", 2, &buf, &len), -EINVAL);
        assert_int_equal(fka_frame_build(FKA_RESPONSE, 0, "{}", 2, &buf, &len), -EINVAL);
        assert_int_equal(fka_frame_build(FKA_EVENT, 1, "{}", 2, &buf, &len), -EINVAL);
        assert_int_equal(fka_frame_build(FKA_REQUEST, 1, NULL, 2, &buf, &len), -EINVAL);
        big = calloc(1, FKA_MAX_PAYLOAD + 1);
        assert_non_null(big);
        assert_int_equal(fka_frame_build(FKA_REQUEST, 1, big, FKA_MAX_PAYLOAD + 1, &buf, &len), -EMSGSIZE);
        assert_ptr_equal(buf, buf0);
        assert_int_equal(len, 777);

        /* fka_decoder_new / fka_client_new */
        assert_int_equal(fka_decoder_new(0, &d), -EINVAL);
        assert_int_equal(fka_decoder_new(FKA_MAX_PAYLOAD + 1, &d), -EINVAL);
        assert_ptr_equal(d, (fka_decoder *) 0x5678);
        assert_int_equal(fka_client_new(-1, 1, &c), -EBADF);
        assert_int_equal(fka_client_new(0, 0, &c), -EINVAL);
        assert_int_equal(fka_client_new(0, FKA_CLIENT_MAX_IN_FLIGHT + 1, &c), -EINVAL);
        assert_ptr_equal(c, (fka_client *) 0x9abc);

        /* fka_decoder_feed on garbage */
        {
                _cleanup_(fka_decoder_freep) fka_decoder *dd = NULL;
                uint8_t junk[FKA_HDR_SIZE];
                const void *p = junk;
                size_t n = sizeof(junk);
                fka_frame f, untouched;

                memset(junk, 'x', sizeof(junk));
                memset(&f, SENTINEL, sizeof(f));
                memcpy(&untouched, &f, sizeof(f));
                assert_int_equal(fka_decoder_new(FKA_MAX_PAYLOAD, &dd), 0);
                assert_int_equal(fka_decoder_feed(dd, &p, &n, &f), -EBADMSG);
                assert_memory_equal(&f, &untouched, sizeof(f));
        }

        /* fka_call and fka_client_next on a dead connection */
        {
                _cleanup_(fka_client_freep) fka_client *cl = NULL;
                char *resp = (char *) 0x42;
                uint16_t type = 0xbeef;
                fka_completion comp, untouched;
                int sv[2];

                make_pair(sv);
                assert_int_equal(close(sv[1]), 0);
                assert_int_equal(fka_call(sv[0], "not json", 1000000, &resp, &type), -EINVAL);
                assert_int_equal(fka_call(sv[0], "{\"op\":\"ping\"}", 1000000, &resp, &type), -EPIPE);
                assert_ptr_equal(resp, (char *) 0x42);
                assert_int_equal(type, 0xbeef);

                assert_int_equal(fka_client_new(sv[0], 1, &cl), 0);
                memset(&comp, SENTINEL, sizeof(comp));
                memcpy(&untouched, &comp, sizeof(comp));
                assert_int_equal(fka_client_next(cl, &comp), -ECONNRESET);
                assert_memory_equal(&comp, &untouched, sizeof(comp));
                close(sv[0]);
        }
}

/* ---- decoder ---- */

static const struct expect three[] = {
        { FKA_RESPONSE, 1, "{\"pong\":true,\"pid\":1}" },
        { FKA_EVENT, 0, "{}" },
        { FKA_ERROR, 0xfffffffeu, "{\"error\":\"unknown op \\u00e9\"}" },
};

static uint8_t *three_stream(size_t *ret_n) {
        uint8_t *s = NULL;
        size_t n = 0;

        for (size_t i = 0; i < ELEMENTSOF(three); i++)
                stream_add(&s, &n, three[i].type, three[i].id, three[i].json);
        *ret_n = n;
        return s;
}

static void test_decoder_one_byte(void **state) {
        _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
        _cleanup_free_ uint8_t *s = NULL;
        fka_frame out[8];
        size_t n, got;

        s = three_stream(&n);
        assert_int_equal(fka_decoder_new(FKA_MAX_PAYLOAD, &d), 0);
        got = feed_all(d, s, n, 1, out, ELEMENTSOF(out));
        check_frames(out, got, three, ELEMENTSOF(three));
        assert_int_equal(fka_decoder_eof(d), 0);
}

static void test_decoder_two_in_one_chunk(void **state) {
        _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
        _cleanup_free_ uint8_t *s = NULL;
        size_t n = 0, first_len;
        fka_frame f = {};
        const void *p;

        stream_add(&s, &n, FKA_RESPONSE, 9, "{\"a\":1}");
        first_len = n = FKA_HDR_SIZE + 7;
        stream_add(&s, &n, FKA_RESPONSE, 10, "{\"b\":2}");

        assert_int_equal(fka_decoder_new(FKA_MAX_PAYLOAD, &d), 0);
        p = s;
        /* One call returns the first frame and leaves the second in place */
        assert_int_equal(fka_decoder_feed(d, &p, &n, &f), 1);
        assert_ptr_equal(p, s + first_len);
        assert_int_equal(n, FKA_HDR_SIZE + 7);
        assert_int_equal(f.id, 9);
        assert_string_equal(f.payload, "{\"a\":1}");
        fka_frame_done(&f);

        assert_int_equal(fka_decoder_feed(d, &p, &n, &f), 1);
        assert_int_equal(n, 0);
        assert_int_equal(f.id, 10);
        assert_string_equal(f.payload, "{\"b\":2}");
        fka_frame_done(&f);

        assert_int_equal(fka_decoder_feed(d, &p, &n, &f), 0);
        assert_int_equal(fka_decoder_eof(d), 0);
}

static void test_decoder_split_everywhere(void **state) {
        _cleanup_free_ uint8_t *s = NULL;
        size_t n;

        s = three_stream(&n);
        for (size_t k = 0; k <= n; k++) {
                _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
                fka_frame out[8];
                size_t got;

                assert_int_equal(fka_decoder_new(FKA_MAX_PAYLOAD, &d), 0);
                got = feed_all(d, s, k, 0, out, ELEMENTSOF(out));
                got += feed_all(d, s + k, n - k, 0, out + got, ELEMENTSOF(out) - got);
                check_frames(out, got, three, ELEMENTSOF(three));
                assert_int_equal(fka_decoder_eof(d), 0);
        }

        /* And in three pieces, at every pair of offsets */
        for (size_t a = 0; a <= n; a++)
                for (size_t b = a; b <= n; b += 3) {
                        _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
                        fka_frame out[8];
                        size_t got;

                        assert_int_equal(fka_decoder_new(FKA_MAX_PAYLOAD, &d), 0);
                        got = feed_all(d, s, a, 0, out, ELEMENTSOF(out));
                        got += feed_all(d, s + a, b - a, 0, out + got, ELEMENTSOF(out) - got);
                        got += feed_all(d, s + b, n - b, 0, out + got, ELEMENTSOF(out) - got);
                        check_frames(out, got, three, ELEMENTSOF(three));
                }
}

static void run_oversized(size_t chunk) {
        _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
        _cleanup_free_ uint8_t *s = NULL;
        uint8_t h[FKA_HDR_SIZE], body[100];
        size_t n = 0, off = 0;
        int oversized = 0, frames = 0;

        /* limit 64: a 100-byte frame, then a good one */
        fka_encode_header(h, FKA_RESPONSE, 77, sizeof(body));
        memset(body, '{', sizeof(body));
        stream_add_raw(&s, &n, h, sizeof(h));
        stream_add_raw(&s, &n, body, sizeof(body));
        stream_add(&s, &n, FKA_RESPONSE, 78, "{\"ok\":true}");

        assert_int_equal(fka_decoder_new(64, &d), 0);
        while (off < n) {
                size_t k = MIN(chunk, n - off);
                const void *p = s + off;
                size_t left = k;

                while (left > 0) {
                        fka_frame f;
                        int r;

                        memset(&f, SENTINEL, sizeof(f));
                        r = fka_decoder_feed(d, &p, &left, &f);
                        if (r == -EMSGSIZE) {
                                assert_int_equal(oversized, 0);
                                assert_int_equal(frames, 0);
                                assert_int_equal(f.id, 77);
                                assert_int_equal(f.type, FKA_RESPONSE);
                                assert_int_equal(f.len, sizeof(body));
                                assert_null(f.payload);
                                /* Skipping: exactly the payload is wanted, no more */
                                assert_int_equal(fka_decoder_wanted(d), sizeof(body));
                                oversized++;
                        } else if (r == 1) {
                                assert_int_equal(oversized, 1);
                                assert_int_equal(f.id, 78);
                                assert_string_equal(f.payload, "{\"ok\":true}");
                                fka_frame_done(&f);
                                frames++;
                        } else
                                assert_int_equal(r, 0);
                }
                off += k;
        }
        assert_int_equal(oversized, 1);
        assert_int_equal(frames, 1);
        assert_int_equal(fka_decoder_eof(d), 0);
}

static void test_decoder_oversized_skipped(void **state) {
        run_oversized(1);
        run_oversized(7);
        run_oversized(SIZE_MAX);
}

static void test_decoder_huge_len_then_eof(void **state) {
        _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
        uint8_t buf[FKA_HDR_SIZE + 1000];
        const void *p = buf;
        size_t n = sizeof(buf);
        fka_frame f = {};

        /* 4 GiB announced: skipped without buffering, and the stream ends */
        fka_encode_header(buf, FKA_RESPONSE, 5, 0xffffffffu);
        memset(buf + FKA_HDR_SIZE, 0, 1000);
        assert_int_equal(fka_decoder_new(FKA_MAX_PAYLOAD, &d), 0);
        assert_int_equal(fka_decoder_feed(d, &p, &n, &f), -EMSGSIZE);
        assert_int_equal(f.id, 5);
        assert_int_equal(n, 1000);
        assert_int_equal(fka_decoder_feed(d, &p, &n, &f), 0);
        assert_int_equal(n, 0);
        assert_int_equal(fka_decoder_wanted(d), 0xffffffffu - 1000);
        assert_int_equal(fka_decoder_eof(d), -EPROTO);
}

static void test_decoder_truncated(void **state) {
        _cleanup_free_ uint8_t *s = NULL;
        size_t n;

        s = three_stream(&n);
        for (size_t k = 0; k <= n; k++) {
                _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
                fka_frame out[8];
                size_t got;
                bool boundary = k == 0;

                /* Is k a frame boundary? */
                for (size_t i = 0, b = 0; i < ELEMENTSOF(three); i++) {
                        b += FKA_HDR_SIZE + strlen(three[i].json);
                        if (b == k)
                                boundary = true;
                }

                assert_int_equal(fka_decoder_new(FKA_MAX_PAYLOAD, &d), 0);
                got = feed_all(d, s, k, 0, out, ELEMENTSOF(out));
                for (size_t i = 0; i < got; i++)
                        fka_frame_done(&out[i]);
                assert_int_equal(fka_decoder_eof(d), boundary ? 0 : -EPROTO);
                if (!boundary)
                        assert_true(fka_decoder_wanted(d) > 0);
        }
}

static void test_decoder_resync(void **state) {
        _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
        _cleanup_free_ uint8_t *s = NULL;
        uint8_t h[FKA_HDR_SIZE];
        size_t n = 0, total = 0;
        int badmsg = 0, frames = 0;

        /* garbage, including a partial magic; a header with flags set; a good frame */
        stream_add_raw(&s, &n, "garbage FK FKA", 14);
        fka_encode_header(h, FKA_REQUEST, 3, 0);
        h[6] = 1;
        stream_add_raw(&s, &n, h, sizeof(h));
        stream_add(&s, &n, FKA_EVENT, 0, "{\"op\":\"identity\"}");
        total = n;

        for (size_t chunk = 1; chunk <= total; chunk++) {
                badmsg = frames = 0;
                assert_int_equal(fka_decoder_new(FKA_MAX_PAYLOAD, &d), 0);
                for (size_t off = 0; off < total; off += chunk) {
                        const void *p = s + off;
                        size_t left = MIN(chunk, total - off);

                        while (left > 0) {
                                fka_frame f;
                                int r;

                                memset(&f, SENTINEL, sizeof(f));
                                r = fka_decoder_feed(d, &p, &left, &f);
                                if (r == -EBADMSG) {
                                        assert_int_equal(f.type, (SENTINEL << 8) | SENTINEL);
                                        badmsg++;
                                } else if (r == 1) {
                                        assert_int_equal(f.type, FKA_EVENT);
                                        assert_string_equal(f.payload, "{\"op\":\"identity\"}");
                                        fka_frame_done(&f);
                                        frames++;
                                } else
                                        assert_int_equal(r, 0);
                        }
                }
                /* One report for the whole run of garbage, then the frame */
                assert_int_equal(badmsg, 1);
                assert_int_equal(frames, 1);
                assert_int_equal(fka_decoder_eof(d), 0);
                d = fka_decoder_free(d);
        }
}

/* Random bytes and random mutations of valid frames, in random chunks: the
 * decoder must neither crash nor grow beyond its limit (ASan/UBSan builds
 * check the former, wanted() the latter). */
static void test_decoder_random(void **state) {
        _cleanup_free_ uint8_t *s = NULL;
        size_t n;
        unsigned seed = 12345;

        s = three_stream(&n);
        for (int iter = 0; iter < 2000; iter++) {
                _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
                uint8_t buf[256];
                size_t len = MIN(n, sizeof(buf)), off = 0;

                memcpy(buf, s, len);
                for (int m = rand_r(&seed) % 8; m >= 0; m--)
                        buf[rand_r(&seed) % len] = (uint8_t) rand_r(&seed);
                if (iter % 4 == 0)
                        for (size_t i = 0; i < len; i++)
                                buf[i] = (uint8_t) rand_r(&seed);

                assert_int_equal(fka_decoder_new(64, &d), 0);
                while (off < len) {
                        size_t k = MIN((size_t) (rand_r(&seed) % 40) + 1, len - off);
                        const void *p = buf + off;

                        while (k > 0) {
                                fka_frame f = {};
                                int r = fka_decoder_feed(d, &p, &k, &f);

                                assert_true(r == 0 || r == 1 || r == -EMSGSIZE || r == -EBADMSG);
                                if (r == 1) {
                                        assert_true(f.len <= 64);
                                        assert_int_equal(strlen(f.payload) <= f.len, true);
                                }
                                fka_frame_done(&f);
                        }
                        off = (size_t) ((const uint8_t *) p - buf);
                }
        }
}

/* ---- client ---- */

struct peer {
        int fd;
        unsigned n;          /* requests to read before answering */
        int result;
};

/* Reads n requests, then answers them in reverse order, echoing the id. */
static void *peer_reverse(void *arg) {
        _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
        struct peer *p = arg;
        uint32_t ids[16];
        char json[128];

        p->result = -EINVAL;
        if (p->n > ELEMENTSOF(ids) || fka_decoder_new(FKA_GUEST_MAX_PAYLOAD, &d) < 0)
                return NULL;

        for (unsigned i = 0; i < p->n; i++) {
                fka_frame f = {};

                if (peer_read_frame(p->fd, d, &f) != 1 || f.type != FKA_REQUEST || f.id == 0) {
                        fka_frame_done(&f);
                        p->result = -EPROTO;
                        return NULL;
                }
                ids[i] = f.id;
                fka_frame_done(&f);
        }
        for (unsigned i = p->n; i > 0; i--) {
                snprintf(json, sizeof(json), "{\"echo\":%u}", ids[i - 1]);
                if (peer_write(p->fd, FKA_RESPONSE, ids[i - 1], json) < 0)
                        return NULL;
        }
        p->result = 0;
        return NULL;
}

static void test_client_out_of_order(void **state) {
        _cleanup_(fka_client_freep) fka_client *c = NULL;
        struct peer p = { .n = 5 };
        int sv[2], ids[5], seen[5] = {};
        uintptr_t tags[5];
        pthread_t t;

        make_pair(sv);
        p.fd = sv[1];
        assert_int_equal(pthread_create(&t, NULL, peer_reverse, &p), 0);

        assert_int_equal(fka_client_new(sv[0], 8, &c), 0);
        for (unsigned i = 0; i < 5; i++) {
                char req[64];

                snprintf(req, sizeof(req), "{\"op\":\"ping\",\"n\":%u}", i);
                tags[i] = 100 + i;
                ids[i] = fka_client_send(c, req, SIZE_MAX, fka_now_usec() + 10 * 1000000, (void *) tags[i]);
                assert_true(ids[i] > 0);
                for (unsigned j = 0; j < i; j++)
                        assert_int_not_equal(ids[i], ids[j]);
        }
        assert_int_equal(fka_client_in_flight(c), 5);

        for (unsigned k = 0; k < 5; k++) {
                fka_completion comp = {};
                struct json_object *v;
                unsigned i;

                assert_int_equal(wait_completion(c, &comp, 5000), 1);
                assert_int_equal(comp.error, 0);
                assert_int_equal(comp.type, FKA_RESPONSE);
                for (i = 0; i < 5; i++)
                        if ((uint32_t) ids[i] == comp.id)
                                break;
                assert_true(i < 5);
                /* Reverse order: the last request is answered first */
                assert_int_equal(i, 4 - k);
                assert_int_equal(seen[i], 0);
                seen[i] = 1;
                assert_ptr_equal(comp.userdata, (void *) tags[i]);
                assert_non_null(comp.obj);
                assert_true(json_object_object_get_ex(comp.obj, "echo", &v));
                assert_int_equal(json_object_get_int64(v), ids[i]);
                assert_int_equal(strlen(comp.json), comp.json_len);
                fka_completion_done(&comp);
                assert_null(comp.json);
        }
        assert_int_equal(fka_client_in_flight(c), 0);
        assert_int_equal(fka_client_next_deadline(c), UINT64_MAX);

        assert_int_equal(pthread_join(t, NULL), 0);
        assert_int_equal(p.result, 0);
        c = fka_client_free(c);
        close(sv[0]);
        close(sv[1]);
}

static void test_client_timeout(void **state) {
        _cleanup_(fka_client_freep) fka_client *c = NULL;
        _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
        fka_completion comp = {};
        fka_frame f1 = {}, f2 = {};
        uint64_t t0, dl;
        int sv[2], id1, id2;

        make_pair(sv);
        assert_int_equal(fka_decoder_new(FKA_GUEST_MAX_PAYLOAD, &d), 0);
        assert_int_equal(fka_client_new(sv[0], 4, &c), 0);

        t0 = fka_now_usec();
        dl = t0 + 50 * 1000;
        id1 = fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, dl, (void *) 1);
        id2 = fka_client_send(c, "{\"op\":\"identity\"}", SIZE_MAX, t0 + 10 * 1000000, (void *) 2);
        assert_true(id1 > 0 && id2 > 0);
        assert_int_equal(fka_client_next_deadline(c), dl);

        /* Nothing overdue yet */
        assert_int_equal(fka_client_expire(c, t0), 0);
        assert_int_equal(fka_client_next(c, &comp), 0);

        /* The peer stays silent: the first request times out */
        assert_int_equal(wait_completion(c, &comp, 5000), 1);
        assert_true(fka_now_usec() >= dl);
        assert_int_equal(comp.id, (uint32_t) id1);
        assert_int_equal(comp.error, -ETIMEDOUT);
        assert_int_equal(comp.type, 0);
        assert_ptr_equal(comp.userdata, (void *) 1);
        assert_null(comp.json);
        assert_null(comp.obj);
        fka_completion_done(&comp);
        assert_int_equal(fka_client_in_flight(c), 1);

        /* The late answer is dropped quietly, then the second is answered */
        assert_int_equal(peer_read_frame(sv[1], d, &f1), 1);
        assert_int_equal(peer_read_frame(sv[1], d, &f2), 1);
        assert_int_equal(f1.id, (uint32_t) id1);
        assert_int_equal(f2.id, (uint32_t) id2);
        assert_int_equal(peer_write(sv[1], FKA_RESPONSE, f1.id, "{\"late\":true}"), 0);
        assert_int_equal(peer_write(sv[1], FKA_ERROR, f2.id, "{\"error\":\"no\"}"), 0);
        fka_frame_done(&f1);
        fka_frame_done(&f2);

        assert_int_equal(wait_completion(c, &comp, 5000), 1);
        assert_int_equal(comp.id, (uint32_t) id2);
        assert_int_equal(comp.type, FKA_ERROR);
        assert_int_equal(comp.error, 0);
        assert_string_equal(comp.json, "{\"error\":\"no\"}");
        fka_completion_done(&comp);

        /* A second answer to the timed-out id is a protocol error */
        assert_int_equal(peer_write(sv[1], FKA_RESPONSE, (uint32_t) id1, "{}"), 0);
        assert_int_equal(wait_completion(c, &comp, 5000), -EPROTO);

        c = fka_client_free(c);
        close(sv[0]);
        close(sv[1]);
}

static void test_client_in_flight_cap(void **state) {
        _cleanup_(fka_client_freep) fka_client *c = NULL;
        _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
        fka_completion comp = {};
        fka_frame f = {};
        int sv[2], id1, id2, id3;

        make_pair(sv);
        assert_int_equal(fka_decoder_new(FKA_GUEST_MAX_PAYLOAD, &d), 0);
        assert_int_equal(fka_client_new(sv[0], 2, &c), 0);

        id1 = fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, 0, NULL);
        id2 = fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, 0, NULL);
        assert_true(id1 > 0 && id2 > 0 && id1 != id2);
        assert_int_equal(fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, 0, NULL), -EBUSY);
        assert_int_equal(fka_client_in_flight(c), 2);

        /* Nothing of the refused request reached the wire */
        assert_int_equal(peer_read_frame(sv[1], d, &f), 1);
        assert_int_equal(f.id, (uint32_t) id1);
        fka_frame_done(&f);
        assert_int_equal(peer_read_frame(sv[1], d, &f), 1);
        assert_int_equal(f.id, (uint32_t) id2);
        fka_frame_done(&f);
        assert_no_input(sv[1]);

        /* An answered request counts until it is collected */
        assert_int_equal(peer_write(sv[1], FKA_RESPONSE, (uint32_t) id2, "{\"pong\":true}"), 0);
        assert_int_equal(fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, 0, NULL), -EBUSY);
        assert_int_equal(wait_completion(c, &comp, 5000), 1);
        assert_int_equal(comp.id, (uint32_t) id2);
        fka_completion_done(&comp);
        assert_int_equal(fka_client_in_flight(c), 1);

        id3 = fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, 0, NULL);
        assert_true(id3 > 0 && id3 != id1);
        assert_int_equal(fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, 0, NULL), -EBUSY);

        c = fka_client_free(c);
        close(sv[0]);
        close(sv[1]);
}

/* The peer answers the request with an id that was never sent. */
static void test_client_unknown_id(void **state) {
        static const uint32_t bad_ids[] = { 0, 1000, 0xffffffffu };

        for (size_t i = 0; i < ELEMENTSOF(bad_ids); i++) {
                _cleanup_(fka_client_freep) fka_client *c = NULL;
                _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
                fka_completion comp = {};
                fka_frame f = {};
                int sv[2], id;

                make_pair(sv);
                assert_int_equal(fka_decoder_new(FKA_GUEST_MAX_PAYLOAD, &d), 0);
                assert_int_equal(fka_client_new(sv[0], 4, &c), 0);
                id = fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, 0, (void *) 7);
                assert_true(id > 0);
                assert_int_equal(peer_read_frame(sv[1], d, &f), 1);
                fka_frame_done(&f);

                assert_int_equal(peer_write(sv[1], bad_ids[i] == 0 ? FKA_ERROR : FKA_RESPONSE, bad_ids[i], "{}"), 0);

                /* The pending request fails with the protocol error, then the connection */
                assert_int_equal(wait_completion(c, &comp, 5000), 1);
                assert_int_equal(comp.id, (uint32_t) id);
                assert_int_equal(comp.error, -EPROTO);
                assert_ptr_equal(comp.userdata, (void *) 7);
                fka_completion_done(&comp);
                assert_int_equal(fka_client_next(c, &comp), -EPROTO);
                assert_int_equal(fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, 0, NULL), -EPROTO);
                assert_int_equal(fka_client_in_flight(c), 0);

                c = fka_client_free(c);
                close(sv[0]);
                close(sv[1]);
        }
}

/* Other things the host refuses from a guest: requests, events with an id,
 * bad magic, flags. */
static void test_client_hostile_frames(void **state) {
        for (int kind = 0; kind < 4; kind++) {
                _cleanup_(fka_client_freep) fka_client *c = NULL;
                fka_completion comp = {};
                uint8_t h[FKA_HDR_SIZE];
                int sv[2], expected = -EPROTO;

                make_pair(sv);
                assert_int_equal(fka_client_new(sv[0], 4, &c), 0);
                assert_true(fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, 0, NULL) > 0);

                switch (kind) {
                case 0:
                        assert_int_equal(peer_write(sv[1], FKA_REQUEST, 1, "{\"op\":\"ping\"}"), 0);
                        break;
                case 1:
                        assert_int_equal(peer_write(sv[1], FKA_EVENT, 1, "{}"), 0);
                        break;
                case 2:
                        assert_int_equal(write_all(sv[1], "HTTP/1.1 200 OK\r\n", 17), 0);
                        expected = -EBADMSG;
                        break;
                case 3:
                        fka_encode_header(h, FKA_RESPONSE, 1, 0);
                        h[7] = 0x80;
                        assert_int_equal(write_all(sv[1], h, sizeof(h)), 0);
                        expected = -EBADMSG;
                        break;
                }

                assert_int_equal(wait_completion(c, &comp, 5000), 1);
                assert_int_equal(comp.error, expected);
                fka_completion_done(&comp);
                assert_int_equal(fka_client_next(c, &comp), expected);

                c = fka_client_free(c);
                close(sv[0]);
                close(sv[1]);
        }
}

/* Payloads that are not one strict JSON object fail their request only. */
static void test_client_bad_json(void **state) {
        static const char *const bad[] = {
                "",
                "not json",
                "[1,2]",
                "\"str\"",
                "{\"a\":1} trailing",
                "{\"a\":1}{}",
                "{\"a\":\"\xff\"}",            /* invalid UTF-8 */
                "{\"a\":\"\xc0\xaf\"}",         /* overlong */
                "{\"a\":",                     /* truncated */
                "{'a':1}",
                "{\"a\":NaN}",
        };
        _cleanup_(fka_client_freep) fka_client *c = NULL;
        _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
        int sv[2];

        make_pair(sv);
        assert_int_equal(fka_decoder_new(FKA_GUEST_MAX_PAYLOAD, &d), 0);
        assert_int_equal(fka_client_new(sv[0], 4, &c), 0);

        for (size_t i = 0; i <= ELEMENTSOF(bad); i++) {
                const char *answer = i < ELEMENTSOF(bad) ? bad[i] : " {\"fine\": [1, {\"x\": null}]}\n";
                fka_completion comp = {};
                fka_frame f = {};
                int id;

                id = fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, 0, NULL);
                assert_true(id > 0);
                assert_int_equal(peer_read_frame(sv[1], d, &f), 1);
                assert_int_equal(f.id, (uint32_t) id);
                fka_frame_done(&f);
                assert_int_equal(peer_write(sv[1], FKA_RESPONSE, (uint32_t) id, answer), 0);

                assert_int_equal(wait_completion(c, &comp, 5000), 1);
                assert_int_equal(comp.id, (uint32_t) id);
                assert_int_equal(comp.type, FKA_RESPONSE);
                if (i < ELEMENTSOF(bad)) {
                        assert_int_equal(comp.error, -EBADMSG);
                        assert_null(comp.json);
                        assert_null(comp.obj);
                } else {
                        /* The connection survived all of the above */
                        assert_int_equal(comp.error, 0);
                        assert_string_equal(comp.json, answer);
                        assert_true(json_object_is_type(comp.obj, json_type_object));
                }
                fka_completion_done(&comp);
        }

        c = fka_client_free(c);
        close(sv[0]);
        close(sv[1]);
}

/* Requests that are not JSON objects are refused before anything is sent. */
static void test_client_send_refused(void **state) {
        _cleanup_(fka_client_freep) fka_client *c = NULL;
        _cleanup_free_ char *big = NULL;
        int sv[2];

        make_pair(sv);
        assert_int_equal(fka_client_new(sv[0], 4, &c), 0);
        assert_int_equal(fka_client_send(c, "[1]", SIZE_MAX, 0, NULL), -EINVAL);
        assert_int_equal(fka_client_send(c, "{} x", SIZE_MAX, 0, NULL), -EINVAL);
        assert_int_equal(fka_client_send(c, "{\"op\":\"ping\"}", 5, 0, NULL), -EINVAL);
        assert_int_equal(fka_client_send(c, NULL, 0, 0, NULL), -EINVAL);

        big = malloc(FKA_MAX_PAYLOAD + 2);
        assert_non_null(big);
        memset(big, ' ', FKA_MAX_PAYLOAD + 1);
        big[0] = '{';
        big[FKA_MAX_PAYLOAD] = '}';
        big[FKA_MAX_PAYLOAD + 1] = 0;
        assert_int_equal(fka_client_send(c, big, SIZE_MAX, 0, NULL), -EMSGSIZE);
        /* Exactly at the limit is fine */
        big[FKA_MAX_PAYLOAD - 1] = '}';
        big[FKA_MAX_PAYLOAD] = 0;
        assert_true(fka_client_send(c, big, SIZE_MAX, 0, NULL) > 0);
        assert_int_equal(fka_client_in_flight(c), 1);

        c = fka_client_free(c);
        close(sv[0]);
        close(sv[1]);
}

struct big_writer {
        int fd;
        uint32_t id;
        int result;
};

/* Answers with a 1 MiB + 1 payload, then a good answer, both to id. */
static void *peer_oversized(void *arg) {
        struct big_writer *w = arg;
        _cleanup_free_ char *body = NULL;
        uint8_t h[FKA_HDR_SIZE];

        w->result = -ENOMEM;
        body = malloc(FKA_MAX_PAYLOAD + 1);
        if (!body)
                return NULL;
        memset(body, 'x', FKA_MAX_PAYLOAD + 1);
        fka_encode_header(h, FKA_RESPONSE, w->id, FKA_MAX_PAYLOAD + 1);
        w->result = write_all(w->fd, h, sizeof(h));
        if (w->result == 0)
                w->result = write_all(w->fd, body, FKA_MAX_PAYLOAD + 1);
        if (w->result == 0)
                w->result = peer_write(w->fd, FKA_RESPONSE, w->id + 1, "{\"after\":1}");
        return NULL;
}

static void test_client_oversized_response(void **state) {
        _cleanup_(fka_client_freep) fka_client *c = NULL;
        struct big_writer w = {};
        fka_completion comp = {};
        int sv[2], id1, id2;
        pthread_t t;

        make_pair(sv);
        assert_int_equal(fka_client_new(sv[0], 4, &c), 0);
        id1 = fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, 0, NULL);
        id2 = fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, 0, NULL);
        assert_int_equal(id2, id1 + 1);

        w = (struct big_writer) { .fd = sv[1], .id = (uint32_t) id1 };
        assert_int_equal(pthread_create(&t, NULL, peer_oversized, &w), 0);

        assert_int_equal(wait_completion(c, &comp, 10000), 1);
        assert_int_equal(comp.id, (uint32_t) id1);
        assert_int_equal(comp.error, -EMSGSIZE);
        assert_null(comp.json);
        fka_completion_done(&comp);

        assert_int_equal(wait_completion(c, &comp, 10000), 1);
        assert_int_equal(comp.id, (uint32_t) id2);
        assert_int_equal(comp.error, 0);
        assert_string_equal(comp.json, "{\"after\":1}");
        fka_completion_done(&comp);

        assert_int_equal(pthread_join(t, NULL), 0);
        assert_int_equal(w.result, 0);
        c = fka_client_free(c);
        close(sv[0]);
        close(sv[1]);
}

static void test_client_event_and_eof(void **state) {
        _cleanup_(fka_client_freep) fka_client *c = NULL;
        fka_completion comp = {};
        int sv[2], id;

        make_pair(sv);
        assert_int_equal(fka_client_new(sv[0], 4, &c), 0);
        id = fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, 0, (void *) 3);
        assert_true(id > 0);

        assert_int_equal(peer_write(sv[1], FKA_EVENT, 0, "{\"op\":\"identity\",\"generation\":2}"), 0);
        assert_int_equal(wait_completion(c, &comp, 5000), 1);
        assert_int_equal(comp.type, FKA_EVENT);
        assert_int_equal(comp.id, 0);
        assert_int_equal(comp.error, 0);
        assert_null(comp.userdata);
        assert_non_null(comp.obj);
        fka_completion_done(&comp);
        assert_int_equal(fka_client_in_flight(c), 1);

        /* The peer hangs up in the middle of a frame */
        assert_int_equal(write_all(sv[1], "FKA1\x02\x00", 6), 0);
        close(sv[1]);
        assert_int_equal(wait_completion(c, &comp, 5000), 1);
        assert_int_equal(comp.id, (uint32_t) id);
        assert_int_equal(comp.error, -ECONNRESET);
        assert_ptr_equal(comp.userdata, (void *) 3);
        fka_completion_done(&comp);
        assert_int_equal(fka_client_next(c, &comp), -ECONNRESET);
        assert_int_equal(fka_client_send(c, "{}", SIZE_MAX, 0, NULL), -ECONNRESET);

        c = fka_client_free(c);
        close(sv[0]);
}

/* ---- fka_call against a forked peer ---- */

/* Child: answer each request according to its "op"; exit when the host hangs up. */
_Noreturn static void child_agent(int fd) {
        _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;

        if (fka_decoder_new(FKA_GUEST_MAX_PAYLOAD, &d) < 0)
                _exit(2);
        for (;;) {
                fka_frame f = {};
                int r;

                r = peer_read_frame(fd, d, &f);
                if (r == 0)
                        _exit(0);
                if (r != 1 || f.type != FKA_REQUEST)
                        _exit(3);

                if (strstr(f.payload, "\"ping\"")) {
                        /* An event first: fka_call() must skip it */
                        r = peer_write(fd, FKA_EVENT, 0, "{\"note\":1}");
                        if (r >= 0)
                                r = peer_write(fd, FKA_RESPONSE, f.id, "{\"pong\":true,\"pid\":1}");
                } else if (strstr(f.payload, "\"sleep\""))
                        r = 0; /* never answers */
                else
                        r = peer_write(fd, FKA_ERROR, f.id, "{\"error\":\"unknown op\"}");
                fka_frame_done(&f);
                if (r < 0)
                        _exit(4);
        }
}

/* A Linux guest's agent: its tty lost the first ping (drop_first) or not, then it
 * says "ready" and answers every ping after that with the ping's id. */
_Noreturn static void child_ready_agent(int fd, bool drop_first) {
        _cleanup_(fka_decoder_freep) fka_decoder *d = NULL;
        bool first = true;
        char body[64];

        if (fka_decoder_new(FKA_GUEST_MAX_PAYLOAD, &d) < 0)
                _exit(2);
        for (;;) {
                fka_frame f = {};
                int r = peer_read_frame(fd, d, &f);

                if (r == 0)
                        _exit(0);
                if (r != 1 || f.type != FKA_REQUEST || !strstr(f.payload, "\"ping\""))
                        _exit(3);
                r = 0;
                if (first) {
                        r = peer_write(fd, FKA_EVENT, 0, "{\"op\":\"ready\",\"agent\":\"test\"}");
                        first = false;
                        if (drop_first) {
                                fka_frame_done(&f);
                                continue;
                        }
                }
                snprintf(body, sizeof(body), "{\"pong\":true,\"id\":%u}", (unsigned) f.id);
                if (r >= 0)
                        r = peer_write(fd, FKA_RESPONSE, f.id, body);
                fka_frame_done(&f);
                if (r < 0)
                        _exit(4);
        }
}

static void test_wait_ready(void **state) {
        for (int drop_first = 0; drop_first <= 1; drop_first++) {
                uint16_t type = 0;
                int sv[2], status;
                struct pollfd pfd;
                pid_t pid;

                make_pair(sv);
                pid = fork();
                assert_true(pid >= 0);
                if (pid == 0) {
                        close(sv[0]);
                        child_ready_agent(sv[1], drop_first);
                }
                close(sv[1]);

                /* Answered whether or not the first ping was lost; only the answer to
                 * the newest ping counts, so nothing is left in flight afterwards. */
                assert_int_equal(fka_wait_ready(sv[0], 5 * 1000000, &type), 0);
                assert_int_equal(type, FKA_RESPONSE);
                pfd = (struct pollfd) { .fd = sv[0], .events = POLLIN };
                assert_int_equal(poll(&pfd, 1, 100), 0);

                close(sv[0]);
                assert_int_equal(waitpid(pid, &status, 0), pid);
                assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }

        /* A guest that never answers: -ETIMEDOUT, type untouched. */
        {
                uint16_t type = 0;
                int sv[2];

                make_pair(sv);
                assert_int_equal(fka_wait_ready(sv[0], 100 * 1000, &type), -ETIMEDOUT);
                assert_int_equal(type, 0);
                close(sv[0]);
                close(sv[1]);
        }
        assert_int_equal(fka_wait_ready(-1, 1000, NULL), -EBADF);
}

static void test_call_forked_peer(void **state) {
        _cleanup_free_ char *resp = NULL;
        char *untouched = (char *) 0x77;
        uint16_t type = 0;
        uint64_t t0;
        int sv[2], status;
        pid_t pid;

        make_pair(sv);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                close(sv[0]);
                child_agent(sv[1]);
        }
        close(sv[1]);

        assert_int_equal(fka_call(sv[0], "{\"op\":\"ping\"}", 5 * 1000000, &resp, &type), 0);
        assert_int_equal(type, FKA_RESPONSE);
        assert_string_equal(resp, "{\"pong\":true,\"pid\":1}");
        free(resp);
        resp = NULL;

        /* Twice on the same fd: nothing of the first call is left behind */
        assert_int_equal(fka_call(sv[0], "{\"op\":\"ping\"}", 5 * 1000000, NULL, &type), 0);
        assert_int_equal(type, FKA_RESPONSE);

        assert_int_equal(fka_call(sv[0], "{\"op\":\"frobnicate\"}", 5 * 1000000, &resp, &type), 0);
        assert_int_equal(type, FKA_ERROR);
        assert_string_equal(resp, "{\"error\":\"unknown op\"}");

        /* No answer: -ETIMEDOUT after the timeout, outputs untouched */
        type = 0;
        t0 = fka_now_usec();
        assert_int_equal(fka_call(sv[0], "{\"op\":\"sleep\"}", 100 * 1000, &untouched, &type), -ETIMEDOUT);
        assert_true(fka_now_usec() - t0 >= 100 * 1000);
        assert_true(fka_now_usec() - t0 < 5 * 1000000);
        assert_ptr_equal(untouched, (char *) 0x77);
        assert_int_equal(type, 0);

        close(sv[0]);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_header_roundtrip),
                cmocka_unit_test(test_header_hostile),
                cmocka_unit_test(test_frame_build),
                cmocka_unit_test(test_untouched_on_error),
                cmocka_unit_test(test_decoder_one_byte),
                cmocka_unit_test(test_decoder_two_in_one_chunk),
                cmocka_unit_test(test_decoder_split_everywhere),
                cmocka_unit_test(test_decoder_oversized_skipped),
                cmocka_unit_test(test_decoder_huge_len_then_eof),
                cmocka_unit_test(test_decoder_truncated),
                cmocka_unit_test(test_decoder_resync),
                cmocka_unit_test(test_decoder_random),
                cmocka_unit_test(test_client_out_of_order),
                cmocka_unit_test(test_client_timeout),
                cmocka_unit_test(test_client_in_flight_cap),
                cmocka_unit_test(test_client_unknown_id),
                cmocka_unit_test(test_client_hostile_frames),
                cmocka_unit_test(test_client_bad_json),
                cmocka_unit_test(test_client_send_refused),
                cmocka_unit_test(test_client_oversized_response),
                cmocka_unit_test(test_client_event_and_eof),
                cmocka_unit_test(test_call_forked_peer),
                cmocka_unit_test(test_wait_ready),
        };

        /* A peer that hangs up must not kill the test with SIGPIPE */
        signal(SIGPIPE, SIG_IGN);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
