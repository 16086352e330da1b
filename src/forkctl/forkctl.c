/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkctl: drive forkd (org.forkd.Manager) over D-Bus.
 *
 * Every verb is one method call; replies are converted to JSON objects once
 * (bus-json.c) and then either printed as one JSON document (--json) or as a
 * table (forkctl-output.c). Long calls (CreateSnapshot, Fork) run through
 * sd-event so a spinner can show progress on a terminal (forkctl-call.c).
 *
 * This file: the command line (its options, the verb table, the checks that
 * need no forkd) and main(). The verbs live in one file per group.
 */

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "doctor.h"
#include "forkctl.h"
#include "forkctl-files.h"
#include "mcp.h"

static void help(void) {
        printf("forkctl [OPTIONS...] COMMAND ...\n"
               "\n"
               "Control forkd, the copy-on-write microVM fork service, over D-Bus.\n"
               "\n"
               "Snapshots:\n"
               "  snapshot create TAG --kernel K --rootfs R [--mem-mib M] [--boot-wait S]\n"
               "                  [--network [--agent-tcp]] [--volume HOST:GUEST[:ro|cow|rw]]...\n"
               "                  [--vcpus N]\n"
               "                          Boot kernel K with root disk R, wait until its agent\n"
               "                          answers (at most S seconds, 1..600), snapshot it as TAG;\n"
               "                          --vcpus: N vCPUs (1..32, default 1), kept by every fork;\n"
               "                          --network: with a NIC, --agent-tcp: and the agent on TCP;\n"
               "                          --volume: an ext4 image mounted at GUEST (up to 24)\n"
               "  snapshot create TAG --image I [--kernel K] [--start-cmd] [...]\n"
               "                          The same from an OCI image I: a directory (an image\n"
               "                          layout) or an oci-archive or docker-archive tar; its\n"
               "                          Env, WorkingDir and User are the defaults of exec and\n"
               "                          run_code; without --kernel, forkd's default kernel;\n"
               "                          --start-cmd: start its Entrypoint and Cmd before the\n"
               "                          snapshot\n"
               "  snapshot ls             List snapshots\n"
               "  snapshot info TAG       Show everything about one snapshot\n"
               "  snapshot rm TAG [--cascade|--force]\n"
               "                          Delete a snapshot; one that others chain on only with\n"
               "                          --cascade (its whole subtree too) or --force (its\n"
               "                          children are orphaned and fail to restore)\n"
               "  snapshot compact TAG --to T\n"
               "                          Write chain head TAG as T, a flat snapshot (no parent)\n"
               "  snapshot diff --from BASE --tag T --exec CMD [--exec-timeout-secs N]\n"
               "                          Fork BASE, run sh -c CMD in it (N 1..3600, default 600),\n"
               "                          take a diff branch T of it, remove the sandbox\n"
               "Sandboxes:\n"
               "  fork TAG [-n N] [--memory-limit-mib M] [--per-child-netns] [--live-fork]\n"
               "           [--network none|egress] [--timeout S [--on-timeout kill|pause]]\n"
               "           [--cpu-limit X] [--disk-rate R] [--net-rate R]\n"
               "                          Fork N (1..1000, default 1) sandboxes of snapshot TAG;\n"
               "                          --network: a snapshot with a NIC's policy (default none);\n"
               "                          --timeout: each is killed (or paused) S seconds\n"
               "                          (1..86400) after the fork; --cpu-limit: CPUs each may\n"
               "                          use (0.01 to the snapshot's vcpus); --disk-rate and\n"
               "                          --net-rate: R is BW[,ops=N][,burst=B] (BW and B bytes,\n"
               "                          K, M, G, T for KiB...; 0: unlimited), or ops=N alone\n"
               "  ls                      List sandboxes, running and paused, with their deadline\n"
               "  top [--once [--json]] [--sort cpu|mem|disk|net]\n"
               "                          The running sandboxes' usage, refreshed every second\n"
               "                          until q or Ctrl-C: CPU%%, private and shared memory,\n"
               "                          disk and net rates (--once: one table, a second apart)\n"
               "  kill ID...              Terminate sandboxes (a paused one is deleted)\n"
               "  ping ID                 Ask a sandbox's agent whether it is alive\n"
               "  exec ID [--timeout S] -- ARGV...\n"
               "                          Run a command in a sandbox (S 0..3600, 0 = forkd's 30)\n"
               "  exec --follow ID [--timeout S] -- ARGV...\n"
               "                          Start ARGV as a background process of the sandbox and\n"
               "                          follow it: its stdout and stderr to ours as they come,\n"
               "                          its exit code as ours (128+N when signal N killed it);\n"
               "                          --timeout: it is killed after S seconds (0: never)\n"
               "  ps ID                   List a sandbox's background processes, running and\n"
               "                          exited\n"
               "  signal ID PID SIG       Send signal SIG (TERM, SIGKILL, 1..64) to process PID\n"
               "                          of a sandbox and its process group\n"
               "  logs ID PID [--follow] [--offset N]\n"
               "                          The output of process PID from byte N on (default 0):\n"
               "                          what there is, or with --follow all that comes until it\n"
               "                          exits; dropped bytes are said on stderr\n"
               "  shell ID [--cmd CMD]    An interactive shell (/bin/sh -i, or sh -c CMD) on a\n"
               "                          terminal of the sandbox's; the window size follows ours;\n"
               "                          exits with its status\n"
               "  eval ID CODE            Evaluate an expression in a sandbox\n"
               "  run ID [--timeout S] CODE\n"
               "                          Run statements in a sandbox's REPL, its globals kept\n"
               "                          (RunCode; S 0..3600, 0 = forkd's 30)\n"
               "  merge ID WINNER         ID takes over WINNER's VM (ID's own VM is destroyed,\n"
               "                          WINNER's id is gone)\n"
               "  diff ID OTHER [PATH...] Files added, removed and modified in OTHER compared\n"
               "                          with ID, under PATHs (default /root and /tmp)\n"
               "  fork-sandbox ID [-n N] [--timeout S [--on-timeout kill|pause]]\n"
               "                          Fork a running or paused sandbox into N (1..32)\n"
               "                          sandboxes that start from its state now; it runs on\n"
               "                          (or stays paused); --timeout as for fork\n"
               "  pause ID                Pause a running sandbox: its VM exits, its state is\n"
               "                          kept; only kill, fork-sandbox, timeout and resume\n"
               "                          take a paused sandbox\n"
               "  resume ID               Run a paused sandbox again, under the same ID\n"
               "  timeout ID S [--on-timeout kill|pause]\n"
               "                          Set the deadline of a running or paused sandbox to\n"
               "                          S seconds (1..86400) from now; at it, the sandbox is\n"
               "                          killed or paused (default: its action so far, kill\n"
               "                          when it had none)\n"
               "  limits ID [--cpu-limit X] [--disk-rate R] [--net-rate R] [--memory-limit-mib M]\n"
               "                          Change the limits of a running or paused sandbox (as for\n"
               "                          fork; --cpu-limit 0 and a rate of 0 remove a limit)\n"
               "  write-file ID PATH [LOCAL|-] [--file-mode M]\n"
               "                          Create or replace the file PATH in a sandbox with the\n"
               "                          contents of LOCAL (default: standard input), at most\n"
               "                          512 KiB; M is octal, default 644\n"
               "  read-file ID PATH       Write the file PATH of a sandbox (at most 512 KiB) to\n"
               "                          standard output, as it is\n"
               "  ports ID PORT           Print HOST:PORT where this host reaches TCP port PORT\n"
               "                          (1..65535) of a sandbox's guest (it needs a NIC)\n"
               "  branch ID [--tag T] [--mode full|diff|live] [--no-wait]\n"
               "                          Branch a running sandbox into a new snapshot (default\n"
               "                          tag branch-ID-<unix time>); --no-wait (live only)\n"
               "                          returns while the snapshot is still being written\n"
               "MCP:\n"
               "  mcp                     Serve the Model Context Protocol on stdin/stdout, for\n"
               "                          agents (forkctl mcp --help, forkctl-mcp(1))\n"
               "Host:\n"
               "  doctor [--state-dir DIR] [--prefix DIR] [--token-file FILE]\n"
               "                          Check what this host can do for forkd: KVM, tun,\n"
               "                          netns, cgroups, userfaultfd, reflink, polkit, the bus\n"
               "                          policy, the token; ok, warn, fail or skip with a fix;\n"
               "                          needs no forkd; exit 1 when a check failed\n"
               "                          (forkctl doctor --help)\n"
               "Bundles:\n"
               "  pack --tag T --out F    Write snapshot T and all its ancestors (a whole chain)\n"
               "                          to the bundle F (tar + zstd)\n"
               "  unpack F [--tag NEW]    Register the snapshots of bundle F (NEW renames a\n"
               "                          bundle of one snapshot)\n"
               "Registries:\n"
               "  push TAG REF            Push snapshot TAG and its ancestors to the OCI registry\n"
               "                          REF (host[:port]/repository:tag) that forkd's admin\n"
               "                          configured; prints the head's manifest digest\n"
               "  pull REF [--tag T]      Register the chain REF names (a tag or @sha256:...),\n"
               "                          fetching only the links not here; T: the head's tag\n"
               "\n"
               "Options:\n"
               "  -h --help               Show this help\n"
               "     --version            Show the version\n"
               "  -j --json               Print one JSON document on stdout instead of a table\n"
               "     --no-progress        No spinner on stderr for long operations\n"
               "     --bus-address ADDR   D-Bus address of the bus forkd is on (default:\n"
               "                          $FORKD_BUS_ADDRESS, else the system bus)\n"
               "\n"
               "Exit status: 0 success, 1 failure, 2 usage error, 3 no such snapshot/sandbox,\n"
               "4 access denied, 5 forkd not running. Errors are printed on stderr.\n"
               "See forkctl(1) and org.forkd.Manager(5).\n");
}

