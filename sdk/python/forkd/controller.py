# SPDX-License-Identifier: LGPL-2.1-or-later
"""Controller: forkd-rest's REST API, one method a route.

The method names, arguments and return values are those of forkd's own Python
SDK (list_snapshots, spawn_sandboxes, branch_sandbox, exec_command, ...): each
returns the server's JSON decoded (a dict or a list; None for 204). Beyond
them: create_snapshot, snapshot_info, compact_snapshot, pack, unpack,
fork_sandbox, run_code, merge, diff, write_file and read_file, for the routes
forkd-rest has beyond forkd's.

Timeouts: every call waits at least `timeout` (the constructor's) for the
answer, and a call the server itself may work on longer waits the server's own
bound for it plus a margin (a spawn or a branch 615 s, an exec or run_code its
timeout_secs + 45 s, pack and unpack an hour per read), so that a slow call
ends with the server's 504 rather than with a request abandoned while the
server still works on it. Every method takes timeout= to override it.
"""

import base64
import http.client
import socket
import json
import os
import re
import ssl
import tempfile
import urllib.parse

from . import errors
from .errors import (ConnectionFailed, InvalidArgument, ProtocolError, Timeout)
from .streams import OutputStream, TtyConnection, WS_HEADER_MAX, ws_accept, ws_key

__all__ = ["Controller", "DEFAULT_URL", "FILE_MAX"]

DEFAULT_URL = "http://127.0.0.1:8889"

# Limits of forkd-rest (src/rest/rest-routes-*.c), checked here before sending.
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}\Z")
FILE_MAX = 512 * 1024          # files.write / files.read: bytes of one file per call
PATH_MAX = 4096
SPAWN_N_MAX = 1000             # POST /v1/sandboxes
FORK_N_MAX = 32                # POST /v1/sandboxes/:id/fork (Podflare's limit)
EXEC_TIMEOUT_MAX = 3600
BOOT_WAIT_MAX = 600
CODE_MAX = 256 * 1024
DIFF_PATHS_MAX = 64
BUNDLE_MAX = 1 << 30
REPLY_MAX = 64 << 20           # the most JSON the SDK reads in one answer
TOKEN_FILE_MAX = 4096

# Processes (forkd's REST API v1 for processes; the guest agent's limits).
PID_MAX = 4194304
PID_HEADER = "Forkd-Process-Pid"  # exec's "stream": true answer names its process
PROC_ARGS_MAX = 4096
PROC_ARGS_BYTES = 128 * 1024   # each argument counts its bytes + 1
PROC_ENV_MAX = 1024
PROC_ENV_BYTES = 128 * 1024    # each entry counts key + value + 2
PROC_TIMEOUT_MAX = 86400
PROC_USER_MAX = 256
STDIN_CHUNK_MAX = 64 * 1024    # one send_stdin, decoded
PTY_DIM_MAX = 1000             # cols and rows: 1 .. this
OFFSET_MAX = 2**63 - 1
SIGNAL_MAX = 64
SIGNAL_NAME_RE = re.compile(r"^(SIG)?[A-Z][A-Z0-9]*([+-][0-9]+)?\Z")

# The server's own bounds (seconds) for the calls that may take long, and the margin.
MARGIN = 15
SERVER_SHORT = 30
SERVER_LONG = 600              # spawn, fork, branch, compact, delete
SERVER_DIFF = 120
SERVER_CREATE_EXTRA = 120      # create waits boot_wait_secs + this
SERVER_PACK = 3600
STREAM_BLOCK = 1 << 20


def _check_name(value, what):
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise InvalidArgument(f"invalid {what} {value!r}: must match ^[A-Za-z0-9_][A-Za-z0-9._-]{{0,63}}$")
    return value


def _check_int(value, what, lo, hi):
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidArgument(f"{what} must be an integer between {lo} and {hi}, not {value!r}")
    return value


RATE_KEYS = ("bandwidth", "ops", "burst")


def _limits(body, cpu_limit, disk_rate, net_rate):
    """cpu_limit (CPUs), disk_rate and net_rate ({"bandwidth", "ops", "burst"}) into
    body where given; their bounds are forkd's, which answers 400 naming the field."""
    if cpu_limit is not None:
        if isinstance(cpu_limit, bool) or not isinstance(cpu_limit, (int, float)):
            raise InvalidArgument(f"cpu_limit must be a number of CPUs, not {cpu_limit!r}")
        body["cpu_limit"] = cpu_limit
    for name, rate in (("disk_rate", disk_rate), ("net_rate", net_rate)):
        if rate is None:
            continue
        if not isinstance(rate, dict) or not rate or any(k not in RATE_KEYS for k in rate):
            raise InvalidArgument(f"{name} must be a dict of some of {', '.join(RATE_KEYS)}, not {rate!r}")
        body[name] = {k: _check_int(v, f"{name}.{k}", 0, 2**63 - 1) for k, v in rate.items()}
    return body


def _check_path(value, what="path"):
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value or len(value.encode()) > PATH_MAX:
        raise InvalidArgument(f"{what} must be an absolute path of at most {PATH_MAX} bytes without NUL, "
                              f"not {value!r}")
    return value


def _check_str(value, what, max_bytes):
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, not {type(value).__name__}")
    if "\0" in value:
        raise InvalidArgument(f"{what} must not contain NUL characters")
    if len(value.encode("utf-8", errors="surrogatepass")) > max_bytes:
        raise InvalidArgument(f"{what} is longer than {max_bytes} bytes")
    return value


