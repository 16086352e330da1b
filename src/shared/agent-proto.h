/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The forkd agent protocol, host side (docs/agent-protocol.md, forkd-agent-protocol(7)).
 *
 * Three layers, each usable on its own:
 *
 *   fka_encode_header() / fka_decode_header() / fka_frame_build()
 *           the 16-byte header and whole frames;
 *   fka_decoder
 *           incremental: feed any byte chunks (one byte at a time works), get
 *           complete frames; buffers at most FKA_HDR_SIZE + max_payload + 1 bytes;
 *   fka_client
 *           requests over a connected stream socket: ids, matching, deadlines,
 *           an in-flight cap, strict JSON validation of what the peer sends;
 *           nonblocking, for a poll/epoll loop. fka_call() is the blocking
 *           one-shot on top of it.
 *
 * Conventions: functions return >= 0 on success or a negative errno; ret_
 * parameters are written only on success, except where a comment says
 * otherwise (the header of an oversized frame, so that it can be answered).
 * No function logs (the caller decides). Objects are not thread-safe: one
 * decoder or client per thread, or a lock around it.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct json_object;

#define FKA_MAGIC 0x31414B46u                  /* "FKA1" as a little-endian u32 */
#define FKA_HDR_SIZE 16
#define FKA_MAX_PAYLOAD (1024u * 1024u)        /* the host's payload limit */
#define FKA_GUEST_MAX_PAYLOAD (16u * 1024u)    /* the test guest's payload limit */

/* Bounds of the client */
#define FKA_CLIENT_MAX_IN_FLIGHT 4096u         /* largest max_in_flight accepted */
#define FKA_CLIENT_MAX_OUTPUT (4u * 1024u * 1024u) /* bytes queued for writing, at most */
#define FKA_CLIENT_READS_PER_CALL 64u          /* recv()s in one fka_client_next(), at most */
#define FKA_JSON_MAX_DEPTH 64                  /* nesting accepted in a payload */

enum {
        FKA_REQUEST = 1,
        FKA_RESPONSE = 2,
        FKA_ERROR = 3,
        FKA_EVENT = 4,
};

typedef struct fka_header {
        uint16_t type;
        uint16_t flags; /* always 0 in a header that decoded */
        uint32_t id;
        uint32_t len;
} fka_header;

/* Is type one of FKA_REQUEST .. FKA_EVENT? */
bool fka_type_is_valid(uint16_t type);

/* Write a header as it goes on the wire. Raw: no check of its arguments
 * (fka_frame_build() checks), so that tests can craft any header. */
void fka_encode_header(uint8_t out[static FKA_HDR_SIZE], uint16_t type, uint32_t id, uint32_t len);

/* Decode and check a header. Errors:
 *   -EBADMSG   wrong magic, non-zero flags or unknown type; *ret untouched.
 *   -EMSGSIZE  len > max_payload. The exception to the ret_ rule: *ret is
 *              filled (type, id, len) so that the caller can answer the id and
 *              skip len bytes.
 * Checks run in that order, so -EMSGSIZE implies a well-formed header. */
int fka_decode_header(const uint8_t in[static FKA_HDR_SIZE], uint32_t max_payload, fka_header *ret);

/* Build header + payload in one malloc()ed buffer. Does not parse the JSON.
 * -EINVAL unknown type, json NULL with len > 0, id 0 on a request or
 * response, id != 0 on an event; -EMSGSIZE len > FKA_MAX_PAYLOAD; -ENOMEM. */
int fka_frame_build(uint16_t type, uint32_t id, const char *json, size_t len, void **ret_buf, size_t *ret_len);

/* ---- incremental decoder ---- */

typedef struct fka_frame {
        uint16_t type;
        uint32_t id;
        uint32_t len;
        char *payload; /* len bytes plus a NUL, owned by the frame; NULL for an oversized frame */
} fka_frame;

/* Free the payload and reset the frame. Accepts a zeroed frame. */
void fka_frame_done(fka_frame *f);

typedef struct fka_decoder fka_decoder;

