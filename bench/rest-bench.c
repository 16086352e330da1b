/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * bench/rest: the cost of forkd-rest. Round trips of ping and eval to one
 * sandbox of the test guest over REST (one keep-alive HTTP connection) and
 * the same calls made directly over D-Bus to org.forkd.Manager, in the same
 * run; then GET /healthz throughput under load from wrk.
 *
 * Every round trip is also broken down, in the same run:
 *  - REST through forkd-rest's default path (its direct connection to forkd
 *    when it runs as root) and, with --url-bus, through a second forkd-rest
 *    started with --no-direct, so the D-Bus hop goes through the bus daemon;
 *  - D-Bus straight from here, through the bus daemon and (when forkd offers
 *    one, see its DirectSocket property) on forkd's direct socket;
 *  - with --vmm, ping on the raw agent socket of a forkd-vmm that this
 *    program boots itself: the VMM and guest part of every figure above;
 *  - with --url-installed (and --url-installed-bus), eval through forkd-rest
 *    running as the unprivileged bridge user, as installed: on forkd's direct
 *    socket as the trusted bridge (and with --no-direct, through the bus and
 *    polkitd). That user forks a sandbox of its own first through its
 *    forkd-rest (what root made is not its to eval) and evaluates in it.
 *
 * The test guest does not implement eval: its agent answers an error, which
 * forkd returns as org.forkd.Error.GuestError and forkd-rest as a 500 with
 * {"error": ...}. The eval figures are that round trip, guest included.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <getopt.h>
#include <json-c/json.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <systemd/sd-bus.h>
#include <time.h>

#include "agent-proto.h"
#include "macro.h"

static const char *arg_url, *arg_token_file, *arg_bus_address, *arg_kernel, *arg_rootfs, *arg_url_bus, *arg_vmm;
static const char *arg_url_installed, *arg_url_installed_bus;
static const char *arg_wrk = "wrk";
static unsigned arg_iterations = 2000, arg_wrk_secs = 5, arg_wrk_conns = 64, arg_wrk_threads = 2;
static bool arg_json;

static char token[512];
static struct sockaddr_in server_addr, server_addr_bus, server_addr_inst, server_addr_inst_bus;

static uint64_t now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000ULL + (uint64_t) ts.tv_nsec;
}

/* ---------------- a minimal keep-alive HTTP/1.1 client ---------------- */

struct http {
        const struct sockaddr_in *addr;
        int fd;
        char buf[65536];
        size_t len;
};

static int http_connect(struct http *h) {
        int one = 1;

        h->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (h->fd < 0)
                return negative_errno();
        (void) setsockopt(h->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(h->fd, (const struct sockaddr *) h->addr, sizeof *h->addr) < 0) {
                int r = negative_errno();
                h->fd = safe_close(h->fd);
                return r;
        }
        h->len = 0;
        return 0;
}

static int http_once(struct http *h, const char *method, const char *path, const char *body, unsigned *ret_status,
                     char **ret_body) {
        char req[12288];
        size_t blen = body ? strlen(body) : 0, off = 0;
        int n;

        n = snprintf(req, sizeof req,
                     "%s %s HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer %s\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     method, path, token, blen, body ?: "");
        if (n < 0 || (size_t) n >= sizeof req)
                return -E2BIG;
        while (off < (size_t) n) {
                ssize_t k = send(h->fd, req + off, (size_t) n - off, MSG_NOSIGNAL);
                if (k < 0)
                        return negative_errno();
                off += (size_t) k;
        }

        h->len = 0;
        for (;;) {
                char *end, *cl;
                size_t hdr, clen = 0;
                ssize_t k;

                h->buf[h->len] = 0;
                end = strstr(h->buf, "\r\n\r\n");
                if (end) {
                        hdr = (size_t) (end - h->buf) + 4;
                        cl = strcasestr(h->buf, "\r\nContent-Length:");
                        if (cl && cl < end)
                                clen = strtoul(cl + 17, NULL, 10);
                        if (h->len >= hdr + clen) {
                                if (sscanf(h->buf, "HTTP/1.%*d %u", ret_status) != 1)
                                        return -EBADMSG;
                                if (ret_body) {
                                        *ret_body = strndup(h->buf + hdr, clen);
                                        if (!*ret_body)
                                                return -ENOMEM;
                                }
                                return 0;
                        }
                }
                if (h->len >= sizeof h->buf - 1)
                        return -EMSGSIZE;
                k = recv(h->fd, h->buf + h->len, sizeof h->buf - 1 - h->len, 0);
                if (k < 0)
                        return negative_errno();
                if (k == 0)
                        return -ECONNRESET;
                h->len += (size_t) k;
        }
}

static int http_request(struct http *h, const char *method, const char *path, const char *body,
                        unsigned *ret_status, char **ret_body) {
        int r;

        if (h->fd < 0) {
                r = http_connect(h);
                if (r < 0)
                        return r;
        }
        r = http_once(h, method, path, body, ret_status, ret_body);
        if (r == -ECONNRESET || r == -EPIPE) { /* the server closed an idle keep-alive connection */
                h->fd = safe_close(h->fd);
                r = http_connect(h);
                if (r < 0)
                        return r;
                r = http_once(h, method, path, body, ret_status, ret_body);
        }
        return r;
}

/* ---------------- statistics ---------------- */

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return x < y ? -1 : x > y;
}

