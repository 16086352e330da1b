/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkctl fork, ls, kill, merge, diff, fork-sandbox, branch and ports: making
 * sandboxes, listing them, ending them, and what forks of one another share.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bus-json.h"
#include "forkctl.h"
#include "time-util.h"

/* fork and fork-sandbox --timeout S [--on-timeout A]: the options timeout_secs and on_timeout. */
static int append_deadline_options(sd_bus_message *m, const struct forkctl_options *o) {
        int r = 0;

        if (o->given & OPT_TIMEOUT)
                r = sd_bus_message_append(m, "{sv}", "timeout_secs", "u", o->timeout);
        if (r >= 0 && o->on_timeout)
                r = sd_bus_message_append(m, "{sv}", "on_timeout", "s", o->on_timeout);
        return r;
}

int verb_fork(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *list = NULL, *doc = NULL;
        struct error_context ctx = { .verb = "fork", .tag = args[0] };
        _cleanup_free_ char *what = NULL;
        uint64_t start = now_usec();
        int r;

        if ((o->given & OPT_NETWORK) && !o->network)
                return usage_error("fork --network wants none or egress");
        if ((o->given & OPT_CPU_LIMIT) && o->cpu_limit == 0)
                return usage_error("fork --cpu-limit wants a number of CPUs of at least 0.01");
        r = new_call(bus, "Fork", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "su", args[0], o->n);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0 && (o->given & OPT_PER_CHILD_NETNS))
                r = sd_bus_message_append(m, "{sv}", "per_child_netns", "b", (int) o->per_child_netns);
        if (r >= 0 && (o->given & OPT_MEMORY_LIMIT))
                r = sd_bus_message_append(m, "{sv}", "memory_limit_mib", "u", o->memory_limit_mib);
        if (r >= 0 && (o->given & OPT_LIVE_FORK))
                r = sd_bus_message_append(m, "{sv}", "live_fork", "b", (int) o->live_fork);
        if (r >= 0 && o->network)
                r = sd_bus_message_append(m, "{sv}", "network", "s", o->network);
        if (r >= 0)
                r = append_deadline_options(m, o);
        if (r >= 0)
                r = append_limit_options(m, o);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return report_error(NULL, r, &ctx);

        if (asprintf(&what, "Forking %u sandbox%s of '%s'", o->n, o->n == 1 ? "" : "es", args[0]) < 0)
                return -1;
        r = call_with_progress(bus, o, m, what, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);

        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!o->json) {
                fprintf(stderr, "Forked %zu sandbox%s of '%s' in %.2fs.\n", json_object_array_length(list),
                        json_object_array_length(list) == 1 ? "" : "es", args[0],
                        (double) (now_usec() - start) / USEC_PER_SEC);
                return print_sandbox_table(list, false);
        }
        doc = json_object_new_object();
        if (!doc || json_object_object_add(doc, "sandboxes", TAKE_PTR(list)) < 0)
                return -1;
        return print_json(doc);
}

int verb_ls(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *list = NULL, *doc = NULL;
        struct error_context ctx = { .verb = "ls" };
        int r;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "ListSandboxes", &error, &reply, "");
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!o->json)
                return print_sandbox_table(list, true);
        doc = json_object_new_object();
        if (!doc || json_object_object_add(doc, "sandboxes", TAKE_PTR(list)) < 0)
                return -1;
        return print_json(doc);
}

/* At most this many TerminateSandbox calls in flight: each is answered once its
 * VMM is gone (about 15 ms of the kernel's VM teardown), so one after the other
 * a kill of 100 took 1.6 s; dbus-daemon allows 128 pending replies a connection. */
#define KILL_IN_FLIGHT 64

struct kill_call {
        int r;            /* 0 until answered; 1 done; < 0 failed */
        sd_bus_error error;
        size_t *pending;
};

static int on_kill_reply(sd_bus_message *m, void *userdata, sd_bus_error *ret_error) {
        struct kill_call *c = userdata;
        const sd_bus_error *e = sd_bus_message_get_error(m);

        if (e) {
                (void) sd_bus_error_copy(&c->error, e);
                c->r = -(sd_bus_message_get_errno(m) ?: EIO);
        } else
                c->r = 1;
        (*c->pending)--;
        return 0;
}

