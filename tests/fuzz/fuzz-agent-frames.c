/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The agent protocol, as a hostile guest speaks it to the host.
 *
 * 1. fka_decoder: the bytes are fed in chunks whose sizes come from the first
 *    input byte (1..256), and it keeps feeding after -EBADMSG (the resyncing
 *    mode); every frame it hands out must keep the promises of agent-proto.h.
 * 2. fka_client, the host's side: four requests in flight on a socketpair, the
 *    bytes arrive as the guest's answer, and fka_client_next() runs until the
 *    connection breaks at the end of the stream.
 */

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent-proto.h"

#define MAX_PAYLOAD 4096u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_decoder(const uint8_t *data, size_t size, size_t chunk) {
        fka_decoder *d = NULL;
        size_t off = 0;

        if (fka_decoder_new(MAX_PAYLOAD, &d) < 0)
                abort();
        while (off < size) {
                size_t n = size - off < chunk ? size - off : chunk;
                const void *p = data + off;
                size_t left = n;

                while (left > 0) {
                        fka_frame f = {};
                        size_t before = left;
                        int r;

                        if (fka_decoder_wanted(d) < 1)
                                abort();
                        r = fka_decoder_feed(d, &p, &left, &f);
                        if (left > before)
                                abort();
                        if (r == 1) {
                                if (!fka_type_is_valid(f.type) || f.len > MAX_PAYLOAD || !f.payload ||
                                    f.payload[f.len] != '\0')
                                        abort();
                        } else if (r == -EMSGSIZE) {
                                if (f.payload || f.len <= MAX_PAYLOAD)
                                        abort();
                        } else if (r == 0) {
                                if (left != 0)
                                        abort();
                        } else if (r != -EBADMSG && r != -ENOMEM)
                                abort();
                        fka_frame_done(&f);
                }
                off += n;
        }
        (void) fka_decoder_eof(d);
        fka_decoder_free(d);
}

static void fuzz_client(const uint8_t *data, size_t size) {
        fka_client *c = NULL;
        int sv[2], r;
        size_t off = 0;
        unsigned done = 0;

        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
                abort();
        if (fka_client_new(sv[0], 8, &c) < 0)
                abort();
        for (unsigned i = 0; i < 4; i++)
                if (fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, 0, NULL) < 0)
                        abort();

        for (;;) {
                fka_completion comp = {};

                if (off < size) {
                        ssize_t w = write(sv[1], data + off, size - off);
                        if (w > 0)
                                off += (size_t) w;
                        if (off == size)
                                (void) shutdown(sv[1], SHUT_WR);
                } else if (size == 0)
                        (void) shutdown(sv[1], SHUT_WR);

                r = fka_client_next(c, &comp);
                if (r < 0)
                        break;
                if (r == 0) {
                        char sink[4096];
                        /* Keep the requests the client writes from filling the pair. */
                        while (read(sv[1], sink, sizeof(sink)) > 0)
                                ;
                        continue;
                }
                if (comp.error == 0 && (!comp.json || !comp.obj || comp.json[comp.json_len] != '\0'))
                        abort();
                if (comp.type != FKA_EVENT)
                        done++;
                fka_completion_done(&comp);
        }
        if (done > 4 || fka_client_in_flight(c) > 4)
                abort();

        fka_client_free(c);
        close(sv[0]);
        close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        fuzz_decoder(data + 1, size - 1, (size_t) data[0] + 1);
        fuzz_client(data + 1, size - 1);
        return 0;
}
