/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* netns-helper: src/daemon/netns.c driven from test-netns-child.py.
 *
 *   netns-helper up INDEX none|egress [PREFIX]
 *        netns_child_create(); then this process moves into a namespace of its
 *        own (the fake guest "G") with a tap gtap, prints one JSON line
 *        (name, host_addr, inside_addr, host_ifname, pid) and relays frames
 *        between the child's tap0 (12-byte virtio-net header stripped and
 *        added) and gtap until its standard input closes. G's kernel then
 *        plays the guest: the test gives gtap 172.16.0.2/30. Removes nothing.
 *   netns-helper down NAME     netns_child_destroy(NAME)
 *   netns-helper cleanup       netns_cleanup_leftovers(); prints how many
 *   netns-helper pick N        netns_pick_free(N) twice: both sets printed, disjoint
 *   netns-helper batch N THREADS none|egress
 *                              netns_children_create() of N (1..100) free indices
 *                              with THREADS threads, as a fork makes them; prints
 *                              {"n":N,"threads":T,"ms":M,"names":[...]}, then
 *                              destroys them all (the time is the creation's)
 *   netns-helper allow NAME UID
 *                              netns_children_allow(): UID (and root) may dial NAME's guest
 *   netns-helper nft CMDS      CMDS through libnftables, as an operator's nft(8) would
 *   netns-helper selftest      the pure parts: prefixes, names, addresses,
 *                              refusals leave outputs untouched (TAP lines)
 *
 * Exit status 0 on success, 1 on failure (the step named on stderr). Every
 * mode ends by itself: up after FAILSAFE_SEC at the latest. */

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <nftables/libnftables.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <time.h>

#include "netns-batch.h"
#include "netns.h"

#define FAILSAFE_SEC 240
#define FRAME_MAX 65536

static int open_gtap(void) {
        struct ifreq ifr = {};
        int fd;

        fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0)
                return log_error_errno(errno, "open /dev/net/tun in G: %m");
        memcpy(ifr.ifr_name, "gtap", 5);
        ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
        if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
                int r = log_error_errno(errno, "TUNSETIFF gtap: %m");
                close(fd);
                return r;
        }
        return fd;
}

