/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd-rest: the forkd REST API over HTTP(S), translated into calls to
 * org.forkd.Manager on D-Bus. Lifecycle and command line only; the server
 * is rest-server.c, the route table rest-routes.c.
 */

#include <arpa/inet.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>

#include "fleet-front.h"
#include "fleet-node.h"
#include "io-util.h"
#include "macro.h"
#include "rest-metrics.h"
#include "rest-server.h"

#define TOKEN_MAX 4096
#define PEM_MAX (1024 * 1024)
#define STATE_DIR_DEFAULT "/var/lib/forkd-rest"

static const char *arg_listen = "127.0.0.1:8889";
static const char *arg_token_file, *arg_tls_cert, *arg_tls_key, *arg_bus_address, *arg_state_dir;
static unsigned arg_connection_limit = REST_CONNECTION_LIMIT_DEFAULT;
static unsigned arg_timeout = REST_TIMEOUT_SECS_DEFAULT;
static unsigned arg_calls_max = REST_CALLS_MAX_DEFAULT;
static size_t arg_body_max = REST_BODY_MAX_DEFAULT;
static size_t arg_memory_limit = REST_MEMORY_LIMIT_DEFAULT;
static bool arg_no_direct;
static bool arg_metrics_per_sandbox;
static bool arg_fleet_front;
static const char *arg_fleet_etcd, *arg_fleet_node, *arg_fleet_advertise;
static const char *arg_fleet_cacert, *arg_fleet_cert, *arg_fleet_key, *arg_fleet_user, *arg_fleet_password_file;
static unsigned arg_fleet_ttl = FLEET_TTL_DEFAULT;
static unsigned arg_fleet_max_sandboxes = 1000;

static void help(void) {
        printf("Usage: forkd-rest [OPTIONS]\n"
               "Serve the forkd REST API and translate it into D-Bus calls to org.forkd.Manager.\n\n"
               "  --listen ADDR:PORT       listen here (default 127.0.0.1:8889; [::1]:PORT for IPv6);\n"
               "                           a socket passed by systemd (sd_listen_fds) takes precedence\n"
               "  --token-file FILE        require 'Authorization: Bearer <token>' (all routes but /healthz)\n"
               "  --tls-cert FILE          serve HTTPS with this PEM certificate ...\n"
               "  --tls-key FILE           ... and this PEM key\n"
               "  --bus-address ADDRESS    D-Bus address of the daemon's bus (default: the system bus)\n"
               "  --no-direct              always go through the bus; by default calls use forkd's direct\n"
               "                           socket (its DirectSocket property) when forkd admits us there\n"
               "                           (root, or forkd --trusted-bridge-user), else the bus\n"
               "  --connection-limit N     concurrent connections (default %u)\n"
               "  --timeout SECS           idle timeout and deadline for a whole request (default %u;\n"
               "                           a bundle upload gets a second more per MiB received)\n"
               "  --body-max BYTES         request body cap (default %u)\n"
               "  --memory-limit BYTES     per-connection memory, bounds the headers (default %u)\n"
               "  --max-calls N            D-Bus calls in flight before answering 503 (default %u)\n"
               "  --state-dir DIR          keep Idempotency-Key records here (default " STATE_DIR_DEFAULT ",\n"
               "                           made at first use; a directory given here is made at start)\n"
               "  --metrics-per-sandbox    GET /metrics has series per sandbox too (at most %u sandboxes)\n"
               "\nA node of a fleet (docs/fleet.md): keep this node's record in etcd under a lease\n"
               "  --fleet-etcd URL[,URL...]  etcd's client URLs (http(s)://HOST:PORT, at most 16)\n"
               "  --fleet-node NAME        the node's name (default: the host name)\n"
               "  --fleet-advertise URL    where front ends reach this REST API (default: http(s):// and\n"
               "                           --listen)\n"
               "  --fleet-lease-ttl SECS   the lease's TTL, %u..%u (default %u): a node that dies drops out\n"
               "                           after it\n"
               "  --fleet-max-sandboxes N  the most sandboxes this node takes, 1..4096 (default 1000)\n"
               "  --fleet-etcd-cacert FILE, --fleet-etcd-cert FILE, --fleet-etcd-key FILE\n"
               "                           TLS to etcd: its CA, and this node's client certificate and key\n"
               "  --fleet-etcd-user NAME, --fleet-etcd-password-file FILE\n"
               "                           etcd's own authentication\n"
               "\nA front end of a fleet: the same REST API with no forkd behind it\n"
               "  --fleet-front            place forks on the nodes in --fleet-etcd's records and pass\n"
               "                           every call for a sandbox to its node; with --fleet-etcd (and\n"
               "                           its TLS and credentials), --listen, --token-file, --tls-*,\n"
               "                           --connection-limit, --timeout, --body-max only\n"
               "\n"
               "  --debug                  log at debug level\n"
               "  --version                print the version\n",
               REST_CONNECTION_LIMIT_DEFAULT, REST_TIMEOUT_SECS_DEFAULT, REST_BODY_MAX_DEFAULT,
               REST_MEMORY_LIMIT_DEFAULT, REST_CALLS_MAX_DEFAULT, REST_METRICS_SANDBOXES_MAX, FLEET_TTL_MIN,
               FLEET_TTL_MAX, FLEET_TTL_DEFAULT);
}

