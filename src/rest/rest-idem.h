/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Idempotency-Key for the requests of forkd-rest that create something
 * (docs/rest-api.md, "Idempotency-Key"; forkd-rest(8)). The store only: no
 * HTTP, no D-Bus; rest-idem-glue.c decides which request gets which answer.
 *
 * One record per (caller, key): a file in the state directory named by the
 * hex SHA-256 of the caller's scope (a hash of the bearer token) and the key,
 * written atomically (temporary file, fsync, rename, fsync of the directory).
 * Its text header, then the body:
 *
 *   forkd-rest-idempotency 1
 *   request <64 hex: SHA-256 of method, path, query and body>
 *   created <CLOCK_REALTIME seconds>
 *   state pending                       the first request is being answered
 *
 * or, once answered, "state answered", "status N", "content-type T" (may be
 * empty) and "body LEN" followed by exactly LEN bytes; or "state unkept",
 * "status N" and "size LEN" for an answer larger than forkd-rest keeps.
 * One forkd-rest per state directory: the requests in flight are known only
 * in memory, so a pending record without one is a request whose outcome is
 * unknown (forkd-rest died while forkd worked on it).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "sha256.h"

#define REST_IDEM_KEY_MAX 255u
#define REST_IDEM_TTL_SECS (24u * 3600u)
#define REST_IDEM_SWEEP_SECS 3600u
/* Answers with a larger body are not kept (their status is: "unkept"). */
#define REST_IDEM_BODY_MAX (1024u * 1024u)
/* Records at once; a new key beyond it is refused (503) until some expire. */
#define REST_IDEM_RECORDS_MAX 4096u
/* Bytes of all records at once; an answer that would pass it is kept unkept. */
#define REST_IDEM_BYTES_MAX (64u * 1024u * 1024u)
#define REST_IDEM_CONTENT_TYPE_MAX 127u
/* The header of a record is never longer than this. */
#define REST_IDEM_HEADER_MAX 512u
#define REST_IDEM_FILE_MAX (REST_IDEM_HEADER_MAX + REST_IDEM_BODY_MAX)

typedef enum RestIdemState {
        REST_IDEM_PENDING,
        REST_IDEM_ANSWERED,
        REST_IDEM_UNKEPT,
} RestIdemState;

typedef struct RestIdemRecord {
        uint8_t request[SHA256_DIGEST_SIZE];
        uint64_t created;
        RestIdemState state;
        unsigned status;                                  /* ANSWERED, UNKEPT */
        char content_type[REST_IDEM_CONTENT_TYPE_MAX + 1]; /* ANSWERED; "" for none */
        const char *body;                                 /* ANSWERED: in the parsed buffer */
        size_t body_len;                                  /* ANSWERED: of body; UNKEPT: the answer's */
} RestIdemRecord;

/* Parse a record file (hostile: any bytes). With header_only, stop after
 * "created" (the expiry sweep reads no more). -EBADMSG for anything but a
 * whole, well-formed record; *ret untouched then. */
int rest_idem_record_parse(const char *buf, size_t len, bool header_only, RestIdemRecord *ret);
/* The file of rec (body and body_len for ANSWERED). */
int rest_idem_record_format(const RestIdemRecord *rec, char **ret, size_t *ret_len);

/* POST on /v1/snapshots, /v1/snapshots/unpack, /v1/snapshots/:tag/compact,
 * /v1/sandboxes and /v1/sandboxes/:id/{branch,fork,pause,resume}. */
bool rest_idem_applies(const char *method, const char *path);
/* 1..REST_IDEM_KEY_MAX characters, each printable ASCII (0x20..0x7e). */
bool rest_idem_key_is_valid(const char *key);
/* Feed one field of the request into its hash: its length, then its bytes. */
void rest_idem_hash_field(sha256_ctx *c, const void *p, size_t n);

typedef struct RestIdem RestIdem;
typedef struct RestIdemEntry RestIdemEntry;

/* A key whose first request is being answered, in this process. */
struct RestIdemEntry {
        char name[SHA256_HEX_SIZE];
        uint8_t request[SHA256_DIGEST_SIZE];
        uint64_t created;
        size_t file_size;       /* of its pending record */
        void *waiters;          /* the caller's: requests that wait for the answer */
        RestIdemEntry *prev, *next;
};

/* dir: the state directory. With create it is made (mode 0700; its parent
 * must exist) and opened now, and failure is returned; without, it is
 * opened if it exists, else made at first use. token (NULL: none) scopes the
 * records. event (may be NULL) runs the sweep every REST_IDEM_SWEEP_SECS. */
int rest_idem_new(sd_event *event, const char *dir, bool create, const char *token, RestIdem **ret);
RestIdem *rest_idem_free(RestIdem *s);
static inline void rest_idem_freep(RestIdem **s) {
        rest_idem_free(*s);
}
/* Tests: smaller bounds. */
void rest_idem_set_limits(RestIdem *s, unsigned records_max, size_t bytes_max);

typedef enum RestIdemLookup {
        REST_IDEM_LOOKUP_NEW,          /* claimed, its record pending on disk: *ret_entry is the caller's */
        REST_IDEM_LOOKUP_WAIT,         /* the first request is in flight: *ret_entry is its entry */
        REST_IDEM_LOOKUP_REPLAY,       /* answered: *ret_record, its body in *ret_buf (the caller frees it) */
        REST_IDEM_LOOKUP_UNKEPT, /* answered too large to keep: *ret_record */
        REST_IDEM_LOOKUP_INTERRUPTED,  /* pending, but no request in flight: the outcome is unknown */
        REST_IDEM_LOOKUP_DAMAGED,      /* the record cannot be read: the outcome is unknown */
        REST_IDEM_LOOKUP_MISMATCH,     /* the key was used with another request */
} RestIdemLookup;

/* Look the key up for a request of hash request; claim it if it is new (or
 * its record expired). Returns a RestIdemLookup, or -ENOBUFS when
 * REST_IDEM_RECORDS_MAX records exist, or another negative errno when the
 * record cannot be written (nothing claimed then). */
int rest_idem_begin(RestIdem *s, const char *key, const uint8_t request[SHA256_DIGEST_SIZE],
                    RestIdemEntry **ret_entry, RestIdemRecord *ret_record, char **ret_buf);
/* The claimed request's answer: kept, or as unkept when body is NULL or too
 * large. Frees e; its waiters are the caller's to answer. */
int rest_idem_finish(RestIdem *s, RestIdemEntry *e, unsigned status, const char *content_type, const void *body,
                     size_t len);
/* The claimed request ended without an answer to keep: with remove, nothing
 * was done and the key is free again; else the record stays pending and a
 * retry gets REST_IDEM_LOOKUP_INTERRUPTED. Frees e. */
void rest_idem_abandon(RestIdem *s, RestIdemEntry *e, bool remove);
/* Remove expired records and leftover temporary files, count the rest. */
int rest_idem_sweep(RestIdem *s);
unsigned rest_idem_records(RestIdem *s);
