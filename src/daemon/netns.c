/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Per-child network namespaces: made, torn down, found again after a crash
 * (netns.h). rtnetlink through rtnl.c (libmnl), nftables through libnftables.
 *
 * A namespace is made the way ip-netns(8) makes one: /run/netns a shared
 * mount of itself, a file /run/netns/NAME, and a thread that unshares its
 * network namespace and bind-mounts /proc/thread-self/ns/net onto that file.
 * The same thread configures everything inside (its netlink socket, tap and
 * nft context all belong to the namespace it is in) and exits: no thread of
 * the caller ever changes namespace. */

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <nftables/libnftables.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "fs-util.h"
#include "netns.h"
#include "rtnl.h"
#include "strv.h"

#define IP_FORWARD_PATH "/proc/sys/net/ipv4/ip_forward"
/* Room for a ruleset below: the templates and a few addresses. */
#define NFT_RULES_MAX 4096u

static const char *const policy_names[_NETNS_POLICY_MAX] = {
        [NETNS_POLICY_NONE] = "none",
        [NETNS_POLICY_EGRESS] = "egress",
};

const char *netns_policy_to_string(NetnsPolicy p) {
        return p >= 0 && p < _NETNS_POLICY_MAX ? policy_names[p] : NULL;
}

NetnsPolicy netns_policy_from_string(const char *s) {
        if (s)
                for (NetnsPolicy p = 0; p < _NETNS_POLICY_MAX; p++)
                        if (strcmp(s, policy_names[p]) == 0)
                                return p;
        return _NETNS_POLICY_INVALID;
}

/* Strict decimal: digits only, no sign, no leading zero, at most max. */
static int parse_uint_strict(const char *s, size_t len, unsigned max, unsigned *ret) {
        unsigned long v = 0;

        if (len == 0 || len > 10 || (s[0] == '0' && len > 1))
                return -EINVAL;
        for (size_t k = 0; k < len; k++) {
                if (s[k] < '0' || s[k] > '9')
                        return -EINVAL;
                v = v * 10 + (unsigned) (s[k] - '0');
        }
        if (v > max)
                return -ERANGE;
        *ret = (unsigned) v;
        return 0;
}

int netns_prefix_parse(const char *s, NetnsPrefix *ret) {
        char addr[INET_ADDRSTRLEN];
        const char *slash;
        struct in_addr a;
        unsigned len;
        uint32_t host;

        if (!s || strnlen(s, 32) >= 32)
                return -EINVAL;
        slash = strchr(s, '/');
        if (!slash || (size_t) (slash - s) >= sizeof addr)
                return -EINVAL;
        memcpy(addr, s, (size_t) (slash - s));
        addr[slash - s] = 0;
        if (inet_pton(AF_INET, addr, &a) != 1)
                return -EINVAL;
        if (parse_uint_strict(slash + 1, strlen(slash + 1), 30, &len) < 0 || len < 8)
                return -EINVAL;
        host = ntohl(a.s_addr);
        if (host & ~(UINT32_MAX << (32 - len)))
                return -EINVAL; /* bits set below the prefix length */
        *ret = (NetnsPrefix) { .addr = host, .len = len };
        return 0;
}

unsigned netns_prefix_capacity(const NetnsPrefix *p) {
        if (!p || p->len < 8 || p->len > 30)
                return 0;
        return MIN(1u << (30 - p->len), NETNS_INDEX_MAX);
}

int netns_child_addrs(const NetnsPrefix *p, unsigned index, struct in_addr *ret_host, struct in_addr *ret_inside) {
        uint32_t base;

        if (index == 0 || index > netns_prefix_capacity(p))
                return -ERANGE;
        /* Child i has the i-th /30: network, host end, inside end, broadcast. */
        base = p->addr + (index - 1) * 4u;
        if (ret_host)
                ret_host->s_addr = htonl(base + 1);
        if (ret_inside)
                ret_inside->s_addr = htonl(base + 2);
        return 0;
}

int netns_child_name(unsigned index, char buf[static NETNS_NAME_MAX]) {
        if (index == 0 || index > NETNS_INDEX_MAX)
                return -ERANGE;
        (void) snprintf(buf, NETNS_NAME_MAX, NETNS_NAME_PREFIX "%u", index);
        return 0;
}

