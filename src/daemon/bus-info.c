/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* What operations and bus faces both send: see bus-info.h. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <json-c/json.h>

#include "bus-info.h"
#include "json-util.h"
#include "forkd-bus.h"
#include "image.h"
#include "macro.h"
#include "paused.h"
#include "sandbox.h"
#include "snapshot-meta.h"
#include "usage.h"

/* ---- snapshots ---- */


/* cpu_limit (d), disk_rate and net_rate (a{st}: bandwidth, ops, burst), where set. */
static int append_rate(sd_bus_message *reply, const char *key, const struct rate_limit *l) {
        int r;

        if (!rate_limit_is_set(l))
                return 0;
        r = sd_bus_message_open_container(reply, 'e', "sv");
        if (r >= 0)
                r = sd_bus_message_append(reply, "s", key);
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'v', "a{st}");
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'a', "{st}");
        if (r >= 0 && l->bandwidth > 0)
                r = sd_bus_message_append(reply, "{st}", "bandwidth", l->bandwidth);
        if (r >= 0 && l->ops > 0)
                r = sd_bus_message_append(reply, "{st}", "ops", l->ops);
        if (r >= 0 && l->burst > 0)
                r = sd_bus_message_append(reply, "{st}", "burst", l->burst);
        for (int k = 0; k < 3 && r >= 0; k++)
                r = sd_bus_message_close_container(reply);
        return r;
}

int sandbox_append_limits(sd_bus_message *reply, const struct sandbox_limits *l) {
        int r = 0;

        if (l->cpu_limit > 0)
                r = sd_bus_message_append(reply, "{sv}", "cpu_limit", "d", l->cpu_limit);
        if (r >= 0)
                r = append_rate(reply, "disk_rate", &l->disk_rate);
        if (r >= 0)
                r = append_rate(reply, "net_rate", &l->net_rate);
        return r;
}
int image_append_info(sd_bus_message *reply, Image *i, bool details) {
        int r;

        r = sd_bus_message_open_container(reply, 'a', "{sv}");
        if (r < 0)
                return r;
        r = image_append_info_fields(reply, i, details);
        if (r < 0)
                return r;
        return sd_bus_message_close_container(reply);
}

/* "image": the OCI image config (snapshot.json "image", checked when it was
 * read) as a{sv}: env, entrypoint, cmd as; working_dir, user s; start_cmd b. */
static int append_image_config(sd_bus_message *reply, const char *config) {
        _cleanup_json_ struct json_object *o = json_tokener_parse(config);
        int r;

        if (!o || !json_object_is_type(o, json_type_object))
                return -EBADMSG;
        r = sd_bus_message_open_container(reply, 'e', "sv");
        if (r >= 0)
                r = sd_bus_message_append(reply, "s", "image");
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'v', "a{sv}");
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'a', "{sv}");
        json_object_object_foreach(o, key, v) {
                if (r < 0)
                        break;
                if (json_object_is_type(v, json_type_string))
                        r = sd_bus_message_append(reply, "{sv}", key, "s", json_object_get_string(v));
                else if (json_object_is_type(v, json_type_boolean))
                        r = sd_bus_message_append(reply, "{sv}", key, "b", (int) json_object_get_boolean(v));
                else if (json_object_is_type(v, json_type_array)) {
                        r = sd_bus_message_open_container(reply, 'e', "sv");
                        if (r >= 0)
                                r = sd_bus_message_append(reply, "s", key);
                        if (r >= 0)
                                r = sd_bus_message_open_container(reply, 'v', "as");
                        if (r >= 0)
                                r = sd_bus_message_open_container(reply, 'a', "s");
                        for (size_t k = 0; r >= 0 && k < json_object_array_length(v); k++)
                                r = sd_bus_message_append(reply, "s",
                                                          json_object_get_string(json_object_array_get_idx(v, k)));
                        for (unsigned k = 0; r >= 0 && k < 3; k++)
                                r = sd_bus_message_close_container(reply);
                }
        }
        for (unsigned k = 0; r >= 0 && k < 3; k++)
                r = sd_bus_message_close_container(reply);
        return r;
}

