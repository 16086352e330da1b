/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The defaults a container image gives the agent: /.forkd/image.json, written
 * next to the agent when an OCI image is unpacked.
 *
 *   {"env": ["K=V", ...], "working_dir": "/opt/app", "user": "1000:1000",
 *    "entrypoint": [...], "cmd": [...], "start_cmd": true}
 *
 * Every key is optional. A file that is not such an object (a wrong type, an
 * entry that is not "K=V", more than the limits below) is refused whole.
 *
 * User names are resolved from the image's own /etc/passwd and /etc/group,
 * parsed here: the portable agent is linked statically and has no NSS.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define IMAGE_CONFIG_PATH "/.forkd/image.json"
#define IMAGE_CONFIG_MAX (1024u * 1024u)     /* bytes of image.json */
#define IMAGE_ENV_MAX 4096u                  /* env entries */
#define IMAGE_ARGV_MAX 256u                  /* entrypoint + cmd */
#define IMAGE_STRING_MAX (64u * 1024u)       /* any one string */
#define IMAGE_GROUPS_MAX 64u                 /* supplementary groups kept */
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

static inline void *mfree(void *p) {
        free(p);
        return NULL;
}

typedef struct ImageConfig {
        char **env;             /* "K=V", NULL-terminated; NULL: none given */
        char *working_dir;      /* absolute; NULL: none */
        char *user;             /* NULL: none (an empty string is none too) */
        char **entrypoint;      /* NULL-terminated or NULL */
        char **cmd;
        bool start_cmd;
} ImageConfig;

void image_config_done(ImageConfig *c);
/* Parse image.json's text. -EBADMSG (bad JSON), -EINVAL (wrong type or value),
 * -E2BIG (a limit), -ENOMEM; *ret_error says why. *ret is filled only on success. */
int image_config_parse(const char *text, size_t len, ImageConfig *ret, const char **ret_error);
/* Read and parse a file: -ENOENT when it is missing. */
int image_config_load(const char *path, ImageConfig *ret, const char **ret_error);

/* A new environment: base with every entry of overrides replacing the entry of
 * the same name, new names appended in their order. Either may be NULL. */
char **env_merge(char *const *base, char *const *overrides);
/* The value of name in env, or NULL. */
const char *env_get(char *const *env, const char *name);
/* Look name up in the ':'-separated search path; an executable regular file.
 * A name with a '/' is returned as it is. -ENOENT when none. */
int find_in_path(const char *name, const char *path, char **ret);

typedef struct UserIds {
        uid_t uid;
        gid_t gid;
        gid_t groups[IMAGE_GROUPS_MAX];  /* supplementary, from /etc/group */
        size_t n_groups;
        char *home;                      /* from /etc/passwd; NULL when unknown */
} UserIds;

void user_ids_done(UserIds *u);
/* One line of /etc/passwd: 0 and fields (pointers into line, which is
 * modified), -EINVAL for a malformed line. */
int passwd_parse_line(char *line, const char **ret_name, uid_t *ret_uid, gid_t *ret_gid, const char **ret_home);
/* One line of /etc/group: name, gid and the members (comma-separated, in line). */
int group_parse_line(char *line, const char **ret_name, gid_t *ret_gid, const char **ret_members);
/* Resolve "name", "uid", "uid:gid", "name:group" (either side a number or a
 * name) against root/etc/passwd and root/etc/group (root "" or "/": the real
 * ones). A numeric uid need not exist in passwd (its group is then 0, or its
 * entry's group). -ESRCH: no such user or group; -EINVAL: a malformed spec. */
int user_resolve(const char *root, const char *spec, UserIds *ret);
