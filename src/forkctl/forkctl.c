/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkctl: drive forkd (org.forkd.Manager) over D-Bus.
 *
 * Every verb is one method call; replies are converted to JSON objects once
 * (bus-json.c) and then either printed as one JSON document (--json) or as a
 * table. Long calls (CreateSnapshot, Fork) run through sd-event so a spinner
 * can show progress on a terminal.
 */

#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>
#include <time.h>

#include "boot-files.h"
#include "bus-json.h"
#include "bus-util.h"
#include "forkctl-files.h"
#include "forkctl-util.h"
#include "macro.h"
#include "doctor.h"
#include "mcp.h"
#include "snapshot-meta.h"
#include "table.h"

#define BUS_NAME "org.forkd.Manager"
#define BUS_PATH "/org/forkd/Manager"
#define BUS_INTERFACE "org.forkd.Manager"

#define USEC_PER_SEC FORKCTL_USEC_PER_SEC
#define CALL_TIMEOUT_USEC FORKCTL_CALL_TIMEOUT_USEC

#define EXIT_USAGE 2

static const char *arg_bus_address = NULL;
static bool arg_json = false;
static bool arg_help = false;
static bool arg_no_progress = false;
static const char *arg_kernel = NULL, *arg_rootfs = NULL;
static uint32_t arg_mem_mib = 0, arg_boot_wait = 0;
static bool arg_cascade = false, arg_force = false;
static uint32_t arg_n = 1;
static uint32_t arg_memory_limit_mib = 0;
static bool arg_memory_limit_set = false;
static bool arg_per_child_netns = false, arg_live_fork = false;
static const char *arg_network = NULL; /* fork --network none|egress */
static bool arg_agent_tcp = false;    /* snapshot create --network --agent-tcp */
static uint32_t arg_timeout = 0;      /* exec, run: 0..3600; fork, fork-sandbox: the deadline, 1..86400 */
static const char *arg_timeout_str = NULL; /* --timeout as given: its range is the verb's */
static const char *arg_on_timeout = NULL;  /* --on-timeout kill|pause */
static uint32_t arg_deadline_secs = 0;     /* timeout ID SECS */
static const char *arg_tag = "", *arg_mode = "";
static bool arg_no_wait = false;
static const char *arg_to = NULL, *arg_from = NULL, *arg_exec = NULL;
static uint32_t arg_exec_timeout = 600;
/* snapshot diff --exec: a shell command line, at most this long */
#define EXEC_COMMAND_MAX (64u * 1024u)
static const char *arg_out = NULL;
static uint32_t arg_file_mode = 0644;
static const char *arg_state_dir = NULL, *arg_prefix = NULL, *arg_token_file = NULL;

/* Options given, to refuse ones that do not apply to the verb. */
enum {
        OPT_KERNEL = 1u << 0,
        OPT_ROOTFS = 1u << 1,
        OPT_MEM_MIB = 1u << 2,
        OPT_BOOT_WAIT = 1u << 3,
        OPT_CASCADE = 1u << 4,
        OPT_FORCE = 1u << 5,
        OPT_COUNT = 1u << 6,
        OPT_MEMORY_LIMIT = 1u << 7,
        OPT_PER_CHILD_NETNS = 1u << 8,
        OPT_LIVE_FORK = 1u << 9,
        OPT_TIMEOUT = 1u << 10,
        OPT_TAG = 1u << 11,
        OPT_MODE = 1u << 12,
        OPT_NO_WAIT = 1u << 13,
        OPT_TO = 1u << 14,
        OPT_FROM = 1u << 15,
        OPT_EXEC = 1u << 16,
        OPT_EXEC_TIMEOUT = 1u << 17,
        OPT_OUT = 1u << 18,
        OPT_FILE_MODE = 1u << 19,
        OPT_STATE_DIR = 1u << 20,
        OPT_PREFIX = 1u << 21,
        OPT_TOKEN_FILE = 1u << 22,
        OPT_NETWORK = 1u << 23,
        OPT_AGENT_TCP = 1u << 24,
        OPT_ON_TIMEOUT = 1u << 25,
        OPT_LAST = OPT_ON_TIMEOUT,
};
static unsigned arg_given = 0;

static int usage_error(const char *fmt, ...) _printf_(1, 2);
static int usage_error(const char *fmt, ...) {
        va_list ap;

        fputs("forkctl: ", stderr);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputs("\nTry 'forkctl --help'.\n", stderr);
        return -EXIT_USAGE;
}

