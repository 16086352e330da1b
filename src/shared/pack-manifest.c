/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* manifest.json of a snapshot bundle: formatting and strict parsing (pack.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json-util.h"
#include "macro.h"
#include "pack-internal.h"

int pack_set_error(char **ret_error, int r, const char *fmt, ...) {
        va_list ap;

        if (ret_error) {
                free(*ret_error);
                *ret_error = NULL;
                va_start(ap, fmt);
                if (vasprintf(ret_error, fmt, ap) < 0)
                        *ret_error = NULL;
                va_end(ap);
        }
        return r;
}

void pack_manifest_done(struct pack_manifest *m) {
        if (!m)
                return;
        for (size_t i = 0; i < m->n_links; i++)
                free(m->links[i].files);
        free(m->links);
        m->links = NULL;
        m->n_links = 0;
}

static struct json_object *json_string_or_null(const char *s) {
        return s[0] ? json_object_new_string(s) : NULL;
}

int pack_manifest_format(const struct pack_manifest *m, char **ret_json) {
        _cleanup_json_ struct json_object *o = json_object_new_object(), *chain = json_object_new_array();
        char *s;

        if (!o || !chain)
                return -ENOMEM;
        for (size_t i = 0; i < m->n_links; i++) {
                const struct pack_link *l = &m->links[i];
                struct json_object *lo = json_object_new_object(), *files = json_object_new_array();

                if (!lo || !files || json_object_array_add(chain, lo) < 0) {
                        json_object_put(lo);
                        json_object_put(files);
                        return -ENOMEM;
                }
                json_object_object_add(lo, "tag", json_object_new_string(l->tag));
                json_object_object_add(lo, "parent_tag", json_string_or_null(l->parent_tag));
                json_object_object_add(lo, "parent_content_hash", json_string_or_null(l->parent_content_hash));
                json_object_object_add(lo, "files", files);
                for (size_t j = 0; j < l->n_files; j++) {
                        struct json_object *fo = json_object_new_object();

                        if (!fo || json_object_array_add(files, fo) < 0) {
                                json_object_put(fo);
                                return -ENOMEM;
                        }
                        json_object_object_add(fo, "name", json_object_new_string(l->files[j].name));
                        json_object_object_add(fo, "size", json_object_new_uint64(l->files[j].size));
                        json_object_object_add(fo, "sha256", json_object_new_string(l->files[j].sha256));
                }
        }
        json_object_object_add(o, "version", json_object_new_int(PACK_MANIFEST_VERSION));
        json_object_object_add(o, "chain", json_object_get(chain));
        s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
                                                             JSON_C_TO_STRING_NOSLASHESCAPE));
        if (!s)
                return -ENOMEM;
        *ret_json = s;
        return 0;
}

/* ---- manifest parsing ---- */

static int parse_tag_or_null(struct json_object *v, void *field, const char **ret_error) {
        char *buf = field;

        if (!v) {
                buf[0] = 0;
                return 0;
        }
        return json_string_to_buf(v, buf, SNAPSHOT_TAG_MAX + 1, ret_error);
}

static int parse_hash_or_null(struct json_object *v, void *field, const char **ret_error) {
        char *buf = field;

        if (!v) {
                buf[0] = 0;
                return 0;
        }
        return json_string_to_buf(v, buf, SNAPSHOT_HASH_LEN + 1, ret_error);
}

struct link_json {
        struct pack_link l;
        struct json_object *files;
};

static const struct json_dispatch link_table[] = {
        { "tag", JSON_KIND_STRING, NULL, offsetof(struct link_json, l.tag), SNAPSHOT_TAG_MAX + 1, JSON_MANDATORY },
        { "parent_tag", JSON_KIND_STRING, parse_tag_or_null, offsetof(struct link_json, l.parent_tag), 0,
          JSON_MANDATORY | JSON_NULLABLE },
        { "parent_content_hash", JSON_KIND_STRING, parse_hash_or_null,
          offsetof(struct link_json, l.parent_content_hash), 0, JSON_MANDATORY | JSON_NULLABLE },
        { "files", JSON_KIND_ARRAY, NULL, offsetof(struct link_json, files), 0, JSON_MANDATORY },
        {}
};

