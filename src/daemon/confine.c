/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd's side of the VMM jail (src/vmm/jail.c does the confining): who owns
 * what in the state directory, and what forkd-vmm is told.
 *
 *   state_dir/            root:VMM-group 0710   the VMM may pass, not list
 *     snapshots/          root 0700             no VMM passes here
 *       <tag>/...         VMM:VMM               adopted on registration (confine_adopt_snapshot())
 *       <tag>.tmp.<pid>/  the writer's          made by forkd for a branch or a boot's
 *                                               snapshot, handed over as a descriptor
 *     overlays/ logs/     VMM:VMM 0750          copy-on-write disks, consoles
 *     sandboxes/ .lock    root, as before       never the VMM's
 *     bus.sock            root, as before       and seccomp allows no socket() or connect()
 *
 * A VMM reaches only what forkd names with --jail-link (confine_jail_links()):
 * a template the directories of its snapshot's chain, a boot none, and both
 * the overlay and console directories; through descriptors opened before the
 * jail, so that ".." out of a snapshot directory stops at snapshots/, which
 * the VMM user may not pass.
 *
 * With --vmm-uid-range (not 'shared'), a template and the VMMs that boot run
 * as the VMM user, and each sandbox's VMM under an id of its own, with the
 * VMM group as its one supplementary group (vmm-userns.c): its way through
 * state_dir, and to the snapshots, which a branch of it reads (the parent's
 * memory). It writes its branch and its overlay, so
 *
 *     overlays/             VMM:VMM 1770        the sticky bit: only what a
 *                                               VMM made is its to rename or
 *                                               remove
 *
 * and what it writes (an overlay, a branch until forkd adopts it) is its own
 * id's, 0600 or 0640, which no other sandbox's VMM may open.
 *
 * forkd --no-confine leaves every mode alone and starts VMMs as before.
 */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>

#include "confine.h"
#include "hash-cache.h"
#include "hashmap.h"
#include "image.h"
#include "macro.h"
#include "snapshot-meta.h"
#include "strv.h"
#include "vmm-client.h"

static int own(const char *path, uid_t uid, gid_t gid, mode_t mode) {
        if (chown(path, uid, gid) < 0 || chmod(path, mode) < 0)
                return log_error_errno(errno, "Failed to hand %s to the VMM user %u:%u: %m", path, (unsigned) uid,
                                       (unsigned) gid);
        return 0;
}

int confine_setup(Manager *m) {
        struct vmm_confine c = { .uid = m->vmm_uid, .gid = m->vmm_gid, .binds = { m->state_dir }, .n_binds = 1 };
        const char *dirs[] = { m->overlay_dir, m->log_dir };
        /* Written by VMMs of ids of their own, in the group (see above). */
        const mode_t modes[] = { m->vmm_uids.count > 0 ? 01770 : 0750, 0750 };
        int r;

        if (!m->confine)
                return vmm_client_set_confine(NULL);
        r = own(m->state_dir, 0, m->vmm_gid, 0710);
        if (r >= 0)
                r = own(m->snapshots_dir, 0, 0, 0700);
        for (size_t i = 0; r >= 0 && i < ELEMENTSOF(dirs); i++)
                r = own(dirs[i], m->vmm_uid, m->vmm_gid, modes[i]);
        if (r < 0)
                return r;
        r = vmm_client_set_confine(&c);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the VMM confinement: %m");
        log_info("VMMs run confined, as %u:%u.", (unsigned) m->vmm_uid, (unsigned) m->vmm_gid);
        return 0;
}

/* chown of one file of a snapshot; a hash cache that held for it before (unpack and
 * pull leave one) is written again for it after, since the chown changes its ctime. */
static int adopt_file(int dfd, const char *name, uid_t uid, gid_t gid) {
        char hash[SNAPSHOT_HASH_LEN + 1];
        _cleanup_close_ int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        bool cached;

        if (fd < 0)
                return -errno;
        cached = hash_cache_get(dfd, name, fd, hash) > 0;
        if (fchown(fd, uid, gid) < 0)
                return -errno;
        if (cached)
                hash_cache_put(dfd, name, fd, hash);
        return 0;
}

