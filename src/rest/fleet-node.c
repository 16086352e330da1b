/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The fleet node agent of fleet-node.h. */
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-bus.h>
#include <time.h>
#include <unistd.h>

#include "bus-open.h"
#include "fleet-node.h"
#include "forkd-bus.h"
#include "io-util.h"
#include "json-util.h"
#include "macro.h"
#include "rest-util.h"
#include "time-util.h"

#define REFRESH_USEC USEC_PER_SEC
#define CONFIG_STRINGS 9
#define RETRY_USEC USEC_PER_SEC

struct FleetNode {
        FleetNodeConfig cfg;
        char *strings[CONFIG_STRINGS]; /* the copies cfg points to (config_string()) */
        char *key;
        int stop_pipe[2];
        pthread_t thread, keeper;
        bool started, keeper_started;
        /* The lease, 0 while there is none: the record thread takes one; the
         * keeper thread keeps it alive, and sets 0 when etcd let it go. The
         * keeper is a thread of its own so that a forkd slow to answer the
         * record's look (a fork of hundreds) never holds a keep-alive back. */
        _Atomic int64_t lease;
};

/* The i-th of the CONFIG_STRINGS string fields of a configuration. */
static const char **config_string(FleetNodeConfig *c, size_t i) {
        const char **fields[CONFIG_STRINGS] = { &c->etcd, &c->etcd_opts.cacert, &c->etcd_opts.cert,
                                                &c->etcd_opts.key, &c->etcd_opts.user, &c->etcd_opts.password,
                                                &c->name, &c->advertise, &c->bus_address };

        return fields[i];
}

bool fleet_node_name_is_valid(const char *name) {
        size_t n = name ? strlen(name) : 0;

        if (n == 0 || n > FLEET_NODE_NAME_MAX || name[0] == '.' || name[0] == '-')
                return false;
        for (size_t i = 0; i < n; i++)
                if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= 'A' && name[i] <= 'Z') ||
                      (name[i] >= '0' && name[i] <= '9') || name[i] == '.' || name[i] == '_' || name[i] == '-'))
                        return false;
        return true;
}

/* Sleep until usec have passed or the stop pipe is readable: true when stopping. */
static bool wait_or_stop(FleetNode *n, uint64_t usec) {
        struct pollfd p = { .fd = n->stop_pipe[0], .events = POLLIN };
        int ms = (int) MIN(usec / USEC_PER_MSEC, (uint64_t) 60000);

        return poll(&p, 1, ms) > 0;
}

static uint64_t memory_available_kib(void) {
        _cleanup_free_ char *text = NULL;
        const char *p;

        if (read_file_capped_at(AT_FDCWD, "/proc/meminfo", 64 * 1024, &text, NULL) < 0)
                return 0;
        p = strstr(text, "MemAvailable:");
        return p ? strtoull(p + strlen("MemAvailable:"), NULL, 10) : 0;
}

/* The fields of one ListSnapshots entry that a placement needs. */
static struct json_object *snapshot_entry(struct json_object *info) {
        static const char *const keys[] = { "tag", "parent_tag", "parent_content_hash", "vcpus", "mem_size" };
        static const char *const names[] = { "tag", "parent", "parent_content_hash", "vcpus", "mem_size" };
        struct json_object *e = json_object_new_object(), *v;

        if (!e)
                return NULL;
        for (size_t i = 0; i < ELEMENTSOF(keys); i++)
                json_object_object_add(e, names[i], json_object_object_get_ex(info, keys[i], &v) ?
                                                            json_object_get(v) : NULL);
        return e;
}

/* What forkd says now: snapshots (a new array) and the running sandboxes. */
static int look_at_forkd(sd_bus *bus, struct json_object **ret_snapshots, uint32_t *ret_running) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(json_object_putp) struct json_object *list = NULL, *out = NULL;
        int r;

        r = sd_bus_get_property_trivial(bus, FORKD_BUS_NAME, FORKD_MANAGER_PATH, FORKD_MANAGER_INTERFACE,
                                        "SandboxCount", &error, 'u', ret_running);
        if (r < 0)
                return r;
        r = sd_bus_call_method(bus, FORKD_BUS_NAME, FORKD_MANAGER_PATH, FORKD_MANAGER_INTERFACE, "ListSnapshots",
                               &error, &reply, "");
        if (r < 0)
                return r;
        r = rest_bus_read_dict_array_json(reply, &list);
        if (r < 0)
                return r;
        out = json_object_new_array();
        if (!out)
                return -ENOMEM;
        for (size_t i = 0; i < json_object_array_length(list) && i < FLEET_SNAPSHOTS_MAX; i++) {
                struct json_object *e = snapshot_entry(json_object_array_get_idx(list, i));

                if (!e || json_object_array_add(out, e) < 0) {
                        json_object_put(e);
                        return -ENOMEM;
                }
        }
        *ret_snapshots = TAKE_PTR(out);
        return 0;
}

