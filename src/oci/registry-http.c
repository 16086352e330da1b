/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* HTTP for the registry client: one exchange at a time on the client's curl
 * handle; redirects and authentication by hand, so that each hop is checked
 * against the HTTP rule and credentials go only to the registry itself and
 * to the token realm it names. */

#include <ctype.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdarg.h>

#include "base64.h"
#include "io-util.h"
#include "json-util.h"
#include "macro.h"
#include "registry-internal.h"
#include "time-util.h"

#define REDIRECTS_MAX 5
#define TOKEN_BODY_MAX (64U * 1024U)
#define HEADER_VALUE_MAX 8192U

static void *mfree(void *p) {
        free(p);
        return NULL;
}

static char *mfree_credentials(char *p) {
        oci_credentials_free(p);
        return NULL;
}

static bool streq_ptr(const char *a, const char *b) {
        return a && b && strcmp(a, b) == 0;
}

static void exchange_reset_response(struct exchange *x) {
        x->status = 0;
        x->out_count = 0;
        x->sink_error = 0;
        x->body_off = 0;
        x->buf_size = 0;
        x->have_content_length = false;
        x->content_length = 0;
        x->content_type_resp = mfree(x->content_type_resp);
        x->docker_digest = mfree(x->docker_digest);
        x->location = mfree(x->location);
        x->www_authenticate = mfree(x->www_authenticate);
}

void exchange_done(struct exchange *x) {
        exchange_reset_response(x);
        free(x->buf);
        free(x->url);
        if (x->md)
                EVP_MD_CTX_free(x->md);
}

/* Set the message of the last failure. */
int oci_registry_set_error(oci_registry *r, int err, const char *fmt, ...) {
        va_list ap;
        char *s = NULL;

        va_start(ap, fmt);
        if (vasprintf(&s, fmt, ap) < 0)
                s = NULL;
        va_end(ap);
        free(r->error);
        r->error = s;
        return err < 0 ? err : -EIO;
}

const char *oci_registry_error(const oci_registry *r) {
        return r->error ?: "";
}

uint64_t oci_registry_bytes_fetched(const oci_registry *r) {
        return r->fetched;
}

uint64_t oci_registry_bytes_sent(const oci_registry *r) {
        return r->sent;
}

/* The URL for a message: no user, no password, no query (presigned URLs carry secrets there). */
char *url_display(const char *url) {
        CURLU *u = curl_url();
        char *s = NULL, *ret;

        if (!u)
                return strdup("(URL)");
        if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
            curl_url_set(u, CURLUPART_USER, NULL, 0) != CURLUE_OK ||
            curl_url_set(u, CURLUPART_PASSWORD, NULL, 0) != CURLUE_OK ||
            curl_url_set(u, CURLUPART_QUERY, NULL, 0) != CURLUE_OK ||
            curl_url_set(u, CURLUPART_FRAGMENT, NULL, 0) != CURLUE_OK ||
            curl_url_get(u, CURLUPART_URL, &s, 0) != CURLUE_OK) {
                curl_url_cleanup(u);
                return strdup("(unparsable URL)");
        }
        ret = strdup(s);
        curl_free(s);
        curl_url_cleanup(u);
        return ret;
}

