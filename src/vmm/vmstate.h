/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * vmstate: the versioned binary file that holds everything of a snapshot
 * except guest RAM (memory.bin) and the disk.
 *
 * On disk (all integers little-endian):
 *
 *   header (32 bytes)
 *     u8[8]  magic        "FKVMSTAT"
 *     u32    version      VMSTATE_VERSION (2); version 1 files, written
 *                         before snapshots had several vCPUs, are still read:
 *                         they have the same layout and exactly one vCPU
 *     u32    flags        0 (reserved; non-zero is refused)
 *     u64    payload_len  bytes that follow the header
 *     u32    payload_crc  CRC-32C of the payload
 *     u32    header_crc   CRC-32C of the first 28 bytes of the header
 *   payload: a sequence of sections, each
 *     u32    type         enum vmstate_section
 *     u32    index        vCPU or device index (0 for VM-wide sections)
 *     u32    len          bytes of data
 *     u32    reserved     0
 *     u8     data[len]    followed by zero padding to a multiple of 8
 *
 * Sections appear in the order the restore must apply them (Firecracker's
 * order): per vCPU CPUID, MP_STATE, REGS, SREGS, XSAVE, XCRS, DEBUGREGS,
 * LAPIC, MSRS (TSC_DEADLINE last), EVENTS; then VM-wide PIT, CLOCK,
 * IRQCHIP (PIC master, PIC slave, IOAPIC); devices last. MEMORY is first of all.
 * Decoding refuses: short buffers, bad magic, unknown version, non-zero flags or
 * reserved fields, CRC mismatch, a section that runs past the payload, a
 * section of the wrong size, an unknown or duplicate section, a missing
 * mandatory section, or sections out of order.
 *
 * In detail (each is a static reason string from vmstate_decode()):
 *   - the header CRC is checked before the version, so a version error is
 *     only reported for an intact header; payload_len must match the buffer
 *     exactly (no trailing bytes);
 *   - every section's len is the exact sizeof() of its kernel struct; CPUID
 *     and MSRS have len == 8 + count * entry size with count <= the maximum;
 *     the u32 pad after a count or device kind is 0; padding bytes are 0;
 *   - every section except DEVICE is mandatory; vCPU sections carry the vCPU
 *     index (< VMSTATE_MAX_VCPUS, numbered from 0 without gaps, at least one
 *     vCPU; exactly one in a version 1 file), VM-wide sections index 0, DEVICE sections slots 0, 1, 2, ...
 *     without gaps (index < VMSTATE_MAX_DEVS);
 *   - order is strictly MEMORY; per vCPU in index order the vCPU sections in
 *     enum order; PIT, CLOCK, PIC_MASTER, PIC_SLAVE, IOAPIC; devices by slot;
 *   - MEMORY: reserved 0, mem_size a non-zero multiple of 2 MiB;
 *   - irqchip sections carry their chip_id (0, 1, 2);
 *   - DEVICE: kind is a known enum vmstate_dev_kind, blob <= VMSTATE_DEV_BLOB_MAX.
 * The MSR order inside MSRS (TSC_DEADLINE last) is the writer's duty and is
 * not checked. Kernel structs are stored as the kernel lays them out (x86 is
 * little-endian); the format is x86-64 only.
 */

#include <linux/kvm.h>
#include <stddef.h>
#include <stdint.h>

#define VMSTATE_MAGIC "FKVMSTAT"
#define VMSTATE_VERSION 2
#define VMSTATE_VERSION_MIN 1 /* version 1: one vCPU only, otherwise the same layout */
#define VMSTATE_HEADER_SIZE 32
#define VMSTATE_MAX_VCPUS 32
#define VMSTATE_MAX_MSRS 64
#define VMSTATE_MAX_CPUID 96
#define VMSTATE_MAX_DEVS 32
#define VMSTATE_DEV_BLOB_MAX 1024
#define VMSTATE_MAX_SIZE (1u << 20) /* a file larger than this is refused */

