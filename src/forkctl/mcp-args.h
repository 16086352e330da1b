/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The arguments of forkctl mcp's tools, described once in tables of struct
 * mcp_param: mcp_params_schema() turns a table into the tool's inputSchema
 * (JSON Schema), mcp_args_parse() checks a call's arguments against the same
 * table (types, ranges, lengths, required and unknown keys). */

#include <json-c/json.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "macro.h"

#define MCP_NAME_PATTERN "^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$"
#define MCP_CODE_LENGTH_MAX (256 * 1024)  /* forkd's CODE_MAX */
#define MCP_EXEC_ARGS_MAX 1024            /* forkd's EXEC_ARGS_MAX */
#define MCP_PATH_LENGTH_MAX (PATH_MAX - 1)

enum mcp_param_type {
        MCP_NAME,         /* a snapshot tag or sandbox id (MCP_NAME_PATTERN) */
        MCP_PATH,         /* an absolute path on the host */
        MCP_TEXT,         /* a string of min..max characters */
        MCP_ENUM,         /* one of values */
        MCP_INTEGER,      /* min..max, stored as uint32_t */
        MCP_BOOLEAN,      /* stored as bool */
        MCP_STRING_ARRAY, /* min..max strings, stored as the borrowed array */
        MCP_NUMBER,       /* a number above min, stored as double (0: not given) */
        MCP_RATE,         /* {"bandwidth", "ops", "burst"}, stored as the borrowed object */
};

/* What the arguments are parsed into: one struct for every tool, each tool's
 * table says which fields it uses. Strings and the array are borrowed from
 * the request. */
struct mcp_args {
        const char *tag, *kernel, *rootfs, *snapshot_tag, *sandbox_id, *code, *mode;
        struct json_object *argv, *disk_rate, *net_rate;
        double cpu_limit;
        uint32_t n, mem_mib, boot_wait_secs, timeout_secs, memory_limit_mib;
        bool per_child_netns, live_fork, wait;
};

struct mcp_param {
        const char *name;
        enum mcp_param_type type;
        bool required;
        int64_t min, max;           /* integers: the range; text: characters; arrays: items */
        bool has_default;
        int64_t def;                /* integer or boolean default (the schema's "default") */
        const char *def_str;        /* MCP_ENUM default */
        const char *const *values;  /* MCP_ENUM, NULL-terminated */
        size_t offset;              /* in struct mcp_args */
        const char *description;
};

#define ARG(f) offsetof(struct mcp_args, f)
char *mcp_asprintf(const char *fmt, ...) _printf_(1, 2);

/* json_object_object_add() that takes v (NULL: -ENOMEM) in any case. */
int mcp_json_add(struct json_object *o, const char *key, struct json_object *v);

/* The inputSchema of a tool taking params: an object schema with properties,
 * required and additionalProperties false. */
int mcp_params_schema(const struct mcp_param *params, struct json_object **ret);

/* Checks arguments (an object, or NULL for none) against params and fills
 * *ret, defaults first; on failure *ret is untouched and *ret_error says
 * what is wrong, naming the tool. */
int mcp_args_parse(const char *tool, const struct mcp_param *params, struct json_object *arguments,
                   struct mcp_args *ret, char **ret_error);