int netns_child_index_from_name(const char *name, unsigned *ret) {
        size_t l = strlen(NETNS_NAME_PREFIX);
        unsigned i;
        int r;

        if (!name || strncmp(name, NETNS_NAME_PREFIX, l) != 0)
                return -EINVAL;
        r = parse_uint_strict(name + l, strnlen(name + l, 11), NETNS_INDEX_MAX, &i);
        if (r < 0)
                return r;
        if (i == 0)
                return -ERANGE;
        *ret = i;
        return 0;
}

static int host_ifname(unsigned index, char buf[static 16]) {
        if (index == 0 || index > NETNS_INDEX_MAX)
                return -ERANGE;
        (void) snprintf(buf, 16, NETNS_HOST_IFNAME_PREFIX "%u", index);
        return 0;
}

static int host_ifname_index(const char *ifname, unsigned *ret) {
        size_t l = strlen(NETNS_HOST_IFNAME_PREFIX);
        unsigned i;

        if (strncmp(ifname, NETNS_HOST_IFNAME_PREFIX, l) != 0 ||
            parse_uint_strict(ifname + l, strnlen(ifname + l, 11), NETNS_INDEX_MAX, &i) < 0 || i == 0)
                return -EINVAL;
        *ret = i;
        return 0;
}

void netns_child_done(NetnsChild *c) {
        if (c)
                c->tap_fd = safe_close(c->tap_fd);
}

/* net.ipv4.ip_forward=1 in the namespace of the calling thread (/proc/sys/net
 * answers for the namespace of whoever opens it). Not written when already 1;
 * -EROFS when it is 0 and cannot be written. */
static int ip_forward_enable(void) {
        _cleanup_close_ int fd = -EBADF;
        char c = 0;

        fd = open(IP_FORWARD_PATH, O_RDWR | O_CLOEXEC | O_NOCTTY);
        if (fd < 0) {
                /* Read-only /proc/sys (ProtectKernelTunables=): enough if already on. */
                fd = open(IP_FORWARD_PATH, O_RDONLY | O_CLOEXEC | O_NOCTTY);
                if (fd < 0)
                        return negative_errno();
                if (read(fd, &c, 1) == 1 && c == '1')
                        return 0;
                return -EROFS;
        }
        if (read(fd, &c, 1) == 1 && c == '1')
                return 0;
        if (pwrite(fd, "1\n", 2, 0) != 2)
                return negative_errno();
        return 0;
}

/* libnftables: one context per call, one call at a time in this process. */
static pthread_mutex_t nft_lock = PTHREAD_MUTEX_INITIALIZER;

/* Runs cmds in the calling thread's namespace as one transaction. -EPROTO
 * when nft refuses it (its message at debug level). */
static int nft_run(const char *cmds, bool quiet) {
        struct nft_ctx *ctx;
        int r = 0;

        pthread_mutex_lock(&nft_lock);
        ctx = nft_ctx_new(NFT_CTX_DEFAULT);
        if (!ctx) {
                pthread_mutex_unlock(&nft_lock);
                return -ENOMEM;
        }
        if (nft_ctx_buffer_output(ctx) < 0 || nft_ctx_buffer_error(ctx) < 0)
                r = -ENOMEM;
        else if (nft_run_cmd_from_buffer(ctx, cmds) != 0) {
                const char *e = nft_ctx_get_error_buffer(ctx);
                if (!quiet)
                        log_debug("nft: %.512s", e ?: "(no message)");
                r = -EPROTO;
        }
        nft_ctx_free(ctx);
        pthread_mutex_unlock(&nft_lock);
        return r;
}

/* The host's table: made once, left as it is when it exists (an operator's
 * rules in chain egress survive forkd's restarts). */
