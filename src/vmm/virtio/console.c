/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * virtio-console, single port: the agent channel. See virtio-console.h.
 */

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "bootinfo.h"
#include "virtio-console.h"

#define BL_MAX VIRTIO_CONSOLE_BACKLOG_MAX

struct console {
        int host_fd;
        bool dead;                  /* EOF or error on host_fd */

        uint8_t inject[VIRTIO_CONSOLE_INJECT_MAX];
        size_t inject_len;

        uint8_t *backlog;           /* ring of BL_MAX bytes, allocated while non-empty */
        size_t bl_head, bl_len;

        bool tx_inflight;           /* tx_chain popped, not all of it backlogged yet */
        uint64_t tx_off;
        struct virtq_chain tx_chain;
        struct virtq_chain rx_chain;
};

static struct console *console_of(struct virtio_mmio *dev) {
        if (!dev || virtio_mmio_device_id(dev) != FORKD_VIRTIO_ID_CONSOLE)
                return NULL;
        return virtio_mmio_priv(dev);
}

static void backlog_drop(struct console *c) {
        free(c->backlog);
        c->backlog = NULL;
        c->bl_head = c->bl_len = 0;
}

static bool output_dropped(const struct console *c) {
        return c->host_fd < 0 || c->dead;
}

static void set_dead(struct console *c) {
        c->dead = true;
        backlog_drop(c);
}

/* Write backlogged bytes to the host fd until it would block. */
static void backlog_flush(struct console *c) {
        if (output_dropped(c)) {
                backlog_drop(c);
                return;
        }

        while (c->bl_len > 0) {
                size_t first = MIN(c->bl_len, BL_MAX - c->bl_head);
                struct iovec iov[2] = {
                        { .iov_base = c->backlog + c->bl_head, .iov_len = first },
                        { .iov_base = c->backlog, .iov_len = c->bl_len - first },
                };
                struct msghdr mh = { .msg_iov = iov, .msg_iovlen = iov[1].iov_len > 0 ? 2 : 1 };
                ssize_t n;

                n = sendmsg(c->host_fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (n < 0 && errno == ENOTSOCK)
                        n = writev(c->host_fd, iov, (int) mh.msg_iovlen);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN || errno == EWOULDBLOCK)
                                return;
                        set_dead(c); /* EPIPE, ECONNRESET, ... */
                        return;
                }
                c->bl_head = (c->bl_head + (size_t) n) % BL_MAX;
                c->bl_len -= (size_t) n;
        }
        backlog_drop(c); /* empty: give the memory back */
}

/* Host (inject, then host fd) -> guest receive buffers. */
static void console_rx(struct vmm *vmm, struct virtio_mmio *dev, struct console *c) {
        struct virtq *vq = virtio_mmio_queue(dev, VIRTIO_CONSOLE_RX_QUEUE);
        struct virtq_chain *ch = &c->rx_chain;
        bool pushed = false;

        while (c->inject_len > 0 || (c->host_fd >= 0 && !c->dead)) {
                struct iovec iov[VIRTQ_MAX_SIZE];
                uint32_t len;
                ssize_t n;
                int r;

                r = virtq_pop(vmm, vq, ch);
                if (r == 0)
                        break;
                if (r < 0) {
                        virtio_mmio_set_needs_reset(vmm, dev);
                        break;
                }

                if (ch->in_len == 0) {
                        len = 0; /* nothing writable: hand it back empty */
                } else if (c->inject_len > 0) {
                        len = (uint32_t) virtq_chain_write(ch, 0, c->inject, c->inject_len);
                        memmove(c->inject, c->inject + len, c->inject_len - len);
                        c->inject_len -= len;
                } else {
                        r = virtq_chain_iov(ch, true, 0, MIN(ch->in_len, (uint64_t) UINT32_MAX), iov, ELEMENTSOF(iov));
                        if (r < 0) {
                                virtq_unpop(vq);
                                break;
                        }
                        n = readv(c->host_fd, iov, r);
                        if (n <= 0) {
                                int err = n < 0 ? errno : 0;

                                virtq_unpop(vq);
                                if (n < 0 && err == EINTR)
                                        continue;
                                if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK))
                                        break;
                                set_dead(c); /* EOF, ECONNRESET, ... */
                                break;
                        }
                        len = (uint32_t) n;
                }

                if (virtq_push(vmm, vq, ch->head, len) < 0) {
                        virtio_mmio_set_needs_reset(vmm, dev);
                        break;
                }
                pushed = true;
        }
        if (pushed)
                virtio_mmio_signal_used(vmm, dev, VIRTIO_CONSOLE_RX_QUEUE);
}

