/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Split virtqueue helpers (virtio 1.x 2.7), device side. See virtio-queue.h.
 *
 * Memory ordering (2.7.13): the driver writes ring entries, then (after a
 * write barrier) avail->idx; we read avail->idx with acquire semantics before
 * reading ring entries and descriptors. We write used elements, then publish
 * used->idx with release semantics. Before looking at avail->flags to decide
 * about an interrupt we need a full barrier (store/load ordering).
 */

#include <endian.h>
#include <errno.h>
#include <string.h>

#include "virtio-queue.h"

struct virtq_desc_le {
        uint64_t addr;
        uint32_t len;
        uint16_t flags;
        uint16_t next;
};

static bool is_pow2(uint32_t v) {
        return v != 0 && (v & (v - 1)) == 0;
}

void virtq_reset(struct virtq *vq, uint32_t num_max) {
        *vq = (struct virtq) {
                .num = num_max,
                .num_max = num_max,
        };
}

bool virtq_num_valid(const struct virtq *vq, uint32_t num) {
        return is_pow2(num) && num <= vq->num_max && num <= VIRTQ_MAX_SIZE;
}

int virtq_check_layout(struct vmm *vmm, const struct virtq *vq) {
        if (!virtq_num_valid(vq, vq->num))
                return -EINVAL;
        if (vq->desc_gpa % VIRTQ_DESC_ALIGN || vq->avail_gpa % VIRTQ_AVAIL_ALIGN ||
            vq->used_gpa % VIRTQ_USED_ALIGN)
                return -EINVAL;
        if (!vmm_gpa(vmm, vq->desc_gpa, VIRTQ_DESC_SIZE(vq->num)) ||
            !vmm_gpa(vmm, vq->avail_gpa, VIRTQ_AVAIL_SIZE(vq->num)) ||
            !vmm_gpa(vmm, vq->used_gpa, VIRTQ_USED_SIZE(vq->num)))
                return -EINVAL;
        return 0;
}

static int virtq_break(struct virtq *vq) {
        vq->broken = true;
        return -EBADMSG;
}

/* Host pointer to the avail ring, or NULL. Revalidated on every use. */
static uint8_t *avail_ring(struct vmm *vmm, const struct virtq *vq) {
        if (!virtq_num_valid(vq, vq->num) || vq->avail_gpa % VIRTQ_AVAIL_ALIGN)
                return NULL;
        return vmm_gpa(vmm, vq->avail_gpa, VIRTQ_AVAIL_SIZE(vq->num));
}

static uint16_t load_avail_idx(const uint8_t *avail) {
        /* acquire: ring entries and descriptors are read after this load */
        return le16toh(__atomic_load_n((const uint16_t *) (avail + 2), __ATOMIC_ACQUIRE));
}

bool virtq_has_avail(struct vmm *vmm, struct virtq *vq) {
        uint8_t *avail;

        if (!vq->ready || vq->broken)
                return false;
        avail = avail_ring(vmm, vq);
        if (!avail)
                return false;
        return load_avail_idx(avail) != vq->last_avail_idx;
}

int virtq_pop(struct vmm *vmm, struct virtq *vq, struct virtq_chain *c) {
        const struct virtq_desc_le *table;
        uint8_t *avail;
        uint16_t avail_idx, pending, head, i;
        uint64_t out_len = 0, in_len = 0;
        unsigned n = 0, n_out = 0;

        if (vq->broken)
                return -EBADMSG;
        if (!vq->ready)
                return 0;

        avail = avail_ring(vmm, vq);
        table = vmm_gpa(vmm, vq->desc_gpa, VIRTQ_DESC_SIZE(vq->num));
        if (!avail || !table || vq->desc_gpa % VIRTQ_DESC_ALIGN)
                return virtq_break(vq);

        avail_idx = load_avail_idx(avail);
        pending = (uint16_t) (avail_idx - vq->last_avail_idx);
        if (pending == 0)
                return 0;
        if (pending > vq->num)
                return virtq_break(vq); /* the driver cannot have more than num chains out */

        head = le16toh(__atomic_load_n((const uint16_t *) (avail + 4 + 2u * (vq->last_avail_idx % vq->num)),
                                       __ATOMIC_RELAXED));
        if (head >= vq->num)
                return virtq_break(vq);

        for (i = head;;) {
                struct virtq_desc_le d;
                uint16_t flags;
                uint64_t addr;
                uint32_t len;
                uint8_t *p;

                if (n >= vq->num)
                        return virtq_break(vq); /* longer than the table: a loop */

                /* one snapshot of the descriptor: never re-read a checked field */
                memcpy(&d, &table[i], sizeof d);
                addr = le64toh(d.addr);
                len = le32toh(d.len);
                flags = le16toh(d.flags);

                if (flags & VIRTQ_DESC_F_INDIRECT)
                        return virtq_break(vq);
                p = vmm_gpa(vmm, addr, len);
                if (!p)
                        return virtq_break(vq);
                if (flags & VIRTQ_DESC_F_WRITE) {
                        in_len += len;
                } else {
                        if (n_out != n)
                                return virtq_break(vq); /* readable after writable */
                        out_len += len;
                        n_out++;
                }
                c->buf[n++] = (struct virtq_buf) {
                        .ptr = p,
                        .len = len,
                        .write = !!(flags & VIRTQ_DESC_F_WRITE),
                };

                if (!(flags & VIRTQ_DESC_F_NEXT))
                        break;
                i = le16toh(d.next);
                if (i >= vq->num)
                        return virtq_break(vq);
        }

        c->head = head;
        c->n = (uint16_t) n;
        c->n_out = (uint16_t) n_out;
        c->out_len = out_len;
        c->in_len = in_len;
        vq->last_avail_idx++;
        vq->inflight++;
        return 1;
}