def _as_bytes(data, what="data"):
    """str (UTF-8), bytes-like, or a binary file object read to FILE_MAX + 1 bytes."""
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if hasattr(data, "read"):
        b = data.read(FILE_MAX + 1)
        if isinstance(b, str):
            b = b.encode("utf-8")
        if not isinstance(b, (bytes, bytearray)):
            raise InvalidArgument(f"{what}: read() returned {type(b).__name__}, not bytes")
        return bytes(b)
    raise InvalidArgument(f"{what} must be str, bytes or a file object, not {type(data).__name__}")


def _check_pid(pid):
    return _check_int(pid, "pid", 1, PID_MAX)


def _check_pty(pty):
    """(cols, rows), [cols, rows] or {"cols", "rows"} (an object with .cols and
    .rows too: PtySize) into {"cols", "rows"}."""
    if isinstance(pty, dict):
        if set(pty) != {"cols", "rows"}:
            raise InvalidArgument(f'pty must be {{"cols": C, "rows": R}}, not {pty!r}')
        cols, rows = pty["cols"], pty["rows"]
    elif isinstance(pty, (tuple, list)) and len(pty) == 2:
        cols, rows = pty
    elif hasattr(pty, "cols") and hasattr(pty, "rows"):
        cols, rows = pty.cols, pty.rows
    else:
        raise InvalidArgument(f"pty must be (cols, rows) or {{\"cols\", \"rows\"}}, not {pty!r}")
    return {"cols": _check_int(cols, "pty cols", 1, PTY_DIM_MAX), "rows": _check_int(rows, "pty rows", 1, PTY_DIM_MAX)}


def _process_body(args, cmd, cwd, env, user, pty, timeout_secs, stdin):
    """The body of POST .../processes, every field checked against the guest agent's limits."""
    if (args is None) == (cmd is None):
        raise InvalidArgument("give args (a list of strings) or cmd (a shell command), exactly one")
    body = {}
    if args is not None:
        if isinstance(args, str) or not isinstance(args, (list, tuple)) or not 1 <= len(args) <= PROC_ARGS_MAX:
            raise InvalidArgument(f"args must be a list of 1 to {PROC_ARGS_MAX} strings")
        total = 0
        for i, a in enumerate(args):
            _check_str(a, f"args[{i}]", PROC_ARGS_BYTES)
            total += len(a.encode("utf-8", errors="surrogatepass")) + 1
        if total > PROC_ARGS_BYTES:
            raise InvalidArgument(f"args are longer than {PROC_ARGS_BYTES} bytes in all")
        body["args"] = list(args)
    else:
        # It runs as /bin/sh -c cmd: those count too.
        _check_str(cmd, "cmd", PROC_ARGS_BYTES - len("/bin/sh") - len("-c") - 3)
        body["cmd"] = cmd
    if cwd is not None:
        body["cwd"] = _check_str(cwd, "cwd", PATH_MAX)
        if not cwd:
            raise InvalidArgument("cwd must not be empty")
    if env is not None:
        if not isinstance(env, dict) or len(env) > PROC_ENV_MAX:
            raise InvalidArgument(f"env must be a dict of at most {PROC_ENV_MAX} strings")
        total = 0
        for k, v in env.items():
            _check_str(k, "env key", PROC_ENV_BYTES)
            if not k or "=" in k:
                raise InvalidArgument(f"env key {k!r} must be non-empty and without '='")
            _check_str(v, f"env[{k!r}]", PROC_ENV_BYTES)
            total += len(k.encode("utf-8", errors="surrogatepass")) + len(v.encode("utf-8", errors="surrogatepass")) + 2
        if total > PROC_ENV_BYTES:
            raise InvalidArgument(f"env is longer than {PROC_ENV_BYTES} bytes in all")
        body["env"] = dict(env)
    if user is not None:
        _check_str(user, "user", PROC_USER_MAX)
        if not user:
            raise InvalidArgument("user must not be empty")
        body["user"] = user
    if pty is not None:
        body["pty"] = _check_pty(pty)
    if timeout_secs is not None:
        body["timeout_secs"] = _check_int(timeout_secs, "timeout_secs", 0, PROC_TIMEOUT_MAX)
    if stdin is not None:
        if not isinstance(stdin, bool):
            raise InvalidArgument(f"stdin must be a bool, not {stdin!r}")
        body["stdin"] = stdin
    return body


def _read_token_file(path):
    try:
        with open(path, "rb") as f:
            raw = f.read(TOKEN_FILE_MAX + 1)
    except OSError as e:
        raise InvalidArgument(f"cannot read the token file {path}: {e.strerror}") from e
    if len(raw) > TOKEN_FILE_MAX:
        raise InvalidArgument(f"the token file {path} is larger than {TOKEN_FILE_MAX} bytes")
    token = raw.decode("utf-8", errors="replace").strip()
    if not token:
        raise InvalidArgument(f"the token file {path} is empty")
    return token


