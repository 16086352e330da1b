# SPDX-License-Identifier: LGPL-2.1-or-later
"""A minimal D-Bus client on the Python standard library, for the daemon tests:
method calls with any signature (also deliberately wrong ones), error names,
and signals. Unix socket transport, EXTERNAL auth, little-endian only."""

import os
import select
import socket
import struct
import time

METHOD_CALL, METHOD_RETURN, ERROR, SIGNAL = 1, 2, 3, 4


class DBusError(Exception):
    def __init__(self, name, message):
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


def _align(n, a):
    return (n + a - 1) // a * a


def split_signature(sig):
    """Split a signature into complete types."""
    out, i = [], 0
    while i < len(sig):
        j = _end_of_type(sig, i)
        out.append(sig[i:j])
        i = j
    return out


def _end_of_type(sig, i):
    c = sig[i]
    if c == "a":
        return _end_of_type(sig, i + 1)
    if c in "({":
        close = ")" if c == "(" else "}"
        i += 1
        while sig[i] != close:
            i = _end_of_type(sig, i)
        return i + 1
    return i + 1


_ALIGN = {"y": 1, "b": 4, "n": 2, "q": 2, "i": 4, "u": 4, "x": 8, "t": 8, "d": 8, "s": 4, "o": 4, "g": 1,
          "a": 4, "(": 8, "{": 8, "v": 1, "h": 4}
_FIXED = {"y": "B", "b": "I", "n": "h", "q": "H", "i": "i", "u": "I", "x": "q", "t": "Q", "d": "d", "h": "I"}


class _Writer:
    def __init__(self):
        self.buf = bytearray()

    def pad(self, a):
        self.buf += b"\0" * (_align(len(self.buf), a) - len(self.buf))

    def write(self, t, v):
        c = t[0]
        self.pad(_ALIGN[c])
        if c in _FIXED:
            self.buf += struct.pack("<" + _FIXED[c], float(v) if c == "d" else int(v))
        elif c in "so":
            b = v.encode()
            self.buf += struct.pack("<I", len(b)) + b + b"\0"
        elif c == "g":
            b = v.encode()
            self.buf += struct.pack("<B", len(b)) + b + b"\0"
        elif c == "v":
            sig, val = v
            self.write("g", sig)
            self.write(sig, val)
        elif c == "a":
            inner = t[1:]
            at = len(self.buf)
            self.buf += b"\0\0\0\0"
            self.pad(_ALIGN[inner[0]])
            start = len(self.buf)
            items = v.items() if inner[0] == "{" else v
            for item in items:
                self.write(inner, item)
            struct.pack_into("<I", self.buf, at, len(self.buf) - start)
        elif c in "({":
            for st, sv in zip(split_signature(t[1:-1]), v):
                self.write(st, sv)
        else:
            raise ValueError(f"cannot marshal {t}")


class _Reader:
    def __init__(self, buf, pos=0):
        self.buf, self.pos = buf, pos

    def pad(self, a):
        self.pos = _align(self.pos, a)

    def read(self, t):
        c = t[0]
        self.pad(_ALIGN[c])
        if c in _FIXED:
            f = "<" + _FIXED[c]
            (v,) = struct.unpack_from(f, self.buf, self.pos)
            self.pos += struct.calcsize(f)
            return bool(v) if c == "b" else v
        if c in "so":
            (n,) = struct.unpack_from("<I", self.buf, self.pos)
            v = bytes(self.buf[self.pos + 4:self.pos + 4 + n]).decode()
            self.pos += 4 + n + 1
            return v
        if c == "g":
            n = self.buf[self.pos]
            v = bytes(self.buf[self.pos + 1:self.pos + 1 + n]).decode()
            self.pos += 1 + n + 1
            return v
        if c == "v":
            sig = self.read("g")
            return self.read(sig)
        if c == "a":
            inner = t[1:]
            (n,) = struct.unpack_from("<I", self.buf, self.pos)
            self.pos += 4
            self.pad(_ALIGN[inner[0]])
            end = self.pos + n
            items = []
            while self.pos < end:
                items.append(self.read(inner))
            return dict(items) if inner[0] == "{" else items
        if c in "({":
            return tuple(self.read(st) for st in split_signature(t[1:-1]))
        raise ValueError(f"cannot unmarshal {t}")


