/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The insides of RestServer and RestRequest, for the files of forkd-rest's
 * HTTP side only (rest-server.c, rest-request.c, rest-reply.c, rest-bus.c,
 * rest-idem-glue.c, rest-metrics.c); route handlers see rest-request.h. */

#include <microhttpd.h>
#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include "rest-bus.h"
#include "rest-idem.h"
#include "rest-metrics.h"
#include "rest-reply.h"
#include "rest-request.h"
#include "rest-routes.h"
#include "sha256.h"

#define REST_PARAM_MAX 256

typedef struct RestConn RestConn;

struct RestUpgrade {
        RestServer *server;
        struct MHD_UpgradeResponseHandle *urh;
        rest_upgrade_func on_upgrade;
        rest_upgrade_stop_func on_stop;
        void *userdata;
        RestUpgrade *prev, *next;
};

struct RestConn {
        RestServer *server;
        int fd;
        uint64_t deadline; /* CLOCK_MONOTONIC usec; 0: none */
        bool upgraded;     /* another protocol's now (rest_reply_upgrade()): no deadline */
        RestConn *prev, *next;
};

struct RestRequest {
        RestServer *server;
        struct MHD_Connection *connection;
        RestConn *conn;
        const RestRoute *route;
        const struct rest_method *method;
        int route_index; /* rest_routes_count: unknown */
        int method_index;
        char param[REST_PARAM_MAX];
        char param2[REST_PARAM_MAX]; /* a second '%' segment (a process's pid) */
        bool has_param, has_param2;

        char *body;
        size_t body_len, body_alloc;
        int body_fd;      /* a method with a body_fd_max: the body goes here */

        bool too_large;   /* body over the cap: discarding the rest */
        bool queued;      /* a response went to MHD */
        bool suspended;   /* a D-Bus call is in flight */
        struct MHD_Response *pending;
        unsigned pending_status;
        sd_bus_slot *slot;
        rest_reply_func on_reply;

        unsigned status;
        uint64_t start;
        RestRequest *prev, *next; /* suspended list */

        /* a streamed reply (rest_reply_stream()) */
        rest_stream_read_func stream_read;
        bool streaming, stream_suspended, stream_abort;
        RestRequest *stream_prev, *stream_next;
        void *data;
        void (*free_data)(void *data);

        /* a protocol upgrade not yet done (rest_reply_upgrade()) */
        RestUpgrade *upgrade;

        /* Idempotency-Key (rest-idem.c) */
        char *idem_key;             /* a valid key on a route that takes one */
        sha256_ctx idem_hash;       /* of method, path, query and body */
        RestIdemEntry *idem;        /* the key's first request: this one, to be answered */
        RestIdemEntry *idem_wait;   /* waiting for the answer of the key's first request ... */
        RestRequest *idem_next;     /* ... in its list of waiters */
        bool idem_sent;             /* a call went to forkd: the answer is an outcome to keep */
};

struct RestServer {
        sd_event *event;
        struct MHD_Daemon *daemon;
        sd_event_source *io_source, *timer_source, *deadline_source, *resume_source;
        sd_bus *bus;
        char *bus_address;
        sd_bus *direct;              /* to forkd itself, bypassing the bus daemon; may be NULL */
        sd_bus_slot *direct_query;   /* asking forkd for its DirectSocket */
        uint64_t direct_next_query;  /* CLOCK_MONOTONIC usec */
        bool no_direct;
        char *token;
        size_t token_len;
        char *tls_cert, *tls_key;
        unsigned timeout_secs;
        size_t body_max;
        unsigned calls_max, calls_in_flight;

        RestConn *conns;
        unsigned conns_active;
        RestRequest *suspended;
        RestRequest *streams;        /* replies being streamed */
        RestUpgrade *upgrades;       /* connections handed over to another protocol */
        unsigned streams_open;       /* process output streams and terminals (rest_stream_slot_take()) */
        RestIdem *idem;              /* NULL: no state directory, keys are refused */
        bool stopping;

        /* metrics */
        RestMetrics metrics;
        bool metrics_per_sandbox;    /* GET /metrics has series per sandbox */
};

/* Hand resp to MHD for req, or park it while a D-Bus call is in flight
 * (rest-reply.c). */
int rest_queue_response(RestRequest *req, unsigned status, struct MHD_Response *resp);
/* Take req off the server's list of suspended requests (rest-request.c). */
void rest_request_suspended_unlink(RestRequest *req);
