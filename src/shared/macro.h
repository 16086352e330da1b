/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Small helpers shared by every forkd program: cleanup attributes, ownership
 * hand-off and error-returning log calls, in the style of systemd. */

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _unused_ __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _packed_ __attribute__((packed))
#define _likely_(x) __builtin_expect(!!(x), 1)
#define _unlikely_(x) __builtin_expect(!!(x), 0)

#define streq(a, b) (strcmp((a), (b)) == 0)

#define ELEMENTSOF(x) (sizeof(x) / sizeof((x)[0]))
#define ALIGN_UP(x, a) (((x) + ((a) - 1)) & ~((__typeof__(x))(a) - 1))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* Take ownership of a pointer or fd: returns the value and resets the source. */
#define TAKE_PTR(p)                        \
        ({                                 \
                __typeof__(p) _p_ = (p);   \
                (p) = NULL;                \
                _p_;                       \
        })
#define TAKE_FD(fd)                        \
        ({                                 \
                int _fd_ = (fd);           \
                (fd) = -EBADF;             \
                _fd_;                      \
        })

static inline void freep(void *p) {
        free(*(void **) p);
}
#define _cleanup_free_ _cleanup_(freep)

static inline int safe_close(int fd) {
        if (fd >= 0) {
                int saved = errno;
                (void) close(fd);
                errno = saved;
        }
        return -EBADF;
}
static inline void closep(int *fd) {
        *fd = safe_close(*fd);
}
#define _cleanup_close_ _cleanup_(closep)

static inline void fclosep(FILE **f) {
        if (*f)
                fclose(*f);
}
#define _cleanup_fclose_ _cleanup_(fclosep)

/* Logging. Library code logs at debug level only; programs set the level. */
enum { LOG_LVL_ERR = 3, LOG_LVL_WARNING = 4, LOG_LVL_INFO = 6, LOG_LVL_DEBUG = 7 };
extern int log_max_level;
extern const char *log_prefix;

int log_internal(int level, int error, const char *file, int line, const char *fmt, ...) _printf_(5, 6);

#define log_full_errno(level, error, ...) log_internal((level), (error), __FILE__, __LINE__, __VA_ARGS__)
#define log_error_errno(error, ...) log_full_errno(LOG_LVL_ERR, (error), __VA_ARGS__)
#define log_warning_errno(error, ...) log_full_errno(LOG_LVL_WARNING, (error), __VA_ARGS__)
#define log_info_errno(error, ...) log_full_errno(LOG_LVL_INFO, (error), __VA_ARGS__)
#define log_debug_errno(error, ...) log_full_errno(LOG_LVL_DEBUG, (error), __VA_ARGS__)
#define log_error(...) log_full_errno(LOG_LVL_ERR, 0, __VA_ARGS__)
#define log_warning(...) log_full_errno(LOG_LVL_WARNING, 0, __VA_ARGS__)
#define log_info(...) log_full_errno(LOG_LVL_INFO, 0, __VA_ARGS__)
#define log_debug(...) log_full_errno(LOG_LVL_DEBUG, 0, __VA_ARGS__)
#define log_oom() log_error_errno(ENOMEM, "Out of memory.")

/* Returns -errno, or -EIO if errno is unset: for wrapping libc calls. */
static inline int negative_errno(void) {
        return errno > 0 ? -errno : -EIO;
}

/* The value of one hexadecimal digit, either case, or -1. */
static inline int unhexchar(char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        return -1;
}
