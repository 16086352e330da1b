/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Fork options read from D-Bus messages: see fork-options-bus.h. */
#include <string.h>

#include "cgroup.h"
#include "fork-op.h"
#include "fork-options-bus.h"
#include "forkd-bus.h"
#include "macro.h"
#include "time-util.h"

int fork_options_resolve_network(struct fork_options *o, bool has_nic, bool agent_tcp, const char **ret_why) {
        if (!has_nic) {
                if (o->net_policy_given) {
                        *ret_why = "the snapshot has no NIC, so a network policy has nothing to apply to: "
                                   "create the snapshot with network (option network, REST \"network\": true) "
                                   "or leave network out";
                        return -EINVAL;
                }
                o->net = o->agent_tcp = false;
                return 0;
        }
        if (o->per_child_netns) {
                *ret_why = "the snapshot has a NIC: forkd makes each child's namespace itself, with its tap, "
                           "while per_child_netns's pre-made namespaces hold no tap for it; leave "
                           "per_child_netns out and choose the policy with network (none or egress)";
                return -EINVAL;
        }
        if (!o->net_policy_given)
                o->net_policy = NETNS_POLICY_NONE; /* the default: nothing leaves */
        o->net = true;
        o->agent_tcp = agent_tcp;
        return 0;
}

/* A rate's a{st} (bandwidth, ops, burst), inside its variant. */
static int read_rate(sd_bus_message *message, const char *field, struct rate_limit *ret, sd_bus_error *error) {
        char err[FORK_OPTION_ERROR_MAX];
        struct rate_limit l = {};
        unsigned given = 0;
        int r;

        r = sd_bus_message_enter_container(message, 'a', "{st}");
        if (r < 0)
                return r;
        for (;;) {
                const char *key;
                uint64_t v;

                r = sd_bus_message_read(message, "{st}", &key, &v);
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                if (rate_limit_set(&l, &given, key, v) < 0)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "%s takes only bandwidth, ops and burst.", field);
        }
        if (fork_option_check_rate(field, &l, given, err) < 0)
                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, err);
        *ret = l;
        return sd_bus_message_exit_container(message);
}

/* cpu_limit (d), disk_rate and net_rate (a{st}), the variant entered: key is
 * one of them. vcpus is checked later (bus_check_limits()), once the snapshot
 * is known; here only what holds for any. */
static int read_limit(sd_bus_message *message, const char *key, struct sandbox_limits *l, sd_bus_error *error) {
        if (strcmp(key, "cpu_limit") == 0) {
                char err[FORK_OPTION_ERROR_MAX];
                double d;
                int r;

                r = sd_bus_message_read(message, "d", &d);
                if (r < 0)
                        return r;
                if (fork_option_check_cpu_limit_any(d, err) < 0)
                        return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, err);
                l->cpu_limit = d;
                return 0;
        }
        return read_rate(message, key, strcmp(key, "disk_rate") == 0 ? &l->disk_rate : &l->net_rate, error);
}

