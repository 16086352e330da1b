/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <json-c/json.h>

#include "agent-proto.h"
#include "branch.h"
#include "sandbox-fork.h"
#include "json-util.h"
#include "macro.h"
#include "polkit.h"
#include "sandbox-dbus.h"
#include "sandbox.h"
#include "snapshot-meta.h"

#define PING_TIMEOUT_USEC (10 * 1000000ull)
#define EVAL_TIMEOUT_USEC (120 * 1000000ull)
#define EXEC_MARGIN_USEC (5 * 1000000ull)

#define IN_SET_CONN(r) ((r) == -ECONNRESET || (r) == -EPIPE || (r) == -ENOTCONN || (r) == -ESHUTDOWN)

bool sandbox_is_visible(const Sandbox *s) {
        return s->state == SANDBOX_RUNNING || s->state == SANDBOX_TERMINATING;
}

static int property_get_state(sd_bus *bus, const char *path, const char *interface, const char *property,
                              sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Sandbox *s = userdata;
        return sd_bus_message_append(reply, "s", sandbox_state_to_string(s->state));
}

static int property_get_netns(sd_bus *bus, const char *path, const char *interface, const char *property,
                              sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Sandbox *s = userdata;
        return sd_bus_message_append(reply, "s", s->netns ?: "");
}

int sandbox_append_info(sd_bus_message *reply, Sandbox *s) {
        int r;

        r = sd_bus_message_open_container(reply, 'a', "{sv}");
        if (r < 0)
                return r;
        r = sd_bus_message_append(reply, "{sv}{sv}{sv}{sv}{sv}{sv}",
                                  "id", "s", s->id,
                                  "snapshot_tag", "s", s->snapshot_tag,
                                  "guest_addr", "s", s->guest_addr,
                                  "created_at_unix", "t", s->created_at,
                                  "pid", "u", s->pid,
                                  "state", "s", sandbox_state_to_string(s->state));
        if (r < 0)
                return r;
        if (s->netns) {
                r = sd_bus_message_append(reply, "{sv}", "netns", "s", s->netns);
                if (r < 0)
                        return r;
        }
        if (s->memory_limit_mib > 0) {
                r = sd_bus_message_append(reply, "{sv}", "memory_limit_mib", "u", s->memory_limit_mib);
                if (r < 0)
                        return r;
        }
        return sd_bus_message_close_container(reply);
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
                        for (size_t i = 0; i < n; i++)
                                free(l[i]);
                        free(l);
                        return -ENOMEM;
                }
                n++;
        }
        *nodes = l;
        return 1;
}

/* ---- signals ---- */

void sandbox_send_new_signal(Sandbox *s) {
        _cleanup_free_ char *p = NULL;

        if (!s->manager->bus || sandbox_object_path(s->id, &p) < 0)
                return;
        (void) sd_bus_emit_signal(s->manager->bus, FORKD_MANAGER_PATH, FORKD_BUS_NAME, "SandboxNew", "so", s->id, p);
}

void sandbox_send_removed_signal(Sandbox *s, const char *reason) {
        _cleanup_free_ char *p = NULL;

        if (!s->manager->bus || sandbox_object_path(s->id, &p) < 0)
                return;
        (void) sd_bus_emit_signal(s->manager->bus, FORKD_MANAGER_PATH, FORKD_BUS_NAME, "SandboxRemoved", "sos", s->id,
                                  p, reason);
}

void sandbox_send_state_changed(Sandbox *s) {
        _cleanup_free_ char *p = NULL;

        if (!s->manager->bus || sandbox_object_path(s->id, &p) < 0)
                return;
        (void) sd_bus_emit_properties_changed(s->manager->bus, p, "org.forkd.Sandbox", "State", NULL);
}

/* ---- methods ---- */

static int verify(sd_bus_message *message, Sandbox *s, const char *action, const char *verb, sd_bus_error *error) {
        const char *details[] = { "sandbox", s->id, "snapshot", s->snapshot_tag, "verb", verb, NULL };

        return bus_verify_polkit_async(message, action, details, &s->manager->polkit_registry, error);
}

int bus_sandbox_method_terminate(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Sandbox *s = userdata;
        int r;

        r = verify(message, s, "org.forkd.terminate", "terminate", error);
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

        r = verify(message, s, "org.forkd.run-code", "ping", error);
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

        r = verify(message, s, "org.forkd.run-code", "exec", error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1;
        return call_simple(message, s, "exec", req, (uint64_t) timeout * 1000000u + EXEC_MARGIN_USEC, error);
}

static int method_code(sd_bus_message *message, Sandbox *s, const char *op, sd_bus_error *error) {
        _cleanup_json_ struct json_object *req = NULL;
        const char *code;
        int r;

        r = sd_bus_message_read(message, "s", &code);
        if (r < 0)
                return r;
        if (strlen(code) > CODE_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "code is longer than %u bytes.", CODE_MAX);
        req = json_object_new_object();
        if (!req)
                return -ENOMEM;
        json_object_object_add(req, "op", json_object_new_string(op));
        json_object_object_add(req, "code", json_object_new_string(code));

        r = verify(message, s, "org.forkd.run-code", op, error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1;
        return call_simple(message, s, op, req, EVAL_TIMEOUT_USEC, error);
}

int bus_sandbox_method_eval(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return method_code(message, userdata, "eval", error);
}

int bus_sandbox_method_run_code(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return method_code(message, userdata, "run_code", error);
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

const sd_bus_vtable sandbox_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_PROPERTY("Id", "s", NULL, offsetof(Sandbox, id), SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("SnapshotTag", "s", NULL, offsetof(Sandbox, snapshot_tag), SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("Pid", "u", NULL, offsetof(Sandbox, pid), SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("CreatedAt", "t", NULL, offsetof(Sandbox, created_at), SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("MemoryLimitMiB", "u", NULL, offsetof(Sandbox, memory_limit_mib), SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("NetNS", "s", property_get_netns, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("State", "s", property_get_state, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_METHOD_WITH_ARGS("Terminate", SD_BUS_NO_ARGS, SD_BUS_NO_RESULT, object_terminate,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Ping", SD_BUS_NO_ARGS, SD_BUS_RESULT("s", result_json), object_ping,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Exec", SD_BUS_ARGS("as", args, "u", timeout_secs), SD_BUS_RESULT("s", result_json),
                                object_exec, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Eval", SD_BUS_ARGS("s", code), SD_BUS_RESULT("s", result_json),
                                object_eval, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("RunCode", SD_BUS_ARGS("s", code), SD_BUS_RESULT("s", result_json),
                                object_run_code, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Branch", SD_BUS_ARGS("s", tag, "s", mode, "b", wait), SD_BUS_RESULT("a{sv}", info),
                                object_branch, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Fork", SD_BUS_ARGS("u", n), SD_BUS_RESULT("aa{sv}", sandboxes, "t", pause_us),
                                object_fork, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_VTABLE_END,
};
