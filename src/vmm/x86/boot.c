/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Direct boot into 64-bit long mode: load an ELF64 image, build identity page
 * tables, a GDT and the bootinfo page, and set the vCPU registers. The contract
 * with the guest is documented in bootinfo.h.
 */
#include <elf.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include "bootinfo.h"
#include "x86.h"

#define PTE_P   (1ull << 0)
#define PTE_W   (1ull << 1)
#define PTE_U   (1ull << 2)
#define PTE_PWT (1ull << 3)
#define PTE_PCD (1ull << 4)
#define PTE_A   (1ull << 5)
#define PTE_D   (1ull << 6)
#define PTE_PS  (1ull << 7)

#define ELF_MAX_SIZE (64ull << 20)
#define ELF_MAX_PHDRS 32

static int load_elf(struct vmm *vmm, int fd, uint64_t *ret_entry) {
        Elf64_Ehdr eh;
        Elf64_Phdr ph[ELF_MAX_PHDRS];
        struct stat st;
        ssize_t n;

        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode) || (uint64_t) st.st_size > ELF_MAX_SIZE)
                return log_debug_errno(EINVAL, "Guest image is not a regular file of at most 64 MiB");

        n = pread(fd, &eh, sizeof(eh), 0);
        if (n != sizeof(eh))
                return log_debug_errno(ENOEXEC, "Guest image is too short for an ELF header");
        if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
            eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_machine != EM_X86_64 || eh.e_type != ET_EXEC)
                return log_debug_errno(ENOEXEC, "Guest image is not an x86-64 ELF executable");
        if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 || eh.e_phnum > ELF_MAX_PHDRS)
                return log_debug_errno(ENOEXEC, "Guest image has a bad program header table");

        n = pread(fd, ph, eh.e_phnum * sizeof(Elf64_Phdr), eh.e_phoff);
        if (n != (ssize_t) (eh.e_phnum * sizeof(Elf64_Phdr)))
                return log_debug_errno(ENOEXEC, "Guest image program headers are truncated");

        bool entry_ok = false;
        for (unsigned i = 0; i < eh.e_phnum; i++) {
                const Elf64_Phdr *p = &ph[i];
                uint8_t *dst;

                if (p->p_type != PT_LOAD)
                        continue;
                if (p->p_filesz > p->p_memsz || p->p_offset > (uint64_t) st.st_size ||
                    p->p_filesz > (uint64_t) st.st_size - p->p_offset)
                        return log_debug_errno(ENOEXEC, "Guest segment %u lies outside the file", i);
                if (p->p_paddr < FORKD_KERNEL_MIN_GPA)
                        return log_debug_errno(ENOEXEC, "Guest segment %u loads below 1 MiB", i);
                dst = vmm_gpa(vmm, p->p_paddr, p->p_memsz);
                if (!dst)
                        return log_debug_errno(ENOEXEC, "Guest segment %u does not fit in guest RAM", i);
                n = pread(fd, dst, p->p_filesz, p->p_offset);
                if (n != (ssize_t) p->p_filesz)
                        return log_debug_errno(EIO, "Failed to read guest segment %u", i);
                memset(dst + p->p_filesz, 0, p->p_memsz - p->p_filesz);
                if (eh.e_entry >= p->p_paddr && eh.e_entry - p->p_paddr < p->p_memsz)
                        entry_ok = true;
        }
        if (!entry_ok)
                return log_debug_errno(ENOEXEC, "Guest entry point is not inside a loaded segment");

        *ret_entry = eh.e_entry;
        return 0;
}

void x86_build_page_tables(struct vmm *vmm) {
        uint64_t *pml4 = vmm_gpa(vmm, FORKD_PML4_GPA, 4096);
        uint64_t *pdpt = vmm_gpa(vmm, FORKD_PDPT_GPA, 4096);
        uint64_t *pd = vmm_gpa(vmm, FORKD_PD_GPA, 4 * 4096);

        memset(pml4, 0, 4096);
        memset(pdpt, 0, 4096);
        memset(pd, 0, 4 * 4096);

        /* Non-leaf entries: bits 6-8 must stay clear (reserved under PVM). */
        pml4[0] = FORKD_PDPT_GPA | PTE_P | PTE_W | PTE_U | PTE_A;
        for (unsigned i = 0; i < 4; i++)
                pdpt[i] = (FORKD_PD_GPA + i * 4096) | PTE_P | PTE_W | PTE_U | PTE_A;

        /* 2 MiB leaves with Accessed and Dirty preset, so the hypervisor never
         * has to write the guest's page tables (that would cost a CoW page in
         * every forked child). */
        for (uint64_t gpa = 0; gpa < vmm->mem_size; gpa += 2ull << 20)
                pd[gpa >> 21] = gpa | PTE_P | PTE_W | PTE_U | PTE_A | PTE_D | PTE_PS;
        for (uint64_t gpa = FORKD_MMIO_WINDOW; gpa < (4ull << 30); gpa += 2ull << 20)
                pd[gpa >> 21] = gpa | PTE_P | PTE_W | PTE_U | PTE_A | PTE_D | PTE_PS | PTE_PCD | PTE_PWT;
}

