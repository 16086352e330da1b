/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent-image.h"
#include "agent.h"
#include "io-util.h"
#include "json-util.h"
#include "macro.h"
#include "strv.h"

void image_config_done(ImageConfig *c) {
        c->env = strv_free(c->env);
        c->entrypoint = strv_free(c->entrypoint);
        c->cmd = strv_free(c->cmd);
        free(c->working_dir);
        free(c->user);
        c->working_dir = c->user = NULL;
        c->start_cmd = false;
}

static int string_of(struct json_object *v, char **ret, const char **ret_error) {
        size_t n;

        if (!json_object_is_type(v, json_type_string)) {
                *ret_error = "expected a string";
                return -EINVAL;
        }
        n = (size_t) json_object_get_string_len(v);
        if (n > IMAGE_STRING_MAX) {
                *ret_error = "a string exceeds 64 KiB";
                return -E2BIG;
        }
        if (strlen(json_object_get_string(v)) != n) {
                *ret_error = "a string contains NUL";
                return -EINVAL;
        }
        *ret = strdup(json_object_get_string(v));
        return *ret ? 0 : -ENOMEM;
}

static int strv_of(struct json_object *v, size_t max, bool env, char ***ret, const char **ret_error) {
        _cleanup_strv_free_ char **l = NULL;
        size_t n;
        int r;

        if (!json_object_is_type(v, json_type_array)) {
                *ret_error = "expected an array of strings";
                return -EINVAL;
        }
        n = json_object_array_length(v);
        if (n > max) {
                *ret_error = "too many entries";
                return -E2BIG;
        }
        l = calloc(n + 1, sizeof *l);
        if (!l)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                r = string_of(json_object_array_get_idx(v, i), &l[i], ret_error);
                if (r < 0)
                        return r;
                if (env && (l[i][0] == '=' || !strchr(l[i], '='))) {
                        *ret_error = "env entries must be NAME=VALUE";
                        return -EINVAL;
                }
        }
        *ret = TAKE_PTR(l);
        return 0;
}

int image_config_parse(const char *text, size_t len, ImageConfig *ret, const char **ret_error) {
        _cleanup_(json_object_putp) struct json_object *o = NULL;
        _cleanup_(image_config_done) ImageConfig c = {};
        const char *dummy;
        int r;

        if (!ret_error)
                ret_error = &dummy;
        r = json_parse_strict(text, len, IMAGE_CONFIG_MAX, 8, &o, ret_error);
        if (r < 0)
                return r;

        json_object_object_foreach(o, key, v) {
                if (json_object_is_type(v, json_type_null))
                        continue; /* as absent */
                if (streq(key, "env"))
                        r = strv_of(v, IMAGE_ENV_MAX, true, &c.env, ret_error);
                else if (streq(key, "entrypoint"))
                        r = strv_of(v, IMAGE_ARGV_MAX, false, &c.entrypoint, ret_error);
                else if (streq(key, "cmd"))
                        r = strv_of(v, IMAGE_ARGV_MAX, false, &c.cmd, ret_error);
                else if (streq(key, "working_dir")) {
                        r = string_of(v, &c.working_dir, ret_error);
                        if (r >= 0 && c.working_dir[0] == 0)
                                c.working_dir = mfree(c.working_dir);
                        else if (r >= 0 && c.working_dir[0] != '/') {
                                *ret_error = "working_dir must be absolute";
                                r = -EINVAL;
                        }
                } else if (streq(key, "user")) {
                        r = string_of(v, &c.user, ret_error);
                        if (r >= 0 && c.user[0] == 0)
                                c.user = mfree(c.user);
                } else if (streq(key, "start_cmd")) {
                        if (!json_object_is_type(v, json_type_boolean)) {
                                *ret_error = "start_cmd must be a boolean";
                                r = -EINVAL;
                        } else
                                c.start_cmd = json_object_get_boolean(v);
                } else
                        r = 0; /* unknown keys: for later writers */
                if (r < 0)
                        return r;
        }
        if (strv_length(c.entrypoint) + strv_length(c.cmd) > IMAGE_ARGV_MAX) {
                *ret_error = "entrypoint and cmd exceed 256 arguments";
                return -E2BIG;
        }
        *ret = c;
        c = (ImageConfig) {};
        return 0;
}

