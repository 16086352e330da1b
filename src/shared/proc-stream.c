/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "proc-stream.h"

static void put_le32(uint8_t *p, uint32_t v) {
        for (unsigned i = 0; i < 4; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v) {
        for (unsigned i = 0; i < 8; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p) {
        uint32_t v = 0;

        for (unsigned i = 0; i < 4; i++)
                v |= (uint32_t) p[i] << (8 * i);
        return v;
}

static uint64_t get_le64(const uint8_t *p) {
        uint64_t v = 0;

        for (unsigned i = 0; i < 8; i++)
                v |= (uint64_t) p[i] << (8 * i);
        return v;
}

void proc_stream_header_encode(uint8_t out[static PROC_STREAM_HDR_SIZE], uint8_t kind, uint32_t len,
                               uint64_t offset) {
        out[0] = kind;
        out[1] = out[2] = out[3] = 0;
        put_le32(out + 4, len);
        put_le64(out + 8, offset);
}

size_t proc_stream_encode_gap(uint8_t out[static PROC_STREAM_HDR_SIZE + 8], uint64_t offset, uint64_t dropped) {
        proc_stream_header_encode(out, PROC_STREAM_GAP, PROC_STREAM_FIXED_LEN, offset);
        put_le64(out + PROC_STREAM_HDR_SIZE, dropped);
        return PROC_STREAM_HDR_SIZE + PROC_STREAM_FIXED_LEN;
}

size_t proc_stream_encode_exit(uint8_t out[static PROC_STREAM_HDR_SIZE + 8], uint64_t offset, int32_t exit_code,
                               int32_t signal) {
        proc_stream_header_encode(out, PROC_STREAM_EXIT, PROC_STREAM_FIXED_LEN, offset);
        put_le32(out + PROC_STREAM_HDR_SIZE, (uint32_t) exit_code);
        put_le32(out + PROC_STREAM_HDR_SIZE + 4, (uint32_t) signal);
        return PROC_STREAM_HDR_SIZE + PROC_STREAM_FIXED_LEN;
}

int proc_stream_header_decode(const uint8_t in[static PROC_STREAM_HDR_SIZE], ProcStreamHeader *ret) {
        uint8_t kind = in[0];
        uint32_t len = get_le32(in + 4);

        if (kind < PROC_STREAM_STDOUT || kind > PROC_STREAM_EXIT)
                return -EBADMSG;
        if (in[1] != 0 || in[2] != 0 || in[3] != 0)
                return -EBADMSG;
        if (len > PROC_STREAM_DATA_MAX)
                return -EBADMSG;
        if ((kind == PROC_STREAM_GAP || kind == PROC_STREAM_EXIT) && len != PROC_STREAM_FIXED_LEN)
                return -EBADMSG;
        *ret = (ProcStreamHeader) { .kind = kind, .len = len, .offset = get_le64(in + 8) };
        return 0;
}

int proc_stream_decoder_init(ProcStreamDecoder *d) {
        *d = (ProcStreamDecoder) {};
        d->payload = malloc(PROC_STREAM_DATA_MAX);
        return d->payload ? 0 : -ENOMEM;
}

void proc_stream_decoder_done(ProcStreamDecoder *d) {
        free(d->payload);
        *d = (ProcStreamDecoder) {};
}

bool proc_stream_decoder_idle(const ProcStreamDecoder *d) {
        return d->error == 0 && d->hdr_have == 0;
}

int proc_stream_decoder_feed(ProcStreamDecoder *d, const void *buf, size_t n, size_t *ret_used,
                             ProcStreamFrame *ret) {
        const uint8_t *p = buf;
        size_t used = 0, k;
        int r;

        if (d->error < 0)
                return d->error;
        if (d->hdr_have < PROC_STREAM_HDR_SIZE) {
                k = MIN(n, PROC_STREAM_HDR_SIZE - d->hdr_have);
                memcpy(d->hdr + d->hdr_have, p, k);
                d->hdr_have += k;
                used += k;
                if (d->hdr_have < PROC_STREAM_HDR_SIZE) {
                        *ret_used = used;
                        return 0;
                }
                r = proc_stream_header_decode(d->hdr, &d->h);
                if (r < 0) {
                        d->error = r;
                        *ret_used = used;
                        return r;
                }
                d->have = 0;
        }
        k = MIN(n - used, (size_t) d->h.len - d->have);
        memcpy(d->payload + d->have, p + used, k);
        d->have += k;
        used += k;
        *ret_used = used;
        if (d->have < d->h.len)
                return 0;

        *ret = (ProcStreamFrame) { .kind = d->h.kind, .len = d->h.len, .offset = d->h.offset, .data = d->payload };
        if (d->h.kind == PROC_STREAM_GAP)
                ret->dropped = get_le64(d->payload);
        else if (d->h.kind == PROC_STREAM_EXIT) {
                ret->exit_code = (int32_t) get_le32(d->payload);
                ret->signal = (int32_t) get_le32(d->payload + 4);
        }
        d->hdr_have = 0;
        d->have = 0;
        return 1;
}

static const char *const signal_names[] = {
        [1] = "HUP",     [2] = "INT",    [3] = "QUIT",    [4] = "ILL",     [5] = "TRAP",   [6] = "ABRT",
        [7] = "BUS",     [8] = "FPE",    [9] = "KILL",    [10] = "USR1",   [11] = "SEGV",  [12] = "USR2",
        [13] = "PIPE",   [14] = "ALRM",  [15] = "TERM",   [16] = "STKFLT", [17] = "CHLD",  [18] = "CONT",
        [19] = "STOP",   [20] = "TSTP",  [21] = "TTIN",   [22] = "TTOU",   [23] = "URG",   [24] = "XCPU",
        [25] = "XFSZ",   [26] = "VTALRM", [27] = "PROF",  [28] = "WINCH",  [29] = "IO",    [30] = "PWR",
        [31] = "SYS",
};

int proc_signal_from_string(const char *s) {
        const char *name = s;
        unsigned long v = 0;

        if (!s || !*s)
                return -EINVAL;
        if (s[0] >= '0' && s[0] <= '9') {
                for (const char *c = s; *c; c++) {
                        if (*c < '0' || *c > '9')
                                return -EINVAL;
                        v = v * 10 + (unsigned long) (*c - '0');
                        if (v > 64)
                                return -EINVAL;
                }
                return v >= 1 ? (int) v : -EINVAL;
        }
        if (strncmp(s, "SIG", 3) == 0)
                name = s + 3;
        for (size_t i = 1; i < ELEMENTSOF(signal_names); i++)
                if (strcmp(name, signal_names[i]) == 0)
                        return (int) i;
        return -EINVAL;
}
