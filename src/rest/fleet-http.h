/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * A front end's calls to the nodes' REST APIs (libcurl, blocking: each request
 * thread of the front end makes its own). A node is as hostile as any peer: an
 * answer is read up to answer_max bytes (more: the call fails, -EMSGSIZE) and
 * within timeout_ms, and only http(s) is followed, never a redirect.
 */

#include <stdbool.h>
#include <stddef.h>

#define FLEET_ANSWER_MAX (16u << 20)

typedef struct FleetCall {
        const char *base;          /* the node's URL: http(s)://HOST:PORT */
        const char *method;
        const char *path;          /* from '/', with its query */
        const char *authorization; /* the client's header, passed on; or NULL */
        const char *content_type;  /* of body; NULL: application/json when there is a body */
        const char *body;
        size_t len;
        int body_fd;               /* >= 0: the body is this file, from 0, len bytes (body unused) */
        int answer_fd;             /* >= 0: a 2xx answer's body goes into this file instead */
        size_t answer_max;         /* 0: FLEET_ANSWER_MAX */
        unsigned timeout_ms;
} FleetCall;

typedef struct FleetAnswer {
        long status;               /* 0: no answer (error says why) */
        char content_type[128];
        char process_pid[24];      /* Forkd-Process-Pid, when the node sent one */
        char *body;                /* NUL-terminated */
        size_t len;
        char error[256];
} FleetAnswer;

/* 0 with the answer in *ret (any status), or a negative errno with ret->error. */
int fleet_http_call(const FleetCall *call, FleetAnswer *ret);
/* The n calls at once; each answer in ret[i]. Returns how many got an answer. */
size_t fleet_http_call_many(const FleetCall *calls, size_t n, FleetAnswer *ret);
void fleet_answer_done(FleetAnswer *a);

struct json_object;
/* A node's answer body as JSON of any type (an object or an array), nested at
 * most 64 deep, with nothing after it: 0, or -EBADMSG. */
int front_parse_answer(const char *body, size_t len, struct json_object **ret);

/* A sandbox's id through a front end: "<the node's id>.<node>", at most this long. */
#define FLEET_ID_MAX (64u + 1u + 63u)
/* A node's SandboxInfo (an object with "id"), an array of them, or
 * {"children": [ids]}, in place: every id named by its node, and "node" added;
 * an id that is not a forkd sandbox id becomes null, never a name that could
 * route to another node. */
void fleet_answer_rename(struct json_object *o, const char *node);
