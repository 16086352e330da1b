/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The tools of forkctl mcp: each one's table of arguments (mcp-args.c makes
 * the inputSchema of it and checks a call's arguments against it before any
 * D-Bus call) and its call to forkd. The calls are forkctl's: the same
 * methods, forkctl's error messages.
 */

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>

#include "boot-files.h"
#include "bus-json.h"
#include "bus-util.h"
#include "fork-options.h"
#include "forkctl-util.h"
#include "json-util.h"
#include "macro.h"
#include "mcp-args.h"
#include "mcp-tools.h"
#include "mcp.h"
#include "rate-bus.h"

struct mcp_tool {
        const char *name;
        const char *title;
        const char *description;
        const struct mcp_param *params; /* terminated by an entry without name */
        bool read_only, destructive;
        int (*run)(sd_bus *bus, const struct mcp_args *a, struct json_object **ret, char **ret_error);
};

static char *bus_failure(const sd_bus_error *e, int r, const struct error_context *ctx) {
        _cleanup_free_ char *msg = NULL;

        if (!sd_bus_error_is_set(e))
                return mcp_asprintf("%s failed: %s", ctx->verb, strerror(-r));
        msg = forkctl_error_message(e, ctx);
        if (!msg)
                return NULL;
        return mcp_asprintf("%s [%s]", msg, e->name);
}

/* ---- results ------------------------------------------------------------- */

static int wrap(const char *key, struct json_object *value, struct json_object **ret) {
        _cleanup_json_ struct json_object *o = json_object_new_object();

        if (!o || !value || json_object_object_add(o, key, value) < 0) {
                json_object_put(value);
                return -ENOMEM;
        }
        *ret = TAKE_PTR(o);
        return 0;
}

/* Ping, Exec, Eval and RunCode answer the guest agent's JSON, passed through.
 * The guest is not trusted: what is not one strict JSON object (json-c alone
 * would let a lone surrogate escape through as invalid UTF-8) is passed on as
 * the string it is, {"raw": ...}. */
static int agent_result(sd_bus_message *reply, struct json_object **ret) {
        _cleanup_json_ struct json_object *j = NULL;
        const char *s;
        int r;

        r = sd_bus_message_read(reply, "s", &s);
        if (r < 0)
                return r;
        r = json_parse_strict(s, strlen(s), SIZE_MAX, MCP_JSON_DEPTH_MAX, &j, NULL);
        if (r == -ENOMEM)
                return r;
        if (r >= 0) {
                *ret = TAKE_PTR(j);
                return 0;
        }
        return wrap("raw", json_object_new_string(s), ret);
}

/* ---- the tools ------------------------------------------------------------- */

static int call(sd_bus *bus, sd_bus_message *m, uint64_t timeout, const struct error_context *ctx,
                sd_bus_message **ret_reply, char **ret_error) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        int r;

        r = sd_bus_call(bus, m, timeout, &error, ret_reply);
        if (r < 0)
                *ret_error = bus_failure(&error, r, ctx);
        return r;
}

static int new_call(sd_bus *bus, const char *method, sd_bus_message **ret) {
        return sd_bus_message_new_method_call(bus, ret, FORKD_BUS_NAME, FORKD_MANAGER_PATH,
                                              FORKD_MANAGER_INTERFACE, method);
}

static int open_boot_file(const char *what, const char *path, int *ret_fd, char **ret_error) {
        int r = boot_file_open(path, ret_fd);

        if (r == -EISDIR || r == -EINVAL)
                *ret_error = mcp_asprintf("create_snapshot: the %s %s is not a regular file", what, path);
        else if (r < 0)
                *ret_error = mcp_asprintf("create_snapshot: cannot open the %s %s: %s", what, path, strerror(-r));
        return r;
}

