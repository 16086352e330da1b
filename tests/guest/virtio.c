/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd-test-guest: virtio-mmio (version 2) drivers for the console and the
 * block device, in ring 3. Every MMIO access is a VM exit, so the hot paths
 * touch the device registers as little as possible: one QueueNotify per
 * transmitted frame, one InterruptACK per interrupt, one QueueNotify per
 * batch of re-posted receive buffers.
 */
#include "guest.h"

/* virtio-mmio registers */
#define VM_MAGIC            0x000
#define VM_VERSION          0x004
#define VM_DEVICE_ID        0x008
#define VM_DEVICE_FEATURES  0x010
#define VM_DEVICE_FEAT_SEL  0x014
#define VM_DRIVER_FEATURES  0x020
#define VM_DRIVER_FEAT_SEL  0x024
#define VM_QUEUE_SEL        0x030
#define VM_QUEUE_NUM_MAX    0x034
#define VM_QUEUE_NUM        0x038
#define VM_QUEUE_READY      0x044
#define VM_QUEUE_NOTIFY     0x050
#define VM_INTERRUPT_ACK    0x064
#define VM_STATUS           0x070
#define VM_QUEUE_DESC_LO    0x080
#define VM_QUEUE_DESC_HI    0x084
#define VM_QUEUE_DRIVER_LO  0x090
#define VM_QUEUE_DRIVER_HI  0x094
#define VM_QUEUE_DEVICE_LO  0x0a0
#define VM_QUEUE_DEVICE_HI  0x0a4
#define VM_CONFIG           0x100

#define VIRTIO_MMIO_MAGIC   0x74726976u

#define ST_ACKNOWLEDGE      1
#define ST_DRIVER           2
#define ST_DRIVER_OK        4
#define ST_FEATURES_OK      8
#define ST_FAILED           0x80

#define VIRTIO_BLK_T_IN     0
#define VIRTIO_BLK_T_OUT    1

/*
 * The console page: both console rings and the receive buffers, so that the
 * receive/transmit hot path writes exactly this page and the hot page.
 */
#define RING_BYTES(qs)      (16u * (qs) + 6u + 2u * (qs) + 2u + 6u + 8u * (qs))
#define CONS_RXBUF_OFF      1024u
_Static_assert(2 * (RING_BYTES(CONS_QSIZE) + 16) <= CONS_RXBUF_OFF, "console rings overflow");
_Static_assert(CONS_RXBUF_OFF + RX_NBUF * RX_BUFSZ <= 4096, "console page overflow");
_Static_assert(RX_NBUF <= CONS_QSIZE, "more rx buffers than descriptors");

static u8 cons_page[4096] __attribute__((aligned(4096)));

/* the block page: rings, request header and status byte; data in blk_data */
struct blk_req_hdr {
        u32 type;
        u32 reserved;
        u64 sector;
};
static u8 blk_page[4096] __attribute__((aligned(4096)));
#define BLK_HDR_OFF         2048u
#define BLK_STATUS_OFF      2064u
_Static_assert(RING_BYTES(BLK_QSIZE) <= BLK_HDR_OFF, "blk ring overflow");
u8 blk_data[4096] __attribute__((aligned(4096)));

static u64 blk_mmio, cons_mmio;

u8 *cons_rx_buf(u32 i)
{
        return cons_page + CONS_RXBUF_OFF + i * RX_BUFSZ;
}

/* place a split ring of `size` entries at mem; returns the bytes used */
static u32 vq_place(struct vq *q, u8 *mem, u16 size, u16 index, u64 mmio)
{
        u32 off = 0;

        q->desc = (volatile struct vring_desc *)mem;
        off += 16u * size;
        q->avail = (volatile struct vring_avail *)(mem + off);
        off += 6u + 2u * size;
        off = (off + 3) & ~3u;
        q->used = (volatile struct vring_used *)(mem + off);
        off += 6u + 8u * size;
        q->size = size;
        q->index = index;
        q->mmio = mmio;
        return off;
}

