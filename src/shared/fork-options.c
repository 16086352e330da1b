/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <json-c/json.h>

#include "fork-options.h"
#include "macro.h"

int fork_option_check_timeout_secs(int64_t secs, char err[static FORK_OPTION_ERROR_MAX]) {
        if (secs >= 1 && secs <= SANDBOX_TIMEOUT_SECS_MAX)
                return 0;
        snprintf(err, FORK_OPTION_ERROR_MAX, "timeout_secs must be an integer between 1 and %u",
                 SANDBOX_TIMEOUT_SECS_MAX);
        return -EINVAL;
}

int fork_option_check_on_timeout(const char *on_timeout, char err[static FORK_OPTION_ERROR_MAX]) {
        if (on_timeout && (strcmp(on_timeout, ON_TIMEOUT_KILL) == 0 || strcmp(on_timeout, ON_TIMEOUT_PAUSE) == 0))
                return 0;
        snprintf(err, FORK_OPTION_ERROR_MAX, "on_timeout must be \"%s\" or \"%s\"", ON_TIMEOUT_KILL, ON_TIMEOUT_PAUSE);
        return -EINVAL;
}

int fork_option_check_deadline(bool secs_given, int64_t secs, const char *on_timeout, bool secs_required,
                               char err[static FORK_OPTION_ERROR_MAX]) {
        bool on_timeout_given = on_timeout && on_timeout[0];
        int r;

        if (secs_given || secs_required) {
                r = fork_option_check_timeout_secs(secs_given ? secs : 0, err);
                if (r < 0)
                        return r;
        }
        if (on_timeout_given) {
                r = fork_option_check_on_timeout(on_timeout, err);
                if (r < 0)
                        return r;
                if (!secs_given) {
                        snprintf(err, FORK_OPTION_ERROR_MAX, "on_timeout needs timeout_secs");
                        return -EINVAL;
                }
        }
        return 0;
}

int fork_option_check_memory_limit_mib(int64_t mib, char err[static FORK_OPTION_ERROR_MAX]) {
        if (mib >= MEMORY_LIMIT_MIB_MIN && mib <= MEMORY_LIMIT_MIB_MAX)
                return 0;
        snprintf(err, FORK_OPTION_ERROR_MAX, "memory_limit_mib must be an integer between %u and %u",
                 MEMORY_LIMIT_MIB_MIN, MEMORY_LIMIT_MIB_MAX);
        return -EINVAL;
}

int fork_option_check_network(const char *network, char err[static FORK_OPTION_ERROR_MAX]) {
        if (network && (strcmp(network, "none") == 0 || strcmp(network, "egress") == 0))
                return 0;
        snprintf(err, FORK_OPTION_ERROR_MAX, "network must be \"none\" or \"egress\"");
        return -EINVAL;
}

int fork_option_check_cpu_limit(double cpus, uint32_t vcpus, char err[static FORK_OPTION_ERROR_MAX]) {
        /* written so that NaN fails too */
        if (vcpus > 0 && cpus >= CPU_LIMIT_MIN && cpus <= (double) vcpus)
                return 0;
        snprintf(err, FORK_OPTION_ERROR_MAX, "cpu_limit must be a number between %.2f and %u", CPU_LIMIT_MIN,
                 vcpus > 0 ? vcpus : 1);
        return -EINVAL;
}

int fork_option_check_cpu_limit_any(double cpus, char err[static FORK_OPTION_ERROR_MAX]) {
        if (cpus >= CPU_LIMIT_MIN && cpus <= (double) UINT32_MAX)
                return 0;
        snprintf(err, FORK_OPTION_ERROR_MAX, "cpu_limit must be a number of at least %.2f (and at most the vcpus)",
                 CPU_LIMIT_MIN);
        return -EINVAL;
}

