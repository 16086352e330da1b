/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The models' hooks: see hooks.h. */
#include "branch.h"
#include "direct-listener.h"
#include "fork-op.h"
#include "hooks.h"
#include "operation.h"
#include "pause-op.h"
#include "paused.h"
#include "sandbox-dbus.h"
#include "sandbox-proc-dbus.h"

static void free_operations(Manager *m) {
        branch_free_all(m);
        while (m->operations)
                operation_free(m->operations);
}

static void free_paused(Manager *m) {
        while (hashmap_size(m->paused) > 0)
                paused_free(hashmap_first(m->paused));
}

static void sandbox_gone(Sandbox *s) {
        branch_sandbox_gone(s);
        proc_streams_sandbox_gone(s);
}

static int pause_on_deadline(Sandbox *s) {
        int r = operation_check_not_exiting(s->manager, NULL);

        return r < 0 ? r : paused_pause(s, NULL, NULL);
}

const ManagerHooks daemon_hooks = {
        .watch_snapshots = branch_watch_snapshots,
        .adopt_staging = branch_adopt_staging,
        .load_paused = paused_load_all,
        .free_operations = free_operations,
        .free_paused = free_paused,
        .sandbox_gone = sandbox_gone,
        .fork_child_exited = fork_op_child_exited,
        .fork_child_gone = fork_op_child_gone,
        .snapshot_is_forkds = snapshot_tag_is_forkds,
        .snapshot_released = paused_snapshot_gc,
        .pause = pause_on_deadline,
        .sandbox_removed = sandbox_send_removed_signal,
        .sandbox_state_changed = sandbox_send_state_changed,
        .close_direct = manager_close_direct,
};
