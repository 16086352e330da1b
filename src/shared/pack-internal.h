/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Shared by pack.c (the archive) and pack-manifest.c (manifest.json). */

#include "macro.h"
#include "pack.h"

/* Replace *ret_error (if ret_error) with a formatted message; returns r. */
int pack_set_error(char **ret_error, int r, const char *fmt, ...) _printf_(3, 4);

const struct pack_file *pack_link_find_file(const struct pack_link *l, const char *name);

static inline void pack_manifest_donep(struct pack_manifest *m) {
        pack_manifest_done(m);
}