static int parse_ulong(const char *s, unsigned long lo, unsigned long hi, unsigned long *ret) {
        unsigned long v;
        char *end;

        errno = 0;
        v = strtoul(s, &end, 10);
        if (errno || end == s || *end || *s == '-' || v < lo || v > hi)
                return -EINVAL;
        *ret = v;
        return 0;
}

static int parse_argv(int argc, char *argv[]) {
        enum { ARG_LISTEN = 0x100, ARG_TOKEN, ARG_CERT, ARG_KEY, ARG_BUS, ARG_CONNS, ARG_TIMEOUT,
               ARG_BODY, ARG_MEM, ARG_CALLS, ARG_DEBUG, ARG_VERSION, ARG_NO_DIRECT, ARG_STATE_DIR,
               ARG_METRICS_PER_SANDBOX, ARG_FLEET_ETCD, ARG_FLEET_NODE, ARG_FLEET_ADVERTISE, ARG_FLEET_TTL,
               ARG_FLEET_MAX, ARG_FLEET_CACERT, ARG_FLEET_CERT, ARG_FLEET_KEY, ARG_FLEET_USER, ARG_FLEET_PASSWORD,
               ARG_FLEET_FRONT };
        static const struct option opts[] = {
                { "listen", required_argument, NULL, ARG_LISTEN },
                { "token-file", required_argument, NULL, ARG_TOKEN },
                { "tls-cert", required_argument, NULL, ARG_CERT },
                { "tls-key", required_argument, NULL, ARG_KEY },
                { "bus-address", required_argument, NULL, ARG_BUS },
                { "no-direct", no_argument, NULL, ARG_NO_DIRECT },
                { "connection-limit", required_argument, NULL, ARG_CONNS },
                { "timeout", required_argument, NULL, ARG_TIMEOUT },
                { "body-max", required_argument, NULL, ARG_BODY },
                { "memory-limit", required_argument, NULL, ARG_MEM },
                { "max-calls", required_argument, NULL, ARG_CALLS },
                { "state-dir", required_argument, NULL, ARG_STATE_DIR },
                { "metrics-per-sandbox", no_argument, NULL, ARG_METRICS_PER_SANDBOX },
                { "fleet-etcd", required_argument, NULL, ARG_FLEET_ETCD },
                { "fleet-node", required_argument, NULL, ARG_FLEET_NODE },
                { "fleet-advertise", required_argument, NULL, ARG_FLEET_ADVERTISE },
                { "fleet-lease-ttl", required_argument, NULL, ARG_FLEET_TTL },
                { "fleet-max-sandboxes", required_argument, NULL, ARG_FLEET_MAX },
                { "fleet-etcd-cacert", required_argument, NULL, ARG_FLEET_CACERT },
                { "fleet-etcd-cert", required_argument, NULL, ARG_FLEET_CERT },
                { "fleet-etcd-key", required_argument, NULL, ARG_FLEET_KEY },
                { "fleet-etcd-user", required_argument, NULL, ARG_FLEET_USER },
                { "fleet-etcd-password-file", required_argument, NULL, ARG_FLEET_PASSWORD },
                { "fleet-front", no_argument, NULL, ARG_FLEET_FRONT },
                { "debug", no_argument, NULL, ARG_DEBUG },
                { "version", no_argument, NULL, ARG_VERSION },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        unsigned long v;
        int c;

        while ((c = getopt_long(argc, argv, "h", opts, NULL)) >= 0)
                switch (c) {
                case ARG_LISTEN: arg_listen = optarg; break;
                case ARG_TOKEN: arg_token_file = optarg; break;
                case ARG_CERT: arg_tls_cert = optarg; break;
                case ARG_KEY: arg_tls_key = optarg; break;
                case ARG_BUS: arg_bus_address = optarg; break;
                case ARG_NO_DIRECT: arg_no_direct = true; break;
                case ARG_METRICS_PER_SANDBOX: arg_metrics_per_sandbox = true; break;
                case ARG_FLEET_ETCD: arg_fleet_etcd = optarg; break;
                case ARG_FLEET_NODE: arg_fleet_node = optarg; break;
                case ARG_FLEET_ADVERTISE: arg_fleet_advertise = optarg; break;
                case ARG_FLEET_CACERT: arg_fleet_cacert = optarg; break;
                case ARG_FLEET_CERT: arg_fleet_cert = optarg; break;
                case ARG_FLEET_KEY: arg_fleet_key = optarg; break;
                case ARG_FLEET_USER: arg_fleet_user = optarg; break;
                case ARG_FLEET_PASSWORD: arg_fleet_password_file = optarg; break;
                case ARG_FLEET_FRONT: arg_fleet_front = true; break;
                case ARG_FLEET_TTL:
                        if (parse_ulong(optarg, FLEET_TTL_MIN, FLEET_TTL_MAX, &v) < 0)
                                return log_error_errno(EINVAL, "--fleet-lease-ttl must be %u..%u", FLEET_TTL_MIN,
                                                       FLEET_TTL_MAX);
                        arg_fleet_ttl = (unsigned) v;
                        break;
                case ARG_FLEET_MAX:
                        if (parse_ulong(optarg, 1, 4096, &v) < 0)
                                return log_error_errno(EINVAL, "--fleet-max-sandboxes must be 1..4096");
                        arg_fleet_max_sandboxes = (unsigned) v;
                        break;
                case ARG_CONNS:
                        if (parse_ulong(optarg, 1, 65536, &v) < 0)
                                return log_error_errno(EINVAL, "--connection-limit must be 1..65536");
                        arg_connection_limit = (unsigned) v;
                        break;
                case ARG_TIMEOUT:
                        if (parse_ulong(optarg, 1, 3600, &v) < 0)
                                return log_error_errno(EINVAL, "--timeout must be 1..3600");
                        arg_timeout = (unsigned) v;
                        break;
                case ARG_BODY:
                        if (parse_ulong(optarg, 1024, 64UL * 1024 * 1024, &v) < 0)
                                return log_error_errno(EINVAL, "--body-max must be 1024..67108864");
                        arg_body_max = v;
                        break;
                case ARG_MEM:
                        if (parse_ulong(optarg, 8192, 16UL * 1024 * 1024, &v) < 0)
                                return log_error_errno(EINVAL, "--memory-limit must be 8192..16777216");
                        arg_memory_limit = v;
                        break;
                case ARG_CALLS:
                        if (parse_ulong(optarg, 1, 65536, &v) < 0)
                                return log_error_errno(EINVAL, "--max-calls must be 1..65536");
                        arg_calls_max = (unsigned) v;
                        break;
                case ARG_STATE_DIR:
                        if (optarg[0] != '/')
                                return log_error_errno(EINVAL, "--state-dir must be an absolute path");
                        arg_state_dir = optarg;
                        break;
                case ARG_DEBUG: log_max_level = LOG_LVL_DEBUG; break;
                case ARG_VERSION: puts(FORKD_VERSION); return 0;
                case 'h': help(); return 0;
                default: return -EINVAL;
                }
        if (optind < argc)
                return log_error_errno(EINVAL, "Unexpected argument: %s", argv[optind]);
        if (!!arg_tls_cert != !!arg_tls_key)
                return log_error_errno(EINVAL, "--tls-cert and --tls-key go together");
        if (!!arg_fleet_cert != !!arg_fleet_key)
                return log_error_errno(EINVAL, "--fleet-etcd-cert and --fleet-etcd-key go together");
        if (!!arg_fleet_user != !!arg_fleet_password_file)
                return log_error_errno(EINVAL, "--fleet-etcd-user and --fleet-etcd-password-file go together");
        if (!arg_fleet_etcd && (arg_fleet_node || arg_fleet_advertise || arg_fleet_cacert || arg_fleet_cert ||
                                arg_fleet_user))
                return log_error_errno(EINVAL, "The --fleet-* options need --fleet-etcd");
        if (arg_fleet_front && !arg_fleet_etcd)
                return log_error_errno(EINVAL, "--fleet-front needs --fleet-etcd");
        if (arg_fleet_front && (arg_fleet_node || arg_fleet_advertise || arg_bus_address || arg_no_direct ||
                                arg_state_dir || arg_metrics_per_sandbox))
                return log_error_errno(EINVAL, "--fleet-front has no forkd behind it: --fleet-node, "
                                               "--fleet-advertise, --bus-address, --no-direct, --state-dir and "
                                               "--metrics-per-sandbox are a node's");
        return 1;
}

/* Read a small file whole. With secret, refuse a world-readable file. */
static int read_small_file(const char *path, size_t max, bool secret, char **ret) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t n;
        ssize_t k;

        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return negative_errno();
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (!S_ISREG(st.st_mode))
                return -EBADFD;
        if (secret && (st.st_mode & S_IROTH))
                return -EPERM;
        if ((uint64_t) st.st_size > max)
                return -EFBIG;
        buf = malloc((size_t) st.st_size + 1);
        if (!buf)
                return -ENOMEM;
        k = loop_read(fd, buf, (size_t) st.st_size);
        if (k < 0)
                return (int) k;
        n = (size_t) k;
        buf[n] = 0;
        if (strlen(buf) != n)
                return -EBADMSG; /* NUL inside */
        *ret = TAKE_PTR(buf);
        return 0;
}

