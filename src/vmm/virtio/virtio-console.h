/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * virtio-console (virtio 1.x 5.3): a single port, no MULTIPORT, no SIZE, no
 * EMERG_WRITE. It is the agent channel: a byte stream between the guest and a
 * connected stream socket on the host (the "host fd").
 *
 * Queue 0 (receiveq): host -> guest. Bytes are read from the host fd straight
 * into the buffers the guest posted; bytes queued with virtio_console_inject()
 * go first.
 * Queue 1 (transmitq): guest -> host. Guest bytes are copied into a backlog
 * of at most VIRTIO_CONSOLE_BACKLOG_MAX bytes and written to the host fd
 * without blocking. While the backlog is full no more transmit chains are
 * completed, so a guest that floods a host that does not read is throttled
 * instead of eating host memory.
 *
 * EOF or an error (ECONNRESET, EPIPE, ...) on the host fd makes the
 * connection dead: no more reads, guest output is dropped (completed at
 * once), the guest keeps running. Without a host fd (-1), guest output is
 * dropped too.
 *
 * Nothing here blocks. Everything is done by virtio_console_process(), which
 * the transport also calls on queue notifications and on DRIVER_OK.
 */

#include <stddef.h>

#include "virtio-mmio.h"

#define VIRTIO_CONSOLE_QUEUE_SIZE   256u
#define VIRTIO_CONSOLE_RX_QUEUE     0u
#define VIRTIO_CONSOLE_TX_QUEUE     1u
#define VIRTIO_CONSOLE_INJECT_MAX   4096u
#define VIRTIO_CONSOLE_BACKLOG_MAX  (256u * 1024u)

/* Create the device at mmio_base (irq on gsi) and register it on vmm's bus. */
int virtio_console_new(struct vmm *vmm, uint64_t mmio_base, uint32_t gsi, struct virtio_mmio **ret);

/* Attach the host side: fd is a connected stream socket (or -1 for none).
 * On success the device owns fd (made O_NONBLOCK and FD_CLOEXEC), the
 * previous one is closed, a dead state is cleared and the transmit backlog
 * (bytes of the old connection) dropped. On failure fd stays the caller's
 * and nothing changes. */
int virtio_console_set_host_fd(struct virtio_mmio *dev, int fd);

/* The host fd, or -1. */
int virtio_console_host_fd(struct virtio_mmio *dev);

/* Queue bytes that reach the guest before any further byte from the host fd
 * (e.g. the identity frame after a restore). At most
 * VIRTIO_CONSOLE_INJECT_MAX bytes may be pending: -ENOBUFS beyond (nothing
 * queued then). Delivers right away if the guest has buffers posted. */
int virtio_console_inject(struct vmm *vmm, struct virtio_mmio *dev, const void *buf, size_t len);

/* Bytes injected but not yet delivered to the guest. */
size_t virtio_console_inject_pending(struct virtio_mmio *dev);

/* Guest bytes waiting in the backlog for the host fd. */
size_t virtio_console_backlog(struct virtio_mmio *dev);

/* The poll(2) events the run loop should wait for on the host fd:
 * POLLIN when the guest has posted receive buffers and the connection is not
 * dead, POLLOUT when guest output is backlogged. 0 means "do not poll the fd
 * at all" (a dead socket would report POLLHUP forever): put -1 in the pollfd. */
short virtio_console_poll_events(struct virtio_mmio *dev);

/* Move as much as possible in both directions without blocking: injected
 * bytes, then host -> guest, then guest -> host. Call it when the host fd
 * polls ready (the transport calls it on notifications itself). */
void virtio_console_process(struct vmm *vmm, struct virtio_mmio *dev);
