/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* forkd-rest's D-Bus client: the connection to the bus (or to forkd's own
 * direct socket) and the asynchronous calls of the routes. */

#include <microhttpd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "bus-open.h"
#include "macro.h"
#include "rest-bus.h"
#include "rest-reply.h"
#include "rest-server-internal.h"
#include "time-util.h"

#define DIRECT_RETRY_USEC (5 * USEC_PER_SEC)

/* ---------------- D-Bus connection ---------------- */

int rest_bus_ensure(RestServer *s) {
        _cleanup_(sd_bus_unrefp) sd_bus *bus = NULL;
        int r;

        if (s->bus && sd_bus_is_open(s->bus) > 0)
                return 0;

        /* Calls still pending on a closed connection hold their own
         * references; the old bus stays attached until they got their
         * (synthesised) error replies. */
        s->bus = sd_bus_unref(s->bus);

        r = bus_open_address(s->bus_address, "forkd-rest", &bus);
        if (r < 0)
                return r;
        r = sd_bus_attach_event(bus, s->event, SD_EVENT_PRIORITY_NORMAL);
        if (r < 0)
                return r;

        s->bus = TAKE_PTR(bus);
        return 0;
}

/* ---------------- direct connection to forkd ----------------
 *
 * Each call through the bus passes the bus daemon twice (call and reply),
 * each time a wakeup of another process. forkd also serves its objects on a
 * socket of its own (DirectSocket), to root and to the one user it trusts as
 * the bridge (forkd --trusted-bridge-user; the shipped units trust
 * forkd-rest): its accept checks the peer's uid, and there the bridge needs
 * no polkit round trip. Anyone else is refused (by the file's mode, or by
 * forkd closing the connection), and calls stay on the bus. The path comes
 * from the owner of org.forkd.Manager, a name that the bus policy lets only
 * root own, and the peer must be root. Any failure leaves the bus as it was. */

static int direct_connect(RestServer *s, const char *path) {
        _cleanup_(sd_bus_unrefp) sd_bus *bus = NULL;
        union {
                struct sockaddr sa;
                struct sockaddr_un un;
        } sa = { .un.sun_family = AF_UNIX };
        struct ucred uc;
        socklen_t n = sizeof uc;
        int fd, r;

        if (path[0] != '/' || strlen(path) >= sizeof sa.un.sun_path)
                return -EINVAL;
        strcpy(sa.un.sun_path, path);

        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        /* Non-blocking: a unix socket connects at once or fails (EAGAIN when
         * the backlog is full); it never stalls the loop. */
        if (connect(fd, &sa.sa, sizeof sa.un) < 0) {
                r = -errno;
                safe_close(fd);
                return r;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &n) < 0 || n != sizeof uc || uc.uid != 0) {
                safe_close(fd);
                return -EPERM;
        }

        r = sd_bus_new(&bus);
        if (r < 0) {
                safe_close(fd);
                return r;
        }
        r = sd_bus_set_fd(bus, fd, fd);
        if (r < 0) {
                safe_close(fd);
                return r;
        }
        (void) sd_bus_set_description(bus, "forkd-rest-direct");
        r = sd_bus_start(bus);
        if (r < 0)
                return r;
        r = sd_bus_attach_event(bus, s->event, SD_EVENT_PRIORITY_NORMAL);
        if (r < 0)
                return r;
        s->direct = sd_bus_unref(s->direct);
        s->direct = TAKE_PTR(bus);
        log_debug("Calls go to forkd directly on %s.", path);
        return 0;
}

static int on_direct_socket(sd_bus_message *reply, void *userdata, sd_bus_error *ret_error) {
        RestServer *s = userdata;
        const char *path;
        int r;

        s->direct_query = sd_bus_slot_unref(s->direct_query);
        if (sd_bus_message_is_method_error(reply, NULL))
                return 0; /* an older forkd, or none yet: the bus it is */
        r = sd_bus_message_read(reply, "v", "s", &path);
        if (r < 0 || !*path)
                return 0;
        r = direct_connect(s, path);
        if (r < 0)
                log_debug_errno(r, "No direct connection to forkd on %s, using the bus: %m", path);
        return 0;
}

void rest_bus_direct_query_start(RestServer *s) {
        uint64_t now = now_usec();
        int r;

        if (s->no_direct || s->direct_query || !s->bus || now < s->direct_next_query)
                return;
        s->direct_next_query = now + DIRECT_RETRY_USEC;
        r = sd_bus_call_method_async(s->bus, &s->direct_query, "org.forkd.Manager", "/org/forkd/Manager",
                                     "org.freedesktop.DBus.Properties", "Get", on_direct_socket, s, "ss",
                                     "org.forkd.Manager", "DirectSocket");
        if (r < 0)
                log_debug_errno(r, "Cannot ask forkd for its direct socket: %m");
}

