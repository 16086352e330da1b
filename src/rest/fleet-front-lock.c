/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* At most one fetch of a chain into a node at a time across the fleet's front
 * ends: the key FLEET_KEY_PREFIX "fetch/<node>/<tag>", created only when
 * absent, under a short lease that a thread of the fetch's own keeps alive
 * while the fetch runs. A front end that dies mid-fetch leaves the key for
 * FETCH_LOCK_TTL_SECS at most. Within a front end the (node, tag) slot of
 * fleet-front-place.c comes first, so only one of its threads waits here. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fleet-front-internal.h"
#include "macro.h"
#include "time-util.h"

#define FETCH_LOCK_TTL_SECS 6u
#define FETCH_LOCK_POLL_USEC (100ull * USEC_PER_MSEC)

struct FrontLock {
        EtcdClient *etcd;  /* the request thread's, until the keeper starts */
        EtcdClient *keep;  /* the keeper's */
        int64_t lease;
        pthread_t keeper;
        bool keeper_started, stop;
        pthread_mutex_t lock;
        pthread_cond_t changed;
};

static void *keeper_thread(void *userdata) {
        FrontLock *l = userdata;
        struct timespec ts;

        pthread_mutex_lock(&l->lock);
        while (!l->stop) {
                int64_t ttl;

                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += FETCH_LOCK_TTL_SECS / 3;
                if (pthread_cond_timedwait(&l->changed, &l->lock, &ts) == 0 || l->stop)
                        continue;
                pthread_mutex_unlock(&l->lock);
                (void) etcd_lease_keepalive(l->keep, l->lease, &ttl);
                pthread_mutex_lock(&l->lock);
        }
        pthread_mutex_unlock(&l->lock);
        return NULL;
}

void front_lock_release(FrontLock *l) {
        if (!l)
                return;
        if (l->keeper_started) {
                pthread_mutex_lock(&l->lock);
                l->stop = true;
                pthread_cond_broadcast(&l->changed);
                pthread_mutex_unlock(&l->lock);
                pthread_join(l->keeper, NULL);
        }
        if (l->lease != 0)
                (void) etcd_lease_revoke(l->etcd, l->lease); /* the key goes with it */
        etcd_client_free(l->etcd);
        etcd_client_free(l->keep);
        pthread_cond_destroy(&l->changed);
        pthread_mutex_destroy(&l->lock);
        free(l);
}

int front_lock_fetch(FrontRequest *r, const char *node, const char *tag, bool (*done)(FrontRequest *r, void *data),
                     void *data, FrontLock **ret) {
        FleetFront *f = r->front;
        uint64_t start = now_usec();
        char key[256];
        FrontLock *l;
        int k;

        *ret = NULL;
        l = calloc(1, sizeof(*l));
        if (!l)
                return -ENOMEM;
        pthread_mutex_init(&l->lock, NULL);
        pthread_cond_init(&l->changed, NULL);
        snprintf(key, sizeof(key), FLEET_KEY_PREFIX "fetch/%s/%s", node, tag);
        k = etcd_client_new(f->cfg.etcd, &f->cfg.etcd_opts, &l->etcd);
        if (k >= 0)
                k = etcd_client_new(f->cfg.etcd, &f->cfg.etcd_opts, &l->keep);
        if (k >= 0)
                k = etcd_lease_grant(l->etcd, FETCH_LOCK_TTL_SECS, &l->lease);
        for (bool created = false; k >= 0 && !created;) {
                k = etcd_create(l->etcd, key, "{}", 2, l->lease, &created);
                if (k < 0 || created)
                        break;
                /* another front end fetches it: wait for its key to go, or the chain to be there */
                if (done(r, data)) {
                        front_lock_release(l);
                        return 0;
                }
                if (now_usec() - start > 3600ull * USEC_PER_SEC) {
                        k = -ETIMEDOUT;
                        break;
                }
                usleep(FETCH_LOCK_POLL_USEC);
        }
        if (k < 0) {
                /* no etcd: this front end's own slot is all there is */
                log_warning("Cannot take the fetch lock %s in etcd (%s); fetching without it.", key,
                            l->etcd ? etcd_client_error(l->etcd) : strerror(-k));
                front_lock_release(l);
                return 0;
        }
        k = -pthread_create(&l->keeper, NULL, keeper_thread, l);
        if (k < 0) {
                front_lock_release(l);
                return k;
        }
        l->keeper_started = true;
        *ret = l;
        return 1;
}
