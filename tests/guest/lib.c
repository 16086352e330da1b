/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* forkd-test-guest: the few libc pieces the guest needs (ring 3 only). */
#include "guest.h"

void *memset(void *d, int c, size_t n)
{
        void *r = d;
        __asm__ __volatile__("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
        return r;
}

void *memcpy(void *d, const void *s, size_t n)
{
        void *r = d;
        __asm__ __volatile__("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
        return r;
}

void *memmove(void *d, const void *s, size_t n)
{
        u8 *dp = d;
        const u8 *sp = s;

        if (dp <= sp || dp >= sp + n)
                return memcpy(d, s, n);
        while (n) {
                n--;
                dp[n] = sp[n];
        }
        return d;
}

int memcmp(const void *a, const void *b, size_t n)
{
        const u8 *x = a, *y = b;

        for (size_t i = 0; i < n; i++)
                if (x[i] != y[i])
                        return x[i] < y[i] ? -1 : 1;
        return 0;
}

size_t strlen(const char *s)
{
        size_t n = 0;

        while (s[n])
                n++;
        return n;
}

/* every byte is a VM exit: use at boot and on errors only */
void serial_puts(const char *s)
{
        while (*s)
                u_outb(0x3f8, (u8)*s++);
}

void serial_put_hex(u64 v)
{
        serial_puts("0x");
        for (int i = 60; i >= 0; i -= 4)
                u_outb(0x3f8, (u8)"0123456789abcdef"[(v >> i) & 0xf]);
}

u64 fnv1a(u64 h, const void *p, size_t n)
{
        const u8 *b = p;

        for (size_t i = 0; i < n; i++) {
                h ^= b[i];
                h *= FNV_PRIME;
        }
        return h;
}
