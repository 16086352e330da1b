/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * forkd-agent: the agent of a Linux guest (docs/agent-protocol.md).
 *
 * One Agent serves one channel from a poll loop: frames in, frames out, exec
 * children whose pipes the loop drains, SIGCHLD through a self-pipe. eval and
 * run_code run synchronously in the embedded interpreter (agent-python.c):
 * a long eval blocks the loop, exec is the asynchronous path.
 */

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "agent-image.h"
#include "agent-proto.h"
#include "time-util.h"

#define AGENT_NAME "forkd-agent"
/* The portable agent (no libpython, linked statically) says so in its version, only there */
#ifdef AGENT_PORTABLE
#  define AGENT_VERSION FORKD_VERSION "-portable"
#else
#  define AGENT_VERSION FORKD_VERSION
#endif

/* Limits on what a host can ask for */
#define AGENT_MAX_PAYLOAD FKA_MAX_PAYLOAD             /* request payloads; also the reply limit */
#define AGENT_EXEC_MAX_ARGS 256u
#define AGENT_EXEC_MAX_ARGS_BYTES (64u * 1024u)
#define AGENT_EXEC_MAX_IN_FLIGHT 64u
#define AGENT_EXEC_OUTPUT_CAP (1024u * 1024u)         /* bytes kept per stream, before fitting */
#define AGENT_EXEC_DRAIN_USEC (200u * 1000u)          /* after exit, wait this long for EOF */
#define AGENT_TIMEOUT_DEFAULT_SECS 30u
#define AGENT_TIMEOUT_MAX_SECS 3600u
#define AGENT_CODE_MAX (256u * 1024u)                 /* eval / run_code source */
#define AGENT_PY_OUTPUT_CAP (256u * 1024u)            /* characters kept per captured stream */
#define AGENT_OUTQ_HIGH (8u * 1024u * 1024u)          /* stop reading requests above this */
#define AGENT_READ_CHUNK (64u * 1024u)

static inline bool streq(const char *a, const char *b) {
        return strcmp(a, b) == 0;
}
static inline bool startswith(const char *s, const char *prefix) {
        return strncmp(s, prefix, strlen(prefix)) == 0;
}

typedef enum ChannelKind {
        CHANNEL_TTY,   /* a character device, put into raw mode; reopened on hangup */
        CHANNEL_UNIX,  /* listen on a unix socket path, one connection at a time */
        CHANNEL_FD,    /* an inherited connected fd; end of stream ends the agent (not PID 1) */
} ChannelKind;

typedef struct AgentConfig {
        const char *channel;    /* "/dev/hvc0", "unix:PATH" or "fd:N" */
        bool pid1;              /* getpid() == 1: mounts, reaping, power-off */
        bool set_clock;         /* apply wall_ns of the identity event */
        bool python;            /* start the embedded interpreter */
} AgentConfig;

typedef struct Identity {
        struct json_object *id; /* string or number as sent; NULL before the first event */
        uint64_t generation;
        uint8_t seed[32];
        int64_t wall_ns;        /* wall clock at the event */
        uint64_t mono_usec;     /* CLOCK_MONOTONIC at the event */
        bool have;
} Identity;

/* What /.forkd/image.json makes the defaults of exec, run_code and the service. */
typedef struct AgentDefaults {
        ImageConfig image;
        char **env;             /* the base environment; NULL: the agent's own */
        bool have_user;         /* image.json's user, resolved */
        UserIds user;
        pid_t service_pid;      /* entrypoint + cmd, started at boot; 0: none */
} AgentDefaults;

typedef struct ExecJob ExecJob;
typedef struct Agent Agent;
typedef struct AgentTcp AgentTcp;

typedef struct OutQueue {
        uint8_t *buf;
        size_t start, end, cap;
} OutQueue;

struct Agent {
        AgentConfig config;
        pid_t self_pid;

        ChannelKind kind;
        char *path;             /* tty or socket path */
        int fd;                 /* the connection; -EBADF while none */
        int listen_fd;          /* CHANNEL_UNIX */
        uint64_t conn_gen;      /* bumped on every new connection */
        uint64_t reopen_usec;   /* CHANNEL_TTY: when to try opening again; 0 = not waiting */
        fka_decoder *decoder;
        uint8_t in[AGENT_READ_CHUNK]; /* read, not yet decoded (backpressure) */
        size_t in_start, in_end;
        OutQueue out;

        int sigchld_pipe[2];

        ExecJob *jobs[AGENT_EXEC_MAX_IN_FLIGHT];
        unsigned n_jobs;

