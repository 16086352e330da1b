/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Split virtqueues as a hostile guest drives them: virtq_pop() / virtq_push()
 * and the chain accessors over a fake guest RAM of 64 KiB (a plain heap
 * buffer, so AddressSanitizer sees any access outside it).
 *
 * Input: u16 queue size, u16 starting avail index, u32 descriptor, driver and
 * device area addresses (taken as they are: out of range too), a byte of
 * flags (bit 0: unpop and pop again the first chain), then the guest RAM's
 * first bytes (descriptors, rings, buffers; the rest is zero). The queue must
 * pass virtq_check_layout() as the transport requires at QueueReady; then
 * chains are popped until the ring is empty or broken (at most 2 * num), each
 * read, written, turned into iovecs and pushed.
 */

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "virtio-queue.h"
#include "vmm.h"

#define MEM_SIZE (64u * 1024u)
#define HDR 17

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint32_t le(const uint8_t *p, unsigned n) {
        uint32_t v = 0;

        for (unsigned i = 0; i < n; i++)
                v |= (uint32_t) p[i] << (8 * i);
        return v;
}

static bool in_ram(const struct vmm *v, const uint8_t *p, uint64_t len) {
        return p >= v->mem && len <= v->mem_size && (uint64_t) (p - v->mem) <= v->mem_size - len;
}

static void check_chain(struct vmm *v, const struct virtq *vq, struct virtq_chain *c) {
        static uint8_t scratch[MEM_SIZE];
        struct iovec iov[VIRTQ_MAX_SIZE];
        uint64_t out = 0, in = 0;
        size_t n;
        int r;

        if (c->n == 0 || c->n > vq->num || c->n_out > c->n || c->head >= vq->num)
                abort();
        for (unsigned i = 0; i < c->n; i++) {
                if (!in_ram(v, c->buf[i].ptr, c->buf[i].len))
                        abort();
                if (c->buf[i].write != (i >= c->n_out))
                        abort(); /* readable first, then writable */
                if (c->buf[i].write)
                        in += c->buf[i].len;
                else
                        out += c->buf[i].len;
        }
        if (out != c->out_len || in != c->in_len)
                abort();

        n = virtq_chain_read(c, 0, scratch, sizeof(scratch));
        if (n > c->out_len || n > sizeof(scratch))
                abort();
        (void) virtq_chain_read(c, c->out_len / 2, scratch, 7);
        n = virtq_chain_write(c, 0, scratch, sizeof(scratch));
        if (n > c->in_len)
                abort();
        (void) virtq_chain_write(c, c->in_len / 2 + 1, scratch, 3);

        r = virtq_chain_iov(c, false, 0, c->out_len, iov, VIRTQ_MAX_SIZE);
        if (r < 0 && r != -E2BIG)
                abort();
        for (int i = 0; i < r; i++)
                if (!in_ram(v, iov[i].iov_base, iov[i].iov_len))
                        abort();
        r = virtq_chain_iov(c, true, c->in_len / 3, c->in_len - c->in_len / 3, iov, 4);
        if (r < 0 && r != -E2BIG)
                abort();
        if (virtq_chain_iov(c, true, 0, c->in_len + 1, iov, VIRTQ_MAX_SIZE) != -ERANGE)
                abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static struct virtq_chain c;
        struct vmm v = { .kvm_fd = -1, .vm_fd = -1, .vcpu_fd = -1, .mem_fd = -1 };
        struct virtq vq;
        uint8_t flags;
        int r;

        if (size < HDR)
                return 0;
        v.stats = &v.own_stats; /* as vmm_new(): never NULL */
        v.mem = calloc(1, MEM_SIZE);
        if (!v.mem)
                abort();
        v.mem_size = MEM_SIZE;
        memcpy(v.mem, data + HDR, size - HDR < MEM_SIZE ? size - HDR : MEM_SIZE);

        virtq_reset(&vq, VIRTQ_MAX_SIZE);
        if (!virtq_num_valid(&vq, le(data, 2)))
                goto finish;
        vq.num = le(data, 2);
        vq.last_avail_idx = vq.used_idx = (uint16_t) le(data + 2, 2);
        vq.desc_gpa = le(data + 4, 4);
        vq.avail_gpa = le(data + 8, 4);
        vq.used_gpa = le(data + 12, 4);
        flags = data[16];
        if (virtq_check_layout(&v, &vq) < 0)
                goto finish;
        vq.ready = true;

        for (unsigned i = 0; i < 2 * vq.num; i++) {
                r = virtq_pop(&v, &vq, &c);
                if (r < 0) {
                        if (!vq.broken || virtq_pop(&v, &vq, &c) >= 0)
                                abort(); /* broken stays broken */
                        break;
                }
                if (r == 0)
                        break;
                if (i == 0 && (flags & 1)) {
                        virtq_unpop(&vq);
                        r = virtq_pop(&v, &vq, &c);
                        if (r <= 0)
                                abort(); /* the same chain again */
                }
                check_chain(&v, &vq, &c);
                r = virtq_push(&v, &vq, c.head, (uint32_t) (c.in_len < UINT32_MAX ? c.in_len : UINT32_MAX));
                if (r < 0 && !vq.broken)
                        abort();
                (void) virtq_should_interrupt(&v, &vq);
        }

finish:
        free(v.mem);
        return 0;
}
