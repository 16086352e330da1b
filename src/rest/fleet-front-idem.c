/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Idempotency-Key across front ends: the records in etcd (fleet-front.h).
 *
 * A record is FLEET_KEY_PREFIX "idem/<hex SHA-256 of token and key>", put only
 * if absent (a transaction) when the request comes, as {"state": "pending",
 * "request": <hex SHA-256 of method, path, query, body>}, and rewritten with
 * the answer ({"state": "done", "status", "type", "body"}) once it is
 * answered. Records live under a lease of a day, a new lease every hour. */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fleet-front-internal.h"
#include "json-util.h"
#include "macro.h"
#include "sha256.h"
#include "time-util.h"

#define IDEM_KEY_MAX 255u
#define IDEM_TTL_SECS (24u * 3600u)
#define IDEM_LEASE_EVERY_USEC (3600ull * USEC_PER_SEC)
#define IDEM_BODY_MAX (512u * 1024u) /* with base64 and JSON, within etcd's value limit */
#define IDEM_WAIT_USEC (600ull * USEC_PER_SEC)
#define IDEM_POLL_USEC (100ull * USEC_PER_MSEC)

bool front_idem_applies(const FrontRequest *r) {
        static const char *const tails[] = { "/branch", "/fork", "/pause", "/resume" };
        const char *p = r->path;
        size_t n = strlen(p);

        if (!streq(r->method, "POST") ||
            !MHD_lookup_connection_value(r->connection, MHD_HEADER_KIND, "Idempotency-Key"))
                return false;
        if (streq(p, "/v1/sandboxes") || streq(p, "/v1/snapshots") || streq(p, "/v1/snapshots/unpack"))
                return true;
        if (strncmp(p, "/v1/snapshots/", 14) == 0 && n > 8 && streq(p + n - 8, "/compact"))
                return true;
        if (strncmp(p, "/v1/sandboxes/", 14) != 0)
                return false;
        for (size_t i = 0; i < ELEMENTSOF(tails); i++)
                if (n > strlen(tails[i]) && streq(p + n - strlen(tails[i]), tails[i]) &&
                    memchr(p + 14, '/', n - 14 - strlen(tails[i])) == NULL)
                        return true;
        return false;
}

/* The lease the records go under: a new one every hour. */
static int64_t idem_lease(FleetFront *f, EtcdClient *c) {
        int64_t id = 0;

        pthread_mutex_lock(&f->lock);
        if (f->idem_lease != 0 && now_usec() - f->idem_lease_usec < IDEM_LEASE_EVERY_USEC)
                id = f->idem_lease;
        pthread_mutex_unlock(&f->lock);
        if (id != 0 || etcd_lease_grant(c, IDEM_TTL_SECS, &id) < 0)
                return id;
        pthread_mutex_lock(&f->lock);
        f->idem_lease = id;
        f->idem_lease_usec = now_usec();
        pthread_mutex_unlock(&f->lock);
        return id;
}

static void request_hash(const FrontRequest *r, char out[static SHA256_HEX_SIZE]) {
        uint8_t d[SHA256_DIGEST_SIZE];
        sha256_ctx h;

        sha256_init(&h);
        sha256_update(&h, r->method, strlen(r->method) + 1);
        sha256_update(&h, r->path, strlen(r->path) + 1);
        sha256_update(&h, r->query, strlen(r->query) + 1);
        if (r->body_fd >= 0) {
                char buf[65536];
                ssize_t k;

                for (off_t off = 0; (k = pread(r->body_fd, buf, sizeof(buf), off)) > 0; off += k)
                        sha256_update(&h, buf, (size_t) k);
        } else if (r->body)
                sha256_update(&h, r->body, r->len);
        sha256_final(&h, d);
        sha256_hex(d, out);
}

static int open_etcd(FleetFront *f, EtcdClient **ret) {
        return etcd_client_new(f->cfg.etcd, &f->cfg.etcd_opts, ret);
}

/* The record, parsed: 1, 0 when there is none, or a negative errno. */
static int read_record(EtcdClient *c, const char *key, struct json_object **ret) {
        EtcdKv *kvs = NULL;
        size_t n = 0;
        int k;

        k = etcd_range_prefix(c, key, 1, &kvs, &n);
        if (k < 0)
                return k;
        if (n == 0 || !streq(kvs[0].key, key)) {
                etcd_kvs_free(kvs, n);
                return 0;
        }
        k = json_parse_strict(kvs[0].value, kvs[0].len, ETCD_VALUE_MAX, 4, ret, NULL);
        etcd_kvs_free(kvs, n);
        return k < 0 ? -EBADMSG : 1;
}

static const char *get_string(struct json_object *o, const char *field) {
        struct json_object *v;

        if (!json_object_object_get_ex(o, field, &v) || !json_object_is_type(v, json_type_string))
                return NULL;
        return json_object_get_string(v);
}

/* A done record's answer, replayed. */
static int replay(FrontRequest *r, struct json_object *rec) {
        const char *body = get_string(rec, "body"), *type = get_string(rec, "type");
        struct json_object *st, *size;
        int64_t status;

        if (!json_object_object_get_ex(rec, "status", &st) || !json_object_is_type(st, json_type_int) ||
            (status = json_object_get_int64(st)) < 100 || status > 599)
                return front_answer_error(r, 409, "the record of this Idempotency-Key cannot be read; the outcome of "
                                                  "its request is unknown");
        if (!body) {
                json_object_object_get_ex(rec, "size", &size);
                return front_answer_error(r, 409,
                                          "the first request with this Idempotency-Key was answered %" PRId64
                                          " with a body of %" PRId64 " bytes, more than a front end keeps; look at "
                                          "GET /v1/sandboxes or GET /v1/snapshots, and use a new key to try again",
                                          status, size ? json_object_get_int64(size) : 0);
        }
        atomic_fetch_add(&r->front->idem_replays, 1);
        front_add_header(r, "Idempotent-Replayed", "true");
        return front_answer(r, (unsigned) status, type, body, strlen(body));
}