        struct ProcTable *procs; /* background processes (agent-proc.c); NULL until the first */

        Identity identity;
        AgentDefaults defaults;

        AgentTcp *tcp;          /* forkd's JSON-line protocol (agent-tcp.c); NULL unless enabled */
        uint64_t reply_tcp;     /* non-zero: replies go to this TCP connection, not the channel */

        bool quit;              /* leave the loop (not PID 1, end of stream or shutdown) */
};

/* ---- agent.c ---- */
struct pollfd;

int agent_new(const AgentConfig *config, Agent **ret);
Agent *agent_free(Agent *a);
static inline void agent_freep(Agent **a) {
        if (*a)
                (void) agent_free(*a);
}

/* Open (or start listening on) the channel. */
int agent_open_channel(Agent *a);
/* The poll loop; returns when a->quit is set, or a negative errno. */
int agent_run(Agent *a);

/* Feed bytes received on the channel: decodes frames and dispatches them;
 * replies are queued in a->out. Exposed for tests. */
void agent_feed(Agent *a, const void *data, size_t size);

/* Run the op that req names ("op"), answering through agent_send_json() and
 * agent_send_error(): unknown ops and failures are answered with an error. */
void agent_dispatch_op(Agent *a, uint32_t id, struct json_object *req);

/* Queue a frame; payload is a JSON object (taken over: the reference is put).
 * While a->reply_tcp is set, the reply goes to that TCP connection instead. */
int agent_send_json(Agent *a, uint16_t type, uint32_t id, struct json_object *payload);
int agent_send_error(Agent *a, uint32_t id, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The same with "errno": the symbolic name of err (strerrorname_np()), for a refusal that an errno says. */
int agent_send_error_errno(Agent *a, uint32_t id, int err, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

/* Write what is queued; with block, wait (up to timeout_usec) until all is out. */
int agent_flush(Agent *a, bool block, uint64_t timeout_usec);

/* ---- agent-defaults.c ---- */
/* Read path (image.json): missing gives no defaults; a bad file is logged and ignored. */
int agent_defaults_load(Agent *a, const char *path);
void agent_defaults_done(AgentDefaults *d);
/* With start_cmd, start entrypoint + cmd once, in the background, output to the console. */
int agent_service_start(Agent *a);
/* The reaper collected pid: the service's exit is logged. */
bool agent_service_reaped(Agent *a, pid_t pid, int status);

/* ---- agent-exec.c ---- */
int agent_exec_start(Agent *a, uint32_t id, struct json_object *req);
/* Reap every child that exited; the agent's own exec children get their status recorded. */
void agent_reap(Agent *a);
/* Loop integration */
size_t agent_exec_pollfds(Agent *a, struct pollfd *fds, ExecJob **owners, size_t max);
void agent_exec_io(Agent *a, ExecJob *j, int fd, short revents);
void agent_exec_tick(Agent *a, uint64_t now_usec);
uint64_t agent_exec_next_deadline(const Agent *a);
void agent_exec_kill_all(Agent *a);
ExecJob *exec_job_free(ExecJob *j);

/* ---- agent-files.c ---- */
/* hash_files: SHA-256 of the regular files under the given paths. */
int agent_op_hash_files(Agent *a, uint32_t id, struct json_object *req);
/* mount_volumes (agent-volumes.c): mount forkd's ext4 volumes. */
int agent_op_mount_volumes(Agent *a, uint32_t id, struct json_object *req);

/* ---- agent-fileio.c ---- */
/* write_file / read_file: one file's contents, base64, at most FILE_OP_MAX bytes (file-ops.h). */
int agent_op_write_file(Agent *a, uint32_t id, struct json_object *req);
int agent_op_read_file(Agent *a, uint32_t id, struct json_object *req);

/* ---- agent-identity.c ---- */
/* Apply an identity event. Returns 0, or a negative errno for a malformed event (ignored). */
int agent_identity_event(Agent *a, struct json_object *ev);
int agent_op_identity(Agent *a, uint32_t id);
void identity_done(Identity *i);

/* ---- agent-util.c ---- */
/* A JSON string from arbitrary bytes: invalid UTF-8 and NUL become U+FFFD. */
struct json_object *json_string_sanitized(const char *s, size_t n);
/* Length of the longest prefix of s[0..n) that does not cut a UTF-8 sequence. */
size_t utf8_prefix(const char *s, size_t n);
/* Serialize; NULL on ENOMEM. */
const char *json_plain(struct json_object *o, size_t *ret_len);