static void mcp_help(void) {
        printf("forkctl [--bus-address ADDR] mcp\n"
               "\n"
               "Serve the Model Context Protocol on stdin and stdout (JSON-RPC 2.0, one message a\n"
               "line), so that an MCP client (an agent, Claude Desktop, an IDE) drives forkd as the\n"
               "user who runs this: polkit decides what it may do.\n"
               "\n"
               "Tools: create_snapshot, list_snapshots, spawn_sandboxes, list_sandboxes, exec,\n"
               "eval, run_code, fork_sandbox, branch_sandbox, kill_sandbox (tools/list gives\n"
               "each one's JSON Schema).\n"
               "\n"
               "Register it with a client, e.g. in its mcpServers configuration:\n"
               "  {\"mcpServers\": {\"forkd\": {\"command\": \"forkctl\", \"args\": [\"mcp\"]}}}\n"
               "\n"
               "stdout carries protocol messages only; logs go to stderr. Messages are at most\n"
               "%u bytes. The server exits 0 at the end of its input.\n"
               "\n"
               "Options:\n"
               "  -h --help               Show this help\n"
               "     --bus-address ADDR   D-Bus address of the bus forkd is on (default:\n"
               "                          $FORKD_BUS_ADDRESS, else the system bus)\n"
               "See forkctl-mcp(1).\n", MCP_LINE_MAX);
}

