/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <sys/types.h>

/* A user namespace for one confined VMM (forkd(8), VMM USERS; forkd's forks,
 * and bench/fork): owned by
 * owner, the uid of the template that forks the VMM, so that the template,
 * which holds no capability, may enter its child into it; uid and gid 0 in it
 * are id outside, and gid 1 is group (the template's, the VMMs' way through
 * the state directory). Returns an fd of it in *ret_fd (O_CLOEXEC). From any
 * thread; needs root. */
int vmm_userns_new(uid_t owner, uid_t id, gid_t group, int *ret_fd);
