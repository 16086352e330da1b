/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <dirent.h>
#include <endian.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io-util.h"
#include "macro.h"
#include "rest-idem.h"
#include "time-util.h"

#define MAGIC "forkd-rest-idempotency 1\n"
#define TMP_PREFIX ".tmp-"

struct RestIdem {
        char *dir;
        int dfd;                        /* -EBADF until the directory is there */
        uint8_t scope[SHA256_DIGEST_SIZE];
        RestIdemEntry *entries;         /* in flight */
        unsigned records, records_max;
        uint64_t bytes, bytes_max;
        sd_event_source *sweep_source;
};

static uint64_t now_secs(void) {
        struct timespec ts;

        clock_gettime(CLOCK_REALTIME, &ts);
        return ts.tv_sec > 0 ? (uint64_t) ts.tv_sec : 0;
}

static bool expired(uint64_t created, uint64_t now) {
        /* A record from the future (the clock went back) counts from now,
         * but never for more than a day ahead. */
        return now >= created + REST_IDEM_TTL_SECS || created > now + REST_IDEM_TTL_SECS;
}

/* ---------------- the record file ---------------- */

/* One line "name value\n" at *p: value is what follows "name ", up to the
 * newline, at most max bytes of 0x20..0x7e. */
static int take_line(const char **p, const char *end, const char *name, const char **ret, size_t *ret_len,
                     size_t max) {
        size_t n = strlen(name), i;
        const char *v;

        if ((size_t) (end - *p) < n + 1 || memcmp(*p, name, n) != 0 || (*p)[n] != ' ')
                return -EBADMSG;
        v = *p + n + 1;
        for (i = 0; v + i < end && v[i] != '\n'; i++)
                if (i >= max || (unsigned char) v[i] < 0x20 || (unsigned char) v[i] > 0x7e)
                        return -EBADMSG;
        if (v + i >= end)
                return -EBADMSG;
        *ret = v;
        *ret_len = i;
        *p = v + i + 1;
        return 0;
}

/* Decimal, no sign, no leading zeros, at most 19 digits. */
static int take_number(const char **p, const char *end, const char *name, uint64_t *ret) {
        const char *v;
        uint64_t x = 0;
        size_t n;
        int r;

        r = take_line(p, end, name, &v, &n, 19);
        if (r < 0)
                return r;
        if (n == 0 || (n > 1 && v[0] == '0'))
                return -EBADMSG;
        for (size_t i = 0; i < n; i++) {
                if (v[i] < '0' || v[i] > '9')
                        return -EBADMSG;
                x = x * 10 + (uint64_t) (v[i] - '0');
        }
        *ret = x;
        return 0;
}

int rest_idem_record_parse(const char *buf, size_t len, bool header_only, RestIdemRecord *ret) {
        const char *p = buf, *end = buf + len, *v;
        RestIdemRecord rec = {};
        uint64_t x;
        size_t n;
        int r;

        if (len < strlen(MAGIC) || memcmp(buf, MAGIC, strlen(MAGIC)) != 0)
                return -EBADMSG;
        p += strlen(MAGIC);

        r = take_line(&p, end, "request", &v, &n, 2 * SHA256_DIGEST_SIZE);
        if (r < 0)
                return r;
        if (n != 2 * SHA256_DIGEST_SIZE)
                return -EBADMSG;
        for (size_t i = 0; i < SHA256_DIGEST_SIZE; i++) {
                int hi = unhexchar(v[2 * i]), lo = unhexchar(v[2 * i + 1]);

                if (hi < 0 || lo < 0)
                        return -EBADMSG;
                rec.request[i] = (uint8_t) (hi << 4 | lo);
        }
        r = take_number(&p, end, "created", &rec.created);
        if (r < 0)
                return r;
        if (header_only) {
                *ret = rec;
                return 0;
        }

        r = take_line(&p, end, "state", &v, &n, 16);
        if (r < 0)
                return r;
        if (n == 7 && !memcmp(v, "pending", 7)) {
                if (p != end)
                        return -EBADMSG;
                rec.state = REST_IDEM_PENDING;
                *ret = rec;
                return 0;
        }
        if (n == 8 && !memcmp(v, "answered", 8))
                rec.state = REST_IDEM_ANSWERED;
        else if (n == 6 && !memcmp(v, "unkept", 6))
                rec.state = REST_IDEM_UNKEPT;
        else
                return -EBADMSG;

        r = take_number(&p, end, "status", &x);
        if (r < 0)
                return r;
        if (x < 100 || x > 599)
                return -EBADMSG;
        rec.status = (unsigned) x;

        if (rec.state == REST_IDEM_UNKEPT) {
                r = take_number(&p, end, "size", &x);
                if (r < 0)
                        return r;
                if (p != end || x > SIZE_MAX)
                        return -EBADMSG;
                rec.body_len = (size_t) x;
                *ret = rec;
                return 0;
        }

        r = take_line(&p, end, "content-type", &v, &n, REST_IDEM_CONTENT_TYPE_MAX);
        if (r < 0)
                return r;
        memcpy(rec.content_type, v, n);
        rec.content_type[n] = 0;
        r = take_number(&p, end, "body", &x);
        if (r < 0)
                return r;
        if (x > REST_IDEM_BODY_MAX || x != (uint64_t) (end - p))
                return -EBADMSG;
        rec.body = p;
        rec.body_len = (size_t) x;
        *ret = rec;
        return 0;
}

