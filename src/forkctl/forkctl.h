/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* forkctl's insides: the options of one command line, the verbs (one file per
 * group: forkctl-snapshots.c, forkctl-sandboxes.c, forkctl-agent.c,
 * forkctl-lifecycle.c, forkctl-pack.c), the bus calls they share
 * (forkctl-call.c) and the output they print (forkctl-output.c).
 *
 * A verb returns 0, or minus forkctl's exit status after printing why on stderr:
 * 1 failure, 2 usage error, 3 no such snapshot/sandbox, 4 access denied,
 * 5 forkd not running. */

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

#include "fork-options.h"
#include "bus-util.h"
#include "forkctl-util.h"
#include "macro.h"

#define BUS_NAME "org.forkd.Manager"
#define BUS_PATH "/org/forkd/Manager"
#define BUS_INTERFACE "org.forkd.Manager"

#define CALL_TIMEOUT_USEC FORKCTL_CALL_TIMEOUT_USEC

#define EXIT_USAGE 2
#define EXIT_NO_FORKD 5

/* snapshot diff --exec: a shell command line, at most this long */
#define EXEC_COMMAND_MAX (64u * 1024u)

/* The verb options given, to refuse ones that do not apply to the verb (a
 * 64-bit mask: uint64_t wherever a set of them is kept). */
enum {
        OPT_KERNEL = 1ull << 0,
        OPT_ROOTFS = 1ull << 1,
        OPT_MEM_MIB = 1ull << 2,
        OPT_BOOT_WAIT = 1ull << 3,
        OPT_CASCADE = 1ull << 4,
        OPT_FORCE = 1ull << 5,
        OPT_COUNT = 1ull << 6,
        OPT_MEMORY_LIMIT = 1ull << 7,
        OPT_PER_CHILD_NETNS = 1ull << 8,
        OPT_LIVE_FORK = 1ull << 9,
        OPT_TIMEOUT = 1ull << 10,
        OPT_TAG = 1ull << 11,
        OPT_MODE = 1ull << 12,
        OPT_NO_WAIT = 1ull << 13,
        OPT_TO = 1ull << 14,
        OPT_FROM = 1ull << 15,
        OPT_EXEC = 1ull << 16,
        OPT_EXEC_TIMEOUT = 1ull << 17,
        OPT_OUT = 1ull << 18,
        OPT_FILE_MODE = 1ull << 19,
        OPT_STATE_DIR = 1ull << 20,
        OPT_PREFIX = 1ull << 21,
        OPT_TOKEN_FILE = 1ull << 22,
        OPT_NETWORK = 1ull << 23,
        OPT_AGENT_TCP = 1ull << 24,
        OPT_ON_TIMEOUT = 1ull << 25,
        OPT_IMAGE = 1ull << 26,
        OPT_START_CMD = 1ull << 27,
        OPT_VOLUME = 1ull << 28,
        OPT_CPU_LIMIT = 1ull << 29,
        OPT_DISK_RATE = 1ull << 30,
        OPT_NET_RATE = 1ull << 31,
        OPT_ONCE = 1ull << 32,
        OPT_SORT = 1ull << 33,
        OPT_VCPUS = 1ull << 34,
        OPT_FOLLOW = 1ull << 35,
        OPT_OFFSET = 1ull << 36,
        OPT_CMD = 1ull << 37,
        OPT_LAST = OPT_CMD,
};

/* One command line's options. The global ones apply to every verb; the others
 * are refused (forkctl.c) by a verb that does not list their OPT_* bit. */
struct forkctl_options {
        /* global */
        const char *bus_address;   /* --bus-address, NULL: $FORKD_BUS_ADDRESS or the system bus */
        bool json, help, no_progress;
        uint64_t given;            /* OPT_* of the verb options given */

        /* snapshot create */
        const char *kernel, *rootfs;
        const char *image;         /* --image: an OCI image instead of --rootfs */
        uint32_t mem_mib, boot_wait;
        uint32_t vcpus;            /* snapshot create --vcpus, 0: not given */
        bool agent_tcp;            /* --network --agent-tcp */
        bool start_cmd;            /* --image --start-cmd */
        struct forkctl_volume volumes[24]; /* --volume HOST:GUEST[:MODE], repeatable */
        unsigned n_volumes;
        /* snapshot rm */
        bool cascade, force;
        /* snapshot compact, snapshot diff */
        const char *to, *from, *exec;
        uint32_t exec_timeout;

