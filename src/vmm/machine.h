/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Putting a whole microVM together: memory, vCPU, devices, either from a
 * guest image (boot) or from a parsed snapshot (restore). */

#include "snapshot.h"
#include "vmm.h"

#define MACHINE_GSI_BLK 5
#define MACHINE_GSI_CONSOLE 6

struct machine_config {
        const char *id;          /* sandbox id, <= 64 chars */
        const char *console_log; /* serial output, NULL to discard */
        const char *overlay_dir; /* where the copy-on-write disk overlay lives */
        int agent_fd;            /* connected agent channel, or -1 */
        const char *initrd;      /* Linux guests only, may be NULL */
        const char *cmdline;     /* Linux guests only, NULL for the default */
};

#define MACHINE_LINUX_CMDLINE "console=ttyS0 reboot=k panic=-1 root=/dev/vda rw quiet"


/* Boot a fresh VM from a guest image (the ELF test guest, or a Linux bzImage
 * described to the kernel by ACPI) and a disk image. */
int machine_boot(int kvm_fd, const char *kernel, const char *disk, uint64_t mem_size, const struct machine_config *cfg,
                 struct vmm **ret);

/* Restore a VM from a loaded snapshot. mem is the snapshot's memory.bin mapped
 * MAP_PRIVATE (shared by every child of a template); the caller keeps owning it. */
int machine_restore(int kvm_fd, const struct snapshot *snap, uint8_t *mem, const struct machine_config *cfg,
                    struct vmm **ret);

/* Free the VM and its devices. Does not unmap a borrowed (restore) mapping. */
struct vmm *machine_free(struct vmm *vmm);

/* Queue the identity event for the guest: id, generation, fresh entropy, wall clock. */
int machine_send_identity(struct vmm *vmm);
