/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Booting a stock Linux bzImage through the 64-bit boot protocol
 * (Documentation/arch/x86/boot.rst): the protected-mode kernel goes to 1 MiB,
 * the zero page carries the setup header, an e820 map, the command line and
 * the initrd, and the vCPU starts at the 64-bit entry (load address + 0x200)
 * in long mode with __BOOT_CS = 0x10 and __BOOT_DS = 0x18 and RSI pointing at
 * the zero page. Devices are described to the kernel by ACPI (acpi.c).
 */
#include <asm/bootparam.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include "acpi.h"
#include "x86.h"

#define LINUX_ZERO_PAGE_GPA 0x9000ull
#define LINUX_CMDLINE_GPA 0x20000ull
#define LINUX_CMDLINE_MAX 4096u
#define LINUX_KERNEL_GPA 0x100000ull
#define LINUX_BIOS_START 0x9fc00ull
#define LINUX_MAX_IMAGE (128ull << 20)
#define LINUX_MAX_INITRD (1024ull << 20)

#define E820_RAM 1
#define E820_RESERVED 2

bool x86_is_bzimage(int fd) {
        uint8_t magic[4];

        return pread(fd, magic, 4, 0x202) == 4 && memcmp(magic, "HdrS", 4) == 0;
}

static int read_full(int fd, void *buf, size_t len, off_t off) {
        uint8_t *p = buf;

        while (len > 0) {
                ssize_t n = pread(fd, p, len, off);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        return -EIO;
                p += n;
                off += n;
                len -= n;
        }
        return 0;
}

static void linux_gdt(struct vmm *vmm) {
        uint64_t *gdt = vmm_gpa(vmm, FORKD_GDT_GPA, 4 * 8);

        gdt[0] = 0;
        gdt[1] = 0;
        gdt[2] = 0x00af9b000000ffffull; /* __BOOT_CS: 64-bit code */
        gdt[3] = 0x00cf93000000ffffull; /* __BOOT_DS */
}

static int linux_cpu(struct vmm *vmm, uint64_t entry) {
        struct kvm_sregs sregs;
        struct kvm_regs regs = { .rip = entry, .rsi = LINUX_ZERO_PAGE_GPA, .rflags = 0x2 };
        struct kvm_segment cs = { .limit = 0xffffffff, .selector = 0x10, .type = 0xb, .present = 1, .s = 1, .l = 1,
                                  .g = 1 };
        struct kvm_segment ds = { .limit = 0xffffffff, .selector = 0x18, .type = 0x3, .present = 1, .s = 1, .db = 1,
                                  .g = 1 };

        if (ioctl(vmm->vcpu_fd, KVM_GET_SREGS, &sregs) < 0)
                return -errno;
        sregs.cs = cs;
        sregs.ds = sregs.es = sregs.fs = sregs.gs = sregs.ss = ds;
        sregs.gdt.base = FORKD_GDT_GPA;
        sregs.gdt.limit = 4 * 8 - 1;
        sregs.cr3 = FORKD_PML4_GPA;
        sregs.cr4 = 1u << 5;
        sregs.cr0 = 0x80050033;
        sregs.efer = (1u << 8) | (1u << 10);
        if (ioctl(vmm->vcpu_fd, KVM_SET_SREGS, &sregs) < 0)
                return -errno;
        if (ioctl(vmm->vcpu_fd, KVM_SET_REGS, &regs) < 0)
                return -errno;
        return 0;
}

