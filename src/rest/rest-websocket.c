/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* RFC 6455 framing for forkd-rest's WebSocket terminal (rest-websocket.h). */

#include <errno.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "json-util.h"
#include "macro.h"
#include "rest-websocket.h"

#define WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

bool ws_key_is_valid(const char *key) {
        uint8_t raw[16];
        size_t n;

        if (!key || strlen(key) != 24)
                return false;
        return base64_decode(key, 24, raw, sizeof raw, &n) == 0 && n == 16;
}

int ws_accept_for_key(const char *key, char out[static WS_ACCEPT_SIZE]) {
        char buf[24 + sizeof WS_GUID];
        uint8_t md[EVP_MAX_MD_SIZE];
        unsigned md_len = 0;

        if (!ws_key_is_valid(key))
                return -EINVAL;
        memcpy(buf, key, 24);
        memcpy(buf + 24, WS_GUID, sizeof WS_GUID - 1);
        if (EVP_Digest(buf, 24 + sizeof WS_GUID - 1, md, &md_len, EVP_sha1(), NULL) != 1 || md_len != 20)
                return -EIO;
        out[base64_encode(md, 20, out)] = 0;
        return 0;
}

size_t ws_frame_header(uint8_t out[static 10], uint8_t opcode, uint64_t len) {
        out[0] = 0x80 | (opcode & 0x0f);
        if (len < 126) {
                out[1] = (uint8_t) len;
                return 2;
        }
        if (len <= UINT16_MAX) {
                out[1] = 126;
                out[2] = (uint8_t) (len >> 8);
                out[3] = (uint8_t) len;
                return 4;
        }
        out[1] = 127;
        for (unsigned i = 0; i < 8; i++)
                out[2 + i] = (uint8_t) (len >> (56 - 8 * i));
        return 10;
}

size_t ws_close_frame(uint8_t out[static 2 + WS_CONTROL_MAX], uint16_t code, const char *reason) {
        size_t n = reason ? strlen(reason) : 0;

        n = MIN(n, (size_t) WS_CONTROL_MAX - 2);
        out[0] = 0x80 | WS_OP_CLOSE;
        out[1] = (uint8_t) (2 + n);
        out[2] = (uint8_t) (code >> 8);
        out[3] = (uint8_t) code;
        if (n > 0)
                memcpy(out + 4, reason, n);
        return 4 + n;
}

void ws_decoder_init(WsDecoder *d) {
        *d = (WsDecoder) { .hdr_need = 2 };
}

void ws_decoder_done(WsDecoder *d) {
        free(d->msg);
        ws_decoder_init(d);
}

uint16_t ws_close_code_for_error(int error) {
        switch (error) {
        case -EMSGSIZE:
                return WS_CLOSE_TOO_BIG;
        case -EILSEQ:
                return WS_CLOSE_INVALID_DATA;
        case -EPROTO:
                return WS_CLOSE_PROTOCOL_ERROR;
        default:
                return WS_CLOSE_INTERNAL_ERROR;
        }
}

static bool opcode_is_control(uint8_t op) {
        return op & 0x8;
}