static int verb_mcp(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        struct mcp_server s = { .bus_address = forkctl_bus_address(o->bus_address) };
        int r;

        log_prefix = "forkctl mcp";
        if (getenv("FORKCTL_MCP_DEBUG"))
                log_max_level = LOG_LVL_DEBUG;
        r = mcp_serve(&s, STDIN_FILENO, STDOUT_FILENO);
        mcp_server_done(&s);
        return r < 0 ? -1 : 0;
}

static int verb_doctor(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        DoctorOptions d = {
                .state_dir = o->state_dir ?: DOCTOR_STATE_DIR_DEFAULT,
                .prefix = o->prefix,
                .token_file = o->token_file,
                .bus_address = o->bus_address,
                .json = o->json,
        };
        int r;

        r = doctor_run(&d, stdout);
        if (r < 0)
                return log_error_errno(r, "Cannot write the report: %m");
        return r > 0 ? -EXIT_FAILURE : 0; /* exit status 1: a check failed */
}

/* ---- the verbs ----------------------------------------------------------- */

enum {
        VERB_NO_BUS = 1u << 0,          /* runs without connecting (mcp connects when a tool needs it) */
        VERB_DEADLINE = 1u << 1,        /* --timeout is the sandboxes' deadline, 1..86400, not 0..3600 */
        VERB_ON_TIMEOUT_ALONE = 1u << 2, /* --on-timeout without --timeout */
};

struct verb {
        const char *group; /* "snapshot" or NULL */
        const char *name;
        size_t min_args, max_args; /* positional arguments after the verb */
        uint64_t options;          /* OPT_* allowed */
        unsigned flags;            /* VERB_* */
        const char *synopsis;
        verb_run_t run;
        verb_check_t check;        /* NULL: nothing beyond the counts and options */
};