static void help(void) {
        printf("forkctl [OPTIONS...] COMMAND ...\n"
               "\n"
               "Control forkd, the copy-on-write microVM fork service, over D-Bus.\n"
               "\n"
               "Snapshots:\n"
               "  snapshot create TAG --kernel K --rootfs R [--mem-mib M] [--boot-wait S]\n"
               "                  [--network [--agent-tcp]]\n"
               "                          Boot kernel K with root disk R, wait until its agent\n"
               "                          answers (at most S seconds, 1..600), snapshot it as TAG;\n"
               "                          --network: with a NIC, --agent-tcp: and the agent on TCP\n"
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
               "                          Fork N (1..1000, default 1) sandboxes of snapshot TAG;\n"
               "                          --network: a snapshot with a NIC's policy (default none);\n"
               "                          --timeout: each is killed (or paused) S seconds\n"
               "                          (1..86400) after the fork\n"
               "  ls                      List sandboxes, running and paused, with their deadline\n"
               "  kill ID...              Terminate sandboxes (a paused one is deleted)\n"
               "  ping ID                 Ask a sandbox's agent whether it is alive\n"
               "  exec ID [--timeout S] -- ARGV...\n"
               "                          Run a command in a sandbox (S 0..3600, 0 = forkd's 30)\n"
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

/* ---- bus ---------------------------------------------------------------- */

static const char *bus_address(void) {
        return forkctl_bus_address(arg_bus_address);
}

static int connect_bus(sd_bus **ret) {
        const char *addr = bus_address();
        int r;

        r = forkctl_bus_open(addr, ret);
        if (r < 0) {
                fprintf(stderr,
                        "forkctl: cannot connect to %s%s: %s\n"
                        "forkctl: is D-Bus running? Without a system bus, run 'tools/forkd-stack up' and set\n"
                        "forkctl: FORKD_BUS_ADDRESS (or --bus-address) to the address it prints.\n",
                        addr ? "the bus at " : "the system bus at ",
                        addr ?: (getenv("DBUS_SYSTEM_BUS_ADDRESS") ?: "unix:path=/run/dbus/system_bus_socket"),
                        strerror(-r));
                return -5;
        }
        return 0;
}

static int new_call(sd_bus *bus, const char *method, sd_bus_message **ret) {
        int r = sd_bus_message_new_method_call(bus, ret, BUS_NAME, BUS_PATH, BUS_INTERFACE, method);
        if (r < 0)
                fprintf(stderr, "forkctl: failed to build the %s call: %s\n", method, strerror(-r));
        return r;
}

/* Prints the error for a failed call and returns minus the exit code. */
static int report_error(const sd_bus_error *e, int r, const struct error_context *ctx) {
        _cleanup_free_ char *msg = NULL;

        if (!sd_bus_error_is_set(e)) {
                fprintf(stderr, "forkctl: %s failed: %s\n", ctx && ctx->verb ? ctx->verb : "call",
                        strerror(-r));
                return -1;
        }
        msg = forkctl_error_message(e, ctx);
        fprintf(stderr, "forkctl: %s\n", msg ?: "out of memory");
        return -forkctl_error_exit_code(e);
}

/* ---- progress ----------------------------------------------------------- */

struct progress {
        const char *what;
        uint64_t start_usec;
        unsigned tick;
        bool tty;
        sd_bus_message *reply;
};

static uint64_t now_usec(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * USEC_PER_SEC + (uint64_t) ts.tv_nsec / 1000;
}

static int on_tick(sd_event_source *s, uint64_t usec, void *userdata) {
        static const char spinner[] = "|/-\\";
        struct progress *p = userdata;
        double elapsed = (double) (now_usec() - p->start_usec) / USEC_PER_SEC;

        fprintf(stderr, "\r%c %s... %.1fs\033[K", spinner[p->tick++ % 4], p->what, elapsed);
        fflush(stderr);
        return sd_event_source_set_time(s, usec + 100 * 1000);
}

static int on_reply(sd_bus_message *m, void *userdata, sd_bus_error *ret_error) {
        struct progress *p = userdata;

        p->reply = sd_bus_message_ref(m);
        return sd_event_exit(sd_bus_get_event(sd_bus_message_get_bus(m)), 0);
}

/* Like sd_bus_call(), with a spinner on a terminal (or one line otherwise). */
static int call_with_progress(sd_bus *bus, sd_bus_message *m, const char *what, sd_bus_error *error,
                              sd_bus_message **ret_reply) {
        _cleanup_(sd_event_unrefp) sd_event *event = NULL;
        _cleanup_(sd_event_source_unrefp) sd_event_source *timer = NULL;
        _cleanup_(sd_bus_slot_unrefp) sd_bus_slot *slot = NULL;
        struct progress p = { .what = what, .start_usec = now_usec(), .tty = isatty(STDERR_FILENO) };
        const sd_bus_error *e;
        int r;

        if (arg_no_progress)
                return sd_bus_call(bus, m, 0, error, ret_reply);

        r = sd_event_new(&event);
        if (r < 0)
                return r;
        r = sd_bus_attach_event(bus, event, 0);
        if (r < 0)
                return r;
        r = sd_bus_call_async(bus, &slot, m, on_reply, &p, 0);
        if (r < 0)
                goto finish;

        if (p.tty) {
                uint64_t t;
                r = sd_event_now(event, CLOCK_MONOTONIC, &t);
                if (r >= 0)
                        r = sd_event_add_time(event, &timer, CLOCK_MONOTONIC, t, 0, on_tick, &p);
                if (r < 0)
                        goto finish;
        } else
                fprintf(stderr, "forkctl: %s...\n", what);

        r = sd_event_loop(event);
        if (p.tty)
                fputs("\r\033[K", stderr);
        if (r < 0)
                goto finish;

        e = sd_bus_message_get_error(p.reply);
        if (e) {
                r = -sd_bus_message_get_errno(p.reply);
                sd_bus_error_copy(error, e);
                if (r >= 0)
                        r = -EIO;
                goto finish;
        }

        *ret_reply = TAKE_PTR(p.reply);
        r = 1;
finish:
        sd_bus_message_unref(p.reply);
        slot = sd_bus_slot_unref(slot);
        (void) sd_bus_detach_event(bus);
        return r;
}

/* ---- output ------------------------------------------------------------- */

static int print_json(struct json_object *j) {
        const char *s = json_object_to_json_string_ext(j, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
        if (!s)
                return -ENOMEM;
        puts(s);
        return 0;
}

static const char *jstr(struct json_object *o, const char *key) {
        struct json_object *v;

        if (!json_object_object_get_ex(o, key, &v) || !v)
                return NULL;
        if (json_object_is_type(v, json_type_string))
                return json_object_get_string(v);
        return json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
}

static bool juint(struct json_object *o, const char *key, uint64_t *ret) {
        struct json_object *v;

        if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_int))
                return false;
        *ret = json_object_get_uint64(v);
        return true;
}

static const char *jbytes(struct json_object *o, const char *key, char *buf, size_t size) {
        uint64_t v;
        return juint(o, key, &v) ? format_bytes(buf, size, v) : NULL;
}

static const char *jtime(struct json_object *o, const char *key, char *buf, size_t size) {
        uint64_t v;
        return juint(o, key, &v) ? format_unix_time(buf, size, v) : NULL;
}

/* owner_uid as a user name where it has one, else the number. */
static const char *jowner(struct json_object *o, char *buf, size_t size) {
        struct passwd *pw;
        uint64_t v;

        if (!juint(o, "owner_uid", &v) || v > UINT32_MAX)
                return NULL;
        pw = getpwuid((uid_t) v);
        if (pw && pw->pw_name)
                snprintf(buf, size, "%s", pw->pw_name);
        else
                snprintf(buf, size, "%llu", (unsigned long long) v);
        return buf;
}

static int print_snapshot_table(struct json_object *list) {
        static const char *const headers[] = { "TAG", "GUEST", "MEMORY", "DISK", "CREATED", "STATUS", "PARENT", "OWNER" };
        _cleanup_table_ struct table *t = table_new(ELEMENTSOF(headers), headers);
        size_t n = json_object_array_length(list);

        if (!t)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct json_object *s = json_object_array_get_idx(list, i);
                char mem[32], disk[32], created[64], owner[64];
                const char *cells[] = {
                        jstr(s, "tag"), jstr(s, "guest"),
                        jbytes(s, "mem_size", mem, sizeof mem), jbytes(s, "disk_size", disk, sizeof disk),
                        jtime(s, "created_at_unix", created, sizeof created), jstr(s, "status"),
                        jstr(s, "parent_tag"), jowner(s, owner, sizeof owner),
                };
                if (table_add_row(t, cells) < 0)
                        return -ENOMEM;
        }
        if (n == 0) {
                puts("No snapshots. Create one with 'forkctl snapshot create TAG --kernel K --rootfs R'.");
                return 0;
        }
        return table_print(t, stdout);
}

/* expires_at (RFC 3339, UTC) in local time as CREATED is shown, with the action:
 * "2026-05-20 10:08:46 (kill)"; "-" for none. */
static const char *jexpires(struct json_object *o, char *buf, size_t size) {
        const char *at = jstr(o, "expires_at"), *action = jstr(o, "on_timeout");
        char when[64];
        uint64_t t;

        if (!at || !*at)
                return NULL;
        if (parse_rfc3339_utc(at, &t) < 0)
                snprintf(when, sizeof when, "%s", at); /* shown as forkd wrote it */
        else
                format_unix_time(when, sizeof when, t);
        snprintf(buf, size, "%s (%s)", when, action && *action ? action : "kill");
        return buf;
}

static int print_sandbox_table(struct json_object *list, bool empty_hint) {
        static const char *const headers[] = { "ID", "SNAPSHOT", "STATE", "PID", "MEMLIMIT", "NETNS", "ADDRESS", "CREATED",
                                               "EXPIRES", "OWNER" };
        _cleanup_table_ struct table *t = table_new(ELEMENTSOF(headers), headers);
        size_t n = json_object_array_length(list);

        if (!t)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct json_object *s = json_object_array_get_idx(list, i);
                char created[64], limit[32] = "", owner[64], expires[96];
                uint64_t l, pid;

                if (juint(s, "memory_limit_mib", &l) && l > 0)
                        snprintf(limit, sizeof limit, "%lluM", (unsigned long long) l);
                const char *cells[] = {
                        jstr(s, "id"), jstr(s, "snapshot_tag"), jstr(s, "state"),
                        juint(s, "pid", &pid) && pid == 0 ? NULL : jstr(s, "pid"), /* a paused one has no VMM */
                        limit, jstr(s, "netns"), jstr(s, "guest_addr"),
                        jtime(s, "created_at_unix", created, sizeof created), jexpires(s, expires, sizeof expires),
                        jowner(s, owner, sizeof owner),
                };
                if (table_add_row(t, cells) < 0)
                        return -ENOMEM;
        }
        if (n == 0) {
                if (empty_hint)
                        puts("No sandboxes. Fork some with 'forkctl fork TAG -n N'.");
                return 0;
        }
        return table_print(t, stdout);
}