void virtq_unpop(struct virtq *vq) {
        if (vq->inflight == 0)
                return;
        vq->inflight--;
        vq->last_avail_idx--;
}

int virtq_push(struct vmm *vmm, struct virtq *vq, uint16_t head, uint32_t len) {
        uint8_t *used;
        uint32_t *elem;

        if (vq->broken)
                return -EBADMSG;
        if (!vq->ready || !virtq_num_valid(vq, vq->num) || vq->used_gpa % VIRTQ_USED_ALIGN || head >= vq->num)
                return virtq_break(vq);
        used = vmm_gpa(vmm, vq->used_gpa, VIRTQ_USED_SIZE(vq->num));
        if (!used)
                return virtq_break(vq);

        elem = (uint32_t *) (used + 4 + 8u * (vq->used_idx % vq->num));
        __atomic_store_n(&elem[0], htole32(head), __ATOMIC_RELAXED);
        __atomic_store_n(&elem[1], htole32(len), __ATOMIC_RELAXED);
        vq->used_idx++;
        /* release: the element is visible before the index that covers it */
        __atomic_store_n((uint16_t *) (used + 2), htole16(vq->used_idx), __ATOMIC_RELEASE);
        if (vq->inflight > 0)
                vq->inflight--;
        return 0;
}

bool virtq_should_interrupt(struct vmm *vmm, struct virtq *vq) {
        uint8_t *avail;
        uint16_t flags;

        avail = avail_ring(vmm, vq);
        if (!avail)
                return true;
        /* full barrier: our used->idx store must be ordered before this load,
         * or we could miss a driver that just re-enabled interrupts */
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        flags = le16toh(__atomic_load_n((const uint16_t *) avail, __ATOMIC_RELAXED));
        return !(flags & VIRTQ_AVAIL_F_NO_INTERRUPT);
}

/* Walk the bytes of one direction of the chain. */
static size_t chain_copy(const struct virtq_chain *c, bool write, uint64_t off, void *data, size_t len) {
        uint8_t *d = data;
        size_t done = 0;

        for (unsigned k = 0; k < c->n && done < len; k++) {
                const struct virtq_buf *b = &c->buf[k];
                size_t chunk;

                if (b->write != write)
                        continue;
                if (off >= b->len) {
                        off -= b->len;
                        continue;
                }
                chunk = MIN((uint64_t) b->len - off, (uint64_t) (len - done));
                if (write)
                        memcpy(b->ptr + off, d + done, chunk);
                else
                        memcpy(d + done, b->ptr + off, chunk);
                done += chunk;
                off = 0;
        }
        return done;
}

size_t virtq_chain_read(const struct virtq_chain *c, uint64_t off, void *dst, size_t len) {
        return chain_copy(c, false, off, dst, len);
}

size_t virtq_chain_write(const struct virtq_chain *c, uint64_t off, const void *src, size_t len) {
        return chain_copy(c, true, off, (void *) src, len);
}

int virtq_chain_iov(const struct virtq_chain *c, bool write, uint64_t off, uint64_t len,
                    struct iovec *iov, unsigned max) {
        unsigned n = 0;

        for (unsigned k = 0; k < c->n && len > 0; k++) {
                const struct virtq_buf *b = &c->buf[k];
                uint64_t chunk;

                if (b->write != write)
                        continue;
                if (off >= b->len) {
                        off -= b->len;
                        continue;
                }
                chunk = MIN((uint64_t) b->len - off, len);
                if (n >= max)
                        return -E2BIG;
                iov[n++] = (struct iovec) { .iov_base = b->ptr + off, .iov_len = chunk };
                len -= chunk;
                off = 0;
        }
        if (len > 0)
                return -ERANGE;
        return (int) n;
}
