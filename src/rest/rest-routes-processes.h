/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Processes in a sandbox (rest-routes-processes.c; the terminal's WebSocket
 * rest-proc-tty.c): forkd's REST API v1 over the Manager's process methods. */

#include <json-c/json.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

#include "rest-request.h"

#define REST_PROC_PID_MAX 4194304u
#define REST_PROC_READ_MAX (256u * 1024u)
/* The header of exec's "stream": true answer that names its process, so that a
 * client whose stream breaks off can follow it again from an offset. */
#define REST_PID_HEADER "Forkd-Process-Pid"

int rest_route_processes_start(RestRequest *req);
int rest_route_processes_list(RestRequest *req);
int rest_route_process_output(RestRequest *req);
int rest_route_process_stdin(RestRequest *req);
int rest_route_process_signal(RestRequest *req);
int rest_route_process_resize(RestRequest *req);
int rest_route_process_tty(RestRequest *req);

/* POST /v1/sandboxes/:id/exec with "stream": true: StartSandboxProcess of
 * args, then its output as GET .../output?follow=true answers it. */
int rest_proc_exec_stream(RestRequest *req, const char *id, struct json_object *args, uint32_t timeout_secs);

/* For the routes of both files. */
/* The sandbox id and the pid of the path: 1 when both are valid; else the
 * 400 is queued and this returns 0 (or the reply's negative errno). */
int rest_proc_path(RestRequest *req, const char **ret_id, uint32_t *ret_pid);
/* ?offset=N: 1 (*ret set, 0 when absent); else the 400 is queued. */
int rest_proc_query_offset(RestRequest *req, uint64_t *ret);
/* A D-Bus error of a process method: "sandbox not found" and "process not
 * found" for 404s, the others as every route answers them. */
int rest_proc_reply_bus_error(RestRequest *req, const sd_bus_error *e);
/* The output stream of an OpenSandboxOutputStream reply as a nonblocking fd of our own in
 * *ret_fd: 1; else the error answer is queued and this returns what queuing it did (<= 0). */
int rest_proc_take_stream(RestRequest *req, sd_bus_message *reply, int *ret_fd);
