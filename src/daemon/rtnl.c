/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* rtnetlink over libmnl: the handful of requests netns.c makes (rtnl.h). */

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/if.h>
#include <linux/if_link.h>
#include <linux/ip.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#include "rtnl.h"
#include "strv.h"

/* One request: an ifinfomsg, a name, a nested link info and a nested peer. */
#define RTNL_REQUEST_SIZE 1024u
/* One receive: a dump batch of the kernel fits (it sizes them to the reader's buffer, at most 32 KiB). */
#define RTNL_RECV_SIZE 32768u
/* No answer from the kernel within this is an error, not a hang. */
#define RTNL_RECV_TIMEOUT_SEC 5

static uint32_t rtnl_next_seq(void) {
        static uint32_t seq;

        if (__atomic_load_n(&seq, __ATOMIC_RELAXED) == 0)
                __atomic_store_n(&seq, (uint32_t) time(NULL), __ATOMIC_RELAXED);
        return __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED);
}

int rtnl_open(struct mnl_socket **ret) {
        struct timeval tv = { .tv_sec = RTNL_RECV_TIMEOUT_SEC };
        struct mnl_socket *nl;

        nl = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
        if (!nl)
                return log_debug_errno(negative_errno(), "rtnl: socket: %m");
        if (setsockopt(mnl_socket_get_fd(nl), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ||
            mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
                int r = negative_errno();
                mnl_socket_close(nl);
                return log_debug_errno(r, "rtnl: bind: %m");
        }
        *ret = nl;
        return 0;
}

struct mnl_socket *rtnl_close(struct mnl_socket *nl) {
        if (nl)
                mnl_socket_close(nl);
        return NULL;
}

/* Sends nlh and reads until its acknowledgement (or NLMSG_DONE for a dump),
 * handing every other answer to cb. An NLMSG_ERROR is its -errno. */
static int rtnl_talk(struct mnl_socket *nl, struct nlmsghdr *nlh, mnl_cb_t cb, void *userdata) {
        _cleanup_free_ char *buf = NULL;
        uint32_t portid = mnl_socket_get_portid(nl), seq;

        buf = malloc(RTNL_RECV_SIZE);
        if (!buf)
                return -ENOMEM;

        seq = nlh->nlmsg_seq = rtnl_next_seq();
        /* NLM_F_DUMP's bits mean REPLACE and EXCL on a NEW request: only a GET dumps. */
        if (!((nlh->nlmsg_type == RTM_GETLINK || nlh->nlmsg_type == RTM_GETADDR || nlh->nlmsg_type == RTM_GETROUTE) &&
              (nlh->nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP))
                nlh->nlmsg_flags |= NLM_F_ACK;
        if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0)
                return negative_errno();

        for (;;) {
                ssize_t n;
                int r;

                n = mnl_socket_recvfrom(nl, buf, RTNL_RECV_SIZE);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        /* SO_RCVTIMEO ran out. */
                        return errno == EAGAIN ? -ETIMEDOUT : negative_errno();
                }
                errno = 0;
                r = mnl_cb_run(buf, (size_t) n, seq, portid, cb, userdata);
                if (r < 0)
                        /* errno: the kernel's error, ESRCH/EPROTO for a stray
                         * message, or what the callback set. */
                        return negative_errno();
                if (r == MNL_CB_STOP)
                        return 0;
        }
}

static struct nlmsghdr *rtnl_link_request(char *buf, uint16_t type, uint16_t flags, const char *ifname) {
        struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
        struct ifinfomsg *ifi;

        nlh->nlmsg_type = type;
        nlh->nlmsg_flags = NLM_F_REQUEST | flags;
        ifi = mnl_nlmsg_put_extra_header(nlh, sizeof *ifi);
        ifi->ifi_family = AF_UNSPEC;
        if (ifname && !mnl_attr_put_strz_check(nlh, RTNL_REQUEST_SIZE, IFLA_IFNAME, ifname))
                return NULL;
        return nlh;
}

static bool ifname_valid(const char *ifname) {
        size_t l;

        if (!ifname)
                return false;
        l = strnlen(ifname, IFNAMSIZ);
        return l > 0 && l < IFNAMSIZ && !strchr(ifname, '/') && !strchr(ifname, ':');
}

