/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "snapshot-meta.h"
#include "fork-options.h"
#include "forkctl-util.h"
#include "macro.h"

static char *xasprintf(const char *fmt, ...) _printf_(1, 2);
static char *xasprintf(const char *fmt, ...) {
        va_list ap;
        char *s;
        int r;

        va_start(ap, fmt);
        r = vasprintf(&s, fmt, ap);
        va_end(ap);
        return r < 0 ? NULL : s;
}

static bool is(const sd_bus_error *e, const char *name) {
        return e && e->name && strcmp(e->name, name) == 0;
}

/* The id in forkd's "sandbox ID is paused", or NULL. */
static char *paused_id(const char *msg) {
        static const char prefix[] = "sandbox ", suffix[] = " is paused";
        size_t l;

        if (!msg || strncmp(msg, prefix, strlen(prefix)) != 0)
                return NULL;
        msg += strlen(prefix);
        l = strlen(msg);
        if (l <= strlen(suffix) || strcmp(msg + l - strlen(suffix), suffix) != 0)
                return NULL;
        return strndup(msg, l - strlen(suffix));
}

char *forkctl_error_message(const sd_bus_error *e, const struct error_context *ctx) {
        static const struct error_context empty = {};
        const char *msg = e && e->message && *e->message ? e->message : NULL;
        const char *tag, *id, *verb;

        if (!ctx)
                ctx = &empty;
        tag = ctx->tag ?: "?";
        id = ctx->id ?: "?";
        verb = ctx->verb ?: "the request";

        if (is(e, SD_BUS_ERROR_SERVICE_UNKNOWN) || is(e, SD_BUS_ERROR_NAME_HAS_NO_OWNER))
                return xasprintf("forkd is not running; start it with 'systemctl start forkd' or "
                                 "'tools/forkd-stack up' (and set FORKD_BUS_ADDRESS to what it prints)");

        if (is(e, SD_BUS_ERROR_ACCESS_DENIED))
                return xasprintf("%s: %s; ask an administrator to add you to the forkd group",
                                 verb, msg ?: "access denied");

        if (is(e, FORKD_ERROR_NO_SUCH_SNAPSHOT))
                return xasprintf("no snapshot '%s'; list them with 'forkctl snapshot ls'", tag);

        if (is(e, FORKD_ERROR_NO_SUCH_SANDBOX))
                return xasprintf("no sandbox '%s' (or it is no longer running); list them with 'forkctl ls'", id);

        if (is(e, FORKD_ERROR_PAUSED)) {
                /* forkd names the paused sandbox ("sandbox ID is paused"): with two ids
                 * (merge, diff) it may be the other one, so the hint takes its id. */
                _cleanup_free_ char *paused = paused_id(msg);
                const char *p = paused ?: id;

                return xasprintf("%s: sandbox '%s' is paused; resume it with 'forkctl resume %s', or fork it as it "
                                 "is with 'forkctl fork-sandbox %s'", verb, p, p, p);
        }

        if (is(e, FORKD_ERROR_NOT_PAUSED))
                return xasprintf("%s: sandbox '%s' is not paused; pause it with 'forkctl pause %s'", verb, id, id);

        if (is(e, FORKD_ERROR_SNAPSHOT_EXISTS))
                return xasprintf("snapshot '%s' already exists; choose another tag, or remove it first with "
                                 "'forkctl snapshot rm %s'", tag, tag);

        if (is(e, FORKD_ERROR_HAS_DEPENDENTS)) {
                /* forkd names every dependent, then the REST flags: say forkctl's instead */
                const char *semi = msg ? strchr(msg, ';') : NULL;
                return xasprintf("%.*s; rerun with 'forkctl snapshot rm --cascade %s' to delete the whole subtree, "
                                 "or with --force to orphan the children (they will fail to restore)",
                                 semi ? (int) (semi - msg) : msg ? (int) strlen(msg) : 0, msg ?: "", tag);
        }

        if (is(e, FORKD_ERROR_CHAIN_BROKEN))
                return xasprintf("%s: %s", verb, msg ?: "the snapshot chain is broken");

        if (is(e, FORKD_ERROR_BUSY))
                return xasprintf("forkd is busy (%s); retry in a moment", msg ?: "too many operations running");

        if (is(e, FORKD_ERROR_NOT_SUPPORTED))
                return xasprintf("%s is not supported by this forkd yet: %s", verb, msg ?: "not supported");

        if (is(e, FORKD_ERROR_GUEST_ERROR))
                return xasprintf("the guest agent in sandbox '%s' failed: %s", id, msg ?: "no details");

        if (is(e, FORKD_ERROR_TIMEOUT))
                return xasprintf("%s: the guest did not answer in time (%s); check it with 'forkctl ping %s'",
                                 verb, msg ?: "timeout", id);

        if (is(e, SD_BUS_ERROR_INVALID_ARGS))
                return xasprintf("%s: invalid argument: %s; see 'forkctl --help'", verb, msg ?: "rejected by forkd");

        if (is(e, SD_BUS_ERROR_NO_REPLY) || is(e, SD_BUS_ERROR_TIMEOUT))
                return xasprintf("%s: forkd did not reply in time; it may still be working, check with "
                                 "'forkctl ls' / 'forkctl snapshot ls', and the journal "
                                 "('journalctl -u forkd')", verb);

        if (is(e, SD_BUS_ERROR_UNKNOWN_METHOD) || is(e, SD_BUS_ERROR_UNKNOWN_OBJECT) ||
            is(e, SD_BUS_ERROR_UNKNOWN_INTERFACE))
                return xasprintf("%s: this forkd does not offer it (%s); forkctl and forkd versions differ?",
                                 verb, msg ?: e->name);

        if (is(e, SD_BUS_ERROR_DISCONNECTED))
                return xasprintf("%s: lost the connection to the bus; is forkd still running?", verb);

        if (is(e, FORKD_ERROR_FAILED)) {
                /* A message of several lines (a failed boot quotes the guest's
                 * console) keeps its lines last. */
                if (msg && strchr(msg, '\n'))
                        return xasprintf("%s failed (see also forkd's log, 'journalctl -u forkd'): %s", verb, msg);
                return xasprintf("%s failed: %s; see forkd's log ('journalctl -u forkd')", verb,
                                 msg ?: "unknown error");
        }

        return xasprintf("%s failed: %s%s%s", verb, msg ?: "", msg ? " " : "",
                         e && e->name ? e->name : "(no error name)");
}

