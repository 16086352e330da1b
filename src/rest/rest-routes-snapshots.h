/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The snapshot routes (rest-routes-snapshots.c). */

#include "rest-request.h"

int rest_route_snapshots_create(RestRequest *req);
int rest_route_snapshots_list(RestRequest *req);
int rest_route_snapshot_delete(RestRequest *req);
int rest_route_snapshot_info(RestRequest *req);
int rest_route_snapshot_compact(RestRequest *req);
