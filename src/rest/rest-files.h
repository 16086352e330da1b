/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Our REST extension for files in a sandbox (E2B's files.write/files.read):
 *   POST /v1/sandboxes/:id/files/write  {"path", "data_b64", "mode"?} -> 200 {"path", "size"}
 *   POST /v1/sandboxes/:id/files/read   {"path"}                      -> 200 {"path", "data_b64", "size"}
 * over forkd's WriteFile and ReadFile (rest-files.c). */

#include "rest-request.h"

int rest_route_sandbox_files_write(RestRequest *req);
int rest_route_sandbox_files_read(RestRequest *req);
