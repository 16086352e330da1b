/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* What the route files share (rest-routes.c): body parsing with forkd's
 * error words, the sandbox id or tag of the path, D-Bus replies turned into
 * answers, and one call to org.forkd.Manager. */

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

#include "json-util.h"
#include "rest-bus.h"
#include "rest-request.h"
#include "time-util.h"

#define REST_CALL_TIMEOUT_SHORT (30 * USEC_PER_SEC)
#define REST_CALL_TIMEOUT_FORK (600 * USEC_PER_SEC)

/* json_dispatch() flags for request bodies: no JSON_REJECT_UNKNOWN. forkd's
 * own clients send fields that only some forkd versions know (prewarm,
 * hugepages, measure_diff, parent_tag, ...) and forkd ignores the ones it
 * does not know; so does forkd-rest (docs/rest-api.md, "Requests"). */
#define REST_BODY_FLAGS 0u

/* What a body's fields mean for the error a client gets back. */
struct rest_body_rules {
        const char *tag;       /* a field that holds a tag: too long or malformed gets the tag error */
        const char *tag_value; /* where the dispatch puts it, checked after parsing */
        const char *n;         /* a field that holds a count: out of range gets the count error */
        int n_max;
};

/* A 400 (or 500) for a failed json_dispatch_full() of field, with reason. */
int rest_reply_dispatch_error(RestRequest *req, int r, const char *field, const char *reason);
/* Parse the body as strict JSON into base by table and check the rules' tag.
 * Returns 1 when it parsed; otherwise the error is queued and this returns 0
 * (or the reply's negative errno). *ret_obj is the parsed body. */
int rest_parse_body(RestRequest *req, bool allow_empty, const struct json_dispatch *table, void *base,
                    const struct rest_body_rules *rules, struct json_object **ret_obj);
/* The '%' path segment if it is a valid tag or sandbox id (what names it in
 * the error); else NULL, with the 400 queued. */
const char *rest_param_or_reply(RestRequest *req, const char *what);
/* Failure to create or send a call: no reply is queued yet. */
int rest_reply_call_failed(RestRequest *req, int r);
/* 1 for a method return; for an error, its answer (exists_status: the status
 * of FORKD_ERROR_SNAPSHOT_EXISTS, 0 for the table's). */
int rest_reply_bus_result(RestRequest *req, sd_bus_message *reply, unsigned exists_status);

/* Replies of forkd answered as they are: an a{sv} as an object, an aa{sv} as
 * an array, nothing as 204. */
int rest_on_reply_dict(RestRequest *req, sd_bus_message *reply, unsigned status, unsigned exists_status);
int rest_on_reply_dict_200(RestRequest *req, sd_bus_message *reply);
int rest_on_reply_dict_201(RestRequest *req, sd_bus_message *reply);
int rest_on_reply_array_200(RestRequest *req, sd_bus_message *reply);
int rest_on_reply_array_201(RestRequest *req, sd_bus_message *reply);
int rest_on_reply_empty_204(RestRequest *req, sd_bus_message *reply);

/* Build a Manager call with the given signature and arguments, send it. */
int rest_call_manager(RestRequest *req, const char *member, uint64_t timeout, rest_reply_func cb,
                      const char *types, ...);
