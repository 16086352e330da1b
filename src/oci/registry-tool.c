/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* registry-tool: the registry client from the command line, for the tests.
 *
 *   registry-tool pull-layout REF --config FILE --out DIR [--timeout SEC]
 *   registry-tool push-layout DIR REF --config FILE [--timeout SEC]
 *
 * --timeout: for a request, and for a blob transfer that stalls.
 *
 * Prints one JSON object on success; the error on stderr and exit 1 otherwise. */

#include <getopt.h>
#include <inttypes.h>

#include "macro.h"
#include "registry.h"
#include "time-util.h"

static int usage(void) {
        fprintf(stderr, "usage: registry-tool pull-layout REF --config FILE --out DIR [--timeout SEC]\n"
                        "       registry-tool push-layout DIR REF --config FILE [--timeout SEC]\n");
        return 2;
}

static int run(const char *verb, const char *ref_s, const char *dir, const char *config, uint64_t timeout_usec) {
        _cleanup_(oci_registry_config_freep) oci_registry_config *c = NULL;
        _cleanup_(oci_registry_freep) oci_registry *reg = NULL;
        _cleanup_(oci_ref_freep) oci_ref *ref = NULL;
        _cleanup_free_ char *error = NULL;
        oci_layout_stats st = {};
        int r;

        r = oci_ref_parse(ref_s, &ref, &error);
        if (r < 0)
                return log_error_errno(r, "%s", error ?: "invalid reference"), 1;
        r = oci_registry_config_load(config, &c, &error);
        if (r < 0)
                return log_error_errno(r, "%s", error ?: "invalid configuration"), 1;
        r = oci_registry_new(c, ref->host, &reg, &error);
        if (r < 0)
                return log_error_errno(r, "%s", error ?: "cannot make a registry client"), 1;
        oci_registry_set_timeouts(reg, timeout_usec, timeout_usec, timeout_usec);

        if (strcmp(verb, "pull-layout") == 0) {
                r = oci_registry_pull_layout(reg, ref, dir, 0, &st);
                if (r < 0)
                        return log_error_errno(r, "pull %s: %s", ref_s, oci_registry_error(reg)), 1;
                printf("{\"fetched_bytes\": %" PRIu64 ", \"blobs_fetched\": %u, \"digest\": \"%s\"}\n",
                       st.fetched_bytes, st.blobs_fetched, st.digest);
        } else {
                r = oci_registry_push_layout(reg, dir, ref, &st);
                if (r < 0)
                        return log_error_errno(r, "push %s: %s", ref_s, oci_registry_error(reg)), 1;
                printf("{\"sent_bytes\": %" PRIu64 ", \"blobs_sent\": %u, \"digest\": \"%s\"}\n", st.sent_bytes,
                       st.blobs_sent, st.digest);
        }
        return 0;
}

int main(int argc, char *argv[]) {
        static const struct option options[] = {
                { "config", required_argument, NULL, 'c' },
                { "out", required_argument, NULL, 'o' },
                { "timeout", required_argument, NULL, 't' },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        const char *config = NULL, *out = NULL;
        uint64_t timeout_usec = 0;
        char *end;
        int c;

        log_prefix = "registry-tool";
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                switch (c) {
                case 'c':
                        config = optarg;
                        break;
                case 'o':
                        out = optarg;
                        break;
                case 't':
                        errno = 0;
                        timeout_usec = strtoull(optarg, &end, 10);
                        if (errno != 0 || end == optarg || *end || timeout_usec == 0 || timeout_usec > 3600)
                                return log_error("--timeout: 1 to 3600 seconds, not %s", optarg), 2;
                        timeout_usec *= USEC_PER_SEC;
                        break;
                case 'h':
                        usage();
                        return 0;
                default:
                        return usage();
                }
        argc -= optind;
        argv += optind;
        if (!config || argc < 1)
                return usage();
        if (strcmp(argv[0], "pull-layout") == 0 && argc == 2 && out)
                return run(argv[0], argv[1], out, config, timeout_usec);
        if (strcmp(argv[0], "push-layout") == 0 && argc == 3 && !out)
                return run(argv[0], argv[2], argv[1], config, timeout_usec);
        return usage();
}