struct stat_row {
        const char *name;
        double p50_us, p99_us, mean_us;
        unsigned status; /* HTTP status, or 0 for D-Bus */
        const char *outcome;
};

enum {
        ROW_PING_REST,
        ROW_PING_REST_BUS,
        ROW_PING_DBUS,
        ROW_PING_DBUS_DIRECT,
        ROW_EVAL_REST,
        ROW_EVAL_REST_BUS,
        ROW_EVAL_DBUS,
        ROW_EVAL_DBUS_DIRECT,
        ROW_EVAL_REST_INSTALLED,
        ROW_EVAL_REST_INSTALLED_BUS,
        ROW_HEALTHZ,
        ROW_PING_RAW,
        ROW_MAX,
};

static void summarize(uint64_t *v, unsigned n, struct stat_row *row) {
        double sum = 0;

        qsort(v, n, sizeof *v, cmp_u64);
        for (unsigned i = 0; i < n; i++)
                sum += (double) v[i];
        row->p50_us = (double) v[n / 2] / 1000.0;
        row->p99_us = (double) v[(size_t) n * 99 / 100] / 1000.0;
        row->mean_us = sum / n / 1000.0;
}

/* ---------------- the raw agent socket of a forkd-vmm ---------------- */

struct raw_vm {
        pid_t pid;
        int fd;
        char dir[64];
        uint32_t next_id;
};

static int raw_read_exact(int fd, void *buf, size_t n) {
        size_t off = 0;

        while (off < n) {
                ssize_t k = recv(fd, (char *) buf + off, n - off, 0);
                if (k < 0)
                        return negative_errno();
                if (k == 0)
                        return -ECONNRESET;
                off += (size_t) k;
        }
        return 0;
}

/* One request, its answer; events are skipped. */
static int raw_call(struct raw_vm *vm, const char *json) {
        uint8_t hdr[FKA_HDR_SIZE], frame[FKA_HDR_SIZE + 256], payload[FKA_GUEST_MAX_PAYLOAD];
        size_t len = strlen(json);
        uint32_t id = ++vm->next_id;
        fka_header h;
        int r;

        if (len > sizeof frame - FKA_HDR_SIZE)
                return -E2BIG;
        fka_encode_header(frame, FKA_REQUEST, id, (uint32_t) len);
        memcpy(frame + FKA_HDR_SIZE, json, len);
        if (send(vm->fd, frame, FKA_HDR_SIZE + len, MSG_NOSIGNAL) != (ssize_t) (FKA_HDR_SIZE + len))
                return -EIO;
        for (;;) {
                r = raw_read_exact(vm->fd, hdr, sizeof hdr);
                if (r < 0)
                        return r;
                r = fka_decode_header(hdr, sizeof payload, &h);
                if (r < 0)
                        return r;
                r = raw_read_exact(vm->fd, payload, h.len);
                if (r < 0)
                        return r;
                if (h.type != FKA_EVENT && h.id == id)
                        return h.type == FKA_RESPONSE ? 0 : -EPROTO;
        }
}

static void raw_stop(struct raw_vm *vm) {
        char path[192];

        vm->fd = safe_close(vm->fd);
        if (vm->pid > 0) {
                (void) kill(vm->pid, SIGKILL);
                (void) waitpid(vm->pid, NULL, 0);
                vm->pid = 0;
        }
        if (vm->dir[0]) {
                snprintf(path, sizeof path, "%s/agent", vm->dir);
                (void) unlink(path);
                (void) rmdir(vm->dir);
                vm->dir[0] = 0;
        }
}