/* Vertical "Key: value" listing: the known keys first, in order, then any others. */
static int print_info(struct json_object *o, const char *const *keys) {
        size_t w = 0;

        {
                json_object_object_foreach(o, k, v) {
                        (void) v;
                        w = MAX(w, strlen(k));
                }
        }
        for (const char *const *k = keys; *k; k++) {
                struct json_object *v;
                char buf[64];
                const char *s;
                uint64_t u;

                if (!json_object_object_get_ex(o, *k, &v))
                        continue;
                if (json_object_is_type(v, json_type_array)) {
                        /* ancestors, dependents: names, as seed 003's snapshot-info lists them */
                        size_t n = json_object_array_length(v);

                        printf("%*s: ", (int) w, *k);
                        for (size_t i = 0; i < n; i++) {
                                const char *e = json_object_get_string(json_object_array_get_idx(v, i));
                                printf("%s%s", i ? ", " : "", e ?: "?");
                        }
                        if (n == 0)
                                fputs("-", stdout);
                        else if (strcmp(*k, "ancestors") == 0)
                                fputs(" (root first, the parent last)", stdout);
                        else if (strcmp(*k, "dependents") == 0)
                                fputs(" (snapshot rm refuses: --cascade deletes them too, --force orphans them)", stdout);
                        putchar('\n');
                        continue;
                }
                if (strstr(*k, "_unix") && juint(o, *k, &u))
                        s = format_unix_time(buf, sizeof buf, u);
                else if ((strstr(*k, "_size") || strstr(*k, "_bytes")) && juint(o, *k, &u)) {
                        char b[32];
                        snprintf(buf, sizeof buf, "%s (%llu bytes)", format_bytes(b, sizeof b, u),
                                 (unsigned long long) u);
                        s = buf;
                } else
                        s = jstr(o, *k);
                printf("%*s: %s\n", (int) w, *k, s && *s ? s : "-");
        }
        {
                json_object_object_foreach(o, key, val) {
                        bool known = false;
                        (void) val;
                        for (const char *const *kk = keys; *kk; kk++)
                                if (strcmp(*kk, key) == 0)
                                        known = true;
                        if (!known)
                                printf("%*s: %s\n", (int) w, key, jstr(o, key) ?: "-");
                }
        }
        return 0;
}

static const char *const snapshot_keys[] = {
        "tag", "status", "owner_uid", "guest", "network", "agent_tcp", "dir", "created_at_unix", "mem_size", "disk_size",
        "generation",
        "parent_tag", "branched_from", "pause_ms", "pause_us", "memory_logical_bytes", "memory_physical_bytes",
        "vmstate_bytes", "parent_content_hash", "chain_depth", "ancestors", "dependents", NULL,
};

/* ---- verbs -------------------------------------------------------------- */

static int open_boot_file(const char *what, const char *path, int *ret_fd) {
        int r = boot_file_open(path, ret_fd);

        if (r == -EISDIR || r == -EINVAL) {
                fprintf(stderr, "forkctl: snapshot create: the %s %s is not a regular file\n", what, path);
                return -1;
        }
        if (r < 0) {
                fprintf(stderr, "forkctl: snapshot create: cannot open the %s %s: %s\n", what, path, strerror(-r));
                return -1;
        }
        return 0;
}

static int verb_snapshot_create(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *info = NULL;
        struct error_context ctx = { .verb = "snapshot create", .tag = args[0] };
        _cleanup_free_ char *what = NULL;
        _cleanup_close_ int kernel_fd = -EBADF, rootfs_fd = -EBADF, initrd_fd = -EBADF;
        char initrd[PATH_MAX];
        int r;

        if (arg_network)
                return usage_error("snapshot create --network takes no value (the policy is fork's: fork --network %s)",
                                   arg_network);
        if (arg_agent_tcp && !(arg_given & OPT_NETWORK))
                return usage_error("--agent-tcp needs --network: the agent's TCP port is reached through the NIC");

        /* Opened here, with our own credentials: forkd reads only what we could. */
        r = open_boot_file("kernel", arg_kernel, &kernel_fd);
        if (r >= 0)
                r = open_boot_file("rootfs", arg_rootfs, &rootfs_fd);
        if (r >= 0 && boot_initrd_beside(arg_kernel, initrd, sizeof initrd) > 0)
                r = open_boot_file("initrd (found beside the kernel)", initrd, &initrd_fd);
        if (r < 0)
                return r;

        r = new_call(bus, "CreateSnapshotFromFds", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "shhuu", args[0], kernel_fd, rootfs_fd, arg_mem_mib, arg_boot_wait);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0 && initrd_fd >= 0)
                r = sd_bus_message_append(m, "{sv}", "initrd", "h", initrd_fd);
        if (r >= 0 && (arg_given & OPT_NETWORK))
                r = sd_bus_message_append(m, "{sv}", "network", "b", 1);
        if (r >= 0 && arg_agent_tcp)
                r = sd_bus_message_append(m, "{sv}", "agent_tcp", "b", 1);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return report_error(NULL, r, &ctx);

        if (asprintf(&what, "Creating snapshot '%s'", args[0]) < 0)
                return -1;
        r = call_with_progress(bus, m, what, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);

        r = bus_message_read_dict_json(reply, &info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (arg_json)
                return print_json(info);
        fprintf(stderr, "Created snapshot '%s'.\n", args[0]);
        return print_info(info, snapshot_keys);
}

static int verb_snapshot_ls(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *list = NULL, *doc = NULL;
        struct error_context ctx = { .verb = "snapshot ls" };
        int r;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "ListSnapshots", &error, &reply, "");
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!arg_json)
                return print_snapshot_table(list);
        doc = json_object_new_object();
        if (!doc || json_object_object_add(doc, "snapshots", TAKE_PTR(list)) < 0)
                return -1;
        return print_json(doc);
}

static int verb_snapshot_info(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *info = NULL;
        struct error_context ctx = { .verb = "snapshot info", .tag = args[0] };
        int r;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "GetSnapshotInfo", &error, &reply,
                               "s", args[0]);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_json(reply, &info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        return arg_json ? print_json(info) : print_info(info, snapshot_keys);
}

static int verb_snapshot_rm(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "snapshot rm", .tag = args[0] };
        int r;

        if (arg_cascade && arg_force)
                return usage_error("--cascade and --force exclude each other");

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "DeleteSnapshot", &error, NULL,
                               "sbb", args[0], (int) arg_cascade, (int) arg_force);
        if (r < 0)
                return report_error(&error, r, &ctx);
        if (arg_json) {
                _cleanup_json_ struct json_object *doc = json_object_new_object();
                if (!doc || json_object_object_add(doc, "deleted", json_object_new_string(args[0])) < 0)
                        return -1;
                return print_json(doc);
        }
        fprintf(stderr, "Deleted snapshot '%s'.\n", args[0]);
        return 0;
}

