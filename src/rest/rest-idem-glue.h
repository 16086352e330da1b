/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Idempotency-Key between the HTTP side and the store (rest-idem.h): which
 * request gets which answer (rest-idem-glue.c). */

#include <stddef.h>

#include "rest-request.h"

/* Headers are in, on a route that creates something: take its key, if any,
 * and start the request's hash. Returns 0, or a queued 400's result. */
int rest_request_idem_begin(RestRequest *req, const char *url, const char *method);
/* The whole request is in. Returns 1 when the route is to run (the key is
 * new and now this request's), 0 when it was answered or waits, or the
 * failed reply's negative errno. */
int rest_request_idem_claim(RestRequest *req);
/* Every answer passes here before it goes to MHD. body NULL: an answer that
 * cannot be kept (a file, a stream), of len bytes. */
void rest_request_idem_settle(RestRequest *req, unsigned status, const char *content_type, const char *body, size_t len);
/* The key's first request ends without an answer (its connection failed). */
void rest_request_idem_drop(RestRequest *req);
