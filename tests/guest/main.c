/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd-test-guest: boot, in ring 3. entry.S and ring0_setup() have loaded
 * the GDT, IDT and TSS, programmed the LAPIC and the IOAPIC pins and dropped
 * here with IOPL=3 and interrupts on. We find the devices, bring up virtio
 * and enter the agent loop.
 */
#include "guest.h"

_Static_assert(offsetof(struct hot, pending) == HOT_PENDING_OFF, "entry.S pending offset");
_Static_assert(offsetof(struct hot, kstack) == USTACK_SIZE, "stack layout");
_Static_assert(offsetof(struct hot, payload) < 4096 - 256, "hot page too full");

struct hot hot;
struct boot_state boot;

__attribute__((noreturn)) void sys_poweroff(void)
{
        u_outb(FORKD_I8042_CMD_PORT, FORKD_I8042_CMD_RESET);
        for (;;)
                sys_wait();
}

static __attribute__((noreturn)) void die(const char *msg)
{
        serial_puts("forkd-test-guest: fatal: ");
        serial_puts(msg);
        serial_puts("\n");
        sys_poweroff();
}

void user_main(const struct forkd_bootinfo *bi)
{
        u32 ndev;

        if (bi->magic != FORKD_BOOTINFO_MAGIC || bi->version != FORKD_BOOTINFO_VERSION)
                die("bad bootinfo");
        boot.mem_size = bi->mem_size;
        boot.tsc_khz = bi->tsc_khz;
        boot.scratch_pages = bi->mem_size > SCRATCH_BASE ? (bi->mem_size - SCRATCH_BASE) / PAGE_SIZE : 0;
        ndev = bi->n_devs < FORKD_BOOTINFO_MAX_DEVS ? bi->n_devs : FORKD_BOOTINFO_MAX_DEVS;

        for (u32 i = 0; i < ndev; i++) {
                const struct forkd_bootinfo_dev *d = &bi->devs[i];

                if (d->virtio_id == FORKD_VIRTIO_ID_BLK && !boot.have_blk) {
                        boot.have_blk = 1;
                        boot.blk_devidx = i;
                } else if (d->virtio_id == FORKD_VIRTIO_ID_CONSOLE && !boot.have_cons) {
                        boot.have_cons = 1;
                        boot.cons_devidx = i;
                } else {
                        continue;
                }
                if (d->gsi >= 24)
                        die("device gsi beyond the IOAPIC's 24 pins");
        }
        if (!boot.have_cons)
                die("no virtio console in the bootinfo");

        if (boot.have_blk && virtio_init_blk(bi->devs[boot.blk_devidx].mmio_base) < 0)
                boot.have_blk = 0;
        if (virtio_init_console(bi->devs[boot.cons_devidx].mmio_base) < 0)
                die("virtio console init failed");

        /* A disk whose first block starts with "forkd-test-guest hostile=MODE\n"
         * makes the guest hostile from boot (hostile.c). */
        if (boot.have_blk && blk_rw(0, 0, blk_data) == 0 && memcmp(blk_data, HOSTILE_DISK_MARK, 25) == 0) {
                u32 n = 0;

                while (n < 32 && blk_data[25 + n] != '\n')
                        n++;
                if (n == 32 || hostile_parse(blk_data + 25, n) < 0)
                        serial_puts("forkd-test-guest: unknown hostile mode on the disk\n");
        }

        smp_start(bi->n_cpus);
        serial_puts("forkd-test-guest: ready\n");
        hostile_start(); /* a mode from the disk: before the first request is read */
        agent_loop();
}
