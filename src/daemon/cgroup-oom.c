/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* OOM accounting: the oom_kill count of a cgroup, and the one to report for an
 * exited sandbox whose cgroup systemd removed before forkd read it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgroup-backend.h"
#include "fs-util.h"
#include "macro.h"

int cgroup_parse_oom_kill(const char *text, uint64_t *ret) {
        for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
                unsigned long long v;
                char *end;

                if (strncmp(p, "oom_kill ", 9) != 0)
                        continue;
                errno = 0;
                v = strtoull(p + 9, &end, 10);
                if (errno != 0 || end == p + 9 || (*end != '\n' && *end != 0))
                        return -EBADMSG;
                *ret = v;
                return 0;
        }
        return -ENODATA;
}

int cgroup_read_oom_kill_file(const char *path, uint64_t *ret) {
        _cleanup_free_ char *text = NULL;
        int r = read_small_file(path, 4096, &text, NULL);

        if (r < 0)
                return r;
        return cgroup_parse_oom_kill(text, ret);
}

uint64_t cgroup_attribute_ooms(uint64_t *accounted, bool direct_ok, uint64_t direct, bool slice_ok,
                               uint64_t slice_now) {
        if (direct_ok) {
                *accounted += direct;
                return direct;
        }
        if (slice_ok && slice_now > *accounted) {
                *accounted += 1;
                return 1;
        }
        return 0;
}

int cgroup_slice_oom_kills(const char *scope_cgroup, uint64_t *ret) {
        const char *slash = strrchr(scope_cgroup, '/');
        char path[4200];

        if (!slash || slash == scope_cgroup)
                return -EINVAL;
        snprintf(path, sizeof(path), "%.*s/memory.events", (int) (slash - scope_cgroup), scope_cgroup);
        return cgroup_read_oom_kill_file(path, ret);
}
