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
