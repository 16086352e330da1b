/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkctl pause, resume, timeout and limits: a sandbox's life after its fork.
 */

#include <stdio.h>
#include <stdlib.h>

#include "bus-json.h"
#include "forkctl.h"
#include "rate-bus.h"

int check_timeout(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis) {
        if (parse_u32(args[1], 1, SANDBOX_TIMEOUT_SECS_MAX, &o->deadline_secs) < 0)
                return usage_error("timeout wants S, a whole number of seconds in 1..%u, not '%s'; usage: forkctl %s",
                                   SANDBOX_TIMEOUT_SECS_MAX, args[1], synopsis);
        return 0;
}

/* PauseSandbox and ResumeSandbox: id in, SandboxInfo out; each waits for a VM to go or to answer. */
static int pause_or_resume(sd_bus *bus, const struct forkctl_options *o, const char *id, bool pause) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *info = NULL;
        struct error_context ctx = { .verb = pause ? "pause" : "resume", .id = id };
        _cleanup_free_ char *what = NULL;
        int r;

        r = new_call(bus, pause ? "PauseSandbox" : "ResumeSandbox", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "s", id);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (asprintf(&what, "%s sandbox '%s'", pause ? "Pausing" : "Resuming", id) < 0)
                return -1;
        r = call_with_progress(bus, o, m, what, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_json(reply, &info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!o->json) {
                if (pause)
                        fprintf(stderr, "Paused sandbox '%s'; resume it with 'forkctl resume %s'.\n", id, id);
                else
                        fprintf(stderr, "Resumed sandbox '%s'.\n", id);
        }
        return print_one_sandbox(&info, o->json);
}

int verb_pause(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        return pause_or_resume(bus, o, args[0], true);
}

int verb_resume(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        return pause_or_resume(bus, o, args[0], false);
}

int verb_timeout(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *info = NULL;
        struct error_context ctx = { .verb = "timeout", .id = args[0] };
        char expires[96];
        int r;

        /* "" keeps the sandbox's action */
        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "SetSandboxTimeout", &error, &reply, "sus",
                               args[0], o->deadline_secs, o->on_timeout ?: "");
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_json(reply, &info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!o->json)
                fprintf(stderr, "Sandbox '%s' expires at %s.\n", args[0],
                        jexpires(info, expires, sizeof expires) ?: "?");
        return print_one_sandbox(&info, o->json);
}

int check_limits(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis) {
        if (!(o->given & (OPT_CPU_LIMIT | OPT_DISK_RATE | OPT_NET_RATE | OPT_MEMORY_LIMIT)))
                return usage_error("limits wants at least one of --cpu-limit, --disk-rate, --net-rate and "
                                   "--memory-limit-mib; usage: forkctl %s", synopsis);
        return 0;
}

/* The limits given, into an open a{sv} (fork's options, SetSandboxLimits's). */
int append_limit_options(sd_bus_message *m, const struct forkctl_options *o) {
        int r = 0;

        if (o->given & OPT_CPU_LIMIT)
                r = sd_bus_message_append(m, "{sv}", "cpu_limit", "d", o->cpu_limit);
        if (r >= 0 && (o->given & OPT_DISK_RATE))
                r = bus_append_rate(m, "disk_rate", &o->disk_rate);
        if (r >= 0 && (o->given & OPT_NET_RATE))
                r = bus_append_rate(m, "net_rate", &o->net_rate);
        return r;
}

int verb_limits(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *info = NULL;
        struct error_context ctx = { .verb = "limits", .id = args[0] };
        int r;

        r = new_call(bus, "SetSandboxLimits", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "s", args[0]);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0)
                r = append_limit_options(m, o);
        if (r >= 0 && (o->given & OPT_MEMORY_LIMIT))
                r = sd_bus_message_append(m, "{sv}", "memory_limit_mib", "u", o->memory_limit_mib);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        r = sd_bus_call(bus, m, 0, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_json(reply, &info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!o->json)
                fprintf(stderr, "Limits of sandbox '%s' changed.\n", args[0]);
        return print_one_sandbox(&info, o->json);
}
