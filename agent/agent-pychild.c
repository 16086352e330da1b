/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent-pychild.h"
#include "agent-spawn.h"
#include "io-util.h"
#include "json-util.h"
#include "macro.h"

/* Runs in the image's python3 as __main__ of "-c"; the user's code runs in a
 * module of its own, registered as __main__. Written for 3.8 and later, and
 * parseable by older ones, which then say so in their hello. */
const char pychild_bootstrap[] =
        "import sys\n"
        "def _forkd_main():\n"
        "    import os, struct, json\n"
        "    rfd, wfd = int(sys.argv[1]), int(sys.argv[2])\n"
        "    os.set_inheritable(rfd, False)\n"
        "    os.set_inheritable(wfd, False)\n"
        "    def send(obj):\n"
        "        b = json.dumps(obj, ensure_ascii=False).encode('utf-8', 'backslashreplace')\n"
        "        b = struct.pack('>I', len(b)) + b\n"
        "        while b:\n"
        "            b = b[os.write(wfd, b):]\n"
        "    def recv_exact(n):\n"
        "        parts = []\n"
        "        while n:\n"
        "            b = os.read(rfd, n)\n"
        "            if not b:\n"
        "                raise EOFError\n"
        "            parts.append(b)\n"
        "            n -= len(b)\n"
        "        return b''.join(parts)\n"
        "    def recv():\n"
        "        n = struct.unpack('>I', recv_exact(4))[0]\n"
        "        return json.loads(recv_exact(n).decode('utf-8'))\n"
        "    hello = {'hello': 1, 'version': '%d.%d.%d' % tuple(sys.version_info[:3]),\n"
        "             'executable': sys.executable, 'numpy': None, 'ok': sys.version_info >= (3, 8)}\n"
        "    if not hello['ok']:\n"
        "        send(hello)\n"
        "        return\n"
        "    import builtins, io, signal, traceback, types\n"
        "    CAP = int(sys.argv[3])\n"
        "    class Capped(io.TextIOBase):\n"
        "        def __init__(self, cap):\n"
        "            super().__init__()\n"
        "            self._parts = []\n"
        "            self._n = 0\n"
        "            self._cap = cap\n"
        "            self.truncated = False\n"
        "        @property\n"
        "        def encoding(self):\n"
        "            return 'utf-8'\n"
        "        def writable(self):\n"
        "            return True\n"
        "        def isatty(self):\n"
        "            return False\n"
        "        def write(self, s):\n"
        "            if not isinstance(s, str):\n"
        "                raise TypeError('write() argument must be str, not ' + type(s).__name__)\n"
        "            n = len(s)\n"
        "            room = self._cap - self._n\n"
        "            if n > room:\n"
        "                s = s[:max(room, 0)]\n"
        "                self.truncated = True\n"
        "            if s:\n"
        "                self._parts.append(s)\n"
        "                self._n += len(s)\n"
        "            return n\n"
        "        def flush(self):\n"
        "            pass\n"
        "        def getvalue(self):\n"
        "            return ''.join(self._parts)\n"
        "    state = {'armed': False, 'fired': False}\n"
        "    def on_alarm(signum, frame):\n"
        "        if state['armed']:\n"
        "            state['fired'] = True\n"
        "            raise KeyboardInterrupt('timeout')\n"
        "    signal.signal(signal.SIGALRM, on_alarm)\n"
        "    def text(s, st):\n"
        "        b = s.encode('utf-8', 'backslashreplace')\n"
        "        if len(b) > 4 * CAP:\n"
        "            b = b[:4 * CAP]\n"
        "            st['truncated'] = True\n"
        "        return b.decode('utf-8', 'ignore')\n"
        "    def describe(e):\n"
        "        try:\n"
        "            only = traceback.format_exception_only(type(e), e)\n"
        "            line = only[-1].strip() if only else type(e).__name__\n"
        "        except BaseException:\n"
        "            line = type(e).__name__\n"
        "        try:\n"
        "            tb = ''.join(traceback.format_exception(type(e), e, e.__traceback__))\n"
        "        except BaseException:\n"
        "            tb = line + '\\n'\n"
        "        return line, tb\n"
        "    main = types.ModuleType('__main__')\n"
        "    main.__dict__['__builtins__'] = builtins\n"
        "    sys.modules['__main__'] = main\n"
        "    g_main = main.__dict__\n"
        "    numpy = None\n"
        "    try:\n"
        "        import numpy\n"
        "        g_main['numpy'] = g_main['np'] = numpy\n"
        "        hello['numpy'] = str(numpy.__version__)\n"
        "    except BaseException:\n"
        "        numpy = None\n"
        "    sys.argv = ['']\n"
        "    sys.stdin = io.StringIO('')\n"
        "    me = os.getpid()\n"
        "    def run(op, code, timeout):\n"
        "        is_eval = op != 'run_code'\n"
        "        if op == 'eval_fresh':\n"
        "            g = {'__builtins__': builtins}\n"
        "            if numpy is not None:\n"
        "                g['numpy'] = g['np'] = numpy\n"
        "        else:\n"
        "            g = g_main\n"
        "        o = {'result': None, 'error': None, 'exit_code': 0, 'stdout': '', 'stderr': '',\n"
        "             'truncated': False, 'timed_out': False}\n"
        "        out, err = Capped(CAP), Capped(CAP)\n"
        "        old_out, old_err = sys.stdout, sys.stderr\n"
        "        sys.stdout, sys.stderr = out, err\n"
        "        exc = None\n"
        "        rep = None\n"
        "        state['fired'] = False\n"
        "        state['armed'] = True\n"
        "        try:\n"
        "            signal.setitimer(signal.ITIMER_REAL, timeout, 0.1)\n"
        "            co = compile(code, '<eval>' if is_eval else '<run_code>', 'eval' if is_eval else 'exec')\n"
        "            v = eval(co, g, g)\n"
        "            if is_eval:\n"
        "                rep = repr(v)\n"
        "        except BaseException as e:\n"
        "            exc = e\n"
        "        finally:\n"
        "            state['armed'] = False\n"
        "            signal.setitimer(signal.ITIMER_REAL, 0, 0)\n"
        "        if os.getpid() != me:\n"
        "            os._exit(1 if exc is not None else 0)\n"
        "        if exc is None:\n"
        "            if is_eval:\n"
        "                o['result'] = text(rep, o)\n"
        "        elif state['fired'] and isinstance(exc, KeyboardInterrupt):\n"
        "            o['error'] = 'TimeoutError: code ran longer than %d s' % timeout\n"
        "            o['exit_code'] = 124\n"
        "            o['timed_out'] = True\n"
        "            err.write(o['error'] + '\\n')\n"
        "        elif isinstance(exc, SystemExit):\n"
        "            c = exc.code\n"
        "            if c is None:\n"
        "                o['exit_code'] = 0\n"
        "            elif isinstance(c, int):\n"
        "                o['exit_code'] = max(min(c, 2147483647), -2147483648)\n"
        "            else:\n"
        "                try:\n"
        "                    err.write(str(c) + '\\n')\n"
        "                except BaseException:\n"
        "                    pass\n"
        "                o['exit_code'] = 1\n"
        "            if o['exit_code'] != 0:\n"
        "                o['error'] = 'SystemExit: %d' % o['exit_code']\n"
        "        else:\n"
        "            line, tb = describe(exc)\n"
        "            o['error'] = text(line, {})[:4096]\n"
        "            err.write(tb)\n"
        "            o['exit_code'] = 1\n"
        "        exc = None\n"
        "        sys.stdout, sys.stderr = old_out, old_err\n"
        "        o['stdout'] = text(out.getvalue(), o)\n"
        "        o['stderr'] = text(err.getvalue(), o)\n"
        "        if out.truncated or err.truncated:\n"
        "            o['truncated'] = True\n"
        "        return o\n"
        "    def reseed():\n"
        "        m = sys.modules.get('random')\n"
        "        if m is not None:\n"
        "            m.seed(os.urandom(32))\n"
        "        m = sys.modules.get('numpy.random')\n"
        "        if m is not None:\n"
        "            m.seed(int.from_bytes(os.urandom(4), 'little'))\n"
        "        m = sys.modules.get('tempfile')\n"
        "        if m is not None:\n"
        "            m._name_sequence = None\n"
        "    send(hello)\n"
        "    while True:\n"
        "        try:\n"
        "            req = recv()\n"
        "        except EOFError:\n"
        "            os._exit(0)\n"
        "        if req.get('op') == 'reseed':\n"
        "            try:\n"
        "                reseed()\n"
        "            except BaseException:\n"
        "                pass\n"
        "            send({'ok': True})\n"
        "            continue\n"
        "        send(run(req.get('op'), req.get('code', ''), int(req.get('timeout', 30))))\n"
        "_forkd_main()\n";

