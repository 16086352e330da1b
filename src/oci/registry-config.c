/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Image references and the registry configuration file. */

#include <arpa/inet.h>
#include <ctype.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/stat.h>

#include "io-util.h"
#include "json-util.h"
#include "macro.h"
#include "registry-internal.h"

#define OCI_REF_MAX 1024U
#define OCI_TAG_MAX 128U
#define OCI_REPO_MAX 255U

static int set_error(char **ret_error, int err, const char *fmt, ...) _printf_(3, 4);
static int set_error(char **ret_error, int err, const char *fmt, ...) {
        va_list ap;

        if (ret_error) {
                free(*ret_error);
                va_start(ap, fmt);
                if (vasprintf(ret_error, fmt, ap) < 0)
                        *ret_error = NULL;
                va_end(ap);
        }
        return err;
}

bool oci_digest_is_valid(const char *s) {
        if (!s || strncmp(s, "sha256:", 7) != 0 || strlen(s) != OCI_DIGEST_SIZE - 1)
                return false;
        for (const char *p = s + 7; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

static bool is_alnum_lower(char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

/* One path component of a repository name: [a-z0-9]+ joined by ".", "_", "__" or runs of "-". */
static bool repo_component_is_valid(const char *s, size_t n) {
        size_t i = 0;

        if (n == 0 || !is_alnum_lower(s[0]) || !is_alnum_lower(s[n - 1]))
                return false;
        while (i < n) {
                if (is_alnum_lower(s[i])) {
                        i++;
                        continue;
                }
                if (s[i] == '.' || s[i] == '_') {
                        size_t run = (s[i] == '_' && i + 1 < n && s[i + 1] == '_') ? 2 : 1;

                        i += run;
                        if (i >= n || !is_alnum_lower(s[i]))
                                return false;
                        continue;
                }
                if (s[i] == '-') {
                        while (i < n && s[i] == '-')
                                i++;
                        if (i >= n || !is_alnum_lower(s[i]))
                                return false;
                        continue;
                }
                return false;
        }
        return true;
}

static bool repo_is_valid(const char *s) {
        size_t n = strlen(s);

        if (n == 0 || n > OCI_REPO_MAX)
                return false;
        for (const char *p = s;;) {
                const char *slash = strchr(p, '/');
                size_t len = slash ? (size_t) (slash - p) : strlen(p);

                if (!repo_component_is_valid(p, len))
                        return false;
                if (!slash)
                        return true;
                p = slash + 1;
        }
}

static bool tag_is_valid(const char *s) {
        size_t n = strlen(s);

        if (n == 0 || n > OCI_TAG_MAX)
                return false;
        if (!(isalnum((unsigned char) s[0]) || s[0] == '_'))
                return false;
        for (size_t i = 1; i < n; i++)
                if (!(isalnum((unsigned char) s[i]) || strchr("_.-", s[i])))
                        return false;
        return true;
}

static bool port_is_valid(const char *s) {
        unsigned long v = 0;

        if (!*s || strlen(s) > 5)
                return false;
        for (const char *p = s; *p; p++) {
                if (*p < '0' || *p > '9')
                        return false;
                v = v * 10 + (unsigned long) (*p - '0');
        }
        return v >= 1 && v <= 65535 && s[0] != '0';
}

/* host, host:port, [v6] or [v6]:port; host a DNS name or IPv4 address. */
static bool host_is_valid(const char *s) {
        const char *colon;

        if (!*s || strlen(s) > 262)
                return false;
        if (s[0] == '[') {
                const char *end = strchr(s, ']');
                char buf[INET6_ADDRSTRLEN];
                struct in6_addr a;

                if (!end || (size_t) (end - s - 1) >= sizeof buf)
                        return false;
                memcpy(buf, s + 1, end - s - 1);
                buf[end - s - 1] = 0;
                if (inet_pton(AF_INET6, buf, &a) != 1)
                        return false;
                return end[1] == 0 || (end[1] == ':' && port_is_valid(end + 2));
        }
        colon = strchr(s, ':');
        if (colon && !port_is_valid(colon + 1))
                return false;
        for (const char *p = s; p < (colon ?: s + strlen(s)); p++)
                if (!(isalnum((unsigned char) *p) || *p == '.' || *p == '-'))
                        return false;
        return s[0] != '.' && s[0] != '-' && s[0] != ':';
}

bool oci_host_is_loopback(const char *host) {
        char buf[INET6_ADDRSTRLEN];
        struct in6_addr a6;
        struct in_addr a4;
        const char *end;
        size_t n;

        if (!host)
                return false;
        if (host[0] == '[') {
                end = strchr(host, ']');
                if (!end)
                        return false;
                host++;
        } else
                end = strchr(host, ':') ?: host + strlen(host);
        n = end - host;
        if (n == 0 || n >= sizeof buf)
                return false;
        memcpy(buf, host, n);
        buf[n] = 0;
        if (strcasecmp(buf, "localhost") == 0)
                return true;
        if (inet_pton(AF_INET, buf, &a4) == 1)
                return (ntohl(a4.s_addr) >> 24) == 127;
        if (inet_pton(AF_INET6, buf, &a6) == 1)
                return IN6_IS_ADDR_LOOPBACK(&a6);
        return false;
}

oci_ref *oci_ref_free(oci_ref *r) {
        if (!r)
                return NULL;
        free(r->host);
        free(r->repo);
        free(r->tag);
        free(r->digest);
        free(r);
        return NULL;
}

const char *oci_ref_reference(const oci_ref *r) {
        return r->digest ?: r->tag;
}

int oci_ref_parse(const char *s, oci_ref **ret, char **ret_error) {
        _cleanup_(oci_ref_freep) oci_ref *ref = NULL;
        _cleanup_free_ char *copy = NULL;
        char *slash, *at, *name, *colon, *last;

        if (!s || !*s)
                return set_error(ret_error, -EINVAL, "empty image reference");
        if (strlen(s) > OCI_REF_MAX)
                return set_error(ret_error, -EINVAL, "image reference longer than %u bytes", OCI_REF_MAX);
        copy = strdup(s);
        ref = calloc(1, sizeof *ref);
        if (!copy || !ref)
                return -ENOMEM;

        slash = strchr(copy, '/');
        if (!slash)
                return set_error(ret_error, -EINVAL,
                                 "image reference '%s' names no registry: expected host[:port]/repository[:tag|@sha256:<64 hex>]", s);
        *slash = 0;
        name = slash + 1;
        if (!host_is_valid(copy))
                return set_error(ret_error, -EINVAL, "image reference '%s': invalid registry host '%s'", s, copy);

        at = strchr(name, '@');
        if (at) {
                *at = 0;
                if (!oci_digest_is_valid(at + 1))
                        return set_error(ret_error, -EINVAL,
                                         "image reference '%s': a digest is sha256: and 64 lowercase hex digits", s);
                ref->digest = strdup(at + 1);
                if (!ref->digest)
                        return -ENOMEM;
        }
        last = strrchr(name, '/') ?: name;
        colon = strchr(last, ':');
        if (colon) {
                *colon = 0;
                if (ref->digest)
                        return set_error(ret_error, -EINVAL,
                                         "image reference '%s' has both a tag and a digest: give one of them", s);
                if (!tag_is_valid(colon + 1))
                        return set_error(ret_error, -EINVAL, "image reference '%s': invalid tag '%s'", s, colon + 1);
                ref->tag = strdup(colon + 1);
        } else if (!ref->digest)
                ref->tag = strdup("latest");
        if (!ref->digest && !ref->tag)
                return -ENOMEM;
        if (!repo_is_valid(name))
                return set_error(ret_error, -EINVAL,
                                 "image reference '%s': invalid repository '%s' (lowercase components of [a-z0-9._-] joined by /)", s, name);

        ref->host = strdup(copy);
        ref->repo = strdup(name);
        if (!ref->host || !ref->repo)
                return -ENOMEM;
        *ret = TAKE_PTR(ref);
        return 0;
}

void oci_credentials_free(char *s) {
        if (s) {
                explicit_bzero(s, strlen(s));
                free(s);
        }
}

int oci_credentials_read(const char *path, char **ret, char **ret_error) {
        char *buf = NULL;
        size_t len = 0;
        int r;

        r = read_file_capped_at(AT_FDCWD, path, OCI_CREDENTIALS_MAX, &buf, &len);
        if (r < 0) {
                errno = -r;
                return set_error(ret_error, r, "cannot read credentials file %s: %m", path);
        }
        if (len > 0 && buf[len - 1] == '\n')
                buf[--len] = 0;
        if (len > 0 && buf[len - 1] == '\r')
                buf[--len] = 0;
        /* Only the shape is described: never a byte of the content. */
        if (len == 0 || memchr(buf, '\n', len) || memchr(buf, '\r', len) || strlen(buf) != len || !strchr(buf, ':') ||
            buf[0] == ':') {
                oci_credentials_free(buf);
                return set_error(ret_error, -EBADMSG, "credentials file %s does not hold one line user:password", path);
        }
        *ret = buf;
        return 0;
}

static void entry_done(struct oci_registry_entry *e) {
        free(e->host);
        free(e->credentials_file);
        free(e->ca_file);
}

oci_registry_config *oci_registry_config_free(oci_registry_config *c) {
        if (!c)
                return NULL;
        for (size_t i = 0; i < c->n_entries; i++)
                entry_done(&c->entries[i]);
        free(c->entries);
        free(c->path);
        free(c);
        return NULL;
}

const struct oci_registry_entry *oci_registry_config_find(const oci_registry_config *c, const char *host) {
        for (size_t i = 0; i < c->n_entries; i++)
                if (strcasecmp(c->entries[i].host, host) == 0)
                        return &c->entries[i];
        return NULL;
}

static const struct json_dispatch entry_table[] = {
        { "host", JSON_KIND_STRING, NULL, offsetof(struct oci_registry_entry, host), 0, JSON_MANDATORY },
        { "insecure_http", JSON_KIND_BOOL, NULL, offsetof(struct oci_registry_entry, insecure_http), 0, 0 },
        { "credentials_file", JSON_KIND_STRING, NULL, offsetof(struct oci_registry_entry, credentials_file), 0,
          JSON_NULLABLE },
        { "ca_file", JSON_KIND_STRING, NULL, offsetof(struct oci_registry_entry, ca_file), 0, JSON_NULLABLE },
        {}
};

struct config_json {
        struct json_object *registries;
};

static const struct json_dispatch config_table[] = {
        { "registries", JSON_KIND_ARRAY, NULL, offsetof(struct config_json, registries), 0, JSON_MANDATORY },
        {}
};

static int check_entry(const oci_registry_config *c, const struct oci_registry_entry *e, size_t i, char **ret_error) {
        char *creds = NULL;
        int r;

        if (!host_is_valid(e->host))
                return set_error(ret_error, -EBADMSG, "%s: registries[%zu]: invalid host '%s'", c->path, i, e->host);
        if (oci_registry_config_find(c, e->host))
                return set_error(ret_error, -EBADMSG, "%s: registry %s appears twice", c->path, e->host);
        if (e->insecure_http && !oci_host_is_loopback(e->host))
                return set_error(ret_error, -EPERM,
                                 "%s: registry %s: insecure_http is allowed only for a loopback host (127.0.0.0/8, ::1, localhost)",
                                 c->path, e->host);
        if (e->credentials_file) {
                if (e->credentials_file[0] != '/')
                        return set_error(ret_error, -EBADMSG, "%s: registry %s: credentials_file must be an absolute path",
                                         c->path, e->host);
                r = oci_credentials_read(e->credentials_file, &creds, ret_error);
                if (r < 0)
                        return r;
                oci_credentials_free(creds);
        }
        if (e->ca_file) {
                if (e->ca_file[0] != '/')
                        return set_error(ret_error, -EBADMSG, "%s: registry %s: ca_file must be an absolute path", c->path,
                                         e->host);
                if (access(e->ca_file, R_OK) < 0)
                        return set_error(ret_error, negative_errno(), "%s: registry %s: cannot read ca_file %s: %m",
                                         c->path, e->host, e->ca_file);
        }
        return 0;
}

int oci_registry_config_load(const char *path, oci_registry_config **ret, char **ret_error) {
        _cleanup_(oci_registry_config_freep) oci_registry_config *c = NULL;
        _cleanup_(json_object_putp) struct json_object *obj = NULL;
        _cleanup_free_ char *buf = NULL;
        struct config_json cj = {};
        const char *field = NULL, *why = NULL;
        size_t len = 0, n;
        int r;

        r = read_file_capped_at(AT_FDCWD, path, OCI_CONFIG_MAX, &buf, &len);
        if (r < 0) {
                errno = -r;
                return set_error(ret_error, r, "cannot read registry configuration %s: %m", path);
        }
        r = json_parse_strict(buf, len, OCI_CONFIG_MAX, 8, &obj, &why);
        if (r < 0)
                return set_error(ret_error, -EBADMSG, "%s: %s", path, why ?: "invalid JSON");
        r = json_dispatch_full(obj, config_table, JSON_REJECT_UNKNOWN, &cj, &field, &why);
        if (r < 0)
                return set_error(ret_error, -EBADMSG, "%s: %s%s%s", path, field ?: "", field ? ": " : "", why ?: "invalid");

        c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->path = strdup(path);
        if (!c->path)
                return -ENOMEM;
        n = json_object_array_length(cj.registries);
        if (n > OCI_REGISTRIES_MAX)
                return set_error(ret_error, -EBADMSG, "%s: more than %u registries", path, OCI_REGISTRIES_MAX);
        c->entries = calloc(MAX(n, 1u), sizeof *c->entries);
        if (!c->entries)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct oci_registry_entry e = {};

                field = why = NULL;
                r = json_dispatch_full(json_object_array_get_idx(cj.registries, i), entry_table, JSON_REJECT_UNKNOWN, &e,
                                       &field, &why);
                if (r < 0)
                        r = set_error(ret_error, -EBADMSG, "%s: registries[%zu]: %s%s%s", path, i, field ?: "",
                                      field ? ": " : "", why ?: "invalid");
                else
                        r = check_entry(c, &e, i, ret_error);
                if (r < 0) {
                        entry_done(&e);
                        return r;
                }
                c->entries[c->n_entries++] = e;
        }
        *ret = TAKE_PTR(c);
        return 0;
}
