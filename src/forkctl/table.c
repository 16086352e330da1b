/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "table.h"

#define TABLE_ROWS_MAX 1000000U

struct table {
        size_t n_columns, n_rows, n_allocated;
        char **cells; /* (n_rows + 1) * n_columns; row 0 holds the headers */
};

static char *cell_dup(const char *s) {
        return strdup(s && *s ? s : "-");
}

struct table *table_free(struct table *t) {
        if (!t)
                return NULL;
        for (size_t i = 0; i < (t->n_rows + 1) * t->n_columns; i++)
                free(t->cells[i]);
        free(t->cells);
        free(t);
        return NULL;
}

static int table_append(struct table *t, const char *const *cells) {
        size_t need = (t->n_rows + 2) * t->n_columns;

        if (t->n_rows >= TABLE_ROWS_MAX)
                return -E2BIG;
        if (need > t->n_allocated) {
                size_t n = MAX(need, t->n_allocated * 2);
                char **c = realloc(t->cells, n * sizeof(char *));
                if (!c)
                        return -ENOMEM;
                t->cells = c;
                t->n_allocated = n;
        }
        return 0;
}

struct table *table_new(size_t n_columns, const char *const *headers) {
        struct table *t;

        if (n_columns == 0)
                return NULL;
        t = calloc(1, sizeof(*t));
        if (!t)
                return NULL;
        t->n_columns = n_columns;
        t->cells = calloc(n_columns, sizeof(char *));
        if (!t->cells) {
                free(t);
                return NULL;
        }
        t->n_allocated = n_columns;
        for (size_t i = 0; i < n_columns; i++) {
                t->cells[i] = cell_dup(headers[i]);
                if (!t->cells[i]) {
                        t->n_rows = 0;
                        return table_free(t);
                }
        }
        return t;
}

int table_add_row(struct table *t, const char *const *cells) {
        size_t base;
        int r;

        if (!t || !cells)
                return -EINVAL;
        r = table_append(t, cells);
        if (r < 0)
                return r;

        base = (t->n_rows + 1) * t->n_columns;
        for (size_t i = 0; i < t->n_columns; i++) {
                t->cells[base + i] = cell_dup(cells[i]);
                if (!t->cells[base + i]) {
                        for (size_t k = 0; k < i; k++)
                                free(t->cells[base + k]);
                        return -ENOMEM;
                }
        }
        t->n_rows++;
        return 0;
}

size_t table_rows(const struct table *t) {
        return t ? t->n_rows : 0;
}

/* Display width: count UTF-8 lead bytes, so multibyte tags line up. */
static size_t width(const char *s) {
        size_t w = 0;
        for (; *s; s++)
                if (((unsigned char) *s & 0xC0) != 0x80)
                        w++;
        return w;
}

int table_print(const struct table *t, FILE *f) {
        _cleanup_free_ size_t *widths = NULL;

        if (!t)
                return -EINVAL;
        widths = calloc(t->n_columns, sizeof(size_t));
        if (!widths)
                return -ENOMEM;

        for (size_t row = 0; row <= t->n_rows; row++)
                for (size_t c = 0; c < t->n_columns; c++)
                        widths[c] = MAX(widths[c], width(t->cells[row * t->n_columns + c]));

        for (size_t row = 0; row <= t->n_rows; row++) {
                for (size_t c = 0; c < t->n_columns; c++) {
                        const char *s = t->cells[row * t->n_columns + c];
                        bool last = c + 1 == t->n_columns;

                        fputs(s, f);
                        if (!last)
                                fprintf(f, "%*s", (int) (widths[c] - width(s) + 2), "");
                }
                fputc('\n', f);
        }
        return ferror(f) ? -EIO : 0;
}