static int host_table_ensure(const NetnsPrefix *prefix) {
        char rules[NFT_RULES_MAX], net[INET_ADDRSTRLEN];
        struct in_addr a = { .s_addr = htonl(prefix->addr) };
        int n, r;

        if (nft_run("list table ip forkd", true) == 0)
                return 0;
        if (!inet_ntop(AF_INET, &a, net, sizeof net))
                return -EINVAL;
        /* "create table" fails the whole batch when the table appeared meanwhile. */
        n = snprintf(rules, sizeof rules,
                     "create table ip forkd\n"
                     /* Operators' rules for children's new outgoing connections (forkd(8)). */
                     "add chain ip forkd egress\n"
                     "add chain ip forkd input { type filter hook input priority filter; policy accept; }\n"
                     "add rule ip forkd input iifname \"" NETNS_HOST_IFNAME_PREFIX "*\" ct state established,related accept\n"
                     /* Only the address on the very link it came in by: its own host end. */
                     "add rule ip forkd input iifname \"" NETNS_HOST_IFNAME_PREFIX "*\" fib daddr . iif type local accept\n"
                     "add rule ip forkd input iifname \"" NETNS_HOST_IFNAME_PREFIX "*\" drop\n"
                     "add chain ip forkd forward { type filter hook forward priority filter; policy accept; }\n"
                     "add rule ip forkd forward iifname \"" NETNS_HOST_IFNAME_PREFIX "*\" oifname \"" NETNS_HOST_IFNAME_PREFIX "*\" drop\n"
                     "add rule ip forkd forward oifname \"" NETNS_HOST_IFNAME_PREFIX "*\" ct state established,related accept\n"
                     "add rule ip forkd forward oifname \"" NETNS_HOST_IFNAME_PREFIX "*\" drop\n"
                     "add rule ip forkd forward iifname \"" NETNS_HOST_IFNAME_PREFIX "*\" ct state new jump egress\n"
                     "add chain ip forkd postrouting { type nat hook postrouting priority srcnat; policy accept; }\n"
                     "add rule ip forkd postrouting ip saddr %s/%u oifname != \"" NETNS_HOST_IFNAME_PREFIX "*\" masquerade\n",
                     net, prefix->len);
        if (n < 0 || (size_t) n >= sizeof rules)
                return -ENOBUFS;
        r = nft_run(rules, false);
        if (r < 0 && nft_run("list table ip forkd", true) == 0)
                return 0; /* made by someone else meanwhile */
        return r;
}

/* Who may dial a child from the host: a new connection out of a fkd<i> link
 * from a local socket passes when the socket is root's, or when the map
 * dialers sends fkd<i> to a chain dial-fkd<i> that accepts its uid (the
 * sandbox's owner, netns_children_allow()); anything else is rejected. So
 * another user of the host cannot reach a guest's ports, the agent's TCP port
 * included. Added to a table made before it existed too. */
static int host_dial_ensure(void) {
        int r;

        if (nft_run("list chain ip forkd dial", true) == 0)
                return 0;
        r = nft_run("add map ip forkd dialers { type ifname : verdict; }\n"
                    "create chain ip forkd dial { type filter hook output priority filter; policy accept; }\n"
                    "add rule ip forkd dial oifname \"" NETNS_HOST_IFNAME_PREFIX "*\" ct state new meta skuid 0 accept\n"
                    "add rule ip forkd dial oifname \"" NETNS_HOST_IFNAME_PREFIX "*\" ct state new oifname vmap @dialers\n"
                    "add rule ip forkd dial oifname \"" NETNS_HOST_IFNAME_PREFIX "*\" ct state new reject\n",
                    false);
        if (r < 0 && nft_run("list chain ip forkd dial", true) == 0)
                return 0; /* made by someone else meanwhile */
        return r;
}

/* Forgets who may dial through link ifname (nothing to forget is fine). */
static void dial_forget(const char *ifname) {
        char cmds[256];

        (void) snprintf(cmds, sizeof cmds,
                        "delete element ip forkd dialers { \"%s\" }\n"
                        "delete chain ip forkd dial-%s\n", ifname, ifname);
        if (nft_run(cmds, true) >= 0)
                return;
        /* The transaction fails as a whole without the element: the chain alone. */
        (void) snprintf(cmds, sizeof cmds, "delete chain ip forkd dial-%s\n", ifname);
        (void) nft_run(cmds, true);
}

int netns_children_allow(const NetnsChild *children, unsigned n, uid_t owner) {
        _cleanup_free_ char *cmds = NULL;
        size_t size, len = 0;

        if (!children || n == 0 || n > NETNS_PICK_MAX || owner == (uid_t) -1)
                return -EINVAL;
        /* For root too: a chain left by an earlier child of the same index is emptied. */
        size = (size_t) n * 256 + 1;
        cmds = malloc(size);
        if (!cmds)
                return -ENOMEM;
        for (unsigned i = 0; i < n; i++) {
                const char *ifn = children[i].host_ifname;
                int k;

                if (strncmp(ifn, NETNS_HOST_IFNAME_PREFIX, strlen(NETNS_HOST_IFNAME_PREFIX)) != 0 ||
                    strlen(ifn) >= 16)
                        return -EINVAL;
                k = snprintf(cmds + len, size - len,
                             "add chain ip forkd dial-%s\n"
                             "flush chain ip forkd dial-%s\n",
                             ifn, ifn);
                if (k >= 0 && (size_t) k < size - len && owner != 0) {
                        len += (size_t) k;
                        k = snprintf(cmds + len, size - len, "add rule ip forkd dial-%s meta skuid %u accept\n",
                                     ifn, (unsigned) owner);
                }
                if (k >= 0 && (size_t) k < size - len) {
                        len += (size_t) k;
                        k = snprintf(cmds + len, size - len,
                                     "add element ip forkd dialers { \"%s\" : jump dial-%s }\n", ifn, ifn);
                }
                if (k < 0 || (size_t) k >= size - len)
                        return -ENOBUFS;
                len += (size_t) k;
        }
        return nft_run(cmds, false);
}