/* One frame from one tap to the other; a full tap queue drops it, as a wire would. */
static int relay(int child_tap, int gtap) {
        static uint8_t buf[NETNS_VNET_HDR_SIZE + FRAME_MAX];
        struct pollfd p[3] = {
                { .fd = child_tap, .events = POLLIN },
                { .fd = gtap, .events = POLLIN },
                { .fd = STDIN_FILENO, .events = POLLIN },
        };

        for (;;) {
                ssize_t n;

                if (poll(p, 3, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        return log_error_errno(errno, "poll: %m");
                }
                if (p[2].revents) {
                        char c;
                        if (read(STDIN_FILENO, &c, 1) <= 0)
                                return 0; /* the test is done with us */
                }
                if (p[0].revents & POLLIN) {
                        n = read(child_tap, buf, sizeof buf);
                        if (n < 0 && errno != EAGAIN && errno != EINTR)
                                return log_error_errno(errno, "read tap0: %m");
                        if (n > NETNS_VNET_HDR_SIZE)
                                (void) write(gtap, buf + NETNS_VNET_HDR_SIZE, (size_t) n - NETNS_VNET_HDR_SIZE);
                }
                if (p[1].revents & POLLIN) {
                        n = read(gtap, buf + NETNS_VNET_HDR_SIZE, FRAME_MAX);
                        if (n < 0 && errno != EAGAIN && errno != EINTR)
                                return log_error_errno(errno, "read gtap: %m");
                        if (n > 0) {
                                /* No offloads asked for: flags 0, no GSO. */
                                memset(buf, 0, NETNS_VNET_HDR_SIZE);
                                (void) write(child_tap, buf, (size_t) n + NETNS_VNET_HDR_SIZE);
                        }
                }
                if ((p[0].revents | p[1].revents) & (POLLERR | POLLHUP | POLLNVAL))
                        return log_error_errno(EIO, "a tap went away");
        }
}

static int cmd_up(int argc, char **argv) {
        NetnsPrefix prefix;
        NetnsChild c;
        NetnsPolicy policy;
        const char *step = NULL;
        unsigned index;
        int gtap, r, fl;

        if (argc < 4 || argc > 5)
                return log_error_errno(EINVAL, "usage: up INDEX none|egress [PREFIX]");
        index = (unsigned) atoi(argv[2]);
        policy = netns_policy_from_string(argv[3]);
        if (policy < 0)
                return log_error_errno(EINVAL, "bad policy %s", argv[3]);
        r = netns_prefix_parse(argc == 5 ? argv[4] : NETNS_DEFAULT_PREFIX, &prefix);
        if (r < 0)
                return log_error_errno(r, "bad prefix: %m");

        r = netns_child_create(&prefix, index, policy, &c, &step);
        if (r < 0)
                return log_error_errno(r, "netns_child_create(%u): %s: %m", index, step ?: "?");

        /* G, the fake guest: a namespace that dies with this process. */
        if (unshare(CLONE_NEWNET) < 0)
                return log_error_errno(errno, "unshare G: %m");
        gtap = open_gtap();
        if (gtap < 0)
                return gtap;
        fl = fcntl(c.tap_fd, F_GETFL);
        if (fl < 0 || fcntl(c.tap_fd, F_SETFL, fl | O_NONBLOCK) < 0)
                return log_error_errno(errno, "O_NONBLOCK: %m");

        printf("{\"name\": \"%s\", \"host_addr\": \"%s\", \"inside_addr\": \"%s\", \"host_ifname\": \"%s\", "
               "\"policy\": \"%s\", \"pid\": %d}\n",
               c.name, c.host_addr, c.inside_addr, c.host_ifname, netns_policy_to_string(c.policy), (int) getpid());
        fflush(stdout);

        r = relay(c.tap_fd, gtap);
        close(gtap);
        netns_child_done(&c);
        return r;
}

static int cmd_pick(int argc, char **argv) {
        unsigned a[8], b[8], n;
        NetnsPrefix prefix;

        if (argc != 3 || (n = (unsigned) atoi(argv[2])) == 0 || n > 8)
                return log_error_errno(EINVAL, "usage: pick N (1..8)");
        (void) netns_prefix_parse(NETNS_DEFAULT_PREFIX, &prefix);
        if (netns_pick_free(&prefix, n, a) < 0 || netns_pick_free(&prefix, n, b) < 0)
                return log_error_errno(ENOSPC, "pick failed");
        for (unsigned k = 0; k < n; k++)
                printf("%s%u", k ? " " : "", a[k]);
        printf("\n");
        for (unsigned k = 0; k < n; k++)
                printf("%s%u", k ? " " : "", b[k]);
        printf("\n");
        for (unsigned k = 0; k < n; k++) {
                netns_release(a[k]);
                netns_release(b[k]);
        }
        return 0;
}

static int cmd_batch(int argc, char **argv) {
        unsigned idx[100], n, threads, failed = 0;
        NetnsChild kids[100];
        bool made[100];
        const char *step = NULL;
        NetnsPrefix prefix;
        NetnsPolicy policy;
        struct timespec a, b;
        int r, k;

        if (argc != 5 || (n = (unsigned) atoi(argv[2])) == 0 || n > 100 || (threads = (unsigned) atoi(argv[3])) == 0 ||
            (policy = netns_policy_from_string(argv[4])) < 0)
                return log_error_errno(EINVAL, "usage: batch N (1..100) THREADS none|egress");
        (void) netns_prefix_parse(NETNS_DEFAULT_PREFIX, &prefix);
        r = netns_pick_free(&prefix, n, idx);
        if (r < 0)
                return log_error_errno(r, "pick: %m");
        clock_gettime(CLOCK_MONOTONIC, &a);
        r = netns_children_create(&prefix, idx, n, policy, threads, kids, made, &failed, &step);
        clock_gettime(CLOCK_MONOTONIC, &b);
        if (r < 0)
                log_error_errno(r, "child %u: %s: %m", idx[failed], step ?: "?");
        else {
                printf("{\"n\":%u,\"threads\":%u,\"ms\":%.1f,\"names\":[", n, threads,
                       (double) (b.tv_sec - a.tv_sec) * 1e3 + (double) (b.tv_nsec - a.tv_nsec) / 1e6);
                for (unsigned i = 0; i < n; i++)
                        printf("%s\"%s\"", i ? "," : "", kids[i].name);
                printf("]}\n");
                fflush(stdout);
        }
        for (unsigned i = 0; i < n; i++) {
                if (made[i]) {
                        netns_child_done(&kids[i]);
                        k = netns_child_destroy(kids[i].name);
                        if (k < 0 && r >= 0)
                                r = log_error_errno(k, "destroy %s: %m", kids[i].name);
                }
                netns_release(idx[i]);
        }
        return r < 0 ? r : 0;
}

/* What an operator does with nft(8), which the test host need not have. */
static int cmd_nft(const char *cmds) {
        struct nft_ctx *ctx = nft_ctx_new(NFT_CTX_DEFAULT);
        int r;

        if (!ctx)
                return log_error_errno(ENOMEM, "nft_ctx_new failed");
        r = nft_run_cmd_from_buffer(ctx, cmds);
        nft_ctx_free(ctx);
        return r == 0 ? 0 : log_error_errno(EPROTO, "nft refused: %s", cmds);
}

static unsigned tests_run, tests_failed;

static void check(bool ok, const char *what) {
        tests_run++;
        if (!ok)
                tests_failed++;
        printf("%s %u - %s\n", ok ? "ok" : "not ok", tests_run, what);
}

static bool addr_is(struct in_addr a, const char *s) {
        char buf[INET_ADDRSTRLEN];
        return inet_ntop(AF_INET, &a, buf, sizeof buf) && strcmp(buf, s) == 0;
}

static int cmd_selftest(void) {
        NetnsPrefix p, q = { .addr = 42, .len = 42 };
        struct in_addr h = { .s_addr = 7 }, in = { .s_addr = 7 };
        NetnsChild c = { .index = 4242, .tap_fd = -42 };
        char name[NETNS_NAME_MAX];
        unsigned i = 4242, picked[4] = { 9, 9, 9, 9 };
        const char *step = NULL;

        check(netns_prefix_parse("10.200.0.0/16", &p) == 0 && p.len == 16 && p.addr == 0x0ac80000u, "default prefix parses");
        check(netns_prefix_capacity(&p) == 16384, "a /16 holds 16384 children");
        check(netns_child_addrs(&p, 1, &h, &in) == 0 && addr_is(h, "10.200.0.1") && addr_is(in, "10.200.0.2"), "child 1: .1 and .2");
        check(netns_child_addrs(&p, 2, &h, &in) == 0 && addr_is(h, "10.200.0.5") && addr_is(in, "10.200.0.6"), "child 2: .5 and .6");
        check(netns_child_addrs(&p, 16384, &h, &in) == 0 && addr_is(h, "10.200.255.253") && addr_is(in, "10.200.255.254"),
              "the last child: .255.253 and .255.254");
        h.s_addr = in.s_addr = 7;
        check(netns_child_addrs(&p, 16385, &h, &in) == -ERANGE && h.s_addr == 7 && in.s_addr == 7, "past capacity: ERANGE, outputs untouched");
        check(netns_child_addrs(&p, 0, &h, &in) == -ERANGE, "index 0: ERANGE");
        check(netns_prefix_parse("10.200.0.0/30", &p) == 0 && netns_prefix_capacity(&p) == 1, "a /30 holds one");
        check(netns_prefix_parse("10.0.0.0/8", &p) == 0 && netns_prefix_capacity(&p) == NETNS_INDEX_MAX, "a /8 is capped at NETNS_INDEX_MAX");

        static const char *const bad_prefixes[] = {
                "10.200.0.1/16", "10.200.0.0/31", "10.200.0.0/7", "10.200.0.0", "10.200.0.0/016", "10.200.0.0/16 ",
                "/16", "10.200.0/16", "10.200.0.0/+16", "", "300.0.0.0/8", "10.200.0.0/16/16",
                "10.200.0.0/1600000000000000000000000000000000",
        };
        bool all = true;
        for (size_t k = 0; k < ELEMENTSOF(bad_prefixes); k++)
                if (netns_prefix_parse(bad_prefixes[k], &q) != -EINVAL || q.addr != 42 || q.len != 42) {
                        printf("# accepted or clobbered: '%s'\n", bad_prefixes[k]);
                        all = false;
                }
        check(all, "bad prefixes refused, output untouched");

        check(netns_child_name(7, name) == 0 && strcmp(name, "forkd-child-7") == 0, "name of 7");
        check(netns_child_name(NETNS_INDEX_MAX, name) == 0 && strlen(name) + 1 <= NETNS_NAME_MAX, "the longest name fits");
        check(netns_child_name(0, name) == -ERANGE && netns_child_name(NETNS_INDEX_MAX + 1, name) == -ERANGE, "names out of range refused");
        check(netns_child_index_from_name("forkd-child-65535", &i) == 0 && i == 65535, "index of forkd-child-65535");
        static const char *const bad_names[] = {
                "forkd-child-0", "forkd-child-01", "forkd-child-65536", "forkd-child-", "forkd-child-1x",
                "forkd-child--1", "forkd-child-+1", "fork-child-1", "forkd-child-99999999999", "",
        };
        all = true;
        i = 4242;
        for (size_t k = 0; k < ELEMENTSOF(bad_names); k++)
                if (netns_child_index_from_name(bad_names[k], &i) >= 0 || i != 4242) {
                        printf("# accepted or clobbered: '%s'\n", bad_names[k]);
                        all = false;
                }
        check(all, "bad names refused, output untouched");
        check(netns_child_destroy("../../etc") == -EINVAL && netns_child_destroy("forkd-child-0") < 0, "destroy refuses names it did not make");

        check(netns_policy_from_string("none") == NETNS_POLICY_NONE && netns_policy_from_string("egress") == NETNS_POLICY_EGRESS &&
              netns_policy_from_string("Egress") < 0 && netns_policy_from_string(NULL) < 0, "policies");

        (void) netns_prefix_parse("10.200.0.0/30", &p);
        check(netns_child_create(&p, 2, NETNS_POLICY_NONE, &c, &step) == -ERANGE && c.index == 4242 && c.tap_fd == -42 &&
              step && strstr(step, "prefix"), "create past the prefix: ERANGE naming the step, output untouched");
        check(netns_child_create(&p, 1, (NetnsPolicy) 7, &c, &step) == -EINVAL && c.index == 4242, "create with a bad policy: EINVAL");
        check(netns_pick_free(&p, 2, picked) == -ENOSPC && picked[0] == 9 && picked[1] == 9, "pick more than fit: ENOSPC, output untouched");
        check(netns_pick_free(&p, 0, picked) == -EINVAL && netns_pick_free(&p, NETNS_PICK_MAX + 1, picked) == -EINVAL, "pick 0 or too many: EINVAL");

        printf("1..%u\n", tests_run);
        return tests_failed ? -EIO : 0;
}

/* allow NAME UID: netns_children_allow() for the child called NAME. */
static int cmd_allow(const char *name, const char *uid_s) {
        NetnsChild c = { .tap_fd = -EBADF };
        unsigned index;
        char *end;
        unsigned long uid;
        int r;

        errno = 0;
        uid = strtoul(uid_s, &end, 10);
        if (errno != 0 || end == uid_s || *end || uid >= (uid_t) -1)
                return log_error_errno(EINVAL, "allow: bad uid '%s'", uid_s);
        r = netns_child_index_from_name(name, &index);
        if (r < 0)
                return log_error_errno(r, "allow: bad name '%s'", name);
        (void) snprintf(c.host_ifname, sizeof c.host_ifname, NETNS_HOST_IFNAME_PREFIX "%u", index);
        r = netns_children_allow(&c, 1, (uid_t) uid);
        if (r < 0)
                return log_error_errno(r, "netns_children_allow(%s, %lu): %m", name, uid);
        return 0;
}

int main(int argc, char **argv) {
        int r;

        log_prefix = "netns-helper";
        if (getenv("NETNS_HELPER_DEBUG"))
                log_max_level = LOG_LVL_DEBUG;
        alarm(FAILSAFE_SEC);

        if (argc < 2)
                r = log_error_errno(EINVAL, "usage: netns-helper up|down|cleanup|pick|selftest ...");
        else if (strcmp(argv[1], "up") == 0)
                r = cmd_up(argc, argv);
        else if (strcmp(argv[1], "down") == 0 && argc == 3) {
                r = netns_child_destroy(argv[2]);
                if (r < 0)
                        log_error_errno(r, "netns_child_destroy(%s): %m", argv[2]);
        } else if (strcmp(argv[1], "cleanup") == 0 && argc == 2) {
                r = netns_cleanup_leftovers();
                if (r < 0)
                        log_error_errno(r, "netns_cleanup_leftovers: %m");
                else
                        printf("%d\n", r);
        } else if (strcmp(argv[1], "pick") == 0)
                r = cmd_pick(argc, argv);
        else if (strcmp(argv[1], "batch") == 0)
                r = cmd_batch(argc, argv);
        else if (strcmp(argv[1], "allow") == 0 && argc == 4)
                r = cmd_allow(argv[2], argv[3]);
        else if (strcmp(argv[1], "nft") == 0 && argc == 3)
                r = cmd_nft(argv[2]);
        else if (strcmp(argv[1], "selftest") == 0 && argc == 2)
                r = cmd_selftest();
        else
                r = log_error_errno(EINVAL, "unknown command");
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
