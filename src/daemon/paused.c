/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Paused sandboxes: see paused.h. */
#include <dirent.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "branch.h"
#include "cgroup.h"
#include "chain.h"
#include "forkd-bus.h"
#include "fork-op.h"
#include "fs-util.h"
#include "hashmap.h"
#include "image.h"
#include "json-util.h"
#include "manager-dbus.h"
#include "macro.h"
#include "operation.h"
#include "paused.h"
#include "polkit.h"
#include "sandbox-dbus.h"
#include "sandbox.h"
#include "snapshot-meta.h"
#include "vm-template.h"
#include "vmm-client.h"

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

/* The record in text, for the file called name ("<id>.json"): checked field
 * by field; *ret_why says what is wrong with a refused one. */
static int record_parse(Manager *m, const char *name, const char *text, size_t len, Paused **ret,
                        const char **ret_why) {
        _cleanup_json_ struct json_object *o = NULL;
        const char *id, *tag, *origin, *net, *on_timeout, *perr = NULL;
        uint64_t owner, created, paused, mem, expires = 0;
        size_t idlen;
        Paused *p;

        if (json_parse_strict(text, len, RECORD_MAX, 2, &o, &perr) < 0) {
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

static int record_write(Paused *p) {
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
static int record_remove(Manager *m, const char *id, bool sync) {
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

static int paused_arm(Paused *p) {
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
        r = record_write(p);
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

/* ---- D-Bus ---- */

int paused_append_info(sd_bus_message *reply, Paused *p) {
        int r;

        r = sd_bus_message_open_container(reply, 'a', "{sv}");
        if (r < 0)
                return r;
        r = sd_bus_message_append(reply, "{sv}{sv}{sv}{sv}{sv}{sv}{sv}{sv}{sv}",
                                  "id", "s", p->id,
                                  "owner_uid", "u", (uint32_t) p->owner_uid,
                                  "snapshot_tag", "s", p->origin_tag,
                                  "guest_addr", "s", "",
                                  "created_at_unix", "t", p->created_at,
                                  "paused_at_unix", "t", p->paused_at,
                                  "pid", "u", (uint32_t) 0,
                                  "state", "s", "paused",
                                  "status", "s", "paused");
        if (r >= 0 && p->memory_limit_mib > 0)
                r = sd_bus_message_append(reply, "{sv}", "memory_limit_mib", "u", p->memory_limit_mib);
        if (r >= 0 && p->net_policy >= 0)
                r = sd_bus_message_append(reply, "{sv}", "network", "s",
                                          netns_policy_to_string((NetnsPolicy) p->net_policy));
        if (r >= 0)
                r = sandbox_append_deadline(reply, p->expires_at, p->timeout_pause);
        if (r >= 0 && p->pause_us > 0)
                r = sd_bus_message_append(reply, "{sv}{sv}", "pause_us", "t", p->pause_us, "pause_ms", "t",
                                          (p->pause_us + 500) / 1000);
        if (r < 0)
                return r;
        return sd_bus_message_close_container(reply);
}

int paused_verify(sd_bus_message *message, Paused *p, const char *action, const char *verb, sd_bus_error *error) {
        const char *details[] = { "sandbox", p->id, "snapshot", p->origin_tag, "verb", verb, NULL };
        char what[SNAPSHOT_TAG_MAX + 32];

        snprintf(what, sizeof(what), "paused sandbox %s", p->id);
        return bus_verify_owner_async(message, p->owner_uid, what, action, details, &p->manager->polkit_registry,
                                      error);
}

static int reply_info(sd_bus_message *call, Paused *p, Sandbox *s, sd_bus_message **ret) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        int r;

        r = sd_bus_message_new_method_return(call, &reply);
        if (r >= 0)
                r = p ? paused_append_info(reply, p) : sandbox_append_info(reply, s);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(reply);
        return 0;
}

/* -- pause -- */

/* sd_bus_reply_method_errorf() for a call that may be none (a deadline's pause). */
static int reply_error(sd_bus_message *call, const char *name, const char *fmt, ...) _printf_(3, 4);
static int reply_error(sd_bus_message *call, const char *name, const char *fmt, ...) {
        _cleanup_free_ char *msg = NULL;
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(&msg, fmt, ap) < 0)
                msg = NULL;
        va_end(ap);
        if (!call) {
                log_warning("%s", msg ?: name);
                return 0;
        }
        return sd_bus_reply_method_errorf(call, name, "%s", msg ?: "Out of memory");
}

typedef struct PauseOp {
        Manager *manager;
        sd_bus_message *message;
        char *id, *vm_id, *origin_tag;
} PauseOp;

static void pause_op_free(PauseOp *op) {
        sd_bus_message_unref(op->message);
        free(op->id);
        free(op->vm_id);
        free(op->origin_tag);
        free(op);
}

/* How many templates of paused sandboxes may wait, warm and idle. */
#define PAUSED_WARM_MAX 8

/* The paused sandbox's VM, kept until its snapshot's template is ready (see
 * paused_warm()), goes now; the caller hears once it is gone. */
static void pause_kill_vm(Manager *m, void *userdata) {
        char *vm_id = userdata;
        Sandbox *s = hashmap_get(m->vms, vm_id);

        if (s && s->retired && !s->killed) {
                int r = sandbox_kill(s);
                if (r < 0)
                        log_warning_errno(r, "Failed to kill the VM of the paused sandbox %s: %m", s->id);
        }
        free(vm_id);
}

/* Start the template of a new paused snapshot before its VM goes and the pause
 * answers, so that the sandbox's resume and its first fork, which may come the
 * moment the pause answers, find it running. Started beside the VM's teardown
 * instead, it took 15-22 ms rather than 6 on two cores and a fork sent right
 * after the reply waited for it (bench/lifecycle's first batch 1.6x, not 1.0x);
 * this way the reply waits for the start, which costs a pause less than the
 * teardown's competition did. One waiting template costs about 1 MiB (PSS,
 * mostly shared pages): beyond PAUSED_WARM_MAX, the templates of older pauses
 * that serve nothing stop, and their next fork starts them again. Then kills
 * the VM of sandbox s (at once when no start was needed or it could not begin). */
static void paused_warm(Manager *m, Image *i, Sandbox *s) {
        unsigned n = 1;
        char *vm_id;
        int r;

        /* Newest first: m->templates is in the order they were made. */
        for (VmTemplate *t = m->templates, *next; t; t = next) {
                next = t->next;
                if (t->image == i || !t->image || !snapshot_tag_is_forkds(t->tag) || t->vt.pid <= 0 ||
                    t->busy || t->waiters || t->n_sandboxes > 0)
                        continue;
                if (++n > PAUSED_WARM_MAX)
                        vm_template_stop_idle(t);
        }
        vm_id = strdup(s->vm_id);
        r = vm_id ? fork_op_warm_template_then(m, i, pause_kill_vm, vm_id) : -ENOMEM;
        if (r > 0)
                return;
        if (r < 0)
                log_warning_errno(r, "Could not start the template of %s ahead of its resume: %m", i->tag);
        if (vm_id)
                pause_kill_vm(m, vm_id); /* frees it */
        else if (sandbox_kill(s) < 0)
                log_warning("Failed to kill the VM of the paused sandbox %s.", s->id);
}

static void pause_branch_done(Manager *m, int r, Image *i, uint64_t pause_us, const char *why, void *userdata) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        PauseOp *op = userdata;
        Sandbox *s = hashmap_get(m->sandboxes, op->id);
        Paused *p = NULL;

        if (s && strcmp(s->vm_id, op->vm_id) != 0)
                s = NULL; /* another VM took the id meanwhile */
        if (s)
                s->pausing = false;
        if (r < 0) {
                (void) reply_error(op->message, FORKD_ERROR_FAILED, "Failed to pause sandbox %s: %s",
                                                  op->id, why ?: strerror(-r));
                goto finish;
        }
        if (!s || s->killed || s->state != SANDBOX_RUNNING) {
                (void) image_delete(i);
                (void) reply_error(op->message, FORKD_ERROR_NO_SUCH_SANDBOX,
                                                  "Sandbox %s ended during its pause.", op->id);
                goto finish;
        }

        p = calloc(1, sizeof(*p));
        if (p) {
                *p = (Paused) {
                        .manager = m, .id = strdup(s->id), .tag = strdup(i->tag), .origin_tag = strdup(op->origin_tag),
                        .owner_uid = s->owner_uid, .created_at = s->created_at, .paused_at = (uint64_t) time(NULL),
                        .memory_limit_mib = s->memory_limit_mib, .net_policy = s->netns_owned ? s->net_policy : -1,
                };
                p->pause_us = pause_us;
                /* Its deadline goes with it, unless this pause is what it asked for. */
                if (s->expires_at > 0 && !(s->timeout_pause && s->expires_at <= now_realtime_usec())) {
                        p->expires_at = s->expires_at;
                        p->timeout_pause = s->timeout_pause;
                }
                r = p->id && p->tag && p->origin_tag ? 0 : -ENOMEM;
        } else
                r = -ENOMEM;
        if (r >= 0)
                r = record_write(p);
        if (r >= 0)
                r = hashmap_put(m->paused, p->id, p);
        if (r >= 0)
                r = paused_arm(p);
        if (r >= 0 && op->message)
                r = reply_info(op->message, p, NULL, &reply);
        if (r < 0) {
                if (p)
                        (void) record_remove(m, p->id, true);
                paused_free(p);
                (void) image_delete(i);
                (void) reply_error(op->message, FORKD_ERROR_FAILED,
                                                  "Failed to record the pause of sandbox %s: %s", op->id,
                                                  strerror(-r));
                goto finish;
        }

        /* Paused from now on, after any crash too: the VM goes, silently (the id lives on),
         * and the caller hears once it is gone. */
        hashmap_remove(m->sandboxes, s->id);
        s->retired = true;
        s->retire_reply = TAKE_PTR(reply);
        log_info("Sandbox %s paused into forkd's snapshot %s (guest paused %llu us).", p->id, p->tag,
                 (unsigned long long) pause_us);
        paused_warm(m, i, s);
finish:
        pause_op_free(op);
}

int bus_sandbox_method_pause(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Sandbox *s = userdata;
        int r;

        r = sandbox_verify(message, s, "org.forkd.pause", "pause", error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1;
        r = paused_pause(s, message, error);
        return r < 0 ? r : 1;
}

int paused_pause(Sandbox *s, sd_bus_message *message, sd_bus_error *error) {
        _cleanup_(sd_bus_error_free) sd_bus_error local = SD_BUS_ERROR_NULL;
        Manager *m = s->manager;
        char tag[SNAPSHOT_TAG_MAX + 1];
        const char *mode;
        PauseOp *op;
        int r;

        if (!error)
                error = &local;
        if (s->pausing)
                return sd_bus_error_setf(error, FORKD_ERROR_PAUSED, "sandbox %s is being paused", s->id);
        if (s->state != SANDBOX_RUNNING)
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "Sandbox %s is %s.", s->id,
                                         sandbox_state_to_string(s->state));
        for (unsigned k = 0;; k++) {
                char dir[4096];

                if (k == 0)
                        snprintf(tag, sizeof(tag), PAUSED_TAG_PREFIX "%s.%lld", s->id, (long long) time(NULL));
                else
                        snprintf(tag, sizeof(tag), PAUSED_TAG_PREFIX "%s.%lld-%u", s->id, (long long) time(NULL), k);
                snprintf(dir, sizeof(dir), "%s/%s", m->snapshots_dir, tag);
                if (!hashmap_get(m->images, tag) && !branch_in_flight(m, tag) && access(dir, F_OK) < 0)
                        break;
                if (k >= 16)
                        return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "No free snapshot tag for the pause of %s.",
                                                 s->id);
        }
        if (!snapshot_tag_is_valid(tag))
                return sd_bus_error_setf(error, FORKD_ERROR_FAILED, "Cannot make a snapshot tag from %s.", s->id);
        /* Only what differs from the snapshot it came from, when that is its memory's base. */
        mode = !s->live_fork && hashmap_get(m->images, s->snapshot_tag) ? "diff" : "full";

        op = calloc(1, sizeof(*op));
        if (!op)
                return -ENOMEM;
        op->manager = m;
        op->id = strdup(s->id);
        op->vm_id = strdup(s->vm_id);
        op->origin_tag = strdup(s->origin_tag ?: s->snapshot_tag);
        if (!op->id || !op->vm_id || !op->origin_tag) {
                pause_op_free(op);
                return -ENOMEM;
        }
        r = branch_start(s, tag, mode, true, s->owner_uid, NULL, pause_branch_done, op, error);
        if (r < 0) {
                pause_op_free(op);
                return r;
        }
        op->message = sd_bus_message_ref(message);
        s->pausing = true;
        log_info("Pausing sandbox %s (a %s branch to %s).", s->id, mode, tag);
        return 0;
}

/* -- resume and fork -- */

typedef struct PausedFork {
        char *id;         /* the paused sandbox */
        char *origin_tag;
        bool resume;
} PausedFork;

static void paused_fork_release(void *userdata) {
        PausedFork *pf = userdata;

        free(pf->id);
        free(pf->origin_tag);
        free(pf);
}

static void paused_fork_done(ForkOp *f, int r, const char *error_name, const char *error_message, void *userdata) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Operation *o = userdata;
        PausedFork *pf = o->extra;
        Manager *m = o->manager;
        Paused *p = hashmap_get(m->paused, pf->id);

        if (pf->resume && p)
                p->resuming = false;
        if (r < 0 && pf->resume && p)
                (void) paused_arm(p); /* a deadline that came during the resume counts again */
        if (r < 0) {
                (void) sd_bus_reply_method_errorf(o->message, error_name ?: FORKD_ERROR_FAILED, "%s",
                                                  error_message ?: strerror(-r));
                goto finish;
        }
        /* Shown as what they came from, not as forkd's snapshot. */
        for (unsigned k = 0; k < f->n; k++) {
                Sandbox *s = hashmap_get(m->sandboxes, f->ids[k]);

                if (s && !s->origin_tag)
                        s->origin_tag = strdup(pf->origin_tag);
        }
        if (pf->resume) {
                Sandbox *s = hashmap_get(m->sandboxes, pf->id);

                if (s && p && p->expires_at > 0)
                        (void) sandbox_set_deadline(s, p->expires_at, p->timeout_pause);
                /* Running again: the record goes (a crash before this finds it paused). */
                r = record_remove(m, pf->id, false);
                if (r < 0)
                        log_warning_errno(r, "Failed to remove the pause record of %s: %m", pf->id);
                paused_free(p);
                log_info("Sandbox %s resumed.", pf->id);
                r = reply_info(o->message, NULL, hashmap_get(m->sandboxes, pf->id), &reply);
        } else {
                r = sd_bus_message_new_method_return(o->message, &reply);
                if (r >= 0)
                        r = sandbox_append_infos(reply, m, f->ids, f->n);
                if (r >= 0)
                        r = sd_bus_message_append(reply, "t", (uint64_t) 0);
        }
        if (r >= 0)
                r = sd_bus_send(NULL, reply, NULL);
        if (r < 0)
                (void) sd_bus_reply_method_errno(o->message, r, NULL);
finish:
        operation_free(o);
}

