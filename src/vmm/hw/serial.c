/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * 8250/16550A UART: enough for a guest console. Transmit is always ready,
 * nothing is ever received, no interrupt is raised.
 */
#include <fcntl.h>

#include "serial.h"

#define UART_LCR_DLAB 0x80
#define UART_LSR_THRE 0x20
#define UART_LSR_TEMT 0x40
#define SERIAL_STATE_VERSION 1

struct serial {
        struct pio_dev pio;
        uint8_t dll, dlm, ier, lcr, mcr, scr, fcr;
        char *log_path;
        int log_fd;
        uint64_t logged;
        char buf[256];
        size_t buf_len;
};

void serial_flush(struct serial *s) {
        if (!s || s->buf_len == 0)
                return;
        if (s->log_fd < 0 && s->log_path)
                s->log_fd = open(s->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY, 0640);
        if (s->log_fd >= 0 && s->logged < SERIAL_LOG_MAX) {
                size_t n = MIN(s->buf_len, SERIAL_LOG_MAX - s->logged);
                ssize_t w = write(s->log_fd, s->buf, n);
                if (w > 0)
                        s->logged += w;
        }
        s->buf_len = 0;
}

static void serial_out(struct vmm *vmm, struct pio_dev *dev, uint16_t off, const void *data, uint32_t len) {
        struct serial *s = dev->priv;
        uint8_t v = *(const uint8_t *) data;

        if (len != 1)
                return;
        switch (off) {
        case 0:
                if (s->lcr & UART_LCR_DLAB) {
                        s->dll = v;
                        break;
                }
                s->buf[s->buf_len++] = (char) v;
                if (v == '\n' || s->buf_len == sizeof(s->buf))
                        serial_flush(s);
                break;
        case 1:
                if (s->lcr & UART_LCR_DLAB)
                        s->dlm = v;
                else
                        s->ier = v & 0x0f;
                break;
        case 2:
                s->fcr = v;
                break;
        case 3:
                s->lcr = v;
                break;
        case 4:
                s->mcr = v & 0x1f;
                break;
        case 7:
                s->scr = v;
                break;
        default:
                break;
        }
}

static void serial_in(struct vmm *vmm, struct pio_dev *dev, uint16_t off, void *data, uint32_t len) {
        struct serial *s = dev->priv;
        uint8_t v = 0;

        memset(data, 0, len);
        if (len != 1)
                return;
        switch (off) {
        case 0:
                v = (s->lcr & UART_LCR_DLAB) ? s->dll : 0;
                break;
        case 1:
                v = (s->lcr & UART_LCR_DLAB) ? s->dlm : s->ier;
                break;
        case 2:
                v = 0x01 | ((s->fcr & 1) ? 0xc0 : 0); /* no interrupt pending */
                break;
        case 3:
                v = s->lcr;
                break;
        case 4:
                v = s->mcr;
                break;
        case 5:
                v = UART_LSR_THRE | UART_LSR_TEMT;
                break;
        case 6:
                v = 0xb0; /* DCD, DSR, CTS */
                break;
        case 7:
                v = s->scr;
                break;
        }
        *(uint8_t *) data = v;
}

int serial_set_log_path(struct serial *s, const char *log_path) {
        char *p = NULL;

        if (log_path) {
                p = strdup(log_path);
                if (!p)
                        return -ENOMEM;
        }
        serial_flush(s);
        free(s->log_path);
        s->log_path = p;
        s->log_fd = safe_close(s->log_fd);
        s->logged = 0;
        return 0;
}

int serial_new(struct vmm *vmm, uint16_t base, const char *log_path, struct serial **ret) {
        struct serial *s;
        int r;

        s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        s->log_fd = -EBADF;
        s->lcr = 0x03;
        s->pio = (struct pio_dev) { .base = base, .len = 8, .priv = s, .read = serial_in, .write = serial_out };

        r = serial_set_log_path(s, log_path);
        if (r >= 0)
                r = vmm_register_pio(vmm, &s->pio);
        if (r < 0) {
                serial_free(s);
                return r;
        }
        *ret = s;
        return 0;
}

struct serial *serial_free(struct serial *s) {
        if (!s)
                return NULL;
        serial_flush(s);
        safe_close(s->log_fd);
        free(s->log_path);
        free(s);
        return NULL;
}

int serial_save(struct serial *s, void *buf, size_t cap, size_t *ret_len) {
        uint8_t *b = buf;

        if (cap < 8)
                return -ENOBUFS;
        b[0] = SERIAL_STATE_VERSION;
        b[1] = s->dll;
        b[2] = s->dlm;
        b[3] = s->ier;
        b[4] = s->lcr;
        b[5] = s->mcr;
        b[6] = s->scr;
        b[7] = s->fcr;
        *ret_len = 8;
        return 0;
}

int serial_restore(struct serial *s, const void *buf, size_t len) {
        const uint8_t *b = buf;

        if (len != 8 || b[0] != SERIAL_STATE_VERSION || (b[3] & 0xf0) || (b[5] & 0xe0))
                return -EBADMSG;
        s->dll = b[1];
        s->dlm = b[2];
        s->ier = b[3];
        s->lcr = b[4];
        s->mcr = b[5];
        s->scr = b[6];
        s->fcr = b[7];
        return 0;
}
