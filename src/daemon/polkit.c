/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Asynchronous polkit authorization for D-Bus method handlers; see polkit.h
 * for the contract. Written for forkd; the mechanism (ask polkit
 * asynchronously, then re-dispatch the request message) is the one systemd
 * documents for its bus daemons.
 */

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "polkit.h"

#define POLKIT_BUS_NAME "org.freedesktop.PolicyKit1"
#define POLKIT_PATH "/org/freedesktop/PolicyKit1/Authority"
#define POLKIT_INTERFACE "org.freedesktop.PolicyKit1.Authority"

/* polkitd answers non-interactive checks quickly; if it hangs, refuse rather than
 * keeping the caller waiting for the bus default of 25 s. */
#define POLKIT_TIMEOUT_USEC (20ULL * 1000ULL * 1000ULL)

/* A caller controls how many queries it starts; cap them. */
#define POLKIT_QUERIES_MAX 4096U

/* At most this many detail pairs are forwarded to polkit. */
#define POLKIT_DETAILS_MAX 32U

/* Callers whose uid is remembered (see struct uid_cache_entry). */
#define UID_CACHE_SIZE 16U
#define UID_CACHE_NAME_MAX 64U

struct polkit_query {
        struct polkit_query *prev, *next;
        struct polkit_registry *registry;

        sd_bus_message *request; /* the method call we re-dispatch; we hold a reference */
        sd_bus_slot *slot;       /* the pending CheckAuthorization call, NULL once answered */
        char *action;
        uid_t uid;

        bool answered;
        int result;              /* once answered: 1 authorized, or a negative errno with error set */
        sd_bus_error error;
};

/* Asking the bus daemon for a sender's uid is a synchronous round trip
 * through it on every call. A unique connection name (":1.42") is never
 * reused by a bus instance (D-Bus specification, "Unique Connection Names")
 * and a connection's uid is fixed when it authenticates, so (bus instance,
 * unique name) -> uid stays true for as long as that bus runs. The bus
 * instance is its id (a new daemon has a new one), and only what the bus
 * daemon itself said is stored: never for direct connections. */
struct uid_cache_entry {
        sd_id128_t bus_id;
        char name[UID_CACHE_NAME_MAX];
        uid_t uid;
        bool used;
};

struct polkit_registry {
        struct polkit_query *queries;
        unsigned n_queries;
        uid_t bridge_uid; /* trusted on direct connections; OWNER_UID_INVALID: none */
        struct uid_cache_entry uids[UID_CACHE_SIZE];
        unsigned uid_next; /* the slot to replace next */
};

static struct polkit_query *polkit_query_free(struct polkit_query *q) {
        if (!q)
                return NULL;

        if (q->registry) {
                if (q->prev)
                        q->prev->next = q->next;
                else
                        q->registry->queries = q->next;
                if (q->next)
                        q->next->prev = q->prev;
                q->registry->n_queries--;
        }

        sd_bus_slot_unref(q->slot);
        sd_bus_message_unref(q->request);
        sd_bus_error_free(&q->error);
        free(q->action);
        free(q);
        return NULL;
}

struct polkit_registry *polkit_registry_free(struct polkit_registry *registry) {
        if (!registry)
                return NULL;

        while (registry->queries)
                polkit_query_free(registry->queries);

        free(registry);
        return NULL;
}

static int polkit_registry_ensure(struct polkit_registry **registry) {
        if (*registry)
                return 0;
        *registry = calloc(1, sizeof(struct polkit_registry));
        if (!*registry)
                return -ENOMEM;
        (*registry)->bridge_uid = OWNER_UID_INVALID;
        return 0;
}

int polkit_registry_trust_bridge(struct polkit_registry **registry, uid_t uid) {
        int r;

        if (!registry || uid == 0 || uid == OWNER_UID_INVALID)
                return -EINVAL;
        r = polkit_registry_ensure(registry);
        if (r < 0)
                return r;
        (*registry)->bridge_uid = uid;
        return 0;
}

unsigned polkit_registry_size(const struct polkit_registry *registry) {
        return registry ? registry->n_queries : 0;
}

static struct polkit_query *polkit_registry_find(struct polkit_registry *registry,
                                                 sd_bus_message *m, const char *action) {
        if (!registry)
                return NULL;

        for (struct polkit_query *q = registry->queries; q; q = q->next)
                if (q->request == m && strcmp(q->action, action) == 0)
                        return q;

        return NULL;
}

