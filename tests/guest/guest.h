/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * forkd-test-guest: shared declarations.
 *
 * Layout constants used by both the ring-0 assembly (entry.S) and the ring-3
 * C code live in this header; the part below #ifndef __ASSEMBLER__ is C only.
 */

/* selectors of our own GDT (same layout as the VMM's boot GDT, plus a TSS) */
#define G_SEL_KCODE     0x08
#define G_SEL_KDATA     0x10
#define G_SEL_UDATA     0x18
#define G_SEL_UCODE     0x20
#define G_SEL_TSS       0x28
#define G_GDT_ENTRIES   7


/* interrupt vectors */
#define IRQ_VEC_BASE    0x40  /* + index of the device in bootinfo.devs[] */
#define IRQ_VEC_COUNT   8
#define SPURIOUS_VEC    0x4f  /* low nibble 0xf, as old APICs require */
#define IDT_ENTRIES     0x50  /* vectors 0..0x4f; nothing above is ever raised */

/* sizes of the hot page (see struct hot) */
#define USTACK_SIZE     2048  /* ring-3 stack */
#define KSTACK_SIZE     256   /* TSS.RSP0: traps and interrupts from ring 3, and IRQs nested in the WAIT trap */
#define IST_STACK_SIZE  4096  /* IST1: exceptions (fatal) */
#define HOT_PENDING_OFF (USTACK_SIZE + KSTACK_SIZE) /* offsetof(struct hot, pending) */

#define LAPIC_BASE      0xfee00000
#define AP_TRAMP_GPA    0x9000  /* the APs' real-mode trampoline (smp.c): page 9, free below 1 MiB */
#define SMP_MAX_CPUS    32
#define AP_STACK_SHIFT  8     /* 256 bytes of ring-0 stack for each AP */
#define AP_TIMER_VEC    0x4e  /* the APs' LAPIC timer: irq_other, EOI and return */
#define PROC_TIMER_VEC  0x4d  /* the BSP's one-shot LAPIC timer for its processes (procs.c): irq_timer */
#define PROC_TIMER_PENDING 7  /* the byte of hot.pending irq_timer sets, so that a WAIT returns */
/* 100 ms at KVM's 1 GHz APIC timer clock, divided by 1: 10 Hz, enough to show each AP at work.
 * At 100 Hz, 100 idle children of a 4-vCPU snapshot woke 30000 times a second between
 * them, and on a 2-core host those wake-ups, not the fork, were what a fork of them cost. */
#define AP_TIMER_COUNT  100000000
#define IOAPIC_BASE     0xfec00000

#ifndef __ASSEMBLER__

#include <stdint.h>
#include <stddef.h>
#include "bootinfo.h"

typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;

#define AGENT_MAGIC      0x31414b46u
#define AGENT_T_REQUEST  1
#define AGENT_T_RESPONSE 2
#define AGENT_T_ERROR    3
#define AGENT_T_EVENT    4
#define AGENT_HDR_SIZE   16
#define PAYLOAD_MAX      16384

#define CONS_QSIZE       16
#define RX_NBUF          16
#define RX_BUFSZ         192
#define TXBUF_SIZE       1024
#define BLK_QSIZE        16
#define ID_MAX           128  /* raw JSON token of the sandbox id */

#define PAGE_SIZE        4096ull
#define SCRATCH_BASE     (16ull << 20)

#define barrier() __asm__ __volatile__("" ::: "memory")

/* ---- virtqueue bookkeeping (split ring, virtio 1.x) ---- */
struct vring_desc {
        u64 addr;
        u32 len;
        u16 flags;
        u16 next;
};
#define VRING_DESC_F_NEXT  1
#define VRING_DESC_F_WRITE 2
#define VRING_AVAIL_F_NO_INTERRUPT 1

struct vring_avail {
        u16 flags;
        u16 idx;
        u16 ring[];
};

struct vring_used_elem {
        u32 id;
        u32 len;
};

struct vring_used {
        u16 flags;
        u16 idx;
        struct vring_used_elem ring[];
};

