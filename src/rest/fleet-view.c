/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A front end's view of the fleet's node records (fleet-view.h). */
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fleet-node.h"
#include "fleet-view.h"
#include "io-util.h"
#include "json-util.h"
#include "macro.h"
#include "time-util.h"

#define REFUSED_MAX 64u
#define FLEET_LOST_TTL_SECS (24u * 3600u)
#define FLEET_LOST_LEASE_EVERY_USEC (3600ull * USEC_PER_SEC)

typedef struct Lost {
        char name[FLEET_NODE_NAME_MAX + 1];
        uint64_t at_unix;
} Lost;

struct FleetWatcher {
        EtcdClient *etcd;
        pthread_t thread;
        bool started;
        int stop_pipe[2];

        pthread_mutex_t lock; /* everything below */
        FleetView *view;
        bool etcd_ok;
        char error[256];
        Lost *lost;            /* a ring of the last FLEET_VIEW_LOST_MAX */
        size_t n_lost, lost_next;
        uint64_t lost_total, refused_total;
        uint64_t refused_hash[REFUSED_MAX]; /* the records refused at the last read: logged once */
        size_t n_refused;

        int64_t lost_lease; /* the watcher thread's: publish_lost() */
        uint64_t lost_lease_usec;
};

static void view_free(FleetView *v) {
        for (size_t i = 0; v && i < v->n_nodes; i++)
                fleet_record_done(&v->nodes[i]);
        if (v)
                free(v->nodes);
        free(v);
}

FleetView *fleet_view_get(FleetWatcher *w) {
        FleetView *v;

        pthread_mutex_lock(&w->lock);
        v = w->view;
        v->refs++;
        pthread_mutex_unlock(&w->lock);
        return v;
}

void fleet_view_put(FleetWatcher *w, FleetView *v) {
        bool last;

        if (!v)
                return;
        pthread_mutex_lock(&w->lock);
        last = --v->refs == 0;
        pthread_mutex_unlock(&w->lock);
        if (last)
                view_free(v);
}

static int record_cmp(const void *a, const void *b) {
        return strcmp(((const FleetRecord *) a)->name, ((const FleetRecord *) b)->name);
}

const FleetRecord *fleet_view_node(const FleetView *v, const char *name) {
        FleetRecord key;

        if (!v || strlen(name) > FLEET_NODE_NAME_MAX)
                return NULL;
        snprintf(key.name, sizeof(key.name), "%s", name);
        return bsearch(&key, v->nodes, v->n_nodes, sizeof(FleetRecord), record_cmp);
}

/* FNV-1a of a key and its value: which refused records were logged already. */
static uint64_t kv_hash(const EtcdKv *kv) {
        uint64_t h = 1469598103934665603ull;

        for (const char *p = kv->key; *p; p++)
                h = (h ^ (unsigned char) *p) * 1099511628211ull;
        for (size_t i = 0; i < kv->len; i++)
                h = (h ^ (unsigned char) kv->value[i]) * 1099511628211ull;
        return h;
}

static bool hash_was_refused(FleetWatcher *w, uint64_t h) {
        for (size_t i = 0; i < w->n_refused; i++)
                if (w->refused_hash[i] == h)
                        return true;
        return false;
}

static void lost_add(FleetWatcher *w, const char *name, uint64_t at) {
        snprintf(w->lost[w->lost_next].name, sizeof(w->lost[0].name), "%.63s", name);
        w->lost[w->lost_next].at_unix = at;
        w->lost_next = (w->lost_next + 1) % FLEET_VIEW_LOST_MAX;
        w->n_lost = MIN(w->n_lost + 1, (size_t) FLEET_VIEW_LOST_MAX);
}

/* The nodes of old that are not in new go to the lost ring (and, for the
 * caller to publish, to ret_new, at most 8 a read); the caller
 * holds the lock. */
static size_t note_lost(FleetWatcher *w, const FleetView *old, const FleetView *new, Lost *ret_new) {
        uint64_t now = now_realtime_usec() / USEC_PER_SEC;
        size_t n_new = 0;

        for (size_t i = 0; old && i < old->n_nodes; i++) {
                if (fleet_view_node(new, old->nodes[i].name))
                        continue;
                log_warning("Fleet node %s left etcd: its sandboxes are lost.", old->nodes[i].name);
                lost_add(w, old->nodes[i].name, now);
                w->lost_total++;
                if (ret_new && n_new < 8) {
                        snprintf(ret_new[n_new].name, sizeof(ret_new[0].name), "%s", old->nodes[i].name);
                        ret_new[n_new++].at_unix = now;
                }
        }
        /* a node that came back is not lost any more */
        for (size_t i = 0; i < w->n_lost; i++)
                if (fleet_view_node(new, w->lost[i].name))
                        w->lost[i].name[0] = 0;
        return n_new;
}