/* The connection a call goes out on: the direct one once forkd has
 * accepted it (authentication done: forkd closes connections it does not
 * want, e.g. beyond its cap, before that), the bus otherwise. */
static sd_bus *call_bus(RestServer *s) {
        if (s->direct) {
                if (sd_bus_is_ready(s->direct) > 0)
                        return s->direct;
                if (sd_bus_is_open(s->direct) > 0)
                        return s->bus; /* still authenticating */
                /* Closed: forkd went away or refused us. Pending calls hold
                 * their own references and get their (synthesised) error
                 * replies. */
                s->direct = sd_bus_unref(s->direct);
        }
        rest_bus_direct_query_start(s);
        return s->bus;
}

/* ---------------- D-Bus calls ---------------- */

int rest_new_call(RestRequest *req, const char *path, const char *interface, const char *member,
                  sd_bus_message **ret) {
        RestServer *s = req->server;
        sd_bus *bus;
        int r;

        r = rest_bus_ensure(s);
        if (r < 0)
                return log_debug_errno(r, "Cannot connect to the bus: %m");
        bus = call_bus(s);
        /* A direct connection has no names: no destination. */
        return sd_bus_message_new_method_call(bus, ret, bus == s->bus ? "org.forkd.Manager" : NULL, path,
                                              interface, member);
}

int rest_new_manager_call(RestRequest *req, const char *member, sd_bus_message **ret) {
        return rest_new_call(req, "/org/forkd/Manager", "org.forkd.Manager", member, ret);
}

static int on_bus_reply(sd_bus_message *reply, void *userdata, sd_bus_error *ret_error) {
        RestRequest *req = userdata;
        RestServer *s = req->server;
        int r;

        req->slot = sd_bus_slot_unref(req->slot);
        s->calls_in_flight--;

        r = req->on_reply(req, reply);
        if (r < 0 && req->suspended)
                (void) rest_reply_error(req, 500, "failed to translate the daemon's reply: %s", strerror(-r));
        if (req->suspended) /* a handler that forgot to answer */
                (void) rest_reply_error(req, 500, "no reply produced");
        return 0;
}

int rest_call(RestRequest *req, sd_bus_message *m, uint64_t timeout_usec, rest_reply_func on_reply) {
        RestServer *s = req->server;
        int r;

        if (s->calls_in_flight >= s->calls_max) {
                s->metrics.calls_rejected++;
                return -EBUSY;
        }
        r = sd_bus_call_async(sd_bus_message_get_bus(m), &req->slot, m, on_bus_reply, req, timeout_usec);
        if (r < 0)
                return log_debug_errno(r, "Failed to send D-Bus call: %m");

        s->calls_in_flight++;
        s->metrics.calls_total++;
        if (sd_bus_message_get_bus(m) == s->direct)
                s->metrics.calls_direct++;
        req->idem_sent = true;
        req->on_reply = on_reply;
        req->suspended = true;
        req->next = s->suspended;
        if (s->suspended)
                s->suspended->prev = req;
        s->suspended = req;
        /* No idle timeout while we wait for the daemon: the D-Bus call has its own. */
        (void) MHD_set_connection_option(req->connection, MHD_CONNECTION_OPTION_TIMEOUT, 0);
        MHD_suspend_connection(req->connection);
        return 0;
}

static int on_bus_reply_detached(sd_bus_message *reply, void *userdata, sd_bus_error *ret_error) {
        RestRequest *req = userdata;

        req->slot = sd_bus_slot_unref(req->slot);
        req->server->calls_in_flight--;
        (void) req->on_reply(req, reply);
        return 0;
}

int rest_call_detached(RestRequest *req, sd_bus_message *m, uint64_t timeout_usec, rest_reply_func on_reply) {
        RestServer *s = req->server;
        int r;

        if (s->calls_in_flight >= s->calls_max) {
                s->metrics.calls_rejected++;
                return -EBUSY;
        }
        r = sd_bus_call_async(sd_bus_message_get_bus(m), &req->slot, m, on_bus_reply_detached, req, timeout_usec);
        if (r < 0)
                return log_debug_errno(r, "Failed to send D-Bus call: %m");
        s->calls_in_flight++;
        s->metrics.calls_total++;
        if (sd_bus_message_get_bus(m) == s->direct)
                s->metrics.calls_direct++;
        req->idem_sent = true;
        req->on_reply = on_reply;
        return 0;
}

