# SPDX-License-Identifier: LGPL-2.1-or-later
"""Sandbox: one forkd sandbox, with E2B's surface (create, commands, pty,
files.write/read, run_code) and Podflare's fan-out (fork, diff, merge_into,
branch), over forkd-rest (see Controller)."""

import os
from dataclasses import dataclass

from .commands import CommandResult, Commands, Pty
from .controller import Controller, FILE_MAX, _check_name
from .errors import ForkdError, InvalidArgument, NotFound, ProtocolError

__all__ = ["Sandbox", "CommandResult", "Execution"]


@dataclass
class Execution:
    """What sandbox.run_code() returns: the code's output, and error (None, or the
    exception's text, "NameError: ...") with exit_code 1 when it raised."""

    stdout: str
    stderr: str
    error: object
    exit_code: int
    truncated: bool = False
    timed_out: bool = False

    @property
    def text(self):
        """stdout, for E2B's execution.text."""
        return self.stdout


def _str_field(r, key, what):
    v = r.get(key, "") if isinstance(r, dict) else None
    if not isinstance(v, str):
        raise ProtocolError(f"{what}: the answer's {key} is not a string: {str(r)[:200]}")
    return v


def _int_field(r, key, what):
    v = r.get(key) if isinstance(r, dict) else None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ProtocolError(f"{what}: the answer's {key} is not an integer: {str(r)[:200]}")
    return v


class Files:
    """sandbox.files (E2B's): one file of at most 512 KiB a call."""

    MAX = FILE_MAX

    def __init__(self, sandbox):
        self._sb = sandbox

    def write(self, path, data, mode=None):
        """Create or replace the file path (absolute) with data: str (UTF-8), bytes or
        a binary file object. Over 512 KiB is refused before anything is sent
        (InvalidArgument). Returns {"path", "size"}."""
        return self._sb._ctl.write_file(self._sb._live_id(), path, data, mode=mode)

    def read(self, path, format="text"):
        """The file's contents: str (UTF-8; format="text") or bytes (format="bytes").
        A missing file is NotFound."""
        if format not in ("text", "bytes"):
            raise InvalidArgument(f'format must be "text" or "bytes", not {format!r}')
        data = self._sb._ctl.read_file(self._sb._live_id(), path)
        return data if format == "bytes" else data.decode("utf-8", errors="replace")