static int load_token(const char *path, char **ret) {
        _cleanup_free_ char *t = NULL;
        size_t n;
        int r;

        r = read_small_file(path, TOKEN_MAX, true, &t);
        if (r == -EPERM)
                return log_error_errno(r, "Token file %s is readable by everyone; chmod o-r it.", path);
        if (r < 0)
                return log_error_errno(r, "Cannot read token file %s: %m", path);
        n = strlen(t);
        while (n > 0 && strchr(" \t\r\n", t[n - 1]))
                t[--n] = 0;
        if (n == 0)
                return log_error_errno(EINVAL, "Token file %s is empty.", path);
        for (size_t i = 0; i < n; i++)
                if ((unsigned char) t[i] <= ' ' || (unsigned char) t[i] >= 0x7f)
                        return log_error_errno(EINVAL, "Token in %s must be printable ASCII without spaces.", path);
        *ret = TAKE_PTR(t);
        return 0;
}

static int parse_listen(const char *s, struct sockaddr_storage *ret, socklen_t *ret_len) {
        _cleanup_free_ char *host = NULL;
        const char *colon, *port_s;
        unsigned long port;
        struct sockaddr_storage ss = {};

        if (s[0] == '[') {
                const char *end = strchr(s, ']');
                if (!end || end[1] != ':')
                        return -EINVAL;
                host = strndup(s + 1, (size_t) (end - s - 1));
                port_s = end + 2;
        } else {
                colon = strrchr(s, ':');
                if (!colon)
                        return -EINVAL;
                host = strndup(s, (size_t) (colon - s));
                port_s = colon + 1;
        }
        if (!host)
                return -ENOMEM;
        if (parse_ulong(port_s, 0, 65535, &port) < 0)
                return -EINVAL;

        if (s[0] == '[') {
                struct sockaddr_in6 *sa = (struct sockaddr_in6 *) &ss;
                sa->sin6_family = AF_INET6;
                sa->sin6_port = htons((uint16_t) port);
                if (inet_pton(AF_INET6, host, &sa->sin6_addr) != 1)
                        return -EINVAL;
                *ret_len = sizeof *sa;
        } else {
                struct sockaddr_in *sa = (struct sockaddr_in *) &ss;
                sa->sin_family = AF_INET;
                sa->sin_port = htons((uint16_t) port);
                if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
                        return -EINVAL;
                *ret_len = sizeof *sa;
        }
        *ret = ss;
        return 0;
}

