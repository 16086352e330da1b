/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A front end's calls to the nodes (fleet-http.h). */
#include <curl/curl.h>
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fleet-http.h"
#include "json-util.h"
#include "macro.h"
#include "snapshot-meta.h"

typedef struct Transfer {
        const FleetCall *call;
        FleetAnswer *answer;
        CURL *curl;
        struct curl_slist *headers;
        size_t alloc, written, max;
        bool too_big, write_failed;
        off_t body_off;
} Transfer;

void fleet_answer_done(FleetAnswer *a) {
        if (!a)
                return;
        free(a->body);
        a->body = NULL;
        a->len = 0;
}

static size_t on_header(char *data, size_t size, size_t n, void *userdata) {
        Transfer *t = userdata;
        size_t k = size * n, v;
        char *colon = memchr(data, ':', k);

        if (!colon)
                return k;
        v = (size_t) (colon - data);
        if (v == strlen("Forkd-Process-Pid") && strncasecmp(data, "Forkd-Process-Pid", v) == 0) {
                const char *p = colon + 1, *end = data + k;
                size_t i = 0;

                while (p < end && *p == ' ')
                        p++;
                while (p < end && *p >= '0' && *p <= '9' && i + 1 < sizeof(t->answer->process_pid))
                        t->answer->process_pid[i++] = *p++;
                t->answer->process_pid[i] = 0;
        }
        return k;
}

static size_t on_body(char *data, size_t size, size_t n, void *userdata) {
        Transfer *t = userdata;
        size_t k = size * n;
        long status = 0;
        char *b;

        if (t->written + k > t->max) {
                t->too_big = true;
                return 0;
        }
        (void) curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
        if (t->call->answer_fd >= 0 && status >= 200 && status < 300) {
                for (size_t done = 0; done < k;) {
                        ssize_t w = write(t->call->answer_fd, data + done, k - done);

                        if (w < 0 && errno == EINTR)
                                continue;
                        if (w <= 0) {
                                t->write_failed = true;
                                return 0;
                        }
                        done += (size_t) w;
                }
                t->written += k;
                return k;
        }
        if (t->answer->len + k + 1 > t->alloc) {
                size_t want = MAX(t->alloc * 2, t->answer->len + k + 1);

                b = realloc(t->answer->body, want);
                if (!b)
                        return 0;
                t->answer->body = b;
                t->alloc = want;
        }
        memcpy(t->answer->body + t->answer->len, data, k);
        t->answer->len += k;
        t->answer->body[t->answer->len] = 0;
        t->written += k;
        return k;
}

static size_t on_read(char *buf, size_t size, size_t n, void *userdata) {
        Transfer *t = userdata;
        ssize_t r;

        do
                r = pread(t->call->body_fd, buf, size * n, t->body_off);
        while (r < 0 && errno == EINTR);
        if (r < 0)
                return CURL_READFUNC_ABORT;
        t->body_off += r;
        return (size_t) r;
}

