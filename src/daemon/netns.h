/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Per-child network namespaces made by forkd: for child index i,
 * /run/netns/forkd-child-<i> holding
 *   - lo, up;
 *   - tap0 (the guest's side, 172.16.0.1/30; the guest is 172.16.0.2), whose
 *     fd goes to the VMM: a tap fd works from any namespace;
 *   - veth0, the inside end of a veth pair whose host end is fkd<i>, both in
 *     the i-th /30 of a prefix (default 10.200.0.0/16): host end .1, inside .2;
 *     the default route goes via the host end;
 *   - table ip forkd: the guest SNATed to the inside address on its way out,
 *     TCP to the inside address (any port) DNATed to the guest, and a forward
 *     filter (NONE: nothing the guest starts leaves; EGRESS: it does).
 * and, once, in the caller's (host) namespace, table ip forkd: egress
 * masqueraded out of any non-fkd* interface, nothing forwarded between two
 * fkd* links or into one unasked, input from a fkd* link only to that link's
 * own address; and, for an egress child, net.ipv4.ip_forward=1 (written to
 * /proc/sys when it is 0). Inside, forwarding is set per link over netlink
 * and no link gets IPv6 addresses. forkd(8), NETWORKING, has the plan.
 *
 * Every fd is O_CLOEXEC. forkd's own threads never change namespace: the work
 * inside a namespace runs in a short-lived thread of its own. Object code
 * only; logs at debug level. Needs CAP_SYS_ADMIN and CAP_NET_ADMIN. */

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "macro.h"

#define NETNS_DIR "/run/netns"
/* forkd's marks: a namespace with a file of its name here is forkd's to remove
 * (tools/netns-setup's never are). */
#define NETNS_MARKER_DIR "/run/forkd/netns"
#define NETNS_NAME_PREFIX "forkd-child-"
#define NETNS_HOST_IFNAME_PREFIX "fkd"
#define NETNS_TAP_IFNAME "tap0"
#define NETNS_VETH_IFNAME "veth0"
#define NETNS_DEFAULT_PREFIX "10.200.0.0/16"
/* The guest side, the same in every child (they are clones of one snapshot). */
#define NETNS_GUEST_IP "172.16.0.2"
#define NETNS_GATEWAY_IP "172.16.0.1"
#define NETNS_GUEST_PREFIXLEN 30
/* The tap's virtio-net header (TUNSETVNETHDRSZ): struct virtio_net_hdr_v1,
 * num_buffers included, as a virtio 1.x device's queues carry it. */
#define NETNS_VNET_HDR_SIZE 12
/* Indices run from 1 to this (and to the prefix's number of /30s). */
#define NETNS_INDEX_MAX 65535u
/* The most indices one netns_pick_free() call hands out. */
#define NETNS_PICK_MAX 1000u
/* "forkd-child-65535" and its NUL. */
#define NETNS_NAME_MAX (sizeof(NETNS_NAME_PREFIX) + 5)

typedef enum NetnsPolicy {
        NETNS_POLICY_NONE,   /* nothing the guest starts leaves the namespace */
        NETNS_POLICY_EGRESS, /* the guest may connect out, masqueraded by the host */
        _NETNS_POLICY_MAX,
        _NETNS_POLICY_INVALID = -EINVAL,
} NetnsPolicy;

const char *netns_policy_to_string(NetnsPolicy p);
NetnsPolicy netns_policy_from_string(const char *s);

/* The IPv4 prefix the children's /30s come from: a network address with
 * nothing set below len, len from 8 to 30. */
typedef struct NetnsPrefix {
        uint32_t addr; /* host byte order */
        unsigned len;
} NetnsPrefix;

/* "A.B.C.D/LEN"; -EINVAL for anything else (bits below LEN, LEN out of 8..30). */
int netns_prefix_parse(const char *s, NetnsPrefix *ret);
/* How many children fit: the prefix's /30s, at most NETNS_INDEX_MAX. */
unsigned netns_prefix_capacity(const NetnsPrefix *p);
/* Child i's host end and inside address; -ERANGE if i is 0 or past capacity. */
int netns_child_addrs(const NetnsPrefix *p, unsigned index, struct in_addr *ret_host, struct in_addr *ret_inside);

/* forkd-child-<i> into buf (NETNS_NAME_MAX), and back: strict decimal, 1..NETNS_INDEX_MAX. */
int netns_child_name(unsigned index, char buf[static NETNS_NAME_MAX]);
int netns_child_index_from_name(const char *name, unsigned *ret);

typedef struct NetnsChild {
        unsigned index;
        NetnsPolicy policy;
        char name[NETNS_NAME_MAX];           /* forkd-child-<i>, under NETNS_DIR */
        char host_ifname[16];                /* fkd<i> */
        char host_addr[INET_ADDRSTRLEN];     /* the host end: what the guest reaches with EGRESS */
        char inside_addr[INET_ADDRSTRLEN];   /* veth0's: the host dials inside_addr:port for the guest's port */
        int tap_fd;                          /* tap0, IFF_TAP|IFF_NO_PI|IFF_VNET_HDR, blocking; owned */
} NetnsChild;

/* Lets uid owner (and root) dial the guests of these children from the host,
 * any port, and nobody else: the host's chain ip forkd dial rejects a new
 * connection into a fkd<i> link from any other local socket. Call it after
 * netns_child_create(), before the guest runs, for root-owned children too
 * (it empties what an earlier child of the same index allowed). One nft
 * transaction. netns_child_destroy() forgets it. */
int netns_children_allow(const NetnsChild *children, unsigned n, uid_t owner);
/* Closes the tap fd (the namespace stays until netns_child_destroy()). */
void netns_child_done(NetnsChild *c);

/* Makes everything child index needs (see the top of this file) and fills
 * *ret. -EEXIST when /run/netns/forkd-child-<i> exists, -ERANGE for an index
 * the prefix has no room for. On failure nothing made is left behind, *ret
 * is untouched and, if ret_failed_step is not NULL, it names the step that
 * failed ("tap0: TUNSETIFF", "host nftables table", ...). */
int netns_child_create(const NetnsPrefix *prefix, unsigned index, NetnsPolicy policy,
                       NetnsChild *ret, const char **ret_failed_step);

/* Removes what netns_child_create() made for the namespace called name: the
 * veth pair, the namespace's mount and file, forkd's mark. Works from the name
 * alone, any number of times; a namespace without forkd's mark (a pre-made
 * one) is left alone, though a fkd<i> link is removed. A tap fd still open
 * keeps the (then nameless) namespace alive until it is closed. */
int netns_child_destroy(const char *name);

/* At forkd's start: destroys every namespace forkd marked, and deletes every
 * fkd<i> veth left in the caller's namespace. Returns how many namespaces it
 * removed. */
int netns_cleanup_leftovers(void);

/* Reserves count indices (1..NETNS_PICK_MAX) whose namespace does not exist
 * and that no earlier call reserved, lowest first, into ret_indices: no two
 * callers in this process ever get the same one until it is released. -ENOSPC
 * (and nothing reserved) when the prefix has too few left. Thread-safe. */
int netns_pick_free(const NetnsPrefix *prefix, unsigned count, unsigned *ret_indices);
void netns_release(unsigned index);
