/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * A stand-in for forkd's process methods on a private bus, so that forkd-rest's
 * process routes run without a guest (test-rest-processes.py). It owns
 * org.forkd.Manager and knows the sandbox "sb-1" (any other id: NoSuchSandbox;
 * "sb-paused": Paused) and two processes:
 *
 *   pid 100  a terminal that runs until its stdin's eof or a signal: what
 *            WriteSandboxStdin sends comes back as stdout on every open stream,
 *            ResizeSandboxPty prints "size ROWS COLS\n", eof exits 0, a signal
 *            kills it (exit_code -1, that signal). StartSandboxProcess answers
 *            it (the process starts afresh)
 *   pid 200  exited with code 3; its output: stdout "out\n" at 0 (dropped: the
 *            ring starts at 4), stderr "err\n" at 4, stdout "\xff\xfe\n" at 8,
 *            11 bytes in all
 *
 * Anything else is NoSuchProcess. StartSandboxProcess (and StartSandboxProcessStream,
 * which answers the terminal's stream too) with argv[0] "nope" is a GuestError. Every method's arguments are checked as forkd checks them.
 *
 * usage: standin-procs BUS-ADDRESS
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include "forkd-bus.h"
#include "io-util.h"
#include "macro.h"
#include "proc-stream.h"

#define TERM_PID 100u
#define DONE_PID 200u
#define STREAMS_MAX 80

/* the terminal's state */
static char term_out[1024 * 1024];
static size_t term_len;
static bool term_exited;
static int32_t term_code = -1, term_signal;
static int term_fds[STREAMS_MAX];

/* pid 200's output */
static const struct {
        uint8_t kind;
        uint64_t offset;
        const char *data;
} done_chunks[] = {
        { PROC_STREAM_STDOUT, 0, "out\n" },
        { PROC_STREAM_STDERR, 4, "err\n" },
        { PROC_STREAM_STDOUT, 8, "\xff\xfe\n" },
};
#define DONE_RING_START 4u
#define DONE_END 11u

/* The part of chunk i at or after from (and in the ring): false if none. */
static bool done_slice(size_t i, uint64_t from, uint64_t *ret_offset, const char **ret_data, size_t *ret_len) {
        uint64_t start = done_chunks[i].offset, end = start + strlen(done_chunks[i].data);

        from = MAX(from, (uint64_t) DONE_RING_START);
        if (end <= from)
                return false;
        *ret_offset = MAX(start, from);
        *ret_data = done_chunks[i].data + (*ret_offset - start);
        *ret_len = (size_t) (end - *ret_offset);
        return true;
}

static int check_target(sd_bus_message *m, uint32_t *ret_pid, sd_bus_error *error) {
        const char *id;
        int r;

        r = sd_bus_message_read(m, "s", &id);
        if (r < 0)
                return r;
        if (!strcmp(id, "sb-paused"))
                return sd_bus_error_setf(error, FORKD_ERROR_PAUSED, "sandbox %s is paused", id);
        if (strcmp(id, "sb-1") != 0)
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SANDBOX, "No sandbox %s.", id);
        if (!ret_pid)
                return 0;
        r = sd_bus_message_read(m, "u", ret_pid);
        if (r < 0)
                return r;
        if (*ret_pid != TERM_PID && *ret_pid != DONE_PID)
                return sd_bus_error_set(error, FORKD_ERROR_NO_SUCH_PROCESS, "No such process.");
        return 0;
}

static int put_frame(int fd, uint8_t kind, uint64_t offset, const void *data, uint32_t len) {
        uint8_t h[PROC_STREAM_HDR_SIZE];
        int r;

        proc_stream_header_encode(h, kind, len, offset);
        r = loop_write(fd, h, sizeof h);
        if (r >= 0 && len > 0)
                r = loop_write(fd, data, len);
        return r;
}

static int put_exit(int fd, uint64_t offset, int32_t code, int32_t sig) {
        uint8_t b[PROC_STREAM_HDR_SIZE + 8];

        return loop_write(fd, b, proc_stream_encode_exit(b, offset, code, sig));
}

