/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "fork-options.h"

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