/* Copy as much of the in-flight tx chain into the backlog as fits. */
static void backlog_fill(struct console *c) {
        struct virtq_chain *ch = &c->tx_chain;

        if (output_dropped(c)) {
                c->tx_off = ch->out_len;
                return;
        }
        while (c->tx_off < ch->out_len && c->bl_len < BL_MAX) {
                size_t tail, space, n;

                if (!c->backlog) {
                        c->backlog = malloc(BL_MAX);
                        if (!c->backlog)
                                return; /* try again later */
                        c->bl_head = 0;
                }
                tail = (c->bl_head + c->bl_len) % BL_MAX;
                space = MIN(BL_MAX - c->bl_len, BL_MAX - tail);
                n = virtq_chain_read(ch, c->tx_off, c->backlog + tail, MIN((uint64_t) space, ch->out_len - c->tx_off));
                if (n == 0)
                        return;
                c->bl_len += n;
                c->tx_off += n;
        }
}

/* Guest transmit buffers -> backlog -> host fd. */
static void console_tx(struct vmm *vmm, struct virtio_mmio *dev, struct console *c) {
        struct virtq *vq = virtio_mmio_queue(dev, VIRTIO_CONSOLE_TX_QUEUE);
        bool pushed = false;

        for (;;) {
                int r;

                backlog_flush(c);
                if (!c->tx_inflight) {
                        if (c->bl_len >= BL_MAX)
                                break;
                        r = virtq_pop(vmm, vq, &c->tx_chain);
                        if (r == 0)
                                break;
                        if (r < 0) {
                                virtio_mmio_set_needs_reset(vmm, dev);
                                break;
                        }
                        c->tx_inflight = true;
                        c->tx_off = 0;
                }

                backlog_fill(c);
                if (c->tx_off < c->tx_chain.out_len) {
                        /* backlog full (or no memory): wait for POLLOUT */
                        backlog_flush(c);
                        if (c->bl_len >= BL_MAX || !c->backlog)
                                break;
                        continue;
                }

                c->tx_inflight = false;
                if (virtq_push(vmm, vq, c->tx_chain.head, 0) < 0) {
                        virtio_mmio_set_needs_reset(vmm, dev);
                        break;
                }
                pushed = true;
        }
        if (pushed)
                virtio_mmio_signal_used(vmm, dev, VIRTIO_CONSOLE_TX_QUEUE);
}

void virtio_console_process(struct vmm *vmm, struct virtio_mmio *dev) {
        struct console *c = console_of(dev);

        if (!c)
                return;
        if (!vmm)
                vmm = virtio_mmio_vmm(dev);
        if (!virtio_mmio_active(dev)) {
                backlog_flush(c);
                return;
        }
        console_rx(vmm, dev, c);
        console_tx(vmm, dev, c);
}

static void console_notify(struct vmm *vmm, struct virtio_mmio *dev, unsigned q) {
        virtio_console_process(vmm, dev);
}

static void console_reset(struct virtio_mmio *dev) {
        struct console *c = virtio_mmio_priv(dev);

        /* the chain belongs to the old queue; bytes already backlogged are
         * output the guest considered sent and still go out */
        c->tx_inflight = false;
        c->tx_off = 0;
}

static void console_free(void *p) {
        struct console *c = p;

        if (!c)
                return;
        safe_close(c->host_fd);
        free(c->backlog);
        free(c);
}

/* ---- save/restore: no stream bytes, a restored device is a new connection -- */

#define CONSOLE_STATE_VERSION 1u

static int console_save(struct virtio_mmio *dev, uint8_t *buf, size_t cap, size_t *ret_len) {
        uint32_t v[2] = { htole32(CONSOLE_STATE_VERSION), 0 };

        if (cap < sizeof v)
                return -ENOBUFS;
        memcpy(buf, v, sizeof v);
        *ret_len = sizeof v;
        return 0;
}