int rest_idem_record_format(const RestIdemRecord *rec, char **ret, size_t *ret_len) {
        char hex[SHA256_HEX_SIZE], head[REST_IDEM_HEADER_MAX];
        _cleanup_free_ char *buf = NULL;
        size_t body_len = 0;
        int n;

        sha256_hex(rec->request, hex);
        switch (rec->state) {
        case REST_IDEM_PENDING:
                n = snprintf(head, sizeof head, MAGIC "request %s\ncreated %" PRIu64 "\nstate pending\n", hex,
                             rec->created);
                break;
        case REST_IDEM_UNKEPT:
                n = snprintf(head, sizeof head, MAGIC "request %s\ncreated %" PRIu64 "\nstate unkept\nstatus %u\nsize %zu\n",
                             hex, rec->created, rec->status, rec->body_len);
                break;
        case REST_IDEM_ANSWERED:
                if (rec->body_len > REST_IDEM_BODY_MAX || strlen(rec->content_type) > REST_IDEM_CONTENT_TYPE_MAX)
                        return -EINVAL;
                for (const char *c = rec->content_type; *c; c++)
                        if ((unsigned char) *c < 0x20 || (unsigned char) *c > 0x7e)
                                return -EINVAL;
                n = snprintf(head, sizeof head,
                             MAGIC "request %s\ncreated %" PRIu64 "\nstate answered\nstatus %u\ncontent-type %s\nbody %zu\n",
                             hex, rec->created, rec->status, rec->content_type, rec->body_len);
                body_len = rec->body_len;
                break;
        default:
                return -EINVAL;
        }
        if (n < 0 || (size_t) n >= sizeof head || rec->status > 599)
                return -EINVAL;
        buf = malloc((size_t) n + body_len + 1);
        if (!buf)
                return -ENOMEM;
        memcpy(buf, head, (size_t) n);
        if (body_len)
                memcpy(buf + n, rec->body, body_len);
        buf[(size_t) n + body_len] = 0;
        *ret_len = (size_t) n + body_len;
        *ret = TAKE_PTR(buf);
        return 0;
}

/* ---------------- requests and keys ---------------- */

static const struct {
        const char *method, *path; /* '%': one non-empty segment */
} idem_routes[] = {
        { "POST", "/v1/snapshots" },
        { "POST", "/v1/snapshots/unpack" },
        { "POST", "/v1/snapshots/%/compact" },
        { "POST", "/v1/sandboxes" },
        { "POST", "/v1/sandboxes/%/branch" },
        { "POST", "/v1/sandboxes/%/fork" },
        { "POST", "/v1/sandboxes/%/pause" },
        { "POST", "/v1/sandboxes/%/resume" },
};

static bool path_match(const char *pattern, const char *path) {
        while (*pattern && *path) {
                if (*pattern == '%') {
                        size_t n = strcspn(path, "/");

                        if (n == 0)
                                return false;
                        path += n;
                        pattern++;
                        continue;
                }
                if (*pattern++ != *path++)
                        return false;
        }
        return !*pattern && !*path;
}

bool rest_idem_applies(const char *method, const char *path) {
        for (size_t i = 0; i < ELEMENTSOF(idem_routes); i++)
                if (!strcmp(method, idem_routes[i].method) && path_match(idem_routes[i].path, path))
                        return true;
        return false;
}

bool rest_idem_key_is_valid(const char *key) {
        size_t n = 0;

        for (; key[n]; n++)
                if (n >= REST_IDEM_KEY_MAX || (unsigned char) key[n] < 0x20 || (unsigned char) key[n] > 0x7e)
                        return false;
        return n > 0;
}

