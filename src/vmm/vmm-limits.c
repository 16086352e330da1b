/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * disk_rate and net_rate in a running VMM. See vmm-limits.h.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "run.h"
#include "vmm-limits.h"
#include "ratelimit.h"
#include "time-util.h"
#include "virtio-mmio.h"
#include "virtio-net.h"

struct vmm_limits {
        struct rate_limit disk_limit, net_limit;
        struct rate_limiter disk, net_tx, net_rx;
        bool disk_waits, net_tx_waits, net_rx_waits;
        uint64_t due_usec;   /* when the first waiting queue may go on; 0: none waits */
        timer_t timer;
        pid_t timer_pid;     /* the process the timer belongs to (timers are not inherited by fork) */
};

int vmm_limits_set(struct vmm *vmm, const struct rate_limit *disk, const struct rate_limit *net) {
        struct vmm_limits *l = vmm->limits;
        uint64_t now = now_usec();

        if (!l) {
                if ((!disk || !rate_limit_is_set(disk)) && (!net || !rate_limit_is_set(net)))
                        return 0;
                l = calloc(1, sizeof(*l));
                if (!l)
                        return -ENOMEM;
                vmm->limits = l;
        }
        if (disk) {
                l->disk_limit = *disk;
                rate_limiter_configure(&l->disk, disk, now);
        }
        if (net) {
                l->net_limit = *net;
                rate_limiter_configure(&l->net_tx, net, now);
                rate_limiter_configure(&l->net_rx, net, now);
        }
        /* Whatever waited may go on under the new figures. */
        if (l->disk_waits || l->net_tx_waits || l->net_rx_waits)
                l->due_usec = now;
        return 0;
}

int vmm_limits_parse_json(struct json_object *req, struct rate_limit *ret_disk, bool *ret_has_disk,
                          struct rate_limit *ret_net, bool *ret_has_net, char err[static FORK_OPTION_ERROR_MAX]) {
        struct json_object *o;
        int r;

        *ret_has_disk = *ret_has_net = false;
        if (json_object_object_get_ex(req, "disk_rate", &o) && !json_object_is_type(o, json_type_null)) {
                r = rate_limit_from_json(o, "disk_rate", ret_disk, err);
                if (r < 0)
                        return r;
                *ret_has_disk = true;
        }
        if (json_object_object_get_ex(req, "net_rate", &o) && !json_object_is_type(o, json_type_null)) {
                r = rate_limit_from_json(o, "net_rate", ret_net, err);
                if (r < 0)
                        return r;
                *ret_has_net = true;
        }
        return 0;
}

int vmm_limits_set_json(struct vmm *vmm, struct json_object *req, struct json_object *reply,
                        char err[static FORK_OPTION_ERROR_MAX]) {
        struct rate_limit disk, net;
        bool has_disk, has_net;
        int r;

        r = vmm_limits_parse_json(req, &disk, &has_disk, &net, &has_net, err);
        if (r < 0)
                return r;
        r = vmm_limits_set(vmm, has_disk ? &disk : NULL, has_net ? &net : NULL);
        if (r < 0) {
                snprintf(err, FORK_OPTION_ERROR_MAX, "set_limits failed: %s", strerror(-r));
                return r;
        }
        vmm_limits_get(vmm, &disk, &net);
        if (rate_limit_is_set(&disk))
                json_object_object_add(reply, "disk_rate", rate_limit_to_json(&disk));
        if (rate_limit_is_set(&net))
                json_object_object_add(reply, "net_rate", rate_limit_to_json(&net));
        return 0;
}

void vmm_limits_get(struct vmm *vmm, struct rate_limit *ret_disk, struct rate_limit *ret_net) {
        *ret_disk = vmm->limits ? vmm->limits->disk_limit : (struct rate_limit) {};
        *ret_net = vmm->limits ? vmm->limits->net_limit : (struct rate_limit) {};
}