/* The record's text, a new string; *bus reopened where it broke. */
static char *make_record(FleetNode *n, sd_bus **bus) {
        _cleanup_(json_object_putp) struct json_object *rec = json_object_new_object(), *cap = NULL;
        struct json_object *snapshots = NULL;
        uint32_t running = 0;
        bool ready = false;
        long cores = sysconf(_SC_NPROCESSORS_ONLN);

        if (!rec)
                return NULL;
        if (!*bus && bus_open_address(n->cfg.bus_address, "forkd-rest-fleet", bus) < 0)
                *bus = NULL;
        if (*bus) {
                ready = look_at_forkd(*bus, &snapshots, &running) >= 0;
                if (!ready && sd_bus_is_open(*bus) <= 0)
                        *bus = sd_bus_flush_close_unref(*bus);
        }
        cap = json_object_new_object();
        if (!cap)
                return NULL;
        json_object_object_add(cap, "cores", json_object_new_int64(cores > 0 ? cores : 1));
        json_object_object_add(cap, "memory_available_kib", json_object_new_int64((int64_t) memory_available_kib()));
        json_object_object_add(cap, "sandboxes_running", json_object_new_int64(running));
        json_object_object_add(cap, "sandboxes_max", json_object_new_int64(n->cfg.sandboxes_max));
        json_object_object_add(rec, "format", json_object_new_int(1));
        json_object_object_add(rec, "name", json_object_new_string(n->cfg.name));
        json_object_object_add(rec, "url", json_object_new_string(n->cfg.advertise));
        json_object_object_add(rec, "ready", json_object_new_boolean(ready));
        json_object_object_add(rec, "capacity", TAKE_PTR(cap));
        json_object_object_add(rec, "snapshots", snapshots ?: json_object_new_array());
        return strdup(json_object_to_json_string_ext(rec, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
}

/* The record with the time it was written: the text compared is the one without. */
static int put_record(FleetNode *n, EtcdClient *etcd, const char *record, int64_t lease) {
        _cleanup_free_ char *text = NULL;
        size_t len = strlen(record);

        /* ..."} -> ...,"updated_unix":N} */
        if (len < 2 || asprintf(&text, "%.*s,\"updated_unix\":%llu}", (int) (len - 1), record,
                                (unsigned long long) (now_realtime_usec() / USEC_PER_SEC)) < 0)
                return -ENOMEM;
        return etcd_put(etcd, n->key, text, strlen(text), lease);
}

static void *keeper_thread(void *userdata) {
        FleetNode *n = userdata;
        uint64_t period = (uint64_t) n->cfg.ttl_secs * USEC_PER_SEC / 3;
        EtcdClient *etcd = NULL;
        bool failing = false;

        if (etcd_client_new(n->cfg.etcd, &n->cfg.etcd_opts, &etcd) < 0)
                return NULL;
        for (uint64_t wait = period; !wait_or_stop(n, wait);) {
                int64_t lease = atomic_load(&n->lease), ttl = 0;
                int r;

                wait = period;

                if (lease == 0)
                        continue;
                r = etcd_lease_keepalive(etcd, lease, &ttl);
                if (r >= 0 && ttl <= 0) {
                        log_warning("Fleet: etcd let lease %llx go; taking a new one.", (unsigned long long) lease);
                        atomic_compare_exchange_strong(&n->lease, &lease, 0);
                        continue;
                }
                if (r < 0 && !failing)
                        log_warning("Fleet: cannot keep lease %llx alive (%s).", (unsigned long long) lease,
                                    etcd_client_error(etcd));
                else if (r >= 0 && failing)
                        log_info("Fleet: lease %llx kept alive again.", (unsigned long long) lease);
                failing = r < 0;
                if (failing)
                        wait = period / 8; /* a slow or lost member: the next try at once, not a third of the TTL on */
        }
        etcd_client_free(etcd);
        return NULL;
}

static void *node_thread(void *userdata) {
        FleetNode *n = userdata;
        _cleanup_(sd_bus_flush_close_unrefp) sd_bus *bus = NULL;
        _cleanup_free_ char *written = NULL;
        EtcdClient *etcd = NULL;
        int64_t lease = 0;
        bool failing = false;
        int r;

        if (etcd_client_new(n->cfg.etcd, &n->cfg.etcd_opts, &etcd) < 0)
                return NULL;
        for (;;) {
                _cleanup_free_ char *record = NULL;

                lease = atomic_load(&n->lease);
                if (lease == 0) {
                        r = etcd_lease_grant(etcd, n->cfg.ttl_secs, &lease);
                        if (r < 0) {
                                if (!failing)
                                        log_warning("Fleet: cannot get a lease from etcd (%s); trying again every second.",
                                                    etcd_client_error(etcd));
                                failing = true;
                                if (wait_or_stop(n, RETRY_USEC))
                                        break;
                                continue;
                        }
                        atomic_store(&n->lease, lease);
                        free(written);
                        written = NULL;
                }
                record = make_record(n, &bus);
                if (record && (!written || strcmp(record, written) != 0)) {
                        r = put_record(n, etcd, record, lease);
                        if (r >= 0) {
                                if (!written || failing)
                                        log_info("Fleet: node %s is in etcd (%s) under lease %llx, TTL %u s.",
                                                 n->cfg.name, etcd_client_endpoint(etcd), (unsigned long long) lease,
                                                 n->cfg.ttl_secs);
                                failing = false;
                                free(written);
                                written = TAKE_PTR(record);
                        } else if (!failing) {
                                log_warning("Fleet: cannot write the node's record (%s).", etcd_client_error(etcd));
                                failing = true;
                        }
                }
                if (wait_or_stop(n, REFRESH_USEC))
                        break;
        }
        lease = atomic_load(&n->lease);
        if (lease != 0 && etcd_lease_revoke(etcd, lease) < 0)
                log_info("Fleet: could not revoke lease %llx (%s); the record goes when it ends.",
                         (unsigned long long) lease, etcd_client_error(etcd));
        etcd_client_free(etcd);
        return NULL;
}

int fleet_node_start(const FleetNodeConfig *cfg, FleetNode **ret) {
        FleetNode *n;
        const char *why = NULL;
        int r;

        if (etcd_endpoints_check(cfg->etcd, &why) < 0)
                return log_error_errno(EINVAL, "--fleet-etcd: %s.", why);
        if (!fleet_node_name_is_valid(cfg->name))
                return log_error_errno(EINVAL, "--fleet-node must be 1 to %u of A-Z a-z 0-9 . _ - (not starting "
                                       "with . or -).", FLEET_NODE_NAME_MAX);
        if (etcd_endpoints_check(cfg->advertise, &why) < 0 || strchr(cfg->advertise, ','))
                return log_error_errno(EINVAL, "--fleet-advertise must be one http(s)://HOST:PORT.");
        if (cfg->ttl_secs < FLEET_TTL_MIN || cfg->ttl_secs > FLEET_TTL_MAX)
                return log_error_errno(EINVAL, "--fleet-lease-ttl must be %u..%u.", FLEET_TTL_MIN, FLEET_TTL_MAX);
        n = calloc(1, sizeof(*n));
        if (!n)
                return -ENOMEM;
        n->stop_pipe[0] = n->stop_pipe[1] = -EBADF;
        /* copies of every string, the caller's may go */
        n->cfg = *cfg;
        for (size_t i = 0; i < ELEMENTSOF(n->strings); i++) {
                const char **field = config_string(&n->cfg, i);

                if (*field && !(n->strings[i] = strdup(*field))) {
                        fleet_node_stop(n);
                        return -ENOMEM;
                }
                *field = n->strings[i];
        }
        if (asprintf(&n->key, FLEET_KEY_PREFIX "nodes/%s", cfg->name) < 0) {
                n->key = NULL;
                fleet_node_stop(n);
                return -ENOMEM;
        }
        if (pipe2(n->stop_pipe, O_CLOEXEC) < 0) {
                r = -errno;
                fleet_node_stop(n);
                return r;
        }
        r = -pthread_create(&n->thread, NULL, node_thread, n);
        if (r < 0) {
                fleet_node_stop(n);
                return r;
        }
        n->started = true;
        r = -pthread_create(&n->keeper, NULL, keeper_thread, n);
        if (r < 0) {
                fleet_node_stop(n);
                return r;
        }
        n->keeper_started = true;
        *ret = n;
        return 0;
}

FleetNode *fleet_node_stop(FleetNode *n) {
        if (!n)
                return NULL;
        if (n->started || n->keeper_started)
                (void) write(n->stop_pipe[1], "x", 1);
        if (n->keeper_started)
                (void) pthread_join(n->keeper, NULL);
        if (n->started)
                (void) pthread_join(n->thread, NULL);
        safe_close(n->stop_pipe[0]);
        safe_close(n->stop_pipe[1]);
        for (size_t i = 0; i < ELEMENTSOF(n->strings); i++) {
                if (n->strings[i])
                        explicit_bzero(n->strings[i], strlen(n->strings[i]));
                free(n->strings[i]);
        }
        free(n->key);
        free(n);
        return NULL;
}
