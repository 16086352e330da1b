/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json-util.h"
#include "macro.h"
#include "rest-pack.h"
#include "rest-util.h"

#define CALL_TIMEOUT_PACK (3600ULL * 1000000ULL)

static int reply_call_failed(RestRequest *req, int r) {
        if (r == -EBUSY)
                return rest_reply_error(req, 503, "too many requests in flight to the daemon, retry later");
        return rest_reply_error(req, 503, "forkd daemon unavailable: %s", strerror(-r));
}

static int call(RestRequest *req, const char *member, const char *types, const char *s, int fd, rest_reply_func cb) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        int r;

        r = rest_new_manager_call(req, member, &m);
        if (r < 0)
                return reply_call_failed(req, r);
        if (types[0] == 's')
                r = sd_bus_message_append(m, types, s, fd);
        else
                r = sd_bus_message_append(m, types, fd, s);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = rest_call(req, m, CALL_TIMEOUT_PACK, cb);
        if (r < 0)
                return reply_call_failed(req, r);
        return 0;
}

static int on_reply_pack(RestRequest *req, sd_bus_message *reply) {
        const sd_bus_error *e = sd_bus_message_get_error(reply);
        struct stat st;
        int fd, copy;

        if (e)
                return rest_reply_bus_error(req, e, 0);
        /* forkd wrote the bundle into the request's temporary file. */
        fd = rest_request_body_fd(req);
        if (fd < 0 || fstat(fd, &st) < 0)
                return rest_reply_error(req, 500, "cannot read the bundle: %s", strerror(fd < 0 ? -fd : errno));
        copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (copy < 0)
                return rest_reply_error(req, 500, "cannot read the bundle: %s", strerror(errno));
        return rest_reply_fd(req, 200, "application/zstd", copy, (uint64_t) st.st_size);
}

int rest_route_snapshot_pack(RestRequest *req) {
        const char *tag = rest_request_param(req);
        int fd;

        if (!rest_tag_is_valid(tag))
                return rest_reply_error(req, 400, "invalid tag: must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$");
        fd = rest_request_body_fd(req);
        if (fd < 0)
                return rest_reply_error(req, 500, "cannot make a buffer for the bundle: %s", strerror(-fd));
        return call(req, "PackSnapshot", "sh", tag, fd, on_reply_pack);
}

static int on_reply_unpack(RestRequest *req, sd_bus_message *reply) {
        _cleanup_json_ struct json_object *a = NULL;
        const sd_bus_error *e = sd_bus_message_get_error(reply);
        int r;

        if (e)
                return rest_reply_bus_error(req, e, 0);
        r = rest_bus_read_dict_array_json(reply, &a);
        if (r < 0)
                return rest_reply_error(req, 500, "unexpected reply from the daemon: %s", strerror(-r));
        return rest_reply_json(req, 201, a);
}

int rest_route_snapshot_post(RestRequest *req) {
        const char *p = rest_request_param(req), *tag = rest_request_query(req, "tag");
        int fd;

        if (!p || strcmp(p, "unpack") != 0)
                return rest_reply_error(req, 405, "method POST not allowed on /v1/snapshots/%.64s", p ?: "");
        if (tag && !rest_tag_is_valid(tag))
                return rest_reply_error(req, 400, "invalid tag: must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$");
        fd = rest_request_body_fd(req);
        if (fd < 0)
                return rest_reply_error(req, 500, "cannot read the body: %s", strerror(-fd));
        return call(req, "UnpackSnapshot", "hs", tag ?: "", fd, on_reply_unpack);
}

size_t rest_method_body_fd_max(const struct rest_method *m) {
        return m && m->handler == rest_route_snapshot_post ? (size_t) REST_BUNDLE_MAX : 0;
}
