/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Processes in a sandbox (the agent ops proc_start, proc_list, proc_signal,
 * proc_stdin, proc_resize and proc_read): the methods of org.forkd.Sandbox
 * and the Manager's that forward to them, and the output streams
 * (OpenOutputStream) that forkd feeds by long-polling the agent.
 */

#include <systemd/sd-bus.h>

#include "manager.h"

/* What forkd checks before anything reaches the guest (the agent checks again). */
#define PROC_ARGV_MAX 4096u
#define PROC_ARGV_BYTES_MAX (128u * 1024u)
#define PROC_ENV_MAX 1024u
#define PROC_ENV_BYTES_MAX (128u * 1024u)
#define PROC_PTY_MAX 1000u
#define PROC_READ_MAX (256u * 1024u)
#define PROC_STDIN_CHUNK_MAX (64u * 1024u)
#define PROC_TIMEOUT_SECS_MAX 86400u
#define PROC_STRING_MAX 4096u             /* cwd, user */
/* Output streams open at once (Busy beyond). */
#define PROC_STREAMS_PER_SANDBOX_MAX 16u /* each holds one of the sandbox's AGENT_CALLS_MAX calls */
#define PROC_STREAMS_MAX 1024u

/* The org.forkd.Sandbox methods of this file, registered beside sandbox_vtable
 * on the same interface (manager-dbus.c). */
extern const sd_bus_vtable sandbox_proc_vtable[];

/* The methods; the Manager's forward here with the looked-up sandbox. */
int bus_sandbox_method_start_process(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_list_processes(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_signal_process(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_write_stdin(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_resize_pty(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_read_output(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_open_output_stream(sd_bus_message *message, void *userdata, sd_bus_error *error);
int bus_sandbox_method_start_process_stream(sd_bus_message *message, void *userdata, sd_bus_error *error);

/* sandbox_free() (hooks.c): the streams of s stop, their sockets close. */
void proc_streams_sandbox_gone(Sandbox *s);