/* read-only after boot */
struct vq {
        volatile struct vring_desc *desc;
        volatile struct vring_avail *avail;
        volatile struct vring_used *used;
        u64 mmio;
        u16 size;
        u16 index;
};

/* mutable per-queue state: lives in the hot page */
struct vq_state {
        u16 next_avail;  /* shadow of avail->idx */
        u16 last_used;   /* next used entry to consume */
};

/* ---- frame reassembly ---- */
enum { RX_HDR = 0, RX_PAYLOAD, RX_DISCARD, RX_RESYNC };

struct rx_stream {
        u32 mode;
        u32 hdr_len;
        u8 hdr[AGENT_HDR_SIZE];
        u32 id;
        u32 type;
        u32 want;     /* payload bytes of the current frame */
        u32 got;
        u32 window;   /* last 4 bytes seen while resynchronising */
};

/*
 * Everything the guest writes after boot on the hot path (idle wait, an
 * identity event, a ping) sits in this one page-aligned struct: the stacks,
 * the agent state, the transmit buffer and the first part of the receive
 * payload buffer. Together with the console ring page that makes two guest
 * pages written per restored child on the happy path.
 */
struct hot {
        u8 ustack[USTACK_SIZE];          /* grows down from ustack + USTACK_SIZE */
        u8 kstack[KSTACK_SIZE];          /* TSS.RSP0 */
        volatile u64 pending;            /* byte i set by the IRQ handler of device i */
        struct vq_state rxq, txq, blkq;
        u8 rx_repost[RX_NBUF];
        u32 n_repost;
        u32 procs_live;                  /* procs.c: processes running and reads waiting */
        struct rx_stream rx;
        /* identity */
        u32 have_identity;
        u32 id_len;
        u64 generation;
        u64 wall_ns_at_event;
        u64 tsc_at_event;
        u64 prng;
        u8 seed[32];
        u8 id_raw[ID_MAX];
        u8 txbuf[TXBUF_SIZE];
        u8 payload[PAYLOAD_MAX];         /* first bytes share the hot page */
} __attribute__((aligned(4096)));

extern struct hot hot;

/* per-device facts gathered at boot (read-only afterwards) */
struct boot_state {
        u64 mem_size;
        u64 tsc_khz;
        u64 scratch_pages;
        u64 blk_blocks;     /* 4096-byte blocks on the disk */
        int have_blk;
        int have_cons;
        u32 blk_devidx;
        u32 cons_devidx;
        struct vq rxq, txq, blkq;
};
extern struct boot_state boot;


/* ---- lib.c ---- */
void *memset(void *d, int c, size_t n);
void *memcpy(void *d, const void *s, size_t n);
void *memmove(void *d, const void *s, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);
void serial_puts(const char *s);
void serial_put_hex(u64 v);
u64 fnv1a(u64 h, const void *p, size_t n);
#define FNV_BASIS 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

/* ring 0 only */
static inline void outb(u16 port, u8 v)
{
        __asm__ __volatile__("outb %0, %1" : : "a"(v), "Nd"(port));
}

/* ring 3: port output through the #GP trap (entry.S) */
void u_outb(u16 port, u8 v);

static inline u32 mmio_read32(u64 addr)
{
        return *(volatile u32 *)addr;
}

static inline void mmio_write32(u64 addr, u32 v)
{
        *(volatile u32 *)addr = v;
}

static inline u64 rdtsc(void)
{
        u32 lo, hi;
        __asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
        return ((u64)hi << 32) | lo;
}

/*
 * WAIT: a hlt in ring 3 at the known address hlt_gate (entry.S). It raises #GP
 * into ring 0, where the handler halts with interrupts on unless an interrupt
 * is already pending, then returns past the hlt.
 */
void sys_wait(void);
__attribute__((noreturn)) void sys_poweroff(void);