static const struct verb verbs[] = {
        { "snapshot", "create", 1, 1,
          OPT_KERNEL | OPT_ROOTFS | OPT_IMAGE | OPT_START_CMD | OPT_MEM_MIB | OPT_BOOT_WAIT | OPT_NETWORK |
                  OPT_AGENT_TCP | OPT_VOLUME | OPT_VCPUS,
          0, "snapshot create TAG (--kernel K --rootfs R | --image I [--kernel K]) [--mem-mib M] [--boot-wait S]",
          verb_snapshot_create,
          check_snapshot_create },
        { "snapshot", "ls", 0, 0, 0, 0, "snapshot ls", verb_snapshot_ls, NULL },
        { "snapshot", "list", 0, 0, 0, 0, "snapshot ls", verb_snapshot_ls, NULL },
        { "snapshot", "info", 1, 1, 0, 0, "snapshot info TAG", verb_snapshot_info, NULL },
        { "snapshot", "rm", 1, 1, OPT_CASCADE | OPT_FORCE, 0, "snapshot rm TAG [--cascade|--force]", verb_snapshot_rm,
          NULL },
        { "snapshot", "compact", 1, 1, OPT_TO, 0, "snapshot compact TAG --to T", verb_snapshot_compact,
          check_snapshot_compact },
        { "snapshot", "diff", 0, 0, OPT_FROM | OPT_TAG | OPT_EXEC | OPT_EXEC_TIMEOUT, 0,
          "snapshot diff --from BASE --tag T --exec CMD [--exec-timeout-secs N]", verb_snapshot_diff,
          check_snapshot_diff },
        { NULL, "fork", 1, 1,
          OPT_COUNT | OPT_MEMORY_LIMIT | OPT_PER_CHILD_NETNS | OPT_LIVE_FORK | OPT_NETWORK | OPT_TIMEOUT |
                  OPT_ON_TIMEOUT | OPT_CPU_LIMIT | OPT_DISK_RATE | OPT_NET_RATE,
          VERB_DEADLINE,
          "fork TAG [-n N] [--memory-limit-mib M] [--cpu-limit X] [--disk-rate R] [--net-rate R] "
          "[--per-child-netns] [--live-fork] [--network none|egress] [--timeout S [--on-timeout kill|pause]]",
          verb_fork, NULL },
        { NULL, "ls", 0, 0, 0, 0, "ls", verb_ls, NULL },
        { NULL, "list", 0, 0, 0, 0, "ls", verb_ls, NULL },
        { NULL, "top", 0, 0, OPT_ONCE | OPT_SORT, 0, "top [--once [--json]] [--sort cpu|mem|disk|net]", verb_top,
          check_top },
        { NULL, "kill", 1, SIZE_MAX, 0, 0, "kill ID...", verb_kill, NULL },
        { NULL, "ping", 1, 1, 0, 0, "ping ID", verb_ping, NULL },
        { NULL, "exec", 2, SIZE_MAX, OPT_TIMEOUT | OPT_FOLLOW, 0, "exec ID [--timeout S] [--follow] -- ARGV...",
          verb_exec, NULL },
        { NULL, "ps", 1, 1, 0, 0, "ps ID", verb_ps, NULL },
        { NULL, "signal", 3, 3, 0, 0, "signal ID PID SIG", verb_signal, check_signal },
        { NULL, "logs", 2, 2, OPT_FOLLOW | OPT_OFFSET, 0, "logs ID PID [--follow] [--offset N]", verb_logs,
          check_logs },
        { NULL, "shell", 1, 1, OPT_CMD, 0, "shell ID [--cmd CMD]", verb_shell, NULL },
        { NULL, "eval", 2, 2, 0, 0, "eval ID CODE", verb_eval, NULL },
        { NULL, "run", 2, 2, OPT_TIMEOUT, 0, "run ID [--timeout S] CODE", verb_run, NULL },
        { NULL, "merge", 2, 2, 0, 0, "merge ID WINNER", verb_merge, NULL },
        { NULL, "diff", 2, 2 + 64, 0, 0, "diff ID OTHER [PATH...]", verb_diff, NULL },
        { NULL, "fork-sandbox", 1, 1, OPT_COUNT | OPT_TIMEOUT | OPT_ON_TIMEOUT, VERB_DEADLINE,
          "fork-sandbox ID [-n N] [--timeout S [--on-timeout kill|pause]]", verb_fork_sandbox, NULL },
        { NULL, "pause", 1, 1, 0, 0, "pause ID", verb_pause, NULL },
        { NULL, "resume", 1, 1, 0, 0, "resume ID", verb_resume, NULL },
        { NULL, "timeout", 2, 2, OPT_ON_TIMEOUT, VERB_ON_TIMEOUT_ALONE, "timeout ID S [--on-timeout kill|pause]",
          verb_timeout, check_timeout },
        { NULL, "limits", 1, 1, OPT_CPU_LIMIT | OPT_DISK_RATE | OPT_NET_RATE | OPT_MEMORY_LIMIT, 0,
          "limits ID [--cpu-limit X] [--disk-rate R] [--net-rate R] [--memory-limit-mib M]", verb_limits,
          check_limits },
        { NULL, "write-file", 2, 3, OPT_FILE_MODE, 0, "write-file ID PATH [LOCAL|-] [--file-mode M]", verb_write_file,
          NULL },
        { NULL, "read-file", 2, 2, 0, 0, "read-file ID PATH", verb_read_file, NULL },
        { NULL, "ports", 2, 2, 0, 0, "ports ID PORT", verb_ports, NULL },
        { NULL, "branch", 1, 1, OPT_TAG | OPT_MODE | OPT_NO_WAIT, 0, "branch ID [--tag T] [--mode M] [--no-wait]",
          verb_branch, NULL },
        { NULL, "pack", 0, 0, OPT_TAG | OPT_OUT, 0, "pack --tag T --out F", verb_pack, NULL },
        { NULL, "unpack", 1, 1, OPT_TAG, 0, "unpack F [--tag NEW]", verb_unpack, NULL },
        { NULL, "push", 2, 2, 0, 0, "push TAG REF", verb_push, NULL },
        { NULL, "pull", 1, 1, OPT_TAG, 0, "pull REF [--tag T]", verb_pull, NULL },
        { NULL, "mcp", 0, 0, 0, VERB_NO_BUS, "mcp", verb_mcp, NULL },
        { NULL, "doctor", 0, 0, OPT_STATE_DIR | OPT_PREFIX | OPT_TOKEN_FILE, VERB_NO_BUS,
          "doctor [--json] [--state-dir DIR] [--prefix DIR] [--token-file FILE]", verb_doctor, NULL },
};