static int raw_start(struct raw_vm *vm) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        struct timeval tv = { .tv_sec = 10 };
        char *argv[16];
        unsigned n = 0;

        /* /var/tmp rather than $TMPDIR: the socket path must fit sun_path */
        snprintf(vm->dir, sizeof vm->dir, "/var/tmp/rest-bench-vm.XXXXXX");
        if (!mkdtemp(vm->dir)) {
                vm->dir[0] = 0;
                return log_error_errno(errno, "mkdtemp: %m");
        }
        memcpy(sa.sun_path, vm->dir, strlen(vm->dir));
        memcpy(sa.sun_path + strlen(vm->dir), "/agent", sizeof "/agent");
        argv[n++] = (char *) arg_vmm;
        argv[n++] = (char *) "boot";
        argv[n++] = (char *) "--kernel";
        argv[n++] = (char *) arg_kernel;
        argv[n++] = (char *) "--disk";
        argv[n++] = (char *) arg_rootfs;
        argv[n++] = (char *) "--agent-socket";
        argv[n++] = sa.sun_path;
        argv[n++] = (char *) "--overlay-dir";
        argv[n++] = vm->dir;
        argv[n++] = (char *) "--id";
        argv[n++] = (char *) "rest-bench";
        argv[n] = NULL;

        vm->pid = fork();
        if (vm->pid < 0)
                return log_error_errno(errno, "fork: %m");
        if (vm->pid == 0) {
                int null = open("/dev/null", O_RDWR | O_CLOEXEC);
                if (null >= 0) {
                        (void) dup2(null, STDOUT_FILENO);
                        (void) dup2(null, STDERR_FILENO);
                }
                execv(arg_vmm, argv);
                _exit(127);
        }

        for (unsigned i = 0; i < 200; i++) { /* up to 10 s for the socket */
                vm->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (vm->fd < 0)
                        return log_error_errno(errno, "socket: %m");
                if (connect(vm->fd, (struct sockaddr *) &sa, sizeof sa) == 0)
                        break;
                vm->fd = safe_close(vm->fd);
                (void) usleep(50000);
        }
        if (vm->fd < 0)
                return log_error_errno(ETIMEDOUT, "%s did not open its agent socket", arg_vmm);
        (void) setsockopt(vm->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        return raw_call(vm, "{\"op\":\"ping\"}") < 0 ? log_error_errno(EIO, "the raw VM did not answer ping") : 0;
}

/* ---------------- the measurement: every path in turn, per iteration ---------------- */

/* One way of making one call. The paths take turns (see bench_paths()), so a
 * noisy second on this shared machine hits all of them alike. */
#define BLOCK 25
struct path {
        const char *name;
        enum { PATH_REST, PATH_DBUS, PATH_RAW } kind;
        struct http *http;      /* PATH_REST */
        const char *method, *url, *body;
        sd_bus *bus;            /* PATH_DBUS */
        const char *member, *id, *code;
        struct raw_vm *vm;      /* PATH_RAW */
        struct stat_row *row;
        uint64_t *v;
        unsigned status;        /* PATH_REST: of the first call */
        bool guest_error;       /* PATH_DBUS: a GuestError came back */
};

static int path_call(struct path *p) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        sd_bus_error error = SD_BUS_ERROR_NULL;
        const char *dest;
        unsigned status = 0;
        int r;

        switch (p->kind) {
        case PATH_REST:
                r = http_request(p->http, p->method, p->url, p->body, &status, NULL);
                if (r < 0)
                        return log_error_errno(r, "%s: %m", p->name);
                /* A refusal (403: the bridge not trusted, polkit saying no) is no round trip of
                 * the call: stop rather than time it. */
                if (status != 200 && status != 500)
                        return log_error_errno(EPROTO, "%s: HTTP %u", p->name, status);
                if (!p->status)
                        p->status = status;
                else if (status != p->status)
                        return log_error_errno(EPROTO, "%s: status changed from %u to %u", p->name, p->status,
                                               status);
                return 0;
        case PATH_DBUS:
                dest = sd_bus_is_bus_client(p->bus) > 0 ? "org.forkd.Manager" : NULL;
                if (p->code)
                        r = sd_bus_call_method(p->bus, dest, "/org/forkd/Manager", "org.forkd.Manager", p->member,
                                               &error, &reply, "ss", p->id, p->code);
                else
                        r = sd_bus_call_method(p->bus, dest, "/org/forkd/Manager", "org.forkd.Manager", p->member,
                                               &error, &reply, "s", p->id);
                if (r < 0) {
                        if (!sd_bus_error_has_name(&error, "org.forkd.Error.GuestError")) {
                                log_error("%s: %s: %s", p->name, error.name ?: "?", error.message ?: strerror(-r));
                                sd_bus_error_free(&error);
                                return r;
                        }
                        p->guest_error = true;
                }
                sd_bus_error_free(&error);
                return 0;
        case PATH_RAW:
                r = raw_call(p->vm, "{\"op\":\"ping\"}");
                return r < 0 ? log_error_errno(r, "%s: %m", p->name) : 0;
        }
        return -EINVAL;
}

static int bench_paths(struct path *paths, unsigned n) {
        unsigned warm = arg_iterations / 10 + 10;
        int r;

        for (unsigned k = 0; k < n; k++) /* warm up */
                for (unsigned i = 0; i < warm; i++) {
                        r = path_call(&paths[k]);
                        if (r < 0)
                                return r;
                }
        /* Blocks of BLOCK calls per path, in turn: back-to-back calls like a
         * client's, while noise spreads over all paths alike. */
        for (unsigned i0 = 0; i0 < arg_iterations; i0 += BLOCK)
                for (unsigned k = 0; k < n; k++)
                        for (unsigned i = i0; i < MIN(i0 + BLOCK, arg_iterations); i++) {
                                uint64_t t0 = now_ns();

                                r = path_call(&paths[k]);
                                if (r < 0)
                                        return r;
                                paths[k].v[i] = now_ns() - t0;
                        }
        for (unsigned k = 0; k < n; k++) {
                struct path *p = &paths[k];

                p->row->name = p->name;
                p->row->status = p->status;
                p->row->outcome = p->kind == PATH_RAW     ? "response"
                                  : p->kind == PATH_DBUS ? (p->guest_error ? "GuestError" : "reply")
                                  : p->status == 200     ? "200"
                                  : p->status == 500     ? "500 guest error"
                                                         : "other";
                summarize(p->v, arg_iterations, p->row);
        }
        return 0;
}

