/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * vmstate: vmstate_decode() on any bytes.
 *
 * The first input byte picks a mode, the rest is the file. Mode bit 0 set:
 * the header's payload_len, payload CRC and header CRC are rewritten to fit
 * the bytes (as a writer would), so that the fuzzer gets past the CRCs into
 * the section walker; clear: the bytes go in as they are. What decodes must
 * encode back to exactly the bytes that decoded (the format has one encoding
 * of each state: exact section sizes, zero padding and reserved fields); an
 * older version's file is written as the current version, which must then
 * decode and encode to itself.
 */

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "vmstate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void put_le32(uint8_t *p, uint32_t v) {
        for (unsigned i = 0; i < 4; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p) {
        return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

static void put_le64(uint8_t *p, uint64_t v) {
        for (unsigned i = 0; i < 8; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static struct vmstate s; /* large: not on the stack */
        const char *e = NULL;
        uint8_t *buf;
        void *out = NULL;
        size_t n, out_len = 0;
        int r;

        if (size < 1)
                return 0;
        n = size - 1;
        buf = malloc(n ? n : 1);
        if (!buf)
                return 0;
        memcpy(buf, data + 1, n);

        if ((data[0] & 1) && n >= VMSTATE_HEADER_SIZE) {
                put_le64(buf + 16, n - VMSTATE_HEADER_SIZE);
                put_le32(buf + 24, crc32c(buf + VMSTATE_HEADER_SIZE, n - VMSTATE_HEADER_SIZE));
                put_le32(buf + 28, crc32c(buf, 28));
        }

        r = vmstate_decode(buf, n, &s, &e);
        if (r >= 0) {
                if (vmstate_encode(&s, &out, &out_len) < 0)
                        abort();
                if (get_le32(buf + 8) != VMSTATE_VERSION) {
                        /* an older version: its current-version encoding is the reference */
                        free(buf);
                        buf = out;
                        n = out_len;
                        out = NULL;
                        if (vmstate_decode(buf, n, &s, &e) < 0 || vmstate_encode(&s, &out, &out_len) < 0)
                                abort();
                }
                if (out_len != n || memcmp(out, buf, n) != 0)
                        abort();
                free(out);
        } else if (!e && r != -ENOMEM)
                abort(); /* every refusal has a reason */

        free(buf);
        return 0;
}
