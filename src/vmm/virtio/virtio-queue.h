/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Split virtqueues (virtio 1.x, section 2.7), device side.
 *
 * Everything the guest controls is untrusted: ring addresses, the queue size,
 * the avail index, every descriptor. The helpers here validate all of it and
 * report a broken queue as a negative errno (and vq->broken), after which the
 * transport marks the device DEVICE_NEEDS_RESET and stops using the queue.
 * Nothing guest-controlled can make them crash, loop or touch host memory
 * outside guest RAM.
 *
 * Not supported (and therefore never offered): VIRTIO_F_INDIRECT_DESC,
 * VIRTIO_F_EVENT_IDX, packed rings. A descriptor with the INDIRECT flag breaks
 * the queue.
 *
 * Ring memory is resolved through vmm_gpa() on every access, so nothing here
 * caches host pointers across a restore (guest RAM may be remapped). The one
 * exception is a popped chain: its buffer pointers are valid until the chain
 * is pushed, the device is reset, or guest RAM is remapped.
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "vmm.h"

#define VIRTQ_MAX_SIZE 256u      /* QueueNumMax of every forkd queue */

#define VIRTQ_DESC_F_NEXT     1u
#define VIRTQ_DESC_F_WRITE    2u
#define VIRTQ_DESC_F_INDIRECT 4u
#define VIRTQ_AVAIL_F_NO_INTERRUPT 1u

/* Ring alignment the driver must honour (virtio 1.x 2.7, table "Alignment"). */
#define VIRTQ_DESC_ALIGN  16u
#define VIRTQ_AVAIL_ALIGN 2u
#define VIRTQ_USED_ALIGN  4u

/* Byte sizes of the three areas for a queue of num entries (used_event /
 * avail_event included: they exist in the layout even without EVENT_IDX). */
#define VIRTQ_DESC_SIZE(num)  (16ull * (num))
#define VIRTQ_AVAIL_SIZE(num) (6ull + 2ull * (num))
#define VIRTQ_USED_SIZE(num)  (6ull + 8ull * (num))

struct virtq {
        uint32_t num;            /* QueueNum as written by the driver (validated at ready) */
        uint32_t num_max;        /* QueueNumMax, a power of two <= VIRTQ_MAX_SIZE */
        bool ready;              /* QueueReady */
        bool broken;             /* the driver violated the ring protocol */
        uint64_t desc_gpa;       /* Descriptor Area */
        uint64_t avail_gpa;      /* Driver Area */
        uint64_t used_gpa;       /* Device Area */
        uint16_t last_avail_idx; /* next avail ring slot the device consumes */
        uint16_t used_idx;       /* the device's copy of used->idx */
        uint16_t inflight;       /* chains popped but not yet pushed */
};

/* One guest buffer of a popped chain: a host pointer into guest RAM. */
struct virtq_buf {
        uint8_t *ptr;
        uint32_t len;
        bool write;              /* device-writable */
};

/* A popped descriptor chain. Device-readable buffers come first (n_out of
 * them), device-writable ones after: a chain in any other order breaks the
 * queue, as the spec requires of the driver (2.7.4.2). */
struct virtq_chain {
        uint16_t head;
        uint16_t n;
        uint16_t n_out;
        uint64_t out_len;        /* bytes in the device-readable part */
        uint64_t in_len;         /* bytes in the device-writable part */
        struct virtq_buf buf[VIRTQ_MAX_SIZE];
};

/* Back to the power-on state (QueueNum = num_max, not ready, indices 0). */
void virtq_reset(struct virtq *vq, uint32_t num_max);

/* True if num is a valid queue size for this queue: a power of two in
 * [1, num_max]. */
bool virtq_num_valid(const struct virtq *vq, uint32_t num);

/* Validate size, alignment and placement (inside guest RAM, overflow-safe)
 * of all three rings. 0 or -EINVAL. */
int virtq_check_layout(struct vmm *vmm, const struct virtq *vq);

/* Pop the next available chain into *c.
 * Returns 1 with *c filled, 0 if the ring is empty (or the queue is not
 * ready), or a negative errno if the queue is broken: vq->broken is set and
 * every later call fails too until virtq_reset(). Breaks the queue: avail idx
 * more than num ahead, head or next index >= num, a chain longer than num
 * (loop), an indirect descriptor, a buffer not entirely in guest RAM, a
 * readable buffer after a writable one. */
int virtq_pop(struct vmm *vmm, struct virtq *vq, struct virtq_chain *c);

/* Give back the chain popped last (not pushed): it will be popped again. */
void virtq_unpop(struct virtq *vq);

/* Put chain head on the used ring with len bytes written into its writable
 * part (the caller keeps len <= the chain's in_len). 0 or negative errno. */
int virtq_push(struct vmm *vmm, struct virtq *vq, uint16_t head, uint32_t len);

/* True if the driver has made a chain available that is not popped yet. */
bool virtq_has_avail(struct vmm *vmm, struct virtq *vq);

/* After pushes: true unless the driver suppressed interrupts
 * (VIRTQ_AVAIL_F_NO_INTERRUPT). Includes the full barrier the spec needs
 * between the used idx store and the flags load. */
bool virtq_should_interrupt(struct vmm *vmm, struct virtq *vq);

/* Copy up to len bytes at byte offset off of the chain's device-readable part
 * into dst. Returns the number of bytes copied. */
size_t virtq_chain_read(const struct virtq_chain *c, uint64_t off, void *dst, size_t len);

/* Copy up to len bytes into the chain's device-writable part at byte offset
 * off. Never touches a device-readable buffer. Returns bytes copied. */
size_t virtq_chain_write(const struct virtq_chain *c, uint64_t off, const void *src, size_t len);

/* Describe [off, off+len) of the readable (write=false) or writable
 * (write=true) part as iovecs. Returns the number of iovecs (<= max), or
 * -ERANGE if the part is shorter than off+len, -E2BIG if max is too small. */
int virtq_chain_iov(const struct virtq_chain *c, bool write, uint64_t off, uint64_t len,
                    struct iovec *iov, unsigned max);
