/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * A fleet's front end (forkd-rest --fleet-front, docs/fleet.md): the forkd REST
 * API with no forkd behind it. It watches the node records in etcd
 * (fleet-view.h), places each fork on a node by where the snapshot's chain is
 * (fleet_place()), fetching a missing chain from a node that holds it first,
 * and sends every later call for a sandbox to its node: a sandbox's id through
 * a front end is "<the node's id>.<node>". Lists merge every node's answer.
 * Idempotency-Key records are kept in etcd, so that any front end replays them.
 *
 * libmicrohttpd with a thread per connection: a request's calls to the nodes
 * and to etcd block that request's thread only.
 */

#include <stdbool.h>
#include <stddef.h>

#include "fleet-etcd.h"

typedef struct FleetFrontConfig {
        int listen_fd;              /* bound, listening; the front end takes it */
        const char *tls_cert_pem;   /* both set: HTTPS */
        const char *tls_key_pem;
        const char *token;          /* NULL: no authentication; else also what the nodes are sent */
        const char *etcd;           /* endpoints */
        EtcdOptions etcd_opts;
        unsigned connection_limit;
        unsigned timeout_secs;      /* a request's idle time-out */
        size_t body_max;            /* request body cap (a bundle upload: REST_BUNDLE_MAX) */
} FleetFrontConfig;

typedef struct FleetFront FleetFront;

int fleet_front_start(const FleetFrontConfig *cfg, FleetFront **ret);
FleetFront *fleet_front_stop(FleetFront *f);