class Sandbox:
    """One sandbox.

    Sandbox(snapshot_tag) / Sandbox.create(snapshot_tag) forks a new sandbox
    from the snapshot (default: $FORKD_SNAPSHOT); Sandbox.connect(sandbox_id)
    drives an existing one. The server is $FORKD_URL with $FORKD_TOKEN unless
    base_url/token or a Controller (controller=) are given. As a context
    manager, the sandbox is closed (deleted) on exit.
    """

    def __init__(self, snapshot_tag=None, *, sandbox_id=None, controller=None, base_url=None, token=None,
                 timeout=60.0, memory_limit_mib=None, per_child_netns=False, info=None):
        self._ctl = controller if controller is not None else Controller(base_url=base_url, token=token,
                                                                         timeout=timeout)
        self._closed = False
        self._defunct = False
        self.commands = Commands(self)
        self.pty = Pty(self)
        self.files = Files(self)
        if sandbox_id is not None:
            if snapshot_tag is not None:
                raise InvalidArgument("give a snapshot_tag (a new sandbox) or a sandbox_id (an existing one), "
                                      "not both")
            self.id = _check_name(sandbox_id, "sandbox id")
            self._info = info
            return
        tag = snapshot_tag or os.environ.get("FORKD_SNAPSHOT")
        if not tag:
            raise InvalidArgument("no snapshot to create the sandbox from: pass snapshot_tag or set FORKD_SNAPSHOT")
        sbs = self._ctl.spawn_sandboxes(tag, n=1, per_child_netns=per_child_netns,
                                        memory_limit_mib=memory_limit_mib)
        if not isinstance(sbs, list) or len(sbs) != 1 or not isinstance(sbs[0], dict) or \
                not isinstance(sbs[0].get("id"), str):
            raise ProtocolError(f"spawn: expected one SandboxInfo, got {str(sbs)[:200]}")
        self.id = _check_name(sbs[0]["id"], "sandbox id")
        self._info = sbs[0]

    @classmethod
    def create(cls, snapshot_tag=None, **kwargs):
        """A new sandbox forked from snapshot_tag (E2B's Sandbox.create)."""
        return cls(snapshot_tag, **kwargs)

    @classmethod
    def connect(cls, sandbox_id, **kwargs):
        """The existing sandbox sandbox_id."""
        return cls(sandbox_id=sandbox_id, **kwargs)

    def __repr__(self):
        state = " closed" if self._closed else " merged" if self._defunct else ""
        return f"<Sandbox {self.id}{state}>"

    @property
    def sandbox_id(self):
        return self.id

    @property
    def controller(self):
        return self._ctl

    @property
    def info(self):
        """The SandboxInfo (fetched again: pid, memory limit, ...)."""
        self._info = self._ctl.get_sandbox(self._live_id())
        return self._info

    def _live_id(self):
        if self._defunct:
            raise InvalidArgument(f"sandbox {self.id} was merged into another one; use that one")
        if self._closed:
            raise InvalidArgument(f"sandbox {self.id} is closed")
        return self.id

    def _peer_id(self, other, what):
        if isinstance(other, Sandbox):
            return other._live_id()
        return _check_name(other, what)

    # ---------------------------------------------------------------- E2B

    def run_code(self, code, timeout=None):
        """Run Python statements (the test guest: its tiny language) in the sandbox's
        REPL; globals persist between calls and into forks. An exception in the
        code is not raised: it is the result's error (exit_code 1)."""
        r = self._ctl.run_code(self._live_id(), code, timeout_secs=timeout)
        err = r.get("error") if isinstance(r, dict) else None
        if err is not None and not isinstance(err, str):
            raise ProtocolError(f"run_code: the answer's error is not a string or null: {str(r)[:200]}")
        return Execution(stdout=_str_field(r, "stdout", "run_code"), stderr=_str_field(r, "stderr", "run_code"),
                         error=err, exit_code=_int_field(r, "exit_code", "run_code"),
                         truncated=bool(r.get("truncated", False)), timed_out=bool(r.get("timed_out", False)))

    def eval(self, code):
        """Evaluate an expression in the guest's interpreter: the agent's answer."""
        return self._ctl.eval_sandbox(self._live_id(), code)

    def ping(self):
        return self._ctl.ping_sandbox(self._live_id())

    def is_running(self):
        """Whether the server still knows this sandbox."""
        if self._closed or self._defunct:
            return False
        try:
            self._ctl.get_sandbox(self.id)
            return True
        except NotFound:
            return False

    # ---------------------------------------------------------------- Podflare

    def fork(self, n=1, cpu_limit=None, disk_rate=None, net_rate=None):
        """n children (1 to 32), each starting from this sandbox's state now
        (memory: REPL globals, files); returns them as Sandboxes. They keep this
        sandbox's limits but for those given (Controller.spawn_sandboxes says how)."""
        r = self._ctl.fork_sandbox(self._live_id(), n, cpu_limit=cpu_limit, disk_rate=disk_rate, net_rate=net_rate)
        return [Sandbox(sandbox_id=cid, controller=self._ctl) for cid in r["children"]]

    def set_limits(self, cpu_limit=None, disk_rate=None, net_rate=None, memory_limit_mib=None):
        """Change this sandbox's limits while it runs; returns its SandboxInfo."""
        return self._ctl.set_limits(self._live_id(), cpu_limit=cpu_limit, disk_rate=disk_rate, net_rate=net_rate,
                                    memory_limit_mib=memory_limit_mib)

    def diff(self, other, paths=None):
        """Files of other compared with this sandbox's, under paths (default /root and
        /tmp): {"added": [...], "removed": [...], "modified": [...]}, each sorted."""
        return self._ctl.diff(self._live_id(), self._peer_id(other, "other"), paths=paths)

    def merge_into(self, winner):
        """Make winner's state this sandbox's: this id now drives winner's VM (this
        one's VM is destroyed), and winner is spent (its close() does nothing)."""
        wid = self._peer_id(winner, "winner")
        self._info = self._ctl.merge(self._live_id(), wid)
        if isinstance(winner, Sandbox):
            winner._defunct = True
        return self

    def branch(self, tag=None, mode="full"):
        """A new snapshot of this running sandbox (mode "full", "diff" or "live");
        the sandbox runs on. Returns its SnapshotInfo (its "tag" is what
        Sandbox.create takes)."""
        return self._ctl.branch_sandbox(self._live_id(), tag=tag, mode=mode)

    # ---------------------------------------------------------------- lifetime

    def close(self):
        """Delete the sandbox. Idempotent; a sandbox already gone, or spent by
        merge_into, is not an error."""
        if self._closed or self._defunct:
            self._closed = True
            return
        try:
            self._ctl.kill_sandbox(self.id)
        except NotFound:
            pass
        self._closed = True

    kill = close  # E2B's and forkd's SDKs' name

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.close()
        except ForkdError:
            if exc_type is None:
                raise
