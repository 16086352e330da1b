/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Direct D-Bus connections on a private socket: see direct-listener.h. */
#include <fcntl.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "direct-listener.h"
#include "macro.h"
#include "manager-dbus.h"
#include "polkit.h"

/* ---- direct connections ----
 *
 * A caller on the bus pays two passes through the bus daemon per call (call
 * and reply), each a wakeup of another process. A direct connection is the
 * same D-Bus objects on a private socket, as systemd's PID 1 offers on
 * /run/systemd/private. The peer must be root or the trusted REST bridge
 * (forkd --trusted-bridge-user; SO_PEERCRED, checked before anything is
 * read), and every method still calls bus_verify_polkit_async(), which
 * admits root, admits the bridge for all but org.forkd.manage-all without
 * asking polkit (its bearer token already authenticated the HTTP caller,
 * and the shipped rules allow it the rest on the bus anyway), and refuses
 * anyone else on a direct connection. forkd-rest finds the socket through
 * the DirectSocket property. */

int manager_trust_bridge(Manager *m, uid_t uid) {
        int r;

        if (uid == 0 || uid == OWNER_UID_INVALID)
                return -EINVAL;
        /* A confined VMM runs as vmm_uid, or an id of --vmm-uid-range, and sees
         * the state directory, where the socket may be: it must never pass for
         * the bridge. */
        if (uid == m->vmm_uid || uid_range_contains(&m->vmm_uids, uid))
                return -EEXIST;
        r = polkit_registry_trust_bridge(&m->polkit_registry, uid);
        if (r < 0)
                return r;
        m->bridge_uid = uid;
        return 0;
}

static void direct_drop(Manager *m, sd_bus *bus) {
        for (unsigned i = 0; i < m->n_direct; i++)
                if (m->direct[i] == bus) {
                        m->direct[i] = m->direct[--m->n_direct];
                        m->direct_started[i] = m->direct_started[m->n_direct];
                        m->direct[m->n_direct] = NULL;
                        (void) sd_bus_flush(bus);
                        sd_bus_close(bus);
                        (void) sd_bus_detach_event(bus);
                        sd_bus_unref(bus);
                        return;
                }
}

static int on_direct_disconnected(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;

        log_debug("Direct D-Bus connection closed.");
        direct_drop(m, sd_bus_message_get_bus(message));
        return 0;
}

/* sd-bus, as a server, may read the peer's BEGIN and its first message in one
 * go while authenticating, and then leave that message in its buffer: nothing
 * new arrives on the socket, so the event loop never dispatches it and the
 * caller waits for ever (seen with two clients connecting at once). After every
 * iteration of the loop, each connection that has just become ready is
 * processed until it has nothing left; the source is off once none is waiting. */
static int on_direct_kick(sd_event_source *s, void *userdata) {
        Manager *m = userdata;
        bool waiting = false;

        for (unsigned i = 0; i < m->n_direct;) {
                sd_bus *bus = m->direct[i];
                int r;

                if (m->direct_started[i]) {
                        i++;
                        continue;
                }
                if (sd_bus_is_ready(bus) <= 0) {
                        waiting = true;
                        i++;
                        continue;
                }
                m->direct_started[i] = true;
                sd_bus_ref(bus);
                do
                        r = sd_bus_process(bus, NULL);
                while (r > 0);
                /* Processing may have dropped it (Disconnected), moving another into slot i. */
                if (i < m->n_direct && m->direct[i] == bus)
                        i++;
                sd_bus_unref(bus);
        }
        if (!waiting)
                (void) sd_event_source_set_enabled(s, SD_EVENT_OFF);
        return 0;
}

/* Root, or the trusted bridge: 1; anyone else: 0. */
static int direct_peer_admitted(Manager *m, int fd, uid_t *ret_uid) {
        struct ucred uc;
        socklen_t n = sizeof uc;

        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &n) < 0)
                return -errno;
        if (n != sizeof uc)
                return -EIO;
        *ret_uid = uc.uid;
        return uc.uid == 0 || (m->bridge_uid != OWNER_UID_INVALID && uc.uid == m->bridge_uid);
}