static void arm_timer(struct vmm_limits *l, uint64_t due) {
        struct itimerspec its = {
                .it_value = { .tv_sec = (time_t) (due / USEC_PER_SEC),
                              .tv_nsec = (long) (due % USEC_PER_SEC * NSEC_PER_USEC) },
        };

        if (l->timer_pid != getpid()) {
                struct sigevent sev = { .sigev_notify = SIGEV_THREAD_ID, .sigev_signo = SIGIO };

                sev._sigev_un._tid = vmm_event_tid(); /* not an AP's: it must run the queues */
                if (timer_create(CLOCK_MONOTONIC, &sev, &l->timer) < 0) {
                        log_debug_errno(errno, "Failed to create the rate limit timer, polling instead: %m");
                        return;
                }
                l->timer_pid = getpid();
        }
        if (timer_settime(l->timer, TIMER_ABSTIME, &its, NULL) < 0)
                log_debug_errno(errno, "Failed to arm the rate limit timer: %m");
}

/* A request waits wait_usec: make sure the queues are re-run by then. */
static void defer(struct vmm_limits *l, uint64_t now, uint64_t wait_usec) {
        uint64_t due = now + wait_usec;

        if (l->due_usec != 0 && l->due_usec <= due)
                return;
        l->due_usec = due;
        arm_timer(l, due);
}

/* bytes: UINT64_MAX to only admit (rate_limiter_admit()). */
static bool take(struct vmm_limits *l, struct rate_limiter *rl, bool *waits, uint64_t bytes, uint64_t *throttled) {
        uint64_t now, wait, waited;

        if (!rate_limiter_active(rl))
                return true;
        now = now_usec();
        wait = bytes == UINT64_MAX ? rate_limiter_admit(rl, now, &waited) : rate_limiter_consume(rl, bytes, now, &waited);
        if (waited > 0)
                vmm_stats_add(throttled, waited);
        *waits = wait > 0;
        if (wait > 0)
                defer(l, now, wait);
        return wait == 0;
}

bool vmm_limits_disk_take(struct vmm *vmm, uint64_t bytes) {
        struct vmm_limits *l = vmm->limits;

        return !l || take(l, &l->disk, &l->disk_waits, bytes, &vmm->stats->disk_throttled_usec);
}

bool vmm_limits_net_tx_take(struct vmm *vmm, uint64_t bytes) {
        struct vmm_limits *l = vmm->limits;

        return !l || take(l, &l->net_tx, &l->net_tx_waits, bytes, &vmm->stats->net_throttled_usec);
}

bool vmm_limits_net_rx_take(struct vmm *vmm) {
        struct vmm_limits *l = vmm->limits;

        return !l || take(l, &l->net_rx, &l->net_rx_waits, UINT64_MAX, &vmm->stats->net_throttled_usec);
}

void vmm_limits_net_rx_charge(struct vmm *vmm, uint64_t bytes) {
        if (vmm->limits)
                rate_limiter_charge(&vmm->limits->net_rx, bytes);
}

bool vmm_limits_net_rx_waiting(struct vmm *vmm) {
        return vmm->limits && vmm->limits->net_rx_waits;
}

void vmm_limits_service(struct vmm *vmm) {
        struct vmm_limits *l = vmm->limits;
        bool disk, net;

        if (!l || l->due_usec == 0 || now_usec() < l->due_usec)
                return;
        l->due_usec = 0;
        disk = l->disk_waits;
        net = l->net_tx_waits || l->net_rx_waits;
        l->disk_waits = l->net_tx_waits = l->net_rx_waits = false;
        /* A queue that still finds no tokens waits again (and re-arms). */
        if (disk) {
                virtio_mmio_kick(vmm, vmm->blk);
                for (unsigned i = 0; i < vmm->n_volumes; i++)
                        virtio_mmio_kick(vmm, vmm->volumes[i]);
        }
        if (net && vmm->net)
                virtio_mmio_kick(vmm, vmm->net);
}

void vmm_limits_free(struct vmm *vmm) {
        struct vmm_limits *l = vmm->limits;

        if (!l)
                return;
        if (l->timer_pid == getpid())
                (void) timer_delete(l->timer);
        free(l);
        vmm->limits = NULL;
}
