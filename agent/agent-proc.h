/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The process table: processes started in the background (proc_start), whose
 * output the agent keeps in one ring per process, for readers that come and go
 * (proc_read, a long poll). The table lives in the agent, so in guest memory:
 * it goes with the guest through fork, branch and pause.
 *
 * Per process: one output log for both streams, at most AGENT_PROC_RING bytes,
 * with one byte offset over the interleaved output; each stored segment is
 * tagged with its stream. When the ring is full the oldest bytes go, and a
 * reader that asks for them gets a gap (their count). The agent always drains
 * the pipes, so a slow or absent reader never blocks the process.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "time-util.h"

#define AGENT_PROC_MAX 256u                           /* entries: running plus exited-unread */
#define AGENT_PROC_RING (2u * 1024u * 1024u)          /* output bytes kept per process */
#define AGENT_PROC_MAX_SEGMENTS 65536u                /* stream changes kept per process; more drops the oldest */
#define AGENT_PROC_MAX_ARGS 4096u
#define AGENT_PROC_MAX_ARGS_BYTES (128u * 1024u)
#define AGENT_PROC_MAX_ENV 1024u
#define AGENT_PROC_MAX_ENV_BYTES (128u * 1024u)
#define AGENT_PROC_STDIN_CHUNK (64u * 1024u)          /* one proc_stdin, decoded */
#define AGENT_PROC_STDIN_QUEUE (256u * 1024u)         /* queued per process */
#define AGENT_PROC_PTY_MAX 1000u                      /* cols and rows: 1 .. this */
#define AGENT_PROC_READ_MAX 262144u
#define AGENT_PROC_READ_DEFAULT 65536u
#define AGENT_PROC_WAIT_MAX_MS 60000u
#define AGENT_PROC_TIMEOUT_MAX_SECS 86400u
#define AGENT_PROC_MAX_WAITERS 1024u                  /* proc_read long polls pending at once */
#define AGENT_PROC_EXPIRE_USEC (10u * 60u * USEC_PER_SEC) /* an exited entry is dropped */
#define AGENT_PROC_DRAIN_USEC (200u * 1000u)          /* after exit, wait this long for EOF */
#define AGENT_PROC_POLL_MAX (3u * AGENT_PROC_MAX)     /* per process: stdout, stderr, stdin (or one pty) */

struct json_object;
struct pollfd;
typedef struct Agent Agent;
typedef struct ProcTable ProcTable;

ProcTable *proc_table_free(ProcTable *t);

/* The ops (docs/agent-protocol.md); each answers through agent_send_json() or
 * an error frame, and returns a negative errno only when it could not answer. */
int agent_op_proc_start(Agent *a, uint32_t id, struct json_object *req);
int agent_op_proc_list(Agent *a, uint32_t id, struct json_object *req);
int agent_op_proc_signal(Agent *a, uint32_t id, struct json_object *req);
int agent_op_proc_stdin(Agent *a, uint32_t id, struct json_object *req);
int agent_op_proc_resize(Agent *a, uint32_t id, struct json_object *req);
int agent_op_proc_read(Agent *a, uint32_t id, struct json_object *req);

/* agent_reap() found pid: true when it is one of the table's, its status recorded. */
bool agent_proc_reaped(Agent *a, pid_t pid, int status);

/* Loop integration: the fds to poll (in the table's order: call agent_proc_io()
 * with the same array before anything can change the table), timeouts, drains,
 * long polls and expiry in agent_proc_tick(). */
size_t agent_proc_pollfds(Agent *a, struct pollfd *fds, size_t max);
void agent_proc_io(Agent *a, const struct pollfd *fds, size_t n);
void agent_proc_tick(Agent *a, uint64_t now_usec);
uint64_t agent_proc_next_deadline(const Agent *a);
/* SIGKILL to every running process's group (shutdown, and the agent's end). */
void agent_proc_kill_all(Agent *a);
