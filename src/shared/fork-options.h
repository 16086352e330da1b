/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The checks of a fork's options, and their words: forkd applies them to the
 * a{sv} of Fork, ForkSandbox(Ex), the fork of a paused sandbox and
 * SetSandboxTimeout; forkd-rest to the same fields of a JSON body before it
 * calls forkd, so that a client reads the same message on either side.
 *
 * Each check returns 0, or -EINVAL with the message in err. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "forkd-bus.h"

#define FORK_OPTION_ERROR_MAX 128

#define ON_TIMEOUT_KILL "kill"
#define ON_TIMEOUT_PAUSE "pause"

/* A sandbox's memory limit, memory_limit_mib (0: none). */
#define MEMORY_LIMIT_MIB_MIN 16u
#define MEMORY_LIMIT_MIB_MAX (1024u * 1024u)

/* timeout_secs: 1..SANDBOX_TIMEOUT_SECS_MAX. */
int fork_option_check_timeout_secs(int64_t secs, char err[static FORK_OPTION_ERROR_MAX]);
/* on_timeout: "kill" or "pause" (the empty string is the caller's to allow). */
int fork_option_check_on_timeout(const char *on_timeout, char err[static FORK_OPTION_ERROR_MAX]);
/* timeout_secs and on_timeout together: on_timeout given (non-NULL, non-empty)
 * needs timeout_secs given; secs_given false with secs_required fails as an out of
 * range timeout_secs would. */
int fork_option_check_deadline(bool secs_given, int64_t secs, const char *on_timeout, bool secs_required,
                               char err[static FORK_OPTION_ERROR_MAX]);
/* memory_limit_mib: MEMORY_LIMIT_MIB_MIN..MEMORY_LIMIT_MIB_MAX. */
int fork_option_check_memory_limit_mib(int64_t mib, char err[static FORK_OPTION_ERROR_MAX]);
/* network: "none" or "egress". */
int fork_option_check_network(const char *network, char err[static FORK_OPTION_ERROR_MAX]);

/* cpu_limit: a number of CPUs, CPU_LIMIT_MIN..vcpus (the snapshot's). */
#define CPU_LIMIT_MIN 0.01
int fork_option_check_cpu_limit(double cpus, uint32_t vcpus, char err[static FORK_OPTION_ERROR_MAX]);
/* The part that holds whatever the snapshot: a finite number >= CPU_LIMIT_MIN
 * (where the vcpus are not known yet). */
int fork_option_check_cpu_limit_any(double cpus, char err[static FORK_OPTION_ERROR_MAX]);

/* disk_rate and net_rate: {"bandwidth": bytes/s, "ops": ops/s, "burst": bytes},
 * each optional (0: that dimension is unlimited), at least one given; burst
 * needs bandwidth. */
#define RATE_BANDWIDTH_MIN UINT64_C(4096)
#define RATE_BANDWIDTH_MAX (UINT64_C(1) << 40)
#define RATE_OPS_MIN UINT64_C(1)
#define RATE_OPS_MAX UINT64_C(10000000)
#define RATE_BURST_MAX (UINT64_C(1) << 40)

struct rate_limit {
        uint64_t bandwidth; /* bytes/s; 0: unlimited */
        uint64_t ops;       /* operations/s; 0: unlimited */
        uint64_t burst;     /* bytes the bucket holds; 0: one second's worth of bandwidth */
};

static inline bool rate_limit_is_set(const struct rate_limit *l) {
        return l->bandwidth > 0 || l->ops > 0;
}

/* field: "disk_rate" or "net_rate", for the message. given: which keys were
 * given at all (RATE_KEY_*), so that an explicit 0 is told from an absent key. */
#define RATE_KEY_BANDWIDTH 1u
#define RATE_KEY_OPS 2u
#define RATE_KEY_BURST 4u
int fork_option_check_rate(const char *field, const struct rate_limit *l, unsigned given,
                           char err[static FORK_OPTION_ERROR_MAX]);
/* Sets key ("bandwidth", "ops" or "burst") of l to v and its RATE_KEY_* bit in
 * *given; -EINVAL for any other key. */
int rate_limit_set(struct rate_limit *l, unsigned *given, const char *key, uint64_t v);

/* A rate as JSON, {"bandwidth":N,"ops":N,"burst":N}: the REST body's, and the
 * VMM's spawn and set_limits requests. Refuses other keys, non-integers and
 * values out of bounds, with the check's words. */
struct json_object;
int rate_limit_from_json(struct json_object *o, const char *field, struct rate_limit *ret,
                         char err[static FORK_OPTION_ERROR_MAX]);
/* Only the dimensions set ({"bandwidth":0} for none); NULL on ENOMEM. */
struct json_object *rate_limit_to_json(const struct rate_limit *l);

/* The limits of a sandbox besides memory_limit_mib (zero: none). cpu_limit
 * needs a cgroup of the sandbox's own; the rates are its VMM's. */
struct sandbox_limits {
        double cpu_limit;
        struct rate_limit disk_rate, net_rate;
};

/* A fork of a sandbox keeps its limits, but for those the fork names. */
static inline void sandbox_limits_override(struct sandbox_limits *l, const struct sandbox_limits *given) {
        if (given->cpu_limit > 0)
                l->cpu_limit = given->cpu_limit;
        if (rate_limit_is_set(&given->disk_rate))
                l->disk_rate = given->disk_rate;
        if (rate_limit_is_set(&given->net_rate))
                l->net_rate = given->net_rate;
}

/* cgroup v2's cpu.max period, and cpu_limit's quota in it. */
#define CPU_LIMIT_PERIOD_USEC 100000u
static inline uint64_t cpu_limit_quota_usec(double cpus) {
        return (uint64_t) (cpus * CPU_LIMIT_PERIOD_USEC + 0.5);
}
