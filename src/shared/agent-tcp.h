/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The guest agent's TCP endpoint (issue 14, "compatibility mode"): a Linux
 * guest booted with AGENT_TCP_CMDLINE_SWITCH on its kernel command line also
 * answers forkd's JSON-line agent protocol (ping, exec, eval) on TCP port
 * AGENT_TCP_PORT of its NIC's address, without authentication. forkd adds the
 * switch for snapshots created with agent_tcp (snapshot.json "agent_tcp") and
 * reports <inside address>:AGENT_TCP_PORT as such a sandbox's guest_addr. */

#define AGENT_TCP_PORT 10000
#define AGENT_TCP_CMDLINE_SWITCH "forkd.agent_tcp=1"