int bus_read_limits(sd_bus_message *message, bool *ret_memory_given, uint32_t *ret_memory_limit_mib,
                    struct sandbox_limits *ret, unsigned *ret_given, sd_bus_error *error) {
        char err[FORK_OPTION_ERROR_MAX];
        struct sandbox_limits l = *ret;
        uint32_t mib = 0;
        unsigned given = 0;
        int r;

        r = sd_bus_message_enter_container(message, 'a', "{sv}");
        if (r < 0)
                return r;
        for (;;) {
                const char *key, *type;

                r = sd_bus_message_enter_container(message, 'e', "sv");
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                r = sd_bus_message_read(message, "s", &key);
                if (r < 0)
                        return r;
                if (strcmp(key, "cpu_limit") == 0)
                        type = "d";
                else if (strcmp(key, "disk_rate") == 0 || strcmp(key, "net_rate") == 0)
                        type = "a{st}";
                else if (strcmp(key, "memory_limit_mib") == 0)
                        type = "u";
                else
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "Unknown limit \"%.64s\" (known: cpu_limit, disk_rate, net_rate, "
                                                 "memory_limit_mib).", key);
                r = sd_bus_message_enter_container(message, 'v', type);
                if (r < 0)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Limit %s must be of type %s.",
                                                 key, type);
                if (strcmp(key, "memory_limit_mib") == 0) {
                        r = sd_bus_message_read(message, "u", &mib);
                        if (r < 0)
                                return r;
                        if (fork_option_check_memory_limit_mib(mib, err) < 0)
                                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, err);
                        given |= LIMIT_MEMORY;
                } else if (strcmp(key, "cpu_limit") == 0) {
                        double d;

                        /* 0 here: remove the limit */
                        r = sd_bus_message_read(message, "d", &d);
                        if (r < 0)
                                return r;
                        if (d != 0 && fork_option_check_cpu_limit_any(d, err) < 0)
                                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, err);
                        l.cpu_limit = d;
                        given |= LIMIT_CPU;
                } else {
                        r = read_limit(message, key, &l, error);
                        if (r < 0)
                                return r;
                        given |= strcmp(key, "disk_rate") == 0 ? LIMIT_DISK_RATE : LIMIT_NET_RATE;
                }
                r = sd_bus_message_exit_container(message);
                if (r >= 0)
                        r = sd_bus_message_exit_container(message);
                if (r < 0)
                        return r;
        }
        if (given == 0)
                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS,
                                        "No limit given (cpu_limit, disk_rate, net_rate, memory_limit_mib).");
        *ret = l;
        *ret_given = given;
        *ret_memory_given = given & LIMIT_MEMORY;
        *ret_memory_limit_mib = mib;
        return sd_bus_message_exit_container(message);
}

int bus_check_limits(Manager *m, uint32_t memory_limit_mib, const struct sandbox_limits *l, uint32_t vcpus,
                     sd_bus_error *error) {
        char err[FORK_OPTION_ERROR_MAX];

        if (l->cpu_limit > 0 && fork_option_check_cpu_limit(l->cpu_limit, vcpus, err) < 0)
                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, err);
        if ((memory_limit_mib > 0 || l->cpu_limit > 0) && !cgroup_manager_supported(m->cgroups))
                return sd_bus_error_setf(error, FORKD_ERROR_NOT_SUPPORTED,
                                         "%s limits are not available on this host (no usable cgroup backend).",
                                         memory_limit_mib > 0 ? "Memory" : "CPU");
        if (l->cpu_limit > 0 && !cgroup_manager_cpu_supported(m->cgroups))
                return sd_bus_error_setf(error, FORKD_ERROR_NOT_SUPPORTED,
                                         "cpu_limit is not available with the %s cgroup backend here (it needs "
                                         "the cpu controller: cgroup v2's, a cgroup v1 cpu hierarchy, or systemd "
                                         "scopes).",
                                         cgroup_manager_name(m->cgroups));
        return 0;
}

/* Fork's options a{sv} into o; timeout_only (ForkSandboxEx): only timeout_secs,
 * on_timeout and the limits are known. */
