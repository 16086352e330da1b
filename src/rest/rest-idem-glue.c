/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <microhttpd.h>

#include "macro.h"
#include "rest-idem-glue.h"
#include "rest-reply.h"
#include "rest-server-internal.h"

#define IDEM_HEADER "Idempotency-Key"
#define IDEM_REPLAYED_HEADER "Idempotent-Replayed"

/* ---------------- Idempotency-Key ----------------
 *
 * A request that creates something and carries a valid key hashes its
 * method, path, query and body as they arrive. Once it is whole, the key is
 * looked up (rest_idem_begin()): a new key is claimed on disk and the route
 * runs; a kept answer is replayed; while the key's first request is still in
 * flight the retry waits, suspended like a D-Bus call, for that answer. The
 * first request's answer is kept when forkd was asked (idem_sent): before
 * that nothing was done, and the key is free again. */

static int reply_replay(RestRequest *req, unsigned status, const char *content_type, const char *body, size_t len) {
        struct MHD_Response *resp;

        resp = MHD_create_response_from_buffer(len, (void *) body, MHD_RESPMEM_MUST_COPY);
        if (!resp)
                return -ENOMEM;
        if (content_type && *content_type)
                (void) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        (void) MHD_add_response_header(resp, IDEM_REPLAYED_HEADER, "true");
        req->server->metrics.idem_replays++;
        return rest_queue_response(req, status, resp);
}

static int reply_unkept(RestRequest *req, unsigned status, size_t len) {
        return rest_reply_error(req, 409,
                                "the first request with this Idempotency-Key was answered %u with a body of %zu bytes, "
                                "more than forkd-rest keeps; its answer cannot be replayed",
                                status, len);
}

static int reply_interrupted(RestRequest *req) {
        return rest_reply_error(req, 409,
                                "a request with this Idempotency-Key was interrupted by a restart of forkd-rest; "
                                "its outcome is unknown");
}

static void idem_waiter_unlink(RestRequest *req) {
        RestRequest **w = (RestRequest **) &req->idem_wait->waiters;

        while (*w && *w != req)
                w = &(*w)->idem_next;
        if (*w)
                *w = req->idem_next;
        req->idem_next = NULL;
        req->idem_wait = NULL;
}

/* Every answer passes here before it goes to MHD. body NULL: an answer that
 * cannot be kept (a file, a stream), of len bytes. */
void rest_request_idem_settle(RestRequest *req, unsigned status, const char *content_type, const char *body, size_t len) {
        RestServer *s = req->server;
        RestRequest *waiters;
        RestIdemEntry *e;
        int r;

        if (req->idem_wait)
                idem_waiter_unlink(req); /* its own answer: a replay, or an error */
        if (!req->idem)
                return;
        e = TAKE_PTR(req->idem);
        waiters = e->waiters;
        e->waiters = NULL;
        if (s->stopping)
                /* The 503 of a shutdown is no outcome: forkd may finish the
                 * work. The record stays pending. */
                rest_idem_abandon(s->idem, e, false);
        else if (!req->idem_sent)
                rest_idem_abandon(s->idem, e, true);
        else {
                r = rest_idem_finish(s->idem, e, status, content_type, body, len);
                if (r < 0)
                        log_warning_errno(r, "Cannot keep the answer to a request with an Idempotency-Key: %m");
        }
        while (waiters) {
                RestRequest *w = waiters;

                waiters = w->idem_next;
                w->idem_next = NULL;
                w->idem_wait = NULL;
                if (body)
                        (void) reply_replay(w, status, content_type, body, len);
                else
                        (void) reply_unkept(w, status, len);
        }
}

/* The key's first request ends without an answer (its connection failed). */
void rest_request_idem_drop(RestRequest *req) {
        RestServer *s = req->server;
        RestRequest *waiters;
        RestIdemEntry *e;
        bool sent = req->idem_sent && !s->stopping;

        if (req->idem_wait)
                idem_waiter_unlink(req);
        if (!req->idem)
                return;
        e = TAKE_PTR(req->idem);
        waiters = e->waiters;
        e->waiters = NULL;
        rest_idem_abandon(s->idem, e, !req->idem_sent);
        while (waiters) {
                RestRequest *w = waiters;

                waiters = w->idem_next;
                w->idem_next = NULL;
                w->idem_wait = NULL;
                if (sent)
                        (void) reply_interrupted(w);
                else
                        (void) rest_reply_error(w, 503, "the first request with this Idempotency-Key ended without "
                                                        "an answer before anything was done; retry");
        }
}

