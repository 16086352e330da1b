/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * A stand-in for forkd's process methods on a private bus, for forkctl's
 * exec --follow, ps, signal, logs and shell without a guest
 * (test-forkctl-procs.sh).
 * It owns org.forkd.Manager and answers:
 *
 *   StartSandboxProcess   pid 3 for argv[0] "exit3", 15 for "term", else 42,
 *                         InvalidArgs unless the option stdin is false; a
 *                         shell (argv /bin/sh -i or the option cmd, stdin
 *                         true, pty 80x24): pid 50
 *   WriteSandboxStdin     pid 50: the bytes come back on its stream as stdout;
 *                         eof ends it with exit code 7
 *   OpenSandboxOutputStream
 *                         pid 3: stdout "out\n", stderr "err\n", a gap of 5,
 *                         stdout "tail\n", exit 3; pid 15: stdout "bye\n", killed
 *                         by signal 15; pid 42: TEXT from the offset, exit 0;
 *                         pid 66: a frame with a non-zero pad byte; pid 67:
 *                         stdout "cut" and the end without an exit frame; pid
 *                         50: kept open for WriteSandboxStdin. Each frame
 *                         written in bytes of its own.
 *   ReadSandboxOutput     pid 42: TEXT from the offset (at most max bytes),
 *                         pid 7: the same with the ring started at 4 (a gap);
 *                         pid 8: TEXT of an exited process, forgotten (NoSuchProcess)
 *                         once a read returned its end
 *   ListSandboxProcesses  one running process 42, one killed (SIGTERM) 15
 *   SignalSandboxProcess  NoSuchProcess for pid 99, else nothing
 *
 * usage: fake-procs-service BUS-ADDRESS
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include "io-util.h"
#include "macro.h"
#include "proc-stream.h"
#include "strv.h"

static const char TEXT[] = "line1\nline2\nline3\n";

/* The shell's stream (pid 50) and where its output is. */
static int shell_fd = -EBADF;
static uint64_t shell_offset;

static int method_start(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        _cleanup_strv_free_ char **argv = NULL;
        int with_stdin = -1, r;
        uint32_t cols = 0, rows = 0;
        const char *id, *cmd = NULL;

        r = sd_bus_message_read(m, "s", &id);
        if (r >= 0)
                r = sd_bus_message_read_strv(m, &argv);
        if (r < 0)
                return r;
        r = sd_bus_message_enter_container(m, 'a', "{sv}");
        if (r < 0)
                return r;
        for (;;) {
                const char *key;

                r = sd_bus_message_enter_container(m, 'e', "sv");
                if (r <= 0)
                        break;
                r = sd_bus_message_read(m, "s", &key);
                if (r >= 0 && strcmp(key, "stdin") == 0)
                        r = sd_bus_message_read(m, "v", "b", &with_stdin);
                else if (r >= 0 && strcmp(key, "cmd") == 0)
                        r = sd_bus_message_read(m, "v", "s", &cmd);
                else if (r >= 0 && strcmp(key, "pty") == 0)
                        r = sd_bus_message_read(m, "v", "(uu)", &cols, &rows);
                else if (r >= 0)
                        r = sd_bus_message_skip(m, "v");
                if (r >= 0)
                        r = sd_bus_message_exit_container(m);
                if (r < 0)
                        return r;
        }
        if (r < 0)
                return r;
        if (with_stdin == 1 && cols == 80 && rows == 24 &&
            ((cmd && strv_length(argv) == 0) ||
             (!cmd && strv_length(argv) == 2 && strcmp(argv[0], "/bin/sh") == 0 && strcmp(argv[1], "-i") == 0)))
                return sd_bus_reply_method_return(m, "u", 50u);
        if (!argv || !argv[0] || with_stdin != 0)
                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "argv and stdin=false wanted");
        return sd_bus_reply_method_return(m, "u", strcmp(argv[0], "exit3") == 0 ? 3u :
                                                  strcmp(argv[0], "term") == 0 ? 15u : 42u);
}

