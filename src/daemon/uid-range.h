/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* The default range of the uids (and gids, the same numbers) that confined
 * VMMs get one each of (forkd --vmm-uid-range): 65536 ids from 0x70000000.
 * systemd's ranges end below it: its dynamic users (61184..65519) and the
 * containers of systemd-nspawn -U and systemd-homed (0x80000..0x6FFFFFFF,
 * picked in 64K chunks anywhere there); systemd documents 0x70000000 and above,
 * up to its foreign range (0x7FFE0000), as taken by nothing. And it stays
 * below 2^31, past which some tools read a uid as negative. */
#define VMM_UID_RANGE_DEFAULT_FIRST UINT32_C(0x70000000)
#define VMM_UID_RANGE_DEFAULT_COUNT UINT32_C(65536)

/* The most ids a range may have: the map takes a byte per id. */
#define VMM_UID_RANGE_COUNT_MAX (UINT32_C(1) << 24)

typedef struct UidRange {
        uid_t first;
        uint32_t count;
        uint8_t *refs;  /* per id, how many hold it (a sandbox, the frozen copy of its VMM); 0: free */
        uint32_t n_used;
        uint32_t next;  /* where the next search starts: a freed id is handed out again last */
} UidRange;

/* "FIRST:COUNT", decimal numbers, COUNT from 1 to VMM_UID_RANGE_COUNT_MAX.
 * Checks nothing else. */
int uid_range_parse(const char *s, uid_t *ret_first, uint32_t *ret_count);

/* The range in itself: no overflow (the last id below (uid_t) -1), and none of
 * 0, 65533, 65534 (nobody, and the usual VMM user of --vmm-user), nor
 * also_refused (the --vmm-user uid in force; (uid_t) -1 for none).
 * -EINVAL, -ERANGE or -EEXIST (holds a reserved id, named in *ret_id). */
int uid_range_check(uid_t first, uint32_t count, uid_t also_refused, uid_t *ret_id);

/* One pass over the passwd database and one over the group database
 * (getpwent(), getgrent()): -EEXIST if a user or a group has an id in the
 * range, with "user NAME (UID)" or "group NAME (GID)" in *ret_what; 0 if none. */
int uid_range_check_databases(uid_t first, uint32_t count, char **ret_what);

int uid_range_init(UidRange *r, uid_t first, uint32_t count);
void uid_range_done(UidRange *r);

static inline bool uid_range_contains(const UidRange *r, uid_t uid) {
        return r->count > 0 && uid >= r->first && (uint64_t) uid - r->first < r->count;
}

/* A free id of the range, marked used: -EBUSY when every one is used. */
int uid_range_alloc(UidRange *r, uid_t *ret);

/* Marks uid used (one a running VMM holds): -ERANGE outside the range, -EEXIST
 * if used already. */
int uid_range_reserve(UidRange *r, uid_t uid);

/* One more holder of a used id (the frozen copy of a VMM runs under its
 * sandbox's id): -ERANGE outside the range, -ENOENT if free, -EOVERFLOW past
 * 255 holders. */
int uid_range_ref(UidRange *r, uid_t uid);

/* One holder fewer: the id is free when none is left. Ids outside the range,
 * or free, are ignored. */
void uid_range_free(UidRange *r, uid_t uid);

/* Marks used every id of the range that a process still runs under (its real,
 * effective or saved uid, from /proc/PID/status under proc, "/proc" normally):
 * a VMM of a forkd that went away, not dead yet. Returns how many. */
int uid_range_reserve_running(UidRange *r, const char *proc);