static int verb_snapshot_compact(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *info = NULL;
        struct error_context ctx = { .verb = "snapshot compact", .tag = arg_to };
        _cleanup_free_ char *what = NULL;
        int r;

        r = new_call(bus, "CompactSnapshot", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "ss", args[0], arg_to);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (asprintf(&what, "Compacting snapshot '%s' into '%s'", args[0], arg_to) < 0)
                return -1;
        r = call_with_progress(bus, m, what, &error, &reply);
        if (r < 0) {
                /* NoSuchSnapshot names the source, everything else the target */
                if (sd_bus_error_has_name(&error, FORKD_ERROR_NO_SUCH_SNAPSHOT))
                        ctx.tag = args[0];
                return report_error(&error, r, &ctx);
        }
        r = bus_message_read_dict_json(reply, &info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (arg_json)
                return print_json(info);
        fprintf(stderr, "Compacted '%s' into the flat snapshot '%s'.\n", args[0], arg_to);
        return print_info(info, snapshot_keys);
}

/* seed 003's snapshot-diff, from the existing calls: Fork, Exec, BranchSandbox (diff),
 * TerminateSandbox; the sandbox goes whatever happens. */
static int snapshot_diff_in(sd_bus *bus, const char *id, struct json_object **ret_info) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *res = NULL;
        struct error_context ctx = { .verb = "snapshot diff", .id = id, .tag = arg_tag };
        const char *argv[] = { "sh", "-c", arg_exec, NULL }, *text;
        struct json_object *code, *err;
        _cleanup_free_ char *what = NULL;
        int r;

        r = new_call(bus, "Exec", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "s", id);
        if (r >= 0)
                r = sd_bus_message_append_strv(m, (char **) argv);
        if (r >= 0)
                r = sd_bus_message_append(m, "u", arg_exec_timeout);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!arg_json && !arg_no_progress)
                fprintf(stderr, "forkctl: running '%s' in sandbox '%s'...\n", arg_exec, id);
        r = sd_bus_call(bus, m, ((uint64_t) arg_exec_timeout + 60) * USEC_PER_SEC, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = sd_bus_message_read(reply, "s", &text);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        res = json_tokener_parse(text);
        if (!res || !json_object_object_get_ex(res, "exit_code", &code) || !json_object_is_type(code, json_type_int)) {
                fprintf(stderr, "forkctl: snapshot diff: the sandbox's answer to exec has no exit_code: %.200s\n",
                        text);
                return -1;
        }
        if (json_object_get_int64(code) != 0) {
                fprintf(stderr, "forkctl: snapshot diff: '%s' exited with status %" PRId64 "; no snapshot '%s' was "
                        "made. Its stderr:\n%s\n", arg_exec, json_object_get_int64(code), arg_tag,
                        json_object_object_get_ex(res, "stderr", &err) && json_object_is_type(err, json_type_string) ?
                                json_object_get_string(err) : "(none)");
                return -1;
        }

        sd_bus_message_unref(TAKE_PTR(m));
        sd_bus_message_unref(TAKE_PTR(reply));
        r = new_call(bus, "BranchSandbox", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "sssb", id, arg_tag, "diff", 1);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (asprintf(&what, "Taking the diff snapshot '%s'", arg_tag) < 0)
                return -1;
        r = call_with_progress(bus, m, what, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_json(reply, ret_info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        return 0;
}

static int verb_snapshot_diff(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *list = NULL, *info = NULL;
        struct error_context ctx = { .verb = "snapshot diff", .tag = arg_from };
        _cleanup_free_ char *id = NULL;
        struct json_object *v;
        int r, k;

        r = new_call(bus, "Fork", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "sua{sv}", arg_from, (uint32_t) 1, 0);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        r = call_with_progress(bus, m, "Forking a sandbox for the diff", &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0 || json_object_array_length(list) != 1 ||
            !json_object_object_get_ex(json_object_array_get_idx(list, 0), "id", &v))
                return report_error(NULL, r < 0 ? r : -EBADMSG, &ctx);
        id = strdup(json_object_get_string(v));
        if (!id)
                return -1;

        r = snapshot_diff_in(bus, id, &info);

        sd_bus_error_free(&error);
        k = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "TerminateSandbox", &error, NULL, "s", id);
        if (k < 0 && !sd_bus_error_has_name(&error, FORKD_ERROR_NO_SUCH_SANDBOX))
                fprintf(stderr, "forkctl: snapshot diff: failed to remove sandbox '%s': %s\n", id,
                        error.message ?: strerror(-k));
        if (r < 0)
                return r;
        if (arg_json)
                return print_json(info);
        fprintf(stderr, "Made the diff snapshot '%s' of '%s'.\n", arg_tag, arg_from);
        return print_info(info, snapshot_keys);
}

/* fork and fork-sandbox --timeout S [--on-timeout A]: the options timeout_secs and on_timeout. */
static int append_deadline_options(sd_bus_message *m) {
        int r = 0;

        if (arg_given & OPT_TIMEOUT)
                r = sd_bus_message_append(m, "{sv}", "timeout_secs", "u", arg_timeout);
        if (r >= 0 && arg_on_timeout)
                r = sd_bus_message_append(m, "{sv}", "on_timeout", "s", arg_on_timeout);
        return r;
}

static int verb_fork(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *list = NULL, *doc = NULL;
        struct error_context ctx = { .verb = "fork", .tag = args[0] };
        _cleanup_free_ char *what = NULL;
        uint64_t start = now_usec();
        int r;

        if ((arg_given & OPT_NETWORK) && !arg_network)
                return usage_error("fork --network wants none or egress");
        r = new_call(bus, "Fork", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "su", args[0], arg_n);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0 && (arg_given & OPT_PER_CHILD_NETNS))
                r = sd_bus_message_append(m, "{sv}", "per_child_netns", "b", (int) arg_per_child_netns);
        if (r >= 0 && arg_memory_limit_set)
                r = sd_bus_message_append(m, "{sv}", "memory_limit_mib", "u", arg_memory_limit_mib);
        if (r >= 0 && (arg_given & OPT_LIVE_FORK))
                r = sd_bus_message_append(m, "{sv}", "live_fork", "b", (int) arg_live_fork);
        if (r >= 0 && arg_network)
                r = sd_bus_message_append(m, "{sv}", "network", "s", arg_network);
        if (r >= 0)
                r = append_deadline_options(m);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return report_error(NULL, r, &ctx);

        if (asprintf(&what, "Forking %u sandbox%s of '%s'", arg_n, arg_n == 1 ? "" : "es", args[0]) < 0)
                return -1;
        r = call_with_progress(bus, m, what, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);

        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!arg_json) {
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

static int verb_ls(sd_bus *bus, char **args, size_t n_args) {
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
        if (!arg_json)
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

static int verb_kill(sd_bus *bus, char **args, size_t n_args) {
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

                        if (ret == 0 || k == -5)
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
                        if (k == -5) /* forkd is gone: the others failed the same way */
                                break;
                        continue;
                }
                json_object_array_add(done, json_object_new_string(args[i]));
        }
        for (size_t i = 0; i < sent; i++) {
                slots[i] = sd_bus_slot_unref(slots[i]);
                sd_bus_error_free(&calls[i].error);
        }

        if (arg_json) {
                _cleanup_json_ struct json_object *doc = json_object_new_object();
                if (!doc)
                        return -1;
                json_object_object_add(doc, "terminated", TAKE_PTR(done));
                json_object_object_add(doc, "failed", TAKE_PTR(failed));
                (void) print_json(doc);
        }
        return ret;
}

/* Ping, Exec, Eval, RunCode all answer the guest agent's JSON, passed through. */
static int agent_result(sd_bus_message *reply, const struct error_context *ctx, bool exec) {
        _cleanup_json_ struct json_object *j = NULL;
        const char *s;
        int r;

        r = sd_bus_message_read(reply, "s", &s);
        if (r < 0)
                return report_error(NULL, r, ctx);

        j = json_tokener_parse(s);
        if (arg_json) {
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

static int verb_ports(sd_bus *bus, char **args, size_t n_args) {
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
        if (arg_json) {
                _cleanup_json_ struct json_object *doc = json_object_new_object();

                if (!doc || json_object_object_add(doc, "host_addr", json_object_new_string(addr)) < 0)
                        return -1;
                return print_json(doc);
        }
        printf("%s\n", addr);
        return 0;
}

static int verb_ping(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "ping", .id = args[0] };
        int r;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "Ping", &error, &reply, "s", args[0]);
        if (r < 0)
                return report_error(&error, r, &ctx);
        return agent_result(reply, &ctx, false);
}

static int verb_exec(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "exec", .id = args[0] };
        uint64_t timeout;
        int r;

        r = new_call(bus, "Exec", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "s", args[0]);
        if (r >= 0)
                r = sd_bus_message_append_strv(m, args + 1);
        if (r >= 0)
                r = sd_bus_message_append(m, "u", arg_timeout);
        if (r < 0)
                return report_error(NULL, r, &ctx);

        /* Leave forkd time to report the guest's timeout itself. */
        timeout = MAX(CALL_TIMEOUT_USEC, ((uint64_t) (arg_timeout ?: 30) + 60) * USEC_PER_SEC);
        r = sd_bus_call(bus, m, timeout, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        return agent_result(reply, &ctx, true);
}