/* The header is whole: check it, and where the payload goes. */
static int header_done(WsDecoder *d) {
        const uint8_t *h = d->hdr;
        uint8_t len7 = h[1] & 0x7f;
        size_t p = 2;

        d->fin = h[0] & 0x80;
        d->opcode = h[0] & 0x0f;
        if (len7 == 126) {
                d->len = (uint64_t) h[2] << 8 | h[3];
                if (d->len < 126)
                        return -EPROTO; /* not the shortest form */
                p = 4;
        } else if (len7 == 127) {
                d->len = 0;
                for (unsigned i = 0; i < 8; i++)
                        d->len = d->len << 8 | h[2 + i];
                if (d->len >> 63 || d->len <= UINT16_MAX)
                        return -EPROTO;
                p = 10;
        } else
                d->len = len7;
        memcpy(d->mask, h + p, 4);
        d->got = 0;

        if (opcode_is_control(d->opcode)) {
                if (d->opcode != WS_OP_CLOSE && d->opcode != WS_OP_PING && d->opcode != WS_OP_PONG)
                        return -EPROTO;
                if (!d->fin || d->len > WS_CONTROL_MAX)
                        return -EPROTO;
                return 0;
        }
        if (d->opcode == WS_OP_CONTINUATION) {
                if (!d->in_message)
                        return -EPROTO;
        } else if (d->opcode == WS_OP_TEXT || d->opcode == WS_OP_BINARY) {
                if (d->in_message)
                        return -EPROTO;
                d->in_message = true;
                d->msg_opcode = d->opcode;
                d->msg_len = 0;
        } else
                return -EPROTO;
        if (d->len > WS_MESSAGE_MAX - d->msg_len)
                return -EMSGSIZE;
        if (d->msg_len + d->len > d->msg_alloc) {
                size_t a = MAX(d->msg_alloc * 2, (size_t) (d->msg_len + d->len));
                uint8_t *m;

                a = MIN(MAX(a, (size_t) 4096), (size_t) WS_MESSAGE_MAX);
                m = realloc(d->msg, a);
                if (!m)
                        return -ENOMEM;
                d->msg = m;
                d->msg_alloc = a;
        }
        return 0;
}

/* How long the header is, once its first two bytes are known. */
static int header_size(WsDecoder *d) {
        uint8_t b0 = d->hdr[0], b1 = d->hdr[1];

        if (b0 & 0x70)
                return -EPROTO; /* RSV1..3: no extension was negotiated */
        if (!(b1 & 0x80))
                return -EPROTO; /* a client's frames are masked */
        d->hdr_need = 2 + ((b1 & 0x7f) == 126 ? 2 : (b1 & 0x7f) == 127 ? 8 : 0) + 4;
        return 0;
}

/* The frame is whole: a message to hand out? */
static int frame_done(WsDecoder *d, WsMessage *ret) {
        d->hdr_have = 0;
        d->hdr_need = 2;
        if (opcode_is_control(d->opcode)) {
                *ret = (WsMessage) { .opcode = d->opcode, .data = d->ctl, .len = (size_t) d->len };
                if (d->opcode == WS_OP_CLOSE && d->len == 1)
                        return -EPROTO;
                return 1;
        }
        d->msg_len += (size_t) d->len;
        if (!d->fin)
                return 0;
        d->in_message = false;
        if (d->msg_opcode == WS_OP_TEXT && !utf8_is_valid_n((const char *) d->msg, d->msg_len))
                return -EILSEQ;
        *ret = (WsMessage) { .opcode = d->msg_opcode, .data = d->msg, .len = d->msg_len };
        return 1;
}

int ws_decoder_feed(WsDecoder *d, const void *buf, size_t n, size_t *ret_used, WsMessage *ret) {
        const uint8_t *p = buf;
        size_t used = 0;
        int r;

        *ret_used = 0;
        if (d->error)
                return d->error;
        while (used < n) {
                if (d->hdr_have < d->hdr_need) {
                        d->hdr[d->hdr_have++] = p[used++];
                        if (d->hdr_have == 2) {
                                r = header_size(d);
                                if (r < 0)
                                        return (d->error = r);
                        }
                        if (d->hdr_have < d->hdr_need)
                                continue;
                        r = header_done(d);
                        if (r < 0)
                                return (d->error = r);
                        if (d->len > 0)
                                continue;
                } else {
                        uint8_t *dst = opcode_is_control(d->opcode) ? d->ctl : d->msg + d->msg_len;
                        size_t k = (size_t) MIN((uint64_t) (n - used), d->len - d->got);

                        for (size_t i = 0; i < k; i++)
                                dst[d->got + i] = p[used + i] ^ d->mask[(d->got + i) & 3];
                        used += k;
                        d->got += k;
                        if (d->got < d->len)
                                continue;
                }
                r = frame_done(d, ret);
                if (r < 0)
                        return (d->error = r);
                if (r > 0) {
                        *ret_used = used;
                        return 1;
                }
        }
        *ret_used = used;
        return 0;
}