static int open_listen_socket(int *ret) {
        _cleanup_close_ int fd = -EBADF;
        struct sockaddr_storage ss;
        socklen_t len;
        int one = 1, n, r;

        n = sd_listen_fds(true);
        if (n < 0)
                return log_error_errno(n, "Failed to get sockets from the service manager: %m");
        if (n > 1)
                return log_error_errno(EINVAL, "Expected at most one socket from the service manager, got %d.", n);
        if (n == 1) {
                fd = SD_LISTEN_FDS_START;
                r = sd_is_socket(fd, AF_UNSPEC, SOCK_STREAM, 1);
                if (r < 0)
                        return log_error_errno(r, "Failed to check the passed socket: %m");
                if (r == 0)
                        return log_error_errno(EINVAL, "The passed fd is not a listening stream socket.");
                if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
                        return log_error_errno(errno, "fcntl: %m");
                log_info("Using the socket passed by the service manager.");
                *ret = TAKE_FD(fd);
                return 0;
        }

        r = parse_listen(arg_listen, &ss, &len);
        if (r < 0)
                return log_error_errno(r, "Invalid --listen address '%s' (want ADDR:PORT or [ADDR6]:PORT).", arg_listen);
        fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return log_error_errno(errno, "socket(): %m");
        (void) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, (struct sockaddr *) &ss, len) < 0)
                return log_error_errno(errno, "Cannot bind %s: %m", arg_listen);
        if (listen(fd, SOMAXCONN) < 0)
                return log_error_errno(errno, "listen(): %m");
        log_info("Listening on %s.", arg_listen);
        *ret = TAKE_FD(fd);
        return 0;
}

