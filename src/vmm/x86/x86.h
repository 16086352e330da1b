/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "bootinfo.h"
#include "vmm.h"
#include "vmstate.h"

/* boot.c */
int x86_boot_setup(struct vmm *vmm, int elf_fd, const struct forkd_bootinfo_dev *devs, unsigned n_devs,
                   const char *cmdline);

/* cpu.c */
int x86_vcpu_save(struct vmm *vmm, const struct kvm_cpuid2 *cpuid, struct vmstate_vcpu *v);
int x86_vcpu_restore(struct vmm *vmm, const struct vmstate_vcpu *v);
int x86_vm_save(struct vmm *vmm, struct vmstate *s);
int x86_vm_restore(struct vmm *vmm, const struct vmstate *s);