/* The lost nodes into etcd, FLEET_KEY_PREFIX "lost/<name>" = {"at": seconds},
 * under a lease of a day, so that a front end started later answers 410 for
 * their sandboxes too. Best effort: a front end that cannot write them still
 * knows them itself. */
static void publish_lost(FleetWatcher *w, const Lost *lost, size_t n) {
        uint64_t now = now_usec();

        if (n == 0)
                return;
        if (w->lost_lease == 0 || now - w->lost_lease_usec > FLEET_LOST_LEASE_EVERY_USEC) {
                if (etcd_lease_grant(w->etcd, FLEET_LOST_TTL_SECS, &w->lost_lease) < 0) {
                        w->lost_lease = 0;
                        return;
                }
                w->lost_lease_usec = now;
        }
        for (size_t i = 0; i < n; i++) {
                char key[256], value[64];
                bool created;

                snprintf(key, sizeof(key), FLEET_KEY_PREFIX "lost/%.63s", lost[i].name);
                snprintf(value, sizeof(value), "{\"at\":%" PRIu64 "}", lost[i].at_unix);
                (void) etcd_create(w->etcd, key, value, strlen(value), w->lost_lease, &created);
        }
}

/* At start: the nodes other front ends saw lost. */
static void read_lost(FleetWatcher *w) {
        EtcdKv *kvs = NULL;
        size_t n = 0;

        if (etcd_range_prefix(w->etcd, FLEET_KEY_PREFIX "lost/", FLEET_VIEW_LOST_MAX, &kvs, &n) < 0)
                return;
        pthread_mutex_lock(&w->lock);
        for (size_t i = 0; i < n; i++) {
                const char *name = kvs[i].key + strlen(FLEET_KEY_PREFIX "lost/");
                _cleanup_(json_object_putp) struct json_object *o = NULL;
                struct json_object *at;

                if (strncmp(kvs[i].key, FLEET_KEY_PREFIX "lost/", strlen(FLEET_KEY_PREFIX "lost/")) != 0 ||
                    !fleet_node_name_is_valid(name) || fleet_view_node(w->view, name) ||
                    json_parse_strict(kvs[i].value, kvs[i].len, 256, 2, &o, NULL) < 0 ||
                    !json_object_object_get_ex(o, "at", &at) || !json_object_is_type(at, json_type_int) ||
                    json_object_get_int64(at) <= 0)
                        continue; /* hostile or another front end's newer format: not followed */
                lost_add(w, name, (uint64_t) json_object_get_int64(at));
        }
        pthread_mutex_unlock(&w->lock);
        etcd_kvs_free(kvs, n);
}

/* One read of the records into a new view. */
static int read_once(FleetWatcher *w) {
        _cleanup_free_ FleetView *nv = NULL;
        uint64_t hashes[REFUSED_MAX], refused = 0;
        size_t n_kvs = 0, n_hashes = 0, n_lost;
        Lost lost[8];
        EtcdKv *kvs = NULL;
        FleetView *old;
        int r;

        r = etcd_range_prefix(w->etcd, FLEET_KEY_PREFIX "nodes/", FLEET_VIEW_NODES_MAX, &kvs, &n_kvs);
        if (r < 0) {
                pthread_mutex_lock(&w->lock);
                if (w->etcd_ok)
                        log_warning("Cannot read the fleet's records from etcd: %s",
                                    r == -E2BIG ? "more than 1024 nodes" : etcd_client_error(w->etcd));
                w->etcd_ok = false;
                snprintf(w->error, sizeof(w->error), "%s",
                         r == -E2BIG ? "more than 1024 node records" : etcd_client_error(w->etcd));
                pthread_mutex_unlock(&w->lock);
                return r;
        }
        nv = calloc(1, sizeof(*nv));
        if (nv)
                nv->nodes = calloc(MAX(n_kvs, 1u), sizeof(FleetRecord));
        if (!nv || !nv->nodes) {
                etcd_kvs_free(kvs, n_kvs);
                if (nv)
                        free(nv->nodes);
                return -ENOMEM;
        }
        for (size_t i = 0; i < n_kvs; i++) {
                const char *why = NULL;
                uint64_t h;

                if (fleet_record_parse(kvs[i].key, kvs[i].value, kvs[i].len, &nv->nodes[nv->n_nodes], &why) >= 0) {
                        nv->n_nodes++;
                        continue;
                }
                h = kv_hash(&kvs[i]);
                if (!hash_was_refused(w, h)) {
                        log_warning("Ignoring the fleet record %.100s: %s.", kvs[i].key, why);
                        refused++;
                }
                if (n_hashes < REFUSED_MAX)
                        hashes[n_hashes++] = h;
        }
        etcd_kvs_free(kvs, n_kvs);
        qsort(nv->nodes, nv->n_nodes, sizeof(FleetRecord), record_cmp);
        nv->read_usec = now_usec();
        nv->refs = 1;

        pthread_mutex_lock(&w->lock);
        memcpy(w->refused_hash, hashes, n_hashes * sizeof(uint64_t));
        w->refused_total += refused;
        w->n_refused = n_hashes;
        if (!w->etcd_ok)
                log_info("Reading the fleet's records from etcd: %zu node(s).", nv->n_nodes);
        w->etcd_ok = true;
        w->error[0] = 0;
        old = w->view;
        n_lost = note_lost(w, old, nv, lost);
        w->view = TAKE_PTR(nv);
        pthread_mutex_unlock(&w->lock);
        fleet_view_put(w, old);
        publish_lost(w, lost, n_lost);
        return 0;
}

