/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* A small string-keyed hash map. Keys are borrowed: each key must stay valid
 * (usually it is a field of the value) for as long as its entry exists.
 * Not thread-safe: the daemon uses it from the event loop thread only. */

#include <stdbool.h>

typedef struct Hashmap Hashmap;

int hashmap_new(Hashmap **ret);
/* Frees the map, not the values. Accepts NULL, returns NULL. */
Hashmap *hashmap_free(Hashmap *h);

/* -EEXIST if the key is present, -ENOMEM. */
int hashmap_put(Hashmap *h, const char *key, void *value);
void *hashmap_get(const Hashmap *h, const char *key);
/* Returns the removed value or NULL. */
void *hashmap_remove(Hashmap *h, const char *key);
unsigned hashmap_size(const Hashmap *h);
/* Any one value, or NULL if empty (for draining a map). */
void *hashmap_first(const Hashmap *h);

/* Iteration; the map must not change meanwhile:
 *     HashmapIter it = {};
 *     while (hashmap_iterate(h, &it, &v)) ...  */
typedef struct HashmapIter {
        unsigned bucket;
        void *entry;
} HashmapIter;
bool hashmap_iterate(const Hashmap *h, HashmapIter *it, void **ret_value);
