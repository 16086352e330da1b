/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* forkctl helpers that do not talk to the bus: error messages that say what to
 * do, strict number parsing, formatting of sizes and times. Unit-tested. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

#include "forkd-bus.h"

/* What the call was about, for the message: the tag or sandbox id (may be NULL). */
struct error_context {
        const char *verb;    /* "fork", "snapshot create", ... */
        const char *tag;     /* snapshot tag, if any */
        const char *id;      /* sandbox id, if any */
};

/* Formats a one-line message (without "forkctl: " and without newline) for a
 * failed call: what went wrong, then what to do. Returns a malloc()ed string or
 * NULL on OOM. e may carry any error name; unknown ones keep forkd's message. */
char *forkctl_error_message(const sd_bus_error *e, const struct error_context *ctx);

/* Exit code for a failed call: 1 in general; 4 denied, 3 no such object, 5 forkd unreachable. */
int forkctl_error_exit_code(const sd_bus_error *e);

/* Strict unsigned parsing: decimal digits only, no sign, no spaces, no trailing
 * bytes, within [min, max]. *ret is untouched on failure (-EINVAL, -ERANGE). */
int parse_u32(const char *s, uint32_t min, uint32_t max, uint32_t *ret);

/* forkd's expires_at, "2026-05-20T08:08:46.123456Z" (UTC; the fraction optional), in seconds since
 * the epoch, the fraction dropped. -EINVAL for anything else (a leap second too); *ret untouched then. */
int parse_rfc3339_utc(const char *s, uint64_t *ret);

/* "64.0M", "1.5G", "512B": buf of at least 16 bytes. */
const char *format_bytes(char *buf, size_t size, uint64_t bytes);
/* Local time "2026-05-20 08:08:46", or "-" for 0. buf of at least 32 bytes. */
const char *format_unix_time(char *buf, size_t size, uint64_t t);

/* snapshot create --volume HOST:GUEST[:ro|cow|rw] (mode ro when absent): host
 * absolute, guest as snapshot_volume_guest_path_is_valid() wants it. HOST may
 * hold ':' (the last one or two split). spec is modified (split in place);
 * the pointers point into it. -EINVAL with *ret_why a static reason. */
struct forkctl_volume {
        const char *host, *guest, *mode;
};
int forkctl_parse_volume(char *spec, struct forkctl_volume *ret, const char **ret_why);

/* --disk-rate and --net-rate: BW[,ops=N][,burst=N], or key=value items only
 * (bandwidth=, ops=, burst=), comma-separated. Bandwidth and burst are bytes
 * (per second for bandwidth) with an optional binary suffix K, M, G or T (KiB
 * ...); ops a plain integer; 0 leaves a dimension unlimited. The values must
 * pass fork_option_check_rate(): -EINVAL with err filled (field names the
 * option in it, e.g. "disk_rate"). */
struct rate_limit;
int forkctl_parse_rate(const char *spec, const char *field, struct rate_limit *ret, char *err, size_t err_size);

/* --cpu-limit: a decimal number (0.5, 2), >= 0.01; 0 too where zero_ok. */
int forkctl_parse_cpu_limit(const char *s, bool zero_ok, double *ret);
