/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* CRC-32C (Castagnoli): reflected polynomial 0x82F63B78, initial value and
 * final xor 0xFFFFFFFF. crc32c("123456789", 9) == 0xE3069283. */

#include <stddef.h>
#include <stdint.h>

/* Continue a finished CRC over more data: crc32c_extend(crc32c(a), b) is the
 * CRC of a followed by b, and crc32c_extend(0, buf, len) == crc32c(buf, len). */
uint32_t crc32c_extend(uint32_t crc, const void *buf, size_t len);

static inline uint32_t crc32c(const void *buf, size_t len) {
        return crc32c_extend(0, buf, len);
}
