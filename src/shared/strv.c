/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdlib.h>

#include "strv.h"

char **strv_free(char **l) {
        if (!l)
                return NULL;
        for (char **p = l; *p; p++)
                free(*p);
        free(l);
        return NULL;
}

void strv_free_n(char **l, size_t n) {
        if (!l)
                return;
        for (size_t k = 0; k < n; k++)
                free(l[k]);
        free(l);
}

size_t strv_length(char *const *l) {
        size_t n = 0;

        while (l && l[n])
                n++;
        return n;
}
