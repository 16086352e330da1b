/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <stdarg.h>
#include <time.h>

#include <json-c/json.h>

#include "agent-proto.h"
#include "branch.h"
#include "cgroup.h"
#include "file-hashes.h"
#include "fork-op.h"
#include "fork-options-bus.h"
#include "pause-op.h"
#include "sandbox-fork.h"
#include "image-dbus.h"
#include "image.h"
#include "json-util.h"
#include "strv.h"
#include "macro.h"
#include "time-util.h"
#include "operation.h"
#include "polkit.h"
#include "sandbox-dbus.h"
#include "sandbox.h"
#include "snapshot-meta.h"

#define PING_TIMEOUT_USEC (10 * USEC_PER_SEC)
#define EVAL_TIMEOUT_USEC (120 * USEC_PER_SEC)
#define EXEC_MARGIN_USEC (5 * USEC_PER_SEC)
#define HASH_FILES_TIMEOUT_SECS 60u

#define IN_SET_CONN(r) ((r) == -ECONNRESET || (r) == -EPIPE || (r) == -ENOTCONN || (r) == -ESHUTDOWN)

/* A sandbox's properties are its details: for its owner and root. A property
 * read cannot wait for polkit, so holders of org.forkd.manage-all read others'
 * through GetSandbox. Checked only when the read is a Properties call (the
 * getters also run to fill PropertiesChanged). */
static int property_check_owner(sd_bus *bus, Sandbox *s, sd_bus_error *error) {
        sd_bus_message *m = sd_bus_get_current_message(bus);
        uid_t uid;
        int r;

        if (!m || !sd_bus_message_is_method_call(m, "org.freedesktop.DBus.Properties", NULL))
                return 0;
        r = bus_message_sender_uid(m, &s->manager->polkit_registry, &uid);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Cannot determine the caller's credentials: %m");
        if (uid != 0 && uid != s->owner_uid)
                return sd_bus_error_setf(error, SD_BUS_ERROR_ACCESS_DENIED,
                                         "Access denied: sandbox %s belongs to uid %u; its properties are for its "
                                         "owner and root (others with polkit action '" POLKIT_ACTION_MANAGE_ALL
                                         "' use GetSandbox)",
                                         s->id, (unsigned) s->owner_uid);
        return 0;
}

static int property_get(sd_bus *bus, const char *path, const char *interface, const char *property,
                        sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Sandbox *s = userdata;
        int r;

        r = property_check_owner(bus, s, error);
        if (r < 0)
                return r;
        if (strcmp(property, "SnapshotTag") == 0)
                return sd_bus_message_append(reply, "s", s->snapshot_tag);
        if (strcmp(property, "Pid") == 0)
                return sd_bus_message_append(reply, "u", s->pid);
        if (strcmp(property, "CreatedAt") == 0)
                return sd_bus_message_append(reply, "t", s->created_at);
        if (strcmp(property, "MemoryLimitMiB") == 0)
                return sd_bus_message_append(reply, "u", s->memory_limit_mib);
        if (strcmp(property, "NetNS") == 0)
                return sd_bus_message_append(reply, "s", s->netns ?: "");
        if (strcmp(property, "State") == 0)
                return sd_bus_message_append(reply, "s", sandbox_state_to_string(s->state));
        if (strcmp(property, "OwnerUID") == 0)
                return sd_bus_message_append(reply, "u", (uint32_t) s->owner_uid);
        return -ENOENT;
}

int sandbox_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata, void **found,
                        sd_bus_error *error) {
        _cleanup_free_ char *id = NULL;
        Manager *m = userdata;
        Sandbox *s;
        int r;

        r = sd_bus_path_decode(path, FORKD_SANDBOX_PREFIX, &id);
        if (r <= 0)
                return 0;
        s = hashmap_get(m->sandboxes, id);
        if (!s || !sandbox_is_visible(s))
                return 0;
        *found = s;
        return 1;
}

int sandbox_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error) {
        Manager *m = userdata;
        HashmapIter it = {};
        char **l;
        size_t n = 0;
        void *v;

        l = calloc(hashmap_size(m->sandboxes) + 1, sizeof(char *));
        if (!l)
                return -ENOMEM;
        while (hashmap_iterate(m->sandboxes, &it, &v)) {
                Sandbox *s = v;
                if (!sandbox_is_visible(s))
                        continue;
                if (sandbox_object_path(s->id, &l[n]) < 0) {
                        strv_free(l);
                        return -ENOMEM;
                }
                n++;
        }
        *nodes = l;
        return 1;
}

/* ---- methods ---- */

int sandbox_verify(sd_bus_message *message, Sandbox *s, const char *action, const char *verb, sd_bus_error *error) {
        return bus_verify_sandbox_async(message, "sandbox", s->id, s->snapshot_tag, s->owner_uid, action, verb,
                                        &s->manager->polkit_registry, error);
}

