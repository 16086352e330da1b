/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>

/* Longest network namespace name a spawn request may carry (under /run/netns). */
#define TEMPLATE_NETNS_NAME_MAX 64

/* Serve fork requests for one snapshot on control_fd (SOCK_SEQPACKET) until
 * the controller hangs up. See template.c for the protocol. */
/* rw_fds: the fds of the snapshot's rw volumes, in order (snapshot_set_rw_volumes()). */
int template_serve(int kvm_fd, const char *snapshot_dir, int control_fd, const char *overlay_dir, const int *rw_fds,
                   unsigned n_rw);

struct snapshot;
/* The same for a snapshot already in memory (a running VM's frozen copy,
 * branch.c): snap's state and disk files, guest RAM at mem (private). */
int template_serve_loaded(int kvm_fd, struct snapshot *snap, uint8_t *mem, int control_fd, const char *overlay_dir);

/* A name a child may join as /run/netns/<name>: 1 to TEMPLATE_NETNS_NAME_MAX
 * characters of [A-Za-z0-9_.-], not starting with '.', without "..". */
bool template_netns_name_is_valid(const char *name);
