/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Paused sandboxes: a sandbox whose VM is gone and whose state is a snapshot
 * of forkd's own. This is the record (its format, loading, deadlines and
 * forkd's snapshots' collection); pause-op.c runs the pause, resume and fork,
 * paused-dbus.c is their D-Bus face.
 *
 *   pause    a branch of the running sandbox (mode diff against the snapshot
 *            it came from; full for a copy of a running sandbox) into the
 *            snapshot paused.<id>.<unix time>; once it is registered, the
 *            record state_dir/paused/<id>.json (atomic, synced), then the VM
 *            is killed and the id lives on as a Paused; the reply comes once
 *            the VMM is gone
 *   resume   a fork of 1 of that snapshot under the same id; the record goes
 *            once the new VM's agent answered
 *   fork     a fork of that snapshot; the paused sandbox stays paused
 *   delete   TerminateSandbox: the record, then the snapshot when nothing
 *            needs it
 *
 * A kill of forkd at any point leaves either the record (paused, its
 * snapshot complete) or none (the sandbox was running and died with forkd);
 * paused_load_all() at the next start registers the records and removes
 * forkd's snapshots that nothing needs. Snapshots named paused.* are forkd's:
 * not listed, not forkable, not deletable by name, and no caller may pick
 * such a tag.
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <systemd/sd-bus.h>

#include "manager.h"

#define PAUSED_TAG_PREFIX "paused."
#define PAUSED_DIR "paused"

typedef struct Paused {
        Manager *manager;
        char *id;
        char *tag;          /* forkd's snapshot of the paused state */
        char *origin_tag;   /* the snapshot the sandbox came from, as its owner knows it */
        uid_t owner_uid;
        uint64_t created_at, paused_at; /* unix seconds */
        uint32_t memory_limit_mib;
        struct sandbox_limits limits; /* what it had running; a resume gets them again */
        int net_policy;     /* NetnsPolicy, or -1: no NIC */
        bool resuming;
        uint64_t pause_us;  /* how long the guest stood still for the pause (0: not known, after a restart) */
        /* Its deadline (CLOCK_REALTIME usec, 0: none), kept from when it ran or set
         * while paused: past it, on_timeout "kill" deletes it; "pause" has nothing left to do. */
        uint64_t expires_at;
        bool timeout_pause;
        sd_event_source *deadline_source;
} Paused;

/* A tag of forkd's own (PAUSED_TAG_PREFIX): callers may not name one. */
bool snapshot_tag_is_forkds(const char *tag);

/* At start, after the snapshots are loaded: registers every record of
 * state_dir/paused/ whose snapshot is there (a broken one is logged and
 * removed), then removes forkd's snapshots that nothing needs. */
int paused_load_all(Manager *m);
/* Unregisters and frees (the files stay). Accepts NULL, returns NULL. */
Paused *paused_free(Paused *p);

/* forkd's snapshot tag is not needed any more (no record, no sandbox forked
 * from it, no snapshot chained on it): delete it, and then its parent if that
 * is forkd's too. */
void paused_snapshot_gc(Manager *m, const char *tag);

/* A new deadline for p, recorded (synced) before it counts. */
int paused_set_deadline(Paused *p, uint64_t expires_at, bool pause);
/* Arm p's deadline as recorded (none with on_timeout "pause"). */
int paused_arm(Paused *p);

/* Write p's record state_dir/paused/<id>.json (atomic, synced). */
int paused_record_write(Paused *p);
/* Remove the record of id; sync: the directory too. */
int paused_record_remove(Manager *m, const char *id, bool sync);

/* Delete a paused sandbox (its record, its state if nothing else needs it),
 * announced with reason "terminated"; the caller checked the caller's rights
 * and that it is not being resumed. */
int paused_terminate(Paused *p);
