/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* forkd-rest's Idempotency-Key store (src/rest/rest-idem.c) without HTTP: the
 * record file against hostile bytes (every truncation, every byte of a record
 * replaced by each of 256 values, random files; a record parses whole or not
 * at all, never past its buffer: run it under ASan), keys, routes, and the
 * store on a real directory: claim, replay, mismatch, interrupted, damaged,
 * expiry, the record bound, the answer size bound, scope by token. */

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "macro.h"
#include "rest-idem.h"

static const RestIdemRecord *sample(RestIdemState state) {
        static RestIdemRecord r;

        r = (RestIdemRecord) { .created = 1700000000, .state = state };
        for (size_t i = 0; i < sizeof r.request; i++)
                r.request[i] = (uint8_t) (i * 7 + 1);
        if (state != REST_IDEM_PENDING) {
                r.status = 201;
                r.body = "[{\"id\":\"sb-1\"}]\n\0x";
                r.body_len = 18; /* a NUL and a newline inside */
                strcpy(r.content_type, "application/json");
        }
        return &r;
}

static void test_round_trip(void **state) {
        for (RestIdemState st = REST_IDEM_PENDING; st <= REST_IDEM_UNKEPT; st++) {
                const RestIdemRecord *want = sample(st);
                _cleanup_free_ char *buf = NULL;
                RestIdemRecord got;
                size_t len;

                assert_int_equal(rest_idem_record_format(want, &buf, &len), 0);
                assert_true(len <= REST_IDEM_HEADER_MAX + want->body_len);
                assert_int_equal(rest_idem_record_parse(buf, len, false, &got), 0);
                assert_memory_equal(got.request, want->request, sizeof got.request);
                assert_int_equal(got.created, want->created);
                assert_int_equal(got.state, st);
                if (st == REST_IDEM_PENDING)
                        continue;
                assert_int_equal(got.status, 201);
                assert_int_equal(got.body_len, want->body_len);
                if (st == REST_IDEM_ANSWERED) {
                        assert_string_equal(got.content_type, "application/json");
                        assert_memory_equal(got.body, want->body, want->body_len);
                }
        }
}

/* Parse a copy of exactly len bytes, so that ASan sees any read past it. */
static int parse_exact(const char *p, size_t len, bool header_only, RestIdemRecord *ret) {
        char *copy = malloc(len ?: 1);
        int r;

        assert_non_null(copy);
        memcpy(copy, p, len);
        r = rest_idem_record_parse(copy, len, header_only, ret);
        free(copy);
        return r;
}

static void test_hostile(void **state) {
        uint32_t x = 12345;

        for (RestIdemState st = REST_IDEM_PENDING; st <= REST_IDEM_UNKEPT; st++) {
                _cleanup_free_ char *buf = NULL;
                RestIdemRecord got, untouched;
                size_t len;

                assert_int_equal(rest_idem_record_format(sample(st), &buf, &len), 0);
                /* every truncation and every extension: not a record */
                for (size_t n = 0; n < len; n++) {
                        memset(&got, 0x5a, sizeof got);
                        untouched = got;
                        assert_int_equal(parse_exact(buf, n, false, &got), -EBADMSG);
                        assert_memory_equal(&got, &untouched, sizeof got); /* ret untouched on failure */
                        (void) parse_exact(buf, n, true, &got);
                }
                {
                        _cleanup_free_ char *longer = malloc(len + 1);

                        memcpy(longer, buf, len);
                        longer[len] = '\n';
                        assert_int_equal(parse_exact(longer, len + 1, false, &got), -EBADMSG);
                }
                /* every byte replaced by every value: no crash, and a record
                 * that still parses says what its bytes say */
                for (size_t i = 0; i < len; i++)
                        for (unsigned v = 0; v < 256; v++) {
                                char saved = buf[i];

                                buf[i] = (char) v;
                                if (parse_exact(buf, len, false, &got) == 0 && got.state == REST_IDEM_ANSWERED)
                                        assert_true(got.body_len <= len && got.status >= 100 && got.status <= 599);
                                (void) parse_exact(buf, len, true, &got);
                                buf[i] = saved;
                        }
        }
        /* random bytes after a valid magic */
        for (unsigned round = 0; round < 20000; round++) {
                char b[300];
                size_t n = strlen("forkd-rest-idempotency 1\n");
                RestIdemRecord got;

                memcpy(b, "forkd-rest-idempotency 1\n", n);
                for (size_t i = n; i < sizeof b; i++) {
                        x = x * 1103515245u + 12345u;
                        b[i] = (char) (x >> 16) % 8 == 0 ? '\n' : (char) (x >> 20);
                }
                x = x * 1103515245u + 12345u;
                (void) parse_exact(b, n + (x >> 16) % (sizeof b - n), false, &got);
        }
}

