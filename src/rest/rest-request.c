/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* What a route handler sees of its request: the path's parameter, the body
 * (in memory, or in a file for a route with a body limit of its own), the
 * query, the strict JSON parser, route data, and waiting for an answer. */

#include <fcntl.h>
#include <microhttpd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "json-util.h"
#include "macro.h"
#include "rest-reply.h"
#include "rest-request.h"
#include "rest-server-internal.h"

#define REST_JSON_DEPTH_MAX 32

void rest_request_suspended_unlink(RestRequest *req) {
        RestServer *s = req->server;

        if (req->prev)
                req->prev->next = req->next;
        else if (s->suspended == req)
                s->suspended = req->next;
        if (req->next)
                req->next->prev = req->prev;
        req->prev = req->next = NULL;
}

void rest_request_wait(RestRequest *req) {
        RestServer *s = req->server;

        req->suspended = true;
        req->next = s->suspended;
        if (s->suspended)
                s->suspended->prev = req;
        s->suspended = req;
        (void) MHD_set_connection_option(req->connection, MHD_CONNECTION_OPTION_TIMEOUT, 0);
        MHD_suspend_connection(req->connection);
}

void rest_request_set_data(RestRequest *req, void *data, void (*free_data)(void *)) {
        req->data = data;
        req->free_data = free_data;
}

void *rest_request_data(RestRequest *req) {
        return req->data;
}

/* ---------------- request accessors ---------------- */

const char *rest_request_param(RestRequest *req) {
        return req->has_param ? req->param : NULL;
}

int rest_request_body_fd(RestRequest *req) {
        if (req->body_fd < 0) {
                /* On disk where we may (a bundle may be larger than forkd-rest's MemoryMax=),
                 * else in memory. Unlinked from birth either way. */
                const char *dir = getenv("TMPDIR");

                req->body_fd = open(dir && dir[0] == '/' ? dir : "/var/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
                if (req->body_fd < 0)
                        req->body_fd = memfd_create("forkd-rest-body", MFD_CLOEXEC);
                if (req->body_fd < 0)
                        return -errno;
        }
        if (lseek(req->body_fd, 0, SEEK_SET) < 0)
                return -errno;
        return req->body_fd;
}

const char *rest_request_param2(RestRequest *req) {
        return req->has_param2 ? req->param2 : NULL;
}

const char *rest_request_body(RestRequest *req, size_t *ret_len) {
        *ret_len = req->body_len;
        return req->body ?: "";
}

const char *rest_request_query(RestRequest *req, const char *key) {
        return MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, key);
}

const char *rest_request_header(RestRequest *req, const char *name) {
        return MHD_lookup_connection_value(req->connection, MHD_HEADER_KIND, name);
}

RestServer *rest_request_server(RestRequest *req) {
        return req->server;
}

int rest_request_parse_json(RestRequest *req, bool allow_empty, struct json_object **ret) {
        const char *err = NULL;
        struct json_object *o;
        size_t i;
        int r;

        for (i = 0; i < req->body_len; i++)
                if (!strchr(" \t\r\n", req->body[i]))
                        break;
        if (i == req->body_len) {
                if (!allow_empty) {
                        (void) rest_reply_error(req, 400, "request body must be a JSON object");
                        return -EBADMSG;
                }
                o = json_object_new_object();
                if (!o)
                        return -ENOMEM;
                *ret = o;
                return 0;
        }

        r = json_parse_strict(req->body, req->body_len, req->server->body_max, REST_JSON_DEPTH_MAX, &o, &err);
        if (r < 0) {
                (void) rest_reply_error(req, r == -EMSGSIZE ? 413 : 400, "malformed JSON body: %s",
                                        err ?: "parse error");
                return r;
        }
        *ret = o;
        return 0;
}
