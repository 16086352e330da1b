/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* The hooks of the models (ManagerHooks, manager.h) into the layers above
 * them: the operations (branches, forks, pauses) and the bus faces. Only
 * forkd.c, which installs them, includes this. */

#include "manager.h"

extern const ManagerHooks daemon_hooks;