/* scheme and host[:port] of an absolute URL; checks the HTTP rule. */
static int url_check(oci_registry *r, const char *url, char **ret_hostport) {
        _cleanup_free_ char *shown = url_display(url);
        CURLU *u = curl_url();
        char *scheme = NULL, *host = NULL, *port = NULL, *user = NULL;
        int ret = 0;

        if (!u)
                return -ENOMEM;
        if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
            curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
            curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK) {
                ret = oci_registry_set_error(r, -EBADMSG, "%s: not an absolute http(s) URL", shown ?: "(URL)");
                goto out;
        }
        (void) curl_url_get(u, CURLUPART_PORT, &port, 0);
        if (curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK) {
                ret = oci_registry_set_error(r, -EPERM, "%s: a URL with user information is refused", shown ?: "(URL)");
                goto out;
        }
        if (strcmp(scheme, "https") != 0) {
                char hp[300];

                (void) snprintf(hp, sizeof hp, "%s%s%s", host, port ? ":" : "", port ?: "");
                if (strcmp(scheme, "http") != 0)
                        ret = oci_registry_set_error(r, -EPERM, "%s: only https (and http on loopback) is used",
                                                     shown ?: "(URL)");
                else if (!r->http_allowed || !oci_host_is_loopback(hp))
                        ret = oci_registry_set_error(r, -EPERM,
                                                     "%s: plain HTTP refused: only to a loopback host of a registry configured with insecure_http",
                                                     shown ?: "(URL)");
        }
        if (ret == 0 && ret_hostport) {
                if (asprintf(ret_hostport, "%s%s%s", host, port ? ":" : "", port ?: "") < 0)
                        ret = -ENOMEM;
        }
out:
        curl_free(scheme);
        curl_free(host);
        curl_free(port);
        curl_free(user);
        curl_url_cleanup(u);
        return ret;
}

static size_t on_header(char *data, size_t size, size_t n, void *userdata) {
        struct exchange *x = userdata;
        size_t len = size * n, name_len;
        const char *colon, *v, *end;
        char **slot = NULL;

        if (len >= 5 && strncmp(data, "HTTP/", 5) == 0) {
                /* A new response (after a 100 Continue): forget the last one's headers. */
                x->content_type_resp = mfree(x->content_type_resp);
                x->docker_digest = mfree(x->docker_digest);
                x->location = mfree(x->location);
                x->www_authenticate = mfree(x->www_authenticate);
                x->have_content_length = false;
                return len;
        }
        colon = memchr(data, ':', len);
        if (!colon || len > HEADER_VALUE_MAX)
                return len;
        name_len = colon - data;
        v = colon + 1;
        end = data + len;
        while (v < end && (*v == ' ' || *v == '\t'))
                v++;
        while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t'))
                end--;

#define IS(h) (name_len == strlen(h) && strncasecmp(data, h, name_len) == 0)
        if (IS("Content-Type"))
                slot = &x->content_type_resp;
        else if (IS("Docker-Content-Digest"))
                slot = &x->docker_digest;
        else if (IS("Location"))
                slot = &x->location;
        else if (IS("WWW-Authenticate")) {
                /* The first challenge is the one used. */
                if (!x->www_authenticate)
                        slot = &x->www_authenticate;
        } else if (IS("Content-Length")) {
                char tmp[32];
                char *e;

                if ((size_t) (end - v) < sizeof tmp) {
                        memcpy(tmp, v, end - v);
                        tmp[end - v] = 0;
                        errno = 0;
                        x->content_length = strtoull(tmp, &e, 10);
                        x->have_content_length = errno == 0 && e != tmp && *e == 0 && tmp[0] != '-';
                }
        }
#undef IS
        if (slot) {
                free(*slot);
                *slot = strndup(v, end - v);
                if (!*slot)
                        return 0;
        }
        return len;
}

static size_t on_body(char *data, size_t size, size_t n, void *userdata) {
        struct exchange *x = userdata;
        size_t len = size * n;
        long status = 0;
        int r;

        (void) curl_easy_getinfo(x->reg->curl, CURLINFO_RESPONSE_CODE, &status);
        x->reg->fetched += len;

        if (x->out_fd >= 0 && status >= 200 && status < 300) {
                if (len > x->out_limit - x->out_count) {
                        x->sink_error = -EFBIG;
                        return 0;
                }
                if (EVP_DigestUpdate(x->md, data, len) != 1) {
                        x->sink_error = -EIO;
                        return 0;
                }
                r = loop_write(x->out_fd, data, len);
                if (r < 0) {
                        x->sink_error = r;
                        return 0;
                }
                x->out_count += len;
                return len;
        }

        /* Into the buffer: the body of a small answer, or of an error (kept short). */
        if (len > x->buf_max - x->buf_size) {
                if (x->out_fd >= 0 || !(status >= 200 && status < 300)) {
                        len = x->buf_max - x->buf_size; /* an error's text: keep the start */
                        if (len == 0)
                                return size * n;
                } else {
                        x->sink_error = -EFBIG;
                        return 0;
                }
        }
        if (!x->buf) {
                x->buf = malloc(x->buf_max + 1);
                if (!x->buf) {
                        x->sink_error = -ENOMEM;
                        return 0;
                }
        }
        memcpy(x->buf + x->buf_size, data, len);
        x->buf_size += len;
        x->buf[x->buf_size] = 0;
        return size * n;
}

