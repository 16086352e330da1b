/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Writes the vmstate seeds (tests/fuzz/make-corpus runs it): valid states
 * from vmstate_encode(), each behind fuzz-vmstate's mode byte.
 * Usage: seed-vmstate DIR
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmstate.h"

static int write_seed(const char *dir, const char *name, unsigned mode, const struct vmstate *s) {
        char path[4096];
        void *buf = NULL;
        size_t len = 0;
        FILE *f;
        int r;

        r = vmstate_encode(s, &buf, &len);
        if (r < 0)
                return r;
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        f = fopen(path, "we");
        if (!f) {
                free(buf);
                return -errno;
        }
        fputc((int) mode, f);
        fwrite(buf, 1, len, f);
        free(buf);
        return fclose(f) == 0 ? 0 : -EIO;
}

int main(int argc, char **argv) {
        static struct vmstate s;
        struct vmstate_vcpu *v = &s.vcpus[0];

        if (argc != 2) {
                fprintf(stderr, "usage: seed-vmstate DIR\n");
                return 2;
        }

        s.memory.mem_size = 256u << 20;
        s.memory.tsc_khz = 2999999;
        s.n_vcpus = 1;
        s.pic_master.chip_id = KVM_IRQCHIP_PIC_MASTER;
        s.pic_slave.chip_id = KVM_IRQCHIP_PIC_SLAVE;
        s.ioapic.chip_id = KVM_IRQCHIP_IOAPIC;
        v->regs.rip = 0x100000;
        v->mp_state.mp_state = KVM_MP_STATE_RUNNABLE;

        /* The least state: no CPUID entries, MSRs or devices. */
        if (write_seed(argv[1], "minimal", 0, &s) < 0)
                return 1;

        v->n_cpuid = 2;
        v->cpuid[0].function = 0;
        v->cpuid[0].eax = 0xd;
        v->cpuid[1].function = 1;
        v->cpuid[1].ecx = 1u << 31;
        v->n_msrs = 2;
        v->msrs[0].index = 0xc0000080; /* EFER */
        v->msrs[0].data = 0x500;
        v->msrs[1].index = 0x6e0;      /* TSC_DEADLINE, last */
        s.n_devs = 3;
        for (unsigned i = 0; i < s.n_devs; i++) {
                s.devs[i].kind = VMSTATE_DEV_SERIAL + i;
                s.devs[i].len = 8 + 5 * i;
                memset(s.devs[i].blob, (int) i + 1, s.devs[i].len);
        }
        if (write_seed(argv[1], "devices", 0, &s) < 0)
                return 1;
        /* The same with mode bit 0: the fuzzer rewrites the CRCs. */
        if (write_seed(argv[1], "devices-fixcrc", 1, &s) < 0)
                return 1;

        /* What a VM with a NIC saves: a fourth device, kind VIRTIO_NET. */
        s.n_devs = 4;
        s.devs[3].kind = VMSTATE_DEV_VIRTIO_NET;
        s.devs[3].len = 140; /* virtio_mmio_save() of two queues and the NIC's 12 bytes */
        memset(s.devs[3].blob, 5, s.devs[3].len);
        if (write_seed(argv[1], "devices-net-fixcrc", 1, &s) < 0)
                return 1;

        v->n_cpuid = VMSTATE_MAX_CPUID;
        v->n_msrs = VMSTATE_MAX_MSRS;
        s.n_devs = VMSTATE_MAX_DEVS;
        for (unsigned i = 0; i < s.n_devs; i++) {
                s.devs[i].kind = VMSTATE_DEV_SERIAL + i % 4;
                s.devs[i].len = i == 0 ? VMSTATE_DEV_BLOB_MAX : 0;
        }
        if (write_seed(argv[1], "maximal-fixcrc", 1, &s) < 0)
                return 1;
        return 0;
}
