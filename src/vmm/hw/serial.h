/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "vmm.h"

#define SERIAL_LOG_MAX (1u << 20) /* bytes a guest may write to its console log */

struct serial;

/* A 16550A-compatible UART at port base. Output goes to log_path, opened on the
 * first byte (NULL: discarded). No input, no interrupts. */
int serial_new(struct vmm *vmm, uint16_t base, const char *log_path, struct serial **ret);
struct serial *serial_free(struct serial *s);
void serial_flush(struct serial *s);
int serial_set_log_path(struct serial *s, const char *log_path);
int serial_save(struct serial *s, void *buf, size_t cap, size_t *ret_len);
int serial_restore(struct serial *s, const void *buf, size_t len);
