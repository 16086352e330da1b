/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd-test-guest: a small in-memory file table and variables, so that
 * run_code and hash_files (docs/agent-protocol.md) can be tested without
 * Linux. The state lives in guest RAM like everything else, so it survives a
 * snapshot and every fork inherits it, as a Linux guest's files and REPL
 * globals do.
 *
 * run_code takes a tiny language, one statement a line (or separated by ';'):
 *   write PATH TEXT   create or replace the file PATH holding TEXT (to the end
 *                     of the statement; may be empty)
 *   rm PATH           remove the file
 *   cat PATH          print the file's contents and a newline
 *   NAME = VALUE      set a variable (VALUE to the end of the statement)
 *   print NAME        print the variable's value and a newline
 * Anything else stops the run with an error, as an exception would.
 *
 * Everything here is in .bss after the console page, written only by these
 * ops: the hot path of an idle child does not touch it.
 */
#include "guest.h"
#include "base64.h"
#include "sha256.h"

#define GFILES_MAX      8
#define GFILE_PATH_MAX  48    /* a hash_files reply of 8 such paths fits the 1 KiB tx buffer */
#define GFILE_DATA_MAX  256
#define GVARS_MAX       8
#define GVAR_NAME_MAX   16
#define GVAR_VALUE_MAX  64
#define GCODE_MAX       2048
#define GOUT_MAX        512
#define HASH_PATHS_MAX  16
#define HASH_DIR_MAX    256   /* a requested path, with room to spare */
#define GB64_MAX        BASE64_ENCODED_SIZE(GFILE_DATA_MAX) /* 344 */
#define GMODE_MAX       07777
#define GMODE_DEFAULT   0644

struct gfile {
        u32 used;
        u32 path_len;
        u32 data_len;
        u32 mode;               /* as write_file set it (run_code's write: 0644); kept, not enforced */
        char path[GFILE_PATH_MAX];
        u8 data[GFILE_DATA_MAX];
};

struct gvar {
        u32 used;
        u32 name_len;
        u32 value_len;
        char name[GVAR_NAME_MAX];
        char value[GVAR_VALUE_MAX];
};

static struct {
        struct gfile files[GFILES_MAX];
        struct gvar vars[GVARS_MAX];
        u8 code[GCODE_MAX];
        u8 out[GOUT_MAX];
        u32 out_len;
        int out_truncated;
        const char *error;
        const u8 *error_arg;
        u32 error_arg_len;
        u8 msg[160];            /* error and its argument: 96 + 48 at most, and a newline */
        u8 dirs[HASH_PATHS_MAX][HASH_DIR_MAX];
        u8 fpath[HASH_DIR_MAX]; /* read_file / write_file: the path, decoded */
        u8 b64[GB64_MAX];       /* and the contents in base64 */
        u8 data[GFILE_DATA_MAX];
        u32 dir_len[HASH_PATHS_MAX];
        sha256_ctx sha;
} g;

/* ---- helpers ---- */

static int span_eq(const u8 *a, u32 na, const char *b, u32 nb)
{
        return na == nb && memcmp(a, b, na) == 0;
}

/*
 * Decode the JSON string at s[f->off..f->off+f->len) (quotes included) into
 * dst. Escapes: the two-character ones and \u00XX below 0x80. Returns the
 * length, or -1 (bad escape, too long).
 */