/* --fleet-etcd-password-file, or NULL without one. */
static int load_fleet_password(char **ret) {
        size_t n;
        int r;

        *ret = NULL;
        if (!arg_fleet_password_file)
                return 0;
        r = read_small_file(arg_fleet_password_file, TOKEN_MAX, true, ret);
        if (r == -EPERM)
                return log_error_errno(r, "%s is readable by everyone; chmod o-r it.", arg_fleet_password_file);
        if (r < 0)
                return log_error_errno(r, "Cannot read %s: %m", arg_fleet_password_file);
        n = strlen(*ret);
        while (n > 0 && strchr("\r\n", (*ret)[n - 1]))
                (*ret)[--n] = 0;
        return 0;
}

static EtcdOptions fleet_etcd_options(const char *password) {
        return (EtcdOptions) {
                .cacert = arg_fleet_cacert,
                .cert = arg_fleet_cert,
                .key = arg_fleet_key,
                .user = arg_fleet_user,
                .password = password,
        };
}

/* --fleet-front: no forkd; the front end's own threads serve until a signal. */
static int run_front(sd_event *event, int fd, const char *cert, const char *key, const char *token) {
        _cleanup_free_ char *password = NULL;
        FleetFront *front = NULL;
        int r;

        r = load_fleet_password(&password);
        if (r < 0)
                return r;
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
                return log_error_errno(ENOMEM, "Cannot initialise libcurl.");
        r = fleet_front_start(&(FleetFrontConfig) {
                                      .listen_fd = fd,
                                      .tls_cert_pem = cert,
                                      .tls_key_pem = key,
                                      .token = token,
                                      .etcd = arg_fleet_etcd,
                                      .etcd_opts = fleet_etcd_options(password),
                                      .connection_limit = arg_connection_limit,
                                      .timeout_secs = arg_timeout,
                                      .body_max = arg_body_max,
                              },
                              &front);
        if (r < 0)
                return log_error_errno(r, "Cannot start the front end: %m");
        (void) sd_notify(false, "READY=1\nSTATUS=Serving the forkd REST API as a fleet's front end");
        r = sd_event_loop(event);
        (void) sd_notify(false, "STOPPING=1");
        fleet_front_stop(front);
        if (password)
                explicit_bzero(password, strlen(password));
        return r < 0 ? log_error_errno(r, "Event loop failed: %m") : 0;
}

/* --fleet-etcd: this node's record in etcd, kept by a thread of its own. */
static int start_fleet_node(FleetNode **ret) {
        _cleanup_free_ char *password = NULL, *advertise = NULL;
        char host[FLEET_NODE_NAME_MAX + 2] = "";
        FleetNodeConfig cfg = {};
        int r;

        if (!arg_fleet_node && (gethostname(host, sizeof(host) - 1) < 0 || !fleet_node_name_is_valid(host)))
                return log_error_errno(EINVAL, "The host name is no node name: give --fleet-node.");
        r = load_fleet_password(&password);
        if (r < 0)
                return r;
        if (!arg_fleet_advertise && asprintf(&advertise, "%s://%s", arg_tls_cert ? "https" : "http", arg_listen) < 0)
                return log_oom();
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
                return log_error_errno(ENOMEM, "Cannot initialise libcurl.");
        cfg = (FleetNodeConfig) {
                .etcd = arg_fleet_etcd,
                .etcd_opts = fleet_etcd_options(password),
                .name = arg_fleet_node ?: host,
                .advertise = arg_fleet_advertise ?: advertise,
                .ttl_secs = arg_fleet_ttl,
                .sandboxes_max = arg_fleet_max_sandboxes,
                .bus_address = arg_bus_address,
        };
        r = fleet_node_start(&cfg, ret); /* it keeps copies */
        if (password)
                explicit_bzero(password, strlen(password));
        return r;
}

