# SPDX-License-Identifier: LGPL-2.1-or-later
"""Long-lived answers of forkd-rest: a process's output as NDJSON (OutputStream)
and a terminal over a WebSocket (TtyConnection, RFC 6455, client side).

Both can be closed from another thread than the one reading them: close()
shuts the socket down, which ends a read blocked on it.
"""

import base64
import hashlib
import http.client
import json
import os
import socket
import struct
import threading

from .errors import ConnectionFailed, ProtocolError, Timeout

__all__ = ["OutputStream", "TtyConnection", "NDJSON_LINE_MAX", "WS_FRAME_MAX"]

# One NDJSON line: a chunk of at most 256 KiB as JSON text (escapes included)
# or base64, with room to spare.
NDJSON_LINE_MAX = 4 << 20
# One WebSocket message from the server (a frame of the output stream is at
# most 256 KiB; a close frame at most 125 bytes).
WS_FRAME_MAX = 1 << 20
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
WS_HEADER_MAX = 16 * 1024

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def _shutdown(sock):
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class OutputStream:
    """The NDJSON answer of GET .../processes/:pid/output (or of exec with
    stream=True): iterating yields each line's object as soon as its line has
    arrived, until the body ends. close() ends it early (from any thread)."""

    def __init__(self, conn, resp, method, url, timeout):
        self._conn = conn
        self._resp = resp
        self._method = method
        self._url = url
        self._timeout = timeout
        self._closed = False
        self._reading = False
        self._lock = threading.Lock()
        self.ended = False       # the body ended (not closed early)

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            with self._lock:
                if self._closed:
                    raise StopIteration
                self._reading = True
            failure = None
            try:
                line = self._resp.readline(NDJSON_LINE_MAX + 1)
            except Exception as e:  # noqa: BLE001: sorted out below
                failure = e
            with self._lock:
                self._reading = False
                closed = self._closed
            if closed:
                # close() came from another thread while this one read: the
                # connection is this thread's to close now.
                self._resp.close()
                self._conn.close()
                raise StopIteration
            if isinstance(failure, TimeoutError):
                self.close()
                raise Timeout(f"no output within {self._timeout:g} s", method=self._method,
                              url=self._url) from failure
            if isinstance(failure, (OSError, ValueError, http.client.HTTPException)):
                self.close()
                raise ConnectionFailed(f"the output stream broke off: {failure}", method=self._method,
                                       url=self._url) from failure
            if failure is not None:
                self.close()
                raise failure
            if not line:
                self.ended = True
                self.close()
                raise StopIteration
            if len(line) > NDJSON_LINE_MAX:
                self.close()
                raise ProtocolError(f"an output line is longer than {NDJSON_LINE_MAX} bytes", method=self._method,
                                    url=self._url)
            if not line.endswith(b"\n"):
                # The body ended inside a line: the server or the connection failed.
                self.close()
                raise ProtocolError("the output stream ended inside a line", method=self._method, url=self._url)
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                self.close()
                raise ProtocolError(f"an output line is not JSON: {line[:200]!r}", method=self._method,
                                    url=self._url) from e
            if not isinstance(obj, dict):
                self.close()
                raise ProtocolError(f"an output line is not an object: {line[:200]!r}", method=self._method,
                                    url=self._url)
            return obj

    def close(self):
        """End the stream; from another thread, this ends a read blocked on it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            reading = self._reading
            sock = getattr(self._resp, "forkd_sock", None) or self._conn.sock
        _shutdown(sock)
        if not reading:
            self._resp.close()
            self._conn.close()

    @property
    def closed(self):
        return self._closed

    def header(self, name):
        """A header of the answer (None when it has none)."""
        return self._resp.getheader(name)

    def read_json(self, limit=NDJSON_LINE_MAX * 16):
        """The whole body as one JSON document (an answer that is not NDJSON)."""
        try:
            data = self._resp.read(limit + 1)
        except TimeoutError as e:
            raise Timeout(f"no answer within {self._timeout:g} s", method=self._method, url=self._url) from e
        except (OSError, http.client.HTTPException) as e:
            raise ConnectionFailed(f"the answer broke off: {e}", method=self._method, url=self._url) from e
        if len(data) > limit:
            raise ProtocolError(f"the answer is larger than {limit} bytes", method=self._method, url=self._url)
        try:
            return json.loads(data)
        except ValueError as e:
            raise ProtocolError(f"the answer is not JSON: {data[:200]!r}", method=self._method,
                                url=self._url) from e

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


class TtyConnection:
    """A WebSocket to GET .../processes/:pid/tty (made by Controller.open_tty).

    send(data): the terminal's input (bytes or str), a binary frame.
    resize(cols, rows): a text frame {"resize": [cols, rows]}.
    recv(): the next output bytes; None once the server closed (close_code and
            close_reason then say why: 1000 and "exit_code N" or "signal N").
    close(): a close frame (1000), then the socket is closed.
    """

    def __init__(self, sock, buffered, url):
        self._sock = sock
        self._buf = bytearray(buffered)
        self._url = url
        self._send_lock = threading.Lock()
        self._closed = False
        self._close_sent = False
        self.close_code = None
        self.close_reason = None

    # -------------------------------------------------------- sending

    def _send_frame(self, opcode, payload):
        payload = bytes(payload)
        n = len(payload)
        head = bytearray([0x80 | opcode])
        if n < 126:
            head.append(0x80 | n)
        elif n < 65536:
            head.append(0x80 | 126)
            head += struct.pack("!H", n)
        else:
            head.append(0x80 | 127)
            head += struct.pack("!Q", n)
        key = os.urandom(4)
        head += key
        masked = bytes(b ^ key[i & 3] for i, b in enumerate(payload)) if n < 256 else _mask(payload, key)
        with self._send_lock:
            if self._closed or self._close_sent:
                raise ConnectionFailed("the terminal is closed", method="GET", url=self._url)
            try:
                self._sock.sendall(bytes(head) + masked)
            except OSError as e:
                raise ConnectionFailed(f"the terminal's connection broke: {e}", method="GET", url=self._url) from e
            if opcode == OP_CLOSE:
                self._close_sent = True

    def send(self, data):
        if isinstance(data, str):
            data = data.encode("utf-8")
        self._send_frame(OP_BINARY, data)

    def resize(self, cols, rows):
        self._send_frame(OP_TEXT, json.dumps({"resize": [cols, rows]}).encode())

    # -------------------------------------------------------- receiving

    def _fill(self, n):
        while len(self._buf) < n:
            try:
                b = self._sock.recv(max(65536, n - len(self._buf)))
            except TimeoutError as e:
                raise Timeout("the terminal sent nothing in time", method="GET", url=self._url) from e
            except OSError as e:
                if self._closed:
                    return False
                raise ConnectionFailed(f"the terminal's connection broke: {e}", method="GET", url=self._url) from e
            if not b:
                return False
            self._buf += b
        return True

    def _take(self, n):
        if not self._fill(n):
            return None
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _frame(self):
        """(fin, opcode, payload), or None at the end of the connection."""
        head = self._take(2)
        if head is None:
            return None
        fin, opcode = head[0] & 0x80, head[0] & 0x0F
        if head[0] & 0x70:
            raise ProtocolError("a WebSocket frame with reserved bits set", method="GET", url=self._url)
        if head[1] & 0x80:
            raise ProtocolError("a masked WebSocket frame from the server", method="GET", url=self._url)
        n = head[1] & 0x7F
        if n == 126:
            ext = self._take(2)
            n = None if ext is None else struct.unpack("!H", ext)[0]
        elif n == 127:
            ext = self._take(8)
            n = None if ext is None else struct.unpack("!Q", ext)[0]
        if n is None:
            return None
        if n > WS_FRAME_MAX:
            raise ProtocolError(f"a WebSocket frame of {n} bytes, more than {WS_FRAME_MAX}", method="GET",
                                url=self._url)
        payload = self._take(n) if n else b""
        if payload is None:
            return None
        return bool(fin), opcode, payload

    def recv(self):
        """The next output bytes (a message of the server), or None at the end."""
        message = None
        while True:
            if self._closed and not self._buf:
                return None
            f = self._frame()
            if f is None:
                self._finish()
                return None
            fin, opcode, payload = f
            if opcode == OP_PING:
                try:
                    self._send_frame(OP_PONG, payload)
                except ConnectionFailed:
                    pass
                continue
            if opcode == OP_PONG:
                continue
            if opcode == OP_CLOSE:
                if len(payload) >= 2:
                    self.close_code = struct.unpack("!H", payload[:2])[0]
                    self.close_reason = payload[2:].decode("utf-8", errors="replace")
                else:
                    self.close_code = 1005
                    self.close_reason = ""
                try:
                    self._send_frame(OP_CLOSE, payload[:2])
                except ConnectionFailed:
                    pass
                self._finish()
                return None
            if opcode in (OP_TEXT, OP_BINARY):
                if message is not None:
                    raise ProtocolError("a new WebSocket message inside a fragmented one", method="GET",
                                        url=self._url)
                message = bytearray(payload)
            elif opcode == OP_CONT:
                if message is None:
                    raise ProtocolError("a WebSocket continuation without a message", method="GET", url=self._url)
                message += payload
                if len(message) > WS_FRAME_MAX:
                    raise ProtocolError(f"a WebSocket message of more than {WS_FRAME_MAX} bytes", method="GET",
                                        url=self._url)
            else:
                raise ProtocolError(f"a WebSocket frame of unknown opcode {opcode}", method="GET", url=self._url)
            if fin:
                return bytes(message)

    def _finish(self):
        with self._send_lock:
            self._closed = True
        _shutdown(self._sock)
        self._sock.close()

    def close(self, code=1000):
        """Send a close frame and close the connection (from any thread)."""
        if self._closed:
            return
        try:
            self._send_frame(OP_CLOSE, struct.pack("!H", code))
        except ConnectionFailed:
            pass
        self._finish()

    @property
    def closed(self):
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _mask(payload, key):
    """payload XOR the repeated 4-byte key, a word at a time."""
    n = len(payload)
    k = int.from_bytes(key * ((n + 3) // 4), "big")
    v = int.from_bytes(payload, "big") ^ (k >> (8 * ((4 - n % 4) % 4)))
    return v.to_bytes(n, "big")


def ws_key():
    return base64.b64encode(os.urandom(16)).decode("ascii")


def ws_accept(key):
    return base64.b64encode(hashlib.sha1((key + WS_GUID).encode("ascii")).digest()).decode("ascii")