static int child_rules(char *buf, size_t size, NetnsPolicy policy, const char *inside) {
        int n;

        n = snprintf(buf, size,
                     "table ip forkd {\n"
                     "  chain prerouting {\n"
                     "    type nat hook prerouting priority dstnat; policy accept;\n"
                     "    iifname \"" NETNS_VETH_IFNAME "\" ip daddr %s meta l4proto tcp dnat to " NETNS_GUEST_IP "\n"
                     "  }\n"
                     "  chain postrouting {\n"
                     "    type nat hook postrouting priority srcnat; policy accept;\n"
                     "    oifname \"" NETNS_VETH_IFNAME "\" ip saddr " NETNS_GUEST_IP " snat to %s\n"
                     "  }\n"
                     "  chain input {\n"
                     "    type filter hook input priority filter; policy accept;\n"
                     "    iifname \"" NETNS_TAP_IFNAME "\" ct state established,related accept\n"
                     "    iifname \"" NETNS_TAP_IFNAME "\" drop\n"
                     "  }\n"
                     "  chain forward {\n"
                     "    type filter hook forward priority filter; policy drop;\n"
                     "    ct state established,related accept\n"
                     "    iifname \"" NETNS_VETH_IFNAME "\" oifname \"" NETNS_TAP_IFNAME "\" ct status dnat accept\n"
                     "%s"
                     "  }\n"
                     "}\n",
                     inside, inside,
                     policy == NETNS_POLICY_EGRESS ?
                     "    iifname \"" NETNS_TAP_IFNAME "\" oifname \"" NETNS_VETH_IFNAME "\" ip saddr " NETNS_GUEST_IP " accept\n" : "");
        if (n < 0 || (size_t) n >= size)
                return -ENOBUFS;
        return 0;
}

static int tap_open(int *ret) {
        _cleanup_close_ int fd = -EBADF;
        struct ifreq ifr = {};
        int hdr = NETNS_VNET_HDR_SIZE;

        fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return negative_errno();
        memcpy(ifr.ifr_name, NETNS_TAP_IFNAME, sizeof NETNS_TAP_IFNAME);
        ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
        if (ioctl(fd, TUNSETIFF, &ifr) < 0)
                return negative_errno();
        if (ioctl(fd, TUNSETVNETHDRSZ, &hdr) < 0)
                return negative_errno();
        *ret = TAKE_FD(fd);
        return 0;
}

typedef struct Inside {
        /* in */
        const char *path;        /* NETNS_DIR/NAME, an empty file */
        const char *host_ifname; /* the veth's host end, made in host_netns_fd */
        int host_netns_fd;
        struct in_addr host, inside;
        NetnsPolicy policy;
        /* out */
        int tap_fd;
        int r;
        const char *step;
} Inside;

#define STEP(a, s) ((a)->step = (s))

/* Forwarding per link, through netlink: the namespace's /proc/sys may be
 * read-only (ProtectKernelTunables=). IPv4 only: no link-local IPv6 for a
 * guest to talk over. Then the address, then up. steps[] names each. */
static int link_configure(Inside *a, struct mnl_socket *nl, const char *ifname, struct in_addr addr,
                          unsigned prefixlen, const char *const steps[static 4]) {
        int r;

        STEP(a, steps[0]);
        r = rtnl_link_set_ipv4_forwarding(nl, ifname, true);
        if (r < 0)
                return r;
        STEP(a, steps[1]);
        r = rtnl_link_set_ipv6_addrgen_none(nl, ifname);
        if (r < 0)
                return r;
        STEP(a, steps[2]);
        r = rtnl_addr_add(nl, ifname, addr, prefixlen);
        if (r < 0)
                return r;
        STEP(a, steps[3]);
        return rtnl_link_up(nl, ifname);
}

#define LINK_STEPS(ifname) \
        ((const char *const[4]) { ifname ": forwarding", ifname ": no IPv6 addresses", ifname ": address", ifname ": up" })