int image_config_load(const char *path, ImageConfig *ret, const char **ret_error) {
        _cleanup_free_ char *text = NULL;
        size_t len;
        int r;

        r = read_file_capped_at(AT_FDCWD, path, IMAGE_CONFIG_MAX, &text, &len);
        if (r == -EMSGSIZE) {
                if (ret_error)
                        *ret_error = "larger than 1 MiB";
                return -E2BIG;
        }
        if (r < 0) {
                if (ret_error)
                        *ret_error = strerror(-r);
                return r;
        }
        return image_config_parse(text, len, ret, ret_error);
}

/* ---- the environment ---- */

static size_t env_name_len(const char *e) {
        const char *eq = strchr(e, '=');

        return eq ? (size_t) (eq - e) : strlen(e);
}

const char *env_get(char *const *env, const char *name) {
        size_t n = strlen(name);

        for (size_t i = 0; env && env[i]; i++)
                if (env_name_len(env[i]) == n && strncmp(env[i], name, n) == 0)
                        return env[i] + n + (env[i][n] == '=');
        return NULL;
}

char **env_merge(char *const *base, char *const *overrides) {
        size_t nb = strv_length(base), no = strv_length(overrides), n = 0;
        _cleanup_strv_free_ char **l = calloc(nb + no + 1, sizeof(char *));

        if (!l)
                return NULL;
        for (size_t i = 0; i < nb; i++) {
                size_t k = env_name_len(base[i]);
                bool replaced = false;

                /* a name given twice in base: the first place, the last value */
                for (size_t j = 0; j < n; j++)
                        if (env_name_len(l[j]) == k && strncmp(l[j], base[i], k) == 0) {
                                free(l[j]);
                                l[j] = strdup(base[i]);
                                if (!l[j])
                                        return NULL;
                                replaced = true;
                                break;
                        }
                if (replaced)
                        continue;
                l[n] = strdup(base[i]);
                if (!l[n++])
                        return NULL;
        }
        for (size_t i = 0; i < no; i++) {
                size_t k = env_name_len(overrides[i]);
                bool replaced = false;

                for (size_t j = 0; j < n; j++)
                        if (env_name_len(l[j]) == k && strncmp(l[j], overrides[i], k) == 0) {
                                free(l[j]);
                                l[j] = strdup(overrides[i]);
                                if (!l[j])
                                        return NULL;
                                replaced = true;
                                break;
                        }
                if (replaced)
                        continue;
                l[n] = strdup(overrides[i]);
                if (!l[n++])
                        return NULL;
        }
        return TAKE_PTR(l);
}

int find_in_path(const char *name, const char *path, char **ret) {
        if (!name[0])
                return -ENOENT;
        if (strchr(name, '/')) {
                *ret = strdup(name);
                return *ret ? 0 : -ENOMEM;
        }
        for (const char *p = path ?: DEFAULT_PATH; ; ) {
                size_t k = strcspn(p, ":");
                _cleanup_free_ char *cand = NULL;
                struct stat st;

                if (k > 0 && asprintf(&cand, "%.*s/%s", (int) k, p, name) < 0)
                        return -ENOMEM;
                if (cand && stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0) {
                        *ret = TAKE_PTR(cand);
                        return 0;
                }
                if (!p[k])
                        return -ENOENT;
                p += k + 1;
        }
}

/* ---- users ---- */

void user_ids_done(UserIds *u) {
        u->home = mfree(u->home);
}

static int parse_id(const char *s, unsigned *ret) {
        char *end;
        unsigned long v;

        if (!s[0] || s[0] < '0' || s[0] > '9')
                return -EINVAL;
        errno = 0;
        v = strtoul(s, &end, 10);
        if (errno || *end || v >= UINT_MAX) /* (uid_t) -1 is no one */
                return -EINVAL;
        *ret = (unsigned) v;
        return 0;
}

/* Split line at ':' into at most max fields; the count. */
static size_t split_fields(char *line, char **f, size_t max) {
        size_t n = 0;

        line[strcspn(line, "\n")] = 0;
        for (char *p = line; n < max; ) {
                f[n++] = p;
                if (n == max)
                        break; /* the last field keeps any further ':' */
                p = strchr(p, ':');
                if (!p)
                        break;
                *p++ = 0;
        }
        return n;
}

int passwd_parse_line(char *line, const char **ret_name, uid_t *ret_uid, gid_t *ret_gid, const char **ret_home) {
        char *f[7];
        unsigned uid, gid;

        if (split_fields(line, f, 7) != 7 || !f[0][0] || strchr(f[6], ':'))
                return -EINVAL;
        if (parse_id(f[2], &uid) < 0 || parse_id(f[3], &gid) < 0)
                return -EINVAL;
        *ret_name = f[0];
        *ret_uid = uid;
        *ret_gid = gid;
        *ret_home = f[5];
        return 0;
}