/* ---- the options ----------------------------------------------------------- */

enum {
        ARG_VERSION = 0x100,
        ARG_BUS_ADDRESS,
        ARG_NO_PROGRESS,
        ARG_KERNEL,
        ARG_ROOTFS,
        ARG_MEM_MIB,
        ARG_BOOT_WAIT,
        ARG_CASCADE,
        ARG_FORCE,
        ARG_MEMORY_LIMIT,
        ARG_PER_CHILD_NETNS,
        ARG_LIVE_FORK,
        ARG_TIMEOUT,
        ARG_TAG,
        ARG_MODE,
        ARG_NO_WAIT,
        ARG_TO,
        ARG_FROM,
        ARG_EXEC,
        ARG_EXEC_TIMEOUT,
        ARG_OUT,
        ARG_FILE_MODE,
        ARG_STATE_DIR,
        ARG_PREFIX,
        ARG_TOKEN_FILE,
        ARG_NETWORK,
        ARG_AGENT_TCP,
        ARG_ON_TIMEOUT,
        ARG_IMAGE,
        ARG_START_CMD,
        ARG_VOLUME,
        ARG_CPU_LIMIT,
        ARG_DISK_RATE,
        ARG_NET_RATE,
        ARG_ONCE,
        ARG_SORT,
        ARG_FOLLOW,
        ARG_OFFSET,
        ARG_CMD,
        ARG_VCPUS,
};

struct option_spec;
/* Stores value (NULL for an option without one) in o; argv and argc for an
 * optional value given as the next argument. 0, or minus the exit status. */
typedef int (*option_parse_t)(struct forkctl_options *o, const struct option_spec *s, char *value, int argc,
                              char *argv[]);

struct option_spec {
        struct option getopt;   /* long name, has_arg, getopt's value */
        const char *shown;      /* the name messages use */
        uint64_t bit;           /* OPT_*; 0 for a global option */
        option_parse_t parse;
        size_t offset;          /* of the field in struct forkctl_options that parse fills in */
        uint32_t min, max;      /* parse_u32s */
};

#define FIELD(f) offsetof(struct forkctl_options, f)
#define FIELD_PTR(o, s, type) ((type *) ((char *) (o) + (s)->offset))

static int parse_flag(struct forkctl_options *o, const struct option_spec *s, char *value, int argc, char *argv[]) {
        *FIELD_PTR(o, s, bool) = true;
        return 0;
}

static int parse_string(struct forkctl_options *o, const struct option_spec *s, char *value, int argc,
                        char *argv[]) {
        *FIELD_PTR(o, s, const char *) = value;
        return 0;
}

static int parse_bus_address(struct forkctl_options *o, const struct option_spec *s, char *value, int argc,
                             char *argv[]) {
        if (!*value)
                return usage_error("--bus-address wants a D-Bus address");
        o->bus_address = value;
        return 0;
}

static int parse_token_file(struct forkctl_options *o, const struct option_spec *s, char *value, int argc,
                            char *argv[]) {
        if (!*value)
                return usage_error("--token-file wants a path");
        o->token_file = value;
        return 0;
}

static int parse_number(const char *opt, const char *value, uint32_t min, uint32_t max, uint32_t *ret) {
        int r = parse_u32(value, min, max, ret);
        if (r < 0)
                return usage_error("%s wants a whole number in %u..%u, not '%s'", opt, min, max, value);
        return 0;
}

static int parse_u32s(struct forkctl_options *o, const struct option_spec *s, char *value, int argc, char *argv[]) {
        return parse_number(s->shown, value, s->min, s->max, FIELD_PTR(o, s, uint32_t));
}

static int parse_abs_path(struct forkctl_options *o, const struct option_spec *s, char *value, int argc,
                          char *argv[]) {
        if (value[0] != '/' || strlen(value) > 1024)
                return usage_error("%s wants an absolute path of at most 1024 bytes", s->shown);
        return parse_string(o, s, value, argc, argv);
}

static int parse_mode(struct forkctl_options *o, const struct option_spec *s, char *value, int argc, char *argv[]) {
        if (strcmp(value, "full") != 0 && strcmp(value, "diff") != 0 && strcmp(value, "live") != 0)
                return usage_error("--mode wants full, diff or live, not '%s'", value);
        o->mode = value;
        return 0;
}

/* fork takes 0.01 and more; limits 0 too (no limit), checked by check_limits(). */
static int parse_cpu_limit_option(struct forkctl_options *o, const struct option_spec *s, char *value, int argc,
                                  char *argv[]) {
        if (forkctl_parse_cpu_limit(value, true, &o->cpu_limit) < 0)
                return usage_error("--cpu-limit wants a number of CPUs of at least 0.01 (0.5, 2), not '%s'", value);
        return 0;
}