/* "volumes": aa{sv}, each guest_path, mode, size (bytes), and for rw host_path. */
static int append_volumes(sd_bus_message *reply, const struct snapshot_meta *meta, const char *dir) {
        int r;

        if (meta->n_volumes == 0)
                return 0;
        r = sd_bus_message_open_container(reply, 'e', "sv");
        if (r >= 0)
                r = sd_bus_message_append(reply, "s", "volumes");
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'v', "aa{sv}");
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'a', "a{sv}");
        for (uint32_t k = 0; r >= 0 && k < meta->n_volumes; k++) {
                const struct snapshot_volume *v = &meta->volumes[k];
                _cleanup_free_ char *path = NULL;
                struct stat st;
                uint64_t size = 0;

                if (v->file[0] ? asprintf(&path, "%s/%s", dir, v->file) < 0 : !(path = strdup(v->host_path)))
                        return -ENOMEM;
                if (lstat(path, &st) >= 0 && S_ISREG(st.st_mode))
                        size = (uint64_t) st.st_size;
                r = sd_bus_message_open_container(reply, 'a', "{sv}");
                if (r >= 0)
                        r = sd_bus_message_append(reply, "{sv}{sv}{sv}", "guest_path", "s", v->guest_path,
                                                  "mode", "s", v->mode, "size", "t", size);
                if (r >= 0 && !v->file[0])
                        r = sd_bus_message_append(reply, "{sv}", "host_path", "s", v->host_path);
                if (r >= 0)
                        r = sd_bus_message_close_container(reply);
        }
        for (unsigned k = 0; r >= 0 && k < 3; k++)
                r = sd_bus_message_close_container(reply);
        return r;
}

int image_append_info_fields(sd_bus_message *reply, Image *i, bool details) {
        int r;

        r = sd_bus_message_append(reply, "{sv}{sv}{sv}{sv}{sv}{sv}{sv}{sv}{sv}",
                                  "tag", "s", i->tag,
                                  "owner_uid", "u", (uint32_t) image_owner(i),
                                  "dir", "s", i->dir,
                                  "created_at_unix", "t", (uint64_t) i->meta.created_at_unix,
                                  "status", "s", "ready",
                                  "mem_size", "t", i->meta.mem_size,
                                  "disk_size", "t", i->meta.disk_size,
                                  "generation", "t", i->meta.generation,
                                  "guest", "s", i->meta.guest);
        if (r >= 0)
                r = sd_bus_message_append(reply, "{sv}{sv}", "network", "b", (int) i->meta.network,
                                          "agent_tcp", "b", (int) i->meta.agent_tcp);
        if (r >= 0)
                r = sd_bus_message_append(reply, "{sv}", "vcpus", "u", i->meta.vcpus);
        if (r < 0)
                return r;
        if (i->meta.parent_tag[0]) {
                r = sd_bus_message_append(reply, "{sv}", "parent_tag", "s", i->meta.parent_tag);
                if (r < 0)
                        return r;
        }
        if (i->meta.image_config[0]) {
                r = append_image_config(reply, i->meta.image_config);
                if (r < 0)
                        return r;
        }
        r = append_volumes(reply, &i->meta, i->dir);
        if (r < 0)
                return r;
        if (i->meta.branched_from[0]) {
                /* only on snapshots made by a branch */
                r = sd_bus_message_append(reply, "{sv}{sv}{sv}", "branched_from", "s", i->meta.branched_from,
                                          "pause_ms", "t", (i->meta.pause_us + 500) / 1000,
                                          "pause_us", "t", i->meta.pause_us);
                if (r < 0)
                        return r;
        }
        if (details) {
                _cleanup_(strv_freep) char **deps = NULL;
                const char *ancestors[64 + 1] = {}; /* NULL-terminated */
                size_t n_ancestors = 0;
                struct image_sizes sz = {};

                r = image_sizes(i, &sz);
                if (r < 0)
                        return r;
                /* Parent first, then its parent, ...: as far as they are registered (a
                 * diff chain's links hold on to their parents, forkd-vmm(8)); then turned
                 * round, since forkd's REST API v1 lists them root first. */
                for (Image *a = i; a->meta.parent_tag[0] && n_ancestors < ELEMENTSOF(ancestors) - 1;) {
                        ancestors[n_ancestors++] = a->meta.parent_tag;
                        a = hashmap_get(i->manager->images, a->meta.parent_tag);
                        if (!a)
                                break;
                }
                for (size_t k = 0; k < n_ancestors / 2; k++) {
                        const char *t = ancestors[k];

                        ancestors[k] = ancestors[n_ancestors - 1 - k];
                        ancestors[n_ancestors - 1 - k] = t;
                }
                r = image_dependents(i->manager, i->tag, &deps);
                if (r < 0)
                        return r;
                r = sd_bus_message_append(reply, "{sv}{sv}{sv}{sv}",
                                          "memory_logical_bytes", "t", sz.memory_logical,
                                          "memory_physical_bytes", "t", sz.memory_physical,
                                          "vmstate_bytes", "t", sz.vmstate,
                                          "chain_depth", "u", (uint32_t) n_ancestors);
                if (r < 0)
                        return r;
                if (i->meta.parent_content_hash[0]) {
                        r = sd_bus_message_append(reply, "{sv}", "parent_content_hash", "s",
                                                  i->meta.parent_content_hash);
                        if (r < 0)
                                return r;
                }
                r = sd_bus_message_open_container(reply, 'e', "sv");
                if (r >= 0)
                        r = sd_bus_message_append(reply, "s", "ancestors");
                if (r >= 0)
                        r = sd_bus_message_open_container(reply, 'v', "as");
                if (r >= 0)
                        r = sd_bus_message_append_strv(reply, (char **) ancestors);
                if (r >= 0)
                        r = sd_bus_message_close_container(reply);
                if (r >= 0)
                        r = sd_bus_message_close_container(reply);
                if (r >= 0)
                        r = sd_bus_message_open_container(reply, 'e', "sv");
                if (r >= 0)
                        r = sd_bus_message_append(reply, "s", "dependents");
                if (r >= 0)
                        r = sd_bus_message_open_container(reply, 'v', "as");
                if (r >= 0)
                        r = sd_bus_message_append_strv(reply, deps);
                if (r >= 0)
                        r = sd_bus_message_close_container(reply);
                if (r >= 0)
                        r = sd_bus_message_close_container(reply);
                if (r < 0)
                        return r;
        }
        return 0;
}