/* The terminal prints: to its log, and to every open stream. */
static void term_print(const void *data, size_t len) {
        len = MIN(len, sizeof term_out - term_len);
        for (size_t i = 0; i < STREAMS_MAX; i++)
                if (term_fds[i] >= 0 && put_frame(term_fds[i], PROC_STREAM_STDOUT, term_len, data, (uint32_t) len) < 0)
                        term_fds[i] = safe_close(term_fds[i]);
        memcpy(term_out + term_len, data, len);
        term_len += len;
}

static void term_exit(int32_t code, int32_t sig) {
        term_exited = true;
        term_code = code;
        term_signal = sig;
        for (size_t i = 0; i < STREAMS_MAX; i++)
                if (term_fds[i] >= 0) {
                        (void) put_exit(term_fds[i], term_len, code, sig);
                        term_fds[i] = safe_close(term_fds[i]);
                }
}

/* StartSandboxProcess's arguments, and the terminal started afresh: 0, or an error. */
static int start_term(sd_bus_message *m, sd_bus_error *error) {
        char **argv = NULL;
        bool nope;
        int r;

        r = check_target(m, NULL, error);
        if (r < 0)
                return r;
        r = sd_bus_message_read_strv(m, &argv);
        if (r < 0)
                return r;
        nope = argv && argv[0] && !strcmp(argv[0], "nope");
        for (char **a = argv; a && *a; a++)
                free(*a);
        free(argv);
        r = sd_bus_message_skip(m, "a{sv}");
        if (r < 0)
                return r;
        if (nope)
                return sd_bus_error_set(error, FORKD_ERROR_GUEST_ERROR, "nope: No such file or directory");
        for (size_t i = 0; i < STREAMS_MAX; i++)
                term_fds[i] = safe_close(term_fds[i]);
        term_len = 0;
        term_exited = false;
        term_code = -1;
        term_signal = 0;
        return 0;
}

static int method_start(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        int r = start_term(m, error);

        if (r < 0 || sd_bus_error_is_set(error))
                return r;
        return sd_bus_reply_method_return(m, "u", TERM_PID);
}

/* A stream of pid from offset (checked): the caller's end in *ret. */
static int open_stream(uint32_t pid, uint64_t offset, int *ret) {
        _cleanup_close_ int ours = -EBADF, theirs = -EBADF;
        int pair[2];

        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
                return -errno;
        ours = pair[0];
        theirs = pair[1];
        if (pid == DONE_PID) {
                if (offset < DONE_RING_START) {
                        uint8_t g[PROC_STREAM_HDR_SIZE + 8];

                        (void) loop_write(ours, g, proc_stream_encode_gap(g, DONE_RING_START, DONE_RING_START - offset));
                }
                for (size_t i = 0; i < ELEMENTSOF(done_chunks); i++) {
                        const char *data;
                        uint64_t at;
                        size_t len;

                        if (done_slice(i, offset, &at, &data, &len))
                                (void) put_frame(ours, done_chunks[i].kind, at, data, (uint32_t) len);
                }
                (void) put_exit(ours, DONE_END, 3, 0);
        } else {
                if (term_len > offset)
                        (void) put_frame(ours, PROC_STREAM_STDOUT, offset, term_out + offset,
                                         (uint32_t) (term_len - offset));
                if (term_exited)
                        (void) put_exit(ours, term_len, term_code, term_signal);
                else
                        for (size_t i = 0; i < STREAMS_MAX; i++)
                                if (term_fds[i] < 0) {
                                        term_fds[i] = TAKE_FD(ours);
                                        break;
                                }
        }
        *ret = TAKE_FD(theirs);
        return 0;
}

static int method_open_stream(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        _cleanup_close_ int theirs = -EBADF;
        uint64_t offset;
        uint32_t pid;
        int r;

        r = check_target(m, &pid, error);
        if (r < 0 || sd_bus_error_is_set(error))
                return r;
        r = sd_bus_message_read(m, "t", &offset);
        if (r < 0)
                return r;
        if (offset > (pid == TERM_PID ? term_len : DONE_END))
                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "offset beyond the end of the output");
        r = open_stream(pid, offset, &theirs);
        if (r < 0)
                return r;
        return sd_bus_reply_method_return(m, "h", theirs);
}

