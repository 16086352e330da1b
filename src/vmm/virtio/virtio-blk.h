/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * virtio-blk (virtio 1.x 5.2) over virtio-mmio, one request queue of 256.
 *
 * The disk is a read-only base image plus a private copy-on-write overlay:
 * the base is never written. The overlay is an unlinked temporary file
 * (O_TMPFILE in overlay_dir, falling back to mkostemp + unlink) created on the
 * first write, with an in-memory bitmap of the 4 KiB blocks it holds; a
 * partial write of a block not yet in the overlay copies the block from the
 * base first. A device that is never written costs one small allocation.
 *
 * Offered features: VIRTIO_F_VERSION_1, VIRTIO_BLK_F_FLUSH (and VIRTIO_BLK_F_RO for
 * a read-only device, see enum virtio_blk_mode).
 * Requests: T_IN, T_OUT, T_FLUSH (nothing to do: the overlay is temporary),
 * T_GET_ID; anything else gets VIRTIO_BLK_S_UNSUPP. A request that reaches
 * past the capacity, is not a multiple of 512 bytes, or has its data buffers
 * in the wrong direction gets VIRTIO_BLK_S_IOERR. The status byte is written
 * whenever the chain has a device-writable last byte; a chain without one is
 * completed with nothing done.
 *
 * Config space: u64 capacity (512-byte sectors) only.
 */

#include <stdint.h>

#include "virtio-mmio.h"

#define VIRTIO_BLK_F_RO_BIT    5
#define VIRTIO_BLK_F_FLUSH_BIT 9

#define VIRTIO_BLK_T_IN     0u
#define VIRTIO_BLK_T_OUT    1u
#define VIRTIO_BLK_T_FLUSH  4u
#define VIRTIO_BLK_T_GET_ID 8u

#define VIRTIO_BLK_S_OK     0u
#define VIRTIO_BLK_S_IOERR  1u
#define VIRTIO_BLK_S_UNSUPP 2u

#define VIRTIO_BLK_SECTOR_SIZE 512u
#define VIRTIO_BLK_ID_BYTES    20u
#define VIRTIO_BLK_OVERLAY_BLOCK 4096u
#define VIRTIO_BLK_QUEUE_SIZE  256u
#define VIRTIO_BLK_LAYERS_MAX  256u

/* Create the device at mmio_base (irq on gsi) and register it on vmm's bus.
 * base_fd: the disk image, opened read-only (regular file or block device);
 * the device owns it after success (untouched on failure). The capacity is
 * its size rounded down to 512 bytes. overlay_dir: where the overlay goes
 * once the guest writes (NULL: $TMPDIR or /var/tmp); copied. */
int virtio_blk_new(struct vmm *vmm, uint64_t mmio_base, uint32_t gsi, int base_fd, const char *overlay_dir,
                   struct virtio_mmio **ret);

/* What the guest's writes do. */
enum virtio_blk_mode {
        VIRTIO_BLK_COPY_ON_WRITE, /* into the private overlay (virtio_blk_new()) */
        VIRTIO_BLK_READ_ONLY,     /* offered with VIRTIO_BLK_F_RO; a write gets VIRTIO_BLK_S_IOERR */
        VIRTIO_BLK_DIRECT,        /* into base_fd itself (opened read-write); T_FLUSH is fdatasync() */
        _VIRTIO_BLK_MODE_MAX,
};

/* virtio_blk_new() with a mode: the volumes attached after the root disk. */
int virtio_blk_new_mode(struct vmm *vmm, uint64_t mmio_base, uint32_t gsi, int base_fd, const char *overlay_dir,
                        enum virtio_blk_mode mode, struct virtio_mmio **ret);

/* The serial returned by VIRTIO_BLK_T_GET_ID: at most 20 bytes, zero-padded
 * (default "forkd"). -EINVAL if longer than 20 or dev is not a virtio-blk. */
int virtio_blk_set_id(struct virtio_mmio *dev, const char *id);

/* Capacity in 512-byte sectors (0 if dev is not a virtio-blk). */
uint64_t virtio_blk_capacity(struct virtio_mmio *dev);

/* Write the merged disk (base + overlay), capacity bytes, into the regular
 * file out_fd from offset 0; out_fd is truncated first, so ranges that are
 * holes in the base stay holes. Uses copy_file_range() where possible.
 * Does not change the file offset of out_fd. 0 or negative errno. */
int virtio_blk_export(struct virtio_mmio *dev, int out_fd);

/* Freeze the live overlay (a branch of the running VM took it as it stands):
 * it becomes a read-only layer between the base and a fresh overlay, made on
 * the next write. Nothing is copied. 1 if a layer was added, 0 if the disk was
 * never written since the last freeze, -E2BIG past VIRTIO_BLK_LAYERS_MAX. */
int virtio_blk_freeze_overlay(struct virtio_mmio *dev);
/* Stack a read-only layer (a snapshot's disk.layer.<i>: fd, and map_fd, its
 * bitmap: little-endian 64-bit words, capacity / 4096 / 64 + 1 of them) over
 * the layers so far, before the guest writes anything. Takes fd on success
 * (map_fd stays the caller's). -EBADMSG for a file of the wrong size. */
int virtio_blk_push_layer(struct virtio_mmio *dev, int fd, int map_fd);

/* For a snapshot of a VM whose overlay is frozen (no live overlay, else
 * -EBUSY): hard-link the base as dfd/disk_name and every frozen layer as
 * dfd/disk.layer.<i> (i from 1), and write their maps, copying no data. Fails
 * (-EXDEV, ...) where a file cannot be linked (another filesystem, an
 * unlinked file); the caller then exports. *ret_n: the number of layers. */
int virtio_blk_link_layers(struct virtio_mmio *dev, int dfd, const char *disk_name, unsigned *ret_n);

/* Where linkat() of a file (the base, a layer) refuses with EPERM or EXDEV,
 * virtio_blk_link_layers() and virtio_blk_link_base() ask fn, when set, and
 * take its answer instead: 0 when it will see to dfd/name itself (a branch's
 * writer hands such a file to forkd, which links it), else a negative errno.
 * One per process (a branch's writer sets it). */
typedef int (*virtio_blk_link_refused_t)(int fd, int dfd, const char *name);
void virtio_blk_on_link_refused(virtio_blk_link_refused_t fn);

/* Hard-link the base (never written in place) as dfd/name. */
int virtio_blk_link_base(struct virtio_mmio *dev, int dfd, const char *name);

/* For a frozen copy that becomes a template (no live overlay, else -EBUSY):
 * new fds of the base and of every frozen layer, with each layer's map in a
 * memfd, as snapshot_load() would give them for virtio_blk_push_layer(). */
int virtio_blk_open_layers(struct virtio_mmio *dev, int *ret_base_fd, int *layer_fds, int *map_fds,
                           unsigned *ret_n);

/* Where the overlay goes (as given to virtio_blk_new()). */
const char *virtio_blk_overlay_dir(struct virtio_mmio *dev);

/* Frozen layers stacked under the live overlay. */
unsigned virtio_blk_layers(struct virtio_mmio *dev);

/* Blocks written by the guest so far (blocks held by the overlay). */
uint64_t virtio_blk_overlay_blocks(struct virtio_mmio *dev);
