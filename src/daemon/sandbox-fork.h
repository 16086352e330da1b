/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Forking a running sandbox into n children (ForkSandbox, Podflare's fork):
 * the sandbox's VMM pauses as for a branch and fork(2)s; the frozen copy
 * becomes a template (forkd-vmm "fork") holding the VM as it stood, and the
 * children are forked from it like any fork (fork-op.c), each answering its
 * agent before the reply. The parent runs on; the children share its memory
 * copy-on-write with it and with each other. The template goes once its last
 * child is gone.
 */

#include <systemd/sd-bus.h>

#define SANDBOX_FORK_N_MAX 32u

#include "manager.h"

struct fork_options;

/* Fork s into n children with topts's deadline, after the method's
 * operation_prelude(): message is answered with (aa{sv} sandboxes, t pause_us) when
 * they all answered. 1 when the fork is on its way, else an error in error. */
int sandbox_fork_start(Sandbox *s, sd_bus_message *message, unsigned n, const struct fork_options *topts,
                       sd_bus_error *error);
