/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Paused sandboxes, the record: see paused.h. */
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "forkd-bus.h"
#include "fs-util.h"
#include "hashmap.h"
#include "image.h"
#include "json-util.h"
#include "macro.h"
#include "paused.h"
#include "sandbox.h"
#include "snapshot-meta.h"

/* A record is a few hundred bytes; anything larger is not one of ours. */
#define RECORD_MAX 4096

bool snapshot_tag_is_forkds(const char *tag) {
        return tag && strncmp(tag, PAUSED_TAG_PREFIX, strlen(PAUSED_TAG_PREFIX)) == 0;
}

static bool endswith(const char *s, const char *suffix) {
        size_t n = strlen(s), k = strlen(suffix);

        return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int paused_dir(Manager *m, char **ret) {
        return asprintf(ret, "%s/" PAUSED_DIR, m->state_dir) < 0 ? -ENOMEM : 0;
}

Paused *paused_free(Paused *p) {
        if (!p)
                return NULL;
        if (p->id && hashmap_get(p->manager->paused, p->id) == p)
                hashmap_remove(p->manager->paused, p->id);
        p->deadline_source = sd_event_source_disable_unref(p->deadline_source);
        free(p->id);
        free(p->tag);
        free(p->origin_tag);
        free(p);
        return NULL;
}

/* ---- the record ---- */

static int record_format(const Paused *p, char **ret) {
        _cleanup_json_ struct json_object *o = json_object_new_object();
        char *s;

        if (!o)
                return -ENOMEM;
        json_object_object_add(o, "id", json_object_new_string(p->id));
        json_object_object_add(o, "tag", json_object_new_string(p->tag));
        json_object_object_add(o, "origin_tag", json_object_new_string(p->origin_tag));
        json_object_object_add(o, "owner_uid", json_object_new_int64(p->owner_uid));
        json_object_object_add(o, "created_at", json_object_new_int64((int64_t) p->created_at));
        json_object_object_add(o, "paused_at", json_object_new_int64((int64_t) p->paused_at));
        json_object_object_add(o, "memory_limit_mib", json_object_new_int64(p->memory_limit_mib));
        if (p->limits.cpu_limit > 0)
                json_object_object_add(o, "cpu_limit", json_object_new_double(p->limits.cpu_limit));
        if (rate_limit_is_set(&p->limits.disk_rate))
                json_object_object_add(o, "disk_rate", rate_limit_to_json(&p->limits.disk_rate));
        if (rate_limit_is_set(&p->limits.net_rate))
                json_object_object_add(o, "net_rate", rate_limit_to_json(&p->limits.net_rate));
        if (p->net_policy >= 0)
                json_object_object_add(o, "network",
                                       json_object_new_string(netns_policy_to_string((NetnsPolicy) p->net_policy)));
        if (p->expires_at > 0) {
                json_object_object_add(o, "expires_at_usec", json_object_new_int64((int64_t) p->expires_at));
                json_object_object_add(o, "on_timeout",
                                       json_object_new_string(p->timeout_pause ? ON_TIMEOUT_PAUSE : ON_TIMEOUT_KILL));
        }
        s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
        if (!s)
                return -ENOMEM;
        *ret = s;
        return 0;
}

static const char *get_string(struct json_object *o, const char *key) {
        struct json_object *v;

        return json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_string) ?
                       json_object_get_string(v) :
                       NULL;
}

static bool get_uint(struct json_object *o, const char *key, uint64_t max, uint64_t *ret) {
        struct json_object *v;
        int64_t x;

        if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_int))
                return false;
        x = json_object_get_int64(v);
        if (x < 0 || (uint64_t) x > max)
                return false;
        *ret = (uint64_t) x;
        return true;
}

