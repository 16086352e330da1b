/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <sys/stat.h>
#include <unistd.h>


#include "chain.h"
#include "boot-files.h"
#include "fork-op.h"
#include "fs-util.h"
#include "image-dbus.h"
#include "image.h"
#include "macro.h"
#include "manager-dbus.h"
#include "operation.h"
#include "pack-op.h"
#include "pushpull-op.h"
#include "paused-dbus.h"
#include "polkit.h"
#include "branch.h"
#include "sandbox-fork.h"
#include "sandbox-dbus.h"
#include "sandbox-proc-dbus.h"
#include "sandbox.h"
#include "snapshot-meta.h"
#include "usage-batch.h"
#include "usage.h"
#include "worker.h"

/* ---- properties ---- */

static int property_get_version(sd_bus *bus, const char *path, const char *interface, const char *property,
                                sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        return sd_bus_message_append(reply, "s", FORKD_VERSION);
}

static int property_get_state_dir(sd_bus *bus, const char *path, const char *interface, const char *property,
                                  sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        return sd_bus_message_append(reply, "s", m->state_dir);
}

static int property_get_direct_socket(sd_bus *bus, const char *path, const char *interface, const char *property,
                                      sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        return sd_bus_message_append(reply, "s", m->direct_path ?: "");
}

static int property_get_snapshot_count(sd_bus *bus, const char *path, const char *interface, const char *property,
                                       sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        return sd_bus_message_append(reply, "u", (uint32_t) hashmap_size(m->images));
}

static int property_get_sandbox_count(sd_bus *bus, const char *path, const char *interface, const char *property,
                                      sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        return sd_bus_message_append(reply, "u", (uint32_t) manager_n_visible_sandboxes(m));
}

/* The namespace pool (--netns-pool): policy -> namespaces ready now, for the
 * policies a fork asked for; empty without a pool. */
static int property_get_netns_pool(sd_bus *bus, const char *path, const char *interface, const char *property,
                                   sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        int r;

        r = sd_bus_message_open_container(reply, 'a', "{su}");
        for (int k = 0; r >= 0 && m->netns_pool && k < _NETNS_POLICY_MAX; k++) {
                bool wanted;
                unsigned n = netns_pool_ready(m->netns_pool, (NetnsPolicy) k, &wanted);

                if (wanted)
                        r = sd_bus_message_append(reply, "{su}", netns_policy_to_string((NetnsPolicy) k),
                                                  (uint32_t) n);
        }
        return r < 0 ? r : sd_bus_message_close_container(reply);
}

static int property_get_netns_pool_size(sd_bus *bus, const char *path, const char *interface,
                                        const char *property, sd_bus_message *reply, void *userdata,
                                        sd_bus_error *error) {
        Manager *m = userdata;
        return sd_bus_message_append(reply, "u", (uint32_t) netns_pool_size(m->netns_pool));
}

/* ---- lookups with precise errors ---- */

int bus_manager_get_image(Manager *m, const char *tag, Image **ret, sd_bus_error *error) {
        Image *i = NULL;
        int r = bus_check_tag(tag, "snapshot tag", error);

        if (r < 0)
                return r;
        i = hashmap_get(m->images, tag);
        if (!i)
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SNAPSHOT, "No snapshot with tag %s.", tag);
        *ret = i;
        return 0;
}

static int get_sandbox(Manager *m, const char *id, Sandbox **ret, sd_bus_error *error) {
        Sandbox *s = NULL;

        if (!snapshot_tag_is_valid(id))
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Invalid sandbox id \"%.64s\".", id);
        s = hashmap_get(m->sandboxes, id);
        if ((!s || !sandbox_is_visible(s)) && hashmap_get(m->paused, id))
                return sd_bus_error_setf(error, FORKD_ERROR_PAUSED, "sandbox %s is paused", id);
        if (!s || !sandbox_is_visible(s))
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "No sandbox with id %s.", id);
        if (s->pausing)
                return bus_sandbox_error_pausing(id, error);
        *ret = s;
        return 0;
}

/* The sandbox id, running (pausing included) or paused: one of *ret_s, *ret_p is set. */
static int get_sandbox_or_paused(Manager *m, const char *id, Sandbox **ret_s, Paused **ret_p, sd_bus_error *error) {
        Sandbox *s;

        if (!snapshot_tag_is_valid(id))
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Invalid sandbox id \"%.64s\".", id);
        s = hashmap_get(m->sandboxes, id);
        *ret_s = s && sandbox_is_visible(s) ? s : NULL;
        *ret_p = *ret_s ? NULL : hashmap_get(m->paused, id);
        if (!*ret_s && !*ret_p)
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "No sandbox with id %s.", id);
        return 0;
}

