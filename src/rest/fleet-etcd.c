/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The etcd v3 JSON gateway client of fleet-etcd.h. */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "fleet-etcd.h"
#include "json-util.h"
#include "macro.h"

struct EtcdClient {
        CURL *curl;
        char *endpoints[ETCD_ENDPOINTS_MAX];
        unsigned n_endpoints, current;
        EtcdOptions opts;
        char *token;              /* etcd's auth token, with opts.user */
        char error[256];
        /* the answer being received */
        char *body;
        size_t len;
        bool too_big;
};

/* One endpoint: http(s)://HOST:PORT, HOST a name or address ([v6] too), PORT
 * 1..65535, nothing after (a path would be joined wrongly). */
static bool endpoint_is_valid(const char *s, size_t n) {
        const char *p, *end = s + n, *colon;
        unsigned long port = 0;

        if (n == 0 || n > ETCD_URL_MAX)
                return false;
        if (n > 7 && strncmp(s, "http://", 7) == 0)
                p = s + 7;
        else if (n > 8 && strncmp(s, "https://", 8) == 0)
                p = s + 8;
        else
                return false;
        if (*p == '[') {
                const char *close = memchr(p, ']', (size_t) (end - p));
                if (!close || close + 1 >= end || close[1] != ':')
                        return false;
                colon = close + 1;
        } else {
                colon = NULL;
                for (const char *q = p; q < end; q++)
                        if (*q == ':')
                                colon = q;
                if (!colon || colon == p)
                        return false;
                for (const char *q = p; q < colon; q++)
                        if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
                              *q == '.' || *q == '-'))
                                return false;
        }
        if (colon + 1 >= end || end - colon - 1 > 5)
                return false;
        for (const char *q = colon + 1; q < end; q++) {
                if (*q < '0' || *q > '9')
                        return false;
                port = port * 10 + (unsigned long) (*q - '0');
        }
        return port >= 1 && port <= 65535;
}

int etcd_endpoints_check(const char *endpoints, const char **ret_why) {
        unsigned n = 0;

        if (!endpoints || !*endpoints)
                return *ret_why = "no endpoint", -EINVAL;
        for (const char *p = endpoints;;) {
                const char *comma = strchr(p, ',');
                size_t len = comma ? (size_t) (comma - p) : strlen(p);

                if (!endpoint_is_valid(p, len))
                        return *ret_why = "each endpoint must be http(s)://HOST:PORT with nothing after it", -EINVAL;
                if (++n > ETCD_ENDPOINTS_MAX)
                        return *ret_why = "at most 16 endpoints", -EINVAL;
                if (!comma)
                        break;
                p = comma + 1;
        }
        return 0;
}

EtcdClient *etcd_client_free(EtcdClient *c) {
        if (!c)
                return NULL;
        if (c->curl)
                curl_easy_cleanup(c->curl);
        for (unsigned i = 0; i < c->n_endpoints; i++)
                free(c->endpoints[i]);
        if (c->token)
                explicit_bzero(c->token, strlen(c->token));
        free(c->token);
        free(c->body);
        free(c);
        return NULL;
}

int etcd_client_new(const char *endpoints, const EtcdOptions *opts, EtcdClient **ret) {
        EtcdClient *c;
        const char *why = NULL;
        int r;

        r = etcd_endpoints_check(endpoints, &why);
        if (r < 0)
                return log_error_errno(r, "Invalid etcd endpoints '%s': %s.", endpoints ?: "", why);
        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->opts = *opts;
        if (c->opts.timeout_ms == 0)
                c->opts.timeout_ms = 2000;
        for (const char *p = endpoints;;) {
                const char *comma = strchr(p, ',');
                size_t len = comma ? (size_t) (comma - p) : strlen(p);

                c->endpoints[c->n_endpoints] = strndup(p, len);
                if (!c->endpoints[c->n_endpoints]) {
                        etcd_client_free(c);
                        return -ENOMEM;
                }
                c->n_endpoints++;
                if (!comma)
                        break;
                p = comma + 1;
        }
        c->curl = curl_easy_init();
        if (!c->curl) {
                etcd_client_free(c);
                return -ENOMEM;
        }
        *ret = c;
        return 0;
}