/* The operation prelude of what s starts (branch, fork, pause). */
static int sandbox_prelude(sd_bus_message *message, Sandbox *s, const char *action, const char *verb,
                           bool timeout_pause, sd_bus_error *error) {
        const OperationPrelude p = { .action = action, .verb = verb, .snapshot = s->snapshot_tag, .kind = "sandbox",
                                     .id = s->id, .owner = s->owner_uid, .timeout_pause = timeout_pause };

        return operation_prelude(s->manager, message, &p, error);
}

/* Two sandboxes (merge, diff): their owner when they have the same, else nobody's. */
static int verify_pair(sd_bus_message *message, Sandbox *s, Sandbox *o, const char *action, const char *key,
                       const char *verb, sd_bus_error *error) {
        const char *details[] = { "sandbox", s->id, key, o->id, "verb", verb, NULL };
        char what[2 * SNAPSHOT_TAG_MAX + 32];
        bool same = s->owner_uid == o->owner_uid;

        if (same)
                snprintf(what, sizeof(what), "sandboxes %s and %s", s->id, o->id);
        else
                snprintf(what, sizeof(what), "sandboxes %s (uid %u) and %s (uid %u)", s->id,
                         (unsigned) s->owner_uid, o->id, (unsigned) o->owner_uid);
        return bus_verify_owner_async(message, same ? s->owner_uid : OWNER_UID_INVALID, what, action, details,
                                      &s->manager->polkit_registry, error);
}

int bus_sandbox_method_terminate(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Sandbox *s = userdata;
        int r;

        r = sandbox_verify(message, s, "org.forkd.terminate", "terminate", error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1; /* polkit answers later; we run again then */

        r = sandbox_kill(s);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Failed to kill sandbox %s: %m", s->id);
        log_info("Sandbox %s: terminate requested.", s->id);
        if (s->n_terminate_waiters >= ELEMENTSOF(s->terminate_waiters))
                return sd_bus_reply_method_return(message, NULL);
        /* Answered from sandbox_free(), when the template reports the exit. */
        s->terminate_waiters[s->n_terminate_waiters++] = sd_bus_message_ref(message);
        return 1;
}

static void agent_reply(int r, uint16_t type, const char *json, struct json_object *obj, void *userdata) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *message = userdata;
        struct json_object *e;

        if (r >= 0 && type == FKA_RESPONSE) {
                (void) sd_bus_reply_method_return(message, "s", json);
                return;
        }
        if (r >= 0 && type == FKA_ERROR) {
                const char *msg = "the guest refused the request";
                if (obj && json_object_object_get_ex(obj, "error", &e) && json_object_is_type(e, json_type_string))
                        msg = json_object_get_string(e);
                (void) sd_bus_reply_method_errorf(message, FORKD_ERROR_GUEST_ERROR, "%s", msg);
                return;
        }
        if (r == -ETIMEDOUT)
                (void) sd_bus_reply_method_errorf(message, FORKD_ERROR_TIMEOUT, "The guest did not answer in time.");
        else if (IN_SET_CONN(r))
                (void) sd_bus_reply_method_errorf(message, FORKD_ERROR_NO_SUCH_SANDBOX,
                                                  "The sandbox exited before it answered.");
        else if (r == -EBADMSG || r == -EMSGSIZE || r == -EPROTO)
                (void) sd_bus_reply_method_errorf(message, FORKD_ERROR_GUEST_ERROR,
                                                  "The guest sent an invalid answer (%s).", strerror(-r));
        else
                (void) sd_bus_reply_method_errorf(message, FORKD_ERROR_FAILED, "Agent request failed: %s",
                                                  strerror(-r));
}

static int start_call(sd_bus_message *message, Sandbox *s, const char *json, uint64_t timeout_usec,
                      sd_bus_error *error) {
        int r;

        if (s->state != SANDBOX_RUNNING)
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "Sandbox %s is being terminated.", s->id);
        r = sandbox_call(s, json, timeout_usec, agent_reply, message);
        if (r == -EBUSY || r == -ENOBUFS)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "Too many requests in flight for sandbox %s.", s->id);
        if (IN_SET_CONN(r))
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "Sandbox %s has exited.", s->id);
        if (r == -EBADMSG || r == -EPROTO)
                return sd_bus_error_setf(error, FORKD_ERROR_GUEST_ERROR,
                                         "The agent channel of sandbox %s is broken: its guest sent an invalid frame (%s).",
                                         s->id, strerror(-r));
        if (r == -EMSGSIZE)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Request too large.");
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Failed to send the request to %s: %m", s->id);
        sd_bus_message_ref(message); /* the reply callback owns it */
        return 1;
}

static int call_simple(sd_bus_message *message, Sandbox *s, const char *verb, struct json_object *req,
                       uint64_t timeout_usec, sd_bus_error *error) {
        return start_call(message, s, json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN), timeout_usec, error);
}