static const struct json_dispatch file_table[] = {
        { "name", JSON_KIND_STRING, NULL, offsetof(struct pack_file, name), SNAPSHOT_FILE_NAME_MAX + 1,
          JSON_MANDATORY },
        { "size", JSON_KIND_UINT64, NULL, offsetof(struct pack_file, size), 0, JSON_MANDATORY },
        { "sha256", JSON_KIND_STRING, NULL, offsetof(struct pack_file, sha256), SNAPSHOT_HASH_LEN + 1,
          JSON_MANDATORY },
        {}
};

struct manifest_json {
        int version;
        struct json_object *chain;
};

static const struct json_dispatch manifest_table[] = {
        { "version", JSON_KIND_INT, NULL, offsetof(struct manifest_json, version), 0, JSON_MANDATORY },
        { "chain", JSON_KIND_ARRAY, NULL, offsetof(struct manifest_json, chain), 0, JSON_MANDATORY },
        {}
};

const struct pack_file *pack_link_find_file(const struct pack_link *l, const char *name) {
        for (size_t i = 0; i < l->n_files; i++)
                if (strcmp(l->files[i].name, name) == 0)
                        return &l->files[i];
        return NULL;
}

static int parse_link(struct json_object *lo, size_t index, const struct pack_manifest *m, struct pack_link *ret,
                      uint64_t *total, char **ret_error) {
        struct link_json lj = {};
        const char *field = NULL, *why = NULL;
        size_t n;
        int r;

        r = json_dispatch_full(lo, link_table, JSON_REJECT_UNKNOWN, &lj, &field, &why);
        if (r < 0)
                return pack_set_error(ret_error, -EBADMSG, "manifest.json: chain[%zu]: %s%s%s.", index, field ?: "",
                               field ? ": " : "", why ?: "invalid");
        if (!snapshot_tag_is_valid(lj.l.tag))
                return pack_set_error(ret_error, -EBADMSG, "manifest.json: chain[%zu]: invalid tag.", index);
        if (lj.l.parent_tag[0] && !snapshot_tag_is_valid(lj.l.parent_tag))
                return pack_set_error(ret_error, -EBADMSG, "manifest.json: link %s: invalid parent_tag.", lj.l.tag);
        if (lj.l.parent_content_hash[0] && !snapshot_content_hash_is_valid(lj.l.parent_content_hash))
                return pack_set_error(ret_error, -EBADMSG, "manifest.json: link %s: invalid parent_content_hash.", lj.l.tag);
        if (!lj.l.parent_tag[0] != !lj.l.parent_content_hash[0])
                return pack_set_error(ret_error, -EBADMSG,
                               "manifest.json: link %s: parent_tag and parent_content_hash go together.", lj.l.tag);
        if (index == 0 && lj.l.parent_tag[0])
                return pack_set_error(ret_error, -EBADMSG,
                               "manifest.json: the root link %s has a parent (%s) that the bundle lacks.", lj.l.tag,
                               lj.l.parent_tag);
        if (index > 0 && strcmp(lj.l.parent_tag, m->links[index - 1].tag) != 0)
                return pack_set_error(ret_error, -EBADMSG,
                               "manifest.json: link %s: its parent is %s, not the link before it (%s).", lj.l.tag,
                               lj.l.parent_tag[0] ? lj.l.parent_tag : "none", m->links[index - 1].tag);
        for (size_t i = 0; i < index; i++)
                if (strcmp(m->links[i].tag, lj.l.tag) == 0)
                        return pack_set_error(ret_error, -EBADMSG, "manifest.json: tag %s appears twice.", lj.l.tag);

        n = json_object_array_length(lj.files);
        if (n == 0 || n > PACK_FILES_MAX)
                return pack_set_error(ret_error, -EBADMSG, "manifest.json: link %s: 1 to %u files.", lj.l.tag,
                               PACK_FILES_MAX);
        lj.l.files = calloc(n, sizeof(struct pack_file));
        if (!lj.l.files)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct pack_file f = {};

                field = why = NULL;
                r = json_dispatch_full(json_object_array_get_idx(lj.files, i), file_table, JSON_REJECT_UNKNOWN, &f,
                                       &field, &why);
                if (r < 0)
                        r = pack_set_error(ret_error, -EBADMSG, "manifest.json: link %s: files[%zu]: %s%s%s.", lj.l.tag, i,
                                    field ?: "", field ? ": " : "", why ?: "invalid");
                else if (!snapshot_file_name_is_valid(f.name) || strcmp(f.name, PACK_MANIFEST_NAME) == 0)
                        r = pack_set_error(ret_error, -EBADMSG, "manifest.json: link %s: invalid file name.", lj.l.tag);
                else if (!snapshot_content_hash_is_valid(f.sha256))
                        r = pack_set_error(ret_error, -EBADMSG, "manifest.json: %s/%s: invalid sha256.", lj.l.tag, f.name);
                else if (pack_link_find_file(&lj.l, f.name))
                        r = pack_set_error(ret_error, -EBADMSG, "manifest.json: %s/%s is listed twice.", lj.l.tag, f.name);
                else if (f.size > PACK_FILE_SIZE_MAX || f.size > PACK_TOTAL_SIZE_MAX - *total)
                        r = pack_set_error(ret_error, -EBADMSG,
                                    "manifest.json: %s/%s is too large (%" PRIu64 " bytes; at most %" PRIu64
                                    " per file and %" PRIu64 " per bundle).",
                                    lj.l.tag, f.name, f.size, PACK_FILE_SIZE_MAX, PACK_TOTAL_SIZE_MAX);
                if (r < 0) {
                        free(lj.l.files);
                        return r;
                }
                *total += f.size;
                lj.l.files[lj.l.n_files++] = f;
        }
        if (!pack_link_find_file(&lj.l, "snapshot.json")) {
                free(lj.l.files);
                return pack_set_error(ret_error, -EBADMSG, "manifest.json: link %s has no snapshot.json.", lj.l.tag);
        }
        *ret = lj.l;
        return 0;
}

