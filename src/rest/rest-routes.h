/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The route table of forkd-rest (rest-routes.c); rest-server.c matches a
 * request's path and method against it. */

#include <stdbool.h>
#include <stddef.h>

#include "rest-request.h"

struct rest_method {
        const char *method;     /* "GET", "POST", "DELETE" */
        int (*handler)(RestRequest *req);
        /* Non-zero: the body goes to a file (rest_request_body_fd()), at most
         * this many bytes, instead of memory and the server's body cap. */
        size_t body_fd_max;
};

typedef struct RestRoute {
        const char *pattern;    /* "/v1/snapshots/%/info": '%' matches one segment */
        bool no_auth;
        struct rest_method methods[3];
        const char *allow;      /* value of the Allow header on 405 */
} RestRoute;

extern const RestRoute rest_routes[];
extern const size_t rest_routes_count;