void rest_idem_hash_field(sha256_ctx *c, const void *p, size_t n) {
        uint64_t le = htole64((uint64_t) n);

        sha256_update(c, &le, sizeof le);
        sha256_update(c, p, n);
}

/* ---------------- the store ---------------- */

static int sweep_timer(sd_event_source *es, uint64_t usec, void *userdata) {
        RestIdem *s = userdata;
        int r;

        r = rest_idem_sweep(s);
        if (r < 0)
                log_debug_errno(r, "Idempotency records: sweep failed: %m");
        (void) sd_event_source_set_time_relative(es, REST_IDEM_SWEEP_SECS * USEC_PER_SEC);
        return sd_event_source_set_enabled(es, SD_EVENT_ONESHOT);
}

/* The directory, made and opened on first need (and swept then). */
static int dir_fd(RestIdem *s, bool create) {
        int fd, r;

        if (s->dfd >= 0)
                return s->dfd;
        if (create && mkdir(s->dir, 0700) < 0 && errno != EEXIST)
                return negative_errno();
        fd = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return negative_errno();
        s->dfd = fd;
        r = rest_idem_sweep(s);
        if (r < 0)
                log_debug_errno(r, "Idempotency records: sweep of %s failed: %m", s->dir);
        return s->dfd;
}

int rest_idem_new(sd_event *event, const char *dir, bool create, const char *token, RestIdem **ret) {
        _cleanup_(rest_idem_freep) RestIdem *s = NULL;
        static const char scope_magic[] = "forkd-rest-idempotency-scope";
        sha256_ctx c;
        int r;

        s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        s->dfd = -EBADF;
        s->records_max = REST_IDEM_RECORDS_MAX;
        s->bytes_max = REST_IDEM_BYTES_MAX;
        s->dir = strdup(dir);
        if (!s->dir)
                return -ENOMEM;

        /* The caller is whoever holds the token: its records are its own. */
        sha256_init(&c);
        rest_idem_hash_field(&c, scope_magic, strlen(scope_magic));
        if (token)
                rest_idem_hash_field(&c, token, strlen(token));
        sha256_final(&c, s->scope);
        explicit_bzero(&c, sizeof c);

        r = dir_fd(s, create);
        if (r < 0 && (create || r != -ENOENT))
                log_debug_errno(r, "Idempotency records: cannot open %s yet: %m", dir);
        if (r < 0 && create)
                return r;

        if (event) {
                r = sd_event_add_time_relative(event, &s->sweep_source, CLOCK_MONOTONIC,
                                               REST_IDEM_SWEEP_SECS * USEC_PER_SEC, USEC_PER_SEC, sweep_timer, s);
                if (r < 0)
                        return r;
        }
        *ret = TAKE_PTR(s);
        return 0;
}

RestIdem *rest_idem_free(RestIdem *s) {
        if (!s)
                return NULL;
        while (s->entries) {
                RestIdemEntry *e = s->entries;

                s->entries = e->next;
                free(e);
        }
        sd_event_source_disable_unref(s->sweep_source);
        safe_close(s->dfd);
        free(s->dir);
        free(s);
        return NULL;
}

void rest_idem_set_limits(RestIdem *s, unsigned records_max, size_t bytes_max) {
        s->records_max = records_max;
        s->bytes_max = bytes_max;
}

unsigned rest_idem_records(RestIdem *s) {
        return s->records;
}

static void key_name(RestIdem *s, const char *key, char ret[SHA256_HEX_SIZE]) {
        uint8_t d[SHA256_DIGEST_SIZE];
        sha256_ctx c;

        sha256_init(&c);
        sha256_update(&c, s->scope, sizeof s->scope);
        rest_idem_hash_field(&c, key, strlen(key));
        sha256_final(&c, d);
        sha256_hex(d, ret);
}

static bool is_record_name(const char *name) {
        size_t n = 0;

        for (; name[n]; n++)
                if (!((name[n] >= '0' && name[n] <= '9') || (name[n] >= 'a' && name[n] <= 'f')))
                        return false;
        return n == 2 * SHA256_DIGEST_SIZE;
}

/* At most max bytes of a record file; -ENOENT when there is none. */
static int read_record(int dfd, const char *name, size_t max, char **ret, size_t *ret_len, struct stat *ret_st) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t want, n;
        ssize_t k;

        fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return negative_errno();
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (!S_ISREG(st.st_mode))
                return -EBADMSG;
        want = (uint64_t) st.st_size < max ? (size_t) st.st_size : max;
        buf = malloc(want + 1);
        if (!buf)
                return -ENOMEM;
        k = loop_read(fd, buf, want);
        if (k < 0)
                return (int) k;
        n = (size_t) k;
        buf[n] = 0;
        *ret = TAKE_PTR(buf);
        *ret_len = n;
        *ret_st = st;
        return 0;
}

