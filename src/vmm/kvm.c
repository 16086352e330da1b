/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * VM and vCPU creation on /dev/kvm, the I/O buses and interrupt lines.
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include "kvm.h"
#include "vmm-limits.h"
#include "vmm.h"

#define KVM_TSS_ADDR 0xfffbd000ul
#define KVM_IDENTITY_MAP_ADDR 0xfffbc000ull

int vmm_open_kvm(void) {
        int fd, r;

        fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
        if (fd < 0)
                return log_debug_errno(errno, "Failed to open /dev/kvm: %m");

        r = ioctl(fd, KVM_GET_API_VERSION, 0);
        if (r != KVM_API_VERSION) {
                safe_close(fd);
                return log_debug_errno(EPROTONOSUPPORT, "Unsupported KVM API version %d", r);
        }
        return fd;
}

int vmm_new(int kvm_fd, struct vmm **ret) {
        struct vmm *vmm;

        vmm = calloc(1, sizeof(*vmm));
        if (!vmm)
                return -ENOMEM;
        vmm->kvm_fd = kvm_fd;
        vmm->vm_fd = -EBADF;
        vmm->vcpu_fd = -EBADF;
        for (unsigned i = 0; i < VMM_VCPUS_MAX; i++)
                vmm->vcpus[i] = (struct vmm_vcpu) { .vmm = vmm, .index = i, .fd = -EBADF };
        vmm->n_vcpus = 1;
        pthread_mutex_init(&vmm->dev_lock, NULL);
        pthread_mutex_init(&vmm->vcpu_lock, NULL);
        pthread_cond_init(&vmm->vcpu_cond, NULL);
        vmm->mem_fd = -EBADF;
        vmm->own_stats = (struct vmm_stats) { .magic = VMM_STATS_MAGIC, .version = VMM_STATS_VERSION };
        vmm->stats = &vmm->own_stats;
        *ret = vmm;
        return 0;
}

/* Create the VM with the in-kernel irqchip (PIC + IOAPIC + LAPIC) and PIT. */
int vmm_create_vm(struct vmm *vmm) {
        struct kvm_pit_config pit = { .flags = KVM_PIT_SPEAKER_DUMMY };
        uint64_t idmap = KVM_IDENTITY_MAP_ADDR;
        int fd;

        fd = ioctl(vmm->kvm_fd, KVM_CREATE_VM, 0);
        if (fd < 0)
                return log_debug_errno(errno, "KVM_CREATE_VM failed: %m");
        vmm->vm_fd = fd;

        if (ioctl(fd, KVM_SET_TSS_ADDR, KVM_TSS_ADDR) < 0)
                return log_debug_errno(errno, "KVM_SET_TSS_ADDR failed: %m");
        if (ioctl(fd, KVM_SET_IDENTITY_MAP_ADDR, &idmap) < 0)
                return log_debug_errno(errno, "KVM_SET_IDENTITY_MAP_ADDR failed: %m");
        if (ioctl(fd, KVM_CREATE_IRQCHIP, 0) < 0)
                return log_debug_errno(errno, "KVM_CREATE_IRQCHIP failed: %m");
        if (ioctl(fd, KVM_CREATE_PIT2, &pit) < 0)
                return log_debug_errno(errno, "KVM_CREATE_PIT2 failed: %m");
        return 0;
}

int vmm_set_memory(struct vmm *vmm, uint8_t *mem, uint64_t size) {
        struct kvm_userspace_memory_region region = {
                .slot = 0,
                .guest_phys_addr = 0,
                .memory_size = size,
                .userspace_addr = (uint64_t) (uintptr_t) mem,
        };

        if (size < VMM_MEM_MIN || size > VMM_MEM_MAX || size % (2u << 20) != 0)
                return -EINVAL;
        if (ioctl(vmm->vm_fd, KVM_SET_USER_MEMORY_REGION, &region) < 0)
                return log_debug_errno(errno, "KVM_SET_USER_MEMORY_REGION failed: %m");
        vmm->mem = mem;
        vmm->mem_size = size;
        return 0;
}

