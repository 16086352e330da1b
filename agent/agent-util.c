/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <json-c/json.h>
#include <time.h>

#include "agent.h"
#include "macro.h"

/* Length of the valid UTF-8 sequence at s[0..n), 0 if invalid (NUL counts as invalid). */
static size_t utf8_seq(const uint8_t *s, size_t n) {
        uint8_t c = s[0];
        uint32_t cp, min;
        size_t k;

        if (c == 0)
                return 0;
        if (c < 0x80)
                return 1;
        if ((c & 0xe0) == 0xc0)
                k = 2, cp = c & 0x1f, min = 0x80;
        else if ((c & 0xf0) == 0xe0)
                k = 3, cp = c & 0x0f, min = 0x800;
        else if ((c & 0xf8) == 0xf0)
                k = 4, cp = c & 0x07, min = 0x10000;
        else
                return 0;
        if (n < k)
                return 0;
        for (size_t i = 1; i < k; i++) {
                if ((s[i] & 0xc0) != 0x80)
                        return 0;
                cp = (cp << 6) | (s[i] & 0x3f);
        }
        if (cp < min || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
                return 0;
        return k;
}

struct json_object *json_string_sanitized(const char *s, size_t n) {
        _cleanup_free_ char *buf = NULL;
        const uint8_t *p = (const uint8_t *) s;
        size_t i = 0, o = 0;
        struct json_object *v;

        if (n > SIZE_MAX / 3 - 1)
                return NULL;
        buf = malloc(n * 3 + 1); /* each bad byte becomes 3 bytes */
        if (!buf)
                return NULL;

        while (i < n) {
                size_t k = utf8_seq(p + i, n - i);

                if (k == 0) {
                        buf[o++] = (char) 0xef; /* U+FFFD */
                        buf[o++] = (char) 0xbf;
                        buf[o++] = (char) 0xbd;
                        i++;
                } else {
                        memcpy(buf + o, p + i, k);
                        o += k;
                        i += k;
                }
        }
        buf[o] = 0;

        v = json_object_new_string_len(buf, (int) MIN(o, (size_t) INT32_MAX));
        return v;
}

size_t utf8_prefix(const char *s, size_t n) {
        size_t i = n;

        /* step back over at most 3 continuation bytes to a lead byte */
        while (i > 0 && n - i < 4 && ((uint8_t) s[i - 1] & 0xc0) == 0x80)
                i--;
        if (i == 0)
                return 0;
        if (utf8_seq((const uint8_t *) s + i - 1, n - i + 1) == n - i + 1)
                return n; /* the last sequence is complete */
        return i - 1;
}

const char *json_plain(struct json_object *o, size_t *ret_len) {
        return json_object_to_json_string_length(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE,
                                                  ret_len);
}
