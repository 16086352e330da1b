/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * snapshot.json: snapshot_meta_parse() on any bytes. What parses must format,
 * and the formatted text must parse back to the same metadata and format to
 * the same text (a snapshot.json forkd writes is one it reads).
 */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "snapshot-meta.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        struct snapshot_meta m, m2;
        const char *e = NULL;
        char *json = NULL, *json2 = NULL;

        if (snapshot_meta_parse((const char *) data, size, &m, &e) < 0)
                return 0;
        /* Parsed means valid: formatting it must not fail. */
        if (snapshot_meta_format(&m, &json) < 0)
                abort();
        if (snapshot_meta_parse(json, strlen(json), &m2, &e) < 0)
                abort();
        if (memcmp(&m, &m2, sizeof(m)) != 0)
                abort();
        if (snapshot_meta_format(&m2, &json2) < 0 || strcmp(json, json2) != 0)
                abort();
        free(json);
        free(json2);
        return 0;
}
