/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The registry protocol's operations (registry-http.c carries them): one curl
 * easy handle per client, reused so that its connection stays open. */

#include <curl/curl.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdarg.h>

#include "macro.h"
#include "registry-internal.h"
#include "time-util.h"

static int registry_url(oci_registry *r, char **ret, const char *fmt, ...) _printf_(3, 4);
static int registry_url(oci_registry *r, char **ret, const char *fmt, ...) {
        _cleanup_free_ char *path = NULL;
        va_list ap;
        int k;

        va_start(ap, fmt);
        k = vasprintf(&path, fmt, ap);
        va_end(ap);
        if (k < 0)
                return -ENOMEM;
        if (asprintf(ret, "%s%s", r->base, path) < 0)
                return -ENOMEM;
        return 0;
}

int oci_registry_new(const oci_registry_config *c, const char *host, oci_registry **ret, char **ret_error) {
        const struct oci_registry_entry *e = oci_registry_config_find(c, host);
        _cleanup_(oci_registry_freep) oci_registry *r = NULL;
        int k;

        if (!e) {
                if (ret_error && asprintf(ret_error, "registry %s is not configured in %s", host, c->path) < 0)
                        *ret_error = NULL;
                return -EPERM;
        }
        if (e->insecure_http && !oci_host_is_loopback(e->host)) {
                if (ret_error && asprintf(ret_error, "registry %s: plain HTTP is allowed only to a loopback host", host) < 0)
                        *ret_error = NULL;
                return -EPERM;
        }
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
                return -EIO;
        r = calloc(1, sizeof *r);
        if (!r)
                return -ENOMEM;
        r->connect_usec = 10 * USEC_PER_SEC;
        r->request_usec = 60 * USEC_PER_SEC;
        r->stall_usec = 30 * USEC_PER_SEC;
        r->http_allowed = e->insecure_http;
        r->host = strdup(e->host);
        if (!r->host)
                return -ENOMEM;
        if (asprintf(&r->base, "%s://%s", e->insecure_http ? "http" : "https", e->host) < 0) {
                r->base = NULL;
                return -ENOMEM;
        }
        if (e->ca_file && !(r->ca_file = strdup(e->ca_file)))
                return -ENOMEM;
        if (e->credentials_file) {
                k = oci_credentials_read(e->credentials_file, &r->credentials, ret_error);
                if (k < 0)
                        return k;
        }
        r->curl = curl_easy_init();
        if (!r->curl)
                return -ENOMEM;
        *ret = TAKE_PTR(r);
        return 0;
}

oci_registry *oci_registry_free(oci_registry *r) {
        if (!r)
                return NULL;
        if (r->curl)
                curl_easy_cleanup(r->curl);
        free(r->host);
        free(r->base);
        free(r->ca_file);
        oci_credentials_free(r->credentials);
        oci_credentials_free(r->auth_header);
        free(r->error);
        free(r);
        return NULL;
}

void oci_registry_set_timeouts(oci_registry *r, uint64_t connect_usec, uint64_t request_usec, uint64_t stall_usec) {
        if (connect_usec > 0)
                r->connect_usec = MAX(connect_usec, USEC_PER_MSEC);
        if (request_usec > 0)
                r->request_usec = MAX(request_usec, USEC_PER_MSEC);
        if (stall_usec > 0)
                r->stall_usec = MAX(stall_usec, USEC_PER_SEC);
}

oci_manifest *oci_manifest_free(oci_manifest *m) {
        if (!m)
                return NULL;
        free(m->data);
        free(m->media_type);
        free(m);
        return NULL;
}

static void digest_of(const void *data, size_t n, char out[OCI_DIGEST_SIZE]) {
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned len = 0;

        (void) EVP_Digest(data, n, md, &len, EVP_sha256(), NULL);
        memcpy(out, "sha256:", 7);
        for (unsigned i = 0; i < 32; i++)
                (void) snprintf(out + 7 + 2 * i, 3, "%02x", md[i]);
}

static int name_check(oci_registry *r, const char *repo, const char *reference) {
        /* The reference parser vets names; these only keep a caller's mistakes out of URLs. */
        if (!repo || !*repo || strpbrk(repo, "?#%@: \t\r\n") || strstr(repo, ".."))
                return oci_registry_set_error(r, -EINVAL, "invalid repository name");
        if (reference && (!*reference || strpbrk(reference, "/?#%@ \t\r\n") || strlen(reference) > 128 + 7))
                return oci_registry_set_error(r, -EINVAL, "invalid tag or digest");
        return 0;
}