static int virtio_fail(u64 m, const char *what)
{
        mmio_write32(m + VM_STATUS, ST_FAILED);
        serial_puts("forkd-test-guest: virtio ");
        serial_put_hex(m);
        serial_puts(": ");
        serial_puts(what);
        serial_puts("\n");
        return -1;
}

static int virtio_begin(u64 m, u32 devid)
{
        if (mmio_read32(m + VM_MAGIC) != VIRTIO_MMIO_MAGIC)
                return virtio_fail(m, "bad magic");
        if (mmio_read32(m + VM_VERSION) != 2)
                return virtio_fail(m, "not virtio-mmio version 2");
        if (mmio_read32(m + VM_DEVICE_ID) != devid)
                return virtio_fail(m, "unexpected device id");
        mmio_write32(m + VM_STATUS, 0);
        if (mmio_read32(m + VM_STATUS) != 0)
                return virtio_fail(m, "reset did not complete");
        mmio_write32(m + VM_STATUS, ST_ACKNOWLEDGE);
        mmio_write32(m + VM_STATUS, ST_ACKNOWLEDGE | ST_DRIVER);
        mmio_write32(m + VM_DEVICE_FEAT_SEL, 1);
        if (!(mmio_read32(m + VM_DEVICE_FEATURES) & 1)) /* VIRTIO_F_VERSION_1 = bit 32 */
                return virtio_fail(m, "no VIRTIO_F_VERSION_1");
        mmio_write32(m + VM_DRIVER_FEAT_SEL, 0);
        mmio_write32(m + VM_DRIVER_FEATURES, 0);
        mmio_write32(m + VM_DRIVER_FEAT_SEL, 1);
        mmio_write32(m + VM_DRIVER_FEATURES, 1);
        mmio_write32(m + VM_STATUS, ST_ACKNOWLEDGE | ST_DRIVER | ST_FEATURES_OK);
        if (!(mmio_read32(m + VM_STATUS) & ST_FEATURES_OK))
                return virtio_fail(m, "FEATURES_OK refused");
        return 0;
}

static int vq_enable(const struct vq *q)
{
        u64 m = q->mmio;

        mmio_write32(m + VM_QUEUE_SEL, q->index);
        if (mmio_read32(m + VM_QUEUE_READY) != 0)
                return virtio_fail(m, "queue already live");
        if (mmio_read32(m + VM_QUEUE_NUM_MAX) < q->size)
                return virtio_fail(m, "queue too small");
        mmio_write32(m + VM_QUEUE_NUM, q->size);
        mmio_write32(m + VM_QUEUE_DESC_LO, (u32)(u64)q->desc);
        mmio_write32(m + VM_QUEUE_DESC_HI, (u32)((u64)q->desc >> 32));
        mmio_write32(m + VM_QUEUE_DRIVER_LO, (u32)(u64)q->avail);
        mmio_write32(m + VM_QUEUE_DRIVER_HI, (u32)((u64)q->avail >> 32));
        mmio_write32(m + VM_QUEUE_DEVICE_LO, (u32)(u64)q->used);
        mmio_write32(m + VM_QUEUE_DEVICE_HI, (u32)((u64)q->used >> 32));
        mmio_write32(m + VM_QUEUE_READY, 1);
        return 0;
}

static void virtio_driver_ok(u64 m)
{
        mmio_write32(m + VM_STATUS, ST_ACKNOWLEDGE | ST_DRIVER | ST_FEATURES_OK | ST_DRIVER_OK);
}

void vq_notify(const struct vq *q)
{
        mmio_write32(q->mmio + VM_QUEUE_NOTIFY, q->index);
}