void image_send_signal(Manager *m, const char *tag, bool new) {
        _cleanup_free_ char *p = NULL;

        if (!m->bus || snapshot_tag_is_forkds(tag) || image_object_path(tag, &p) < 0)
                return;
        (void) sd_bus_emit_signal(m->bus, FORKD_MANAGER_PATH, FORKD_BUS_NAME, new ? "SnapshotNew" : "SnapshotRemoved",
                                  "so", tag, p);
}

/* ---- sandboxes ---- */

/* One {sv} (or, with variant false, {st}) entry of a u64: the calls themselves,
 * as sd_bus_message_append()'s format parsing was a tenth of forkd's time in a
 * list of 1000 with their usage. */
static int append_u64_entry(sd_bus_message *reply, const char *key, uint64_t v, bool variant) {
        int r;

        r = sd_bus_message_open_container(reply, 'e', variant ? "sv" : "st");
        if (r >= 0)
                r = sd_bus_message_append_basic(reply, 's', key);
        if (r >= 0 && variant)
                r = sd_bus_message_open_container(reply, 'v', "t");
        if (r >= 0)
                r = sd_bus_message_append_basic(reply, 't', &v);
        if (r >= 0 && variant)
                r = sd_bus_message_close_container(reply);
        return r < 0 ? r : sd_bus_message_close_container(reply);
}

/* "usage" a{sv}: what it uses now; a figure that could not be read is left out. */
static int append_usage(sd_bus_message *reply, const SandboxUsage *usage) {
        const SandboxUsage u = *usage;
        int r;

        r = sd_bus_message_open_container(reply, 'e', "sv");
        if (r >= 0)
                r = sd_bus_message_append_basic(reply, 's', "usage");
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'v', "a{sv}");
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'a', "{sv}");
        if (r >= 0 && u.have_cpu)
                r = append_u64_entry(reply, "cpu_usec", u.cpu_usec, true);
        if (r >= 0 && u.have_memory)
                r = append_u64_entry(reply, "memory_private_kib", u.memory_private_kib, true);
        if (r >= 0 && u.have_memory)
                r = append_u64_entry(reply, "memory_shared_kib", u.memory_shared_kib, true);
        if (u.have_stats) {
                if (r >= 0)
                        r = append_u64_entry(reply, "disk_read_bytes", u.stats.disk_read_bytes, true);
                if (r >= 0)
                        r = append_u64_entry(reply, "disk_written_bytes", u.stats.disk_written_bytes, true);
                if (r >= 0)
                        r = append_u64_entry(reply, "net_rx_bytes", u.stats.net_rx_bytes, true);
                if (r >= 0)
                        r = append_u64_entry(reply, "net_tx_bytes", u.stats.net_tx_bytes, true);
        }
        if (r >= 0 && (u.have_stats || u.have_cpu_throttled)) {
                r = sd_bus_message_open_container(reply, 'e', "sv");
                if (r >= 0)
                        r = sd_bus_message_append_basic(reply, 's', "throttled_usec");
                if (r >= 0)
                        r = sd_bus_message_open_container(reply, 'v', "a{st}");
                if (r >= 0)
                        r = sd_bus_message_open_container(reply, 'a', "{st}");
                if (r >= 0 && u.have_cpu_throttled)
                        r = append_u64_entry(reply, "cpu", u.cpu_throttled_usec, false);
                if (r >= 0 && u.have_stats)
                        r = append_u64_entry(reply, "disk", u.stats.disk_throttled_usec, false);
                if (r >= 0 && u.have_stats)
                        r = append_u64_entry(reply, "net", u.stats.net_throttled_usec, false);
                for (unsigned k = 0; r >= 0 && k < 3; k++)
                        r = sd_bus_message_close_container(reply);
        }
        for (unsigned k = 0; r >= 0 && k < 3; k++)
                r = sd_bus_message_close_container(reply);
        return r;
}

