/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The D-Bus face of paused sandboxes: see paused-dbus.h. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "fork-op.h"
#include "fork-options-bus.h"
#include "image.h"
#include "macro.h"
#include "pause-op.h"
#include "paused-dbus.h"
#include "paused.h"
#include "operation.h"
#include "polkit.h"
#include "sandbox.h"
#include "snapshot-meta.h"
#include "strv.h"

int paused_verify(sd_bus_message *message, Paused *p, const char *action, const char *verb, sd_bus_error *error) {
        return bus_verify_sandbox_async(message, "paused sandbox", p->id, p->origin_tag, p->owner_uid, action, verb,
                                        &p->manager->polkit_registry, error);
}

/* The operation prelude of what p starts (resume, fork). */
static int paused_prelude(sd_bus_message *message, Paused *p, const char *action, const char *verb,
                          bool timeout_pause, sd_bus_error *error) {
        const OperationPrelude o = { .action = action, .verb = verb, .snapshot = p->origin_tag,
                                     .kind = "paused sandbox", .id = p->id, .owner = p->owner_uid,
                                     .timeout_pause = timeout_pause };

        return operation_prelude(p->manager, message, &o, error);
}

int bus_paused_method_resume(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Paused *p = userdata;
        int r;

        r = paused_prelude(message, p, "org.forkd.pause", "resume", false, error);
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
        r = paused_prelude(message, p, "org.forkd.branch", "fork", topts.timeout_pause, error);
        if (r <= 0)
                return r < 0 ? r : 1;
        return paused_fork_start(message, p, n, &topts, error);
}

int bus_paused_method_terminate(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Paused *p = userdata;
        int r;

        r = paused_verify(message, p, "org.forkd.terminate", "terminate", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        if (p->resuming)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "Sandbox %s is being resumed.", p->id);
        r = paused_terminate(p);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Failed to remove the record of paused sandbox %s: %m",
                                               p->id);
        return sd_bus_reply_method_return(message, NULL);
}

int bus_paused_method_set_timeout(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Paused *p = userdata;
        uint64_t expires = 0;
        bool pause = false;
        int r;

        r = bus_read_timeout(message, p->expires_at > 0 && p->timeout_pause, &expires, &pause, error);
        if (r < 0)
                return r;
        r = paused_verify(message, p, "org.forkd.pause", "timeout", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        r = paused_set_deadline(p, expires, pause);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Failed to record the deadline of %s: %m", p->id);
        r = bus_sandbox_info_reply(message, p, NULL, &reply);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

/* A paused sandbox's limits are what its resume gets: any may change,
 * memory_limit_mib and cpu_limit included (the resume makes the cgroup). */
int bus_paused_method_set_limits(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Paused *p = userdata;
        struct sandbox_limits l = p->limits, old = p->limits;
        uint32_t mib = 0, old_mib = p->memory_limit_mib;
        bool mib_given = false;
        unsigned given = 0;
        Image *i;
        int r;

        r = bus_read_limits(message, &mib_given, &mib, &l, &given, error);
        if (r < 0)
                return r;
        r = paused_verify(message, p, "org.forkd.pause", "limits", error);
        if (r <= 0)
                return r < 0 ? r : 1;
        if (p->resuming)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "Sandbox %s is being resumed.", p->id);
        i = hashmap_get(p->manager->images, p->tag);
        r = bus_check_limits(p->manager, mib_given ? mib : 0, &l, i ? i->meta.vcpus : 1, error);
        if (r < 0)
                return r;
        p->limits = l;
        if (mib_given)
                p->memory_limit_mib = mib;
        r = paused_record_write(p);
        if (r < 0) {
                p->limits = old;
                p->memory_limit_mib = old_mib;
                return sd_bus_error_set_errnof(error, r, "Failed to record the limits of %s: %m", p->id);
        }
        r = bus_sandbox_info_reply(message, p, NULL, &reply);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

/* ---- the object: org.forkd.PausedSandbox at the sandbox's path ---- */

/* The id's Paused, unless a running sandbox of that id is on the bus (a
 * resume's VM once it answered): then the path is its org.forkd.Sandbox. */
static Paused *paused_by_path(Manager *m, const char *path) {
        _cleanup_free_ char *id = NULL;
        Sandbox *s;

        if (sd_bus_path_decode(path, FORKD_SANDBOX_PREFIX, &id) <= 0)
                return NULL;
        s = hashmap_get(m->sandboxes, id);
        if (s && sandbox_is_visible(s))
                return NULL;
        return hashmap_get(m->paused, id);
}

int paused_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata, void **found,
                       sd_bus_error *error) {
        Paused *p = paused_by_path(userdata, path);

        if (!p)
                return 0;
        *found = p;
        return 1;
}

int paused_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error) {
        Manager *m = userdata;
        HashmapIter it = {};
        char **l;
        size_t n = 0;
        void *v;

        l = calloc(hashmap_size(m->paused) + 1, sizeof(char *));
        if (!l)
                return -ENOMEM;
        while (hashmap_iterate(m->paused, &it, &v)) {
                Paused *p = v;
                Sandbox *s = hashmap_get(m->sandboxes, p->id);

                if (s && sandbox_is_visible(s))
                        continue;
                if (sandbox_object_path(p->id, &l[n]) < 0) {
                        strv_free(l);
                        return -ENOMEM;
                }
                n++;
        }
        *nodes = l;
        return 1;
}

static int property_get_state(sd_bus *bus, const char *path, const char *interface, const char *property,
                              sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        return sd_bus_message_append(reply, "s", "paused");
}

static int property_get_owner(sd_bus *bus, const char *path, const char *interface, const char *property,
                              sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Paused *p = userdata;

        return sd_bus_message_append(reply, "u", (uint32_t) p->owner_uid);
}

/* As the Sandbox object's entry points: polkit may dispatch a message twice. */
#define PAUSED_OBJECT_METHOD(name)                                                              \
        static int object_##name(sd_bus_message *message, void *userdata, sd_bus_error *error) { \
                int r = sd_bus_message_rewind(message, true);                                     \
                if (r < 0)                                                                        \
                        return r;                                                                 \
                return bus_paused_method_##name(message, userdata, error);                        \
        }
PAUSED_OBJECT_METHOD(resume)
PAUSED_OBJECT_METHOD(set_timeout)
PAUSED_OBJECT_METHOD(set_limits)
PAUSED_OBJECT_METHOD(terminate)
PAUSED_OBJECT_METHOD(fork)

const sd_bus_vtable paused_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_PROPERTY("Id", "s", NULL, offsetof(Paused, id), SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("SnapshotTag", "s", NULL, offsetof(Paused, origin_tag), SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("State", "s", property_get_state, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("OwnerUID", "u", property_get_owner, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_METHOD_WITH_ARGS("Resume", SD_BUS_NO_ARGS, SD_BUS_RESULT("a{sv}", info), object_resume,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("SetTimeout", SD_BUS_ARGS("u", timeout_secs, "s", on_timeout),
                                SD_BUS_RESULT("a{sv}", info), object_set_timeout, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("SetLimits", SD_BUS_ARGS("a{sv}", limits), SD_BUS_RESULT("a{sv}", info),
                                object_set_limits, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Terminate", SD_BUS_NO_ARGS, SD_BUS_NO_RESULT, object_terminate,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Fork", SD_BUS_ARGS("u", n), SD_BUS_RESULT("aa{sv}", sandboxes, "t", pause_us),
                                object_fork, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_VTABLE_END,
};