static bool error_means_no_polkit(const sd_bus_error *e) {
        return sd_bus_error_has_names(e,
                                      SD_BUS_ERROR_SERVICE_UNKNOWN,
                                      SD_BUS_ERROR_NAME_HAS_NO_OWNER,
                                      SD_BUS_ERROR_NO_REPLY,
                                      SD_BUS_ERROR_TIMEOUT,
                                      SD_BUS_ERROR_DISCONNECTED);
}

/* Turns polkit's reply (or the failure to get one) into q->result and q->error. Every
 * path that is not an explicit "yes" ends in AccessDenied: fail closed. */
static void polkit_query_store_answer(struct polkit_query *q, sd_bus_message *reply) {
        const sd_bus_error *e;
        int authorized = 0, challenge = 0, r;

        q->answered = true;

        e = sd_bus_message_get_error(reply);
        if (e) {
                if (error_means_no_polkit(e))
                        sd_bus_error_setf(&q->error, SD_BUS_ERROR_ACCESS_DENIED,
                                          "Access denied: cannot check polkit action '%s' for uid %u "
                                          "because polkit (" POLKIT_BUS_NAME ") is not available on the bus; "
                                          "only root is allowed without it",
                                          q->action, (unsigned) q->uid);
                else
                        sd_bus_error_setf(&q->error, SD_BUS_ERROR_ACCESS_DENIED,
                                          "Access denied: polkit check of action '%s' for uid %u failed: %s: %s",
                                          q->action, (unsigned) q->uid, e->name, e->message ?: "no message");
                q->result = -EACCES;
                return;
        }

        r = sd_bus_message_enter_container(reply, 'r', "bba{ss}");
        if (r > 0)
                r = sd_bus_message_read(reply, "bb", &authorized, &challenge);
        if (r <= 0) {
                sd_bus_error_setf(&q->error, SD_BUS_ERROR_ACCESS_DENIED,
                                  "Access denied: polkit sent an unexpected reply for action '%s'",
                                  q->action);
                q->result = -EACCES;
                return;
        }

        if (authorized) {
                q->result = 1;
                return;
        }

        if (challenge)
                sd_bus_error_setf(&q->error, SD_BUS_ERROR_ACCESS_DENIED,
                                  "Access denied: polkit action '%s' requires interactive authentication "
                                  "for uid %u, which is not possible over this interface",
                                  q->action, (unsigned) q->uid);
        else
                sd_bus_error_setf(&q->error, SD_BUS_ERROR_ACCESS_DENIED,
                                  "Access denied: polkit does not allow uid %u to perform action '%s'",
                                  (unsigned) q->uid, q->action);
        q->result = -EACCES;
}

static int polkit_query_reply(sd_bus_message *reply, void *userdata, sd_bus_error *ret_error) {
        struct polkit_query *q = userdata;
        int r;

        q->slot = sd_bus_slot_unref(q->slot);
        polkit_query_store_answer(q, reply);

        /* Run the original handler again; it finds the answer in the registry. */
        r = sd_bus_enqueue_for_read(sd_bus_message_get_bus(q->request), q->request);
        if (r < 0) {
                /* Cannot re-dispatch: answer the caller here and forget the query. */
                if (q->result > 0)
                        (void) sd_bus_reply_method_errorf(q->request, SD_BUS_ERROR_FAILED,
                                                          "Authorized, but re-dispatching the request failed: %s",
                                                          strerror(-r));
                else
                        (void) sd_bus_reply_method_error(q->request, &q->error);
                polkit_query_free(q);
        }

        return 0;
}

/* The effective uid of m's sender as the bus daemon knows it, or with peer, of the
 * other end of m's connection as the kernel saw it connect (SO_PEERCRED). */
static int creds_euid(sd_bus_message *m, bool peer, uid_t *ret) {
        sd_bus_creds *creds = NULL;
        uid_t uid;
        int r;

        r = peer ? sd_bus_get_owner_creds(sd_bus_message_get_bus(m), SD_BUS_CREDS_EUID, &creds)
                 : sd_bus_query_sender_creds(m, SD_BUS_CREDS_EUID, &creds);
        if (r < 0)
                return r;

        r = sd_bus_creds_get_euid(creds, &uid);
        sd_bus_creds_unref(creds);
        if (r < 0)
                return r;

        *ret = uid;
        return 0;
}

