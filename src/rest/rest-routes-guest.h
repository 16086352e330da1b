/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The routes into a sandbox's guest (rest-routes-guest.c). */

#include "rest-request.h"

int rest_route_sandbox_ping(RestRequest *req);
int rest_route_sandbox_exec(RestRequest *req);
int rest_route_sandbox_eval(RestRequest *req);
int rest_route_sandbox_run_code(RestRequest *req);
int rest_route_sandbox_ports(RestRequest *req);
int rest_route_sandbox_diff(RestRequest *req);
