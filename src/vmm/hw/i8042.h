/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "vmm.h"

/* The i8042 keyboard controller, reduced to what a microVM needs: the CPU
 * reset command (0xFE on port 0x64) stops the VM cleanly. */
int i8042_init(struct vmm *vmm);