int json_str_decode(const u8 *s, const struct jfield *f, u8 *dst, u32 cap)
{
        u32 i = f->off + 1, end = f->off + f->len - 1, n = 0;

        if (f->type != J_STR || f->len < 2)
                return -1;
        while (i < end) {
                u8 c = s[i++];

                if (c == '\\') {
                        if (i >= end)
                                return -1;
                        c = s[i++];
                        switch (c) {
                        case 'n': c = '\n'; break;
                        case 't': c = '\t'; break;
                        case 'r': c = '\r'; break;
                        case 'b': c = '\b'; break;
                        case 'f': c = '\f'; break;
                        case '"': case '\\': case '/': break;
                        case 'u': {
                                u32 v = 0;

                                if (end - i < 4)
                                        return -1;
                                for (u32 k = 0; k < 4; k++) {
                                        u8 h = s[i++];

                                        v <<= 4;
                                        if (h >= '0' && h <= '9')
                                                v |= (u32)(h - '0');
                                        else if (h >= 'a' && h <= 'f')
                                                v |= (u32)(h - 'a' + 10);
                                        else if (h >= 'A' && h <= 'F')
                                                v |= (u32)(h - 'A' + 10);
                                        else
                                                return -1;
                                }
                                if (v >= 0x80)
                                        return -1;
                                c = (u8)v;
                                break;
                        }
                        default:
                                return -1;
                        }
                }
                if (n >= cap)
                        return -1;
                dst[n++] = c;
        }
        return (int)n;
}

/* A JSON string with the control characters, quote and backslash escaped. */
void out_json_str(struct out *o, const u8 *p, u32 n)
{
        out_s(o, "\"");
        for (u32 k = 0; k < n; k++) {
                u8 c = p[k];

                if (c == '"' || c == '\\') {
                        char e[2] = { '\\', (char)c };

                        out_raw(o, e, 2);
                } else if (c == '\n') {
                        out_s(o, "\\n");
                } else if (c < 0x20 || c == 0x7f) {
                        char e[6] = { '\\', 'u', '0', '0', "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15] };

                        out_raw(o, e, 6);
                } else {
                        out_raw(o, &c, 1);
                }
        }
        out_s(o, "\"");
}

/* An absolute path of printable ASCII without empty, "." or ".." components or a trailing '/'. */
static int path_valid(const u8 *p, u32 n, u32 max)
{
        u32 comp = 0;

        if (n == 0 || n >= max || p[0] != '/')
                return 0;
        if (n == 1)
                return 1;
        for (u32 k = 1; k <= n; k++) {
                if (k == n || p[k] == '/') {
                        u32 len = k - comp - 1;

                        if (len == 0 || (len == 1 && p[comp + 1] == '.') ||
                            (len == 2 && p[comp + 1] == '.' && p[comp + 2] == '.'))
                                return 0;
                        comp = k;
                        continue;
                }
                if (p[k] <= 0x20 || p[k] >= 0x7f || p[k] == '\\' || p[k] == '"')
                        return 0;
        }
        return 1;
}

/* The file is at or below the path. */
static int path_covers(const u8 *dir, u32 nd, const struct gfile *f)
{
        if (nd == 1)
                return 1; /* "/" */
        if (f->path_len < nd || memcmp(f->path, dir, nd) != 0)
                return 0;
        return f->path_len == nd || f->path[nd] == '/';
}

static struct gfile *file_find(const u8 *p, u32 n)
{
        for (u32 k = 0; k < GFILES_MAX; k++)
                if (g.files[k].used && span_eq(p, n, g.files[k].path, g.files[k].path_len))
                        return &g.files[k];
        return NULL;
}

static struct gvar *var_find(const u8 *p, u32 n)
{
        for (u32 k = 0; k < GVARS_MAX; k++)
                if (g.vars[k].used && span_eq(p, n, g.vars[k].name, g.vars[k].name_len))
                        return &g.vars[k];
        return NULL;
}

static void print(const void *p, u32 n)
{
        const u8 *s = p;

        for (u32 k = 0; k < n; k++) {
                if (g.out_len >= GOUT_MAX) {
                        g.out_truncated = 1;
                        return;
                }
                g.out[g.out_len++] = s[k];
        }
}

static int fail(const char *msg, const u8 *arg, u32 n)
{
        g.error = msg;
        g.error_arg = arg;
        g.error_arg_len = n > GFILE_PATH_MAX ? GFILE_PATH_MAX : n;
        return -1;
}

/* ---- run_code ---- */

static int is_space(u8 c)
{
        return c == ' ' || c == '\t' || c == '\r';
}

static int is_ident(u8 c, int first)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!first && c >= '0' && c <= '9');
}