/* ---- virtio.c ---- */
int virtio_init_blk(u64 mmio);
int virtio_init_console(u64 mmio);
void irq_service(void);
void vq_notify(const struct vq *q);
int blk_rw(int write, u64 block, u8 *buf);
extern u8 blk_data[4096];
u8 *cons_rx_buf(u32 i);
u8 *tx_begin(void);
void tx_commit(u16 type, u32 id, u32 len);
void tx_commit_buf(u8 *buf, u16 type, u32 id, u32 len);
void tx_flush(void);
u32 cons_rx_poll(void);

/* ---- json.c ---- */
enum { J_NONE = 0, J_STR, J_NUM, J_TRUE, J_FALSE, J_NULL, J_OBJ, J_ARR };

struct jfield {
        const char *key;
        u32 type;
        u32 off;   /* value span in the input (strings: including quotes) */
        u32 len;
};

int json_fields(const u8 *s, u32 n, struct jfield *f, u32 nf);
int json_fields_strict(const u8 *s, u32 n, struct jfield *f, u32 nf, struct jfield *unknown);
int json_array_next(const u8 *s, const struct jfield *arr, u32 *pos, struct jfield *e);
int json_u64(const u8 *s, const struct jfield *f, u64 *out);
int json_str_eq(const u8 *s, const struct jfield *f, const char *lit);

struct out {
        u8 *buf;
        u32 len;
        u32 cap;
        int overflow;
};
void out_raw(struct out *o, const void *p, u32 n);
void out_s(struct out *o, const char *s);
void out_u64(struct out *o, u64 v);
void out_hex64(struct out *o, u64 v);
void out_hexbytes(struct out *o, const u8 *p, u32 n);

/* ---- agent.c ---- */
u64 wall_ns_now(void);
void agent_feed(const u8 *p, u32 n);
struct out agent_reply_begin(void);
void agent_reply(u32 id, struct out *o);
void agent_reply_error(u32 id, const char *msg);
void agent_reply_error_errno(u32 id, const char *msg, const char *ename);

/* ---- hostile.c ---- */
enum {
        HOSTILE_NONE = 0,
        HOSTILE_VIRTIO,
        HOSTILE_FLOOD_CONSOLE,
        HOSTILE_FLOOD_AGENT,
        HOSTILE_OVERSIZED,
        HOSTILE_GARBAGE,
        HOSTILE_SILENT,
        HOSTILE_SPIN,
};
#define HOSTILE_DISK_MARK "forkd-test-guest hostile=" /* 25 bytes, then MODE and a newline */
int hostile_parse(const u8 *s, u32 n);
int hostile_answer(u32 id);
void hostile_start(void);
u32 virtio_hostile_round(u8 *scratch);
void tx_commit_raw(u32 len);

/* ---- files.c ---- */
void op_run_code(u32 id, const u8 *p, u32 n);
int json_str_decode(const u8 *s, const struct jfield *f, u8 *dst, u32 cap);
void out_json_str(struct out *o, const u8 *p, u32 n);
/* Runs a run_code script: 0, or 1 when it stopped on an error (its line in *err). */
int script_run(const u8 *code, u32 len, const u8 **out, u32 *out_len, const u8 **err, u32 *err_len);

/* ---- procs.c ---- */
/* proc_start, proc_list, proc_signal, proc_stdin, proc_resize, proc_read: 1 when op is one */
int procs_op(u32 id, const u8 *p, u32 n, const struct jfield *op);
/* A new channel (an identity event after a restore): the reads waiting are dropped. */
void procs_channel_reset(void);
/* proc_start refuses "read" from now on (run_code's old_agent). */
void procs_refuse_read(void);
/* Runs what is due and answers the reads that can be: the ns until the next
 * deadline (0: nothing timed is waiting). Only while hot.procs_live. */
u64 procs_step(void);

/* ---- smp.c ---- */
void smp_start(u32 n_cpus);
void smp_out(struct out *o);
void op_exec(u32 id, const u8 *p, u32 n);
void op_hash_files(u32 id, const u8 *p, u32 n);
void op_write_file(u32 id, const u8 *p, u32 n);
void op_read_file(u32 id, const u8 *p, u32 n);
__attribute__((noreturn)) void agent_loop(void);

#endif