const char *etcd_client_error(const EtcdClient *c) {
        return c->error;
}

const char *etcd_client_endpoint(const EtcdClient *c) {
        return c->endpoints[c->current];
}

static size_t on_body(char *data, size_t size, size_t n, void *userdata) {
        EtcdClient *c = userdata;
        size_t k = size * n;
        char *b;

        if (c->len + k > ETCD_ANSWER_MAX) {
                c->too_big = true;
                return 0; /* curl fails the transfer */
        }
        b = realloc(c->body, c->len + k + 1);
        if (!b)
                return 0;
        memcpy(b + c->len, data, k);
        c->len += k;
        b[c->len] = 0;
        c->body = b;
        return k;
}

/* One POST of body to path on endpoint i; *ret_status the HTTP status. */
static int post_once(EtcdClient *c, unsigned i, const char *path, const char *body, long *ret_status) {
        struct curl_slist *headers = NULL;
        char url[ETCD_URL_MAX + 64], auth[600];
        CURLcode cc;
        int r = 0;

        free(c->body);
        c->body = NULL;
        c->len = 0;
        c->too_big = false;
        snprintf(url, sizeof(url), "%s%s", c->endpoints[i], path);
        curl_easy_reset(c->curl);
        (void) curl_easy_setopt(c->curl, CURLOPT_URL, url);
        (void) curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, body);
        (void) curl_easy_setopt(c->curl, CURLOPT_PROTOCOLS_STR, "http,https");
        (void) curl_easy_setopt(c->curl, CURLOPT_NOSIGNAL, 1L);
        (void) curl_easy_setopt(c->curl, CURLOPT_CONNECTTIMEOUT_MS, (long) MIN(c->opts.timeout_ms, 1000u));
        (void) curl_easy_setopt(c->curl, CURLOPT_TIMEOUT_MS, (long) c->opts.timeout_ms);
        (void) curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, on_body);
        (void) curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, c);
        if (c->opts.cacert)
                (void) curl_easy_setopt(c->curl, CURLOPT_CAINFO, c->opts.cacert);
        if (c->opts.cert) {
                (void) curl_easy_setopt(c->curl, CURLOPT_SSLCERT, c->opts.cert);
                (void) curl_easy_setopt(c->curl, CURLOPT_SSLKEY, c->opts.key);
        }
        headers = curl_slist_append(headers, "Content-Type: application/json");
        if (headers && c->token) {
                snprintf(auth, sizeof(auth), "Authorization: %s", c->token);
                headers = curl_slist_append(headers, auth);
                explicit_bzero(auth, sizeof(auth));
        }
        if (!headers)
                return -ENOMEM;
        (void) curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, headers);
        cc = curl_easy_perform(c->curl);
        curl_slist_free_all(headers);
        if (cc != CURLE_OK) {
                snprintf(c->error, sizeof(c->error), "%s: %s", c->endpoints[i],
                         c->too_big ? "the answer is too long" : curl_easy_strerror(cc));
                r = c->too_big ? -EMSGSIZE : -EHOSTUNREACH;
        } else
                (void) curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, ret_status);
        return r;
}

/* The message of an error answer ({"error": s} or {"message": s}). */
static void remote_error(EtcdClient *c, struct json_object *o, long status) {
        struct json_object *m = NULL;
        const char *s = NULL;

        if (o && (json_object_object_get_ex(o, "message", &m) || json_object_object_get_ex(o, "error", &m)) &&
            json_object_is_type(m, json_type_string))
                s = json_object_get_string(m);
        snprintf(c->error, sizeof(c->error), "%s: HTTP %ld: %.160s", c->endpoints[c->current], status,
                 s ?: "no message");
}

static int authenticate(EtcdClient *c);

