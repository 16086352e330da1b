/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include "vmm.h"

/* Host-side endpoints of one running VM. */
struct vmm_host {
        int agent_listen_fd;   /* listening unix socket for the agent channel, or -1 */
        int control_listen_fd; /* listening SOCK_SEQPACKET control socket, or -1 */
        int control_fd;        /* connected SOCK_SEQPACKET control socket, or -1 */
        bool exit_on_control_eof;
        bool paused;
        const char *kernel;    /* recorded in snapshot metadata */
        int armed_console_fd;
};

int vmm_install_signals(void);
/* The thread that handles host events (the main one, vCPU 0's): where a signal
 * that asks for them must go (a SIGIO on an AP's thread only kicks that AP). */
pid_t vmm_event_tid(void);

/* Complete any in-flight PIO/MMIO exit (KVM_RUN with immediate_exit), so
 * that the saved register state is consistent. */
int vcpu_quiesce(struct vmm *vmm);

/* Run until the guest stops or the host asks. Returns 0 on a clean stop
 * (guest reset/power-off, SIGTERM, "shutdown"), -ECANCELED if the guest
 * crashed, -EIO on a VMM error. */
int vmm_run(struct vmm *vmm, struct vmm_host *host);

/* The exit status of a process whose VM stopped (forkd-vmm(8), EXIT STATUS):
 * 0 for a clean stop, VMM_EXIT_TRIPLE_FAULT or VMM_EXIT_HALTED when the guest
 * crashed, VMM_CHILD_EXIT_FAILED when the VMM failed. */
int vmm_exit_status(const struct vmm *vmm);
