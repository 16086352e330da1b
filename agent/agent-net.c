/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The guest's NIC, configured over rtnetlink with hand-made messages (four
 * kinds: a link dump, link up, an address, a route), so that the agent needs
 * no libmnl in the image.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <net/if_arp.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "agent-net.h"
#include "agent.h"
#include "macro.h"

#define NL_REQ_SIZE 512
#define NL_RECV_SIZE (32u * 1024u)
#define NL_DUMP_MAX_MESSAGES 65536u /* links looked at before giving up */
#define NL_TIMEOUT_SEC 5

typedef struct NlReq {
        struct nlmsghdr nh;
        uint8_t body[NL_REQ_SIZE - sizeof(struct nlmsghdr)];
} NlReq;

static int nl_open(void) {
        _cleanup_close_ int fd = -EBADF;
        struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
        struct timeval tv = { .tv_sec = NL_TIMEOUT_SEC };

        fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
        if (fd < 0)
                return -errno;
        if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0)
                return -errno;
        if (bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0)
                return -errno;
        return TAKE_FD(fd);
}

static void *nl_body(NlReq *r, size_t len) {
        r->nh.nlmsg_len = (uint32_t) NLMSG_LENGTH(len);
        return NLMSG_DATA(&r->nh);
}

static int nl_attr(NlReq *r, uint16_t type, const void *data, size_t len) {
        size_t off = NLMSG_ALIGN(r->nh.nlmsg_len);
        struct rtattr *rta;

        if (off + RTA_SPACE(len) > sizeof *r)
                return -ENOBUFS;
        rta = (struct rtattr *) ((uint8_t *) r + off);
        rta->rta_type = type;
        rta->rta_len = (unsigned short) RTA_LENGTH(len);
        memcpy(RTA_DATA(rta), data, len);
        r->nh.nlmsg_len = (uint32_t) (off + RTA_SPACE(len));
        return 0;
}

static int nl_send(int fd, NlReq *r, uint16_t type, uint16_t flags, uint32_t seq) {
        struct sockaddr_nl kernel = { .nl_family = AF_NETLINK };
        ssize_t k;

        r->nh.nlmsg_type = type;
        r->nh.nlmsg_flags = NLM_F_REQUEST | flags;
        r->nh.nlmsg_seq = seq;
        k = sendto(fd, r, r->nh.nlmsg_len, 0, (struct sockaddr *) &kernel, sizeof kernel);
        if (k < 0)
                return -errno;
        if ((size_t) k != r->nh.nlmsg_len)
                return -EIO;
        return 0;
}

static ssize_t nl_recv(int fd, uint8_t *buf, size_t size) {
        for (;;) {
                ssize_t k = recv(fd, buf, size, MSG_TRUNC);

                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return errno == EAGAIN ? -ETIMEDOUT : -errno;
                if ((size_t) k > size)
                        return -EMSGSIZE;
                return k;
        }
}

/* Send a request with NLM_F_ACK and wait for its answer: 0 or the kernel's negative errno. */
static int nl_call(int fd, NlReq *r, uint16_t type, uint16_t flags, uint32_t seq) {
        _cleanup_free_ uint8_t *buf = NULL;
        int ret;

        buf = malloc(NL_RECV_SIZE);
        if (!buf)
                return -ENOMEM;
        ret = nl_send(fd, r, type, flags | NLM_F_ACK, seq);
        if (ret < 0)
                return ret;
        for (;;) {
                ssize_t k = nl_recv(fd, buf, NL_RECV_SIZE);
                size_t left;

                if (k < 0)
                        return (int) k;
                left = (size_t) k;
                for (struct nlmsghdr *h = (struct nlmsghdr *) buf; NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
                        const struct nlmsgerr *e;

                        if (h->nlmsg_seq != seq || h->nlmsg_type != NLMSG_ERROR)
                                continue;
                        if (h->nlmsg_len < NLMSG_LENGTH(sizeof *e))
                                return -EBADMSG;
                        e = NLMSG_DATA(h);
                        return e->error > 0 ? -EBADMSG : e->error;
                }
        }
}

static int link_up(int fd, int ifindex, uint32_t seq) {
        NlReq r = {};
        struct ifinfomsg *ifi = nl_body(&r, sizeof *ifi);

        ifi->ifi_family = AF_UNSPEC;
        ifi->ifi_index = ifindex;
        ifi->ifi_flags = IFF_UP;
        ifi->ifi_change = IFF_UP;
        return nl_call(fd, &r, RTM_NEWLINK, 0, seq);
}

