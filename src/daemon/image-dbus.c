/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "chain.h"
#include "image-dbus.h"
#include "paused.h"
#include "image.h"
#include "macro.h"
#include "polkit.h"
#include "snapshot-meta.h"

static int property_get_created_at(sd_bus *bus, const char *path, const char *interface, const char *property,
                                   sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Image *i = userdata;
        return sd_bus_message_append(reply, "t", (uint64_t) i->meta.created_at_unix);
}

static int property_get_generation(sd_bus *bus, const char *path, const char *interface, const char *property,
                                   sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Image *i = userdata;
        return sd_bus_message_append(reply, "t", i->meta.generation);
}

static int property_get_memory_size(sd_bus *bus, const char *path, const char *interface, const char *property,
                                    sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Image *i = userdata;
        return sd_bus_message_append(reply, "t", i->meta.mem_size);
}

static int property_get_parent_tag(sd_bus *bus, const char *path, const char *interface, const char *property,
                                   sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Image *i = userdata;
        return sd_bus_message_append(reply, "s", i->meta.parent_tag);
}

static int property_get_owner_uid(sd_bus *bus, const char *path, const char *interface, const char *property,
                                  sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Image *i = userdata;
        return sd_bus_message_append(reply, "u", (uint32_t) image_owner(i));
}

static int property_get_status(sd_bus *bus, const char *path, const char *interface, const char *property,
                               sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        return sd_bus_message_append(reply, "s", "ready");
}

int bus_check_tag(const char *tag, const char *what, sd_bus_error *error) {
        if (!snapshot_tag_is_valid(tag))
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "Invalid %s \"%.64s\": it must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$.", what,
                                         tag);
        if (snapshot_tag_is_forkds(tag))
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "Invalid %s \"%.64s\": tags beginning with \"" PAUSED_TAG_PREFIX
                                         "\" are forkd's own (paused sandboxes).", what, tag);
        return 0;
}

int image_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata, void **found,
                      sd_bus_error *error) {
        _cleanup_free_ char *tag = NULL;
        Manager *m = userdata;
        Image *i;
        int r;

        r = sd_bus_path_decode(path, FORKD_SNAPSHOT_PREFIX, &tag);
        if (r <= 0)
                return 0;
        i = hashmap_get(m->images, tag);
        if (!i || snapshot_tag_is_forkds(i->tag))
                return 0;
        *found = i;
        return 1;
}

int image_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error) {
        Manager *m = userdata;
        HashmapIter it = {};
        size_t n = 0;
        char **l;
        void *v;

        l = calloc(hashmap_size(m->images) + 1, sizeof(char *));
        if (!l)
                return -ENOMEM;
        while (hashmap_iterate(m->images, &it, &v)) {
                if (snapshot_tag_is_forkds(((Image *) v)->tag))
                        continue;
                if (image_object_path(((Image *) v)->tag, &l[n]) < 0) {
                        strv_free(l);
                        return -ENOMEM;
                }
                n++;
        }
        *nodes = l;
        return 1;
}

int image_verify(sd_bus_message *message, Image *i, uid_t owner, const char *action, const char *verb,
                 sd_bus_error *error) {
        const char *details[] = { "snapshot", i->tag, "verb", verb, NULL };
        char what[SNAPSHOT_TAG_MAX + 64];

        if (owner == image_owner(i))
                snprintf(what, sizeof(what), "snapshot %s", i->tag);
        else
                snprintf(what, sizeof(what), "snapshot %s and the snapshots below it", i->tag);
        return bus_verify_owner_async(message, owner, what, action, details, &i->manager->polkit_registry, error);
}

static uid_t subtree_owner(Image *i, unsigned depth) {
        uid_t owner = image_owner(i);
        HashmapIter it = {};
        void *v;

        if (depth > SNAPSHOTS_MAX)
                return OWNER_UID_INVALID;
        while (hashmap_iterate(i->manager->images, &it, &v)) {
                Image *c = v;

                if (strcmp(c->meta.parent_tag, i->tag) == 0 && subtree_owner(c, depth + 1) != owner)
                        return OWNER_UID_INVALID;
        }
        return owner;
}

uid_t image_subtree_owner(Image *i) {
        return subtree_owner(i, 0);
}

int bus_image_method_delete(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Image *i = userdata;
        int cascade, force, r;

        r = sd_bus_message_read(message, "bb", &cascade, &force);
        if (r < 0)
                return r;
        if (cascade && force)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "cascade and force exclude each other.");

        /* cascade deletes, force orphans, every snapshot below: all must be the caller's */
        r = image_verify(message, i, cascade || force ? image_subtree_owner(i) : image_owner(i),
                         "org.forkd.manage-snapshots", "delete", error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1;

        return chain_delete(i, cascade, force, message, error);
}

static int object_delete(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        /* Dispatched again after polkit answers: read from the start. */
        int r = sd_bus_message_rewind(message, true);
        if (r < 0)
                return r;
        return bus_image_method_delete(message, userdata, error);
}

const sd_bus_vtable image_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_PROPERTY("Tag", "s", NULL, offsetof(Image, tag), SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("Directory", "s", NULL, offsetof(Image, dir), SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("CreatedAt", "t", property_get_created_at, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("Generation", "t", property_get_generation, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("MemorySize", "t", property_get_memory_size, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("ParentTag", "s", property_get_parent_tag, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("Status", "s", property_get_status, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("OwnerUID", "u", property_get_owner_uid, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_METHOD_WITH_ARGS("Delete", SD_BUS_ARGS("b", cascade, "b", force), SD_BUS_NO_RESULT,
                                object_delete, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_VTABLE_END,
};
