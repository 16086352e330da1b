/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd-triple-fault: a guest that crashes at once, for the tests of how a
 * crash during boot is reported. It prints two lines on the serial console
 * (so that the report has console lines to show), loads an empty IDT and
 * touches an unmapped address: the page fault cannot be delivered, nor the
 * #GP and the double fault that follow, so the CPU shuts down (a triple
 * fault) and KVM exits with KVM_EXIT_SHUTDOWN.
 *
 * Entered by forkd-vmm like the test guest (src/vmm/x86/bootinfo.h): long
 * mode, CPL 0, IF=0, identity-mapped RAM, nothing mapped at 512 GiB. Plain
 * integer instructions only: under PVM every one of them is emulated.
 */
        .section .text.entry, "ax"
        .code64
        .globl _start
        .type _start, @function
_start:
        cli
        leaq    banner(%rip), %rsi
        movw    $0x3f8, %dx                     /* COM1 data register */
1:      movb    (%rsi), %al
        testb   %al, %al
        jz      2f
        outb    %al, %dx
        incq    %rsi
        jmp     1b
2:      lidt    empty_idtr(%rip)
        movabsq $0x8000000000, %rax             /* PML4 entry 1: not present */
        movq    (%rax), %rax
3:      hlt                                     /* not reached */
        jmp     3b
        .size _start, . - _start

/* In .data, so that the image has the data segment guest.ld lays out. */
        .section .data
banner:
        .asciz  "forkd-triple-fault: started\nforkd-triple-fault: loading an empty IDT, then faulting\n"
        .balign 16
empty_idtr:
        .word   0
        .quad   0
