# SPDX-License-Identifier: LGPL-2.1-or-later
"""Processes in a sandbox with E2B's SDK surface: sandbox.commands and
sandbox.pty, over forkd's REST API v1 for processes (Controller.start_process,
read_output, send_stdin, signal_process, resize_pty, open_tty).

A CommandHandle follows one process: a thread of its own reads the output
(the NDJSON stream, or the terminal's WebSocket for a pty), keeps it, and calls
the callbacks; wait() joins that thread. Iterating a handle yields
(stdout, stderr, pty) triples, one of the three set, from the first output on.
"""

import base64
import codecs
import math
import re
import threading
from dataclasses import dataclass, field

from .controller import (EXEC_TIMEOUT_MAX, PID_HEADER, PID_MAX, PTY_DIM_MAX, STDIN_CHUNK_MAX, _check_int,
                         _check_pid)
from .errors import (ForkdError, InvalidArgument, MethodNotAllowed, NotFound, ProtocolError, Timeout,
                     Unsupported)

__all__ = ["CommandHandle", "CommandResult", "CommandExitException", "ProcessInfo", "PtySize", "Commands", "Pty"]

SIGKILL = 9
# What pty.create runs: bash as a login shell where the image has it, else sh.
# bash where the image has it, else sh: a failed exec would end sh -c itself, so the
# choice is made before either runs.
PTY_SHELL = "if command -v bash >/dev/null 2>&1; then exec bash -i -l; else exec sh -i; fi"
EXIT_REASON_RE = re.compile(r"^(exit_code|signal) (-?[0-9]+)\Z")


@dataclass
class CommandResult:
    """A finished command (E2B's shape, plus forkd's fields).

    exit_code: the exit status; -N when killed by signal N (signal is then N).
    error: None, or a line saying why it failed ("killed by signal 9", the agent's error).
    """

    stdout: str
    stderr: str
    exit_code: int
    error: object = None
    truncated: bool = False   # output cut at the agent's cap (the exec route)
    timed_out: bool = False   # killed at its timeout (the exec route)
    signal: object = None     # the signal that killed it, or None


class CommandExitException(ForkdError):
    """A command ended with a non-zero exit status (E2B's): stdout, stderr,
    exit_code, error and signal as in CommandResult, and the result itself."""

    def __init__(self, result):
        why = result.error or f"exit code {result.exit_code}"
        super().__init__(f"the command failed: {why}")
        self.result = result
        self.stdout = result.stdout
        self.stderr = result.stderr
        self.exit_code = result.exit_code
        self.error = result.error
        self.signal = result.signal


@dataclass
class PtySize:
    """A terminal's size (E2B's PtySize(rows, cols))."""

    rows: int
    cols: int


@dataclass
class ProcessInfo:
    """One entry of commands.list(): cmd is the program (args[0] in the guest),
    args the rest of its argv, as E2B gives them. envs is not kept ({}), tag is None."""

    pid: int
    cmd: str
    args: list
    cwd: str
    envs: dict = field(default_factory=dict)
    tag: object = None
    pty: bool = False
    running: bool = True
    exit_code: object = None
    signal: object = None
    end_offset: int = 0
    started_at_unix: object = None


def _result(stdout, stderr, exit_code, signal, error=None):
    if signal is not None:
        code = -signal
        error = error or f"killed by signal {signal}"
    else:
        code = exit_code
        if code != 0 and error is None:
            error = f"exit code {code}"
    return CommandResult(stdout=stdout, stderr=stderr, exit_code=code, error=error, signal=signal)


def _optional_int(obj, key, what):
    v = obj.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
        raise ProtocolError(f"{what}: {key} is not an integer or null: {str(obj)[:200]}")
    return v