/* StartSandboxProcessStream: the terminal started and its stream from 0, in one call. */
static int method_start_stream(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        _cleanup_close_ int theirs = -EBADF;
        int r = start_term(m, error);

        if (r < 0 || sd_bus_error_is_set(error))
                return r;
        r = open_stream(TERM_PID, 0, &theirs);
        if (r < 0)
                return r;
        return sd_bus_reply_method_return(m, "uh", TERM_PID, theirs);
}

static int method_read(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        uint64_t offset;
        uint32_t pid, max;
        int r;

        r = check_target(m, &pid, error);
        if (r < 0 || sd_bus_error_is_set(error))
                return r;
        r = sd_bus_message_read(m, "tu", &offset, &max);
        if (r < 0)
                return r;
        if (max < 1 || max > PROC_STREAM_DATA_MAX)
                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "max must be 1 to 262144.");
        if (offset > (pid == TERM_PID ? term_len : DONE_END))
                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "offset beyond the end of the output");
        r = sd_bus_message_new_method_return(m, &reply);
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'a', "(stay)");
        if (pid == DONE_PID) {
                for (size_t i = 0; r >= 0 && i < ELEMENTSOF(done_chunks); i++) {
                        const char *data;
                        uint64_t at;
                        size_t len;

                        if (!done_slice(i, offset, &at, &data, &len))
                                continue;
                        r = sd_bus_message_open_container(reply, 'r', "stay");
                        if (r >= 0)
                                r = sd_bus_message_append(reply, "st",
                                                          done_chunks[i].kind == PROC_STREAM_STDOUT ? "stdout" : "stderr",
                                                          at);
                        if (r >= 0)
                                r = sd_bus_message_append_array(reply, 'y', data, len);
                        if (r >= 0)
                                r = sd_bus_message_close_container(reply);
                }
                if (r >= 0)
                        r = sd_bus_message_close_container(reply);
                if (r >= 0)
                        r = sd_bus_message_append(reply, "ttbii", (uint64_t) DONE_END,
                                                  offset < DONE_RING_START ? DONE_RING_START - offset : 0, 1, 3, 0);
        } else {
                size_t n = MIN((size_t) max, term_len - offset);

                if (r >= 0 && n > 0) {
                        r = sd_bus_message_open_container(reply, 'r', "stay");
                        if (r >= 0)
                                r = sd_bus_message_append(reply, "st", "stdout", offset);
                        if (r >= 0)
                                r = sd_bus_message_append_array(reply, 'y', term_out + offset, n);
                        if (r >= 0)
                                r = sd_bus_message_close_container(reply);
                }
                if (r >= 0)
                        r = sd_bus_message_close_container(reply);
                if (r >= 0)
                        r = sd_bus_message_append(reply, "ttbii", offset + n, (uint64_t) 0, term_exited, term_code,
                                                  term_signal);
        }
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

static int method_list(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        int r = check_target(m, NULL, error);

        if (r < 0 || sd_bus_error_is_set(error))
                return r;
        return sd_bus_reply_method_return(m, "aa{sv}", 1, 9, "pid", "u", TERM_PID, "args", "as", 2, "sh", "-i", "cwd",
                                          "s", "/root", "pty", "b", 1, "running", "b", !term_exited, "exit_code", "i",
                                          term_code, "signal", "i", term_signal, "end_offset", "t", (uint64_t) term_len,
                                          "started_usec", "t", (uint64_t) 1700000000123456);
}

