/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json-util.h"
#include "macro.h"
#include "io-util.h"
#include "snapshot-meta.h"

#define SNAPSHOT_META_MAX_DEPTH 4 /* the object, "image", its arrays; one more for a useful type error */

static void set_error(const char **ret_error, const char *e) {
        if (ret_error)
                *ret_error = e;
}

static bool char_is_tag_first(char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

bool snapshot_tag_is_valid(const char *tag) {
        size_t n;

        if (!tag || !char_is_tag_first(tag[0]))
                return false;

        for (n = 1; tag[n]; n++) {
                if (n >= SNAPSHOT_TAG_MAX)
                        return false;
                if (!char_is_tag_first(tag[n]) && tag[n] != '.' && tag[n] != '-')
                        return false;
        }

        return true;
}

bool snapshot_file_name_is_valid(const char *name) {
        size_t n;

        if (!name || !name[0])
                return false;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
                return false;

        for (n = 0; name[n]; n++) {
                unsigned char c = (unsigned char) name[n];

                if (n >= SNAPSHOT_FILE_NAME_MAX)
                        return false;
                if (c == '/' || c < 0x20 || c == 0x7f)
                        return false;
        }

        return utf8_is_valid_n(name, n);
}

bool snapshot_content_hash_is_valid(const char *hash) {
        size_t n;

        if (!hash)
                return false;

        for (n = 0; hash[n]; n++)
                if (!((hash[n] >= '0' && hash[n] <= '9') || (hash[n] >= 'a' && hash[n] <= 'f')))
                        return false;

        return n == SNAPSHOT_HASH_LEN;
}

static bool string_has_control(const char *s) {
        for (; *s; s++)
                if ((unsigned char) *s < 0x20 || *s == 0x7f)
                        return true;
        return false;
}

static bool string_fits(const char *s, size_t size) {
        return memchr(s, 0, size) != NULL;
}

static const char *const volume_modes[_SNAPSHOT_VOLUME_MODE_MAX] = {
        [SNAPSHOT_VOLUME_RO] = "ro",
        [SNAPSHOT_VOLUME_COW] = "cow",
        [SNAPSHOT_VOLUME_RW] = "rw",
};

int snapshot_volume_mode_from_string(const char *s) {
        for (int i = 0; s && i < _SNAPSHOT_VOLUME_MODE_MAX; i++)
                if (streq(s, volume_modes[i]))
                        return i;
        return -EINVAL;
}

const char *snapshot_volume_mode_to_string(enum snapshot_volume_mode m) {
        return (unsigned) m < _SNAPSHOT_VOLUME_MODE_MAX ? volume_modes[m] : NULL;
}

static bool path_is_at_or_under(const char *path, const char *prefix) {
        size_t n = strlen(prefix);

        return strncmp(path, prefix, n) == 0 && (path[n] == 0 || path[n] == '/');
}

bool snapshot_volume_guest_path_is_valid(const char *path) {
        static const char *const reserved[] = { "/proc", "/sys", "/dev", "/run", "/.forkd" };
        size_t len;

        if (!path || path[0] != '/' || path[1] == 0)
                return false;
        len = strlen(path);
        if (len >= SNAPSHOT_VOLUME_PATH_MAX || string_has_control(path) || !utf8_is_valid_n(path, len))
                return false;
        if (path[len - 1] == '/')
                return false;
        /* every component: not empty, not ".", not ".." */
        for (const char *p = path; *p; ) {
                const char *c = p + 1, *end = strchrnul(c, '/');
                size_t n = (size_t) (end - c);

                if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
                        return false;
                p = end;
        }
        for (size_t i = 0; i < ELEMENTSOF(reserved); i++)
                if (path_is_at_or_under(path, reserved[i]))
                        return false;
        return true;
}

static const char *volume_check(const struct snapshot_volume *v) {
        int mode;

        if (!string_fits(v->file, sizeof(v->file)) || !string_fits(v->guest_path, sizeof(v->guest_path)) ||
            !string_fits(v->mode, sizeof(v->mode)) || !string_fits(v->host_path, sizeof(v->host_path)))
                return "volumes: unterminated string field";
        mode = snapshot_volume_mode_from_string(v->mode);
        if (mode < 0)
                return "volumes: mode must be \"ro\", \"cow\" or \"rw\"";
        if (!snapshot_volume_guest_path_is_valid(v->guest_path))
                return "volumes: guest_path must be an absolute, normalized path, not /, at most 255 bytes, "
                       "not under /proc, /sys, /dev, /run or /.forkd";
        if (mode == SNAPSHOT_VOLUME_RW) {
                if (v->file[0])
                        return "volumes: an rw volume has no file";
                if (v->host_path[0] != '/' || string_has_control(v->host_path) ||
                    !utf8_is_valid_n(v->host_path, strlen(v->host_path)))
                        return "volumes: an rw volume needs an absolute host_path";
        } else {
                if (!snapshot_file_name_is_valid(v->file))
                        return "volumes: file is not a plain file name";
                if (v->host_path[0] || v->dev || v->ino)
                        return "volumes: host_path, dev and ino are for rw volumes";
        }
        return NULL;
}

static const char *volumes_check(const struct snapshot_meta *m) {
        if (m->n_volumes > SNAPSHOT_VOLUMES_MAX)
                return "volumes: more than 24";
        for (uint32_t i = 0; i < m->n_volumes; i++) {
                const char *e = volume_check(&m->volumes[i]);

                if (e)
                        return e;
                if (m->volumes[i].file[0] && (streq(m->volumes[i].file, m->memory_file) ||
                                              streq(m->volumes[i].file, m->vmstate_file) ||
                                              streq(m->volumes[i].file, m->disk_file)))
                        return "volumes: file names another file of the snapshot";
                for (uint32_t j = 0; j < i; j++) {
                        if (streq(m->volumes[i].guest_path, m->volumes[j].guest_path))
                                return "volumes: two volumes have the same guest_path";
                        if (m->volumes[i].file[0] && streq(m->volumes[i].file, m->volumes[j].file))
                                return "volumes: two volumes have the same file";
                }
        }
        return NULL;
}


int snapshot_meta_validate(const struct snapshot_meta *m, const char **ret_error) {
        const char *e = NULL;

        /* Strings in a struct handed to us may lack their NUL; check first. */
        if (!string_fits(m->tag, sizeof(m->tag)) ||
            !string_fits(m->memory_file, sizeof(m->memory_file)) ||
            !string_fits(m->vmstate_file, sizeof(m->vmstate_file)) ||
            !string_fits(m->disk_file, sizeof(m->disk_file)) ||
            !string_fits(m->kernel, sizeof(m->kernel)) ||
            !string_fits(m->guest, sizeof(m->guest)) ||
            !string_fits(m->parent_tag, sizeof(m->parent_tag)) ||
            !string_fits(m->parent_content_hash, sizeof(m->parent_content_hash)) ||
            !string_fits(m->branched_from, sizeof(m->branched_from)))
                e = "unterminated string field";
        else if (m->format != SNAPSHOT_META_FORMAT)
                e = "unsupported snapshot format (expected 1)";
        else if (!snapshot_tag_is_valid(m->tag))
                e = "invalid tag";
        else if (m->created_at_unix < 0)
                e = "created_at_unix is negative";
        else if (m->mem_size == 0 || m->mem_size % SNAPSHOT_MEM_ALIGN != 0)
                e = "mem_size is not a non-zero multiple of 2 MiB";
        else if (m->mem_size > SNAPSHOT_MEM_MAX)
                e = "mem_size is larger than 3 GiB";
        else if (m->vcpus < 1 || m->vcpus > SNAPSHOT_VCPUS_MAX)
                e = "vcpus must be 1..32";
        else if (!snapshot_file_name_is_valid(m->memory_file))
                e = "memory_file is not a plain file name";
        else if (!snapshot_file_name_is_valid(m->vmstate_file))
                e = "vmstate_file is not a plain file name";
        else if (!snapshot_file_name_is_valid(m->disk_file))
                e = "disk_file is not a plain file name";
        else if (m->kernel[0] == 0)
                e = "kernel is empty";
        else if (string_has_control(m->kernel) || !utf8_is_valid_n(m->kernel, strlen(m->kernel)))
                e = "kernel contains control characters or invalid UTF-8";
        else if (strcmp(m->guest, "test") != 0 && strcmp(m->guest, "linux") != 0)
                e = "guest must be \"test\" or \"linux\"";
        else if (m->parent_tag[0] && !snapshot_tag_is_valid(m->parent_tag))
                e = "parent_tag is not a valid tag";
        else if (m->parent_content_hash[0] && !snapshot_content_hash_is_valid(m->parent_content_hash))
                e = "parent_content_hash is not 64 lowercase hex digits";
        else if (m->disk_layers > SNAPSHOT_DISK_LAYERS_MAX)
                e = "disk_layers is larger than 256";
        else if (m->branched_from[0] && !snapshot_tag_is_valid(m->branched_from))
                e = "branched_from is not a valid sandbox id";
        else if (!m->branched_from[0] && m->pause_us > 0)
                e = "pause_us without branched_from";
        else if (m->pause_us > SNAPSHOT_PAUSE_US_MAX)
                e = "pause_us is longer than an hour";
        else if (m->owner_uid == UINT32_MAX)
                e = "owner_uid is not a valid uid";
        else if (m->agent_tcp && !m->network)
                e = "agent_tcp without network";
        else
                e = volumes_check(m);

        if (e) {
                set_error(ret_error, e);
                return -EINVAL;
        }
        return 0;
}

#define IMAGE_CONFIG_ARRAY_MAX 256u
#define IMAGE_CONFIG_STRING_MAX 4096u

static bool image_config_strings_are_valid(struct json_object *a, bool env) {
        size_t n;

        if (!json_object_is_type(a, json_type_array))
                return false;
        n = json_object_array_length(a);
        if (n > IMAGE_CONFIG_ARRAY_MAX)
                return false;
        for (size_t k = 0; k < n; k++) {
                struct json_object *e = json_object_array_get_idx(a, k);
                const char *s;
                size_t len;

                if (!e || !json_object_is_type(e, json_type_string))
                        return false;
                s = json_object_get_string(e);
                len = (size_t) json_object_get_string_len(e);
                if (len > IMAGE_CONFIG_STRING_MAX || strlen(s) != len || !utf8_is_valid_n(s, len))
                        return false;
                if (env && (!strchr(s, '=') || s[0] == '='))
                        return false;
        }
        return true;
}

int snapshot_image_config_normalize(struct json_object *v, char *buf, size_t size, const char **ret_error) {
        const char *s;
        size_t n;

        if (!v || !json_object_is_type(v, json_type_object)) {
                set_error(ret_error, "image config is not an object");
                return -EINVAL;
        }
        json_object_object_foreach(v, key, val) {
                bool ok;

                if (streq(key, "env") || streq(key, "entrypoint") || streq(key, "cmd"))
                        ok = image_config_strings_are_valid(val, streq(key, "env"));
                else if (streq(key, "working_dir") || streq(key, "user")) {
                        const char *str = val && json_object_is_type(val, json_type_string) ?
                                                  json_object_get_string(val) : NULL;
                        size_t len = str ? strlen(str) : 0;

                        ok = str && len == (size_t) json_object_get_string_len(val) &&
                             len <= IMAGE_CONFIG_STRING_MAX && !string_has_control(str) && utf8_is_valid_n(str, len) &&
                             (key[0] != 'w' || len == 0 || str[0] == '/');
                } else if (streq(key, "start_cmd"))
                        ok = val && json_object_is_type(val, json_type_boolean);
                else {
                        set_error(ret_error, "image config has an unknown field");
                        return -EINVAL;
                }
                if (!ok) {
                        set_error(ret_error, "image config: env, entrypoint and cmd must be arrays of at most 256 "
                                             "strings (env NAME=VALUE), working_dir absolute, user a string, "
                                             "start_cmd a boolean");
                        return -EINVAL;
                }
        }
        s = json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        if (!s)
                return -ENOMEM;
        n = strlen(s);
        if (n >= size) {
                set_error(ret_error, "image config is larger than 16 KiB");
                return -E2BIG;
        }
        memcpy(buf, s, n + 1);
        return 0;
}

static int parse_image_config(struct json_object *v, void *field, const char **ret_error) {
        return snapshot_image_config_normalize(v, field, SNAPSHOT_IMAGE_CONFIG_MAX, ret_error);
}

#define VOL_STR_FIELD(n, f, fl) { n, JSON_KIND_STRING, NULL, offsetof(struct snapshot_volume, f), \
                                  JSON_FIELD_SIZE(struct snapshot_volume, f), fl }

