/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <sys/stat.h>

#include "console-tail.h"
#include "macro.h"

static bool line_is_blank(const char *s, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
                        return false;
        return true;
}

/* Append line [s, s+n) to out at *o, indented, sanitized and cut. */
static void append_line(char *out, size_t *o, const char *s, size_t n) {
        unsigned shown = 0;

        if (*o > 0)
                out[(*o)++] = '\n';
        out[(*o)++] = ' ';
        out[(*o)++] = ' ';
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char) s[i];

                if (c == '\r')
                        continue;
                if (shown == CONSOLE_TAIL_LINE_MAX) {
                        memcpy(out + *o, "...", 3);
                        *o += 3;
                        break;
                }
                out[(*o)++] = c == '\t' ? ' ' : c >= 0x20 && c < 0x7f ? (char) c : '?';
                shown++;
        }
}

int console_tail(const char *path, unsigned n_lines, char **ret) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        struct { size_t start, end; } lines[CONSOLE_TAIL_LINES_MAX];
        size_t len = 0, first = 0, end, k = 0, o = 0;
        struct stat st;
        off_t off;
        char *out;

        if (n_lines < 1 || n_lines > CONSOLE_TAIL_LINES_MAX)
                return -EINVAL;
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EBADF;
        buf = malloc(CONSOLE_TAIL_READ_MAX);
        if (!buf)
                return -ENOMEM;
        off = st.st_size > (off_t) CONSOLE_TAIL_READ_MAX ? st.st_size - (off_t) CONSOLE_TAIL_READ_MAX : 0;
        while (len < CONSOLE_TAIL_READ_MAX) {
                ssize_t n = pread(fd, buf + len, CONSOLE_TAIL_READ_MAX - len, off + (off_t) len);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0)
                        break;
                len += (size_t) n;
        }

        /* Reading from the middle of the file: its first line is cut, skip it. */
        if (off > 0) {
                const char *nl = memchr(buf, '\n', len);
                if (nl)
                        first = (size_t) (nl - buf) + 1;
        }

        /* Collect the last n_lines lines that are not blank, newest first. */
        end = len;
        while (k < n_lines) {
                size_t s = end;

                while (s > first && buf[s - 1] != '\n')
                        s--;
                if (!line_is_blank(buf + s, end - s)) {
                        lines[k].start = s;
                        lines[k].end = end;
                        k++;
                }
                if (s <= first)
                        break;
                end = s - 1;
        }

        out = malloc(k * (2 + CONSOLE_TAIL_LINE_MAX + 3 + 1) + 1);
        if (!out)
                return -ENOMEM;
        while (k > 0) {
                k--;
                append_line(out, &o, buf + lines[k].start, lines[k].end - lines[k].start);
        }
        out[o] = 0;
        *ret = out;
        return 0;
}