static void test_keys_routes(void **state) {
        char k[REST_IDEM_KEY_MAX + 2];

        memset(k, 'a', sizeof k);
        k[REST_IDEM_KEY_MAX] = 0;
        assert_true(rest_idem_key_is_valid(k));
        k[REST_IDEM_KEY_MAX] = 'a';
        k[REST_IDEM_KEY_MAX + 1] = 0;
        assert_false(rest_idem_key_is_valid(k));
        assert_true(rest_idem_key_is_valid("a b ~!"));
        assert_false(rest_idem_key_is_valid(""));
        assert_false(rest_idem_key_is_valid("a\tb"));
        assert_false(rest_idem_key_is_valid("a\x7f"));
        assert_false(rest_idem_key_is_valid("caf\xc3\xa9"));

        assert_true(rest_idem_applies("POST", "/v1/snapshots"));
        assert_true(rest_idem_applies("POST", "/v1/snapshots/unpack"));
        assert_true(rest_idem_applies("POST", "/v1/snapshots/t/compact"));
        assert_true(rest_idem_applies("POST", "/v1/sandboxes"));
        assert_true(rest_idem_applies("POST", "/v1/sandboxes/sb-1/branch"));
        assert_true(rest_idem_applies("POST", "/v1/sandboxes/sb-1/fork"));
        assert_true(rest_idem_applies("POST", "/v1/sandboxes/sb-1/pause"));
        assert_true(rest_idem_applies("POST", "/v1/sandboxes/sb-1/resume"));
        assert_false(rest_idem_applies("GET", "/v1/sandboxes"));
        assert_false(rest_idem_applies("DELETE", "/v1/sandboxes/sb-1"));
        assert_false(rest_idem_applies("POST", "/v1/sandboxes/sb-1/exec"));
        assert_false(rest_idem_applies("POST", "/v1/sandboxes//fork"));
        assert_false(rest_idem_applies("POST", "/v1/sandboxes/a/b/fork"));
        assert_false(rest_idem_applies("POST", "/v1/snapshots/t"));
        assert_false(rest_idem_applies("POST", "/v1/sandboxes/"));
}

static char dir[] = "/tmp/test-rest-idem.XXXXXX";

static void hash_of(const char *s, uint8_t out[SHA256_DIGEST_SIZE]) {
        sha256_ctx c;

        sha256_init(&c);
        rest_idem_hash_field(&c, s, strlen(s));
        sha256_final(&c, out);
}

static unsigned files(void) {
        char cmd[256];
        unsigned n = 0;
        FILE *f;

        snprintf(cmd, sizeof cmd, "ls -A %s | grep -vc '^\\.' || true", dir);
        f = popen(cmd, "r");
        assert_non_null(f);
        assert_int_equal(fscanf(f, "%u", &n), 1);
        pclose(f);
        return n;
}

