/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * bench/rest: the cost of forkd-rest. Round trips of ping and eval to one
 * sandbox of the test guest over REST (one keep-alive HTTP connection) and
 * the same calls made directly over D-Bus to org.forkd.Manager, in the same
 * run; then GET /healthz throughput under load from wrk.
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
#include <sys/socket.h>
#include <sys/wait.h>
#include <systemd/sd-bus.h>
#include <time.h>

#include "macro.h"

static const char *arg_url, *arg_token_file, *arg_bus_address, *arg_kernel, *arg_rootfs;
static const char *arg_wrk = "wrk";
static unsigned arg_iterations = 2000, arg_wrk_secs = 5, arg_wrk_conns = 64, arg_wrk_threads = 2;
static bool arg_json;

static char token[512];
static struct sockaddr_in server_addr;

static uint64_t now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000ULL + (uint64_t) ts.tv_nsec;
}

/* ---------------- a minimal keep-alive HTTP/1.1 client ---------------- */

struct http {
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
        if (connect(h->fd, (struct sockaddr *) &server_addr, sizeof server_addr) < 0) {
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

static void summarize(uint64_t *v, unsigned n, struct stat_row *row) {
        double sum = 0;

        qsort(v, n, sizeof *v, cmp_u64);
        for (unsigned i = 0; i < n; i++)
                sum += (double) v[i];
        row->p50_us = (double) v[n / 2] / 1000.0;
        row->p99_us = (double) v[(size_t) n * 99 / 100] / 1000.0;
        row->mean_us = sum / n / 1000.0;
}

static int bench_rest(struct http *h, const char *name, const char *method, const char *path, const char *body, uint64_t *v,
                      struct stat_row *row) {
        unsigned status = 0, first = 0;
        int r;

        for (unsigned i = 0; i < arg_iterations / 10 + 10; i++) { /* warm up */
                r = http_request(h, method, path, body, &status, NULL);
                if (r < 0)
                        return log_error_errno(r, "%s: %m", name);
        }
        first = status;
        for (unsigned i = 0; i < arg_iterations; i++) {
                uint64_t t0 = now_ns();
                r = http_request(h, method, path, body, &status, NULL);
                v[i] = now_ns() - t0;
                if (r < 0)
                        return log_error_errno(r, "%s: %m", name);
                if (status != first)
                        return log_error_errno(EPROTO, "%s: status changed from %u to %u", name, first, status);
        }
        row->name = name;
        row->status = first;
        row->outcome = first == 200 ? "200" : first == 500 ? "500 guest error" : "other";
        summarize(v, arg_iterations, row);
        return 0;
}

static int bench_dbus(sd_bus *bus, const char *name, const char *member, const char *id, const char *code,
                      uint64_t *v, struct stat_row *row) {
        bool err_seen = false;

        for (unsigned i = 0; i < arg_iterations / 10 + 10 + arg_iterations; i++) {
                _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
                sd_bus_error error = SD_BUS_ERROR_NULL;
                uint64_t t0 = now_ns();
                int r;

                if (code)
                        r = sd_bus_call_method(bus, "org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager",
                                               member, &error, &reply, "ss", id, code);
                else
                        r = sd_bus_call_method(bus, "org.forkd.Manager", "/org/forkd/Manager", "org.forkd.Manager",
                                               member, &error, &reply, "s", id);
                if (i >= arg_iterations / 10 + 10)
                        v[i - (arg_iterations / 10 + 10)] = now_ns() - t0;
                if (r < 0) {
                        if (!sd_bus_error_has_name(&error, "org.forkd.Error.GuestError")) {
                                log_error("%s: %s: %s", name, error.name ?: "?", error.message ?: strerror(-r));
                                sd_bus_error_free(&error);
                                return r;
                        }
                        err_seen = true;
                }
                sd_bus_error_free(&error);
        }
        row->name = name;
        row->outcome = err_seen ? "GuestError" : "reply";
        summarize(v, arg_iterations, row);
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
               "                  --kernel K --rootfs R [--iterations N] [--wrk PATH] [--wrk-secs S]\n"
               "                  [--wrk-connections C] [--json]\n"
               "Ping and eval round trips over REST and over D-Bus (p50, p99), and GET /healthz\n"
               "throughput with wrk, against a running stack (see bench/rest).\n");
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
        return 1;
}

static int parse_url(void) {
        char host[64];
        unsigned port;

        if (sscanf(arg_url, "http://%63[0-9.]:%u", host, &port) != 2 || port == 0 || port > 65535)
                return log_error_errno(EINVAL, "--url must be http://IPV4:PORT, got %s", arg_url);
        server_addr.sin_family = AF_INET;
        server_addr.sin_port = htons((uint16_t) port);
        if (inet_pton(AF_INET, host, &server_addr.sin_addr) != 1)
                return log_error_errno(EINVAL, "bad address in --url");
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

static int run(int argc, char *argv[]) {
        _cleanup_(sd_bus_flush_close_unrefp) sd_bus *bus = NULL;
        _cleanup_free_ uint64_t *v = NULL;
        _cleanup_free_ char *resp = NULL;
        struct json_object *o = NULL, *e;
        struct http h = { .fd = -EBADF };
        struct stat_row rows[6] = {};
        struct wrk_result w = {};
        char tag[64], id[128] = "", path[256], body[9000], k[4200], rf[4200];
        unsigned status;
        int r;

        log_prefix = "rest-bench";
        r = parse_argv(argc, argv);
        if (r <= 0)
                return r;
        r = parse_url();
        if (r < 0)
                return r;
        r = read_token();
        if (r < 0)
                return r;
        v = calloc(arg_iterations, sizeof *v);
        if (!v)
                return log_oom();

        r = sd_bus_new(&bus);
        if (r >= 0)
                r = sd_bus_set_address(bus, arg_bus_address);
        if (r >= 0)
                r = sd_bus_set_bus_client(bus, true);
        if (r >= 0)
                r = sd_bus_start(bus);
        if (r < 0)
                return log_error_errno(r, "Cannot connect to %s: %m", arg_bus_address);

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
        r = http_request(&h, "POST", "/v1/sandboxes", body, &status, &resp);
        if (r >= 0 && status == 201 && (o = json_tokener_parse(resp)) && json_object_is_type(o, json_type_array) &&
            (e = json_object_array_get_idx(o, 0)) && json_object_object_get_ex(e, "id", &e))
                snprintf(id, sizeof id, "%s", json_object_get_string(e));
        json_object_put(o);
        if (!id[0]) {
                log_error("POST /v1/sandboxes: %u %s", status, resp ?: "");
                r = -EIO;
                goto cleanup;
        }

        snprintf(path, sizeof path, "/v1/sandboxes/%s/ping", id);
        r = bench_rest(&h, "ping  REST", "POST", path, NULL, v, &rows[0]);
        if (r < 0)
                goto cleanup;
        r = bench_dbus(bus, "ping  D-Bus", "Ping", id, NULL, v, &rows[1]);
        if (r < 0)
                goto cleanup;
        snprintf(path, sizeof path, "/v1/sandboxes/%s/eval", id);
        r = bench_rest(&h, "eval  REST", "POST", path, "{\"code\":\"1+1\"}", v, &rows[2]);
        if (r < 0)
                goto cleanup;
        r = bench_dbus(bus, "eval  D-Bus", "Eval", id, "1+1", v, &rows[3]);
        if (r < 0)
                goto cleanup;
        r = bench_rest(&h, "healthz REST (1 conn)", "GET", "/healthz", NULL, v, &rows[4]);
        if (r < 0)
                goto cleanup;

        r = run_wrk(&w);

cleanup:
        if (id[0]) {
                snprintf(path, sizeof path, "/v1/sandboxes/%s", id);
                (void) http_request(&h, "DELETE", path, NULL, &status, NULL);
        }
        snprintf(path, sizeof path, "/v1/snapshots/%s", tag);
        (void) http_request(&h, "DELETE", path, NULL, &status, NULL);
        safe_close(h.fd);
        if (r < 0)
                return r;

        printf("%-24s %10s %10s %10s  %s\n", "round trip", "p50 us", "p99 us", "mean us", "outcome");
        for (unsigned i = 0; i < 5; i++)
                printf("%-24s %10.1f %10.1f %10.1f  %s\n", rows[i].name, rows[i].p50_us, rows[i].p99_us,
                       rows[i].mean_us, rows[i].outcome);
        printf("bridge cost (REST - D-Bus, p50): ping %.1f us, eval %.1f us\n", rows[0].p50_us - rows[1].p50_us,
               rows[2].p50_us - rows[3].p50_us);
        printf("GET /healthz under wrk -t%u -c%u -d%us: %.0f req/s, latency p50 %.1f us, p99 %.1f us, %llu requests, "
               "%llu errors\n",
               arg_wrk_threads, arg_wrk_conns, arg_wrk_secs, w.rps, w.p50_us, w.p99_us, w.requests, w.errors);
        printf("(%u iterations per row, one keep-alive HTTP connection, one D-Bus connection; the test guest\n"
               " does not implement eval, so eval is the round trip of its GuestError: HTTP 500)\n",
               arg_iterations);

        if (arg_json)
                printf("{\"iterations\":%u,"
                       "\"ping_rest_p50_us\":%.1f,\"ping_rest_p99_us\":%.1f,"
                       "\"ping_dbus_p50_us\":%.1f,\"ping_dbus_p99_us\":%.1f,"
                       "\"eval_rest_p50_us\":%.1f,\"eval_rest_p99_us\":%.1f,"
                       "\"eval_dbus_p50_us\":%.1f,\"eval_dbus_p99_us\":%.1f,"
                       "\"eval_rest_status\":%u,\"eval_outcome\":\"guest-error\","
                       "\"healthz_p50_us\":%.1f,\"healthz_p99_us\":%.1f,"
                       "\"healthz_wrk_rps\":%.0f,\"healthz_wrk_p50_us\":%.1f,\"healthz_wrk_p99_us\":%.1f,"
                       "\"healthz_wrk_connections\":%u,\"healthz_wrk_errors\":%llu}\n",
                       arg_iterations, rows[0].p50_us, rows[0].p99_us, rows[1].p50_us, rows[1].p99_us,
                       rows[2].p50_us, rows[2].p99_us, rows[3].p50_us, rows[3].p99_us, rows[2].status,
                       rows[4].p50_us, rows[4].p99_us, w.rps, w.p50_us, w.p99_us, arg_wrk_conns, w.errors);
        return 0;
}

int main(int argc, char *argv[]) {
        return run(argc, argv) < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