        /* fork, fork-sandbox */
        uint32_t n;
        uint32_t memory_limit_mib;
        double cpu_limit;          /* fork, limits --cpu-limit (limits: 0 removes it) */
        struct rate_limit disk_rate, net_rate; /* --disk-rate, --net-rate */
        bool per_child_netns, live_fork;
        const char *network;       /* fork --network none|egress */
        uint32_t timeout;          /* exec, run: 0..3600; fork, fork-sandbox: the deadline, 1..86400 */
        const char *timeout_str;   /* --timeout as given: its range is the verb's */
        const char *on_timeout;    /* --on-timeout kill|pause */
        uint32_t deadline_secs;    /* timeout ID SECS */

        /* branch, pack, unpack, snapshot diff */
        const char *tag, *mode;
        bool no_wait;
        const char *out;
        /* write-file */
        uint32_t file_mode;
        /* doctor */
        const char *state_dir, *prefix, *token_file;
        /* top */
        bool once;
        const char *sort;          /* cpu, mem, disk or net */
        /* exec --follow, logs, shell */
        bool follow;
        const char *offset_str;    /* logs --offset as given */
        uint64_t offset;
        const char *cmd;           /* shell --cmd */
};

#define FORKCTL_OPTIONS_INIT                                                                                           \
        {                                                                                                              \
                .n = 1, .tag = "", .mode = "", .exec_timeout = 600, .file_mode = 0644,                                 \
        }

/* ---- forkctl-call.c: usage errors and calls to forkd --------------------------- */

/* Prints "forkctl: MESSAGE" and the hint to --help on stderr; returns -EXIT_USAGE. */
int usage_error(const char *fmt, ...) _printf_(1, 2);

/* Connects, or says why not and returns -EXIT_NO_FORKD. */
int connect_bus(const struct forkctl_options *o, sd_bus **ret);
int new_call(sd_bus *bus, const char *method, sd_bus_message **ret);
/* Prints the error for a failed call and returns minus the exit code. */
int report_error(const sd_bus_error *e, int r, const struct error_context *ctx);
/* Like sd_bus_call(), with a spinner on a terminal (or one line otherwise), unless
 * o->no_progress. */
int call_with_progress(sd_bus *bus, const struct forkctl_options *o, sd_bus_message *m, const char *what,
                       sd_bus_error *error, sd_bus_message **ret_reply);

/* ---- forkctl-output.c: JSON and tables ------------------------------------------ */

int print_json(struct json_object *j);
/* A member as a string (non-strings in their JSON form), NULL when missing. */
const char *jstr(struct json_object *o, const char *key);
/* expires_at in local time with the action, "2026-05-20 10:08:46 (kill)"; NULL for none. */
const char *jexpires(struct json_object *o, char *buf, size_t size);
int print_snapshot_table(struct json_object *list);
int print_sandbox_table(struct json_object *list, bool empty_hint);
/* A SandboxInfo as the one row of the sandbox table, or with json as it is. */
int print_one_sandbox(struct json_object **info, bool json);
/* Vertical "Key: value" listing: the known keys (NULL-terminated) first, in order, then any others. */
int print_info(struct json_object *o, const char *const *keys);
extern const char *const snapshot_keys[];

/* ---- the verbs -------------------------------------------------------------------- */

typedef int (*verb_run_t)(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
/* Checks of a verb's arguments once it is known, before any call; may fill in defaults. */
typedef int (*verb_check_t)(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis);

/* forkctl-snapshots.c */
int verb_snapshot_create(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_snapshot_ls(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_snapshot_info(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_snapshot_rm(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_snapshot_compact(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_snapshot_diff(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int check_snapshot_create(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis);
int check_snapshot_compact(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis);
int check_snapshot_diff(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis);

/* forkctl-sandboxes.c */
int verb_fork(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_ls(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_top(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_kill(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_merge(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_diff(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_fork_sandbox(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_branch(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_ports(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);

/* forkctl-agent.c: the guest agent's calls and files */
int verb_ping(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_exec(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_eval(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_run(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_write_file(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_read_file(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);

/* forkctl-procs.c: processes in a sandbox */
int verb_exec_follow(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_ps(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_signal(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int check_signal(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis);
int verb_logs(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int check_logs(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis);
int verb_shell(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);

/* forkctl-lifecycle.c */
int verb_pause(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_resume(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_timeout(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int check_timeout(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis);
int verb_limits(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int check_limits(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis);
/* cpu_limit, disk_rate and net_rate as given, into an open a{sv}. */
int append_limit_options(sd_bus_message *m, const struct forkctl_options *o);
int check_top(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis);

/* forkctl-pack.c: bundles */
int verb_pack(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_unpack(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_push(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
int verb_pull(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args);
