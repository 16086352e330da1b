/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* forkctl write-file and read-file: one file's contents in and out of a
 * sandbox (forkd's WriteFile and ReadFile, at most FILE_OP_MAX bytes).
 * Each returns 0, or minus forkctl's exit code after printing why. */

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

/* The contents come from the file local, or standard input when local is
 * NULL or "-". json: print {"path", "size"}. */
int forkctl_write_file(sd_bus *bus, const char *id, const char *path, const char *local, uint32_t mode, bool json);

/* The contents go to standard output as they are; json: {"path", "data_b64", "size"} instead. */
int forkctl_read_file(sd_bus *bus, const char *id, const char *path, bool json);

/* "644", "0644", "4755": octal, at most 07777. -EINVAL otherwise; *ret untouched. */
int parse_file_mode(const char *s, uint32_t *ret);