/* ---- snapshots ---- */

static int method_list_snapshots(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Manager *m = userdata;
        HashmapIter it = {};
        void *v;
        int r;

        r = sd_bus_message_new_method_return(message, &reply);
        if (r < 0)
                return r;
        r = sd_bus_message_open_container(reply, 'a', "a{sv}");
        if (r < 0)
                return r;
        while (hashmap_iterate(m->images, &it, &v)) {
                if (snapshot_tag_is_forkds(((Image *) v)->tag))
                        continue; /* a paused sandbox's state */
                r = image_append_info(reply, v, false);
                if (r < 0)
                        return r;
        }
        r = branch_append_in_flight(reply, m);
        if (r < 0)
                return r;
        r = sd_bus_message_close_container(reply);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

static int method_get_snapshot_info(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Manager *m = userdata;
        const char *tag;
        Image *i = NULL;
        int r;

        r = sd_bus_message_rewind(message, true); /* polkit may dispatch it twice */
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "s", &tag);
        if (r < 0)
                return r;
        r = bus_manager_get_image(m, tag, &i, error);
        if (r < 0)
                return r;
        /* Its owner needs nothing more; anyone else org.forkd.manage-all. */
        r = image_verify(message, i, image_owner(i), NULL, "info", error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1;
        r = sd_bus_message_new_method_return(message, &reply);
        if (r < 0)
                return r;
        r = image_append_info(reply, i, true);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Failed to inspect snapshot %s: %m", tag);
        return sd_bus_send(NULL, reply, NULL);
}

static int method_delete_snapshot(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        const char *tag;
        Image *i = NULL;
        int r;

        r = sd_bus_message_rewind(message, true); /* polkit may dispatch it twice */
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "s", &tag);
        if (r < 0)
                return r;
        if (!hashmap_get(m->images, tag) && branch_failed(m, tag)) {
                /* A failed live branch, listed as such until now. */
                char what[SNAPSHOT_TAG_MAX + 32];

                snprintf(what, sizeof(what), "failed branch %s", tag);
                r = bus_verify_owner_async(message, branch_failed_owner(m, tag), what, "org.forkd.manage-snapshots",
                                           (const char *[]) { "snapshot", tag, "verb", "delete", NULL },
                                           &m->polkit_registry, error);
                if (r <= 0)
                        return r < 0 ? r : 1;
                branch_forget_failed(m, tag);
                return sd_bus_reply_method_return(message, NULL);
        }
        r = bus_manager_get_image(m, tag, &i, error);
        if (r < 0)
                return r;
        return bus_image_method_delete(message, i, error);
}

/* CompactSnapshot, PackSnapshot and UnpackSnapshot: the arguments and polkit
 * here, the operations in chain.c and pack-op.c. */

static int method_compact_snapshot(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        const char *tag, *to;
        Image *i;
        int r;

        r = sd_bus_message_rewind(message, true); /* polkit may dispatch it twice */
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "ss", &tag, &to);
        if (r < 0)
                return r;
        r = bus_check_tag(tag, "snapshot tag", error);
        if (r < 0)
                return r;
        r = bus_check_tag(to, "target tag", error);
        if (r < 0)
                return r;
        if (strcmp(tag, to) == 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                         "\"to\" must differ from the snapshot compacted (%s).", tag);
        i = hashmap_get(m->images, tag);
        if (!i)
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SNAPSHOT, "No snapshot with tag %s.", tag);

        r = operation_prelude(m, message,
                              &(OperationPrelude) { .action = "org.forkd.manage-snapshots", .verb = "compact",
                                                    .snapshot = tag,
                                                    .tag = to },
                              error);
        if (r <= 0)
                return r < 0 ? r : 1;

        return chain_compact_start(m, message, tag, to, error);
}

static int method_pack_snapshot(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        const char *tag;
        int fd, r;

        r = sd_bus_message_rewind(message, true); /* polkit may dispatch it twice */
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "sh", &tag, &fd);
        if (r < 0)
                return r;
        r = bus_check_tag(tag, "snapshot tag", error);
        if (r < 0)
                return r;
        r = operation_prelude(m, message,
                              &(OperationPrelude) { .action = "org.forkd.manage-snapshots", .verb = "pack",
                                                    .snapshot = tag },
                              error);
        if (r <= 0)
                return r < 0 ? r : 1;

        return pack_snapshot_start(m, message, tag, fd, error);
}