static const struct json_dispatch snapshot_volume_table[] = {
        VOL_STR_FIELD("file", file, JSON_MANDATORY | JSON_NULLABLE),
        VOL_STR_FIELD("guest_path", guest_path, JSON_MANDATORY),
        VOL_STR_FIELD("mode", mode, JSON_MANDATORY),
        VOL_STR_FIELD("host_path", host_path, 0),
        { "dev", JSON_KIND_UINT64, NULL, offsetof(struct snapshot_volume, dev), 0, 0 },
        { "ino", JSON_KIND_UINT64, NULL, offsetof(struct snapshot_volume, ino), 0, 0 },
        {}
};

/* field points at n_volumes; the array follows it. */
static int parse_volumes(struct json_object *v, void *field, const char **ret_error) {
        struct snapshot_meta *m = (struct snapshot_meta *) ((uint8_t *) field - offsetof(struct snapshot_meta, n_volumes));
        size_t n = json_object_array_length(v);

        if (n == 0 || n > SNAPSHOT_VOLUMES_MAX) {
                set_error(ret_error, "volumes must have 1 to 24 entries");
                return -EINVAL;
        }
        for (size_t i = 0; i < n; i++) {
                struct json_object *e = json_object_array_get_idx(v, i);
                struct snapshot_volume *vol = &m->volumes[i];
                const char *f = NULL;
                struct json_object *x;
                bool rw;
                int r;

                memset(vol, 0, sizeof(*vol));
                r = json_dispatch(e, snapshot_volume_table, JSON_REJECT_UNKNOWN, vol, &f);
                if (r < 0) {
                        set_error(ret_error, "volumes: an entry is not an object of file, guest_path, mode "
                                             "(and for rw host_path, dev, ino) of the right types");
                        return r == -EINVAL ? r : -EINVAL;
                }
                rw = streq(vol->mode, "rw");
                /* null is spelled null; rw entries carry all three of host_path, dev and ino */
                if (json_object_object_get_ex(e, "file", &x) && x &&
                    json_object_get_string_len(x) == 0) {
                        set_error(ret_error, "volumes: file is not a plain file name");
                        return -EINVAL;
                }
                if (rw != json_object_object_get_ex(e, "host_path", NULL) ||
                    rw != json_object_object_get_ex(e, "dev", NULL) ||
                    rw != json_object_object_get_ex(e, "ino", NULL)) {
                        set_error(ret_error, "volumes: host_path, dev and ino are there for rw volumes only");
                        return -EINVAL;
                }
        }
        m->n_volumes = (uint32_t) n;
        return 0;
}

