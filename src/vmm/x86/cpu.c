/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Saving and restoring vCPU and VM state, in the order Firecracker documents:
 * save MP state first; restore CPUID, MP state, regs, sregs, xsave, xcrs,
 * debugregs, LAPIC, MSRs (TSC_DEADLINE last), events; then PIT, clock and
 * irqchip. Devices come after, in snapshot.c.
 */
#include <sys/ioctl.h>

#include "kvm.h"
#include "x86.h"

/* MSRs we carry across a snapshot. Those KVM does not know are dropped at
 * save time. MSR_IA32_TSC_DEADLINE must stay last: writing it arms the timer
 * against the TSC restored just before. */
static const uint32_t msr_list[] = {
        0x00000174, /* SYSENTER_CS */
        0x00000175, /* SYSENTER_ESP */
        0x00000176, /* SYSENTER_EIP */
        0xc0000081, /* STAR */
        0xc0000082, /* LSTAR */
        0xc0000083, /* CSTAR */
        0xc0000084, /* SFMASK */
        0xc0000102, /* KERNEL_GS_BASE */
        0xc0000103, /* TSC_AUX */
        0x00000277, /* PAT */
        0x000001a0, /* MISC_ENABLE */
        0x4b564d00, /* KVM wall clock */
        0x4b564d01, /* KVM system time */
        0x4b564d02, /* KVM async PF */
        0x4b564d03, /* KVM steal time */
        0x4b564d04, /* KVM PV EOI */
        0x00000010, /* TSC */
        0x000006e0, /* TSC_DEADLINE (last) */
};

struct msrs_buf {
        struct kvm_msrs hdr;
        struct kvm_msr_entry e[VMSTATE_MAX_MSRS];
};

static int save_msrs(int fd, struct vmstate_vcpu *v) {
        struct msrs_buf b = {};
        unsigned n = 0;
        int r;

        for (unsigned i = 0; i < ELEMENTSOF(msr_list); i++)
                b.e[n++].index = msr_list[i];
        b.hdr.nmsrs = n;

        /* KVM_GET_MSRS stops at the first MSR it does not know; drop it and retry. */
        for (;;) {
                r = ioctl(fd, KVM_GET_MSRS, &b);
                if (r < 0)
                        return log_debug_errno(errno, "KVM_GET_MSRS failed: %m");
                if ((unsigned) r >= b.hdr.nmsrs)
                        break;
                memmove(&b.e[r], &b.e[r + 1], (b.hdr.nmsrs - r - 1) * sizeof(b.e[0]));
                b.hdr.nmsrs--;
        }
        v->n_msrs = b.hdr.nmsrs;
        memcpy(v->msrs, b.e, b.hdr.nmsrs * sizeof(b.e[0]));
        return 0;
}

int x86_vcpu_save(struct vmm *vmm, unsigned index, const struct kvm_cpuid2 *cpuid, struct vmstate_vcpu *v) {
        struct {
                struct kvm_cpuid2 hdr;
                struct kvm_cpuid_entry2 e[VMSTATE_MAX_CPUID];
        } own;
        int fd = vmm->vcpus[index].fd, r;

        if (cpuid->nent > VMSTATE_MAX_CPUID)
                return -E2BIG;
        /* cpuid is vCPU 0's: each vCPU saves what it was given, its APIC id. */
        own.hdr = (struct kvm_cpuid2) { .nent = cpuid->nent };
        memcpy(own.e, cpuid->entries, cpuid->nent * sizeof(cpuid->entries[0]));
        vmm_cpuid_set_topology(&own.hdr, index, vmm->n_vcpus);
        v->n_cpuid = own.hdr.nent;
        memcpy(v->cpuid, own.e, own.hdr.nent * sizeof(own.e[0]));

        if (ioctl(fd, KVM_GET_MP_STATE, &v->mp_state) < 0)
                return log_debug_errno(errno, "KVM_GET_MP_STATE failed: %m");
        if (ioctl(fd, KVM_GET_REGS, &v->regs) < 0)
                return log_debug_errno(errno, "KVM_GET_REGS failed: %m");
        if (ioctl(fd, KVM_GET_SREGS, &v->sregs) < 0)
                return log_debug_errno(errno, "KVM_GET_SREGS failed: %m");
        if (ioctl(fd, KVM_GET_XSAVE, &v->xsave) < 0)
                return log_debug_errno(errno, "KVM_GET_XSAVE failed: %m");
        if (ioctl(fd, KVM_GET_XCRS, &v->xcrs) < 0)
                return log_debug_errno(errno, "KVM_GET_XCRS failed: %m");
        if (ioctl(fd, KVM_GET_DEBUGREGS, &v->debugregs) < 0)
                return log_debug_errno(errno, "KVM_GET_DEBUGREGS failed: %m");
        if (ioctl(fd, KVM_GET_LAPIC, &v->lapic) < 0)
                return log_debug_errno(errno, "KVM_GET_LAPIC failed: %m");
        r = save_msrs(fd, v);
        if (r < 0)
                return r;
        if (ioctl(fd, KVM_GET_VCPU_EVENTS, &v->events) < 0)
                return log_debug_errno(errno, "KVM_GET_VCPU_EVENTS failed: %m");
        return 0;
}

