/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "agent-proto.h"
#include "json-util.h"
#include "macro.h"

static const uint8_t magic_bytes[4] = { 'F', 'K', 'A', '1' };

static void put_le16(uint8_t *p, uint16_t v) {
        p[0] = v & 0xff;
        p[1] = v >> 8;
}

static void put_le32(uint8_t *p, uint32_t v) {
        p[0] = v & 0xff;
        p[1] = (v >> 8) & 0xff;
        p[2] = (v >> 16) & 0xff;
        p[3] = v >> 24;
}

static uint16_t get_le16(const uint8_t *p) {
        return (uint16_t) (p[0] | (p[1] << 8));
}

static uint32_t get_le32(const uint8_t *p) {
        return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) | ((uint32_t) p[3] << 24);
}

bool fka_type_is_valid(uint16_t type) {
        return type >= FKA_REQUEST && type <= FKA_EVENT;
}

void fka_encode_header(uint8_t out[static FKA_HDR_SIZE], uint16_t type, uint32_t id, uint32_t len) {
        put_le32(out, FKA_MAGIC);
        put_le16(out + 4, type);
        put_le16(out + 6, 0);
        put_le32(out + 8, id);
        put_le32(out + 12, len);
}

int fka_decode_header(const uint8_t in[static FKA_HDR_SIZE], uint32_t max_payload, fka_header *ret) {
        fka_header h;

        if (!in || !ret)
                return -EINVAL;

        if (get_le32(in) != FKA_MAGIC)
                return -EBADMSG;

        h = (fka_header) {
                .type = get_le16(in + 4),
                .flags = get_le16(in + 6),
                .id = get_le32(in + 8),
                .len = get_le32(in + 12),
        };
        if (h.flags != 0 || !fka_type_is_valid(h.type))
                return -EBADMSG;

        *ret = h;
        return h.len > max_payload ? -EMSGSIZE : 0;
}

int fka_frame_build(uint16_t type, uint32_t id, const char *json, size_t len, void **ret_buf, size_t *ret_len) {
        uint8_t *buf;

        if (!ret_buf || !ret_len)
                return -EINVAL;
        if (!fka_type_is_valid(type))
                return -EINVAL;
        if (!json && len > 0)
                return -EINVAL;
        if ((type == FKA_REQUEST || type == FKA_RESPONSE) && id == 0)
                return -EINVAL;
        if (type == FKA_EVENT && id != 0)
                return -EINVAL;
        if (len > FKA_MAX_PAYLOAD)
                return -EMSGSIZE;

        buf = malloc(FKA_HDR_SIZE + len);
        if (!buf)
                return -ENOMEM;
        fka_encode_header(buf, type, id, (uint32_t) len);
        if (len > 0)
                memcpy(buf + FKA_HDR_SIZE, json, len);

        *ret_buf = buf;
        *ret_len = FKA_HDR_SIZE + len;
        return 0;
}

void fka_frame_done(fka_frame *f) {
        if (!f)
                return;
        free(f->payload);
        *f = (fka_frame) {};
}

/* ---- decoder ---- */

enum decoder_state {
        DEC_HEADER,
        DEC_PAYLOAD,
        DEC_SKIP,
};

struct fka_decoder {
        uint32_t max_payload;
        enum decoder_state state;
        bool resync;             /* discarding garbage until a valid header */

        uint8_t hbuf[FKA_HDR_SIZE];
        size_t hlen;

        fka_header hdr;          /* of the frame being read or skipped */
        char *buf;               /* payload so far, hdr.len + 1 bytes at most */
        size_t buf_size;
        size_t have;             /* payload bytes received (or skipped) */
};

int fka_decoder_new(uint32_t max_payload, fka_decoder **ret) {
        fka_decoder *d;

        if (!ret)
                return -EINVAL;
        if (max_payload == 0 || max_payload > FKA_MAX_PAYLOAD)
                return -EINVAL;

        d = calloc(1, sizeof(*d));
        if (!d)
                return -ENOMEM;
        d->max_payload = max_payload;

        *ret = d;
        return 0;
}

fka_decoder *fka_decoder_free(fka_decoder *d) {
        if (!d)
                return NULL;
        free(d->buf);
        free(d);
        return NULL;
}

size_t fka_decoder_wanted(const fka_decoder *d) {
        if (!d)
                return 0;
        switch (d->state) {
        case DEC_PAYLOAD:
        case DEC_SKIP:
                return d->hdr.len - d->have;
        case DEC_HEADER:
        default:
                return FKA_HDR_SIZE - d->hlen;
        }
}