static int tool_create_snapshot(sd_bus *bus, const struct mcp_args *a, struct json_object **ret, char **ret_error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_close_ int kernel_fd = -EBADF, rootfs_fd = -EBADF, initrd_fd = -EBADF;
        struct error_context ctx = { .verb = "create_snapshot", .tag = a->tag };
        char initrd[PATH_MAX];
        int r;

        /* Opened here, as the user who runs us: forkd reads only what we could
         * (CreateSnapshotFromFds), as forkctl snapshot create does. */
        r = open_boot_file("kernel", a->kernel, &kernel_fd, ret_error);
        if (r >= 0)
                r = open_boot_file("rootfs", a->rootfs, &rootfs_fd, ret_error);
        if (r >= 0 && boot_initrd_beside(a->kernel, initrd, sizeof initrd) > 0)
                r = open_boot_file("initrd (found beside the kernel)", initrd, &initrd_fd, ret_error);
        if (r < 0)
                return r;

        r = new_call(bus, "CreateSnapshotFromFds", &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "shhuu", a->tag, kernel_fd, rootfs_fd, a->mem_mib, a->boot_wait_secs);
        if (r >= 0)
                r = initrd_fd >= 0 ? sd_bus_message_append(m, "a{sv}", 1, "initrd", "h", initrd_fd) :
                                     sd_bus_message_append(m, "a{sv}", 0);
        if (r < 0)
                return r;
        r = call(bus, m, MAX(FORKCTL_CALL_TIMEOUT_USEC, ((uint64_t) a->boot_wait_secs + 120) * USEC_PER_SEC),
                 &ctx, &reply, ret_error);
        if (r < 0)
                return r;
        return bus_message_read_dict_json(reply, ret);
}

static int tool_list_snapshots(sd_bus *bus, const struct mcp_args *a, struct json_object **ret, char **ret_error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        struct error_context ctx = { .verb = "list_snapshots" };
        struct json_object *list = NULL;
        int r;

        r = new_call(bus, "ListSnapshots", &m);
        if (r < 0)
                return r;
        r = call(bus, m, 0, &ctx, &reply, ret_error);
        if (r < 0)
                return r;
        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0)
                return r;
        return wrap("snapshots", list, ret);
}

/* cpu_limit, disk_rate and net_rate given to a fork tool, checked with forkd's
 * words and appended to the open options a{sv}. 1 when any was given. */
static int append_limits(const char *tool, const struct mcp_args *a, sd_bus_message *m, char **ret_error) {
        static const struct {
                const char *name;
                size_t offset;
        } rates[] = { { "disk_rate", offsetof(struct mcp_args, disk_rate) },
                      { "net_rate", offsetof(struct mcp_args, net_rate) } };
        char err[FORK_OPTION_ERROR_MAX];
        int r, given = 0;

        if (a->cpu_limit > 0) {
                if (fork_option_check_cpu_limit_any(a->cpu_limit, err) < 0) {
                        *ret_error = mcp_asprintf("%s: %s", tool, err);
                        return -EINVAL;
                }
                r = sd_bus_message_append(m, "{sv}", "cpu_limit", "d", a->cpu_limit);
                if (r < 0)
                        return r;
                given = 1;
        }
        for (size_t k = 0; k < ELEMENTSOF(rates); k++) {
                struct json_object *o = *(struct json_object *const *) ((const uint8_t *) a + rates[k].offset);
                struct rate_limit l;

                if (!o)
                        continue;
                if (rate_limit_from_json(o, rates[k].name, &l, err) < 0) {
                        *ret_error = mcp_asprintf("%s: %s", tool, err);
                        return -EINVAL;
                }
                r = bus_append_rate(m, rates[k].name, &l);
                if (r < 0)
                        return r;
                given = 1;
        }
        return given;
}

static int tool_spawn_sandboxes(sd_bus *bus, const struct mcp_args *a, struct json_object **ret, char **ret_error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        struct error_context ctx = { .verb = "spawn_sandboxes", .tag = a->snapshot_tag };
        struct json_object *list = NULL;
        int r;

        r = new_call(bus, "Fork", &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "su", a->snapshot_tag, a->n);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0 && a->per_child_netns)
                r = sd_bus_message_append(m, "{sv}", "per_child_netns", "b", 1);
        if (r >= 0 && a->memory_limit_mib > 0)
                r = sd_bus_message_append(m, "{sv}", "memory_limit_mib", "u", a->memory_limit_mib);
        if (r >= 0 && a->live_fork)
                r = sd_bus_message_append(m, "{sv}", "live_fork", "b", 1);
        if (r >= 0)
                r = append_limits("spawn_sandboxes", a, m, ret_error);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return r;
        r = call(bus, m, 0, &ctx, &reply, ret_error);
        if (r < 0)
                return r;
        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0)
                return r;
        return wrap("sandboxes", list, ret);
}