static int setup(Transfer *t, const FleetCall *c, FleetAnswer *a) {
        char url[1024], h[1200];

        *a = (FleetAnswer) {};
        *t = (Transfer) { .call = c, .answer = a, .max = c->answer_max ?: FLEET_ANSWER_MAX };
        if ((size_t) snprintf(url, sizeof(url), "%s%s", c->base, c->path) >= sizeof(url)) {
                snprintf(a->error, sizeof(a->error), "the path is too long");
                return -E2BIG;
        }
        t->curl = curl_easy_init();
        if (!t->curl)
                return -ENOMEM;
        (void) curl_easy_setopt(t->curl, CURLOPT_URL, url);
        (void) curl_easy_setopt(t->curl, CURLOPT_CUSTOMREQUEST, c->method);
        (void) curl_easy_setopt(t->curl, CURLOPT_PROTOCOLS_STR, "http,https");
        (void) curl_easy_setopt(t->curl, CURLOPT_FOLLOWLOCATION, 0L);
        (void) curl_easy_setopt(t->curl, CURLOPT_NOSIGNAL, 1L);
        (void) curl_easy_setopt(t->curl, CURLOPT_CONNECTTIMEOUT_MS, (long) MIN(c->timeout_ms, 2000u));
        (void) curl_easy_setopt(t->curl, CURLOPT_TIMEOUT_MS, (long) c->timeout_ms);
        (void) curl_easy_setopt(t->curl, CURLOPT_WRITEFUNCTION, on_body);
        (void) curl_easy_setopt(t->curl, CURLOPT_WRITEDATA, t);
        (void) curl_easy_setopt(t->curl, CURLOPT_HEADERFUNCTION, on_header);
        (void) curl_easy_setopt(t->curl, CURLOPT_HEADERDATA, t);
        if (streq(c->method, "HEAD"))
                (void) curl_easy_setopt(t->curl, CURLOPT_NOBODY, 1L);
        if (c->body_fd >= 0) {
                (void) curl_easy_setopt(t->curl, CURLOPT_UPLOAD, 1L);
                (void) curl_easy_setopt(t->curl, CURLOPT_READFUNCTION, on_read);
                (void) curl_easy_setopt(t->curl, CURLOPT_READDATA, t);
                (void) curl_easy_setopt(t->curl, CURLOPT_INFILESIZE_LARGE, (curl_off_t) c->len);
        } else if (c->body) {
                (void) curl_easy_setopt(t->curl, CURLOPT_POSTFIELDS, c->body);
                (void) curl_easy_setopt(t->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) c->len);
        }
        /* curl's own "Expect: 100-continue" would wait a second for bodies over 1 MiB */
        t->headers = curl_slist_append(t->headers, "Expect:");
        if (c->body || c->body_fd >= 0) {
                snprintf(h, sizeof(h), "Content-Type: %s", c->content_type ?: "application/json");
                t->headers = curl_slist_append(t->headers, h);
        }
        if (c->authorization && strlen(c->authorization) < 1024) {
                snprintf(h, sizeof(h), "Authorization: %s", c->authorization);
                t->headers = curl_slist_append(t->headers, h);
                explicit_bzero(h, sizeof(h));
        }
        if (!t->headers)
                return -ENOMEM;
        (void) curl_easy_setopt(t->curl, CURLOPT_HTTPHEADER, t->headers);
        return 0;
}

/* The outcome of a done transfer into its answer; frees the handle. */
static int finish(Transfer *t, CURLcode cc) {
        FleetAnswer *a = t->answer;
        const char *ct = NULL;
        int r = 0;

        if (cc != CURLE_OK) {
                snprintf(a->error, sizeof(a->error), "%s",
                         t->too_big ? "its answer is longer than a front end takes"
                         : t->write_failed ? "cannot keep its answer"
                                           : curl_easy_strerror(cc));
                a->status = 0;
                fleet_answer_done(a);
                r = t->too_big ? -EMSGSIZE : -EHOSTUNREACH;
        } else {
                (void) curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &a->status);
                if (curl_easy_getinfo(t->curl, CURLINFO_CONTENT_TYPE, &ct) == CURLE_OK && ct)
                        snprintf(a->content_type, sizeof(a->content_type), "%s", ct);
                if (!a->body)
                        a->body = strdup("");
                if (!a->body)
                        r = -ENOMEM;
        }
        curl_slist_free_all(t->headers);
        curl_easy_cleanup(t->curl);
        t->curl = NULL;
        t->headers = NULL;
        return r;
}

int fleet_http_call(const FleetCall *call, FleetAnswer *ret) {
        Transfer t;
        int r;

        r = setup(&t, call, ret);
        if (r < 0) {
                curl_slist_free_all(t.headers);
                if (t.curl)
                        curl_easy_cleanup(t.curl);
                return r;
        }
        return finish(&t, curl_easy_perform(t.curl));
}

