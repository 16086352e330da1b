/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * A process's output log (agent-proc-internal.h): the bytes [start, end) of its
 * output at buf[offset % cap], and the runs of one stream, each kept as
 * (offset << 1 | stream) where it begins. The buffer grows as output comes, up
 * to AGENT_PROC_RING; then the oldest bytes are overwritten.
 */

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "agent-image.h"
#include "agent-proc-internal.h"
#include "macro.h"

uint64_t ring_seg(const ProcRing *r, size_t i) {
        return r->segs[(r->seg_first + i) & (r->seg_cap - 1)];
}

void ring_done(ProcRing *r) {
        r->buf = mfree(r->buf);
        r->segs = mfree(r->segs);
        r->cap = r->seg_cap = r->seg_first = r->n_segs = 0;
}

/* Out of memory: the bytes kept are dropped (a reader sees them as a gap). */
static void ring_drop_all(ProcRing *r, uint64_t new_end) {
        r->end = r->start = new_end;
        r->seg_first = r->n_segs = 0;
}

static int ring_grow(ProcRing *r, size_t need) {
        size_t cap = MAX(r->cap, (size_t) 4096);
        uint8_t *b;

        while (cap < need)
                cap *= 2;
        cap = MIN(cap, (size_t) AGENT_PROC_RING);
        if (cap <= r->cap)
                return 0;
        b = malloc(cap);
        if (!b)
                return -ENOMEM;
        for (uint64_t o = r->start; o < r->end; o++) /* at most 1 MiB, once per doubling */
                b[o & (cap - 1)] = r->buf[o & (r->cap - 1)];
        free(r->buf);
        r->buf = b;
        r->cap = cap;
        return 0;
}

static int ring_push_seg(ProcRing *r, uint64_t v) {
        if (r->n_segs == r->seg_cap) {
                size_t cap = MAX(r->seg_cap * 2, (size_t) 16);
                uint64_t *s;

                if (r->seg_cap >= AGENT_PROC_MAX_SEGMENTS) {
                        /* the oldest run goes, with its bytes */
                        r->seg_first = (r->seg_first + 1) & (r->seg_cap - 1);
                        r->n_segs--;
                        r->start = MAX(r->start, ring_seg(r, 0) >> 1);
                } else {
                        s = malloc(cap * sizeof *s);
                        if (!s)
                                return -ENOMEM;
                        for (size_t i = 0; i < r->n_segs; i++)
                                s[i] = ring_seg(r, i);
                        free(r->segs);
                        r->segs = s;
                        r->seg_cap = cap;
                        r->seg_first = 0;
                }
        }
        r->segs[(r->seg_first + r->n_segs) & (r->seg_cap - 1)] = v;
        r->n_segs++;
        return 0;
}

void ring_append(ProcRing *r, const uint8_t *data, size_t n, unsigned stream) {
        size_t pos, first;

        if (n == 0)
                return;
        assert(n <= AGENT_PROC_RING);
        if (r->end - r->start + n > r->cap && ring_grow(r, (size_t) (r->end - r->start) + n) < 0)
                return ring_drop_all(r, r->end + n);
        if (r->n_segs == 0 || (ring_seg(r, r->n_segs - 1) & 1) != stream)
                if (ring_push_seg(r, r->end << 1 | stream) < 0)
                        return ring_drop_all(r, r->end + n);
        if (r->end + n - r->start > r->cap)
                r->start = r->end + n - r->cap;
        while (r->n_segs > 1 && (ring_seg(r, 1) >> 1) <= r->start) {
                r->seg_first = (r->seg_first + 1) & (r->seg_cap - 1);
                r->n_segs--;
        }
        pos = (size_t) (r->end & (r->cap - 1));
        first = MIN(n, r->cap - pos);
        memcpy(r->buf + pos, data, first);
        memcpy(r->buf, data + first, n - first);
        r->end += n;
}

size_t ring_find(const ProcRing *r, uint64_t o) {
        size_t lo = 0, hi = r->n_segs;

        while (hi - lo > 1) {
                size_t mid = lo + (hi - lo) / 2;

                if ((ring_seg(r, mid) >> 1) <= o)
                        lo = mid;
                else
                        hi = mid;
        }
        return lo;
}