/* Create vCPUs 0..n-1 (vCPU i has APIC id i; 0 is the BSP) and map their kvm_run. */
int vmm_create_vcpus(struct vmm *vmm, unsigned n) {
        int sz, khz;

        if (n < 1 || n > VMM_VCPUS_MAX)
                return -EINVAL;
        sz = ioctl(vmm->kvm_fd, KVM_GET_VCPU_MMAP_SIZE, 0);
        if (sz < (int) sizeof(struct kvm_run))
                return log_debug_errno(sz < 0 ? errno : EINVAL, "KVM_GET_VCPU_MMAP_SIZE failed");
        vmm->run_size = sz;

        for (unsigned i = 0; i < n; i++) {
                struct vmm_vcpu *c = &vmm->vcpus[i];

                c->fd = ioctl(vmm->vm_fd, KVM_CREATE_VCPU, (unsigned long) i);
                if (c->fd < 0) {
                        c->fd = -EBADF;
                        return log_debug_errno(errno, "KVM_CREATE_VCPU(%u) failed: %m", i);
                }
                vmm->n_vcpus = i + 1;
                c->run = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
                if (c->run == MAP_FAILED) {
                        c->run = NULL;
                        return log_debug_errno(errno, "Failed to map kvm_run of vCPU %u: %m", i);
                }
        }
        vmm->vcpu_fd = vmm->vcpus[0].fd;
        vmm->run = vmm->vcpus[0].run;

        khz = ioctl(vmm->vcpu_fd, KVM_GET_TSC_KHZ, 0);
        vmm->tsc_khz = khz > 0 ? (uint32_t) khz : 0;
        return 0;
}

/* The topology vCPU apic_id of n sees: one package of n cores, one thread
 * each, APIC ids 0..n-1 (CPUID leaves 1, 4, 0xb, 0x1f and 0x80000008). A VM
 * of one vCPU keeps what KVM reports, as it always did. */
void vmm_cpuid_set_topology(struct kvm_cpuid2 *cpuid, unsigned apic_id, unsigned n) {
        unsigned order = 0;

        if (n <= 1)
                return;
        while ((1u << order) < n)
                order++;
        for (uint32_t i = 0; i < cpuid->nent; i++) {
                struct kvm_cpuid_entry2 *e = &cpuid->entries[i];

                switch (e->function) {
                case 1:
                        e->ebx = (e->ebx & 0x0000ffff) | ((1u << order) << 16) | (apic_id << 24);
                        e->edx |= 1u << 28; /* HTT: the count in EBX[23:16] is valid */
                        break;
                case 4:
                        if (e->eax & 0x1f) /* a cache level: cores per package - 1, not shared */
                                e->eax = (e->eax & 0x00003fff) | (((1u << order) - 1) << 26);
                        break;
                case 0xb:
                case 0x1f:
                        e->edx = apic_id;
                        if (e->index == 0) {
                                e->eax = 0;  /* no SMT: the core level starts at bit 0 */
                                e->ebx = 1;
                                e->ecx = (1u << 8) | 0;
                        } else if (e->index == 1) {
                                e->eax = order;
                                e->ebx = n;
                                e->ecx = (2u << 8) | 1;
                        } else {
                                e->eax = e->ebx = 0;
                                e->ecx = e->index;
                        }
                        break;
                case 0x80000008:
                        e->ecx = (e->ecx & ~0xf0ffu) | (order << 12) | (n - 1);
                        break;
                }
        }
}

/* Fetch what KVM supports and hand it to the vCPU. */
int vmm_setup_cpuid(struct vmm *vmm, struct kvm_cpuid2 *cpuid, uint32_t max_entries) {
        cpuid->nent = max_entries;
        if (ioctl(vmm->kvm_fd, KVM_GET_SUPPORTED_CPUID, cpuid) < 0)
                return log_debug_errno(errno, "KVM_GET_SUPPORTED_CPUID failed: %m");

        for (uint32_t i = 0; i < cpuid->nent; i++) {
                struct kvm_cpuid_entry2 *e = &cpuid->entries[i];

                /* Leaf 1: APIC id 0, and hide the hypervisor-unfriendly bits the
                 * test guest never needs (no x2APIC here, it uses the xAPIC).
                 * Set the hypervisor bit: KVM leaves it to the VMM, and Linux
                 * looks for the KVM leaves (kvmclock, the TSC frequency) only
                 * when it is set. */
                if (e->function == 1) {
                        e->ebx &= 0x00ffffff;
                        e->ecx &= ~(1u << 21); /* x2APIC */
                        e->ecx |= 1u << 31;    /* hypervisor */
                }
        }

        /* Each vCPU its own APIC id; cpuid stays vCPU 0's. */
        for (unsigned k = vmm->n_vcpus; k-- > 0;) {
                if (k > 0 || vmm->n_vcpus > 1)
                        vmm_cpuid_set_topology(cpuid, k, vmm->n_vcpus);
                if (ioctl(vmm->vcpus[k].fd, KVM_SET_CPUID2, cpuid) < 0)
                        return log_debug_errno(errno, "KVM_SET_CPUID2 (vCPU %u) failed: %m", k);
        }
        return 0;
}

