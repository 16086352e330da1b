/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "file-hashes.h"
#include "json-util.h"
#include "strv.h"

bool hash_path_is_valid(const char *p) {
        size_t n = strlen(p), comp = 0;

        if (n == 0 || n > HASH_PATH_MAX || p[0] != '/' || !utf8_is_valid_n(p, n))
                return false;
        if (n == 1)
                return true;
        for (size_t k = 1; k <= n; k++) {
                if (k == n || p[k] == '/') {
                        size_t len = k - comp - 1;

                        if (len == 0 || (len == 1 && p[comp + 1] == '.') ||
                            (len == 2 && p[comp + 1] == '.' && p[comp + 2] == '.'))
                                return false;
                        comp = k;
                        continue;
                }
                if ((unsigned char) p[k] < 0x20 || p[k] == 0x7f)
                        return false;
        }
        return true;
}

static bool is_sha256_hex(const char *s, size_t n) {
        if (n != 64)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
                        return false;
        return true;
}

int file_hashes_check(struct json_object *answer, struct json_object **ret_files, const char **ret_error) {
        struct json_object *files;
        size_t n = 0;

        if (!json_object_is_type(answer, json_type_object) || !json_object_object_get_ex(answer, "files", &files) ||
            !json_object_is_type(files, json_type_object)) {
                *ret_error = "no \"files\" object";
                return -EBADMSG;
        }
        json_object_object_foreach(files, key, v) {
                if (++n > HASH_FILES_MAX) {
                        *ret_error = "more files than the limit";
                        return -EBADMSG;
                }
                if (!hash_path_is_valid(key)) {
                        *ret_error = "a file name that is not a valid path";
                        return -EBADMSG;
                }
                if (!json_object_is_type(v, json_type_string) ||
                    !is_sha256_hex(json_object_get_string(v), (size_t) json_object_get_string_len(v))) {
                        *ret_error = "a hash that is not 64 lowercase hex digits";
                        return -EBADMSG;
                }
        }
        *ret_files = files;
        return 0;
}

static int cmp_str(const void *a, const void *b) {
        return strcmp(*(char *const *) a, *(char *const *) b);
}

static int push(char ***l, size_t *n, const char *s) {
        char **nl = realloc(*l, (*n + 1) * sizeof(char *));

        if (!nl)
                return -ENOMEM;
        *l = nl;
        nl[*n] = strdup(s);
        if (!nl[*n])
                return -ENOMEM;
        (*n)++;
        return 0;
}

int file_hashes_diff(struct json_object *a, struct json_object *b, FileDiff *ret) {
        FileDiff d = {};
        int r = 0;

        json_object_object_foreach(a, ka, va) {
                struct json_object *vb;

                if (!json_object_object_get_ex(b, ka, &vb))
                        r = push(&d.removed, &d.n_removed, ka);
                else if (strcmp(json_object_get_string(va), json_object_get_string(vb)) != 0)
                        r = push(&d.modified, &d.n_modified, ka);
                if (r < 0)
                        goto fail;
        }
        json_object_object_foreach(b, kb, vb2) {
                (void) vb2;
                if (!json_object_object_get_ex(a, kb, NULL)) {
                        r = push(&d.added, &d.n_added, kb);
                        if (r < 0)
                                goto fail;
                }
        }
        if (d.n_added > 1)
                qsort(d.added, d.n_added, sizeof(char *), cmp_str);
        if (d.n_removed > 1)
                qsort(d.removed, d.n_removed, sizeof(char *), cmp_str);
        if (d.n_modified > 1)
                qsort(d.modified, d.n_modified, sizeof(char *), cmp_str);
        *ret = d;
        return 0;
fail:
        file_diff_done(&d);
        return r;
}

void file_diff_done(FileDiff *d) {
        strv_free_n(d->added, d->n_added);
        strv_free_n(d->removed, d->n_removed);
        strv_free_n(d->modified, d->n_modified);
        *d = (FileDiff) {};
}
