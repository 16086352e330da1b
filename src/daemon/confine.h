/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "manager.h"

/* The state directory for confined VMMs (forkd-vmm(8), CONFINEMENT): the VMM
 * user may pass through state_dir (root:VMM-group, 0710) and owns snapshots/,
 * overlays/ and logs/, where it writes; sandboxes/ and the rest stay root's.
 * Then every VMM this forkd starts gets --confine and the state directory as
 * its one --jail-bind. Does nothing when m->confine is false. */
int confine_setup(Manager *m);

/* Hands a snapshot directory and its files to the VMM user, so that a
 * confined VMM may read them, and hard-link its disk into a branch: called
 * for every snapshot forkd registers, whoever wrote it (a VMM, forkd-vmm
 * compact, an unpack). */
int confine_adopt_snapshot(Manager *m, int dfd);
