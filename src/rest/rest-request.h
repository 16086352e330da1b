/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* What a route handler sees of its request (rest-request.c). The answers are
 * rest-reply.h, the calls to forkd rest-bus.h. */

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct RestServer RestServer;
typedef struct RestRequest RestRequest;

const char *rest_request_param(RestRequest *req);             /* the '%' segment, or NULL */
const char *rest_request_param2(RestRequest *req);            /* a second '%' segment, or NULL */
const char *rest_request_body(RestRequest *req, size_t *ret_len);
/* A method with a body_fd_max (rest-routes.h): the body in an unlinked
 * temporary file ($TMPDIR, else /var/tmp; a memfd if neither takes one), at
 * offset 0 (owned by req; an empty one if there was no body). Negative errno
 * on failure. */
int rest_request_body_fd(RestRequest *req);
const char *rest_request_query(RestRequest *req, const char *key);
const char *rest_request_header(RestRequest *req, const char *name);
RestServer *rest_request_server(RestRequest *req);

/* Parse the body as one strict JSON object. An empty body yields an empty
 * object when allow_empty. On failure a 400 has been queued and the return
 * value is negative. */
int rest_request_parse_json(RestRequest *req, bool allow_empty, struct json_object **ret);

/* Suspend the connection until a reply is queued (from an event source of
 * the route's own, or a detached call's reply). */
void rest_request_wait(RestRequest *req);
/* Route state, freed with the request. */
void rest_request_set_data(RestRequest *req, void *data, void (*free_data)(void *));
void *rest_request_data(RestRequest *req);
