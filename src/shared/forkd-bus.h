/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Names of forkd's D-Bus interface (dbus/org.forkd.Manager.xml), shared by
 * the daemon and its clients so that they cannot drift apart. */

#define FORKD_BUS_NAME "org.forkd.Manager"
#define FORKD_MANAGER_PATH "/org/forkd/Manager"
#define FORKD_MANAGER_INTERFACE "org.forkd.Manager"
#define FORKD_SNAPSHOT_PREFIX "/org/forkd/snapshot"
#define FORKD_SANDBOX_PREFIX "/org/forkd/sandbox"

#define FORKD_ERROR_NO_SUCH_SNAPSHOT "org.forkd.Error.NoSuchSnapshot"
#define FORKD_ERROR_NO_SUCH_SANDBOX "org.forkd.Error.NoSuchSandbox"
/* The sandbox is paused (or being paused): resume it first. */
#define FORKD_ERROR_PAUSED "org.forkd.Error.Paused"
/* A sandbox's deadline, timeout_secs: 1 s to a day. */
#define SANDBOX_TIMEOUT_SECS_MAX 86400u
/* ResumeSandbox of a sandbox that runs. */
#define FORKD_ERROR_NOT_PAUSED "org.forkd.Error.NotPaused"
#define FORKD_ERROR_SNAPSHOT_EXISTS "org.forkd.Error.SnapshotExists"
#define FORKD_ERROR_HAS_DEPENDENTS "org.forkd.Error.HasDependents"
#define FORKD_ERROR_CHAIN_BROKEN "org.forkd.Error.ChainBroken"
#define FORKD_ERROR_BUSY "org.forkd.Error.Busy"
/* An rw volume is held by another running sandbox, or n > 1 forks were asked of it. */
#define FORKD_ERROR_VOLUME_BUSY "org.forkd.Error.VolumeBusy"
#define FORKD_ERROR_NOT_SUPPORTED "org.forkd.Error.NotSupported"
#define FORKD_ERROR_GUEST_ERROR "org.forkd.Error.GuestError"
#define FORKD_ERROR_TIMEOUT "org.forkd.Error.Timeout"
#define FORKD_ERROR_FAILED "org.forkd.Error.Failed"
#define FORKD_ERROR_NOT_READY "org.forkd.Error.NotReady"
/* The sandbox has no NIC (its snapshot was made without network). */
#define FORKD_ERROR_NO_NETWORK "org.forkd.Error.NoNetwork"
/* WriteFile/ReadFile: what the guest said about the file (sandbox-files.c) */
#define FORKD_ERROR_NO_SUCH_FILE "org.forkd.Error.NoSuchFile"
#define FORKD_ERROR_NOT_REGULAR_FILE "org.forkd.Error.NotRegularFile"
#define FORKD_ERROR_FILE_TOO_LARGE "org.forkd.Error.FileTooLarge"
/* A process of a sandbox (StartProcess and the verbs after it) that its guest does not know, or that exited. */
#define FORKD_ERROR_NO_SUCH_PROCESS "org.forkd.Error.NoSuchProcess"
