/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkctl ping, exec, eval, run, write-file and read-file: calls that forkd
 * passes on to a sandbox's guest agent. The agent's JSON answer is printed as
 * it is, exec's as a shell would show it.
 */

#include <stdio.h>

#include "forkctl.h"
#include "forkctl-files.h"
#include "json-util.h"
#include "time-util.h"

/* Ping, Exec, Eval, RunCode all answer the guest agent's JSON, passed through. */
static int agent_result(sd_bus_message *reply, const struct error_context *ctx, bool json, bool exec) {
        _cleanup_json_ struct json_object *j = NULL;
        const char *s;
        int r;

        r = sd_bus_message_read(reply, "s", &s);
        if (r < 0)
                return report_error(NULL, r, ctx);

        j = json_tokener_parse(s);
        if (json) {
                if (!j) {
                        /* Still one valid JSON document: wrap what we got. */
                        _cleanup_json_ struct json_object *w = json_object_new_object();
                        if (!w)
                                return -1;
                        json_object_object_add(w, "raw", json_object_new_string(s));
                        return print_json(w);
                }
                return print_json(j);
        }
        if (!j || !json_object_is_type(j, json_type_object)) {
                puts(s);
                return 0;
        }

        if (exec) {
                /* A Linux agent answers with stdout/stderr/exit code; show them like a shell would. */
                struct json_object *v;
                bool shown = false;
                int code = 0;

                if (json_object_object_get_ex(j, "stdout", &v) && json_object_is_type(v, json_type_string)) {
                        fputs(json_object_get_string(v), stdout);
                        shown = true;
                }
                if (json_object_object_get_ex(j, "stderr", &v) && json_object_is_type(v, json_type_string)) {
                        fputs(json_object_get_string(v), stderr);
                        shown = true;
                }
                if ((json_object_object_get_ex(j, "exit_code", &v) || json_object_object_get_ex(j, "returncode", &v)) &&
                    json_object_is_type(v, json_type_int)) {
                        code = json_object_get_int(v);
                        if (code < 0 || code > 255)
                                code = 1;
                        shown = true;
                }
                if (shown)
                        return -code;
        }
        return print_json(j);
}

int verb_ping(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "ping", .id = args[0] };
        int r;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "Ping", &error, &reply, "s", args[0]);
        if (r < 0)
                return report_error(&error, r, &ctx);
        return agent_result(reply, &ctx, o->json, false);
}

int verb_exec(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "exec", .id = args[0] };
        uint64_t timeout;
        int r;

        if (o->follow)
                return verb_exec_follow(bus, o, args, n_args);
        r = new_call(bus, "Exec", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "s", args[0]);
        if (r >= 0)
                r = sd_bus_message_append_strv(m, args + 1);
        if (r >= 0)
                r = sd_bus_message_append(m, "u", o->timeout);
        if (r < 0)
                return report_error(NULL, r, &ctx);

        /* Leave forkd time to report the guest's timeout itself. */
        timeout = MAX(CALL_TIMEOUT_USEC, ((uint64_t) (o->timeout ?: 30) + 60) * USEC_PER_SEC);
        r = sd_bus_call(bus, m, timeout, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        return agent_result(reply, &ctx, o->json, true);
}

int verb_eval(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "eval", .id = args[0] };
        int r;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "Eval", &error, &reply, "ss", args[0],
                               args[1]);
        if (r < 0)
                return report_error(&error, r, &ctx);
        return agent_result(reply, &ctx, o->json, false);
}

int verb_run(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "run", .id = args[0] };
        int r;

        r = new_call(bus, "RunCode", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "ssu", args[0], args[1], o->timeout);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        r = sd_bus_call(bus, m, MAX(CALL_TIMEOUT_USEC, ((uint64_t) (o->timeout ?: 30) + 60) * USEC_PER_SEC), &error,
                        &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        return agent_result(reply, &ctx, o->json, false);
}

int verb_write_file(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        return forkctl_write_file(bus, args[0], args[1], n_args > 2 ? args[2] : NULL, o->file_mode, o->json);
}

int verb_read_file(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        return forkctl_read_file(bus, args[0], args[1], o->json);
}
