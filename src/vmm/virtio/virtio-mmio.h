/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * virtio-mmio transport, version 2 (modern only; virtio 1.x section 4.2.2).
 *
 * A struct virtio_mmio is one device on the MMIO bus: the register file at
 * base .. base + FORKD_VIRTIO_MMIO_SIZE, its virtqueues, and a device back
 * end (virtio-blk, virtio-console, virtio-net) behind struct virtio_dev_ops.
 *
 * Behaviour towards the guest:
 *   - VIRTIO_F_VERSION_1 is always offered and must be accepted: FEATURES_OK
 *     does not stick if the driver did not accept it or accepted a feature
 *     that is not offered. Driver features are frozen once FEATURES_OK is set.
 *   - Registers below 0x100 accept only aligned 32-bit accesses; anything else
 *     is ignored (reads return zero). Config space (0x100..) accepts 1/2/4/8
 *     byte accesses inside the device's config, and is read-only.
 *   - Writing 0 to Status resets the device (queues, features, ISR, selectors).
 *   - QueueReady=1 validates the queue (size a power of two <= QueueNumMax,
 *     rings aligned and inside guest RAM); a bad queue is not made ready and
 *     the device goes DEVICE_NEEDS_RESET. Queue registers are ignored while
 *     the selected queue is ready.
 *   - A driver that breaks a ring puts the device in DEVICE_NEEDS_RESET
 *     (status bit 0x40, a configuration change interrupt); the device then
 *     does no more work until the driver resets it.
 *   - Used buffers: InterruptStatus bit 0 and an edge on the device's gsi
 *     (vmm_irq_pulse); configuration change: bit 1.
 *
 * Lifetime: *_new() registers the device with vmm_register_mmio(); there is
 * no unregistration, so virtio_mmio_free() is for VMM teardown (or for a vmm
 * whose bus is never dispatched again).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "virtio-queue.h"
#include "vmm.h"

/* Device status bits (virtio 1.x 2.1) */
#define VIRTIO_STATUS_ACKNOWLEDGE        1u
#define VIRTIO_STATUS_DRIVER             2u
#define VIRTIO_STATUS_DRIVER_OK          4u
#define VIRTIO_STATUS_FEATURES_OK        8u
#define VIRTIO_STATUS_DEVICE_NEEDS_RESET 64u
#define VIRTIO_STATUS_FAILED             128u

/* Feature bits (virtio 1.x 6) */
#define VIRTIO_F_VERSION_1_BIT           32

/* InterruptStatus bits */
#define VIRTIO_MMIO_INT_VRING            1u
#define VIRTIO_MMIO_INT_CONFIG           2u

/* Register offsets (virtio 1.x 4.2.2) */
#define VIRTIO_MMIO_MAGIC_VALUE          0x000
#define VIRTIO_MMIO_VERSION              0x004
#define VIRTIO_MMIO_DEVICE_ID            0x008
#define VIRTIO_MMIO_VENDOR_ID            0x00c
#define VIRTIO_MMIO_DEVICE_FEATURES      0x010
#define VIRTIO_MMIO_DEVICE_FEATURES_SEL  0x014
#define VIRTIO_MMIO_DRIVER_FEATURES      0x020
#define VIRTIO_MMIO_DRIVER_FEATURES_SEL  0x024
#define VIRTIO_MMIO_QUEUE_SEL            0x030
#define VIRTIO_MMIO_QUEUE_NUM_MAX        0x034
#define VIRTIO_MMIO_QUEUE_NUM            0x038
#define VIRTIO_MMIO_QUEUE_READY          0x044
#define VIRTIO_MMIO_QUEUE_NOTIFY         0x050
#define VIRTIO_MMIO_INTERRUPT_STATUS     0x060
#define VIRTIO_MMIO_INTERRUPT_ACK        0x064
#define VIRTIO_MMIO_STATUS               0x070
#define VIRTIO_MMIO_QUEUE_DESC_LOW       0x080
#define VIRTIO_MMIO_QUEUE_DESC_HIGH      0x084
#define VIRTIO_MMIO_QUEUE_DRIVER_LOW     0x090
#define VIRTIO_MMIO_QUEUE_DRIVER_HIGH    0x094
#define VIRTIO_MMIO_QUEUE_DEVICE_LOW     0x0a0
#define VIRTIO_MMIO_QUEUE_DEVICE_HIGH    0x0a4
#define VIRTIO_MMIO_SHM_SEL              0x0ac
#define VIRTIO_MMIO_SHM_LEN_LOW          0x0b0
#define VIRTIO_MMIO_SHM_LEN_HIGH         0x0b4
#define VIRTIO_MMIO_SHM_BASE_LOW         0x0b8
#define VIRTIO_MMIO_SHM_BASE_HIGH        0x0bc
#define VIRTIO_MMIO_CONFIG_GENERATION    0x0fc
#define VIRTIO_MMIO_CONFIG               0x100