int bus_sandbox_method_ping(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Sandbox *s = userdata;
        int r;

        r = sandbox_verify(message, s, "org.forkd.run-code", "ping", error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1;
        return start_call(message, s, "{\"op\":\"ping\"}", PING_TIMEOUT_USEC, error);
}

int bus_sandbox_method_exec(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ struct json_object *req = NULL;
        struct json_object *args;
        Sandbox *s = userdata;
        uint32_t timeout;
        size_t n = 0, bytes = 0;
        int r;

        r = sd_bus_message_enter_container(message, 'a', "s");
        if (r < 0)
                return r;
        req = json_object_new_object();
        args = json_object_new_array();
        if (!req || !args) {
                json_object_put(args);
                return -ENOMEM;
        }
        json_object_object_add(req, "op", json_object_new_string("exec"));
        json_object_object_add(req, "args", args);
        for (;;) {
                const char *a;

                r = sd_bus_message_read(message, "s", &a);
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                n++;
                bytes += strlen(a) + 1;
                if (n > EXEC_ARGS_MAX || bytes > EXEC_ARGS_BYTES_MAX)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "At most %u arguments of %u bytes in all.", EXEC_ARGS_MAX,
                                                 EXEC_ARGS_BYTES_MAX);
                json_object_array_add(args, json_object_new_string(a));
        }
        r = sd_bus_message_exit_container(message);
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "u", &timeout);
        if (r < 0)
                return r;
        if (n == 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "args must not be empty.");
        if (timeout > EXEC_TIMEOUT_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "timeout_secs must be at most %u.",
                                         EXEC_TIMEOUT_MAX);
        if (timeout == 0)
                timeout = EXEC_TIMEOUT_DEFAULT;
        json_object_object_add(req, "timeout_secs", json_object_new_int64(timeout));

        r = sandbox_verify(message, s, "org.forkd.run-code", "exec", error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1;
        return call_simple(message, s, "exec", req, (uint64_t) timeout * 1000000u + EXEC_MARGIN_USEC, error);
}

static int method_code(sd_bus_message *message, Sandbox *s, const char *op, bool with_timeout,
                       sd_bus_error *error) {
        _cleanup_json_ struct json_object *req = NULL;
        uint64_t timeout_usec = EVAL_TIMEOUT_USEC;
        uint32_t timeout = 0;
        const char *code;
        int r;

        r = sd_bus_message_read(message, "s", &code);
        if (r < 0)
                return r;
        if (with_timeout) {
                r = sd_bus_message_read(message, "u", &timeout);
                if (r < 0)
                        return r;
                if (timeout > EXEC_TIMEOUT_MAX)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "timeout_secs must be at most %u.",
                                                 EXEC_TIMEOUT_MAX);
                if (timeout == 0)
                        timeout = EXEC_TIMEOUT_DEFAULT;
                timeout_usec = (uint64_t) timeout * 1000000u + EXEC_MARGIN_USEC;
        }
        if (strlen(code) > CODE_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "code is longer than %u bytes.", CODE_MAX);
        req = json_object_new_object();
        if (!req)
                return -ENOMEM;
        json_object_object_add(req, "op", json_object_new_string(op));
        json_object_object_add(req, "code", json_object_new_string(code));
        if (with_timeout)
                json_object_object_add(req, "timeout_secs", json_object_new_int64(timeout));

        r = sandbox_verify(message, s, "org.forkd.run-code", op, error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1;
        return call_simple(message, s, op, req, timeout_usec, error);
}

int bus_sandbox_method_eval(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return method_code(message, userdata, "eval", false, error);
}

int bus_sandbox_method_run_code(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return method_code(message, userdata, "run_code", true, error);
}

/* ---- merge ---- */

static Sandbox *lookup_other(Manager *m, const char *what, const char *id, sd_bus_error *error) {
        Sandbox *o;

        if (!snapshot_tag_is_valid(id)) {
                (void) sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Invalid %s id \"%.64s\".", what, id);
                return NULL;
        }
        o = hashmap_get(m->sandboxes, id);
        if (!o || !sandbox_is_visible(o)) {
                (void) sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "No sandbox with id %s.", id);
                return NULL;
        }
        return o;
}

static void send_vm_changed(Sandbox *s) {
        _cleanup_free_ char *p = NULL;

        if (!s->manager->bus || sandbox_object_path(s->id, &p) < 0)
                return;
        (void) sd_bus_emit_properties_changed(s->manager->bus, p, "org.forkd.Sandbox", "SnapshotTag", "Pid",
                                              "CreatedAt", "MemoryLimitMiB", "NetNS", "OwnerUID", NULL);
}