static int tool_list_sandboxes(sd_bus *bus, const struct mcp_args *a, struct json_object **ret, char **ret_error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        struct error_context ctx = { .verb = "list_sandboxes" };
        struct json_object *list = NULL;
        int r;

        r = new_call(bus, "ListSandboxes", &m);
        if (r < 0)
                return r;
        r = call(bus, m, 0, &ctx, &reply, ret_error);
        if (r < 0)
                return r;
        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0)
                return r;
        return wrap("sandboxes", list, ret);
}

/* Leave forkd time to report the guest's timeout itself. */
static uint64_t agent_timeout(uint32_t secs) {
        return MAX(FORKCTL_CALL_TIMEOUT_USEC, ((uint64_t) (secs ?: 30) + 60) * USEC_PER_SEC);
}

static int tool_exec(sd_bus *bus, const struct mcp_args *a, struct json_object **ret, char **ret_error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        struct error_context ctx = { .verb = "exec", .id = a->sandbox_id };
        size_t n = json_object_array_length(a->argv);
        int r;

        r = new_call(bus, "Exec", &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "s", a->sandbox_id);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "s");
        for (size_t i = 0; r >= 0 && i < n; i++)
                r = sd_bus_message_append_basic(m, 's', json_object_get_string(json_object_array_get_idx(a->argv, i)));
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r >= 0)
                r = sd_bus_message_append(m, "u", a->timeout_secs);
        if (r < 0)
                return r;
        r = call(bus, m, agent_timeout(a->timeout_secs), &ctx, &reply, ret_error);
        if (r < 0)
                return r;
        return agent_result(reply, ret);
}

static int tool_eval(sd_bus *bus, const struct mcp_args *a, struct json_object **ret, char **ret_error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        struct error_context ctx = { .verb = "eval", .id = a->sandbox_id };
        int r;

        r = new_call(bus, "Eval", &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "ss", a->sandbox_id, a->code);
        if (r < 0)
                return r;
        r = call(bus, m, agent_timeout(0), &ctx, &reply, ret_error);
        if (r < 0)
                return r;
        return agent_result(reply, ret);
}

static int tool_run_code(sd_bus *bus, const struct mcp_args *a, struct json_object **ret, char **ret_error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        struct error_context ctx = { .verb = "run_code", .id = a->sandbox_id };
        int r;

        r = new_call(bus, "RunCode", &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "ssu", a->sandbox_id, a->code, a->timeout_secs);
        if (r < 0)
                return r;
        r = call(bus, m, agent_timeout(a->timeout_secs), &ctx, &reply, ret_error);
        if (r < 0)
                return r;
        return agent_result(reply, ret);
}

static int tool_fork_sandbox(sd_bus *bus, const struct mcp_args *a, struct json_object **ret, char **ret_error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_json_ struct json_object *list = NULL, *doc = NULL;
        struct error_context ctx = { .verb = "fork_sandbox", .id = a->sandbox_id };
        uint64_t pause_us = 0;
        int r;

        /* ForkSandboxEx with the limits given, else ForkSandbox as before. */
        r = new_call(bus, a->cpu_limit > 0 || a->disk_rate || a->net_rate ? "ForkSandboxEx" : "ForkSandbox", &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "su", a->sandbox_id, a->n);
        if (r >= 0 && (a->cpu_limit > 0 || a->disk_rate || a->net_rate)) {
                r = sd_bus_message_open_container(m, 'a', "{sv}");
                if (r >= 0)
                        r = append_limits("fork_sandbox", a, m, ret_error);
                if (r >= 0)
                        r = sd_bus_message_close_container(m);
        }
        if (r < 0)
                return r;
        r = call(bus, m, 0, &ctx, &reply, ret_error);
        if (r < 0)
                return r;
        r = bus_message_read_dict_array_json(reply, &list);
        if (r >= 0)
                r = sd_bus_message_read(reply, "t", &pause_us);
        if (r < 0)
                return r;
        doc = json_object_new_object();
        if (!doc || json_object_object_add(doc, "sandboxes", TAKE_PTR(list)) < 0 ||
            json_object_object_add(doc, "parent_pause_us", json_object_new_uint64(pause_us)) < 0)
                return -ENOMEM;
        *ret = TAKE_PTR(doc);
        return 0;
}