#define STR_FIELD(n, f) { n, JSON_KIND_STRING, NULL, offsetof(struct snapshot_meta, f), \
                          JSON_FIELD_SIZE(struct snapshot_meta, f), JSON_MANDATORY }
#define NUM_FIELD(n, k, f) { n, k, NULL, offsetof(struct snapshot_meta, f), 0, JSON_MANDATORY }

static const struct json_dispatch snapshot_meta_table[] = {
        NUM_FIELD("format", JSON_KIND_INT, format),
        STR_FIELD("tag", tag),
        NUM_FIELD("created_at_unix", JSON_KIND_INT64, created_at_unix),
        NUM_FIELD("mem_size", JSON_KIND_UINT64, mem_size),
        NUM_FIELD("vcpus", JSON_KIND_UINT32, vcpus),
        NUM_FIELD("generation", JSON_KIND_UINT64, generation),
        STR_FIELD("memory_file", memory_file),
        STR_FIELD("vmstate_file", vmstate_file),
        STR_FIELD("disk_file", disk_file),
        NUM_FIELD("disk_size", JSON_KIND_UINT64, disk_size),
        STR_FIELD("kernel", kernel),
        STR_FIELD("guest", guest),
        { "parent_tag", JSON_KIND_STRING, NULL, offsetof(struct snapshot_meta, parent_tag),
          JSON_FIELD_SIZE(struct snapshot_meta, parent_tag), JSON_MANDATORY | JSON_NULLABLE },
        { "parent_content_hash", JSON_KIND_STRING, NULL, offsetof(struct snapshot_meta, parent_content_hash),
          JSON_FIELD_SIZE(struct snapshot_meta, parent_content_hash), JSON_MANDATORY | JSON_NULLABLE },
        { "disk_layers", JSON_KIND_UINT32, NULL, offsetof(struct snapshot_meta, disk_layers), 0, 0 },
        { "branched_from", JSON_KIND_STRING, NULL, offsetof(struct snapshot_meta, branched_from),
          JSON_FIELD_SIZE(struct snapshot_meta, branched_from), 0 },
        { "pause_us", JSON_KIND_UINT64, NULL, offsetof(struct snapshot_meta, pause_us), 0, 0 },
        { "owner_uid", JSON_KIND_UINT32, NULL, offsetof(struct snapshot_meta, owner_uid), 0, 0 },
        { "network", JSON_KIND_BOOL, NULL, offsetof(struct snapshot_meta, network), 0, 0 },
        { "agent_tcp", JSON_KIND_BOOL, NULL, offsetof(struct snapshot_meta, agent_tcp), 0, 0 },
        { "image", JSON_KIND_OBJECT, parse_image_config, offsetof(struct snapshot_meta, image_config), 0, 0 },
        { "volumes", JSON_KIND_ARRAY, parse_volumes, offsetof(struct snapshot_meta, n_volumes), 0, 0 },
        {}
};