static int inside_setup(Inside *a) {
        _cleanup_rtnl_ struct mnl_socket *nl = NULL;
        _cleanup_close_ int tap = -EBADF;
        struct in_addr gw;
        char rules[NFT_RULES_MAX], inside[INET_ADDRSTRLEN];
        int r;

        STEP(a, "unshare(CLONE_NEWNET)");
        if (unshare(CLONE_NEWNET) < 0)
                return negative_errno();
        STEP(a, "bind mount of /proc/thread-self/ns/net");
        if (mount("/proc/thread-self/ns/net", a->path, "none", MS_BIND, NULL) < 0)
                return negative_errno();

        STEP(a, "rtnetlink socket in the namespace");
        r = rtnl_open(&nl);
        if (r < 0)
                return r;
        STEP(a, "lo: up");
        r = rtnl_link_up(nl, "lo");
        if (r < 0)
                return r;

        STEP(a, NETNS_TAP_IFNAME ": open /dev/net/tun, TUNSETIFF, TUNSETVNETHDRSZ");
        r = tap_open(&tap);
        if (r < 0)
                return r;
        if (inet_pton(AF_INET, NETNS_GATEWAY_IP, &gw) != 1)
                return -EINVAL;
        r = link_configure(a, nl, NETNS_TAP_IFNAME, gw, NETNS_GUEST_PREFIXLEN, LINK_STEPS(NETNS_TAP_IFNAME));
        if (r < 0)
                return r;

        STEP(a, "veth pair");
        r = rtnl_veth_create(nl, NETNS_VETH_IFNAME, a->host_ifname, a->host_netns_fd);
        if (r < 0)
                return r;
        r = link_configure(a, nl, NETNS_VETH_IFNAME, a->inside, 30, LINK_STEPS(NETNS_VETH_IFNAME));
        if (r < 0)
                return r;
        STEP(a, "default route in the namespace");
        r = rtnl_route_default(nl, a->host);
        if (r < 0)
                return r;

        STEP(a, "nftables rules in the namespace");
        if (!inet_ntop(AF_INET, &a->inside, inside, sizeof inside))
                return -EINVAL;
        r = child_rules(rules, sizeof rules, a->policy, inside);
        if (r < 0)
                return r;
        r = nft_run(rules, false);
        if (r < 0)
                return r;

        a->tap_fd = TAKE_FD(tap);
        return 0;
}

static void *inside_thread(void *p) {
        Inside *a = p;

        a->r = inside_setup(a);
        return NULL;
}

/* Runs inside_setup() in a thread of its own, every signal blocked there. */
static int inside_run(Inside *a) {
        sigset_t all, old;
        pthread_t t;
        int r;

        sigfillset(&all);
        r = -pthread_sigmask(SIG_SETMASK, &all, &old);
        if (r < 0)
                return r;
        r = -pthread_create(&t, NULL, inside_thread, a);
        (void) pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (r < 0)
                return r;
        r = -pthread_join(t, NULL);
        if (r < 0)
                return r;
        return a->r;
}

/* /run/netns as ip-netns leaves it: a shared mount (of itself, if need be),
 * so that a namespace mounted there shows in every mount namespace below. */
static int netns_dir_setup_locked(void) {
        int r;

        r = mkdir_parents_and_self(NETNS_DIR, 0755);
        if (r < 0)
                return r;
        if (mount("", NETNS_DIR, "none", MS_SHARED | MS_REC, NULL) == 0)
                return 0;
        if (errno != EINVAL)
                return negative_errno();
        /* Not a mount point yet. */
        if (mount(NETNS_DIR, NETNS_DIR, "none", MS_BIND | MS_REC, NULL) < 0)
                return negative_errno();
        if (mount("", NETNS_DIR, "none", MS_SHARED | MS_REC, NULL) < 0)
                return negative_errno();
        return 0;
}

static int netns_dir_setup(void) {
        static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
        int r;

        /* Two threads finding it no mount point would stack two bind mounts. */
        pthread_mutex_lock(&lock);
        r = netns_dir_setup_locked();
        pthread_mutex_unlock(&lock);
        return r;
}

static int path_in(const char *dir, const char *name, char *buf, size_t size) {
        int n = snprintf(buf, size, "%s/%s", dir, name);
        return n < 0 || (size_t) n >= size ? -ENAMETOOLONG : 0;
}

static int fail(const char **ret_failed_step, const char *step, int r) {
        if (ret_failed_step)
                *ret_failed_step = step;
        return log_debug_errno(r, "netns: %s: %m", step);
}