static void *watch_thread(void *userdata) {
        FleetWatcher *w = userdata;
        struct pollfd p = { .fd = w->stop_pipe[0], .events = POLLIN };

        for (;;) {
                if (poll(&p, 1, FLEET_VIEW_PERIOD_MS) != 0)
                        break; /* the stop pipe, or an error: stop either way */
                (void) read_once(w);
        }
        return NULL;
}

int fleet_watcher_start(const char *etcd, const EtcdOptions *opts, FleetWatcher **ret) {
        FleetWatcher *w;
        int r;

        w = calloc(1, sizeof(*w));
        if (!w)
                return -ENOMEM;
        w->stop_pipe[0] = w->stop_pipe[1] = -1;
        pthread_mutex_init(&w->lock, NULL);
        w->lost = calloc(FLEET_VIEW_LOST_MAX, sizeof(Lost));
        w->view = calloc(1, sizeof(FleetView));
        if (!w->lost || !w->view) {
                fleet_watcher_stop(w);
                return -ENOMEM;
        }
        w->view->refs = 1;
        w->etcd_ok = true; /* so that a first failure is logged */
        r = etcd_client_new(etcd, opts, &w->etcd);
        if (r >= 0 && pipe2(w->stop_pipe, O_CLOEXEC) < 0)
                r = -errno;
        if (r < 0) {
                fleet_watcher_stop(w);
                return r;
        }
        (void) read_once(w);
        read_lost(w);
        r = -pthread_create(&w->thread, NULL, watch_thread, w);
        if (r < 0) {
                fleet_watcher_stop(w);
                return r;
        }
        w->started = true;
        *ret = w;
        return 0;
}

FleetWatcher *fleet_watcher_stop(FleetWatcher *w) {
        if (!w)
                return NULL;
        if (w->started) {
                (void) write(w->stop_pipe[1], "x", 1);
                pthread_join(w->thread, NULL);
        }
        safe_close(w->stop_pipe[0]);
        safe_close(w->stop_pipe[1]);
        etcd_client_free(w->etcd);
        if (w->view)
                fleet_view_put(w, w->view);
        free(w->lost);
        pthread_mutex_destroy(&w->lock);
        free(w);
        return NULL;
}

bool fleet_watcher_etcd_ok(FleetWatcher *w, uint64_t *ret_age_usec, char *ret_error, size_t error_size) {
        bool ok;

        pthread_mutex_lock(&w->lock);
        ok = w->etcd_ok;
        if (ret_age_usec)
                *ret_age_usec = w->view->read_usec ? now_usec() - w->view->read_usec : UINT64_MAX;
        if (ret_error)
                snprintf(ret_error, error_size, "%s", w->error);
        pthread_mutex_unlock(&w->lock);
        return ok;
}

uint64_t fleet_watcher_lost_at(FleetWatcher *w, const char *name) {
        uint64_t at = 0;

        pthread_mutex_lock(&w->lock);
        for (size_t i = 0; i < w->n_lost; i++)
                if (streq(w->lost[i].name, name))
                        at = MAX(at, w->lost[i].at_unix);
        pthread_mutex_unlock(&w->lock);
        return at;
}

void fleet_watcher_counts(FleetWatcher *w, uint64_t *ret_lost, uint64_t *ret_refused) {
        pthread_mutex_lock(&w->lock);
        *ret_lost = w->lost_total;
        *ret_refused = w->refused_total;
        pthread_mutex_unlock(&w->lock);
}