class CommandHandle:
    """A running (or finished) process of a sandbox: commands.run(background=True),
    commands.connect(pid) and pty.create() return one.

    pid; wait() -> CommandResult (raises CommandExitException for a non-zero
    exit); kill() -> bool; send_stdin(data); disconnect() stops following the
    output (the process runs on); for stdout, stderr, pty in handle: ... ;
    stdout, stderr, exit_code, error while or after it runs; dropped: bytes
    the guest's ring dropped before they were read.
    """

    def __init__(self, commands, pid, *, on_stdout=None, on_stderr=None, on_pty=None, tty=None,
                 read_timeout=None, offset=0, stream=None, inline=False):
        self._commands = commands
        self.pid = pid
        self._first = stream         # an output stream already open (exec's), read first
        self._on = {"stdout": on_stdout, "stderr": on_stderr, "pty": on_pty}
        self._tty = tty
        self._read_timeout = read_timeout
        self._offset = offset
        self._events = []
        self._out = {"stdout": [], "stderr": []}
        self._dec = {}
        self._cond = threading.Condition()
        self._done = False
        self._exit = None            # (exit_code, signal) once known
        self._failure = None         # an error of the reader, raised by wait()
        self._callback_error = None  # the first exception a callback raised
        self._disconnected = False
        self._stream = None
        self.dropped = 0
        # inline: no reader thread; wait() reads the output on the caller's thread (a
        # foreground run, which waits at once: a thread would only cost its start)
        self._thread = None
        if not inline:
            self._thread = threading.Thread(target=self._run, name=f"forkd-process-{pid}", daemon=True)
            self._thread.start()

    def __repr__(self):
        state = "running" if not self._done else "disconnected" if self._exit is None else "ended"
        return f"<CommandHandle pid={self.pid} {state}>"

    # ---------------------------------------------------------------- the reader

    def _decode(self, stream, data, final=False):
        dec = self._dec.get(stream)
        if dec is None:
            dec = self._dec[stream] = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return dec.decode(data, final)

    def _emit(self, stream, payload):
        if not payload:
            return
        if stream == "pty":
            triple = (None, None, payload)
        else:
            self._out[stream].append(payload)
            triple = (payload, None, None) if stream == "stdout" else (None, payload, None)
        with self._cond:
            self._events.append(triple)
            self._cond.notify_all()
        cb = self._on.get(stream)
        if cb is not None and self._callback_error is None:
            try:
                cb(payload)
            except Exception as e:  # noqa: BLE001: wait() raises it
                self._callback_error = e

    def _flush_decoders(self):
        for stream in list(self._dec):
            self._emit(stream, self._decode(stream, b"", final=True))
        self._dec.clear()

    def _line(self, obj):
        """One NDJSON object; True at the exit line."""
        what = f"process {self.pid}'s output"
        if "stream" in obj:
            stream = obj["stream"]
            if stream not in ("stdout", "stderr"):
                raise ProtocolError(f"{what}: unknown stream {stream!r}")
            if isinstance(obj.get("data"), str):
                data = obj["data"].encode("utf-8", errors="surrogatepass")
            elif isinstance(obj.get("data_b64"), str):
                try:
                    data = base64.b64decode(obj["data_b64"], validate=True)
                except ValueError as e:
                    raise ProtocolError(f"{what}: data_b64 is not base64") from e
            else:
                raise ProtocolError(f"{what}: a chunk without data or data_b64: {str(obj)[:200]}")
            off = _optional_int(obj, "offset", what)
            if off is not None:
                self._offset = off + len(data)
            else:
                self._offset += len(data)
            self._emit(stream, self._decode(stream, data))
            return False
        if "gap" in obj:
            gap = _optional_int(obj, "gap", what) or 0
            self.dropped += gap
            off = _optional_int(obj, "offset", what)
            self._offset = off if off is not None else self._offset + gap
            self._flush_decoders()  # a character cut by the gap stays cut
            return False
        if "exit_code" in obj or "signal" in obj:
            self._exit = (_optional_int(obj, "exit_code", what), _optional_int(obj, "signal", what))
            return True
        return False  # a line of a later version: ignored

    def _follow_output(self):
        ctl, sid = self._commands._ctl_sid()
        idle = 0
        while not self._disconnected:
            before = self._offset
            if self._first is not None:
                stream, self._first = self._first, None
            elif self.pid is None:
                raise ProtocolError("the output stream broke off, and the server named no pid to follow it again")
            else:
                stream = ctl.read_output(sid, self.pid, offset=self._offset, follow=True,
                                         timeout=self._read_timeout)
            self._stream = stream
            if self._disconnected:
                stream.close()
                return
            with stream:
                for obj in stream:
                    if self._line(obj):
                        return
            if self._disconnected:
                return
            # The body ended without the exit line (the server went, or a proxy
            # cut it): follow again from where it stopped, once without progress.
            idle = idle + 1 if self._offset == before else 0
            if idle > 1:
                raise ProtocolError(f"process {self.pid}'s output ended without its exit status")

    def _follow_tty(self):
        tty = self._tty
        while True:
            data = tty.recv()
            if data is None:
                break
            self._offset += len(data)
            self._emit("pty", data)
        m = EXIT_REASON_RE.match(tty.close_reason or "")
        if m:
            n = int(m.group(2))
            self._exit = (n, None) if m.group(1) == "exit_code" else (None, n)
        elif not self._disconnected:
            raise ProtocolError(f"the terminal of process {self.pid} closed without an exit status "
                                f"(close code {tty.close_code}, reason {tty.close_reason!r})")

    def _run(self):
        try:
            if self._tty is not None:
                self._follow_tty()
            else:
                self._follow_output()
        except Exception as e:  # noqa: BLE001: wait() raises it
            if not self._disconnected:
                self._failure = e
        finally:
            try:
                self._flush_decoders()
            finally:
                with self._cond:
                    self._done = True
                    self._cond.notify_all()

    # ---------------------------------------------------------------- E2B's surface

    def __iter__(self):
        """(stdout, stderr, pty) triples from the first output on, until the end."""
        i = 0
        while True:
            with self._cond:
                while i >= len(self._events) and not self._done:
                    self._cond.wait()
                if i >= len(self._events):
                    break
                ev = self._events[i]
            i += 1
            yield ev
        self._raise_failure()

    def _raise_failure(self):
        if self._failure is not None:
            raise self._failure

    @property
    def stdout(self):
        return "".join(self._out["stdout"])

    @property
    def stderr(self):
        return "".join(self._out["stderr"])

    @property
    def exit_code(self):
        """None while it runs (or when not known); -N when killed by signal N."""
        if self._exit is None:
            return None
        code, sig = self._exit
        return -sig if sig is not None else code

    @property
    def error(self):
        if self._exit is None:
            return None
        return _result("", "", self._exit[0], self._exit[1]).error

    def wait(self, on_stdout=None, on_stderr=None, on_pty=None, timeout=None):
        """Wait for the end: a CommandResult, or CommandExitException for a non-zero
        exit (or a signal). The callbacks given here get the output from the start
        (on the caller's thread, as E2B's wait does). timeout: seconds, then Timeout."""
        if self._thread is None and not self._done:
            self._run()
        if on_stdout or on_stderr or on_pty:
            for out, err, pty in self:
                if out is not None and on_stdout:
                    on_stdout(out)
                elif err is not None and on_stderr:
                    on_stderr(err)
                elif pty is not None and on_pty:
                    on_pty(pty)
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise Timeout(f"process {self.pid} did not end within {timeout:g} s")
        self._raise_failure()
        if self._callback_error is not None:
            raise self._callback_error
        if self._exit is None:
            raise ForkdError(f"process {self.pid}: disconnected before it ended")
        code, sig = self._exit
        if code is None and sig is None:
            raise ProtocolError(f"process {self.pid} ended with neither an exit code nor a signal")
        r = _result(self.stdout, self.stderr, code, sig)
        if r.exit_code != 0:
            raise CommandExitException(r)
        return r

    def kill(self):
        """SIGKILL to the process's group: True, or False when it is gone already."""
        return self._commands.kill(self.pid)

    def send_stdin(self, data):
        """data (str or bytes) to its input (the terminal's, for a pty)."""
        if self._tty is not None and not self._tty.closed:
            self._tty.send(data)
        else:
            self._commands.send_stdin(self.pid, data)

    def close_stdin(self):
        """The end of its input (a pty gets ^D)."""
        self._commands.close_stdin(self.pid)

    def resize(self, size):
        """A pty's size (PtySize, or (cols, rows))."""
        cols, rows = _pty_dims(size)
        if self._tty is not None and not self._tty.closed:
            self._tty.resize(cols, rows)
        else:
            ctl, sid = self._commands._ctl_sid()
            ctl.resize_pty(sid, self.pid, cols, rows)

    def disconnect(self):
        """Stop following the output; the process runs on (commands.connect(pid)
        follows it again)."""
        self._disconnected = True
        if self._tty is not None:
            self._tty.close()
        stream = self._stream
        if stream is not None:
            stream.close()
        if self._thread is not None:
            self._thread.join(5)