int fka_decoder_eof(const fka_decoder *d) {
        if (!d)
                return -EINVAL;
        if (d->state != DEC_HEADER || d->hlen > 0)
                return -EPROTO;
        return 0;
}

/* Drop leading bytes of hbuf until it starts with (a prefix of) the magic. */
static void decoder_align(fka_decoder *d) {
        size_t p;

        for (p = 0; p < d->hlen; p++)
                if (memcmp(d->hbuf + p, magic_bytes, MIN(d->hlen - p, sizeof(magic_bytes))) == 0)
                        break;

        memmove(d->hbuf, d->hbuf + p, d->hlen - p);
        d->hlen -= p;
}

static void decoder_reset(fka_decoder *d) {
        d->state = DEC_HEADER;
        d->hlen = 0;
        d->have = 0;
        d->hdr = (fka_header) {};
}

/* Make room for `need` payload bytes plus a NUL. Grows with what arrived,
 * not with what the header announced, so a peer that announces a large
 * payload and then stalls costs little. */
static int decoder_reserve(fka_decoder *d, size_t need) {
        size_t n;
        char *p;

        if (need + 1 <= d->buf_size)
                return 0;

        n = MAX(MAX(d->buf_size * 2, need + 1), (size_t) 4096);
        n = MIN(n, (size_t) d->hdr.len + 1);

        p = realloc(d->buf, n);
        if (!p)
                return -ENOMEM;
        d->buf = p;
        d->buf_size = n;
        return 0;
}

/* Hand the finished payload over to *ret. */
static int decoder_complete(fka_decoder *d, fka_frame *ret) {
        char *payload;
        int r;

        r = decoder_reserve(d, d->hdr.len);
        if (r < 0) {
                decoder_reset(d);
                return r;
        }
        payload = TAKE_PTR(d->buf);
        payload[d->hdr.len] = 0;
        d->buf_size = 0;

        *ret = (fka_frame) {
                .type = d->hdr.type,
                .id = d->hdr.id,
                .len = d->hdr.len,
                .payload = payload,
        };
        decoder_reset(d);
        return 1;
}

int fka_decoder_feed(fka_decoder *d, const void **data, size_t *size, fka_frame *ret) {
        const uint8_t *p;
        size_t n;
        int r;

        if (!d || !data || !size || !ret)
                return -EINVAL;
        if (!*data && *size > 0)
                return -EINVAL;

        p = *data;
        n = *size;

        for (;;) {
                if (d->state == DEC_HEADER) {
                        fka_header h;
                        size_t k;

                        if (n == 0) {
                                r = 0;
                                break;
                        }

                        k = MIN(n, FKA_HDR_SIZE - d->hlen);
                        memcpy(d->hbuf + d->hlen, p, k);
                        d->hlen += k;
                        p += k;
                        n -= k;

                        if (d->resync) {
                                decoder_align(d);
                                if (d->hlen < FKA_HDR_SIZE)
                                        continue;
                        } else if (d->hlen < FKA_HDR_SIZE) {
                                r = 0;
                                break;
                        }

                        r = fka_decode_header(d->hbuf, d->max_payload, &h);
                        if (r == -EBADMSG) {
                                bool report = !d->resync;

                                /* Slide by one byte and look for the next magic. */
                                d->resync = true;
                                memmove(d->hbuf, d->hbuf + 1, FKA_HDR_SIZE - 1);
                                d->hlen = FKA_HDR_SIZE - 1;
                                decoder_align(d);
                                if (report)
                                        break;
                                continue;
                        }
                        d->resync = false;
                        d->hlen = 0;
                        d->hdr = h;
                        d->have = 0;

                        if (r == -EMSGSIZE) {
                                d->state = DEC_SKIP;
                                *ret = (fka_frame) {
                                        .type = h.type,
                                        .id = h.id,
                                        .len = h.len,
                                };
                                break;
                        }
                        if (h.len == 0) {
                                r = decoder_complete(d, ret);
                                break;
                        }
                        d->state = DEC_PAYLOAD;

                } else if (d->state == DEC_PAYLOAD) {
                        size_t k;

                        if (n == 0) {
                                r = 0;
                                break;
                        }

                        k = MIN(n, (size_t) d->hdr.len - d->have);
                        r = decoder_reserve(d, d->have + k);
                        if (r < 0) {
                                /* Drop this frame's bytes: skip the rest of it. */
                                d->state = DEC_SKIP;
                                break;
                        }
                        memcpy(d->buf + d->have, p, k);
                        d->have += k;
                        p += k;
                        n -= k;

                        if (d->have == d->hdr.len) {
                                r = decoder_complete(d, ret);
                                break;
                        }

                } else { /* DEC_SKIP */
                        size_t k;

                        k = MIN(n, (size_t) d->hdr.len - d->have);
                        d->have += k;
                        p += k;
                        n -= k;

                        if (d->have == d->hdr.len)
                                decoder_reset(d);
                        else {
                                r = 0;
                                break;
                        }
                }
        }

        *data = p;
        *size = n;
        return r;
}