static int run(int argc, char *argv[]) {
        _cleanup_(rest_server_freep) RestServer *server = NULL;
        _cleanup_(sd_event_unrefp) sd_event *event = NULL;
        _cleanup_free_ char *token = NULL, *cert = NULL, *key = NULL;
        RestConfig config = {};
        FleetNode *fleet = NULL;
        sigset_t mask;
        int fd = -EBADF, r;

        log_prefix = "forkd-rest";
        r = parse_argv(argc, argv);
        if (r <= 0)
                return r;

        if (arg_token_file) {
                r = load_token(arg_token_file, &token);
                if (r < 0)
                        return r;
        } else
                log_warning("No --token-file: the API is open to anyone who can connect.");
        if (arg_tls_cert) {
                r = read_small_file(arg_tls_cert, PEM_MAX, false, &cert);
                if (r < 0)
                        return log_error_errno(r, "Cannot read %s: %m", arg_tls_cert);
                r = read_small_file(arg_tls_key, PEM_MAX, true, &key);
                if (r == -EPERM)
                        return log_error_errno(r, "TLS key %s is readable by everyone; chmod o-r it.", arg_tls_key);
                if (r < 0)
                        return log_error_errno(r, "Cannot read %s: %m", arg_tls_key);
        }

        (void) signal(SIGPIPE, SIG_IGN);
        sigemptyset(&mask);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGINT);
        if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
                return log_error_errno(errno, "sigprocmask: %m");

        r = sd_event_default(&event);
        if (r < 0)
                return log_error_errno(r, "Cannot allocate the event loop: %m");
        r = sd_event_add_signal(event, NULL, SIGTERM, NULL, NULL);
        if (r >= 0)
                r = sd_event_add_signal(event, NULL, SIGINT, NULL, NULL);
        if (r < 0)
                return log_error_errno(r, "Cannot watch signals: %m");

        r = open_listen_socket(&fd);
        if (r < 0)
                return r;

        if (arg_fleet_front) {
                r = run_front(event, fd, cert, key, token);
                if (key)
                        explicit_bzero(key, strlen(key));
                if (token)
                        explicit_bzero(token, strlen(token));
                return r;
        }
        config = (RestConfig) {
                .listen_fd = fd,
                .tls_cert_pem = cert,
                .tls_key_pem = key,
                .token = token,
                .bus_address = arg_bus_address,
                .no_direct = arg_no_direct,
                .metrics_per_sandbox = arg_metrics_per_sandbox,
                .connection_limit = arg_connection_limit,
                .timeout_secs = arg_timeout,
                .memory_limit = arg_memory_limit,
                .body_max = arg_body_max,
                .calls_max = arg_calls_max,
                .state_dir = arg_state_dir ?: STATE_DIR_DEFAULT,
                .state_dir_create = arg_state_dir,
        };
        if (arg_state_dir && mkdir(arg_state_dir, 0700) < 0 && errno != EEXIST)
                return log_error_errno(errno, "Cannot make the state directory %s: %m", arg_state_dir);
        r = rest_server_new(event, &config, &server);
        if (key)
                explicit_bzero(key, strlen(key));
        if (token)
                explicit_bzero(token, strlen(token));
        if (r < 0)
                return log_error_errno(r, "Cannot start the HTTP server%s: %m",
                                       cert ? " (check the TLS certificate and key)" : "");

        if (arg_fleet_etcd) {
                r = start_fleet_node(&fleet);
                if (r < 0)
                        return r;
        }
        (void) sd_notify(false, "READY=1\nSTATUS=Serving the forkd REST API");
        r = sd_event_loop(event);
        (void) sd_notify(false, "STOPPING=1");
        fleet = fleet_node_stop(fleet);
        if (r < 0)
                return log_error_errno(r, "Event loop failed: %m");
        return 0;
}

int main(int argc, char *argv[]) {
        return run(argc, argv) < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
