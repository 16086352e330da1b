# SPDX-License-Identifier: LGPL-2.1-or-later
"""forkd's Python SDK: a client of forkd-rest, standard library only.

- Controller: the REST API one method a route, with forkd's own SDK's names
  (list_snapshots, spawn_sandboxes, branch_sandbox, exec_command, ...).
- Sandbox: one sandbox, with E2B's surface (Sandbox.create, commands and pty
  (forkd.commands: CommandHandle, CommandResult, CommandExitException,
  ProcessInfo, PtySize), files.write/read, run_code) and Podflare's fan-out (fork, diff, merge_into,
  branch).
- Typed errors: ForkdError and one subclass per HTTP status (NotFound,
  Conflict, BadRequest, Unauthorized, Timeout, ...), each with .status and
  the server's .message.

The server is $FORKD_URL (default http://127.0.0.1:8889) with the bearer
token $FORKD_TOKEN (or the contents of $FORKD_TOKEN_FILE).
"""

from .controller import Controller, DEFAULT_URL, FILE_MAX
from .errors import (BadRequest, Conflict, ConnectionFailed, ControllerError, Forbidden, ForkdError,
                     InvalidArgument, MethodNotAllowed, NotFound, PayloadTooLarge, ProtocolError, ServerError,
                     Timeout, Unauthorized, Unavailable, Unsupported)
from .commands import CommandExitException, CommandHandle, CommandResult, ProcessInfo, PtySize
from .sandbox import Execution, Sandbox
from .streams import OutputStream, TtyConnection

__version__ = "0.1.0"
__all__ = [
    "Controller", "Sandbox", "CommandResult", "Execution", "DEFAULT_URL", "FILE_MAX",
    "CommandHandle", "CommandExitException", "ProcessInfo", "PtySize", "OutputStream", "TtyConnection",
    "ForkdError", "ControllerError", "InvalidArgument", "BadRequest", "Unauthorized", "Forbidden", "NotFound",
    "MethodNotAllowed", "Conflict", "PayloadTooLarge", "ServerError", "Unsupported", "Unavailable", "Timeout",
    "ConnectionFailed", "ProtocolError",
]
