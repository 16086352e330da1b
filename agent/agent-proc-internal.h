/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The process table's insides, shared by agent-proc.c, agent-proc-start.c and agent-proc-ring.c. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent-proc.h"
#include "json-util.h"

enum { STREAM_STDOUT, STREAM_STDERR };


/* The output log: bytes [start, end) of the output, at buf[offset % cap]; a
 * segment is (offset << 1 | stream), where a run of one stream begins. */
typedef struct ProcRing {
        uint8_t *buf;
        size_t cap;             /* 0, or a power of two up to AGENT_PROC_RING */
        uint64_t start, end;
        uint64_t *segs;         /* circular, oldest first */
        size_t seg_first, n_segs, seg_cap;
} ProcRing;

typedef struct ProcEntry {
        pid_t pid;
        char **argv;
        char *cwd;
        bool pty;
        unsigned cols, rows;
        int out_fd;             /* stdout pipe, or the pty master (written to as well) */
        int err_fd;             /* stderr pipe; -EBADF with a pty */
        int in_fd;              /* stdin pipe; -EBADF with a pty, or stdin false, or closed */
        bool in_open;           /* proc_stdin is accepted */
        bool in_eof;            /* close the pipe once the queue drained */
        uint8_t *inq;           /* queued stdin: inq[inq_start .. inq_end) */
        size_t inq_start, inq_end;
        uint64_t started_ns;    /* CLOCK_REALTIME */
        uint64_t deadline_usec; /* the timeout kill; 0: none */
        bool timed_out;
        bool exited;
        int status;
        uint64_t exited_usec;
        bool drop;              /* expired, or evicted for a new entry: it goes */
        bool end_read;          /* a read returned its end: the first to go when the table is full */
        ProcRing ring;
} ProcEntry;

typedef struct ProcWaiter {
        uint32_t id;
        uint64_t conn_gen;
        uint64_t tcp_conn;
        pid_t pid;
        uint64_t offset;
        uint32_t max;
        uint64_t deadline_usec;
        bool start;     /* a proc_start's "read": the answer is {"pid", "read"} */
} ProcWaiter;

struct ProcTable {
        ProcEntry *entries[AGENT_PROC_MAX];     /* in start order */
        unsigned n;
        ProcWaiter waiters[AGENT_PROC_MAX_WAITERS];
        unsigned n_waiters;
        ProcEntry *owners[AGENT_PROC_POLL_MAX]; /* of the fds agent_proc_pollfds() gave */
        size_t n_owners;
};

/* ---- agent-proc-ring.c ---- */
uint64_t ring_seg(const ProcRing *r, size_t i);
void ring_done(ProcRing *r);
/* Append n (<= AGENT_PROC_RING) bytes of stream; the oldest bytes go when it is full. */
void ring_append(ProcRing *r, const uint8_t *data, size_t n, unsigned stream);
/* The index of the run that holds offset o (start <= o < end). */
size_t ring_find(const ProcRing *r, uint64_t o);

/* ---- agent-proc.c ---- */
ProcEntry *proc_entry_free(ProcEntry *e);
static inline void proc_entry_freep(ProcEntry **e) {
        if (*e)
                proc_entry_free(*e);
}
ProcTable *proc_table(Agent *a);
int proc_dispatch_ignore(struct json_object *v, void *field, const char **ret_error);
int proc_dispatch_borrow(struct json_object *v, void *field, const char **ret_error);
#define PROC_OP_FIELD { "op", JSON_KIND_STRING, proc_dispatch_ignore, 0, 0, JSON_MANDATORY }
/* Dispatch req into args; answers a refusal itself (then returns 0); 1: go on. */
int proc_dispatch(Agent *a, uint32_t id, struct json_object *req, const struct json_dispatch *table, void *args);

bool proc_table_evict_read(ProcTable *t);
/* A proc_start's "read" of entry e (just started) from offset 0: answered with
 * {"pid", "read"} once the process is done, it printed max bytes, or wait_ms passed
 * (0: at once). Always answers: 0, or -ENOMEM. */
int proc_start_read(Agent *a, uint32_t id, ProcEntry *e, uint32_t max, uint32_t wait_ms);
