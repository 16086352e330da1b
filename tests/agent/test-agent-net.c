/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * agent_net_pick() and agent_net_configure() in a network namespace of this
 * test's own (unshare(CLONE_NEWNET)), with veth pairs standing in for the
 * guest's virtio NIC, checked with ip -j. TAP. Needs root; skips without.
 */

#include <errno.h>
#include <json-c/json.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent-net.h"
#include "agent.h"
#include "macro.h"

static unsigned n_tests, n_failed;

static void check(bool ok, const char *fmt, ...) {
        va_list ap;

        n_tests++;
        if (!ok)
                n_failed++;
        printf("%s %u - ", ok ? "ok" : "not ok", n_tests);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
        fflush(stdout);
}

static int sh(const char *fmt, ...) {
        char cmd[512];
        va_list ap;
        int st;

        va_start(ap, fmt);
        vsnprintf(cmd, sizeof cmd, fmt, ap);
        va_end(ap);
        st = system(cmd);
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Run an ip -j command and parse its output. */
static struct json_object *ip_json(const char *args) {
        char cmd[256], buf[65536];
        size_t n = 0, k;
        FILE *p;

        snprintf(cmd, sizeof cmd, "ip -j %s", args);
        p = popen(cmd, "r");
        if (!p)
                return NULL;
        while (n < sizeof buf - 1 && (k = fread(buf + n, 1, sizeof buf - 1 - n, p)) > 0)
                n += k;
        buf[n] = 0;
        (void) pclose(p);
        return json_tokener_parse(buf);
}

static const char *str_of(struct json_object *o, const char *key) {
        struct json_object *v;

        if (!o || !json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
                return NULL;
        return json_object_get_string(v);
}

static bool has_flag(struct json_object *link, const char *flag) {
        struct json_object *flags;

        if (!link || !json_object_object_get_ex(link, "flags", &flags) || !json_object_is_type(flags, json_type_array))
                return false;
        for (size_t i = 0; i < json_object_array_length(flags); i++)
                if (streq(json_object_get_string(json_object_array_get_idx(flags, i)) ?: "", flag))
                        return true;
        return false;
}

static struct json_object *first(struct json_object *arr) {
        if (!arr || !json_object_is_type(arr, json_type_array) || json_object_array_length(arr) < 1)
                return NULL;
        return json_object_array_get_idx(arr, 0);
}

/* The IPv4 addresses of dev as "a/len" joined by spaces. */
static void inet_of(const char *dev, char *out, size_t size) {
        char args[64];
        struct json_object *arr, *infos;

        out[0] = 0;
        snprintf(args, sizeof args, "-4 addr show dev %s", dev);
        arr = ip_json(args);
        if (first(arr) && json_object_object_get_ex(first(arr), "addr_info", &infos))
                for (size_t i = 0; i < json_object_array_length(infos); i++) {
                        struct json_object *a = json_object_array_get_idx(infos, i), *pl;
                        size_t l = strlen(out);

                        if (!json_object_object_get_ex(a, "prefixlen", &pl))
                                continue;
                        snprintf(out + l, size - l, "%s%s/%d", l ? " " : "", str_of(a, "local") ?: "?",
                                 json_object_get_int(pl));
                }
        json_object_put(arr);
}

static bool link_is_up(const char *dev) {
        char args[64];
        struct json_object *arr;
        bool up;

        snprintf(args, sizeof args, "link show dev %s", dev);
        arr = ip_json(args);
        up = has_flag(first(arr), "UP");
        json_object_put(arr);
        return up;
}

static void check_configured(const char *dev, const char *what) {
        char addrs[256];
        struct json_object *routes, *r;
        unsigned n_default;

        inet_of(dev, addrs, sizeof addrs);
        check(streq(addrs, AGENT_NET_ADDRESS "/30"), "%s: %s has exactly %s/%d (got '%s')", what, dev,
              AGENT_NET_ADDRESS, AGENT_NET_PREFIXLEN, addrs);
        check(link_is_up(dev), "%s: %s is up", what, dev);
        check(link_is_up("lo"), "%s: lo is up", what);

        routes = ip_json("-4 route show default");
        n_default = routes && json_object_is_type(routes, json_type_array) ? (unsigned) json_object_array_length(routes) : 0;
        r = first(routes);
        check(n_default == 1 && streq(str_of(r, "gateway") ?: "", AGENT_NET_GATEWAY) && streq(str_of(r, "dev") ?: "", dev),
              "%s: one default route, via %s dev %s (got %u, via %s dev %s)", what, AGENT_NET_GATEWAY, dev, n_default,
              str_of(r, "gateway") ?: "-", str_of(r, "dev") ?: "-");
        json_object_put(routes);
}

int main(void) {
        char name[IF_NAMESIZE], before[IF_NAMESIZE] = "untouched";
        int r;

        if (geteuid() != 0) {
                printf("1..0 # SKIP needs root to unshare(CLONE_NEWNET) and make veth links\n");
                return 0;
        }
        if (unshare(CLONE_NEWNET) < 0) {
                printf("Bail out! unshare(CLONE_NEWNET) failed as root: %s\n", strerror(errno));
                return 1;
        }
        log_max_level = LOG_LVL_DEBUG;

        /* nothing but lo */
        memcpy(name, before, sizeof name);
        r = agent_net_pick(name);
        check(r == -ENODEV && memcmp(name, before, sizeof name) == 0, "no NIC: pick says ENODEV, name untouched (r=%d)", r);
        agent_net_setup();
        check(link_is_up("lo"), "no NIC: setup brings lo up");
        {
                struct json_object *routes = ip_json("-4 route show default");

                check(routes && json_object_array_length(routes) == 0, "no NIC: setup adds no route");
                json_object_put(routes);
        }
        r = agent_net_configure("eth0");
        check(r == -ENODEV, "configure of a missing eth0: ENODEV (r=%d)", r);
        r = agent_net_configure("an-overlong-interface-name");
        check(r == -EINVAL, "configure of an overlong name: EINVAL (r=%d)", r);

        /* an ethernet link that is not eth0: the one with the lowest ifindex */
        if (sh("ip link add net7 type veth peer name peer7") != 0 ||
            sh("ip link add net5 type veth peer name peer5") != 0) {
                printf("Bail out! cannot make veth links\n");
                return 1;
        }
        r = agent_net_pick(name);
        check(r == 0 && streq(name, "peer7"), "no eth0: pick the ethernet link with the lowest ifindex (got %s)",
              r == 0 ? name : strerror(-r));

        /* eth0 wins over lower ifindexes */
        if (sh("ip link add eth0 type veth peer name eth0-peer") != 0 || sh("ip link set eth0-peer up") != 0) {
                printf("Bail out! cannot make the eth0 veth\n");
                return 1;
        }
        r = agent_net_pick(name);
        check(r == 0 && streq(name, "eth0"), "eth0 is picked when it exists (got %s)", r == 0 ? name : strerror(-r));

        r = agent_net_configure(name);
        check(r == 0, "configure eth0 (r=%d %s)", r, r < 0 ? strerror(-r) : "");
        check_configured("eth0", "first");

        r = agent_net_configure(name);
        check(r == 0, "configure again is harmless (r=%d)", r);
        check_configured("eth0", "again");

        /* what PID 1 runs: with a default route there, nothing is touched */
        check(agent_net_has_default_route() == 1, "the default route is seen");
        (void) sh("ip addr flush dev eth0"); /* takes the default route via eth0 along */
        if (sh("ip link set peer7 up && ip addr add 10.9.0.2/24 dev peer7 && ip route add default via 10.9.0.1") != 0) {
                printf("Bail out! cannot set up a host-like default route\n");
                return 1;
        }
        (void) sh("ip link set lo down");
        agent_net_setup();
        {
                char addrs[256];

                inet_of("eth0", addrs, sizeof addrs);
                check(addrs[0] == 0 && !link_is_up("lo"), "setup with a default route in place touches nothing (eth0 has '%s')",
                      addrs);
        }

        /* a fresh network (no default route, lo down, eth0 down and bare): setup configures it */
        (void) sh("ip link set eth0 down; ip route del default; ip link set peer7 down");
        check(agent_net_has_default_route() == 0, "no default route is seen once it is deleted");
        agent_net_setup();
        check_configured("eth0", "setup");

        /* a link without carrier (its veth peer down) still gets its address and route */
        if (sh("ip link del eth0") != 0) {
                printf("Bail out! cannot remove eth0\n");
                return 1;
        }
        r = agent_net_configure("net5");
        check(r == 0, "configure a link without carrier (r=%d %s)", r, r < 0 ? strerror(-r) : "");
        check_configured("net5", "no carrier");

        printf("1..%u\n", n_tests);
        return n_failed ? 1 : 0;
}
