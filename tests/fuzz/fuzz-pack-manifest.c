/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * manifest.json of a snapshot bundle: pack_manifest_parse() on any bytes.
 * What parses must format, and the text must parse back to the same manifest
 * and format to the same text.
 */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool manifest_equal(const struct pack_manifest *a, const struct pack_manifest *b) {
        if (a->n_links != b->n_links)
                return false;
        for (size_t i = 0; i < a->n_links; i++) {
                const struct pack_link *x = &a->links[i], *y = &b->links[i];

                if (strcmp(x->tag, y->tag) != 0 || strcmp(x->parent_tag, y->parent_tag) != 0 ||
                    strcmp(x->parent_content_hash, y->parent_content_hash) != 0 || x->n_files != y->n_files)
                        return false;
                for (size_t j = 0; j < x->n_files; j++)
                        if (strcmp(x->files[j].name, y->files[j].name) != 0 ||
                            x->files[j].size != y->files[j].size ||
                            strcmp(x->files[j].sha256, y->files[j].sha256) != 0)
                                return false;
        }
        return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        struct pack_manifest m = {}, m2 = {};
        char *err = NULL, *json = NULL, *json2 = NULL;

        if (pack_manifest_parse((const char *) data, size, &m, &err) < 0) {
                if (!err)
                        abort(); /* a refusal says why */
                free(err);
                return 0;
        }
        if (pack_manifest_format(&m, &json) < 0)
                abort();
        if (pack_manifest_parse(json, strlen(json), &m2, &err) < 0)
                abort();
        if (!manifest_equal(&m, &m2))
                abort();
        if (pack_manifest_format(&m2, &json2) < 0 || strcmp(json, json2) != 0)
                abort();
        free(json);
        free(json2);
        pack_manifest_done(&m);
        pack_manifest_done(&m2);
        return 0;
}