/* ---------------- wrk ---------------- */

struct wrk_result {
        double rps, p50_us, p99_us;
        unsigned long long requests, errors;
};

static double wrk_time_us(const char *s) {
        double v = strtod(s, NULL);
        if (strstr(s, "us"))
                return v;
        if (strstr(s, "ms"))
                return v * 1000.0;
        if (strchr(s, 's'))
                return v * 1e6;
        return v;
}

static int run_wrk(struct wrk_result *ret) {
        char cmd[1024], line[512];
        struct wrk_result w = {};
        FILE *f;
        int st;

        snprintf(cmd, sizeof cmd, "'%s' -t%u -c%u -d%us --latency '%s/healthz' 2>&1", arg_wrk, arg_wrk_threads,
                 arg_wrk_conns, arg_wrk_secs, arg_url);
        f = popen(cmd, "r");
        if (!f)
                return log_error_errno(errno, "Cannot run wrk: %m");
        while (fgets(line, sizeof line, f)) {
                char *p = line + strspn(line, " \t");
                unsigned long long a, b;

                if (!strncmp(p, "Requests/sec:", 13))
                        w.rps = strtod(p + 13, NULL);
                else if (!strncmp(p, "50%", 3))
                        w.p50_us = wrk_time_us(p + 3 + strspn(p + 3, " \t"));
                else if (!strncmp(p, "99%", 3))
                        w.p99_us = wrk_time_us(p + 3 + strspn(p + 3, " \t"));
                else if (sscanf(p, "%llu requests in", &a) == 1)
                        w.requests = a;
                else if (sscanf(p, "Non-2xx or 3xx responses: %llu", &b) == 1)
                        w.errors += b;
                else if (!strncmp(p, "Socket errors:", 14)) {
                        unsigned long long c1 = 0, c2 = 0, c3 = 0, c4 = 0;
                        (void) sscanf(p, "Socket errors: connect %llu, read %llu, write %llu, timeout %llu", &c1,
                                      &c2, &c3, &c4);
                        w.errors += c1 + c2 + c3 + c4;
                }
        }
        st = pclose(f);
        if (st != 0 || w.rps <= 0)
                return log_error_errno(EIO, "wrk failed (status %d)", st);
        *ret = w;
        return 0;
}

/* ---------------- setup ---------------- */

static void help(void) {
        printf("Usage: rest-bench --url http://127.0.0.1:PORT --token-file F --bus-address ADDR\n"
               "                  --kernel K --rootfs R [--url-bus URL] [--vmm PATH] [--iterations N]\n"
               "                  [--url-installed URL [--url-installed-bus URL]]\n"
               "                  [--wrk PATH] [--wrk-secs S] [--wrk-connections C] [--json]\n"
               "Ping and eval round trips over REST and over D-Bus (p50, p99), and GET /healthz\n"
               "throughput with wrk, against a running stack (see bench/rest). --url-bus: a forkd-rest\n"
               "started with --no-direct, measured too; --vmm: boot a VM of our own and measure ping\n"
               "on its raw agent socket; --url-installed: a forkd-rest running as the trusted bridge\n"
               "user (forkd --trusted-bridge-user), eval measured in a sandbox it forks itself;\n"
               "--url-installed-bus: the same user with --no-direct (through the bus and polkit).\n");
}

static int parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *ret) {
        char *end;
        unsigned long v;

        errno = 0;
        v = strtoul(s, &end, 10);
        if (errno || *end || end == s || v < lo || v > hi)
                return -EINVAL;
        *ret = (unsigned) v;
        return 0;
}

