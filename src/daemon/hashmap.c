/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "hashmap.h"
#include "macro.h"

struct entry {
        const char *key;
        void *value;
        struct entry *next;
};

struct Hashmap {
        struct entry **buckets;
        unsigned n_buckets; /* a power of two */
        unsigned size;
};

static unsigned hash_string(const char *s) {
        /* FNV-1a; keys are daemon-generated ids and validated tags. */
        uint32_t h = 2166136261u;
        for (; *s; s++)
                h = (h ^ (uint8_t) *s) * 16777619u;
        return h;
}

int hashmap_new(Hashmap **ret) {
        Hashmap *h = calloc(1, sizeof(*h));

        if (!h)
                return -ENOMEM;
        h->n_buckets = 64;
        h->buckets = calloc(h->n_buckets, sizeof(*h->buckets));
        if (!h->buckets) {
                free(h);
                return -ENOMEM;
        }
        *ret = h;
        return 0;
}

Hashmap *hashmap_free(Hashmap *h) {
        if (!h)
                return NULL;
        for (unsigned i = 0; i < h->n_buckets; i++)
                for (struct entry *e = h->buckets[i], *n; e; e = n) {
                        n = e->next;
                        free(e);
                }
        free(h->buckets);
        free(h);
        return NULL;
}

static struct entry **find(const Hashmap *h, const char *key) {
        struct entry **p = &h->buckets[hash_string(key) & (h->n_buckets - 1)];

        for (; *p; p = &(*p)->next)
                if (strcmp((*p)->key, key) == 0)
                        return p;
        return p;
}

static void grow(Hashmap *h) {
        unsigned n = h->n_buckets * 2;
        struct entry **b = calloc(n, sizeof(*b));

        if (!b)
                return; /* keep going with longer chains */
        for (unsigned i = 0; i < h->n_buckets; i++)
                for (struct entry *e = h->buckets[i], *next; e; e = next) {
                        unsigned k = hash_string(e->key) & (n - 1);
                        next = e->next;
                        e->next = b[k];
                        b[k] = e;
                }
        free(h->buckets);
        h->buckets = b;
        h->n_buckets = n;
}

int hashmap_put(Hashmap *h, const char *key, void *value) {
        struct entry **p = find(h, key), *e;

        if (*p)
                return -EEXIST;
        e = malloc(sizeof(*e));
        if (!e)
                return -ENOMEM;
        *e = (struct entry) { .key = key, .value = value };
        *p = e;
        h->size++;
        if (h->size > h->n_buckets)
                grow(h);
        return 0;
}

void *hashmap_get(const Hashmap *h, const char *key) {
        struct entry **p;

        if (!h)
                return NULL;
        p = find(h, key);
        return *p ? (*p)->value : NULL;
}

void *hashmap_remove(Hashmap *h, const char *key) {
        struct entry **p, *e;
        void *v;

        if (!h)
                return NULL;
        p = find(h, key);
        e = *p;
        if (!e)
                return NULL;
        *p = e->next;
        v = e->value;
        free(e);
        h->size--;
        return v;
}

unsigned hashmap_size(const Hashmap *h) {
        return h ? h->size : 0;
}

void *hashmap_first(const Hashmap *h) {
        if (!h)
                return NULL;
        for (unsigned i = 0; i < h->n_buckets; i++)
                if (h->buckets[i])
                        return h->buckets[i]->value;
        return NULL;
}

bool hashmap_iterate(const Hashmap *h, HashmapIter *it, void **ret_value) {
        struct entry *e = it->entry;

        if (!h)
                return false;
        if (e)
                e = e->next;
        while (!e) {
                if (it->bucket >= h->n_buckets)
                        return false;
                e = h->buckets[it->bucket++];
        }
        it->entry = e;
        *ret_value = e->value;
        return true;
}