/* The next word of s[*i..n): its start and length; *i past it and the spaces after it. */
static u32 word(const u8 *s, u32 n, u32 *i, u32 *start)
{
        u32 k = *i;

        *start = k;
        while (k < n && !is_space(s[k]))
                k++;
        *i = k;
        while (*i < n && is_space(s[*i]))
                (*i)++;
        return k - *start;
}

static int st_write(const u8 *s, u32 n, u32 i)
{
        u32 ps, pl = word(s, n, &i, &ps);
        struct gfile *f;

        if (!path_valid(s + ps, pl, GFILE_PATH_MAX))
                return fail("ValueError: invalid path (absolute, printable ASCII, at most 47 bytes): ", s + ps, pl);
        if (n - i > GFILE_DATA_MAX)
                return fail("ValueError: at most 256 bytes in a file: ", s + ps, pl);
        f = file_find(s + ps, pl);
        for (u32 k = 0; !f && k < GFILES_MAX; k++)
                if (!g.files[k].used) {
                        f = &g.files[k];
                        memcpy(f->path, s + ps, pl);
                        f->path_len = pl;
                        f->used = 1;
                }
        if (!f)
                return fail("OSError: the file table is full (8 files): ", s + ps, pl);
        memcpy(f->data, s + i, n - i);
        f->data_len = n - i;
        f->mode = GMODE_DEFAULT;
        return 0;
}

static int st_path_op(const u8 *s, u32 n, u32 i, int remove)
{
        u32 ps, pl = word(s, n, &i, &ps);
        struct gfile *f;

        if (i != n || !path_valid(s + ps, pl, GFILE_PATH_MAX))
                return fail("ValueError: invalid path: ", s + ps, pl);
        f = file_find(s + ps, pl);
        if (!f)
                return fail("FileNotFoundError: no such file: ", s + ps, pl);
        if (remove)
                f->used = 0;
        else {
                print(f->data, f->data_len);
                print("\n", 1);
        }
        return 0;
}

static int st_print(const u8 *s, u32 n, u32 i)
{
        u32 ns, nl = word(s, n, &i, &ns);
        struct gvar *v;

        if (i != n || nl == 0)
                return fail("SyntaxError: print takes one name", NULL, 0);
        v = var_find(s + ns, nl);
        if (!v)
                return fail("NameError: name is not defined: ", s + ns, nl);
        print(v->value, v->value_len);
        print("\n", 1);
        return 0;
}

static int st_assign(const u8 *s, u32 n, u32 name_len, u32 i)
{
        struct gvar *v;

        if (name_len >= GVAR_NAME_MAX || n - i >= GVAR_VALUE_MAX)
                return fail("ValueError: names of at most 15 and values of at most 63 bytes", NULL, 0);
        v = var_find(s, name_len);
        for (u32 k = 0; !v && k < GVARS_MAX; k++)
                if (!g.vars[k].used) {
                        v = &g.vars[k];
                        memcpy(v->name, s, name_len);
                        v->name_len = name_len;
                        v->used = 1;
                }
        if (!v)
                return fail("MemoryError: at most 8 variables", NULL, 0);
        memcpy(v->value, s + i, n - i);
        v->value_len = n - i;
        return 0;
}

/* s[0..n) as a decimal integer, nothing else. */
static int decimal(const u8 *s, u32 n, u64 *ret)
{
        u64 v = 0;

        if (n == 0 || n > 12)
                return -1;
        for (u32 k = 0; k < n; k++) {
                if (s[k] < '0' || s[k] > '9')
                        return -1;
                v = v * 10 + (u64)(s[k] - '0');
        }
        *ret = v;
        return 0;
}

/* "dirty N": write a word in each of the first N pages of the scratch area,
 * so that the host sees the VMM's private memory grow by N pages. */
static int st_dirty(const u8 *s, u32 n, u32 i)
{
        u64 pages;

        if (decimal(s + i, n - i, &pages) < 0 || pages > boot.scratch_pages)
                return fail("dirty: wants a page count within the scratch area", NULL, 0);
        for (u64 k = 0; k < pages; k++)
                *(volatile u32 *)(SCRATCH_BASE + k * PAGE_SIZE) = (u32)k ^ 0x5a5a5a5au;
        print("dirtied\n", 8);
        return 0;
}

