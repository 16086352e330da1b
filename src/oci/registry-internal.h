/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* What the registry client's files share: a configured registry (registry-config.c),
 * the client and one HTTP exchange (registry-http.c). */

#include <curl/curl.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "registry.h"

#define OCI_REGISTRIES_MAX 256U
#define OCI_CONFIG_MAX (1024U * 1024U)
#define OCI_CREDENTIALS_MAX 4096U

struct oci_registry_entry {
        char *host;
        bool insecure_http;
        char *credentials_file;
        char *ca_file;
};

struct oci_registry_config {
        char *path;
        struct oci_registry_entry *entries;
        size_t n_entries;
};

const struct oci_registry_entry *oci_registry_config_find(const oci_registry_config *c, const char *host);

/* "user:password" from path: one line, a trailing newline dropped. The buffer
 * is wiped and freed by oci_credentials_free(). */
int oci_credentials_read(const char *path, char **ret, char **ret_error);
void oci_credentials_free(char *s);

#define ERROR_BODY_MAX 4096U

struct oci_registry {
        CURL *curl;
        char *host;
        char *base; /* "https://host" or "http://host" */
        bool http_allowed;
        char *ca_file;
        char *credentials; /* "user:password" or NULL; never printed */
        char *auth_header; /* "Authorization: ..." or NULL; never printed */
        uint64_t connect_usec, request_usec, stall_usec;
        uint64_t fetched, sent;
        char *error;
};

/* One exchange: what to send and where the answer goes. */
struct exchange {
        const char *method;
        char *url;
        const char *accept;
        const char *content_type;
        bool send_auth;
        bool streaming;

        /* request body: memory or an fd read from offset 0 */
        const char *body;
        int body_fd;
        uint64_t body_size, body_off;

        /* response body: to out_fd when the status is 2xx, else buffered */
        int out_fd;
        EVP_MD_CTX *md;
        uint64_t out_limit, out_count;
        char *buf;
        size_t buf_size, buf_max;
        int sink_error;

        long status;
        char *content_type_resp, *docker_digest, *location, *www_authenticate;
        uint64_t content_length;
        bool have_content_length;

        oci_registry *reg;
};

void exchange_done(struct exchange *x);
/* The URL for a message: no user, no password, no query (presigned URLs carry secrets there). */
char *url_display(const char *url);
/* "METHOD URL: HTTP status what (the registry's reason)" as the client's error; returns err. */
int http_error(oci_registry *r, const struct exchange *x, int err, const char *what);
/* A request to the registry: authentication on a 401 (once), redirects followed when
 * follow is set (with the Authorization only while on the registry's host). */
int registry_request(oci_registry *r, struct exchange *x, bool follow);