/* cpu_limit, disk_rate, net_rate: each optional. */
static int record_parse_limits(struct json_object *o, struct sandbox_limits *ret) {
        char err[FORK_OPTION_ERROR_MAX];
        struct json_object *v;
        int r;

        if (json_object_object_get_ex(o, "cpu_limit", &v)) {
                if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
                        return -EINVAL;
                ret->cpu_limit = json_object_get_double(v);
                if (fork_option_check_cpu_limit_any(ret->cpu_limit, err) < 0)
                        return -EINVAL;
        }
        if (json_object_object_get_ex(o, "disk_rate", &v)) {
                r = rate_limit_from_json(v, "disk_rate", &ret->disk_rate, err);
                if (r < 0)
                        return r;
        }
        if (json_object_object_get_ex(o, "net_rate", &v)) {
                r = rate_limit_from_json(v, "net_rate", &ret->net_rate, err);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* The record in text, for the file called name ("<id>.json"): checked field
 * by field; *ret_why says what is wrong with a refused one. */
static int record_parse(Manager *m, const char *name, const char *text, size_t len, Paused **ret,
                        const char **ret_why) {
        _cleanup_json_ struct json_object *o = NULL;
        const char *id, *tag, *origin, *net, *on_timeout, *perr = NULL;
        uint64_t owner, created, paused, mem, expires = 0;
        struct sandbox_limits limits = {};
        size_t idlen;
        Paused *p;

        if (json_parse_strict(text, len, RECORD_MAX, 3, &o, &perr) < 0) {
                *ret_why = "not a JSON object";
                return -EBADMSG;
        }
        id = get_string(o, "id");
        tag = get_string(o, "tag");
        origin = get_string(o, "origin_tag");
        net = get_string(o, "network");
        on_timeout = get_string(o, "on_timeout");
        idlen = id ? strlen(id) : 0;
        if (!id || !snapshot_tag_is_valid(id) || snapshot_tag_is_forkds(id) || strncmp(name, id, idlen) != 0 ||
            strcmp(name + idlen, ".json") != 0)
                *ret_why = "its id is missing, invalid, or not its file's name";
        else if (!tag || !snapshot_tag_is_valid(tag) || !snapshot_tag_is_forkds(tag) ||
                 strncmp(tag + strlen(PAUSED_TAG_PREFIX), id, idlen) != 0 || tag[strlen(PAUSED_TAG_PREFIX) + idlen] != '.')
                *ret_why = "its snapshot tag is not paused.<id>.*";
        else if (!origin || !snapshot_tag_is_valid(origin))
                *ret_why = "its origin_tag is missing or invalid";
        else if (!get_uint(o, "owner_uid", UINT32_MAX - 1, &owner) || !get_uint(o, "created_at", INT64_MAX, &created) ||
                 !get_uint(o, "paused_at", INT64_MAX, &paused) ||
                 !get_uint(o, "memory_limit_mib", MEMORY_LIMIT_MIB_MAX, &mem))
                *ret_why = "owner_uid, created_at, paused_at or memory_limit_mib is missing or out of range";
        else if (net && netns_policy_from_string(net) < 0)
                *ret_why = "its network policy is unknown";
        else if (record_parse_limits(o, &limits) < 0)
                *ret_why = "its cpu_limit, disk_rate or net_rate is malformed";
        else if (json_object_object_get_ex(o, "expires_at_usec", NULL) &&
                 (!get_uint(o, "expires_at_usec", INT64_MAX, &expires) || expires == 0 || !on_timeout ||
                  (strcmp(on_timeout, ON_TIMEOUT_KILL) != 0 && strcmp(on_timeout, ON_TIMEOUT_PAUSE) != 0)))
                *ret_why = "its deadline (expires_at_usec, on_timeout) is malformed";
        else
                *ret_why = NULL;
        if (*ret_why)
                return -EBADMSG;

        p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        p->manager = m;
        p->id = strdup(id);
        p->tag = strdup(tag);
        p->origin_tag = strdup(origin);
        p->owner_uid = (uid_t) owner;
        p->created_at = created;
        p->paused_at = paused;
        p->memory_limit_mib = (uint32_t) mem;
        p->limits = limits;
        p->net_policy = net ? (int) netns_policy_from_string(net) : -1;
        p->expires_at = expires;
        p->timeout_pause = expires > 0 && strcmp(on_timeout, ON_TIMEOUT_PAUSE) == 0;
        if (!p->id || !p->tag || !p->origin_tag) {
                paused_free(p);
                return -ENOMEM;
        }
        *ret = p;
        return 0;
}

int paused_record_write(Paused *p) {
        _cleanup_free_ char *dir = NULL, *json = NULL, *name = NULL;
        int r;

        r = paused_dir(p->manager, &dir);
        if (r < 0)
                return r;
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                return -errno;
        r = record_format(p, &json);
        if (r < 0)
                return r;
        if (asprintf(&name, "%s.json", p->id) < 0)
                return -ENOMEM;
        /* Synced: the record is what says, after any crash, that the sandbox is paused. */
        return write_file_atomic(dir, name, json, strlen(json), WRITE_SYNC_DATA | WRITE_SYNC_DIR);
}

/* sync: the directory too. A resume does without: the removal of its record
 * that a power cut undoes brings the sandbox back paused, with the state it was
 * paused with, after a crash in which its VM died anyway; the 1-9 ms of the
 * directory's fsync would delay every resume's reply. */
int paused_record_remove(Manager *m, const char *id, bool sync) {
        _cleanup_free_ char *dir = NULL, *path = NULL;

        if (paused_dir(m, &dir) < 0 || asprintf(&path, "%s/%s.json", dir, id) < 0)
                return -ENOMEM;
        if (unlink(path) < 0 && errno != ENOENT)
                return -errno;
        if (sync)
                (void) fsync_path(dir);
        return 0;
}

/* ---- deadlines ---- */

static int paused_delete(Paused *p, const char *reason);

static int on_paused_deadline(sd_event_source *es, uint64_t usec, void *userdata) {
        Paused *p = userdata;
        int r;

        p->deadline_source = sd_event_source_disable_unref(p->deadline_source);
        if (p->timeout_pause || p->resuming)
                return 0; /* paused already; a resume carries the deadline on */
        log_info("Paused sandbox %s reached its deadline: deleting it.", p->id);
        r = paused_delete(p, "timeout");
        if (r < 0)
                log_warning_errno(r, "Failed to delete the paused sandbox %s: %m", p->id);
        return 0;
}

int paused_arm(Paused *p) {
        int r;

        p->deadline_source = sd_event_source_disable_unref(p->deadline_source);
        if (p->expires_at == 0 || p->timeout_pause)
                return 0;
        /* A deadline that passed while forkd was down fires at once. */
        r = sd_event_add_time(p->manager->event, &p->deadline_source, CLOCK_REALTIME, p->expires_at, 100 * 1000,
                              on_paused_deadline, p);
        if (r >= 0)
                (void) sd_event_source_set_description(p->deadline_source, "paused-deadline");
        return r;
}

int paused_set_deadline(Paused *p, uint64_t expires_at, bool pause) {
        uint64_t old = p->expires_at;
        bool old_pause = p->timeout_pause;
        int r;

        p->expires_at = expires_at;
        p->timeout_pause = pause;
        r = paused_record_write(p);
        if (r < 0) {
                p->expires_at = old;
                p->timeout_pause = old_pause;
                return r;
        }
        return paused_arm(p);
}

/* ---- forkd's snapshots ---- */

static bool snapshot_needed(Manager *m, const char *tag) {
        _cleanup_(strv_freep) char **deps = NULL;
        HashmapIter it = {};
        Image *i = hashmap_get(m->images, tag);
        void *v;

        if (!i || i->n_users > 0)
                return true;
        while (hashmap_iterate(m->paused, &it, &v))
                if (strcmp(((Paused *) v)->tag, tag) == 0)
                        return true;
        it = (HashmapIter) {};
        while (hashmap_iterate(m->vms, &it, &v))
                if (strcmp(((Sandbox *) v)->snapshot_tag, tag) == 0)
                        return true;
        return image_dependents(m, tag, &deps) != 0; /* an error keeps it too */
}

void paused_snapshot_gc(Manager *m, const char *tag) {
        char parent[SNAPSHOT_TAG_MAX + 1], current[SNAPSHOT_TAG_MAX + 1];

        if (!snapshot_tag_is_forkds(tag) || m->freeing)
                return;
        snprintf(current, sizeof(current), "%s", tag);
        for (unsigned depth = 0; depth < 64 && snapshot_tag_is_forkds(current); depth++) {
                Image *i = hashmap_get(m->images, current);
                int r;

                if (!i || snapshot_needed(m, current))
                        return;
                snprintf(parent, sizeof(parent), "%s", i->meta.parent_tag);
                r = image_delete(i);
                if (r < 0) {
                        log_warning_errno(r, "Failed to remove forkd's snapshot %s: %m", current);
                        return;
                }
                log_info("Removed forkd's snapshot %s: nothing needs it any more.", current);
                memcpy(current, parent, sizeof(current));
        }
}

int paused_load_all(Manager *m) {
        _cleanup_free_ char *dir = NULL;
        _cleanup_(strv_freep) char **forkds = NULL;
        HashmapIter it = {};
        size_t n_forkds = 0;
        struct dirent *de;
        unsigned loaded = 0;
        DIR *d;
        void *v;
        int r;

        r = paused_dir(m, &dir);
        if (r < 0)
                return r;
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                return -errno;
        d = opendir(dir);
        if (!d)
                return -errno;
        while ((de = readdir(d))) {
                _cleanup_free_ char *path = NULL, *text = NULL;
                const char *why = NULL;
                Paused *p = NULL;
                size_t len = 0;

                if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                        continue;
                if (asprintf(&path, "%s/%s", dir, de->d_name) < 0) {
                        closedir(d);
                        return -ENOMEM;
                }
                if (de->d_name[0] == '.' || !endswith(de->d_name, ".json")) {
                        /* A temporary file of a write that a kill cut short (write_file_atomic()'s
                         * ".#NAME.TID"), or nothing of ours. */
                        (void) unlink(path);
                        continue;
                }
                r = read_small_file(path, RECORD_MAX, &text, &len);
                if (r >= 0)
                        r = record_parse(m, de->d_name, text, len, &p, &why);
                else
                        why = strerror(-r);
                if (r >= 0 && !hashmap_get(m->images, p->tag)) {
                        why = "its snapshot is missing";
                        r = -ENOENT;
                }
                if (r >= 0 && (hashmap_get(m->paused, p->id) || (r = hashmap_put(m->paused, p->id, p)) < 0))
                        why = "its id is taken";
                if (r >= 0 && !why && (r = paused_arm(p)) < 0)
                        why = "its deadline cannot be armed";
                if (r < 0 || why) {
                        log_warning("Dropping the paused sandbox record %s: %s.", path, why ?: strerror(-r));
                        if (p && hashmap_get(m->paused, p->id) != p)
                                paused_free(p);
                        (void) unlink(path);
                        continue;
                }
                loaded++;
        }
        closedir(d);
        if (loaded > 0)
                log_info("Loaded %u paused sandbox(es).", loaded);

        /* forkd's snapshots that no record names: a pause that a kill cut short, a resumed
         * sandbox that ended with forkd. Collected first: the removal changes the map. */
        forkds = calloc(hashmap_size(m->images) + 1, sizeof(char *));
        if (!forkds)
                return -ENOMEM;
        while (hashmap_iterate(m->images, &it, &v))
                if (snapshot_tag_is_forkds(((Image *) v)->tag)) {
                        forkds[n_forkds] = strdup(((Image *) v)->tag);
                        if (!forkds[n_forkds])
                                return -ENOMEM;
                        n_forkds++;
                }
        for (size_t k = 0; k < n_forkds; k++)
                paused_snapshot_gc(m, forkds[k]);
        return 0;
}

/* The record, then the sandbox (SandboxRemoved with reason), then forkd's snapshot if nothing else needs it. */
static int paused_delete(Paused *p, const char *reason) {
        _cleanup_free_ char *tag = NULL, *path = NULL;
        Manager *m = p->manager;
        int r;

        r = paused_record_remove(m, p->id, true);
        if (r < 0)
                return r;
        tag = strdup(p->tag);
        if (!tag)
                return -ENOMEM;
        if (m->bus && sandbox_object_path(p->id, &path) >= 0)
                (void) sd_bus_emit_signal(m->bus, FORKD_MANAGER_PATH, FORKD_BUS_NAME, "SandboxRemoved", "sos", p->id,
                                          path, reason);
        log_info("Paused sandbox %s deleted (%s).", p->id, reason);
        paused_free(p);
        paused_snapshot_gc(m, tag);
        return 0;
}

int paused_terminate(Paused *p) {
        return paused_delete(p, "terminated");
}

