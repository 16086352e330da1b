/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd-test-guest: the ring-0 entry, trap and interrupt paths (the one-time
 * table setup and the fatal-exception printer are C, in ring0.c).
 *
 * Under PVM every ring-0 instruction is emulated, so this file is kept to a
 * handful of plain integer instructions per path: no string ops, no SSE, no
 * int3, no cmpxchg16b, no xsave.
 */
#include "guest.h"

        .section .text.entry, "ax"
        .code64

/*
 * Entry from forkd-vmm: long mode, CPL 0, IF=0, RDI = bootinfo, RSP = the
 * VMM's boot stack. Load our GDT, let ring0_setup() build the IDT and TSS and
 * program the LAPIC and IOAPIC, then drop to ring 3 for good with IF=1. RDI survives the iretq, so user_start gets the bootinfo pointer.
 *
 * There are no syscalls: under PVM `syscall` jumps to LSTAR without leaving
 * CPL 3 (measured: the LSTAR handler's lgdt raised #GP with CS=0x23), and
 * `int n` raises #UD. The only way into ring 0 is a fault, so WAIT is a hlt
 * in ring 3 at hlt_gate, which raises #GP; see exc_13 below.
 */
        .globl _start
        .type _start, @function
_start:
        cli
        lgdt    g_gdtr(%rip)
        movq    %rdi, %rbx
        call    ring0_setup
        movq    %rbx, %rdi
        leaq    hot+USTACK_SIZE(%rip), %rax
        pushq   $(G_SEL_UDATA | 3)
        pushq   %rax
        pushq   $0x202                          /* IF=1 */
        pushq   $(G_SEL_UCODE | 3)
        leaq    user_start(%rip), %rax
        pushq   %rax
        iretq
        .size _start, . - _start

/* ring 3: WAIT. The hlt faults (#GP) into exc_13, which returns past it. */
        .globl sys_wait
        .type sys_wait, @function
sys_wait:
hlt_gate:
        hlt
        ret
        .size sys_wait, . - sys_wait

/*
 * ring 3: void u_outb(u16 port, u8 val). Under PVM, IOPL cannot be raised for
 * ring 3 (iretq and popfq leave it 0: measured), so this out faults (#GP) and
 * exc_13 performs it in ring 0. Used only at boot, on errors and to power off.
 */
        .globl u_outb
        .type u_outb, @function
u_outb:
        movl    %esi, %eax
        movl    %edi, %edx
outb_gate:
        outb    %al, %dx
        ret
        .size u_outb, . - u_outb

/*
 * #GP, through TSS.RSP0 (not IST, so that it stays in the hot page).
 * Frame: error, rip, cs, rflags, rsp, ss. If it is the WAIT hlt: halt here
 * with interrupts enabled unless a device interrupt is already pending (the
 * STI shadow covers the hlt, so a wakeup cannot slip in between), then step
 * over the hlt. If it is the out at outb_gate, do it and step over it.
 * Any other #GP is fatal.
 */
exc_13:
        pushq   %rax
        leaq    hlt_gate(%rip), %rax
        cmpq    %rax, 16(%rsp)
        jne     3f
        movq    hot+HOT_PENDING_OFF(%rip), %rax
        testq   %rax, %rax
        jnz     2f
        sti
        hlt
        cli
2:      incq    16(%rsp)
        popq    %rax
        addq    $8, %rsp
        iretq
3:      leaq    outb_gate(%rip), %rax
        cmpq    %rax, 16(%rsp)
        jne     1f
        popq    %rax
        outb    %al, %dx
        incq    8(%rsp)
        addq    $8, %rsp
        iretq
1:      popq    %rax
        pushq   $13
        jmp     exc_common

/*
 * Device interrupts: mark the device pending, EOI the LAPIC, return.
 * RAX is saved because the interrupt may land anywhere in ring 3.
 */
        .macro IRQ n
irq_\n:
        movb    $1, hot+HOT_PENDING_OFF+\n(%rip)
        pushq   %rax
        movl    $(LAPIC_BASE + 0xb0), %eax
        movl    $0, (%rax)
        popq    %rax
        iretq
        .endm
        IRQ 0
        IRQ 1
        IRQ 2
        IRQ 3
        IRQ 4
        IRQ 5
        IRQ 6
        IRQ 7

/* the BSP's timer for its processes: marks a pending byte, as a device's IRQ does,
 * so that a WAIT after it returns at once (no deadline is slept past), and EOIs */
irq_timer:
        movb    $1, hot+HOT_PENDING_OFF+PROC_TIMER_PENDING(%rip)
        pushq   %rax
        movl    $(LAPIC_BASE + 0xb0), %eax
        movl    $0, (%rax)
        popq    %rax
        iretq

/* any other vector from the APIC: EOI and ignore */
irq_other:
        pushq   %rax
        movl    $(LAPIC_BASE + 0xb0), %eax
        movl    $0, (%rax)
        popq    %rax
        iretq

/* the spurious vector needs no EOI */
irq_spurious:
        iretq

/* exceptions: fatal. Frame on the IST stack: vector, error, rip, cs, rflags, rsp, ss */
        .macro EXC n, err