/* The sender's effective uid, from the cache when this bus daemon told us
 * before. The cache is used only for messages that came through a bus
 * daemon (the sender field is then set by the daemon, not by the peer). */
static int sender_euid(sd_bus_message *m, struct polkit_registry *registry, uid_t *ret) {
        sd_bus *bus = sd_bus_message_get_bus(m);
        const char *sender = sd_bus_message_get_sender(m);
        struct uid_cache_entry *e;
        sd_id128_t bus_id;
        uid_t uid;
        int r;

        /* A direct connection: a sender field there is whatever the peer wrote, so
         * only the socket's peer counts. */
        if (sd_bus_is_bus_client(bus) <= 0)
                return creds_euid(m, true, ret);
        if (!registry || !sender || sender[0] != ':' || strlen(sender) >= UID_CACHE_NAME_MAX ||
            sd_bus_get_bus_id(bus, &bus_id) < 0)
                return creds_euid(m, false, ret);

        for (unsigned i = 0; i < UID_CACHE_SIZE; i++) {
                e = &registry->uids[i];
                if (e->used && sd_id128_equal(e->bus_id, bus_id) && strcmp(e->name, sender) == 0) {
                        *ret = e->uid;
                        return 0;
                }
        }

        r = creds_euid(m, false, &uid);
        if (r < 0)
                return r;

        e = &registry->uids[registry->uid_next];
        registry->uid_next = (registry->uid_next + 1) % UID_CACHE_SIZE;
        *e = (struct uid_cache_entry) { .bus_id = bus_id, .uid = uid, .used = true };
        strcpy(e->name, sender); /* length checked above */

        *ret = uid;
        return 0;
}

static int polkit_query_start(struct polkit_query *q, sd_bus_message *m, const char *sender,
                              const char **details) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *call = NULL;
        sd_bus *bus = sd_bus_message_get_bus(m);
        int r;

        r = sd_bus_message_new_method_call(bus, &call, POLKIT_BUS_NAME, POLKIT_PATH, POLKIT_INTERFACE,
                                           "CheckAuthorization");
        if (r < 0)
                return r;

        r = sd_bus_message_append(call, "(sa{sv})s", "system-bus-name", 1, "name", "s", sender, q->action);
        if (r < 0)
                return r;

        r = sd_bus_message_open_container(call, 'a', "{ss}");
        if (r < 0)
                return r;
        for (const char **d = details; d && *d; d += 2) {
                r = sd_bus_message_append(call, "{ss}", d[0], d[1]);
                if (r < 0)
                        return r;
        }
        r = sd_bus_message_close_container(call);
        if (r < 0)
                return r;

        /* flags 0: no interactive authentication; empty cancellation id */
        r = sd_bus_message_append(call, "us", 0, "");
        if (r < 0)
                return r;

        return sd_bus_call_async(bus, &q->slot, call, polkit_query_reply, q, POLKIT_TIMEOUT_USEC);
}

static int check_details(const char **details) {
        size_t n = 0;

        for (const char **d = details; d && *d; d += 2, n++) {
                if (!d[1])
                        return -EINVAL; /* a key without a value */
                if (n >= POLKIT_DETAILS_MAX)
                        return -E2BIG;
        }
        return 0;
}

