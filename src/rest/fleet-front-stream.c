/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A node's streamed answer through a front end (a process's output with
 * follow=true, an exec with stream: true): a thread of its own reads it from
 * the node with libcurl into a pipe, and the client's response reads the
 * pipe as it fills. The client's status and Content-Type are the node's, known
 * once its headers are in. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fleet-front-internal.h"
#include "io-util.h"
#include "macro.h"

#define STREAM_BLOCK (64u * 1024u)

struct FrontStream {
        atomic_int refs;        /* the request's and the thread's */
        atomic_bool cancelled;  /* the client went: the thread stops */
        int pipe[2];
        char url[4096];
        char *body;
        size_t len;
        char content_type[128], authorization[1024], answer_type[128], pid[24];
        bool has_auth;
        CURL *curl;             /* the thread's */

        pthread_mutex_t lock;   /* what follows */
        pthread_cond_t changed;
        bool headers_in, done;
        long status;
        char error[256];
};

static void stream_unref(FrontStream *s) {
        if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
                return;
        safe_close(s->pipe[0]);
        safe_close(s->pipe[1]);
        explicit_bzero(s->authorization, sizeof(s->authorization));
        free(s->body);
        pthread_cond_destroy(&s->changed);
        pthread_mutex_destroy(&s->lock);
        free(s);
}

static void mark(FrontStream *s, bool headers, bool done) {
        pthread_mutex_lock(&s->lock);
        s->headers_in |= headers;
        s->done |= done;
        pthread_cond_broadcast(&s->changed);
        pthread_mutex_unlock(&s->lock);
}

static void headers_in(FrontStream *s) {
        long status = 0;

        (void) curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &status);
        pthread_mutex_lock(&s->lock);
        s->status = status;
        pthread_mutex_unlock(&s->lock);
        mark(s, true, false);
}

static size_t on_header(char *data, size_t size, size_t n, void *userdata) {
        FrontStream *s = userdata;
        size_t k = size * n;

        if ((k == 2 && data[0] == '\r' && data[1] == '\n') || (k == 1 && data[0] == '\n')) {
                headers_in(s); /* the blank line after the headers */
                return k;
        }
        if (k >= 18 && strncasecmp(data, "Forkd-Process-Pid:", 18) == 0)
                snprintf(s->pid, sizeof(s->pid), "%.*s", (int) MIN(k - 18, sizeof(s->pid) - 1), data + 18);
        if (k >= 13 && strncasecmp(data, "Content-Type:", 13) == 0)
                snprintf(s->answer_type, sizeof(s->answer_type), "%.*s",
                         (int) MIN(k - 13, sizeof(s->answer_type) - 1), data + 13);
        return k;
}

static size_t on_body(char *data, size_t size, size_t n, void *userdata) {
        FrontStream *s = userdata;
        size_t k = size * n;

        for (size_t done = 0; done < k;) {
                ssize_t w = write(s->pipe[1], data + done, k - done);

                if (w < 0 && errno == EINTR)
                        continue;
                if (w <= 0)
                        return 0; /* the client went: curl stops */
                done += (size_t) w;
        }
        return k;
}

static int on_progress(void *userdata, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d) {
        FrontStream *s = userdata;

        return atomic_load(&s->cancelled) ? 1 : 0;
}

/* Trim a header value copied with its leading blanks and CR LF. */
static void trim(char *v) {
        size_t n, skip = strspn(v, " \t");

        memmove(v, v + skip, strlen(v + skip) + 1);
        n = strcspn(v, "\r\n");
        v[n] = 0;
}

static void *stream_thread(void *userdata) {
        FrontStream *s = userdata;
        struct curl_slist *headers = NULL;
        char h[1200];
        CURL *c = curl_easy_init();
        CURLcode cc = CURLE_OUT_OF_MEMORY;
        long status = 0;

        s->curl = c;
        if (c) {
                (void) curl_easy_setopt(c, CURLOPT_URL, s->url);
                (void) curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
                (void) curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
                (void) curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
                (void) curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
                (void) curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 3600L * 1000L);
                (void) curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
                (void) curl_easy_setopt(c, CURLOPT_WRITEDATA, s);
                (void) curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
                (void) curl_easy_setopt(c, CURLOPT_HEADERDATA, s);
                (void) curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
                (void) curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
                (void) curl_easy_setopt(c, CURLOPT_XFERINFODATA, s);
                if (s->body) {
                        (void) curl_easy_setopt(c, CURLOPT_POSTFIELDS, s->body);
                        (void) curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) s->len);
                        snprintf(h, sizeof(h), "Content-Type: %s", s->content_type[0] ? s->content_type
                                                                                   : "application/json");
                        headers = curl_slist_append(headers, h);
                }
                headers = curl_slist_append(headers, "Expect:");
                if (s->has_auth) {
                        snprintf(h, sizeof(h), "Authorization: %s", s->authorization);
                        headers = curl_slist_append(headers, h);
                        explicit_bzero(h, sizeof(h));
                }
                (void) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
                cc = curl_easy_perform(c);
                (void) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
                curl_slist_free_all(headers);
                curl_easy_cleanup(c);
        }
        pthread_mutex_lock(&s->lock);
        s->status = status;
        if (cc != CURLE_OK)
                snprintf(s->error, sizeof(s->error), "%s", curl_easy_strerror(cc));
        pthread_mutex_unlock(&s->lock);
        s->pipe[1] = safe_close(s->pipe[1]); /* the reader sees the end */
        mark(s, true, true);
        stream_unref(s);
        return NULL;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
        FrontStream *s = cls;
        ssize_t k;

        do
                k = read(s->pipe[0], buf, max);
        while (k < 0 && errno == EINTR);
        if (k > 0)
                return k;
        if (k < 0)
                return MHD_CONTENT_READER_END_WITH_ERROR;
        pthread_mutex_lock(&s->lock);
        k = s->error[0] ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_unlock(&s->lock);
        return k;
}