exc_\n:
        .if \err == 0
        pushq   $0
        .endif
        pushq   $\n
        jmp     exc_common
        .endm
        EXC 0, 0
        EXC 1, 0
        EXC 2, 0
        EXC 3, 0
        EXC 4, 0
        EXC 5, 0
        EXC 6, 0
        EXC 7, 0
        EXC 8, 1
        EXC 9, 0
        EXC 10, 1
        EXC 11, 1
        EXC 12, 1
        EXC 14, 1
        EXC 15, 0
        EXC 16, 0
        EXC 17, 1
        EXC 18, 0
        EXC 19, 0
        EXC 20, 0
        EXC 21, 1
        EXC 22, 0
        EXC 23, 0
        EXC 24, 0
        EXC 25, 0
        EXC 26, 0
        EXC 27, 0
        EXC 28, 0
        EXC 29, 1
        EXC 30, 1
        EXC 31, 0

exc_common:
        movq    %rsp, %rdi
        call    ring0_fatal
5:      cli
        hlt
        jmp     5b

/* ring 3: the first code after _start's iretq */
        .globl user_start
        .type user_start, @function
user_start:
        andq    $-16, %rsp
        call    user_main
        ud2

/*
 * The APs (smp.c). ap_tramp_start..ap_tramp_end is copied to AP_TRAMP_GPA and
 * entered by SIPI in real mode (CS = AP_TRAMP_GPA >> 4, IP = 0): PAE, forkd-vmm's
 * page tables, EFER.LME, then PE and PG at once straight into long mode on
 * forkd-vmm's GDT (bootinfo.h: its numbers are written out here, the header
 * being C), and on to ap_start64 in the image.
 */
        .section .rodata
        .globl ap_tramp_start
        .globl ap_tramp_end
        .code16
ap_tramp_start:
        cli
        xorw    %ax, %ax
        movw    %ax, %ds
        movl    $0x1000, %eax                   /* FORKD_PML4_GPA */
        movl    %eax, %cr3
        movl    %cr4, %eax
        orl     $0x20, %eax                     /* PAE */
        movl    %eax, %cr4
        movl    $0xc0000080, %ecx               /* EFER */
        rdmsr
        orl     $0x101, %eax                    /* SCE, LME */
        wrmsr
        lgdtl   AP_TRAMP_GPA + (ap_tramp_gdtr - ap_tramp_start)
        movl    %cr0, %eax
        andl    $0x9fffffff, %eax               /* caches on: CD and NW are set after INIT */
        orl     $0x80010023, %eax               /* PG, WP, NE, MP, PE */
        movl    %eax, %cr0
        ljmpl   $0x08, $(AP_TRAMP_GPA + (ap_tramp_64 - ap_tramp_start))
        .code64
ap_tramp_64:
        movabsq $ap_start64, %rax
        jmp     *%rax
        .balign 8
ap_tramp_gdtr:
        .word   8 * 8 - 1
        .long   0x7000                          /* FORKD_GDT_GPA */
ap_tramp_end:

        .text
/* Long mode, CPL 0, IF=0: our GDT and IDT, a ring-0 stack of its own for the
 * timer's interrupt frames, the LAPIC timer periodic (AP_TIMER_VEC, which the IDT
 * sends to irq_other: EOI and return), then a counter incremented once a tick,
 * halted in between. A halted vCPU costs its host nothing: one that spun would
 * keep a host CPU busy in every child for as long as the child lives. */
ap_start64:
        lgdt    g_gdtr(%rip)
        movl    $G_SEL_KDATA, %eax
        movl    %eax, %ds
        movl    %eax, %es
        movl    %eax, %ss
        movabsq $(LAPIC_BASE + 0x20), %rax
        movl    (%rax), %eax
        shrl    $24, %eax                       /* APIC id = CPU index */
        andl    $(SMP_MAX_CPUS - 1), %eax
        movq    %rax, %rcx
        shlq    $6, %rcx
        leaq    ap_counters(%rip), %rdi
        addq    %rcx, %rdi                      /* &ap_counters[id][0] */
        movq    $1, 8(%rdi)                     /* up */
        incq    %rax
        shlq    $AP_STACK_SHIFT, %rax
        leaq    ap_stacks(%rip), %rsp
        addq    %rax, %rsp                      /* the top of this AP's stack */
        lidt    g_idtr(%rip)
        movabsq $LAPIC_BASE, %rax
        movl    $(0x100 | SPURIOUS_VEC), 0xf0(%rax)     /* enabled */
        movl    $0xb, 0x3e0(%rax)                      /* divide by 1 */
        movl    $(0x20000 | AP_TIMER_VEC), 0x320(%rax) /* periodic */
        movl    $AP_TIMER_COUNT, 0x380(%rax)
ap_loop:
        incq    (%rdi)
        sti
        hlt
        cli
        jmp     ap_loop

        .bss
        .balign 16
ap_stacks:
        .skip   (SMP_MAX_CPUS << AP_STACK_SHIFT)
ap_stacks_end:

        .section .rodata
        .balign 8
        .globl exc_handlers
exc_handlers:
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        .quad exc_\n
        .endr
        .globl irq_handlers
irq_handlers:
        .irp n, 0,1,2,3,4,5,6,7
        .quad irq_\n
        .endr
        .globl irq_other_handler
irq_other_handler:
        .quad irq_other
        .globl irq_timer_handler
irq_timer_handler:
        .quad irq_timer
        .globl irq_spurious_handler
irq_spurious_handler:
        .quad irq_spurious

        .section .note.GNU-stack, "", @progbits
