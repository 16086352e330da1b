/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* String vectors: NULL-terminated (strv_*) or counted (strv_free_n). */

#include <stddef.h>

/* Frees every string and the array; returns NULL. */
char **strv_free(char **l);
static inline void strv_freep(char ***l) {
        strv_free(*l);
}
#define _cleanup_strv_free_ __attribute__((cleanup(strv_freep)))

/* Frees the first n strings of l (NULL entries allowed) and the array. */
void strv_free_n(char **l, size_t n);

size_t strv_length(char *const *l);
