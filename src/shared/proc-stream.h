/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The output stream of a process in a sandbox (org.forkd.Sandbox.OpenOutputStream):
 * frames on a SOCK_STREAM socket, little-endian, a 16-byte header
 *
 *   u8 kind (PROC_STREAM_STDOUT .. PROC_STREAM_EXIT), u8 pad[3] (zero),
 *   u32 len, u64 offset (where the frame's bytes start in the process's output)
 *
 * then len bytes of payload: the output itself (stdout, stderr); for a gap a
 * u64 count of dropped bytes (its offset: the first offset after the gap);
 * for the exit an i32 exit code (-1: killed by a signal) and an i32 signal
 * (0: none). len is at most PROC_STREAM_DATA_MAX; a gap's and an exit's is 8.
 * forkd writes them, forkctl and forkd-rest read them.
 *
 * Plain C: no sd-bus, no json-c.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PROC_STREAM_HDR_SIZE 16u
#define PROC_STREAM_DATA_MAX (256u * 1024u)
#define PROC_STREAM_FIXED_LEN 8u /* a gap's and an exit's payload */

enum {
        PROC_STREAM_STDOUT = 1,
        PROC_STREAM_STDERR = 2,
        PROC_STREAM_GAP = 3,
        PROC_STREAM_EXIT = 4,
};

typedef struct ProcStreamHeader {
        uint8_t kind;
        uint32_t len;
        uint64_t offset;
} ProcStreamHeader;

/* Write the header of a frame to out. Nothing is checked: callers pass what
 * proc_stream_header_decode() accepts. */
void proc_stream_header_encode(uint8_t out[static PROC_STREAM_HDR_SIZE], uint8_t kind, uint32_t len,
                               uint64_t offset);
/* A whole gap or exit frame (header and payload, PROC_STREAM_HDR_SIZE + 8
 * bytes) into out; returns its size. */
size_t proc_stream_encode_gap(uint8_t out[static PROC_STREAM_HDR_SIZE + 8], uint64_t offset, uint64_t dropped);
size_t proc_stream_encode_exit(uint8_t out[static PROC_STREAM_HDR_SIZE + 8], uint64_t offset, int32_t exit_code,
                               int32_t signal);

/* Check and read a header: -EBADMSG for an unknown kind, a non-zero pad, a
 * len over PROC_STREAM_DATA_MAX, or a gap or exit whose len is not 8 (ret
 * untouched then). */
int proc_stream_header_decode(const uint8_t in[static PROC_STREAM_HDR_SIZE], ProcStreamHeader *ret);

/* One decoded frame. data points into the decoder (len bytes, kinds 1 and 2)
 * and stays valid until the next proc_stream_decoder_feed(). */
typedef struct ProcStreamFrame {
        uint8_t kind;
        uint32_t len;
        uint64_t offset;
        const uint8_t *data;
        uint64_t dropped;   /* a gap's */
        int32_t exit_code;  /* an exit's */
        int32_t signal;
} ProcStreamFrame;

/* Incremental decoder: bytes as they come, in chunks of any size. */
typedef struct ProcStreamDecoder {
        uint8_t hdr[PROC_STREAM_HDR_SIZE];
        size_t hdr_have;
        ProcStreamHeader h;
        uint8_t *payload;  /* PROC_STREAM_DATA_MAX bytes */
        size_t have;
        int error;         /* once a header was refused: every later feed fails with it */
} ProcStreamDecoder;

int proc_stream_decoder_init(ProcStreamDecoder *d);
void proc_stream_decoder_done(ProcStreamDecoder *d);

/* Take bytes from buf[0..n) up to the end of the next frame: *ret_used says
 * how many were taken. 1: a frame is complete, in *ret; 0: all n bytes taken,
 * no frame complete yet; -EBADMSG: an invalid header (sticky). Feed the rest
 * of buf again after a frame. */
int proc_stream_decoder_feed(ProcStreamDecoder *d, const void *buf, size_t n, size_t *ret_used,
                             ProcStreamFrame *ret);
/* Between frames (no partial frame held)? A stream that ends elsewhere was cut. */
bool proc_stream_decoder_idle(const ProcStreamDecoder *d);

/* A signal as the D-Bus API takes it: "SIGTERM", "TERM" or a decimal number
 * 1..64. Returns the number or -EINVAL. */
int proc_signal_from_string(const char *s);