int pack_manifest_parse(const char *json, size_t len, struct pack_manifest *ret, char **ret_error) {
        _cleanup_(pack_manifest_donep) struct pack_manifest m = {};
        _cleanup_json_ struct json_object *o = NULL;
        struct manifest_json mj = {};
        const char *field = NULL, *why = NULL;
        uint64_t total = 0;
        size_t n;
        int r;

        r = json_parse_strict(json, len, PACK_MANIFEST_MAX, 8, &o, &why);
        if (r == -EMSGSIZE)
                return pack_set_error(ret_error, -EBADMSG, "manifest.json is larger than %u bytes.", PACK_MANIFEST_MAX);
        if (r < 0)
                return pack_set_error(ret_error, -EBADMSG, "manifest.json is not valid JSON: %s.", why ?: "?");
        r = json_dispatch_full(o, manifest_table, JSON_REJECT_UNKNOWN, &mj, &field, &why);
        if (r < 0)
                return pack_set_error(ret_error, -EBADMSG, "manifest.json: %s%s%s.", field ?: "", field ? ": " : "",
                               why ?: "invalid");
        if (mj.version != PACK_MANIFEST_VERSION)
                return pack_set_error(ret_error, -EBADMSG, "manifest.json: version %d; this forkd reads version %d.",
                               mj.version, PACK_MANIFEST_VERSION);
        n = json_object_array_length(mj.chain);
        if (n == 0 || n > PACK_LINKS_MAX)
                return pack_set_error(ret_error, -EBADMSG, "manifest.json: the chain has 1 to %u links, not %zu.",
                               PACK_LINKS_MAX, n);
        m.links = calloc(n, sizeof(struct pack_link));
        if (!m.links)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                r = parse_link(json_object_array_get_idx(mj.chain, i), i, &m, &m.links[i], &total, ret_error);
                if (r < 0)
                        return r;
                m.n_links++;
        }
        *ret = m;
        m = (struct pack_manifest) {};
        return 0;
}
