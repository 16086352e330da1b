/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Branching a running VM (control op "branch"):
 *
 *   -> {"op":"branch","dir":"/abs/path","tag":"name","mode":"full"}
 *      with SCM_RIGHTS: one fd, the result channel (a SOCK_SEQPACKET socket
 *      or a pipe, write end)
 *   <- {"ok":true,"pause_us":N,"pid":P} as soon as the VM runs again
 *   on the result fd, later: {"ok":true,"dir":"..."} | {"ok":false,"error":"..."}
 *
 * The VM is paused only for this: the vCPU leaves KVM_RUN with any PIO/MMIO
 * exit completed (device emulation is synchronous, so no virtio request is in
 * flight then), the vCPU, irqchip, clock and device state are saved, the
 * disk's copy-on-write overlay is frozen into a read-only layer (the VM goes on
 * with a fresh overlay stacked on it), and the VMM fork(2)s. Guest RAM is a
 * MAP_PRIVATE mapping, so the copy (pid P) holds a copy-on-write image of it.
 * The VM resumes at once; the copy writes the snapshot directory atomically
 * (snapshot_write_collected(): "<dir>.tmp.<pid>", fsync, rename), reports on
 * the result fd and exits. It has no parent death signal: the snapshot is
 * finished even if the VM or its controller dies meanwhile.
 */

#include <stddef.h>

#include "run.h"

struct json_object;

/* Handle a "branch" request. *result_fd is taken (set to -EBADF) once the
 * copy exists. On success, fields for the reply are added to reply; on
 * failure msg says why and nothing was forked. */
int vmm_branch(struct vmm *vmm, struct vmm_host *host, struct json_object *req, int *result_fd,
               struct json_object *reply, char *msg, size_t msg_size);

/* Handle a "fork" request: the same pause, but the frozen copy becomes a
 * template (template.c) serving the SOCK_SEQPACKET socket passed with the
 * request (*tpl_fd, taken), with the VM as it stood at the pause as its
 * snapshot: children share its RAM copy-on-write and stack their own disk
 * overlay on its frozen layers. It ends, with its children, when that socket
 * is closed. Reply: {"ok":true,"pause_us":N,"pid":P}. */
int vmm_fork_template(struct vmm *vmm, struct vmm_host *host, struct json_object *req, int *tpl_fd,
                      struct json_object *reply, char *msg, size_t msg_size);
