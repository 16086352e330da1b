/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * virtio-net (src/vmm/virtio/net.c), driven through the MMIO registers as a
 * guest driver would, against guest RAM that is a plain mmap (no KVM: vm_fd
 * is -1, interrupts are seen through InterruptStatus). The backend is a
 * SOCK_SEQPACKET socketpair carrying what a tap with IFF_VNET_HDR and a
 * 12-byte vnet header carries (one header + one frame per message), and, where
 * this process may make one (root, /dev/net/tun), a real tap in a private
 * network namespace, read and written through a packet socket on its
 * interface.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_packet.h>
#include <linux/if_tun.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "bootinfo.h"
#include "virtio-mmio.h"
#include "virtio-net.h"
#include "vmm.h"
#include "vmstate.h"

#define MEM_SIZE (4u << 20)
#define NET_BASE (FORKD_VIRTIO_MMIO_BASE + 2 * FORKD_VIRTIO_MMIO_SIZE)
#define NET2_BASE (FORKD_VIRTIO_MMIO_BASE + 3 * FORKD_VIRTIO_MMIO_SIZE)
#define RXQ 0
#define TXQ 1
#define HDR 12
#define DATA_GPA 0x100000ull /* small buffers */
#define BIG_GPA 0x200000ull  /* up to 2 MiB */
#define ETHERTYPE_TEST 0x88b5 /* IEEE 802 local experimental */

static const uint8_t mac_a[6] = { 0x02, 0x11, 0x22, 0x33, 0x44, 0x55 };

static struct vmm *tv;

/* ---- a tiny guest driver ---------------------------------------------------- */

struct gdesc {
        uint64_t addr;
        uint32_t len;
        uint16_t flags;
        uint16_t next;
};

struct gq {
        uint64_t desc, avail, used;
        uint16_t num, avail_idx, used_seen, next;
};

struct gbuf {
        uint64_t gpa;
        uint32_t len;
        bool write;
};

struct fx {
        struct virtio_mmio *dev;
        struct gq q[2];
        int peer; /* the far end of the backend socketpair */
};

static uint8_t *G(uint64_t gpa) {
        return tv->mem + gpa;
}

static void w32(struct virtio_mmio *d, uint64_t off, uint32_t v) {
        struct mmio_dev *m = virtio_mmio_bus_dev(d);
        m->write(tv, m, off, &v, 4);
}

static uint32_t r32(struct virtio_mmio *d, uint64_t off) {
        struct mmio_dev *m = virtio_mmio_bus_dev(d);
        uint32_t v = 0xdeadbeef;
        m->read(tv, m, off, &v, 4);
        return v;
}

static uint8_t r8cfg(struct virtio_mmio *d, uint64_t off) {
        struct mmio_dev *m = virtio_mmio_bus_dev(d);
        uint8_t v = 0xee;
        m->read(tv, m, VIRTIO_MMIO_CONFIG + off, &v, 1);
        return v;
}

static void queue_setup(struct virtio_mmio *d, unsigned idx, struct gq *q, uint16_t num) {
        *q = (struct gq) { .desc = 0x10000 + idx * 0x8000ull, .num = num };
        q->avail = q->desc + 0x1000;
        q->used = q->desc + 0x2000;
        memset(G(q->desc), 0, 0x8000);
        w32(d, VIRTIO_MMIO_QUEUE_SEL, idx);
        assert_int_equal(r32(d, VIRTIO_MMIO_QUEUE_NUM_MAX), 256);
        w32(d, VIRTIO_MMIO_QUEUE_NUM, num);
        w32(d, VIRTIO_MMIO_QUEUE_DESC_LOW, (uint32_t) q->desc);
        w32(d, VIRTIO_MMIO_QUEUE_DESC_HIGH, 0);
        w32(d, VIRTIO_MMIO_QUEUE_DRIVER_LOW, (uint32_t) q->avail);
        w32(d, VIRTIO_MMIO_QUEUE_DRIVER_HIGH, 0);
        w32(d, VIRTIO_MMIO_QUEUE_DEVICE_LOW, (uint32_t) q->used);
        w32(d, VIRTIO_MMIO_QUEUE_DEVICE_HIGH, 0);
        w32(d, VIRTIO_MMIO_QUEUE_READY, 1);
        assert_int_equal(r32(d, VIRTIO_MMIO_QUEUE_READY), 1);
}

