/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Token buckets for disk_rate and net_rate.
 *
 * A rate limiter is two buckets: one of bytes (refilled at bandwidth bytes/s,
 * holding at most burst bytes, one second's worth of bandwidth when no burst
 * is given) and one of operations (refilled at ops/s, holding at most one
 * second's worth). A bucket with a rate of 0 is unlimited. Buckets start full.
 *
 * A request is let through when every limited bucket holds what it costs, or
 * at least holds all it can hold (a request larger than the bucket passes once
 * the bucket is full, and leaves it in debt: what it took beyond the bucket is
 * paid back by the refill before anything else passes). Either both buckets
 * are charged or neither.
 *
 * Pure arithmetic: the caller passes the time (monotonic microseconds). A
 * clock that goes backward refills nothing and moves the reference back; no
 * product or sum overflows for any rate, burst and request within the bounds
 * of fork-options.h, and for any time.
 */

#include <stdbool.h>
#include <stdint.h>

#include "fork-options.h"

struct token_bucket {
        uint64_t rate;      /* tokens per second; 0: unlimited */
        uint64_t capacity;  /* the most tokens it holds */
        int64_t tokens;     /* negative: in debt */
        uint64_t frac;      /* refill not yet a whole token, in millionths of a token */
        uint64_t last_usec; /* when it was last refilled */
};

struct rate_limiter {
        struct token_bucket bytes;
        struct token_bucket ops;
        bool waiting;           /* a request was refused and has not passed since */
        uint64_t waiting_since; /* when it was first refused */
};

/* Set the rates (replacing earlier ones) and fill both buckets. */
void rate_limiter_configure(struct rate_limiter *rl, const struct rate_limit *limit, uint64_t now_usec);

/* Whether any dimension is limited. */
bool rate_limiter_active(const struct rate_limiter *rl);

/* Let a request of the given bytes and one operation through: returns 0 and
 * charges the buckets, or returns how many microseconds (>= 1) to wait before
 * it would pass, charging nothing. *ret_waited (may be NULL) gets how long the
 * refused requests waited, when one finally passes (else 0). */
uint64_t rate_limiter_consume(struct rate_limiter *rl, uint64_t bytes, uint64_t now_usec, uint64_t *ret_waited);

/* For a request whose size is known only once it ran (a received frame):
 * rate_limiter_admit() says whether one may run now, as consume() would for
 * 0 bytes, charging nothing; rate_limiter_charge() then charges its bytes and
 * its op (the bytes bucket may go into debt). */
uint64_t rate_limiter_admit(struct rate_limiter *rl, uint64_t now_usec, uint64_t *ret_waited);
void rate_limiter_charge(struct rate_limiter *rl, uint64_t bytes);

/* The parts, for tests. */
void token_bucket_configure(struct token_bucket *b, uint64_t rate, uint64_t capacity, uint64_t now_usec);
void token_bucket_refill(struct token_bucket *b, uint64_t now_usec);
/* Microseconds until the bucket holds min(cost, capacity) (0: it does now). */
uint64_t token_bucket_wait(const struct token_bucket *b, uint64_t cost);
void token_bucket_take(struct token_bucket *b, uint64_t cost);