int bus_verify_polkit_async(sd_bus_message *m, const char *action, const char **details,
                            struct polkit_registry **registry, sd_bus_error *error) {
        struct polkit_query *q;
        const char *sender;
        uid_t uid;
        int r;

        if (!m || !action || !registry)
                return -EINVAL;
        r = check_details(details);
        if (r < 0)
                return r;

        /* Second (or later) run for this message: hand out the stored answer, once. */
        q = polkit_registry_find(*registry, m, action);
        if (q) {
                if (!q->answered)
                        return 0; /* still waiting; should not happen, but never answer twice */

                r = q->result;
                if (r < 0)
                        sd_bus_error_move(error, &q->error);
                polkit_query_free(q);
                return r;
        }

        r = polkit_registry_ensure(registry);
        if (r < 0)
                return r;

        r = sender_euid(m, *registry, &uid);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r,
                                               "Cannot determine the caller's credentials to check '%s': %s",
                                               action, strerror(-r));
        if (uid == 0)
                return 1;

        sender = sd_bus_message_get_sender(m);
        if (sd_bus_is_bus_client(sd_bus_message_get_bus(m)) <= 0) {
                /* A direct (peer-to-peer) connection: there is no bus to ask polkit on. uid
                 * is the socket's peer (sender_euid()). The bridge is trusted with what the
                 * shipped rules give it on the bus: everything but acting on others' work. */
                if (uid == (*registry)->bridge_uid && strcmp(action, POLKIT_ACTION_MANAGE_ALL) != 0)
                        return 1;
                return sd_bus_error_setf(error, SD_BUS_ERROR_ACCESS_DENIED,
                                         "Access denied: uid %u is not root and polkit cannot be asked "
                                         "on a direct connection (action '%s')",
                                         (unsigned) uid, action);
        }
        if (!sender)
                return sd_bus_error_setf(error, SD_BUS_ERROR_ACCESS_DENIED,
                                         "Access denied: a message without a sender (action '%s')", action);
        if ((*registry)->n_queries >= POLKIT_QUERIES_MAX)
                return sd_bus_error_setf(error, SD_BUS_ERROR_LIMITS_EXCEEDED,
                                         "Too many authorization requests in flight; retry later");

        q = calloc(1, sizeof(*q));
        if (!q)
                return -ENOMEM;
        q->error = SD_BUS_ERROR_NULL;
        q->uid = uid;
        q->action = strdup(action);
        if (!q->action) {
                free(q);
                return -ENOMEM;
        }

        r = polkit_query_start(q, m, sender, details);
        if (r < 0) {
                polkit_query_free(q);
                return sd_bus_error_set_errnof(error, r, "Failed to ask polkit about '%s': %s",
                                               action, strerror(-r));
        }

        q->request = sd_bus_message_ref(m);
        q->registry = *registry;
        q->next = (*registry)->queries;
        if (q->next)
                q->next->prev = q;
        (*registry)->queries = q;
        (*registry)->n_queries++;

        return 0;
}

int bus_message_sender_uid(sd_bus_message *m, struct polkit_registry **registry, uid_t *ret) {
        int r;

        if (!m || !registry || !ret)
                return -EINVAL;
        r = polkit_registry_ensure(registry);
        if (r < 0)
                return r;
        return sender_euid(m, *registry, ret);
}

int bus_verify_owner_async(sd_bus_message *m, uid_t owner, const char *what, const char *action,
                           const char **details, struct polkit_registry **registry, sd_bus_error *error) {
        _cleanup_(sd_bus_error_free) sd_bus_error e = SD_BUS_ERROR_NULL;
        uid_t uid;
        int r;

        if (!m || !what || !registry)
                return -EINVAL;

        r = bus_message_sender_uid(m, registry, &uid);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Cannot determine the caller's credentials: %s",
                                               strerror(-r));
        if (uid == 0)
                return 1;
        if (uid == owner && owner != OWNER_UID_INVALID)
                return action ? bus_verify_polkit_async(m, action, details, registry, error) : 1;

        r = bus_verify_polkit_async(m, POLKIT_ACTION_MANAGE_ALL, details, registry, &e);
        if (r != -EACCES) {
                if (r < 0)
                        sd_bus_error_move(error, &e);
                return r;
        }
        if (owner == OWNER_UID_INVALID)
                return sd_bus_error_setf(error, SD_BUS_ERROR_ACCESS_DENIED,
                                         "Access denied: %s belong to more than one user; uid %u needs polkit "
                                         "action '" POLKIT_ACTION_MANAGE_ALL "' to act on what others own (%s)",
                                         what, (unsigned) uid, e.message ?: "refused");
        return sd_bus_error_setf(error, SD_BUS_ERROR_ACCESS_DENIED,
                                 "Access denied: %s belongs to uid %u; uid %u needs polkit action '"
                                 POLKIT_ACTION_MANAGE_ALL "' to act on what others own (%s)",
                                 what, (unsigned) owner, (unsigned) uid, e.message ?: "refused");
}

int bus_verify_sandbox_async(sd_bus_message *m, const char *kind, const char *id, const char *snapshot, uid_t owner,
                             const char *action, const char *verb, struct polkit_registry **registry,
                             sd_bus_error *error) {
        const char *details[] = { "sandbox", id, "snapshot", snapshot, "verb", verb, NULL };
        char what[128];

        snprintf(what, sizeof(what), "%s %s", kind, id);
        return bus_verify_owner_async(m, owner, what, action, details, registry, error);
}