int bus_sandbox_method_merge(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_free_ char *old_id = NULL;
        Sandbox *s = userdata, *w;
        const char *winner;
        int r;

        r = sd_bus_message_read(message, "s", &winner);
        if (r < 0)
                return r;
        if (strcmp(winner, s->id) == 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "The winner must be another sandbox than %s itself.", s->id);
        w = lookup_other(s->manager, "winner", winner, error);
        if (!w)
                return -EINVAL;

        r = verify_pair(message, s, w, "org.forkd.terminate", "winner", "merge", error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1;

        if (s->state != SANDBOX_RUNNING || w->state != SANDBOX_RUNNING)
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "Sandbox %s is being terminated.",
                                         s->state != SANDBOX_RUNNING ? s->id : w->id);
        /* s keeps its id and takes w's VM: s's old VM (the struct s) retires,
         * the struct w carries on under s's id. */
        r = sandbox_merge(s, w, &old_id);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Failed to merge %s into %s: %m", w->id, s->id);
        sandbox_send_removed_signal_as(w, old_id, "merged");
        send_vm_changed(w);

        r = sd_bus_message_new_method_return(message, &reply);
        if (r >= 0)
                r = sandbox_append_info(reply, w);
        if (r < 0)
                return r; /* unlikely (ENOMEM); the merge stands, the caller sees it in ListSandboxes */
        if (!s->killed || s->pid == 0)
                return sd_bus_send(NULL, reply, NULL);
        /* Answered once the old VM is gone (sandbox_free()). */
        s->retire_reply = TAKE_PTR(reply);
        return 1;
}

/* ---- diff ---- */

typedef struct DiffOp {
        sd_bus_message *message;
        struct json_object *answers[2];
        char *ids[2];
        unsigned pending;
        const char *error_name;
        char *error;
} DiffOp;

typedef struct DiffSlot {
        DiffOp *op;
        unsigned index;
} DiffSlot;

static void diff_op_free(DiffOp *d) {
        sd_bus_message_unref(d->message);
        for (unsigned i = 0; i < 2; i++) {
                json_object_put(d->answers[i]);
                free(d->ids[i]);
        }
        free(d->error);
        free(d);
}

static void diff_fail(DiffOp *d, const char *name, const char *fmt, ...) _printf_(3, 4);
static void diff_fail(DiffOp *d, const char *name, const char *fmt, ...) {
        va_list ap;

        if (d->error)
                return; /* the first one says it */
        va_start(ap, fmt);
        if (vasprintf(&d->error, fmt, ap) < 0)
                d->error = NULL;
        va_end(ap);
        d->error_name = name;
}

static int append_strv(sd_bus_message *m, char **l, size_t n) {
        int r = sd_bus_message_open_container(m, 'a', "s");

        for (size_t i = 0; r >= 0 && i < n; i++)
                r = sd_bus_message_append_basic(m, 's', l[i]);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        return r;
}

static void diff_finish(DiffOp *d) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        struct json_object *files[2];
        FileDiff fd = {};
        int r;

        for (unsigned i = 0; i < 2 && !d->error; i++) {
                const char *why = NULL;

                if (file_hashes_check(d->answers[i], &files[i], &why) < 0)
                        diff_fail(d, FORKD_ERROR_GUEST_ERROR, "The guest of %s sent an invalid hash_files answer: %s.",
                                  d->ids[i], why);
        }
        if (d->error) {
                (void) sd_bus_reply_method_errorf(d->message, d->error_name ?: FORKD_ERROR_FAILED, "%s", d->error);
                return;
        }
        r = file_hashes_diff(files[0], files[1], &fd);
        if (r >= 0)
                r = sd_bus_message_new_method_return(d->message, &reply);
        if (r >= 0)
                r = append_strv(reply, fd.added, fd.n_added);
        if (r >= 0)
                r = append_strv(reply, fd.removed, fd.n_removed);
        if (r >= 0)
                r = append_strv(reply, fd.modified, fd.n_modified);
        if (r >= 0)
                r = sd_bus_send(NULL, reply, NULL);
        if (r < 0)
                (void) sd_bus_reply_method_errno(d->message, r, NULL);
        file_diff_done(&fd);
}

static void diff_reply(int r, uint16_t type, const char *json, struct json_object *obj, void *userdata) {
        DiffSlot *slot = userdata;
        DiffOp *d = slot->op;
        const char *id = d->ids[slot->index];
        struct json_object *e;

        if (r >= 0 && type == FKA_RESPONSE)
                d->answers[slot->index] = json_object_get(obj);
        else if (r >= 0 && type == FKA_ERROR) {
                const char *msg = "the guest refused the request";
                if (obj && json_object_object_get_ex(obj, "error", &e) && json_object_is_type(e, json_type_string))
                        msg = json_object_get_string(e);
                diff_fail(d, FORKD_ERROR_GUEST_ERROR, "%s: %s", id, msg);
        } else if (r == -ETIMEDOUT)
                diff_fail(d, FORKD_ERROR_TIMEOUT, "The guest of %s did not answer in time.", id);
        else if (IN_SET_CONN(r))
                diff_fail(d, FORKD_ERROR_NO_SUCH_SANDBOX, "Sandbox %s exited before it answered.", id);
        else
                diff_fail(d, FORKD_ERROR_GUEST_ERROR, "The guest of %s sent an invalid answer (%s).", id,
                          strerror(-r));
        free(slot);
        if (--d->pending == 0) {
                diff_finish(d);
                diff_op_free(d);
        }
}

