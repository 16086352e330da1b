/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json-util.h"
#include "macro.h"
#include "rest-bus.h"
#include "rest-pack.h"
#include "rest-reply.h"
#include "rest-routes-common.h"
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

/* GET /v1/snapshots/:tag/pack: forkd writes the bundle into a pipe, and the
 * response streams it while forkd packs. The status waits for the first
 * bytes (200) or an error reply before any (its status: 404, ...). An error
 * after the first bytes cuts the connection: the client sees a truncated body,
 * which unpack refuses. */
typedef struct PackStream {
        int fd;                  /* the pipe's read end */
        sd_event_source *io;     /* readable: start the reply, or resume the reader */
        bool streaming, replied, failed;
} PackStream;

static void pack_stream_free(void *p) {
        PackStream *ps = p;

        if (!ps)
                return;
        sd_event_source_disable_unref(ps->io);
        safe_close(ps->fd);
        free(ps);
}

static ssize_t pack_stream_read(RestRequest *req, char *buf, size_t max) {
        PackStream *ps = rest_request_data(req);
        ssize_t n = read(ps->fd, buf, max);

        if (n > 0)
                return n;
        if (n < 0 && errno == EAGAIN) {
                (void) sd_event_source_set_enabled(ps->io, SD_EVENT_ONESHOT);
                return REST_STREAM_AGAIN;
        }
        if (n < 0)
                return REST_STREAM_ERROR;
        /* forkd closed its end: a whole bundle only if its reply says so. */
        if (!ps->replied)
                return REST_STREAM_AGAIN; /* the reply resumes us */
        return ps->failed ? REST_STREAM_ERROR : REST_STREAM_END;
}

static int pack_stream_start(RestRequest *req, PackStream *ps) {
        int r;

        ps->streaming = true;
        r = rest_reply_stream(req, 200, "application/zstd", NULL, NULL, pack_stream_read);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot stream the bundle: %s", strerror(-r));
        return 0;
}

static int on_pack_readable(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        RestRequest *req = userdata;
        PackStream *ps = rest_request_data(req);

        if (!ps->streaming) {
                int avail = 0;

                /* Readable but empty: forkd closed its end without a byte (an
                 * error, most likely); its reply says which status. */
                if (ioctl(fd, FIONREAD, &avail) < 0 || avail == 0) {
                        (void) sd_event_source_set_enabled(es, SD_EVENT_OFF);
                        return 0;
                }
                return pack_stream_start(req, ps);
        }
        rest_stream_resume(req);
        return 0;
}

static int on_reply_pack(RestRequest *req, sd_bus_message *reply) {
        const sd_bus_error *e = sd_bus_message_get_error(reply);
        PackStream *ps = rest_request_data(req);

        ps->replied = true;
        ps->failed = e != NULL;
        if (!ps->streaming) {
                if (e) {
                        (void) sd_event_source_set_enabled(ps->io, SD_EVENT_OFF);
                        return rest_reply_bus_error(req, e, 0);
                }
                return pack_stream_start(req, ps);
        }
        rest_stream_resume(req);
        return 0;
}

int rest_route_snapshot_pack(RestRequest *req) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL;
        const char *tag = rest_request_param(req);
        PackStream *ps;
        int p[2], r;

        if (!rest_tag_is_valid(tag))
                return rest_reply_error(req, 400, "invalid tag: must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$");
        r = rest_new_manager_call(req, "PackSnapshot", &m);
        if (r < 0)
                return reply_call_failed(req, r);
        if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0)
                return rest_reply_error(req, 500, "cannot make a pipe: %s", strerror(errno));
        ps = calloc(1, sizeof(*ps));
        if (!ps) {
                safe_close(p[0]);
                safe_close(p[1]);
                return rest_reply_error(req, 500, "out of memory");
        }
        ps->fd = p[0];
        rest_request_set_data(req, ps, pack_stream_free);
        r = sd_bus_message_append(m, "sh", tag, p[1]); /* sd-bus keeps a copy of the write end */
        safe_close(p[1]);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot build D-Bus call: %s", strerror(-r));
        r = sd_event_add_io(sd_bus_get_event(sd_bus_message_get_bus(m)), &ps->io, ps->fd, EPOLLIN, on_pack_readable,
                            req);
        if (r >= 0)
                r = sd_event_source_set_enabled(ps->io, SD_EVENT_ONESHOT);
        if (r < 0)
                return rest_reply_error(req, 500, "cannot watch the pipe: %s", strerror(-r));
        r = rest_call_detached(req, m, CALL_TIMEOUT_PACK, on_reply_pack);
        if (r < 0)
                return reply_call_failed(req, r);
        rest_request_wait(req);
        return 0;
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

