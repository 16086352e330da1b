/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "bootinfo.h"
#include "i8042.h"

static void i8042_read(struct vmm *vmm, struct pio_dev *dev, uint16_t off, void *data, uint32_t len) {
        /* Status port and data port both read 0: no data, input buffer empty. */
        memset(data, 0, len);
}

static void i8042_write(struct vmm *vmm, struct pio_dev *dev, uint16_t off, const void *data, uint32_t len) {
        if (len == 1 && dev->base + off == FORKD_I8042_CMD_PORT &&
            *(const uint8_t *) data == FORKD_I8042_CMD_RESET)
                vmm_request_stop(vmm, VMM_STOP_RESET);
}

static struct pio_dev i8042_data = { .base = FORKD_I8042_DATA_PORT, .len = 1, .read = i8042_read, .write = i8042_write };
static struct pio_dev i8042_cmd = { .base = FORKD_I8042_CMD_PORT, .len = 1, .read = i8042_read, .write = i8042_write };

int i8042_init(struct vmm *vmm) {
        int r;

        r = vmm_register_pio(vmm, &i8042_data);
        if (r < 0)
                return r;
        return vmm_register_pio(vmm, &i8042_cmd);
}