/* ---- client ---- */

void fka_completion_done(fka_completion *c) {
        if (!c)
                return;
        free(c->json);
        if (c->obj)
                json_object_put(c->obj);
        *c = (fka_completion) {};
}

uint64_t fka_now_usec(void) {
        struct timespec ts;

        if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0)
                return 0;
        return (uint64_t) ts.tv_sec * UINT64_C(1000000) + (uint64_t) ts.tv_nsec / 1000;
}

enum slot_state {
        SLOT_FREE,
        SLOT_PENDING,
        SLOT_FAILED,   /* failed locally (timeout, connection), not yet collected */
};

struct fka_slot {
        uint32_t id;
        enum slot_state state;
        int error;
        uint64_t deadline;
        void *userdata;
};

#define FKA_CLIENT_RBUF 16384

struct fka_client {
        int fd;
        int error;                  /* sticky: the connection is broken */

        /* Request id is chosen so that slots[id % max_in_flight] is free:
         * lookups are O(1). */
        struct fka_slot *slots;
        unsigned max_in_flight;
        unsigned n_used;            /* pending + failed */
        unsigned n_failed;
        uint32_t last_id;

        /* Ids that timed out, so that a late answer is not a protocol error.
         * A ring of max_in_flight entries; the oldest is forgotten. */
        uint32_t *tombstones;
        unsigned tomb_next;

        fka_decoder *dec;

        uint8_t *obuf;
        size_t obuf_size, opos, olen;

        uint8_t rbuf[FKA_CLIENT_RBUF];
        size_t rpos, rlen;
        bool yielded;               /* the last fka_client_next() stopped short of EAGAIN */
};

int fka_client_new(int fd, unsigned max_in_flight, fka_client **ret) {
        _cleanup_(fka_client_freep) fka_client *c = NULL;
        int r;

        if (!ret)
                return -EINVAL;
        if (fd < 0)
                return -EBADF;
        if (max_in_flight == 0 || max_in_flight > FKA_CLIENT_MAX_IN_FLIGHT)
                return -EINVAL;

        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->fd = fd;
        c->max_in_flight = max_in_flight;

        c->slots = calloc(max_in_flight, sizeof(*c->slots));
        c->tombstones = calloc(max_in_flight, sizeof(*c->tombstones));
        if (!c->slots || !c->tombstones)
                return -ENOMEM;

        r = fka_decoder_new(FKA_MAX_PAYLOAD, &c->dec);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(c);
        return 0;
}

fka_client *fka_client_free(fka_client *c) {
        if (!c)
                return NULL;
        fka_decoder_free(c->dec);
        free(c->obuf);
        free(c->slots);
        free(c->tombstones);
        free(c);
        return NULL;
}

int fka_client_fd(const fka_client *c) {
        return c ? c->fd : -EINVAL;
}

bool fka_client_yielded(const fka_client *c) {
        return c && c->yielded;
}

unsigned fka_client_in_flight(const fka_client *c) {
        return c ? c->n_used : 0;
}

short fka_client_events(const fka_client *c) {
        if (!c)
                return 0;
        return POLLIN | (c->olen > c->opos ? POLLOUT : 0);
}

uint64_t fka_client_next_deadline(const fka_client *c) {
        uint64_t t = UINT64_MAX;

        if (!c)
                return t;
        for (unsigned i = 0; i < c->max_in_flight; i++)
                if (c->slots[i].state == SLOT_PENDING && c->slots[i].deadline > 0)
                        t = MIN(t, c->slots[i].deadline);
        return t;
}

static void client_fail_slot(fka_client *c, struct fka_slot *s, int error) {
        s->state = SLOT_FAILED;
        s->error = error;
        c->n_failed++;
}

static void client_free_slot(fka_client *c, struct fka_slot *s) {
        if (s->state == SLOT_FAILED)
                c->n_failed--;
        *s = (struct fka_slot) {};
        c->n_used--;
}

