/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * ACPI tables for Linux guests: RSDP, XSDT, FADT (hardware-reduced), MADT and
 * a DSDT that describes the virtio-mmio devices ("LNRO0005", which Debian's
 * virtio_mmio module matches) and the COM1 UART. Debian's kernels build every
 * virtio driver as a module and cannot take virtio-mmio devices from the
 * command line, so ACPI is how they find our devices, as with QEMU's microvm.
 */
#include "acpi.h"
#include "bootinfo.h"

struct aml {
        uint8_t *b;
        size_t len, cap;
        bool oom;
};

static void aml_put(struct aml *a, const void *p, size_t n) {
        if (a->oom)
                return;
        if (a->len + n > a->cap) {
                size_t cap = MAX(a->cap * 2, a->len + n + 64);
                uint8_t *nb = realloc(a->b, cap);
                if (!nb) {
                        a->oom = true;
                        return;
                }
                a->b = nb;
                a->cap = cap;
        }
        memcpy(a->b + a->len, p, n);
        a->len += n;
}

static void aml_byte(struct aml *a, uint8_t v) {
        aml_put(a, &v, 1);
}

/* PkgLength counts itself: pick the encoding size first. */
static void aml_pkg(struct aml *a, const struct aml *body, const uint8_t *prefix, size_t prefix_len) {
        size_t n = body->len;
        size_t total;

        if (n + 1 < 0x40) {
                aml_put(a, prefix, prefix_len);
                aml_byte(a, (uint8_t) (n + 1));
        } else if (n + 2 < 0x1000) {
                total = n + 2;
                aml_put(a, prefix, prefix_len);
                aml_byte(a, (uint8_t) (0x40 | (total & 0xf)));
                aml_byte(a, (uint8_t) (total >> 4));
        } else {
                total = n + 3;
                aml_put(a, prefix, prefix_len);
                aml_byte(a, (uint8_t) (0x80 | (total & 0xf)));
                aml_byte(a, (uint8_t) (total >> 4));
                aml_byte(a, (uint8_t) (total >> 12));
        }
        aml_put(a, body->b, body->len);
}

static void aml_name_string(struct aml *a, const char *seg4, const char *s) {
        aml_byte(a, 0x08); /* NameOp */
        aml_put(a, seg4, 4);
        aml_byte(a, 0x0d); /* StringPrefix */
        aml_put(a, s, strlen(s) + 1);
}

static void aml_name_int(struct aml *a, const char *seg4, uint32_t v) {
        aml_byte(a, 0x08);
        aml_put(a, seg4, 4);
        aml_byte(a, 0x0c); /* DWordPrefix */
        aml_put(a, &v, 4);
}

/* Name(_CRS, ResourceTemplate() { ... }) from raw resource descriptors. */
static void aml_name_crs(struct aml *a, const uint8_t *res, size_t n) {
        struct aml buf = {};
        uint8_t hdr[5] = { 0x08, '_', 'C', 'R', 'S' };

        aml_byte(&buf, 0x0a); /* BytePrefix: buffer size */
        aml_byte(&buf, (uint8_t) (n + 2));
        aml_put(&buf, res, n);
        aml_byte(&buf, 0x79); /* EndTag */
        aml_byte(&buf, 0x00);
        aml_put(a, hdr, sizeof(hdr));
        aml_pkg(a, &buf, (const uint8_t[]) { 0x11 }, 1); /* BufferOp */
        a->oom |= buf.oom;
        free(buf.b);
}

static void aml_device(struct aml *a, const char *seg4, const struct aml *body) {
        struct aml dev = {};

        aml_put(&dev, seg4, 4);
        aml_put(&dev, body->b, body->len);
        aml_pkg(a, &dev, (const uint8_t[]) { 0x5b, 0x82 }, 2); /* DeviceOp */
        a->oom |= dev.oom || body->oom;
        free(dev.b);
}