/* PushSnapshot, PullSnapshot: the registry reference (a tag that may be set). */
#define REST_REF_MAX 1024
#define REST_PULL_BODY_MAX (16 * 1024)

struct transfer_args {
        char ref[REST_REF_MAX + 2];
        char tag[REST_TAG_MAX + 2];
};

static const struct json_dispatch transfer_table[] = {
        { "ref", JSON_KIND_STRING, NULL, offsetof(struct transfer_args, ref), JSON_FIELD_SIZE(struct transfer_args, ref),
          JSON_MANDATORY },
        { "tag", JSON_KIND_STRING, NULL, offsetof(struct transfer_args, tag), JSON_FIELD_SIZE(struct transfer_args, tag),
          JSON_NULLABLE },
        {}
};

/* POST /v1/snapshots/:tag/push {"ref"}: 200 {digest, bytes_sent, blobs_sent, links}. */
int rest_route_snapshot_push(RestRequest *req) {
        static const struct json_dispatch table[] = {
                { "ref", JSON_KIND_STRING, NULL, offsetof(struct transfer_args, ref),
                  JSON_FIELD_SIZE(struct transfer_args, ref), JSON_MANDATORY },
                {}
        };
        _cleanup_json_ struct json_object *o = NULL;
        struct transfer_args a = {};
        const char *tag;
        int r;

        tag = rest_param_or_reply(req, "tag");
        if (!tag)
                return 0;
        r = rest_parse_body(req, false, table, &a, NULL, &o);
        if (r <= 0)
                return r;
        return rest_call_manager(req, "PushSnapshot", CALL_TIMEOUT_PACK, rest_on_reply_dict_200, "ssa{sv}", tag, a.ref,
                                 0);
}

/* POST /v1/snapshots/pull {"ref", "tag"?}: its route takes bundles, so the
 * body is in a file. 201 [SnapshotInfo, ...], root first. */
static int snapshot_pull(RestRequest *req, int fd) {
        _cleanup_json_ struct json_object *o = NULL;
        _cleanup_free_ char *buf = NULL;
        const char *field = NULL, *reason = NULL;
        struct transfer_args a = {};
        struct stat st;
        ssize_t n;
        int r;

        if (fstat(fd, &st) < 0)
                return rest_reply_error(req, 500, "cannot read the body: %s", strerror(errno));
        if (st.st_size > REST_PULL_BODY_MAX)
                return rest_reply_error(req, 413, "request body larger than %d bytes", REST_PULL_BODY_MAX);
        buf = malloc((size_t) st.st_size + 1);
        if (!buf)
                return rest_reply_error(req, 500, "out of memory");
        n = pread(fd, buf, (size_t) st.st_size, 0);
        if (n < 0 || n != st.st_size)
                return rest_reply_error(req, 500, "cannot read the body");
        buf[n] = 0;
        r = json_parse_strict(buf, (size_t) n, REST_PULL_BODY_MAX, 16, &o, &reason);
        if (r < 0)
                return rest_reply_error(req, 400, "request body: %s", reason ?: "invalid JSON");
        r = json_dispatch_full(o, transfer_table, REST_BODY_FLAGS, &a, &field, &reason);
        if (r < 0)
                return rest_reply_dispatch_error(req, r, field, reason);
        if (a.tag[0] && !rest_tag_is_valid(a.tag))
                return rest_reply_error(req, 400, "invalid tag '%s': must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$",
                                        a.tag);
        return rest_call_manager(req, "PullSnapshot", CALL_TIMEOUT_PACK, rest_on_reply_array_201, "ssa{sv}", a.ref,
                                 a.tag, 0);
}

int rest_route_snapshot_post(RestRequest *req) {
        const char *p = rest_request_param(req), *tag = rest_request_query(req, "tag");
        int fd;

        if (p && strcmp(p, "pull") == 0) {
                fd = rest_request_body_fd(req);
                if (fd < 0)
                        return rest_reply_error(req, 500, "cannot read the body: %s", strerror(-fd));
                return snapshot_pull(req, fd);
        }
        if (!p || strcmp(p, "unpack") != 0)
                return rest_reply_error(req, 405, "method POST not allowed on /v1/snapshots/%.64s", p ?: "");
        if (tag && !rest_tag_is_valid(tag))
                return rest_reply_error(req, 400, "invalid tag: must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$");
        fd = rest_request_body_fd(req);
        if (fd < 0)
                return rest_reply_error(req, 500, "cannot read the body: %s", strerror(-fd));
        return call(req, "UnpackSnapshot", "hs", tag ?: "", fd, on_reply_unpack);
}
