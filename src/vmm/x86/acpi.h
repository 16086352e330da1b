/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "vmm.h"

/* Where the tables live: inside the BIOS area Linux scans for the RSDP. */
#define ACPI_TABLES_GPA 0xe0000ull
#define ACPI_TABLES_SIZE 0x10000ull

struct acpi_dev {
        uint64_t mmio_base;
        uint32_t mmio_size;
        uint32_t gsi;
        bool shared;    /* the interrupt is shared (volumes) */
};

/* Write RSDP (at ACPI_TABLES_GPA), XSDT, FADT, MADT and a DSDT listing the
 * virtio-mmio devices and COM1 into guest memory. */
int acpi_build(struct vmm *vmm, const struct acpi_dev *devs, unsigned n_devs);
