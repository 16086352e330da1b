/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* What forkd and the guest agent agree on about the agent's TCP endpoint
 * ("compatibility mode", forkd's REST API v1 agent): a Linux guest booted with
 * AGENT_TCP_CMDLINE_SWITCH on its kernel command line also answers forkd's
 * JSON-line agent protocol (ping, exec, eval; agent/agent-tcp.h) on TCP port
 * AGENT_TCP_PORT of its NIC's address, without authentication. forkd adds the
 * switch for snapshots created with agent_tcp (snapshot.json "agent_tcp") and
 * reports <inside address>:AGENT_TCP_PORT as such a sandbox's guest_addr. */

#define AGENT_TCP_PORT 8888u /* forkd's agent port */
#define AGENT_TCP_CMDLINE_SWITCH "forkd.agent_tcp=1"
