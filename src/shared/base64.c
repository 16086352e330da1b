/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>

#include "base64.h"

static const char alphabet[64] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The value of an alphabet character, or -1. */
static int value(char c) {
        if (c >= 'A' && c <= 'Z')
                return c - 'A';
        if (c >= 'a' && c <= 'z')
                return c - 'a' + 26;
        if (c >= '0' && c <= '9')
                return c - '0' + 52;
        if (c == '+')
                return 62;
        if (c == '/')
                return 63;
        return -1;
}

size_t base64_encode(const void *src, size_t n, char *dst) {
        const uint8_t *p = src;
        size_t o = 0, i = 0;

        for (; n - i >= 3; i += 3) {
                uint32_t v = (uint32_t) p[i] << 16 | (uint32_t) p[i + 1] << 8 | p[i + 2];

                dst[o++] = alphabet[v >> 18];
                dst[o++] = alphabet[(v >> 12) & 63];
                dst[o++] = alphabet[(v >> 6) & 63];
                dst[o++] = alphabet[v & 63];
        }
        if (n - i == 1) {
                uint32_t v = (uint32_t) p[i] << 16;

                dst[o++] = alphabet[v >> 18];
                dst[o++] = alphabet[(v >> 12) & 63];
                dst[o++] = '=';
                dst[o++] = '=';
        } else if (n - i == 2) {
                uint32_t v = (uint32_t) p[i] << 16 | (uint32_t) p[i + 1] << 8;

                dst[o++] = alphabet[v >> 18];
                dst[o++] = alphabet[(v >> 12) & 63];
                dst[o++] = alphabet[(v >> 6) & 63];
                dst[o++] = '=';
        }
        return o;
}

int base64_decoded_size(const char *s, size_t n, size_t *ret_len) {
        size_t pad = 0;

        if (n % 4 != 0)
                return -EINVAL;
        if (n > 0 && s[n - 1] == '=')
                pad = n > 1 && s[n - 2] == '=' ? 2 : 1;
        for (size_t i = 0; i < n - pad; i++)
                if (value(s[i]) < 0)
                        return -EINVAL;
        /* the bits that the padding cuts off must be zero */
        if (pad == 2 && (value(s[n - 3]) & 15) != 0)
                return -EINVAL;
        if (pad == 1 && (value(s[n - 2]) & 3) != 0)
                return -EINVAL;
        *ret_len = n / 4 * 3 - pad;
        return 0;
}

int base64_decode(const char *s, size_t n, void *dst, size_t cap, size_t *ret_len) {
        uint8_t *out = dst;
        size_t len, o = 0;
        int r;

        r = base64_decoded_size(s, n, &len);
        if (r < 0)
                return r;
        if (len > cap)
                return -EFBIG;
        for (size_t i = 0; i < n; i += 4) {
                uint32_t v = (uint32_t) value(s[i]) << 18 | (uint32_t) value(s[i + 1]) << 12;

                out[o++] = (uint8_t) (v >> 16);
                if (s[i + 2] == '=')
                        break;
                v |= (uint32_t) value(s[i + 2]) << 6;
                out[o++] = (uint8_t) (v >> 8);
                if (s[i + 3] == '=')
                        break;
                v |= (uint32_t) value(s[i + 3]);
                out[o++] = (uint8_t) v;
        }
        *ret_len = o;
        return 0;
}
