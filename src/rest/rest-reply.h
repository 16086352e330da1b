/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* A request's answer (rest-reply.c). Each returns 0 (or a negative errno if
 * even the reply failed). */

#include <json-c/json.h>
#include <stdint.h>
#include <sys/types.h>
#include <systemd/sd-bus.h>

#include "rest-request.h"

int rest_reply_json(RestRequest *req, unsigned status, struct json_object *body);
int rest_reply_raw(RestRequest *req, unsigned status, const char *content_type, const char *body, size_t len);
int rest_reply_error(RestRequest *req, unsigned status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int rest_reply_no_content(RestRequest *req);
/* size bytes of fd from offset 0 (fd is taken, also on failure). */
int rest_reply_fd(RestRequest *req, unsigned status, const char *content_type, int fd, uint64_t size);
/* Turn a D-Bus error reply into the mapped status and {"error": message}. */
int rest_reply_bus_error(RestRequest *req, const sd_bus_error *e, unsigned override_exists_status);

/* Streamed replies: MHD pulls the body from read(req, buf, max): > 0 bytes,
 * REST_STREAM_AGAIN (nothing now: the connection is suspended until
 * rest_stream_resume()), REST_STREAM_END, or REST_STREAM_ERROR (the
 * connection is cut, so the client sees a truncated body). */
#define REST_STREAM_AGAIN 0
#define REST_STREAM_END (-1)
#define REST_STREAM_ERROR (-2)
typedef ssize_t (*rest_stream_read_func)(RestRequest *req, char *buf, size_t max);
int rest_reply_stream(RestRequest *req, unsigned status, const char *content_type, rest_stream_read_func read);
void rest_stream_resume(RestRequest *req);