static int on_direct_connection(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        _cleanup_(sd_bus_unrefp) sd_bus *bus = NULL;
        Manager *m = userdata;
        uid_t peer = OWNER_UID_INVALID;
        sd_id128_t id;
        int cfd, r;

        cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
                if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                        log_warning_errno(errno, "Failed to accept a direct D-Bus connection: %m");
                return 0;
        }
        r = direct_peer_admitted(m, cfd, &peer);
        if (r <= 0) {
                if (r == 0)
                        log_debug("Refusing a direct D-Bus connection from uid %u: neither root nor the "
                                  "trusted bridge.", (unsigned) peer);
                safe_close(cfd);
                return 0;
        }
        if (m->n_direct >= FORKD_DIRECT_CONNECTIONS_MAX || m->exiting) {
                log_debug("Refusing a direct D-Bus connection: %u open.", m->n_direct);
                safe_close(cfd);
                return 0;
        }

        r = sd_bus_new(&bus);
        if (r < 0) {
                safe_close(cfd);
                return 0;
        }
        (void) sd_bus_set_description(bus, "forkd-direct");
        r = sd_bus_set_fd(bus, cfd, cfd);
        if (r < 0) {
                safe_close(cfd);
                return 0;
        }
        r = sd_id128_randomize(&id);
        if (r >= 0)
                r = sd_bus_set_server(bus, true, id);
        if (r >= 0)
                r = sd_bus_set_trusted(bus, false);
        if (r >= 0)
                r = sd_bus_start(bus);
        if (r >= 0)
                r = sd_bus_attach_event(bus, m->event, 0);
        if (r >= 0)
                r = sd_bus_match_signal(bus, NULL, "org.freedesktop.DBus.Local", "/org/freedesktop/DBus/Local",
                                        "org.freedesktop.DBus.Local", "Disconnected", on_direct_disconnected, m);
        if (r >= 0)
                r = manager_add_bus_objects_to(m, bus);
        if (r < 0) {
                log_debug_errno(r, "Cannot set up a direct D-Bus connection: %m");
                return 0;
        }
        if (!m->direct_kick) {
                r = sd_event_add_post(m->event, &m->direct_kick, on_direct_kick, m);
                if (r < 0) {
                        log_debug_errno(r, "Cannot set up a direct D-Bus connection: %m");
                        return 0;
                }
                (void) sd_event_source_set_description(m->direct_kick, "direct-bus-kick");
        }
        r = sd_event_source_set_enabled(m->direct_kick, SD_EVENT_ON);
        if (r < 0) {
                log_debug_errno(r, "Cannot set up a direct D-Bus connection: %m");
                return 0;
        }
        m->direct_started[m->n_direct] = false;
        m->direct[m->n_direct++] = TAKE_PTR(bus);
        return 0;
}

static int fd_cloexec_nonblock(int fd) {
        int fl = fcntl(fd, F_GETFD);

        if (fl < 0 || fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0)
                return -errno;
        fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
                return -errno;
        return 0;
}

int manager_take_activated_direct(Manager *m) {
        union {
                struct sockaddr sa;
                struct sockaddr_un un;
        } sa = {};
        socklen_t salen = sizeof sa;
        int n, fd;

        n = sd_listen_fds(true); /* unsets $LISTEN_FDS: no VMM sees it */
        if (n < 0)
                return log_warning_errno(n, "Cannot read the sockets systemd passed: %m");
        for (fd = SD_LISTEN_FDS_START; fd < SD_LISTEN_FDS_START + n; fd++) {
                /* systemd passes them without O_CLOEXEC; no VMM may inherit one. */
                if (fd_cloexec_nonblock(fd) < 0 || m->direct_fd >= 0 || geteuid() != 0 ||
                    sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0 ||
                    getsockname(fd, &sa.sa, &salen) < 0 || salen <= offsetof(struct sockaddr_un, sun_path) ||
                    sa.un.sun_path[0] == '\0') {
                        log_warning("Ignoring passed fd %i: forkd takes one listening AF_UNIX stream socket "
                                    "with a path (forkd.socket), and only as root.", fd);
                        safe_close(fd);
                        continue;
                }
                m->direct_path = strndup(sa.un.sun_path, salen - offsetof(struct sockaddr_un, sun_path));
                if (!m->direct_path) {
                        safe_close(fd);
                        return log_oom();
                }
                m->direct_fd = fd;
                m->direct_activated = true;
        }
        return 0;
}