static size_t on_read(char *data, size_t size, size_t n, void *userdata) {
        struct exchange *x = userdata;
        size_t len = MIN(size * n, x->body_size - x->body_off);

        if (len == 0)
                return 0;
        if (x->body)
                memcpy(data, x->body + x->body_off, len);
        else {
                ssize_t k = pread(x->body_fd, data, len, x->body_off);

                if (k < 0 && errno == EINTR)
                        k = pread(x->body_fd, data, len, x->body_off);
                if (k <= 0) {
                        x->sink_error = k < 0 ? negative_errno() : -EIO;
                        return CURL_READFUNC_ABORT;
                }
                len = (size_t) k;
        }
        x->body_off += len;
        x->reg->sent += len;
        return len;
}

/* The registry's own account of an error: "CODE: message" of its first error. */
static void registry_reason(const struct exchange *x, char *out, size_t out_size) {
        _cleanup_(json_object_putp) struct json_object *obj = NULL;
        struct json_object *errors, *e, *code, *message;
        size_t j = 0;
        char tmp[256];

        out[0] = 0;
        if (!x->buf || x->buf_size == 0)
                return;
        if (json_parse_strict(x->buf, x->buf_size, ERROR_BODY_MAX, 16, &obj, NULL) < 0)
                return;
        if (!json_object_object_get_ex(obj, "errors", &errors) || !json_object_is_type(errors, json_type_array) ||
            json_object_array_length(errors) == 0)
                return;
        e = json_object_array_get_idx(errors, 0);
        if (!json_object_is_type(e, json_type_object))
                return;
        (void) snprintf(tmp, sizeof tmp, "%s%s%s",
                        json_object_object_get_ex(e, "code", &code) && json_object_is_type(code, json_type_string) ?
                                json_object_get_string(code) : "",
                        ": ",
                        json_object_object_get_ex(e, "message", &message) && json_object_is_type(message, json_type_string) ?
                                json_object_get_string(message) : "");
        for (size_t i = 0; tmp[i] && j + 1 < out_size; i++)
                out[j++] = (tmp[i] >= 0x20 && tmp[i] < 0x7f) ? tmp[i] : '?';
        out[j] = 0;
}

int http_error(oci_registry *r, const struct exchange *x, int err, const char *what) {
        _cleanup_free_ char *shown = url_display(x->url);
        char reason[160];

        registry_reason(x, reason, sizeof reason);
        return oci_registry_set_error(r, err, "%s %s: HTTP %ld%s%s%s%s%s", x->method, shown ?: "(URL)", x->status,
                                      what ? " " : "", what ?: "", reason[0] ? " (" : "", reason, reason[0] ? ")" : "");
}

