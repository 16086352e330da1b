/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The boot contract between forkd-vmm and a freestanding guest (the test guest).
 * This header is included by both sides, so it uses only <stdint.h>.
 *
 * The VMM loads an ELF64 image (PT_LOAD segments at their physical addresses,
 * at or above FORKD_KERNEL_MIN_GPA) and starts vCPU 0 (the BSP) straight in
 * 64-bit long mode (the APs of a VM of several vCPUs wait for INIT/SIPI):
 *   - CS = FORKD_SEL_KCODE (64-bit, DPL 0), DS/ES/SS/FS/GS = FORKD_SEL_KDATA
 *   - CR0 = PE|MP|ET|NE|WP|PG, CR4 = PAE, EFER = SCE|LME|LMA
 *   - CR3 = FORKD_PML4_GPA; page tables identity-map guest RAM [0, mem_size)
 *     and the MMIO window [0xC0000000, 4 GiB) with 2 MiB pages that are
 *     present, writable, user-accessible, with Accessed and Dirty preset
 *     (the MMIO window also cache-disabled). 1 GiB pages are not used.
 *   - GDT at FORKD_GDT_GPA with the selectors below (the guest may load its own)
 *   - RIP = ELF entry, RSP = FORKD_BOOT_STACK_TOP, RDI = FORKD_BOOTINFO_GPA,
 *     RFLAGS = 0x2 (interrupts off)
 * Devices are described by struct forkd_bootinfo at FORKD_BOOTINFO_GPA.
 * Interrupts: each virtio-mmio device raises an edge on its IOAPIC pin (gsi);
 * the guest programs the IOAPIC redirection entry and its LAPIC itself.
 */

#include <stdint.h>

#define FORKD_PML4_GPA          0x1000ull
#define FORKD_PDPT_GPA          0x2000ull
#define FORKD_PD_GPA            0x3000ull /* 4 pages: PDs for 0..4 GiB */
#define FORKD_GDT_GPA           0x7000ull
#define FORKD_BOOTINFO_GPA      0x8000ull
#define FORKD_BOOT_STACK_TOP    0x80000ull
#define FORKD_KERNEL_MIN_GPA    0x100000ull

#define FORKD_MMIO_WINDOW       0xc0000000ull
#define FORKD_VIRTIO_MMIO_BASE  0xd0000000ull
#define FORKD_VIRTIO_MMIO_SIZE  0x1000ull
#define FORKD_IOAPIC_GPA        0xfec00000ull
#define FORKD_LAPIC_GPA         0xfee00000ull

#define FORKD_SERIAL_PORT       0x3f8
#define FORKD_I8042_DATA_PORT   0x60
#define FORKD_I8042_CMD_PORT    0x64
#define FORKD_I8042_CMD_RESET   0xfe

#define FORKD_SEL_KCODE         0x08
#define FORKD_SEL_KDATA         0x10
#define FORKD_SEL_UDATA         0x18 /* use with RPL 3: 0x1b */
#define FORKD_SEL_UCODE         0x20 /* use with RPL 3: 0x23 */

#define FORKD_BOOTINFO_MAGIC    0x4f4f42444b524f46ull /* "FORKDBOO" little-endian */
#define FORKD_BOOTINFO_VERSION  1
#define FORKD_BOOTINFO_MAX_DEVS 8

/* virtio device ids (virtio spec 5.x) */
#define FORKD_VIRTIO_ID_NET     1
#define FORKD_VIRTIO_ID_BLK     2
#define FORKD_VIRTIO_ID_CONSOLE 3

struct forkd_bootinfo_dev {
        uint32_t virtio_id;
        uint32_t gsi;       /* IOAPIC pin */
        uint64_t mmio_base;
        uint64_t mmio_size;
};

struct forkd_bootinfo {
        uint64_t magic;
        uint32_t version;
        uint32_t n_devs;
        uint64_t mem_size;  /* bytes of RAM at GPA 0 */
        uint64_t tsc_khz;   /* guest TSC frequency, 0 if unknown */
        struct forkd_bootinfo_dev devs[FORKD_BOOTINFO_MAX_DEVS];
        char cmdline[256];
        /* vCPUs, APIC ids 0..n_cpus-1 (0 from a VMM of before: one). Only the
         * BSP (APIC id 0) is started; the others wait for INIT/SIPI. */
        uint32_t n_cpus;
        uint32_t reserved;
};
