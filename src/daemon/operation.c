/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "branch.h"
#include "fork-op.h"
#include "image.h"
#include "macro.h"
#include "operation.h"
#include "polkit.h"

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