#define VIRTIO_MMIO_MAGIC                0x74726976u /* "virt" */
#define VIRTIO_MMIO_VERSION_MODERN       2u
#define VIRTIO_MMIO_VENDOR               0x444b5246u /* "FRKD" */

#define VIRTIO_MMIO_MAX_QUEUES           2
#define VIRTIO_MMIO_CONFIG_MAX           64

/* Transport save blob: see virtio_mmio_save(). */
#define VIRTIO_MMIO_STATE_MAGIC          0x4f495646u /* "FVIO" */
#define VIRTIO_MMIO_STATE_VERSION        1u

struct virtio_mmio;

/* ---- The face towards the VMM core ---------------------------------------- */

void virtio_mmio_free(struct virtio_mmio *dev);
static inline void virtio_mmio_freep(struct virtio_mmio **p) {
        virtio_mmio_free(*p);
}
#define _cleanup_virtio_mmio_ _cleanup_(virtio_mmio_freep)

/* The virtio device id (FORKD_VIRTIO_ID_*), e.g. to choose a vmstate kind. */
uint32_t virtio_mmio_device_id(const struct virtio_mmio *dev);
/* The registered bus device (base, size), e.g. for bootinfo. */
struct mmio_dev *virtio_mmio_bus_dev(struct virtio_mmio *dev);
uint32_t virtio_mmio_gsi(const struct virtio_mmio *dev);

/* Serialize transport + queue + device state into buf (little-endian,
 * versioned, at most VIRTIO_MMIO_STATE_MAX bytes). The blob holds:
 *   u32 magic "FVIO", u16 version, u16 n_queues, u32 device_id, u32 status,
 *   u32 isr, u32 device_features_sel, u32 driver_features_sel, u32 queue_sel,
 *   u64 driver_features, u32 config_generation, u32 dev_len,
 *   n_queues x { u32 num, u16 last_avail_idx, u16 used_idx, u64 desc, u64 avail,
 *                u64 used, u32 flags (1 ready, 2 broken), u32 reserved },
 *   u8 dev[dev_len] (device specific, versioned by the device).
 * Chains popped but not completed at save time (a console tx chain waiting for
 * host backlog space) are saved as not popped: after a restore the device
 * consumes them again from the start.
 * Returns 0, or -ENOBUFS if cap is too small. Does not change the device. */
int virtio_mmio_save(struct virtio_mmio *dev, void *buf, size_t cap, size_t *ret_len);

/* Load a blob from virtio_mmio_save() into a freshly created device of the
 * same kind (queues and ring addresses are checked against vmm's RAM).
 * Everything is validated before anything is applied: on any error the
 * device is unchanged and -EBADMSG is returned. */
int virtio_mmio_restore(struct vmm *vmm, struct virtio_mmio *dev, const void *buf, size_t len);

#define VIRTIO_MMIO_STATE_HDR_SIZE   48u
#define VIRTIO_MMIO_STATE_QUEUE_SIZE 40u
#define VIRTIO_MMIO_STATE_DEV_MAX    64u
#define VIRTIO_MMIO_STATE_MAX \
        (VIRTIO_MMIO_STATE_HDR_SIZE + VIRTIO_MMIO_MAX_QUEUES * VIRTIO_MMIO_STATE_QUEUE_SIZE + VIRTIO_MMIO_STATE_DEV_MAX)