/* The connection is unusable: fail everything in flight with error. */
static void client_break(fka_client *c, int error) {
        if (c->error < 0)
                return;
        c->error = error;
        for (unsigned i = 0; i < c->max_in_flight; i++)
                if (c->slots[i].state == SLOT_PENDING)
                        client_fail_slot(c, c->slots + i, error);
        c->opos = c->olen = 0;
}

static bool client_tombstone_take(fka_client *c, uint32_t id) {
        for (unsigned i = 0; i < c->max_in_flight; i++)
                if (c->tombstones[i] == id) {
                        c->tombstones[i] = 0;
                        return true;
                }
        return false;
}

static bool client_tombstone_has(const fka_client *c, uint32_t id) {
        for (unsigned i = 0; i < c->max_in_flight; i++)
                if (c->tombstones[i] == id)
                        return true;
        return false;
}

int fka_client_expire(fka_client *c, uint64_t now_usec) {
        int n = 0;

        if (!c)
                return -EINVAL;

        for (unsigned i = 0; i < c->max_in_flight; i++) {
                struct fka_slot *s = c->slots + i;

                if (s->state != SLOT_PENDING || s->deadline == 0 || s->deadline > now_usec)
                        continue;
                client_fail_slot(c, s, -ETIMEDOUT);
                c->tombstones[c->tomb_next] = s->id;
                c->tomb_next = (c->tomb_next + 1) % c->max_in_flight;
                n++;
        }
        return n;
}

static int client_flush(fka_client *c) {
        while (c->opos < c->olen) {
                ssize_t l;

                l = send(c->fd, c->obuf + c->opos, c->olen - c->opos, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (l < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN || errno == EWOULDBLOCK)
                                return 0;
                        return negative_errno();
                }
                c->opos += (size_t) l;
        }
        c->opos = c->olen = 0;
        return 0;
}

/* Pick an id whose slot is free and that is not waiting for a late answer.
 * With n_used < max a slot is free, and at most max ids are tombstoned, so
 * (max + 1) * max tries always find one; 0 if not. */
static uint32_t client_new_id(fka_client *c) {
        uint64_t tries = ((uint64_t) c->max_in_flight + 1) * c->max_in_flight;

        for (uint64_t i = 0; i < tries; i++) {
                uint32_t id = c->last_id >= INT32_MAX ? 1 : c->last_id + 1;

                c->last_id = id;
                if (c->slots[id % c->max_in_flight].state == SLOT_FREE && !client_tombstone_has(c, id))
                        return id;
        }
        return 0;
}

int fka_client_send(fka_client *c, const char *json, size_t len, uint64_t deadline_usec, void *userdata) {
        _cleanup_json_ struct json_object *obj = NULL;
        struct fka_slot *s;
        size_t queued, need;
        uint32_t id;
        int r;

        if (!c || !json)
                return -EINVAL;
        if (len == SIZE_MAX)
                len = strnlen(json, (size_t) FKA_MAX_PAYLOAD + 1);
        if (len > FKA_MAX_PAYLOAD)
                return -EMSGSIZE;
        if (c->error < 0)
                return c->error;
        if (c->n_used >= c->max_in_flight)
                return -EBUSY;

        queued = c->olen - c->opos;
        need = FKA_HDR_SIZE + len;
        if (need > FKA_CLIENT_MAX_OUTPUT - queued)
                return -ENOBUFS;

        r = json_parse_strict(json, len, FKA_MAX_PAYLOAD, FKA_JSON_MAX_DEPTH, &obj, NULL);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return -EINVAL;

        /* Compact, then grow the output buffer to fit. */
        if (c->opos > 0) {
                memmove(c->obuf, c->obuf + c->opos, queued);
                c->opos = 0;
                c->olen = queued;
        }
        if (c->obuf_size < queued + need) {
                size_t n = MIN(MAX(c->obuf_size * 2, queued + need), (size_t) FKA_CLIENT_MAX_OUTPUT);
                uint8_t *p;

                p = realloc(c->obuf, n);
                if (!p)
                        return -ENOMEM;
                c->obuf = p;
                c->obuf_size = n;
        }

        id = client_new_id(c);
        if (id == 0)
                return -EBUSY;
        fka_encode_header(c->obuf + c->olen, FKA_REQUEST, id, (uint32_t) len);
        memcpy(c->obuf + c->olen + FKA_HDR_SIZE, json, len);
        c->olen += need;

        s = c->slots + id % c->max_in_flight;
        *s = (struct fka_slot) {
                .id = id,
                .state = SLOT_PENDING,
                .deadline = deadline_usec,
                .userdata = userdata,
        };
        c->n_used++;

        /* A write error fails the request later, through fka_client_next(). */
        r = client_flush(c);
        if (r < 0)
                client_break(c, r);

        return (int) id;
}