static void virtio_device(struct aml *sb, unsigned i, uint64_t base, uint32_t size, uint32_t gsi, bool shared) {
        struct aml d = {};
        char seg[5];
        uint8_t res[21];

        snprintf(seg, sizeof(seg), "VR%02u", i % 100);
        aml_name_string(&d, "_HID", "LNRO0005");
        aml_name_int(&d, "_UID", i);
        /* Memory32Fixed(ReadWrite, base, size) */
        res[0] = 0x86;
        res[1] = 9;
        res[2] = 0;
        res[3] = 1;
        memcpy(res + 4, &(uint32_t) { (uint32_t) base }, 4);
        memcpy(res + 8, &size, 4);
        /* Interrupt(ResourceConsumer, Edge, ActiveHigh, Exclusive or Shared) { gsi } */
        res[12] = 0x89;
        res[13] = 6;
        res[14] = 0;
        res[15] = shared ? 0x0b : 0x03;
        res[16] = 1;
        memcpy(res + 17, &gsi, 4);
        aml_name_crs(&d, res, sizeof(res));
        aml_device(sb, seg, &d);
        free(d.b);
}

static void com1_device(struct aml *sb) {
        struct aml d = {};
        /* IO(Decode16, 0x3f8, 0x3f8, 1, 8) and IRQNoFlags() { 4 } */
        const uint8_t res[] = { 0x47, 0x01, 0xf8, 0x03, 0xf8, 0x03, 0x01, 0x08, 0x22, 0x10, 0x00 };

        aml_byte(&d, 0x08);
        aml_put(&d, "_HID", 4);
        aml_byte(&d, 0x0c);
        aml_put(&d, &(uint32_t) { 0x0105d041 }, 4); /* EISAID("PNP0501") */
        aml_name_int(&d, "_UID", 1);
        aml_name_crs(&d, res, sizeof(res));
        aml_device(sb, "COM1", &d);
        free(d.b);
}

static uint8_t checksum(const void *p, size_t n) {
        const uint8_t *b = p;
        uint8_t s = 0;

        for (size_t i = 0; i < n; i++)
                s += b[i];
        return (uint8_t) -s;
}

struct _packed_ acpi_header {
        char signature[4];
        uint32_t length;
        uint8_t revision;
        uint8_t checksum;
        char oem_id[6];
        char oem_table_id[8];
        uint32_t oem_revision;
        char creator_id[4];
        uint32_t creator_revision;
};

static void header(struct acpi_header *h, const char *sig, uint32_t len, uint8_t rev) {
        memcpy(h->signature, sig, 4);
        h->length = len;
        h->revision = rev;
        memcpy(h->oem_id, "FORKD ", 6);
        memcpy(h->oem_table_id, "FORKDVMM", 8);
        h->oem_revision = 1;
        memcpy(h->creator_id, "FKVM", 4);
        h->creator_revision = 1;
}