static enum MHD_Result count_idem_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
        if (key && !strcasecmp(key, IDEM_HEADER))
                (*(unsigned *) cls)++;
        return MHD_YES;
}

static enum MHD_Result hash_query_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
        sha256_ctx *c = cls;

        rest_idem_hash_field(c, key ?: "", key ? strlen(key) : 0);
        rest_idem_hash_field(c, value ? "=" : "", value ? 1 : 0); /* "?a" is not "?a=" */
        if (value)
                rest_idem_hash_field(c, value, strlen(value));
        return MHD_YES;
}

/* A route that creates something: take its Idempotency-Key, if any, and
 * start the request's hash. Returns 0, or a queued 400's result. */
int rest_request_idem_begin(RestRequest *req, const char *url, const char *method) {
        const char *key;
        unsigned n = 0;

        if (!rest_idem_applies(method, url))
                return 0; /* elsewhere the header means nothing and is ignored */
        (void) MHD_get_connection_values(req->connection, MHD_HEADER_KIND, count_idem_header, &n);
        if (n == 0)
                return 0;
        if (n > 1)
                return MIN(rest_reply_error(req, 400, "more than one Idempotency-Key header"), -EINVAL);
        key = MHD_lookup_connection_value(req->connection, MHD_HEADER_KIND, IDEM_HEADER);
        if (!key || !rest_idem_key_is_valid(key))
                return MIN(rest_reply_error(req, 400,
                                            "invalid Idempotency-Key: it must be 1 to %u printable ASCII characters",
                                            REST_IDEM_KEY_MAX),
                           -EINVAL);
        req->idem_key = strdup(key);
        if (!req->idem_key)
                return MIN(rest_reply_error(req, 500, "out of memory"), -ENOMEM);
        sha256_init(&req->idem_hash);
        rest_idem_hash_field(&req->idem_hash, method, strlen(method));
        rest_idem_hash_field(&req->idem_hash, url, strlen(url));
        (void) MHD_get_connection_values(req->connection, MHD_GET_ARGUMENT_KIND, hash_query_arg, &req->idem_hash);
        return 0;
}

/* The whole request is in. Returns 1 when the route is to run (the key is
 * new and now this request's), 0 when it was answered or waits, or the
 * failed reply's negative errno. */
int rest_request_idem_claim(RestRequest *req) {
        RestServer *s = req->server;
        _cleanup_free_ char *buf = NULL;
        uint8_t hash[SHA256_DIGEST_SIZE];
        RestIdemEntry *e = NULL;
        RestIdemRecord rec;
        int r;

        if (!s->idem)
                return rest_reply_error(req, 503, "Idempotency-Key is not available: forkd-rest has no state directory");
        sha256_final(&req->idem_hash, hash);
        r = rest_idem_begin(s->idem, req->idem_key, hash, &e, &rec, &buf);
        switch (r) {
        case REST_IDEM_LOOKUP_NEW:
                req->idem = e;
                return 1;
        case REST_IDEM_LOOKUP_WAIT:
                req->idem_wait = e;
                req->idem_next = e->waiters;
                e->waiters = req;
                s->metrics.idem_waits++;
                rest_request_wait(req);
                return 0;
        case REST_IDEM_LOOKUP_REPLAY:
                return reply_replay(req, rec.status, rec.content_type, rec.body, rec.body_len);
        case REST_IDEM_LOOKUP_UNKEPT:
                return reply_unkept(req, rec.status, rec.body_len);
        case REST_IDEM_LOOKUP_INTERRUPTED:
                return reply_interrupted(req);
        case REST_IDEM_LOOKUP_DAMAGED:
                return rest_reply_error(req, 409,
                                        "the record of this Idempotency-Key cannot be read; the outcome of its "
                                        "request is unknown");
        case REST_IDEM_LOOKUP_MISMATCH:
                return rest_reply_error(req, 422,
                                        "this Idempotency-Key was used with another request (method, path, query "
                                        "or body differ)");
        case -ENOBUFS:
                return rest_reply_error(req, 503, "too many Idempotency-Key records (%u, each kept 24 hours); retry later",
                                        rest_idem_records(s->idem));
        default:
                return rest_reply_error(req, 503, "cannot keep a record of the Idempotency-Key: %s",
                                        strerror(r < 0 ? -r : EIO));
        }
}

/* The first call for a request: headers are in. Route, authenticate, check
 * the announced body size. A response may be queued right here. */