static int method_signal(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        const char *sig;
        uint32_t pid;
        int r, n;

        r = check_target(m, &pid, error);
        if (r < 0 || sd_bus_error_is_set(error))
                return r;
        r = sd_bus_message_read(m, "s", &sig);
        if (r < 0)
                return r;
        n = proc_signal_from_string(sig);
        if (n < 0)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "unknown signal \"%s\"", sig);
        if (pid != TERM_PID || term_exited)
                return sd_bus_error_set(error, FORKD_ERROR_NO_SUCH_PROCESS, "No such process.");
        term_exit(-1, n);
        return sd_bus_reply_method_return(m, "");
}

static int method_write_stdin(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        const void *data;
        size_t len;
        uint32_t pid;
        int eof, r;

        r = check_target(m, &pid, error);
        if (r < 0 || sd_bus_error_is_set(error))
                return r;
        r = sd_bus_message_read_array(m, 'y', &data, &len);
        if (r >= 0)
                r = sd_bus_message_read(m, "b", &eof);
        if (r < 0)
                return r;
        if (len > 65536)
                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "data is larger than 65536 bytes.");
        if (pid != TERM_PID || term_exited)
                return sd_bus_error_set(error, FORKD_ERROR_NO_SUCH_PROCESS, "No such process.");
        if (len > 0)
                term_print(data, len);
        if (eof)
                term_exit(0, 0);
        return sd_bus_reply_method_return(m, "u", (uint32_t) len);
}

static int method_resize(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        uint16_t cols, rows;
        char line[64];
        uint32_t pid;
        int r;

        r = check_target(m, &pid, error);
        if (r < 0 || sd_bus_error_is_set(error))
                return r;
        r = sd_bus_message_read(m, "qq", &cols, &rows);
        if (r < 0)
                return r;
        if (cols < 1 || cols > 1000 || rows < 1 || rows > 1000)
                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "cols and rows must be 1 to 1000.");
        if (pid != TERM_PID || term_exited)
                return sd_bus_error_set(error, FORKD_ERROR_NO_SUCH_PROCESS, "No such process.");
        (void) snprintf(line, sizeof line, "size %u %u\n", rows, cols);
        term_print(line, strlen(line));
        return sd_bus_reply_method_return(m, "");
}

static const sd_bus_vtable vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_METHOD("StartSandboxProcess", "sasa{sv}", "u", method_start, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD("ListSandboxProcesses", "s", "aa{sv}", method_list, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD("SignalSandboxProcess", "sus", "", method_signal, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD("WriteSandboxStdin", "suayb", "u", method_write_stdin, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD("ResizeSandboxPty", "suqq", "", method_resize, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD("ReadSandboxOutput", "sutu", "a(stay)ttbii", method_read, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD("OpenSandboxOutputStream", "sut", "h", method_open_stream, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD("StartSandboxProcessStream", "sasa{sv}", "uh", method_start_stream, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_VTABLE_END
};

int main(int argc, char **argv) {
        sd_bus *bus = NULL;
        sd_event *event = NULL;
        int r;

        if (argc != 2) {
                fprintf(stderr, "usage: %s BUS-ADDRESS\n", argv[0]);
                return 2;
        }
        for (size_t i = 0; i < STREAMS_MAX; i++)
                term_fds[i] = -EBADF;
        r = sd_event_default(&event);
        if (r >= 0)
                r = sd_bus_new(&bus);
        if (r >= 0)
                r = sd_bus_set_address(bus, argv[1]);
        if (r >= 0)
                r = sd_bus_set_bus_client(bus, true);
        if (r >= 0)
                r = sd_bus_negotiate_fds(bus, true);
        if (r >= 0)
                r = sd_bus_start(bus);
        if (r >= 0)
                r = sd_bus_add_object_vtable(bus, NULL, "/org/forkd/Manager", "org.forkd.Manager", vtable, NULL);
        if (r >= 0)
                r = sd_bus_request_name(bus, "org.forkd.Manager", 0);
        if (r >= 0)
                r = sd_bus_attach_event(bus, event, 0);
        if (r >= 0)
                r = sd_event_loop(event);
        if (r < 0)
                fprintf(stderr, "standin-procs: %s\n", strerror(-r));
        sd_bus_flush_close_unref(bus);
        sd_event_unref(event);
        return r < 0 ? 1 : 0;
}
