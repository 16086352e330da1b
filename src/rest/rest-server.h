/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * forkd-rest's HTTP side: libmicrohttpd in external-polling epoll mode driven
 * by sd-event (its epoll fd is one io source, its timeout one timer), the
 * request lifecycle (routing, auth, body cap, suspend while a D-Bus call is in
 * flight, resume on the reply) and request deadlines (rest-server.c). The D-Bus
 * client is rest-bus.c, the answers rest-reply.c (with protocol upgrades: a
 * WebSocket's socket goes to its route, which watches it on sd-event beside
 * MHD's loop), Idempotency-Key rest-idem-glue.c (the store rest-idem.c), the
 * metrics rest-metrics.c. No threads.
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "rest-request.h"

typedef struct RestConfig {
        int listen_fd;              /* bound, listening socket; the server takes it */
        const char *tls_cert_pem;   /* both set: HTTPS */
        const char *tls_key_pem;
        const char *token;          /* NULL: no authentication */
        const char *bus_address;    /* NULL: the system bus */
        bool no_direct;             /* never use forkd's direct socket */
        unsigned connection_limit;  /* MHD_OPTION_CONNECTION_LIMIT */
        unsigned timeout_secs;      /* idle timeout and request deadline */
        size_t memory_limit;        /* per-connection pool (headers) */
        size_t body_max;            /* request body cap */
        unsigned calls_max;         /* D-Bus calls in flight */
        const char *state_dir;      /* Idempotency-Key records (rest-idem.h); NULL: keys are refused */
        bool state_dir_create;      /* make state_dir now, fail if we cannot; else at first use */
        bool metrics_per_sandbox;   /* GET /metrics: series per sandbox too (REST_METRICS_SANDBOXES_MAX) */
} RestConfig;

#define REST_CONNECTION_LIMIT_DEFAULT 256u
#define REST_TIMEOUT_SECS_DEFAULT 10u
#define REST_MEMORY_LIMIT_DEFAULT (64u * 1024u)
#define REST_BODY_MAX_DEFAULT (1024u * 1024u)
#define REST_CALLS_MAX_DEFAULT 64u

int rest_server_new(sd_event *event, const RestConfig *config, RestServer **ret);
RestServer *rest_server_free(RestServer *s);
static inline void rest_server_freep(RestServer **s) {
        rest_server_free(*s);
}
