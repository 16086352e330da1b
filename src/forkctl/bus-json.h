/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Turning D-Bus replies into json-c objects, so one code path serves both the
 * tables (which pick keys out of the object) and --json (which prints it). */

#include <json-c/json.h>
#include <systemd/sd-bus.h>

#include "json-util.h" /* _cleanup_json_ */

/* Reads one complete value of D-Bus signature sig (a single complete type) at the
 * current position of m. Variants and containers are converted recursively:
 * a{sv} and a{s*} become objects, other arrays and structs become arrays, b a
 * boolean, integers integers (t as uint64), d a double, s/o/g strings.
 * On success *ret holds a new reference; on failure *ret is untouched. */
int bus_message_read_json(sd_bus_message *m, const char *sig, struct json_object **ret);

/* Shorthands for the contract's dictionaries: a{sv} -> object, aa{sv} -> array. */
int bus_message_read_dict_json(sd_bus_message *m, struct json_object **ret);
int bus_message_read_dict_array_json(sd_bus_message *m, struct json_object **ret);