int oci_registry_get_manifest(oci_registry *r, const char *repo, const char *reference, oci_manifest **ret_manifest) {
        struct exchange x = { .method = "GET", .body_fd = -EBADF, .out_fd = -EBADF, .buf_max = OCI_MANIFEST_MAX, .reg = r,
                              .accept = OCI_MEDIA_TYPE_INDEX ", " OCI_MEDIA_TYPE_MANIFEST ", " DOCKER_MEDIA_TYPE_MANIFEST_LIST
                                        ", " DOCKER_MEDIA_TYPE_MANIFEST };
        _cleanup_(oci_manifest_freep) oci_manifest *m = NULL;
        _cleanup_free_ char *shown = NULL;
        int ret;

        ret = name_check(r, repo, reference);
        if (ret < 0)
                return ret;
        ret = registry_url(r, &x.url, "/v2/%s/manifests/%s", repo, reference);
        if (ret < 0)
                goto out;
        ret = registry_request(r, &x, true);
        if (ret < 0)
                goto out;
        if (x.status != 200) {
                ret = http_error(r, &x, x.status == 404 ? -ENOENT : x.status == 403 ? -EACCES : -EIO, NULL);
                goto out;
        }
        shown = url_display(x.url);
        m = calloc(1, sizeof *m);
        if (!m) {
                ret = -ENOMEM;
                goto out;
        }
        digest_of(x.buf ?: "", x.buf_size, m->digest);
        if (x.docker_digest && strcmp(x.docker_digest, m->digest) != 0) {
                ret = oci_registry_set_error(r, -EBADMSG, "GET %s: HTTP 200: the manifest's SHA-256 is %s, not the %s the registry names in Docker-Content-Digest",
                                             shown ?: "(URL)", m->digest, oci_digest_is_valid(x.docker_digest) ? x.docker_digest : "(invalid digest)");
                goto out;
        }
        if (oci_digest_is_valid(reference) && strcmp(reference, m->digest) != 0) {
                ret = oci_registry_set_error(r, -EBADMSG, "GET %s: HTTP 200: the manifest's SHA-256 is %s, not the %s asked for",
                                             shown ?: "(URL)", m->digest, reference);
                goto out;
        }
        if (!x.content_type_resp || !*x.content_type_resp) {
                ret = oci_registry_set_error(r, -EBADMSG, "GET %s: HTTP 200 without a Content-Type", shown ?: "(URL)");
                goto out;
        }
        m->media_type = strndup(x.content_type_resp, strcspn(x.content_type_resp, "; "));
        m->data = TAKE_PTR(x.buf);
        m->size = x.buf_size;
        if (!m->media_type || !m->data) {
                ret = -ENOMEM;
                goto out;
        }
        *ret_manifest = TAKE_PTR(m);
        ret = 0;
out:
        exchange_done(&x);
        return ret;
}

int oci_registry_get_blob(oci_registry *r, const char *repo, const char *digest, uint64_t size, int fd) {
        struct exchange x = { .method = "GET", .body_fd = -EBADF, .out_fd = fd, .out_limit = size, .buf_max = ERROR_BODY_MAX,
                              .streaming = true, .reg = r };
        _cleanup_free_ char *shown = NULL;
        char got[OCI_DIGEST_SIZE];
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned len = 0;
        int ret;

        if (!oci_digest_is_valid(digest))
                return oci_registry_set_error(r, -EINVAL, "invalid blob digest");
        ret = name_check(r, repo, NULL);
        if (ret < 0)
                return ret;
        x.md = EVP_MD_CTX_new();
        if (!x.md)
                return -ENOMEM;
        ret = registry_url(r, &x.url, "/v2/%s/blobs/%s", repo, digest);
        if (ret < 0)
                goto out;
        ret = registry_request(r, &x, true);
        if (ret < 0)
                goto out;
        if (x.status != 200) {
                ret = http_error(r, &x, x.status == 404 ? -ENOENT : x.status == 403 ? -EACCES : -EIO, NULL);
                goto out;
        }
        shown = url_display(x.url);
        if (x.out_count != size) {
                ret = oci_registry_set_error(r, -EBADMSG, "GET %s: HTTP 200: blob %s is %" PRIu64 " bytes, not the %" PRIu64 " expected",
                                             shown ?: "(URL)", digest, x.out_count, size);
                goto out;
        }
        if (EVP_DigestFinal_ex(x.md, md, &len) != 1 || len != 32) {
                ret = -EIO;
                goto out;
        }
        memcpy(got, "sha256:", 7);
        for (unsigned i = 0; i < 32; i++)
                (void) snprintf(got + 7 + 2 * i, 3, "%02x", md[i]);
        if (strcmp(got, digest) != 0) {
                ret = oci_registry_set_error(r, -EBADMSG, "GET %s: HTTP 200: the blob's SHA-256 is %s, not %s",
                                             shown ?: "(URL)", got, digest);
                goto out;
        }
        ret = 0;
out:
        exchange_done(&x);
        return ret;
}

int oci_registry_head_blob(oci_registry *r, const char *repo, const char *digest, uint64_t *ret_size) {
        struct exchange x = { .method = "HEAD", .body_fd = -EBADF, .out_fd = -EBADF, .buf_max = ERROR_BODY_MAX, .reg = r };
        int ret;

        if (!oci_digest_is_valid(digest))
                return oci_registry_set_error(r, -EINVAL, "invalid blob digest");
        ret = name_check(r, repo, NULL);
        if (ret < 0)
                return ret;
        ret = registry_url(r, &x.url, "/v2/%s/blobs/%s", repo, digest);
        if (ret < 0)
                goto out;
        ret = registry_request(r, &x, true);
        if (ret < 0)
                goto out;
        if (x.status == 404)
                ret = 0;
        else if (x.status == 200) {
                if (ret_size)
                        *ret_size = x.have_content_length ? x.content_length : 0;
                ret = 1;
        } else
                ret = http_error(r, &x, x.status == 403 ? -EACCES : -EIO, NULL);
out:
        exchange_done(&x);
        return ret;
}