static int console_restore_check(struct virtio_mmio *dev, const uint8_t *buf, size_t len) {
        uint32_t v[2];

        if (len != sizeof v)
                return -EBADMSG;
        memcpy(v, buf, sizeof v);
        if (le32toh(v[0]) != CONSOLE_STATE_VERSION || v[1] != 0)
                return -EBADMSG;
        return 0;
}

static void console_restore_apply(struct virtio_mmio *dev, const uint8_t *buf, size_t len) {
        struct console *c = virtio_mmio_priv(dev);

        /* stale guest output belongs to the connection of the saved VM */
        backlog_drop(c);
        c->tx_inflight = false;
        c->tx_off = 0;
}

static const struct virtio_dev_ops console_ops = {
        .device_id = FORKD_VIRTIO_ID_CONSOLE,
        .notify = console_notify,
        .reset = console_reset,
        .save = console_save,
        .restore_check = console_restore_check,
        .restore_apply = console_restore_apply,
        .free = console_free,
};

/* ---- public ----------------------------------------------------------------- */

int virtio_console_new(struct vmm *vmm, uint64_t mmio_base, uint32_t gsi, struct virtio_mmio **ret) {
        /* struct virtio_console_config: cols, rows, max_nr_ports, emerg_wr;
         * meaningless without SIZE/MULTIPORT/EMERG_WRITE, present for drivers
         * that read it anyway */
        static const uint8_t config[12] = {};
        struct console *c;
        struct virtio_mmio *dev;
        int r;

        if (!vmm || !ret)
                return -EINVAL;

        c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->host_fd = -EBADF;

        r = virtio_mmio_new(vmm, mmio_base, gsi, &console_ops, 0, 2, VIRTIO_CONSOLE_QUEUE_SIZE,
                            config, sizeof config, c, &dev);
        if (r < 0) {
                free(c);
                return r;
        }
        *ret = dev;
        return 0;
}

int virtio_console_set_host_fd(struct virtio_mmio *dev, int fd) {
        struct console *c = console_of(dev);

        if (!c)
                return -EINVAL;
        if (fd >= 0) {
                int fl = fcntl(fd, F_GETFL);
                if (fl < 0)
                        return negative_errno();
                if (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
                        return negative_errno();
                if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
                        return negative_errno();
        }
        if (c->host_fd != fd)
                safe_close(c->host_fd);
        c->host_fd = fd >= 0 ? fd : -EBADF;
        c->dead = false;
        backlog_drop(c);
        return 0;
}

int virtio_console_host_fd(struct virtio_mmio *dev) {
        struct console *c = console_of(dev);

        return c && c->host_fd >= 0 ? c->host_fd : -1;
}

int virtio_console_inject(struct vmm *vmm, struct virtio_mmio *dev, const void *buf, size_t len) {
        struct console *c = console_of(dev);

        if (!c || (!buf && len > 0))
                return -EINVAL;
        if (len > VIRTIO_CONSOLE_INJECT_MAX - c->inject_len)
                return -ENOBUFS;
        if (len > 0)
                memcpy(c->inject + c->inject_len, buf, len);
        c->inject_len += len;
        virtio_console_process(vmm, dev);
        return 0;
}

size_t virtio_console_inject_pending(struct virtio_mmio *dev) {
        struct console *c = console_of(dev);

        return c ? c->inject_len : 0;
}

size_t virtio_console_backlog(struct virtio_mmio *dev) {
        struct console *c = console_of(dev);

        return c ? c->bl_len : 0;
}

short virtio_console_poll_events(struct virtio_mmio *dev) {
        struct console *c = console_of(dev);
        short ev = 0;

        if (!c || c->host_fd < 0 || c->dead)
                return 0;
        if (virtio_mmio_active(dev) &&
            virtq_has_avail(virtio_mmio_vmm(dev), virtio_mmio_queue(dev, VIRTIO_CONSOLE_RX_QUEUE)))
                ev |= POLLIN;
        if (c->bl_len > 0)
                ev |= POLLOUT;
        return ev;
}
