# SPDX-License-Identifier: LGPL-2.1-or-later
"""Clients of forkd-rest's process routes for the tests (test-rest-processes.py, the
Linux guest's processes-rest part): an NDJSON answer read line by line, and a
WebSocket client of Python's standard library only. stack: a dict with FORKD_URL and
FORKD_TOKEN_FILE (no token file: no Authorization)."""
import base64
import hashlib
import http.client
import json
import os
import socket
import struct
import time
import urllib.parse

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def token(stack):
    if not stack.get("FORKD_TOKEN_FILE"):
        return None
    with open(stack["FORKD_TOKEN_FILE"]) as f:
        return f.read().strip()


def host_port(stack):
    u = urllib.parse.urlsplit(stack["FORKD_URL"])
    return u.hostname, u.port or 80


class NdjsonStream:
    """An NDJSON answer read line by line, each with the time it arrived."""

    def __init__(self, stack, method, path, body=None, timeout=120):
        host, port = host_port(stack)
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        headers = {"Authorization": f"Bearer {token(stack)}"} if token(stack) else {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.ctype = self.resp.getheader("Content-Type", "")
        self.lines = []  # (monotonic time, parsed object)

    def next(self):
        """The next object, or None at the end of the body."""
        line = self.resp.readline()
        if not line:
            return None
        obj = json.loads(line)
        self.lines.append((time.monotonic(), obj))
        return obj

    def all(self):
        while self.next() is not None:
            pass
        return [o for _, o in self.lines]

    def close(self):
        self.conn.close()


def data_of(objs, stream=None):
    """The bytes of the chunk lines (data or data_b64), of one stream or both."""
    out = b""
    for o in objs:
        if "stream" in o and (stream is None or o["stream"] == stream):
            out += o["data"].encode() if "data" in o else base64.b64decode(o["data_b64"])
    return out


class WebSocket:
    """A WebSocket client of the standard library: masked frames out, frames in."""

    def __init__(self, stack, path, timeout=60):
        host, port = host_port(stack)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        auth = f"Authorization: Bearer {token(stack)}\r\n" if token(stack) else ""
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}"
                           f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            d = self.sock.recv(4096)
            if not d:
                break
            buf += d
        head, _, self.buf = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
        self.headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        self.accept_ok = self.headers.get("sec-websocket-accept") == base64.b64encode(
            hashlib.sha1((key + WS_GUID).encode()).digest()).decode()

    def send(self, opcode, data):
        mask = os.urandom(4)
        n = len(data)
        if n < 126:
            h = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 65536:
            h = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            h = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        self.sock.sendall(h + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _need(self, n):
        while len(self.buf) < n:
            d = self.sock.recv(65536)
            if not d:
                raise EOFError("the server closed the connection")
            self.buf += d

    def recv(self):
        """(opcode, payload) of the next frame; server frames are not masked."""
        self._need(2)
        b0, b1 = self.buf[0], self.buf[1]
        if b1 & 0x80:
            raise ValueError("a masked frame from the server")
        n, p = b1 & 0x7f, 2
        if n == 126:
            self._need(4)
            n, p = struct.unpack("!H", self.buf[2:4])[0], 4
        elif n == 127:
            self._need(10)
            n, p = struct.unpack("!Q", self.buf[2:10])[0], 10
        self._need(p + n)
        payload, self.buf = self.buf[p:p + n], self.buf[p + n:]
        return b0 & 0x0f, payload

    def read_until(self, pred, timeout):
        """The terminal's bytes until pred(bytes) or a close frame or timeout;
        returns (bytes, close payload or None)."""
        out = b""
        deadline = time.monotonic() + timeout
        while not pred(out) and time.monotonic() < deadline:
            self.sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                op, payload = self.recv()
            except (socket.timeout, TimeoutError):
                break
            if op == 0x2:
                out += payload
            elif op == 0x8:
                return out, payload
        return out, None

    def close(self):
        self.sock.close()
