/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Putting a whole microVM together: memory, vCPU, devices, either from a
 * guest image (boot) or from a parsed snapshot (restore). */

#include "bootinfo.h"
#include "vmm-client.h"
#include "snapshot.h"
#include "vmm.h"

#define MACHINE_GSI_BLK 5
#define MACHINE_GSI_CONSOLE 6
#define MACHINE_GSI_NET 7
/* The NIC's place on the MMIO bus: after virtio-blk and virtio-console. */
#define MACHINE_NET_MMIO_BASE (FORKD_VIRTIO_MMIO_BASE + 2 * FORKD_VIRTIO_MMIO_SIZE)
/* Volume i (vdb, vdc, ...): its place after the NIC's, whether or not the VM has
 * one, so that a device never moves; the 24 volumes share the GSIs 16..23. */
#define MACHINE_VOLUME_MMIO_BASE(i) (FORKD_VIRTIO_MMIO_BASE + (3 + (uint64_t) (i)) * FORKD_VIRTIO_MMIO_SIZE)
#define MACHINE_GSI_VOLUME(i) (16 + (uint32_t) (i) % 8)

/* A NIC (virtio-net, virtio-net.h) and its backend. */
struct machine_net {
        int tap_fd;        /* the backend (virtio_net_check_backend()); the VM uses a
                            * duplicate of it, the caller keeps and closes this one */
        uint8_t mac[6];    /* boot: the NIC's MAC; restore: ignored, the snapshot's */
};

/* A volume for machine_boot(): the device reads (and for rw writes) a duplicate
 * of fd, which stays the caller's; meta is what snapshot.json records of it. */
struct machine_volume {
        int fd;
        const struct snapshot_volume *meta;
};

struct machine_config {
        const char *id;          /* sandbox id, <= 64 chars */
        const char *console_log; /* serial output, NULL to discard */
        const char *overlay_dir; /* where the copy-on-write disk overlay lives */
        int agent_fd;            /* connected agent channel, or -1 */
        const char *initrd;      /* Linux guests only, may be NULL */
        const char *cmdline;     /* Linux guests only, NULL for the default */
        /* boot: a NIC with this backend, or NULL for none. restore: the
         * backend for the snapshot's NIC. A snapshot with a NIC is not
         * restored without one (-ENONET), a tap for a snapshot without a NIC
         * is refused too (-ENODEV): the caller asked for a network it would
         * not get. */
        const struct machine_net *net;
        /* boot: the volumes, in device order. restore: ignored, the snapshot's
         * (struct snapshot's volumes, all of them with an fd, else -ENXIO). */
        const struct machine_volume *volumes;
        unsigned n_volumes;
        /* The devices' counters: a page shared with forkd (vmm-stats.h, set up
         * by the caller), or NULL for the VMM's own. */
        struct vmm_stats *stats;
        /* boot: the vCPUs, 1..VMM_VCPUS_MAX (0: 1). restore: ignored, the snapshot's. */
        unsigned vcpus;
};

#define MACHINE_LINUX_CMDLINE VMM_LINUX_CMDLINE_DEFAULT


/* Boot a fresh VM from a guest image (the ELF test guest, or a Linux bzImage
 * described to the kernel by ACPI) and a disk image. */
int machine_boot(int kvm_fd, const char *kernel, const char *disk, uint64_t mem_size, const struct machine_config *cfg,
                 struct vmm **ret);

/* Restore a VM from a loaded snapshot. mem is the snapshot's memory.bin mapped
 * MAP_PRIVATE (shared by every child of a template); the caller keeps owning it. */
int machine_restore(int kvm_fd, const struct snapshot *snap, uint8_t *mem, const struct machine_config *cfg,
                    struct vmm **ret);

/* Whether a VM state has a NIC: 1 (and its MAC in *ret_mac, if not NULL),
 * 0 if it has none, -EBADMSG if its NIC state is corrupt. */
int machine_state_net(const struct vmstate *s, uint8_t *ret_mac);

/* Free the VM and its devices. Does not unmap a borrowed (restore) mapping. */
struct vmm *machine_free(struct vmm *vmm);

/* Queue the identity event for the guest: id, generation, fresh entropy, wall clock. */
int machine_send_identity(struct vmm *vmm);