int virtio_init_blk(u64 m)
{
        struct vq *q = &boot.blkq;
        u64 cap;

        if (virtio_begin(m, FORKD_VIRTIO_ID_BLK) < 0)
                return -1;
        cap = mmio_read32(m + VM_CONFIG);
        cap |= (u64)mmio_read32(m + VM_CONFIG + 4) << 32;
        boot.blk_blocks = cap / 8;

        vq_place(q, blk_page, BLK_QSIZE, 0, m);
        /* one request at a time: descriptors 0 -> 1 -> 2, fixed */
        q->desc[0].addr = (u64)(blk_page + BLK_HDR_OFF);
        q->desc[0].len = sizeof(struct blk_req_hdr);
        q->desc[0].flags = VRING_DESC_F_NEXT;
        q->desc[0].next = 1;
        q->desc[1].addr = (u64)blk_data;
        q->desc[1].len = sizeof(blk_data);
        q->desc[1].flags = VRING_DESC_F_NEXT;
        q->desc[1].next = 2;
        q->desc[2].addr = (u64)(blk_page + BLK_STATUS_OFF);
        q->desc[2].len = 1;
        q->desc[2].flags = VRING_DESC_F_WRITE;
        q->desc[2].next = 0;
        if (vq_enable(q) < 0)
                return -1;
        virtio_driver_ok(m);
        blk_mmio = m;
        return 0;
}

int virtio_init_console(u64 m)
{
        u32 off;

        if (virtio_begin(m, FORKD_VIRTIO_ID_CONSOLE) < 0)
                return -1;
        off = vq_place(&boot.rxq, cons_page, CONS_QSIZE, 0, m);
        off = (off + 15) & ~15u;
        vq_place(&boot.txq, cons_page + off, CONS_QSIZE, 1, m);

        for (u32 i = 0; i < RX_NBUF; i++) {
                boot.rxq.desc[i].addr = (u64)cons_rx_buf(i);
                boot.rxq.desc[i].len = RX_BUFSZ;
                boot.rxq.desc[i].flags = VRING_DESC_F_WRITE;
                boot.rxq.desc[i].next = 0;
                boot.rxq.avail->ring[i] = (u16)i;
        }
        boot.rxq.avail->flags = 0;
        boot.rxq.avail->idx = RX_NBUF;
        hot.rxq.next_avail = RX_NBUF;

        boot.txq.desc[0].addr = (u64)hot.txbuf;
        boot.txq.desc[0].flags = 0;
        boot.txq.desc[0].next = 0;
        /* transmit completions are polled; interrupts only while waiting */
        boot.txq.avail->flags = VRING_AVAIL_F_NO_INTERRUPT;

        if (vq_enable(&boot.rxq) < 0 || vq_enable(&boot.txq) < 0)
                return -1;
        virtio_driver_ok(m);
        cons_mmio = m;
        vq_notify(&boot.rxq);
        return 0;
}

/*
 * Take the pending interrupt bits set by the ring-0 handlers and acknowledge
 * the devices that raised them. Called before the queues are scanned, so an
 * interrupt that arrives after this point sets pending again and sys_wait()
 * returns at once.
 */
void irq_service(void)
{
        u64 p = __atomic_exchange_n(&hot.pending, 0, __ATOMIC_SEQ_CST);

        if (!p)
                return;
        /*
         * Acknowledge both the used-buffer and the configuration-change bit
         * without reading InterruptStatus first: saves one VM exit.
         */
        if (boot.have_cons && ((p >> (8 * boot.cons_devidx)) & 0xff))
                mmio_write32(cons_mmio + VM_INTERRUPT_ACK, 3);
        if (boot.have_blk && ((p >> (8 * boot.blk_devidx)) & 0xff))
                mmio_write32(blk_mmio + VM_INTERRUPT_ACK, 3);
}

static int vq_done(const struct vq *q, const struct vq_state *s)
{
        return q->used->idx == s->next_avail;
}

