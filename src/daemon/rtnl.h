/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* A few rtnetlink requests over libmnl, as netns.c needs them: links up,
 * addresses, a default route, veth pairs across namespaces, deletion and a
 * listing of links by name. Every request asks for an acknowledgement and every
 * answer is checked; errors come back as -errno (the kernel's NLMSG_ERROR code,
 * or the socket's). A socket works in the network namespace it was opened in,
 * whichever namespace the thread that uses it is in later. Debug logging only. */

#include <netinet/in.h>
#include <stdbool.h>

#include "macro.h"

struct mnl_socket;

/* The most links rtnl_link_list() returns; more is -E2BIG. */
#define RTNL_LINKS_MAX 65536u

/* A NETLINK_ROUTE socket (SOCK_CLOEXEC) in the caller thread's network namespace. */
int rtnl_open(struct mnl_socket **ret);
struct mnl_socket *rtnl_close(struct mnl_socket *nl);
static inline void rtnl_closep(struct mnl_socket **nl) {
        *nl = rtnl_close(*nl);
}
#define _cleanup_rtnl_ _cleanup_(rtnl_closep)

/* The index of the link named ifname; -ENODEV when there is none. */
int rtnl_link_index(struct mnl_socket *nl, const char *ifname, int *ret_ifindex);

/* Sets the link up. */
int rtnl_link_up(struct mnl_socket *nl, const char *ifname);

/* Per-link IPv4 forwarding (net.ipv4.conf.IFNAME.forwarding) through
 * IFLA_AF_SPEC, so no /proc/sys write is needed: what the kernel checks on
 * the link a packet comes in by before forwarding it. */
int rtnl_link_set_ipv4_forwarding(struct mnl_socket *nl, const char *ifname, bool on);

/* No IPv6 address generated on the link (addr_gen_mode none: no link-local
 * when it goes up); call before rtnl_link_up(). Success where the kernel has
 * no IPv6. */
int rtnl_link_set_ipv6_addrgen_none(struct mnl_socket *nl, const char *ifname);

/* Deletes the link; a missing one (-ENODEV) is success, and 0 vs 1 says which. */
int rtnl_link_delete(struct mnl_socket *nl, const char *ifname);

/* Adds addr/prefixlen to the link (an existing identical address is success). */
int rtnl_addr_add(struct mnl_socket *nl, const char *ifname, struct in_addr addr, unsigned prefixlen);

/* Adds (or replaces) the IPv4 default route via gw. */
int rtnl_route_default(struct mnl_socket *nl, struct in_addr gw);

/* Creates a veth pair: ifname in this socket's namespace, peer_ifname in the
 * namespace of peer_netns_fd (an nsfs fd). -EEXIST if ifname exists. */
int rtnl_veth_create(struct mnl_socket *nl, const char *ifname, const char *peer_ifname, int peer_netns_fd);

/* Names of the links whose name starts with prefix and (if kind is not NULL)
 * whose IFLA_INFO_KIND is kind: a NULL-terminated array (free with
 * strv_free()). At most RTNL_LINKS_MAX links are looked at. */
int rtnl_link_list(struct mnl_socket *nl, const char *prefix, const char *kind, char ***ret);
