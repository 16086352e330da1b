/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * virtio-net over a tap: one receive and one transmit queue. See virtio-net.h.
 */

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "bootinfo.h"
#include "vmm-limits.h"
#include "virtio-net.h"

/* struct virtio_net_hdr_v1, virtio 1.x 5.1.6 (little-endian on the wire) */
struct net_hdr {
        uint8_t flags;
        uint8_t gso_type;
        uint16_t hdr_len;
        uint16_t gso_size;
        uint16_t csum_start;
        uint16_t csum_offset;
        uint16_t num_buffers;
};
_Static_assert(sizeof(struct net_hdr) == VIRTIO_NET_HDR_SIZE, "virtio_net_hdr_v1 is 12 bytes");

#define NET_HDR_F_NEEDS_CSUM 1u
#define NET_HDR_GSO_NONE     0u

/* config space: mac[6], status, max_virtqueue_pairs, mtu */
#define NET_CONFIG_SIZE 12u

struct net {
        int fd;                  /* backend, or -EBADF */
        bool is_socket;          /* recvmsg()/sendmsg() rather than readv()/writev() */
        bool dead;               /* EOF or a fatal error on fd: link down */
        uint8_t mac[VIRTIO_NET_MAC_LEN];
        struct virtio_net_stats stats;
        struct virtq_chain chain; /* scratch: too large for the stack */
};

static struct net *net_of(struct virtio_mmio *dev) {
        if (!dev || virtio_mmio_device_id(dev) != FORKD_VIRTIO_ID_NET)
                return NULL;
        return virtio_mmio_priv(dev);
}

static bool link_up(const struct net *n) {
        return n->fd >= 0 && !n->dead;
}

/* ---- MAC addresses ------------------------------------------------------------ */

bool virtio_net_mac_is_valid(const uint8_t mac[VIRTIO_NET_MAC_LEN]) {
        static const uint8_t zero[VIRTIO_NET_MAC_LEN] = {};

        return mac && !(mac[0] & 1) && memcmp(mac, zero, VIRTIO_NET_MAC_LEN) != 0;
}

int virtio_net_parse_mac(const char *s, uint8_t ret_mac[VIRTIO_NET_MAC_LEN]) {
        uint8_t mac[VIRTIO_NET_MAC_LEN];

        if (!s || !ret_mac || strlen(s) != VIRTIO_NET_MAC_STRING_MAX - 1)
                return -EINVAL;
        for (unsigned i = 0; i < VIRTIO_NET_MAC_LEN; i++) {
                int hi = unhexchar(s[3 * i]), lo = unhexchar(s[3 * i + 1]);

                if (hi < 0 || lo < 0 || (i + 1 < VIRTIO_NET_MAC_LEN && s[3 * i + 2] != ':'))
                        return -EINVAL;
                mac[i] = (uint8_t) (hi << 4 | lo);
        }
        if (!virtio_net_mac_is_valid(mac))
                return -EINVAL;
        memcpy(ret_mac, mac, sizeof mac);
        return 0;
}

void virtio_net_format_mac(const uint8_t mac[VIRTIO_NET_MAC_LEN], char buf[VIRTIO_NET_MAC_STRING_MAX]) {
        snprintf(buf, VIRTIO_NET_MAC_STRING_MAX, "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3],
                 mac[4], mac[5]);
}

/* ---- the backend ------------------------------------------------------------- */

int virtio_net_check_backend(int fd) {
        struct ifreq ifr = {};
        struct stat st;
        int sz = 0;

        if (fd < 0)
                return -EBADF;
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (S_ISSOCK(st.st_mode))
                return 0;
        if (!S_ISCHR(st.st_mode))
                return -ENOTTY;
        /* TUNGETIFF and TUNGETVNETHDRSZ only read the tap's configuration.
         * IFF_NO_PI cannot be checked: TUNGETIFF reports IFF_NOFILTER in the
         * same bit (0x1000), set on any tap without a socket filter. */
        if (ioctl(fd, TUNGETIFF, &ifr) < 0)
                return errno == EBADFD ? -EBADFD : -ENOTTY;
        if ((ifr.ifr_flags & (IFF_TUN | IFF_TAP | IFF_VNET_HDR)) != (IFF_TAP | IFF_VNET_HDR))
                return -EPROTOTYPE;
        if (ioctl(fd, TUNGETVNETHDRSZ, &sz) < 0)
                return negative_errno();
        if (sz != (int) VIRTIO_NET_HDR_SIZE)
                return -EPROTO;
        return 0;
}

