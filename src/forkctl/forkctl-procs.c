/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * Processes in a sandbox: exec --follow, ps, signal, logs and shell
 * (StartSandboxProcess, ListSandboxProcesses, SignalSandboxProcess,
 * ReadSandboxOutput, OpenSandboxOutputStream, WriteSandboxStdin,
 * ResizeSandboxPty). A followed process's output comes as proc-stream frames
 * on the descriptor OpenSandboxOutputStream returns; its stdout goes to ours,
 * its stderr to ours, and its end becomes our exit status: its exit code, or
 * 128 + the signal that killed it.
 */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "bus-json.h"
#include "forkctl.h"
#include "io-util.h"
#include "proc-stream.h"
#include "table.h"

#define FOLLOW_BUF (64u * 1024u)
#define LOGS_READ_MAX (256u * 1024u)
#define SHELL_STDIN_CHUNK 4096u

/* The bytes of a gap, said once on stderr. */
static void say_dropped(uint64_t n) {
        fprintf(stderr, "forkctl: %llu bytes dropped\n", (unsigned long long) n);
}

static int exit_status_of(int32_t code, int32_t sig) {
        if (sig > 0)
                return 128 + sig;
        return code >= 0 && code <= 255 ? code : 1;
}

/* One frame to our output. 1: the exit frame (its status in *ret_status). */
static int frame_out(const ProcStreamFrame *f, int *ret_status) {
        int r = 0;

        switch (f->kind) {
        case PROC_STREAM_STDOUT:
                r = loop_write(STDOUT_FILENO, f->data, f->len);
                break;
        case PROC_STREAM_STDERR:
                fflush(stdout);
                r = loop_write(STDERR_FILENO, f->data, f->len);
                break;
        case PROC_STREAM_GAP:
                say_dropped(f->dropped);
                break;
        case PROC_STREAM_EXIT:
                *ret_status = exit_status_of(f->exit_code, f->signal);
                return 1;
        }
        /* EPIPE on our own output: nobody reads any more; stop following. */
        return r < 0 ? r : 0;
}

/* Bytes read from a stream into its decoder, frames out. 1: the exit frame came. */
static int stream_consume(ProcStreamDecoder *d, const uint8_t *buf, size_t n, int *ret_status) {
        while (n > 0) {
                ProcStreamFrame f;
                size_t used = 0;
                int r = proc_stream_decoder_feed(d, buf, n, &used, &f);

                if (r < 0)
                        return r;
                buf += used;
                n -= used;
                if (r == 1) {
                        r = frame_out(&f, ret_status);
                        if (r != 0)
                                return r;
                }
        }
        return 0;
}

static int open_stream(sd_bus *bus, const char *id, uint32_t pid, uint64_t offset, const struct error_context *ctx,
                       int *ret_fd) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        int r, fd;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "OpenSandboxOutputStream", &error, &reply,
                               "sut", id, pid, offset);
        if (r < 0)
                return report_error(&error, r, ctx);
        r = sd_bus_message_read(reply, "h", &fd);
        if (r < 0)
                return report_error(NULL, r, ctx);
        fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (fd < 0)
                return report_error(NULL, -errno, ctx);
        *ret_fd = fd;
        return 0;
}

/* Follow a stream to its end: 0 and the process's exit status in *ret_status,
 * or minus forkctl's. */
static int follow_fd(int fd, const struct error_context *ctx, int *ret_status) {
        _cleanup_free_ uint8_t *buf = malloc(FOLLOW_BUF);
        ProcStreamDecoder d;
        int status = 0, r;

        if (!buf || proc_stream_decoder_init(&d) < 0)
                return report_error(NULL, -ENOMEM, ctx);
        for (;;) {
                ssize_t n = read(fd, buf, FOLLOW_BUF);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0) {
                        r = report_error(NULL, -errno, ctx);
                        break;
                }
                if (n == 0) {
                        fprintf(stderr, "forkctl: the output stream of the process ended before its exit (the "
                                        "sandbox went away?)\n");
                        r = -1;
                        break;
                }
                r = stream_consume(&d, buf, (size_t) n, &status);
                if (r == 1) {
                        *ret_status = status;
                        r = 0;
                        break;
                }
                if (r == -EBADMSG) {
                        fprintf(stderr, "forkctl: invalid frame on the output stream\n");
                        r = -1;
                        break;
                }
                if (r < 0) {
                        r = -1; /* our own output is gone */
                        break;
                }
        }
        proc_stream_decoder_done(&d);
        return r;
}