static int link_index_cb(const struct nlmsghdr *nlh, void *userdata) {
        const struct ifinfomsg *ifi;

        if (nlh->nlmsg_type != RTM_NEWLINK || mnl_nlmsg_get_payload_len(nlh) < sizeof *ifi) {
                errno = EPROTO;
                return MNL_CB_ERROR;
        }
        ifi = mnl_nlmsg_get_payload(nlh);
        *(int *) userdata = ifi->ifi_index;
        return MNL_CB_OK;
}

int rtnl_link_index(struct mnl_socket *nl, const char *ifname, int *ret_ifindex) {
        char buf[RTNL_REQUEST_SIZE];
        struct nlmsghdr *nlh;
        int ifindex = 0, r;

        if (!ifname_valid(ifname))
                return -EINVAL;
        nlh = rtnl_link_request(buf, RTM_GETLINK, 0, ifname);
        if (!nlh)
                return -ENOBUFS;
        r = rtnl_talk(nl, nlh, link_index_cb, &ifindex);
        if (r < 0)
                return r;
        if (ifindex <= 0)
                return -ENODEV;
        *ret_ifindex = ifindex;
        return 0;
}

int rtnl_link_up(struct mnl_socket *nl, const char *ifname) {
        char buf[RTNL_REQUEST_SIZE];
        struct nlmsghdr *nlh;
        struct ifinfomsg *ifi;

        if (!ifname_valid(ifname))
                return -EINVAL;
        nlh = rtnl_link_request(buf, RTM_NEWLINK, 0, ifname);
        if (!nlh)
                return -ENOBUFS;
        ifi = mnl_nlmsg_get_payload(nlh);
        ifi->ifi_flags = IFF_UP;
        ifi->ifi_change = IFF_UP;
        return rtnl_talk(nl, nlh, NULL, NULL);
}

/* RTM_NEWLINK on ifname with IFLA_AF_SPEC { family { type: payload } } or,
 * with inner_nest, IFLA_AF_SPEC { family { inner_nest { type: payload } } }. */
static int rtnl_link_set_af(struct mnl_socket *nl, const char *ifname, uint16_t family, uint16_t inner_nest,
                            uint16_t type, const void *payload, size_t size) {
        char buf[RTNL_REQUEST_SIZE];
        struct nlattr *spec, *af, *inner = NULL;
        struct nlmsghdr *nlh;

        if (!ifname_valid(ifname))
                return -EINVAL;
        nlh = rtnl_link_request(buf, RTM_NEWLINK, 0, ifname);
        if (!nlh)
                return -ENOBUFS;
        spec = mnl_attr_nest_start_check(nlh, RTNL_REQUEST_SIZE, IFLA_AF_SPEC);
        if (!spec)
                return -ENOBUFS;
        af = mnl_attr_nest_start_check(nlh, RTNL_REQUEST_SIZE, family);
        if (!af)
                return -ENOBUFS;
        if (inner_nest) {
                inner = mnl_attr_nest_start_check(nlh, RTNL_REQUEST_SIZE, inner_nest);
                if (!inner)
                        return -ENOBUFS;
        }
        if (!mnl_attr_put_check(nlh, RTNL_REQUEST_SIZE, type, size, payload))
                return -ENOBUFS;
        if (inner)
                mnl_attr_nest_end(nlh, inner);
        mnl_attr_nest_end(nlh, af);
        mnl_attr_nest_end(nlh, spec);
        return rtnl_talk(nl, nlh, NULL, NULL);
}

int rtnl_link_set_ipv4_forwarding(struct mnl_socket *nl, const char *ifname, bool on) {
        uint32_t v = on;

        return rtnl_link_set_af(nl, ifname, AF_INET, IFLA_INET_CONF, IPV4_DEVCONF_FORWARDING, &v, sizeof v);
}

int rtnl_link_set_ipv6_addrgen_none(struct mnl_socket *nl, const char *ifname) {
        uint8_t mode = IN6_ADDR_GEN_MODE_NONE;
        int r;

        r = rtnl_link_set_af(nl, ifname, AF_INET6, 0, IFLA_INET6_ADDR_GEN_MODE, &mode, sizeof mode);
        return r == -EAFNOSUPPORT ? 0 : r;
}

