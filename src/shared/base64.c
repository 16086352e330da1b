/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>

#include "base64.h"

static const char alphabet[64] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* 1 + the value of each alphabet character; 0 for every other byte. */
static const uint8_t decode_table[256] = {
        ['A'] = 1, ['B'] = 2, ['C'] = 3, ['D'] = 4, ['E'] = 5, ['F'] = 6, ['G'] = 7, ['H'] = 8, ['I'] = 9,
        ['J'] = 10, ['K'] = 11, ['L'] = 12, ['M'] = 13, ['N'] = 14, ['O'] = 15, ['P'] = 16, ['Q'] = 17,
        ['R'] = 18, ['S'] = 19, ['T'] = 20, ['U'] = 21, ['V'] = 22, ['W'] = 23, ['X'] = 24, ['Y'] = 25,
        ['Z'] = 26, ['a'] = 27, ['b'] = 28, ['c'] = 29, ['d'] = 30, ['e'] = 31, ['f'] = 32, ['g'] = 33,
        ['h'] = 34, ['i'] = 35, ['j'] = 36, ['k'] = 37, ['l'] = 38, ['m'] = 39, ['n'] = 40, ['o'] = 41,
        ['p'] = 42, ['q'] = 43, ['r'] = 44, ['s'] = 45, ['t'] = 46, ['u'] = 47, ['v'] = 48, ['w'] = 49,
        ['x'] = 50, ['y'] = 51, ['z'] = 52, ['0'] = 53, ['1'] = 54, ['2'] = 55, ['3'] = 56, ['4'] = 57,
        ['5'] = 58, ['6'] = 59, ['7'] = 60, ['8'] = 61, ['9'] = 62, ['+'] = 63, ['/'] = 64,
};

/* The value of an alphabet character, or -1. */
static int value(char c) {
        return (int) decode_table[(uint8_t) c] - 1;
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

int base64_decoded_length(const char *s, size_t n, size_t *ret_len) {
        size_t pad = 0;

        if (n % 4 != 0)
                return -EINVAL;
        if (n > 0 && s[n - 1] == '=')
                pad = s[n - 2] == '=' ? 2 : 1;
        *ret_len = n / 4 * 3 - pad;
        return 0;
}

int base64_decode(const char *s, size_t n, void *dst, size_t cap, size_t *ret_len) {
        const uint8_t *in = (const uint8_t *) s;
        uint8_t *out = dst;
        size_t len, full, o = 0;
        uint32_t a, b, c, d;

        if (base64_decoded_length(s, n, &len) < 0)
                return -EINVAL;
        if (len > cap)
                return -EFBIG;
        /* the groups without padding: four table entries each, none 0 (not in the alphabet) */
        full = len % 3 ? n - 4 : n;
        for (size_t i = 0; i < full; i += 4) {
                a = decode_table[in[i]];
                b = decode_table[in[i + 1]];
                c = decode_table[in[i + 2]];
                d = decode_table[in[i + 3]];
                if (!a || !b || !c || !d)
                        return -EINVAL;
                a = (a - 1) << 18 | (b - 1) << 12 | (c - 1) << 6 | (d - 1);
                out[o++] = (uint8_t) (a >> 16);
                out[o++] = (uint8_t) (a >> 8);
                out[o++] = (uint8_t) a;
        }
        if (full < n) {
                /* "xx==" or "xxx=": the bits the padding cuts off must be zero */
                a = decode_table[in[full]];
                b = decode_table[in[full + 1]];
                c = len % 3 == 2 ? decode_table[in[full + 2]] : 1;
                if (!a || !b || !c || (len % 3 == 1 && ((b - 1) & 15)) || (len % 3 == 2 && ((c - 1) & 3)))
                        return -EINVAL;
                a = (a - 1) << 18 | (b - 1) << 12 | (c - 1) << 6;
                out[o++] = (uint8_t) (a >> 16);
                if (len % 3 == 2)
                        out[o++] = (uint8_t) (a >> 8);
        }
        *ret_len = o;
        return 0;
}
