/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd's side of the VMM jail (src/vmm/jail.c does the confining): who owns
 * what in the state directory, and what forkd-vmm is told.
 *
 *   state_dir/            root:VMM-group 0710   the VMM may pass, not list
 *     snapshots/          VMM:VMM 0750          templates read, branches and boots write here
 *       <tag>/...         VMM:VMM               adopted on registration (confine_adopt_snapshot())
 *     overlays/ logs/     VMM:VMM 0750          copy-on-write disks, boot consoles
 *     sandboxes/ .lock    root, as before       never the VMM's
 *     bus.sock            root, as before       and seccomp allows no socket() or connect()
 *
 * With --vmm-uid-range (not 'shared'), a template and the VMMs that boot run
 * as the VMM user, and each sandbox's VMM under an id of its own, with the
 * VMM group as its one supplementary group (vmm-userns.c): its way through
 * state_dir, and to the snapshots, which a branch of it reads (the parent's
 * memory). It writes its branch and its overlay, so
 *
 *     snapshots/ overlays/  VMM:VMM 1770        the sticky bit: only what a
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
#include <sys/stat.h>

#include "confine.h"
#include "macro.h"
#include "vmm-client.h"

static int own(const char *path, uid_t uid, gid_t gid, mode_t mode) {
        if (chown(path, uid, gid) < 0 || chmod(path, mode) < 0)
                return log_error_errno(errno, "Failed to hand %s to the VMM user %u:%u: %m", path, (unsigned) uid,
                                       (unsigned) gid);
        return 0;
}

int confine_setup(Manager *m) {
        struct vmm_confine c = { .uid = m->vmm_uid, .gid = m->vmm_gid, .binds = { m->state_dir }, .n_binds = 1 };
        const char *dirs[] = { m->snapshots_dir, m->overlay_dir, m->log_dir };
        /* Written by VMMs of ids of their own, in the group (see above). */
        const mode_t modes[] = { m->vmm_uids.count > 0 ? 01770 : 0750, m->vmm_uids.count > 0 ? 01770 : 0750, 0750 };
        int r;

        if (!m->confine)
                return vmm_client_set_confine(NULL);
        r = own(m->state_dir, 0, m->vmm_gid, 0710);
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
                if ((st.st_uid != m->vmm_uid || st.st_gid != m->vmm_gid) &&
                    fchownat(dirfd(d), de->d_name, m->vmm_uid, m->vmm_gid, AT_SYMLINK_NOFOLLOW) < 0) {
                        r = -errno;
                        break;
                }
        }
        closedir(d);
        return r;
}