static int tool_branch_sandbox(sd_bus *bus, const struct mcp_args *a, struct json_object **ret, char **ret_error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        struct error_context ctx = { .verb = "branch_sandbox", .id = a->sandbox_id, .tag = a->tag };
        int r;

        if (!a->wait && strcmp(a->mode, "live") != 0) {
                *ret_error = mcp_asprintf("branch_sandbox: wait false needs mode \"live\", not \"%s\"", a->mode);
                return -EINVAL;
        }
        r = new_call(bus, "BranchSandbox", &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "sssb", a->sandbox_id, a->tag ?: "", a->mode, (int) a->wait);
        if (r < 0)
                return r;
        r = call(bus, m, 0, &ctx, &reply, ret_error);
        if (r < 0)
                return r;
        return bus_message_read_dict_json(reply, ret);
}

static int tool_kill_sandbox(sd_bus *bus, const struct mcp_args *a, struct json_object **ret, char **ret_error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        _cleanup_json_ struct json_object *doc = NULL;
        struct error_context ctx = { .verb = "kill_sandbox", .id = a->sandbox_id };
        int r;

        r = new_call(bus, "TerminateSandbox", &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "s", a->sandbox_id);
        if (r < 0)
                return r;
        r = call(bus, m, 0, &ctx, NULL, ret_error);
        if (r < 0)
                return r;
        doc = json_object_new_object();
        if (!doc || json_object_object_add(doc, "id", json_object_new_string(a->sandbox_id)) < 0 ||
            json_object_object_add(doc, "killed", json_object_new_boolean(1)) < 0)
                return -ENOMEM;
        *ret = TAKE_PTR(doc);
        return 0;
}

/* A Manager method that takes the id and answers a SandboxInfo a{sv}. */
static int sandbox_info_call(sd_bus *bus, const char *member, const char *verb, const struct mcp_args *a,
                             struct json_object **ret, char **ret_error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        struct error_context ctx = { .verb = verb, .id = a->sandbox_id };
        int r;

        r = new_call(bus, member, &m);
        if (r >= 0)
                r = sd_bus_message_append(m, "s", a->sandbox_id);
        if (r < 0)
                return r;
        r = call(bus, m, 0, &ctx, &reply, ret_error);
        if (r < 0)
                return r;
        return bus_message_read_dict_json(reply, ret);
}

static int tool_pause_sandbox(sd_bus *bus, const struct mcp_args *a, struct json_object **ret, char **ret_error) {
        return sandbox_info_call(bus, "PauseSandbox", "pause_sandbox", a, ret, ret_error);
}

static int tool_resume_sandbox(sd_bus *bus, const struct mcp_args *a, struct json_object **ret, char **ret_error) {
        return sandbox_info_call(bus, "ResumeSandbox", "resume_sandbox", a, ret, ret_error);
}

/* ---- the tables ---------------------------------------------------------- */

static const char *const branch_modes[] = { "full", "diff", "live", NULL };

#define P_SANDBOX_ID(what)                                                                          \
        { .name = "sandbox_id", .type = MCP_NAME, .required = true, .offset = ARG(sandbox_id),      \
          .description = what " (an id from spawn_sandboxes or list_sandboxes)" }
#define P_TIMEOUT                                                                                   \
        { .name = "timeout_secs", .type = MCP_INTEGER, .min = 0, .max = 3600, .has_default = true,  \
          .def = 0, .offset = ARG(timeout_secs),                                                    \
          .description = "How long the guest may take, in seconds; 0 means forkd's default (30)" }

static const struct mcp_param params_create_snapshot[] = {
        { .name = "tag", .type = MCP_NAME, .required = true, .offset = ARG(tag),
          .description = "Name of the new snapshot" },
        { .name = "kernel", .type = MCP_PATH, .required = true, .offset = ARG(kernel),
          .description = "Absolute path of the guest kernel on the host; opened with the rights of the user "
                         "running the MCP server (an initrd.img beside a vmlinuz is used too)" },
        { .name = "rootfs", .type = MCP_PATH, .required = true, .offset = ARG(rootfs),
          .description = "Absolute path of the root disk image on the host; opened as the kernel is" },
        { .name = "mem_mib", .type = MCP_INTEGER, .min = 0, .max = 3072, .has_default = true, .def = 0,
          .offset = ARG(mem_mib),
          .description = "Guest memory in MiB: 0 for the default (256), else an even number from 16 to 3072" },
        { .name = "boot_wait_secs", .type = MCP_INTEGER, .min = 1, .max = 600, .has_default = true, .def = 60,
          .offset = ARG(boot_wait_secs),
          .description = "How long to wait for the booted guest's agent to answer before giving up" },
        {}
};