/* POST body to path, endpoints in turn; *ret the parsed answer object. */
static int call(EtcdClient *c, const char *path, struct json_object *req, struct json_object **ret) {
        const char *body = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
        bool retried_auth = false;
        int r = -EHOSTUNREACH;

        if (!body)
                return -ENOMEM;
        for (unsigned k = 0; k < c->n_endpoints; k++) {
                unsigned i = (c->current + k) % c->n_endpoints;
                struct json_object *o;
                long status = 0;

                r = post_once(c, i, path, body, &status);
                if (r == -EMSGSIZE || r == -ENOMEM)
                        return r;
                if (r < 0 || status >= 500) {
                        if (r >= 0)
                                snprintf(c->error, sizeof(c->error), "%s: HTTP %ld", c->endpoints[i], status);
                        r = -EHOSTUNREACH;
                        continue;
                }
                c->current = i;
                o = c->body ? json_tokener_parse(c->body) : NULL;
                if (!o || !json_object_is_type(o, json_type_object)) {
                        json_object_put(o);
                        snprintf(c->error, sizeof(c->error), "%s: the answer is not a JSON object", c->endpoints[i]);
                        return -EBADMSG;
                }
                if (status == 401 && c->opts.user && !retried_auth) {
                        /* the token expired: once more with a new one */
                        json_object_put(o);
                        retried_auth = true;
                        r = authenticate(c);
                        if (r < 0)
                                return r;
                        k--;
                        continue;
                }
                if (status != 200 || json_object_object_get_ex(o, "error", NULL)) {
                        remote_error(c, o, status);
                        json_object_put(o);
                        return -EREMOTEIO;
                }
                *ret = o;
                return 0;
        }
        return r;
}

static int authenticate(EtcdClient *c) {
        _cleanup_(json_object_putp) struct json_object *req = json_object_new_object(), *o = NULL;
        struct json_object *t;
        char *saved = c->token;
        int r;

        if (!req)
                return -ENOMEM;
        json_object_object_add(req, "name", json_object_new_string(c->opts.user));
        json_object_object_add(req, "password", json_object_new_string(c->opts.password ?: ""));
        c->token = NULL;
        r = call(c, "/v3/auth/authenticate", req, &o);
        free(saved);
        if (r < 0)
                return r;
        if (!json_object_object_get_ex(o, "token", &t) || !json_object_is_type(t, json_type_string) ||
            json_object_get_string_len(t) == 0 || json_object_get_string_len(t) > 512) {
                snprintf(c->error, sizeof(c->error), "authentication answered no token");
                return -EBADMSG;
        }
        c->token = strdup(json_object_get_string(t));
        return c->token ? 0 : -ENOMEM;
}

/* call() after authenticating once where a user is set. */
static int request(EtcdClient *c, const char *path, struct json_object *req, struct json_object **ret) {
        int r;

        if (c->opts.user && !c->token) {
                r = authenticate(c);
                if (r < 0)
                        return r;
        }
        return call(c, path, req, ret);
}

/* An int64 that the gateway writes as a string (or, from some versions, a number). */
static int get_i64(struct json_object *o, const char *key, int64_t *ret) {
        struct json_object *v;
        const char *s;
        char *end;

        if (!json_object_object_get_ex(o, key, &v))
                return -ENOENT;
        if (json_object_is_type(v, json_type_int)) {
                *ret = json_object_get_int64(v);
                return 0;
        }
        if (!json_object_is_type(v, json_type_string))
                return -EBADMSG;
        s = json_object_get_string(v);
        errno = 0;
        *ret = strtoll(s, &end, 10);
        return errno || end == s || *end ? -EBADMSG : 0;
}

static struct json_object *new_i64_string(int64_t v) {
        char buf[24];

        snprintf(buf, sizeof(buf), "%" PRId64, v);
        return json_object_new_string(buf);
}

/* s[0..n) in base64 as a new JSON string. */
static struct json_object *new_b64(const void *s, size_t n) {
        _cleanup_free_ char *b = malloc(BASE64_ENCODED_SIZE(n) + 1);

        if (!b)
                return NULL;
        b[base64_encode(s, n, b)] = 0;
        return json_object_new_string(b);
}

