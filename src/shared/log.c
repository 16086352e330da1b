/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdarg.h>

#include "macro.h"

int log_max_level = LOG_LVL_INFO;
const char *log_prefix = NULL;

int log_internal(int level, int error, const char *file, int line, const char *fmt, ...) {
        int saved = errno;
        char msg[1024];
        va_list ap;

        if (error < 0)
                error = -error;
        if (level > log_max_level)
                return -error;

        /* %m in fmt refers to the error we were handed, not to whatever errno is now. */
        errno = error;
        va_start(ap, fmt);
        (void) vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);

        if (log_max_level >= LOG_LVL_DEBUG)
                fprintf(stderr, "%s%s%s:%d: %s\n", log_prefix ?: "", log_prefix ? ": " : "", file, line, msg);
        else
                fprintf(stderr, "%s%s%s\n", log_prefix ?: "", log_prefix ? ": " : "", msg);

        errno = saved;
        return -error;
}