int bus_sandbox_method_diff(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_json_ struct json_object *req = NULL;
        struct json_object *paths;
        Sandbox *s = userdata, *o, *both[2];
        const char *other, *json;
        DiffOp *d;
        size_t n = 0;
        int r;

        r = sd_bus_message_read(message, "s", &other);
        if (r < 0)
                return r;
        req = json_object_new_object();
        paths = json_object_new_array();
        if (!req || !paths) {
                json_object_put(paths);
                return -ENOMEM;
        }
        json_object_object_add(req, "op", json_object_new_string("hash_files"));
        json_object_object_add(req, "paths", paths);
        json_object_object_add(req, "timeout_secs", json_object_new_int64(HASH_FILES_TIMEOUT_SECS));
        r = sd_bus_message_enter_container(message, 'a', "s");
        if (r < 0)
                return r;
        for (;;) {
                const char *p;

                r = sd_bus_message_read(message, "s", &p);
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                if (++n > HASH_PATHS_MAX)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "At most %u paths.", HASH_PATHS_MAX);
                if (!hash_path_is_valid(p))
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "Path \"%.64s\" is not absolute and normalized (no \".\", \"..\", "
                                                 "\"//\" or trailing '/').", p);
                json_object_array_add(paths, json_object_new_string(p));
        }
        r = sd_bus_message_exit_container(message);
        if (r < 0)
                return r;
        if (n == 0) {
                /* Podflare's default */
                json_object_array_add(paths, json_object_new_string("/root"));
                json_object_array_add(paths, json_object_new_string("/tmp"));
        }
        o = lookup_other(s->manager, "other sandbox", other, error);
        if (!o)
                return -EINVAL;

        r = verify_pair(message, s, o, "org.forkd.run-code", "other", "diff", error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1;
        if (s->state != SANDBOX_RUNNING || o->state != SANDBOX_RUNNING)
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "Sandbox %s is being terminated.",
                                         s->state != SANDBOX_RUNNING ? s->id : o->id);

        d = calloc(1, sizeof(*d));
        if (!d)
                return -ENOMEM;
        d->message = sd_bus_message_ref(message);
        d->ids[0] = strdup(s->id);
        d->ids[1] = strdup(o->id);
        if (!d->ids[0] || !d->ids[1]) {
                diff_op_free(d);
                return -ENOMEM;
        }
        json = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        both[0] = s;
        both[1] = o;
        /* One pending count per call started; a call that does not start fails the diff,
         * whose reply then waits for the other call's answer. */
        d->pending = 1;
        for (unsigned i = 0; i < 2; i++) {
                DiffSlot *slot = calloc(1, sizeof(*slot));

                if (!slot) {
                        diff_fail(d, FORKD_ERROR_FAILED, "Out of memory.");
                        break;
                }
                *slot = (DiffSlot) { .op = d, .index = i };
                d->pending++;
                r = sandbox_call(both[i], json, (uint64_t) HASH_FILES_TIMEOUT_SECS * 1000000u + EXEC_MARGIN_USEC,
                                 diff_reply, slot);
                if (r < 0) {
                        d->pending--;
                        free(slot);
                        if (r == -EBUSY || r == -ENOBUFS)
                                diff_fail(d, FORKD_ERROR_BUSY, "Too many requests in flight for sandbox %s.",
                                          both[i]->id);
                        else
                                diff_fail(d, FORKD_ERROR_FAILED, "Failed to send the request to %s: %s", both[i]->id,
                                          strerror(-r));
                        break;
                }
        }
        if (--d->pending == 0) {
                /* Nothing was sent: answer now. */
                diff_finish(d);
                diff_op_free(d);
        }
        return 1;
}