/* Reset, negotiate exactly what is offered, set up both queues, DRIVER_OK. */
static void driver_up(struct virtio_mmio *d, struct gq *qs) {
        uint32_t lo, hi;

        w32(d, VIRTIO_MMIO_STATUS, 0);
        w32(d, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
        w32(d, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
        lo = r32(d, VIRTIO_MMIO_DEVICE_FEATURES);
        w32(d, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
        hi = r32(d, VIRTIO_MMIO_DEVICE_FEATURES);
        w32(d, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        w32(d, VIRTIO_MMIO_DRIVER_FEATURES, lo);
        w32(d, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        w32(d, VIRTIO_MMIO_DRIVER_FEATURES, hi);
        w32(d, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK);
        assert_true(r32(d, VIRTIO_MMIO_STATUS) & VIRTIO_STATUS_FEATURES_OK);
        queue_setup(d, RXQ, &qs[RXQ], 256);
        queue_setup(d, TXQ, &qs[TXQ], 256);
        w32(d, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK |
                                   VIRTIO_STATUS_DRIVER_OK);
        assert_int_equal(r32(d, VIRTIO_MMIO_STATUS) & 0xff, 0x0f);
}

static struct gdesc *gq_desc(struct gq *q, uint16_t i) {
        return (struct gdesc *) G(q->desc + 16ull * i);
}

static void gq_publish(struct gq *q, uint16_t head) {
        uint16_t *ring = (uint16_t *) G(q->avail + 4);

        ring[q->avail_idx % q->num] = head;
        __atomic_store_n((uint16_t *) G(q->avail + 2), ++q->avail_idx, __ATOMIC_RELEASE);
}

static uint16_t gq_add(struct gq *q, const struct gbuf *b, unsigned n) {
        uint16_t head = q->next;

        for (unsigned i = 0; i < n; i++) {
                uint16_t k = (uint16_t) ((head + i) % q->num);
                *gq_desc(q, k) = (struct gdesc) {
                        .addr = b[i].gpa,
                        .len = b[i].len,
                        .flags = (uint16_t) ((b[i].write ? 2 : 0) | (i + 1 < n ? 1 : 0)),
                        .next = (uint16_t) ((k + 1) % q->num),
                };
        }
        q->next = (uint16_t) ((head + n) % q->num);
        gq_publish(q, head);
        return head;
}

static uint16_t gq_used_idx(struct gq *q) {
        return __atomic_load_n((uint16_t *) G(q->used + 2), __ATOMIC_ACQUIRE);
}

static bool gq_get_used(struct gq *q, uint32_t *ret_id, uint32_t *ret_len) {
        uint32_t *e;

        if (gq_used_idx(q) == q->used_seen)
                return false;
        e = (uint32_t *) G(q->used + 4 + 8ull * (q->used_seen % q->num));
        *ret_id = e[0];
        *ret_len = e[1];
        q->used_seen++;
        return true;
}

static bool needs_reset(struct virtio_mmio *d) {
        return r32(d, VIRTIO_MMIO_STATUS) & VIRTIO_STATUS_DEVICE_NEEDS_RESET;
}

static void kick(struct virtio_mmio *d, unsigned q) {
        w32(d, VIRTIO_MMIO_QUEUE_NOTIFY, q);
}

static struct virtio_net_stats stats(struct virtio_mmio *d) {
        struct virtio_net_stats s;

        assert_int_equal(virtio_net_get_stats(d, &s), 0);
        return s;
}

/* ---- fixture ---------------------------------------------------------------- */

static struct vmm *test_vmm_new(void) {
        struct vmm *v = calloc(1, sizeof *v);

        assert_non_null(v);
        v->kvm_fd = v->vm_fd = v->vcpu_fd = v->mem_fd = -1;
        v->mem = mmap(NULL, MEM_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        assert_true(v->mem != MAP_FAILED);
        v->mem_size = MEM_SIZE;
        /* as vmm_new(): the devices count in the VMM's own page */
        v->own_stats = (struct vmm_stats) { .magic = VMM_STATS_MAGIC, .version = VMM_STATS_VERSION };
        v->stats = &v->own_stats;
        return v;
}

static void test_vmm_free(struct vmm *v) {
        munmap(v->mem, v->mem_size);
        free(v);
}

static int fx_setup(void **state) {
        struct fx *f = calloc(1, sizeof *f);
        int sv[2];

        assert_non_null(f);
        tv = test_vmm_new();
        assert_int_equal(virtio_net_new(tv, NET_BASE, 7, mac_a, &f->dev), 0);
        assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
        assert_int_equal(virtio_net_set_backend(f->dev, sv[0]), 0);
        assert_int_equal(virtio_net_backend_fd(f->dev), sv[0]);
        f->peer = sv[1];
        driver_up(f->dev, f->q);
        *state = f;
        return 0;
}

static int fx_teardown(void **state) {
        struct fx *f = *state;

        virtio_mmio_free(f->dev);
        close(f->peer);
        test_vmm_free(tv);
        free(f);
        return 0;
}

/* A frame: broadcast destination, mac_a as source, our ethertype, payload
 * bytes derived from seed. */
static void make_frame(uint8_t *p, size_t len, uint8_t seed) {
        memset(p, 0xff, 6);
        memcpy(p + 6, mac_a, 6);
        p[12] = ETHERTYPE_TEST >> 8;
        p[13] = ETHERTYPE_TEST & 0xff;
        for (size_t i = 14; i < len; i++)
                p[i] = (uint8_t) (seed + i * 3);
}

/* What the backend sends: a vnet header (hdr, or zeros) and the frame. */
static void peer_send(struct fx *f, const uint8_t *hdr, const uint8_t *frame, size_t len) {
        static const uint8_t zero[HDR];
        struct iovec iov[2] = { { (void *) (hdr ?: zero), HDR }, { (void *) frame, len } };
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 2 };

        assert_int_equal(sendmsg(f->peer, &mh, MSG_DONTWAIT), (ssize_t) (HDR + len));
}

/* Nothing sent to the backend's far end. */
static bool peer_empty(struct fx *f) {
        uint8_t b;

        return recv(f->peer, &b, 1, MSG_DONTWAIT | MSG_PEEK) < 0 && errno == EAGAIN;
}

/* Something sent by the far end still waits in the backend, unread. */
static bool backend_pending(struct fx *f) {
        uint8_t b;

        return recv(virtio_net_backend_fd(f->dev), &b, 1, MSG_DONTWAIT | MSG_PEEK) >= 0;
}

/* ---- tests: identity -------------------------------------------------------- */

static void test_identity(void **state) {
        struct fx *f = *state;
        uint8_t mac[6];

        assert_int_equal(r32(f->dev, VIRTIO_MMIO_MAGIC_VALUE), VIRTIO_MMIO_MAGIC);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_DEVICE_ID), 1);
        /* features: MAC and VERSION_1, nothing else */
        w32(f->dev, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_DEVICE_FEATURES), 1u << 5);
        w32(f->dev, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_DEVICE_FEATURES), 1u);
        /* config: the MAC, byte by byte as Linux reads it, then zeros */
        for (unsigned i = 0; i < 6; i++)
                assert_int_equal(r8cfg(f->dev, i), mac_a[i]);
        for (unsigned i = 6; i < 12; i++)
                assert_int_equal(r8cfg(f->dev, i), 0);
        assert_int_equal(virtio_net_get_mac(f->dev, mac), 0);
        assert_memory_equal(mac, mac_a, 6);

        /* a driver that asks for MRG_RXBUF (not offered) does not get FEATURES_OK */
        w32(f->dev, VIRTIO_MMIO_STATUS, 0);
        w32(f->dev, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
        w32(f->dev, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        w32(f->dev, VIRTIO_MMIO_DRIVER_FEATURES, (1u << 5) | (1u << 15));
        w32(f->dev, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        w32(f->dev, VIRTIO_MMIO_DRIVER_FEATURES, 1);
        w32(f->dev, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK);
        assert_false(r32(f->dev, VIRTIO_MMIO_STATUS) & VIRTIO_STATUS_FEATURES_OK);

        /* MAC parsing and checks */
        assert_int_equal(virtio_net_parse_mac("02:66:6B:64:00:01", mac), 0);
        assert_int_equal(mac[2], 0x6b);
        char s[VIRTIO_NET_MAC_STRING_MAX];
        virtio_net_format_mac(mac, s);
        assert_string_equal(s, "02:66:6b:64:00:01");
        memset(mac, 0x77, 6);
        assert_int_equal(virtio_net_parse_mac("01:00:5e:00:00:01", mac), -EINVAL); /* multicast */
        assert_int_equal(virtio_net_parse_mac("00:00:00:00:00:00", mac), -EINVAL);
        assert_int_equal(virtio_net_parse_mac("02:66:6b:64:00", mac), -EINVAL);
        assert_int_equal(virtio_net_parse_mac("02:66:6b:64:00:01:", mac), -EINVAL);
        assert_int_equal(virtio_net_parse_mac("02-66-6b-64-00-01", mac), -EINVAL);
        assert_int_equal(virtio_net_parse_mac("02:66:6g:64:00:01", mac), -EINVAL);
        assert_int_equal(mac[0], 0x77); /* untouched on error */
        assert_int_equal(virtio_net_new(tv, NET2_BASE, 8, (const uint8_t[6]) { 1, 2, 3, 4, 5, 6 }, &(struct virtio_mmio *) { NULL }),
                         -EINVAL);
}

/* ---- tests: transmit -------------------------------------------------------- */

static void test_tx(void **state) {
        struct fx *f = *state;
        uint8_t frame1[60], frame2[1514], got[2048];
        uint32_t id, len;
        uint16_t h1, h2;

        /* chain 1: header and frame in one descriptor (Linux with VERSION_1
         * puts the header in the skb's headroom); the guest's header is junk
         * that must not reach the backend */
        memset(G(DATA_GPA), 0xa5, HDR);
        make_frame(G(DATA_GPA + HDR), sizeof frame1, 1);
        memcpy(frame1, G(DATA_GPA + HDR), sizeof frame1);
        h1 = gq_add(&f->q[TXQ], (struct gbuf[]) { { DATA_GPA, HDR + sizeof frame1, false } }, 1);

        /* chain 2: header alone, the frame in three pieces, the header split too */
        make_frame(frame2, sizeof frame2, 2);
        memset(G(DATA_GPA + 0x1000), 0, HDR);
        memcpy(G(DATA_GPA + 0x2000), frame2, 100);
        memcpy(G(DATA_GPA + 0x3000), frame2 + 100, 1000);
        memcpy(G(DATA_GPA + 0x4000), frame2 + 1100, sizeof frame2 - 1100);
        h2 = gq_add(&f->q[TXQ],
                    (struct gbuf[]) { { DATA_GPA + 0x1000, 5, false },
                                      { DATA_GPA + 0x1005, HDR - 5, false },
                                      { DATA_GPA + 0x2000, 100, false },
                                      { DATA_GPA + 0x3000, 1000, false },
                                      { DATA_GPA + 0x4000, sizeof frame2 - 1100, false } },
                    5);

        w32(f->dev, VIRTIO_MMIO_INTERRUPT_ACK, 3);
        kick(f->dev, TXQ);

        assert_int_equal(recv(f->peer, got, sizeof got, MSG_DONTWAIT), HDR + sizeof frame1);
        for (unsigned i = 0; i < HDR; i++)
                assert_int_equal(got[i], 0);
        assert_memory_equal(got + HDR, frame1, sizeof frame1);
        assert_int_equal(recv(f->peer, got, sizeof got, MSG_DONTWAIT), HDR + sizeof frame2);
        for (unsigned i = 0; i < HDR; i++)
                assert_int_equal(got[i], 0);
        assert_memory_equal(got + HDR, frame2, sizeof frame2);
        assert_true(peer_empty(f));

        assert_true(gq_get_used(&f->q[TXQ], &id, &len));
        assert_int_equal(id, h1);
        assert_int_equal(len, 0);
        assert_true(gq_get_used(&f->q[TXQ], &id, &len));
        assert_int_equal(id, h2);
        assert_int_equal(len, 0);
        assert_false(gq_get_used(&f->q[TXQ], &id, &len));
        assert_true(r32(f->dev, VIRTIO_MMIO_INTERRUPT_STATUS) & VIRTIO_MMIO_INT_VRING);

        assert_int_equal(stats(f->dev).tx_packets, 2);
        assert_int_equal(stats(f->dev).tx_bytes, sizeof frame1 + sizeof frame2);
        /* the same in the stats page shared with forkd */
        assert_int_equal(tv->stats->net_tx_packets, 2);
        assert_int_equal(tv->stats->net_tx_bytes, sizeof frame1 + sizeof frame2);
        assert_int_equal(stats(f->dev).tx_dropped, 0);
        assert_false(needs_reset(f->dev));
}

static void test_tx_refused_frames(void **state) {
        struct fx *f = *state;
        uint32_t id, len;
        unsigned n = 0;

        make_frame(G(DATA_GPA + HDR), 64, 3);
        /* no frame at all: a header only, and less than a header */
        gq_add(&f->q[TXQ], (struct gbuf[]) { { DATA_GPA, HDR, false } }, 1);
        gq_add(&f->q[TXQ], (struct gbuf[]) { { DATA_GPA, 7, false } }, 1);
        /* zero-length descriptors only */
        gq_add(&f->q[TXQ], (struct gbuf[]) { { DATA_GPA, 0, false }, { DATA_GPA, 0, false } }, 2);
        /* a runt: shorter than an Ethernet header */
        gq_add(&f->q[TXQ], (struct gbuf[]) { { DATA_GPA, HDR + 13, false } }, 1);
        /* writable buffers only: nothing to send */
        gq_add(&f->q[TXQ], (struct gbuf[]) { { DATA_GPA, 1500, true } }, 1);
        /* a frame over VIRTIO_NET_FRAME_MAX, in one descriptor and in several */
        gq_add(&f->q[TXQ], (struct gbuf[]) { { BIG_GPA, HDR + VIRTIO_NET_FRAME_MAX + 1, false } }, 1);
        gq_add(&f->q[TXQ],
               (struct gbuf[]) { { BIG_GPA, HDR, false }, { BIG_GPA, 60000, false }, { BIG_GPA, 60000, false } }, 3);
        kick(f->dev, TXQ);

        while (gq_get_used(&f->q[TXQ], &id, &len)) {
                assert_int_equal(len, 0);
                n++;
        }
        assert_int_equal(n, 7);
        assert_true(peer_empty(f));
        assert_int_equal(stats(f->dev).tx_dropped, 7);
        assert_int_equal(stats(f->dev).tx_packets, 0);
        assert_false(needs_reset(f->dev));

        /* the largest frame allowed goes through */
        make_frame(G(BIG_GPA + HDR), VIRTIO_NET_FRAME_MAX, 4);
        gq_add(&f->q[TXQ], (struct gbuf[]) { { BIG_GPA, HDR + VIRTIO_NET_FRAME_MAX, false } }, 1);
        kick(f->dev, TXQ);
        {
                _cleanup_free_ uint8_t *got = malloc(HDR + VIRTIO_NET_FRAME_MAX + 1);
                assert_non_null(got);
                assert_int_equal(recv(f->peer, got, HDR + VIRTIO_NET_FRAME_MAX + 1, MSG_DONTWAIT),
                                 HDR + VIRTIO_NET_FRAME_MAX);
                assert_memory_equal(got + HDR, G(BIG_GPA + HDR), VIRTIO_NET_FRAME_MAX);
        }
        assert_int_equal(stats(f->dev).tx_packets, 1);

        /* the link goes down (the backend hangs up): frames are dropped, the
         * queue keeps moving */
        close(f->peer);
        f->peer = open("/dev/null", O_RDONLY | O_CLOEXEC);
        for (unsigned i = 0; i < 3; i++)
                gq_add(&f->q[TXQ], (struct gbuf[]) { { DATA_GPA, HDR + 64, false } }, 1);
        kick(f->dev, TXQ);
        n = 0;
        while (gq_get_used(&f->q[TXQ], &id, &len))
                n++;
        assert_int_equal(n, 4); /* the one before the largest frame, and these three */
        assert_int_equal(stats(f->dev).tx_packets, 1);
        assert_int_equal(stats(f->dev).tx_errors, 1);
        assert_int_equal(stats(f->dev).tx_dropped, 7 + 2);
        assert_false(needs_reset(f->dev));
}

/* ---- tests: receive --------------------------------------------------------- */

static void check_rx_hdr(uint64_t gpa) {
        static const uint8_t want[HDR] = { [10] = 1 }; /* flags 0, GSO_NONE, num_buffers 1 */
        uint8_t got[HDR];

        memcpy(got, G(gpa), HDR);
        assert_memory_equal(got, want, HDR);
}

static void test_rx(void **state) {
        struct fx *f = *state;
        uint8_t frame[1514], hdr[HDR];
        uint32_t id, len;
        uint16_t h;

        /* nothing posted: not polled, and a frame waits in the backend */
        assert_int_equal(virtio_net_poll_events(f->dev), 0);
        make_frame(frame, 100, 5);
        memset(hdr, 0, sizeof hdr);
        hdr[10] = 0x77; /* a tap leaves num_buffers as it finds it */
        hdr[11] = 0x66;
        peer_send(f, hdr, frame, 100);
        virtio_net_process_rx(tv, f->dev);
        assert_true(backend_pending(f));

        /* a buffer the size Linux posts without MRG_RXBUF: 12 + 1518 */
        memset(G(DATA_GPA), 0xaa, 2048);
        h = gq_add(&f->q[RXQ], (struct gbuf[]) { { DATA_GPA, HDR + 1518, true } }, 1);
        assert_int_equal(virtio_net_poll_events(f->dev), POLLIN);
        w32(f->dev, VIRTIO_MMIO_INTERRUPT_ACK, 3);
        virtio_net_process_rx(tv, f->dev);
        assert_true(gq_get_used(&f->q[RXQ], &id, &len));
        assert_int_equal(id, h);
        assert_int_equal(len, HDR + 100);
        check_rx_hdr(DATA_GPA);
        assert_memory_equal(G(DATA_GPA + HDR), frame, 100);
        assert_int_equal(G(DATA_GPA + HDR + 100)[0], 0xaa); /* nothing written beyond */
        assert_true(r32(f->dev, VIRTIO_MMIO_INTERRUPT_STATUS) & VIRTIO_MMIO_INT_VRING);
        assert_int_equal(virtio_net_poll_events(f->dev), 0);

        /* a chain in pieces, the header split across the first two, a readable
         * descriptor in front (ignored); the guest's refill notification reads */
        make_frame(frame, sizeof frame, 6);
        peer_send(f, NULL, frame, sizeof frame);
        memset(G(DATA_GPA), 0xaa, 0x4000);
        h = gq_add(&f->q[RXQ],
                   (struct gbuf[]) { { DATA_GPA + 0x3000, 16, false },
                                     { DATA_GPA, 5, true },
                                     { DATA_GPA + 0x100, 20, true },
                                     { DATA_GPA + 0x1000, 2000, true } },
                   4);
        kick(f->dev, RXQ);
        assert_true(gq_get_used(&f->q[RXQ], &id, &len));
        assert_int_equal(id, h);
        assert_int_equal(len, HDR + sizeof frame);
        {
                uint8_t got[HDR + sizeof frame];

                memcpy(got, G(DATA_GPA), 5);
                memcpy(got + 5, G(DATA_GPA + 0x100), 20);
                memcpy(got + 25, G(DATA_GPA + 0x1000), sizeof got - 25);
                assert_memory_equal(got, (uint8_t[HDR]) { [10] = 1 }, HDR);
                assert_memory_equal(got + HDR, frame, sizeof frame);
        }
        assert_int_equal(G(DATA_GPA + 0x3000)[0], 0xaa);

        /* the largest frame, into a chain that just holds it */
        {
                _cleanup_free_ uint8_t *big = malloc(VIRTIO_NET_FRAME_MAX);
                int sz = 1 << 20;

                assert_non_null(big);
                assert_int_equal(setsockopt(f->peer, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz), 0);
                make_frame(big, VIRTIO_NET_FRAME_MAX, 7);
                peer_send(f, NULL, big, VIRTIO_NET_FRAME_MAX);
                h = gq_add(&f->q[RXQ], (struct gbuf[]) { { BIG_GPA, HDR + VIRTIO_NET_FRAME_MAX, true } }, 1);
                kick(f->dev, RXQ);
                assert_true(gq_get_used(&f->q[RXQ], &id, &len));
                assert_int_equal(len, HDR + VIRTIO_NET_FRAME_MAX);
                assert_memory_equal(G(BIG_GPA + HDR), big, VIRTIO_NET_FRAME_MAX);
        }
        assert_int_equal(stats(f->dev).rx_packets, 3);
        assert_int_equal(stats(f->dev).rx_dropped, 0);
        assert_int_equal(tv->stats->net_rx_packets, 3);
        assert_int_equal(tv->stats->net_rx_bytes, stats(f->dev).rx_bytes);
        assert_false(needs_reset(f->dev));

        /* the backend hangs up: link down, no longer polled */
        gq_add(&f->q[RXQ], (struct gbuf[]) { { DATA_GPA, 2048, true } }, 1);
        assert_int_equal(virtio_net_poll_events(f->dev), POLLIN);
        close(f->peer);
        f->peer = open("/dev/null", O_RDONLY | O_CLOEXEC);
        assert_true(virtio_net_link_up(f->dev));
        virtio_net_process_rx(tv, f->dev);
        assert_false(gq_get_used(&f->q[RXQ], &id, &len));
        assert_int_equal(virtio_net_poll_events(f->dev), 0);
        assert_false(virtio_net_link_up(f->dev));
}

static void test_rx_refused_frames(void **state) {
        struct fx *f = *state;
        _cleanup_free_ uint8_t *big = malloc(VIRTIO_NET_FRAME_MAX + 1);
        uint8_t frame[1514], hdr[HDR];
        uint32_t id, len;
        uint16_t h;
        int sz = 1 << 20;

        assert_non_null(big);
        assert_int_equal(setsockopt(f->peer, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz), 0);

        /* a chain of 12 + 50: a 100-byte frame does not fit and is dropped, the
         * chain stays posted and takes the next frame that fits */
        h = gq_add(&f->q[RXQ], (struct gbuf[]) { { DATA_GPA, HDR + 50, true } }, 1);
        make_frame(frame, 100, 8);
        peer_send(f, NULL, frame, 100);
        virtio_net_process_rx(tv, f->dev);
        assert_false(gq_get_used(&f->q[RXQ], &id, &len));
        assert_int_equal(stats(f->dev).rx_dropped, 1);

        /* offloads the guest did not ask for: NEEDS_CSUM, GSO */
        memset(hdr, 0, sizeof hdr);
        hdr[0] = 1;
        peer_send(f, hdr, frame, 40);
        memset(hdr, 0, sizeof hdr);
        hdr[1] = 1; /* GSO_TCPV4 */
        peer_send(f, hdr, frame, 40);
        /* runts: a header only, a frame shorter than an Ethernet header, and a
         * message shorter than a header */
        peer_send(f, NULL, frame, 0);
        peer_send(f, NULL, frame, 13);
        assert_int_equal(send(f->peer, frame, 5, MSG_DONTWAIT), 5);
        /* larger than any frame may be, even with room for it */
        make_frame(big, VIRTIO_NET_FRAME_MAX + 1, 9);
        peer_send(f, NULL, big, VIRTIO_NET_FRAME_MAX + 1);
        /* and one that fits */
        make_frame(frame, 50, 10);
        peer_send(f, NULL, frame, 50);
        virtio_net_process_rx(tv, f->dev);
        assert_true(gq_get_used(&f->q[RXQ], &id, &len));
        assert_int_equal(id, h);
        assert_int_equal(len, HDR + 50);
        check_rx_hdr(DATA_GPA);
        assert_memory_equal(G(DATA_GPA + HDR), frame, 50);
        assert_int_equal(stats(f->dev).rx_dropped, 1 + 6);
        assert_int_equal(stats(f->dev).rx_packets, 1);

        /* the oversized frame once more, with a chain large enough for it */
        peer_send(f, NULL, big, VIRTIO_NET_FRAME_MAX + 1);
        gq_add(&f->q[RXQ], (struct gbuf[]) { { BIG_GPA, HDR + VIRTIO_NET_FRAME_MAX + 100, true } }, 1);
        virtio_net_process_rx(tv, f->dev);
        assert_false(gq_get_used(&f->q[RXQ], &id, &len));
        assert_int_equal(stats(f->dev).rx_dropped, 8);

        /* a chain too small for even the header (and one with no writable
         * part) cannot take anything; the frames are dropped, never written
         * past the chain, and the device does not spin: each call reads at
         * most VIRTIO_NET_RX_BUDGET frames */
        w32(f->dev, VIRTIO_MMIO_STATUS, 0);
        driver_up(f->dev, f->q);
        memset(G(DATA_GPA), 0xaa, 64);
        gq_add(&f->q[RXQ], (struct gbuf[]) { { DATA_GPA, 8, true } }, 1);
        for (unsigned i = 0; i < VIRTIO_NET_RX_BUDGET + 10; i++)
                peer_send(f, NULL, frame, 50);
        virtio_net_process_rx(tv, f->dev);
        assert_false(gq_get_used(&f->q[RXQ], &id, &len));
        assert_int_equal(G(DATA_GPA + 8)[0], 0xaa);
        assert_int_equal(stats(f->dev).rx_dropped, 8 + VIRTIO_NET_RX_BUDGET);
        assert_true(backend_pending(f)); /* the rest waits for the next call */
        assert_false(needs_reset(f->dev));
}

/* ---- tests: hostile rings --------------------------------------------------- */

static void expect_broken(struct fx *f) {
        assert_true(needs_reset(f->dev));
        assert_true(r32(f->dev, VIRTIO_MMIO_INTERRUPT_STATUS) & VIRTIO_MMIO_INT_CONFIG);
        assert_true(peer_empty(f));
        assert_int_equal(virtio_net_poll_events(f->dev), 0);
        /* a broken device does nothing until reset, then works again */
        driver_up(f->dev, f->q);
        assert_false(needs_reset(f->dev));
        make_frame(G(DATA_GPA + HDR), 64, 11);
        gq_add(&f->q[TXQ], (struct gbuf[]) { { DATA_GPA, HDR + 64, false } }, 1);
        kick(f->dev, TXQ);
        {
                uint8_t got[256];
                assert_int_equal(recv(f->peer, got, sizeof got, MSG_DONTWAIT), HDR + 64);
        }
}

static void test_hostile(void **state) {
        struct fx *f = *state;
        uint8_t frame[64];

        for (unsigned q = RXQ; q <= TXQ; q++) {
                bool w = q == RXQ;
                struct gq *g = &f->q[q];

                /* a loop: 0 -> 1 -> 0 */
                *gq_desc(g, 0) = (struct gdesc) { DATA_GPA, 64, (uint16_t) (1 | (w ? 2 : 0)), 1 };
                *gq_desc(g, 1) = (struct gdesc) { DATA_GPA, 64, (uint16_t) (1 | (w ? 2 : 0)), 0 };
                gq_publish(g, 0);
                if (w) {
                        make_frame(frame, sizeof frame, 12);
                        peer_send(f, NULL, frame, sizeof frame);
                        virtio_net_process_rx(tv, f->dev);
                        /* the frame stays in the backend: drain it */
                        assert_true(recv(virtio_net_backend_fd(f->dev), frame, sizeof frame, MSG_DONTWAIT) > 0);
                } else
                        kick(f->dev, q);
                expect_broken(f);

                /* a self loop */
                *gq_desc(g, 0) = (struct gdesc) { DATA_GPA, 64, (uint16_t) (1 | (w ? 2 : 0)), 0 };
                gq_publish(g, 0);
                kick(f->dev, q);
                expect_broken(f);

                /* an address outside guest RAM, one that wraps, a length that runs out of it */
                uint64_t addrs[][2] = {
                        { MEM_SIZE, 16 }, { UINT64_MAX - 8, 64 }, { DATA_GPA, UINT32_MAX }, { MEM_SIZE - 8, 64 },
                };
                for (unsigned i = 0; i < ELEMENTSOF(addrs); i++) {
                        *gq_desc(g, 0) = (struct gdesc) { addrs[i][0], (uint32_t) addrs[i][1],
                                                          (uint16_t) (w ? 2 : 0), 0 };
                        gq_publish(g, 0);
                        kick(f->dev, q);
                        expect_broken(f);
                }

                /* a next index past the table, a head past it, an indirect descriptor */
                *gq_desc(g, 0) = (struct gdesc) { DATA_GPA, 64, (uint16_t) (1 | (w ? 2 : 0)), 256 };
                gq_publish(g, 0);
                kick(f->dev, q);
                expect_broken(f);
                gq_publish(g, 300);
                kick(f->dev, q);
                expect_broken(f);
                *gq_desc(g, 0) = (struct gdesc) { DATA_GPA, 64, 4, 0 };
                gq_publish(g, 0);
                kick(f->dev, q);
                expect_broken(f);

                /* the avail index more than a ring ahead */
                __atomic_store_n((uint16_t *) G(g->avail + 2), (uint16_t) 1000, __ATOMIC_RELEASE);
                kick(f->dev, q);
                expect_broken(f);

                /* a readable descriptor after a writable one */
                *gq_desc(g, 0) = (struct gdesc) { DATA_GPA, 64, 1 | 2, 1 };
                *gq_desc(g, 1) = (struct gdesc) { DATA_GPA, 64, 0, 0 };
                gq_publish(g, 0);
                kick(f->dev, q);
                expect_broken(f);
        }

        /* a notification for a queue that does not exist, and rings outside RAM at setup */
        kick(f->dev, 2);
        kick(f->dev, 0xffffffffu);
        assert_false(needs_reset(f->dev));
        w32(f->dev, VIRTIO_MMIO_STATUS, 0);
        w32(f->dev, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
        w32(f->dev, VIRTIO_MMIO_QUEUE_SEL, TXQ);
        w32(f->dev, VIRTIO_MMIO_QUEUE_NUM, 256);
        w32(f->dev, VIRTIO_MMIO_QUEUE_DESC_LOW, MEM_SIZE - 0x100);
        w32(f->dev, VIRTIO_MMIO_QUEUE_READY, 1);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_QUEUE_READY), 0);
        assert_true(needs_reset(f->dev));
}

/* ---- tests: save and restore ------------------------------------------------ */

static void put16(uint8_t *p, uint16_t v) {
        memcpy(p, &v, 2);
}

static void test_save_restore(void **state) {
        struct fx *f = *state;
        static const uint8_t mac_b[6] = { 0x0a, 0, 0, 0, 0, 9 };
        uint8_t blob[VIRTIO_MMIO_STATE_MAX], bad[VIRTIO_MMIO_STATE_MAX], mac[6], got[256];
        struct virtio_mmio *dev2 = NULL;
        uint32_t id, len;
        size_t blen, part_len;
        const uint8_t *part;
        int sv[2];

        /* traffic first, so that the indices are not at zero */
        for (unsigned i = 0; i < 3; i++) {
                make_frame(G(DATA_GPA + HDR), 64, (uint8_t) i);
                gq_add(&f->q[TXQ], (struct gbuf[]) { { DATA_GPA, HDR + 64, false } }, 1);
                kick(f->dev, TXQ);
                assert_int_equal(recv(f->peer, got, sizeof got, MSG_DONTWAIT), HDR + 64);
                assert_true(gq_get_used(&f->q[TXQ], &id, &len));
        }
        gq_add(&f->q[RXQ], (struct gbuf[]) { { DATA_GPA + 0x1000, 2048, true } }, 1);

        assert_int_equal(virtio_mmio_save(f->dev, blob, sizeof blob, &blen), 0);
        assert_int_equal(blen, VIRTIO_MMIO_STATE_HDR_SIZE + 2 * VIRTIO_MMIO_STATE_QUEUE_SIZE + VIRTIO_NET_STATE_SIZE);
        assert_int_equal(virtio_net_state_mac(blob, blen, mac), 0);
        assert_memory_equal(mac, mac_a, 6);
        assert_int_equal(virtio_mmio_state_dev_part(blob, blen, FORKD_VIRTIO_ID_NET, &part, &part_len), 0);
        assert_int_equal(part_len, VIRTIO_NET_STATE_SIZE);
        assert_int_equal(virtio_mmio_state_dev_part(blob, blen, FORKD_VIRTIO_ID_BLK, &part, &part_len), -EBADMSG);
        assert_int_equal(virtio_mmio_state_dev_part(blob, blen - 1, FORKD_VIRTIO_ID_NET, &part, &part_len), -EBADMSG);

        /* the blob fits a vmstate DEVICE section of kind VIRTIO_NET, which
         * decodes and encodes back to the same bytes */
        {
                _cleanup_free_ struct vmstate *s = calloc(1, sizeof *s);
                _cleanup_free_ struct vmstate *s2 = calloc(1, sizeof *s2);
                _cleanup_free_ void *buf = NULL;
                _cleanup_free_ void *buf2 = NULL;
                size_t n, n2;
                const char *err = NULL;

                assert_non_null(s);
                assert_non_null(s2);
                s->memory.mem_size = MEM_SIZE;
                s->n_vcpus = 1;
                s->pic_master.chip_id = KVM_IRQCHIP_PIC_MASTER;
                s->pic_slave.chip_id = KVM_IRQCHIP_PIC_SLAVE;
                s->ioapic.chip_id = KVM_IRQCHIP_IOAPIC;
                s->n_devs = 1;
                s->devs[0].kind = VMSTATE_DEV_VIRTIO_NET;
                s->devs[0].len = (uint32_t) blen;
                memcpy(s->devs[0].blob, blob, blen);
                assert_int_equal(vmstate_encode(s, &buf, &n), 0);
                assert_int_equal(vmstate_decode(buf, n, s2, &err), 0);
                assert_int_equal(s2->devs[0].kind, VMSTATE_DEV_VIRTIO_NET);
                assert_int_equal(vmstate_encode(s2, &buf2, &n2), 0);
                assert_int_equal(n, n2);
                assert_memory_equal(buf, buf2, n);
                s->devs[0].kind = VMSTATE_DEV_VIRTIO_NET + 1;
                free(buf);
                buf = NULL;
                assert_int_equal(vmstate_encode(s, &buf, &n), -EINVAL);
        }

        /* a second device (as in a restored child) with another MAC and its own tap */
        assert_int_equal(virtio_net_new(tv, NET2_BASE, 8, mac_b, &dev2), 0);

        /* corrupt device parts are refused and change nothing */
        static const struct { size_t off; uint8_t val; } corrupt[] = {
                { 0, 2 },  /* state version */
                { 4, 1 },  /* multicast MAC */
                { 10, 1 }, /* reserved */
        };
        size_t dev_off = blen - VIRTIO_NET_STATE_SIZE;
        for (unsigned i = 0; i < ELEMENTSOF(corrupt); i++) {
                memcpy(bad, blob, blen);
                bad[dev_off + corrupt[i].off] ^= corrupt[i].val;
                assert_int_equal(virtio_mmio_restore(tv, dev2, bad, blen), -EBADMSG);
                assert_int_equal(virtio_net_state_mac(bad, blen, mac), -EBADMSG);
        }
        memcpy(bad, blob, blen);
        memset(bad + dev_off + 4, 0, 6); /* all-zero MAC */
        assert_int_equal(virtio_mmio_restore(tv, dev2, bad, blen), -EBADMSG);
        assert_int_equal(virtio_mmio_restore(tv, dev2, blob, blen - 1), -EBADMSG);
        assert_int_equal(r8cfg(dev2, 0), mac_b[0]);
        assert_int_equal(r32(dev2, VIRTIO_MMIO_STATUS), 0);

        assert_int_equal(virtio_mmio_restore(tv, dev2, blob, blen), 0);
        for (unsigned i = 0; i < 6; i++)
                assert_int_equal(r8cfg(dev2, i), mac_a[i]);
        assert_int_equal(virtio_net_get_mac(dev2, mac), 0);
        assert_memory_equal(mac, mac_a, 6);
        assert_true(virtio_mmio_active(dev2));

        /* it saves what it restored */
        {
                uint8_t again[VIRTIO_MMIO_STATE_MAX];
                size_t alen;

                assert_int_equal(virtio_mmio_save(dev2, again, sizeof again, &alen), 0);
                assert_int_equal(alen, blen);
                assert_memory_equal(again, blob, blen);
        }

        /* and the guest's rings go on working through it: the posted receive
         * buffer, then a new transmit chain */
        assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
        assert_int_equal(virtio_net_set_backend(dev2, sv[0]), 0);
        assert_int_equal(virtio_net_poll_events(dev2), POLLIN);
        make_frame(got, 80, 13);
        {
                struct iovec iov[2] = { { (uint8_t[HDR]) { 0 }, HDR }, { got, 80 } };
                struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 2 };
                assert_int_equal(sendmsg(sv[1], &mh, 0), HDR + 80);
        }
        virtio_net_process_rx(tv, dev2);
        assert_true(gq_get_used(&f->q[RXQ], &id, &len));
        assert_int_equal(len, HDR + 80);
        assert_memory_equal(G(DATA_GPA + 0x1000 + HDR), got, 80);

        make_frame(G(DATA_GPA + HDR), 70, 14);
        gq_add(&f->q[TXQ], (struct gbuf[]) { { DATA_GPA, HDR + 70, false } }, 1);
        w32(dev2, VIRTIO_MMIO_QUEUE_NOTIFY, TXQ);
        assert_int_equal(recv(sv[1], got, sizeof got, MSG_DONTWAIT), HDR + 70);
        assert_memory_equal(got + HDR, G(DATA_GPA + HDR), 70);
        assert_true(gq_get_used(&f->q[TXQ], &id, &len));
        assert_true(peer_empty(f)); /* nothing through the old device's backend */

        virtio_mmio_free(dev2);
        close(sv[1]);
}

/* Indices wrap at 2^16: restore a device whose queues stand just before the
 * wrap (as a long-running guest's would) and move frames across it. */
static void test_index_wrap(void **state) {
        struct fx *f = *state;
        uint8_t blob[VIRTIO_MMIO_STATE_MAX], got[256];
        uint32_t id, len;
        size_t blen;

        assert_int_equal(virtio_mmio_save(f->dev, blob, sizeof blob, &blen), 0);
        for (unsigned q = RXQ; q <= TXQ; q++) {
                uint8_t *qs = blob + VIRTIO_MMIO_STATE_HDR_SIZE + q * VIRTIO_MMIO_STATE_QUEUE_SIZE;

                put16(qs + 4, 0xfffe); /* last_avail_idx */
                put16(qs + 6, 0xfffe); /* used_idx */
                f->q[q].avail_idx = f->q[q].used_seen = 0xfffe;
                __atomic_store_n((uint16_t *) G(f->q[q].avail + 2), (uint16_t) 0xfffe, __ATOMIC_RELEASE);
                __atomic_store_n((uint16_t *) G(f->q[q].used + 2), (uint16_t) 0xfffe, __ATOMIC_RELEASE);
        }
        assert_int_equal(virtio_mmio_restore(tv, f->dev, blob, blen), 0);

        for (unsigned i = 0; i < 5; i++) {
                make_frame(G(DATA_GPA + HDR), 64, (uint8_t) (20 + i));
                gq_add(&f->q[TXQ], (struct gbuf[]) { { DATA_GPA, HDR + 64, false } }, 1);
                kick(f->dev, TXQ);
                assert_int_equal(recv(f->peer, got, sizeof got, MSG_DONTWAIT), HDR + 64);
                assert_memory_equal(got + HDR, G(DATA_GPA + HDR), 64);
                assert_true(gq_get_used(&f->q[TXQ], &id, &len));

                gq_add(&f->q[RXQ], (struct gbuf[]) { { DATA_GPA + 0x1000, 2048, true } }, 1);
                make_frame(got, 90, (uint8_t) (30 + i));
                peer_send(f, NULL, got, 90);
                virtio_net_process_rx(tv, f->dev);
                assert_true(gq_get_used(&f->q[RXQ], &id, &len));
                assert_int_equal(len, HDR + 90);
                assert_memory_equal(G(DATA_GPA + 0x1000 + HDR), got, 90);
        }
        assert_int_equal(f->q[TXQ].used_seen, 3);
        assert_int_equal(gq_used_idx(&f->q[RXQ]), 3);
        assert_false(needs_reset(f->dev));

        /* a restore whose indices say more than a ring is outstanding is refused */
        assert_int_equal(virtio_mmio_save(f->dev, blob, sizeof blob, &blen), 0);
        put16(blob + VIRTIO_MMIO_STATE_HDR_SIZE + 4, 0x1000);
        assert_int_equal(virtio_mmio_restore(tv, f->dev, blob, blen), -EBADMSG);
}

/* ---- tests: backends -------------------------------------------------------- */

static bool in_private_netns;

static int make_tap(const char *name, short flags, int hdr_size) {
        struct ifreq ifr = { .ifr_flags = flags };
        int fd;

        fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name);
        if (ioctl(fd, TUNSETIFF, &ifr) < 0 || (hdr_size > 0 && ioctl(fd, TUNSETVNETHDRSZ, &hdr_size) < 0)) {
                int r = -errno;
                close(fd);
                return r;
        }
        return fd;
}

static void test_backend_check(void **state) {
        struct fx *f = *state;
        char path[] = "/tmp/test-virtio-net-XXXXXX";
        int fd, sv[2];

        assert_int_equal(virtio_net_check_backend(-1), -EBADF);
        fd = mkstemp(path);
        assert_true(fd >= 0);
        unlink(path);
        assert_int_equal(virtio_net_check_backend(fd), -ENOTTY);
        /* refused: the device keeps its backend, the caller keeps fd */
        assert_int_equal(virtio_net_set_backend(f->dev, fd), -ENOTTY);
        assert_true(virtio_net_backend_fd(f->dev) >= 0);
        assert_true(fcntl(fd, F_GETFD) >= 0);
        close(fd);
        fd = open("/dev/null", O_RDWR | O_CLOEXEC);
        assert_int_equal(virtio_net_check_backend(fd), -ENOTTY);
        close(fd);
        assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
        assert_int_equal(virtio_net_check_backend(sv[0]), 0);
        close(sv[0]);
        close(sv[1]);
        /* none: the link is down */
        assert_int_equal(virtio_net_set_backend(f->dev, -1), 0);
        assert_int_equal(virtio_net_backend_fd(f->dev), -1);
        assert_int_equal(virtio_net_set_backend(NULL, -1), -EINVAL);

        if (!in_private_netns)
                skip(); /* needs root and /dev/net/tun: see group_setup() */

        fd = make_tap("fkt-tun", IFF_TUN | IFF_NO_PI | IFF_VNET_HDR, 12);
        assert_true(fd >= 0);
        assert_int_equal(virtio_net_check_backend(fd), -EPROTOTYPE);
        close(fd);
        fd = make_tap("fkt-nohdr", IFF_TAP | IFF_NO_PI, 0);
        assert_true(fd >= 0);
        assert_int_equal(virtio_net_check_backend(fd), -EPROTOTYPE);
        close(fd);
        fd = make_tap("fkt-10", IFF_TAP | IFF_NO_PI | IFF_VNET_HDR, 0); /* the default: 10 */
        assert_true(fd >= 0);
        assert_int_equal(virtio_net_check_backend(fd), -EPROTO);
        close(fd);
        fd = make_tap("fkt-ok", IFF_TAP | IFF_NO_PI | IFF_VNET_HDR, 12);
        assert_true(fd >= 0);
        assert_int_equal(virtio_net_check_backend(fd), 0);
        close(fd);
        fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC); /* attached to nothing */
        assert_true(fd >= 0);
        assert_int_equal(virtio_net_check_backend(fd), -EBADFD);
        close(fd);
}

