/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "vmm.h"

int vmm_open_kvm(void);
int vmm_new(int kvm_fd, struct vmm **ret);
struct vmm *vmm_free(struct vmm *vmm);
static inline void vmm_freep(struct vmm **v) {
        vmm_free(*v);
}
#define _cleanup_vmm_ _cleanup_(vmm_freep)

int vmm_create_vm(struct vmm *vmm);
int vmm_set_memory(struct vmm *vmm, uint8_t *mem, uint64_t size);
int vmm_create_vcpus(struct vmm *vmm, unsigned n);
void vmm_cpuid_set_topology(struct kvm_cpuid2 *cpuid, unsigned apic_id, unsigned n);
int vmm_setup_cpuid(struct vmm *vmm, struct kvm_cpuid2 *cpuid, uint32_t max_entries);

struct mmio_dev *vmm_find_mmio(struct vmm *vmm, uint64_t addr, uint32_t len);
struct pio_dev *vmm_find_pio(struct vmm *vmm, uint16_t port, uint32_t len);