static int write_record(RestIdem *s, const char *name, const RestIdemRecord *rec, size_t *ret_size) {
        char tmp[sizeof TMP_PREFIX + SHA256_HEX_SIZE];
        _cleanup_free_ char *buf = NULL;
        _cleanup_close_ int fd = -EBADF;
        size_t len, w = 0;
        int r;

        r = rest_idem_record_format(rec, &buf, &len);
        if (r < 0)
                return r;
        (void) snprintf(tmp, sizeof tmp, TMP_PREFIX "%s", name);
        fd = openat(s->dfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0600);
        if (fd < 0)
                return negative_errno();
        while (w < len) {
                ssize_t k = write(fd, buf + w, len - w);

                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0) {
                        r = negative_errno();
                        (void) unlinkat(s->dfd, tmp, 0);
                        return r;
                }
                w += (size_t) k;
        }
        if (fsync(fd) < 0 || renameat(s->dfd, tmp, s->dfd, name) < 0) {
                r = negative_errno();
                (void) unlinkat(s->dfd, tmp, 0);
                return r;
        }
        if (fsync(s->dfd) < 0)
                return negative_errno();
        *ret_size = len;
        return 0;
}

static void remove_record(RestIdem *s, const char *name, uint64_t size) {
        if (unlinkat(s->dfd, name, 0) < 0)
                return;
        if (s->records > 0)
                s->records--;
        s->bytes -= MIN(s->bytes, size);
}

static void closedirp(DIR **d) {
        if (*d)
                (void) closedir(*d);
}

static RestIdemEntry *entry_find(RestIdem *s, const char *name) {
        for (RestIdemEntry *e = s->entries; e; e = e->next)
                if (!strcmp(e->name, name))
                        return e;
        return NULL;
}

static void entry_free(RestIdem *s, RestIdemEntry *e) {
        if (e->prev)
                e->prev->next = e->next;
        else if (s->entries == e)
                s->entries = e->next;
        if (e->next)
                e->next->prev = e->prev;
        free(e);
}

