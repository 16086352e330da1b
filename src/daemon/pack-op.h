/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* PackSnapshot and UnpackSnapshot on org.forkd.Manager: a snapshot chain into
 * one bundle on a caller's fd, and back (src/shared/pack.h). Both run in a
 * worker thread as an Operation. */

#include <systemd/sd-bus.h>

#include "image.h"
#include "manager.h"
#include "pack.h"

/* PackSnapshot(s tag, h fd) and UnpackSnapshot(h fd, s new_tag) after their
 * operation_prelude() (fd: the index of the message's descriptor); message is answered
 * when the operation ends. */
int pack_snapshot_start(Manager *m, sd_bus_message *message, const char *tag, int fd, sd_bus_error *error);
int unpack_snapshot_start(Manager *m, sd_bus_message *message, int fd, const char *new_tag, sd_bus_error *error);

/* Move the links of mf staged in staging/<tag> into the snapshots directory,
 * root first, owned by owner_uid, and load them into loaded[0..n_links); on
 * any failure put everything back as it was. The caller checked that no tag
 * is taken. Also PullSnapshot's. */
int pack_install_staged(Manager *m, const char *staging, const struct pack_manifest *mf, uid_t owner_uid,
                        Image **loaded);
