/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "branch.h"
#include "fork-op.h"
#include "image.h"
#include "macro.h"
#include "operation.h"
#include "polkit.h"
#include "worker.h"

int operation_new(Manager *m, sd_bus_message *message, Operation **ret) {
        uid_t uid = 0;
        Operation *o;
        int r;

        if (m->n_operations >= m->max_operations)
                return -EBUSY;
        if (message) {
                r = bus_message_sender_uid(message, &m->polkit_registry, &uid);
                if (r < 0)
                        return r;
        }
        o = calloc(1, sizeof(*o));
        if (!o)
                return -ENOMEM;
        o->manager = m;
        o->owner_uid = uid;
        o->message = sd_bus_message_ref(message);
        o->next = m->operations;
        if (m->operations)
                m->operations->prev = o;
        m->operations = o;
        m->n_operations++;
        *ret = o;
        return 0;
}

Operation *operation_free(Operation *o) {
        Manager *m;

        if (!o)
                return NULL;
        m = o->manager;
        if (o->prev)
                o->prev->next = o->next;
        else
                m->operations = o->next;
        if (o->next)
                o->next->prev = o->prev;
        m->n_operations--;
        if (o->tag) {
                hashmap_remove(m->creating, o->tag);
                free(o->tag);
        }
        image_create_free(o->create);
        fork_op_free(o->fork);
        if (o->free_extra)
                o->free_extra(o->extra);
        sd_bus_message_unref(o->message);
        free(o);
        manager_check_idle_exit(m);
        return NULL;
}

int operation_check_tag_free(Manager *m, const char *tag, sd_bus_error *error) {
        if (hashmap_get(m->images, tag) || hashmap_get(m->creating, tag) || branch_in_flight(m, tag))
                return sd_bus_error_setf(error, FORKD_ERROR_SNAPSHOT_EXISTS, "Snapshot %s exists already.", tag);
        return 0;
}

static int prelude_verify(Manager *m, sd_bus_message *message, const OperationPrelude *p, const char *action,
                          const char *verb, sd_bus_error *error) {
        if (p->kind)
                return bus_verify_sandbox_async(message, p->kind, p->id, p->snapshot, p->owner, action, verb,
                                                &m->polkit_registry, error);
        return bus_verify_polkit_async(message, action, (const char *[]) { "snapshot", p->snapshot, "verb", verb, NULL },
                                       &m->polkit_registry, error);
}

int operation_prelude(Manager *m, sd_bus_message *message, const OperationPrelude *p, sd_bus_error *error) {
        int r;

        r = prelude_verify(m, message, p, p->action, p->verb, error);
        if (r > 0 && p->timeout_pause)
                r = prelude_verify(m, message, p, "org.forkd.pause", "timeout", error);
        if (r <= 0)
                return r;
        r = operation_check_not_exiting(m, error);
        if (r < 0)
                return r;
        if (p->tag) {
                r = operation_check_tag_free(m, p->tag, error);
                if (r < 0)
                        return r;
        }
        return 1;
}

int operation_begin(Manager *m, sd_bus_message *message, const char *claim, Operation **ret, sd_bus_error *error) {
        Operation *o = NULL;
        char *tag = NULL;
        int r;

        r = operation_new(m, message, &o);
        if (r == -EBUSY)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "%u operations are running; retry later.",
                                         m->max_operations);
        if (r < 0)
                return r;
        if (claim) {
                tag = strdup(claim);
                if (!tag) {
                        operation_free(o);
                        return -ENOMEM;
                }
                r = hashmap_put(m->creating, tag, o);
                if (r < 0) {
                        free(tag);
                        operation_free(o);
                        return r;
                }
                o->tag = tag;
        }
        *ret = o;
        return 0;
}

int operation_submit(Operation *o, int (*work)(void *o), void (*done)(int r, void *o)) {
        int r = worker_pool_submit(o->manager->workers, work, done, o);

        if (r < 0) {
                operation_free(o);
                return r;
        }
        return 1;
}