class Controller:
    """Client of forkd-rest.

    base_url: defaults to $FORKD_URL, then http://127.0.0.1:8889 (http or https;
              a path prefix is kept, for a proxy).
    token:    the bearer token; defaults to $FORKD_TOKEN, then the contents of
              the file $FORKD_TOKEN_FILE; none when neither is set.
    timeout:  the least time (seconds) any call waits for its answer (60).
    ssl_context: for https, an ssl.SSLContext (default: the system's CAs).
    """

    def __init__(self, base_url=None, token=None, timeout=60.0, ssl_context=None):
        url = (base_url or os.environ.get("FORKD_URL") or DEFAULT_URL).rstrip("/")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgument(f"base_url must be http://HOST[:PORT] or https://HOST[:PORT], not {url!r}")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise InvalidArgument(f"base_url must not carry a query, fragment or user: {url!r}")
        try:
            port = parts.port
        except ValueError as e:
            raise InvalidArgument(f"base_url has an invalid port: {url!r}") from e
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise InvalidArgument(f"timeout must be a positive number of seconds, not {timeout!r}")
        if token is None:
            token = os.environ.get("FORKD_TOKEN") or None
            if token is None and os.environ.get("FORKD_TOKEN_FILE"):
                token = _read_token_file(os.environ["FORKD_TOKEN_FILE"])
        if token is not None and (not isinstance(token, str) or any(c in token for c in "\r\n\0")):
            raise InvalidArgument("token must be a string without CR, LF or NUL")
        self.base_url = url
        self.token = token or None
        self.timeout = float(timeout)
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port
        self._prefix = parts.path.rstrip("/")
        self._ssl_context = ssl_context

    def __repr__(self):
        return f"Controller({self.base_url!r})"

    # ------------------------------------------------------------ service

    def healthz(self):
        """GET /healthz: {"ok": true} (no token needed)."""
        return self._call("GET", "/healthz")

    def version(self):
        """GET /version: {"version", "api"}."""
        return self._call("GET", "/version")

    # ------------------------------------------------------------ snapshots

    def list_snapshots(self):
        """GET /v1/snapshots: every snapshot (list of SnapshotInfo)."""
        return self._call("GET", "/v1/snapshots")

    def create_snapshot(self, tag, kernel, rootfs, boot_wait_secs=None, mem_mib=None, timeout=None):
        """POST /v1/snapshots: boot kernel + rootfs (paths on the server's machine, opened
        with forkd-rest's rights) and snapshot the guest once its agent answers.
        Returns the SnapshotInfo (201)."""
        body = {"tag": _check_name(tag, "tag"), "kernel": _check_path(kernel, "kernel"),
                "rootfs": _check_path(rootfs, "rootfs")}
        if boot_wait_secs is not None:
            body["boot_wait_secs"] = _check_int(boot_wait_secs, "boot_wait_secs", 1, BOOT_WAIT_MAX)
        if mem_mib is not None:
            body["mem_mib"] = _check_int(mem_mib, "mem_mib", 1, 1024 * 1024)
        wait = (boot_wait_secs or SERVER_SHORT) + SERVER_CREATE_EXTRA + MARGIN
        return self._call("POST", "/v1/snapshots", body, timeout=self._timeout(timeout, wait))

    def delete_snapshot(self, tag, cascade=False, force=False, timeout=None):
        """DELETE /v1/snapshots/:tag. A snapshot with dependents is a Conflict (409)
        unless cascade (delete them too) or force (orphan them)."""
        query = {}
        if cascade:
            query["cascade"] = "true"
        if force:
            query["force"] = "true"
        if cascade and force:
            raise InvalidArgument("cascade and force are mutually exclusive")
        self._call("DELETE", f"/v1/snapshots/{_check_name(tag, 'tag')}", query=query,
                   timeout=self._timeout(timeout, SERVER_LONG + MARGIN))

    def snapshot_info(self, tag):
        """GET /v1/snapshots/:tag/info: SnapshotInfo with its chain (ancestors,
        dependents, chain_depth)."""
        return self._call("GET", f"/v1/snapshots/{_check_name(tag, 'tag')}/info")

    def compact_snapshot(self, tag, to, timeout=None):
        """POST /v1/snapshots/:tag/compact: a new flat snapshot `to` of the chain
        head `tag`. Returns its SnapshotInfo (201)."""
        _check_name(tag, "tag")
        _check_name(to, "to")
        if to == tag:
            raise InvalidArgument("to must name a new snapshot, not the tag itself")
        return self._call("POST", f"/v1/snapshots/{tag}/compact", {"to": to},
                          timeout=self._timeout(timeout, SERVER_LONG + MARGIN))

    def pack(self, tag, out, timeout=None):
        """GET /v1/snapshots/:tag/pack: the bundle (tar + zstd) of tag and its
        ancestors, streamed into out: a path (written to a temporary file beside
        it and renamed into place only when whole) or a binary file object.
        Returns the number of bytes written."""
        path = f"/v1/snapshots/{_check_name(tag, 'tag')}/pack"
        t = self._timeout(timeout, SERVER_PACK + MARGIN)
        if hasattr(out, "write"):
            return self._download(path, out, t)
        if not isinstance(out, (str, os.PathLike)):
            raise InvalidArgument(f"out must be a path or a binary file object, not {type(out).__name__}")
        out = os.fspath(out)
        d = os.path.dirname(os.path.abspath(out))
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(out) + ".", suffix=".part", dir=d)
        try:
            with os.fdopen(fd, "wb") as f:
                n = self._download(path, f, t)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, out)
            tmp = None
            return n
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def unpack(self, bundle, tag=None, timeout=None):
        """POST /v1/snapshots/unpack: register the snapshots of a bundle (a path, bytes,
        or a seekable binary file object), under tag when given (a bundle of one
        snapshot only). Returns their SnapshotInfos, the chain's root first (201)."""
        query = {"tag": _check_name(tag, "tag")} if tag is not None else None
        t = self._timeout(timeout, SERVER_PACK + MARGIN)
        if isinstance(bundle, (bytes, bytearray, memoryview)):
            data = bytes(bundle)
            if len(data) > BUNDLE_MAX:
                raise InvalidArgument(f"the bundle is larger than {BUNDLE_MAX} bytes")
            return self._call("POST", "/v1/snapshots/unpack", query=query, timeout=t, raw=data,
                              content_type="application/zstd")
        if isinstance(bundle, (str, os.PathLike)):
            with open(bundle, "rb") as f:
                return self._unpack_file(f, query, t)
        if hasattr(bundle, "read") and hasattr(bundle, "seek"):
            return self._unpack_file(bundle, query, t)
        raise InvalidArgument("bundle must be a path, bytes or a seekable binary file object")

    def _unpack_file(self, f, query, t):
        start = f.tell()
        size = f.seek(0, os.SEEK_END) - start
        f.seek(start)
        if size > BUNDLE_MAX:
            raise InvalidArgument(f"the bundle is larger than {BUNDLE_MAX} bytes ({size})")
        return self._call("POST", "/v1/snapshots/unpack", query=query, timeout=t, raw=f, raw_len=size,
                          content_type="application/zstd")

    # ------------------------------------------------------------ sandboxes

    def spawn_sandboxes(self, snapshot_tag, n=1, per_child_netns=False, memory_limit_mib=None, prewarm=False,
                        live_fork=False, hugepages=False, timeout=None, cpu_limit=None, disk_rate=None,
                        net_rate=None):
        """POST /v1/sandboxes: fork n sandboxes from a snapshot. Returns their
        SandboxInfos (id, snapshot_tag, pid, created_at_unix, ...). prewarm,
        live_fork and hugepages are sent only when set, as forkd's SDK does.
        cpu_limit (CPUs), disk_rate and net_rate ({"bandwidth": bytes/s, "ops":
        ops/s, "burst": bytes}) limit each child, where given."""
        body = {"snapshot_tag": _check_name(snapshot_tag, "snapshot_tag"), "n": _check_int(n, "n", 1, SPAWN_N_MAX),
                "per_child_netns": bool(per_child_netns)}
        if memory_limit_mib is not None:
            body["memory_limit_mib"] = _check_int(memory_limit_mib, "memory_limit_mib", 0, 2**32 - 1)
        if prewarm:
            body["prewarm"] = True
        if live_fork:
            body["live_fork"] = True
        if hugepages:
            body["hugepages"] = True
        _limits(body, cpu_limit, disk_rate, net_rate)
        return self._call("POST", "/v1/sandboxes", body, timeout=self._timeout(timeout, SERVER_LONG + MARGIN))

    def list_sandboxes(self):
        """GET /v1/sandboxes: every live sandbox."""
        return self._call("GET", "/v1/sandboxes")

    def get_sandbox(self, sandbox_id):
        """GET /v1/sandboxes/:id: one SandboxInfo."""
        return self._call("GET", f"/v1/sandboxes/{_check_name(sandbox_id, 'sandbox id')}")

    def set_limits(self, sandbox_id, cpu_limit=None, disk_rate=None, net_rate=None, memory_limit_mib=None):
        """PATCH /v1/sandboxes/:id: change a sandbox's limits live (cpu_limit 0
        removes it; a rate of all zeros removes it). Returns its SandboxInfo."""
        body = _limits({}, cpu_limit, disk_rate, net_rate)
        if memory_limit_mib is not None:
            body["memory_limit_mib"] = _check_int(memory_limit_mib, "memory_limit_mib", 0, 2**32 - 1)
        if not body:
            raise InvalidArgument("give at least one of cpu_limit, disk_rate, net_rate and memory_limit_mib")
        return self._call("PATCH", f"/v1/sandboxes/{_check_name(sandbox_id, 'sandbox id')}", body)

    def kill_sandbox(self, sandbox_id):
        """DELETE /v1/sandboxes/:id."""
        self._call("DELETE", f"/v1/sandboxes/{_check_name(sandbox_id, 'sandbox id')}")

    def branch_sandbox(self, sandbox_id, tag=None, diff=False, measure_diff=False, mode=None, wait=True,
                       timeout=None):
        """POST /v1/sandboxes/:id/branch: a new snapshot of the running sandbox
        (mode "full", "diff" or "live"; the sandbox runs on). Returns its
        SnapshotInfo (201); pass its tag to spawn_sandboxes."""
        sid = _check_name(sandbox_id, "sandbox id")
        body = {}
        if tag is not None:
            body["tag"] = _check_name(tag, "tag")
        if mode is not None:
            if mode not in ("full", "diff", "live"):
                raise InvalidArgument(f'mode must be "full", "diff" or "live", not {mode!r}')
            body["mode"] = mode
        elif diff:
            body["diff"] = True
        if measure_diff:
            body["measure_diff"] = True
        if not wait:
            body["wait"] = False
        return self._call("POST", f"/v1/sandboxes/{sid}/branch", body,
                          timeout=self._timeout(timeout, SERVER_LONG + MARGIN))

    def fork_sandbox(self, sandbox_id, n=1, timeout=None, cpu_limit=None, disk_rate=None, net_rate=None):
        """POST /v1/sandboxes/:id/fork (Podflare's): n children of the running
        sandbox, each with its state at the fork. Returns {"children": [ids]}.
        The children keep the source's limits but for those given here."""
        sid = _check_name(sandbox_id, "sandbox id")
        body = _limits({"n": _check_int(n, "n", 1, FORK_N_MAX)}, cpu_limit, disk_rate, net_rate)
        r = self._call("POST", f"/v1/sandboxes/{sid}/fork", body, timeout=self._timeout(timeout, SERVER_LONG + MARGIN))
        if not isinstance(r, dict) or not isinstance(r.get("children"), list) or \
                not all(isinstance(c, str) and NAME_RE.match(c) for c in r["children"]):
            raise ProtocolError(f"fork: the answer has no list of child ids: {str(r)[:200]}")
        return r

    def expose_port(self, sandbox_id, port):
        """POST /v1/sandboxes/:id/ports: "host:port" where this host reaches the
        guest's TCP port (a sandbox of a snapshot made with network)."""
        body = {"port": _check_int(port, "port", 1, 65535)}
        return self._call("POST", f"/v1/sandboxes/{_check_name(sandbox_id, 'sandbox id')}/ports", body)["host_addr"]

    def ping_sandbox(self, sandbox_id):
        """POST /v1/sandboxes/:id/ping: the guest agent's answer."""
        return self._call("POST", f"/v1/sandboxes/{_check_name(sandbox_id, 'sandbox id')}/ping")

    def exec_sandbox(self, sandbox_id, args, timeout_secs=30, timeout=None, stream=False):
        """POST /v1/sandboxes/:id/exec: run argv in the guest; the agent's answer
        ({stdout, stderr, exit_code, ...}). With stream=True the command runs as a
        background process and the answer is its output as it comes: an
        OutputStream of the objects read_output(follow=True) yields, whose
        header(PID_HEADER) is the process's pid."""
        sid = _check_name(sandbox_id, "sandbox id")
        if isinstance(args, str) or not isinstance(args, (list, tuple)) or not args or len(args) > 4096:
            raise InvalidArgument("args must be a list of 1 to 4096 strings")
        args = [_check_str(a, f"args[{i}]", 1 << 20) for i, a in enumerate(args)]
        _check_int(timeout_secs, "timeout_secs", 0, EXEC_TIMEOUT_MAX)
        if not isinstance(stream, bool):
            raise InvalidArgument(f"stream must be a bool, not {stream!r}")
        wait = (timeout_secs or 30) + 30 + MARGIN
        if stream:
            # Each read may wait as long as the command runs quietly.
            return self._stream("POST", f"/v1/sandboxes/{sid}/exec", None,
                                {"args": args, "timeout_secs": timeout_secs, "stream": True},
                                None if timeout_secs == 0 and timeout is None else self._timeout(timeout, wait))
        return self._call("POST", f"/v1/sandboxes/{sid}/exec", {"args": args, "timeout_secs": timeout_secs},
                          timeout=self._timeout(timeout, wait))

    exec_command = exec_sandbox  # forkd's SDK's name

    def eval_sandbox(self, sandbox_id, code, timeout=None):
        """POST /v1/sandboxes/:id/eval: evaluate an expression in the guest's
        interpreter; the agent's answer ({result, error, exit_code, ...})."""
        sid = _check_name(sandbox_id, "sandbox id")
        _check_str(code, "code", CODE_MAX)
        return self._call("POST", f"/v1/sandboxes/{sid}/eval", {"code": code},
                          timeout=self._timeout(timeout, SERVER_SHORT + MARGIN))

    eval_code = eval_sandbox  # forkd's SDK's name

    def run_code(self, sandbox_id, code, timeout_secs=None, timeout=None):
        """POST /v1/sandboxes/:id/run_code: run statements in the guest's REPL,
        globals kept between calls. Returns {stdout, stderr, error, exit_code}
        (and truncated, timed_out)."""
        sid = _check_name(sandbox_id, "sandbox id")
        body = {"code": _check_str(code, "code", CODE_MAX)}
        if timeout_secs is not None:
            body["timeout_secs"] = _check_int(timeout_secs, "timeout_secs", 0, EXEC_TIMEOUT_MAX)
        wait = (timeout_secs or 30) + 30 + MARGIN
        return self._call("POST", f"/v1/sandboxes/{sid}/run_code", body, timeout=self._timeout(timeout, wait))

    def merge(self, sandbox_id, winner, timeout=None):
        """POST /v1/sandboxes/:id/merge: sandbox_id takes over winner's VM (its own VM
        is destroyed, winner's id is gone). Returns sandbox_id's new SandboxInfo."""
        sid = _check_name(sandbox_id, "sandbox id")
        _check_name(winner, "winner")
        if winner == sid:
            raise InvalidArgument("winner must be another sandbox than the one merged into")
        return self._call("POST", f"/v1/sandboxes/{sid}/merge", {"winner": winner},
                          timeout=self._timeout(timeout, SERVER_SHORT + MARGIN))

    def diff(self, sandbox_id, other, paths=None, timeout=None):
        """POST /v1/sandboxes/:id/diff: files of other compared with sandbox_id's under
        paths (default /root and /tmp): {"added", "removed", "modified"}."""
        sid = _check_name(sandbox_id, "sandbox id")
        body = {"other": _check_name(other, "other")}
        if paths is not None:
            if isinstance(paths, str) or not isinstance(paths, (list, tuple)) or not 1 <= len(paths) <= DIFF_PATHS_MAX:
                raise InvalidArgument(f"paths must be a list of 1 to {DIFF_PATHS_MAX} absolute paths")
            body["paths"] = [_check_path(p, f"paths[{i}]") for i, p in enumerate(paths)]
        return self._call("POST", f"/v1/sandboxes/{sid}/diff", body,
                          timeout=self._timeout(timeout, SERVER_DIFF + MARGIN))

    def write_file(self, sandbox_id, path, data, mode=None, timeout=None):
        """POST /v1/sandboxes/:id/files/write: create or replace the file path in the
        guest with data (str as UTF-8, bytes, or a binary file object), at most
        FILE_MAX (512 KiB) bytes. Returns {"path", "size"}."""
        sid = _check_name(sandbox_id, "sandbox id")
        _check_path(path)
        raw = _as_bytes(data)
        if len(raw) > FILE_MAX:
            raise InvalidArgument(f"files.write: {path}: more than {FILE_MAX} bytes in one call "
                                  f"(the server refuses it with 413); write less")
        body = {"path": path, "data_b64": base64.b64encode(raw).decode("ascii")}
        if mode is not None:
            body["mode"] = _check_int(mode, "mode", 0, 0o7777)
        return self._call("POST", f"/v1/sandboxes/{sid}/files/write", body,
                          timeout=self._timeout(timeout, SERVER_SHORT + MARGIN))

    def read_file(self, sandbox_id, path, timeout=None):
        """POST /v1/sandboxes/:id/files/read: the bytes of the file path in the guest
        (at most FILE_MAX; a larger file is refused with 413, a missing one 404)."""
        sid = _check_name(sandbox_id, "sandbox id")
        _check_path(path)
        r = self._call("POST", f"/v1/sandboxes/{sid}/files/read", {"path": path},
                       timeout=self._timeout(timeout, SERVER_SHORT + MARGIN))
        if not isinstance(r, dict) or not isinstance(r.get("data_b64"), str):
            raise ProtocolError(f"files.read: the answer has no data_b64: {str(r)[:200]}")
        try:
            data = base64.b64decode(r["data_b64"], validate=True)
        except ValueError as e:
            raise ProtocolError(f"files.read: data_b64 is not base64: {e}") from e
        if len(data) > FILE_MAX:
            raise ProtocolError(f"files.read: {len(data)} bytes, more than the {FILE_MAX} of the API")
        if "size" in r and r["size"] != len(data):
            raise ProtocolError(f"files.read: size {r['size']!r} but {len(data)} bytes of data")
        return data

    # ------------------------------------------------------------ processes

    def start_process(self, sandbox_id, args=None, cmd=None, cwd=None, env=None, user=None, pty=None,
                      timeout_secs=None, stdin=None, timeout=None):
        """POST /v1/sandboxes/:id/processes: start a background process, argv args
        or the shell command cmd (`/bin/sh -c cmd`), exactly one. env: a dict of
        strings added to the image's; pty: (cols, rows) or {"cols", "rows"};
        timeout_secs 0..86400 (0: none); stdin False gives it /dev/null.
        Returns {"pid": n} (201)."""
        sid = _check_name(sandbox_id, "sandbox id")
        body = _process_body(args, cmd, cwd, env, user, pty, timeout_secs, stdin)
        return self._call("POST", f"/v1/sandboxes/{sid}/processes", body,
                          timeout=self._timeout(timeout, SERVER_SHORT + MARGIN))

    def list_processes(self, sandbox_id, timeout=None):
        """GET /v1/sandboxes/:id/processes: {"processes": [{"pid", "args", "cwd", "pty",
        "running", "exit_code", "signal", "end_offset", "started_at_unix"}]}."""
        sid = _check_name(sandbox_id, "sandbox id")
        return self._call("GET", f"/v1/sandboxes/{sid}/processes", timeout=self._timeout(timeout, SERVER_SHORT + MARGIN))

    def read_output(self, sandbox_id, pid, offset=0, follow=False, timeout=None):
        """GET /v1/sandboxes/:id/processes/:pid/output: an OutputStream (iterate it)
        of the NDJSON objects, each as soon as its line arrived:
        {"stream", "offset", "data"} or {"stream", "offset", "data_b64"}, {"gap",
        "offset"}, and last {"exit_code", "signal"} once the process ended. Without
        follow: what is there now; with follow: until the end. An HTTP error is
        raised here, before the stream is returned. timeout: each read's bound
        (default: none with follow, as a quiet process sends nothing for long)."""
        sid = _check_name(sandbox_id, "sandbox id")
        _check_pid(pid)
        _check_int(offset, "offset", 0, OFFSET_MAX)
        if not isinstance(follow, bool):
            raise InvalidArgument(f"follow must be a bool, not {follow!r}")
        query = {"offset": str(offset), "follow": "true" if follow else "false"}
        if timeout is not None:
            t = self._timeout(timeout, 0)
        else:
            t = None if follow else self._timeout(None, SERVER_SHORT + MARGIN)
        return self._stream("GET", f"/v1/sandboxes/{sid}/processes/{pid}/output", query, None, t)

    def send_stdin(self, sandbox_id, pid, data=b"", eof=False, timeout=None):
        """POST /v1/sandboxes/:id/processes/:pid/stdin: data (str, sent as text, or
        bytes, as base64; at most 64 KiB encoded as UTF-8 / decoded), then the end
        of the input when eof. Returns {"written": n}."""
        sid = _check_name(sandbox_id, "sandbox id")
        _check_pid(pid)
        if not isinstance(eof, bool):
            raise InvalidArgument(f"eof must be a bool, not {eof!r}")
        if isinstance(data, str):
            if len(data.encode("utf-8", errors="surrogatepass")) > STDIN_CHUNK_MAX:
                raise InvalidArgument(f"stdin data is longer than {STDIN_CHUNK_MAX} bytes in one call")
            try:
                data.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InvalidArgument(f"stdin data is not encodable as UTF-8: {e}") from e
            body = {"data": data}
        elif isinstance(data, (bytes, bytearray, memoryview)):
            data = bytes(data)
            if len(data) > STDIN_CHUNK_MAX:
                raise InvalidArgument(f"stdin data is longer than {STDIN_CHUNK_MAX} bytes in one call")
            body = {"data_b64": base64.b64encode(data).decode("ascii")}
        else:
            raise InvalidArgument(f"stdin data must be str or bytes, not {type(data).__name__}")
        if eof:
            body["eof"] = True
        return self._call("POST", f"/v1/sandboxes/{sid}/processes/{pid}/stdin", body,
                          timeout=self._timeout(timeout, SERVER_SHORT + MARGIN))

    def signal_process(self, sandbox_id, pid, signal="SIGTERM", timeout=None):
        """POST /v1/sandboxes/:id/processes/:pid/signal: signal (a name, "SIGTERM" or
        "TERM", or a number 1..64) to the process's group (204: None)."""
        sid = _check_name(sandbox_id, "sandbox id")
        _check_pid(pid)
        if isinstance(signal, str):
            if not SIGNAL_NAME_RE.match(signal) or len(signal) > 32:
                raise InvalidArgument(f'signal must be a name ("SIGTERM", "TERM") or a number 1..{SIGNAL_MAX}, '
                                      f'not {signal!r}')
        else:
            _check_int(signal, "signal", 1, SIGNAL_MAX)
        return self._call("POST", f"/v1/sandboxes/{sid}/processes/{pid}/signal", {"signal": signal},
                          timeout=self._timeout(timeout, SERVER_SHORT + MARGIN))

    def resize_pty(self, sandbox_id, pid, cols, rows, timeout=None):
        """POST /v1/sandboxes/:id/processes/:pid/resize: the pty's size, cols and
        rows 1..1000 (204: None)."""
        sid = _check_name(sandbox_id, "sandbox id")
        _check_pid(pid)
        body = {"cols": _check_int(cols, "cols", 1, PTY_DIM_MAX), "rows": _check_int(rows, "rows", 1, PTY_DIM_MAX)}
        return self._call("POST", f"/v1/sandboxes/{sid}/processes/{pid}/resize", body,
                          timeout=self._timeout(timeout, SERVER_SHORT + MARGIN))

    def open_tty(self, sandbox_id, pid, timeout=None):
        """GET /v1/sandboxes/:id/processes/:pid/tty as a WebSocket: a TtyConnection
        (send, resize, recv, close). timeout bounds the handshake; reads then
        wait without a bound."""
        sid = _check_name(sandbox_id, "sandbox id")
        _check_pid(pid)
        t = self._timeout(timeout, SERVER_SHORT + MARGIN)
        path = f"/v1/sandboxes/{sid}/processes/{pid}/tty"
        url = self.base_url + path
        key = ws_key()
        conn = self._connection(t)
        try:
            conn.connect()
            sock = conn.sock
            host = self._host if ":" not in self._host else f"[{self._host}]"
            if self._port is not None:
                host += f":{self._port}"
            lines = [f"GET {self._prefix + path} HTTP/1.1", f"Host: {host}", "Upgrade: websocket",
                     "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
            if self.token:
                lines.append("Authorization: Bearer " + self.token)
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            buf = bytearray()
            while b"\r\n\r\n" not in buf:
                if len(buf) > WS_HEADER_MAX:
                    raise ProtocolError(f"the WebSocket answer's header is larger than {WS_HEADER_MAX} bytes",
                                        method="GET", url=url)
                b = sock.recv(4096)
                if not b:
                    raise ConnectionFailed("the server closed the connection during the WebSocket handshake",
                                           method="GET", url=url)
                buf += b
            end = buf.index(b"\r\n\r\n")
            head = bytes(buf[:end]).decode("latin-1").split("\r\n")
            rest = bytes(buf[end + 4:])
            parts = head[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise ProtocolError(f"not an HTTP answer: {head[0][:200]!r}", method="GET", url=url)
            status = int(parts[1])
            headers = {}
            for h in head[1:]:
                k, sep, v = h.partition(":")
                if sep:
                    headers[k.strip().lower()] = v.strip()
            if status != 101:
                body = rest
                n = headers.get("content-length")
                if n and n.isdigit():
                    want = min(int(n), REPLY_MAX)
                    while len(body) < want:
                        b = sock.recv(65536)
                        if not b:
                            break
                        body += b
                    body = body[:want]
                raise errors.error_for_status(status, body, "GET", url)
            if headers.get("upgrade", "").lower() != "websocket" or \
                    "upgrade" not in [x.strip() for x in headers.get("connection", "").lower().split(",")]:
                raise ProtocolError("the server did not upgrade the connection to a WebSocket", method="GET", url=url)
            if headers.get("sec-websocket-accept") != ws_accept(key):
                raise ProtocolError("the server's Sec-WebSocket-Accept does not match our key", method="GET", url=url)
            sock.settimeout(None)
            tty = TtyConnection(sock, rest, url)
            conn.sock = None  # the TtyConnection owns the socket now
            return tty
        except TimeoutError as e:
            raise Timeout(f"no answer within {t:g} s", method="GET", url=url) from e
        except (OSError, http.client.HTTPException) as e:
            raise ConnectionFailed(f"cannot talk to forkd-rest at {self.base_url}: {e}", method="GET", url=url) from e
        finally:
            conn.close()

    # ------------------------------------------------------------ HTTP

    def _timeout(self, override, wait):
        if override is not None:
            if isinstance(override, bool) or not isinstance(override, (int, float)) or not override > 0:
                raise InvalidArgument(f"timeout must be a positive number of seconds, not {override!r}")
            return float(override)
        return max(self.timeout, float(wait))

    def _connection(self, timeout):
        if self._https:
            ctx = self._ssl_context or ssl.create_default_context()
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=ctx,
                                               blocksize=STREAM_BLOCK)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout, blocksize=STREAM_BLOCK)

    def _open(self, method, path, query, body, headers, timeout):
        """Send the request; (connection, response) with the status read."""
        target = self._prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        url = self.base_url + path
        hdrs = {"Accept": "application/json"}
        if self.token:
            hdrs["Authorization"] = "Bearer " + self.token
        hdrs.update(headers)
        conn = self._connection(timeout)
        try:
            try:
                conn.request(method, target, body=body, headers=hdrs)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered early (413, 401): read that answer below
            sock = conn.sock
            resp = conn.getresponse()
            # An answer with "Connection: close" takes the socket from conn: keep
            # it reachable, so that a stream can be shut down from another thread.
            resp.forkd_sock = sock
            return conn, resp
        except TimeoutError as e:
            conn.close()
            raise Timeout(f"no answer within {timeout:g} s", method=method, url=url) from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise ConnectionFailed(f"cannot talk to forkd-rest at {self.base_url}: {e}", method=method,
                                   url=url) from e

    def _read(self, resp, limit, method, url, timeout):
        try:
            data = resp.read(limit + 1)
        except TimeoutError as e:
            raise Timeout(f"no answer within {timeout:g} s", method=method, url=url) from e
        except (OSError, http.client.HTTPException) as e:
            raise ConnectionFailed(f"the answer broke off: {e}", method=method, url=url) from e
        if len(data) > limit:
            raise ProtocolError(f"the answer is larger than {limit} bytes", status=resp.status, method=method,
                                url=url)
        return data

    def _call(self, method, path, body=None, *, query=None, timeout=None, raw=None, raw_len=None,
              content_type=None):
        """One request; the decoded JSON answer (None when empty), or a ForkdError."""
        timeout = self.timeout if timeout is None else timeout
        headers = {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        elif raw is not None:
            data = raw
            headers["Content-Type"] = content_type or "application/octet-stream"
            if raw_len is not None:
                headers["Content-Length"] = str(raw_len)
        url = self.base_url + path
        conn, resp = self._open(method, path, query, data, headers, timeout)
        try:
            payload = self._read(resp, REPLY_MAX, method, url, timeout)
        finally:
            conn.close()
        if not 200 <= resp.status < 300:
            raise errors.error_for_status(resp.status, payload, method, url)
        if not payload:
            return None
        try:
            return json.loads(payload)
        except ValueError as e:
            raise ProtocolError(f"the answer is not JSON: {payload[:200]!r}", status=resp.status, method=method,
                                url=url) from e

    def _download(self, path, out, timeout):
        url = self.base_url + path
        conn, resp = self._open("GET", path, None, None, {"Accept": "application/zstd"}, timeout)
        try:
            if resp.status != 200:
                payload = self._read(resp, REPLY_MAX, "GET", url, timeout)
                raise errors.error_for_status(resp.status, payload, "GET", url)
            n = 0
            while True:
                try:
                    block = resp.read(STREAM_BLOCK)
                except TimeoutError as e:
                    raise Timeout(f"the bundle stalled for {timeout:g} s", method="GET", url=url) from e
                except (OSError, http.client.HTTPException) as e:
                    raise ProtocolError(f"the bundle broke off after {n} bytes (the server failed while "
                                        f"packing, or the connection was lost): {e}", method="GET", url=url) from e
                if not block:
                    return n
                n += len(block)
                if n > BUNDLE_MAX:
                    raise ProtocolError(f"the bundle is larger than {BUNDLE_MAX} bytes", method="GET", url=url)
                out.write(block)
        finally:
            conn.close()

    def _stream(self, method, path, query, body, timeout):
        """A request whose 200 answer is NDJSON read as it comes: an OutputStream.
        An error answer is raised here. timeout None: reads wait without a bound."""
        url = self.base_url + path
        headers = {"Accept": "application/x-ndjson"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn, resp = self._open(method, path, query, data, headers, timeout if timeout is not None else
                                socket.getdefaulttimeout())
        try:
            if resp.status != 200:
                payload = self._read(resp, REPLY_MAX, method, url, timeout)
                raise errors.error_for_status(resp.status, payload, method, url)
        except BaseException:
            conn.close()
            raise
        return OutputStream(conn, resp, method, url, timeout)
