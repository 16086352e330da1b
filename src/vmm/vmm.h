/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * forkd-vmm core: one process per microVM, 1..VMM_VCPUS_MAX vCPUs.
 *
 * vCPU 0 (the BSP) runs in the main thread, which also services the host:
 * host-side events (agent channel data, control requests, frames on the NIC's
 * tap) arrive as SIGIO on O_ASYNC fds aimed at the main thread; the signal
 * handler sets vCPU 0's kvm_run->immediate_exit so KVM_RUN returns -EINTR,
 * the loop polls the fds, then re-enters the guest.
 *
 * Each further vCPU (an AP) runs KVM_RUN in a thread of its own, created
 * when the guest first runs (after fork(2) in a template's child). Device
 * emulation is serialised by one lock, vmm->dev_lock: every MMIO/PIO exit of
 * any vCPU and every servicing of host fds by the main thread hold it, so
 * device code still never races with itself and needs no locks of its own.
 * Whatever needs vCPU state (snapshot, branch, fork of a running VM, pause,
 * compact) first stops every AP out of KVM_RUN (vmm_vcpus_stop(): each AP's
 * immediate_exit plus SIGIO to its thread, then a wait until all are parked)
 * and lets them run again after (vmm_vcpus_resume()). With one vCPU there are
 * no threads and both are no-ops.
 */

#include <linux/kvm.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "macro.h"
#include "vmm-stats.h"

#define VMM_MAX_MMIO_DEVS 32 /* virtio-blk, -console, -net and up to VMM_VOLUMES_MAX volumes */
#define VMM_VOLUMES_MAX 24
#define VMM_MAX_PIO_DEVS 8
#define VMM_MEM_MIN (16ull << 20)
#define VMM_MEM_MAX (3072ull << 20)
#define VMM_VCPUS_MAX 32

struct vmm;

/* A device on the MMIO bus. Offsets are relative to base. Reads must fill all
 * len bytes (unknown registers read as zero); hostile offsets/lengths are
 * ignored, never trusted. */
struct mmio_dev {
        uint64_t base;
        uint64_t size;
        void *priv;
        void (*read)(struct vmm *vmm, struct mmio_dev *dev, uint64_t off, void *data, uint32_t len);
        void (*write)(struct vmm *vmm, struct mmio_dev *dev, uint64_t off, const void *data, uint32_t len);
};

/* A device on the port I/O bus. */
struct pio_dev {
        uint16_t base;
        uint16_t len;
        void *priv;
        void (*read)(struct vmm *vmm, struct pio_dev *dev, uint16_t off, void *data, uint32_t len);
        void (*write)(struct vmm *vmm, struct pio_dev *dev, uint16_t off, const void *data, uint32_t len);
};

enum vmm_stop_reason {
        VMM_RUNNING = 0,
        VMM_STOP_RESET,     /* guest asked for reset / power off via i8042 */
        VMM_STOP_SHUTDOWN,  /* triple fault (KVM_EXIT_SHUTDOWN) */
        VMM_STOP_HALTED,    /* the guest halted with no way to wake up */
        VMM_STOP_SIGNAL,    /* SIGTERM/SIGINT from the host */
        VMM_STOP_ERROR,     /* internal error or unhandled exit */
};

/* One vCPU. vCPU 0 runs in the main thread; the others in threads of their own. */
struct vmm_vcpu {
        struct vmm *vmm;
        unsigned index;        /* also its APIC id */
        int fd;
        struct kvm_run *run;
        pthread_t thread;
        bool thread_started;
        volatile pid_t tid;    /* its thread, once it runs */
        bool parked;           /* out of KVM_RUN, waiting (under vmm->vcpu_lock) */
};

struct vmm {
        int kvm_fd;
        int vm_fd;
        int vcpu_fd;           /* vCPU 0's: vcpus[0].fd */
        struct kvm_run *run;   /* vCPU 0's: vcpus[0].run */
        size_t run_size;

        unsigned n_vcpus;
        struct vmm_vcpu vcpus[VMM_VCPUS_MAX];
        pthread_mutex_t dev_lock;   /* device emulation, see the top of this file */
        pthread_mutex_t vcpu_lock;  /* the fields below and each vCPU's parked */
        pthread_cond_t vcpu_cond;
        unsigned vcpus_hold;        /* > 0: APs stay out of KVM_RUN (vmm_vcpus_stop() nests) */
        unsigned n_parked;

        uint8_t *mem;          /* guest RAM, GPA 0 .. mem_size */
        uint64_t mem_size;
        int mem_fd;            /* memfd backing guest RAM at boot, else -1 */
        bool mem_owned;        /* unmap mem on free (false: borrowed from a template) */

        struct mmio_dev *mmio[VMM_MAX_MMIO_DEVS];
        unsigned n_mmio;
        struct pio_dev *pio[VMM_MAX_PIO_DEVS];
        unsigned n_pio;

        /* devices we own */
        struct serial *serial;
        struct virtio_mmio *blk;
        struct virtio_mmio *console;
        struct virtio_mmio *net;      /* NULL: the VM has no NIC */
        /* Volumes: virtio-blk devices after the root disk, in a fixed order, and
         * what snapshot.json says of each (n_volumes entries of volume_meta). */
        struct virtio_mmio *volumes[VMM_VOLUMES_MAX];
        struct snapshot_volume *volume_meta;
        unsigned n_volumes;

        uint32_t tsc_khz;
        char id[65];           /* sandbox id given by the host */
        uint64_t generation;   /* 0 at boot, parent's + 1 after a restore */
        char guest_kind[16];   /* "test" (ELF test guest) or "linux" (bzImage) */
        struct kvm_cpuid2 *cpuid; /* what the vCPU was given, saved with snapshots */

        /* The devices' counters: own_stats until forkd's shared page is mapped
         * (vmm_stats.h); never NULL. */
        struct vmm_stats *stats;
        struct vmm_stats own_stats;

        /* disk_rate and net_rate (vmm-limits.h); NULL: none set */
        struct vmm_limits *limits;

        enum vmm_stop_reason stop;
        int exit_status;
};

/* Translate a guest-physical range to a host pointer. Returns NULL if any byte
 * of [gpa, gpa+len) lies outside guest RAM (overflow-safe). */
static inline void *vmm_gpa(struct vmm *vmm, uint64_t gpa, uint64_t len) {
        if (gpa > vmm->mem_size || len > vmm->mem_size - gpa)
                return NULL;
        return vmm->mem + gpa;
}

int vmm_register_mmio(struct vmm *vmm, struct mmio_dev *dev);
int vmm_register_pio(struct vmm *vmm, struct pio_dev *dev);

/* Raise an edge on an IOAPIC pin. */
int vmm_irq_pulse(struct vmm *vmm, uint32_t gsi);

/* Ask the run loop to stop with the given reason (callable from device code,
 * on any vCPU's thread). */
void vmm_request_stop(struct vmm *vmm, enum vmm_stop_reason reason);

/* Bring every AP out of KVM_RUN and keep it out (returns once all are
 * parked, each with its in-flight PIO/MMIO completed), and let them run
 * again; calls nest. Main thread only, with vmm->dev_lock held (it is
 * dropped while waiting, so that an AP can finish the exit it handles);
 * no-ops with one vCPU or without AP threads (before vmm_run(), in a frozen
 * copy). */
void vmm_vcpus_stop(struct vmm *vmm);
void vmm_vcpus_resume(struct vmm *vmm);