static int paused_fork_start(sd_bus_message *message, Paused *p, unsigned n, const struct fork_options *topts,
                             sd_bus_error *error) {
        struct fork_options opts = { .memory_limit_mib = p->memory_limit_mib };
        bool resume = !topts;
        Manager *m = p->manager;
        const char *why = NULL;
        Operation *o = NULL;
        PausedFork *pf;
        Image *i;
        int r;

        if (m->exiting)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "forkd is shutting down.");
        if (p->resuming)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "Sandbox %s is being resumed.", p->id);
        if (resume && hashmap_get(m->vms, p->id))
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY,
                                         "The VM of sandbox %s is still stopping; retry in a moment.", p->id);
        i = hashmap_get(m->images, p->tag);
        if (!i)
                return sd_bus_error_setf(error, FORKD_ERROR_FAILED, "The state of paused sandbox %s is missing.",
                                         p->id);
        r = chain_check_restorable(m, i, error);
        if (r < 0)
                return r;
        if (p->net_policy >= 0) {
                opts.net_policy = (NetnsPolicy) p->net_policy;
                opts.net_policy_given = true;
        }
        r = fork_options_resolve_network(&opts, i->meta.network, i->meta.agent_tcp, &why);
        if (r < 0)
                return sd_bus_error_setf(error, FORKD_ERROR_FAILED, "Cannot fork paused sandbox %s: %s.", p->id, why);
        if (opts.memory_limit_mib > 0 && !cgroup_manager_supported(m->cgroups))
                return sd_bus_error_setf(error, FORKD_ERROR_NOT_SUPPORTED,
                                         "Memory limits are not available on this host, and sandbox %s has one.",
                                         p->id);
        r = operation_new(m, message, &o);
        if (r == -EBUSY)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "%u operations are running; retry later.",
                                         m->max_operations);
        if (r < 0)
                return r;
        pf = calloc(1, sizeof(*pf));
        if (pf) {
                pf->id = strdup(p->id);
                pf->origin_tag = strdup(p->origin_tag);
                pf->resume = resume;
                o->extra = pf;
                o->free_extra = paused_fork_release;
        }
        if (!pf || !pf->id || !pf->origin_tag) {
                operation_free(o);
                return -ENOMEM;
        }
        if (resume) {
                opts.owner_uid = p->owner_uid;
                opts.id = pf->id;
                opts.created_at = p->created_at;
        } else {
                opts.owner_uid = o->owner_uid;
                opts.timeout_secs = topts->timeout_secs;
                opts.timeout_pause = topts->timeout_pause;
        }
        r = fork_op_start(m, i, n, &opts, paused_fork_done, o, &o->fork);
        if (r < 0) {
                operation_free(o);
                if (r == -EUSERS)
                        return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "At most %u sandboxes may exist at once.",
                                                 SANDBOXES_MAX);
                return sd_bus_error_set_errnof(error, r, "Failed to start the fork: %m");
        }
        if (resume)
                p->resuming = true;
        log_info("%s paused sandbox %s%s.", resume ? "Resuming" : "Forking", p->id,
                 resume ? "" : (n == 1 ? " into 1" : " into several"));
        return 1;
}