static const struct mcp_param params_none[] = { {} };

/* The limits a fork tool takes (forkd's fork options of the same names). */
#define P_LIMITS                                                                                                   \
        { .name = "cpu_limit", .type = MCP_NUMBER, .min = 0, .offset = ARG(cpu_limit),                          \
          .description = "CPUs each sandbox may use, e.g. 0.5 (at least 0.01, at most the snapshot's vCPUs); "     \
                         "needs a cgroup per sandbox" },                                                            \
        { .name = "disk_rate", .type = MCP_RATE, .offset = ARG(disk_rate),                                        \
          .description = "Disk rate limit of each sandbox: bandwidth (bytes/s, 4096..2^40), ops (per second) and " \
                         "burst (bytes), each optional, 0 for unlimited" },                                        \
        { .name = "net_rate", .type = MCP_RATE, .offset = ARG(net_rate),                                          \
          .description = "Network rate limit of each sandbox, as disk_rate" }


static const struct mcp_param params_spawn_sandboxes[] = {
        { .name = "snapshot_tag", .type = MCP_NAME, .required = true, .offset = ARG(snapshot_tag),
          .description = "The snapshot to fork (a tag from list_snapshots)" },
        { .name = "n", .type = MCP_INTEGER, .min = 1, .max = 1000, .has_default = true, .def = 1, .offset = ARG(n),
          .description = "How many sandboxes to fork" },
        { .name = "memory_limit_mib", .type = MCP_INTEGER, .min = 0, .max = 1048576, .has_default = true, .def = 0,
          .offset = ARG(memory_limit_mib),
          .description = "Memory limit of each sandbox's VMM (its cgroup) in MiB; 0 for none" },
        { .name = "per_child_netns", .type = MCP_BOOLEAN, .has_default = true, .def = false,
          .offset = ARG(per_child_netns),
          .description = "Run child i in the network namespace forkd-child-<i> (made beforehand by the "
                         "administrator with tools/netns-setup)" },
        { .name = "live_fork", .type = MCP_BOOLEAN, .has_default = true, .def = false, .offset = ARG(live_fork),
          .description = "Accepted for compatibility; changes nothing (every sandbox can take every kind of branch)" },
        P_LIMITS,
        {}
};

static const struct mcp_param params_exec[] = {
        P_SANDBOX_ID("The sandbox to run the command in"),
        { .name = "args", .type = MCP_STRING_ARRAY, .required = true, .min = 1, .max = MCP_EXEC_ARGS_MAX,
          .offset = ARG(argv),
          .description = "The command and its arguments, e.g. [\"sh\", \"-c\", \"ls /\"]; no shell unless you ask "
                         "for one" },
        P_TIMEOUT,
        {}
};

static const struct mcp_param params_eval[] = {
        P_SANDBOX_ID("The sandbox to evaluate in"),
        { .name = "code", .type = MCP_TEXT, .required = true, .min = 1, .max = MCP_CODE_LENGTH_MAX, .offset = ARG(code),
          .description = "A Python expression" },
        {}
};

static const struct mcp_param params_run_code[] = {
        P_SANDBOX_ID("The sandbox to run the code in"),
        { .name = "code", .type = MCP_TEXT, .required = true, .min = 1, .max = MCP_CODE_LENGTH_MAX, .offset = ARG(code),
          .description = "Python statements; the sandbox's globals persist from one call to the next" },
        P_TIMEOUT,
        {}
};

static const struct mcp_param params_fork_sandbox[] = {
        P_SANDBOX_ID("The running sandbox to fork"),
        { .name = "n", .type = MCP_INTEGER, .min = 1, .max = 32, .has_default = true, .def = 1, .offset = ARG(n),
          .description = "How many sandboxes to make" },
        P_LIMITS,
        {}
};

