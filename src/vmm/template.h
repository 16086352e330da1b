/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Serve fork requests for one snapshot on control_fd (SOCK_SEQPACKET) until
 * the controller hangs up. See template.c for the protocol. */
int template_serve(int kvm_fd, const char *snapshot_dir, int control_fd, const char *overlay_dir);
