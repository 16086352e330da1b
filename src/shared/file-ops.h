/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * Reading and writing one file in a sandbox (E2B's files.read/files.write):
 * the agent ops read_file and write_file (docs/agent-protocol.md), forkd's
 * ReadFile/WriteFile and forkd-rest's /files/read and /files/write share
 * these limits.
 *
 *   {"op": "write_file", "path": "/abs", "data_b64": "...", "mode": 420}
 *       -> {"path": "/abs", "size": N}
 *   {"op": "read_file", "path": "/abs"}
 *       -> {"path": "/abs", "data_b64": "...", "size": N}
 *
 * Paths follow hash_path_is_valid() (file-hashes.h): absolute, normalized, at
 * most 4095 bytes (PATH_MAX with its NUL), valid UTF-8 without control
 * characters. An agent's refusal that comes from the guest's file system is
 * an error frame with the symbolic errno beside the message:
 *   {"error": "/abs: No such file or directory", "errno": "ENOENT"}
 */

/* Bytes of file content in one call: base64 makes 699052 characters of it,
 * which fits the agent protocol's 1 MiB frame with room for the path. */
#define FILE_OP_MAX 524288u
#define FILE_OP_MODE_MAX 07777u
#define FILE_OP_MODE_DEFAULT 0644u

#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>

/* Check a guest's read_file answer (hostile input) and decode its data into
 * buf[FILE_OP_MAX]: data_b64 a string of canonical base64 of at most
 * FILE_OP_MAX bytes, size an integer equal to its length. -EBADMSG with
 * *ret_error saying why; *ret_len (and buf) untouched then. */
int file_read_answer_decode(struct json_object *answer, uint8_t *buf, size_t *ret_len, const char **ret_error);

/* Check a guest's write_file answer: size an integer equal to want. -EBADMSG
 * with *ret_error saying why. */
int file_write_answer_check(struct json_object *answer, uint64_t want, const char **ret_error);