size_t fleet_http_call_many(const FleetCall *calls, size_t n, FleetAnswer *ret) {
        _cleanup_free_ Transfer *ts = calloc(MAX(n, 1u), sizeof(Transfer));
        CURLM *m = curl_multi_init();
        size_t answered = 0;
        int running = 0;
        CURLMsg *msg;
        int left;

        if (!ts || !m) {
                for (size_t i = 0; i < n; i++)
                        ret[i] = (FleetAnswer) { .error = "out of memory" };
                if (m)
                        curl_multi_cleanup(m);
                return 0;
        }
        for (size_t i = 0; i < n; i++) {
                if (setup(&ts[i], &calls[i], &ret[i]) < 0) {
                        curl_slist_free_all(ts[i].headers);
                        if (ts[i].curl)
                                curl_easy_cleanup(ts[i].curl);
                        ts[i].curl = NULL;
                        continue;
                }
                (void) curl_easy_setopt(ts[i].curl, CURLOPT_PRIVATE, &ts[i]);
                curl_multi_add_handle(m, ts[i].curl);
        }
        do {
                if (curl_multi_perform(m, &running) != CURLM_OK)
                        break;
                if (running > 0 && curl_multi_poll(m, NULL, 0, 1000, NULL) != CURLM_OK)
                        break;
        } while (running > 0);
        while ((msg = curl_multi_info_read(m, &left)))
                if (msg->msg == CURLMSG_DONE) {
                        Transfer *t = NULL;

                        (void) curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **) &t);
                        curl_multi_remove_handle(m, msg->easy_handle);
                        if (finish(t, msg->data.result) >= 0)
                                answered++;
                }
        for (size_t i = 0; i < n; i++)
                if (ts[i].curl) { /* never finished: the multi loop broke off */
                        curl_multi_remove_handle(m, ts[i].curl);
                        (void) finish(&ts[i], CURLE_ABORTED_BY_CALLBACK);
                }
        curl_multi_cleanup(m);
        return answered;
}

int front_parse_answer(const char *body, size_t len, struct json_object **ret) {
        struct json_tokener *t;
        struct json_object *o;
        bool whole;

        if (!body || len > FLEET_ANSWER_MAX || len > INT32_MAX || strlen(body) != len || !utf8_is_valid_n(body, len))
                return -EBADMSG;
        t = json_tokener_new_ex(64);
        if (!t)
                return -ENOMEM;
        o = json_tokener_parse_ex(t, body, (int) len);
        whole = o && json_tokener_get_error(t) == json_tokener_success && (size_t) json_tokener_get_parse_end(t) == len;
        json_tokener_free(t);
        if (!whole) {
                json_object_put(o);
                return -EBADMSG;
        }
        *ret = o;
        return 0;
}

/* A node's sandbox id as the front end names it; null for one that is no
 * forkd id (a '.' in it would name another node). */
static struct json_object *front_id(struct json_object *id, const char *node) {
        char buf[FLEET_ID_MAX + 1];
        const char *s;

        if (!json_object_is_type(id, json_type_string))
                return NULL;
        s = json_object_get_string(id);
        if (!snapshot_tag_is_valid(s) || strchr(s, '.') || strlen(node) > 63)
                return NULL;
        snprintf(buf, sizeof(buf), "%s.%s", s, node);
        return json_object_new_string(buf);
}

/* SandboxInfo (an object with "id"), an array of them, or {"children": [ids]}: ids named by node. */
void fleet_answer_rename(struct json_object *o, const char *node) {
        struct json_object *v;

        if (json_object_is_type(o, json_type_array)) {
                for (size_t i = 0; i < json_object_array_length(o); i++)
                        fleet_answer_rename(json_object_array_get_idx(o, i), node);
                return;
        }
        if (!json_object_is_type(o, json_type_object))
                return;
        if (json_object_object_get_ex(o, "id", &v)) {
                json_object_object_add(o, "id", front_id(v, node));
                json_object_object_add(o, "node", json_object_new_string(node));
        }
        if (json_object_object_get_ex(o, "children", &v) && json_object_is_type(v, json_type_array)) {
                struct json_object *a = json_object_new_array();

                for (size_t i = 0; a && i < json_object_array_length(v); i++)
                        json_object_array_add(a, front_id(json_object_array_get_idx(v, i), node));
                if (a)
                        json_object_object_add(o, "children", a);
        }
}