static int start_process(sd_bus *bus, const char *id, char **argv, const char *cmd, bool with_stdin,
                         uint32_t timeout, const uint16_t pty[2], const struct error_context *ctx,
                         uint32_t *ret_pid) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        int r;

        r = new_call(bus, "StartSandboxProcess", &m);
        if (r < 0)
                return -1;
        r = sd_bus_message_append(m, "s", id);
        if (r >= 0)
                r = sd_bus_message_append_strv(m, argv);
        if (r >= 0)
                r = sd_bus_message_open_container(m, 'a', "{sv}");
        if (r >= 0)
                r = sd_bus_message_append(m, "{sv}", "stdin", "b", (int) with_stdin);
        if (r >= 0 && cmd)
                r = sd_bus_message_append(m, "{sv}", "cmd", "s", cmd);
        if (r >= 0 && timeout > 0)
                r = sd_bus_message_append(m, "{sv}", "timeout_secs", "u", timeout);
        if (r >= 0 && pty)
                r = sd_bus_message_append(m, "{sv}", "pty", "(uu)", (uint32_t) pty[0], (uint32_t) pty[1]);
        if (r >= 0)
                r = sd_bus_message_close_container(m);
        if (r < 0)
                return report_error(NULL, r, ctx);
        r = sd_bus_call(bus, m, CALL_TIMEOUT_USEC, &error, &reply);
        if (r < 0)
                return report_error(&error, r, ctx);
        r = sd_bus_message_read(reply, "u", ret_pid);
        return r < 0 ? report_error(NULL, r, ctx) : 0;
}

int verb_exec_follow(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        struct error_context ctx = { .verb = "exec", .id = args[0] };
        _cleanup_close_ int fd = -EBADF;
        uint32_t pid;
        int r, status;

        r = start_process(bus, args[0], args + 1, NULL, false, o->timeout, NULL, &ctx, &pid);
        if (r < 0)
                return r;
        r = open_stream(bus, args[0], pid, 0, &ctx, &fd);
        if (r < 0)
                return r;
        r = follow_fd(fd, &ctx, &status);
        return r < 0 ? r : -status;
}

/* ---- ps ---- */

static const char *process_state(struct json_object *p, char *buf, size_t size) {
        struct json_object *v;
        int64_t code = -1, sig = 0;

        if (json_object_object_get_ex(p, "running", &v) && json_object_get_boolean(v))
                return "running";
        if (json_object_object_get_ex(p, "signal", &v))
                sig = json_object_get_int64(v);
        if (json_object_object_get_ex(p, "exit_code", &v))
                code = json_object_get_int64(v);
        if (sig > 0)
                snprintf(buf, size, "killed (%s)", sigabbrev_np((int) sig) ?: "?");
        else
                snprintf(buf, size, "exited (%lld)", (long long) code);
        return buf;
}

static const char *process_started(struct json_object *p, char *buf, size_t size) {
        struct json_object *v;
        struct tm tm;
        time_t t;

        if (!json_object_object_get_ex(p, "started_usec", &v))
                return NULL;
        t = (time_t) (json_object_get_uint64(v) / USEC_PER_SEC);
        if (!localtime_r(&t, &tm) || strftime(buf, size, "%Y-%m-%d %H:%M:%S", &tm) == 0)
                return NULL;
        return buf;
}

static const char *process_args(struct json_object *p, char *buf, size_t size) {
        struct json_object *a;
        size_t n = 0;

        buf[0] = 0;
        if (!json_object_object_get_ex(p, "args", &a) || !json_object_is_type(a, json_type_array))
                return NULL;
        for (size_t i = 0; i < json_object_array_length(a) && n + 1 < size; i++) {
                int k = snprintf(buf + n, size - n, "%s%s", i ? " " : "",
                                 json_object_get_string(json_object_array_get_idx(a, i)));
                if (k < 0)
                        break;
                n += (size_t) k;
        }
        return buf;
}

