/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd-test-guest: background processes (docs/agent-protocol.md, "Processes").
 * There is no operating system here, so a process is one of a few built-in
 * programs that the idle loop runs a step at a time; what they print goes into
 * an output log per process with byte offsets, read with proc_read (a long poll
 * while nothing is new), as the Linux agents' are. The table is in guest
 * memory: a fork's child has the same processes and unread output.
 *
 * Programs: args[0] (its last path component), or the first word of `cmd` and
 * of ["sh" or "/bin/sh", "-c", CODE]:
 *   true              exits 0
 *   echo WORDS...     prints the words and a newline, exits 0
 *   ticker N MS       prints "<wall clock ns> <i>\n" for i = 0..N-1, MS ms apart
 *                     (the first at once; N 0: until it is signalled), exits 0
 *   flood BYTES       prints BYTES bytes of 'x', 64 KiB a turn of the loop, exits 0
 *                     (a reader slower than that meets a gap)
 *   pipe BYTES        the same, but never more than its log's size ahead of the
 *                     furthest byte a read took: a writer into a pipe that waits for
 *                     its reader, so that nothing is dropped
 *   cat               prints what its stdin brings, exits 0 at stdin's eof
 *   sleep MS          exits 0 after MS ms
 * Any other CODE is a run_code script (files.c), run at once: its output on
 * stdout, its error on stderr, exit status 1 on an error. Any other program is
 * ENOENT. Signals kill (the signal is reported), but for SIGCHLD, SIGCONT,
 * SIGURG and SIGWINCH, which are ignored; there are no terminals (`pty` is
 * EOPNOTSUPP, proc_resize ENOTTY).
 *
 * Limits: TPROC_MAX processes, a log of TPROC_RING bytes each, TPROC_PENDING_MAX
 * reads waiting, TPROC_READ_MAX bytes a read (one chunk, cut at the log's wrap),
 * and what the guest's 16 KiB request frames carry (proc_stdin, args).
 *
 * Everything here is in .bss outside the hot page and written only by these
 * ops: an idle child with no process never touches it.
 */
#include "guest.h"
#include "base64.h"

#define TPROC_MAX         16
#define TPROC_RING        (256u << 10)
#define TPROC_ARGS_MAX    512     /* the args as JSON text, for proc_list */
#define TPROC_PENDING_MAX 32
#define TPROC_READ_MAX    (64u << 10)
#define TPROC_FLOOD_STEP  (64u << 10)
#define TPROC_WORDS_MAX   8
#define TPROC_KEEP_MS     600000ull /* an exited entry: 10 minutes */
#define TPROC_CODE_MAX    2048
#define TPROC_WAIT_MS_MAX 60000ull
#define TPROC_TX_SIZE     (AGENT_HDR_SIZE + BASE64_ENCODED_SIZE(TPROC_READ_MAX) + 512)

enum { P_FREE = 0, P_TRUE, P_ECHO, P_TICKER, P_FLOOD, P_PIPE, P_CAT, P_SLEEP, P_SCRIPT };

struct tproc {
        u32 pid;               /* 0: a free slot */
        u32 prog;
        int running;
        int stdin_open;
        int exit_code;         /* -1: none (running, or killed by a signal) */
        int signal;            /* 0: none */
        u64 n, ms;             /* ticker: lines (0: forever) and interval; flood: bytes; sleep: ms */
        u64 done;              /* ticker: lines printed; flood: bytes printed */
        u64 next_ms;           /* ticker: the next line; sleep: its end */
        u64 deadline_ms;       /* timeout_secs: the SIGKILL; 0: none */
        u64 exited_ms;
        u64 started_ns;
        u64 end;               /* bytes printed in all: the log's end offset */
        u64 stderr_from;       /* bytes from here on are stderr; ~0: none */
        u64 read_to;           /* the furthest next_offset a read answered */
        u32 args_len;
        u8 args[TPROC_ARGS_MAX];
};

struct pending_read {
        u32 id, pid;
        u64 offset, max, deadline_ms;
        u32 start; /* a proc_start's "read": answered with the pid, once the process is done */
};

struct word {
        const u8 *p;
        u32 n;
};

static struct {
        struct tproc p[TPROC_MAX];
        struct tproc scratch;           /* a new entry, until it is known to start */
        struct pending_read pend[TPROC_PENDING_MAX];
        u32 n_pend;
        u32 next_pid;
        u32 refuse_read;                /* run_code's old_agent: proc_start as before "read" */
        u8 code[TPROC_CODE_MAX];        /* cmd, CODE, or one args string, decoded */
        u8 argbuf[TPROC_CODE_MAX];      /* args[1..] decoded, one after another */
        struct word words[TPROC_WORDS_MAX];
        u32 n_words;
        u8 stdin_data[PAYLOAD_MAX];     /* a proc_stdin's bytes, decoded */
        u8 line[48];
        u8 tx[TPROC_TX_SIZE] __attribute__((aligned(16)));
} tp;

/* Each entry's output log, apart: tp stays small enough to copy entries in. */
static u8 rings[TPROC_MAX][TPROC_RING];

static u8 *ring(const struct tproc *t)
{
        return rings[t - tp.p];
}

static u64 now_ms(void)
{
        u64 khz = boot.tsc_khz ? boot.tsc_khz : 1000000;

        return rdtsc() / khz;
}

static void live_count(void)
{
        u32 n = tp.n_pend;

        for (u32 i = 0; i < TPROC_MAX; i++)
                n += tp.p[i].pid && tp.p[i].running;
        hot.procs_live = n;
}

static struct tproc *find(u64 pid)
{
        for (u32 i = 0; i < TPROC_MAX; i++)
                if (tp.p[i].pid && tp.p[i].pid == pid)
                        return &tp.p[i];
        return NULL;
}

/* ---- the log ---- */

static void emit(struct tproc *t, const u8 *d, u64 n)
{
        u64 pos;
        u32 at, first;

        if (n > TPROC_RING) {
                t->end += n - TPROC_RING; /* what would scroll out at once */
                d += n - TPROC_RING;
                n = TPROC_RING;
        }
        pos = t->end;
        at = (u32)(pos % TPROC_RING);
        first = TPROC_RING - at < n ? TPROC_RING - at : (u32)n;
        memcpy(ring(t) + at, d, first);
        if (n > first)
                memcpy(ring(t), d + first, (u32)n - first);
        t->end += n;
}

static void emit_fill(struct tproc *t, u8 c, u64 n)
{
        while (n) {
                u32 at = (u32)(t->end % TPROC_RING), k = TPROC_RING - at;

                if (k > n)
                        k = (u32)n;
                memset(ring(t) + at, c, k);
                t->end += k;
                n -= k;
        }
}

static u64 first_kept(const struct tproc *t)
{
        return t->end > TPROC_RING ? t->end - TPROC_RING : 0;
}

static void exit_with(struct tproc *t, int code, int sig)
{
        t->running = 0;
        t->stdin_open = 0;
        t->exit_code = sig ? -1 : code;
        t->signal = sig;
        t->exited_ms = now_ms();
}

/* ---- replies ---- */

static void reply_errno(u32 id, const char *msg, const char *ename)
{
        agent_reply_error_errno(id, msg, ename);
}

static void out_int_or_null(struct out *o, int have, u64 v)
{
        if (have)
                out_u64(o, v);
        else
                out_s(o, "null");
}

/* Answers a read of t at offset (checked: at most t->end); start: a proc_start's,
 * {"pid", "read": {...}}. */
static void answer_read(u32 id, struct tproc *t, u64 offset, u64 max, int started)
{
        struct out o = { .buf = tp.tx + AGENT_HDR_SIZE, .cap = TPROC_TX_SIZE - AGENT_HDR_SIZE };
        u64 start = offset, take, gap = 0;
        int is_stderr;

        tx_begin(); /* the transmit queue free: tp.tx is not in flight */
        if (start < first_kept(t)) {
                gap = first_kept(t) - start;
                start = first_kept(t);
        }
        take = t->end - start;
        if (take > max)
                take = max;
        if (take > TPROC_READ_MAX)
                take = TPROC_READ_MAX;
        if (take > TPROC_RING - start % TPROC_RING)
                take = TPROC_RING - start % TPROC_RING; /* one chunk: up to the wrap */
        is_stderr = start >= t->stderr_from;
        if (!is_stderr && start + take > t->stderr_from)
                take = t->stderr_from - start; /* one stream a chunk */
        if (started) {
                out_s(&o, "{\"pid\":");
                out_u64(&o, t->pid);
                out_s(&o, ",\"read\":");
        }
        out_s(&o, "{\"chunks\":[");
        if (take) {
                out_s(&o, "{\"stream\":\"");
                out_s(&o, is_stderr ? "stderr" : "stdout");
                out_s(&o, "\",\"offset\":");
                out_u64(&o, start);
                out_s(&o, ",\"data_b64\":\"");
                if (o.len + BASE64_ENCODED_SIZE(take) + 2 <= o.cap) {
                        base64_encode(ring(t) + start % TPROC_RING, (size_t)take, (char *)o.buf + o.len);
                        o.len += (u32)BASE64_ENCODED_SIZE(take);
                } else {
                        o.overflow = 1;
                }
                out_s(&o, "\"}");
        }
        out_s(&o, "],\"next_offset\":");
        out_u64(&o, start + take);
        if (start + take > t->read_to)
                t->read_to = start + take;
        out_s(&o, ",\"gap\":");
        out_u64(&o, gap);
        out_s(&o, ",\"exited\":");
        out_s(&o, t->running ? "false" : "true");
        out_s(&o, ",\"exit_code\":");
        out_int_or_null(&o, !t->running && t->exit_code >= 0, (u64)t->exit_code);
        out_s(&o, ",\"signal\":");
        out_int_or_null(&o, t->signal != 0, (u64)t->signal);
        out_s(&o, ",\"end\":");
        out_s(&o, !t->running && start + take == t->end ? "true" : "false");
        out_s(&o, started ? "}}" : "}");
        if (o.overflow) {
                agent_reply_error(id, "reply too large");
                return;
        }
        tx_commit_buf(tp.tx, AGENT_T_RESPONSE, id, o.len);
}

/* ---- programs ---- */

static int parse_u64(const u8 *s, u32 n, u64 *ret)
{
        u64 v = 0;

        if (n == 0 || n > 19)
                return -1;
        for (u32 k = 0; k < n; k++) {
                if (s[k] < '0' || s[k] > '9')
                        return -1;
                v = v * 10 + (u64)(s[k] - '0');
        }
        *ret = v;
        return 0;
}

static int span_is(const struct word *w, const char *lit)
{
        u32 n = (u32)strlen(lit);

        return w->n == n && memcmp(w->p, lit, n) == 0;
}

/* Splits s[0..n) at spaces into tp.words: -1 when there are too many. */
static int split_words(const u8 *s, u32 n)
{
        tp.n_words = 0;
        for (u32 i = 0; i < n;) {
                u32 a;

                while (i < n && (s[i] == ' ' || s[i] == '\t'))
                        i++;
                if (i >= n)
                        break;
                a = i;
                while (i < n && s[i] != ' ' && s[i] != '\t')
                        i++;
                if (tp.n_words >= TPROC_WORDS_MAX)
                        return -1;
                tp.words[tp.n_words++] = (struct word) { s + a, i - a };
        }
        return 0;
}

/* The program of tp.words (the first its name): 0, or an errno name. */
static const char *program(struct tproc *t)
{
        const struct word *w = tp.words;
        u32 nw = tp.n_words;

        if (nw == 0)
                return "EINVAL";
        /* the last path component: "/bin/true" is "true" */
        for (u32 k = w[0].n; k > 0; k--)
                if (w[0].p[k - 1] == '/') {
                        tp.words[0].p += k;
                        tp.words[0].n -= k;
                        break;
                }
        if (span_is(w, "true") && nw == 1)
                t->prog = P_TRUE;
        else if (span_is(w, "echo"))
                t->prog = P_ECHO;
        else if (span_is(w, "cat") && nw == 1)
                t->prog = P_CAT;
        else if (span_is(w, "ticker") && nw == 3 && parse_u64(w[1].p, w[1].n, &t->n) == 0 &&
                 parse_u64(w[2].p, w[2].n, &t->ms) == 0 && t->ms <= 3600000)
                t->prog = P_TICKER;
        else if (span_is(w, "flood") && nw == 2 && parse_u64(w[1].p, w[1].n, &t->n) == 0)
                t->prog = P_FLOOD;
        else if (span_is(w, "pipe") && nw == 2 && parse_u64(w[1].p, w[1].n, &t->n) == 0)
                t->prog = P_PIPE;
        else if (span_is(w, "sleep") && nw == 2 && parse_u64(w[1].p, w[1].n, &t->ms) == 0 && t->ms <= 86400000)
                t->prog = P_SLEEP;
        else if (span_is(w, "true") || span_is(w, "cat") || span_is(w, "ticker") || span_is(w, "flood") ||
                 span_is(w, "pipe") || span_is(w, "sleep"))
                return "EINVAL";
        else
                return "ENOENT";
        return NULL;
}

/* What a program does at its start. */
static void program_start(struct tproc *t)
{
        u64 now = now_ms();

        switch (t->prog) {
        case P_TRUE:
                exit_with(t, 0, 0);
                break;
        case P_ECHO:
                for (u32 k = 1; k < tp.n_words; k++) {
                        if (k > 1)
                                emit(t, (const u8 *)" ", 1);
                        emit(t, tp.words[k].p, tp.words[k].n);
                }
                emit(t, (const u8 *)"\n", 1);
                exit_with(t, 0, 0);
                break;
        case P_TICKER:
                t->next_ms = now;
                break;
        case P_SLEEP:
                t->next_ms = now + t->ms;
                break;
        default:
                break;
        }
}

/* One step of a running program, at now: whether it printed. */
static int program_step(struct tproc *t, u64 now)
{
        if (t->deadline_ms && now >= t->deadline_ms) {
                exit_with(t, 0, 9);
                return 1;
        }
        switch (t->prog) {
        case P_TICKER: {
                struct out o = { .buf = tp.line, .cap = sizeof(tp.line) };

                if (now < t->next_ms)
                        return 0;
                out_u64(&o, wall_ns_now());
                out_s(&o, " ");
                out_u64(&o, t->done);
                out_s(&o, "\n");
                emit(t, tp.line, o.len);
                t->done++;
                /* no burst after a pause or a restore: the next line one interval from now */
                t->next_ms = t->next_ms + t->ms > now ? t->next_ms + t->ms : now + t->ms;
                if (t->n && t->done >= t->n)
                        exit_with(t, 0, 0);
                return 1;
        }
        case P_FLOOD:
        case P_PIPE: {
                u64 k = t->n - t->done;

                if (k > TPROC_FLOOD_STEP)
                        k = TPROC_FLOOD_STEP;
                if (t->prog == P_PIPE && k > TPROC_RING - (t->end - t->read_to))
                        k = TPROC_RING - (t->end - t->read_to); /* the pipe is full: wait */
                if (k == 0)
                        return 0;
                emit_fill(t, 'x', k);
                t->done += k;
                if (t->done >= t->n)
                        exit_with(t, 0, 0);
                return 1;
        }
        case P_SLEEP:
                if (now < t->next_ms)
                        return 0;
                exit_with(t, 0, 0);
                return 1;
        default:
                return 0;
        }
}

/* ---- proc_start ---- */

/* The entry a new process takes: a free one, else the exited one that ended first. */
static struct tproc *slot(void)
{
        struct tproc *old = NULL;
        u64 now = now_ms();

        for (u32 i = 0; i < TPROC_MAX; i++) {
                struct tproc *t = &tp.p[i];

                if (t->pid && !t->running && now - t->exited_ms > TPROC_KEEP_MS)
                        t->pid = 0; /* kept its 10 minutes */
                if (!t->pid)
                        return t;
                if (!t->running && (!old || t->exited_ms < old->exited_ms))
                        old = t;
        }
        return old;
}

/* args: each string decoded; args[0] into tp.code, the rest into tp.argbuf. */
static const char *take_args(const u8 *p, const struct jfield *f, struct tproc *t)
{
        struct jfield e;
        u32 pos = 0, used = 0, k = 0;
        int r;

        tp.n_words = 0;
        while ((r = json_array_next(p, f, &pos, &e)) > 0) {
                u8 *dst = k == 0 ? tp.code : tp.argbuf + used;
                u32 cap = k == 0 ? TPROC_CODE_MAX : TPROC_CODE_MAX - used;
                int len;

                if (e.type != J_STR)
                        return "EINVAL";
                len = json_str_decode(p, &e, dst, cap);
                if (len < 0 || tp.n_words >= TPROC_WORDS_MAX)
                        return "E2BIG";
                if (k == 0 && len == 0)
                        return "EINVAL";
                tp.words[tp.n_words++] = (struct word) { dst, (u32)len };
                if (k > 0)
                        used += (u32)len;
                k++;
        }
        if (r < 0 || k == 0)
                return "EINVAL";
        if (f->len <= TPROC_ARGS_MAX) {
                memcpy(t->args, p + f->off, f->len);
                t->args_len = f->len;
        } else {
                memcpy(t->args, "[\"...\"]", 7);
                t->args_len = 7;
        }
        return NULL;
}

/* The program of CODE (cmd, or sh -c CODE), in tp.code[0..n), if its words are one
 * (`cat` alone, say); else a script (`cat PATH` is run_code's statement). */
static const char *take_code(struct tproc *t, u32 n)
{
        if (split_words(tp.code, n) == 0 && tp.n_words > 0 && !program(t))
                return NULL;
        t->prog = P_SCRIPT;
        tp.n_words = 0;
        return NULL;
}

static void args_of_cmd(struct tproc *t, const u8 *p, const struct jfield *f)
{
        struct out o = { .buf = t->args, .cap = TPROC_ARGS_MAX };

        out_s(&o, "[\"/bin/sh\",\"-c\",");
        out_raw(&o, p + f->off, f->len);
        out_s(&o, "]");
        if (o.overflow) {
                memcpy(t->args, "[\"/bin/sh\",\"-c\",\"...\"]", 22);
                o.len = 22;
        }
        t->args_len = o.len;
}

/* proc_start's "read": {"max": 1..262144, "wait_ms": 0..60000}, nothing else. */
static int read_args(const u8 *p, const struct jfield *f, u64 *max, u64 *wait)
{
        struct jfield g[2] = { { .key = "max" }, { .key = "wait_ms" } }, unknown;

        if (f->type != J_OBJ || json_fields_strict(p + f->off, f->len, g, 2, &unknown) < 0 || unknown.type != J_NONE)
                return -1;
        if ((g[0].type != J_NONE && (json_u64(p + f->off, &g[0], max) < 0 || *max < 1 || *max > 262144)) ||
            (g[1].type != J_NONE && (json_u64(p + f->off, &g[1], wait) < 0 || *wait > TPROC_WAIT_MS_MAX)))
                return -1;
        return 0;
}

static void op_start(u32 id, const u8 *p, u32 n)
{
        struct jfield f[9] = {
                { .key = "op" },  { .key = "args" }, { .key = "cmd" },          { .key = "cwd" },
                { .key = "env" }, { .key = "user" }, { .key = "timeout_secs" }, { .key = "stdin" },
                { .key = "read" },
        };
        struct jfield pty = { .key = "pty" }, unknown;
        struct tproc *t, *scratch = &tp.scratch;
        const char *why = NULL;
        u64 timeout = 0, rmax = 65536, rwait = 0;
        int len = 0;

        (void)json_fields_strict(p, n, f, 9, &unknown);
        if (unknown.type != J_NONE) {
                (void)json_fields(p, n, &pty, 1);
                if (pty.type != J_NONE && pty.type != J_NULL) {
                        reply_errno(id, "no terminals in the test guest", "EOPNOTSUPP");
                        return;
                }
                if (pty.type == J_NONE) {
                        reply_errno(id, "bad argument: an unknown field", "EINVAL");
                        return;
                }
        }
        if ((f[1].type == J_NONE) == (f[2].type == J_NONE) || (f[1].type != J_NONE && f[1].type != J_ARR) ||
            (f[2].type != J_NONE && f[2].type != J_STR)) {
                reply_errno(id, "exactly one of args (an array of strings) and cmd (a string)", "EINVAL");
                return;
        }
        if ((f[3].type != J_NONE && f[3].type != J_STR) || (f[4].type != J_NONE && f[4].type != J_OBJ) ||
            (f[5].type != J_NONE && f[5].type != J_STR && f[5].type != J_NUM) ||
            (f[6].type != J_NONE && (json_u64(p, &f[6], &timeout) < 0 || timeout > 86400)) ||
            (f[7].type != J_NONE && f[7].type != J_TRUE && f[7].type != J_FALSE)) {
                reply_errno(id, "bad argument (cwd, env, user, timeout_secs or stdin)", "EINVAL");
                return;
        }
        if (f[8].type != J_NONE && tp.refuse_read) {
                reply_errno(id, "bad argument 'read': unknown field", "EINVAL");
                return;
        }
        if (f[8].type != J_NONE && f[8].type != J_NULL && read_args(p, &f[8], &rmax, &rwait) < 0) {
                reply_errno(id, "bad argument 'read': must be {\"max\": 1 .. 262144, \"wait_ms\": 0 .. 60000}",
                            "EINVAL");
                return;
        }
        t = slot();
        if (!t) {
                reply_errno(id, "too many processes (16)", "EAGAIN");
                return;
        }
        /* built in scratch first: a refusal leaves the table as it was */
        memset(scratch, 0, sizeof(*scratch));
        if (f[1].type == J_ARR) {
                why = take_args(p, &f[1], scratch);
                if (!why && tp.n_words == 3 &&
                    (span_is(&tp.words[0], "sh") || span_is(&tp.words[0], "/bin/sh")) &&
                    span_is(&tp.words[1], "-c")) {
                        len = (int)tp.words[2].n;
                        memmove(tp.code, tp.words[2].p, (u32)len);
                        why = take_code(scratch, (u32)len);
                } else if (!why) {
                        why = program(scratch);
                }
        } else {
                len = json_str_decode(p, &f[2], tp.code, TPROC_CODE_MAX);
                why = len < 0 ? "E2BIG" : take_code(scratch, (u32)len);
                if (!why)
                        args_of_cmd(scratch, p, &f[2]);
        }
        if (why) {
                reply_errno(id,
                            memcmp(why, "ENOENT", 7) == 0 ? "No such file or directory (not a program of the test guest)"
                                                          : "bad arguments for the program",
                            why);
                return;
        }
        *t = *scratch;
        t->pid = ++tp.next_pid < 2 ? (tp.next_pid = 2) : tp.next_pid; /* pid 1 is the agent */
        t->running = 1;
        t->exit_code = -1;
        t->stdin_open = f[7].type != J_FALSE;
        t->stderr_from = ~0ull;
        t->started_ns = wall_ns_now();
        t->deadline_ms = timeout ? now_ms() + timeout * 1000 : 0;
        if (t->prog == P_SCRIPT) {
                const u8 *out, *err;
                u32 out_len, err_len;
                int r = script_run(tp.code, (u32)len, &out, &out_len, &err, &err_len);

                emit(t, out, out_len);
                t->stderr_from = t->end;
                emit(t, err, err_len);
                exit_with(t, r ? 1 : 0, 0);
        } else {
                program_start(t);
        }
        if (f[8].type == J_OBJ) {
                /* the start's answer carries its first read: at once when the program is
                 * done or printed rmax bytes (or rwait is 0), else at the first of those */
                if (rwait == 0 || !t->running || t->end >= rmax || tp.n_pend >= TPROC_PENDING_MAX)
                        answer_read(id, t, 0, rmax, 1);
                else
                        tp.pend[tp.n_pend++] = (struct pending_read) {
                                .id = id, .pid = t->pid, .max = rmax, .deadline_ms = now_ms() + rwait, .start = 1,
                        };
                live_count();
                return;
        }
        live_count();
        {
                struct out o = agent_reply_begin();

                out_s(&o, "{\"pid\":");
                out_u64(&o, t->pid);
                out_s(&o, "}");
                agent_reply(id, &o);
        }
}

/* ---- the other ops ---- */

static struct tproc *pid_arg(u32 id, const u8 *p, const struct jfield *f)
{
        struct tproc *t;
        u64 pid;

        if (json_u64(p, f, &pid) < 0 || pid == 0 || pid > 0xffffffffull) {
                reply_errno(id, "bad argument 'pid'", "EINVAL");
                return NULL;
        }
        t = find(pid);
        if (!t)
                reply_errno(id, "no such process", "ESRCH");
        return t;
}

/* The entry of a pid argument that still runs, or NULL when it was answered (EINVAL, ESRCH). */
static struct tproc *running_arg(u32 id, const u8 *p, const struct jfield *f)
{
        struct tproc *t = pid_arg(id, p, f);

        if (t && !t->running) {
                reply_errno(id, "the process has exited", "ESRCH");
                return NULL;
        }
        return t;
}

static void reply_ok(u32 id)
{
        struct out o = agent_reply_begin();

        out_s(&o, "{\"ok\":true}");
        agent_reply(id, &o);
}

static void op_list(u32 id)
{
        struct out o = { .buf = tp.tx + AGENT_HDR_SIZE, .cap = TPROC_TX_SIZE - AGENT_HDR_SIZE };
        int first = 1;

        tx_begin();
        out_s(&o, "{\"processes\":[");
        for (u32 pid = 2; pid <= tp.next_pid; pid++) {
                struct tproc *t = find(pid);

                if (!t)
                        continue;
                if (!first)
                        out_s(&o, ",");
                first = 0;
                out_s(&o, "{\"pid\":");
                out_u64(&o, t->pid);
                out_s(&o, ",\"args\":");
                out_raw(&o, t->args, t->args_len);
                out_s(&o, ",\"cwd\":\"/\",\"pty\":false,\"running\":");
                out_s(&o, t->running ? "true" : "false");
                out_s(&o, ",\"exit_code\":");
                out_int_or_null(&o, !t->running && t->exit_code >= 0, (u64)t->exit_code);
                out_s(&o, ",\"signal\":");
                out_int_or_null(&o, t->signal != 0, (u64)t->signal);
                out_s(&o, ",\"end_offset\":");
                out_u64(&o, t->end);
                out_s(&o, ",\"started_ns\":");
                out_u64(&o, t->started_ns);
                out_s(&o, "}");
        }
        out_s(&o, "]}");
        if (o.overflow) {
                agent_reply_error(id, "reply too large");
                return;
        }
        tx_commit_buf(tp.tx, AGENT_T_RESPONSE, id, o.len);
}

static void op_signal(u32 id, const u8 *p, u32 n)
{
        struct jfield f[2] = { { .key = "pid" }, { .key = "signal" } };
        struct tproc *t;
        u64 sig;

        (void)json_fields(p, n, f, 2);
        if (json_u64(p, &f[1], &sig) < 0 || sig < 1 || sig > 64) {
                reply_errno(id, "bad argument 'signal': 1..64", "EINVAL");
                return;
        }
        t = running_arg(id, p, &f[0]);
        if (!t)
                return;
        if (sig != 17 && sig != 18 && sig != 23 && sig != 28) /* CHLD, CONT, URG, WINCH: ignored */
                exit_with(t, 0, (int)sig);
        live_count();
        reply_ok(id);
}

static void op_stdin(u32 id, const u8 *p, u32 n)
{
        struct jfield f[3] = { { .key = "pid" }, { .key = "data_b64" }, { .key = "eof" } };
        struct tproc *t;
        size_t len = 0;

        (void)json_fields(p, n, f, 3);
        if (f[1].type != J_STR ||
            base64_decode((const char *)p + f[1].off + 1, f[1].len - 2, tp.stdin_data, sizeof(tp.stdin_data), &len) <
                    0 ||
            (f[2].type != J_NONE && f[2].type != J_TRUE && f[2].type != J_FALSE)) {
                reply_errno(id, "bad argument 'data_b64' or 'eof'", "EINVAL");
                return;
        }
        t = running_arg(id, p, &f[0]);
        if (!t)
                return;
        if (!t->stdin_open) {
                reply_errno(id, "stdin is closed", "EPIPE");
                return;
        }
        if (t->prog == P_CAT)
                emit(t, tp.stdin_data, len);
        if (f[2].type == J_TRUE) {
                t->stdin_open = 0;
                if (t->prog == P_CAT)
                        exit_with(t, 0, 0);
        }
        live_count();
        {
                struct out o = agent_reply_begin();

                out_s(&o, "{\"written\":");
                out_u64(&o, len);
                out_s(&o, "}");
                agent_reply(id, &o);
        }
}

static void op_read(u32 id, const u8 *p, u32 n)
{
        struct jfield f[4] = { { .key = "pid" }, { .key = "offset" }, { .key = "max" }, { .key = "wait_ms" } };
        u64 offset = 0, max = 65536, wait = 0;
        struct tproc *t;

        (void)json_fields(p, n, f, 4);
        if ((f[1].type != J_NONE && json_u64(p, &f[1], &offset) < 0) ||
            (f[2].type != J_NONE && (json_u64(p, &f[2], &max) < 0 || max < 1 || max > 262144)) ||
            (f[3].type != J_NONE && (json_u64(p, &f[3], &wait) < 0 || wait > TPROC_WAIT_MS_MAX))) {
                reply_errno(id, "bad argument (offset, max 1..262144, wait_ms 0..60000)", "EINVAL");
                return;
        }
        t = pid_arg(id, p, &f[0]);
        if (!t)
                return;
        if (offset > t->end) {
                struct out o = agent_reply_begin();

                out_s(&o, "{\"error\":\"offset ");
                out_u64(&o, offset);
                out_s(&o, " is beyond the end of the output (");
                out_u64(&o, t->end);
                out_s(&o, ")\",\"errno\":\"EINVAL\"}");
                tx_commit(AGENT_T_ERROR, id, o.len);
                return;
        }
        if (offset < t->end || !t->running || wait == 0) {
                answer_read(id, t, offset, max, 0);
                return;
        }
        if (tp.n_pend >= TPROC_PENDING_MAX) {
                reply_errno(id, "too many pending reads (32)", "EAGAIN");
                return;
        }
        tp.pend[tp.n_pend++] = (struct pending_read) {
                .id = id, .pid = t->pid, .offset = offset, .max = max, .deadline_ms = now_ms() + wait,
        };
        live_count();
}

int procs_op(u32 id, const u8 *p, u32 n, const struct jfield *op)
{
        struct jfield f = { .key = "pid" };

        if (json_str_eq(p, op, "proc_start"))
                op_start(id, p, n);
        else if (json_str_eq(p, op, "proc_list"))
                op_list(id);
        else if (json_str_eq(p, op, "proc_signal"))
                op_signal(id, p, n);
        else if (json_str_eq(p, op, "proc_stdin"))
                op_stdin(id, p, n);
        else if (json_str_eq(p, op, "proc_read"))
                op_read(id, p, n);
        else if (json_str_eq(p, op, "proc_resize")) {
                (void)json_fields(p, n, &f, 1);
                if (pid_arg(id, p, &f))
                        reply_errno(id, "the process has no terminal", "ENOTTY");
        } else
                return 0;
        return 1;
}

void procs_refuse_read(void)
{
        tp.refuse_read = 1;
}

void procs_channel_reset(void)
{
        tp.n_pend = 0;
        live_count();
}

u64 procs_step(void)
{
        u64 now = now_ms(), next = 0;

        for (u32 i = 0; i < TPROC_MAX; i++) {
                struct tproc *t = &tp.p[i];

                if (!t->pid || !t->running)
                        continue;
                (void)program_step(t, now);
                if (!t->running)
                        continue;
                if (t->prog == P_FLOOD || (t->prog == P_PIPE && t->end - t->read_to < TPROC_RING))
                        next = now; /* at once: it prints as fast as the loop turns */
                if ((t->prog == P_TICKER || t->prog == P_SLEEP) && (!next || t->next_ms < next))
                        next = t->next_ms;
                if (t->deadline_ms && (!next || t->deadline_ms < next))
                        next = t->deadline_ms;
        }
        for (u32 k = 0; k < tp.n_pend;) {
                struct pending_read *r = &tp.pend[k];
                struct tproc *t = find(r->pid);

                if (t && t->running && now < r->deadline_ms &&
                    (r->start ? t->end < r->max : r->offset == t->end)) {
                        if (!next || r->deadline_ms < next)
                                next = r->deadline_ms;
                        k++;
                        continue;
                }
                if (t)
                        answer_read(r->id, t, r->offset, r->max, (int)r->start);
                else
                        reply_errno(r->id, "no such process", "ESRCH");
                tp.pend[k] = tp.pend[--tp.n_pend];
        }
        live_count();
        if (!next)
                return 0;
        return next > now ? (next - now) * 1000000ull : 1;
}