int rtnl_link_delete(struct mnl_socket *nl, const char *ifname) {
        char buf[RTNL_REQUEST_SIZE];
        struct nlmsghdr *nlh;
        int r;

        if (!ifname_valid(ifname))
                return -EINVAL;
        nlh = rtnl_link_request(buf, RTM_DELLINK, 0, ifname);
        if (!nlh)
                return -ENOBUFS;
        r = rtnl_talk(nl, nlh, NULL, NULL);
        if (r == -ENODEV)
                return 0;
        return r < 0 ? r : 1;
}

int rtnl_addr_add(struct mnl_socket *nl, const char *ifname, struct in_addr addr, unsigned prefixlen) {
        char buf[RTNL_REQUEST_SIZE];
        struct nlmsghdr *nlh;
        struct ifaddrmsg *ifa;
        int ifindex, r;

        if (prefixlen > 32)
                return -EINVAL;
        r = rtnl_link_index(nl, ifname, &ifindex);
        if (r < 0)
                return r;

        nlh = mnl_nlmsg_put_header(buf);
        nlh->nlmsg_type = RTM_NEWADDR;
        nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_REPLACE;
        ifa = mnl_nlmsg_put_extra_header(nlh, sizeof *ifa);
        ifa->ifa_family = AF_INET;
        ifa->ifa_prefixlen = (unsigned char) prefixlen;
        ifa->ifa_scope = RT_SCOPE_UNIVERSE;
        ifa->ifa_index = (unsigned) ifindex;
        if (!mnl_attr_put_check(nlh, RTNL_REQUEST_SIZE, IFA_LOCAL, sizeof addr, &addr) ||
            !mnl_attr_put_check(nlh, RTNL_REQUEST_SIZE, IFA_ADDRESS, sizeof addr, &addr))
                return -ENOBUFS;
        return rtnl_talk(nl, nlh, NULL, NULL);
}

int rtnl_route_default(struct mnl_socket *nl, struct in_addr gw) {
        char buf[RTNL_REQUEST_SIZE];
        struct nlmsghdr *nlh;
        struct rtmsg *rtm;

        nlh = mnl_nlmsg_put_header(buf);
        nlh->nlmsg_type = RTM_NEWROUTE;
        nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_REPLACE;
        rtm = mnl_nlmsg_put_extra_header(nlh, sizeof *rtm);
        rtm->rtm_family = AF_INET;
        rtm->rtm_dst_len = 0;
        rtm->rtm_table = RT_TABLE_MAIN;
        rtm->rtm_protocol = RTPROT_BOOT;
        rtm->rtm_scope = RT_SCOPE_UNIVERSE;
        rtm->rtm_type = RTN_UNICAST;
        if (!mnl_attr_put_check(nlh, RTNL_REQUEST_SIZE, RTA_GATEWAY, sizeof gw, &gw))
                return -ENOBUFS;
        return rtnl_talk(nl, nlh, NULL, NULL);
}

int rtnl_veth_create(struct mnl_socket *nl, const char *ifname, const char *peer_ifname, int peer_netns_fd) {
        char buf[RTNL_REQUEST_SIZE];
        struct nlattr *linkinfo, *data, *peer;
        struct nlmsghdr *nlh;
        struct ifinfomsg *pifi;

        if (!ifname_valid(ifname) || !ifname_valid(peer_ifname) || peer_netns_fd < 0)
                return -EINVAL;
        nlh = rtnl_link_request(buf, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, ifname);
        if (!nlh)
                return -ENOBUFS;

        linkinfo = mnl_attr_nest_start_check(nlh, RTNL_REQUEST_SIZE, IFLA_LINKINFO);
        if (!linkinfo || !mnl_attr_put_strz_check(nlh, RTNL_REQUEST_SIZE, IFLA_INFO_KIND, "veth"))
                return -ENOBUFS;
        data = mnl_attr_nest_start_check(nlh, RTNL_REQUEST_SIZE, IFLA_INFO_DATA);
        if (!data)
                return -ENOBUFS;
        peer = mnl_attr_nest_start_check(nlh, RTNL_REQUEST_SIZE, VETH_INFO_PEER);
        if (!peer || nlh->nlmsg_len + MNL_ALIGN(sizeof *pifi) > RTNL_REQUEST_SIZE)
                return -ENOBUFS;
        /* The peer's attributes follow an ifinfomsg of its own. */
        pifi = mnl_nlmsg_put_extra_header(nlh, sizeof *pifi);
        pifi->ifi_family = AF_UNSPEC;
        if (!mnl_attr_put_strz_check(nlh, RTNL_REQUEST_SIZE, IFLA_IFNAME, peer_ifname) ||
            !mnl_attr_put_u32_check(nlh, RTNL_REQUEST_SIZE, IFLA_NET_NS_FD, (uint32_t) peer_netns_fd))
                return -ENOBUFS;
        mnl_attr_nest_end(nlh, peer);
        mnl_attr_nest_end(nlh, data);
        mnl_attr_nest_end(nlh, linkinfo);
        return rtnl_talk(nl, nlh, NULL, NULL);
}