int confine_adopt_snapshot(Manager *m, int dfd) {
        _cleanup_close_ int fd = -EBADF;
        struct dirent *de;
        struct stat st;
        DIR *d;
        int r = 0;

        if (!m->confine)
                return 0;
        if (fstat(dfd, &st) < 0)
                return -errno;
        if (st.st_uid != m->vmm_uid || st.st_gid != m->vmm_gid)
                if (fchown(dfd, m->vmm_uid, m->vmm_gid) < 0)
                        return -errno;

        fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        d = fdopendir(fd);
        if (!d)
                return -errno;
        TAKE_FD(fd);
        while ((de = readdir(d))) {
                if (de->d_name[0] == '.')
                        continue;
                if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
                        continue;
                if (st.st_uid == m->vmm_uid && st.st_gid == m->vmm_gid)
                        continue;
                r = adopt_file(dirfd(d), de->d_name, m->vmm_uid, m->vmm_gid);
                if (r < 0)
                        break;
        }
        closedir(d);
        return r;
}

static int strv_push_dup(char **l, size_t *n, const char *s) {
        l[*n] = strdup(s);
        if (!l[*n])
                return -ENOMEM;
        (*n)++;
        return 0;
}

int confine_jail_links(Manager *m, Image *i, char ***ret) {
        _cleanup_strv_free_ char **l = NULL;
        size_t n = 0;
        int r = 0;

        *ret = NULL;
        if (!m->confine)
                return 0;
        l = calloc(VMM_CLIENT_JAIL_LINKS_MAX + 1, sizeof(char *));
        if (!l)
                return -ENOMEM;
        /* The snapshot and its parents, as far as they are registered (a broken
         * chain is refused before any fork: chain_check_restorable()). */
        for (Image *k = i; r >= 0 && k && n < VMM_CLIENT_JAIL_LINKS_MAX - 2;
             k = k->meta.parent_tag[0] ? hashmap_get(m->images, k->meta.parent_tag) : NULL)
                r = strv_push_dup(l, &n, k->dir);
        if (r >= 0)
                r = strv_push_dup(l, &n, m->overlay_dir);
        if (r >= 0)
                r = strv_push_dup(l, &n, m->log_dir);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(l);
        return 0;
}

int confine_staging_dir(const char *snapshots_dir, const char *tag, pid_t pid, uid_t uid, gid_t gid,
                        char **ret_name, int *ret_fd) {
        _cleanup_free_ char *name = NULL;
        _cleanup_close_ int dfd = -EBADF, fd = -EBADF;

        if (pid > 0 ? asprintf(&name, "%s.tmp.%d", tag, (int) pid) < 0 :
                      asprintf(&name, SNAPSHOT_STAGING_HIDDEN_PREFIX "%s", tag) < 0)
                return -ENOMEM;
        dfd = open(snapshots_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;
        if (mkdirat(dfd, name, 0750) < 0)
                return -errno;
        fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 || (uid != (uid_t) -1 && fchown(fd, uid, gid) < 0)) {
                int r = -errno;

                (void) unlinkat(dfd, name, AT_REMOVEDIR);
                return r;
        }
        *ret_name = TAKE_PTR(name);
        *ret_fd = TAKE_FD(fd);
        return 0;
}

int confine_staging_rename(const char *snapshots_dir, const char *from, const char *to) {
        _cleanup_close_ int dfd = -EBADF;

        dfd = open(snapshots_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;
        if (renameat2(dfd, from, dfd, to, RENAME_NOREPLACE) < 0)
                return -errno;
        return fsync(dfd) < 0 ? -errno : 0;
}

int confine_staging_finish(const char *snapshots_dir, const char *name, const char *tag) {
        _cleanup_close_ int fd = -EBADF;
        char path[PATH_MAX];

        if (snprintf(path, sizeof(path), "%s/%s", snapshots_dir, name) >= (int) sizeof(path))
                return -ENAMETOOLONG;
        fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        if (unlinkat(fd, SNAPSHOT_STAGING_WHOLE_FILE, 0) < 0 && errno != ENOENT)
                return -errno;
        if (fsync(fd) < 0)
                return -errno;
        return confine_staging_rename(snapshots_dir, name, tag);
}

bool confine_staging_is_whole(const char *snapshots_dir, const char *name) {
        char path[PATH_MAX];
        struct stat st;

        if (snprintf(path, sizeof(path), "%s/%s/%s", snapshots_dir, name, SNAPSHOT_STAGING_WHOLE_FILE) >=
            (int) sizeof(path))
                return false;
        return lstat(path, &st) >= 0 && S_ISREG(st.st_mode);
}