/* What every child shares, first: nothing of this child to undo if it fails. */
static int shared_setup(const NetnsPrefix *prefix, NetnsPolicy policy, const char **ret_step) {
        int r;

        *ret_step = "host nftables table ip forkd";
        r = host_table_ensure(prefix);
        if (r < 0)
                return r;
        *ret_step = "host nftables chain ip forkd dial";
        r = host_dial_ensure();
        if (r < 0)
                return r;
        /* Egress needs the host to forward, replies from its uplinks included:
         * the global switch. Without egress the host forwards nothing of a child's. */
        if (policy == NETNS_POLICY_EGRESS) {
                r = ip_forward_enable();
                *ret_step = r == -EROFS ?
                        "host net.ipv4.ip_forward is 0 and /proc/sys is read-only (set it with sysctl.d)" :
                        "host net.ipv4.ip_forward";
                if (r < 0)
                        return r;
        }
        *ret_step = NETNS_DIR " as a shared mount";
        r = netns_dir_setup();
        if (r < 0)
                return r;
        *ret_step = "mkdir " NETNS_MARKER_DIR;
        return mkdir_parents_and_self(NETNS_MARKER_DIR, 0700);
}

/* The veth's host end, once the namespace holds the other. */
static int host_end_setup(struct mnl_socket *nl, const char *ifname, struct in_addr host, const char **ret_step) {
        int r;

        *ret_step = "host end of the veth: no IPv6 addresses";
        r = rtnl_link_set_ipv6_addrgen_none(nl, ifname);
        if (r < 0)
                return r;
        *ret_step = "host end of the veth: address";
        r = rtnl_addr_add(nl, ifname, host, 30);
        if (r < 0)
                return r;
        *ret_step = "host end of the veth: up";
        return rtnl_link_up(nl, ifname);
}

