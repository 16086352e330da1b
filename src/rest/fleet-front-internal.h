/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The insides of a front end, for fleet-front*.c only. */

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "fleet-front.h"
#include "fleet-http.h"
#include "fleet-view.h"

#define FRONT_HEADERS_MAX 4u
#define FRONT_FETCHES_MAX 256u
#define FRONT_ID_MAX (64u + 1u + FLEET_NODE_NAME_MAX)

typedef struct FrontFetch {
        char node[FLEET_NODE_NAME_MAX + 1];
        char tag[SNAPSHOT_TAG_MAX + 1];
} FrontFetch;

struct FleetFront {
        FleetFrontConfig cfg;
        size_t token_len;
        struct MHD_Daemon *mhd;
        FleetWatcher *watcher;

        pthread_mutex_t lock;  /* fetches, idem lease */
        pthread_cond_t fetch_done;
        FrontFetch fetches[FRONT_FETCHES_MAX]; /* the chains being fetched: one per (node, tag) */
        size_t n_fetches;
        int64_t idem_lease;
        uint64_t idem_lease_usec;

        atomic_uint_fast64_t requests, placements, placement_refusals, fetches_total, fetch_failures,
                node_failures, idem_replays;
};

typedef struct FrontHeader {
        const char *name;
        char value[512];
} FrontHeader;

/* One request: what came in, and the answer the handler leaves for the server. */
typedef struct FrontRequest {
        FleetFront *front;
        struct MHD_Connection *connection;
        char method[16];
        char path[1024];        /* the URL path as the client sent it, without the query */
        char query[2048];       /* "" or "?a=b&...", as it goes on to a node */
        const char *authorization;
        char *body;
        size_t len, alloc;
        int body_fd;            /* a bundle upload: the body is this memfd */
        bool too_large;
        char content_type[128];
        char *idem_key;
        bool answered;

        unsigned status;
        char answer_type[128];
        char *answer;
        size_t answer_len;
        int answer_fd;          /* >= 0: the answer is this file, answer_len bytes (a bundle) */
        bool asked_node;        /* a node was sent a call that may have changed something */
        FrontHeader headers[FRONT_HEADERS_MAX];
        size_t n_headers;
} FrontRequest;

/* Answers (fleet-front.c). front_answer_error's body is {"error": ...}. */
int front_answer(FrontRequest *r, unsigned status, const char *type, const char *body, size_t len);
int front_answer_json(FrontRequest *r, unsigned status, struct json_object *o);
int front_answer_error(FrontRequest *r, unsigned status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The node's answer as it came (its status, type and body). */
int front_answer_node(FrontRequest *r, const char *node, const FleetAnswer *a);
void front_add_header(FrontRequest *r, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *front_query_arg(FrontRequest *r, const char *name);

/* A call to a node with this request's credentials. */
FleetCall front_call(const FrontRequest *r, const FleetRecord *node, const char *method, const char *path);

/* Routes (fleet-front-routes.c, fleet-front-place.c; the front end's own in fleet-front.c). */
int front_route_healthz(FrontRequest *r);
int front_route_metrics(FrontRequest *r);
int front_route(FrontRequest *r);
int front_sandboxes_create(FrontRequest *r);
int front_snapshot_to_node(FrontRequest *r, FleetView *v, const FleetRecord *source, const char *tag,
                           const FleetRecord *target);

/* Idempotency-Key (fleet-front-idem.c): 1 to go on (the request is new), 0 when
 * answered (a replay, or a refusal). front_idem_finish() keeps the answer. */
bool front_idem_applies(const FrontRequest *r);
int front_idem_claim(FrontRequest *r, char **ret_record_key);
void front_idem_finish(FrontRequest *r, const char *record_key);