/* Return one locally failed request, if any. */
static int client_pop_failed(fka_client *c, fka_completion *ret) {
        if (c->n_failed == 0)
                return 0;

        for (unsigned i = 0; i < c->max_in_flight; i++) {
                struct fka_slot *s = c->slots + i;

                if (s->state != SLOT_FAILED)
                        continue;
                *ret = (fka_completion) {
                        .id = s->id,
                        .error = s->error,
                        .userdata = s->userdata,
                };
                client_free_slot(c, s);
                return 1;
        }
        return 0;
}

/* Fill a completion from a frame; takes the payload. A payload that is not
 * a strict JSON object fails the completion, not the connection. */
static int completion_from_frame(fka_frame *f, fka_completion *ret) {
        struct json_object *obj = NULL;
        int r;

        r = json_parse_strict(f->payload, f->len, FKA_MAX_PAYLOAD, FKA_JSON_MAX_DEPTH, &obj, NULL);
        if (r < 0) {
                ret->error = r == -ENOMEM ? r : -EBADMSG;
                fka_frame_done(f);
                return 1;
        }
        ret->error = 0;
        ret->json = TAKE_PTR(f->payload);
        ret->json_len = f->len;
        ret->obj = obj;
        return 1;
}

/* Match a frame (payload NULL if it was oversized) to what is in flight.
 * Returns 1 with *ret filled, 0 to drop it quietly, or a protocol error. */
static int client_dispatch(fka_client *c, fka_frame *f, fka_completion *ret) {
        fka_completion comp = {};
        struct fka_slot *s;

        switch (f->type) {

        case FKA_EVENT:
                if (f->id != 0)
                        return -EPROTO;
                comp.type = FKA_EVENT;
                break;

        case FKA_RESPONSE:
        case FKA_ERROR:
                if (f->id == 0)
                        return -EPROTO;
                s = c->slots + f->id % c->max_in_flight;
                if (s->state != SLOT_PENDING || s->id != f->id)
                        /* A late answer to a request that timed out is fine, once. */
                        return client_tombstone_take(c, f->id) ? 0 : -EPROTO;

                comp.id = f->id;
                comp.type = f->type;
                comp.userdata = s->userdata;
                client_free_slot(c, s);
                break;

        default: /* the host does not serve requests */
                return -EPROTO;
        }

        if (!f->payload)
                comp.error = -EMSGSIZE;
        else
                (void) completion_from_frame(f, &comp);

        *ret = comp;
        return 1;
}

int fka_client_next(fka_client *c, fka_completion *ret) {
        unsigned reads = 0;
        int r;

        if (!c || !ret)
                return -EINVAL;
        c->yielded = false;

        for (;;) {
                fka_frame f = {};
                const void *p;
                size_t n;

                if (client_pop_failed(c, ret) > 0)
                        return 1;
                if (c->error < 0)
                        return c->error;

                r = client_flush(c);
                if (r < 0) {
                        client_break(c, r);
                        continue;
                }

                if (c->rpos >= c->rlen) {
                        /* Never read past the current frame: bytes after it stay in
                         * the socket for whoever reads next. */
                        size_t want = MIN(fka_decoder_wanted(c->dec), sizeof(c->rbuf));
                        ssize_t l;

                        /* A peer that streams a skipped payload (or any bytes that
                         * complete nothing) as fast as we read would keep us here
                         * for ever: yield after a bounded amount. The socket is
                         * still readable, so the caller's poll returns at once. */
                        if (reads++ >= FKA_CLIENT_READS_PER_CALL) {
                                c->yielded = true;
                                return 0;
                        }

                        l = recv(c->fd, c->rbuf, want, MSG_DONTWAIT);
                        if (l < 0) {
                                if (errno == EINTR)
                                        continue;
                                if (errno == EAGAIN || errno == EWOULDBLOCK)
                                        return 0;
                                client_break(c, negative_errno());
                                continue;
                        }
                        if (l == 0) {
                                client_break(c, -ECONNRESET);
                                continue;
                        }
                        c->rpos = 0;
                        c->rlen = (size_t) l;
                }

                p = c->rbuf + c->rpos;
                n = c->rlen - c->rpos;
                r = fka_decoder_feed(c->dec, &p, &n, &f);
                c->rpos = c->rlen - n;
                if (r == 0)
                        continue;
                if (r == 1 || r == -EMSGSIZE)
                        r = client_dispatch(c, &f, ret);
                fka_frame_done(&f);
                if (r < 0) {
                        client_break(c, r);
                        continue;
                }
                if (r > 0)
                        return 1;
        }
}