static int method_unpack_snapshot(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        const char *new_tag;
        int fd, r;

        r = sd_bus_message_rewind(message, true); /* polkit may dispatch it twice */
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "hs", &fd, &new_tag);
        if (r < 0)
                return r;
        r = new_tag[0] ? bus_check_tag(new_tag, "snapshot tag", error) : 0;
        if (r < 0)
                return r;
        r = operation_prelude(m, message,
                              &(OperationPrelude) { .action = "org.forkd.manage-snapshots", .verb = "unpack",
                                                    .snapshot = new_tag,
                                                    .tag = new_tag[0] ? new_tag : NULL },
                              error);
        if (r <= 0)
                return r < 0 ? r : 1;

        return unpack_snapshot_start(m, message, fd, new_tag, error);
}

/* PushSnapshot and PullSnapshot: the operations in pushpull-op.c. */

static int method_push_snapshot(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        const char *tag, *ref;
        int r;

        r = sd_bus_message_rewind(message, true); /* polkit may dispatch it twice */
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "ss", &tag, &ref);
        if (r < 0)
                return r;
        r = bus_check_tag(tag, "snapshot tag", error);
        if (r < 0)
                return r;
        r = operation_prelude(m, message,
                              &(OperationPrelude) { .action = "org.forkd.manage-snapshots", .verb = "push",
                                                    .snapshot = tag },
                              error);
        if (r <= 0)
                return r < 0 ? r : 1;

        return push_snapshot_start(m, message, tag, ref, error);
}

static int method_pull_snapshot(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        const char *ref, *new_tag;
        int r;

        r = sd_bus_message_rewind(message, true); /* polkit may dispatch it twice */
        if (r < 0)
                return r;
        r = sd_bus_message_read(message, "ss", &ref, &new_tag);
        if (r < 0)
                return r;
        r = new_tag[0] ? bus_check_tag(new_tag, "snapshot tag", error) : 0;
        if (r < 0)
                return r;
        r = operation_prelude(m, message,
                              &(OperationPrelude) { .action = "org.forkd.manage-snapshots", .verb = "pull",
                                                    .snapshot = new_tag,
                                                    .tag = new_tag[0] ? new_tag : NULL },
                              error);
        if (r <= 0)
                return r < 0 ? r : 1;

        return pull_snapshot_start(m, message, ref, new_tag, error);
}

/* ---- sandboxes ---- */

/* Root and holders of org.forkd.manage-all see every sandbox (*ret_all),
 * anyone else their own only. Returns 1 once decided, 0 while polkit's answer
 * is awaited (the call is dispatched again), or a negative errno. */
static int caller_sees_all(sd_bus_message *message, Manager *m, const char *verb, uid_t *ret_uid, bool *ret_all,
                           sd_bus_error *error) {
        uid_t uid;
        int r;

        r = bus_message_sender_uid(message, &m->polkit_registry, &uid);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Cannot determine the caller's credentials: %m");
        if (uid == 0)
                *ret_all = true;
        else {
                _cleanup_(sd_bus_error_free) sd_bus_error e = SD_BUS_ERROR_NULL;

                r = bus_verify_polkit_async(message, POLKIT_ACTION_MANAGE_ALL,
                                            (const char *[]) { "verb", verb, NULL }, &m->polkit_registry, &e);
                if (r == 0)
                        return 0;
                if (r < 0 && r != -EACCES) {
                        sd_bus_error_move(error, &e);
                        return r;
                }
                *ret_all = r > 0; /* refused: the caller's own only */
        }
        *ret_uid = uid;
        return 1;
}

/* Root and holders of org.forkd.manage-all see every sandbox; anyone else
 * sees their own only (others' are left out, not shown without details). */
static void read_usage(void *item, SandboxUsage *ret) {
        sandbox_read_usage(item, ret);
}

/* The running sandboxes the caller sees, each with its usage when usage is set
 * (read beside the reply by a UsageBatch). */
static int append_running(sd_bus_message *reply, Manager *m, bool all, uid_t uid, bool usage) {
        _cleanup_free_ Sandbox **list = NULL;
        UsageBatch batch = {};
        HashmapIter it = {};
        size_t n = 0;
        void *v;
        int r = 0;

        list = calloc(MAX(hashmap_size(m->sandboxes), 1u), sizeof(Sandbox *));
        if (!list)
                return -ENOMEM;
        while (hashmap_iterate(m->sandboxes, &it, &v)) {
                Sandbox *sb = v;

                if (sandbox_is_visible(sb) && (all || sb->owner_uid == uid))
                        list[n++] = sb;
        }
        if (usage) {
                r = usage_batch_start(&batch, (void *const *) list, n, read_usage);
                if (r < 0)
                        return r;
        }
        for (size_t i = 0; r >= 0 && i < n; i++)
                r = sandbox_append_info_ex(reply, list[i], usage ? usage_batch_get(&batch, i) : NULL);
        usage_batch_done(&batch);
        return r;
}