/* The real thing: a tap as forkd sets it up, its interface up, and a packet
 * socket on the interface standing for the host's side of the network. */
static void test_real_tap(void **state) {
        struct fx *f = *state;
        struct ifreq ifr = {};
        struct sockaddr_ll sll = { .sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL) };
        uint8_t frame[200], got[2048];
        uint32_t id, len;
        int tap, ps, ctl;
        bool seen = false;

        if (!in_private_netns)
                skip();

        tap = make_tap("fkt0", IFF_TAP | IFF_NO_PI | IFF_VNET_HDR, 12);
        assert_true(tap >= 0);
        ctl = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        assert_true(ctl >= 0);
        snprintf(ifr.ifr_name, IFNAMSIZ, "fkt0");
        assert_int_equal(ioctl(ctl, SIOCGIFFLAGS, &ifr), 0);
        ifr.ifr_flags |= IFF_UP;
        assert_int_equal(ioctl(ctl, SIOCSIFFLAGS, &ifr), 0);
        close(ctl);

        ps = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ALL));
        assert_true(ps >= 0);
        sll.sll_ifindex = (int) if_nametoindex("fkt0");
        assert_true(sll.sll_ifindex > 0);
        assert_int_equal(bind(ps, (struct sockaddr *) &sll, sizeof sll), 0);

        assert_int_equal(virtio_net_set_backend(f->dev, tap), 0);

        /* guest -> network: the frame, without any header, arrives on the interface */
        make_frame(G(DATA_GPA + HDR), sizeof frame, 40);
        memcpy(frame, G(DATA_GPA + HDR), sizeof frame);
        gq_add(&f->q[TXQ], (struct gbuf[]) { { DATA_GPA, HDR + sizeof frame, false } }, 1);
        kick(f->dev, TXQ);
        assert_true(gq_get_used(&f->q[TXQ], &id, &len));
        assert_int_equal(stats(f->dev).tx_packets, 1);
        for (unsigned tries = 0; tries < 50 && !seen; tries++) {
                struct pollfd p = { .fd = ps, .events = POLLIN };
                ssize_t n;

                if (poll(&p, 1, 100) <= 0)
                        continue;
                n = recv(ps, got, sizeof got, 0);
                if (n == (ssize_t) sizeof frame && memcmp(got, frame, sizeof frame) == 0)
                        seen = true; /* anything else is the kernel's own chatter */
        }
        assert_true(seen);

        /* network -> guest: a frame sent out of the interface lands in the
         * guest's buffer behind a clean header */
        make_frame(frame, sizeof frame, 41);
        memcpy(frame + 6, (uint8_t[6]) { 0x02, 0, 0, 0, 0, 0x42 }, 6);
        memcpy(frame, mac_a, 6);
        assert_int_equal(sendto(ps, frame, sizeof frame, 0, (struct sockaddr *) &sll, sizeof sll),
                         (ssize_t) sizeof frame);
        seen = false;
        for (unsigned tries = 0; tries < 50 && !seen; tries++) {
                struct pollfd p = { .fd = tap };

                memset(G(DATA_GPA + 0x1000), 0xaa, HDR + 1518);
                gq_add(&f->q[RXQ], (struct gbuf[]) { { DATA_GPA + 0x1000, HDR + 1518, true } }, 1);
                p.events = virtio_net_poll_events(f->dev);
                assert_int_equal(p.events, POLLIN);
                if (poll(&p, 1, 100) <= 0)
                        continue;
                virtio_net_process_rx(tv, f->dev);
                while (gq_get_used(&f->q[RXQ], &id, &len)) {
                        if (len == HDR + sizeof frame && memcmp(G(DATA_GPA + 0x1000 + HDR), frame, sizeof frame) == 0) {
                                check_rx_hdr(DATA_GPA + 0x1000);
                                seen = true;
                        }
                }
        }
        assert_true(seen);
        assert_false(needs_reset(f->dev));
        close(ps);
}