static void build_gdt(struct vmm *vmm) {
        uint64_t *gdt = vmm_gpa(vmm, FORKD_GDT_GPA, 8 * 8);

        memset(gdt, 0, 8 * 8);
        gdt[FORKD_SEL_KCODE >> 3] = 0x00af9b000000ffffull; /* 64-bit code, DPL 0 */
        gdt[FORKD_SEL_KDATA >> 3] = 0x00cf93000000ffffull; /* data, DPL 0 */
        gdt[FORKD_SEL_UDATA >> 3] = 0x00cff3000000ffffull; /* data, DPL 3 */
        gdt[FORKD_SEL_UCODE >> 3] = 0x00affb000000ffffull; /* 64-bit code, DPL 3 */
}

static void seg(struct kvm_segment *s, uint16_t sel, uint8_t type, bool code) {
        *s = (struct kvm_segment) {
                .base = 0,
                .limit = 0xffffffff,
                .selector = sel,
                .type = type,
                .present = 1,
                .dpl = 0,
                .db = code ? 0 : 1,
                .s = 1,
                .l = code ? 1 : 0,
                .g = 1,
        };
}

static int setup_cpu(struct vmm *vmm, uint64_t entry) {
        struct kvm_sregs sregs;
        struct kvm_regs regs = {
                .rip = entry,
                .rsp = FORKD_BOOT_STACK_TOP,
                .rdi = FORKD_BOOTINFO_GPA,
                .rsi = FORKD_BOOTINFO_GPA,
                .rflags = 0x2,
        };

        if (ioctl(vmm->vcpu_fd, KVM_GET_SREGS, &sregs) < 0)
                return -errno;

        seg(&sregs.cs, FORKD_SEL_KCODE, 0xb, true);
        seg(&sregs.ds, FORKD_SEL_KDATA, 0x3, false);
        sregs.es = sregs.fs = sregs.gs = sregs.ss = sregs.ds;
        sregs.gdt.base = FORKD_GDT_GPA;
        sregs.gdt.limit = 8 * 8 - 1;
        sregs.cr3 = FORKD_PML4_GPA;
        sregs.cr4 = 1u << 5;                     /* PAE */
        sregs.cr0 = 0x80050033;                  /* PG WP NE ET MP PE */
        sregs.efer = (1u << 0) | (1u << 8) | (1u << 10); /* SCE LME LMA */

        if (ioctl(vmm->vcpu_fd, KVM_SET_SREGS, &sregs) < 0)
                return log_debug_errno(errno, "KVM_SET_SREGS failed: %m");
        if (ioctl(vmm->vcpu_fd, KVM_SET_REGS, &regs) < 0)
                return log_debug_errno(errno, "KVM_SET_REGS failed: %m");
        return 0;
}

int x86_boot_setup(struct vmm *vmm, int elf_fd, const struct forkd_bootinfo_dev *devs, unsigned n_devs,
                   const char *cmdline) {
        struct forkd_bootinfo *bi;
        uint64_t entry;
        int r;

        if (n_devs > FORKD_BOOTINFO_MAX_DEVS)
                return -E2BIG;
        if (vmm->mem_size > FORKD_MMIO_WINDOW)
                return -EINVAL;

        r = load_elf(vmm, elf_fd, &entry);
        if (r < 0)
                return r;

        x86_build_page_tables(vmm);
        build_gdt(vmm);

        bi = vmm_gpa(vmm, FORKD_BOOTINFO_GPA, sizeof(*bi));
        memset(bi, 0, sizeof(*bi));
        bi->magic = FORKD_BOOTINFO_MAGIC;
        bi->version = FORKD_BOOTINFO_VERSION;
        bi->n_devs = n_devs;
        bi->mem_size = vmm->mem_size;
        bi->tsc_khz = vmm->tsc_khz;
        bi->n_cpus = vmm->n_vcpus;
        memcpy(bi->devs, devs, n_devs * sizeof(*devs));
        if (cmdline)
                snprintf(bi->cmdline, sizeof(bi->cmdline), "%s", cmdline);

        return setup_cpu(vmm, entry);
}