/* The device-specific part of a save blob of device device_id, without
 * restoring anything (e.g. to learn a NIC's MAC from a snapshot before the
 * device exists). Checks the blob's framing only (magic, version, device id,
 * lengths); the part itself is the device's to validate. 0 with *ret_part
 * pointing into buf, or -EBADMSG. */
int virtio_mmio_state_dev_part(const void *buf, size_t len, uint32_t device_id, const uint8_t **ret_part,
                               size_t *ret_part_len);

/* ---- The face towards device back ends (blk.c, console.c) ----------------- */

struct virtio_dev_ops {
        uint32_t device_id;
        /* The driver notified queue q, or (q == VIRTIO_MMIO_KICK_ALL) the
         * device just became DRIVER_OK or was restored. Only called while the
         * device is active (virtio_mmio_active()). */
        void (*notify)(struct vmm *vmm, struct virtio_mmio *dev, unsigned q);
        /* The driver reset the device: drop references into guest RAM. */
        void (*reset)(struct virtio_mmio *dev);
        /* Device-specific part of the save blob (<= VIRTIO_MMIO_STATE_DEV_MAX). */
        int (*save)(struct virtio_mmio *dev, uint8_t *buf, size_t cap, size_t *ret_len);
        /* Validate, then (only if valid) apply the device-specific part. */
        int (*restore_check)(struct virtio_mmio *dev, const uint8_t *buf, size_t len);
        void (*restore_apply)(struct virtio_mmio *dev, const uint8_t *buf, size_t len);
        /* Free priv (called by virtio_mmio_free()). */
        void (*free)(void *priv);
};

#define VIRTIO_MMIO_KICK_ALL (~0u)

/* Create a device and register it on vmm's MMIO bus at base (size
 * FORKD_VIRTIO_MMIO_SIZE). features: the device feature bits (VERSION_1 is
 * added). config: initial config space (config_len <= VIRTIO_MMIO_CONFIG_MAX).
 * On success the device owns priv (freed through ops->free); on failure priv
 * is untouched. */
int virtio_mmio_new(struct vmm *vmm, uint64_t base, uint32_t gsi, const struct virtio_dev_ops *ops,
                    uint64_t features, unsigned n_queues, uint32_t queue_max,
                    const void *config, uint32_t config_len, void *priv, struct virtio_mmio **ret);

void *virtio_mmio_priv(struct virtio_mmio *dev);
/* Replace the first len bytes of config space (len <= the config_len given at
 * creation), e.g. from restore_apply. Does not bump ConfigGeneration nor
 * raise a configuration change interrupt: for state the driver already saw. */
int virtio_mmio_set_config(struct virtio_mmio *dev, const void *config, uint32_t len);
struct vmm *virtio_mmio_vmm(struct virtio_mmio *dev);
struct virtq *virtio_mmio_queue(struct virtio_mmio *dev, unsigned q);
uint32_t virtio_mmio_status(const struct virtio_mmio *dev);

/* DRIVER_OK and FEATURES_OK set, neither NEEDS_RESET nor FAILED. */
bool virtio_mmio_active(const struct virtio_mmio *dev);

/* After pushing used buffers on queue q: ISR bit 0 + irq unless suppressed. */
void virtio_mmio_signal_used(struct vmm *vmm, struct virtio_mmio *dev, unsigned q);

/* The driver broke the protocol: set DEVICE_NEEDS_RESET, raise a
 * configuration change interrupt. Idempotent. */
void virtio_mmio_set_needs_reset(struct vmm *vmm, struct virtio_mmio *dev);
/* Run every queue of an active device as if the driver had notified them
 * (dev may be NULL): for a device that stopped a queue to wait, e.g. for a
 * rate limit's tokens. */
void virtio_mmio_kick(struct vmm *vmm, struct virtio_mmio *dev);
