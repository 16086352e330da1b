/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Aligned text tables for people. Cells are copied; a NULL or empty cell prints "-". */

#include <stddef.h>
#include <stdio.h>

struct table;

struct table *table_new(size_t n_columns, const char *const *headers);
struct table *table_free(struct table *t);
int table_add_row(struct table *t, const char *const *cells);
size_t table_rows(const struct table *t);
/* Columns separated by two spaces; the last column is not padded. */
int table_print(const struct table *t, FILE *f);

static inline void table_freep(struct table **t) {
        table_free(*t);
}
#define _cleanup_table_ __attribute__((cleanup(table_freep)))
