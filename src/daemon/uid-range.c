/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The ids of confined VMMs (forkd --vmm-uid-range FIRST:COUNT): each sandbox's
 * VMM gets a uid of its own from the range, with the gid of the same number,
 * when it is forked, and gives it back when its process is gone. A paused
 * sandbox has no process, so it holds none.
 *
 * forkd's VMMs die with it (PR_SET_PDEATHSIG), but not at once: a forkd that
 * starts again marks used whatever id of the range a process still runs under
 * (uid_range_reserve_running()), so that no id of a VMM still on its way out
 * goes to a new one.
 */
#include <assert.h>
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "macro.h"
#include "uid-range.h"

static int parse_u32(const char *s, size_t n, uint32_t *ret) {
        uint64_t v = 0;

        if (n == 0 || n > 10)
                return -EINVAL;
        for (size_t i = 0; i < n; i++) {
                if (s[i] < '0' || s[i] > '9')
                        return -EINVAL;
                v = v * 10 + (uint64_t) (s[i] - '0');
        }
        if (v > UINT32_MAX)
                return -ERANGE;
        *ret = (uint32_t) v;
        return 0;
}

int uid_range_parse(const char *s, uid_t *ret_first, uint32_t *ret_count) {
        const char *colon = strchr(s, ':');
        uint32_t first, count;
        int r;

        if (!colon)
                return -EINVAL;
        r = parse_u32(s, (size_t) (colon - s), &first);
        if (r >= 0)
                r = parse_u32(colon + 1, strlen(colon + 1), &count);
        if (r < 0)
                return r;
        if (count == 0 || count > VMM_UID_RANGE_COUNT_MAX)
                return -EINVAL;
        *ret_first = (uid_t) first;
        *ret_count = count;
        return 0;
}

int uid_range_check(uid_t first, uint32_t count, uid_t also_refused, uid_t *ret_id) {
        const uid_t reserved[] = { 0, 65533, 65534, also_refused };

        if (count == 0 || count > VMM_UID_RANGE_COUNT_MAX)
                return -EINVAL;
        /* The last id must stay below (uid_t) -1, which means "unchanged" to setresuid(). */
        if ((uint64_t) first + count > (uint64_t) (uid_t) -1)
                return -ERANGE;
        for (size_t i = 0; i < ELEMENTSOF(reserved); i++) {
                if (reserved[i] == (uid_t) -1)
                        continue;
                if (reserved[i] >= first && (uint64_t) reserved[i] - first < count) {
                        if (ret_id)
                                *ret_id = reserved[i];
                        return -EEXIST;
                }
        }
        return 0;
}

static bool in_range(uid_t first, uint32_t count, uint32_t id) {
        return id >= first && (uint64_t) id - first < count;
}

int uid_range_check_databases(uid_t first, uint32_t count, char **ret_what) {
        char *what = NULL;
        struct passwd *pw;
        struct group *gr;

        setpwent();
        while (!what && (pw = getpwent()))
                if (in_range(first, count, pw->pw_uid) &&
                    asprintf(&what, "user %s (%u)", pw->pw_name, (unsigned) pw->pw_uid) < 0)
                        what = NULL;
        endpwent();
        setgrent();
        while (!what && (gr = getgrent()))
                if (in_range(first, count, gr->gr_gid) &&
                    asprintf(&what, "group %s (%u)", gr->gr_name, (unsigned) gr->gr_gid) < 0)
                        what = NULL;
        endgrent();
        if (!what)
                return 0;
        if (ret_what)
                *ret_what = what;
        else
                free(what);
        return -EEXIST;
}

int uid_range_init(UidRange *r, uid_t first, uint32_t count) {
        *r = (UidRange) { .first = first, .count = count };
        if (count == 0)
                return 0;
        r->refs = calloc(count, 1);
        return r->refs ? 0 : -ENOMEM;
}

void uid_range_done(UidRange *r) {
        free(r->refs);
        *r = (UidRange) {};
}

int uid_range_alloc(UidRange *r, uid_t *ret) {
        uint8_t *p;
        uint32_t k;

        if (r->n_used >= r->count)
                return -EBUSY;
        p = memchr(r->refs + r->next, 0, r->count - r->next);
        if (!p)
                p = memchr(r->refs, 0, r->next);
        assert(p); /* n_used < count */
        k = (uint32_t) (p - r->refs);
        r->refs[k] = 1;
        r->n_used++;
        r->next = k + 1 < r->count ? k + 1 : 0;
        *ret = r->first + k;
        return 0;
}

int uid_range_reserve(UidRange *r, uid_t uid) {
        if (!uid_range_contains(r, uid))
                return -ERANGE;
        if (r->refs[uid - r->first] > 0)
                return -EEXIST;
        r->refs[uid - r->first] = 1;
        r->n_used++;
        return 0;
}

int uid_range_ref(UidRange *r, uid_t uid) {
        uint8_t *c;

        if (!uid_range_contains(r, uid))
                return -ERANGE;
        c = &r->refs[uid - r->first];
        if (*c == 0)
                return -ENOENT;
        if (*c == UINT8_MAX)
                return -EOVERFLOW;
        (*c)++;
        return 0;
}

void uid_range_free(UidRange *r, uid_t uid) {
        uint8_t *c;

        if (!uid_range_contains(r, uid))
                return;
        c = &r->refs[uid - r->first];
        if (*c == 0)
                return;
        if (--(*c) == 0)
                r->n_used--;
}

/* The real, effective and saved uid of "Uid:\tR\tE\tS\tFS" in a status file. */
static int status_uids(int dfd, const char *pid, uid_t uids[3]) {
        _cleanup_fclose_ FILE *f = NULL;
        char path[64], line[256];
        int fd;

        snprintf(path, sizeof(path), "%s/status", pid);
        fd = openat(dfd, path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        f = fdopen(fd, "re");
        if (!f) {
                safe_close(fd);
                return -errno;
        }
        while (fgets(line, sizeof(line), f)) {
                unsigned long u[3];

                if (strncmp(line, "Uid:", 4) != 0)
                        continue;
                if (sscanf(line + 4, "%lu %lu %lu", &u[0], &u[1], &u[2]) != 3)
                        return -EBADMSG;
                for (unsigned i = 0; i < 3; i++)
                        uids[i] = (uid_t) u[i];
                return 0;
        }
        return -EBADMSG;
}

int uid_range_reserve_running(UidRange *r, const char *proc) {
        struct dirent *de;
        DIR *d;
        int n = 0;

        d = opendir(proc);
        if (!d)
                return -errno;
        while ((de = readdir(d))) {
                uid_t uids[3];

                if (!isdigit((unsigned char) de->d_name[0]) || status_uids(dirfd(d), de->d_name, uids) < 0)
                        continue; /* gone since */
                for (unsigned i = 0; i < 3; i++)
                        if (uid_range_reserve(r, uids[i]) >= 0)
                                n++;
        }
        closedir(d);
        return n;
}