static const struct mcp_param params_branch_sandbox[] = {
        P_SANDBOX_ID("The running sandbox to branch"),
        { .name = "tag", .type = MCP_NAME, .offset = ARG(tag),
          .description = "Name of the new snapshot; without it forkd names it branch-<sandbox_id>-<unix time>" },
        { .name = "mode", .type = MCP_ENUM, .values = branch_modes, .has_default = true, .def_str = "full",
          .offset = ARG(mode),
          .description = "full: a whole snapshot; diff: only the pages changed since the sandbox's own snapshot, "
                         "chained on it; live: the sandbox resumes before the snapshot is written" },
        { .name = "wait", .type = MCP_BOOLEAN, .has_default = true, .def = true, .offset = ARG(wait),
          .description = "false (mode live only): return while the snapshot is still being written" },
        {}
};

static const struct mcp_param params_kill_sandbox[] = {
        P_SANDBOX_ID("The sandbox to terminate"),
        {}
};

static const struct mcp_param params_pause_sandbox[] = {
        P_SANDBOX_ID("The running sandbox to pause"),
        {}
};

static const struct mcp_param params_resume_sandbox[] = {
        P_SANDBOX_ID("The paused sandbox to resume"),
        {}
};

static const struct mcp_tool tools[] = {
        { "create_snapshot", "Create a snapshot",
          "Boot a guest kernel with a root disk, wait until its agent answers and snapshot it under a new tag, "
          "ready for spawn_sandboxes. Takes as long as the boot. Returns the snapshot's info.",
          params_create_snapshot, false, false, tool_create_snapshot },
        { "list_snapshots", "List snapshots",
          "List the snapshots sandboxes can be forked from: tag, guest, memory and disk size, parent, owner.",
          params_none, true, false, tool_list_snapshots },
        { "spawn_sandboxes", "Spawn sandboxes",
          "Fork n sandboxes (copy-on-write microVMs) of a snapshot; returns them once each guest answers, with "
          "their ids for exec, eval, run_code, fork_sandbox, branch_sandbox and kill_sandbox.",
          params_spawn_sandboxes, false, false, tool_spawn_sandboxes },
        { "list_sandboxes", "List sandboxes",
          "List your running sandboxes: id, snapshot, state, pid, memory limit, creation time.",
          params_none, true, false, tool_list_sandboxes },
        { "exec", "Run a command in a sandbox",
          "Run a command (no shell) in a sandbox and wait for it; returns its stdout, stderr and exit code.",
          params_exec, false, false, tool_exec },
        { "eval", "Evaluate an expression in a sandbox",
          "Evaluate a Python expression in the sandbox's warm interpreter; returns its value.",
          params_eval, false, false, tool_eval },
        { "run_code", "Run code in a sandbox",
          "Run statements in the sandbox's interpreter, as in a REPL: globals persist across calls and into "
          "forks and branches. Returns the captured stdout and the error, if any.",
          params_run_code, false, false, tool_run_code },
        { "fork_sandbox", "Fork a running sandbox",
          "Fork a running sandbox into n new sandboxes that start from its state now (memory, files, globals); "
          "it pauses for a moment and runs on. Returns the new sandboxes and the pause.",
          params_fork_sandbox, false, false, tool_fork_sandbox },
        { "branch_sandbox", "Branch a sandbox into a snapshot",
          "Snapshot a running sandbox under a new tag, to spawn_sandboxes from later; the sandbox runs on. "
          "Returns the new snapshot's info.",
          params_branch_sandbox, false, false, tool_branch_sandbox },
        { "kill_sandbox", "Terminate a sandbox",
          "Terminate a sandbox; its VM and everything in it are gone.",
          params_kill_sandbox, false, true, tool_kill_sandbox },
        { "pause_sandbox", "Pause a sandbox",
          "Pause a running sandbox: its state (memory, files, globals, processes) is kept on disk and its VM "
          "exits. A paused sandbox can be forked with fork_sandbox and resumed with resume_sandbox; other tools "
          "refuse it. Returns its info, status \"paused\".",
          params_pause_sandbox, false, false, tool_pause_sandbox },
        { "resume_sandbox", "Resume a paused sandbox",
          "Resume a paused sandbox under the same id, with the state it was paused with; returns once its guest "
          "answers, with its info, status \"running\".",
          params_resume_sandbox, false, false, tool_resume_sandbox },
};