int x86_linux_setup(struct vmm *vmm, int kernel_fd, int initrd_fd, const char *cmdline, const struct acpi_dev *devs,
                    unsigned n_devs) {
        struct boot_params *bp;
        struct setup_header hdr;
        struct stat st;
        uint64_t setup_size, kernel_size, initrd_size = 0, initrd_gpa = 0;
        size_t cmdlen;
        unsigned e = 0;
        int r;

        if (fstat(kernel_fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode) || (uint64_t) st.st_size > LINUX_MAX_IMAGE || st.st_size < 0x1000)
                return log_debug_errno(ENOEXEC, "Kernel image is not a regular file of 4 KiB..128 MiB");
        r = read_full(kernel_fd, &hdr, sizeof(hdr), 0x1f1);
        if (r < 0)
                return r;
        if (hdr.header != 0x53726448 /* "HdrS" */ || hdr.version < 0x020c || !(hdr.loadflags & LOADED_HIGH) ||
            !(hdr.xloadflags & XLF_KERNEL_64))
                return log_debug_errno(ENOEXEC, "Kernel image lacks the 64-bit boot protocol (2.12+)");

        setup_size = ((uint64_t) (hdr.setup_sects ?: 4) + 1) * 512;
        if (setup_size >= (uint64_t) st.st_size)
                return log_debug_errno(ENOEXEC, "Kernel image is truncated");
        kernel_size = st.st_size - setup_size;
        if (!vmm_gpa(vmm, LINUX_KERNEL_GPA, MAX(kernel_size, (uint64_t) hdr.init_size)))
                return log_debug_errno(ENOMEM, "Guest memory is too small for this kernel");
        r = read_full(kernel_fd, vmm_gpa(vmm, LINUX_KERNEL_GPA, kernel_size), kernel_size, setup_size);
        if (r < 0)
                return r;

        if (initrd_fd >= 0) {
                uint64_t top;

                if (fstat(initrd_fd, &st) < 0)
                        return -errno;
                if (!S_ISREG(st.st_mode) || (uint64_t) st.st_size > LINUX_MAX_INITRD)
                        return log_debug_errno(EINVAL, "initrd is not a regular file of at most 1 GiB");
                initrd_size = st.st_size;
                top = MIN(vmm->mem_size, (uint64_t) hdr.initrd_addr_max + 1);
                if (initrd_size + LINUX_KERNEL_GPA + MAX(kernel_size, (uint64_t) hdr.init_size) > top)
                        return log_debug_errno(ENOMEM, "Guest memory is too small for kernel and initrd");
                initrd_gpa = (top - initrd_size) & ~0xfffull;
                r = read_full(initrd_fd, vmm_gpa(vmm, initrd_gpa, initrd_size), initrd_size, 0);
                if (r < 0)
                        return r;
        }

        cmdlen = strlen(cmdline ?: "");
        if (cmdlen >= MIN(LINUX_CMDLINE_MAX, hdr.cmdline_size ?: 255u))
                return log_debug_errno(E2BIG, "Kernel command line too long");
        memcpy(vmm_gpa(vmm, LINUX_CMDLINE_GPA, cmdlen + 1), cmdline ?: "", cmdlen + 1);

        bp = vmm_gpa(vmm, LINUX_ZERO_PAGE_GPA, sizeof(*bp));
        memset(bp, 0, sizeof(*bp));
        bp->hdr = hdr;
        bp->hdr.type_of_loader = 0xff;
        bp->hdr.vid_mode = 0xffff;
        bp->hdr.loadflags |= CAN_USE_HEAP;
        bp->hdr.heap_end_ptr = 0xfe00;
        bp->hdr.cmd_line_ptr = (uint32_t) LINUX_CMDLINE_GPA;
        bp->ext_cmd_line_ptr = 0;
        bp->hdr.ramdisk_image = (uint32_t) initrd_gpa;
        bp->hdr.ramdisk_size = (uint32_t) initrd_size;

        bp->e820_table[e++] = (struct boot_e820_entry) { .addr = 0, .size = LINUX_BIOS_START, .type = E820_RAM };
        bp->e820_table[e++] = (struct boot_e820_entry) { .addr = LINUX_BIOS_START,
                                                         .size = LINUX_KERNEL_GPA - LINUX_BIOS_START,
                                                         .type = E820_RESERVED };
        bp->e820_table[e++] = (struct boot_e820_entry) { .addr = LINUX_KERNEL_GPA,
                                                         .size = vmm->mem_size - LINUX_KERNEL_GPA,
                                                         .type = E820_RAM };
        bp->e820_entries = e;

        x86_build_page_tables(vmm);
        linux_gdt(vmm);
        r = acpi_build(vmm, devs, n_devs);
        if (r < 0)
                return r;
        return linux_cpu(vmm, LINUX_KERNEL_GPA + 0x200);
}
