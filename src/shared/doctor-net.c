/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd doctor: network namespaces and veth pairs, what forkd makes for every
 * child with per-child networking. A child process unshares a network
 * namespace and creates a veth pair in it over rtnetlink (libmnl); when the
 * child exits, the namespace and the pair vanish with it.
 */
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#include "doctor.h"
#include "macro.h"

#define NETNS_CHECK_TIMEOUT_MS 5000

enum { STEP_UNSHARE = 1, STEP_SOCKET, STEP_VETH, STEP_DONE };

struct netns_result {
        int step; /* the step that failed, or STEP_DONE */
        int error;
};

/* RTM_NEWLINK kind veth, name and peer name, in the caller's network namespace. */
static int veth_create(const char *name, const char *peer) {
        char buf[MNL_SOCKET_BUFFER_SIZE];
        struct timeval tv = { .tv_sec = 2 };
        struct mnl_socket *nl;
        struct nlmsghdr *nlh;
        struct ifinfomsg *ifm;
        struct nlattr *linkinfo, *data, *peer_nest;
        unsigned seq = (unsigned) time(NULL), portid;
        ssize_t n;
        int r;

        nlh = mnl_nlmsg_put_header(buf);
        nlh->nlmsg_type = RTM_NEWLINK;
        nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK;
        nlh->nlmsg_seq = seq;
        ifm = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifm));
        ifm->ifi_family = AF_UNSPEC;
        mnl_attr_put_strz(nlh, IFLA_IFNAME, name);
        linkinfo = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
        mnl_attr_put_strz(nlh, IFLA_INFO_KIND, "veth");
        data = mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
        peer_nest = mnl_attr_nest_start(nlh, VETH_INFO_PEER);
        /* The peer's attributes follow an ifinfomsg of its own. */
        ifm = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifm));
        ifm->ifi_family = AF_UNSPEC;
        mnl_attr_put_strz(nlh, IFLA_IFNAME, peer);
        mnl_attr_nest_end(nlh, peer_nest);
        mnl_attr_nest_end(nlh, data);
        mnl_attr_nest_end(nlh, linkinfo);

        nl = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
        if (!nl)
                return -errno;
        if (mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0 ||
            setsockopt(mnl_socket_get_fd(nl), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0) {
                r = -errno;
                goto finish;
        }
        portid = mnl_socket_get_portid(nl);
        if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0) {
                r = -errno;
                goto finish;
        }
        n = mnl_socket_recvfrom(nl, buf, sizeof(buf));
        if (n < 0) {
                r = errno == EAGAIN ? -ETIMEDOUT : -errno;
                goto finish;
        }
        /* The ack: an NLMSG_ERROR carrying 0, or the error (mnl_cb_run sets errno). */
        r = mnl_cb_run(buf, (size_t) n, seq, portid, NULL, NULL) < 0 ? -errno : 0;
finish:
        mnl_socket_close(nl);
        return r;
}

__attribute__((noreturn)) static void netns_child(int fd) {
        struct netns_result res = {};
        int r;

        (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (unshare(CLONE_NEWNET) < 0)
                res = (struct netns_result) { STEP_UNSHARE, errno };
        else {
                r = veth_create("fkdoctor0", "fkdoctor1");
                if (r < 0)
                        res = (struct netns_result) { STEP_VETH, -r };
                else
                        res = (struct netns_result) { STEP_DONE, 0 };
        }
        (void) !write(fd, &res, sizeof(res));
        _exit(0);
}

void doctor_check_netns(const DoctorOptions *o, DoctorCheck *c) {
        _cleanup_close_ int rfd = -EBADF, wfd = -EBADF;
        struct netns_result res = {};
        struct pollfd p;
        int fds[2], r;
        pid_t pid;
        ssize_t n;

        if (geteuid() != 0)
                return doctor_set(c, DOCTOR_SKIP, "run the doctor as root, as forkd runs",
                                  "making a network namespace and a veth pair needs root (uid %u here)",
                                  (unsigned) geteuid());
        if (pipe2(fds, O_CLOEXEC) < 0)
                return doctor_set(c, DOCTOR_FAIL, NULL, "pipe2() failed: %s", strerror(errno));
        rfd = fds[0];
        wfd = fds[1];
        fflush(NULL);
        pid = fork();
        if (pid < 0)
                return doctor_set(c, DOCTOR_FAIL, NULL, "fork() failed: %s", strerror(errno));
        if (pid == 0)
                netns_child(wfd);
        wfd = safe_close(wfd);

        p = (struct pollfd) { .fd = rfd, .events = POLLIN };
        do
                r = poll(&p, 1, NETNS_CHECK_TIMEOUT_MS);
        while (r < 0 && errno == EINTR);
        if (r > 0) {
                n = read(rfd, &res, sizeof(res));
                if (n != (ssize_t) sizeof(res))
                        res = (struct netns_result) { STEP_SOCKET, n < 0 ? errno : EIO };
        } else
                res = (struct netns_result) { 0, r == 0 ? ETIMEDOUT : errno };
        (void) kill(pid, SIGKILL);
        (void) waitpid(pid, NULL, 0);

        switch (res.step) {
        case STEP_DONE:
                return doctor_set(c, DOCTOR_OK, NULL,
                                  "a network namespace with a veth pair made over rtnetlink works (thrown away)");
        case STEP_UNSHARE:
                return doctor_set(c, DOCTOR_FAIL,
                                  "a kernel with CONFIG_NET_NS; in a container, allow CLONE_NEWNET (seccomp, "
                                  "CAP_SYS_ADMIN)",
                                  "unshare(CLONE_NEWNET) failed: %s", strerror(res.error));
        case STEP_VETH:
                return doctor_set(c, DOCTOR_FAIL, "modprobe veth (CONFIG_VETH), and CAP_NET_ADMIN for forkd",
                                  "creating a veth pair in a new network namespace failed: %s", strerror(res.error));
        default:
                return doctor_set(c, DOCTOR_FAIL, NULL, "the namespace check did not finish within %d ms: %s",
                                  NETNS_CHECK_TIMEOUT_MS, strerror(res.error));
        }
}
