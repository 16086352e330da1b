/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The portable agent's Python: the image's own python3 (3.8 or later) as one
 * persistent child, running a bootstrap program of ours (passed with -c). It
 * reads requests on fd 3 and writes replies on fd 4, each frame a 4-byte
 * big-endian length and a JSON object:
 *
 *   -> {"op": "eval"|"run_code"|"eval_fresh", "code": "...", "timeout": N}
 *   <- {"result", "error", "exit_code", "stdout", "stderr", "truncated", "timed_out"}
 *   -> {"op": "reseed"}   <- {"ok": true}
 *
 * and first of all, unasked, {"hello": 1, "ok": bool, "version", "executable",
 * "numpy"}. The child enforces the timeout itself (ITIMER_REAL, a SIGALRM
 * handler that raises while armed), so its globals survive one; the agent
 * kills it only when it does not answer PYCHILD_GRACE_USEC after that.
 * Nothing here needs a VM: the tests drive it with the host's python3.
 */

#include <stdbool.h>
#include <sys/types.h>

#include "agent-image.h"
#include "time-util.h"

#define PYCHILD_HELLO_USEC (60u * USEC_PER_SEC)      /* numpy's import may be slow */
#define PYCHILD_GRACE_USEC (5u * USEC_PER_SEC)       /* after the timeout */
#define PYCHILD_REPLY_MAX (64u * 1024u * 1024u)
#define PYCHILD_OUTPUT_CAP (256u * 1024u)           /* characters kept per stream, as the embedded agent */

struct json_object;

typedef struct PyChild {
        pid_t pid;              /* 0: none */
        int to_fd, from_fd;     /* requests, replies */
        char *path;             /* the python3 started */
        char *version;          /* "3.11.2" */
        char *numpy_version;    /* NULL without numpy */
        bool reaped;            /* the agent's reaper saw it exit: status holds how */
        int status;
} PyChild;

#define PYCHILD_NULL ((PyChild) { .to_fd = -EBADF, .from_fd = -EBADF })

/* The python3 on path (NULL: DEFAULT_PATH). -ENOENT without one. */
int pychild_find(const char *path, char **ret);

/* Start python (an absolute path) with env, in cwd (NULL: the agent's), as
 * user (NULL: the agent's), and wait for its hello. -ENOENT: cannot be run;
 * -EPROTONOSUPPORT: older than 3.8 (or not a python that speaks the
 * bootstrap); -ETIMEDOUT; -EPROTO. The child's stdin is /dev/null, its stdout
 * and stderr the agent's stderr. */
int pychild_start(PyChild *c, const char *python, char *const *env, const char *cwd, const UserIds *user);

/* One request (op, code, timeout in seconds; code NULL for "reseed").
 * 0 and the reply; -EPIPE when the child died (it is reaped, and *ret_status
 * holds its wait status when known, else -1); -ETIMEDOUT when it did not
 * answer in time (it is killed). The child is stopped on any error. */
int pychild_call(PyChild *c, const char *op, const char *code, unsigned timeout_secs,
                 struct json_object **ret, int *ret_status);

/* The agent's reaper collected pid: if it is this child, remember how it ended. */
bool pychild_reaped(PyChild *c, pid_t pid, int status);

/* Kill and reap it, and close the pipes (a child already reaped elsewhere: pass reaped). */
void pychild_stop(PyChild *c, bool reaped);
void pychild_done(PyChild *c);

/* The bootstrap program, for the tests to look at. */
extern const char pychild_bootstrap[];
