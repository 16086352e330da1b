/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* src/shared/sha256.c (built into forkd-agent and the test guest, which have
 * no libcrypto) against FIPS 180-4's examples and against OpenSSL on inputs
 * of every length around the block and padding boundaries, fed whole and in
 * pieces. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "sha256.h"

static void ours_hex(const void *data, size_t n, char out[SHA256_HEX_SIZE]) {
        uint8_t d[SHA256_DIGEST_SIZE];
        sha256_ctx c;

        sha256_init(&c);
        sha256_update(&c, data, n);
        sha256_final(&c, d);
        sha256_hex(d, out);
}

static void openssl_hex(const void *data, size_t n, char out[SHA256_HEX_SIZE]) {
        uint8_t d[EVP_MAX_MD_SIZE];
        unsigned len = 0;

        assert_int_equal(EVP_Digest(data, n, d, &len, EVP_sha256(), NULL), 1);
        assert_int_equal(len, SHA256_DIGEST_SIZE);
        sha256_hex(d, out);
}

static void test_fips_examples(void **state) {
        char h[SHA256_HEX_SIZE];

        (void) state;
        ours_hex("", 0, h);
        assert_string_equal(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        ours_hex("abc", 3, h);
        assert_string_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        ours_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56, h);
        assert_string_equal(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

static void test_against_openssl(void **state) {
        static uint8_t buf[4096 + 130];
        char a[SHA256_HEX_SIZE], b[SHA256_HEX_SIZE];
        uint32_t x = 0x12345678;

        (void) state;
        for (size_t i = 0; i < sizeof buf; i++) {
                x = x * 1103515245u + 12345u;
                buf[i] = (uint8_t) (x >> 16);
        }
        for (size_t n = 0; n < sizeof buf; n += n < 200 ? 1 : 61) {
                ours_hex(buf, n, a);
                openssl_hex(buf, n, b);
                assert_string_equal(a, b);
        }
}

static void test_pieces(void **state) {
        static uint8_t buf[1000];
        char a[SHA256_HEX_SIZE], b[SHA256_HEX_SIZE];

        (void) state;
        for (size_t i = 0; i < sizeof buf; i++)
                buf[i] = (uint8_t) (i * 7 + 3);
        openssl_hex(buf, sizeof buf, b);
        for (size_t step = 1; step <= 130; step++) {
                uint8_t d[SHA256_DIGEST_SIZE];
                sha256_ctx c;

                sha256_init(&c);
                for (size_t off = 0; off < sizeof buf; off += step)
                        sha256_update(&c, buf + off, off + step > sizeof buf ? sizeof buf - off : step);
                sha256_final(&c, d);
                sha256_hex(d, a);
                assert_string_equal(a, b);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fips_examples),
                cmocka_unit_test(test_against_openssl),
                cmocka_unit_test(test_pieces),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