/* ret_error must be static, so name the field through a fixed table. */
static const char *dispatch_error(const char *field, int r) {
        static const struct {
                const char *name, *missing, *invalid;
        } msgs[] = {
#define MSG(n) { #n, "snapshot.json: missing field " #n, "snapshot.json: field " #n " has the wrong type, is out of range or too long" }
                MSG(format), MSG(tag), MSG(created_at_unix), MSG(mem_size), MSG(vcpus),
                MSG(generation), MSG(memory_file), MSG(vmstate_file), MSG(disk_file),
                MSG(disk_size), MSG(kernel), MSG(guest), MSG(parent_tag), MSG(parent_content_hash),
                MSG(disk_layers), MSG(branched_from), MSG(pause_us), MSG(owner_uid), MSG(network), MSG(agent_tcp),
                MSG(image), MSG(volumes),
#undef MSG
        };

        if (r == -EADDRNOTAVAIL)
                return "snapshot.json: unknown field";

        for (size_t i = 0; field && i < ELEMENTSOF(msgs); i++)
                if (strcmp(field, msgs[i].name) == 0)
                        return r == -ENXIO ? msgs[i].missing : msgs[i].invalid;

        return "snapshot.json: invalid field";
}

/* Null is spelled null: an empty string is not a way to say "no parent". */
static bool key_is_empty_string(struct json_object *obj, const char *key) {
        struct json_object *v;

        return json_object_object_get_ex(obj, key, &v) && v &&
                json_object_is_type(v, json_type_string) && json_object_get_string_len(v) == 0;
}

