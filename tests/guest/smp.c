/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd-test-guest: the application processors. With more than one vCPU
 * (bootinfo n_cpus), the BSP copies the real-mode trampoline (entry.S) to
 * AP_TRAMP_GPA and sends INIT and two SIPIs through its LAPIC to all but
 * itself; each AP goes straight from real mode to long mode on forkd-vmm's
 * page tables, then to ap_start64, which starts its LAPIC timer (10 Hz) and
 * increments its counter once a tick, halted in between. The counters say whether
 * each vCPU's work goes on across pause, snapshot, fork, branch and compact:
 * the run_code statement "cpus" and the agent op "cpus" report them.
 */
#include "guest.h"

/* One cache line per CPU: [0] the counter, [1] 1 once the AP runs. */
volatile u64 ap_counters[SMP_MAX_CPUS][8] __attribute__((aligned(64)));
u32 smp_cpus = 1;

extern const u8 ap_tramp_start[], ap_tramp_end[];

static void wait_ms(u64 ms)
{
        u64 khz = boot.tsc_khz ? boot.tsc_khz : 1000000, t0 = rdtsc();

        while (rdtsc() - t0 < ms * khz)
                __asm__ __volatile__("pause");
}

static u32 aps_up(void)
{
        u32 n = 0;

        for (u32 i = 1; i < smp_cpus; i++)
                n += ap_counters[i][1] != 0;
        return n;
}

/* Ring 3: the LAPIC and low memory are mapped user-accessible (bootinfo.h). */
void smp_start(u32 n_cpus)
{
        if (n_cpus <= 1)
                return;
        smp_cpus = n_cpus < SMP_MAX_CPUS ? n_cpus : SMP_MAX_CPUS;
        memcpy((void *)AP_TRAMP_GPA, ap_tramp_start, (size_t)(ap_tramp_end - ap_tramp_start));

        /* INIT, then SIPI twice with the trampoline's page, to all excluding self. */
        mmio_write32(LAPIC_BASE + 0x310, 0);
        mmio_write32(LAPIC_BASE + 0x300, 0x000c4500);
        wait_ms(10);
        for (int k = 0; k < 2 && aps_up() < smp_cpus - 1; k++) {
                mmio_write32(LAPIC_BASE + 0x310, 0);
                mmio_write32(LAPIC_BASE + 0x300, 0x000c4600 | (AP_TRAMP_GPA >> 12));
                wait_ms(1);
        }
        for (u32 ms = 0; ms < 5000 && aps_up() < smp_cpus - 1; ms++)
                wait_ms(1);
        serial_puts("forkd-test-guest: application processors up: ");
        serial_put_hex(aps_up());
        serial_puts("\n");
}

/* {"cpus":N,"counters":[0,C1,...]}: CPU 0 (the BSP, which runs the agent) counts nothing. */
void smp_out(struct out *o)
{
        out_s(o, "{\"cpus\":");
        out_u64(o, smp_cpus);
        out_s(o, ",\"counters\":[");
        for (u32 i = 0; i < smp_cpus; i++) {
                if (i)
                        out_s(o, ",");
                out_u64(o, i == 0 ? 0 : ap_counters[i][0]);
        }
        out_s(o, "]}");
}