int verb_ps(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        static const char *const headers[] = { "PID", "STATE", "PTY", "OUTPUT", "STARTED", "CWD", "COMMAND" };
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "ps", .id = args[0] };
        _cleanup_json_ struct json_object *list = NULL;
        _cleanup_table_ struct table *t = NULL;
        int r;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "ListSandboxProcesses", &error, &reply, "s",
                               args[0]);
        if (r < 0)
                return report_error(&error, r, &ctx);
        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        if (o->json)
                return print_json(list) < 0 ? -1 : 0;
        t = table_new(ELEMENTSOF(headers), headers);
        if (!t)
                return report_error(NULL, -ENOMEM, &ctx);
        for (size_t i = 0; i < json_object_array_length(list); i++) {
                struct json_object *p = json_object_array_get_idx(list, i), *v;
                char state[64], started[64], argv_buf[256];
                bool pty = json_object_object_get_ex(p, "pty", &v) && json_object_get_boolean(v);
                const char *cells[] = { jstr(p, "pid"), process_state(p, state, sizeof state), pty ? "yes" : "no",
                                        jstr(p, "end_offset"), process_started(p, started, sizeof started),
                                        jstr(p, "cwd"), process_args(p, argv_buf, sizeof argv_buf) };

                if (table_add_row(t, cells) < 0)
                        return report_error(NULL, -ENOMEM, &ctx);
        }
        if (table_rows(t) == 0) {
                printf("No processes in sandbox %s. Start one with 'forkctl exec --follow %s -- ARGV...'.\n",
                       args[0], args[0]);
                return 0;
        }
        return table_print(t, stdout) < 0 ? -1 : 0;
}

/* ---- signal ---- */

int check_signal(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis) {
        uint32_t pid;

        if (parse_u32(args[1], 1, INT32_MAX, &pid) < 0)
                return usage_error("invalid PID '%s'; usage: forkctl %s", args[1], synopsis);
        if (proc_signal_from_string(args[2]) < 0)
                return usage_error("unknown signal '%s' (a name such as TERM or SIGKILL, or 1..64)", args[2]);
        return 0;
}

int verb_signal(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        struct error_context ctx = { .verb = "signal", .id = args[0] };
        uint32_t pid = 0;
        int r;

        (void) parse_u32(args[1], 1, INT32_MAX, &pid);
        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "SignalSandboxProcess", &error, &reply, "sus",
                               args[0], pid, args[2]);
        return r < 0 ? report_error(&error, r, &ctx) : 0;
}

/* ---- logs ---- */

int check_logs(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis) {
        uint32_t pid;

        if (parse_u32(args[1], 1, INT32_MAX, &pid) < 0)
                return usage_error("invalid PID '%s'; usage: forkctl %s", args[1], synopsis);
        if (o->given & OPT_OFFSET) {
                const char *s = o->offset_str;
                uint64_t v = 0;

                if (!*s)
                        return usage_error("--offset wants a number of bytes");
                for (; *s; s++) {
                        if (*s < '0' || *s > '9' || v > (UINT64_C(0x7fffffffffffffff) - (uint64_t) (*s - '0')) / 10)
                                return usage_error("--offset wants a number of bytes (0..2^63-1), not '%s'",
                                                   o->offset_str);
                        v = v * 10 + (uint64_t) (*s - '0');
                }
                o->offset = v;
        }
        return 0;
}

/* One ReadSandboxOutput answer out; *next: where the next read starts; 1: the
 * process exited. An answer that gave nothing new is the end; one with bytes
 * may not be, as the guest may answer fewer than asked. after_exit: an earlier
 * answer said it exited, so a process the guest let go since is the end too. */