/* sleep until every buffer posted on q has been used */
static void vq_wait_idle(const struct vq *q, struct vq_state *s, int poll_mode)
{
        if (vq_done(q, s))
                goto out;
        if (poll_mode) {
                q->avail->flags = 0;
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
        }
        for (;;) {
                irq_service();
                if (vq_done(q, s))
                        break;
                sys_wait();
        }
        if (poll_mode)
                q->avail->flags = VRING_AVAIL_F_NO_INTERRUPT;
out:
        s->last_used = s->next_avail;
}

static void vq_post(const struct vq *q, struct vq_state *s, u16 head)
{
        q->avail->ring[s->next_avail & (q->size - 1)] = head;
        barrier();
        s->next_avail++;
        q->avail->idx = s->next_avail;
        barrier();
        vq_notify(q);
}

int blk_rw(int write, u64 block, u8 *buf)
{
        struct vq *q = &boot.blkq;
        volatile struct blk_req_hdr *h = (volatile struct blk_req_hdr *)(blk_page + BLK_HDR_OFF);
        volatile u8 *status = blk_page + BLK_STATUS_OFF;

        if (!boot.have_blk || buf != blk_data || block >= boot.blk_blocks)
                return -1;
        h->type = write ? VIRTIO_BLK_T_OUT : VIRTIO_BLK_T_IN;
        h->reserved = 0;
        h->sector = block * 8;
        *status = 0xff;
        q->desc[1].flags = VRING_DESC_F_NEXT | (write ? 0 : VRING_DESC_F_WRITE);
        vq_post(q, &hot.blkq, 0);
        vq_wait_idle(q, &hot.blkq, 0);
        return *status == 0 ? 0 : -1;
}

/* ---- console ---- */

/* wait until the transmit buffer is free, return where the payload goes */
u8 *tx_begin(void)
{
        vq_wait_idle(&boot.txq, &hot.txq, 1);
        return hot.txbuf + AGENT_HDR_SIZE;
}

/* The frame in buf (its header written here, the payload after it) sent; the
 * caller waited for the buffer to be free (tx_begin()). */
void tx_commit_buf(u8 *buf, u16 type, u32 id, u32 len)
{
        u32 magic = AGENT_MAGIC;

        memcpy(buf, &magic, 4);
        memcpy(buf + 4, &type, 2);
        buf[6] = buf[7] = 0;
        memcpy(buf + 8, &id, 4);
        memcpy(buf + 12, &len, 4);
        if (boot.txq.desc[0].addr != (u64)buf)
                boot.txq.desc[0].addr = (u64)buf;
        boot.txq.desc[0].len = AGENT_HDR_SIZE + len;
        vq_post(&boot.txq, &hot.txq, 0);
}

void tx_commit(u16 type, u32 id, u32 len)
{
        tx_commit_buf(hot.txbuf, type, id, len);
}

/* post the tx buffer as it is, len bytes, header included (hostile.c) */
void tx_commit_raw(u32 len)
{
        boot.txq.desc[0].addr = (u64)hot.txbuf;
        boot.txq.desc[0].len = len;
        vq_post(&boot.txq, &hot.txq, 0);
}

void tx_flush(void)
{
        vq_wait_idle(&boot.txq, &hot.txq, 1);
}

/* consume the used receive buffers, feed them to the agent, re-post them */
u32 cons_rx_poll(void)
{
        struct vq *q = &boot.rxq;
        struct vq_state *s = &hot.rxq;
        u32 n = 0;
        u16 uidx = q->used->idx;

        barrier();
        while (s->last_used != uidx) {
                u32 id = q->used->ring[s->last_used & (q->size - 1)].id;
                u32 len = q->used->ring[s->last_used & (q->size - 1)].len;

                s->last_used++;
                n++;
                if (id >= RX_NBUF)
                        continue;
                if (len > RX_BUFSZ)
                        len = RX_BUFSZ;
                if (hot.n_repost < RX_NBUF)
                        hot.rx_repost[hot.n_repost++] = (u8)id;
                agent_feed(cons_rx_buf(id), len);
                if (s->last_used == uidx) {
                        uidx = q->used->idx;
                        barrier();
                }
        }
        /*
         * Re-post in batches: once half of the buffers are gone (or all of
         * them), hand them back and kick the device once for the batch.
         */
        if (hot.n_repost && (u16)(s->next_avail - s->last_used) <= RX_NBUF / 2) {
                for (u32 i = 0; i < hot.n_repost; i++)
                        q->avail->ring[(u16)(s->next_avail + i) & (q->size - 1)] = hot.rx_repost[i];
                barrier();
                s->next_avail += (u16)hot.n_repost;
                q->avail->idx = s->next_avail;
                hot.n_repost = 0;
                barrier();
                vq_notify(q);
        }
        return n;
}