int forkctl_error_exit_code(const sd_bus_error *e) {
        if (is(e, SD_BUS_ERROR_ACCESS_DENIED))
                return 4;
        if (is(e, FORKD_ERROR_NO_SUCH_SNAPSHOT) || is(e, FORKD_ERROR_NO_SUCH_SANDBOX))
                return 3;
        if (is(e, SD_BUS_ERROR_SERVICE_UNKNOWN) || is(e, SD_BUS_ERROR_NAME_HAS_NO_OWNER))
                return 5;
        return 1;
}

int parse_u32(const char *s, uint32_t min, uint32_t max, uint32_t *ret) {
        unsigned long long v = 0;

        if (!s || !*s)
                return -EINVAL;
        for (const char *p = s; *p; p++) {
                if (*p < '0' || *p > '9')
                        return -EINVAL;
                v = v * 10 + (unsigned) (*p - '0');
                if (v > UINT32_MAX)
                        return -ERANGE;
        }
        if (v < min || v > max)
                return -ERANGE;
        *ret = (uint32_t) v;
        return 0;
}

const char *format_bytes(char *buf, size_t size, uint64_t bytes) {
        static const char suffix[] = "KMGTPE";
        double v = (double) bytes;
        size_t i = 0;

        if (bytes < 1024) {
                snprintf(buf, size, "%lluB", (unsigned long long) bytes);
                return buf;
        }
        v /= 1024.0;
        while (v >= 1024.0 && i + 1 < sizeof suffix - 1) {
                v /= 1024.0;
                i++;
        }
        snprintf(buf, size, "%.1f%c", v, suffix[i]);
        return buf;
}

const char *format_unix_time(char *buf, size_t size, uint64_t t) {
        struct tm tm;
        time_t tt = (time_t) t;

        if (t == 0 || t > (uint64_t) INT64_MAX || !localtime_r(&tt, &tm) ||
            strftime(buf, size, "%Y-%m-%d %H:%M:%S", &tm) == 0)
                snprintf(buf, size, "-");
        return buf;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
        int64_t era;
        unsigned yoe, doy, doe;

        y -= m <= 2;
        era = (y >= 0 ? y : y - 399) / 400;
        yoe = (unsigned) (y - era * 400);
        doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
        doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        return era * 146097 + (int64_t) doe - 719468;
}

static bool digits(const char *s, size_t n, unsigned *ret) {
        unsigned v = 0;

        for (size_t i = 0; i < n; i++) {
                if (s[i] < '0' || s[i] > '9')
                        return false;
                v = v * 10 + (unsigned) (s[i] - '0');
        }
        *ret = v;
        return true;
}

int parse_rfc3339_utc(const char *s, uint64_t *ret) {
        static const unsigned mdays[12] = { 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
        unsigned y, mo, d, h, mi, sec;
        bool leap;
        int64_t t;

        /* YYYY-MM-DDTHH:MM:SS, then an optional fraction, then Z */
        if (!s || strlen(s) < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' ||
            !digits(s, 4, &y) || !digits(s + 5, 2, &mo) || !digits(s + 8, 2, &d) || !digits(s + 11, 2, &h) ||
            !digits(s + 14, 2, &mi) || !digits(s + 17, 2, &sec))
                return -EINVAL;
        s += 19;
        if (*s == '.') {
                size_t n = strspn(s + 1, "0123456789");

                if (n == 0 || n > 9)
                        return -EINVAL;
                s += 1 + n;
        }
        if (strcmp(s, "Z") != 0)
                return -EINVAL;
        leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || (mo == 2 && d == 29 && !leap) || h > 23 ||
            mi > 59 || sec > 59)
                return -EINVAL;
        t = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec;
        *ret = (uint64_t) t;
        return 0;
}

