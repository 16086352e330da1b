# SPDX-License-Identifier: LGPL-2.1-or-later
"""The reading end of a process's output stream from the Manager's
OpenSandboxOutputStream (an fd of 16-byte frame headers and their data), for the
Linux guest's test and bench/process."""
import os
import select
import struct
import time

STDOUT, STDERR, GAP, EXIT = 1, 2, 3, 4


class Stream:
    """The reading end of an output stream: its frames as they come."""

    def __init__(self, fd):
        self.fd, self.buf, self.frames, self.closed = fd, b"", [], False

    def pump(self, until, timeout):
        """Read frames until until(self) or timeout seconds or the end; returns until(self)."""
        deadline = time.monotonic() + timeout
        while not until(self) and not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            r, _, _ = select.select([self.fd], [], [], left)
            if not r:
                continue
            data = os.read(self.fd, 65536)
            if not data:
                self.closed = True
                break
            self.buf += data
            while len(self.buf) >= 16:
                kind, p0, p1, p2, ln, off = struct.unpack_from("<BBBBIQ", self.buf)
                if len(self.buf) < 16 + ln:
                    break
                self.frames.append((time.monotonic(), kind, off, self.buf[16:16 + ln], (p0, p1, p2)))
                self.buf = self.buf[16 + ln:]
        return until(self)

    def data(self):
        return b"".join(f[3] for f in self.frames if f[1] in (STDOUT, STDERR))

    def exit(self):
        """(exit_code, signal) of the exit frame, or None."""
        for f in self.frames:
            if f[1] == EXIT:
                return struct.unpack("<ii", f[3])
        return None

    def close(self):
        os.close(self.fd)