/* ---- hostile mode: malformed virtqueues (hostile.c) ---- */

#define VM_STATUS_NEEDS_RESET 0x40
#define HOSTILE_ATTACKS       19

/*
 * Bring device m back to a fresh DRIVER_OK state with queue q placed at mem
 * (all other queues left off), the descriptor table and avail ring zeroed.
 * Returns the queue, or NULL if the device refused to come up.
 */
static struct vq *hostile_queue(u64 m, u32 devid, u8 *mem, u16 index, struct vq *q)
{
        if (virtio_begin(m, devid) < 0)
                return NULL;
        memset(mem, 0, 2048);
        vq_place(q, mem, CONS_QSIZE, index, m);
        return q;
}

/* Fill q with malformed chain `attack` (0 .. HOSTILE_ATTACKS-1), make it
 * live and kick it. scratch: a valid guest buffer of 4 KiB. */
static void hostile_attack(struct vq *q, u32 attack, u32 devid, u8 *scratch)
{
        volatile struct vring_desc *d = q->desc;
        volatile struct vring_avail *a = q->avail;
        u64 m = q->mmio;
        u64 big = boot.scratch_pages >= 256 ? SCRATCH_BASE : (u64)scratch;
        u32 big_len = boot.scratch_pages >= 256 ? (1u << 20) : 4096;
        u16 idx = 1;
        int skip_ready = 0;

        for (u32 i = 0; i < q->size; i++) {
                d[i].addr = (u64)scratch;
                d[i].len = 64;
                d[i].flags = 0;
                d[i].next = 0;
        }
        a->ring[0] = 0;
        switch (attack) {
        case 0: /* a two-descriptor loop */
                d[0].flags = VRING_DESC_F_NEXT;
                d[0].next = 1;
                d[1].flags = VRING_DESC_F_NEXT;
                d[1].next = 0;
                break;
        case 1: /* a chain through every descriptor, back to the first: longer than the queue */
                for (u32 i = 0; i < q->size; i++) {
                        d[i].flags = VRING_DESC_F_NEXT;
                        d[i].next = (u16)((i + 1) % q->size);
                }
                break;
        case 2: /* an address past the end of guest RAM */
                d[0].addr = boot.mem_size + 4096;
                break;
        case 3: /* an address in the MMIO window (the device's own registers) */
                d[0].addr = m;
                d[0].len = 4096;
                break;
        case 4: /* an address that wraps around 2^64 */
                d[0].addr = 0xfffffffffffff000ull;
                d[0].len = 0x2000;
                break;
        case 5: /* a huge length */
                d[0].addr = 0x100000;
                d[0].len = 0xffffffffu;
                break;
        case 6: /* the avail index far ahead of the device */
                idx = 1000;
                break;
        case 7: /* the avail index wrapped: 65535 chains "available" */
                idx = 0xffff;
                break;
        case 8: /* a head index past the table */
                a->ring[0] = 0xffff;
                break;
        case 9: /* a next index past the table */
                d[0].flags = VRING_DESC_F_NEXT;
                d[0].next = 500;
                break;
        case 10: /* device-writable where the device reads (tx, block header) */
                for (u32 i = 0; i < q->size; i++)
                        d[i].flags = VRING_DESC_F_WRITE;
                for (u32 i = 0; i < q->size; i++)
                        a->ring[i] = (u16)i;
                idx = q->size;
                break;
        case 11: /* device-readable where the device writes (rx, block status) */
                for (u32 i = 0; i < q->size; i++)
                        a->ring[i] = (u16)i;
                idx = q->size;
                break;
        case 12: /* a readable buffer after a writable one */
                d[0].flags = VRING_DESC_F_NEXT | VRING_DESC_F_WRITE;
                d[0].next = 1;
                break;
        case 13: /* an indirect descriptor */
                d[0].flags = 4;
                break;
        case 14: /* every descriptor at once, each 1 MiB (or 4 KiB) of valid memory, zero-length ones too */
                for (u32 i = 0; i < q->size; i++) {
                        d[i].addr = big;
                        d[i].len = (i & 3) == 3 ? 0 : big_len;
                        d[i].flags = devid == FORKD_VIRTIO_ID_BLK && (i & 1) ? VRING_DESC_F_WRITE : 0;
                        a->ring[i] = (u16)i;
                }
                idx = q->size;
                break;
        case 15: /* a block request for a sector far past the disk, then a bad type, then a short header */
                d[0].addr = (u64)scratch;
                d[0].len = 16;
                d[0].flags = VRING_DESC_F_NEXT;
                d[0].next = 1;
                d[1].addr = (u64)scratch + 512;
                d[1].len = 512;
                d[1].flags = VRING_DESC_F_WRITE;
                ((volatile u32 *)scratch)[0] = 0;
                ((volatile u64 *)scratch)[1] = 0xfffffffffffffff0ull;
                d[2] = d[0];
                d[2].len = 4;
                d[2].next = 1;
                a->ring[1] = 2;
                idx = 2;
                break;
        case 16: /* rings outside guest RAM */
                q->desc = (volatile struct vring_desc *)(boot.mem_size - 64);
                break;
        case 17: /* misaligned rings */
                q->desc = (volatile struct vring_desc *)((u64)q->desc + 8);
                break;
        case 18: /* a queue size that is not a power of two, then 0 */
                mmio_write32(m + VM_QUEUE_SEL, q->index);
                mmio_write32(m + VM_QUEUE_NUM, 3);
                mmio_write32(m + VM_QUEUE_NUM, 0);
                mmio_write32(m + VM_QUEUE_READY, 1);
                skip_ready = 1;
                break;
        }
        barrier();
        a->flags = 0;
        a->idx = idx;
        barrier();
        if (!skip_ready && vq_enable(q) < 0)
                return;
        virtio_driver_ok(m);
        for (u32 k = 0; k < 4; k++) {
                vq_notify(q);
                irq_service();
        }
}

/*
 * One round of every attack on every queue of every device. Returns how many
 * times the device reported DEVICE_NEEDS_RESET afterwards. Leaves the devices
 * broken or reset: the agent is gone after this.
 */
u32 virtio_hostile_round(u8 *scratch)
{
        struct vq q;
        u32 broken = 0;

        for (u32 attack = 0; attack < HOSTILE_ATTACKS; attack++) {
                for (u16 index = 0; index < 2; index++) {
                        if (hostile_queue(cons_mmio, FORKD_VIRTIO_ID_CONSOLE, cons_page, index, &q)) {
                                hostile_attack(&q, attack, FORKD_VIRTIO_ID_CONSOLE, scratch);
                                broken += !!(mmio_read32(cons_mmio + VM_STATUS) & VM_STATUS_NEEDS_RESET);
                        }
                }
                if (boot.have_blk && hostile_queue(blk_mmio, FORKD_VIRTIO_ID_BLK, blk_page, 0, &q)) {
                        hostile_attack(&q, attack, FORKD_VIRTIO_ID_BLK, scratch);
                        broken += !!(mmio_read32(blk_mmio + VM_STATUS) & VM_STATUS_NEEDS_RESET);
                }
        }
        return broken;
}