/* One statement, trimmed of spaces on both ends. */
static int statement(const u8 *s, u32 n)
{
        u32 i = 0, ws, wl;

        wl = word(s, n, &i, &ws);
        if (span_eq(s, wl, "write", 5) && i > wl)
                return st_write(s, n, i);
        if (span_eq(s, wl, "rm", 2) && i > wl)
                return st_path_op(s, n, i, 1);
        if (span_eq(s, wl, "cat", 3) && i > wl)
                return st_path_op(s, n, i, 0);
        if (span_eq(s, wl, "print", 5) && i > wl)
                return st_print(s, n, i);
        if (span_eq(s, wl, "dirty", 5) && i > wl)
                return st_dirty(s, n, i);
        if (span_eq(s, wl, "hostile", 7) && i > wl) {
                if (hostile_parse(s + i, n - i) < 0)
                        return fail("hostile: unknown mode: ", s + i, n - i);
                print("hostile mode set\n", 17);
                return 0;
        }
        /* "disk_write N": N blocks of 4 KiB, from the disk's last one down
         * (wrapping), one request each: what disk_rate holds back. */
        if (span_eq(s, wl, "disk_write", 10) && i < n) {
                u64 count = 0;

                if (decimal(s + i, n - i, &count) < 0 || count == 0)
                        return fail("disk_write: N must be a positive integer", NULL, 0);
                if (!boot.have_blk || !boot.blk_blocks)
                        return fail("disk_write: no disk", NULL, 0);
                memset(blk_data, 0x5b, sizeof(blk_data));
                for (u64 k = 0; k < count; k++)
                        if (blk_rw(1, boot.blk_blocks - 1 - k % boot.blk_blocks, blk_data) < 0)
                                return fail("disk_write: the write failed", NULL, 0);
                print("disk written\n", 13);
                return 0;
        }
        /* "spin MS": keeps the vCPU busy for MS milliseconds of wall time (the
         * TSC's), for cpu_limit. */
        if (span_eq(s, wl, "spin", 4) && i < n) {
                u64 ms = 0, end;

                if (decimal(s + i, n - i, &ms) < 0 || ms > 3600000 || !boot.tsc_khz)
                        return fail("spin: MS must be an integer up to 3600000 (and the TSC known)", NULL, 0);
                end = rdtsc() + ms * boot.tsc_khz;
                while (rdtsc() < end)
                        __asm__ __volatile__("pause");
                print("spun\n", 5);
                return 0;
        }
        /* "old_agent": from now on proc_start refuses "read" as an unknown field, as an
         * agent from before it did (the tests of forkd's way around such an agent). */
        if (span_eq(s, wl, "old_agent", 9) && i == n) {
                procs_refuse_read();
                print("proc_start refuses read\n", 24);
                return 0;
        }
        /* "true": nothing (what commands.run("true") runs). */
        if (span_eq(s, wl, "true", 4) && i == n)
                return 0;
        /* "clock": the guest's wall clock in ns (from the last identity event), a line. */
        if (span_eq(s, wl, "clock", 5) && i == n) {
                u8 buf[24];
                struct out o = { .buf = buf, .cap = sizeof(buf) };

                out_u64(&o, wall_ns_now());
                print(buf, o.len);
                print("\n", 1);
                return 0;
        }
        /* "cpus": the vCPUs and each AP's counter, as the agent op "cpus" (smp.c). */
        if (span_eq(s, wl, "cpus", 4) && i == n) {
                static u8 buf[64 + 24 * SMP_MAX_CPUS];
                struct out o = { .buf = buf, .cap = sizeof(buf) };

                smp_out(&o);
                print(buf, o.len);
                print("\n", 1);
                return 0;
        }
        /* "disk_write": dirties the disk's last block, so that the VMM has a disk
         * overlay (a branch or a fork of the running sandbox then has a layer). */
        if (span_eq(s, wl, "disk_write", 10) && i == n) {
                if (!boot.have_blk || !boot.blk_blocks)
                        return fail("disk_write: no disk", NULL, 0);
                memset(blk_data, 0x5a, sizeof(blk_data));
                if (blk_rw(1, boot.blk_blocks - 1, blk_data) < 0)
                        return fail("disk_write: the write failed", NULL, 0);
                print("disk written\n", 13);
                return 0;
        }
        /* Asks the VMM for a syscall its seccomp filter forbids (JAIL_TEST_HOOK_PORT in
         * src/vmm/jail.h); only a VMM started with FORKD_VMM_TEST_HOOKS=1 obeys. */
        if (span_eq(s, wl, "forbidden_call", 14)) {
                /* "forbidden_call": a syscall in no allow-list; "forbidden_call setresuid"
                 * and "forbidden_call prctl": calls a root VMM would make, which no
                 * confined VMM may (JAIL_TEST_* in src/vmm/jail.h). */
                u8 what = 1;

                if (span_eq(s + i, n - i, "setresuid", 9))
                        what = 2;
                else if (span_eq(s + i, n - i, "prctl", 5))
                        what = 3;
                else if (i < n)
                        return fail("forbidden_call: unknown call: ", s + i, n - i);
                u_outb(0x5fe, what);
                return 0;
        }
        /* NAME = VALUE */
        i = 0;
        while (i < n && is_ident(s[i], i == 0))
                i++;
        if (i > 0) {
                u32 name_len = i;

                while (i < n && is_space(s[i]))
                        i++;
                if (i < n && s[i] == '=') {
                        i++;
                        while (i < n && is_space(s[i]))
                                i++;
                        return st_assign(s, n, name_len, i);
                }
        }
        return fail("SyntaxError: not a statement of the test guest: ", s, n > 40 ? 40 : n);
}