void pychild_done(PyChild *c) {
        c->to_fd = safe_close(c->to_fd);
        c->from_fd = safe_close(c->from_fd);
        free(c->path);
        free(c->version);
        free(c->numpy_version);
        c->path = c->version = c->numpy_version = NULL;
}

void pychild_stop(PyChild *c, bool reaped) {
        if (c->pid > 0 && !reaped && !c->reaped) {
                (void) kill(c->pid, SIGKILL);
                while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR)
                        ;
        }
        c->pid = 0;
        c->reaped = false;
        pychild_done(c);
}

bool pychild_reaped(PyChild *c, pid_t pid, int status) {
        if (c->pid <= 0 || c->pid != pid || c->reaped)
                return false;
        c->reaped = true;
        c->status = status;
        return true;
}

int pychild_find(const char *path, char **ret) {
        return find_in_path("python3", path, ret);
}

/* Wait until fd is readable or deadline (CLOCK_MONOTONIC usec) passes. */
static int wait_readable(int fd, uint64_t deadline) {
        for (;;) {
                struct pollfd p = { .fd = fd, .events = POLLIN };
                uint64_t now = now_usec();
                int r;

                if (now >= deadline)
                        return -ETIMEDOUT;
                r = poll(&p, 1, (int) MIN((deadline - now + 999) / 1000, (uint64_t) INT32_MAX));
                if (r < 0 && errno != EINTR)
                        return -errno;
                if (r > 0)
                        return 0;
        }
}

