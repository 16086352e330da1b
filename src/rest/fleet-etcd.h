/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * A small, blocking client of etcd's v3 API through its JSON gateway (POST
 * /v3/<service>/<method>, keys and values in base64, 64-bit numbers as decimal
 * strings), on libcurl: leases (grant, keep alive, revoke) and keys (put,
 * range, delete). One client is one thread's: the fleet node agent's
 * (fleet-node.c).
 *
 * Endpoints are tried in turn: a request that cannot reach one (no connection,
 * a time-out, an HTTP 5xx) goes to the next, and the one that answered is
 * tried first from then on. An answer is at most ETCD_ANSWER_MAX bytes, or the
 * request fails (-EMSGSIZE). etcd's own refusals (HTTP 4xx, or a body with
 * "error") are -EREMOTEIO, with the message in etcd_client_error().
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ETCD_ENDPOINTS_MAX 16u
#define ETCD_URL_MAX 256u
#define ETCD_ANSWER_MAX (4u << 20)
#define ETCD_KEY_MAX 1024u
#define ETCD_VALUE_MAX (1u << 20)

typedef struct EtcdClient EtcdClient;

typedef struct EtcdOptions {
        const char *cacert;   /* PEM file of the CA that signed etcd's certificates, or NULL */
        const char *cert;     /* client certificate (PEM), with key, or NULL */
        const char *key;
        const char *user;     /* etcd's own authentication, with password, or NULL */
        const char *password;
        unsigned timeout_ms;  /* a whole request (0: 2000) */
} EtcdOptions;

/* endpoints: "http://HOST:PORT[,https://HOST:PORT...]". -EINVAL with a reason
 * logged for a list that is empty, too long or holds a URL that is not
 * http(s)://host:port with nothing after it. */
int etcd_client_new(const char *endpoints, const EtcdOptions *opts, EtcdClient **ret);
EtcdClient *etcd_client_free(EtcdClient *c);
const char *etcd_client_error(const EtcdClient *c);
/* The endpoint the last answer came from. */
const char *etcd_client_endpoint(const EtcdClient *c);

/* Split and check an endpoint list as etcd_client_new() does, without a
 * client: 0, or -EINVAL with *ret_why. */
int etcd_endpoints_check(const char *endpoints, const char **ret_why);

int etcd_lease_grant(EtcdClient *c, unsigned ttl_secs, int64_t *ret_id);
/* *ret_ttl: the seconds left; 0 when the lease is gone (expired or revoked). */
int etcd_lease_keepalive(EtcdClient *c, int64_t id, int64_t *ret_ttl);
int etcd_lease_revoke(EtcdClient *c, int64_t id);

/* lease 0: none. */
int etcd_put(EtcdClient *c, const char *key, const void *value, size_t len, int64_t lease);
int etcd_delete(EtcdClient *c, const char *key);
/* Put only if key does not exist yet: *ret_created says whether it was put. */
int etcd_create(EtcdClient *c, const char *key, const void *value, size_t len, int64_t lease, bool *ret_created);

typedef struct EtcdKv {
        char *key;
        char *value; /* NUL-terminated; len without it */
        size_t len;
        int64_t lease;
} EtcdKv;

/* Every key that starts with prefix, at most max (more: -E2BIG). */
int etcd_range_prefix(EtcdClient *c, const char *prefix, size_t max, EtcdKv **ret, size_t *ret_n);
void etcd_kvs_free(EtcdKv *kvs, size_t n);