int mcp_tools_list(struct json_object **ret) {
        _cleanup_json_ struct json_object *list = json_object_new_array();

        if (!list)
                return -ENOMEM;
        for (size_t i = 0; i < ELEMENTSOF(tools); i++) {
                const struct mcp_tool *t = tools + i;
                _cleanup_json_ struct json_object *o = json_object_new_object(), *ann = json_object_new_object();
                struct json_object *schema = NULL;
                int r;

                if (!o || !ann)
                        return -ENOMEM;
                r = mcp_params_schema(t->params, &schema);
                if (r >= 0)
                        r = mcp_json_add(o, "name", json_object_new_string(t->name));
                if (r >= 0)
                        r = mcp_json_add(o, "title", json_object_new_string(t->title));
                if (r >= 0)
                        r = mcp_json_add(o, "description", json_object_new_string(t->description));
                if (r >= 0)
                        r = mcp_json_add(o, "inputSchema", schema);
                if (r >= 0)
                        r = mcp_json_add(ann, "readOnlyHint", json_object_new_boolean(t->read_only));
                if (r >= 0)
                        r = mcp_json_add(ann, "destructiveHint", json_object_new_boolean(t->destructive));
                if (r >= 0)
                        r = mcp_json_add(ann, "openWorldHint", json_object_new_boolean(0));
                if (r >= 0)
                        r = mcp_json_add(o, "annotations", TAKE_PTR(ann));
                if (r >= 0 && json_object_array_add(list, TAKE_PTR(o)) < 0)
                        r = -ENOMEM;
                if (r < 0)
                        return r;
        }
        *ret = TAKE_PTR(list);
        return 0;
}

/* ---- arguments ------------------------------------------------------------- */

static const struct mcp_tool *tool_find(const char *name) {
        for (size_t i = 0; i < ELEMENTSOF(tools); i++)
                if (strcmp(tools[i].name, name) == 0)
                        return tools + i;
        return NULL;
}

bool mcp_tool_exists(const char *name) {
        return tool_find(name) != NULL;
}

/* ---- tools/call ------------------------------------------------------------ */

static int text_result(const char *text, bool is_error, struct json_object *structured, struct json_object **ret) {
        _cleanup_json_ struct json_object *res = json_object_new_object(), *content = json_object_new_array(),
                                          *item = json_object_new_object();
        int r;

        if (!res || !content || !item)
                return -ENOMEM;
        r = mcp_json_add(item, "type", json_object_new_string("text"));
        if (r >= 0)
                r = mcp_json_add(item, "text", json_object_new_string(text));
        if (r >= 0 && json_object_array_add(content, TAKE_PTR(item)) < 0)
                r = -ENOMEM;
        if (r >= 0)
                r = mcp_json_add(res, "content", TAKE_PTR(content));
        if (r >= 0 && structured)
                r = mcp_json_add(res, "structuredContent", json_object_get(structured));
        if (r >= 0)
                r = mcp_json_add(res, "isError", json_object_new_boolean(is_error));
        if (r < 0)
                return r;
        *ret = TAKE_PTR(res);
        return 0;
}

int mcp_tools_call(struct mcp_server *s, const char *name, struct json_object *arguments,
                   struct json_object **ret) {
        _cleanup_json_ struct json_object *result = NULL;
        _cleanup_free_ char *error = NULL;
        const struct mcp_tool *t;
        struct mcp_args a;
        sd_bus *bus;
        const char *text;
        int r;

        t = tool_find(name);
        if (!t)
                return -ENOENT;

        r = mcp_args_parse(t->name, t->params, arguments, &a, &error);
        if (r < 0)
                goto fail;

        r = mcp_server_bus(s, &bus);
        if (r < 0) {
                const char *addr = s->bus_address;
                error = mcp_asprintf("%s: cannot connect to %s%s: %s; is D-Bus running? Without a system bus, run "
                                     "'tools/forkd-stack up' and give its FORKD_BUS_ADDRESS to forkctl mcp "
                                     "(--bus-address or the environment)", t->name,
                                     addr ? "the bus at " : "the system bus", addr ?: "", strerror(-r));
                goto fail;
        }

        r = t->run(bus, &a, &result, &error);
        if (r < 0)
                goto fail;

        text = json_object_to_json_string_ext(result, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        if (!text)
                return -ENOMEM;
        return text_result(text, false, result, ret);

fail:
        if (!error)
                error = mcp_asprintf("%s failed: %s", t->name, strerror(-r));
        if (!error)
                return -ENOMEM;
        return text_result(error, true, NULL, ret);
}