int x86_vcpu_restore(struct vmm *vmm, unsigned index, const struct vmstate_vcpu *v) {
        struct {
                struct kvm_cpuid2 hdr;
                struct kvm_cpuid_entry2 e[VMSTATE_MAX_CPUID];
        } cpuid;
        struct msrs_buf msrs;
        int fd = vmm->vcpus[index].fd, r;

        if (v->n_cpuid > VMSTATE_MAX_CPUID || v->n_msrs > VMSTATE_MAX_MSRS)
                return -EINVAL;

        cpuid.hdr.nent = v->n_cpuid;
        cpuid.hdr.padding = 0;
        memcpy(cpuid.e, v->cpuid, v->n_cpuid * sizeof(v->cpuid[0]));
        if (ioctl(fd, KVM_SET_CPUID2, &cpuid) < 0)
                return log_debug_errno(errno, "KVM_SET_CPUID2 failed: %m");
        if (ioctl(fd, KVM_SET_MP_STATE, &v->mp_state) < 0)
                return log_debug_errno(errno, "KVM_SET_MP_STATE failed: %m");
        if (ioctl(fd, KVM_SET_REGS, &v->regs) < 0)
                return log_debug_errno(errno, "KVM_SET_REGS failed: %m");
        if (ioctl(fd, KVM_SET_SREGS, &v->sregs) < 0)
                return log_debug_errno(errno, "KVM_SET_SREGS failed: %m");
        if (ioctl(fd, KVM_SET_XSAVE, &v->xsave) < 0)
                return log_debug_errno(errno, "KVM_SET_XSAVE failed: %m");
        if (ioctl(fd, KVM_SET_XCRS, &v->xcrs) < 0)
                return log_debug_errno(errno, "KVM_SET_XCRS failed: %m");
        if (ioctl(fd, KVM_SET_DEBUGREGS, &v->debugregs) < 0)
                return log_debug_errno(errno, "KVM_SET_DEBUGREGS failed: %m");
        if (ioctl(fd, KVM_SET_LAPIC, &v->lapic) < 0)
                return log_debug_errno(errno, "KVM_SET_LAPIC failed: %m");

        memset(&msrs.hdr, 0, sizeof(msrs.hdr));
        msrs.hdr.nmsrs = v->n_msrs;
        memcpy(msrs.e, v->msrs, v->n_msrs * sizeof(v->msrs[0]));
        r = ioctl(fd, KVM_SET_MSRS, &msrs);
        if (r < 0)
                return log_debug_errno(errno, "KVM_SET_MSRS failed: %m");
        if ((uint32_t) r != v->n_msrs)
                return log_debug_errno(EINVAL, "KVM_SET_MSRS refused MSR 0x%x", v->msrs[r].index);

        if (ioctl(fd, KVM_SET_VCPU_EVENTS, &v->events) < 0)
                return log_debug_errno(errno, "KVM_SET_VCPU_EVENTS failed: %m");
        return 0;
}

static int get_chip(struct vmm *vmm, uint32_t id, struct kvm_irqchip *c) {
        memset(c, 0, sizeof(*c));
        c->chip_id = id;
        if (ioctl(vmm->vm_fd, KVM_GET_IRQCHIP, c) < 0)
                return log_debug_errno(errno, "KVM_GET_IRQCHIP(%u) failed: %m", id);
        return 0;
}

static int set_chip(struct vmm *vmm, uint32_t id, const struct kvm_irqchip *c) {
        if (c->chip_id != id)
                return -EINVAL;
        if (ioctl(vmm->vm_fd, KVM_SET_IRQCHIP, c) < 0)
                return log_debug_errno(errno, "KVM_SET_IRQCHIP(%u) failed: %m", id);
        return 0;
}

int x86_vm_save(struct vmm *vmm, struct vmstate *s) {
        int r;

        if (ioctl(vmm->vm_fd, KVM_GET_PIT2, &s->pit) < 0)
                return log_debug_errno(errno, "KVM_GET_PIT2 failed: %m");
        if (ioctl(vmm->vm_fd, KVM_GET_CLOCK, &s->clock) < 0)
                return log_debug_errno(errno, "KVM_GET_CLOCK failed: %m");
        /* Only the clock value is restorable; the rest describes the host. */
        s->clock.flags = 0;
        memset(s->clock.pad, 0, sizeof(s->clock.pad));
        s->clock.realtime = 0;
        s->clock.host_tsc = 0;
        r = get_chip(vmm, KVM_IRQCHIP_PIC_MASTER, &s->pic_master);
        if (r >= 0)
                r = get_chip(vmm, KVM_IRQCHIP_PIC_SLAVE, &s->pic_slave);
        if (r >= 0)
                r = get_chip(vmm, KVM_IRQCHIP_IOAPIC, &s->ioapic);
        return r;
}

int x86_vm_restore(struct vmm *vmm, const struct vmstate *s) {
        int r;

        if (ioctl(vmm->vm_fd, KVM_SET_PIT2, &s->pit) < 0)
                return log_debug_errno(errno, "KVM_SET_PIT2 failed: %m");
        if (ioctl(vmm->vm_fd, KVM_SET_CLOCK, &s->clock) < 0)
                return log_debug_errno(errno, "KVM_SET_CLOCK failed: %m");
        r = set_chip(vmm, KVM_IRQCHIP_PIC_MASTER, &s->pic_master);
        if (r >= 0)
                r = set_chip(vmm, KVM_IRQCHIP_PIC_SLAVE, &s->pic_slave);
        if (r >= 0)
                r = set_chip(vmm, KVM_IRQCHIP_IOAPIC, &s->ioapic);
        return r;
}