int vmm_register_mmio(struct vmm *vmm, struct mmio_dev *dev) {
        if (vmm->n_mmio >= VMM_MAX_MMIO_DEVS)
                return -ENOSPC;
        if (dev->size == 0 || dev->base + dev->size < dev->base)
                return -EINVAL;
        for (unsigned i = 0; i < vmm->n_mmio; i++) {
                struct mmio_dev *o = vmm->mmio[i];
                if (dev->base < o->base + o->size && o->base < dev->base + dev->size)
                        return -EADDRINUSE;
        }
        vmm->mmio[vmm->n_mmio++] = dev;
        return 0;
}

int vmm_register_pio(struct vmm *vmm, struct pio_dev *dev) {
        if (vmm->n_pio >= VMM_MAX_PIO_DEVS)
                return -ENOSPC;
        if (dev->len == 0 || (uint32_t) dev->base + dev->len > 0x10000)
                return -EINVAL;
        for (unsigned i = 0; i < vmm->n_pio; i++) {
                struct pio_dev *o = vmm->pio[i];
                if (dev->base < o->base + o->len && o->base < dev->base + dev->len)
                        return -EADDRINUSE;
        }
        vmm->pio[vmm->n_pio++] = dev;
        return 0;
}

struct mmio_dev *vmm_find_mmio(struct vmm *vmm, uint64_t addr, uint32_t len) {
        for (unsigned i = 0; i < vmm->n_mmio; i++) {
                struct mmio_dev *d = vmm->mmio[i];
                if (addr >= d->base && addr - d->base < d->size && len <= d->size - (addr - d->base))
                        return d;
        }
        return NULL;
}

struct pio_dev *vmm_find_pio(struct vmm *vmm, uint16_t port, uint32_t len) {
        for (unsigned i = 0; i < vmm->n_pio; i++) {
                struct pio_dev *d = vmm->pio[i];
                if (port >= d->base && (uint32_t) port - d->base + len <= d->len)
                        return d;
        }
        return NULL;
}

int vmm_irq_pulse(struct vmm *vmm, uint32_t gsi) {
        struct kvm_irq_level irq = { .irq = gsi, .level = 1 };

        if (vmm->vm_fd < 0)
                return -EBADF;
        if (ioctl(vmm->vm_fd, KVM_IRQ_LINE, &irq) < 0)
                return -errno;
        irq.level = 0;
        if (ioctl(vmm->vm_fd, KVM_IRQ_LINE, &irq) < 0)
                return -errno;
        return 0;
}

void vmm_request_stop(struct vmm *vmm, enum vmm_stop_reason reason) {
        pid_t self = gettid();

        if (vmm->stop == VMM_RUNNING)
                vmm->stop = reason;
        __atomic_thread_fence(__ATOMIC_SEQ_CST); /* stop before immediate_exit: see vcpu_thread() */
        /* Every vCPU out of KVM_RUN: whichever thread asked, the others are kicked. */
        for (unsigned i = 0; i < vmm->n_vcpus; i++) {
                struct vmm_vcpu *c = &vmm->vcpus[i];

                if (c->run)
                        c->run->immediate_exit = 1;
                if (c->tid > 0 && c->tid != self)
                        (void) tgkill(getpid(), c->tid, SIGIO);
        }
        if (vmm->n_vcpus > 1) {
                pthread_mutex_lock(&vmm->vcpu_lock);
                pthread_cond_broadcast(&vmm->vcpu_cond);
                pthread_mutex_unlock(&vmm->vcpu_lock);
        }
}

struct vmm *vmm_free(struct vmm *vmm) {
        if (!vmm)
                return NULL;
        for (unsigned i = 0; i < vmm->n_vcpus; i++) {
                if (vmm->vcpus[i].run)
                        munmap(vmm->vcpus[i].run, vmm->run_size);
                safe_close(vmm->vcpus[i].fd);
        }
        safe_close(vmm->vm_fd);
        if (vmm->mem)
                munmap(vmm->mem, vmm->mem_size);
        safe_close(vmm->mem_fd);
        vmm_limits_free(vmm);
        free(vmm);
        return NULL;
}