int verb_kill(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_json_ struct json_object *done = json_object_new_array(), *failed = json_object_new_array();
        _cleanup_free_ struct kill_call *calls = calloc(n_args ?: 1, sizeof(struct kill_call));
        _cleanup_free_ sd_bus_slot **slots = calloc(n_args ?: 1, sizeof(sd_bus_slot *));
        size_t sent = 0, pending = 0;
        int ret = 0, lost = 0;

        if (!done || !failed || !calls || !slots)
                return -1;

        /* Sent KILL_IN_FLIGHT at a time, answers in any order; reported in the order given. */
        while (sent < n_args || pending > 0) {
                int r;

                while (!lost && sent < n_args && pending < KILL_IN_FLIGHT) {
                        calls[sent].pending = &pending;
                        r = sd_bus_call_method_async(bus, &slots[sent], BUS_NAME, BUS_PATH, BUS_INTERFACE,
                                                     "TerminateSandbox", on_kill_reply, &calls[sent], "s", args[sent]);
                        if (r < 0) {
                                calls[sent].r = r;
                                lost = r;
                        } else
                                pending++;
                        sent++;
                }
                if (pending == 0)
                        break;
                r = sd_bus_process(bus, NULL);
                if (r < 0) {
                        lost = r; /* the connection is gone: what is still pending failed with it */
                        break;
                }
                if (r == 0) {
                        r = sd_bus_wait(bus, UINT64_MAX);
                        if (r < 0 && r != -EINTR) {
                                lost = r;
                                break;
                        }
                }
        }

        for (size_t i = 0; i < sent; i++) { /* the rest were not sent: forkd was gone */
                struct error_context ctx = { .verb = "kill", .id = args[i] };
                int r = calls[i].r;

                if (r == 0)
                        r = lost < 0 ? lost : -ECONNRESET; /* never answered */
                if (r < 0) {
                        int k = report_error(&calls[i].error, r, &ctx);
                        struct json_object *f = json_object_new_object();

                        if (ret == 0 || k == -EXIT_NO_FORKD)
                                ret = k;
                        if (f) {
                                json_object_object_add(f, "id", json_object_new_string(args[i]));
                                json_object_object_add(f, "error",
                                                       json_object_new_string(calls[i].error.name ?:
                                                                              "org.freedesktop.DBus.Error.Failed"));
                                json_object_object_add(f, "message",
                                                       json_object_new_string(calls[i].error.message ?: strerror(-r)));
                                json_object_array_add(failed, f);
                        }
                        if (k == -EXIT_NO_FORKD) /* forkd is gone: the others failed the same way */
                                break;
                        continue;
                }
                json_object_array_add(done, json_object_new_string(args[i]));
        }
        for (size_t i = 0; i < sent; i++) {
                slots[i] = sd_bus_slot_unref(slots[i]);
                sd_bus_error_free(&calls[i].error);
        }

        if (o->json) {
                _cleanup_json_ struct json_object *doc = json_object_new_object();
                if (!doc)
                        return -1;
                json_object_object_add(doc, "terminated", TAKE_PTR(done));
                json_object_object_add(doc, "failed", TAKE_PTR(failed));
                (void) print_json(doc);
        }
        return ret;
}

int verb_merge(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *info = NULL, *list = NULL;
        struct error_context ctx = { .verb = "merge", .id = args[0] };
        int r;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "MergeSandbox", &error, &reply, "ss",
                               args[0], args[1]);
        if (r < 0) {
                /* Name the id the daemon did not know: it may be the winner. */
                if (sd_bus_error_has_name(&error, "org.forkd.Error.NoSuchSandbox") && error.message &&
                    strstr(error.message, args[1]))
                        ctx.id = args[1];
                return report_error(&error, r, &ctx);
        }
        r = bus_message_read_dict_json(reply, &info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (o->json)
                return print_json(info);
        fprintf(stderr, "Sandbox %s now drives the VM of %s; %s is gone.\n", args[0], args[1], args[1]);
        list = json_object_new_array();
        if (!list || json_object_array_add(list, TAKE_PTR(info)) < 0)
                return -1;
        return print_sandbox_table(list, false);
}

static int read_strv_json(sd_bus_message *m, struct json_object **ret) {
        _cleanup_json_ struct json_object *a = json_object_new_array();
        const char *s;
        int r;

        if (!a)
                return -ENOMEM;
        r = sd_bus_message_enter_container(m, 'a', "s");
        if (r < 0)
                return r;
        while ((r = sd_bus_message_read_basic(m, 's', &s)) > 0)
                if (json_object_array_add(a, json_object_new_string(s)) < 0)
                        return -ENOMEM;
        if (r < 0)
                return r;
        r = sd_bus_message_exit_container(m);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(a);
        return 0;
}