/* The client's side is done: the read end closes now, so that a thread blocked
 * writing into a full pipe fails (EPIPE) rather than waiting for a reader that
 * is gone, and one waiting for the node stops at its next progress call. */
static void stream_free(void *cls) {
        FrontStream *s = cls;

        atomic_store(&s->cancelled, true);
        s->pipe[0] = safe_close(s->pipe[0]);
        stream_unref(s);
}

int front_stream_start(FrontRequest *r, const FleetRecord *node, const char *path, const char *body, size_t len) {
        FrontStream *s;
        pthread_t t;
        int k;

        s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        atomic_init(&s->refs, 1);
        s->pipe[0] = s->pipe[1] = -1;
        pthread_mutex_init(&s->lock, NULL);
        pthread_cond_init(&s->changed, NULL);
        snprintf(s->url, sizeof(s->url), "%s%s", node->url, path);
        snprintf(s->content_type, sizeof(s->content_type), "%s", r->content_type);
        if (r->authorization && strlen(r->authorization) < sizeof(s->authorization)) {
                snprintf(s->authorization, sizeof(s->authorization), "%s", r->authorization);
                s->has_auth = true;
        }
        if (body) {
                s->body = malloc(len + 1);
                if (!s->body) {
                        stream_unref(s);
                        return -ENOMEM;
                }
                memcpy(s->body, body, len);
                s->len = len;
        }
        if (pipe2(s->pipe, O_CLOEXEC) < 0) {
                k = -errno;
                stream_unref(s);
                return k;
        }
        atomic_fetch_add(&s->refs, 1); /* the thread's */
        k = -pthread_create(&t, NULL, stream_thread, s);
        if (k < 0) {
                atomic_fetch_sub(&s->refs, 1);
                stream_unref(s);
                return k;
        }
        pthread_detach(t);
        r->asked_node = true;

        /* the status first: once the node's headers are in, or it failed */
        pthread_mutex_lock(&s->lock);
        while (!s->headers_in)
                pthread_cond_wait(&s->changed, &s->lock);
        if (s->done && s->status == 0) {
                char err[256];

                snprintf(err, sizeof(err), "%s", s->error);
                pthread_mutex_unlock(&s->lock);
                stream_free(s);
                atomic_fetch_add(&r->front->node_failures, 1);
                return front_answer_error(r, 502, "node %s did not answer: %s", node->name, err);
        }
        pthread_mutex_unlock(&s->lock);
        trim(s->answer_type);
        trim(s->pid);
        if (s->pid[0] && strspn(s->pid, "0123456789") == strlen(s->pid))
                front_add_header(r, "Forkd-Process-Pid", "%s", s->pid);
        r->stream = s;
        r->answered = true;
        snprintf(r->answer_type, sizeof(r->answer_type), "%s", s->answer_type[0] ? s->answer_type : "text/plain");
        return 0;
}

/* The response of a streamed answer: its status, then the pipe as it fills. */
struct MHD_Response *front_stream_response(FrontRequest *r, unsigned *ret_status) {
        FrontStream *s = TAKE_PTR(r->stream);
        struct MHD_Response *resp;
        long status;

        pthread_mutex_lock(&s->lock);
        status = s->status;
        pthread_mutex_unlock(&s->lock);
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read, s, stream_free);
        if (!resp) {
                stream_free(s);
                return NULL;
        }
        *ret_status = status >= 100 && status <= 599 ? (unsigned) status : 200;
        return resp;
}

void front_stream_drop(FrontRequest *r) {
        if (r->stream)
                stream_free(TAKE_PTR(r->stream));
}