int bus_paused_method_resume(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Paused *p = userdata;
        int r;

        r = paused_verify(message, p, "org.forkd.pause", "resume", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        return paused_fork_start(message, p, 1, NULL, error);
}

int bus_paused_method_fork(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Paused *p = userdata;
        struct fork_options topts = {};
        uint32_t n;
        int r;

        r = bus_read_fork_n(message, &n, &topts, error);
        if (r < 0)
                return r;
        if (n < 1 || n > FORK_N_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "n must be from 1 to %u, not %u.",
                                         FORK_N_MAX, n);
        r = paused_verify(message, p, "org.forkd.branch", "fork", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        /* on_timeout "pause" is a pause asked for ahead of time: the caller must be allowed one. */
        if (topts.timeout_pause) {
                r = paused_verify(message, p, "org.forkd.pause", "timeout", error);
                if (r <= 0)
                        return r < 0 ? r : 1;
        }
        return paused_fork_start(message, p, n, &topts, error);
}

/* The record, then the sandbox (SandboxRemoved with reason), then forkd's snapshot if nothing else needs it. */
static int paused_delete(Paused *p, const char *reason) {
        _cleanup_free_ char *tag = NULL, *path = NULL;
        Manager *m = p->manager;
        int r;

        r = record_remove(m, p->id, true);
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

int bus_paused_method_terminate(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Paused *p = userdata;
        int r;

        r = paused_verify(message, p, "org.forkd.terminate", "terminate", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        if (p->resuming)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "Sandbox %s is being resumed.", p->id);
        r = paused_delete(p, "terminated");
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Failed to remove the record of paused sandbox %s: %m",
                                               p->id);
        return sd_bus_reply_method_return(message, NULL);
}

/* -- deadlines set by the caller -- */

/* SetSandboxTimeout's (u timeout_secs, s on_timeout): the deadline from now and
 * the action ("" keeps the current one, "kill" without one). */
static int read_timeout(sd_bus_message *message, bool current_pause, uint64_t *ret_expires, bool *ret_pause,
                        sd_bus_error *error) {
        char err[FORK_OPTION_ERROR_MAX];
        const char *on_timeout;
        uint32_t secs;
        int r;

        r = sd_bus_message_read(message, "us", &secs, &on_timeout);
        if (r < 0)
                return r;
        if (fork_option_check_deadline(true, secs, on_timeout, true, err) < 0)
                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, err);
        *ret_expires = now_realtime_usec() + secs * 1000000ull;
        *ret_pause = on_timeout[0] ? strcmp(on_timeout, ON_TIMEOUT_PAUSE) == 0 : current_pause;
        return 0;
}

int bus_sandbox_method_set_timeout(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Sandbox *s = userdata;
        uint64_t expires = 0;
        bool pause = false;
        int r;

        r = read_timeout(message, s->expires_at > 0 && s->timeout_pause, &expires, &pause, error);
        if (r < 0)
                return r;
        r = sandbox_verify(message, s, "org.forkd.pause", "timeout", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        r = sandbox_set_deadline(s, expires, pause);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Failed to set the deadline of %s: %m", s->id);
        r = reply_info(message, NULL, s, &reply);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

int bus_paused_method_set_timeout(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Paused *p = userdata;
        uint64_t expires = 0;
        bool pause = false;
        int r;

        r = read_timeout(message, p->expires_at > 0 && p->timeout_pause, &expires, &pause, error);
        if (r < 0)
                return r;
        r = paused_verify(message, p, "org.forkd.pause", "timeout", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        r = paused_set_deadline(p, expires, pause);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Failed to record the deadline of %s: %m", p->id);
        r = reply_info(message, p, NULL, &reply);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}
