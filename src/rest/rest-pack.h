/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Our REST extension for snapshot bundles (forkd's snapshot pack and unpack):
 *   GET  /v1/snapshots/:tag/pack   200 application/zstd, the bundle of the tag's chain
 *   POST /v1/snapshots/unpack      the bundle as the body (?tag=NEW for one snapshot);
 *                                  201 [SnapshotInfo, ...], root first
 *   POST /v1/snapshots/:tag/push   {"ref"}: PushSnapshot to an OCI registry; 200 {digest,
 *                                  bytes_sent, blobs_sent, links}
 *   POST /v1/snapshots/pull        {"ref", "tag"?}: PullSnapshot; 201 [SnapshotInfo, ...]
 * pack streams from a pipe that PackSnapshot writes; unpack passes the body,
 * in a temporary file (rest_request_body_fd()), to UnpackSnapshot. */

#include <stdint.h>

#include "rest-request.h"

/* Bundles (POST /v1/snapshots/unpack): the body limit, in the route table. */
#define REST_BUNDLE_MAX (UINT64_C(1) << 30)

int rest_route_snapshot_pack(RestRequest *req);
/* POST /v1/snapshots/%: only "unpack" and "pull" are routes. */
int rest_route_snapshot_post(RestRequest *req);
int rest_route_snapshot_push(RestRequest *req);