static int list_sandboxes(sd_bus_message *message, Manager *m, bool usage, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        HashmapIter it = {};
        bool all = false;
        uid_t uid;
        void *v;
        int r;

        r = caller_sees_all(message, m, "list", &uid, &all, error);
        if (r <= 0)
                return r < 0 ? r : 1;

        r = sd_bus_message_new_method_return(message, &reply);
        if (r < 0)
                return r;
        r = sd_bus_message_open_container(reply, 'a', "a{sv}");
        if (r < 0)
                return r;
        r = append_running(reply, m, all, uid, usage);
        if (r < 0)
                return r;
        while (hashmap_iterate(m->paused, &it, &v)) {
                Paused *p = v;

                if ((!all && p->owner_uid != uid) || hashmap_get(m->sandboxes, p->id))
                        continue; /* a resume's new VM, until it answers, is the paused one */
                r = paused_append_info(reply, p);
                if (r < 0)
                        return r;
        }
        r = sd_bus_message_close_container(reply);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

static int method_list_sandboxes(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return list_sandboxes(message, userdata, true, error);
}

/* ListSandboxes with options: "usage" b (default true). Read from the start
 * again: polkit may dispatch a call twice. */
static int method_list_sandboxes_ex(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        bool usage = true;
        int r;

        r = sd_bus_message_rewind(message, true);
        if (r < 0)
                return r;
        r = sd_bus_message_enter_container(message, 'a', "{sv}");
        if (r < 0)
                return r;
        while ((r = sd_bus_message_enter_container(message, 'e', "sv")) > 0) {
                const char *key;
                int b;

                r = sd_bus_message_read(message, "s", &key);
                if (r < 0)
                        return r;
                if (!streq(key, "usage"))
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Unknown option \"%s\"", key);
                r = sd_bus_message_read(message, "v", "b", &b);
                if (r < 0)
                        return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "Option \"usage\" must be a boolean");
                usage = b;
                r = sd_bus_message_exit_container(message);
                if (r < 0)
                        return r;
        }
        if (r < 0)
                return r;
        r = sd_bus_message_exit_container(message);
        if (r < 0)
                return r;
        return list_sandboxes(message, userdata, usage, error);
}

/* A histogram as (bounds, cumulative counts, sum, count): "(atattt)", in usec. */
static int append_histogram(sd_bus_message *reply, const char *name, const Histogram *h) {
        uint64_t cum[HISTOGRAM_N_BOUNDS + 1];
        int r;

        histogram_cumulative(h, cum);
        r = sd_bus_message_open_container(reply, 'e', "sv");
        if (r >= 0)
                r = sd_bus_message_append(reply, "s", name);
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'v', "(atattt)");
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'r', "atattt");
        if (r >= 0)
                r = sd_bus_message_append_array(reply, 't', histogram_bounds_usec, sizeof(histogram_bounds_usec));
        if (r >= 0)
                r = sd_bus_message_append_array(reply, 't', cum, sizeof(cum));
        if (r >= 0)
                r = sd_bus_message_append(reply, "tt", h->sum_usec, h->count);
        for (unsigned k = 0; r >= 0 && k < 3; k++)
                r = sd_bus_message_close_container(reply);
        return r;
}

/* The totals of the running sandboxes' usage and forkd's latency histograms.
 * As in ListSandboxes, root and holders of org.forkd.manage-all sum every
 * sandbox, anyone else their own; the histograms are forkd's, whole. */