static int logs_read_once(sd_bus *bus, const char *id, uint32_t pid, uint64_t offset, bool after_exit,
                          uint64_t *next, const struct error_context *ctx) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        uint64_t gap;
        int r, exited = 0;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "ReadSandboxOutput", &error, &reply, "sutu", id,
                               pid, offset, LOGS_READ_MAX);
        if (r < 0 && after_exit && sd_bus_error_has_name(&error, FORKD_ERROR_NO_SUCH_PROCESS)) {
                *next = offset;
                return 1;
        }
        if (r < 0)
                return report_error(&error, r, ctx);
        r = sd_bus_message_enter_container(reply, 'a', "(stay)");
        while (r >= 0) {
                const char *stream;
                const void *data;
                uint64_t at;
                size_t len;

                r = sd_bus_message_enter_container(reply, 'r', "stay");
                if (r <= 0)
                        break;
                r = sd_bus_message_read(reply, "st", &stream, &at);
                if (r >= 0)
                        r = sd_bus_message_read_array(reply, 'y', &data, &len);
                if (r >= 0)
                        r = sd_bus_message_exit_container(reply);
                if (r < 0)
                        break;
                if (strcmp(stream, "stderr") == 0) {
                        fflush(stdout);
                        r = loop_write(STDERR_FILENO, data, len);
                } else
                        r = loop_write(STDOUT_FILENO, data, len);
                if (r < 0)
                        return -1;
        }
        if (r >= 0)
                r = sd_bus_message_exit_container(reply);
        if (r >= 0)
                r = sd_bus_message_read(reply, "ttb", next, &gap, &exited);
        if (r < 0)
                return report_error(NULL, r, ctx);
        if (gap > 0)
                say_dropped(gap);
        return !!exited;
}

int verb_logs(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        struct error_context ctx = { .verb = "logs", .id = args[0] };
        uint64_t offset = o->offset;
        uint32_t pid = 0;
        int r, status;

        (void) parse_u32(args[1], 1, INT32_MAX, &pid);
        if (o->follow) {
                _cleanup_close_ int fd = -EBADF;

                r = open_stream(bus, args[0], pid, offset, &ctx, &fd);
                if (r < 0)
                        return r;
                /* The process's own status is exec --follow's; logs says whether it could follow. */
                return follow_fd(fd, &ctx, &status);
        }
        for (bool exited = false;;) {
                uint64_t next = offset;

                r = logs_read_once(bus, args[0], pid, offset, exited, &next, &ctx);
                if (r < 0)
                        return r;
                if (next == offset)
                        return 0;
                exited = r > 0;
                offset = next;
        }
}

/* ---- shell ---- */

static void terminal_size(uint16_t ret[2]) {
        struct winsize w = {};

        ret[0] = 80;
        ret[1] = 24;
        if (ioctl(STDIN_FILENO, TIOCGWINSZ, &w) < 0 || w.ws_col == 0 || w.ws_row == 0)
                return;
        ret[0] = MIN(w.ws_col, (uint16_t) 1000);
        ret[1] = MIN(w.ws_row, (uint16_t) 1000);
}

/* data to the process's stdin (eof: and close it), retried while its queue is full. */
static int shell_write(sd_bus *bus, const char *id, uint32_t pid, const uint8_t *data, size_t len, bool eof,
                       const struct error_context *ctx) {
        do {
                _cleanup_(sd_bus_message_unrefp) sd_bus_message *m = NULL, *reply = NULL;
                _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
                uint32_t written = 0;
                int r;

                r = new_call(bus, "WriteSandboxStdin", &m);
                if (r < 0)
                        return -1;
                r = sd_bus_message_append(m, "su", id, pid);
                if (r >= 0)
                        r = sd_bus_message_append_array(m, 'y', data, len);
                if (r >= 0)
                        r = sd_bus_message_append(m, "b", (int) eof);
                if (r < 0)
                        return report_error(NULL, r, ctx);
                r = sd_bus_call(bus, m, CALL_TIMEOUT_USEC, &error, &reply);
                if (r < 0 && sd_bus_error_has_name(&error, "org.forkd.Error.Busy")) {
                        (void) usleep(50 * 1000);
                        continue;
                }
                if (r < 0)
                        return report_error(&error, r, ctx);
                r = sd_bus_message_read(reply, "u", &written);
                if (r < 0)
                        return report_error(NULL, r, ctx);
                written = MIN(written, (uint32_t) len);
                data += written;
                len -= written;
        } while (len > 0);
        return 0;
}