def _pty_dims(size):
    if isinstance(size, PtySize):
        cols, rows = size.cols, size.rows
    elif isinstance(size, (tuple, list)) and len(size) == 2:
        cols, rows = size
    else:
        raise InvalidArgument(f"size must be a PtySize(rows, cols), not {size!r}")
    return _check_int(cols, "cols", 1, PTY_DIM_MAX), _check_int(rows, "rows", 1, PTY_DIM_MAX)


def _timeout_secs(timeout):
    """Seconds (a float is rounded up) as the whole seconds of timeout_secs."""
    if isinstance(timeout, float) and math.isfinite(timeout) and timeout >= 0:
        timeout = math.ceil(timeout)
    return timeout


def _no_processes(e):
    """Whether e says the server (or its guest) has no process routes: 501 (a guest
    whose agent runs no processes, such as forkd's test guest), or an older
    forkd-rest without the routes (405, or 404 "no route for")."""
    if isinstance(e, (Unsupported, MethodNotAllowed)):
        return True
    return isinstance(e, NotFound) and (e.message or "").startswith("no route for")


class Commands:
    """sandbox.commands (E2B's)."""

    def __init__(self, sandbox):
        self._sb = sandbox

    def _ctl_sid(self):
        return self._sb._ctl, self._sb._live_id()

    def run(self, cmd, background=False, on_stdout=None, on_stderr=None, envs=None, cwd=None, timeout=60,
            user=None, stdin=False):
        """Run cmd (a string: `/bin/sh -c cmd`; a list: argv) in the sandbox.

        background=False: follow its output (on_stdout / on_stderr get each
        decoded text chunk as it comes, on the handle's thread), wait for the
        end, and return a CommandResult; a non-zero exit raises
        CommandExitException. background=True: return its CommandHandle at once.
        timeout: seconds before the guest kills it (0: never). stdin: keep its
        input open for send_stdin (else it reads /dev/null)."""
        if isinstance(cmd, str):
            kw = {"cmd": cmd}
        elif isinstance(cmd, (list, tuple)):
            kw = {"args": list(cmd)}
        else:
            raise InvalidArgument(f"cmd must be a string (a shell command) or a list (argv), not {type(cmd).__name__}")
        if not isinstance(background, bool):
            raise InvalidArgument(f"background must be a bool, not {background!r}")
        timeout = _timeout_secs(timeout)
        if not background and not envs and cwd is None and user is None and not stdin and \
                isinstance(timeout, int) and not isinstance(timeout, bool) and 1 <= timeout <= EXEC_TIMEOUT_MAX:
            return self._run_streamed(cmd, on_stdout, on_stderr, timeout)
        ctl, sid = self._ctl_sid()
        try:
            r = ctl.start_process(sid, env=envs, cwd=cwd, user=user, timeout_secs=timeout, stdin=stdin, **kw)
        except ForkdError as e:
            if background or envs or cwd is not None or user is not None or stdin or not _no_processes(e):
                raise
            return self._run_exec(cmd, on_stdout, on_stderr, timeout)
        pid = self._pid(r)
        handle = CommandHandle(self, pid, on_stdout=on_stdout, on_stderr=on_stderr,
                               read_timeout=(timeout + 60) if timeout else None)
        if background:
            return handle
        return handle.wait()

    def _run_streamed(self, cmd, on_stdout, on_stderr, timeout):
        """A foreground run in one request: exec with "stream": true. Its answer
        names the process (Forkd-Process-Pid), so that a stream that breaks off
        is followed again from where it stopped, as a background one is."""
        args = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        ctl, sid = self._ctl_sid()
        try:
            stream = ctl.exec_sandbox(sid, args, timeout_secs=timeout, stream=True)
        except ForkdError as e:
            if not _no_processes(e):
                raise
            return self._run_exec(cmd, on_stdout, on_stderr, timeout)
        if not (stream.header("Content-Type") or "").startswith("application/x-ndjson"):
            # A forkd-rest that does not stream exec: its whole answer, at the end.
            with stream:
                return self._exec_result(stream.read_json(), on_stdout, on_stderr)
        pid = stream.header(PID_HEADER)
        pid = int(pid) if pid is not None and pid.isascii() and pid.isdigit() and len(pid) <= 8 else None
        if pid is not None and not 0 < pid <= PID_MAX:
            pid = None
        # no callbacks: read on this thread, which waits anyway (callbacks keep the
        # handle's thread, as a background run's)
        handle = CommandHandle(self, pid, on_stdout=on_stdout, on_stderr=on_stderr, read_timeout=timeout + 60,
                               stream=stream, inline=not on_stdout and not on_stderr)
        return handle.wait()

    def _run_exec(self, cmd, on_stdout, on_stderr, timeout):
        """run() on a server or guest without processes: the exec route, the whole
        output at the end."""
        args = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        ctl, sid = self._ctl_sid()
        return self._exec_result(ctl.exec_sandbox(sid, args, timeout_secs=min(timeout, 3600)), on_stdout, on_stderr)

    @staticmethod
    def _exec_result(r, on_stdout, on_stderr):
        if not isinstance(r, dict):
            raise ProtocolError(f"commands.run: the answer is not an object: {str(r)[:200]}")
        out, err, code = r.get("stdout", ""), r.get("stderr", ""), r.get("exit_code")
        if not isinstance(out, str) or not isinstance(err, str) or isinstance(code, bool) or \
                not isinstance(code, int):
            raise ProtocolError(f"commands.run: the answer is not {{stdout, stderr, exit_code}}: {str(r)[:200]}")
        if out and on_stdout:
            on_stdout(out)
        if err and on_stderr:
            on_stderr(err)
        res = CommandResult(stdout=out, stderr=err, exit_code=code, error=r.get("error"),
                            truncated=bool(r.get("truncated", False)), timed_out=bool(r.get("timed_out", False)))
        if code != 0:
            if res.error is None:
                res.error = f"exit code {code}"
            raise CommandExitException(res)
        return res

    @staticmethod
    def _pid(r):
        pid = r.get("pid") if isinstance(r, dict) else None
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ProtocolError(f"start: the answer has no pid: {str(r)[:200]}")
        return pid

    def list(self):
        """The processes of the sandbox, running and exited-unread: ProcessInfos."""
        ctl, sid = self._ctl_sid()
        r = ctl.list_processes(sid)
        procs = r.get("processes") if isinstance(r, dict) else None
        if not isinstance(procs, list):
            raise ProtocolError(f"commands.list: the answer has no processes: {str(r)[:200]}")
        out = []
        for p in procs:
            if not isinstance(p, dict) or isinstance(p.get("pid"), bool) or not isinstance(p.get("pid"), int) or \
                    not isinstance(p.get("args"), list) or not p["args"]:
                raise ProtocolError(f"commands.list: not a process: {str(p)[:200]}")
            out.append(ProcessInfo(pid=p["pid"], cmd=p["args"][0], args=p["args"][1:], cwd=p.get("cwd") or "",
                                   pty=bool(p.get("pty")), running=bool(p.get("running")),
                                   exit_code=p.get("exit_code"), signal=p.get("signal"),
                                   end_offset=p.get("end_offset") or 0, started_at_unix=p.get("started_at_unix")))
        return out

    def kill(self, pid):
        """SIGKILL to the process pid's group: True, or False when no such process runs."""
        ctl, sid = self._ctl_sid()
        try:
            ctl.signal_process(sid, pid, SIGKILL)
        except NotFound:
            return False
        return True

    def send_stdin(self, pid, data):
        """data (str or bytes) to the input of process pid, in pieces of at most
        64 KiB. Returns the bytes written."""
        ctl, sid = self._ctl_sid()
        _check_pid(pid)
        if isinstance(data, str):
            raw = data.encode("utf-8")
            if len(raw) <= STDIN_CHUNK_MAX:
                return self._written(ctl.send_stdin(sid, pid, data))
        elif isinstance(data, (bytes, bytearray, memoryview)):
            raw = bytes(data)
        else:
            raise InvalidArgument(f"stdin data must be str or bytes, not {type(data).__name__}")
        n = 0
        for i in range(0, max(len(raw), 1), STDIN_CHUNK_MAX):
            n += self._written(ctl.send_stdin(sid, pid, raw[i:i + STDIN_CHUNK_MAX]))
        return n

    @staticmethod
    def _written(r):
        n = r.get("written") if isinstance(r, dict) else None
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ProtocolError(f"send_stdin: the answer has no written count: {str(r)[:200]}")
        return n

    def close_stdin(self, pid):
        """The end of process pid's input (its pipe closes once drained)."""
        ctl, sid = self._ctl_sid()
        ctl.send_stdin(sid, pid, b"", eof=True)

    def connect(self, pid, on_stdout=None, on_stderr=None, timeout=None):
        """A CommandHandle following process pid's output from its start (what the
        guest still keeps of it). timeout: each read's bound (default none)."""
        _check_pid(pid)
        self._ctl_sid()
        return CommandHandle(self, pid, on_stdout=on_stdout, on_stderr=on_stderr, read_timeout=timeout)