static int method_get_metrics(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Manager *m = userdata;
        HashmapIter it = {};
        uint64_t cpu = 0, priv = 0, shared = 0, rd = 0, wr = 0, rx = 0, tx = 0;
        uint32_t n = 0;
        bool all = false;
        uid_t uid;
        void *v;
        int r;

        r = caller_sees_all(message, m, "metrics", &uid, &all, error);
        if (r <= 0)
                return r < 0 ? r : 1;
        while (hashmap_iterate(m->sandboxes, &it, &v)) {
                Sandbox *sb = v;
                SandboxUsage u;

                if (!sandbox_is_visible(sb) || (!all && sb->owner_uid != uid))
                        continue;
                sandbox_read_usage(sb, &u);
                n++;
                cpu += u.cpu_usec;
                priv += u.memory_private_kib;
                shared += u.memory_shared_kib;
                if (u.have_stats) {
                        rd += u.stats.disk_read_bytes;
                        wr += u.stats.disk_written_bytes;
                        rx += u.stats.net_rx_bytes;
                        tx += u.stats.net_tx_bytes;
                }
        }
        r = sd_bus_message_new_method_return(message, &reply);
        if (r < 0)
                return r;
        r = sd_bus_message_open_container(reply, 'a', "{sv}");
        if (r < 0)
                return r;
        r = sd_bus_message_append(reply, "{sv}{sv}{sv}{sv}{sv}{sv}{sv}{sv}", "sandboxes", "u", n, "cpu_usec", "t", cpu,
                                  "memory_private_kib", "t", priv, "memory_shared_kib", "t", shared,
                                  "disk_read_bytes", "t", rd, "disk_written_bytes", "t", wr, "net_rx_bytes", "t", rx,
                                  "net_tx_bytes", "t", tx);
        if (r >= 0)
                r = append_histogram(reply, "fork_latency_usec", &m->fork_latency);
        if (r >= 0)
                r = append_histogram(reply, "branch_pause_usec", &m->branch_pause);
        if (r >= 0)
                r = append_histogram(reply, "agent_call_usec", &m->agent_call);
        if (r >= 0)
                r = sd_bus_message_close_container(reply);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

/* The id a method starts with, read from the start again: polkit may dispatch a call twice. */
static int read_leading_id(sd_bus_message *message, const char **ret) {
        int r = sd_bus_message_rewind(message, true);

        return r < 0 ? r : sd_bus_message_read(message, "s", ret);
}

static int method_get_sandbox(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Manager *m = userdata;
        const char *id;
        Sandbox *s = NULL;
        Paused *p = NULL;
        int r;

        r = read_leading_id(message, &id);
        if (r < 0)
                return r;
        r = get_sandbox_or_paused(m, id, &s, &p, error);
        if (r < 0)
                return r;
        /* Its owner needs nothing more; anyone else org.forkd.manage-all. */
        r = s ? sandbox_verify(message, s, NULL, "get", error) : paused_verify(message, p, NULL, "get", error);
        if (r < 0)
                return r;
        if (r == 0)
                return 1;
        r = sd_bus_message_new_method_return(message, &reply);
        if (r < 0)
                return r;
        r = s ? sandbox_append_info(reply, s) : paused_append_info(reply, p);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

/* Manager methods taking an id: look the sandbox up and hand over to its
 * object's handler, so that each verb has one authorization path. */
static int forward_to_sandbox(sd_bus_message *message, Manager *m, sd_bus_message_handler_t handler,
                              sd_bus_error *error) {
        const char *id;
        Sandbox *s = NULL;
        int r;

        r = read_leading_id(message, &id);
        if (r < 0)
                return r;
        r = get_sandbox(m, id, &s, error);
        if (r < 0)
                return r;
        return handler(message, s, error);
}

/* The same for verbs that also take a paused sandbox: paused() gets the Paused
 * (NULL: ResumeSandbox, which a running sandbox, pausing or not, answers as
 * its object's Resume does: NotPaused). */
static int forward_to_either(sd_bus_message *message, Manager *m, sd_bus_message_handler_t running,
                             sd_bus_message_handler_t paused, sd_bus_error *error) {
        const char *id;
        Sandbox *s = NULL;
        Paused *p = NULL;
        int r;

        r = read_leading_id(message, &id);
        if (r < 0)
                return r;
        r = get_sandbox_or_paused(m, id, &s, &p, error);
        if (r < 0)
                return r;
        if (s && !running)
                return bus_sandbox_method_resume(message, s, error); /* NotPaused */
        if (s && s->pausing)
                return bus_sandbox_error_pausing(id, error);
        return s ? running(message, s, error) : paused(message, p, error);
}

static int method_terminate_sandbox(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_either(message, userdata, bus_sandbox_method_terminate, bus_paused_method_terminate, error);
}

static int method_pause_sandbox(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_sandbox(message, userdata, bus_sandbox_method_pause, error);
}

static int method_set_sandbox_timeout(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_either(message, userdata, bus_sandbox_method_set_timeout, bus_paused_method_set_timeout,
                                 error);
}

static int method_set_sandbox_limits(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_either(message, userdata, bus_sandbox_method_set_limits, bus_paused_method_set_limits,
                                 error);
}

static int method_resume_sandbox(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_either(message, userdata, NULL, bus_paused_method_resume, error);
}

static int method_ping(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_sandbox(message, userdata, bus_sandbox_method_ping, error);
}

static int method_exec(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_sandbox(message, userdata, bus_sandbox_method_exec, error);
}

static int method_eval(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_sandbox(message, userdata, bus_sandbox_method_eval, error);
}

static int method_run_code(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_sandbox(message, userdata, bus_sandbox_method_run_code, error);
}

static int method_branch_sandbox(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_sandbox(message, userdata, bus_sandbox_method_branch, error);
}

static int method_fork_sandbox(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_either(message, userdata, bus_sandbox_method_fork, bus_paused_method_fork, error);
}

static int method_merge_sandbox(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_sandbox(message, userdata, bus_sandbox_method_merge, error);
}

static int method_diff_sandboxes(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_sandbox(message, userdata, bus_sandbox_method_diff, error);
}

#define FORWARD(name)                                                                                 \
        static int method_##name(sd_bus_message *message, void *userdata, sd_bus_error *error) {       \
                return forward_to_sandbox(message, userdata, bus_sandbox_method_##name, error);         \
        }
FORWARD(start_process)
FORWARD(list_processes)
FORWARD(signal_process)
FORWARD(write_stdin)
FORWARD(resize_pty)
FORWARD(read_output)
FORWARD(open_output_stream)
FORWARD(start_process_stream)

static int method_write_file(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_sandbox(message, userdata, bus_sandbox_method_write_file, error);
}

static int method_expose_port(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_sandbox(message, userdata, bus_sandbox_method_expose_port, error);
}

static int method_read_file(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        return forward_to_sandbox(message, userdata, bus_sandbox_method_read_file, error);
}

const sd_bus_vtable manager_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_PROPERTY("Version", "s", property_get_version, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("StateDirectory", "s", property_get_state_dir, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("DirectSocket", "s", property_get_direct_socket, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("SnapshotCount", "u", property_get_snapshot_count, 0, 0),
        SD_BUS_PROPERTY("SandboxCount", "u", property_get_sandbox_count, 0, 0),
        SD_BUS_PROPERTY("NetnsPoolSize", "u", property_get_netns_pool_size, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("NetnsPool", "a{su}", property_get_netns_pool, 0, 0),

        SD_BUS_METHOD_WITH_ARGS("CreateSnapshot",
                                SD_BUS_ARGS("s", tag, "s", kernel, "s", rootfs, "u", mem_mib, "u", boot_wait_secs),
                                SD_BUS_RESULT("a{sv}", info), bus_manager_method_create_snapshot,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("CreateSnapshotFromFds",
                                SD_BUS_ARGS("s", tag, "h", kernel, "h", rootfs, "u", mem_mib, "u", boot_wait_secs,
                                            "a{sv}", options),
                                SD_BUS_RESULT("a{sv}", info), bus_manager_method_create_snapshot_from_fds,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("CreateSnapshotFromImage",
                                SD_BUS_ARGS("s", tag, "h", image, "u", mem_mib, "u", boot_wait_secs, "a{sv}", options),
                                SD_BUS_RESULT("a{sv}", info), bus_manager_method_create_snapshot_from_image,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("CreateSnapshotFromImageRef",
                                SD_BUS_ARGS("s", tag, "s", ref, "u", mem_mib, "u", boot_wait_secs, "a{sv}", options),
                                SD_BUS_RESULT("a{sv}", info), bus_manager_method_create_snapshot_from_image_ref,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ListSnapshots", SD_BUS_NO_ARGS, SD_BUS_RESULT("aa{sv}", snapshots),
                                method_list_snapshots, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("GetSnapshotInfo", SD_BUS_ARGS("s", tag), SD_BUS_RESULT("a{sv}", info),
                                method_get_snapshot_info, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("DeleteSnapshot", SD_BUS_ARGS("s", tag, "b", cascade, "b", force), SD_BUS_NO_RESULT,
                                method_delete_snapshot, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("CompactSnapshot", SD_BUS_ARGS("s", tag, "s", to), SD_BUS_RESULT("a{sv}", info),
                                method_compact_snapshot, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("PackSnapshot", SD_BUS_ARGS("s", tag, "h", fd), SD_BUS_RESULT("as", tags, "t", bytes),
                                method_pack_snapshot, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("PushSnapshot", SD_BUS_ARGS("s", tag, "s", ref, "a{sv}", options),
                                SD_BUS_RESULT("a{sv}", result), method_push_snapshot, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("PullSnapshot", SD_BUS_ARGS("s", ref, "s", tag, "a{sv}", options),
                                SD_BUS_RESULT("aa{sv}", snapshots), method_pull_snapshot, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("UnpackSnapshot", SD_BUS_ARGS("h", fd, "s", new_tag),
                                SD_BUS_RESULT("aa{sv}", snapshots), method_unpack_snapshot,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Fork", SD_BUS_ARGS("s", snapshot_tag, "u", n, "a{sv}", options),
                                SD_BUS_RESULT("aa{sv}", sandboxes), bus_manager_method_fork, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ListSandboxes", SD_BUS_NO_ARGS, SD_BUS_RESULT("aa{sv}", sandboxes),
                                method_list_sandboxes, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ListSandboxesEx", SD_BUS_ARGS("a{sv}", options), SD_BUS_RESULT("aa{sv}", sandboxes),
                                method_list_sandboxes_ex, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("GetMetrics", SD_BUS_NO_ARGS, SD_BUS_RESULT("a{sv}", metrics),
                                method_get_metrics, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("GetSandbox", SD_BUS_ARGS("s", id), SD_BUS_RESULT("a{sv}", info), method_get_sandbox,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("TerminateSandbox", SD_BUS_ARGS("s", id), SD_BUS_NO_RESULT, method_terminate_sandbox,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("TerminateSandboxes", SD_BUS_ARGS("as", ids), SD_BUS_RESULT("as", unknown),
                                bus_manager_method_terminate_sandboxes, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Ping", SD_BUS_ARGS("s", id), SD_BUS_RESULT("s", result_json), method_ping,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Exec", SD_BUS_ARGS("s", id, "as", args, "u", timeout_secs),
                                SD_BUS_RESULT("s", result_json), method_exec, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Eval", SD_BUS_ARGS("s", id, "s", code), SD_BUS_RESULT("s", result_json), method_eval,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("RunCode", SD_BUS_ARGS("s", id, "s", code, "u", timeout_secs),
                                SD_BUS_RESULT("s", result_json), method_run_code, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("BranchSandbox", SD_BUS_ARGS("s", id, "s", tag, "s", mode, "b", wait),
                                SD_BUS_RESULT("a{sv}", info), method_branch_sandbox, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("PauseSandbox", SD_BUS_ARGS("s", id), SD_BUS_RESULT("a{sv}", info),
                                method_pause_sandbox, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ResumeSandbox", SD_BUS_ARGS("s", id), SD_BUS_RESULT("a{sv}", info),
                                method_resume_sandbox, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("SetSandboxTimeout", SD_BUS_ARGS("s", id, "u", timeout_secs, "s", on_timeout),
                                SD_BUS_RESULT("a{sv}", info), method_set_sandbox_timeout, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("SetSandboxLimits", SD_BUS_ARGS("s", id, "a{sv}", limits),
                                SD_BUS_RESULT("a{sv}", info), method_set_sandbox_limits, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ForkSandboxEx", SD_BUS_ARGS("s", id, "u", n, "a{sv}", options),
                                SD_BUS_RESULT("aa{sv}", sandboxes, "t", pause_us), method_fork_sandbox,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ForkSandbox", SD_BUS_ARGS("s", id, "u", n),
                                SD_BUS_RESULT("aa{sv}", sandboxes, "t", pause_us), method_fork_sandbox,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("MergeSandbox", SD_BUS_ARGS("s", id, "s", winner), SD_BUS_RESULT("a{sv}", info),
                                method_merge_sandbox, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("DiffSandboxes", SD_BUS_ARGS("s", id, "s", other, "as", paths),
                                SD_BUS_RESULT("as", added, "as", removed, "as", modified), method_diff_sandboxes,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("WriteFile", SD_BUS_ARGS("s", id, "s", path, "ay", data, "u", mode),
                                SD_BUS_RESULT("t", size), method_write_file, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ReadFile", SD_BUS_ARGS("s", id, "s", path), SD_BUS_RESULT("ay", data),
                                method_read_file, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ExposePort", SD_BUS_ARGS("s", id, "q", port), SD_BUS_RESULT("s", host_addr),
                                method_expose_port, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("StartSandboxProcess", SD_BUS_ARGS("s", id, "as", argv, "a{sv}", options),
                                SD_BUS_RESULT("u", pid), method_start_process, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("StartSandboxProcessStream", SD_BUS_ARGS("s", id, "as", argv, "a{sv}", options),
                                SD_BUS_RESULT("u", pid, "h", fd), method_start_process_stream,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ListSandboxProcesses", SD_BUS_ARGS("s", id), SD_BUS_RESULT("aa{sv}", processes),
                                method_list_processes, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("SignalSandboxProcess", SD_BUS_ARGS("s", id, "u", pid, "s", signal), SD_BUS_NO_RESULT,
                                method_signal_process, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("WriteSandboxStdin", SD_BUS_ARGS("s", id, "u", pid, "ay", data, "b", eof),
                                SD_BUS_RESULT("u", written), method_write_stdin, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ResizeSandboxPty", SD_BUS_ARGS("s", id, "u", pid, "q", cols, "q", rows),
                                SD_BUS_NO_RESULT, method_resize_pty, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ReadSandboxOutput", SD_BUS_ARGS("s", id, "u", pid, "t", offset, "u", max),
                                SD_BUS_RESULT("a(stay)", chunks, "t", next_offset, "t", gap, "b", exited, "i",
                                              exit_code, "i", signal),
                                method_read_output, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("OpenSandboxOutputStream", SD_BUS_ARGS("s", id, "u", pid, "t", offset),
                                SD_BUS_RESULT("h", fd), method_open_output_stream, SD_BUS_VTABLE_UNPRIVILEGED),

        SD_BUS_SIGNAL_WITH_ARGS("SnapshotNew", SD_BUS_ARGS("s", tag, "o", object), 0),
        SD_BUS_SIGNAL_WITH_ARGS("SnapshotRemoved", SD_BUS_ARGS("s", tag, "o", object), 0),
        SD_BUS_SIGNAL_WITH_ARGS("SandboxNew", SD_BUS_ARGS("s", id, "o", object), 0),
        SD_BUS_SIGNAL_WITH_ARGS("SandboxRemoved", SD_BUS_ARGS("s", id, "o", object, "s", reason), 0),
        SD_BUS_VTABLE_END,
};

int manager_add_bus_objects_to(Manager *m, sd_bus *bus) {
        int r;

        r = sd_bus_add_object_vtable(bus, NULL, FORKD_MANAGER_PATH, FORKD_BUS_NAME, manager_vtable, m);
        if (r < 0)
                return log_error_errno(r, "Failed to add the manager object: %m");
        r = sd_bus_add_fallback_vtable(bus, NULL, FORKD_SNAPSHOT_PREFIX, "org.forkd.Snapshot", image_vtable,
                                       image_object_find, m);
        if (r < 0)
                return log_error_errno(r, "Failed to add the snapshot objects: %m");
        r = sd_bus_add_node_enumerator(bus, NULL, FORKD_SNAPSHOT_PREFIX, image_node_enumerator, m);
        if (r < 0)
                return log_error_errno(r, "Failed to add the snapshot enumerator: %m");
        r = sd_bus_add_fallback_vtable(bus, NULL, FORKD_SANDBOX_PREFIX, "org.forkd.Sandbox", sandbox_vtable,
                                       sandbox_object_find, m);
        if (r < 0)
                return log_error_errno(r, "Failed to add the sandbox objects: %m");
        /* Processes (sandbox-proc-dbus.c): more methods of the same interface. */
        r = sd_bus_add_fallback_vtable(bus, NULL, FORKD_SANDBOX_PREFIX, "org.forkd.Sandbox", sandbox_proc_vtable,
                                       sandbox_object_find, m);
        if (r < 0)
                return log_error_errno(r, "Failed to add the sandbox process methods: %m");
        r = sd_bus_add_node_enumerator(bus, NULL, FORKD_SANDBOX_PREFIX, sandbox_node_enumerator, m);
        if (r < 0)
                return log_error_errno(r, "Failed to add the sandbox enumerator: %m");
        r = sd_bus_add_fallback_vtable(bus, NULL, FORKD_SANDBOX_PREFIX, "org.forkd.PausedSandbox", paused_vtable,
                                       paused_object_find, m);
        if (r < 0)
                return log_error_errno(r, "Failed to add the paused sandbox objects: %m");
        r = sd_bus_add_node_enumerator(bus, NULL, FORKD_SANDBOX_PREFIX, paused_node_enumerator, m);
        if (r < 0)
                return log_error_errno(r, "Failed to add the paused sandbox enumerator: %m");
        return 0;
}

int manager_add_bus_objects(Manager *m) {
        return manager_add_bus_objects_to(m, m->bus);
}