int etcd_lease_grant(EtcdClient *c, unsigned ttl_secs, int64_t *ret_id) {
        _cleanup_(json_object_putp) struct json_object *req = json_object_new_object(), *o = NULL;
        int r;

        if (!req)
                return -ENOMEM;
        json_object_object_add(req, "TTL", json_object_new_int64(ttl_secs));
        r = request(c, "/v3/lease/grant", req, &o);
        if (r < 0)
                return r;
        if (get_i64(o, "ID", ret_id) < 0 || *ret_id == 0) {
                snprintf(c->error, sizeof(c->error), "the lease grant answered no ID");
                return -EBADMSG;
        }
        return 0;
}

int etcd_lease_keepalive(EtcdClient *c, int64_t id, int64_t *ret_ttl) {
        _cleanup_(json_object_putp) struct json_object *req = json_object_new_object(), *o = NULL;
        struct json_object *res;
        int r;

        if (!req)
                return -ENOMEM;
        json_object_object_add(req, "ID", new_i64_string(id));
        r = request(c, "/v3/lease/keepalive", req, &o);
        if (r < 0)
                return r;
        /* a stream's one message: {"result": {"ID", "TTL"}}; no TTL: gone */
        if (!json_object_object_get_ex(o, "result", &res) || !json_object_is_type(res, json_type_object)) {
                snprintf(c->error, sizeof(c->error), "the keep-alive answered no result");
                return -EBADMSG;
        }
        r = get_i64(res, "TTL", ret_ttl);
        if (r == -ENOENT)
                *ret_ttl = 0;
        else if (r < 0)
                return r;
        return 0;
}

int etcd_lease_revoke(EtcdClient *c, int64_t id) {
        _cleanup_(json_object_putp) struct json_object *req = json_object_new_object(), *o = NULL;

        if (!req)
                return -ENOMEM;
        json_object_object_add(req, "ID", new_i64_string(id));
        return request(c, "/v3/lease/revoke", req, &o);
}

int etcd_put(EtcdClient *c, const char *key, const void *value, size_t len, int64_t lease) {
        _cleanup_(json_object_putp) struct json_object *req = json_object_new_object(), *o = NULL;

        if (strlen(key) > ETCD_KEY_MAX || len > ETCD_VALUE_MAX)
                return -E2BIG;
        if (!req)
                return -ENOMEM;
        json_object_object_add(req, "key", new_b64(key, strlen(key)));
        json_object_object_add(req, "value", new_b64(value, len));
        if (lease != 0)
                json_object_object_add(req, "lease", new_i64_string(lease));
        return request(c, "/v3/kv/put", req, &o);
}

int etcd_delete(EtcdClient *c, const char *key) {
        _cleanup_(json_object_putp) struct json_object *req = json_object_new_object(), *o = NULL;

        if (!req)
                return -ENOMEM;
        json_object_object_add(req, "key", new_b64(key, strlen(key)));
        return request(c, "/v3/kv/deleterange", req, &o);
}

void etcd_kvs_free(EtcdKv *kvs, size_t n) {
        for (size_t i = 0; kvs && i < n; i++) {
                free(kvs[i].key);
                free(kvs[i].value);
        }
        free(kvs);
}

/* A base64 string of the answer into a new NUL-terminated buffer. */
static int decode_b64(struct json_object *o, const char *field, size_t max, char **ret, size_t *ret_len) {
        struct json_object *v;
        _cleanup_free_ char *b = NULL;
        size_t n, len;
        int r;

        if (!json_object_object_get_ex(o, field, &v)) {
                /* the gateway leaves out an empty value */
                *ret = strdup("");
                *ret_len = 0;
                return *ret ? 0 : -ENOMEM;
        }
        if (!json_object_is_type(v, json_type_string))
                return -EBADMSG;
        n = (size_t) json_object_get_string_len(v);
        r = base64_decoded_length(json_object_get_string(v), n, &len);
        if (r < 0)
                return -EBADMSG;
        if (len > max)
                return -E2BIG;
        b = malloc(len + 1);
        if (!b)
                return -ENOMEM;
        r = base64_decode(json_object_get_string(v), n, b, len, &len);
        if (r < 0)
                return -EBADMSG;
        b[len] = 0;
        *ret = TAKE_PTR(b);
        *ret_len = len;
        return 0;
}