static void run(const u8 *code, u32 n)
{
        u32 start = 0;

        for (u32 k = 0; k <= n; k++) {
                u32 a, b;

                if (k < n && code[k] != '\n' && code[k] != ';')
                        continue;
                a = start;
                b = k;
                start = k + 1;
                while (a < b && is_space(code[a]))
                        a++;
                while (b > a && is_space(code[b - 1]))
                        b--;
                if (a < b && statement(code + a, b - a) < 0)
                        return;
        }
}

static void run_and_reply(u32 id, u32 len);

/* The error line of the last run ("<message><argument>\n") into g.msg: its length. */
static u32 error_line(void)
{
        u32 l = (u32)strlen(g.error);

        memcpy(g.msg, g.error, l);
        memcpy(g.msg + l, g.error_arg, g.error_arg_len);
        l += g.error_arg_len;
        g.msg[l] = '\n';
        return l + 1;
}

int script_run(const u8 *code, u32 len, const u8 **out, u32 *out_len, const u8 **err, u32 *err_len)
{
        if (len > GCODE_MAX)
                return -1;
        memmove(g.code, code, len);
        g.out_len = 0;
        g.out_truncated = 0;
        g.error = NULL;
        run(g.code, len);
        *out = g.out;
        *out_len = g.out_len;
        *err = g.msg;
        *err_len = g.error ? error_line() : 0;
        return g.error ? 1 : 0;
}

void op_run_code(u32 id, const u8 *p, u32 n)
{
        struct jfield f[2] = { { .key = "code" }, { .key = "timeout_secs" } };
        u64 timeout;
        int len;

        (void)json_fields(p, n, f, 2);
        if (f[1].type != J_NONE && json_u64(p, &f[1], &timeout) < 0) {
                agent_reply_error(id, "bad argument 'timeout_secs'");
                return;
        }
        len = json_str_decode(p, &f[0], g.code, GCODE_MAX);
        if (len < 0) {
                agent_reply_error(id, "bad argument 'code': a string of at most 2048 bytes");
                return;
        }
        run_and_reply(id, (u32)len);
}

/* exec of ["sh" or "/bin/sh", "-c", CODE] runs CODE as run_code does (so that forkctl
 * snapshot diff runs here); any other command is not supported. */