int snapshot_meta_parse(const char *json, size_t len, struct snapshot_meta *ret, const char **ret_error) {
        _cleanup_json_ struct json_object *obj = NULL;
        _cleanup_free_ struct snapshot_meta *m = NULL;
        const char *field = NULL, *e = NULL;
        int r;

        if (!json && len > 0)
                return -EINVAL;

        r = json_parse_strict(json, len, SNAPSHOT_META_FILE_MAX, SNAPSHOT_META_MAX_DEPTH, &obj, &e);
        if (r < 0) {
                set_error(ret_error, e);
                return r;
        }

        m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;

        r = json_dispatch_full(obj, snapshot_meta_table, JSON_REJECT_UNKNOWN, m, &field, &e);
        if (r < 0) {
                log_debug_errno(r, "snapshot.json: field '%s': %s", field ?: "", e ?: "");
                /* the volumes parser has a precise reason of its own */
                set_error(ret_error, field && streq(field, "volumes") && e ? e : dispatch_error(field, r));
                return r;
        }

        if (key_is_empty_string(obj, "parent_tag")) {
                set_error(ret_error, "parent_tag is not a valid tag");
                return -EINVAL;
        }
        if (json_object_object_get_ex(obj, "disk_layers", NULL) && m->disk_layers == 0) {
                set_error(ret_error, "disk_layers must be absent or at least 1");
                return -EINVAL;
        }
        if (key_is_empty_string(obj, "branched_from")) {
                set_error(ret_error, "branched_from is not a valid sandbox id");
                return -EINVAL;
        }
        if (json_object_object_get_ex(obj, "pause_us", NULL) && !m->branched_from[0]) {
                set_error(ret_error, "pause_us without branched_from");
                return -EINVAL;
        }
        if (key_is_empty_string(obj, "parent_content_hash")) {
                set_error(ret_error, "parent_content_hash is not 64 lowercase hex digits");
                return -EINVAL;
        }

        r = snapshot_meta_validate(m, ret_error);
        if (r < 0)
                return r;

        *ret = *m;
        return 0;
}