class Bus:
    def __init__(self, address, timeout=30.0, hello=True, unix_fds=False):
        """hello=False: a peer-to-peer connection (no bus daemon to say Hello to).
        unix_fds=True: negotiate file descriptor passing (send(fds=...))."""
        path = None
        for part in address.split(";")[0].split(":", 1)[1].split(","):
            k, _, v = part.partition("=")
            if k == "path":
                path = v
        if not path:
            raise ValueError(f"unsupported bus address {address}")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.sock.sendall(b"\0AUTH EXTERNAL " + str(os.getuid()).encode().hex().encode() + b"\r\n")
        line = self._readline()
        if not line.startswith(b"OK"):
            raise RuntimeError(f"auth failed: {line!r}")
        if unix_fds:
            self.sock.sendall(b"NEGOTIATE_UNIX_FD\r\n")
            line = self._readline()
            if not line.startswith(b"AGREE_UNIX_FD"):
                raise RuntimeError(f"no unix fd passing: {line!r}")
        self.sock.sendall(b"BEGIN\r\n")
        self.serial = 0
        self.inbuf = bytearray()
        self.signals = []
        self.fds = []  # descriptors received (unix_fds=True), in order: take_fds()
        self.unique_name = None
        if hello:
            self.unique_name = self.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                                         "Hello")[0]

    def close(self):
        self.sock.close()

    def _readline(self):
        b = b""
        while not b.endswith(b"\r\n"):
            c = self.sock.recv(1)
            if not c:
                raise ConnectionError("bus closed during auth")
            b += c
        return b

    def send(self, dest, path, iface, member, sig="", args=(), no_reply=False, fds=()):
        """An 'h' argument is an index into fds, the descriptors sent with the message."""
        self.serial += 1
        body = _Writer()
        for t, v in zip(split_signature(sig), args):
            body.write(t, v)
        fields = [(1, ("o", path)), (3, ("s", member))]
        if iface:
            fields.append((2, ("s", iface)))
        if dest:
            fields.append((6, ("s", dest)))
        if sig:
            fields.append((8, ("g", sig)))
        if fds:
            fields.append((9, ("u", len(fds))))
        h = _Writer()
        h.buf += struct.pack("<cBBBII", b"l", METHOD_CALL, 1 if no_reply else 0, 1, len(body.buf), self.serial)
        h.write("a(yv)", fields)
        h.pad(8)
        data = bytes(h.buf) + bytes(body.buf)
        if fds:
            import array
            n = self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            if n < len(data):
                self.sock.sendall(data[n:])
        else:
            self.sock.sendall(data)
        return self.serial

    def _read_message(self, deadline):
        while True:
            if len(self.inbuf) >= 16:
                body_len, = struct.unpack_from("<I", self.inbuf, 4)
                fields_len, = struct.unpack_from("<I", self.inbuf, 12)
                hdr_end = _align(16 + fields_len, 8)
                total = hdr_end + body_len
                if len(self.inbuf) >= total:
                    msg = bytes(self.inbuf[:total])
                    del self.inbuf[:total]
                    return self._parse(msg, hdr_end)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no D-Bus message in time")
            r, _, _ = select.select([self.sock], [], [], left)
            if not r:
                continue
            data, anc, _, _ = self.sock.recvmsg(1 << 16, socket.CMSG_SPACE(16 * 4))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    import array
                    got = array.array("i")
                    got.frombytes(payload[:len(payload) - len(payload) % got.itemsize])
                    self.fds.extend(got)
            if not data:
                raise ConnectionError("bus connection closed")
            self.inbuf += data

    @staticmethod
    def _parse(msg, hdr_end):
        if msg[0:1] != b"l":
            raise ValueError("big-endian message")
        mtype = msg[1]
        rd = _Reader(msg, 12)
        fields = dict(rd.read("a(yv)"))
        sig = fields.get(8, "")
        rd = _Reader(msg[hdr_end:])
        body = [rd.read(t) for t in split_signature(sig)]
        return {"type": mtype, "fields": fields, "body": body}

    def _dispatch_until(self, pred, timeout):
        deadline = time.monotonic() + timeout
        while True:
            m = self._read_message(deadline)
            if m["type"] == SIGNAL:
                self.signals.append((m["fields"].get(3), m["body"]))
            if pred(m):
                return m

    def wait_reply(self, serial, timeout=60.0):
        m = self._dispatch_until(lambda m: m["type"] in (METHOD_RETURN, ERROR) and m["fields"].get(5) == serial,
                                 timeout)
        if m["type"] == ERROR:
            raise DBusError(m["fields"].get(4), m["body"][0] if m["body"] else "")
        return m["body"]

    def wait_replies(self, serials, timeout=60.0):
        """The replies to several calls sent with send(), in whatever order they come:
        {serial: body, or the DBusError of an error reply}."""
        want, got = set(serials), {}

        def take(m):
            serial = m["fields"].get(5)
            if m["type"] in (METHOD_RETURN, ERROR) and serial in want:
                want.discard(serial)
                got[serial] = (DBusError(m["fields"].get(4), m["body"][0] if m["body"] else "")
                               if m["type"] == ERROR else m["body"])
            return not want

        if want:
            self._dispatch_until(take, timeout)
        return got

    def take_fds(self):
        """The descriptors received so far (an 'h' in a reply is an index into its
        message's own); the caller owns them now."""
        fds, self.fds = self.fds, []
        return fds

    def call(self, dest, path, iface, member, sig="", args=(), timeout=60.0, fds=()):
        return self.wait_reply(self.send(dest, path, iface, member, sig, args, fds=fds), timeout)

    def add_match(self, rule):
        self.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "AddMatch", "s", [rule])

    def wait_signal(self, pred, timeout=30.0):
        """Return the first signal (member, body) seen so far or arriving that satisfies pred; consume it."""
        deadline = time.monotonic() + timeout
        while True:
            for i, s in enumerate(self.signals):
                if pred(*s):
                    return self.signals.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("signal did not arrive")
            try:
                self._dispatch_until(lambda m: m["type"] == SIGNAL, left)
            except TimeoutError:
                pass

    def pump(self, timeout=0.0):
        """Collect whatever arrived within timeout."""
        try:
            self._dispatch_until(lambda m: False, timeout)
        except TimeoutError:
            pass