/* Exactly len bytes by deadline: -EPIPE at end of file. */
static int read_exact_until(int fd, void *buf, size_t len, uint64_t deadline) {
        uint8_t *p = buf;

        while (len > 0) {
                ssize_t n;
                int r = wait_readable(fd, deadline);

                if (r < 0)
                        return r;
                n = read(fd, p, len);
                if (n < 0) {
                        if (errno == EINTR || errno == EAGAIN)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        return -EPIPE;
                p += n;
                len -= (size_t) n;
        }
        return 0;
}

static int recv_frame(PyChild *c, uint64_t deadline, struct json_object **ret) {
        _cleanup_free_ char *buf = NULL;
        struct json_tokener *tok;
        struct json_object *o;
        uint8_t hdr[4];
        uint32_t n;
        int r;

        r = read_exact_until(c->from_fd, hdr, sizeof hdr, deadline);
        if (r < 0)
                return r;
        n = (uint32_t) hdr[0] << 24 | (uint32_t) hdr[1] << 16 | (uint32_t) hdr[2] << 8 | hdr[3];
        if (n == 0 || n > PYCHILD_REPLY_MAX)
                return -EPROTO;
        buf = malloc(n);
        if (!buf)
                return -ENOMEM;
        r = read_exact_until(c->from_fd, buf, n, deadline);
        if (r < 0)
                return r;
        tok = json_tokener_new_ex(16);
        if (!tok)
                return -ENOMEM;
        o = json_tokener_parse_ex(tok, buf, (int) n);
        if (o && json_tokener_get_parse_end(tok) != n) {
                json_object_put(o);
                o = NULL;
        }
        json_tokener_free(tok);
        if (!o || !json_object_is_type(o, json_type_object)) {
                json_object_put(o);
                return -EPROTO;
        }
        *ret = o;
        return 0;
}

static int send_frame(PyChild *c, struct json_object *o) {
        const char *s;
        size_t n;
        uint8_t hdr[4];
        int r;

        s = json_object_to_json_string_length(o, JSON_C_TO_STRING_PLAIN, &n);
        if (!s)
                return -ENOMEM;
        hdr[0] = (uint8_t) (n >> 24);
        hdr[1] = (uint8_t) (n >> 16);
        hdr[2] = (uint8_t) (n >> 8);
        hdr[3] = (uint8_t) n;
        r = loop_write(c->to_fd, hdr, sizeof hdr);
        if (r >= 0)
                r = loop_write(c->to_fd, s, n);
        return r;
}

static char *dup_string(struct json_object *o, const char *key) {
        struct json_object *v;

        if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
                return NULL;
        return strdup(json_object_get_string(v));
}

int pychild_start(PyChild *c, const char *python, char *const *env, const char *cwd, const UserIds *user) {
        _cleanup_(json_object_putp) struct json_object *hello = NULL;
        char cap[16];
        int to[2] = { -EBADF, -EBADF }, from[2] = { -EBADF, -EBADF }, r;
        struct json_object *ok;
        pid_t pid;

        *c = PYCHILD_NULL;
        (void) snprintf(cap, sizeof cap, "%u", PYCHILD_OUTPUT_CAP);
        if (pipe2(to, O_CLOEXEC) < 0 || pipe2(from, O_CLOEXEC) < 0) {
                r = -errno;
                goto fail_pipes;
        }

        char *argv[] = { (char *) "python3", (char *) "-c", (char *) pychild_bootstrap,
                         (char *) "3", (char *) "4", cap, NULL };
        SpawnParams p = SPAWN_PARAMS_INIT;
        p.path = python;
        p.argv = argv;
        p.envp = env;
        p.cwd = cwd;
        p.user = user;
        p.stdout_fd = STDERR_FILENO; /* what it prints outside a call: the console */
        p.fd3 = to[0];
        p.fd4 = from[1];
        p.new_session = true; /* no signal for the agent's group reaches it */
        r = agent_spawn(&p, &pid);
        safe_close(to[0]);
        safe_close(from[1]);
        if (r < 0) {
                safe_close(to[1]);
                safe_close(from[0]);
                return r;
        }
        c->pid = pid;
        c->to_fd = to[1];
        c->from_fd = from[0];
        c->path = strdup(python);
        if (!c->path) {
                pychild_stop(c, false);
                return -ENOMEM;
        }

        r = recv_frame(c, now_usec() + PYCHILD_HELLO_USEC, &hello);
        if (r < 0) {
                pychild_stop(c, false);
                /* a python that exits at once without a word cannot run our bootstrap: too old */
                return r == -EPIPE || r == -EPROTO ? -EPROTONOSUPPORT : r;
        }
        c->version = dup_string(hello, "version");
        c->numpy_version = dup_string(hello, "numpy");
        if (!c->version || !json_object_object_get_ex(hello, "ok", &ok) || !json_object_get_boolean(ok)) {
                pychild_stop(c, false);
                return -EPROTONOSUPPORT;
        }
        return 0;

fail_pipes:
        safe_close(to[0]);
        safe_close(to[1]);
        safe_close(from[0]);
        safe_close(from[1]);
        return r;
}

int pychild_call(PyChild *c, const char *op, const char *code, unsigned timeout_secs,
                 struct json_object **ret, int *ret_status) {
        _cleanup_(json_object_putp) struct json_object *req = NULL;
        uint64_t deadline;
        int r, status;

        *ret_status = -1;
        if (c->pid <= 0)
                return -EPIPE;
        if (c->reaped) {
                *ret_status = c->status;
                pychild_stop(c, true);
                return -EPIPE;
        }
        req = json_object_new_object();
        if (!req)
                return -ENOMEM;
        json_object_object_add(req, "op", json_object_new_string(op));
        if (code) {
                json_object_object_add(req, "code", json_object_new_string(code));
                json_object_object_add(req, "timeout", json_object_new_int64(timeout_secs));
        }

        deadline = now_usec() + (uint64_t) MAX(timeout_secs, 1u) * USEC_PER_SEC + PYCHILD_GRACE_USEC;
        r = send_frame(c, req);
        if (r >= 0)
                r = recv_frame(c, deadline, ret);
        if (r >= 0)
                return 0;
        if (r == -ENOMEM)
                return r;

        if (r == -EPIPE) {
                /* it is gone (or going): its status, then the pipes */
                pid_t p;

                do
                        p = waitpid(c->pid, &status, 0);
                while (p < 0 && errno == EINTR);
                if (p == c->pid)
                        *ret_status = status;
                else if (c->reaped)
                        *ret_status = c->status;
                pychild_stop(c, true);
                return -EPIPE;
        }
        pychild_stop(c, false);
        return r == -ETIMEDOUT ? r : -EPIPE;
}