/* A mark holds the pid of the forkd that made its namespace. */
static int mark_write_owner(const char *marker) {
        char buf[32];
        int fd, n, r = 0;

        fd = open(marker, O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return negative_errno();
        n = snprintf(buf, sizeof buf, "%d\n", (int) getpid());
        if (write(fd, buf, n) != n)
                r = -EIO;
        safe_close(fd);
        return r;
}

/* True when the mark names another process that is alive: another forkd on
 * this host (a test's, with a state directory of its own) still uses that
 * namespace. An empty or unreadable mark, our own pid, or a dead pid: false. */
static bool mark_held_by_other(const char *marker) {
        char buf[32] = {};
        int fd, pid;
        ssize_t k;

        fd = open(marker, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return false;
        k = read(fd, buf, sizeof buf - 1);
        safe_close(fd);
        if (k <= 0 || sscanf(buf, "%d", &pid) != 1 || pid <= 0 || pid == (int) getpid())
                return false;
        return kill(pid, 0) == 0 || errno == EPERM;
}

int netns_child_create(const NetnsPrefix *prefix, unsigned index, NetnsPolicy policy,
                       NetnsChild *ret, const char **ret_failed_step) {
        _cleanup_rtnl_ struct mnl_socket *nl = NULL;
        _cleanup_close_ int host_netns_fd = -EBADF, fd = -EBADF;
        char name[NETNS_NAME_MAX], ifname[16], path[PATH_MAX], marker[PATH_MAX];
        char host_s[INET_ADDRSTRLEN], inside_s[INET_ADDRSTRLEN];
        struct in_addr host, inside;
        const char *step = NULL;
        Inside a = { .tap_fd = -EBADF };
        int r;

        if (!prefix || !ret || policy < 0 || policy >= _NETNS_POLICY_MAX)
                return fail(ret_failed_step, "arguments", -EINVAL);
        r = netns_child_addrs(prefix, index, &host, &inside);
        if (r < 0)
                return fail(ret_failed_step, "index within the prefix", r);
        if (netns_child_name(index, name) < 0 || host_ifname(index, ifname) < 0 ||
            path_in(NETNS_DIR, name, path, sizeof path) < 0 ||
            path_in(NETNS_MARKER_DIR, name, marker, sizeof marker) < 0 ||
            !inet_ntop(AF_INET, &host, host_s, sizeof host_s) ||
            !inet_ntop(AF_INET, &inside, inside_s, sizeof inside_s))
                return fail(ret_failed_step, "names", -EINVAL);

        r = shared_setup(prefix, policy, &step);
        if (r < 0)
                return fail(ret_failed_step, step, r);
        r = rtnl_open(&nl);
        if (r < 0)
                return fail(ret_failed_step, "rtnetlink socket", r);
        if (access(path, F_OK) == 0)
                return fail(ret_failed_step, "namespace name", -EEXIST);
        /* A fkd<i> left by a crash would stop the veth pair: the index is ours now. */
        r = rtnl_link_delete(nl, ifname);
        if (r < 0)
                return fail(ret_failed_step, "stale host link", r);

        /* The mark first: a crash from here on leaves a namespace that the
         * next netns_cleanup_leftovers() knows to be forkd's. One left by a
         * crash before its namespace was made is reused. */
        fd = open(marker, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0600);
        if (fd < 0 && errno != EEXIST)
                return fail(ret_failed_step, "forkd's mark", negative_errno());
        bool marked_now = fd >= 0;
        fd = safe_close(fd);
        /* Whose it is: another forkd's netns_cleanup_leftovers() leaves it alone while we live. */
        r = mark_write_owner(marker);
        if (r < 0) {
                if (marked_now)
                        (void) unlink(marker);
                return fail(ret_failed_step, "forkd's mark", r);
        }

        fd = open(path, O_RDONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0444);
        if (fd < 0) {
                r = negative_errno();
                /* Someone else's namespace appeared meanwhile: it must not look like ours. */
                if (marked_now)
                        (void) unlink(marker);
                return fail(ret_failed_step, "namespace file", r);
        }
        fd = safe_close(fd);

        host_netns_fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
        if (host_netns_fd < 0) {
                r = fail(ret_failed_step, "the host namespace", negative_errno());
                goto undo;
        }

        a = (Inside) {
                .path = path, .host_ifname = ifname, .host_netns_fd = host_netns_fd,
                .host = host, .inside = inside, .policy = policy,
                .tap_fd = -EBADF, .step = "namespace thread",
        };
        r = inside_run(&a);
        if (r < 0) {
                r = fail(ret_failed_step, a.step, r);
                goto undo;
        }
        r = host_end_setup(nl, ifname, host, &step);
        if (r < 0) {
                r = fail(ret_failed_step, step, r);
                goto undo;
        }

        *ret = (NetnsChild) { .index = index, .policy = policy, .tap_fd = TAKE_FD(a.tap_fd) };
        memcpy(ret->name, name, sizeof name);
        memcpy(ret->host_ifname, ifname, sizeof ifname);
        memcpy(ret->host_addr, host_s, sizeof host_s);
        memcpy(ret->inside_addr, inside_s, sizeof inside_s);
        log_debug("netns: %s made: tap fd %d, %s %s, inside %s, %s", name, ret->tap_fd, ifname, host_s, inside_s,
                  netns_policy_to_string(policy));
        return 0;

undo:
        a.tap_fd = safe_close(a.tap_fd);
        (void) netns_child_destroy(name);
        return r;
}

int netns_child_destroy(const char *name) {
        _cleanup_rtnl_ struct mnl_socket *nl = NULL;
        char ifname[16], path[PATH_MAX], marker[PATH_MAX];
        unsigned index;
        int r;

        r = netns_child_index_from_name(name, &index);
        if (r < 0)
                return r;
        if (host_ifname(index, ifname) < 0 || path_in(NETNS_DIR, name, path, sizeof path) < 0 ||
            path_in(NETNS_MARKER_DIR, name, marker, sizeof marker) < 0)
                return -EINVAL;

        /* Deleting one end of a veth pair deletes both. */
        r = rtnl_open(&nl);
        if (r < 0)
                return log_debug_errno(r, "netns: %s: rtnetlink socket: %m", name);
        r = rtnl_link_delete(nl, ifname);
        if (r < 0)
                return log_debug_errno(r, "netns: %s: delete %s: %m", name, ifname);
        dial_forget(ifname);

        if (access(marker, F_OK) < 0) {
                if (errno != ENOENT)
                        return log_debug_errno(negative_errno(), "netns: %s: mark: %m", name);
                log_debug("netns: %s has no mark of forkd's, its namespace is left alone", name);
                return 0;
        }
        if (umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) < 0 && errno != EINVAL && errno != ENOENT)
                return log_debug_errno(negative_errno(), "netns: %s: umount: %m", name);
        if (unlink(path) < 0 && errno != ENOENT)
                return log_debug_errno(negative_errno(), "netns: %s: unlink: %m", name);
        if (unlink(marker) < 0 && errno != ENOENT)
                return log_debug_errno(negative_errno(), "netns: %s: unlink mark: %m", name);
        log_debug("netns: %s removed", name);
        return 0;
}

int netns_cleanup_leftovers(void) {
        uint8_t spared[NETNS_INDEX_MAX / 8 + 1] = {}; /* indices kept for a live forkd */
        _cleanup_rtnl_ struct mnl_socket *nl = NULL;
        _cleanup_free_ unsigned *found = NULL;
        char **links = NULL;
        size_t n = 0;
        DIR *d;
        int r, removed = 0;

        d = opendir(NETNS_MARKER_DIR);
        if (!d && errno != ENOENT)
                return log_debug_errno(negative_errno(), "netns: open " NETNS_MARKER_DIR ": %m");
        if (d) {
                struct dirent *de;

                found = calloc(NETNS_INDEX_MAX, sizeof(unsigned));
                if (!found) {
                        closedir(d);
                        return -ENOMEM;
                }
                while ((de = readdir(d)) && n < NETNS_INDEX_MAX) {
                        unsigned i;

                        if (netns_child_index_from_name(de->d_name, &i) >= 0)
                                found[n++] = i;
                }
                closedir(d);
        }
        for (size_t k = 0; k < n; k++) {
                char name[NETNS_NAME_MAX], marker[PATH_MAX];

                (void) netns_child_name(found[k], name);
                if (path_in(NETNS_MARKER_DIR, name, marker, sizeof marker) >= 0 && mark_held_by_other(marker)) {
                        log_debug("netns: %s belongs to a forkd that is still running, left alone", name);
                        spared[found[k] / 8] |= (uint8_t) (1u << (found[k] % 8));
                        continue;
                }
                r = netns_child_destroy(name);
                if (r < 0)
                        return r;
                removed++;
        }

        /* Host ends whose namespace is gone or was never marked. */
        r = rtnl_open(&nl);
        if (r < 0)
                return r;
        r = rtnl_link_list(nl, NETNS_HOST_IFNAME_PREFIX, "veth", &links);
        if (r < 0)
                return log_debug_errno(r, "netns: list links: %m");
        for (char **l = links; *l; l++) {
                unsigned i;

                if (host_ifname_index(*l, &i) < 0 || (i <= NETNS_INDEX_MAX && (spared[i / 8] & (1u << (i % 8)))))
                        continue;
                r = rtnl_link_delete(nl, *l);
                if (r < 0) {
                        strv_free(links);
                        return log_debug_errno(r, "netns: delete %s: %m", *l);
                }
                log_debug("netns: dangling %s deleted", *l);
        }
        strv_free(links);
        return removed;
}

/* Indices handed out and not released yet, bit i for index i. */
static uint8_t reserved[NETNS_INDEX_MAX / 8 + 1];
static pthread_mutex_t reserved_lock = PTHREAD_MUTEX_INITIALIZER;

static bool reserved_test(unsigned i) {
        return reserved[i / 8] & (1u << (i % 8));
}

int netns_pick_free(const NetnsPrefix *prefix, unsigned count, unsigned *ret_indices) {
        unsigned cap = netns_prefix_capacity(prefix), got = 0, picked[NETNS_PICK_MAX];

        if (!ret_indices || count == 0 || count > NETNS_PICK_MAX)
                return -EINVAL;
        pthread_mutex_lock(&reserved_lock);
        for (unsigned i = 1; i <= cap && got < count; i++) {
                char name[NETNS_NAME_MAX], path[PATH_MAX], marker[PATH_MAX];

                if (reserved_test(i))
                        continue;
                (void) netns_child_name(i, name);
                if (path_in(NETNS_DIR, name, path, sizeof path) < 0 ||
                    path_in(NETNS_MARKER_DIR, name, marker, sizeof marker) < 0)
                        continue;
                /* Taken: a namespace (anyone's), or forkd's mark of one being made or left over. */
                if (access(path, F_OK) == 0 || access(marker, F_OK) == 0)
                        continue;
                picked[got++] = i;
        }
        if (got < count) {
                pthread_mutex_unlock(&reserved_lock);
                return -ENOSPC;
        }
        for (unsigned k = 0; k < count; k++)
                reserved[picked[k] / 8] |= (uint8_t) (1u << (picked[k] % 8));
        pthread_mutex_unlock(&reserved_lock);
        memcpy(ret_indices, picked, count * sizeof(unsigned));
        return 0;
}

void netns_release(unsigned index) {
        if (index == 0 || index > NETNS_INDEX_MAX)
                return;
        pthread_mutex_lock(&reserved_lock);
        reserved[index / 8] &= (uint8_t) ~(1u << (index % 8));
        pthread_mutex_unlock(&reserved_lock);
}