int parse_fork_options_full(sd_bus_message *message, struct fork_options *o, bool timeout_only,
                            sd_bus_error *error) {
        static const struct {
                const char *key, *type;
                bool timeout;
        } known[] = {
                { "per_child_netns", "b", false }, { "live_fork", "b", false }, { "memory_limit_mib", "u", false },
                { "network", "s", false }, { "timeout_secs", "u", true }, { "on_timeout", "s", true },
                { "cpu_limit", "d", true }, { "disk_rate", "a{st}", true }, { "net_rate", "a{st}", true },
        };
        char err[FORK_OPTION_ERROR_MAX];
        bool timeout_given = false;
        int r;

        r = sd_bus_message_enter_container(message, 'a', "{sv}");
        if (r < 0)
                return r;
        for (;;) {
                const char *key, *type = NULL, *str = NULL;
                uint32_t u = 0;
                int b = 0;

                r = sd_bus_message_enter_container(message, 'e', "sv");
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                r = sd_bus_message_read(message, "s", &key);
                if (r < 0)
                        return r;
                for (size_t k = 0; k < ELEMENTSOF(known); k++)
                        if (strcmp(key, known[k].key) == 0 && (known[k].timeout || !timeout_only))
                                type = known[k].type;
                if (!type)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
                                                 "Unknown fork option \"%.64s\" (known: %s).", key,
                                                 timeout_only ? "timeout_secs, on_timeout, cpu_limit, disk_rate, net_rate" :
                                                 "per_child_netns, memory_limit_mib, live_fork, network, "
                                                 "timeout_secs, on_timeout, cpu_limit, disk_rate, net_rate");
                r = sd_bus_message_enter_container(message, 'v', type);
                if (r < 0)
                        return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "Fork option %s must be of type %s.",
                                                 key, type);
                if (strcmp(type, "d") == 0 || strcmp(type, "a{st}") == 0) {
                        r = read_limit(message, key, &o->limits, error);
                        if (r < 0)
                                return r;
                        goto next;
                }
                r = sd_bus_message_read_basic(message, type[0], type[0] == 'b' ? (void *) &b :
                                                                type[0] == 'u' ? (void *) &u : (void *) &str);
                if (r < 0)
                        return r;
                if (strcmp(key, "per_child_netns") == 0)
                        o->per_child_netns = b;
                else if (strcmp(key, "live_fork") == 0)
                        o->live_fork = b;
                else if (strcmp(key, "network") == 0) {
                        if (fork_option_check_network(str, err) < 0)
                                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, err);
                        o->net_policy = netns_policy_from_string(str);
                        o->net_policy_given = true;
                } else if (strcmp(key, "memory_limit_mib") == 0) {
                        o->memory_limit_mib = u;
                        if (fork_option_check_memory_limit_mib(u, err) < 0)
                                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, err);
                } else if (strcmp(key, "timeout_secs") == 0) {
                        o->timeout_secs = u;
                        timeout_given = true;
                        if (fork_option_check_timeout_secs(u, err) < 0)
                                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, err);
                } else {
                        if (fork_option_check_on_timeout(str, err) < 0)
                                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, err);
                        o->timeout_pause = strcmp(str, ON_TIMEOUT_PAUSE) == 0;
                        o->on_timeout_given = true;
                }
        next:
                r = sd_bus_message_exit_container(message);
                if (r < 0)
                        return r;
                r = sd_bus_message_exit_container(message);
                if (r < 0)
                        return r;
        }
        if (fork_option_check_deadline(timeout_given, o->timeout_secs,
                                       o->on_timeout_given ? (o->timeout_pause ? ON_TIMEOUT_PAUSE : ON_TIMEOUT_KILL) : NULL,
                                       false, err) < 0)
                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, err);
        return sd_bus_message_exit_container(message);
}

int bus_read_fork_n(sd_bus_message *message, uint32_t *ret_n, struct fork_options *o, sd_bus_error *error) {
        int r = sd_bus_message_read(message, "u", ret_n);

        if (r >= 0 && sd_bus_message_has_signature(message, "sua{sv}"))
                r = parse_fork_options_full(message, o, true, error); /* ForkSandboxEx */
        return r;
}

/* SetSandboxTimeout's (u timeout_secs, s on_timeout): the deadline from now and
 * the action ("" keeps the current one, "kill" without one). */
int bus_read_timeout(sd_bus_message *message, bool current_pause, uint64_t *ret_expires, bool *ret_pause,
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
        *ret_expires = now_realtime_usec() + secs * USEC_PER_SEC;
        *ret_pause = on_timeout[0] ? strcmp(on_timeout, ON_TIMEOUT_PAUSE) == 0 : current_pause;
        return 0;
}