int bus_sandbox_method_expose_port(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_free_ char *addr = NULL;
        Sandbox *s = userdata;
        uint16_t port;
        int r;

        r = sd_bus_message_read(message, "q", &port);
        if (r < 0)
                return r;
        if (port == 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "port must be from 1 to 65535.");
        r = sandbox_verify(message, s, "org.forkd.run-code", "expose-port", error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1;
        if (!s->netns_owned || !s->inside_addr)
                return sd_bus_error_setf(error, FORKD_ERROR_NO_NETWORK,
                                         "Sandbox %s has no NIC: fork it from a snapshot created with network.",
                                         s->id);
        /* The namespace's DNAT forwards every TCP port of the inside address
         * to the guest (netns.c): there is nothing to set up, only to say where. */
        if (asprintf(&addr, "%s:%u", s->inside_addr, (unsigned) port) < 0)
                return -ENOMEM;
        return sd_bus_reply_method_return(message, "s", addr);
}

/* ---- branch and fork ---- */

int bus_sandbox_method_branch(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Sandbox *s = userdata;
        Manager *m = s->manager;
        const char *tag, *mode;
        char auto_tag[SNAPSHOT_TAG_MAX + 1];
        uid_t owner = 0;
        int wait, r;

        r = sd_bus_message_read(message, "ssb", &tag, &mode, &wait);
        if (r < 0)
                return r;
        r = tag[0] ? bus_check_tag(tag, "snapshot tag", error) : 0;
        if (r < 0)
                return r;
        if (!mode[0])
                mode = "full";
        if (strcmp(mode, "full") != 0 && strcmp(mode, "diff") != 0 && strcmp(mode, "live") != 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "mode must be \"full\", \"diff\" or \"live\", not \"%.16s\".", mode);
        if (!wait && strcmp(mode, "live") != 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "wait false needs mode \"live\".");

        r = sandbox_prelude(message, s, "org.forkd.branch", "branch", false, error);
        if (r <= 0)
                return r < 0 ? r : 1;
        r = bus_message_sender_uid(message, &m->polkit_registry, &owner);
        if (r < 0)
                return r;

        if (!tag[0]) {
                snprintf(auto_tag, sizeof(auto_tag), "branch-%s-%lld", s->id, (long long) time(NULL));
                if (!snapshot_tag_is_valid(auto_tag))
                        return sd_bus_error_setf(error, FORKD_ERROR_FAILED, "Cannot make a tag from %s.", s->id);
                tag = auto_tag;
        }
        r = branch_start(s, tag, mode, wait, owner, message, NULL, NULL, error);
        return r < 0 ? r : 1;
}

int bus_sandbox_method_fork(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Sandbox *s = userdata;
        struct fork_options topts = {};
        uint32_t n;
        int r;

        r = bus_read_fork_n(message, &n, &topts, error);
        if (r < 0)
                return r;
        if (n < 1 || n > SANDBOX_FORK_N_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "n must be from 1 to %u, not %u.",
                                         SANDBOX_FORK_N_MAX, n);

        r = sandbox_prelude(message, s, "org.forkd.branch", "fork", topts.timeout_pause, error);
        if (r <= 0)
                return r < 0 ? r : 1;

        return sandbox_fork_start(s, message, n, &topts, error);
}

/* ---- pause and deadlines ---- */

int bus_sandbox_method_resume(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Sandbox *s = userdata;

        return sd_bus_error_setf(error, FORKD_ERROR_NOT_PAUSED, "sandbox %s is not paused", s->id);
}

int bus_sandbox_method_pause(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Sandbox *s = userdata;
        int r;

        r = sandbox_prelude(message, s, "org.forkd.pause", "pause", false, error);
        if (r <= 0)
                return r < 0 ? r : 1;
        r = paused_pause(s, message, error);
        return r < 0 ? r : 1;
}

int bus_sandbox_method_set_timeout(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Sandbox *s = userdata;
        uint64_t expires = 0;
        bool pause = false;
        int r;

        r = bus_read_timeout(message, s->expires_at > 0 && s->timeout_pause, &expires, &pause, error);
        if (r < 0)
                return r;
        r = sandbox_verify(message, s, "org.forkd.pause", "timeout", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        r = sandbox_set_deadline(s, expires, pause);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Failed to set the deadline of %s: %m", s->id);
        r = bus_sandbox_info_reply(message, NULL, s, &reply);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

/* ---- limits ---- */

/* A SetSandboxLimits whose rates wait for the VMM's answer to set_limits. */
typedef struct LimitsCall {
        ControlWaiter waiter; /* first */
        Manager *manager;
        char *id;
        sd_bus_message *message;
        struct sandbox_limits limits;
        unsigned given;
        uint32_t memory_limit_mib;
} LimitsCall;

/* The cgroup's part, once the VMM took its part (or had none). */
static int apply_cgroup_limits(Sandbox *s, const struct sandbox_limits *l, unsigned given, uint32_t mib) {
        int r;

        /* Removing a cpu_limit it does not have changes nothing in its cgroup. */
        if ((given & LIMIT_CPU) && l->cpu_limit == 0 && s->limits.cpu_limit == 0)
                given &= ~LIMIT_CPU;
        if (!(given & (LIMIT_CPU | LIMIT_MEMORY)))
                return 0;
        r = cgroup_set_limits(s->manager->cgroups, s->vm_id, given & LIMIT_MEMORY ? (uint64_t) mib << 20 : 0,
                              !(given & LIMIT_CPU) ? 0 : l->cpu_limit > 0 ? l->cpu_limit : -1);
        if (r < 0)
                return r;
        if (given & LIMIT_MEMORY)
                s->memory_limit_mib = mib;
        if (given & LIMIT_CPU)
                s->limits.cpu_limit = l->cpu_limit;
        return 0;
}

static int reply_limits(sd_bus_message *message, Sandbox *s, int r) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;

        if (r < 0)
                return sd_bus_reply_method_errnof(message, r, "Failed to change the limits of %s: %m", s->id);
        r = bus_sandbox_info_reply(message, NULL, s, &reply);
        if (r < 0)
                return sd_bus_reply_method_errno(message, r, NULL);
        return sd_bus_send(NULL, reply, NULL);
}

static void on_set_limits_reply(ControlWaiter *w, struct json_object *o, const char *why) {
        LimitsCall *c = (LimitsCall *) w;
        Sandbox *s = hashmap_get(c->manager->sandboxes, c->id);
        struct json_object *ok, *e;

        if (!o || !s)
                (void) sd_bus_reply_method_errorf(c->message, FORKD_ERROR_NO_SUCH_SANDBOX,
                                                  "Sandbox %s ended before its limits changed (%s).", c->id,
                                                  why ?: "gone");
        else if (!json_object_object_get_ex(o, "ok", &ok) || !json_object_get_boolean(ok))
                (void) sd_bus_reply_method_errorf(c->message, FORKD_ERROR_FAILED,
                                                  "The VMM of %s refused the new limits: %s", c->id,
                                                  json_object_object_get_ex(o, "error", &e) ?
                                                          json_object_get_string(e) : "no reason given");
        else {
                if (c->given & LIMIT_DISK_RATE)
                        s->limits.disk_rate = c->limits.disk_rate;
                if (c->given & LIMIT_NET_RATE)
                        s->limits.net_rate = c->limits.net_rate;
                (void) reply_limits(c->message, s, apply_cgroup_limits(s, &c->limits, c->given, c->memory_limit_mib));
        }
        sd_bus_message_unref(c->message);
        free(c->id);
        free(c);
}

static int send_set_limits(Sandbox *s, sd_bus_message *message, const struct sandbox_limits *l, unsigned given,
                           uint32_t mib) {
        _cleanup_json_ struct json_object *req = json_object_new_object();
        LimitsCall *c;
        int r;

        if (!req)
                return -ENOMEM;
        json_object_object_add(req, "op", json_object_new_string("set_limits"));
        if (given & LIMIT_DISK_RATE)
                json_object_object_add(req, "disk_rate", rate_limit_to_json(&l->disk_rate));
        if (given & LIMIT_NET_RATE)
                json_object_object_add(req, "net_rate", rate_limit_to_json(&l->net_rate));
        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        *c = (LimitsCall) { .waiter.reply = on_set_limits_reply, .manager = s->manager, .id = strdup(s->id),
                            .message = sd_bus_message_ref(message), .limits = *l, .given = given,
                            .memory_limit_mib = mib };
        r = c->id ? sandbox_control_send(s, json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN), -EBADF,
                                         &c->waiter) : -ENOMEM;
        if (r < 0) {
                sd_bus_message_unref(c->message);
                free(c->id);
                free(c);
        }
        return r;
}

/* SetSandboxLimits and the object's SetLimits: everything is checked before
 * anything changes; the VMM's rates first, then the cgroup's limits. */
int bus_sandbox_method_set_limits(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Sandbox *s = userdata;
        Manager *m = s->manager;
        struct sandbox_limits l = s->limits;
        bool mib_given = false;
        uint32_t mib = 0;
        unsigned given = 0;
        Image *i;
        int r;

        r = bus_read_limits(message, &mib_given, &mib, &l, &given, error);
        if (r < 0)
                return r;
        r = sandbox_verify(message, s, "org.forkd.pause", "limits", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        i = hashmap_get(m->images, s->snapshot_tag);
        r = bus_check_limits(m, mib_given ? mib : 0, &(struct sandbox_limits) { .cpu_limit = l.cpu_limit },
                             i ? i->meta.vcpus : 1, error);
        if (r < 0)
                return r;
        if (((given & LIMIT_MEMORY) || ((given & LIMIT_CPU) && (l.cpu_limit > 0 || s->limits.cpu_limit > 0))) &&
            !s->has_cgroup)
                return sd_bus_error_setf(error, FORKD_ERROR_NOT_SUPPORTED,
                                         "Sandbox %s has no cgroup of its own: only a sandbox forked with "
                                         "cpu_limit or memory_limit_mib can change them while it runs.", s->id);
        if ((given & LIMIT_MEMORY) && s->memory_limit_mib == 0)
                return sd_bus_error_setf(error, FORKD_ERROR_NOT_SUPPORTED,
                                         "Sandbox %s was forked without memory_limit_mib; it cannot get one "
                                         "while it runs.", s->id);
        if ((given & (LIMIT_DISK_RATE | LIMIT_NET_RATE)) && s->control_fd < 0)
                return sd_bus_error_setf(error, FORKD_ERROR_FAILED, "Sandbox %s has no control channel.", s->id);

        if (given & (LIMIT_DISK_RATE | LIMIT_NET_RATE)) {
                r = send_set_limits(s, message, &l, given, mib);
                if (r < 0)
                        return sd_bus_error_set_errnof(error, r, "Failed to change the limits of %s: %m", s->id);
                return 1;
        }
        return reply_limits(message, s, apply_cgroup_limits(s, &l, given, mib));
}

/* Object-path entry points. A message may be dispatched twice (polkit
 * re-queues it once answered): start reading from its beginning each time.
 * The Manager's forwarders call the bus_sandbox_method_*() directly, after
 * reading the id. */
#define OBJECT_METHOD(name)                                                                     \
        static int object_##name(sd_bus_message *message, void *userdata, sd_bus_error *error) { \
                int r = sd_bus_message_rewind(message, true);                                     \
                if (r < 0)                                                                        \
                        return r;                                                                 \
                return bus_sandbox_method_##name(message, userdata, error);                       \
        }
OBJECT_METHOD(terminate)
OBJECT_METHOD(ping)
OBJECT_METHOD(exec)
OBJECT_METHOD(eval)
OBJECT_METHOD(run_code)
OBJECT_METHOD(branch)
OBJECT_METHOD(fork)
OBJECT_METHOD(merge)
OBJECT_METHOD(diff)
OBJECT_METHOD(write_file)
OBJECT_METHOD(read_file)
OBJECT_METHOD(expose_port)

/* Pause and SetTimeout refuse a sandbox whose pause is in flight before polkit
 * is asked, as the Manager's lookup of the id does for PauseSandbox and
 * SetSandboxTimeout. */
#define OBJECT_METHOD_NOT_PAUSING(name)                                                         \
        static int object_##name(sd_bus_message *message, void *userdata, sd_bus_error *error) { \
                Sandbox *s = userdata;                                                            \
                int r = sd_bus_message_rewind(message, true);                                     \
                if (r < 0)                                                                        \
                        return r;                                                                 \
                if (s->pausing)                                                                   \
                        return bus_sandbox_error_pausing(s->id, error);                           \
                return bus_sandbox_method_##name(message, userdata, error);                       \
        }