static int verb_eval(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "eval", .id = args[0] };
        int r;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "Eval", &error, &reply, "ss", args[0],
                               args[1]);
        if (r < 0)
                return report_error(&error, r, &ctx);
        return agent_result(reply, &ctx, false);
}

static int verb_run(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "run", .id = args[0] };
        int r;

        r = new_call(bus, "RunCode", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "ssu", args[0], args[1], arg_timeout);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        r = sd_bus_call(bus, m, MAX(CALL_TIMEOUT_USEC, ((uint64_t) (arg_timeout ?: 30) + 60) * USEC_PER_SEC), &error,
                        &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        return agent_result(reply, &ctx, false);
}

static int verb_merge(sd_bus *bus, char **args, size_t n_args) {
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
        if (arg_json)
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

static int verb_diff(sd_bus *bus, char **args, size_t n_args) {
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
        if (arg_json)
                return print_json(doc);
        /* One line a file: + added, - removed, ~ modified, as seen from ID towards OTHER. */
        for (unsigned k = 0; k < 3; k++) {
                struct json_object *l = json_object_object_get(doc, keys[k]);

                for (size_t i = 0; i < json_object_array_length(l); i++)
                        printf("%c %s\n", marks[k], json_object_get_string(json_object_array_get_idx(l, i)));
        }
        return 0;
}

static int verb_branch(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *info = NULL;
        struct error_context ctx = { .verb = "branch", .id = args[0], .tag = arg_tag[0] ? arg_tag : NULL };
        _cleanup_free_ char *what = NULL;
        struct json_object *v;
        int r;

        if (arg_no_wait && strcmp(arg_mode, "live") != 0)
                return usage_error("--no-wait needs --mode live");
        r = new_call(bus, "BranchSandbox", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "sssb", args[0], arg_tag, arg_mode, (int) !arg_no_wait);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (asprintf(&what, "Branching sandbox '%s'", args[0]) < 0)
                return -1;
        r = call_with_progress(bus, m, what, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_json(reply, &info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (arg_json)
                return print_json(info);
        fprintf(stderr, "Branched '%s' into snapshot '%s' (paused %s us, %s).\n", args[0],
                json_object_object_get_ex(info, "tag", &v) ? json_object_get_string(v) : "?",
                json_object_object_get_ex(info, "pause_us", &v) ? json_object_get_string(v) : "?",
                json_object_object_get_ex(info, "status", &v) ? json_object_get_string(v) : "?");
        return print_info(info, snapshot_keys);
}

static int verb_fork_sandbox(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *list = NULL, *doc = NULL;
        struct error_context ctx = { .verb = "fork-sandbox", .id = args[0] };
        _cleanup_free_ char *what = NULL;
        uint64_t start = now_usec(), pause_us = 0;
        bool deadline = arg_given & OPT_TIMEOUT;
        int r;

        if (arg_n > 32)
                return usage_error("fork-sandbox takes -n 1..32");
        /* ForkSandboxEx only with a deadline: ForkSandbox serves a forkd without it. */
        r = new_call(bus, deadline ? "ForkSandboxEx" : "ForkSandbox", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "su", args[0], arg_n);
        if (r >= 0 && deadline) {
                r = sd_bus_message_open_container(m, 'a', "{sv}");
                if (r >= 0)
                        r = append_deadline_options(m);
                if (r >= 0)
                        r = sd_bus_message_close_container(m);
        }
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (asprintf(&what, "Forking the sandbox '%s' into %u", args[0], arg_n) < 0)
                return -1;
        r = call_with_progress(bus, m, what, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_array_json(reply, &list);
        if (r >= 0)
                r = sd_bus_message_read(reply, "t", &pause_us);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!arg_json) {
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

/* A SandboxInfo as the one row of the sandbox table, or with --json as it is. */
static int print_one_sandbox(struct json_object **info) {
        _cleanup_json_ struct json_object *list = NULL;

        if (arg_json)
                return print_json(*info);
        list = json_object_new_array();
        if (!list || json_object_array_add(list, TAKE_PTR(*info)) < 0)
                return -1;
        return print_sandbox_table(list, false);
}

/* PauseSandbox and ResumeSandbox: id in, SandboxInfo out; each waits for a VM to go or to answer. */
static int pause_or_resume(sd_bus *bus, const char *id, bool pause) {
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
        r = call_with_progress(bus, m, what, &error, &reply);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_json(reply, &info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!arg_json) {
                if (pause)
                        fprintf(stderr, "Paused sandbox '%s'; resume it with 'forkctl resume %s'.\n", id, id);
                else
                        fprintf(stderr, "Resumed sandbox '%s'.\n", id);
        }
        return print_one_sandbox(&info);
}

static int verb_pause(sd_bus *bus, char **args, size_t n_args) {
        return pause_or_resume(bus, args[0], true);
}

static int verb_resume(sd_bus *bus, char **args, size_t n_args) {
        return pause_or_resume(bus, args[0], false);
}

static int verb_timeout(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *info = NULL;
        struct error_context ctx = { .verb = "timeout", .id = args[0] };
        char expires[96];
        int r;

        /* "" keeps the sandbox's action */
        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "SetSandboxTimeout", &error, &reply, "sus",
                               args[0], arg_deadline_secs, arg_on_timeout ?: "");
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_json(reply, &info);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!arg_json)
                fprintf(stderr, "Sandbox '%s' expires at %s.\n", args[0],
                        jexpires(info, expires, sizeof expires) ?: "?");
        return print_one_sandbox(&info);
}

static int verb_pack(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *doc = NULL, *tags = NULL;
        struct error_context ctx = { .verb = "pack", .tag = arg_tag };
        _cleanup_free_ char *what = NULL;
        _cleanup_close_ int fd = -EBADF;
        uint64_t bytes = 0;
        bool regular = false;
        struct stat st;
        size_t n = 0;
        int r;

        if (!arg_tag[0] || !arg_out || !arg_out[0])
                return usage_error("pack needs --tag and --out; usage: forkctl pack --tag T --out F");
        fd = open(arg_out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0644);
        if (fd < 0) {
                fprintf(stderr, "forkctl: cannot create %s: %s\n", arg_out, strerror(errno));
                return -1;
        }
        /* A half-written file is removed on failure; a pipe or device (--out /dev/stdout) is not. */
        regular = fstat(fd, &st) >= 0 && S_ISREG(st.st_mode);
        r = new_call(bus, "PackSnapshot", &m);
        if (r < 0)
                goto fail;
        r = sd_bus_message_append(m, "sh", arg_tag, fd);
        if (r < 0) {
                report_error(NULL, r, &ctx);
                goto fail;
        }
        fd = safe_close(fd); /* forkd has its own copy; ours would keep nothing open */
        if (asprintf(&what, "Packing snapshot '%s'", arg_tag) < 0)
                goto fail;
        r = call_with_progress(bus, m, what, &error, &reply);
        if (r < 0) {
                int k = report_error(&error, r, &ctx);
                if (regular)
                        (void) unlink(arg_out); /* not a bundle */
                return k;
        }
        tags = json_object_new_array();
        if (!tags)
                goto fail;
        r = sd_bus_message_enter_container(reply, 'a', "s");
        while (r >= 0) {
                const char *t;
                r = sd_bus_message_read(reply, "s", &t);
                if (r <= 0)
                        break;
                json_object_array_add(tags, json_object_new_string(t));
                n++;
        }
        if (r >= 0)
                r = sd_bus_message_exit_container(reply);
        if (r >= 0)
                r = sd_bus_message_read(reply, "t", &bytes);
        if (r < 0) {
                report_error(NULL, r, &ctx);
                goto fail;
        }
        if (!arg_json) {
                char b[32];
                fprintf(stderr, "Wrote %s (%s) with %zu chain link%s:", arg_out, format_bytes(b, sizeof b, bytes), n,
                        n == 1 ? "" : "s");
                for (size_t i = 0; i < n; i++)
                        fprintf(stderr, " %s", json_object_get_string(json_object_array_get_idx(tags, i)));
                fputc('\n', stderr);
                return 0;
        }
        doc = json_object_new_object();
        if (!doc || json_object_object_add(doc, "out", json_object_new_string(arg_out)) < 0 ||
            json_object_object_add(doc, "bytes", json_object_new_uint64(bytes)) < 0 ||
            json_object_object_add(doc, "chain", TAKE_PTR(tags)) < 0)
                return -1;
        return print_json(doc);
fail:
        if (regular)
                (void) unlink(arg_out); /* not a bundle */
        return -1;
}

static int verb_unpack(sd_bus *bus, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *list = NULL, *doc = NULL;
        struct error_context ctx = { .verb = "unpack", .tag = arg_tag[0] ? arg_tag : NULL };
        _cleanup_free_ char *what = NULL;
        _cleanup_close_ int fd = -EBADF;
        int r;

        fd = open(args[0], O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0) {
                fprintf(stderr, "forkctl: cannot open %s: %s\n", args[0], strerror(errno));
                return -1;
        }
        r = new_call(bus, "UnpackSnapshot", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "hs", fd, arg_tag);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (asprintf(&what, "Unpacking %s", args[0]) < 0)
                return -1;
        r = call_with_progress(bus, m, what, &error, &reply);
        if (r < 0 && sd_bus_error_is_set(&error)) {
                /* forkd's message names the tag or the member at fault. */
                fprintf(stderr, "forkctl: unpack: %s\n", error.message ?: error.name);
                return -forkctl_error_exit_code(&error);
        }
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (!arg_json) {
                size_t n = json_object_array_length(list);
                for (size_t i = 0; i < n; i++) {
                        struct json_object *o = json_object_array_get_idx(list, i);
                        const char *parent = jstr(o, "parent_tag");
                        fprintf(stderr, "Link '%s' at %s%s%s%s\n", jstr(o, "tag") ?: "?", jstr(o, "dir") ?: "?",
                                parent ? " (chain parent: " : "", parent ?: "", parent ? ")" : "");
                }
                fprintf(stderr, "Unpacked %zu chain link%s, head '%s'.\n", n, n == 1 ? "" : "s",
                        n ? jstr(json_object_array_get_idx(list, n - 1), "tag") ?: "?" : "?");
                return print_snapshot_table(list);
        }
        doc = json_object_new_object();
        if (!doc || json_object_object_add(doc, "snapshots", TAKE_PTR(list)) < 0)
                return -1;
        return print_json(doc);
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

static int verb_mcp(sd_bus *bus, char **args, size_t n_args) {
        struct mcp_server s = { .bus_address = bus_address() };
        int r;

        log_prefix = "forkctl mcp";
        if (getenv("FORKCTL_MCP_DEBUG"))
                log_max_level = LOG_LVL_DEBUG;
        r = mcp_serve(&s, STDIN_FILENO, STDOUT_FILENO);
        mcp_server_done(&s);
        return r < 0 ? -1 : 0;
}

static int verb_doctor(sd_bus *bus, char **args, size_t n_args) {
        DoctorOptions o = {
                .state_dir = arg_state_dir ?: DOCTOR_STATE_DIR_DEFAULT,
                .prefix = arg_prefix,
                .token_file = arg_token_file,
                .bus_address = arg_bus_address,
                .json = arg_json,
        };
        int r;

        r = doctor_run(&o, stdout);
        if (r < 0)
                return log_error_errno(r, "Cannot write the report: %m");
        return r > 0 ? -EXIT_FAILURE : 0; /* exit status 1: a check failed */
}

struct verb {
        const char *group; /* "snapshot" or NULL */
        const char *name;
        size_t min_args, max_args; /* positional arguments after the verb */
        unsigned options;          /* OPT_* allowed */
        const char *synopsis;
        int (*run)(sd_bus *bus, char **args, size_t n_args);
};

static int verb_write_file(sd_bus *bus, char **args, size_t n_args) {
        return forkctl_write_file(bus, args[0], args[1], n_args > 2 ? args[2] : NULL, arg_file_mode, arg_json);
}

static int verb_read_file(sd_bus *bus, char **args, size_t n_args) {
        return forkctl_read_file(bus, args[0], args[1], arg_json);
}

static const struct verb verbs[] = {
        { "snapshot", "create", 1, 1, OPT_KERNEL | OPT_ROOTFS | OPT_MEM_MIB | OPT_BOOT_WAIT | OPT_NETWORK | OPT_AGENT_TCP,
          "snapshot create TAG --kernel K --rootfs R [--mem-mib M] [--boot-wait S]", verb_snapshot_create },
        { "snapshot", "ls", 0, 0, 0, "snapshot ls", verb_snapshot_ls },
        { "snapshot", "list", 0, 0, 0, "snapshot ls", verb_snapshot_ls },
        { "snapshot", "info", 1, 1, 0, "snapshot info TAG", verb_snapshot_info },
        { "snapshot", "rm", 1, 1, OPT_CASCADE | OPT_FORCE, "snapshot rm TAG [--cascade|--force]", verb_snapshot_rm },
        { "snapshot", "compact", 1, 1, OPT_TO, "snapshot compact TAG --to T", verb_snapshot_compact },
        { "snapshot", "diff", 0, 0, OPT_FROM | OPT_TAG | OPT_EXEC | OPT_EXEC_TIMEOUT,
          "snapshot diff --from BASE --tag T --exec CMD [--exec-timeout-secs N]", verb_snapshot_diff },
        { NULL, "fork", 1, 1,
          OPT_COUNT | OPT_MEMORY_LIMIT | OPT_PER_CHILD_NETNS | OPT_LIVE_FORK | OPT_NETWORK | OPT_TIMEOUT | OPT_ON_TIMEOUT,
          "fork TAG [-n N] [--memory-limit-mib M] [--per-child-netns] [--live-fork] [--network none|egress] "
          "[--timeout S [--on-timeout kill|pause]]",
          verb_fork },
        { NULL, "ls", 0, 0, 0, "ls", verb_ls },
        { NULL, "list", 0, 0, 0, "ls", verb_ls },
        { NULL, "kill", 1, SIZE_MAX, 0, "kill ID...", verb_kill },
        { NULL, "ping", 1, 1, 0, "ping ID", verb_ping },
        { NULL, "exec", 2, SIZE_MAX, OPT_TIMEOUT, "exec ID [--timeout S] -- ARGV...", verb_exec },
        { NULL, "eval", 2, 2, 0, "eval ID CODE", verb_eval },
        { NULL, "run", 2, 2, OPT_TIMEOUT, "run ID [--timeout S] CODE", verb_run },
        { NULL, "merge", 2, 2, 0, "merge ID WINNER", verb_merge },
        { NULL, "diff", 2, 2 + 64, 0, "diff ID OTHER [PATH...]", verb_diff },
        { NULL, "fork-sandbox", 1, 1, OPT_COUNT | OPT_TIMEOUT | OPT_ON_TIMEOUT,
          "fork-sandbox ID [-n N] [--timeout S [--on-timeout kill|pause]]", verb_fork_sandbox },
        { NULL, "pause", 1, 1, 0, "pause ID", verb_pause },
        { NULL, "resume", 1, 1, 0, "resume ID", verb_resume },
        { NULL, "timeout", 2, 2, OPT_ON_TIMEOUT, "timeout ID S [--on-timeout kill|pause]", verb_timeout },
        { NULL, "write-file", 2, 3, OPT_FILE_MODE, "write-file ID PATH [LOCAL|-] [--file-mode M]", verb_write_file },
        { NULL, "read-file", 2, 2, 0, "read-file ID PATH", verb_read_file },
        { NULL, "ports", 2, 2, 0, "ports ID PORT", verb_ports },
        { NULL, "branch", 1, 1, OPT_TAG | OPT_MODE | OPT_NO_WAIT, "branch ID [--tag T] [--mode M] [--no-wait]",
          verb_branch },
        { NULL, "pack", 0, 0, OPT_TAG | OPT_OUT, "pack --tag T --out F", verb_pack },
        { NULL, "unpack", 1, 1, OPT_TAG, "unpack F [--tag NEW]", verb_unpack },
        { NULL, "mcp", 0, 0, 0, "mcp", verb_mcp },
        { NULL, "doctor", 0, 0, OPT_STATE_DIR | OPT_PREFIX | OPT_TOKEN_FILE,
          "doctor [--json] [--state-dir DIR] [--prefix DIR] [--token-file FILE]", verb_doctor },
};

static const char *option_name(unsigned bit) {
        switch (bit) {
        case OPT_KERNEL: return "--kernel";
        case OPT_ROOTFS: return "--rootfs";
        case OPT_MEM_MIB: return "--mem-mib";
        case OPT_BOOT_WAIT: return "--boot-wait";
        case OPT_CASCADE: return "--cascade";
        case OPT_FORCE: return "--force";
        case OPT_COUNT: return "-n";
        case OPT_MEMORY_LIMIT: return "--memory-limit-mib";
        case OPT_PER_CHILD_NETNS: return "--per-child-netns";
        case OPT_LIVE_FORK: return "--live-fork";
        case OPT_TIMEOUT: return "--timeout";
        case OPT_TAG: return "--tag";
        case OPT_MODE: return "--mode";
        case OPT_NO_WAIT: return "--no-wait";
        case OPT_TO: return "--to";
        case OPT_FROM: return "--from";
        case OPT_EXEC: return "--exec";
        case OPT_EXEC_TIMEOUT: return "--exec-timeout-secs";
        case OPT_OUT: return "--out";
        case OPT_FILE_MODE: return "--file-mode";
        case OPT_STATE_DIR: return "--state-dir";
        case OPT_PREFIX: return "--prefix";
        case OPT_TOKEN_FILE: return "--token-file";
        case OPT_NETWORK: return "--network";
        case OPT_AGENT_TCP: return "--agent-tcp";
        case OPT_ON_TIMEOUT: return "--on-timeout";
        default: return "?";
        }
}

static int parse_number(const char *opt, const char *value, uint32_t min, uint32_t max, uint32_t *ret) {
        int r = parse_u32(value, min, max, ret);
        if (r < 0)
                return usage_error("%s wants a whole number in %u..%u, not '%s'", opt, min, max, value);
        return 0;
}

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
};

static int parse_argv(int argc, char *argv[]) {
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, ARG_VERSION },
                { "json", no_argument, NULL, 'j' },
                { "no-progress", no_argument, NULL, ARG_NO_PROGRESS },
                { "bus-address", required_argument, NULL, ARG_BUS_ADDRESS },
                { "kernel", required_argument, NULL, ARG_KERNEL },
                { "rootfs", required_argument, NULL, ARG_ROOTFS },
                { "mem-mib", required_argument, NULL, ARG_MEM_MIB },
                { "boot-wait", required_argument, NULL, ARG_BOOT_WAIT },
                { "cascade", no_argument, NULL, ARG_CASCADE },
                { "force", no_argument, NULL, ARG_FORCE },
                { "count", required_argument, NULL, 'n' },
                { "memory-limit-mib", required_argument, NULL, ARG_MEMORY_LIMIT },
                { "per-child-netns", no_argument, NULL, ARG_PER_CHILD_NETNS },
                { "live-fork", no_argument, NULL, ARG_LIVE_FORK },
                { "timeout", required_argument, NULL, ARG_TIMEOUT },
                { "tag", required_argument, NULL, ARG_TAG },
                { "mode", required_argument, NULL, ARG_MODE },
                { "no-wait", no_argument, NULL, ARG_NO_WAIT },
                { "to", required_argument, NULL, ARG_TO },
                { "from", required_argument, NULL, ARG_FROM },
                { "exec", required_argument, NULL, ARG_EXEC },
                { "exec-timeout-secs", required_argument, NULL, ARG_EXEC_TIMEOUT },
                { "out", required_argument, NULL, ARG_OUT },
                { "file-mode", required_argument, NULL, ARG_FILE_MODE },
                { "state-dir", required_argument, NULL, ARG_STATE_DIR },
                { "prefix", required_argument, NULL, ARG_PREFIX },
                { "token-file", required_argument, NULL, ARG_TOKEN_FILE },
                /* optional: "snapshot create --network" has none, "fork --network P" one */
                { "network", optional_argument, NULL, ARG_NETWORK },
                { "agent-tcp", no_argument, NULL, ARG_AGENT_TCP },
                { "on-timeout", required_argument, NULL, ARG_ON_TIMEOUT },
                {}
        };
        int c, r;

        opterr = 0;
        while ((c = getopt_long(argc, argv, "hjn:", options, NULL)) >= 0) {
                switch (c) {
                case 'h':
                        arg_help = true;
                        break;
                case ARG_VERSION:
                        printf("forkctl %s\n", FORKD_VERSION);
                        return 0;
                case 'j':
                        arg_json = true;
                        break;
                case ARG_NO_PROGRESS:
                        arg_no_progress = true;
                        break;
                case ARG_BUS_ADDRESS:
                        if (!*optarg)
                                return usage_error("--bus-address wants a D-Bus address");
                        arg_bus_address = optarg;
                        break;
                case ARG_KERNEL:
                        arg_kernel = optarg;
                        arg_given |= OPT_KERNEL;
                        break;
                case ARG_ROOTFS:
                        arg_rootfs = optarg;
                        arg_given |= OPT_ROOTFS;
                        break;
                case ARG_MEM_MIB:
                        r = parse_number("--mem-mib", optarg, 0, UINT32_MAX, &arg_mem_mib);
                        if (r < 0)
                                return r;
                        arg_given |= OPT_MEM_MIB;
                        break;
                case ARG_BOOT_WAIT:
                        r = parse_number("--boot-wait", optarg, 1, 600, &arg_boot_wait);
                        if (r < 0)
                                return r;
                        arg_given |= OPT_BOOT_WAIT;
                        break;
                case ARG_CASCADE:
                        arg_cascade = true;
                        arg_given |= OPT_CASCADE;
                        break;
                case ARG_FORCE:
                        arg_force = true;
                        arg_given |= OPT_FORCE;
                        break;
                case 'n':
                        r = parse_number("-n", optarg, 1, 1000, &arg_n);
                        if (r < 0)
                                return r;
                        arg_given |= OPT_COUNT;
                        break;
                case ARG_MEMORY_LIMIT:
                        r = parse_number("--memory-limit-mib", optarg, 1, UINT32_MAX, &arg_memory_limit_mib);
                        if (r < 0)
                                return r;
                        arg_memory_limit_set = true;
                        arg_given |= OPT_MEMORY_LIMIT;
                        break;
                case ARG_PER_CHILD_NETNS:
                        arg_per_child_netns = true;
                        arg_given |= OPT_PER_CHILD_NETNS;
                        break;
                case ARG_LIVE_FORK:
                        arg_live_fork = true;
                        arg_given |= OPT_LIVE_FORK;
                        break;
                case ARG_TAG:
                        arg_tag = optarg;
                        arg_given |= OPT_TAG;
                        break;
                case ARG_MODE:
                        if (strcmp(optarg, "full") != 0 && strcmp(optarg, "diff") != 0 && strcmp(optarg, "live") != 0)
                                return usage_error("--mode wants full, diff or live, not '%s'", optarg);
                        arg_mode = optarg;
                        arg_given |= OPT_MODE;
                        break;
                case ARG_FILE_MODE:
                        if (parse_file_mode(optarg, &arg_file_mode) < 0)
                                return usage_error("--file-mode wants an octal mode 0..7777, not '%s'", optarg);
                        arg_given |= OPT_FILE_MODE;
                        break;
                case ARG_STATE_DIR:
                case ARG_PREFIX:
                        if (optarg[0] != '/' || strlen(optarg) > 1024)
                                return usage_error("%s wants an absolute path of at most 1024 bytes",
                                                   c == ARG_STATE_DIR ? "--state-dir" : "--prefix");
                        if (c == ARG_STATE_DIR)
                                arg_state_dir = optarg;
                        else
                                arg_prefix = optarg;
                        arg_given |= c == ARG_STATE_DIR ? OPT_STATE_DIR : OPT_PREFIX;
                        break;
                case ARG_TOKEN_FILE:
                        if (!*optarg)
                                return usage_error("--token-file wants a path");
                        arg_token_file = optarg;
                        arg_given |= OPT_TOKEN_FILE;
                        break;
                case ARG_NETWORK:
                        if (!optarg && optind < argc && (strcmp(argv[optind], "none") == 0 ||
                                                         strcmp(argv[optind], "egress") == 0))
                                optarg = argv[optind++];
                        if (optarg && strcmp(optarg, "none") != 0 && strcmp(optarg, "egress") != 0)
                                return usage_error("--network wants none or egress, not '%s'", optarg);
                        arg_network = optarg;
                        arg_given |= OPT_NETWORK;
                        break;
                case ARG_AGENT_TCP:
                        arg_agent_tcp = true;
                        arg_given |= OPT_AGENT_TCP;
                        break;
                case ARG_NO_WAIT:
                        arg_no_wait = true;
                        arg_given |= OPT_NO_WAIT;
                        break;
                case ARG_TO:
                        arg_to = optarg;
                        arg_given |= OPT_TO;
                        break;
                case ARG_FROM:
                        arg_from = optarg;
                        arg_given |= OPT_FROM;
                        break;
                case ARG_EXEC:
                        if (!*optarg || strlen(optarg) > EXEC_COMMAND_MAX)
                                return usage_error("--exec wants a command line of 1 to %u bytes", EXEC_COMMAND_MAX);
                        arg_exec = optarg;
                        arg_given |= OPT_EXEC;
                        break;
                case ARG_EXEC_TIMEOUT:
                        r = parse_number("--exec-timeout-secs", optarg, 1, 3600, &arg_exec_timeout);
                        if (r < 0)
                                return r;
                        arg_given |= OPT_EXEC_TIMEOUT;
                        break;
                case ARG_OUT:
                        arg_out = optarg;
                        arg_given |= OPT_OUT;
                        break;
                case ARG_TIMEOUT:
                        /* parsed once the verb is known: exec and run take 0..3600, a fork's deadline 1..86400 */
                        arg_timeout_str = optarg;
                        arg_given |= OPT_TIMEOUT;
                        break;
                case ARG_ON_TIMEOUT:
                        if (strcmp(optarg, "kill") != 0 && strcmp(optarg, "pause") != 0)
                                return usage_error("--on-timeout wants kill or pause, not '%s'", optarg);
                        arg_on_timeout = optarg;
                        arg_given |= OPT_ON_TIMEOUT;
                        break;
                case '?':
                        if (optopt)
                                return usage_error("unknown option '-%c'", optopt);
                        return usage_error("unknown option '%s'", argv[optind - 1]);
                case ':':
                        return usage_error("option '%s' wants a value", argv[optind - 1]);
                default:
                        return usage_error("cannot parse the options");
                }
        }
        if (arg_help) {
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

static int run(int argc, char *argv[]) {
        _cleanup_(sd_bus_flush_close_unrefp) sd_bus *bus = NULL;
        const struct verb *verb = NULL;
        char **pos;
        size_t n_pos, skip;
        int r;

        r = parse_argv(argc, argv);
        if (r <= 0)
                return r;

        pos = argv + optind;
        n_pos = (size_t) (argc - optind);
        if (n_pos == 0)
                return usage_error("no command given");

        for (size_t i = 0; i < ELEMENTSOF(verbs); i++) {
                const struct verb *v = verbs + i;
                if (v->group) {
                        if (strcmp(pos[0], v->group) != 0)
                                continue;
                        if (n_pos < 2)
                                return usage_error("'snapshot' wants a subcommand: create, ls, info, rm, compact or diff");
                        if (strcmp(pos[1], v->name) != 0)
                                continue;
                        skip = 2;
                } else {
                        if (strcmp(pos[0], v->name) != 0)
                                continue;
                        skip = 1;
                }
                verb = v;
                break;
        }
        if (!verb) {
                if (strcmp(pos[0], "snapshot") == 0)
                        return usage_error("unknown snapshot subcommand '%s'; use create, ls, info, rm, compact or diff",
                                           pos[1]);
                return usage_error("unknown command '%s'", pos[0]);
        }

        pos += skip;
        n_pos -= skip;
        if (n_pos < verb->min_args || n_pos > verb->max_args)
                return usage_error("usage: forkctl %s", verb->synopsis);
        for (unsigned bit = 1; bit <= OPT_LAST; bit <<= 1)
                if ((arg_given & bit) && !(verb->options & bit))
                        return usage_error("option %s does not apply here; usage: forkctl %s", option_name(bit),
                                           verb->synopsis);

        if (arg_given & OPT_TIMEOUT) {
                bool deadline = verb->run == verb_fork || verb->run == verb_fork_sandbox;

                r = parse_number("--timeout", arg_timeout_str, deadline ? 1 : 0,
                                 deadline ? SANDBOX_TIMEOUT_SECS_MAX : 3600, &arg_timeout);
                if (r < 0)
                        return r;
        }
        if ((arg_given & OPT_ON_TIMEOUT) && verb->run != verb_timeout && !(arg_given & OPT_TIMEOUT))
                return usage_error("--on-timeout needs --timeout; usage: forkctl %s", verb->synopsis);
        if (verb->run == verb_timeout && parse_u32(pos[1], 1, SANDBOX_TIMEOUT_SECS_MAX, &arg_deadline_secs) < 0)
                return usage_error("timeout wants S, a whole number of seconds in 1..%u, not '%s'; usage: forkctl %s",
                                   SANDBOX_TIMEOUT_SECS_MAX, pos[1], verb->synopsis);

        if (verb->run == verb_snapshot_create) {
                if (!arg_kernel || !*arg_kernel || !arg_rootfs || !*arg_rootfs)
                        return usage_error("snapshot create needs --kernel and --rootfs; usage: forkctl %s",
                                           verb->synopsis);
                if (!(arg_given & OPT_BOOT_WAIT))
                        arg_boot_wait = 60;
        }
        if (verb->run == verb_snapshot_compact) {
                if (!arg_to)
                        return usage_error("snapshot compact needs --to; usage: forkctl %s", verb->synopsis);
                if (!snapshot_tag_is_valid(arg_to))
                        return usage_error("--to must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$, not '%.64s'", arg_to);
                if (strcmp(arg_to, pos[0]) == 0)
                        return usage_error("--to must name a new snapshot, not '%s' itself", arg_to);
        }
        if (verb->run == verb_snapshot_diff) {
                if (!arg_from || !arg_exec || !(arg_given & OPT_TAG))
                        return usage_error("snapshot diff needs --from, --tag and --exec; usage: forkctl %s",
                                           verb->synopsis);
                if (!snapshot_tag_is_valid(arg_from) || !snapshot_tag_is_valid(arg_tag))
                        return usage_error("--from and --tag must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$");
                if (strcmp(arg_from, arg_tag) == 0)
                        return usage_error("--tag must name a new snapshot, not '%s' itself", arg_tag);
        }

        if (verb->run == verb_mcp)
                return verb_mcp(NULL, pos, n_pos); /* connects when a tool needs the bus */
        if (verb->run == verb_doctor)
                return verb_doctor(NULL, pos, n_pos); /* needs no forkd */

        r = connect_bus(&bus);
        if (r < 0)
                return r;

        return verb->run(bus, pos, n_pos);
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
