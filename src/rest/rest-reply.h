/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* A request's answer (rest-reply.c). Each returns 0 (or a negative errno if
 * even the reply failed). */

#include <json-c/json.h>
#include <stdbool.h>
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
/* A streamed answer; header (with value), when not NULL, goes with it too. */
int rest_reply_stream(RestRequest *req, unsigned status, const char *content_type, const char *header,
                      const char *value, rest_stream_read_func read);
void rest_stream_resume(RestRequest *req);

/* Output streams of processes and their terminals (rest-routes-processes.c):
 * at most REST_STREAMS_MAX at once per server. take: false when all are in
 * use (the route answers 503 "too many streams"). */
#define REST_STREAMS_MAX 64u
bool rest_stream_slot_take(RestServer *s);
void rest_stream_slot_release(RestServer *s);

/* Protocol upgrades (a WebSocket). rest_reply_upgrade() answers 101 with
 * the headers given ("Upgrade: <protocol>", and "Sec-WebSocket-Accept" when
 * accept is set); once MHD sent it, on_upgrade() gets the client's socket
 * (MHD's: never close() it, rest_upgrade_close() does), the bytes the client
 * sent after its request, and the request's data (rest_request_set_data()),
 * which it owns from then on. If the client goes before, the data is freed
 * with the request as always. on_stop(userdata): the server stops, the owner
 * must call rest_upgrade_close() at once. */
typedef struct RestUpgrade RestUpgrade;
typedef void (*rest_upgrade_func)(RestUpgrade *u, int fd, const char *extra, size_t extra_len, void *userdata);
typedef void (*rest_upgrade_stop_func)(void *userdata);
int rest_reply_upgrade(RestRequest *req, const char *protocol, const char *accept, rest_upgrade_func on_upgrade,
                       rest_upgrade_stop_func on_stop);
/* Give the socket back to MHD, which closes it; frees u. */
void rest_upgrade_close(RestUpgrade *u);