/* One frame, written a byte at a time so that the reader gets it in pieces. */
static int put_frame(int fd, uint8_t kind, uint64_t offset, const void *data, uint32_t len) {
        uint8_t h[PROC_STREAM_HDR_SIZE];
        int r;

        proc_stream_header_encode(h, kind, len, offset);
        for (size_t i = 0; i < sizeof(h); i++) {
                r = loop_write(fd, h + i, 1);
                if (r < 0)
                        return r;
        }
        for (size_t i = 0; i < len; i++) {
                r = loop_write(fd, (const uint8_t *) data + i, 1);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int put_fixed(int fd, size_t (*encode)(uint8_t *, uint64_t, int32_t, int32_t), uint64_t offset, int32_t a,
                     int32_t b) {
        uint8_t f[PROC_STREAM_HDR_SIZE + 8];

        return loop_write(fd, f, encode(f, offset, a, b));
}

static size_t encode_exit(uint8_t *f, uint64_t offset, int32_t code, int32_t sig) {
        return proc_stream_encode_exit(f, offset, code, sig);
}

static size_t encode_gap(uint8_t *f, uint64_t offset, int32_t dropped, int32_t unused) {
        return proc_stream_encode_gap(f, offset, (uint64_t) dropped);
}

static int method_open_stream(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        _cleanup_close_ int ours = -EBADF, theirs = -EBADF;
        const char *id;
        uint32_t pid;
        uint64_t offset;
        int pair[2], r = 0;

        r = sd_bus_message_read(m, "sut", &id, &pid, &offset);
        if (r < 0)
                return r;
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
                return -errno;
        ours = pair[0];
        theirs = pair[1];
        switch (pid) {
        case 3:
                r = put_frame(ours, PROC_STREAM_STDOUT, 0, "out\n", 4);
                if (r >= 0)
                        r = put_frame(ours, PROC_STREAM_STDERR, 4, "err\n", 4);
                if (r >= 0)
                        r = put_fixed(ours, encode_gap, 13, 5, 0);
                if (r >= 0)
                        r = put_frame(ours, PROC_STREAM_STDOUT, 13, "tail\n", 5);
                if (r >= 0)
                        r = put_fixed(ours, encode_exit, 18, 3, 0);
                break;
        case 15:
                r = put_frame(ours, PROC_STREAM_STDOUT, 0, "bye\n", 4);
                if (r >= 0)
                        r = put_fixed(ours, encode_exit, 4, -1, 15);
                break;
        case 42:
                if (offset > strlen(TEXT))
                        return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "offset beyond the end");
                r = put_frame(ours, PROC_STREAM_STDOUT, offset, TEXT + offset, (uint32_t) (strlen(TEXT) - offset));
                if (r >= 0)
                        r = put_fixed(ours, encode_exit, strlen(TEXT), 0, 0);
                break;
        case 66: {
                uint8_t h[PROC_STREAM_HDR_SIZE];

                proc_stream_header_encode(h, PROC_STREAM_STDOUT, 0, 0);
                h[2] = 1;
                r = loop_write(ours, h, sizeof(h));
                break;
        }
        case 67:
                r = put_frame(ours, PROC_STREAM_STDOUT, 0, "cut", 3);
                break;
        case 50:
                safe_close(shell_fd);
                shell_fd = TAKE_FD(ours);
                shell_offset = 0;
                break;
        default:
                return sd_bus_error_set(error, "org.forkd.Error.NoSuchProcess", "no such process");
        }
        if (r < 0)
                return r;
        return sd_bus_reply_method_return(m, "h", theirs);
}

static int method_read(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        static bool forgotten = false;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        const char *id;
        uint32_t pid, max;
        uint64_t offset, start = 0, gap = 0, end = strlen(TEXT), n;
        int r;

        r = sd_bus_message_read(m, "sutu", &id, &pid, &offset, &max);
        if (r < 0)
                return r;
        if (pid == 7)
                start = 4;
        else if (pid == 8 && forgotten)
                return sd_bus_error_set(error, "org.forkd.Error.NoSuchProcess", "no such process");
        else if (pid != 42 && pid != 8)
                return sd_bus_error_set(error, "org.forkd.Error.NoSuchProcess", "no such process");
        if (offset > end)
                return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "offset beyond the end");
        if (offset < start) {
                gap = start - offset;
                offset = start;
        }
        n = MIN(end - offset, (uint64_t) max);
        r = sd_bus_message_new_method_return(m, &reply);
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'a', "(stay)");
        if (r >= 0 && n > 0) {
                r = sd_bus_message_open_container(reply, 'r', "stay");
                if (r >= 0)
                        r = sd_bus_message_append(reply, "st", "stdout", offset);
                if (r >= 0)
                        r = sd_bus_message_append_array(reply, 'y', TEXT + offset, n);
                if (r >= 0)
                        r = sd_bus_message_close_container(reply);
        }
        if (r >= 0)
                r = sd_bus_message_close_container(reply);
        if (pid == 8 && offset + n == end)
                forgotten = true;
        if (r >= 0)
                r = sd_bus_message_append(reply, "ttbii", offset + n, gap, pid == 8, pid == 8 ? 0 : -1, 0);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

