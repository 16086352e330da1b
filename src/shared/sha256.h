/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* SHA-256 (FIPS 180-4) in plain C: no libc beyond <stddef.h> and <stdint.h>,
 * no floating point, so that the freestanding test guest builds it too, and
 * forkd-agent hashes files without libcrypto in the guest image. The host
 * uses OpenSSL; tests/unit/test-sha256.c checks this one against it. */

#include <stddef.h>
#include <stdint.h>

#define SHA256_DIGEST_SIZE 32
#define SHA256_HEX_SIZE (2 * SHA256_DIGEST_SIZE + 1) /* with the NUL */

typedef struct sha256_ctx {
        uint32_t h[8];
        uint64_t bytes;      /* message length so far */
        uint8_t buf[64];
        uint32_t n_buf;      /* bytes in buf */
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t n);
void sha256_final(sha256_ctx *c, uint8_t out[SHA256_DIGEST_SIZE]);

/* 64 lowercase hex digits and a NUL. */
void sha256_hex(const uint8_t digest[SHA256_DIGEST_SIZE], char out[SHA256_HEX_SIZE]);