static uint64_t deadline_after(uint64_t timeout_usec) {
        uint64_t now, deadline;

        if (timeout_usec == UINT64_MAX)
                return 0;
        now = fka_now_usec();
        deadline = timeout_usec > UINT64_MAX - now - 1 ? UINT64_MAX - 1 : now + timeout_usec;
        return deadline ?: 1;
}

/* Block until the client yields its next completion (1, *comp filled) or the
 * connection breaks (<0). Requests past the deadline (0: none) come out as
 * completions with -ETIMEDOUT, so this returns by then. */
static int next_completion(fka_client *c, int fd, uint64_t deadline, fka_completion *comp) {
        for (;;) {
                struct pollfd pfd = { .fd = fd };
                int r, timeout_ms = -1;

                if (deadline > 0)
                        (void) fka_client_expire(c, fka_now_usec());
                r = fka_client_next(c, comp);
                if (r != 0)
                        return r;

                if (deadline > 0) {
                        uint64_t now = fka_now_usec(), left = deadline > now ? deadline - now : 0;

                        timeout_ms = (int) MIN((left + 999) / 1000, (uint64_t) INT_MAX);
                }
                pfd.events = fka_client_events(c);
                if (poll(&pfd, 1, timeout_ms) < 0 && errno != EINTR)
                        return negative_errno();
        }
}

int fka_call(int fd, const char *request_json, uint64_t timeout_usec, char **ret_response_json, uint16_t *ret_type) {
        _cleanup_(fka_client_freep) fka_client *c = NULL;
        uint64_t deadline;
        int r;

        if (fd < 0)
                return -EBADF;
        if (!request_json)
                return -EINVAL;
        deadline = deadline_after(timeout_usec);

        r = fka_client_new(fd, 1, &c);
        if (r < 0)
                return r;
        r = fka_client_send(c, request_json, SIZE_MAX, deadline, NULL);
        if (r < 0)
                return r;

        for (;;) {
                fka_completion comp = {};

                r = next_completion(c, fd, deadline, &comp);
                if (r < 0)
                        return r;
                if (comp.type == FKA_EVENT) {
                        fka_completion_done(&comp);
                        continue;
                }
                r = comp.error;
                if (r >= 0) {
                        if (ret_response_json)
                                *ret_response_json = TAKE_PTR(comp.json);
                        if (ret_type)
                                *ret_type = comp.type;
                }
                fka_completion_done(&comp);
                return r;
        }
}

static bool is_ready_event(const fka_completion *comp) {
        struct json_object *op;

        return comp->type == FKA_EVENT && comp->obj && json_object_object_get_ex(comp->obj, "op", &op) &&
               json_object_is_type(op, json_type_string) && strcmp(json_object_get_string(op), "ready") == 0;
}

int fka_wait_ready(int fd, uint64_t timeout_usec, uint16_t *ret_type) {
        static const char ping[] = "{\"op\":\"ping\"}";
        _cleanup_(fka_client_freep) fka_client *c = NULL;
        uintptr_t newest = 1;
        uint64_t deadline;
        int r;

        if (fd < 0)
                return -EBADF;
        deadline = deadline_after(timeout_usec);

        r = fka_client_new(fd, 64, &c); /* one ping per ready event: a few at most */
        if (r < 0)
                return r;
        r = fka_client_send(c, ping, SIZE_MAX, deadline, (void *) newest);
        if (r < 0)
                return r;

        for (;;) {
                fka_completion comp = {};
                bool ready, answer;

                r = next_completion(c, fd, deadline, &comp);
                if (r < 0)
                        return r;
                ready = is_ready_event(&comp);
                answer = comp.type != FKA_EVENT && (uintptr_t) comp.userdata == newest;
                r = comp.error;
                if (answer && r >= 0 && ret_type)
                        *ret_type = comp.type;
                fka_completion_done(&comp);
                if (answer)
                        return r;
                if (ready) {
                        /* The channel was (re)opened: what came before may be lost. */
                        r = fka_client_send(c, ping, SIZE_MAX, deadline, (void *) ++newest);
                        if (r < 0)
                                return r;
                }
        }
}