static int parse_rate_option(struct forkctl_options *o, const struct option_spec *s, char *value, int argc,
                             char *argv[]) {
        bool disk = strcmp(s->shown, "--disk-rate") == 0;
        char err[FORK_OPTION_ERROR_MAX + 64];

        if (forkctl_parse_rate(value, disk ? "disk_rate" : "net_rate", disk ? &o->disk_rate : &o->net_rate, err,
                               sizeof(err)) < 0)
                return usage_error("%s: %s", s->shown, err);
        return 0;
}

static int parse_on_timeout(struct forkctl_options *o, const struct option_spec *s, char *value, int argc,
                            char *argv[]) {
        if (strcmp(value, "kill") != 0 && strcmp(value, "pause") != 0)
                return usage_error("--on-timeout wants kill or pause, not '%s'", value);
        o->on_timeout = value;
        return 0;
}

static int parse_file_mode_option(struct forkctl_options *o, const struct option_spec *s, char *value, int argc,
                                  char *argv[]) {
        if (parse_file_mode(value, &o->file_mode) < 0)
                return usage_error("--file-mode wants an octal mode 0..7777, not '%s'", value);
        return 0;
}

static int parse_exec(struct forkctl_options *o, const struct option_spec *s, char *value, int argc, char *argv[]) {
        if (!*value || strlen(value) > EXEC_COMMAND_MAX)
                return usage_error("--exec wants a command line of 1 to %u bytes", EXEC_COMMAND_MAX);
        o->exec = value;
        return 0;
}

static int parse_sort(struct forkctl_options *o, const struct option_spec *s, char *value, int argc, char *argv[]) {
        if (!streq(value, "cpu") && !streq(value, "mem") && !streq(value, "disk") && !streq(value, "net"))
                return usage_error("--sort wants cpu, mem, disk or net, not '%s'", value);
        o->sort = value;
        return 0;
}

static int parse_volume_option(struct forkctl_options *o, const struct option_spec *s, char *value, int argc,
                               char *argv[]) {
        const char *why = NULL;

        if (o->n_volumes >= ELEMENTSOF(o->volumes))
                return usage_error("--volume: at most %zu volumes", ELEMENTSOF(o->volumes));
        if (forkctl_parse_volume(value, &o->volumes[o->n_volumes], &why) < 0)
                return usage_error("%s", why);
        o->n_volumes++;
        return 0;
}

/* "snapshot create --network" has no value, "fork --network P" one, also as the next argument. */
static int parse_network(struct forkctl_options *o, const struct option_spec *s, char *value, int argc,
                         char *argv[]) {
        if (!value && optind < argc && (strcmp(argv[optind], "none") == 0 || strcmp(argv[optind], "egress") == 0))
                value = argv[optind++];
        if (value && strcmp(value, "none") != 0 && strcmp(value, "egress") != 0)
                return usage_error("--network wants none or egress, not '%s'", value);
        o->network = value;
        return 0;
}

#define FLAG(name, val, opt, field)                                                                                   \
        { .getopt = { name, no_argument, NULL, val }, .shown = "--" name, .bit = opt, .parse = parse_flag,             \
          .offset = FIELD(field) }
#define STRING(name, val, opt, check, field)                                                                          \
        { .getopt = { name, required_argument, NULL, val }, .shown = "--" name, .bit = opt, .parse = check,            \
          .offset = FIELD(field) }
#define NUMBER(name, val, opt, field, lo, hi)                                                                         \
        { .getopt = { name, required_argument, NULL, val }, .shown = "--" name, .bit = opt, .parse = parse_u32s,       \
          .offset = FIELD(field), .min = lo, .max = hi }
#define OTHER(name, has, val, opt, check)                                                                             \
        { .getopt = { name, has, NULL, val }, .shown = "--" name, .bit = opt, .parse = check }