int fork_option_check_rate(const char *field, const struct rate_limit *l, unsigned given,
                           char err[static FORK_OPTION_ERROR_MAX]) {
        if ((given & (RATE_KEY_BANDWIDTH | RATE_KEY_OPS | RATE_KEY_BURST)) == 0) {
                snprintf(err, FORK_OPTION_ERROR_MAX, "%s needs at least one of bandwidth, ops and burst", field);
                return -EINVAL;
        }
        if (l->bandwidth != 0 && (l->bandwidth < RATE_BANDWIDTH_MIN || l->bandwidth > RATE_BANDWIDTH_MAX)) {
                snprintf(err, FORK_OPTION_ERROR_MAX, "%s.bandwidth must be 0 or between %" PRIu64 " and %" PRIu64,
                         field, RATE_BANDWIDTH_MIN, RATE_BANDWIDTH_MAX);
                return -EINVAL;
        }
        if (l->ops != 0 && (l->ops < RATE_OPS_MIN || l->ops > RATE_OPS_MAX)) {
                snprintf(err, FORK_OPTION_ERROR_MAX, "%s.ops must be 0 or between %" PRIu64 " and %" PRIu64,
                         field, RATE_OPS_MIN, RATE_OPS_MAX);
                return -EINVAL;
        }
        if (l->burst > RATE_BURST_MAX) {
                snprintf(err, FORK_OPTION_ERROR_MAX, "%s.burst must be at most %" PRIu64, field, RATE_BURST_MAX);
                return -EINVAL;
        }
        if (l->burst > 0 && l->bandwidth == 0) {
                snprintf(err, FORK_OPTION_ERROR_MAX, "%s.burst needs %s.bandwidth", field, field);
                return -EINVAL;
        }
        return 0;
}

static const struct {
        const char *key;
        unsigned bit;
        size_t offset;
} rate_keys[] = {
        { "bandwidth", RATE_KEY_BANDWIDTH, offsetof(struct rate_limit, bandwidth) },
        { "ops", RATE_KEY_OPS, offsetof(struct rate_limit, ops) },
        { "burst", RATE_KEY_BURST, offsetof(struct rate_limit, burst) },
};

int rate_limit_set(struct rate_limit *l, unsigned *given, const char *key, uint64_t v) {
        for (size_t i = 0; i < ELEMENTSOF(rate_keys); i++)
                if (strcmp(key, rate_keys[i].key) == 0) {
                        *(uint64_t *) ((uint8_t *) l + rate_keys[i].offset) = v;
                        *given |= rate_keys[i].bit;
                        return 0;
                }
        return -EINVAL;
}

int rate_limit_from_json(struct json_object *o, const char *field, struct rate_limit *ret,
                         char err[static FORK_OPTION_ERROR_MAX]) {
        struct rate_limit l = {};
        unsigned given = 0;
        int r;

        if (!json_object_is_type(o, json_type_object)) {
                snprintf(err, FORK_OPTION_ERROR_MAX, "%s must be an object with bandwidth, ops or burst", field);
                return -EINVAL;
        }
        json_object_object_foreach(o, key, v) {
                size_t i;

                for (i = 0; i < ELEMENTSOF(rate_keys); i++)
                        if (strcmp(key, rate_keys[i].key) == 0)
                                break;
                if (i == ELEMENTSOF(rate_keys)) {
                        snprintf(err, FORK_OPTION_ERROR_MAX, "%s takes only bandwidth, ops and burst", field);
                        return -EINVAL;
                }
                if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0) {
                        snprintf(err, FORK_OPTION_ERROR_MAX, "%s.%s must be a non-negative integer", field, key);
                        return -EINVAL;
                }
                *(uint64_t *) ((uint8_t *) &l + rate_keys[i].offset) = (uint64_t) json_object_get_int64(v);
                given |= rate_keys[i].bit;
        }
        r = fork_option_check_rate(field, &l, given, err);
        if (r < 0)
                return r;
        *ret = l;
        return 0;
}

struct json_object *rate_limit_to_json(const struct rate_limit *l) {
        struct json_object *o = json_object_new_object();

        if (!o)
                return NULL;
        if ((l->bandwidth > 0 && json_object_object_add(o, "bandwidth", json_object_new_int64((int64_t) l->bandwidth)) < 0) ||
            (l->ops > 0 && json_object_object_add(o, "ops", json_object_new_int64((int64_t) l->ops)) < 0) ||
            (l->burst > 0 && json_object_object_add(o, "burst", json_object_new_int64((int64_t) l->burst)) < 0) ||
            (!rate_limit_is_set(l) && json_object_object_add(o, "bandwidth", json_object_new_int64(0)) < 0)) {
                json_object_put(o);
                return NULL;
        }
        return o;
}