/* max_payload: 1 .. FKA_MAX_PAYLOAD, else -EINVAL. */
int fka_decoder_new(uint32_t max_payload, fka_decoder **ret);
fka_decoder *fka_decoder_free(fka_decoder *d);
static inline void fka_decoder_freep(fka_decoder **d) {
        if (*d)
                (void) fka_decoder_free(*d);
}

/*
 * Consume bytes from *data (*size of them), stopping after the first complete
 * frame. *data and *size always advance past what was consumed, whatever the
 * return value. Returns:
 *    1         a frame is complete: *ret holds it (the caller owns the payload);
 *              bytes after it are left in *data.
 *    0         all bytes consumed (*size == 0), no frame complete yet.
 *   -EMSGSIZE  a header announced more than max_payload: *ret gets type, id
 *              and len with payload NULL (the one exception to the ret_ rule,
 *              so the id can be answered); its payload will be skipped and
 *              decoding carries on with the next frame.
 *   -EBADMSG   a header with a wrong magic, non-zero flags or an unknown type;
 *              *ret untouched. Reported once per run of garbage: if the caller
 *              keeps feeding, the decoder discards bytes until a valid header
 *              (resynchronises). The host side fails the connection instead.
 *   -ENOMEM    *ret untouched; the bytes of the frame are lost.
 * Memory grows with the bytes actually received, never beyond
 * FKA_HDR_SIZE + max_payload + 1.
 */
int fka_decoder_feed(fka_decoder *d, const void **data, size_t *size, fka_frame *ret);

/* Bytes still needed to complete the current header, payload or skip (>= 1).
 * Reading no more than this never consumes bytes of the next frame. */
size_t fka_decoder_wanted(const fka_decoder *d);

/* At end of stream: 0 if the decoder sits on a frame boundary, -EPROTO if a
 * frame (or a skipped payload, or garbage) was cut short. */
int fka_decoder_eof(const fka_decoder *d);

/* ---- client ---- */

/*
 * One client per connected stream socket. The client borrows fd (the caller
 * closes it after fka_client_free()) and never blocks: it uses
 * MSG_DONTWAIT, so the fd may be blocking or not. Use from a level-triggered
 * poll loop: fka_client_next() returns 0 once the socket is empty, but also
 * after FKA_CLIENT_READS_PER_CALL reads that completed nothing (a peer that
 * streams bytes as fast as it can), with bytes left in the socket, so that
 * one peer cannot hold its caller for ever:
 *
 *      id = fka_client_send(c, "{\"op\":\"ping\"}", SIZE_MAX, deadline, NULL);
 *      ...
 *      poll for fka_client_events(c) with a timeout up to fka_client_next_deadline(c);
 *      fka_client_expire(c, fka_now_usec());
 *      while ((r = fka_client_next(c, &comp)) > 0) { ...; fka_completion_done(&comp); }
 *
 * Pinging N guests at once: one client per fd, send on each, add the fds to
 * an epoll set, and on readiness call fka_client_next() until it returns 0.
 *
 * What the peer sends is checked. These break the connection: a bad header
 * (-EBADMSG); a request, a response or error whose id is 0 or not in flight,
 * an event with a non-zero id (-EPROTO). A response or error whose payload
 * is not a strict JSON object (valid UTF-8, no trailing bytes), or is too
 * large, fails only its own request (-EBADMSG, -EMSGSIZE). A late answer to
 * a request that timed out is dropped quietly. Once broken, a client fails
 * every request in flight with the connection's error and then returns that
 * error from every call.
 */

typedef struct fka_client fka_client;

typedef struct fka_completion {
        uint32_t id;             /* the request's id; 0 for an event */
        uint16_t type;           /* FKA_RESPONSE, FKA_ERROR or FKA_EVENT; 0 if no frame arrived */
        int error;               /* 0, or a negative errno: -ETIMEDOUT, -EMSGSIZE,
                                  * -EBADMSG (payload not a JSON object) or the
                                  * connection's error */
        void *userdata;          /* as passed to fka_client_send(); NULL for events */
        char *json;              /* the payload, NUL-terminated; NULL if error != 0 */
        size_t json_len;
        struct json_object *obj; /* the parsed payload (a reference); NULL if error != 0 */
} fka_completion;