typedef struct LinkList {
        const char *prefix, *kind;
        char **names;
        size_t n, seen;
} LinkList;

static int linkinfo_kind_cb(const struct nlattr *attr, void *userdata) {
        if (mnl_attr_get_type(attr) == IFLA_INFO_KIND && mnl_attr_validate(attr, MNL_TYPE_NUL_STRING) >= 0)
                *(const char **) userdata = mnl_attr_get_str(attr);
        return MNL_CB_OK;
}

typedef struct LinkAttrs {
        const char *ifname, *kind;
} LinkAttrs;

static int link_attr_cb(const struct nlattr *attr, void *userdata) {
        LinkAttrs *a = userdata;

        switch (mnl_attr_get_type(attr)) {
        case IFLA_IFNAME:
                if (mnl_attr_validate(attr, MNL_TYPE_NUL_STRING) >= 0)
                        a->ifname = mnl_attr_get_str(attr);
                break;
        case IFLA_LINKINFO:
                if (mnl_attr_validate(attr, MNL_TYPE_NESTED) >= 0)
                        (void) mnl_attr_parse_nested(attr, linkinfo_kind_cb, &a->kind);
                break;
        }
        return MNL_CB_OK;
}

static int link_list_cb(const struct nlmsghdr *nlh, void *userdata) {
        LinkList *l = userdata;
        LinkAttrs a = {};
        char **n;

        if (nlh->nlmsg_type != RTM_NEWLINK || mnl_nlmsg_get_payload_len(nlh) < sizeof(struct ifinfomsg)) {
                errno = EPROTO;
                return MNL_CB_ERROR;
        }
        if (++l->seen > RTNL_LINKS_MAX) {
                errno = E2BIG;
                return MNL_CB_ERROR;
        }
        if (mnl_attr_parse(nlh, sizeof(struct ifinfomsg), link_attr_cb, &a) < 0) {
                errno = EPROTO;
                return MNL_CB_ERROR;
        }
        if (!a.ifname || strnlen(a.ifname, IFNAMSIZ) >= IFNAMSIZ ||
            strncmp(a.ifname, l->prefix, strlen(l->prefix)) != 0)
                return MNL_CB_OK;
        if (l->kind && (!a.kind || strcmp(a.kind, l->kind) != 0))
                return MNL_CB_OK;

        n = reallocarray(l->names, l->n + 2, sizeof(char *));
        if (!n) {
                errno = ENOMEM;
                return MNL_CB_ERROR;
        }
        l->names = n;
        l->names[l->n] = strdup(a.ifname);
        if (!l->names[l->n]) {
                errno = ENOMEM;
                return MNL_CB_ERROR;
        }
        l->names[++l->n] = NULL;
        return MNL_CB_OK;
}

int rtnl_link_list(struct mnl_socket *nl, const char *prefix, const char *kind, char ***ret) {
        char buf[RTNL_REQUEST_SIZE];
        LinkList l = { .prefix = prefix, .kind = kind };
        struct nlmsghdr *nlh;
        int r;

        if (!prefix || strlen(prefix) >= IFNAMSIZ)
                return -EINVAL;
        nlh = rtnl_link_request(buf, RTM_GETLINK, NLM_F_DUMP, NULL);
        if (!nlh)
                return -ENOBUFS;
        r = rtnl_talk(nl, nlh, link_list_cb, &l);
        if (r < 0) {
                strv_free(l.names);
                return r;
        }
        if (!l.names) {
                l.names = calloc(1, sizeof(char *));
                if (!l.names)
                        return -ENOMEM;
        }
        *ret = l.names;
        return 0;
}
