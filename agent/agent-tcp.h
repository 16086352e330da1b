/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * forkd's JSON-line agent protocol over TCP, as a compatibility mode (off by
 * default; no authentication, as in forkd). What forkd's Python
 * Sandbox(target="host:port") sends: one connection per request, one JSON
 * object on one line, the client half-closes and reads one JSON object and a
 * newline until the agent closes. Actions ping, exec and eval are mapped onto
 * the agent's own ops; see agent/README.md.
 */

#include <stddef.h>
#include <stdint.h>

#include "agent-tcp-port.h" /* AGENT_TCP_PORT, shared with forkd */

#define AGENT_TCP_MAX_CONNECTIONS 16u                 /* more wait in the listen backlog */
#define AGENT_TCP_BACKLOG 16
#define AGENT_TCP_MAX_LINE (1024u * 1024u)            /* a request line, newline excluded */
#define AGENT_TCP_IO_TIMEOUT_USEC (30u * 1000000u)    /* for the request to come in, the reply to go out */
#define AGENT_TCP_LINGER_USEC (2u * 1000000u)         /* after the reply: read what the client still sends */

struct json_object;
struct pollfd;
typedef struct Agent Agent;
typedef struct AgentTcp AgentTcp;

/* Start listening. spec: "PORT" (all IPv4 addresses), "ADDR:PORT" (an IPv4
 * address) or "fd:N" (an inherited listening socket). Sets a->tcp. */
int agent_tcp_listen(Agent *a, const char *spec);
AgentTcp *agent_tcp_free(AgentTcp *t);

/* Loop integration: the listening socket (while fewer than the maximum of
 * connections are open) and the connections that wait for I/O. */
size_t agent_tcp_pollfds(Agent *a, struct pollfd *fds, size_t max);
void agent_tcp_io(Agent *a, const struct pollfd *fds, size_t n);
uint64_t agent_tcp_next_deadline(const Agent *a);
void agent_tcp_tick(Agent *a, uint64_t now_usec);

/* The answer to a request that a TCP connection started: agent_send_json()
 * and agent_send_error() come here while a->reply_tcp names the connection
 * (exec records it and restores it when it answers). payload is borrowed. A
 * connection that is gone drops it. */
int agent_tcp_reply(Agent *a, uint64_t conn, uint16_t type, struct json_object *payload);
