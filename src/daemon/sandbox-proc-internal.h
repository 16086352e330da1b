/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* What sandbox-proc-dbus.c (the methods) and sandbox-proc-stream.c (the
 * output streams) share. */

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

#include "manager.h"
#include "time-util.h"

struct json_object;

#define PROC_CALL_TIMEOUT_USEC (30 * USEC_PER_SEC) /* a guest's answer, beyond a read's wait_ms */
#define IN_SET_CONN(r) ((r) == -ECONNRESET || (r) == -EPIPE || (r) == -ENOTCONN || (r) == -ESHUTDOWN)

typedef enum ProcOp {
        PROC_OP_START,
        PROC_OP_LIST,
        PROC_OP_SIGNAL,
        PROC_OP_STDIN,
        PROC_OP_RESIZE,
        PROC_OP_READ,
} ProcOp;

/* One chunk of a proc_read answer, decoded. */
typedef struct ProcChunk {
        uint8_t kind; /* PROC_STREAM_STDOUT or PROC_STREAM_STDERR */
        uint64_t offset;
        size_t len;
        uint8_t *data;
} ProcChunk;

typedef struct ProcReadAnswer {
        ProcChunk *chunks;
        size_t n_chunks, bytes;
        uint64_t next_offset, gap;
        bool exited, end;
        int32_t exit_code; /* -1 while running or when killed by a signal */
        int32_t signal;    /* 0: none */
} ProcReadAnswer;

/* A proc_read answer o to a read at offset of at most max bytes: chunks
 * contiguous from offset + gap, within max, next_offset at their end.
 * -EINVAL with *why (static), -ENOMEM. */
int proc_read_answer_parse(struct json_object *o, uint64_t offset, uint32_t max, ProcReadAnswer *ret,
                           const char **why);
void proc_read_answer_done(ProcReadAnswer *a);
/* {"pid", "offset", "max", "wait_ms"}, without "op". NULL: out of memory. */
struct json_object *proc_read_request(uint32_t pid, uint64_t offset, uint32_t max, uint32_t wait_ms);

/* An agent call that brought no answer (r < 0) or a refusal (r >= 0: obj is
 * the error frame's payload) as a D-Bus error. */
int proc_agent_error(int r, struct json_object *obj, sd_bus_error *error);
/* Answer message with GuestError: an invalid answer to op. */
int proc_invalid_answer(sd_bus_message *message, ProcOp op, const char *why);

/* StartProcess's argv and options, checked, as a proc_start request (without "op"). */
int proc_start_request(sd_bus_message *message, struct json_object **ret, sd_bus_error *error);
/* Arguments: a pid 1..INT32_MAX, an offset 0..INT64_MAX (InvalidArgs into error). */
int proc_read_pid(sd_bus_message *message, uint32_t *ret, sd_bus_error *error);
int proc_read_offset(sd_bus_message *message, uint64_t *ret, sd_bus_error *error);
/* Polkit and ownership: Exec's action, org.forkd.run-code, with verb. */
int proc_verify(sd_bus_message *message, Sandbox *s, const char *verb, sd_bus_error *error);