OBJECT_METHOD_NOT_PAUSING(pause)
OBJECT_METHOD_NOT_PAUSING(set_timeout)
OBJECT_METHOD_NOT_PAUSING(set_limits)
OBJECT_METHOD(resume)

const sd_bus_vtable sandbox_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_PROPERTY("Id", "s", NULL, offsetof(Sandbox, id), SD_BUS_VTABLE_PROPERTY_CONST),
        /* These describe the VM, which a merge replaces. */
        SD_BUS_PROPERTY("SnapshotTag", "s", property_get, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("Pid", "u", property_get, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("CreatedAt", "t", property_get, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("MemoryLimitMiB", "u", property_get, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("NetNS", "s", property_get, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("State", "s", property_get, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("OwnerUID", "u", property_get, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_METHOD_WITH_ARGS("Terminate", SD_BUS_NO_ARGS, SD_BUS_NO_RESULT, object_terminate,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Ping", SD_BUS_NO_ARGS, SD_BUS_RESULT("s", result_json), object_ping,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Exec", SD_BUS_ARGS("as", args, "u", timeout_secs), SD_BUS_RESULT("s", result_json),
                                object_exec, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Eval", SD_BUS_ARGS("s", code), SD_BUS_RESULT("s", result_json),
                                object_eval, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("RunCode", SD_BUS_ARGS("s", code, "u", timeout_secs), SD_BUS_RESULT("s", result_json),
                                object_run_code, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Branch", SD_BUS_ARGS("s", tag, "s", mode, "b", wait), SD_BUS_RESULT("a{sv}", info),
                                object_branch, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Fork", SD_BUS_ARGS("u", n), SD_BUS_RESULT("aa{sv}", sandboxes, "t", pause_us),
                                object_fork, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Merge", SD_BUS_ARGS("s", winner), SD_BUS_RESULT("a{sv}", info), object_merge,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Diff", SD_BUS_ARGS("s", other, "as", paths),
                                SD_BUS_RESULT("as", added, "as", removed, "as", modified), object_diff,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("WriteFile", SD_BUS_ARGS("s", path, "ay", data, "u", mode), SD_BUS_RESULT("t", size),
                                object_write_file, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ExposePort", SD_BUS_ARGS("q", port), SD_BUS_RESULT("s", host_addr),
                                object_expose_port, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ReadFile", SD_BUS_ARGS("s", path), SD_BUS_RESULT("ay", data), object_read_file,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Pause", SD_BUS_NO_ARGS, SD_BUS_RESULT("a{sv}", info), object_pause,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Resume", SD_BUS_NO_ARGS, SD_BUS_RESULT("a{sv}", info), object_resume,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("SetTimeout", SD_BUS_ARGS("u", timeout_secs, "s", on_timeout),
                                SD_BUS_RESULT("a{sv}", info), object_set_timeout, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("SetLimits", SD_BUS_ARGS("a{sv}", limits), SD_BUS_RESULT("a{sv}", info),
                                object_set_limits, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_VTABLE_END,
};
