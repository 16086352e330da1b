/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * forkctl mcp: a Model Context Protocol server on stdin/stdout.
 *
 * The stdio transport: one JSON-RPC 2.0 message a line (UTF-8, no embedded
 * newline), requests and notifications in, responses out. Nothing but
 * protocol messages goes to stdout; logs go to stderr. The tools (mcp-tools.c)
 * call forkd over D-Bus as the user who runs us, so polkit decides.
 */

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <systemd/sd-bus.h>

/* The longest message (a line, without its newline) we read; longer ones are
 * answered with an error and skipped. Memory stays within about this. */
#define MCP_LINE_MAX (4u * 1024u * 1024u)
#define MCP_JSON_DEPTH_MAX 64
/* At most this many JSON values a message (an exec's 1024 arguments fit), so
 * that parsing one stays within tens of MiB. */
#define MCP_JSON_VALUES_MAX 65536u

/* JSON-RPC 2.0 error codes */
#define JSONRPC_PARSE_ERROR (-32700)
#define JSONRPC_INVALID_REQUEST (-32600)
#define JSONRPC_METHOD_NOT_FOUND (-32601)
#define JSONRPC_INVALID_PARAMS (-32602)
#define JSONRPC_INTERNAL_ERROR (-32603)
/* Not in JSON-RPC itself; LSP's ServerNotInitialized, as MCP servers use it. */
#define JSONRPC_NOT_INITIALIZED (-32002)

/* How many bytes of s to quote in a message: at most max, cut at a UTF-8
 * character boundary (s is valid UTF-8), so that the message stays valid. */
static inline int mcp_quote_len(const char *s, size_t max) {
        size_t n = strlen(s);

        if (n <= max)
                return (int) n;
        while (max > 0 && ((unsigned char) s[max] & 0xc0) == 0x80)
                max--;
        return (int) max;
}

struct mcp_server {
        const char *bus_address; /* NULL: the system bus */
        sd_bus *bus;             /* connected on the first tool call that needs it */
        bool initialized;        /* initialize has been answered */
        const char *protocol_version;
};

void mcp_server_done(struct mcp_server *s);

/* The bus, (re)connected when needed. Negative errno on failure. */
int mcp_server_bus(struct mcp_server *s, sd_bus **ret);

/* Handles one message (a line without its newline). *ret_reply is the message
 * to send back, or NULL when there is none (a notification). Returns a
 * negative errno only for out-of-memory; every other problem is a reply. */
int mcp_server_handle(struct mcp_server *s, const char *line, size_t len, struct json_object **ret_reply);

/* Reads messages from in_fd and writes the replies to out_fd until EOF.
 * 0 at EOF, a negative errno when reading or writing fails. */
int mcp_serve(struct mcp_server *s, int in_fd, int out_fd);