/* One request and its answer, no retries. */
static int perform(oci_registry *r, struct exchange *x) {
        _cleanup_free_ char *shown = NULL;
        struct curl_slist *headers = NULL, *h;
        char errbuf[CURL_ERROR_SIZE] = "", line[300];
        CURLcode cc;
        int ret;

        exchange_reset_response(x);
        if (x->md && EVP_DigestInit_ex(x->md, EVP_sha256(), NULL) != 1)
                return -EIO;
        ret = url_check(r, x->url, NULL);
        if (ret < 0)
                return ret;

        curl_easy_reset(r->curl);
        (void) curl_easy_setopt(r->curl, CURLOPT_URL, x->url);
        (void) curl_easy_setopt(r->curl, CURLOPT_PROTOCOLS_STR, r->http_allowed ? "http,https" : "https");
        (void) curl_easy_setopt(r->curl, CURLOPT_FOLLOWLOCATION, 0L);
        (void) curl_easy_setopt(r->curl, CURLOPT_NOSIGNAL, 1L);
        (void) curl_easy_setopt(r->curl, CURLOPT_ERRORBUFFER, errbuf);
        (void) curl_easy_setopt(r->curl, CURLOPT_USERAGENT, "forkd/" FORKD_VERSION);
        (void) curl_easy_setopt(r->curl, CURLOPT_SSL_VERIFYPEER, 1L);
        (void) curl_easy_setopt(r->curl, CURLOPT_SSL_VERIFYHOST, 2L);
        if (r->ca_file)
                (void) curl_easy_setopt(r->curl, CURLOPT_CAINFO, r->ca_file);
        (void) curl_easy_setopt(r->curl, CURLOPT_CONNECTTIMEOUT_MS, (long) (r->connect_usec / USEC_PER_MSEC));
        if (x->streaming) {
                (void) curl_easy_setopt(r->curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
                (void) curl_easy_setopt(r->curl, CURLOPT_LOW_SPEED_TIME, (long) MAX(r->stall_usec / USEC_PER_SEC, 1u));
        } else
                (void) curl_easy_setopt(r->curl, CURLOPT_TIMEOUT_MS, (long) (r->request_usec / USEC_PER_MSEC));
        (void) curl_easy_setopt(r->curl, CURLOPT_HEADERFUNCTION, on_header);
        (void) curl_easy_setopt(r->curl, CURLOPT_HEADERDATA, x);
        (void) curl_easy_setopt(r->curl, CURLOPT_WRITEFUNCTION, on_body);
        (void) curl_easy_setopt(r->curl, CURLOPT_WRITEDATA, x);

        if (streq_ptr(x->method, "HEAD"))
                (void) curl_easy_setopt(r->curl, CURLOPT_NOBODY, 1L);
        else if (streq_ptr(x->method, "POST")) {
                (void) curl_easy_setopt(r->curl, CURLOPT_POST, 1L);
                (void) curl_easy_setopt(r->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) x->body_size);
                (void) curl_easy_setopt(r->curl, CURLOPT_READFUNCTION, on_read);
                (void) curl_easy_setopt(r->curl, CURLOPT_READDATA, x);
        } else if (streq_ptr(x->method, "PUT")) {
                (void) curl_easy_setopt(r->curl, CURLOPT_UPLOAD, 1L);
                (void) curl_easy_setopt(r->curl, CURLOPT_INFILESIZE_LARGE, (curl_off_t) x->body_size);
                (void) curl_easy_setopt(r->curl, CURLOPT_READFUNCTION, on_read);
                (void) curl_easy_setopt(r->curl, CURLOPT_READDATA, x);
        }

        ret = -ENOMEM;
        if (!(h = curl_slist_append(headers, "Expect:")))
                goto out;
        headers = h;
        if (x->accept) {
                (void) snprintf(line, sizeof line, "Accept: %s", x->accept);
                if (!(h = curl_slist_append(headers, line)))
                        goto out;
                headers = h;
        }
        if (x->content_type) {
                (void) snprintf(line, sizeof line, "Content-Type: %s", x->content_type);
                if (!(h = curl_slist_append(headers, line)))
                        goto out;
                headers = h;
        }
        if (x->send_auth && r->auth_header) {
                if (!(h = curl_slist_append(headers, r->auth_header)))
                        goto out;
                headers = h;
        }
        (void) curl_easy_setopt(r->curl, CURLOPT_HTTPHEADER, headers);

        cc = curl_easy_perform(r->curl);
        (void) curl_easy_getinfo(r->curl, CURLINFO_RESPONSE_CODE, &x->status);
        if (cc != CURLE_OK) {
                shown = url_display(x->url);
                if (x->sink_error < 0) {
                        errno = -x->sink_error;
                        ret = oci_registry_set_error(r, x->sink_error, "%s %s: HTTP %ld: %s", x->method,
                                                     shown ?: "(URL)", x->status,
                                                     x->sink_error == -EFBIG ? "the answer is larger than allowed" : "%m");
                } else
                        ret = oci_registry_set_error(r, cc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT : -EIO,
                                                     "%s %s: %s", x->method, shown ?: "(URL)",
                                                     errbuf[0] ? errbuf : curl_easy_strerror(cc));
                goto out;
        }
        ret = 0;
out:
        /* Detach everything that points into this frame before it goes. */
        (void) curl_easy_setopt(r->curl, CURLOPT_HTTPHEADER, NULL);
        (void) curl_easy_setopt(r->curl, CURLOPT_ERRORBUFFER, NULL);
        curl_slist_free_all(headers);
        return ret;
}