/* Free what the completion owns and zero it. Accepts a zeroed completion. */
void fka_completion_done(fka_completion *c);

/* CLOCK_MONOTONIC in microseconds: the clock of every deadline here. */
uint64_t fka_now_usec(void);

/* max_in_flight: 1 .. FKA_CLIENT_MAX_IN_FLIGHT, else -EINVAL; -EBADF fd < 0. */
int fka_client_new(int fd, unsigned max_in_flight, fka_client **ret);
fka_client *fka_client_free(fka_client *c);
static inline void fka_client_freep(fka_client **c) {
        if (*c)
                (void) fka_client_free(*c);
}

int fka_client_fd(const fka_client *c);

/*
 * Queue a request and try to write it. json is one JSON object (len bytes,
 * or up to its NUL if len == SIZE_MAX); deadline_usec is absolute
 * CLOCK_MONOTONIC, 0 for none. Returns the request id (1 .. INT32_MAX) once
 * queued; a write error later fails the request through fka_client_next().
 * Errors, nothing queued: -EINVAL json is not a strict JSON object;
 * -EMSGSIZE larger than FKA_MAX_PAYLOAD; -EBUSY max_in_flight requests are
 * outstanding (answered ones count until collected); -ENOBUFS the output
 * queue is full; the connection's error if broken.
 */
int fka_client_send(fka_client *c, const char *json, size_t len, uint64_t deadline_usec, void *userdata);

/*
 * Write queued output, read what the socket has, and return the next
 * completion without blocking:
 *    1  *ret holds a completion (release with fka_completion_done());
 *    0  nothing more for now, the socket read until EAGAIN; or
 *       FKA_CLIENT_READS_PER_CALL reads done, fka_client_yielded() true:
 *       call again soon (an edge-triggered poll may not wake for what is
 *       left); then wait for fka_client_events();
 *   <0  the connection is broken and every request in flight was returned
 *       (-ECONNRESET end of stream, -EBADMSG/-EPROTO hostile peer, or the
 *       errno of a read or write); *ret untouched.
 */
int fka_client_next(fka_client *c, fka_completion *ret);

/* Fail every request whose deadline is <= now_usec with -ETIMEDOUT (they
 * come out of fka_client_next()). Returns how many. */
int fka_client_expire(fka_client *c, uint64_t now_usec);

/* The earliest deadline in flight, or UINT64_MAX if none. */
uint64_t fka_client_next_deadline(const fka_client *c);

/* poll() events to wait for: POLLIN, plus POLLOUT while output is queued. */
short fka_client_events(const fka_client *c);

/* Requests outstanding: in flight, or answered and not yet collected. */
unsigned fka_client_in_flight(const fka_client *c);

/* The last fka_client_next() returned 0 after its FKA_CLIENT_READS_PER_CALL
 * reads, not at EAGAIN: bytes may still wait in the socket. */
bool fka_client_yielded(const fka_client *c);

/*
 * Blocking one-shot: send request_json on fd, wait (poll) up to
 * timeout_usec (UINT64_MAX: no limit) for its answer. Returns 0 with
 * *ret_type FKA_RESPONSE or FKA_ERROR and *ret_response_json the payload
 * (malloc()ed; the caller frees), both optional. Events arriving meanwhile
 * are discarded; bytes after the answer are not read. Errors: those of
 * fka_client_send() and fka_client_next(), -ETIMEDOUT (the fd then holds a
 * late answer: do not reuse it for fka_call()), or the completion's error.
 */
int fka_call(int fd, const char *request_json, uint64_t timeout_usec, char **ret_response_json, uint16_t *ret_type);

/*
 * Wait until a freshly booted guest's agent answers ping, within timeout_usec.
 * A Linux guest's tty drops whatever arrived before its agent opened the
 * channel; the agent then sends a "ready" event. Ping is sent at once and again
 * after every ready event, and only the answer to the newest ping counts, so
 * no answer is left in flight when this returns (what a snapshot would keep).
 * Returns 0 and the answer's type (FKA_RESPONSE or FKA_ERROR), or a negative
 * errno (-ETIMEDOUT, or the connection's error).
 */
int fka_wait_ready(int fd, uint64_t timeout_usec, uint16_t *ret_type);