int etcd_range_prefix(EtcdClient *c, const char *prefix, size_t max, EtcdKv **ret, size_t *ret_n) {
        _cleanup_(json_object_putp) struct json_object *req = json_object_new_object(), *o = NULL;
        _cleanup_free_ char *end = NULL;
        struct json_object *kvs;
        EtcdKv *out = NULL;
        size_t n, plen = strlen(prefix);
        int r;

        if (plen == 0 || plen > ETCD_KEY_MAX || (unsigned char) prefix[plen - 1] == 0xff)
                return -EINVAL;
        if (!req)
                return -ENOMEM;
        end = strdup(prefix);
        if (!end)
                return -ENOMEM;
        end[plen - 1]++; /* every key that starts with prefix: [prefix, prefix with its last byte + 1) */
        json_object_object_add(req, "key", new_b64(prefix, plen));
        json_object_object_add(req, "range_end", new_b64(end, plen));
        json_object_object_add(req, "limit", new_i64_string((int64_t) max + 1));
        r = request(c, "/v3/kv/range", req, &o);
        if (r < 0)
                return r;
        if (!json_object_object_get_ex(o, "kvs", &kvs)) {
                *ret = NULL;
                *ret_n = 0;
                return 0;
        }
        if (!json_object_is_type(kvs, json_type_array))
                return -EBADMSG;
        n = json_object_array_length(kvs);
        if (n > max)
                return -E2BIG;
        out = calloc(MAX(n, 1u), sizeof(EtcdKv));
        if (!out)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct json_object *kv = json_object_array_get_idx(kvs, i);
                size_t klen;

                if (!json_object_is_type(kv, json_type_object) ||
                    (r = decode_b64(kv, "key", ETCD_KEY_MAX, &out[i].key, &klen)) < 0 ||
                    (r = decode_b64(kv, "value", ETCD_VALUE_MAX, &out[i].value, &out[i].len)) < 0) {
                        etcd_kvs_free(out, n);
                        return r < 0 ? r : -EBADMSG;
                }
                if (get_i64(kv, "lease", &out[i].lease) < 0)
                        out[i].lease = 0;
        }
        *ret = out;
        *ret_n = n;
        return 0;
}

int etcd_create(EtcdClient *c, const char *key, const void *value, size_t len, int64_t lease, bool *ret_created) {
        _cleanup_(json_object_putp) struct json_object *req = json_object_new_object(), *o = NULL;
        struct json_object *cmp = json_object_new_object(), *put = json_object_new_object(),
                           *op = json_object_new_object(), *cmps = json_object_new_array(),
                           *ops = json_object_new_array(), *ok;
        int r;

        if (strlen(key) > ETCD_KEY_MAX || len > ETCD_VALUE_MAX)
                r = -E2BIG;
        else if (!req || !cmp || !put || !op || !cmps || !ops)
                r = -ENOMEM;
        else
                r = 0;
        if (r < 0) {
                json_object_put(cmp);
                json_object_put(put);
                json_object_put(op);
                json_object_put(cmps);
                json_object_put(ops);
                return r;
        }
        /* only if the key does not exist: its create revision is 0 */
        json_object_object_add(cmp, "key", new_b64(key, strlen(key)));
        json_object_object_add(cmp, "target", json_object_new_string("CREATE"));
        json_object_object_add(cmp, "result", json_object_new_string("EQUAL"));
        json_object_object_add(cmp, "create_revision", new_i64_string(0));
        json_object_array_add(cmps, cmp);
        json_object_object_add(put, "key", new_b64(key, strlen(key)));
        json_object_object_add(put, "value", new_b64(value, len));
        if (lease != 0)
                json_object_object_add(put, "lease", new_i64_string(lease));
        json_object_object_add(op, "request_put", put);
        json_object_array_add(ops, op);
        json_object_object_add(req, "compare", cmps);
        json_object_object_add(req, "success", ops);
        r = request(c, "/v3/kv/txn", req, &o);
        if (r < 0)
                return r;
        /* the gateway leaves out "succeeded" when it is false */
        *ret_created = json_object_object_get_ex(o, "succeeded", &ok) && json_object_get_boolean(ok);
        return 0;
}
