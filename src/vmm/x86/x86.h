/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "bootinfo.h"
#include "vmm.h"
#include "vmstate.h"

struct acpi_dev;

/* boot.c */
void x86_build_page_tables(struct vmm *vmm);
int x86_boot_setup(struct vmm *vmm, int elf_fd, const struct forkd_bootinfo_dev *devs, unsigned n_devs,
                   const char *cmdline);

/* linux.c */
bool x86_is_bzimage(int fd);
int x86_linux_setup(struct vmm *vmm, int kernel_fd, int initrd_fd, const char *cmdline, const struct acpi_dev *devs,
                    unsigned n_devs);

/* cpu.c */
/* vCPU index of vmm; cpuid is vCPU 0's (vmm->cpuid), given the vCPU's APIC id on save. */
int x86_vcpu_save(struct vmm *vmm, unsigned index, const struct kvm_cpuid2 *cpuid, struct vmstate_vcpu *v);
int x86_vcpu_restore(struct vmm *vmm, unsigned index, const struct vmstate_vcpu *v);
int x86_vm_save(struct vmm *vmm, struct vmstate *s);
int x86_vm_restore(struct vmm *vmm, const struct vmstate *s);
