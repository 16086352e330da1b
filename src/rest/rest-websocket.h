/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The WebSocket protocol (RFC 6455), server side, as GET
 * /v1/sandboxes/:id/processes/:pid/tty speaks it (rest-routes-processes.c):
 * the handshake's Sec-WebSocket-Accept, the header of the frames the server
 * sends (never masked, never fragmented), and an incremental decoder of the
 * client's frames that refuses what RFC 6455 refuses: an unmasked frame,
 * reserved bits, unknown opcodes, a fragmented or long control frame, a
 * continuation without a message or a new message inside one, a 64-bit
 * length with its top bit set, a length not in its shortest form, text that
 * is not UTF-8, and any message over WS_MESSAGE_MAX (from the header, before
 * its bytes are buffered).
 *
 * Plain C: no I/O, no sd-bus, no MHD.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WS_MESSAGE_MAX (1024u * 1024u)
#define WS_CONTROL_MAX 125u
#define WS_HEADER_MAX 14u   /* a client's: 2 + 8 (length) + 4 (mask) */
#define WS_ACCEPT_SIZE 29u  /* base64 of a SHA-1, and a NUL */

enum {
        WS_OP_CONTINUATION = 0x0,
        WS_OP_TEXT = 0x1,
        WS_OP_BINARY = 0x2,
        WS_OP_CLOSE = 0x8,
        WS_OP_PING = 0x9,
        WS_OP_PONG = 0xA,
};

/* Close codes (RFC 6455, section 7.4.1). */
#define WS_CLOSE_NORMAL 1000u
#define WS_CLOSE_GOING_AWAY 1001u
#define WS_CLOSE_PROTOCOL_ERROR 1002u
#define WS_CLOSE_INVALID_DATA 1007u
#define WS_CLOSE_TOO_BIG 1009u
#define WS_CLOSE_INTERNAL_ERROR 1011u

/* Is key a Sec-WebSocket-Key: the base64 of 16 bytes? */
bool ws_key_is_valid(const char *key);
/* Sec-WebSocket-Accept for key: base64(SHA-1(key + the protocol's GUID)).
 * -EINVAL for a key that ws_key_is_valid() refuses. */
int ws_accept_for_key(const char *key, char out[static WS_ACCEPT_SIZE]);

/* The header of a server frame (FIN set, unmasked) with a payload of len
 * bytes, into out; returns its size (2, 4 or 10). */
size_t ws_frame_header(uint8_t out[static 10], uint8_t opcode, uint64_t len);
/* A whole close frame: code, and reason cut to fit a control frame. Returns
 * its size (at most 2 + WS_CONTROL_MAX). */
size_t ws_close_frame(uint8_t out[static 2 + WS_CONTROL_MAX], uint16_t code, const char *reason);

/* One message of the client: text or binary (its fragments joined), or a
 * control frame (close, ping, pong). data stays valid until the next feed. */
typedef struct WsMessage {
        uint8_t opcode;
        const uint8_t *data;
        size_t len;
} WsMessage;

typedef struct WsDecoder {
        uint8_t hdr[WS_HEADER_MAX];
        size_t hdr_have, hdr_need;
        /* the frame being read */
        uint8_t opcode;
        bool fin;
        uint8_t mask[4];
        uint64_t len, got;
        /* the data message being assembled */
        bool in_message, message_done;
        uint8_t msg_opcode;
        uint8_t *msg;
        size_t msg_len, msg_alloc;
        uint8_t ctl[WS_CONTROL_MAX];
        int error;          /* sticky, once a frame was refused */
} WsDecoder;

void ws_decoder_init(WsDecoder *d);
void ws_decoder_done(WsDecoder *d);

/* Take bytes from buf[0..n) up to the end of the next message: *ret_used
 * says how many. 1: a message, in *ret (feed the rest of buf again); 0: all
 * n bytes taken, no message complete yet; -EPROTO (a frame RFC 6455
 * refuses), -EMSGSIZE (over WS_MESSAGE_MAX), -EILSEQ (text not UTF-8),
 * -ENOMEM. Errors are sticky. */
int ws_decoder_feed(WsDecoder *d, const void *buf, size_t n, size_t *ret_used, WsMessage *ret);
/* The close code that answers a decoder error. */
uint16_t ws_close_code_for_error(int error);
