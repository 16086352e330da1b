# SPDX-License-Identifier: LGPL-2.1-or-later
"""What the SDK's unit tests share: raises(), and Server, a small HTTP server in the
test's own process (http.server, real sockets) that answers what each test says."""

import http.server
import json
import threading


def raises(cls, fn, *a, **kw):
    try:
        fn(*a, **kw)
    except cls as e:
        return e
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"expected {cls.__name__}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"expected {cls.__name__}, nothing raised")


class Server:
    """Answers each request with what `reply` says for it, and records it.
    reply(req) returns (status, content type, bytes) or a function of the
    handler that writes the answer itself."""

    def __init__(self):
        self.requests = []
        self.reply = lambda req: (200, "application/json", b"{}")
        srv = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def handle_any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                req = {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
                srv.requests.append(req)
                r = srv.reply(req)
                if callable(r):
                    r(self)
                    self.close_connection = True
                    return
                status, ctype, data = r
                self.send_response(status)
                if ctype:
                    self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = True

            do_GET = do_POST = do_DELETE = do_PATCH = handle_any

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def json(self, status, obj):
        self.reply = lambda req: (status, "application/json", json.dumps(obj).encode() if obj is not None else b"")

    def last(self):
        return self.requests[-1]

    def last_body(self):
        return json.loads(self.requests[-1]["body"])