int forkctl_parse_volume(char *spec, struct forkctl_volume *ret, const char **ret_why) {
        struct forkctl_volume v = { .mode = "ro" };
        char *c = strrchr(spec, ':');

        if (c && snapshot_volume_mode_from_string(c + 1) >= 0) {
                v.mode = c + 1;
                *c = 0;
                c = strrchr(spec, ':');
        }
        if (!c) {
                *ret_why = "--volume takes HOST:GUEST[:ro|cow|rw]";
                return -EINVAL;
        }
        *c = 0;
        v.host = spec;
        v.guest = c + 1;
        if (v.host[0] != '/') {
                *ret_why = "--volume: the host file must be an absolute path";
                return -EINVAL;
        }
        if (!snapshot_volume_guest_path_is_valid(v.guest)) {
                *ret_why = "--volume: the guest path must be absolute and normalized, not /, without \"..\", at "
                           "most 255 bytes, and not under /proc, /sys, /dev, /run or /.forkd";
                return -EINVAL;
        }
        *ret = v;
        return 0;
}

/* A size: digits, then at most one of K, M, G, T (powers of 1024). */
static int parse_size(const char *s, uint64_t *ret) {
        uint64_t v = 0;
        unsigned shift = 0;
        const char *p = s;

        if (*p < '0' || *p > '9')
                return -EINVAL;
        for (; *p >= '0' && *p <= '9'; p++) {
                if (v > (UINT64_MAX - 9) / 10)
                        return -ERANGE;
                v = v * 10 + (uint64_t) (*p - '0');
        }
        switch (*p) {
        case '\0': break;
        case 'k': case 'K': shift = 10; p++; break;
        case 'M': shift = 20; p++; break;
        case 'G': shift = 30; p++; break;
        case 'T': shift = 40; p++; break;
        default: return -EINVAL;
        }
        if (*p)
                return -EINVAL;
        if (shift && v > (UINT64_MAX >> shift))
                return -ERANGE;
        *ret = v << shift;
        return 0;
}

int forkctl_parse_rate(const char *spec, const char *field, struct rate_limit *ret, char *err, size_t err_size) {
        _cleanup_free_ char *copy = strdup(spec ?: "");
        char check[FORK_OPTION_ERROR_MAX], *save = NULL;
        struct rate_limit l = {};
        unsigned given = 0, n = 0;

        if (!copy)
                return -ENOMEM;
        for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save), n++) {
                char *eq = strchr(item, '=');
                const char *key = "bandwidth", *value = item;
                uint64_t v;
                int r;

                if (eq) {
                        *eq = '\0';
                        key = item;
                        value = eq + 1;
                } else if (n > 0) {
                        snprintf(err, err_size, "%s: '%s' wants a key (bandwidth=, ops=, burst=)", field, item);
                        return -EINVAL;
                }
                if (strcmp(key, "ops") == 0) {
                        uint32_t u;

                        r = parse_u32(value, 0, UINT32_MAX, &u);
                        v = u;
                } else if (strcmp(key, "bandwidth") == 0 || strcmp(key, "burst") == 0)
                        r = parse_size(value, &v);
                else {
                        snprintf(err, err_size, "%s: unknown key '%s' (bandwidth, ops, burst)", field, key);
                        return -EINVAL;
                }
                if (r < 0) {
                        snprintf(err, err_size, "%s: %s wants %s, not '%s'", field, key,
                                 strcmp(key, "ops") == 0 ? "an integer" : "a number of bytes (K, M, G, T: KiB...)",
                                 value);
                        return -EINVAL;
                }
                (void) rate_limit_set(&l, &given, key, v); /* the key is one of the three, checked above */
        }
        if (fork_option_check_rate(field, &l, given, check) < 0) {
                snprintf(err, err_size, "%s", check);
                return -EINVAL;
        }
        *ret = l;
        return 0;
}

int forkctl_parse_cpu_limit(const char *s, bool zero_ok, double *ret) {
        char err[FORK_OPTION_ERROR_MAX], *end = NULL;
        double d;

        if (!s || !*s || strspn(s, "0123456789.") != strlen(s))
                return -EINVAL;
        errno = 0;
        d = strtod(s, &end);
        if (errno != 0 || !end || *end)
                return -EINVAL;
        if (!(zero_ok && d == 0) && fork_option_check_cpu_limit_any(d, err) < 0)
                return -ERANGE;
        *ret = d;
        return 0;
}