int sandbox_append_info(sd_bus_message *reply, Sandbox *s) {
        SandboxUsage u;

        sandbox_read_usage(s, &u);
        return sandbox_append_info_ex(reply, s, &u);
}

int sandbox_append_info_ex(sd_bus_message *reply, Sandbox *s, const SandboxUsage *usage) {
        int r;

        r = sd_bus_message_open_container(reply, 'a', "{sv}");
        if (r < 0)
                return r;
        r = sd_bus_message_append(reply, "{sv}{sv}{sv}{sv}{sv}{sv}{sv}{sv}",
                                  "id", "s", s->id,
                                  "owner_uid", "u", (uint32_t) s->owner_uid,
                                  "snapshot_tag", "s", s->origin_tag ?: s->snapshot_tag,
                                  "guest_addr", "s", s->guest_addr,
                                  "created_at_unix", "t", s->created_at,
                                  "pid", "u", s->pid,
                                  "state", "s", sandbox_state_to_string(s->state),
                                  "status", "s", sandbox_state_to_string(s->state));
        if (r < 0)
                return r;
        if (s->netns) {
                r = sd_bus_message_append(reply, "{sv}", "netns", "s", s->netns);
                if (r < 0)
                        return r;
        }
        if (s->host_addr) {
                r = sd_bus_message_append(reply, "{sv}", "host_addr", "s", s->host_addr);
                if (r < 0)
                        return r;
        }
        if (s->memory_limit_mib > 0) {
                r = sd_bus_message_append(reply, "{sv}", "memory_limit_mib", "u", s->memory_limit_mib);
                if (r < 0)
                        return r;
        }
        r = sandbox_append_limits(reply, &s->limits);
        if (r < 0)
                return r;
        r = sandbox_append_deadline(reply, s->expires_at, s->timeout_pause);
        if (r < 0)
                return r;
        {
                /* the volumes of the snapshot it runs from */
                Image *i = hashmap_get(s->manager->images, s->snapshot_tag);

                if (i) {
                        r = append_volumes(reply, &i->meta, i->dir);
                        if (r < 0)
                                return r;
                }
        }
        if (usage) {
                r = append_usage(reply, usage);
                if (r < 0)
                        return r;
        }
        return sd_bus_message_close_container(reply);
}

int sandbox_append_infos(sd_bus_message *reply, Manager *m, char *const *vm_ids, unsigned n) {
        int r;

        r = sd_bus_message_open_container(reply, 'a', "a{sv}");
        for (unsigned i = 0; r >= 0 && i < n; i++)
                /* no usage: a fork's children have used next to nothing yet, and
                 * reading it for each would only slow the fork's reply */
                r = sandbox_append_info_ex(reply, hashmap_get(m->vms, vm_ids[i]), NULL);
        return r < 0 ? r : sd_bus_message_close_container(reply);
}

int sandbox_append_deadline(sd_bus_message *reply, uint64_t expires_at, bool pause) {
        char buf[64];

        return sd_bus_message_append(reply, "{sv}{sv}", "expires_at", "s", deadline_format(expires_at, buf),
                                     "on_timeout", "s", pause ? ON_TIMEOUT_PAUSE : ON_TIMEOUT_KILL);
}

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

void sandbox_send_removed_signal_as(Sandbox *s, const char *id, const char *reason) {
        _cleanup_free_ char *p = NULL;

        if (!s->manager->bus || sandbox_object_path(id, &p) < 0)
                return;
        (void) sd_bus_emit_signal(s->manager->bus, FORKD_MANAGER_PATH, FORKD_BUS_NAME, "SandboxRemoved", "sos", id, p,
                                  reason);
}

void sandbox_send_state_changed(Sandbox *s) {
        _cleanup_free_ char *p = NULL;

        if (!s->manager->bus || sandbox_object_path(s->id, &p) < 0)
                return;
        (void) sd_bus_emit_properties_changed(s->manager->bus, p, "org.forkd.Sandbox", "State", NULL);
}

int bus_sandbox_error_pausing(const char *id, sd_bus_error *error) {
        return sd_bus_error_setf(error, FORKD_ERROR_PAUSED, "sandbox %s is being paused", id);
}

/* ---- paused sandboxes ---- */

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
        if (r >= 0)
                r = sandbox_append_limits(reply, &p->limits);
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

int bus_sandbox_info_reply(sd_bus_message *call, Paused *p, Sandbox *s, sd_bus_message **ret) {
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
