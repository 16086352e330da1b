/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The identity event (docs/agent-protocol.md, "Events"): after every restore
 * the VMM tells the guest who it is now. Apply it before anything else is
 * answered: reseed the kernel RNG with the seed (RNDADDENTROPY, credited, as
 * PID 1; else a plain write to /dev/urandom, mixed in but not credited) and
 * rekey its CRNG from it at once (RNDRESEEDCRNG), then Python's generators
 * from the reseeded kernel, set the wall clock (when allowed), take id and
 * generation.
 */

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <linux/random.h>
#include <sys/ioctl.h>
#include <time.h>

#include "agent-python.h"
#include "agent.h"
#include "json-util.h"
#include "macro.h"

typedef struct IdentityEvent {
        struct json_object *id;
        uint64_t generation;
        uint8_t seed[32];
        int64_t wall_ns;
} IdentityEvent;

static int dispatch_ignore(struct json_object *v, void *field, const char **ret_error) {
        return 0;
}

static int dispatch_id(struct json_object *v, void *field, const char **ret_error) {
        struct json_object **p = field;

        if (!json_object_is_type(v, json_type_string) && !json_object_is_type(v, json_type_int)) {
                *ret_error = "id must be a string or an integer";
                return -EINVAL;
        }
        if (json_object_is_type(v, json_type_string) && json_object_get_string_len(v) > 256) {
                *ret_error = "id too long";
                return -EINVAL;
        }
        *p = v;
        return 0;
}

static int dispatch_seed(struct json_object *v, void *field, const char **ret_error) {
        uint8_t *seed = field, tmp[32];
        const char *s;

        if (!json_object_is_type(v, json_type_string) || json_object_get_string_len(v) != 64) {
                *ret_error = "seed must be 64 hex digits";
                return -EINVAL;
        }
        s = json_object_get_string(v);
        for (size_t i = 0; i < 32; i++) {
                int hi = unhexchar(s[2 * i]), lo = unhexchar(s[2 * i + 1]);

                if (hi < 0 || lo < 0) {
                        *ret_error = "seed must be 64 hex digits";
                        return -EINVAL;
                }
                tmp[i] = (uint8_t) (hi << 4 | lo);
        }
        memcpy(seed, tmp, sizeof tmp);
        return 0;
}

static const struct json_dispatch identity_table[] = {
        { "op", JSON_KIND_STRING, dispatch_ignore, 0, 0, JSON_MANDATORY },
        { "id", JSON_KIND_ANY, dispatch_id, offsetof(IdentityEvent, id), 0, JSON_MANDATORY },
        { "generation", JSON_KIND_UINT64, NULL, offsetof(IdentityEvent, generation), 0, JSON_MANDATORY },
        { "seed", JSON_KIND_STRING, dispatch_seed, offsetof(IdentityEvent, seed), 0, JSON_MANDATORY },
        { "wall_ns", JSON_KIND_INT64, NULL, offsetof(IdentityEvent, wall_ns), 0, JSON_MANDATORY },
        {}
};

/* Mixing the seed in is not enough: once the kernel's CRNG is ready it
 * reseeds only when its key is older than its interval (up to a minute), so
 * children of one snapshot would read the same bytes until then. Hence
 * RNDRESEEDCRNG, which rekeys it from the input pool now (CAP_SYS_ADMIN). */
static int reseed_kernel(const uint8_t seed[static 32], bool credit) {
        _cleanup_close_ int fd = -EBADF;
        struct {
                struct rand_pool_info info;
                uint8_t buf[32];
        } e = {
                .info.entropy_count = 256,
                .info.buf_size = 32,
        };
        ssize_t k;

        fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return -errno;
        memcpy(e.buf, seed, 32);
        if (!(credit && ioctl(fd, RNDADDENTROPY, &e) >= 0)) {
                /* not PID 1, or no CAP_SYS_ADMIN: mix in without credit */
                k = write(fd, seed, 32);
                if (k < 0)
                        return -errno;
                if (k != 32)
                        return -EIO;
        }
        if (ioctl(fd, RNDRESEEDCRNG) < 0) {
                if (errno == EPERM && !credit)
                        return 0; /* a test run as a user: the seed is mixed in, no more */
                return -errno;
        }
        return 0;
}

int agent_identity_event(Agent *a, struct json_object *ev) {
        IdentityEvent e = {};
        const char *field = NULL, *err = NULL;
        int r;

        r = json_dispatch_full(ev, identity_table, 0, &e, &field, &err);
        if (r < 0)
                return log_warning_errno(r, "Identity event: bad field '%s': %s", field ?: "?", err ?: "?");
        if (e.wall_ns < 0)
                return log_warning_errno(EINVAL, "Identity event: negative wall_ns");

        r = reseed_kernel(e.seed, a->config.pid1);
        if (r < 0)
                log_warning_errno(r, "Failed to reseed the kernel RNG: %m");
        agent_python_reseed();

        if (a->config.set_clock) {
                struct timespec ts = {
                        .tv_sec = (time_t) (e.wall_ns / 1000000000),
                        .tv_nsec = (long) (e.wall_ns % 1000000000),
                };

                if (clock_settime(CLOCK_REALTIME, &ts) < 0)
                        log_warning_errno(errno, "Failed to set the wall clock: %m");
        }

        identity_done(&a->identity);
        a->identity = (Identity) {
                .id = json_object_get(e.id),
                .generation = e.generation,
                .wall_ns = e.wall_ns,
                .mono_usec = now_usec(),
                .have = true,
        };
        memcpy(a->identity.seed, e.seed, 32);
        explicit_bzero(&e.seed, sizeof e.seed);
        log_debug("Identity: generation %" PRIu64 ".", e.generation);
        return 0;
}

void identity_done(Identity *i) {
        json_object_put(i->id);
        explicit_bzero(i, sizeof *i);
}

int agent_op_identity(Agent *a, uint32_t id) {
        const Identity *i = &a->identity;
        struct json_object *o;
        char hex[65];
        int64_t wall;

        for (size_t k = 0; k < 32; k++)
                (void) snprintf(hex + 2 * k, 3, "%02x", i->seed[k]);

        if (i->have)
                /* the clock of the event, advanced by the monotonic clock: equal to
                 * CLOCK_REALTIME when the event set it, and meaningful when it did not */
                wall = i->wall_ns + (int64_t) ((now_usec() - i->mono_usec) * 1000u);
        else {
                struct timespec ts;

                (void) clock_gettime(CLOCK_REALTIME, &ts);
                wall = (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
        }

        o = json_object_new_object();
        if (!o)
                return -ENOMEM;
        json_object_object_add(o, "id", i->have ? json_object_get(i->id) : NULL);
        json_object_object_add(o, "generation", json_object_new_uint64(i->generation));
        json_object_object_add(o, "seed", json_object_new_string(hex));
        json_object_object_add(o, "wall_ns", json_object_new_int64(wall));
        return agent_send_json(a, FKA_RESPONSE, id, o);
}
