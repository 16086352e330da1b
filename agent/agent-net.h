/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The guest's network: its side of the per-child namespace that forkd makes
 * on the host (tap 172.16.0.1/30 there). Every child keeps the snapshot's
 * address, so these are fixed. forkd's own copy is NETNS_GUEST_IP and
 * NETNS_GATEWAY_IP in src/daemon/netns.h: keep the two in step.
 */

#include <net/if.h>

#define AGENT_NET_IFNAME "eth0"          /* preferred; else the first ethernet link */
#define AGENT_NET_ADDRESS "172.16.0.2"
#define AGENT_NET_PREFIXLEN 30
#define AGENT_NET_GATEWAY "172.16.0.1"

/* The interface to configure: AGENT_NET_IFNAME if a link of that name exists,
 * else the ethernet link (ARPHRD_ETHER, not IFF_LOOPBACK) with the lowest
 * ifindex. -ENODEV when there is none; ret is then untouched. */
int agent_net_pick(char ret[static IF_NAMESIZE]);

/* Bring lo up. Then bring ifname up, give it AGENT_NET_ADDRESS/PREFIXLEN and a
 * default route via AGENT_NET_GATEWAY (replacing what is there, so calling it
 * again is harmless). All over rtnetlink, in the caller's network namespace.
 * Returns 0 or a negative errno (-ENODEV: no such interface). Does not log. */
int agent_net_configure(const char *ifname);

/* 1 if the main table has an IPv4 default route, 0 if not, or a negative errno. */
int agent_net_has_default_route(void);

/* At start, as PID 1: pick and configure, logging a failure to the console.
 * Without an ethernet link it only brings lo up, silently. With an IPv4
 * default route already there (not a fresh guest: PID 1 of a container on
 * some host) it touches nothing. */
void agent_net_setup(void);
