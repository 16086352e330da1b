/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * What the verbs print: one JSON document with --json, else aligned tables
 * (table.c) and "Key: value" listings of the JSON objects bus-json.c makes of
 * forkd's replies, sizes and times made readable.
 */

#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>

#include "forkctl.h"
#include "json-util.h"
#include "table.h"

int print_json(struct json_object *j) {
        const char *s = json_object_to_json_string_ext(j, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
        if (!s)
                return -ENOMEM;
        puts(s);
        return 0;
}

const char *jstr(struct json_object *o, const char *key) {
        struct json_object *v;

        if (!json_object_object_get_ex(o, key, &v) || !v)
                return NULL;
        if (json_object_is_type(v, json_type_string))
                return json_object_get_string(v);
        return json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
}

static bool juint(struct json_object *o, const char *key, uint64_t *ret) {
        struct json_object *v;

        if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_int))
                return false;
        *ret = json_object_get_uint64(v);
        return true;
}

static const char *jbytes(struct json_object *o, const char *key, char *buf, size_t size) {
        uint64_t v;
        return juint(o, key, &v) ? format_bytes(buf, size, v) : NULL;
}

static const char *jtime(struct json_object *o, const char *key, char *buf, size_t size) {
        uint64_t v;
        return juint(o, key, &v) ? format_unix_time(buf, size, v) : NULL;
}

/* owner_uid as a user name where it has one, else the number. */
static const char *jowner(struct json_object *o, char *buf, size_t size) {
        struct passwd *pw;
        uint64_t v;

        if (!juint(o, "owner_uid", &v) || v > UINT32_MAX)
                return NULL;
        pw = getpwuid((uid_t) v);
        if (pw && pw->pw_name)
                snprintf(buf, size, "%s", pw->pw_name);
        else
                snprintf(buf, size, "%llu", (unsigned long long) v);
        return buf;
}

int print_snapshot_table(struct json_object *list) {
        static const char *const headers[] = { "TAG", "GUEST", "MEMORY", "DISK", "CREATED", "STATUS", "PARENT", "OWNER" };
        _cleanup_table_ struct table *t = table_new(ELEMENTSOF(headers), headers);
        size_t n = json_object_array_length(list);

        if (!t)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct json_object *s = json_object_array_get_idx(list, i);
                char mem[32], disk[32], created[64], owner[64];
                const char *cells[] = {
                        jstr(s, "tag"), jstr(s, "guest"),
                        jbytes(s, "mem_size", mem, sizeof mem), jbytes(s, "disk_size", disk, sizeof disk),
                        jtime(s, "created_at_unix", created, sizeof created), jstr(s, "status"),
                        jstr(s, "parent_tag"), jowner(s, owner, sizeof owner),
                };
                if (table_add_row(t, cells) < 0)
                        return -ENOMEM;
        }
        if (n == 0) {
                puts("No snapshots. Create one with 'forkctl snapshot create TAG --kernel K --rootfs R'.");
                return 0;
        }
        return table_print(t, stdout);
}

/* expires_at (RFC 3339, UTC) in local time as CREATED is shown, with the action:
 * "2026-05-20 10:08:46 (kill)"; "-" for none. */
const char *jexpires(struct json_object *o, char *buf, size_t size) {
        const char *at = jstr(o, "expires_at"), *action = jstr(o, "on_timeout");
        char when[64];
        uint64_t t;

        if (!at || !*at)
                return NULL;
        if (parse_rfc3339_utc(at, &t) < 0)
                snprintf(when, sizeof when, "%s", at); /* shown as forkd wrote it */
        else
                format_unix_time(when, sizeof when, t);
        snprintf(buf, size, "%s (%s)", when, action && *action ? action : "kill");
        return buf;
}

/* Its "usage": CPU seconds and memory (private+shared), or NULL each when it has none. */
static void usage_cells(struct json_object *s, char *cpu, size_t cpu_size, char *mem, size_t mem_size) {
        struct json_object *u;
        uint64_t v, p, sh;

        *cpu = *mem = 0;
        if (!json_object_object_get_ex(s, "usage", &u) || !json_object_is_type(u, json_type_object))
                return;
        if (juint(u, "cpu_usec", &v))
                snprintf(cpu, cpu_size, "%.1fs", (double) v / 1e6);
        if (juint(u, "memory_private_kib", &p) && juint(u, "memory_shared_kib", &sh)) {
                char a[32], b[32];

                snprintf(mem, mem_size, "%s+%s", format_bytes(a, sizeof a, p * 1024), format_bytes(b, sizeof b, sh * 1024));
        }
}

