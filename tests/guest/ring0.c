/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd-test-guest: the ring-0 fatal exception report. Runs emulated under
 * PVM, so it stays simple: integer instructions and port I/O only.
 */
#include "guest.h"

void ring0_fatal(const u64 *frame);

static void r0_putc(char c)
{
        outb(0x3f8, (u8)c);
}

static void r0_puts(const char *s)
{
        while (*s)
                r0_putc(*s++);
}

static void r0_hex(u64 v)
{
        r0_puts("0x");
        for (int i = 60; i >= 0; i -= 4)
                r0_putc("0123456789abcdef"[(v >> i) & 0xf]);
}

/* frame: vector, error code, rip, cs, rflags, rsp, ss */
__attribute__((noreturn)) void ring0_fatal(const u64 *frame)
{
        u64 cr2;

        __asm__ __volatile__("mov %%cr2, %0" : "=r"(cr2));
        r0_puts("\nforkd-test-guest: exception ");
        r0_hex(frame[0]);
        r0_puts(" err ");
        r0_hex(frame[1]);
        r0_puts(" rip ");
        r0_hex(frame[2]);
        r0_puts(" cs ");
        r0_hex(frame[3]);
        r0_puts(" rflags ");
        r0_hex(frame[4]);
        r0_puts(" rsp ");
        r0_hex(frame[5]);
        r0_puts(" cr2 ");
        r0_hex(cr2);
        r0_puts("\n");
        outb(0x64, 0xfe);
        for (;;)
                __asm__ __volatile__("cli; hlt");
}

/* ---- one-time setup at _start, before ring 3 ---- */

/* GDT: null, kernel code/data, user data/code, 64-bit TSS (two slots).
 * Accessed bits preset so the CPU never writes the descriptors. */
u64 g_gdt[G_GDT_ENTRIES] __attribute__((aligned(16))) = {
        0,
        0x00af9b000000ffffull, /* 0x08 kernel code, 64-bit */
        0x00cf93000000ffffull, /* 0x10 kernel data */
        0x00cff3000000ffffull, /* 0x18 user data */
        0x00affb000000ffffull, /* 0x20 user code, 64-bit */
        0, 0,                  /* 0x28 TSS, filled in by ring0_setup() */
};

struct dtr {
        u16 limit;
        u64 base;
} __attribute__((packed));

struct dtr g_gdtr = { sizeof(g_gdt) - 1, (u64)g_gdt };

struct idt_gate {
        u16 off0;
        u16 sel;
        u8 ist;
        u8 type;
        u16 off1;
        u32 off2;
        u32 zero;
};
static struct idt_gate idt[IDT_ENTRIES] __attribute__((aligned(64)));
struct dtr g_idtr = { sizeof(idt) - 1, (u64)idt }; /* the APs load it too (entry.S) */

/* 64-bit TSS (104 bytes; its 64-bit fields are unaligned: use u32 halves) */
static u32 tss[26] __attribute__((aligned(16)));
static u8 ist_stack[IST_STACK_SIZE] __attribute__((aligned(16)));

extern const u64 exc_handlers[32];
extern const u64 irq_handlers[IRQ_VEC_COUNT];
extern const u64 irq_other_handler;
extern const u64 irq_timer_handler;
extern const u64 irq_spurious_handler;

void ring0_setup(const struct forkd_bootinfo *bi);

static void set_gate(u32 vec, u64 handler, u8 ist)
{
        idt[vec].off0 = (u16)handler;
        idt[vec].sel = G_SEL_KCODE;
        idt[vec].ist = ist;
        idt[vec].type = 0x8e; /* present, DPL 0, 64-bit interrupt gate */
        idt[vec].off1 = (u16)(handler >> 16);
        idt[vec].off2 = (u32)(handler >> 32);
        idt[vec].zero = 0;
}

static void ioapic_write(u32 reg, u32 val)
{
        mmio_write32(IOAPIC_BASE, reg);
        mmio_write32(IOAPIC_BASE + 0x10, val);
}

/*
 * Runs emulated, once: about a thousand instructions. The IDT covers only
 * vectors 0..0x4f. Exceptions use IST1 (a cold stack) except #GP, which is
 * also the WAIT trap and so uses RSP0 in the hot page.
 */
void ring0_setup(const struct forkd_bootinfo *bi)
{
        u64 base = (u64)tss, limit = sizeof(tss) - 1;
        u32 n, seen = 0;

        for (u32 v = 0; v < IDT_ENTRIES; v++)
                set_gate(v, v < 32 ? exc_handlers[v] : irq_other_handler, v < 32 && v != 13 ? 1 : 0);
        for (u32 v = 0; v < IRQ_VEC_COUNT; v++)
                set_gate(IRQ_VEC_BASE + v, irq_handlers[v], 0);
        set_gate(SPURIOUS_VEC, irq_spurious_handler, 0);
        set_gate(PROC_TIMER_VEC, irq_timer_handler, 0);

        /* tss[] is zero (bss): RSP0 at byte 4, IST1 at byte 36, I/O map base at byte 102 */
        tss[1] = (u32)(u64)(hot.kstack + KSTACK_SIZE);
        tss[2] = (u32)((u64)(hot.kstack + KSTACK_SIZE) >> 32);
        tss[9] = (u32)(u64)(ist_stack + IST_STACK_SIZE);
        tss[10] = (u32)((u64)(ist_stack + IST_STACK_SIZE) >> 32);
        tss[25] = (u32)sizeof(tss) << 16; /* no I/O bitmap: IOPL=3 decides */
        g_gdt[5] = (limit & 0xffff) | (base & 0xffffff) << 16 | 0x89ull << 40 |
                   ((limit >> 16) & 0xf) << 48 | ((base >> 24) & 0xff) << 56;
        g_gdt[6] = base >> 32;

        __asm__ __volatile__("lidt %0" : : "m"(g_idtr));
        __asm__ __volatile__("ltr %w0" : : "r"(G_SEL_TSS));

        /* LAPIC: mask LINT0/LINT1 (no ExtINT from the PIC), TPR 0, enable */
        mmio_write32(LAPIC_BASE + 0x350, 0x10000);
        mmio_write32(LAPIC_BASE + 0x360, 0x10000);
        mmio_write32(LAPIC_BASE + 0x80, 0);
        mmio_write32(LAPIC_BASE + 0xf0, 0x100 | SPURIOUS_VEC);

        /* IOAPIC: the first console and the first block device, edge, fixed, APIC 0 */
        if (bi->magic != FORKD_BOOTINFO_MAGIC)
                return; /* ring 3 reports it */
        n = bi->n_devs < FORKD_BOOTINFO_MAX_DEVS ? bi->n_devs : FORKD_BOOTINFO_MAX_DEVS;
        for (u32 i = 0; i < n; i++) {
                u32 id = bi->devs[i].virtio_id, gsi = bi->devs[i].gsi;

                if ((id != FORKD_VIRTIO_ID_BLK && id != FORKD_VIRTIO_ID_CONSOLE) || (seen & (1u << id)) || gsi >= 24)
                        continue;
                seen |= 1u << id;
                ioapic_write(0x10 + 2 * gsi + 1, 0);                   /* destination APIC 0 */
                ioapic_write(0x10 + 2 * gsi, IRQ_VEC_BASE + i);        /* unmasked */
        }
}