enum vmstate_section {
        VMSTATE_SEC_MEMORY = 1,     /* struct vmstate_memory */
        VMSTATE_SEC_CPUID = 2,      /* u32 nent, u32 pad, struct kvm_cpuid_entry2[nent] */
        VMSTATE_SEC_MP_STATE = 3,   /* struct kvm_mp_state */
        VMSTATE_SEC_REGS = 4,       /* struct kvm_regs */
        VMSTATE_SEC_SREGS = 5,      /* struct kvm_sregs */
        VMSTATE_SEC_XSAVE = 6,      /* struct kvm_xsave (4096 bytes) */
        VMSTATE_SEC_XCRS = 7,       /* struct kvm_xcrs */
        VMSTATE_SEC_DEBUGREGS = 8,  /* struct kvm_debugregs */
        VMSTATE_SEC_LAPIC = 9,      /* struct kvm_lapic_state */
        VMSTATE_SEC_MSRS = 10,      /* u32 nmsrs, u32 pad, struct kvm_msr_entry[nmsrs] */
        VMSTATE_SEC_EVENTS = 11,    /* struct kvm_vcpu_events */
        VMSTATE_SEC_PIT = 12,       /* struct kvm_pit_state2 */
        VMSTATE_SEC_CLOCK = 13,     /* struct kvm_clock_data */
        VMSTATE_SEC_PIC_MASTER = 14,/* struct kvm_irqchip (chip_id 0) */
        VMSTATE_SEC_PIC_SLAVE = 15, /* struct kvm_irqchip (chip_id 1) */
        VMSTATE_SEC_IOAPIC = 16,    /* struct kvm_irqchip (chip_id 2) */
        VMSTATE_SEC_DEVICE = 17,    /* u32 kind, u32 pad, u8 blob[] (index = device slot) */
        _VMSTATE_SEC_MAX,
};

/* Device kinds carried in VMSTATE_SEC_DEVICE. The blob is the device's own
 * versioned little-endian state; the device validates it on restore. */
enum vmstate_dev_kind {
        VMSTATE_DEV_SERIAL = 1,
        VMSTATE_DEV_VIRTIO_BLK = 2,
        VMSTATE_DEV_VIRTIO_CONSOLE = 3,
        VMSTATE_DEV_I8042 = 4,
        VMSTATE_DEV_VIRTIO_NET = 5, /* only in snapshots of a VM with a NIC */
};

struct vmstate_memory {
        uint64_t mem_size;   /* bytes of guest RAM in memory.bin */
        uint64_t tsc_khz;
        uint64_t generation; /* how many restores deep this state is */
        uint64_t reserved;   /* 0 */
};

struct vmstate_vcpu {
        uint32_t n_cpuid;
        struct kvm_cpuid_entry2 cpuid[VMSTATE_MAX_CPUID];
        struct kvm_mp_state mp_state;
        struct kvm_regs regs;
        struct kvm_sregs sregs;
        struct kvm_xsave xsave;
        struct kvm_xcrs xcrs;
        struct kvm_debugregs debugregs;
        struct kvm_lapic_state lapic;
        uint32_t n_msrs;
        struct kvm_msr_entry msrs[VMSTATE_MAX_MSRS];
        struct kvm_vcpu_events events;
};

struct vmstate_dev {
        uint32_t kind;  /* enum vmstate_dev_kind */
        uint32_t len;   /* bytes used in blob */
        uint8_t blob[VMSTATE_DEV_BLOB_MAX];
};

struct vmstate {
        struct vmstate_memory memory;
        uint32_t n_vcpus;
        struct vmstate_vcpu vcpus[VMSTATE_MAX_VCPUS];
        struct kvm_pit_state2 pit;
        struct kvm_clock_data clock;
        struct kvm_irqchip pic_master, pic_slave, ioapic;
        uint32_t n_devs;
        struct vmstate_dev devs[VMSTATE_MAX_DEVS];
};

/* Serialize. On success *ret_buf is malloc()ed and owned by the caller.
 * Refuses (-EINVAL) a state that vmstate_decode() would refuse: n_vcpus not
 * in 1..VMSTATE_MAX_VCPUS, counts or blob lengths over their maximum, unknown
 * device kinds, wrong irqchip ids, bad mem_size or non-zero reserved. */
int vmstate_encode(const struct vmstate *s, void **ret_buf, size_t *ret_len);

/* Parse and validate. On failure returns a negative errno (-EBADMSG corrupt,
 * -EPROTONOSUPPORT wrong version, -EMSGSIZE too large) and, if ret_error is
 * not NULL, a static human-readable reason; *ret is left untouched. */
int vmstate_decode(const void *buf, size_t len, struct vmstate *ret, const char **ret_error);

/* Read/write a vmstate file. vmstate_write_file creates or truncates path
 * (mode 0600 before umask), writes it whole and fsyncs it; callers that need
 * atomic replacement write to a temporary name and rename. vmstate_read_file
 * refuses anything but a regular file and files larger than VMSTATE_MAX_SIZE
 * (-EMSGSIZE) without reading them whole. */
int vmstate_write_file(const char *path, const struct vmstate *s);
int vmstate_read_file(const char *path, struct vmstate *ret, const char **ret_error);