static int address_add(int fd, int ifindex, struct in_addr addr, unsigned prefixlen, uint32_t seq) {
        NlReq r = {};
        struct ifaddrmsg *ifa = nl_body(&r, sizeof *ifa);
        struct in_addr brd = addr;
        int ret;

        ifa->ifa_family = AF_INET;
        ifa->ifa_prefixlen = (uint8_t) prefixlen;
        ifa->ifa_scope = RT_SCOPE_UNIVERSE;
        ifa->ifa_index = (uint32_t) ifindex;
        brd.s_addr |= htonl(prefixlen >= 32 ? 0 : UINT32_MAX >> prefixlen);
        ret = nl_attr(&r, IFA_LOCAL, &addr, sizeof addr);
        if (ret == 0)
                ret = nl_attr(&r, IFA_ADDRESS, &addr, sizeof addr);
        if (ret == 0 && prefixlen < 31)
                ret = nl_attr(&r, IFA_BROADCAST, &brd, sizeof brd);
        if (ret < 0)
                return ret;
        return nl_call(fd, &r, RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE, seq);
}

static int default_route_add(int fd, int ifindex, struct in_addr gw, uint32_t seq) {
        NlReq r = {};
        struct rtmsg *rtm = nl_body(&r, sizeof *rtm);
        uint32_t oif = (uint32_t) ifindex;
        int ret;

        rtm->rtm_family = AF_INET;
        rtm->rtm_dst_len = 0;
        rtm->rtm_table = RT_TABLE_MAIN;
        rtm->rtm_protocol = RTPROT_BOOT;
        rtm->rtm_scope = RT_SCOPE_UNIVERSE;
        rtm->rtm_type = RTN_UNICAST;
        ret = nl_attr(&r, RTA_GATEWAY, &gw, sizeof gw);
        if (ret == 0)
                ret = nl_attr(&r, RTA_OIF, &oif, sizeof oif);
        if (ret < 0)
                return ret;
        return nl_call(fd, &r, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, seq);
}

/* Dump (NLM_F_DUMP) with the request in r, calling cb for each message of the answer. */
static int nl_dump(int fd, NlReq *r, uint16_t type, uint32_t seq,
                   void (*cb)(const struct nlmsghdr *h, void *userdata), void *userdata) {
        _cleanup_free_ uint8_t *buf = NULL;
        unsigned seen = 0;
        int ret;

        buf = malloc(NL_RECV_SIZE);
        if (!buf)
                return -ENOMEM;
        ret = nl_send(fd, r, type, NLM_F_DUMP, seq);
        if (ret < 0)
                return ret;

        for (;;) {
                ssize_t k = nl_recv(fd, buf, NL_RECV_SIZE);
                size_t left;

                if (k < 0)
                        return (int) k;
                if (k == 0)
                        return -EBADMSG;
                left = (size_t) k;
                for (struct nlmsghdr *h = (struct nlmsghdr *) buf; NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
                        if (h->nlmsg_seq != seq)
                                continue;
                        if (h->nlmsg_type == NLMSG_DONE)
                                return 0;
                        if (h->nlmsg_type == NLMSG_ERROR) {
                                const struct nlmsgerr *e = NLMSG_DATA(h);

                                if (h->nlmsg_len < NLMSG_LENGTH(sizeof *e))
                                        return -EBADMSG;
                                return e->error < 0 ? e->error : -EBADMSG;
                        }
                        if (++seen > NL_DUMP_MAX_MESSAGES)
                                return -E2BIG;
                        cb(h, userdata);
                }
        }
}

typedef struct Pick {
        bool have_preferred;
        int best_index;
        char best[IF_NAMESIZE];
} Pick;

/* One RTM_NEWLINK message of the dump: note eth0, or a better fallback. */
static void pick_consider(const struct nlmsghdr *h, void *userdata) {
        Pick *p = userdata;
        const struct ifinfomsg *ifi;
        const struct rtattr *a;
        const char *name = NULL;
        size_t left, nlen = 0;

        if (h->nlmsg_type != RTM_NEWLINK || h->nlmsg_len < NLMSG_LENGTH(sizeof *ifi))
                return;
        ifi = NLMSG_DATA(h);
        left = h->nlmsg_len - NLMSG_LENGTH(sizeof *ifi);
        for (a = IFLA_RTA(ifi); RTA_OK(a, left); a = RTA_NEXT(a, left))
                if (a->rta_type == IFLA_IFNAME) {
                        name = RTA_DATA(a);
                        nlen = strnlen(name, RTA_PAYLOAD(a));
                }
        if (!name || nlen == 0 || nlen >= IF_NAMESIZE)
                return;

        if (nlen == strlen(AGENT_NET_IFNAME) && strncmp(name, AGENT_NET_IFNAME, nlen) == 0) {
                p->have_preferred = true;
                memcpy(p->best, name, nlen);
                p->best[nlen] = 0;
                return;
        }
        if (p->have_preferred || ifi->ifi_type != ARPHRD_ETHER || (ifi->ifi_flags & IFF_LOOPBACK))
                return;
        if (p->best_index > 0 && ifi->ifi_index >= p->best_index)
                return;
        p->best_index = ifi->ifi_index;
        memcpy(p->best, name, nlen);
        p->best[nlen] = 0;
}

