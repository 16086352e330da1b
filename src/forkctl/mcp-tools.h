/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The tools of forkctl mcp: their JSON Schemas (generated from the same
 * tables that check the arguments), and their calls to forkd. */

#include <json-c/json.h>

struct mcp_server;

/* The "tools" array of a tools/list result. */
int mcp_tools_list(struct json_object **ret);

/* Is there a tool of this name? */
bool mcp_tool_exists(const char *name);

/* Runs the tool name with arguments (an object, or NULL for none) and sets
 * *ret to its CallToolResult: a text content item with the JSON result and
 * structuredContent, or isError true and a text item saying what went wrong
 * (bad arguments, forkd's or polkit's refusal, a guest error). -ENOENT for an
 * unknown tool (nothing done), -ENOMEM; else 0. */
int mcp_tools_call(struct mcp_server *s, const char *name, struct json_object *arguments,
                   struct json_object **ret);
