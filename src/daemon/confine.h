/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "manager.h"

/* A staging directory in snapshots/ whose writer is not known yet (a branch
 * before its writer forked): removed at start, like the other leftovers. */
#define SNAPSHOT_STAGING_HIDDEN_PREFIX ".branch-"

/* The state directory for confined VMMs (forkd-vmm(8), CONFINEMENT): the VMM
 * user may pass through state_dir (root:VMM-group, 0710) and owns overlays/
 * and logs/, where it writes; snapshots/ (root, 0700), sandboxes/ and the
 * rest stay root's. Then every VMM this forkd starts gets --confine, and the
 * directories it may reach as --jail-link (confine_jail_links()). Does
 * nothing when m->confine is false. */
int confine_setup(Manager *m);

/* Hands a snapshot directory and its files to the VMM user, so that a
 * confined VMM may read them, and hard-link its disk into a branch: called
 * for every snapshot forkd registers, whoever wrote it (a VMM, forkd-vmm
 * compact, an unpack). */
int confine_adopt_snapshot(Manager *m, int dfd);

/* The --jail-link directories of a VMM (NULL-terminated, *ret NULL when VMMs
 * are not confined): for the template of i, the directory of i and of each
 * parent in its chain, then the overlay and console directories; for a boot
 * (i NULL), those two only. */
int confine_jail_links(Manager *m, Image *i, char ***ret);

/* A new directory in snapshots_dir for a writer to write a snapshot into
 * through the descriptor *ret_fd (forkd renames it into place once written):
 * "<tag>.tmp.<pid>", or SNAPSHOT_STAGING_HIDDEN_PREFIX "<tag>" while pid is
 * not known yet (pid 0); owned by uid:gid unless uid is (uid_t) -1.
 * *ret_name: its name in snapshots_dir. */
int confine_staging_dir(const char *snapshots_dir, const char *tag, pid_t pid, uid_t uid, gid_t gid,
                        char **ret_name, int *ret_fd);
/* renameat2(RENAME_NOREPLACE) of from to to in snapshots_dir, the directory synced. */
int confine_staging_rename(const char *snapshots_dir, const char *from, const char *to);
/* A written staging directory (name) into place as tag: its
 * SNAPSHOT_STAGING_WHOLE_FILE removed, then renamed (never over anything). */
int confine_staging_finish(const char *snapshots_dir, const char *name, const char *tag);
/* The writer of staging directory name marked it whole (SNAPSHOT_STAGING_WHOLE_FILE). */
bool confine_staging_is_whole(const char *snapshots_dir, const char *name);