static int parse_argv(int argc, char *argv[]) {
        static const struct option opts[] = {
                { "url", required_argument, NULL, 'u' },        { "token-file", required_argument, NULL, 't' },
                { "bus-address", required_argument, NULL, 'b' }, { "kernel", required_argument, NULL, 'k' },
                { "rootfs", required_argument, NULL, 'r' },     { "iterations", required_argument, NULL, 'n' },
                { "wrk", required_argument, NULL, 'w' },        { "wrk-secs", required_argument, NULL, 's' },
                { "wrk-connections", required_argument, NULL, 'c' },
                { "url-bus", required_argument, NULL, 'U' },    { "vmm", required_argument, NULL, 'v' },
                { "url-installed", required_argument, NULL, 'I' },
                { "url-installed-bus", required_argument, NULL, 'B' },
                { "json", no_argument, NULL, 'j' },             { "help", no_argument, NULL, 'h' },
                {}
        };
        int c;

        while ((c = getopt_long(argc, argv, "h", opts, NULL)) >= 0)
                switch (c) {
                case 'u': arg_url = optarg; break;
                case 't': arg_token_file = optarg; break;
                case 'b': arg_bus_address = optarg; break;
                case 'k': arg_kernel = optarg; break;
                case 'r': arg_rootfs = optarg; break;
                case 'w': arg_wrk = optarg; break;
                case 'U': arg_url_bus = optarg; break;
                case 'v': arg_vmm = optarg; break;
                case 'I': arg_url_installed = optarg; break;
                case 'B': arg_url_installed_bus = optarg; break;
                case 'j': arg_json = true; break;
                case 'n':
                        if (parse_uint(optarg, 100, 1000000, &arg_iterations) < 0)
                                return log_error_errno(EINVAL, "--iterations must be 100..1000000");
                        break;
                case 's':
                        if (parse_uint(optarg, 1, 600, &arg_wrk_secs) < 0)
                                return log_error_errno(EINVAL, "--wrk-secs must be 1..600");
                        break;
                case 'c':
                        if (parse_uint(optarg, 1, 10000, &arg_wrk_conns) < 0)
                                return log_error_errno(EINVAL, "--wrk-connections must be 1..10000");
                        break;
                case 'h': help(); return 0;
                default: return -EINVAL;
                }
        if (!arg_url || !arg_token_file || !arg_bus_address || !arg_kernel || !arg_rootfs)
                return log_error_errno(EINVAL, "--url, --token-file, --bus-address, --kernel and --rootfs are required");
        if (arg_url_installed_bus && !arg_url_installed)
                return log_error_errno(EINVAL, "--url-installed-bus needs --url-installed (whose sandbox it uses)");
        return 1;
}

static int parse_url(const char *url, struct sockaddr_in *ret) {
        char host[64];
        unsigned port;

        if (sscanf(url, "http://%63[0-9.]:%u", host, &port) != 2 || port == 0 || port > 65535)
                return log_error_errno(EINVAL, "a URL must be http://IPV4:PORT, got %s", url);
        ret->sin_family = AF_INET;
        ret->sin_port = htons((uint16_t) port);
        if (inet_pton(AF_INET, host, &ret->sin_addr) != 1)
                return log_error_errno(EINVAL, "bad address in %s", url);
        return 0;
}

/* forkd's direct socket (its DirectSocket property), or NULL when it has none. */
static int connect_direct(sd_bus *bus, sd_bus **ret) {
        _cleanup_(sd_bus_flush_close_unrefp) sd_bus *direct = NULL;
        _cleanup_free_ char *path = NULL, *address = NULL;
        sd_bus_error error = SD_BUS_ERROR_NULL;
        int r;

        *ret = NULL;
        r = sd_bus_get_property_string(bus, "org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager",
                                       "DirectSocket", &error, &path);
        sd_bus_error_free(&error);
        if (r < 0 || !path[0])
                return 0;
        if (asprintf(&address, "unix:path=%s", path) < 0)
                return -ENOMEM;
        r = sd_bus_new(&direct);
        if (r >= 0)
                r = sd_bus_set_address(direct, address);
        if (r >= 0)
                r = sd_bus_start(direct);
        if (r < 0) {
                log_info("No direct connection to forkd on %s: %s", path, strerror(-r));
                return 0;
        }
        *ret = TAKE_PTR(direct);
        return 0;
}

static int read_token(void) {
        _cleanup_fclose_ FILE *f = fopen(arg_token_file, "re");
        size_t n;

        if (!f)
                return log_error_errno(errno, "Cannot open %s: %m", arg_token_file);
        if (!fgets(token, sizeof token, f))
                return log_error_errno(EINVAL, "Empty token file %s", arg_token_file);
        n = strcspn(token, "\r\n");
        token[n] = 0;
        return 0;
}

static int json_escape(const char *s, char *buf, size_t size) {
        struct json_object *o = json_object_new_string(s);
        int n;

        if (!o)
                return -ENOMEM;
        n = snprintf(buf, size, "%s", json_object_to_json_string_ext(o, JSON_C_TO_STRING_NOSLASHESCAPE));
        json_object_put(o);
        return n < 0 || (size_t) n >= size ? -E2BIG : 0;
}

/* POST /v1/sandboxes with body; the new sandbox's id into id. */
static int post_sandbox(struct http *h, const char *body, char *id, size_t size) {
        _cleanup_free_ char *resp = NULL;
        struct json_object *o, *e;
        unsigned status = 0;
        int r;

        r = http_request(h, "POST", "/v1/sandboxes", body, &status, &resp);
        o = r >= 0 && status == 201 ? json_tokener_parse(resp) : NULL;
        if (o && json_object_is_type(o, json_type_array) && (e = json_object_array_get_idx(o, 0)) &&
            json_object_object_get_ex(e, "id", &e))
                snprintf(id, size, "%s", json_object_get_string(e));
        json_object_put(o);
        if (!id[0])
                return log_error_errno(EIO, "POST /v1/sandboxes on %s:%u: %u %s",
                                       inet_ntoa(h->addr->sin_addr), (unsigned) ntohs(h->addr->sin_port), status,
                                       resp ?: "");
        return 0;
}