int print_sandbox_table(struct json_object *list, bool empty_hint) {
        static const char *const headers[] = { "ID", "SNAPSHOT", "STATE", "PID", "MEMLIMIT", "NETNS", "ADDRESS", "CREATED",
                                               "EXPIRES", "OWNER", "CPU", "MEM(PRIV+SHARED)" };
        _cleanup_table_ struct table *t = table_new(ELEMENTSOF(headers), headers);
        size_t n = json_object_array_length(list);

        if (!t)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct json_object *s = json_object_array_get_idx(list, i);
                char created[64], limit[32] = "", owner[64], expires[96], cpu[32], mem[80];
                uint64_t l, pid;

                if (juint(s, "memory_limit_mib", &l) && l > 0)
                        snprintf(limit, sizeof limit, "%lluM", (unsigned long long) l);
                usage_cells(s, cpu, sizeof cpu, mem, sizeof mem);
                const char *cells[] = {
                        jstr(s, "id"), jstr(s, "snapshot_tag"), jstr(s, "state"),
                        juint(s, "pid", &pid) && pid == 0 ? NULL : jstr(s, "pid"), /* a paused one has no VMM */
                        limit, jstr(s, "netns"), jstr(s, "guest_addr"),
                        jtime(s, "created_at_unix", created, sizeof created), jexpires(s, expires, sizeof expires),
                        jowner(s, owner, sizeof owner), cpu, mem,
                };
                if (table_add_row(t, cells) < 0)
                        return -ENOMEM;
        }
        if (n == 0) {
                if (empty_hint)
                        puts("No sandboxes. Fork some with 'forkctl fork TAG -n N'.");
                return 0;
        }
        return table_print(t, stdout);
}

/* Vertical "Key: value" listing: the known keys first, in order, then any others. */
int print_info(struct json_object *o, const char *const *keys) {
        size_t w = 0;

        {
                json_object_object_foreach(o, k, v) {
                        (void) v;
                        w = MAX(w, strlen(k));
                }
        }
        for (const char *const *k = keys; *k; k++) {
                struct json_object *v;
                char buf[64];
                const char *s;
                uint64_t u;

                if (!json_object_object_get_ex(o, *k, &v))
                        continue;
                if (json_object_is_type(v, json_type_array)) {
                        /* ancestors, dependents: their tags on one line */
                        size_t n = json_object_array_length(v);

                        printf("%*s: ", (int) w, *k);
                        for (size_t i = 0; i < n; i++) {
                                const char *e = json_object_get_string(json_object_array_get_idx(v, i));
                                printf("%s%s", i ? ", " : "", e ?: "?");
                        }
                        if (n == 0)
                                fputs("-", stdout);
                        else if (strcmp(*k, "ancestors") == 0)
                                fputs(" (root first, the parent last)", stdout);
                        else if (strcmp(*k, "dependents") == 0)
                                fputs(" (snapshot rm refuses: --cascade deletes them too, --force orphans them)", stdout);
                        putchar('\n');
                        continue;
                }
                if (strstr(*k, "_unix") && juint(o, *k, &u))
                        s = format_unix_time(buf, sizeof buf, u);
                else if ((strstr(*k, "_size") || strstr(*k, "_bytes")) && juint(o, *k, &u)) {
                        char b[32];
                        snprintf(buf, sizeof buf, "%s (%llu bytes)", format_bytes(b, sizeof b, u),
                                 (unsigned long long) u);
                        s = buf;
                } else
                        s = jstr(o, *k);
                printf("%*s: %s\n", (int) w, *k, s && *s ? s : "-");
        }
        {
                json_object_object_foreach(o, key, val) {
                        bool known = false;
                        (void) val;
                        for (const char *const *kk = keys; *kk; kk++)
                                if (strcmp(*kk, key) == 0)
                                        known = true;
                        if (!known)
                                printf("%*s: %s\n", (int) w, key, jstr(o, key) ?: "-");
                }
        }
        return 0;
}

const char *const snapshot_keys[] = {
        "tag", "status", "owner_uid", "guest", "network", "agent_tcp", "dir", "created_at_unix", "mem_size", "disk_size",
        "generation", "vcpus",
        "parent_tag", "branched_from", "pause_ms", "pause_us", "memory_logical_bytes", "memory_physical_bytes",
        "vmstate_bytes", "parent_content_hash", "chain_depth", "ancestors", "dependents", NULL,
};

int print_one_sandbox(struct json_object **info, bool json) {
        _cleanup_json_ struct json_object *list = NULL;

        if (json)
                return print_json(*info);
        list = json_object_new_array();
        if (!list || json_object_array_add(list, TAKE_PTR(*info)) < 0)
                return -1;
        return print_sandbox_table(list, false);
}