class Pty:
    """sandbox.pty (E2B's): interactive shells in a pseudo-terminal."""

    def __init__(self, sandbox):
        self._sb = sandbox
        self._commands = sandbox.commands
        self._handles = {}
        self._lock = threading.Lock()

    def create(self, size=None, on_data=None, cwd=None, envs=None, timeout=60, user=None):
        """A shell (bash -i -l where the image has it, else sh -i) in a terminal of
        size; on_data gets the terminal's bytes as they come (on the handle's
        thread). Returns its CommandHandle (wait() for its end; send_stdin and
        resize go over the terminal's WebSocket). timeout: seconds before the
        guest kills it (0: never). size defaults to 24 rows of 80 columns."""
        cols, rows = _pty_dims(PtySize(rows=24, cols=80) if size is None else size)
        timeout = _timeout_secs(timeout)
        ctl, sid = self._commands._ctl_sid()
        r = ctl.start_process(sid, cmd=PTY_SHELL, env=envs, cwd=cwd, user=user, pty={"cols": cols, "rows": rows},
                              timeout_secs=timeout, stdin=True)
        pid = Commands._pid(r)
        try:
            tty = ctl.open_tty(sid, pid)
        except ForkdError:
            try:
                ctl.signal_process(sid, pid, SIGKILL)
            except ForkdError:
                pass
            raise
        handle = CommandHandle(self._commands, pid, on_pty=on_data, tty=tty)
        with self._lock:
            self._handles = {p: h for p, h in self._handles.items() if not h._done}
            self._handles[pid] = handle
        return handle

    def _handle(self, pid):
        with self._lock:
            h = self._handles.get(pid)
        return h if h is not None and h._tty is not None and not h._tty.closed else None

    def send_stdin(self, pid, data):
        """bytes (or str) typed into the terminal of pty pid: over its WebSocket when
        this Sandbox opened it, else POST .../stdin."""
        if not isinstance(data, (bytes, bytearray, memoryview, str)):
            raise InvalidArgument(f"pty data must be bytes, not {type(data).__name__}")
        _check_pid(pid)
        h = self._handle(pid)
        if h is not None:
            h._tty.send(bytes(data) if not isinstance(data, str) else data)
            return
        self._commands.send_stdin(pid, bytes(data) if not isinstance(data, str) else data)

    def resize(self, pid, size):
        """The terminal's new size (a PtySize)."""
        _check_pid(pid)
        cols, rows = _pty_dims(size)
        h = self._handle(pid)
        if h is not None:
            h._tty.resize(cols, rows)
            return
        ctl, sid = self._commands._ctl_sid()
        ctl.resize_pty(sid, pid, cols, rows)

    def kill(self, pid):
        """SIGKILL to the shell's group: True, or False when it is gone already."""
        return self._commands.kill(pid)