/* Parameters of a challenge: key="value" pairs, comma separated. */
static char *challenge_param(const char *s, const char *key) {
        size_t klen = strlen(key);
        const char *p = s;

        while (*p) {
                while (*p == ' ' || *p == ',')
                        p++;
                if (strncasecmp(p, key, klen) == 0 && p[klen] == '=') {
                        const char *v = p + klen + 1, *e;

                        if (*v == '"') {
                                v++;
                                e = strchr(v, '"');
                        } else
                                e = v + strcspn(v, ", ");
                        return e ? strndup(v, e - v) : NULL;
                }
                /* Skip this pair. */
                p += strcspn(p, "=,");
                if (*p == '=') {
                        p++;
                        if (*p == '"') {
                                const char *e = strchr(p + 1, '"');

                                if (!e)
                                        return NULL;
                                p = e + 1;
                        } else
                                p += strcspn(p, ",");
                }
        }
        return NULL;
}

static int set_basic_auth(oci_registry *r) {
        size_t n = strlen(r->credentials);
        char *h = malloc(strlen("Authorization: Basic ") + BASE64_ENCODED_SIZE(n) + 1);
        size_t k;

        if (!h)
                return -ENOMEM;
        k = strlen("Authorization: Basic ");
        memcpy(h, "Authorization: Basic ", k);
        k += base64_encode(r->credentials, n, h + k);
        h[k] = 0;
        oci_credentials_free(r->auth_header);
        r->auth_header = h;
        return 0;
}

/* The bearer token flow: GET realm?service=&scope= (with the credentials, if any),
 * answer {"token": ...} or {"access_token": ...}. */