static int run(int argc, char *argv[]) {
        _cleanup_(sd_bus_flush_close_unrefp) sd_bus *bus = NULL, *direct = NULL;
        _cleanup_free_ uint64_t *vs = NULL;
        _cleanup_free_ char *resp = NULL;
        struct http h = { .addr = &server_addr, .fd = -EBADF }, hb = { .addr = &server_addr_bus, .fd = -EBADF };
        struct http hi = { .addr = &server_addr_inst, .fd = -EBADF }, hib = { .addr = &server_addr_inst_bus, .fd = -EBADF };
        struct raw_vm vm = { .fd = -EBADF };
        struct stat_row rows[ROW_MAX] = {};
        struct wrk_result w = {};
        char tag[64], id[128] = "", id_inst[128] = "", path[256], body[9000], k[4200], rf[4200];
        unsigned status;
        int r;

        log_prefix = "rest-bench";
        r = parse_argv(argc, argv);
        if (r <= 0)
                return r;
        {
                const struct {
                        const char *url;
                        struct sockaddr_in *addr;
                } urls[] = { { arg_url, &server_addr }, { arg_url_bus, &server_addr_bus },
                             { arg_url_installed, &server_addr_inst }, { arg_url_installed_bus, &server_addr_inst_bus } };

                for (size_t i = 0; i < ELEMENTSOF(urls); i++)
                        if (urls[i].url && (r = parse_url(urls[i].url, urls[i].addr)) < 0)
                                return r;
        }
        r = read_token();
        if (r < 0)
                return r;

        r = sd_bus_new(&bus);
        if (r >= 0)
                r = sd_bus_set_address(bus, arg_bus_address);
        if (r >= 0)
                r = sd_bus_set_bus_client(bus, true);
        if (r >= 0)
                r = sd_bus_start(bus);
        if (r < 0)
                return log_error_errno(r, "Cannot connect to %s: %m", arg_bus_address);
        r = connect_direct(bus, &direct);
        if (r < 0)
                return log_oom();

        /* A snapshot of the test guest and one sandbox, through the REST API. */
        snprintf(tag, sizeof tag, "bench-rest-%d", (int) getpid());
        if (json_escape(arg_kernel, k, sizeof k) < 0 || json_escape(arg_rootfs, rf, sizeof rf) < 0)
                return log_error_errno(E2BIG, "paths too long");
        snprintf(body, sizeof body, "{\"tag\":\"%s\",\"kernel\":%s,\"rootfs\":%s,\"boot_wait_secs\":30}", tag, k, rf);
        r = http_request(&h, "POST", "/v1/snapshots", body, &status, &resp);
        if (r < 0 || status != 201)
                return log_error_errno(r < 0 ? r : EIO, "POST /v1/snapshots: %u %s", status, resp ?: "");
        free(resp);
        resp = NULL;

        snprintf(body, sizeof body, "{\"snapshot_tag\":\"%s\",\"n\":1}", tag);
        r = post_sandbox(&h, body, id, sizeof id);
        if (r < 0)
                goto cleanup;
        /* The bridge user's own sandbox: root's is not its to eval (org.forkd.manage-all). */
        if (arg_url_installed) {
                r = post_sandbox(&hi, body, id_inst, sizeof id_inst);
                if (r < 0)
                        goto cleanup;
        }

        {
                char ping_url[256], eval_url[256], eval_url_inst[256];
                struct path paths[ROW_MAX];
                unsigned n = 0;

                snprintf(ping_url, sizeof ping_url, "/v1/sandboxes/%s/ping", id);
                snprintf(eval_url, sizeof eval_url, "/v1/sandboxes/%s/eval", id);
                snprintf(eval_url_inst, sizeof eval_url_inst, "/v1/sandboxes/%s/eval", id_inst);
#define REST(row_, name_, h_, method_, url_, body_) \
        paths[n++] = (struct path) { .name = name_, .kind = PATH_REST, .http = h_, .method = method_, .url = url_, \
                                     .body = body_, .row = &rows[row_] }
#define DBUS(row_, name_, bus_, member_, code_) \
        paths[n++] = (struct path) { .name = name_, .kind = PATH_DBUS, .bus = bus_, .member = member_, .id = id, \
                                     .code = code_, .row = &rows[row_] }
                REST(ROW_PING_REST, "ping  REST", &h, "POST", ping_url, NULL);
                if (arg_url_bus)
                        REST(ROW_PING_REST_BUS, "ping  REST via bus", &hb, "POST", ping_url, NULL);
                DBUS(ROW_PING_DBUS, "ping  D-Bus", bus, "Ping", NULL);
                if (direct)
                        DBUS(ROW_PING_DBUS_DIRECT, "ping  D-Bus direct", direct, "Ping", NULL);
                REST(ROW_EVAL_REST, "eval  REST", &h, "POST", eval_url, "{\"code\":\"1+1\"}");
                if (arg_url_bus)
                        REST(ROW_EVAL_REST_BUS, "eval  REST via bus", &hb, "POST", eval_url, "{\"code\":\"1+1\"}");
                DBUS(ROW_EVAL_DBUS, "eval  D-Bus", bus, "Eval", "1+1");
                if (direct)
                        DBUS(ROW_EVAL_DBUS_DIRECT, "eval  D-Bus direct", direct, "Eval", "1+1");
                if (arg_url_installed)
                        REST(ROW_EVAL_REST_INSTALLED, "eval  REST installed", &hi, "POST", eval_url_inst,
                             "{\"code\":\"1+1\"}");
                if (arg_url_installed_bus)
                        REST(ROW_EVAL_REST_INSTALLED_BUS, "eval  REST inst. via bus", &hib, "POST", eval_url_inst,
                             "{\"code\":\"1+1\"}");
                REST(ROW_HEALTHZ, "healthz REST (1 conn)", &h, "GET", "/healthz", NULL);
#undef REST
#undef DBUS
                if (arg_vmm) {
                        r = raw_start(&vm);
                        if (r < 0)
                                goto cleanup;
                        paths[n++] = (struct path) { .name = "ping  raw agent socket", .kind = PATH_RAW, .vm = &vm,
                                                     .row = &rows[ROW_PING_RAW] };
                }
                vs = calloc((size_t) n * arg_iterations, sizeof *vs);
                if (!vs) {
                        r = log_oom();
                        goto cleanup;
                }
                for (unsigned j = 0; j < n; j++)
                        paths[j].v = vs + (size_t) j * arg_iterations;
                r = bench_paths(paths, n);
                raw_stop(&vm);
                if (r < 0)
                        goto cleanup;
        }

        r = run_wrk(&w);

cleanup:
        if (id_inst[0]) {
                snprintf(path, sizeof path, "/v1/sandboxes/%s", id_inst);
                (void) http_request(&hi, "DELETE", path, NULL, &status, NULL);
        }
        if (id[0]) {
                snprintf(path, sizeof path, "/v1/sandboxes/%s", id);
                (void) http_request(&h, "DELETE", path, NULL, &status, NULL);
        }
        snprintf(path, sizeof path, "/v1/snapshots/%s", tag);
        (void) http_request(&h, "DELETE", path, NULL, &status, NULL);
        safe_close(h.fd);
        safe_close(hb.fd);
        safe_close(hi.fd);
        safe_close(hib.fd);
        raw_stop(&vm);
        if (r < 0)
                return r;

        printf("%-24s %10s %10s %10s  %s\n", "round trip", "p50 us", "p99 us", "mean us", "outcome");
        for (unsigned i = 0; i < ROW_MAX; i++)
                if (rows[i].name)
                        printf("%-24s %10.1f %10.1f %10.1f  %s\n", rows[i].name, rows[i].p50_us, rows[i].p99_us,
                               rows[i].mean_us, rows[i].outcome);
        printf("bridge cost (REST - D-Bus, p50): ping %.1f us, eval %.1f us\n",
               rows[ROW_PING_REST].p50_us - rows[ROW_PING_DBUS].p50_us,
               rows[ROW_EVAL_REST].p50_us - rows[ROW_EVAL_DBUS].p50_us);
        if (rows[ROW_EVAL_REST_INSTALLED].name)
                printf("installed forkd-rest (bridge user, direct socket) - root's, eval p50: %.1f us\n",
                       rows[ROW_EVAL_REST_INSTALLED].p50_us - rows[ROW_EVAL_REST].p50_us);
        if (rows[ROW_EVAL_REST_INSTALLED_BUS].name)
                printf("installed forkd-rest through the bus and polkit - direct, eval p50: %.1f us\n",
                       rows[ROW_EVAL_REST_INSTALLED_BUS].p50_us - rows[ROW_EVAL_REST_INSTALLED].p50_us);
        if (direct)
                printf("bridge cost (REST - D-Bus direct, p50): ping %.1f us, eval %.1f us\n",
                       rows[ROW_PING_REST].p50_us - rows[ROW_PING_DBUS_DIRECT].p50_us,
                       rows[ROW_EVAL_REST].p50_us - rows[ROW_EVAL_DBUS_DIRECT].p50_us);
        if (rows[ROW_PING_RAW].name)
                printf("above the raw agent socket (p50): ping D-Bus +%.1f us, D-Bus direct +%.1f us, "
                       "REST +%.1f us, REST via bus +%.1f us\n",
                       rows[ROW_PING_DBUS].p50_us - rows[ROW_PING_RAW].p50_us,
                       direct ? rows[ROW_PING_DBUS_DIRECT].p50_us - rows[ROW_PING_RAW].p50_us : 0.0,
                       rows[ROW_PING_REST].p50_us - rows[ROW_PING_RAW].p50_us,
                       arg_url_bus ? rows[ROW_PING_REST_BUS].p50_us - rows[ROW_PING_RAW].p50_us : 0.0);
        printf("GET /healthz under wrk -t%u -c%u -d%us: %.0f req/s, latency p50 %.1f us, p99 %.1f us, %llu requests, "
               "%llu errors\n",
               arg_wrk_threads, arg_wrk_conns, arg_wrk_secs, w.rps, w.p50_us, w.p99_us, w.requests, w.errors);
        printf("(%u iterations per row, the rows taking turns in blocks of %u calls; one keep-alive HTTP connection per\n"
               " forkd-rest, one D-Bus connection per path; the test guest does not implement eval, so eval\n"
               " is the round trip of its GuestError: HTTP 500)\n",
               arg_iterations, BLOCK);

        if (arg_json) {
                printf("{\"iterations\":%u,"
                       "\"ping_rest_p50_us\":%.1f,\"ping_rest_p99_us\":%.1f,"
                       "\"ping_dbus_p50_us\":%.1f,\"ping_dbus_p99_us\":%.1f,"
                       "\"eval_rest_p50_us\":%.1f,\"eval_rest_p99_us\":%.1f,"
                       "\"eval_dbus_p50_us\":%.1f,\"eval_dbus_p99_us\":%.1f,"
                       "\"eval_rest_status\":%u,\"eval_outcome\":\"guest-error\","
                       "\"healthz_p50_us\":%.1f,\"healthz_p99_us\":%.1f,"
                       "\"healthz_wrk_rps\":%.0f,\"healthz_wrk_p50_us\":%.1f,\"healthz_wrk_p99_us\":%.1f,"
                       "\"healthz_wrk_connections\":%u,\"healthz_wrk_errors\":%llu",
                       arg_iterations, rows[ROW_PING_REST].p50_us, rows[ROW_PING_REST].p99_us,
                       rows[ROW_PING_DBUS].p50_us, rows[ROW_PING_DBUS].p99_us, rows[ROW_EVAL_REST].p50_us,
                       rows[ROW_EVAL_REST].p99_us, rows[ROW_EVAL_DBUS].p50_us, rows[ROW_EVAL_DBUS].p99_us,
                       rows[ROW_EVAL_REST].status, rows[ROW_HEALTHZ].p50_us, rows[ROW_HEALTHZ].p99_us, w.rps,
                       w.p50_us, w.p99_us, arg_wrk_conns, w.errors);
                /* Added fields: present when measured. */
                if (rows[ROW_PING_REST_BUS].name)
                        printf(",\"ping_rest_bus_p50_us\":%.1f,\"ping_rest_bus_p99_us\":%.1f,"
                               "\"eval_rest_bus_p50_us\":%.1f,\"eval_rest_bus_p99_us\":%.1f",
                               rows[ROW_PING_REST_BUS].p50_us, rows[ROW_PING_REST_BUS].p99_us,
                               rows[ROW_EVAL_REST_BUS].p50_us, rows[ROW_EVAL_REST_BUS].p99_us);
                if (rows[ROW_PING_DBUS_DIRECT].name)
                        printf(",\"ping_dbus_direct_p50_us\":%.1f,\"ping_dbus_direct_p99_us\":%.1f,"
                               "\"eval_dbus_direct_p50_us\":%.1f,\"eval_dbus_direct_p99_us\":%.1f",
                               rows[ROW_PING_DBUS_DIRECT].p50_us, rows[ROW_PING_DBUS_DIRECT].p99_us,
                               rows[ROW_EVAL_DBUS_DIRECT].p50_us, rows[ROW_EVAL_DBUS_DIRECT].p99_us);
                if (rows[ROW_PING_RAW].name)
                        printf(",\"ping_agent_raw_p50_us\":%.1f,\"ping_agent_raw_p99_us\":%.1f",
                               rows[ROW_PING_RAW].p50_us, rows[ROW_PING_RAW].p99_us);
                if (rows[ROW_EVAL_REST_INSTALLED].name)
                        printf(",\"eval_rest_installed_p50_us\":%.1f,\"eval_rest_installed_p99_us\":%.1f,"
                               "\"eval_rest_installed_status\":%u",
                               rows[ROW_EVAL_REST_INSTALLED].p50_us, rows[ROW_EVAL_REST_INSTALLED].p99_us,
                               rows[ROW_EVAL_REST_INSTALLED].status);
                if (rows[ROW_EVAL_REST_INSTALLED_BUS].name)
                        printf(",\"eval_rest_installed_bus_p50_us\":%.1f,\"eval_rest_installed_bus_p99_us\":%.1f,"
                               "\"eval_rest_installed_bus_status\":%u",
                               rows[ROW_EVAL_REST_INSTALLED_BUS].p50_us, rows[ROW_EVAL_REST_INSTALLED_BUS].p99_us,
                               rows[ROW_EVAL_REST_INSTALLED_BUS].status);
                printf("}\n");
        }
        return 0;
}

int main(int argc, char *argv[]) {
        return run(argc, argv) < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