int front_idem_claim(FrontRequest *r, char **ret_record_key) {
        _cleanup_(json_object_putp) struct json_object *pending = json_object_new_object();
        const char *key = MHD_lookup_connection_value(r->connection, MHD_HEADER_KIND, "Idempotency-Key");
        const char *token = r->front->cfg.token ?: "";
        char req_hash[SHA256_HEX_SIZE], key_hex[SHA256_HEX_SIZE], record[128];
        uint8_t d[SHA256_DIGEST_SIZE];
        EtcdClient *c = NULL;
        uint64_t start = now_usec();
        const char *value;
        bool created = false;
        sha256_ctx h;
        size_t n = key ? strlen(key) : 0;
        int k;

        *ret_record_key = NULL;
        if (n == 0 || n > IDEM_KEY_MAX)
                return front_answer_error(r, 400, "Idempotency-Key must be 1 to 255 printable ASCII characters");
        for (size_t i = 0; i < n; i++)
                if (key[i] < 0x20 || key[i] > 0x7e)
                        return front_answer_error(r, 400,
                                                  "Idempotency-Key must be 1 to 255 printable ASCII characters");
        sha256_init(&h);
        sha256_update(&h, token, strlen(token) + 1);
        sha256_update(&h, key, n);
        sha256_final(&h, d);
        sha256_hex(d, key_hex);
        snprintf(record, sizeof(record), FLEET_KEY_PREFIX "idem/%s", key_hex);
        request_hash(r, req_hash);
        if (!pending)
                return -ENOMEM;
        json_object_object_add(pending, "state", json_object_new_string("pending"));
        json_object_object_add(pending, "request", json_object_new_string(req_hash));
        value = json_object_to_json_string_ext(pending, JSON_C_TO_STRING_PLAIN);

        k = open_etcd(r->front, &c);
        if (k >= 0)
                k = etcd_create(c, record, value, strlen(value), idem_lease(r->front, c), &created);
        while (k >= 0 && !created) {
                _cleanup_(json_object_putp) struct json_object *rec = NULL;
                const char *state, *hash;

                k = read_record(c, record, &rec);
                if (k == 0) { /* it expired meanwhile: new */
                        k = etcd_create(c, record, value, strlen(value), idem_lease(r->front, c), &created);
                        continue;
                }
                if (k < 0)
                        break;
                state = get_string(rec, "state");
                hash = get_string(rec, "request");
                if (!state || !hash) {
                        k = front_answer_error(r, 409, "the record of this Idempotency-Key cannot be read; the "
                                                       "outcome of its request is unknown");
                        break;
                }
                if (!streq(hash, req_hash)) {
                        k = front_answer_error(r, 422, "this Idempotency-Key was used with another request (method, "
                                                       "path, query or body differ)");
                        break;
                }
                if (streq(state, "done")) {
                        k = replay(r, rec);
                        break;
                }
                /* pending: the first request is still running, on this front end or another */
                if (now_usec() - start > IDEM_WAIT_USEC) {
                        k = front_answer_error(r, 409, "a request with this Idempotency-Key is still running, or its "
                                                       "front end stopped before it answered; its outcome is unknown");
                        break;
                }
                usleep(IDEM_POLL_USEC);
        }
        etcd_client_free(c);
        if (k < 0 && !r->answered)
                return front_answer_error(r, 503, "cannot keep the Idempotency-Key record in etcd: %s",
                                          k == -EREMOTEIO ? "etcd refused it" : strerror(-k));
        if (r->answered)
                return 0;
        *ret_record_key = strdup(record);
        return *ret_record_key ? 1 : -ENOMEM;
}

void front_idem_finish(FrontRequest *r, const char *record_key) {
        _cleanup_(json_object_putp) struct json_object *done = json_object_new_object();
        char req_hash[SHA256_HEX_SIZE];
        EtcdClient *c = NULL;
        const char *value;

        if (open_etcd(r->front, &c) < 0)
                return;
        if (!r->asked_node) {
                /* answered before any node was asked: nothing was done, the key runs afresh next time */
                (void) etcd_delete(c, record_key);
                etcd_client_free(c);
                return;
        }
        request_hash(r, req_hash);
        if (done) {
                json_object_object_add(done, "state", json_object_new_string("done"));
                json_object_object_add(done, "request", json_object_new_string(req_hash));
                json_object_object_add(done, "status", json_object_new_int64(r->status));
                json_object_object_add(done, "type", json_object_new_string(r->answer_type));
                if (r->answer_fd < 0 && r->answer_len <= IDEM_BODY_MAX && utf8_is_valid_n(r->answer, r->answer_len))
                        json_object_object_add(done, "body", json_object_new_string_len(r->answer, (int) r->answer_len));
                else
                        json_object_object_add(done, "size", json_object_new_int64((int64_t) r->answer_len));
                value = json_object_to_json_string_ext(done, JSON_C_TO_STRING_PLAIN);
                if (value && etcd_put(c, record_key, value, strlen(value), idem_lease(r->front, c)) < 0)
                        log_warning("Cannot keep the answer of an Idempotency-Key in etcd: %s",
                                    etcd_client_error(c));
        }
        etcd_client_free(c);
}
