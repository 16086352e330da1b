/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* forkd-rest's D-Bus client (rest-bus.c): the connection to the bus, or to
 * forkd's direct socket once forkd has accepted it, and the routes' calls. */

#include <stdint.h>
#include <systemd/sd-bus.h>

#include "rest-request.h"

typedef int (*rest_reply_func)(RestRequest *req, sd_bus_message *reply);

/* Create a method call on org.forkd.Manager at /org/forkd/Manager, or on
 * interface/path given. Fails with a queued 503 when the bus is unreachable. */
int rest_new_manager_call(RestRequest *req, const char *member, sd_bus_message **ret);
int rest_new_call(RestRequest *req, const char *path, const char *interface, const char *member,
                  sd_bus_message **ret);
/* Send m asynchronously and suspend the connection until the reply; then
 * on_reply(req, reply) is called with an error or a method return. A 503
 * is queued instead when the cap of calls in flight is reached. */
int rest_call(RestRequest *req, sd_bus_message *m, uint64_t timeout_usec, rest_reply_func on_reply);
/* A D-Bus call that leaves the connection alone: on_reply(req, reply) may
 * come while a stream is being sent, or after rest_request_wait(). */
int rest_call_detached(RestRequest *req, sd_bus_message *m, uint64_t timeout_usec, rest_reply_func on_reply);

/* The server's: connect to the bus if it is not (again), and ask forkd for
 * its direct socket (at most every few seconds). */
int rest_bus_ensure(RestServer *s);
void rest_bus_direct_query_start(RestServer *s);