int group_parse_line(char *line, const char **ret_name, gid_t *ret_gid, const char **ret_members) {
        char *f[4];
        unsigned gid;

        if (split_fields(line, f, 4) != 4 || !f[0][0] || strchr(f[3], ':'))
                return -EINVAL;
        if (parse_id(f[2], &gid) < 0)
                return -EINVAL;
        *ret_name = f[0];
        *ret_gid = gid;
        *ret_members = f[3];
        return 0;
}

static FILE *open_etc(const char *root, const char *file) {
        _cleanup_free_ char *p = NULL;

        if (asprintf(&p, "%s/etc/%s", root && !streq(root, "/") ? root : "", file) < 0)
                return NULL;
        return fopen(p, "re");
}

/* By name (name != NULL) or by uid. 0, -ESRCH, -ENOMEM. */
static int passwd_lookup(const char *root, const char *name, uid_t uid, UserIds *u, char **ret_name) {
        _cleanup_fclose_ FILE *f = open_etc(root, "passwd");
        char line[4096];

        if (!f)
                return -ESRCH;
        while (fgets(line, sizeof line, f)) {
                const char *n, *home;
                uid_t lu;
                gid_t lg;

                if (passwd_parse_line(line, &n, &lu, &lg, &home) < 0)
                        continue;
                if (name ? !streq(n, name) : lu != uid)
                        continue;
                u->uid = lu;
                u->gid = lg;
                free(u->home);
                u->home = strdup(home);
                if (ret_name)
                        *ret_name = strdup(n);
                if (!u->home || (ret_name && !*ret_name))
                        return -ENOMEM;
                return 0;
        }
        return -ESRCH;
}

static bool member_of(const char *members, const char *name) {
        size_t n = strlen(name);

        for (const char *p = members; *p; ) {
                size_t k = strcspn(p, ",");

                if (k == n && strncmp(p, name, n) == 0)
                        return true;
                p += k + (p[k] == ',');
        }
        return false;
}

/* The group named (or, with name NULL, nothing), and the user's supplementary groups. */
static int group_scan(const char *root, const char *group_name, gid_t *ret_gid, const char *user, UserIds *u) {
        _cleanup_fclose_ FILE *f = open_etc(root, "group");
        char line[65536];
        bool found = false;

        if (!f)
                return group_name ? -ESRCH : 0;
        while (fgets(line, sizeof line, f)) {
                const char *n, *members;
                gid_t g;

                if (group_parse_line(line, &n, &g, &members) < 0)
                        continue;
                if (group_name && !found && streq(n, group_name)) {
                        *ret_gid = g;
                        found = true;
                }
                if (user && member_of(members, user) && u->n_groups < IMAGE_GROUPS_MAX)
                        u->groups[u->n_groups++] = g;
        }
        return group_name && !found ? -ESRCH : 0;
}

int user_resolve(const char *root, const char *spec, UserIds *ret) {
        _cleanup_(user_ids_done) UserIds u = {};
        _cleanup_free_ char *user = NULL, *name = NULL;
        const char *group = NULL, *colon;
        unsigned id;
        int r;

        if (!spec || !spec[0])
                return -EINVAL;
        colon = strchr(spec, ':');
        user = colon ? strndup(spec, (size_t) (colon - spec)) : strdup(spec);
        if (!user)
                return -ENOMEM;
        if (colon) {
                group = colon + 1;
                if (!group[0] || strchr(group, ':'))
                        return -EINVAL;
        }
        if (!user[0])
                return -EINVAL;

        if (parse_id(user, &id) >= 0) {
                r = passwd_lookup(root, NULL, id, &u, &name);
                if (r == -ENOMEM)
                        return r;
                if (r < 0) { /* a uid that the image does not name: group 0, as container engines do */
                        u.uid = id;
                        u.gid = 0;
                }
        } else {
                r = passwd_lookup(root, user, 0, &u, &name);
                if (r < 0)
                        return r;
        }

        if (group && parse_id(group, &id) >= 0) {
                u.gid = id;
                group = NULL;
        }
        r = group_scan(root, group, &u.gid, name, &u);
        if (r < 0)
                return r;
        *ret = u;
        u = (UserIds) {};
        return 0;
}
