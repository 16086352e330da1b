# SPDX-License-Identifier: LGPL-2.1-or-later
"""Typed errors of the forkd SDK.

Every error the SDK raises is a ForkdError. An answer of forkd-rest other than
2xx becomes the subclass for its status, carrying the status and the server's
own message ({"error": "..."}); a call that could not be made or answered at
all has status None.
"""

import json


class ForkdError(Exception):
    """Base of every SDK error.

    status:  the HTTP status (None when no answer came: connection refused,
             a client-side timeout, an argument refused before sending)
    message: the server's message (its {"error": ...}) or the SDK's own
    body:    the decoded error body (a dict, the text when not JSON, or None)
    method, url: the request, when there was one
    """

    def __init__(self, message, status=None, body=None, method=None, url=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.body = body
        self.method = method
        self.url = url

    def __str__(self):
        where = f"{self.method} {self.url}: " if self.method and self.url else ""
        status = f"HTTP {self.status}: " if self.status is not None else ""
        return f"{where}{status}{self.message}"


# forkd's own SDK calls it ControllerError (.status, .body, .url): same class.
ControllerError = ForkdError


class InvalidArgument(ForkdError, ValueError):
    """An argument refused by the SDK before anything was sent (status None)."""


class BadRequest(ForkdError):
    """400: the server refused the request's arguments."""


class Unauthorized(ForkdError):
    """401: no token, or not the server's token."""


class Forbidden(ForkdError):
    """403: polkit (or the bus policy) refused the call."""


class NotFound(ForkdError):
    """404: no such sandbox, snapshot, file, or route."""


class MethodNotAllowed(ForkdError):
    """405."""


class Conflict(ForkdError):
    """409: the tag exists, the snapshot has dependents, the chain is broken, ..."""


class PayloadTooLarge(ForkdError):
    """413: the request body is over the server's cap."""


class ServerError(ForkdError):
    """500 (and any other 5xx without a class of its own): the daemon or the guest failed."""


class Unsupported(ForkdError):
    """501: not supported by this server or this guest."""


class Unavailable(ForkdError):
    """503: the daemon cannot be reached, or too many requests are in flight."""


class Timeout(ForkdError, TimeoutError):
    """504 (the server gave up waiting), or no answer within the SDK's timeout (status None)."""


class ConnectionFailed(ForkdError, ConnectionError):
    """The server could not be reached, or the connection broke (status None)."""


class ProtocolError(ForkdError):
    """The server's answer is not what the API promises (bad JSON, wrong shape, too big)."""


_BY_STATUS = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    500: ServerError,
    501: Unsupported,
    503: Unavailable,
    504: Timeout,
}


def error_for_status(status, data, method, url):
    """The ForkdError subclass instance for an HTTP error answer with body data (bytes)."""
    body = None
    message = None
    if data:
        try:
            body = json.loads(data)
        except ValueError:
            body = data.decode("utf-8", errors="replace")
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        message = body["error"]
    elif isinstance(body, str) and body.strip():
        message = body.strip()[:500]
    if not message:
        message = f"HTTP status {status}"
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else ForkdError
    return cls(message, status=status, body=body, method=method, url=url)