static void test_store(void **state) {
        _cleanup_(rest_idem_freep) RestIdem *s = NULL, *other = NULL;
        uint8_t a[SHA256_DIGEST_SIZE], b[SHA256_DIGEST_SIZE];
        _cleanup_free_ char *buf = NULL;
        RestIdemEntry *e = NULL, *e2 = NULL;
        RestIdemRecord rec;

        assert_non_null(mkdtemp(dir));
        assert_int_equal(rest_idem_new(NULL, dir, true, "tok", &s), 0);
        hash_of("a", a);
        hash_of("b", b);

        /* a new key, then a retry while it runs, then its answer */
        assert_int_equal(rest_idem_begin(s, "k1", a, &e, &rec, &buf), REST_IDEM_LOOKUP_NEW);
        assert_int_equal(files(), 1);
        assert_int_equal(rest_idem_begin(s, "k1", a, &e2, &rec, &buf), REST_IDEM_LOOKUP_WAIT);
        assert_ptr_equal(e, e2);
        assert_int_equal(rest_idem_begin(s, "k1", b, &e2, &rec, &buf), REST_IDEM_LOOKUP_MISMATCH);
        assert_int_equal(rest_idem_finish(s, e, 201, "application/json", "{}", 2), 0);
        assert_int_equal(rest_idem_begin(s, "k1", a, &e, &rec, &buf), REST_IDEM_LOOKUP_REPLAY);
        assert_non_null(buf);
        assert_int_equal(rec.status, 201);
        assert_int_equal(rec.body_len, 2);
        assert_memory_equal(rec.body, "{}", 2);
        free(TAKE_PTR(buf));
        assert_int_equal(rest_idem_begin(s, "k1", b, &e, &rec, &buf), REST_IDEM_LOOKUP_MISMATCH);

        /* another token: another record */
        assert_int_equal(rest_idem_new(NULL, dir, false, "other", &other), 0);
        assert_int_equal(rest_idem_begin(other, "k1", b, &e, &rec, &buf), REST_IDEM_LOOKUP_NEW);
        rest_idem_abandon(other, e, true); /* nothing done: gone */
        assert_int_equal(files(), 1);

        /* a pending record without its request: interrupted, also for a new store */
        assert_int_equal(rest_idem_begin(s, "k2", a, &e, &rec, &buf), REST_IDEM_LOOKUP_NEW);
        rest_idem_abandon(s, e, false);
        assert_int_equal(rest_idem_begin(s, "k2", a, &e, &rec, &buf), REST_IDEM_LOOKUP_INTERRUPTED);
        s = rest_idem_free(s);
        assert_int_equal(rest_idem_new(NULL, dir, false, "tok", &s), 0);
        assert_int_equal(rest_idem_records(s), 2);
        assert_int_equal(rest_idem_begin(s, "k2", a, &e, &rec, &buf), REST_IDEM_LOOKUP_INTERRUPTED);
        assert_int_equal(rest_idem_begin(s, "k2", b, &e, &rec, &buf), REST_IDEM_LOOKUP_MISMATCH);

        /* too large to keep: its status only */
        {
                _cleanup_free_ char *big = calloc(1, REST_IDEM_BODY_MAX + 1);

                assert_int_equal(rest_idem_begin(s, "k3", a, &e, &rec, &buf), REST_IDEM_LOOKUP_NEW);
                assert_int_equal(rest_idem_finish(s, e, 201, "application/json", big, REST_IDEM_BODY_MAX + 1), 0);
                assert_int_equal(rest_idem_begin(s, "k3", a, &e, &rec, &buf), REST_IDEM_LOOKUP_UNKEPT);
                assert_int_equal(rec.status, 201);
                assert_int_equal(rec.body_len, REST_IDEM_BODY_MAX + 1);
                /* the largest body that is kept */
                assert_int_equal(rest_idem_begin(s, "k4", a, &e, &rec, &buf), REST_IDEM_LOOKUP_NEW);
                assert_int_equal(rest_idem_finish(s, e, 200, "", big, REST_IDEM_BODY_MAX), 0);
                assert_int_equal(rest_idem_begin(s, "k4", a, &e, &rec, &buf), REST_IDEM_LOOKUP_REPLAY);
                assert_int_equal(rec.body_len, REST_IDEM_BODY_MAX);
                assert_string_equal(rec.content_type, "");
                free(TAKE_PTR(buf));
        }

        /* the bound on records */
        rest_idem_set_limits(s, rest_idem_records(s), REST_IDEM_BYTES_MAX);
        assert_int_equal(rest_idem_begin(s, "k5", a, &e, &rec, &buf), -ENOBUFS);
        rest_idem_set_limits(s, REST_IDEM_RECORDS_MAX, REST_IDEM_BYTES_MAX);

        /* damaged: every truncation of a kept record is an error, not a crash */
        {
                char name[SHA256_HEX_SIZE + 1], path[512], cmd[600];
                FILE *f;

                assert_int_equal(rest_idem_begin(s, "k6", a, &e, &rec, &buf), REST_IDEM_LOOKUP_NEW);
                assert_int_equal(rest_idem_finish(s, e, 201, "application/json", "[1,2,3]", 7), 0);
                snprintf(cmd, sizeof cmd, "grep -l '^\\[1,2,3\\]$' %s/* | xargs -n1 basename", dir);
                f = popen(cmd, "r");
                assert_non_null(f);
                assert_non_null(fgets(name, sizeof name, f));
                pclose(f);
                name[strcspn(name, "\n")] = 0;
                assert_int_equal(strlen(name), 2 * SHA256_DIGEST_SIZE);
                snprintf(path, sizeof path, "%s/%s", dir, name);
                for (off_t n = 0; n < 150; n += 7) {
                        assert_int_equal(truncate(path, n), 0);
                        assert_int_equal(rest_idem_begin(s, "k6", a, &e, &rec, &buf), REST_IDEM_LOOKUP_DAMAGED);
                }
                /* an old damaged record expires by its modification time */
                {
                        struct timespec ts[2] = { { .tv_sec = time(NULL) - REST_IDEM_TTL_SECS - 10 },
                                                  { .tv_sec = time(NULL) - REST_IDEM_TTL_SECS - 10 } };

                        assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
                }
                assert_int_equal(rest_idem_begin(s, "k6", a, &e, &rec, &buf), REST_IDEM_LOOKUP_NEW);
                rest_idem_abandon(s, e, true);
        }

        /* expiry: a record written a day ago goes at the sweep */
        {
                unsigned before = rest_idem_records(s);
                RestIdemRecord old = *sample(REST_IDEM_PENDING);
                _cleanup_free_ char *data = NULL;
                char path[512];
                size_t len;
                int fd;

                old.created = (uint64_t) time(NULL) - REST_IDEM_TTL_SECS;
                assert_int_equal(rest_idem_record_format(&old, &data, &len), 0);
                snprintf(path, sizeof path, "%s/%064d", dir, 0);
                fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
                assert_true(fd >= 0);
                assert_int_equal(write(fd, data, len), (ssize_t) len);
                close(fd);
                snprintf(path, sizeof path, "%s/.tmp-leftover", dir);
                fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
                assert_true(fd >= 0);
                close(fd);
                assert_int_equal(rest_idem_sweep(s), 0);
                assert_int_equal(rest_idem_records(s), before);
                assert_int_equal(access(path, F_OK), -1);
        }

        {
                char cmd[300];

                snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
                assert_int_equal(system(cmd), 0);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_round_trip),
                cmocka_unit_test(test_hostile),
                cmocka_unit_test(test_keys_routes),
                cmocka_unit_test(test_store),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