static int json_add(struct json_object *o, const char *key, struct json_object *v, bool may_be_null) {
        if (!v && !may_be_null)
                return -ENOMEM;
        if (json_object_object_add(o, key, v) < 0) {
                json_object_put(v);
                return -ENOMEM;
        }
        return 0;
}

int snapshot_meta_format(const struct snapshot_meta *m, char **ret_json) {
        _cleanup_json_ struct json_object *o = NULL;
        const char *s;
        char *out;
        size_t n;
        int r;

        r = snapshot_meta_validate(m, NULL);
        if (r < 0)
                return r;

        o = json_object_new_object();
        if (!o)
                return -ENOMEM;

        /* json-c keeps insertion order, which makes the output deterministic. */
        if (json_add(o, "format", json_object_new_int(m->format), false) < 0 ||
            json_add(o, "tag", json_object_new_string(m->tag), false) < 0 ||
            json_add(o, "created_at_unix", json_object_new_int64(m->created_at_unix), false) < 0 ||
            json_add(o, "mem_size", json_object_new_uint64(m->mem_size), false) < 0 ||
            json_add(o, "vcpus", json_object_new_uint64(m->vcpus), false) < 0 ||
            json_add(o, "generation", json_object_new_uint64(m->generation), false) < 0 ||
            json_add(o, "memory_file", json_object_new_string(m->memory_file), false) < 0 ||
            json_add(o, "vmstate_file", json_object_new_string(m->vmstate_file), false) < 0 ||
            json_add(o, "disk_file", json_object_new_string(m->disk_file), false) < 0 ||
            json_add(o, "disk_size", json_object_new_uint64(m->disk_size), false) < 0 ||
            json_add(o, "kernel", json_object_new_string(m->kernel), false) < 0 ||
            json_add(o, "guest", json_object_new_string(m->guest), false) < 0 ||
            json_add(o, "parent_tag",
                     m->parent_tag[0] ? json_object_new_string(m->parent_tag) : NULL, !m->parent_tag[0]) < 0 ||
            json_add(o, "parent_content_hash",
                     m->parent_content_hash[0] ? json_object_new_string(m->parent_content_hash) : NULL,
                     !m->parent_content_hash[0]) < 0)
                return -ENOMEM;
        if (m->disk_layers > 0 && json_add(o, "disk_layers", json_object_new_uint64(m->disk_layers), false) < 0)
                return -ENOMEM;
        if (m->branched_from[0] &&
            (json_add(o, "branched_from", json_object_new_string(m->branched_from), false) < 0 ||
             json_add(o, "pause_us", json_object_new_uint64(m->pause_us), false) < 0))
                return -ENOMEM;
        if (m->owner_uid > 0 && json_add(o, "owner_uid", json_object_new_uint64(m->owner_uid), false) < 0)
                return -ENOMEM;
        /* Absent when false: snapshots without a NIC read as before, by older forkds too. */
        if (m->network && json_add(o, "network", json_object_new_boolean(true), false) < 0)
                return -ENOMEM;
        if (m->agent_tcp && json_add(o, "agent_tcp", json_object_new_boolean(true), false) < 0)
                return -ENOMEM;
        if (m->n_volumes > 0) {
                struct json_object *a = json_object_new_array();

                if (json_add(o, "volumes", a, false) < 0)
                        return -ENOMEM;
                for (uint32_t i = 0; i < m->n_volumes; i++) {
                        const struct snapshot_volume *v = &m->volumes[i];
                        struct json_object *e = json_object_new_object();
                        bool rw = streq(v->mode, "rw");

                        if (!e || json_object_array_add(a, e) < 0) {
                                json_object_put(e);
                                return -ENOMEM;
                        }
                        if (json_add(e, "file", v->file[0] ? json_object_new_string(v->file) : NULL, !v->file[0]) < 0 ||
                            json_add(e, "guest_path", json_object_new_string(v->guest_path), false) < 0 ||
                            json_add(e, "mode", json_object_new_string(v->mode), false) < 0)
                                return -ENOMEM;
                        if (rw && (json_add(e, "host_path", json_object_new_string(v->host_path), false) < 0 ||
                                   json_add(e, "dev", json_object_new_uint64(v->dev), false) < 0 ||
                                   json_add(e, "ino", json_object_new_uint64(v->ino), false) < 0))
                                return -ENOMEM;
                }
        }
        if (m->image_config[0]) {
                struct json_object *image = json_tokener_parse(m->image_config);

                if (!image || !json_object_is_type(image, json_type_object)) {
                        json_object_put(image);
                        return -EINVAL;
                }
                if (json_add(o, "image", image, false) < 0)
                        return -ENOMEM;
        }

        s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
                                              JSON_C_TO_STRING_NOSLASHESCAPE);
        if (!s)
                return -ENOMEM;

        n = strlen(s);
        out = malloc(n + 2);
        if (!out)
                return -ENOMEM;
        memcpy(out, s, n);
        out[n] = '\n';
        out[n + 1] = 0;

        *ret_json = out;
        return 0;
}

int snapshot_meta_read_file(const char *path, struct snapshot_meta *ret, const char **ret_error) {
        _cleanup_free_ char *buf = NULL;
        size_t len;
        int r;

        r = read_file_capped_at(AT_FDCWD, path, SNAPSHOT_META_FILE_MAX, &buf, &len);
        if (r == -EMSGSIZE) {
                set_error(ret_error, "snapshot.json too large");
                return r;
        }
        if (r < 0) {
                set_error(ret_error, "cannot read snapshot.json");
                return r;
        }

        return snapshot_meta_parse(buf, len, ret, ret_error);
}