int agent_net_pick(char ret[static IF_NAMESIZE]) {
        _cleanup_close_ int fd = -EBADF;
        Pick p = {};
        NlReq req = {};
        struct ifinfomsg *ifi = nl_body(&req, sizeof *ifi);
        int r;

        ifi->ifi_family = AF_UNSPEC;
        fd = nl_open();
        if (fd < 0)
                return fd;
        r = nl_dump(fd, &req, RTM_GETLINK, 1, pick_consider, &p);
        if (r < 0)
                return r;
        if (!p.have_preferred && p.best_index <= 0)
                return -ENODEV;
        memcpy(ret, p.best, IF_NAMESIZE);
        return 0;
}

static void default_route_seen(const struct nlmsghdr *h, void *userdata) {
        const struct rtmsg *rtm;

        if (h->nlmsg_type != RTM_NEWROUTE || h->nlmsg_len < NLMSG_LENGTH(sizeof *rtm))
                return;
        rtm = NLMSG_DATA(h);
        if (rtm->rtm_family == AF_INET && rtm->rtm_dst_len == 0 && rtm->rtm_table == RT_TABLE_MAIN &&
            rtm->rtm_type == RTN_UNICAST)
                *(bool *) userdata = true;
}

int agent_net_has_default_route(void) {
        _cleanup_close_ int fd = -EBADF;
        NlReq req = {};
        struct rtmsg *rtm = nl_body(&req, sizeof *rtm);
        bool found = false;
        int r;

        rtm->rtm_family = AF_INET;
        fd = nl_open();
        if (fd < 0)
                return fd;
        r = nl_dump(fd, &req, RTM_GETROUTE, 1, default_route_seen, &found);
        if (r < 0)
                return r;
        return found;
}

int agent_net_configure(const char *ifname) {
        _cleanup_close_ int fd = -EBADF;
        struct in_addr addr, gw;
        unsigned lo, idx;
        int r;

        if (!ifname || strlen(ifname) >= IF_NAMESIZE)
                return -EINVAL;
        if (inet_pton(AF_INET, AGENT_NET_ADDRESS, &addr) != 1 || inet_pton(AF_INET, AGENT_NET_GATEWAY, &gw) != 1)
                return -EINVAL;

        fd = nl_open();
        if (fd < 0)
                return fd;

        lo = if_nametoindex("lo");
        if (lo > 0) {
                r = link_up(fd, (int) lo, 1);
                if (r < 0)
                        return r;
        }

        idx = if_nametoindex(ifname);
        if (idx == 0)
                return errno == ENODEV || errno == ENXIO ? -ENODEV : -errno;
        if (idx > INT32_MAX)
                return -ERANGE;

        r = link_up(fd, (int) idx, 2);
        if (r < 0)
                return r;
        r = address_add(fd, (int) idx, addr, AGENT_NET_PREFIXLEN, 3);
        if (r < 0)
                return r;
        return default_route_add(fd, (int) idx, gw, 4);
}

void agent_net_setup(void) {
        char ifname[IF_NAMESIZE];
        int r;

        /* a guest at boot has no default route; a PID 1 of a container on a host
         * (the tests) has its host's: leave that network alone */
        r = agent_net_has_default_route();
        if (r != 0) {
                if (r < 0)
                        log_warning_errno(r, "Failed to list routes, leaving the network alone: %m");
                else
                        log_info("A default route exists already; leaving the network alone.");
                return;
        }

        r = agent_net_pick(ifname);
        if (r == -ENODEV) {
                /* no NIC: only lo, and silently */
                _cleanup_close_ int fd = nl_open();
                unsigned lo = if_nametoindex("lo");

                if (fd >= 0 && lo > 0 && link_up(fd, (int) lo, 1) < 0)
                        log_debug("Failed to bring lo up.");
                return;
        }
        if (r < 0)
                return (void) log_warning_errno(r, "Failed to list network links: %m");

        r = agent_net_configure(ifname);
        if (r < 0)
                return (void) log_warning_errno(r, "Failed to configure %s as %s/%d via %s: %m", ifname,
                                                AGENT_NET_ADDRESS, AGENT_NET_PREFIXLEN, AGENT_NET_GATEWAY);
        log_info("%s is %s/%d, default route via %s.", ifname, AGENT_NET_ADDRESS, AGENT_NET_PREFIXLEN,
                 AGENT_NET_GATEWAY);
}