static int append_process(sd_bus_message *reply, uint32_t pid, const char *arg0, int running, int code, int sig) {
        int r = sd_bus_message_open_container(reply, 'a', "{sv}");

        if (r >= 0)
                r = sd_bus_message_append(reply, "{sv}{sv}{sv}{sv}{sv}{sv}{sv}{sv}", "pid", "u", pid, "args", "as", 2,
                                          arg0, "-x", "cwd", "s", "/root", "pty", "b", 0, "running", "b", running,
                                          "exit_code", "i", code, "signal", "i", sig, "end_offset", "t",
                                          (uint64_t) 18);
        if (r >= 0)
                r = sd_bus_message_append(reply, "{sv}", "started_usec", "t", (uint64_t) 1700000000000000);
        if (r >= 0)
                r = sd_bus_message_close_container(reply);
        return r;
}

static int method_list(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        int r;

        r = sd_bus_message_new_method_return(m, &reply);
        if (r >= 0)
                r = sd_bus_message_open_container(reply, 'a', "a{sv}");
        if (r >= 0)
                r = append_process(reply, 42, "counter", 1, -1, 0);
        if (r >= 0)
                r = append_process(reply, 15, "sleep", 0, -1, 15);
        if (r >= 0)
                r = sd_bus_message_close_container(reply);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

static int method_signal(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        const char *id, *sig;
        uint32_t pid;
        int r;

        r = sd_bus_message_read(m, "sus", &id, &pid, &sig);
        if (r < 0)
                return r;
        if (pid == 99)
                return sd_bus_error_set(error, "org.forkd.Error.NoSuchProcess", "no such process 99");
        return sd_bus_reply_method_return(m, NULL);
}

static int method_write_stdin(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        const void *data;
        const char *id;
        uint32_t pid;
        size_t len;
        int eof, r;

        r = sd_bus_message_read(m, "su", &id, &pid);
        if (r >= 0)
                r = sd_bus_message_read_array(m, 'y', &data, &len);
        if (r >= 0)
                r = sd_bus_message_read(m, "b", &eof);
        if (r < 0)
                return r;
        if (pid != 50 || shell_fd < 0)
                return sd_bus_error_set(error, "org.forkd.Error.NoSuchProcess", "no such process");
        if (len > 0) {
                r = put_frame(shell_fd, PROC_STREAM_STDOUT, shell_offset, data, (uint32_t) len);
                if (r < 0)
                        return r;
                shell_offset += len;
        }
        if (eof) {
                r = put_fixed(shell_fd, encode_exit, shell_offset, 7, 0);
                shell_fd = safe_close(shell_fd);
                if (r < 0)
                        return r;
        }
        return sd_bus_reply_method_return(m, "u", (uint32_t) len);
}

static const sd_bus_vtable vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_METHOD("StartSandboxProcess", "sasa{sv}", "u", method_start, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD("OpenSandboxOutputStream", "sut", "h", method_open_stream, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD("ReadSandboxOutput", "sutu", "a(stay)ttbii", method_read, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD("ListSandboxProcesses", "s", "aa{sv}", method_list, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD("SignalSandboxProcess", "sus", "", method_signal, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD("WriteSandboxStdin", "suayb", "u", method_write_stdin, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_VTABLE_END,
};

int main(int argc, char *argv[]) {
        sd_event *event = NULL;
        sd_bus *bus = NULL;
        int r;

        if (argc != 2) {
                fprintf(stderr, "usage: fake-procs-service BUS-ADDRESS\n");
                return 2;
        }
        r = sd_event_default(&event);
        if (r >= 0)
                r = sd_bus_new(&bus);
        if (r >= 0)
                r = sd_bus_set_address(bus, argv[1]);
        if (r >= 0)
                r = sd_bus_set_bus_client(bus, 1);
        if (r >= 0)
                r = sd_bus_negotiate_fds(bus, 1);
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
                fprintf(stderr, "fake-procs-service: %s\n", strerror(-r));
        sd_bus_flush_close_unref(bus);
        sd_event_unref(event);
        return r < 0 ? 1 : 0;
}
