/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * virtio-net (virtio 1.x 5.1): one receive and one transmit queue over a tap.
 *
 * Features offered: VIRTIO_F_VERSION_1 and VIRTIO_NET_F_MAC, nothing else: no
 * checksum or segmentation offload, no MRG_RXBUF, no control queue, no link
 * status. Every packet on either queue starts with the 12-byte
 * struct virtio_net_hdr_v1 (num_buffers included, as VERSION_1 requires).
 * Config space: the MAC (6 bytes), then zeros (status, max_virtqueue_pairs,
 * mtu; meaningless without their features).
 *
 * The backend ("tap fd") is what forkd opens in the sandbox's network
 * namespace: a tap with IFF_TAP | IFF_NO_PI | IFF_VNET_HDR and a vnet header
 * size of 12 (TUNSETVNETHDRSZ), so every read and write on it is one
 * 12-byte header + one Ethernet frame. A SOCK_SEQPACKET or SOCK_DGRAM socket
 * carrying the same framing works too (the unit tests use one).
 * virtio_net_check_backend() refuses anything else.
 *
 * Queue 1 (transmitq): the chain's device-readable part is the header and the
 * frame, split across descriptors in any way. The guest's header is dropped
 * (nothing is offloaded, so it carries nothing we need) and a zeroed one goes
 * to the backend with the frame, in one writev(). A chain whose frame is
 * shorter than an Ethernet header or longer than VIRTIO_NET_FRAME_MAX is
 * dropped (tx_dropped); a write that fails is dropped too (tx_errors): the
 * network is lossy, the VMM never waits for the backend.
 * Queue 0 (receiveq): one frame per chain, read from the backend straight into
 * the chain's device-writable part behind a header the device writes itself
 * (flags 0, GSO_NONE, num_buffers 1). Without MRG_RXBUF the driver must post
 * chains that hold header + frame: a frame that does not fit, or that the
 * backend hands over with offload flags, is dropped (rx_dropped) and the
 * chain stays posted for the next one. Frames are read only while the guest
 * has chains posted, so a guest that does not receive leaves the packets in
 * the tap's own queue (which the kernel bounds).
 *
 * Without a backend (fd -1), or after EOF or a fatal error on it, the link
 * is down: transmitted frames are dropped, nothing is received.
 *
 * Nothing here blocks. The transport calls in on queue notifications and on
 * DRIVER_OK; the run loop calls virtio_net_process_rx() when the backend
 * polls readable (virtio_net_poll_events()).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "virtio-mmio.h"

#define VIRTIO_NET_F_MAC_BIT       5
#define VIRTIO_NET_QUEUE_SIZE      256u
#define VIRTIO_NET_RX_QUEUE        0u
#define VIRTIO_NET_TX_QUEUE        1u
#define VIRTIO_NET_HDR_SIZE        12u       /* struct virtio_net_hdr_v1 */
#define VIRTIO_NET_FRAME_MIN       14u       /* an Ethernet header */
#define VIRTIO_NET_FRAME_MAX       65550u    /* largest frame either way, header not counted */
#define VIRTIO_NET_RX_BUDGET       256u      /* frames read per virtio_net_process_rx() */
#define VIRTIO_NET_MAC_LEN         6u
#define VIRTIO_NET_MAC_STRING_MAX  18u       /* "xx:xx:xx:xx:xx:xx" and NUL */

/* forkd-vmm boot --net-tap-fd without --net-mac: locally administered, unicast. */
#define VIRTIO_NET_MAC_DEFAULT { 0x02, 0x66, 0x6b, 0x64, 0x00, 0x01 }

/* Device part of the save blob (virtio_mmio_save()): u32 version, u8 mac[6],
 * u16 reserved (0). */
#define VIRTIO_NET_STATE_VERSION   1u
#define VIRTIO_NET_STATE_SIZE      12u

struct virtio_net_stats {
        uint64_t rx_packets, rx_bytes, rx_dropped;
        uint64_t tx_packets, tx_bytes, tx_dropped, tx_errors;
};

/* Create the device at mmio_base (irq on gsi) with this MAC (unicast, not
 * all zeros) and register it on vmm's bus. No backend yet: link down. */
int virtio_net_new(struct vmm *vmm, uint64_t mmio_base, uint32_t gsi, const uint8_t mac[VIRTIO_NET_MAC_LEN],
                   struct virtio_mmio **ret);

/* Is fd usable as a backend? A tap (character device) configured as above,
 * or a socket (whose type is not checked: SOCK_SEQPACKET or SOCK_DGRAM is the
 * caller's promise). 0, or -EBADF (not open), -ENOTTY (neither a tap nor a
 * socket), -EPROTOTYPE (a tun rather than a tap, or no IFF_VNET_HDR), -EPROTO
 * (vnet header size is not 12), -EBADFD (a tap fd that is attached to no
 * interface). Only reads the fd's configuration. IFF_NO_PI cannot be checked
 * (TUNGETIFF reports IFF_NOFILTER in its bit): a tap without it delivers
 * frames behind 4 bytes of packet information, which the guest then drops. */
int virtio_net_check_backend(int fd);

/* Attach the backend: fd (checked with virtio_net_check_backend()) or -1 for
 * none. On success the device owns fd (made O_NONBLOCK and FD_CLOEXEC), the
 * previous one is closed and the link is up again. On failure fd stays the
 * caller's and nothing changes. */
int virtio_net_set_backend(struct virtio_mmio *dev, int fd);

/* The backend fd, or -1. */
int virtio_net_backend_fd(struct virtio_mmio *dev);

/* A backend is attached and has seen no EOF or fatal error. */
bool virtio_net_link_up(struct virtio_mmio *dev);

/* The MAC in config space. -EINVAL if dev is not a virtio-net device. */
int virtio_net_get_mac(struct virtio_mmio *dev, uint8_t ret_mac[VIRTIO_NET_MAC_LEN]);

/* Counters since the device was created (not saved in snapshots). */
int virtio_net_get_stats(struct virtio_mmio *dev, struct virtio_net_stats *ret);

/* POLLIN while the driver is up, has receive chains posted and the link is
 * up; else 0 (leave the fd out of the poll set). */
short virtio_net_poll_events(struct virtio_mmio *dev);

/* Backend -> guest: read up to VIRTIO_NET_RX_BUDGET frames into posted chains. */
void virtio_net_process_rx(struct vmm *vmm, struct virtio_mmio *dev);

/* Guest -> backend: send every chain on the transmit queue. */
void virtio_net_process_tx(struct vmm *vmm, struct virtio_mmio *dev);

/* The MAC a saved device blob (virtio_mmio_save() of a virtio-net device, as
 * in a vmstate DEVICE section) carries, without restoring it. 0 or -EBADMSG. */
int virtio_net_state_mac(const void *blob, size_t len, uint8_t ret_mac[VIRTIO_NET_MAC_LEN]);

/* MAC addresses: "xx:xx:xx:xx:xx:xx" (hex, either case). A usable MAC is
 * unicast (bit 0 of the first octet clear) and not all zeros. */
bool virtio_net_mac_is_valid(const uint8_t mac[VIRTIO_NET_MAC_LEN]);
int virtio_net_parse_mac(const char *s, uint8_t ret_mac[VIRTIO_NET_MAC_LEN]);
void virtio_net_format_mac(const uint8_t mac[VIRTIO_NET_MAC_LEN], char buf[VIRTIO_NET_MAC_STRING_MAX]);