static int shell_resize(sd_bus *bus, const char *id, uint32_t pid) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        uint16_t size[2];

        terminal_size(size);
        /* Best effort: the shell may have exited meanwhile. */
        return sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "ResizeSandboxPty", &error, NULL, "suqq", id,
                                  pid, size[0], size[1]);
}

struct raw_terminal {
        bool raw;
        struct termios saved;
};

static void terminal_restore(struct raw_terminal *t) {
        if (t->raw)
                (void) tcsetattr(STDIN_FILENO, TCSADRAIN, &t->saved);
}

int verb_shell(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        struct error_context ctx = { .verb = "shell", .id = args[0] };
        _cleanup_(terminal_restore) struct raw_terminal term = {};
        _cleanup_close_ int fd = -EBADF, sig = -EBADF;
        _cleanup_free_ uint8_t *buf = malloc(FOLLOW_BUF);
        char *sh[] = { (char *) "/bin/sh", (char *) "-i", NULL };
        bool stdin_open = true;
        ProcStreamDecoder d = {};
        uint16_t size[2];
        sigset_t mask;
        uint32_t pid;
        int r, status = 1;

        if (!buf || proc_stream_decoder_init(&d) < 0)
                return report_error(NULL, -ENOMEM, &ctx);
        terminal_size(size);
        r = start_process(bus, args[0], o->cmd ? (char *[]) { NULL } : sh, o->cmd, true, 0, size, &ctx, &pid);
        if (r >= 0)
                r = open_stream(bus, args[0], pid, 0, &ctx, &fd);
        if (r < 0) {
                proc_stream_decoder_done(&d);
                return r;
        }

        sigemptyset(&mask);
        sigaddset(&mask, SIGWINCH);
        (void) sigprocmask(SIG_BLOCK, &mask, NULL);
        sig = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
        if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &term.saved) >= 0) {
                struct termios raw = term.saved;

                cfmakeraw(&raw);
                term.raw = tcsetattr(STDIN_FILENO, TCSANOW, &raw) >= 0;
        }

        for (;;) {
                struct pollfd p[3] = {
                        { .fd = fd, .events = POLLIN },
                        { .fd = stdin_open ? STDIN_FILENO : -1, .events = POLLIN },
                        { .fd = sig, .events = POLLIN },
                };
                ssize_t n;

                if (poll(p, ELEMENTSOF(p), -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        r = report_error(NULL, -errno, &ctx);
                        break;
                }
                if (p[2].revents & POLLIN) {
                        struct signalfd_siginfo si;

                        while (read(sig, &si, sizeof si) == (ssize_t) sizeof si)
                                ;
                        (void) shell_resize(bus, args[0], pid);
                }
                if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {
                        n = read(STDIN_FILENO, buf, SHELL_STDIN_CHUNK);
                        if (n < 0 && errno == EINTR)
                                continue;
                        stdin_open = n > 0;
                        r = shell_write(bus, args[0], pid, buf, n > 0 ? (size_t) n : 0, n <= 0, &ctx);
                        if (r < 0)
                                break;
                }
                if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
                        n = read(fd, buf, FOLLOW_BUF);
                        if (n < 0 && errno == EINTR)
                                continue;
                        if (n <= 0) {
                                terminal_restore(&term);
                                term.raw = false;
                                fprintf(stderr, "forkctl: the output stream of the shell ended before its exit\n");
                                r = -1;
                                break;
                        }
                        r = stream_consume(&d, buf, (size_t) n, &status);
                        if (r == 1) {
                                r = 0;
                                break;
                        }
                        if (r < 0) {
                                terminal_restore(&term);
                                term.raw = false;
                                if (r == -EBADMSG)
                                        fprintf(stderr, "forkctl: invalid frame on the output stream\n");
                                r = -1;
                                break;
                        }
                }
        }
        proc_stream_decoder_done(&d);
        return r < 0 ? r : -status;
}