static int watch_direct(Manager *m) {
        int r;

        r = sd_event_add_io(m->event, &m->direct_source, m->direct_fd, EPOLLIN, on_direct_connection, m);
        if (r < 0)
                return log_warning_errno(r, "Cannot watch %s: %m", m->direct_path);
        (void) sd_event_source_set_description(m->direct_source, "direct-bus");
        if (m->bridge_uid != OWNER_UID_INVALID)
                log_debug("Direct D-Bus connections for root and the bridge (uid %u) on %s%s.",
                          (unsigned) m->bridge_uid, m->direct_path, m->direct_activated ? " (socket-activated)" : "");
        else
                log_debug("Direct D-Bus connections for root on %s%s.", m->direct_path,
                          m->direct_activated ? " (socket-activated)" : "");
        return 0;
}

int manager_listen_direct(Manager *m) {
        union {
                struct sockaddr sa;
                struct sockaddr_un un;
        } sa = { .un.sun_family = AF_UNIX };
        _cleanup_free_ char *path = NULL;
        int fd, r;

        if (m->direct_activated)
                return watch_direct(m);
        if (geteuid() != 0)
                return 0; /* it would admit nobody: non-root callers need polkit, hence the bus */
        if (asprintf(&path, "%s/bus.sock", m->state_dir) < 0)
                return log_oom();
        if (strlen(path) >= sizeof sa.un.sun_path) {
                log_debug("%s is too long for a socket; no direct D-Bus connections.", path);
                return 0;
        }
        strcpy(sa.un.sun_path, path);

        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return log_warning_errno(errno, "Cannot create the direct D-Bus socket: %m");
        /* We hold the state directory's lock: a socket there is a dead daemon's. */
        if (unlink(path) < 0 && errno != ENOENT) {
                r = log_warning_errno(errno, "Cannot remove the old %s: %m", path);
                safe_close(fd);
                return r;
        }
        /* Only root (and the bridge: the file is its own) may connect; the peer check
         * on accept says so again. The bridge reaches it only where the directories
         * above let it through (forkd.socket's /run/forkd is 0711). */
        mode_t old = umask(0077);
        r = bind(fd, &sa.sa, sizeof sa.un);
        umask(old);
        if (r >= 0 && m->bridge_uid != OWNER_UID_INVALID)
                r = chown(path, m->bridge_uid, (gid_t) -1);
        if (r < 0 || chmod(path, 0600) < 0 || listen(fd, SOMAXCONN) < 0) {
                r = log_warning_errno(errno, "Cannot listen on %s: %m", path);
                safe_close(fd);
                (void) unlink(path);
                return r;
        }
        m->direct_fd = fd;
        m->direct_path = TAKE_PTR(path);
        r = watch_direct(m);
        if (r < 0) {
                (void) unlink(m->direct_path);
                free(m->direct_path);
                m->direct_path = NULL;
                m->direct_fd = safe_close(m->direct_fd);
        }
        return r;
}

void manager_close_direct(Manager *m) {
        while (m->n_direct > 0)
                direct_drop(m, m->direct[0]);
        m->direct_source = sd_event_source_disable_unref(m->direct_source);
        m->direct_kick = sd_event_source_disable_unref(m->direct_kick);
        m->direct_fd = safe_close(m->direct_fd);
        if (m->direct_path) {
                if (!m->direct_activated) /* forkd.socket's path stays: systemd listens on it */
                        (void) unlink(m->direct_path);
                free(m->direct_path);
                m->direct_path = NULL;
        }
}
