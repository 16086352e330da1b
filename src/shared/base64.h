/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Base64 (RFC 4648, section 4: the standard alphabet, '=' padding), strict:
 * the file ops of the agent protocol carry file contents this way (file-ops.h).
 *
 * Plain C without libc calls, so that the freestanding test guest compiles it
 * too (tests/guest/meson.build), as it does sha256.c.
 */

#include <stddef.h>
#include <stdint.h>

/* Characters that base64_encode() writes for n bytes (no NUL). */
#define BASE64_ENCODED_SIZE(n) (((n) + 2) / 3 * 4)

/* Write the encoding of src[0..n) to dst, exactly BASE64_ENCODED_SIZE(n)
 * characters and no NUL; returns that count. */
size_t base64_encode(const void *src, size_t n, char *dst);

/* Decode s[0..n) into dst[0..cap). Only the canonical encoding is accepted:
 * the standard alphabet, a length that is a multiple of 4, '=' only as one
 * or two final characters, and zero bits where the padding cuts the last
 * group (so that every input decodes to one byte string, which encodes back
 * to the same characters). No whitespace, no line breaks.
 * One pass: returns 0 and *ret_len; -EINVAL (not canonical base64: dst may
 * hold the part before the bad character) or -EFBIG (more than cap bytes, by
 * the length alone; dst untouched). */
int base64_decode(const char *s, size_t n, void *dst, size_t cap, size_t *ret_len);

/* Bytes that s[0..n) decodes to, if it is canonical base64; else -EINVAL. */
int base64_decoded_size(const char *s, size_t n, size_t *ret_len);

/* Bytes that s[0..n) decodes to if it is base64, by its length and padding
 * alone (-EINVAL when those are wrong): to size dst for base64_decode(),
 * which checks the rest as it decodes. */
int base64_decoded_length(const char *s, size_t n, size_t *ret_len);