int rest_idem_sweep(RestIdem *s) {
        _cleanup_(closedirp) DIR *d = NULL;
        uint64_t now = now_secs(), bytes = 0;
        unsigned records = 0;
        struct dirent *de;
        RestIdemEntry *e;
        int fd;

        if (s->dfd < 0)
                return 0;
        fd = openat(s->dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return negative_errno();
        d = fdopendir(fd);
        if (!d) {
                safe_close(fd);
                return negative_errno();
        }
        while ((errno = 0, de = readdir(d))) {
                _cleanup_free_ char *buf = NULL;
                RestIdemRecord rec;
                uint64_t created;
                struct stat st;
                size_t len;
                int r;

                /* Temporary files are ours and never outlive a write (no
                 * threads): a leftover is a write that was cut short. */
                if (!strncmp(de->d_name, TMP_PREFIX, strlen(TMP_PREFIX))) {
                        (void) unlinkat(s->dfd, de->d_name, 0);
                        continue;
                }
                if (!is_record_name(de->d_name))
                        continue;
                e = entry_find(s, de->d_name);
                if (e) { /* in flight: never expires under its request */
                        records++;
                        bytes += e->file_size;
                        continue;
                }
                r = read_record(s->dfd, de->d_name, REST_IDEM_HEADER_MAX, &buf, &len, &st);
                if (r == -ENOENT || r == -EBADMSG) /* gone, or not a regular file: not ours */
                        continue;
                if (r < 0)
                        return r;
                /* A damaged record expires by its modification time. */
                if (rest_idem_record_parse(buf, len, true, &rec) >= 0)
                        created = rec.created;
                else
                        created = st.st_mtime > 0 ? (uint64_t) st.st_mtime : 0;
                if (expired(created, now)) {
                        (void) unlinkat(s->dfd, de->d_name, 0);
                        continue;
                }
                records++;
                bytes += (uint64_t) st.st_size;
        }
        if (errno)
                return negative_errno();
        s->records = records;
        s->bytes = bytes;
        return 0;
}

int rest_idem_begin(RestIdem *s, const char *key, const uint8_t request[SHA256_DIGEST_SIZE],
                    RestIdemEntry **ret_entry, RestIdemRecord *ret_record, char **ret_buf) {
        _cleanup_free_ char *buf = NULL;
        char name[SHA256_HEX_SIZE];
        RestIdemRecord rec;
        RestIdemEntry *e;
        struct stat st;
        size_t len;
        int r;

        r = dir_fd(s, true);
        if (r < 0)
                return r;
        key_name(s, key, name);

        e = entry_find(s, name);
        if (e) {
                if (memcmp(e->request, request, SHA256_DIGEST_SIZE) != 0)
                        return REST_IDEM_LOOKUP_MISMATCH;
                *ret_entry = e;
                return REST_IDEM_LOOKUP_WAIT;
        }

        /* One byte more than a record may have: a longer file does not parse. */
        r = read_record(s->dfd, name, REST_IDEM_FILE_MAX + 1, &buf, &len, &st);
        if (r == -EBADMSG)
                return REST_IDEM_LOOKUP_DAMAGED; /* not a regular file */
        if (r < 0 && r != -ENOENT)
                return r;
        if (r >= 0) {
                if (rest_idem_record_parse(buf, len, false, &rec) < 0) {
                        /* Damaged (truncated, edited): the outcome is unknown
                         * until it expires, by its modification time. */
                        if (!expired(st.st_mtime > 0 ? (uint64_t) st.st_mtime : 0, now_secs()))
                                return REST_IDEM_LOOKUP_DAMAGED;
                        remove_record(s, name, (uint64_t) st.st_size);
                } else if (expired(rec.created, now_secs()))
                        remove_record(s, name, (uint64_t) st.st_size);
                else if (memcmp(rec.request, request, SHA256_DIGEST_SIZE) != 0)
                        return REST_IDEM_LOOKUP_MISMATCH;
                else if (rec.state == REST_IDEM_PENDING)
                        return REST_IDEM_LOOKUP_INTERRUPTED;
                else {
                        *ret_record = rec;
                        if (rec.state == REST_IDEM_UNKEPT)
                                return REST_IDEM_LOOKUP_UNKEPT;
                        *ret_buf = TAKE_PTR(buf);
                        return REST_IDEM_LOOKUP_REPLAY;
                }
        }

        /* A new key: claim it on disk before any work is done. */
        if (s->records >= s->records_max) {
                (void) rest_idem_sweep(s);
                if (s->records >= s->records_max)
                        return -ENOBUFS;
        }
        e = calloc(1, sizeof *e);
        if (!e)
                return -ENOMEM;
        memcpy(e->name, name, sizeof name);
        memcpy(e->request, request, SHA256_DIGEST_SIZE);
        e->created = now_secs();
        rec = (RestIdemRecord) { .created = e->created, .state = REST_IDEM_PENDING };
        memcpy(rec.request, request, SHA256_DIGEST_SIZE);
        r = write_record(s, name, &rec, &e->file_size);
        if (r < 0) {
                free(e);
                return r;
        }
        s->records++;
        s->bytes += e->file_size;
        e->next = s->entries;
        if (s->entries)
                s->entries->prev = e;
        s->entries = e;
        *ret_entry = e;
        return REST_IDEM_LOOKUP_NEW;
}

int rest_idem_finish(RestIdem *s, RestIdemEntry *e, unsigned status, const char *content_type, const void *body,
                     size_t len) {
        RestIdemRecord rec = {
                .created = e->created,
                .state = REST_IDEM_ANSWERED,
                .status = status,
                .body = body,
                .body_len = len,
        };
        size_t size = 0;
        int r;

        memcpy(rec.request, e->request, SHA256_DIGEST_SIZE);
        if (content_type && strlen(content_type) <= REST_IDEM_CONTENT_TYPE_MAX)
                strcpy(rec.content_type, content_type);
        else if (content_type)
                rec.state = REST_IDEM_UNKEPT;
        if (!body || len > REST_IDEM_BODY_MAX || s->bytes + REST_IDEM_HEADER_MAX + len > s->bytes_max + e->file_size)
                rec.state = REST_IDEM_UNKEPT;
        if (rec.state == REST_IDEM_UNKEPT)
                rec.body = NULL;

        r = write_record(s, e->name, &rec, &size);
        if (r >= 0) {
                s->bytes -= MIN(s->bytes, e->file_size);
                s->bytes += size;
        }
        entry_free(s, e);
        return r;
}

void rest_idem_abandon(RestIdem *s, RestIdemEntry *e, bool remove) {
        if (remove)
                remove_record(s, e->name, e->file_size);
        entry_free(s, e);
}
