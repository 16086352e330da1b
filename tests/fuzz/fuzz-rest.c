/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd-rest's request side: the bytes are one connection's worth of HTTP to
 * a real RestServer (libmicrohttpd in sd-event, as forkd-rest runs it) in this
 * process: request line and headers, the route matcher, the bearer token
 * check, Content-Length and body limits, query arguments, the JSON body
 * parsers and field tables of every route. Behind it is no bus (an address
 * whose socket does not exist), so a request that gets past its checks is
 * answered 503 without reaching forkd. The token is "fuzz-token".
 * FORKD_FUZZ_DEBUG=1 prints what the server answered.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <systemd/sd-event.h>

#include "rest-server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static sd_event *event;
static RestServer *server;
static struct sockaddr_in addr;

static void setup(void) {
        socklen_t len = sizeof(addr);
        RestConfig config = {
                .token = "fuzz-token",
                .bus_address = "unix:path=/nonexistent/forkd-fuzz-rest-bus",
                .no_direct = true,
                .timeout_secs = 2,
                .body_max = 64 * 1024,
        };
        int fd;

        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        addr = (struct sockaddr_in) { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        if (fd < 0 || bind(fd, (struct sockaddr *) &addr, sizeof(addr)) < 0 || listen(fd, 16) < 0 ||
            getsockname(fd, (struct sockaddr *) &addr, &len) < 0)
                abort();
        config.listen_fd = fd;
        if (sd_event_new(&event) < 0 || rest_server_new(event, &config, &server) < 0)
                abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        size_t off = 0;
        unsigned idle = 0;
        int c;

        if (!server)
                setup();

        c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (c < 0)
                abort();
        if (connect(c, (struct sockaddr *) &addr, sizeof(addr)) < 0 && errno != EINPROGRESS)
                abort();

        /* Send, and let the server run until it has answered and gone quiet
         * (or closed), or for at most 200 turns of 1 ms. */
        for (unsigned turn = 0; turn < 200 && idle < 3; turn++) {
                char buf[4096];
                ssize_t n;
                bool progress = false;

                if (off < size) {
                        n = send(c, data + off, size - off, MSG_NOSIGNAL);
                        if (n > 0) {
                                off += (size_t) n;
                                progress = true;
                        }
                }
                if (sd_event_run(event, 1000) > 0)
                        progress = true;
                while ((n = read(c, buf, sizeof(buf))) > 0) {
                        progress = true;
                        if (getenv("FORKD_FUZZ_DEBUG"))
                                fprintf(stderr, "%.*s\n", (int) n, buf);
                }
                if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
                        break; /* the server closed the connection */
                idle = progress ? 0 : idle + 1;
        }
        close(c);
        /* Let the server see the close and free the connection. */
        for (unsigned turn = 0; turn < 3; turn++)
                (void) sd_event_run(event, 0);
        return 0;
}