/* In getopt's order; --version is handled by parse_argv() itself. */
static const struct option_spec option_specs[] = {
        FLAG("help", 'h', 0, help),
        { .getopt = { "version", no_argument, NULL, ARG_VERSION }, .shown = "--version" },
        FLAG("json", 'j', 0, json),
        FLAG("no-progress", ARG_NO_PROGRESS, 0, no_progress),
        OTHER("bus-address", required_argument, ARG_BUS_ADDRESS, 0, parse_bus_address),
        STRING("kernel", ARG_KERNEL, OPT_KERNEL, parse_string, kernel),
        STRING("rootfs", ARG_ROOTFS, OPT_ROOTFS, parse_string, rootfs),
        STRING("image", ARG_IMAGE, OPT_IMAGE, parse_string, image),
        FLAG("start-cmd", ARG_START_CMD, OPT_START_CMD, start_cmd),
        NUMBER("mem-mib", ARG_MEM_MIB, OPT_MEM_MIB, mem_mib, 0, UINT32_MAX),
        NUMBER("boot-wait", ARG_BOOT_WAIT, OPT_BOOT_WAIT, boot_wait, 1, 600),
        NUMBER("vcpus", ARG_VCPUS, OPT_VCPUS, vcpus, 1, 32),
        FLAG("cascade", ARG_CASCADE, OPT_CASCADE, cascade),
        FLAG("force", ARG_FORCE, OPT_FORCE, force),
        /* messages name it -n, whichever was given */
        { .getopt = { "count", required_argument, NULL, 'n' }, .shown = "-n", .bit = OPT_COUNT, .parse = parse_u32s,
          .offset = FIELD(n), .min = 1, .max = 1000 },
        NUMBER("memory-limit-mib", ARG_MEMORY_LIMIT, OPT_MEMORY_LIMIT, memory_limit_mib, 1, UINT32_MAX),
        FLAG("per-child-netns", ARG_PER_CHILD_NETNS, OPT_PER_CHILD_NETNS, per_child_netns),
        FLAG("live-fork", ARG_LIVE_FORK, OPT_LIVE_FORK, live_fork),
        /* parsed once the verb is known: exec and run take 0..3600, a fork's deadline 1..86400 */
        STRING("timeout", ARG_TIMEOUT, OPT_TIMEOUT, parse_string, timeout_str),
        STRING("tag", ARG_TAG, OPT_TAG, parse_string, tag),
        OTHER("mode", required_argument, ARG_MODE, OPT_MODE, parse_mode),
        FLAG("no-wait", ARG_NO_WAIT, OPT_NO_WAIT, no_wait),
        STRING("to", ARG_TO, OPT_TO, parse_string, to),
        STRING("from", ARG_FROM, OPT_FROM, parse_string, from),
        OTHER("exec", required_argument, ARG_EXEC, OPT_EXEC, parse_exec),
        NUMBER("exec-timeout-secs", ARG_EXEC_TIMEOUT, OPT_EXEC_TIMEOUT, exec_timeout, 1, 3600),
        STRING("out", ARG_OUT, OPT_OUT, parse_string, out),
        OTHER("file-mode", required_argument, ARG_FILE_MODE, OPT_FILE_MODE, parse_file_mode_option),
        STRING("state-dir", ARG_STATE_DIR, OPT_STATE_DIR, parse_abs_path, state_dir),
        STRING("prefix", ARG_PREFIX, OPT_PREFIX, parse_abs_path, prefix),
        OTHER("token-file", required_argument, ARG_TOKEN_FILE, OPT_TOKEN_FILE, parse_token_file),
        /* optional: "snapshot create --network" has none, "fork --network P" one */
        OTHER("network", optional_argument, ARG_NETWORK, OPT_NETWORK, parse_network),
        FLAG("agent-tcp", ARG_AGENT_TCP, OPT_AGENT_TCP, agent_tcp),
        OTHER("on-timeout", required_argument, ARG_ON_TIMEOUT, OPT_ON_TIMEOUT, parse_on_timeout),
        OTHER("volume", required_argument, ARG_VOLUME, OPT_VOLUME, parse_volume_option),
        OTHER("cpu-limit", required_argument, ARG_CPU_LIMIT, OPT_CPU_LIMIT, parse_cpu_limit_option),
        OTHER("disk-rate", required_argument, ARG_DISK_RATE, OPT_DISK_RATE, parse_rate_option),
        OTHER("net-rate", required_argument, ARG_NET_RATE, OPT_NET_RATE, parse_rate_option),
        FLAG("once", ARG_ONCE, OPT_ONCE, once),
        OTHER("sort", required_argument, ARG_SORT, OPT_SORT, parse_sort),
        FLAG("follow", ARG_FOLLOW, OPT_FOLLOW, follow),
        /* parsed by logs' check (a 64-bit offset) */
        STRING("offset", ARG_OFFSET, OPT_OFFSET, parse_string, offset_str),
        STRING("cmd", ARG_CMD, OPT_CMD, parse_string, cmd),
};

static const struct option_spec *option_spec_by_val(int val) {
        for (size_t i = 0; i < ELEMENTSOF(option_specs); i++)
                if (option_specs[i].getopt.val == val)
                        return option_specs + i;
        return NULL;
}

static const char *option_name(uint64_t bit) {
        for (size_t i = 0; i < ELEMENTSOF(option_specs); i++)
                if (option_specs[i].bit == bit)
                        return option_specs[i].shown;
        return "?";
}