int acpi_build(struct vmm *vmm, const struct acpi_dev *devs, unsigned n_devs) {
        uint8_t *base = vmm_gpa(vmm, ACPI_TABLES_GPA, ACPI_TABLES_SIZE);
        struct aml sb = {}, dsdt_body = {};
        uint64_t off = 0, rsdp_gpa, xsdt_gpa, fadt_gpa, madt_gpa, dsdt_gpa;
        int r = 0;

        if (!base)
                return -ENOMEM;
        memset(base, 0, ACPI_TABLES_SIZE);

        /* DSDT: Scope(\_SB) { VR00.., COM1 } */
        for (unsigned i = 0; i < n_devs; i++)
                virtio_device(&sb, i, devs[i].mmio_base, devs[i].mmio_size, devs[i].gsi, devs[i].shared);
        com1_device(&sb);
        aml_put(&dsdt_body, "\\_SB_", 5);
        aml_put(&dsdt_body, sb.b, sb.len);
        {
                struct aml scope = {};
                aml_pkg(&scope, &dsdt_body, (const uint8_t[]) { 0x10 }, 1); /* ScopeOp */
                free(dsdt_body.b);
                dsdt_body = scope;
        }
        if (sb.oom || dsdt_body.oom) {
                r = -ENOMEM;
                goto out;
        }

#define ALLOC(sz) ({ uint64_t _o = off; off = ALIGN_UP(off + (sz), 16); _o; })
        rsdp_gpa = ALLOC(36);
        xsdt_gpa = ALLOC(36 + 2 * 8);
        fadt_gpa = ALLOC(276);
        madt_gpa = ALLOC(44 + 8 * vmm->n_vcpus + 12);
        dsdt_gpa = ALLOC(36 + dsdt_body.len);
#undef ALLOC
        if (off > ACPI_TABLES_SIZE) {
                r = -E2BIG;
                goto out;
        }

        /* DSDT */
        {
                struct acpi_header *h = (void *) (base + dsdt_gpa);
                header(h, "DSDT", 36 + dsdt_body.len, 2);
                memcpy(base + dsdt_gpa + 36, dsdt_body.b, dsdt_body.len);
                h->checksum = checksum(h, h->length);
        }
        /* MADT: a local APIC per vCPU (processor i, APIC id i, enabled), the
         * IOAPIC at the usual address, GSI base 0. Linux starts the APs itself
         * with INIT/SIPI through the in-kernel LAPIC. */
        {
                uint8_t *m = base + madt_gpa, *io;
                struct acpi_header *h = (void *) m;
                uint32_t lapic = (uint32_t) FORKD_LAPIC_GPA, ioapic = (uint32_t) FORKD_IOAPIC_GPA;

                header(h, "APIC", 44 + 8 * vmm->n_vcpus + 12, 4);
                memcpy(m + 36, &lapic, 4);
                /* flags 0: no dual 8259 setup to worry about */
                for (unsigned i = 0; i < vmm->n_vcpus; i++) {
                        uint8_t *e = m + 44 + 8 * i;

                        e[0] = 0; e[1] = 8; e[2] = (uint8_t) i; e[3] = (uint8_t) i; e[4] = 1;
                }
                io = m + 44 + 8 * vmm->n_vcpus;
                io[0] = 1; io[1] = 12; io[2] = 0; /* IOAPIC id 0 */
                memcpy(io + 4, &ioapic, 4);
                /* GSI base 0 (already zero) */
                h->checksum = checksum(h, h->length);
        }
        /* FADT, revision 6, hardware-reduced ACPI. */
        {
                uint8_t *f = base + fadt_gpa;
                struct acpi_header *h = (void *) f;
                uint32_t flags = 1u << 20; /* HW_REDUCED_ACPI */
                uint32_t dsdt32 = (uint32_t) (ACPI_TABLES_GPA + dsdt_gpa);
                uint64_t dsdt64 = ACPI_TABLES_GPA + dsdt_gpa;

                header(h, "FACP", 276, 6);
                memcpy(f + 40, &dsdt32, 4);
                /* IAPC_BOOT_ARCH: no CMOS RTC (Linux then skips a probe of ports
                 * 0x70/0x71 that costs seconds with nothing there; kvmclock and the
                 * identity event give the wall clock) and no 8042 (bit 1 clear). */
                f[109] = 1u << 5;
                memcpy(f + 112, &flags, 4);
                f[131] = 5;                       /* minor version */
                memcpy(f + 140, &dsdt64, 8);      /* X_DSDT */
                memcpy(f + 268, "FORKDVMM", 8);   /* hypervisor vendor identity */
                h->checksum = checksum(h, h->length);
        }
        /* XSDT */
        {
                uint8_t *x = base + xsdt_gpa;
                struct acpi_header *h = (void *) x;
                uint64_t e[2] = { ACPI_TABLES_GPA + fadt_gpa, ACPI_TABLES_GPA + madt_gpa };

                header(h, "XSDT", 36 + sizeof(e), 1);
                memcpy(x + 36, e, sizeof(e));
                h->checksum = checksum(h, h->length);
        }
        /* RSDP, revision 2 */
        {
                uint8_t *p = base + rsdp_gpa;
                uint32_t len = 36;
                uint64_t x = ACPI_TABLES_GPA + xsdt_gpa;

                memcpy(p, "RSD PTR ", 8);
                memcpy(p + 9, "FORKD ", 6);
                p[15] = 2;
                memcpy(p + 20, &len, 4);
                memcpy(p + 24, &x, 8);
                p[8] = checksum(p, 20);
                p[32] = checksum(p, 36);
        }
out:
        free(sb.b);
        free(dsdt_body.b);
        return r;
}
