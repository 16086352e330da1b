/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * virtio-net as a hostile guest and a hostile backend drive it: the device on
 * the virtio-mmio transport over a fake guest RAM of 64 KiB (a plain heap
 * buffer, so AddressSanitizer sees any access outside it), its backend a
 * SOCK_SEQPACKET socketpair whose far end sends what the input says.
 *
 * Input: per queue (receive, then transmit) u16 size, u16 starting avail and
 * used index, u32 descriptor, driver and device area addresses (taken as they
 * are: out of range too); u8 packet count (at most 8), then per packet u16
 * length (up to 12 + 65550 + 16); then the guest RAM's first bytes. Every
 * packet's bytes are guest RAM's from PKT_RAM on (wrapping), header first. The driver negotiates what is offered,
 * sets the queues up (a queue the transport refuses leaves the device
 * needing a reset, which must hold), and the device then transmits
 * (QueueNotify) and receives until nothing moves. Checks: nothing outside
 * guest RAM is touched (ASan), nothing loops, and what reaches the backend is
 * a zero header and 14..65550 bytes of frame. (The used rings are not
 * checked: a hostile guest may lay them over its own receive buffers.)
 */

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootinfo.h"
#include "virtio-mmio.h"
#include "virtio-net.h"
#include "vmm.h"

#define MEM_SIZE (64u * 1024u)
#define QHDR 16
#define PKT_MAX (VIRTIO_NET_HDR_SIZE + VIRTIO_NET_FRAME_MAX + 16)
#define PKT_RAM 0x6ff4u /* where the backend's packets come from */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint32_t le(const uint8_t *p, unsigned n) {
        uint32_t v = 0;

        for (unsigned i = 0; i < n; i++)
                v |= (uint32_t) p[i] << (8 * i);
        return v;
}

static void w32(struct vmm *v, struct virtio_mmio *d, uint64_t off, uint32_t val) {
        struct mmio_dev *m = virtio_mmio_bus_dev(d);
        m->write(v, m, off, &val, 4);
}

static uint32_t r32(struct vmm *v, struct virtio_mmio *d, uint64_t off) {
        struct mmio_dev *m = virtio_mmio_bus_dev(d);
        uint32_t val = 0;
        m->read(v, m, off, &val, 4);
        return val;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static const uint8_t mac[6] = VIRTIO_NET_MAC_DEFAULT;
        static uint8_t pkt[PKT_MAX];
        struct vmm v = { .kvm_fd = -1, .vm_fd = -1, .vcpu_fd = -1, .mem_fd = -1 };
        struct virtio_mmio *dev = NULL;
        const uint8_t *q[2], *p;
        size_t hdr_len;
        unsigned n_pkts;
        int sv[2] = { -1, -1 };

        if (size < 2 * QHDR + 1)
                return 0;
        q[0] = data;
        q[1] = data + QHDR;
        n_pkts = data[2 * QHDR] % 9;
        hdr_len = 2 * QHDR + 1 + 2u * n_pkts;
        if (size < hdr_len)
                return 0;

        v.stats = &v.own_stats; /* as vmm_new(): never NULL */
        v.mem = calloc(1, MEM_SIZE);
        if (!v.mem)
                abort();
        v.mem_size = MEM_SIZE;
        memcpy(v.mem, data + hdr_len, size - hdr_len < MEM_SIZE ? size - hdr_len : MEM_SIZE);

        if (virtio_net_new(&v, FORKD_VIRTIO_MMIO_BASE, 7, mac, &dev) < 0)
                abort();
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
                goto finish;
        {
                int sz = 1 << 20;
                (void) setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
        }
        if (virtio_net_set_backend(dev, sv[0]) < 0)
                abort();
        sv[0] = -1;

        /* the driver: features as offered, queues as the input says */
        w32(&v, dev, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
        for (uint32_t sel = 0; sel < 2; sel++) {
                w32(&v, dev, VIRTIO_MMIO_DEVICE_FEATURES_SEL, sel);
                w32(&v, dev, VIRTIO_MMIO_DRIVER_FEATURES_SEL, sel);
                w32(&v, dev, VIRTIO_MMIO_DRIVER_FEATURES, r32(&v, dev, VIRTIO_MMIO_DEVICE_FEATURES));
        }
        w32(&v, dev, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK);
        for (unsigned i = 0; i < 2; i++) {
                struct virtq *vq = virtio_mmio_queue(dev, i);

                w32(&v, dev, VIRTIO_MMIO_QUEUE_SEL, i);
                w32(&v, dev, VIRTIO_MMIO_QUEUE_NUM, le(q[i], 2));
                w32(&v, dev, VIRTIO_MMIO_QUEUE_DESC_LOW, le(q[i] + 4, 4));
                w32(&v, dev, VIRTIO_MMIO_QUEUE_DRIVER_LOW, le(q[i] + 8, 4));
                w32(&v, dev, VIRTIO_MMIO_QUEUE_DEVICE_LOW, le(q[i] + 12, 4));
                /* where a long-running guest's indices could stand */
                vq->last_avail_idx = vq->used_idx = (uint16_t) le(q[i] + 2, 2);
                w32(&v, dev, VIRTIO_MMIO_QUEUE_READY, 1);
        }
        w32(&v, dev, VIRTIO_MMIO_STATUS,
            VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK | VIRTIO_STATUS_DRIVER_OK);

        /* the backend's packets: header and frame from guest RAM's bytes */
        p = data + 2 * QHDR + 1;
        for (unsigned i = 0; i < n_pkts; i++) {
                size_t len = le(p + 2 * i, 2) * 2u % (PKT_MAX + 1);

                for (size_t k = 0; k < len; k++)
                        pkt[k] = v.mem[(PKT_RAM + k) % MEM_SIZE];
                (void) send(sv[1], pkt, len, MSG_DONTWAIT);
        }

        w32(&v, dev, VIRTIO_MMIO_QUEUE_NOTIFY, VIRTIO_NET_TX_QUEUE);
        for (unsigned i = 0; i < 4; i++)
                virtio_net_process_rx(&v, dev);
        w32(&v, dev, VIRTIO_MMIO_QUEUE_NOTIFY, VIRTIO_NET_RX_QUEUE);

        /* what the guest sent: a zero header, then a frame of a sane size */
        for (;;) {
                ssize_t n = recv(sv[1], pkt, sizeof pkt, MSG_DONTWAIT | MSG_TRUNC);

                if (n < 0)
                        break;
                if ((size_t) n < VIRTIO_NET_HDR_SIZE + VIRTIO_NET_FRAME_MIN ||
                    (size_t) n > VIRTIO_NET_HDR_SIZE + VIRTIO_NET_FRAME_MAX)
                        abort();
                for (unsigned k = 0; k < VIRTIO_NET_HDR_SIZE; k++)
                        if (pkt[k] != 0)
                                abort();
        }

finish:
        virtio_mmio_free(dev);
        if (sv[1] >= 0)
                close(sv[1]);
        if (sv[0] >= 0)
                close(sv[0]);
        free(v.mem);
        return 0;
}