/* Read one packet (header + frame) into iov. Returns its whole length, which
 * is more than the iovecs hold if it did not fit (a tap reports the length
 * of a frame it cut; a socket does with MSG_TRUNC), 0 on EOF, or -errno. */
static ssize_t backend_recv(struct net *n, struct iovec *iov, unsigned n_iov) {
        ssize_t k;

        if (n->is_socket) {
                struct msghdr mh = { .msg_iov = iov, .msg_iovlen = n_iov };

                k = recvmsg(n->fd, &mh, MSG_DONTWAIT | MSG_TRUNC);
        } else
                k = readv(n->fd, iov, (int) n_iov);
        return k < 0 ? -errno : k;
}

static ssize_t backend_send(struct net *n, struct iovec *iov, unsigned n_iov) {
        ssize_t k;

        if (n->is_socket) {
                struct msghdr mh = { .msg_iov = iov, .msg_iovlen = n_iov };

                k = sendmsg(n->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        } else
                k = writev(n->fd, iov, (int) n_iov);
        return k < 0 ? -errno : k;
}

/* ---- receive: backend -> guest -------------------------------------------------- */

static bool rx_hdr_acceptable(const struct net_hdr *h) {
        /* We offered no guest offloads: a frame the backend hands over as
         * partially checksummed or as a GSO super-frame cannot be passed on. */
        return !(h->flags & NET_HDR_F_NEEDS_CSUM) && h->gso_type == NET_HDR_GSO_NONE;
}

void virtio_net_process_rx(struct vmm *vmm, struct virtio_mmio *dev) {
        struct net *n = net_of(dev);
        struct virtq *vq;
        bool pushed = false;

        if (!n || !virtio_mmio_active(dev))
                return;
        if (!vmm)
                vmm = virtio_mmio_vmm(dev);
        vq = virtio_mmio_queue(dev, VIRTIO_NET_RX_QUEUE);

        for (unsigned budget = VIRTIO_NET_RX_BUDGET; budget > 0 && link_up(n); budget--) {
                struct iovec iov[1 + VIRTQ_MAX_SIZE];
                struct virtq_chain *ch = &n->chain;
                struct net_hdr hdr = {};
                uint64_t room = 0;
                ssize_t k;
                unsigned n_iov = 1;
                int r;

                r = virtq_pop(vmm, vq, ch);
                if (r == 0)
                        break;
                if (r < 0) {
                        virtio_mmio_set_needs_reset(vmm, dev);
                        break;
                }
                /* net_rate: frames wait in the backend until rx has tokens */
                if (!vmm_limits_net_rx_take(vmm)) {
                        virtq_unpop(vq);
                        break;
                }

                /* The backend's header goes to us (a tap leaves num_buffers
                 * unwritten), the frame straight into the guest's buffers. */
                iov[0] = (struct iovec) { .iov_base = &hdr, .iov_len = sizeof hdr };
                if (ch->in_len > VIRTIO_NET_HDR_SIZE)
                        room = MIN(ch->in_len - VIRTIO_NET_HDR_SIZE, (uint64_t) VIRTIO_NET_FRAME_MAX);
                if (room > 0) {
                        r = virtq_chain_iov(ch, true, VIRTIO_NET_HDR_SIZE, room, iov + 1, VIRTQ_MAX_SIZE);
                        if (r < 0) { /* cannot happen: room is inside the writable part */
                                virtq_unpop(vq);
                                break;
                        }
                        n_iov += (unsigned) r;
                }

                k = backend_recv(n, iov, n_iov);
                if (k < 0) {
                        virtq_unpop(vq);
                        if (k == -EINTR)
                                continue;
                        if (k == -EAGAIN || k == -EWOULDBLOCK)
                                break;
                        log_debug_errno((int) k, "virtio-net: reading from the backend failed, link down: %m");
                        n->dead = true;
                        break;
                }
                if (k == 0) {
                        virtq_unpop(vq);
                        log_debug("virtio-net: the backend hung up, link down");
                        n->dead = true;
                        break;
                }
                if ((uint64_t) k < VIRTIO_NET_HDR_SIZE + VIRTIO_NET_FRAME_MIN ||
                    (uint64_t) k - VIRTIO_NET_HDR_SIZE > room || !rx_hdr_acceptable(&hdr)) {
                        /* Runt, too large for this chain, or offloaded: drop the
                         * frame, keep the chain posted for the next one. */
                        virtq_unpop(vq);
                        n->stats.rx_dropped++;
                        continue;
                }

                hdr = (struct net_hdr) { .gso_type = NET_HDR_GSO_NONE, .num_buffers = htole16(1) };
                if (virtq_chain_write(ch, 0, &hdr, sizeof hdr) != sizeof hdr) { /* in_len > room, so never */
                        virtq_unpop(vq);
                        break;
                }
                if (virtq_push(vmm, vq, ch->head, (uint32_t) k) < 0) {
                        virtio_mmio_set_needs_reset(vmm, dev);
                        break;
                }
                vmm_limits_net_rx_charge(vmm, (uint64_t) k - VIRTIO_NET_HDR_SIZE);
                n->stats.rx_packets++;
                n->stats.rx_bytes += (uint64_t) k - VIRTIO_NET_HDR_SIZE;
                vmm_stats_add(&vmm->stats->net_rx_packets, 1);
                vmm_stats_add(&vmm->stats->net_rx_bytes, (uint64_t) k - VIRTIO_NET_HDR_SIZE);
                pushed = true;
        }
        if (pushed)
                virtio_mmio_signal_used(vmm, dev, VIRTIO_NET_RX_QUEUE);
}

/* ---- transmit: guest -> backend -------------------------------------------------- */

void virtio_net_process_tx(struct vmm *vmm, struct virtio_mmio *dev) {
        struct net *n = net_of(dev);
        struct virtq *vq;
        bool pushed = false;

        if (!n || !virtio_mmio_active(dev))
                return;
        if (!vmm)
                vmm = virtio_mmio_vmm(dev);
        vq = virtio_mmio_queue(dev, VIRTIO_NET_TX_QUEUE);

        /* Bounded: the guest cannot add chains while we run (one thread), and
         * the ring holds at most num of them. */
        for (;;) {
                static const struct net_hdr zero_hdr = {};
                struct iovec iov[1 + VIRTQ_MAX_SIZE];
                struct virtq_chain *ch = &n->chain;
                uint64_t frame;
                ssize_t k;
                int r;

                r = virtq_pop(vmm, vq, ch);
                if (r == 0)
                        break;
                if (r < 0) {
                        virtio_mmio_set_needs_reset(vmm, dev);
                        break;
                }

                frame = ch->out_len >= VIRTIO_NET_HDR_SIZE ? ch->out_len - VIRTIO_NET_HDR_SIZE : 0;
                if (!link_up(n) || frame < VIRTIO_NET_FRAME_MIN || frame > VIRTIO_NET_FRAME_MAX) {
                        n->stats.tx_dropped++;
                        goto done;
                }
                /* net_rate: the frame stays in the ring until tx has tokens */
                if (!vmm_limits_net_tx_take(vmm, frame)) {
                        virtq_unpop(vq);
                        break;
                }
                /* The guest's header is not passed on: with nothing offloaded it
                 * has nothing to say, and the backend gets no fields to trust. */
                iov[0] = (struct iovec) { .iov_base = (void *) &zero_hdr, .iov_len = sizeof zero_hdr };
                r = virtq_chain_iov(ch, false, VIRTIO_NET_HDR_SIZE, frame, iov + 1, VIRTQ_MAX_SIZE);
                if (r < 0) { /* cannot happen: frame is inside the readable part */
                        n->stats.tx_dropped++;
                        goto done;
                }
                do
                        k = backend_send(n, iov, 1 + (unsigned) r);
                while (k == -EINTR);
                if (k < 0) {
                        /* EAGAIN included: a tap never pushes back (its send
                         * buffer is unlimited), and waiting would stall the guest. */
                        n->stats.tx_errors++;
                        if (k == -EPIPE || k == -ECONNRESET || k == -EBADFD || k == -ENOTCONN) {
                                log_debug_errno((int) k, "virtio-net: the backend is gone, link down: %m");
                                n->dead = true;
                        }
                        goto done;
                }
                n->stats.tx_packets++;
                n->stats.tx_bytes += frame;
                vmm_stats_add(&vmm->stats->net_tx_packets, 1);
                vmm_stats_add(&vmm->stats->net_tx_bytes, frame);
        done:
                if (virtq_push(vmm, vq, ch->head, 0) < 0) {
                        virtio_mmio_set_needs_reset(vmm, dev);
                        break;
                }
                pushed = true;
        }
        if (pushed)
                virtio_mmio_signal_used(vmm, dev, VIRTIO_NET_TX_QUEUE);
}

/* ---- transport callbacks ------------------------------------------------------ */

static void net_notify(struct vmm *vmm, struct virtio_mmio *dev, unsigned q) {
        if (q == VIRTIO_NET_TX_QUEUE || q == VIRTIO_MMIO_KICK_ALL)
                virtio_net_process_tx(vmm, dev);
        if (q == VIRTIO_NET_RX_QUEUE || q == VIRTIO_MMIO_KICK_ALL)
                virtio_net_process_rx(vmm, dev);
}

static void net_reset(struct virtio_mmio *dev) {
        /* Nothing to drop: no chain is kept between calls. */
}

static void net_free(void *p) {
        struct net *n = p;

        if (!n)
                return;
        safe_close(n->fd);
        free(n);
}

/* ---- save/restore: the MAC; packets in flight are lost, as on any network ---- */

static void put_le32(uint8_t *p, uint32_t v) {
        v = htole32(v);
        memcpy(p, &v, 4);
}

static uint32_t get_le32(const uint8_t *p) {
        uint32_t v;

        memcpy(&v, p, 4);
        return le32toh(v);
}

static int net_save(struct virtio_mmio *dev, uint8_t *buf, size_t cap, size_t *ret_len) {
        struct net *n = virtio_mmio_priv(dev);

        if (cap < VIRTIO_NET_STATE_SIZE)
                return -ENOBUFS;
        put_le32(buf, VIRTIO_NET_STATE_VERSION);
        memcpy(buf + 4, n->mac, VIRTIO_NET_MAC_LEN);
        buf[10] = buf[11] = 0;
        *ret_len = VIRTIO_NET_STATE_SIZE;
        return 0;
}

static int state_parse(const uint8_t *buf, size_t len, uint8_t ret_mac[VIRTIO_NET_MAC_LEN]) {
        if (len != VIRTIO_NET_STATE_SIZE || get_le32(buf) != VIRTIO_NET_STATE_VERSION || buf[10] != 0 || buf[11] != 0 ||
            !virtio_net_mac_is_valid(buf + 4))
                return -EBADMSG;
        memcpy(ret_mac, buf + 4, VIRTIO_NET_MAC_LEN);
        return 0;
}

static int net_restore_check(struct virtio_mmio *dev, const uint8_t *buf, size_t len) {
        uint8_t mac[VIRTIO_NET_MAC_LEN];

        return state_parse(buf, len, mac);
}

static void net_restore_apply(struct virtio_mmio *dev, const uint8_t *buf, size_t len) {
        struct net *n = virtio_mmio_priv(dev);

        if (state_parse(buf, len, n->mac) < 0)
                return; /* checked before */
        (void) virtio_mmio_set_config(dev, n->mac, VIRTIO_NET_MAC_LEN);
}

int virtio_net_state_mac(const void *blob, size_t len, uint8_t ret_mac[VIRTIO_NET_MAC_LEN]) {
        const uint8_t *part;
        size_t part_len;

        if (!ret_mac)
                return -EINVAL;
        if (virtio_mmio_state_dev_part(blob, len, FORKD_VIRTIO_ID_NET, &part, &part_len) < 0)
                return -EBADMSG;
        return state_parse(part, part_len, ret_mac);
}

static const struct virtio_dev_ops net_ops = {
        .device_id = FORKD_VIRTIO_ID_NET,
        .notify = net_notify,
        .reset = net_reset,
        .save = net_save,
        .restore_check = net_restore_check,
        .restore_apply = net_restore_apply,
        .free = net_free,
};

/* ---- public ------------------------------------------------------------------- */

int virtio_net_new(struct vmm *vmm, uint64_t mmio_base, uint32_t gsi, const uint8_t mac[VIRTIO_NET_MAC_LEN],
                   struct virtio_mmio **ret) {
        uint8_t config[NET_CONFIG_SIZE] = {};
        struct virtio_mmio *dev;
        struct net *n;
        int r;

        if (!vmm || !ret || !virtio_net_mac_is_valid(mac))
                return -EINVAL;

        n = calloc(1, sizeof *n);
        if (!n)
                return -ENOMEM;
        n->fd = -EBADF;
        memcpy(n->mac, mac, VIRTIO_NET_MAC_LEN);
        memcpy(config, mac, VIRTIO_NET_MAC_LEN);

        r = virtio_mmio_new(vmm, mmio_base, gsi, &net_ops, 1ull << VIRTIO_NET_F_MAC_BIT, 2, VIRTIO_NET_QUEUE_SIZE,
                            config, sizeof config, n, &dev);
        if (r < 0) {
                free(n);
                return r;
        }
        *ret = dev;
        return 0;
}

int virtio_net_set_backend(struct virtio_mmio *dev, int fd) {
        struct net *n = net_of(dev);
        bool is_socket = false;
        int r;

        if (!n)
                return -EINVAL;
        if (fd >= 0) {
                struct stat st;
                int fl;

                r = virtio_net_check_backend(fd);
                if (r < 0)
                        return r;
                if (fstat(fd, &st) < 0)
                        return negative_errno();
                is_socket = S_ISSOCK(st.st_mode);
                fl = fcntl(fd, F_GETFL);
                if (fl < 0)
                        return negative_errno();
                if (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
                        return negative_errno();
                if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
                        return negative_errno();
        }
        if (n->fd != fd)
                safe_close(n->fd);
        n->fd = fd >= 0 ? fd : -EBADF;
        n->is_socket = is_socket;
        n->dead = false;
        return 0;
}

int virtio_net_backend_fd(struct virtio_mmio *dev) {
        struct net *n = net_of(dev);

        return n && n->fd >= 0 ? n->fd : -1;
}

bool virtio_net_link_up(struct virtio_mmio *dev) {
        struct net *n = net_of(dev);

        return n && link_up(n);
}

int virtio_net_get_mac(struct virtio_mmio *dev, uint8_t ret_mac[VIRTIO_NET_MAC_LEN]) {
        struct net *n = net_of(dev);

        if (!n || !ret_mac)
                return -EINVAL;
        memcpy(ret_mac, n->mac, VIRTIO_NET_MAC_LEN);
        return 0;
}

int virtio_net_get_stats(struct virtio_mmio *dev, struct virtio_net_stats *ret) {
        struct net *n = net_of(dev);

        if (!n || !ret)
                return -EINVAL;
        *ret = n->stats;
        return 0;
}

short virtio_net_poll_events(struct virtio_mmio *dev) {
        struct net *n = net_of(dev);

        if (!n || !link_up(n) || !virtio_mmio_active(dev) || vmm_limits_net_rx_waiting(virtio_mmio_vmm(dev)))
                return 0;
        return virtq_has_avail(virtio_mmio_vmm(dev), virtio_mmio_queue(dev, VIRTIO_NET_RX_QUEUE)) ? POLLIN : 0;
}