static int fetch_token(oci_registry *r, const char *challenge) {
        _cleanup_free_ char *realm = challenge_param(challenge, "realm"), *service = challenge_param(challenge, "service"),
                            *scope = challenge_param(challenge, "scope"), *realm_hostport = NULL;
        _cleanup_(json_object_putp) struct json_object *obj = NULL;
        struct exchange x = { .method = "GET", .body_fd = -EBADF, .out_fd = -EBADF, .buf_max = TOKEN_BODY_MAX, .reg = r };
        struct json_object *tok;
        char *old_auth, *e_service = NULL, *e_scope = NULL;
        const char *token;
        int ret;

        if (!realm)
                return oci_registry_set_error(r, -EBADMSG, "registry %s: a Bearer challenge without a realm", r->host);
        ret = url_check(r, realm, &realm_hostport);
        if (ret < 0)
                return ret;
        if (service)
                e_service = curl_easy_escape(r->curl, service, 0);
        if (scope)
                e_scope = curl_easy_escape(r->curl, scope, 0);
        ret = asprintf(&x.url, "%s%s%s%s%s%s", realm, strchr(realm, '?') ? "&" : "?", e_service ? "service=" : "",
                       e_service ?: "", e_scope ? (e_service ? "&scope=" : "scope=") : "", e_scope ?: "");
        curl_free(e_service);
        curl_free(e_scope);
        if (ret < 0) {
                x.url = NULL;
                return -ENOMEM;
        }

        /* The credentials go with the token request; the old token does not. */
        old_auth = TAKE_PTR(r->auth_header);
        oci_credentials_free(old_auth);
        if (r->credentials) {
                ret = set_basic_auth(r);
                if (ret < 0)
                        goto out;
                x.send_auth = true;
        }
        ret = perform(r, &x);
        r->auth_header = mfree_credentials(r->auth_header);
        if (ret < 0)
                goto out;
        if (x.status != 200) {
                ret = http_error(r, &x, x.status == 401 || x.status == 403 ? -EACCES : -EIO,
                                 "from the token service");
                goto out;
        }
        if (!x.buf || json_parse_strict(x.buf, x.buf_size, TOKEN_BODY_MAX, 8, &obj, NULL) < 0 ||
            !((json_object_object_get_ex(obj, "token", &tok) && json_object_is_type(tok, json_type_string)) ||
              (json_object_object_get_ex(obj, "access_token", &tok) && json_object_is_type(tok, json_type_string)))) {
                ret = http_error(r, &x, -EBADMSG, "from the token service: no token in the answer");
                goto out;
        }
        token = json_object_get_string(tok);
        if (!*token || strpbrk(token, "\r\n") || strlen(token) > TOKEN_BODY_MAX) {
                ret = http_error(r, &x, -EBADMSG, "from the token service: an unusable token");
                goto out;
        }
        if (asprintf(&r->auth_header, "Authorization: Bearer %s", token) < 0) {
                r->auth_header = NULL;
                ret = -ENOMEM;
                goto out;
        }
        ret = 0;
out:
        if (x.buf)
                explicit_bzero(x.buf, x.buf_size);
        exchange_done(&x);
        return ret;
}

/* Answer a 401: 1 when there is something new to try, 0 when not. */
static int authenticate(oci_registry *r, const struct exchange *x) {
        const char *c = x->www_authenticate;
        int ret;

        if (!c)
                return 0;
        if (strncasecmp(c, "Bearer ", 7) == 0) {
                ret = fetch_token(r, c + 7);
                return ret < 0 ? ret : 1;
        }
        if (strncasecmp(c, "Basic", 5) == 0 && (c[5] == 0 || c[5] == ' ')) {
                if (!r->credentials || (r->auth_header && strncmp(r->auth_header, "Authorization: Basic ", 21) == 0))
                        return 0;
                ret = set_basic_auth(r);
                return ret < 0 ? ret : 1;
        }
        return 0;
}

/* A request to the registry: authentication on a 401 (once), redirects followed
 * (with the Authorization only while on the registry's host). */
int registry_request(oci_registry *r, struct exchange *x, bool follow) {
        bool authed = false;
        int ret;

        x->send_auth = true;
        for (unsigned hops = 0;;) {
                ret = perform(r, x);
                if (ret < 0)
                        return ret;
                if (x->status == 401 && x->send_auth && !authed) {
                        authed = true;
                        ret = authenticate(r, x);
                        if (ret < 0)
                                return ret;
                        if (ret > 0)
                                continue;
                        return http_error(r, x, -EACCES, r->credentials ? "(the credentials were refused)" :
                                                                          "(no credentials configured)");
                }
                if (follow && (x->status == 301 || x->status == 302 || x->status == 303 || x->status == 307 ||
                               x->status == 308)) {
                        _cleanup_free_ char *hostport = NULL;
                        char *next = NULL;

                        if (++hops > REDIRECTS_MAX)
                                return http_error(r, x, -ELOOP, "(too many redirects)");
                        if (curl_easy_getinfo(r->curl, CURLINFO_REDIRECT_URL, &next) != CURLE_OK || !next)
                                return http_error(r, x, -EBADMSG, "(a redirect without a Location)");
                        next = strdup(next);
                        if (!next)
                                return -ENOMEM;
                        free(x->url);
                        x->url = next;
                        ret = url_check(r, x->url, &hostport);
                        if (ret < 0)
                                return ret;
                        x->send_auth = strcasecmp(hostport, r->host) == 0;
                        continue;
                }
                return 0;
        }
}
