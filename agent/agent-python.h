/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The warm CPython embedded in the agent. One interpreter, started once,
 * with numpy imported when it is importable. eval and run_code share the
 * globals of __main__, so later calls see earlier names, as in a REPL.
 *
 * Calls are synchronous: the loop waits while Python runs (up to the
 * request's timeout_secs, enforced with ITIMER_REAL and a SIGALRM handler
 * that raises TimeoutError between bytecodes; a long call inside a C
 * extension finishes first). The GIL is released while the loop polls, so
 * threads started by user code keep running.
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct json_object;
typedef struct Agent Agent;

/* Start the interpreter. Returns 0, or a negative errno (eval/run_code then
 * answer errors; the rest of the agent is unaffected). */
int agent_python_init(void);
bool agent_python_ready(void);
/* numpy.__version__ as read at start-up, or NULL without numpy. */
const char *agent_python_numpy_version(void);

int agent_op_eval(Agent *a, uint32_t id, struct json_object *req);
int agent_op_run_code(Agent *a, uint32_t id, struct json_object *req);
/* eval as forkd's own agent does it (the JSON-line protocol, agent-tcp.c): in a
 * new namespace of builtins, numpy and np on every call, so nothing persists
 * between calls. Same arguments and reply as eval. */
int agent_op_eval_fresh(Agent *a, uint32_t id, struct json_object *req);

/* The defaults the interpreter runs with (environment, working directory,
 * user): the portable agent's python3 child takes them, the embedded
 * interpreter ignores them. Call before agent_python_init(). */
struct AgentDefaults;
void agent_python_set_defaults(const struct AgentDefaults *d);
/* Adds what the hello (ping) tells about the interpreter beyond "python";
 * the embedded agent adds nothing. */
void agent_python_describe(struct json_object *o);
/* The reaper collected pid (a child of no exec): the python3 child's end is noted. */
void agent_python_reaped(pid_t pid, int status);

/* After the kernel RNG was reseeded: reseed random, numpy.random and
 * tempfile's name sequence, where loaded. */
void agent_python_reseed(void);