static int group_setup(void **state) {
        int fd;

        /* A tap of our own, invisible to the host: root in a new network
         * namespace, with IPv6 off so that the interface stays quiet. */
        if (unshare(CLONE_NEWNET) < 0)
                return 0;
        fd = open("/proc/sys/net/ipv6/conf/default/disable_ipv6", O_WRONLY | O_CLOEXEC);
        if (fd >= 0) {
                (void) !write(fd, "1", 1);
                close(fd);
        }
        if (access("/dev/net/tun", R_OK | W_OK) < 0)
                return 0;
        in_private_netns = true;
        return 0;
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_identity, fx_setup, fx_teardown),
                cmocka_unit_test_setup_teardown(test_tx, fx_setup, fx_teardown),
                cmocka_unit_test_setup_teardown(test_tx_refused_frames, fx_setup, fx_teardown),
                cmocka_unit_test_setup_teardown(test_rx, fx_setup, fx_teardown),
                cmocka_unit_test_setup_teardown(test_rx_refused_frames, fx_setup, fx_teardown),
                cmocka_unit_test_setup_teardown(test_hostile, fx_setup, fx_teardown),
                cmocka_unit_test_setup_teardown(test_save_restore, fx_setup, fx_teardown),
                cmocka_unit_test_setup_teardown(test_index_wrap, fx_setup, fx_teardown),
                cmocka_unit_test_setup_teardown(test_backend_check, fx_setup, fx_teardown),
                cmocka_unit_test_setup_teardown(test_real_tap, fx_setup, fx_teardown),
        };

        return cmocka_run_group_tests(tests, group_setup, NULL);
}
