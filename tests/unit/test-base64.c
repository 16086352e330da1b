/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* src/shared/base64.c (built into forkd-agent, forkd, forkd-rest and the
 * test guest): RFC 4648's examples, OpenSSL's EVP_EncodeBlock on every length
 * around the group boundaries, and the strict decoder refusing what is not
 * the canonical encoding (these before a byte of output is written). */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "base64.h"

static void check_pair(const char *plain, const char *enc) {
        char buf[64];
        uint8_t out[64];
        size_t n = strlen(plain), len = 99;

        assert_int_equal(BASE64_ENCODED_SIZE(n), strlen(enc));
        assert_int_equal(base64_encode(plain, n, buf), strlen(enc));
        assert_memory_equal(buf, enc, strlen(enc));
        assert_int_equal(base64_decode(enc, strlen(enc), out, sizeof out, &len), 0);
        assert_int_equal(len, n);
        assert_memory_equal(out, plain, n);
        assert_int_equal(base64_decoded_size(enc, strlen(enc), &len), 0);
        assert_int_equal(len, n);
}

static void test_rfc4648(void **state) {
        (void) state;
        check_pair("", "");
        check_pair("f", "Zg==");
        check_pair("fo", "Zm8=");
        check_pair("foo", "Zm9v");
        check_pair("foob", "Zm9vYg==");
        check_pair("fooba", "Zm9vYmE=");
        check_pair("foobar", "Zm9vYmFy");
}

static void test_against_openssl(void **state) {
        static uint8_t data[4100], back[4100];
        static char ours[5600], theirs[5600];
        uint32_t x = 0x9e3779b9;

        (void) state;
        for (size_t i = 0; i < sizeof data; i++) {
                x = x * 1103515245u + 12345u;
                data[i] = (uint8_t) (x >> 16);
        }
        for (size_t n = 0; n < sizeof data; n += n < 70 ? 1 : 97) {
                size_t k = base64_encode(data, n, ours), len = 0;
                int m = EVP_EncodeBlock((unsigned char *) theirs, data, (int) n);

                assert_int_equal(k, (size_t) m);
                assert_memory_equal(ours, theirs, k);
                assert_int_equal(base64_decode(ours, k, back, sizeof back, &len), 0);
                assert_int_equal(len, n);
                assert_memory_equal(back, data, n);
        }
}

static void test_refused(void **state) {
        static const char *const bad[] = {
                "Zg=",      /* length not a multiple of 4 */
                "Zg",       /* unpadded */
                "Zg==Zg==", /* padding in the middle */
                "Zh==",     /* non-zero bits cut by the padding */
                "Zm9=",     /* likewise, one '=' */
                "Z===",     /* three '=' */
                "====",
                "Zm9v\n",   /* whitespace */
                "Zm 9v",
                "Zm-v",     /* the URL-safe alphabet */
                "Zm_v",
                "Zm9v=",
                "=Zm9",
        };
        uint8_t out[16];
        size_t len = 77;

        (void) state;
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                memset(out, 0xa5, sizeof out);
                assert_int_equal(base64_decode(bad[i], strlen(bad[i]), out, sizeof out, &len), -EINVAL);
                assert_int_equal(len, 77);
                for (size_t k = 0; k < sizeof out; k++)
                        assert_int_equal(out[k], 0xa5);
        }
        /* a NUL inside is not base64 either */
        assert_int_equal(base64_decode("Zm\0v", 4, out, sizeof out, &len), -EINVAL);
}

static void test_cap(void **state) {
        uint8_t out[4];
        size_t len = 77;

        (void) state;
        memset(out, 0xa5, sizeof out);
        /* 6 bytes into 4: refused before anything is written */
        assert_int_equal(base64_decode("Zm9vYmFy", 8, out, 4, &len), -EFBIG);
        assert_int_equal(len, 77);
        assert_int_equal(out[0], 0xa5);
        /* exactly the cap fits */
        assert_int_equal(base64_decode("Zm9vYg==", 8, out, 4, &len), 0);
        assert_int_equal(len, 4);
        assert_memory_equal(out, "foob", 4);
        /* invalid and too long: the length is checked first, before a byte is decoded */
        assert_int_equal(base64_decode("Zm9vYmF!", 8, out, 4, &len), -EFBIG);
        assert_int_equal(base64_decode("Zm9!", 4, out, 4, &len), -EINVAL);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_rfc4648),
                cmocka_unit_test(test_against_openssl),
                cmocka_unit_test(test_refused),
                cmocka_unit_test(test_cap),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