/* Location of an upload, made absolute against the URL that answered. */
static int upload_location(oci_registry *r, struct exchange *x, char **ret) {
        CURLU *u;
        char *s = NULL;
        int k = 0;

        if (!x->location)
                return http_error(r, x, -EBADMSG, "(an upload without a Location)");
        u = curl_url();
        if (!u)
                return -ENOMEM;
        if (curl_url_set(u, CURLUPART_URL, x->url, 0) != CURLUE_OK ||
            curl_url_set(u, CURLUPART_URL, x->location, 0) != CURLUE_OK ||
            curl_url_get(u, CURLUPART_URL, &s, 0) != CURLUE_OK)
                k = http_error(r, x, -EBADMSG, "(an unusable Location)");
        curl_url_cleanup(u);
        if (k < 0)
                return k;
        *ret = strdup(s);
        curl_free(s);
        return *ret ? 0 : -ENOMEM;
}

int oci_registry_put_blob(oci_registry *r, const char *repo, const char *digest, int fd, uint64_t size,
                          const char *mount_from) {
        struct exchange post = { .method = "POST", .body = "", .body_fd = -EBADF, .out_fd = -EBADF,
                                 .buf_max = ERROR_BODY_MAX, .reg = r };
        struct exchange put = { .method = "PUT", .body_fd = fd, .body_size = size, .out_fd = -EBADF,
                                .content_type = "application/octet-stream", .buf_max = ERROR_BODY_MAX, .streaming = true,
                                .reg = r };
        _cleanup_free_ char *location = NULL, *e_digest = NULL;
        uint64_t have = 0;
        int ret;

        ret = oci_registry_head_blob(r, repo, digest, &have);
        if (ret != 0)
                return ret < 0 ? ret : 1;
        if (mount_from) {
                ret = name_check(r, mount_from, NULL);
                if (ret < 0)
                        return ret;
                ret = registry_url(r, &post.url, "/v2/%s/blobs/uploads/?mount=%s&from=%s", repo, digest, mount_from);
        } else
                ret = registry_url(r, &post.url, "/v2/%s/blobs/uploads/", repo);
        if (ret < 0)
                goto out;
        ret = registry_request(r, &post, false);
        if (ret < 0)
                goto out;
        if (post.status == 201 && mount_from) {
                ret = 1;
                goto out;
        }
        if (post.status != 202) {
                ret = http_error(r, &post, post.status == 403 ? -EACCES : -EIO, NULL);
                goto out;
        }
        ret = upload_location(r, &post, &location);
        if (ret < 0)
                goto out;
        e_digest = curl_easy_escape(r->curl, digest, 0);
        if (!e_digest) {
                ret = -ENOMEM;
                goto out;
        }
        if (asprintf(&put.url, "%s%sdigest=%s", location, strchr(location, '?') ? "&" : "?", e_digest) < 0) {
                put.url = NULL;
                ret = -ENOMEM;
                goto out;
        }
        ret = registry_request(r, &put, false);
        if (ret < 0)
                goto out;
        if (put.status != 201) {
                ret = http_error(r, &put, put.status == 400 ? -EBADMSG : put.status == 403 ? -EACCES : -EIO, NULL);
                goto out;
        }
        ret = 0;
out:
        exchange_done(&post);
        exchange_done(&put);
        return ret;
}

int oci_registry_put_manifest(oci_registry *r, const char *repo, const char *reference, const char *media_type,
                              const void *data, size_t size) {
        struct exchange x = { .method = "PUT", .body = data, .body_fd = -EBADF, .body_size = size, .out_fd = -EBADF,
                              .content_type = media_type, .buf_max = ERROR_BODY_MAX, .reg = r };
        int ret;

        if (size > OCI_MANIFEST_MAX)
                return oci_registry_set_error(r, -EFBIG, "a manifest of more than %u bytes", OCI_MANIFEST_MAX);
        if (!media_type || !*media_type || strpbrk(media_type, "\r\n") || strlen(media_type) > 200)
                return oci_registry_set_error(r, -EINVAL, "invalid media type");
        ret = name_check(r, repo, reference);
        if (ret < 0)
                return ret;
        ret = registry_url(r, &x.url, "/v2/%s/manifests/%s", repo, reference);
        if (ret < 0)
                goto out;
        ret = registry_request(r, &x, false);
        if (ret < 0)
                goto out;
        if (x.status != 201)
                ret = http_error(r, &x, x.status == 400 ? -EBADMSG : x.status == 403 ? -EACCES : -EIO, NULL);
        else
                ret = 0;
out:
        exchange_done(&x);
        return ret;
}
