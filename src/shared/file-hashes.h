/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Comparing two sandboxes' files (the diff verb): each guest agent answers
 * hash_files with {"files": {"<path>": "<SHA-256, 64 lowercase hex>", ...}}
 * for the regular files at or under the requested paths; the host checks
 * both answers (they come from guests: hostile) and compares them.
 */

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>

#define HASH_PATHS_MAX 64u      /* paths in one request */
#define HASH_PATH_MAX 4095u     /* bytes in a path */
#define HASH_FILES_MAX 10000u   /* files in one answer */

/* An absolute path in valid UTF-8 without control characters, empty, "."
 * or ".." components, or a trailing '/' (except "/" itself), at most
 * HASH_PATH_MAX bytes. */
bool hash_path_is_valid(const char *p);

/* Check an agent's hash_files answer; *ret_files borrows its "files" object.
 * -EBADMSG with *ret_error saying why. */
int file_hashes_check(struct json_object *answer, struct json_object **ret_files, const char **ret_error);

typedef struct FileDiff {
        char **added;    /* in b, not in a */
        char **removed;  /* in a, not in b */
        char **modified; /* in both, different hashes */
        size_t n_added, n_removed, n_modified;
} FileDiff;

/* a and b as file_hashes_check() returned them; each list sorted (strcmp). */
int file_hashes_diff(struct json_object *a, struct json_object *b, FileDiff *ret);
void file_diff_done(FileDiff *d);