void op_exec(u32 id, const u8 *p, u32 n)
{
        struct jfield f = { .key = "args" };
        u32 i, end, k = 0;
        int len = -1;

        (void)json_fields(p, n, &f, 1);
        if (f.type != J_ARR) {
                agent_reply_error(id, "not supported by the test guest");
                return;
        }
        i = f.off + 1;
        end = f.off + f.len - 1;
        for (;;) {
                struct jfield e = { .type = J_STR };
                int ok;

                while (i < end && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r' || p[i] == ','))
                        i++;
                if (i >= end)
                        break;
                if (p[i] != '"' || k >= 3) {
                        agent_reply_error(id, "not supported by the test guest");
                        return;
                }
                e.off = i++;
                while (i < end && p[i] != '"')
                        i += p[i] == '\\' ? 2 : 1;
                e.len = ++i - e.off;
                if (k == 0) {
                        /* decoded: the host may send "\/bin\/sh" */
                        int l = json_str_decode(p, &e, g.data, 8);

                        ok = (l == 2 && memcmp(g.data, "sh", 2) == 0) || (l == 7 && memcmp(g.data, "/bin/sh", 7) == 0);
                }
                else if (k == 1)
                        ok = json_str_eq(p, &e, "-c");
                else
                        ok = (len = json_str_decode(p, &e, g.code, GCODE_MAX)) >= 0;
                if (!ok) {
                        agent_reply_error(id, "not supported by the test guest");
                        return;
                }
                k++;
        }
        if (k != 3 || len < 0) {
                agent_reply_error(id, "not supported by the test guest");
                return;
        }
        run_and_reply(id, (u32)len);
}

static void run_and_reply(u32 id, u32 len)
{
        struct out o;

        g.out_len = 0;
        g.out_truncated = 0;
        g.error = NULL;
        run(g.code, len);

        o = agent_reply_begin();
        out_s(&o, "{\"stdout\":");
        out_json_str(&o, g.out, g.out_len);
        if (g.error) {
                u32 l = error_line();

                out_s(&o, ",\"stderr\":");
                out_json_str(&o, g.msg, l);
                out_s(&o, ",\"error\":");
                out_json_str(&o, g.msg, l - 1);
                out_s(&o, ",\"exit_code\":1");
        } else {
                out_s(&o, ",\"stderr\":\"\",\"error\":null,\"exit_code\":0");
        }
        out_s(&o, ",\"truncated\":");
        out_s(&o, g.out_truncated ? "true" : "false");
        out_s(&o, ",\"timed_out\":false}");
        agent_reply(id, &o);
}

/* ---- hash_files ---- */

void op_hash_files(u32 id, const u8 *p, u32 n)
{
        struct jfield f = { .key = "paths" };
        u32 ndirs = 0, i, end;
        struct out o;
        int first = 1;

        (void)json_fields(p, n, &f, 1);
        if (f.type != J_ARR) {
                agent_reply_error(id, "bad argument 'paths': an array of absolute paths");
                return;
        }
        /* The array is well-formed (json_fields checked it): strings only, decoded. */
        i = f.off + 1;
        end = f.off + f.len - 1;
        for (;;) {
                struct jfield e = { .type = J_STR };
                int len;

                while (i < end && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r' || p[i] == ','))
                        i++;
                if (i >= end)
                        break;
                if (p[i] != '"' || ndirs >= HASH_PATHS_MAX) {
                        agent_reply_error(id, "bad argument 'paths': at most 16 strings");
                        return;
                }
                e.off = i++;
                while (i < end && p[i] != '"')
                        i += p[i] == '\\' ? 2 : 1;
                e.len = ++i - e.off;
                len = json_str_decode(p, &e, g.dirs[ndirs], HASH_DIR_MAX - 1);
                if (len < 0 || !path_valid(g.dirs[ndirs], (u32)len, HASH_DIR_MAX)) {
                        agent_reply_error(id, "bad argument 'paths': an invalid path (or longer than 255 bytes)");
                        return;
                }
                g.dir_len[ndirs++] = (u32)len;
        }

        o = agent_reply_begin();
        out_s(&o, "{\"files\":{");
        for (u32 k = 0; k < GFILES_MAX; k++) {
                const struct gfile *gf = &g.files[k];
                u8 digest[SHA256_DIGEST_SIZE];
                char hex[SHA256_HEX_SIZE];
                int covered = 0;

                if (!gf->used)
                        continue;
                for (u32 d = 0; d < ndirs && !covered; d++)
                        covered = path_covers(g.dirs[d], g.dir_len[d], gf);
                if (!covered)
                        continue;
                sha256_init(&g.sha);
                sha256_update(&g.sha, gf->data, gf->data_len);
                sha256_final(&g.sha, digest);
                sha256_hex(digest, hex);
                if (!first)
                        out_s(&o, ",");
                first = 0;
                out_json_str(&o, (const u8 *)gf->path, gf->path_len);
                out_s(&o, ":\"");
                out_s(&o, hex);
                out_s(&o, "\"");
        }
        out_s(&o, "}}");
        agent_reply(id, &o);
}

/* ---- read_file / write_file ----
 *
 * The file table's view of docs/agent-protocol.md's ops: directories are
 * implicit (a path is a directory when a file lies under it, and "/" always
 * is), so a write needs no parent to exist, only none of its ancestors to be
 * a file. The limits are the table's: paths of at most 47 bytes
 * (ENAMETOOLONG), 256 bytes of data (EFBIG: also a data_b64 longer than the
 * 344 characters that 256 bytes make), 8 files (ENOSPC). A request over the
 * 16 KiB frame limit is refused before it gets here (EMSGSIZE, agent.c).
 */

static void reply_errno(u32 id, const char *ename, const char *why, const u8 *path, u32 n)
{
        struct out o = agent_reply_begin();

        out_s(&o, "{\"error\":\"");
        if (path) {
                out_raw(&o, path, n); /* path_valid(): printable ASCII without '"' or '\\' */
                out_s(&o, ": ");
        }
        out_s(&o, why);
        out_s(&o, "\",\"errno\":\"");
        out_s(&o, ename);
        out_s(&o, "\"}");
        if (o.overflow) {
                agent_reply_error(id, why);
                return;
        }
        tx_commit(AGENT_T_ERROR, id, o.len);
}

/* The path argument, decoded into g.fpath and checked: its length, or -1 (answered). */
static int file_path_arg(u32 id, const u8 *p, const struct jfield *f)
{
        int len;

        if (f->type != J_STR) {
                agent_reply_error(id, "bad argument 'path': a string");
                return -1;
        }
        len = json_str_decode(p, f, g.fpath, HASH_DIR_MAX);
        if (len < 0 && f->len > HASH_DIR_MAX) {
                reply_errno(id, "ENAMETOOLONG", "File name too long (the test guest keeps paths of at most 47 bytes)",
                            NULL, 0);
                return -1;
        }
        if (len < 0 || !path_valid(g.fpath, (u32)len, HASH_DIR_MAX)) {
                agent_reply_error(id, "bad argument 'path': not an absolute, normalized path of printable ASCII");
                return -1;
        }
        if ((u32)len >= GFILE_PATH_MAX) {
                reply_errno(id, "ENAMETOOLONG", "File name too long (the test guest keeps paths of at most 47 bytes)",
                            g.fpath, (u32)len);
                return -1;
        }
        return len;
}

/* 0, or the errno name of what the table says about the path as a file. */
static const char *file_kind_error(const u8 *path, u32 n)
{
        if (n == 1)
                return "EISDIR"; /* "/" */
        for (u32 k = 0; k < GFILES_MAX; k++) {
                const struct gfile *f = &g.files[k];

                if (!f->used)
                        continue;
                /* a file under the path: the path is a directory */
                if (f->path_len > n && memcmp(f->path, path, n) == 0 && f->path[n] == '/')
                        return "EISDIR";
                /* a file above it: an ancestor is not a directory */
                if (f->path_len < n && memcmp(f->path, path, f->path_len) == 0 && path[f->path_len] == '/')
                        return "ENOTDIR";
        }
        return 0;
}

static const char *errno_why(const char *ename)
{
        if (ename[3] == 'D')
                return "Is a directory";   /* EISDIR */
        return "Not a directory";          /* ENOTDIR */
}

void op_write_file(u32 id, const u8 *p, u32 n)
{
        struct jfield f[3] = { { .key = "path" }, { .key = "data_b64" }, { .key = "mode" } };
        u64 mode = GMODE_DEFAULT;
        size_t size;
        const char *kind;
        struct gfile *gf;
        struct out o;
        int len, blen;

        (void)json_fields(p, n, f, 3);
        if (f[2].type != J_NONE && (json_u64(p, &f[2], &mode) < 0 || mode > GMODE_MAX)) {
                agent_reply_error(id, "bad argument 'mode': must be 0 .. 07777");
                return;
        }
        if (f[1].type != J_STR) {
                agent_reply_error(id, "bad argument 'data_b64': a string");
                return;
        }
        len = file_path_arg(id, p, &f[0]);
        if (len < 0)
                return;
        blen = json_str_decode(p, &f[1], g.b64, GB64_MAX);
        if (blen < 0 && f[1].len > GB64_MAX + 2) {
                reply_errno(id, "EFBIG", "File too large (the test guest keeps at most 256 bytes a file)", g.fpath,
                            (u32)len);
                return;
        }
        if (blen < 0 || base64_decoded_size((const char *)g.b64, (size_t)blen, &size) < 0) {
                agent_reply_error(id, "bad argument 'data_b64': not base64 (RFC 4648, padded, no whitespace)");
                return;
        }
        if (size > GFILE_DATA_MAX ||
            base64_decode((const char *)g.b64, (size_t)blen, g.data, GFILE_DATA_MAX, &size) < 0) {
                reply_errno(id, "EFBIG", "File too large (the test guest keeps at most 256 bytes a file)", g.fpath,
                            (u32)len);
                return;
        }
        kind = file_kind_error(g.fpath, (u32)len);
        if (kind) {
                reply_errno(id, kind, errno_why(kind), g.fpath, (u32)len);
                return;
        }
        gf = file_find(g.fpath, (u32)len);
        for (u32 k = 0; !gf && k < GFILES_MAX; k++)
                if (!g.files[k].used) {
                        gf = &g.files[k];
                        memcpy(gf->path, g.fpath, (u32)len);
                        gf->path_len = (u32)len;
                        gf->used = 1;
                }
        if (!gf) {
                reply_errno(id, "ENOSPC", "No space left on device (the test guest keeps at most 8 files)", g.fpath,
                            (u32)len);
                return;
        }
        memcpy(gf->data, g.data, size);
        gf->data_len = (u32)size;
        gf->mode = (u32)mode;

        o = agent_reply_begin();
        out_s(&o, "{\"path\":");
        out_json_str(&o, g.fpath, (u32)len);
        out_s(&o, ",\"size\":");
        out_u64(&o, size);
        out_s(&o, "}");
        agent_reply(id, &o);
}

void op_read_file(u32 id, const u8 *p, u32 n)
{
        struct jfield f = { .key = "path" };
        const struct gfile *gf;
        const char *kind;
        struct out o;
        size_t blen;
        int len;

        (void)json_fields(p, n, &f, 1);
        len = file_path_arg(id, p, &f);
        if (len < 0)
                return;
        gf = file_find(g.fpath, (u32)len);
        if (!gf) {
                kind = file_kind_error(g.fpath, (u32)len);
                if (kind)
                        reply_errno(id, kind, errno_why(kind), g.fpath, (u32)len);
                else
                        reply_errno(id, "ENOENT", "No such file or directory", g.fpath, (u32)len);
                return;
        }
        blen = base64_encode(gf->data, gf->data_len, (char *)g.b64);

        o = agent_reply_begin();
        out_s(&o, "{\"path\":");
        out_json_str(&o, g.fpath, (u32)len);
        out_s(&o, ",\"data_b64\":\"");
        out_raw(&o, g.b64, (u32)blen);
        out_s(&o, "\",\"size\":");
        out_u64(&o, gf->data_len);
        out_s(&o, "}");
        agent_reply(id, &o);
}