int verb_diff(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        static const char *const keys[3] = { "added", "removed", "modified" };
        static const char marks[3] = { '+', '-', '~' };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *doc = NULL;
        struct error_context ctx = { .verb = "diff", .id = args[0] };
        int r;

        r = new_call(bus, "DiffSandboxes", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "ss", args[0], args[1]);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "s");
        for (size_t i = 2; r >= 0 && i < n_args; i++)
                r = sd_bus_message_append_basic(m, 's', args[i]);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        r = sd_bus_call(bus, m, 120 * USEC_PER_SEC, &error, &reply);
        if (r < 0) {
                if (sd_bus_error_has_name(&error, "org.forkd.Error.NoSuchSandbox") && error.message &&
                    strstr(error.message, args[1]))
                        ctx.id = args[1];
                return report_error(&error, r, &ctx);
        }
        doc = json_object_new_object();
        if (!doc)
                return -1;
        for (unsigned k = 0; k < 3; k++) {
                struct json_object *l = NULL;

                r = read_strv_json(reply, &l);
                if (r < 0)
                        return report_error(NULL, r, &ctx);
                json_object_object_add(doc, keys[k], l);
        }
        if (o->json)
                return print_json(doc);
        /* One line a file: + added, - removed, ~ modified, as seen from ID towards OTHER. */
        for (unsigned k = 0; k < 3; k++) {
                struct json_object *l = json_object_object_get(doc, keys[k]);

                for (size_t i = 0; i < json_object_array_length(l); i++)
                        printf("%c %s\n", marks[k], json_object_get_string(json_object_array_get_idx(l, i)));
        }
        return 0;
}

int verb_branch(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *info = NULL;
        struct error_context ctx = { .verb = "branch", .id = args[0], .tag = o->tag[0] ? o->tag : NULL };
        _cleanup_free_ char *what = NULL;
        struct json_object *v;
        int r;

        if (o->no_wait && strcmp(o->mode, "live") != 0)
                return usage_error("--no-wait needs --mode live");
        r = new_call(bus, "BranchSandbox", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "sssb", args[0], o->tag, o->mode, (int) !o->no_wait);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (asprintf(&what, "Branching sandbox '%s'", args[0]) < 0)
                return -1;
        r = call_with_progress(bus, o, m, what, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_json(reply, &info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (o->json)
                return print_json(info);
        fprintf(stderr, "Branched '%s' into snapshot '%s' (paused %s us, %s).\n", args[0],
                json_object_object_get_ex(info, "tag", &v) ? json_object_get_string(v) : "?",
                json_object_object_get_ex(info, "pause_us", &v) ? json_object_get_string(v) : "?",
                json_object_object_get_ex(info, "status", &v) ? json_object_get_string(v) : "?");
        return print_info(info, snapshot_keys);
}

int verb_fork_sandbox(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *list = NULL, *doc = NULL;
        struct error_context ctx = { .verb = "fork-sandbox", .id = args[0] };
        _cleanup_free_ char *what = NULL;
        uint64_t start = now_usec(), pause_us = 0;
        bool deadline = o->given & OPT_TIMEOUT;
        int r;

        if (o->n > 32)
                return usage_error("fork-sandbox takes -n 1..32");
        /* ForkSandboxEx only with a deadline: ForkSandbox serves a forkd without it. */
        r = new_call(bus, deadline ? "ForkSandboxEx" : "ForkSandbox", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "su", args[0], o->n);
        if (r >= 0 && deadline) {
                r = sd_bus_message_open_container(m, 'a', "{sv}");
                if (r >= 0)
                        r = append_deadline_options(m, o);
                if (r >= 0)
                        r = sd_bus_message_close_container(m);
        }
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (asprintf(&what, "Forking the sandbox '%s' into %u", args[0], o->n) < 0)
                return -1;
        r = call_with_progress(bus, o, m, what, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_array_json(reply, &list);
        if (r >= 0)
                r = sd_bus_message_read(reply, "t", &pause_us);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!o->json) {
                /* A paused sandbox is forked from its paused state: no pause (0). */
                fprintf(stderr, "Forked '%s' into %zu sandbox%s in %.2fs", args[0], json_object_array_length(list),
                        json_object_array_length(list) == 1 ? "" : "es", (double) (now_usec() - start) / USEC_PER_SEC);
                if (pause_us > 0)
                        fprintf(stderr, "; it was paused %llu us.\n", (unsigned long long) pause_us);
                else
                        fputs(".\n", stderr);
                return print_sandbox_table(list, false);
        }
        doc = json_object_new_object();
        if (!doc || json_object_object_add(doc, "sandboxes", TAKE_PTR(list)) < 0 ||
            json_object_object_add(doc, "parent_pause_us", json_object_new_uint64(pause_us)) < 0)
                return -1;
        return print_json(doc);
}

int verb_ports(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "ports", .id = args[0] };
        const char *addr;
        uint32_t port;
        int r;

        if (parse_u32(args[1], 1, 65535, &port) < 0)
                return usage_error("ports wants a TCP port in 1..65535, not '%s'", args[1]);
        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "ExposePort", &error, &reply, "sq", args[0],
                               (uint16_t) port);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = sd_bus_message_read(reply, "s", &addr);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (o->json) {
                _cleanup_json_ struct json_object *doc = json_object_new_object();

                if (!doc || json_object_object_add(doc, "host_addr", json_object_new_string(addr)) < 0)
                        return -1;
                return print_json(doc);
        }
        printf("%s\n", addr);
        return 0;
}