/* 1: go on with the verb; 0: done (--help, --version); < 0: minus the exit status. */
static int parse_argv(int argc, char *argv[], struct forkctl_options *o) {
        struct option options[ELEMENTSOF(option_specs) + 1] = {};
        const struct option_spec *s;
        int c, r;

        for (size_t i = 0; i < ELEMENTSOF(option_specs); i++)
                options[i] = option_specs[i].getopt;

        opterr = 0;
        while ((c = getopt_long(argc, argv, "hjn:", options, NULL)) >= 0) {
                switch (c) {
                case ARG_VERSION:
                        printf("forkctl %s\n", FORKD_VERSION);
                        return 0;
                case '?':
                        if (optopt)
                                return usage_error("unknown option '-%c'", optopt);
                        return usage_error("unknown option '%s'", argv[optind - 1]);
                case ':':
                        return usage_error("option '%s' wants a value", argv[optind - 1]);
                }

                s = option_spec_by_val(c);
                if (!s || !s->parse)
                        return usage_error("cannot parse the options");
                r = s->parse(o, s, optarg, argc, argv);
                if (r < 0)
                        return r;
                o->given |= s->bit;
        }
        if (o->help) {
                /* forkctl mcp --help: the server's own help */
                if (optind < argc && strcmp(argv[optind], "mcp") == 0)
                        mcp_help();
                else if (optind < argc && strcmp(argv[optind], "doctor") == 0)
                        doctor_help("forkctl");
                else
                        help();
                return 0;
        }
        return 1;
}

static int find_verb(char **pos, size_t n_pos, const struct verb **ret, size_t *ret_skip) {
        for (size_t i = 0; i < ELEMENTSOF(verbs); i++) {
                const struct verb *v = verbs + i;

                if (v->group) {
                        if (strcmp(pos[0], v->group) != 0)
                                continue;
                        if (n_pos < 2)
                                return usage_error(
                                        "'snapshot' wants a subcommand: create, ls, info, rm, compact or diff");
                        if (strcmp(pos[1], v->name) != 0)
                                continue;
                        *ret_skip = 2;
                } else {
                        if (strcmp(pos[0], v->name) != 0)
                                continue;
                        *ret_skip = 1;
                }
                *ret = v;
                return 0;
        }
        if (strcmp(pos[0], "snapshot") == 0)
                return usage_error("unknown snapshot subcommand '%s'; use create, ls, info, rm, compact or diff",
                                   pos[1]);
        return usage_error("unknown command '%s'", pos[0]);
}

/* What the verb's table entry says about its arguments and options, before any call. */
static int check_verb(const struct verb *verb, struct forkctl_options *o, char **pos, size_t n_pos) {
        bool deadline = verb->flags & VERB_DEADLINE;
        int r;

        if (n_pos < verb->min_args || n_pos > verb->max_args)
                return usage_error("usage: forkctl %s", verb->synopsis);
        for (uint64_t bit = 1; bit != 0 && bit <= OPT_LAST; bit <<= 1)
                if ((o->given & bit) && !(verb->options & bit))
                        return usage_error("option %s does not apply here; usage: forkctl %s", option_name(bit),
                                           verb->synopsis);

        if (o->given & OPT_TIMEOUT) {
                r = parse_number("--timeout", o->timeout_str, deadline ? 1 : 0,
                                 deadline ? SANDBOX_TIMEOUT_SECS_MAX : 3600, &o->timeout);
                if (r < 0)
                        return r;
        }
        if ((o->given & OPT_ON_TIMEOUT) && !(verb->flags & VERB_ON_TIMEOUT_ALONE) && !(o->given & OPT_TIMEOUT))
                return usage_error("--on-timeout needs --timeout; usage: forkctl %s", verb->synopsis);

        return verb->check ? verb->check(o, pos, n_pos, verb->synopsis) : 0;
}

static int run(int argc, char *argv[]) {
        _cleanup_(sd_bus_flush_close_unrefp) sd_bus *bus = NULL;
        struct forkctl_options o = FORKCTL_OPTIONS_INIT;
        const struct verb *verb = NULL;
        char **pos;
        size_t n_pos, skip = 0;
        int r;

        r = parse_argv(argc, argv, &o);
        if (r <= 0)
                return r;

        pos = argv + optind;
        n_pos = (size_t) (argc - optind);
        if (n_pos == 0)
                return usage_error("no command given");

        r = find_verb(pos, n_pos, &verb, &skip);
        if (r < 0)
                return r;
        pos += skip;
        n_pos -= skip;
        r = check_verb(verb, &o, pos, n_pos);
        if (r < 0)
                return r;

        if (!(verb->flags & VERB_NO_BUS)) {
                r = connect_bus(&o, &bus);
                if (r < 0)
                        return r;
        }
        return verb->run(bus, &o, pos, n_pos);
}

int main(int argc, char *argv[]) {
        int r;

        /* A closed stdout (forkctl ls | head) must not kill us with SIGPIPE mid-call. */
        signal(SIGPIPE, SIG_IGN);

        r = run(argc, argv);
        if (fflush(stdout) != 0 && r == 0) {
                fprintf(stderr, "forkctl: failed to write the output: %s\n", strerror(errno));
                return 1;
        }
        if (r >= 0)
                return 0;
        return -r > 255 ? 1 : -r;
}
