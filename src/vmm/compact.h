/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * forkd-vmm compact: a flat snapshot of a chain head (forkd's REST API v1 compact).
 * The head src is loaded with its chain (every parent_content_hash checked,
 * chain.h), and written as a snapshot with no parent: the whole memory
 * (sparse: zero pages stay holes), the vmstate as it is, and the disk with its
 * layers merged into one disk.img (hard-linked when it has no layers). It is
 * written into "<dirname(dst)>/.compact-staging-<tag>/", every file and the
 * directory fsynced, then renamed to dst (never over an existing one), so a
 * crash leaves no half-written dst; src and its chain are not touched.
 */

/* On failure *ret_error (if given) says what went wrong; -EEXIST: dst exists,
 * -ENOLINK / -ESTALE: the chain is broken (chain_load()). */
int compact_snapshot(const char *src, const char *dst, const char *tag, char **ret_error);
