/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Token buckets. See ratelimit.h.
 *
 * Bounds that keep the arithmetic in 64 bits: rate and capacity are at most
 * RATE_TOKENS_MAX (2^40), a debt at most another RATE_TOKENS_MAX, so what a
 * bucket lacks is below 2^42 and that times USEC_PER_SEC below 2^62.
 */
#include "ratelimit.h"
#include "time-util.h"

#define RATE_TOKENS_MAX (UINT64_C(1) << 40)

static uint64_t clamp_tokens(uint64_t v) {
        return v < RATE_TOKENS_MAX ? v : RATE_TOKENS_MAX;
}

void token_bucket_configure(struct token_bucket *b, uint64_t rate, uint64_t capacity, uint64_t now_usec) {
        rate = clamp_tokens(rate);
        capacity = clamp_tokens(capacity);
        if (rate > 0 && capacity == 0)
                capacity = 1;
        *b = (struct token_bucket) {
                .rate = rate,
                .capacity = capacity,
                .tokens = (int64_t) capacity,
                .last_usec = now_usec,
        };
}

void token_bucket_refill(struct token_bucket *b, uint64_t now_usec) {
        uint64_t elapsed, missing, full_after, add;

        if (b->rate == 0)
                return;
        if (now_usec <= b->last_usec) {
                /* Backward (or no time): nothing to add; count from here. */
                b->last_usec = now_usec;
                return;
        }
        elapsed = now_usec - b->last_usec;
        b->last_usec = now_usec;
        if (b->tokens >= (int64_t) b->capacity) {
                b->frac = 0;
                return;
        }
        missing = (uint64_t) ((int64_t) b->capacity - b->tokens); /* < 2^42 */
        /* Microseconds after which the bucket is full whatever the remainder. */
        full_after = (missing * USEC_PER_SEC + b->rate - 1) / b->rate;
        if (elapsed >= full_after) {
                b->tokens = (int64_t) b->capacity;
                b->frac = 0;
                return;
        }
        /* elapsed * rate < missing * USEC_PER_SEC + rate < 2^63 */
        add = elapsed * b->rate + b->frac;
        b->tokens += (int64_t) (add / USEC_PER_SEC);
        b->frac = add % USEC_PER_SEC;
        if (b->tokens >= (int64_t) b->capacity) {
                b->tokens = (int64_t) b->capacity;
                b->frac = 0;
        }
}

uint64_t token_bucket_wait(const struct token_bucket *b, uint64_t cost) {
        uint64_t need, lack;

        if (b->rate == 0)
                return 0;
        need = cost < b->capacity ? cost : b->capacity;
        if (b->tokens >= (int64_t) need)
                return 0;
        lack = (uint64_t) ((int64_t) need - b->tokens); /* < 2^42 */
        /* lack * USEC_PER_SEC > frac: frac < USEC_PER_SEC and lack >= 1 */
        return (lack * USEC_PER_SEC - b->frac + b->rate - 1) / b->rate;
}

void token_bucket_take(struct token_bucket *b, uint64_t cost) {
        int64_t floor_tokens = -(int64_t) RATE_TOKENS_MAX;

        if (b->rate == 0)
                return;
        cost = clamp_tokens(cost);
        /* tokens >= -2^40 and cost <= 2^40: no overflow; the debt is capped */
        b->tokens -= (int64_t) cost;
        if (b->tokens < floor_tokens)
                b->tokens = floor_tokens;
}

void rate_limiter_configure(struct rate_limiter *rl, const struct rate_limit *limit, uint64_t now_usec) {
        uint64_t burst = limit->burst > 0 ? limit->burst : limit->bandwidth;

        token_bucket_configure(&rl->bytes, limit->bandwidth, limit->bandwidth > 0 ? burst : 0, now_usec);
        token_bucket_configure(&rl->ops, limit->ops, limit->ops, now_usec);
        rl->waiting = false;
        rl->waiting_since = 0;
}

bool rate_limiter_active(const struct rate_limiter *rl) {
        return rl->bytes.rate > 0 || rl->ops.rate > 0;
}

/* Refill, then how long a request of bytes and one op waits (0: it passes). */
static uint64_t check(struct rate_limiter *rl, uint64_t bytes, uint64_t now_usec, uint64_t *ret_waited) {
        uint64_t wb, wo;

        if (ret_waited)
                *ret_waited = 0;
        token_bucket_refill(&rl->bytes, now_usec);
        token_bucket_refill(&rl->ops, now_usec);
        wb = token_bucket_wait(&rl->bytes, bytes);
        wo = token_bucket_wait(&rl->ops, 1);
        if (wb > 0 || wo > 0) {
                if (!rl->waiting) {
                        rl->waiting = true;
                        rl->waiting_since = now_usec;
                }
                return wb > wo ? wb : wo;
        }
        if (rl->waiting) {
                if (ret_waited && now_usec > rl->waiting_since)
                        *ret_waited = now_usec - rl->waiting_since;
                rl->waiting = false;
        }
        return 0;
}

uint64_t rate_limiter_consume(struct rate_limiter *rl, uint64_t bytes, uint64_t now_usec, uint64_t *ret_waited) {
        uint64_t wait = check(rl, bytes, now_usec, ret_waited);

        if (wait == 0)
                rate_limiter_charge(rl, bytes);
        return wait;
}

uint64_t rate_limiter_admit(struct rate_limiter *rl, uint64_t now_usec, uint64_t *ret_waited) {
        return check(rl, 0, now_usec, ret_waited);
}

void rate_limiter_charge(struct rate_limiter *rl, uint64_t bytes) {
        token_bucket_take(&rl->bytes, bytes);
        token_bucket_take(&rl->ops, 1);
}
