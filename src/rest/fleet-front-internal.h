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
#define FRONT_ID_MAX FLEET_ID_MAX

/* Children placed on a node in the last FRONT_RESERVE_USEC whose record was
 * not written since: it may not count them yet, so placement counts them for
 * it. */
#define FRONT_RESERVATIONS_MAX 1024u
#define FRONT_RESERVE_USEC (2000ull * 1000ull)
typedef struct FrontReservation {
        char node[FLEET_NODE_NAME_MAX + 1];
        uint32_t n;
        uint64_t usec;      /* CLOCK_MONOTONIC */
        uint64_t at_unix;   /* CLOCK_REALTIME seconds, as records' updated_unix */
} FrontReservation;

typedef struct FrontFetch {
        char node[FLEET_NODE_NAME_MAX + 1];
        char tag[SNAPSHOT_TAG_MAX + 1];
} FrontFetch;

struct FleetFront {
        FleetFrontConfig cfg;
        size_t token_len;
        struct MHD_Daemon *mhd;
        FleetWatcher *watcher;

        pthread_mutex_t lock;  /* fetches, idem lease, reservations */
        pthread_cond_t fetch_done;
        FrontFetch fetches[FRONT_FETCHES_MAX]; /* the chains being fetched: one per (node, tag) */
        size_t n_fetches;
        int64_t idem_lease;
        uint64_t idem_lease_usec;
        FrontReservation reservations[FRONT_RESERVATIONS_MAX]; /* a ring */
        size_t reservation_next;

        atomic_uint_fast64_t requests, placements, placement_refusals, fetches_total, fetch_failures,
                node_failures, idem_replays;
};

typedef struct FrontStream FrontStream;

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
        FrontStream *stream;    /* a streamed answer (fleet-front-stream.c) */
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

/* The fleet-wide lock of a fetch of tag into node (fleet-front-lock.c): 1 with
 * *ret held, or 0 to go on without one (done() said the chain is there, or
 * etcd cannot keep the lock: then this front end's own slot is all there is).
 * done() is asked while another front end holds it. */
typedef struct FrontLock FrontLock;
int front_lock_fetch(FrontRequest *r, const char *node, const char *tag, bool (*done)(FrontRequest *r, void *data),
                     void *data, FrontLock **ret);
void front_lock_release(FrontLock *l);

/* A node's answer streamed to the client as it comes (fleet-front-stream.c):
 * 0 with r->stream set (or an error answered), or a negative errno. */
int front_stream_start(FrontRequest *r, const FleetRecord *node, const char *path, const char *body, size_t len);
struct MHD_Response *front_stream_response(FrontRequest *r, unsigned *ret_status);
void front_stream_drop(FrontRequest *r);

/* Idempotency-Key (fleet-front-idem.c): 1 to go on (the request is new), 0 when
 * answered (a replay, or a refusal). front_idem_finish() keeps the answer. */
bool front_idem_applies(const FrontRequest *r);
int front_idem_claim(FrontRequest *r, char **ret_record_key);
void front_idem_finish(FrontRequest *r, const char *record_key);
