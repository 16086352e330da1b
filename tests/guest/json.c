/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd-test-guest: a minimal JSON reader and writer.
 *
 * The reader validates one top-level object completely (strings, escapes,
 * numbers, literals, nested containers up to 64 deep) without recursion, and
 * records the value spans of the keys the caller asks for. Every index is
 * checked against the input length, and every step consumes at least one
 * byte or fails, so any input terminates.
 */
#include "guest.h"

#define JSON_MAX_DEPTH 64

static int is_ws(u8 c)
{
        return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static u32 skip_ws(const u8 *s, u32 n, u32 i)
{
        while (i < n && is_ws(s[i]))
                i++;
        return i;
}

static int is_hex(u8 c)
{
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* s[*i] == '"'; on success *i is just past the closing quote */
static int scan_string(const u8 *s, u32 n, u32 *i)
{
        u32 k = *i + 1;

        while (k < n) {
                u8 c = s[k];

                if (c == '"') {
                        *i = k + 1;
                        return 0;
                }
                if (c < 0x20)
                        return -1;
                if (c == '\\') {
                        if (k + 1 >= n)
                                return -1;
                        c = s[k + 1];
                        if (c == 'u') {
                                if (k + 6 > n)
                                        return -1;
                                for (u32 j = k + 2; j < k + 6; j++)
                                        if (!is_hex(s[j]))
                                                return -1;
                                k += 6;
                                continue;
                        }
                        if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' &&
                            c != 'n' && c != 'r' && c != 't')
                                return -1;
                        k += 2;
                        continue;
                }
                k++;
        }
        return -1;
}

static int is_digit(u8 c)
{
        return c >= '0' && c <= '9';
}

static int scan_number(const u8 *s, u32 n, u32 *i)
{
        u32 k = *i;

        if (k < n && s[k] == '-')
                k++;
        if (k >= n || !is_digit(s[k]))
                return -1;
        if (s[k] == '0')
                k++;
        else
                while (k < n && is_digit(s[k]))
                        k++;
        if (k < n && s[k] == '.') {
                k++;
                if (k >= n || !is_digit(s[k]))
                        return -1;
                while (k < n && is_digit(s[k]))
                        k++;
        }
        if (k < n && (s[k] == 'e' || s[k] == 'E')) {
                k++;
                if (k < n && (s[k] == '+' || s[k] == '-'))
                        k++;
                if (k >= n || !is_digit(s[k]))
                        return -1;
                while (k < n && is_digit(s[k]))
                        k++;
        }
        *i = k;
        return 0;
}

static int scan_literal(const u8 *s, u32 n, u32 *i, const char *lit)
{
        u32 l = (u32)strlen(lit);

        if (n - *i < l || memcmp(s + *i, lit, l) != 0)
                return -1;
        *i += l;
        return 0;
}

/* one scalar at s[*i]; returns its J_ type or -1 */
static int scan_scalar(const u8 *s, u32 n, u32 *i)
{
        switch (s[*i]) {
        case '"':
                return scan_string(s, n, i) < 0 ? -1 : J_STR;
        case 't':
                return scan_literal(s, n, i, "true") < 0 ? -1 : J_TRUE;
        case 'f':
                return scan_literal(s, n, i, "false") < 0 ? -1 : J_FALSE;
        case 'n':
                return scan_literal(s, n, i, "null") < 0 ? -1 : J_NULL;
        default:
                return scan_number(s, n, i) < 0 ? -1 : J_NUM;
        }
}

/*
 * Scan one value starting at s[*i] (no leading whitespace). Containers are
 * walked iteratively; `kinds` is a bit stack (1 = object, 0 = array).
 * Returns the J_ type of the value or -1.
 */
static int scan_value(const u8 *s, u32 n, u32 *i)
{
        u64 kinds = 0;
        u32 depth = 0;
        u32 k = *i;
        int top_type = J_NONE;

        for (;;) {
                /* here a value is expected at s[k] */
                k = skip_ws(s, n, k);
                if (k >= n)
                        return -1;
                if (s[k] == '{' || s[k] == '[') {
                        int obj = s[k] == '{';

                        if (depth == 0)
                                top_type = obj ? J_OBJ : J_ARR;
                        if (depth >= JSON_MAX_DEPTH)
                                return -1;
                        kinds = (kinds << 1) | (u64)obj;
                        depth++;
                        k = skip_ws(s, n, k + 1);
                        if (k >= n)
                                return -1;
                        if (s[k] == (obj ? '}' : ']')) {
                                k++;
                                depth--;
                                kinds >>= 1;
                                goto after_value;
                        }
                        if (obj)
                                goto member_key;
                        continue;
                }
                {
                        int t = scan_scalar(s, n, &k);

                        if (t < 0)
                                return -1;
                        if (depth == 0)
                                top_type = t;
                }
after_value:
                if (depth == 0) {
                        *i = k;
                        return top_type;
                }
                k = skip_ws(s, n, k);
                if (k >= n)
                        return -1;
                if (s[k] == ',') {
                        k++;
                        if (kinds & 1)
                                goto member_key;
                        continue;
                }
                if (s[k] == ((kinds & 1) ? '}' : ']')) {
                        k++;
                        depth--;
                        kinds >>= 1;
                        goto after_value;
                }
                return -1;
member_key:
                k = skip_ws(s, n, k);
                if (k >= n || s[k] != '"' || scan_string(s, n, &k) < 0)
                        return -1;
                k = skip_ws(s, n, k);
                if (k >= n || s[k] != ':')
                        return -1;
                k++;
        }
}

static int fields(const u8 *s, u32 n, struct jfield *f, u32 nf, struct jfield *unknown)
{
        u32 i;

        for (u32 j = 0; j < nf; j++)
                f[j].type = J_NONE;
        if (unknown)
                unknown->type = J_NONE;
        i = skip_ws(s, n, 0);
        if (i >= n || s[i] != '{')
                return -1;
        i = skip_ws(s, n, i + 1);
        if (i < n && s[i] == '}') {
                i++;
                goto end;
        }
        for (;;) {
                u32 kstart, kend, vstart;
                int t;

                if (i >= n || s[i] != '"')
                        return -1;
                kstart = i + 1;
                if (scan_string(s, n, &i) < 0)
                        return -1;
                kend = i - 1;
                i = skip_ws(s, n, i);
                if (i >= n || s[i] != ':')
                        return -1;
                i = skip_ws(s, n, i + 1);
                if (i >= n)
                        return -1;
                vstart = i;
                t = scan_value(s, n, &i);
                if (t < 0)
                        return -1;
                u32 known = 0;

                for (u32 j = 0; j < nf; j++) {
                        u32 kl = (u32)strlen(f[j].key);

                        if (kend - kstart == kl && memcmp(s + kstart, f[j].key, kl) == 0) {
                                known = 1;
                                if (f[j].type == J_NONE) {
                                        f[j].type = (u32)t;
                                        f[j].off = vstart;
                                        f[j].len = i - vstart;
                                }
                        }
                }
                if (!known && unknown && unknown->type == J_NONE) {
                        unknown->type = J_STR;
                        unknown->off = kstart;
                        unknown->len = kend - kstart;
                }
                i = skip_ws(s, n, i);
                if (i >= n)
                        return -1;
                if (s[i] == '}') {
                        i++;
                        break;
                }
                if (s[i] != ',')
                        return -1;
                i = skip_ws(s, n, i + 1);
        }
end:
        i = skip_ws(s, n, i);
        return i == n ? 0 : -1;
}

/*
 * Parse s[0..n) as exactly one JSON object. For each wanted field, record the
 * first occurrence of its key at the top level. Returns 0, or -1 if the input
 * is not a single well-formed JSON object.
 */
int json_fields(const u8 *s, u32 n, struct jfield *f, u32 nf)
{
        return fields(s, n, f, nf, NULL);
}

/* The same; *unknown (type J_STR, the key's span without its quotes) is the
 * first top-level key that is none of f's, or J_NONE. */
int json_fields_strict(const u8 *s, u32 n, struct jfield *f, u32 nf, struct jfield *unknown)
{
        return fields(s, n, f, nf, unknown);
}

/* The next element of the array arr (validated already, as json_fields() does):
 * 1 and its span in *e, 0 at the end, -1 if malformed. *pos starts at 0. */
int json_array_next(const u8 *s, const struct jfield *arr, u32 *pos, struct jfield *e)
{
        u32 end = arr->off + arr->len - 1; /* the ']' */
        u32 i = *pos ? *pos : arr->off + 1;
        int t;

        if (arr->type != J_ARR || arr->len < 2)
                return -1;
        i = skip_ws(s, end, i);
        if (i < end && s[i] == ',')
                i = skip_ws(s, end, i + 1);
        if (i >= end)
                return 0;
        e->off = i;
        t = scan_value(s, end, &i);
        if (t < 0)
                return -1;
        e->type = (u32)t;
        e->len = i - e->off;
        *pos = i;
        return 1;
}

/* a non-negative integer without fraction or exponent, fitting in 64 bits */
int json_u64(const u8 *s, const struct jfield *f, u64 *out)
{
        u64 v = 0;

        if (f->type != J_NUM || f->len == 0)
                return -1;
        for (u32 k = 0; k < f->len; k++) {
                u8 c = s[f->off + k];

                if (!is_digit(c))
                        return -1;
                if (v > (~0ull - (u64)(c - '0')) / 10)
                        return -1;
                v = v * 10 + (u64)(c - '0');
        }
        *out = v;
        return 0;
}

/* the string value equals lit (compared raw, without unescaping) */
int json_str_eq(const u8 *s, const struct jfield *f, const char *lit)
{
        u32 l = (u32)strlen(lit);

        return f->type == J_STR && f->len == l + 2 && memcmp(s + f->off + 1, lit, l) == 0;
}

/* ---- writer ---- */

void out_raw(struct out *o, const void *p, u32 n)
{
        if (o->overflow || n > o->cap - o->len) {
                o->overflow = 1;
                return;
        }
        memcpy(o->buf + o->len, p, n);
        o->len += n;
}

void out_s(struct out *o, const char *s)
{
        out_raw(o, s, (u32)strlen(s));
}

void out_u64(struct out *o, u64 v)
{
        char tmp[20];
        u32 k = sizeof(tmp);

        do {
                tmp[--k] = (char)('0' + v % 10);
                v /= 10;
        } while (v);
        out_raw(o, tmp + k, (u32)sizeof(tmp) - k);
}

void out_hex64(struct out *o, u64 v)
{
        char tmp[16];

        for (int k = 15; k >= 0; k--) {
                tmp[k] = "0123456789abcdef"[v & 0xf];
                v >>= 4;
        }
        out_raw(o, tmp, 16);
}

void out_hexbytes(struct out *o, const u8 *p, u32 n)
{
        for (u32 k = 0; k < n; k++) {
                char tmp[2] = { "0123456789abcdef"[p[k] >> 4], "0123456789abcdef"[p[k] & 0xf] };

                out_raw(o, tmp, 2);
        }
}
