/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The sandbox routes (rest-routes-sandboxes.c). */

#include "rest-request.h"

int rest_route_sandboxes_create(RestRequest *req);
int rest_route_sandboxes_list(RestRequest *req);
int rest_route_sandbox_get(RestRequest *req);
int rest_route_sandbox_delete(RestRequest *req);
int rest_route_sandbox_patch(RestRequest *req);
int rest_route_sandbox_merge(RestRequest *req);
int rest_route_sandbox_branch(RestRequest *req);
int rest_route_sandbox_fork(RestRequest *req);
int rest_route_sandbox_timeout(RestRequest *req);
int rest_route_sandbox_pause(RestRequest *req);
int rest_route_sandbox_resume(RestRequest *req);
