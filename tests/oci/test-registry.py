#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The registry client (src/oci/registry*.c) through registry-tool, against real
parts on loopback: Debian's docker-registry (plain, and with htpasswd basic
auth), skopeo as the reference client, umoci to make the image, and a small
Python registry of our own for the bearer token flow, an image index and a
redirect of blobs to another host.

usage: test-registry.py REGISTRY-TOOL
Missing tools skip the test, or fail it when CI is set."""

import base64
import hashlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from ociregistry import Registry, free_port
from tap import Tap, check, skip_all

TOOL = sys.argv[1]
SECRET_USER = "forkd-tester"
SECRET_PASSWORD = "Pw-9f3a1c7e-never-printed"
tap = Tap()


def need_tools():
    missing = [t for t in ("docker-registry", "skopeo", "umoci") if not shutil.which(t)]
    if missing:
        why = "missing: " + ", ".join(missing) + " (tools/install-deps installs them)"
        if os.environ.get("CI"):
            tap.bail(why)
        skip_all(why)


def tool(*args, check_rc=None):
    p = subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=120)
    if check_rc is not None and p.returncode != check_rc:
        raise AssertionError(f"registry-tool {' '.join(args)}: rc {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def pull(ref, config, out, rc=0):
    p = tool("pull-layout", ref, "--config", config, "--out", out, check_rc=rc)
    return json.loads(p.stdout) if rc == 0 else p


def push(layout, ref, config, rc=0):
    p = tool("push-layout", layout, ref, "--config", config, check_rc=rc)
    return json.loads(p.stdout) if rc == 0 else p


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def layout_image(layout, tag):
    with open(os.path.join(layout, "index.json")) as f:
        index = json.load(f)
    for m in index["manifests"]:
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return m
    raise AssertionError(f"{layout}: no {tag}")


def layout_blobs(layout, tag):
    m = layout_image(layout, tag)
    with open(os.path.join(layout, "blobs/sha256", m["digest"][7:]), "rb") as f:
        manifest = json.load(f)
    return m["digest"], [manifest["config"]] + manifest["layers"]


def check_layout(layout, tag):
    """Every blob of the image is there and hashes to its name."""
    digest, blobs = layout_blobs(layout, tag)
    for d in [{"digest": digest}] + blobs:
        path = os.path.join(layout, "blobs/sha256", d["digest"][7:])
        check(sha256_file(path) == d["digest"], f"{path} does not hash to its name")
    check(json.load(open(os.path.join(layout, "oci-layout")))["imageLayoutVersion"] == "1.0.0", "oci-layout")
    return digest, blobs


class TokenRegistry(http.server.ThreadingHTTPServer):
    """A registry that serves one OCI layout read-only behind the bearer token flow:
    /v2/... answers 401 with a Bearer challenge, /token checks basic credentials and
    hands out a token, blobs are redirected to /direct/ on another loopback address
    (127.0.0.2), which must not see the Authorization header."""

    def __init__(self, layout, tag):
        super().__init__(("127.0.0.1", 0), TokenHandler)
        self.layout = layout
        self.tag = tag
        self.token = "tok-" + hashlib.sha256(os.urandom(8)).hexdigest()[:16]
        self.seen_auth_on_direct = []
        self.basic = "Basic " + base64.b64encode(f"{SECRET_USER}:{SECRET_PASSWORD}".encode()).decode()
        self.direct = http.server.ThreadingHTTPServer(("127.0.0.2", 0), TokenHandler)
        self.direct.owner = self
        self.owner = self
        # The image as an index with two platforms: only linux/amd64 is to be fetched.
        digest, _ = layout_blobs(layout, tag)
        m = layout_image(layout, tag)
        other = {"mediaType": m["mediaType"], "digest": "sha256:" + "0" * 64, "size": 2,
                 "platform": {"architecture": "arm64", "os": "linux"}}
        mine = {"mediaType": m["mediaType"], "digest": digest, "size": m["size"],
                "platform": {"architecture": "amd64", "os": "linux"}}
        self.index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                                 "manifests": [other, mine]}).encode()
        for s in (self, self.direct):
            threading.Thread(target=s.serve_forever, daemon=True).start()

    def stop(self):
        for s in (self, self.direct):
            s.shutdown()
            s.server_close()


class TokenHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, code, body=b"", ctype="application/json", headers=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        o = self.server.owner
        path = self.path.split("?")[0]
        if path.startswith("/direct/"):
            o.seen_auth_on_direct.append(self.headers.get("Authorization"))
            with open(os.path.join(o.layout, "blobs/sha256", path[len("/direct/"):]), "rb") as f:
                return self.reply(200, f.read(), "application/octet-stream")
        if path == "/token":
            if self.headers.get("Authorization") != o.basic:
                return self.reply(401, b'{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}')
            return self.reply(200, json.dumps({"token": o.token}).encode())
        if self.headers.get("Authorization") != "Bearer " + o.token:
            port = self.server.server_address[1]
            challenge = (f'Bearer realm="http://127.0.0.1:{port}/token",service="forkd-test",'
                         f'scope="repository:img:pull"')
            return self.reply(401, b'{"errors":[{"code":"UNAUTHORIZED","message":"token needed"}]}',
                              headers=[("WWW-Authenticate", challenge)])
        parts = path.split("/")  # "", v2, img, manifests|blobs, ref
        if len(parts) != 5 or parts[2] != "img":
            return self.reply(404, b'{"errors":[{"code":"NAME_UNKNOWN","message":"no such repository"}]}')
        if parts[3] == "manifests":
            if parts[4] == o.tag:
                return self.reply(200, o.index, "application/vnd.oci.image.index.v1+json",
                                  [("Docker-Content-Digest", "sha256:" + hashlib.sha256(o.index).hexdigest())])
            blob = os.path.join(o.layout, "blobs/sha256", parts[4][7:])
            if parts[4].startswith("sha256:") and os.path.exists(blob):
                return self.reply(200, open(blob, "rb").read(), "application/vnd.oci.image.manifest.v1+json")
            return self.reply(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"no such manifest"}]}')
        if parts[3] == "blobs":
            direct = f"http://127.0.0.2:{o.direct.server_address[1]}/direct/{parts[4][7:]}?X-Signature=s3kr1t"
            return self.reply(307, b"", headers=[("Location", direct)])
        return self.reply(404)


def main():
    need_tools()
    tmp = tempfile.mkdtemp(prefix="forkd-registry-test-")
    regs = []
    try:
        run_all(tmp, regs)
    finally:
        for r in regs:
            try:
                r.stop()
            except Exception:  # noqa: BLE001 - the cleanup goes on
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(tap.done())


def make_image(tmp):
    layout = os.path.join(tmp, "src-layout")
    src = os.path.join(tmp, "src-files")
    os.makedirs(os.path.join(src, "opt"))
    with open(os.path.join(src, "opt/hello.txt"), "w") as f:
        f.write("hello from forkd\n")
    with open(os.path.join(src, "opt/random.bin"), "wb") as f:
        f.write(os.urandom(256 * 1024))
    rootless = [] if os.geteuid() == 0 else ["--rootless"]
    for args in (["init", "--layout", layout], ["new", "--image", layout + ":v1"],
                 ["insert", *rootless, "--image", layout + ":v1", os.path.join(src, "opt"), "/opt"]):
        subprocess.run(["umoci", *args], check=True, capture_output=True, timeout=120)
    return layout


def run_all(tmp, regs):
    layout = make_image(tmp)
    src_digest, src_blobs = check_layout(layout, "v1")
    os.makedirs(os.path.join(tmp, "plain"))
    reg = Registry(os.path.join(tmp, "plain"))
    regs.append(reg)
    config = write_json(os.path.join(tmp, "registries.json"),
                        {"registries": [{"host": reg.host, "insecure_http": True}]})

    def push_ours():
        st = push(layout, f"{reg.host}/forkd/img:v1", config)
        check(st["digest"] == src_digest, f"pushed {st['digest']}, layout has {src_digest}")
        check(st["blobs_sent"] == len(src_blobs), f"sent {st['blobs_sent']} blobs of {len(src_blobs)}")
        raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{reg.host}/forkd/img:v1"],
                             check=True, capture_output=True, timeout=60).stdout
        check("sha256:" + hashlib.sha256(raw).hexdigest() == src_digest, "skopeo reads back another manifest")
        st = push(layout, f"{reg.host}/forkd/img:v1", config)
        check(st["blobs_sent"] == 0, f"a second push sent {st['blobs_sent']} blobs")
    tap.run("push-layout, read back with skopeo; a second push sends no blob", push_ours)

    out = os.path.join(tmp, "pulled")

    def skopeo_push_our_pull():
        subprocess.run(["skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}:v1",
                        f"docker://{reg.host}/forkd/skopeo:v1"], check=True, capture_output=True, timeout=120)
        raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                              f"docker://{reg.host}/forkd/skopeo:v1"], check=True, capture_output=True, timeout=60).stdout
        st = pull(f"{reg.host}/forkd/skopeo:v1", config, out)
        digest, blobs = check_layout(out, "v1")
        check(st["digest"] == digest == "sha256:" + hashlib.sha256(raw).hexdigest(), "manifest digests differ")
        check(st["blobs_fetched"] == len(blobs), f"fetched {st['blobs_fetched']} blobs, the image has {len(blobs)}")
        check([b["digest"] for b in blobs] == [b["digest"] for b in src_blobs], "other blobs than the source's")
        insp = json.loads(subprocess.run(["skopeo", "inspect", f"oci:{out}:v1"], check=True, capture_output=True,
                                         timeout=60).stdout)
        check(insp["Layers"] == [b["digest"] for b in src_blobs[1:]], f"skopeo reads other layers: {insp['Layers']}")
    tap.run("skopeo copy pushes, pull-layout pulls a layout skopeo reads", skopeo_push_our_pull)

    def pull_again():
        st = pull(f"{reg.host}/forkd/img:v1", config, out)
        check(st["blobs_fetched"] == 0, f"fetched {st['blobs_fetched']} blobs again")
        check(0 < st["fetched_bytes"] < 64 * 1024, f"fetched {st['fetched_bytes']} bytes for manifests only")
        st = pull(f"{reg.host}/forkd/img@{src_digest}", config, out)
        check(st["blobs_fetched"] == 0 and st["digest"] == src_digest, "by digest")
        check_layout(out, "v1")
    tap.run("a second pull into the same layout fetches no blob; by digest too", pull_again)

    def bad_refs():
        for ref, want in (("no-registry-here", "names no registry"),
                          (f"{reg.host}/Upper/case:v1", "invalid repository"),
                          (f"{reg.host}/img:v1@sha256:" + "a" * 64, "both a tag and a digest"),
                          (f"{reg.host}/img@sha256:abc", "64 lowercase hex"),
                          (f"{reg.host}/img:-bad", "invalid tag")):
            p = pull(ref, config, out, rc=1)
            check(want in p.stderr, f"{ref}: {p.stderr}")
    tap.run("malformed references are refused with a reason", bad_refs)

    def unconfigured():
        p = pull(f"127.0.0.2:{reg.port}/forkd/img:v1", config, out, rc=1)
        check(f"registry 127.0.0.2:{reg.port} is not configured in {config}" in p.stderr, p.stderr)
        remote = write_json(os.path.join(tmp, "remote.json"),
                            {"registries": [{"host": "192.0.2.1:5000", "insecure_http": True}]})
        p = pull("192.0.2.1:5000/forkd/img:v1", remote, out, rc=1)
        check("insecure_http is allowed only for a loopback host" in p.stderr, p.stderr)
        https = write_json(os.path.join(tmp, "https.json"), {"registries": [{"host": reg.host}]})
        p = pull(f"{reg.host}/forkd/img:v1", https, out, rc=1)
        check(f"https://{reg.host}/v2/forkd/img/manifests/v1" in p.stderr, p.stderr)
    tap.run("an unconfigured host, plain HTTP to a non-loopback host and TLS to a plain one are refused", unconfigured)

    def missing():
        p = pull(f"{reg.host}/forkd/img:nope", config, out, rc=1)
        check(f"GET http://{reg.host}/v2/forkd/img/manifests/nope: HTTP 404" in p.stderr, p.stderr)
    tap.run("an error names the method, URL and HTTP status", missing)

    def tampered():
        layer = src_blobs[-1]["digest"]
        path = reg.blob_data(layer)
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0xff
        with open(path, "wb") as f:
            f.write(data)
        fresh = os.path.join(tmp, "tampered")
        p = pull(f"{reg.host}/forkd/img:v1", config, fresh, rc=1)
        check(f"the blob's SHA-256 is" in p.stderr and layer in p.stderr, p.stderr)
        left = os.listdir(os.path.join(fresh, "blobs/sha256"))
        check(layer[7:] not in left and not [n for n in left if n.startswith(".")], f"left behind: {left}")
        check(not os.path.exists(os.path.join(fresh, "index.json")), "index.json written for a failed pull")
    tap.run("a blob tampered with in the registry's storage is refused and not kept", tampered)

    def silent():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(4)
            host = f"127.0.0.1:{s.getsockname()[1]}"
            cfg = write_json(os.path.join(tmp, "silent.json"), {"registries": [{"host": host, "insecure_http": True}]})
            start = time.monotonic()
            p = tool("pull-layout", f"{host}/forkd/img:v1", "--config", cfg, "--out", out, "--timeout", "2", check_rc=1)
            took = time.monotonic() - start
            check(f"GET http://{host}/v2/forkd/img/manifests/v1" in p.stderr and "timed out" in p.stderr, p.stderr)
            check(took < 15, f"took {took:.1f} s")
    tap.run("a registry that never answers: the request times out and names its URL", silent)

    tap.run("htpasswd basic auth: works, and no credential appears in errors", lambda: basic_auth(tmp, regs, layout))
    tap.run("bearer token flow, an image index, blobs redirected to another host",
            lambda: bearer(tmp, regs, layout, src_digest, src_blobs))


def secrets():
    both = f"{SECRET_USER}:{SECRET_PASSWORD}"
    return [SECRET_PASSWORD, base64.b64encode(both.encode()).decode()]


def no_secret(text):
    for s in secrets():
        check(s not in text, "a credential appears in: " + text)


def htpasswd_line(tmp):
    try:
        import warnings  # noqa: PLC0415
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # noqa: PLC0415 - present up to Python 3.12
        h = crypt.crypt(SECRET_PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH))
        if h and h.startswith("$2"):
            return f"{SECRET_USER}:{h}\n"
    except ImportError:
        pass
    if shutil.which("htpasswd"):
        return subprocess.run(["htpasswd", "-nbB", SECRET_USER, SECRET_PASSWORD], check=True, capture_output=True,
                              text=True).stdout.strip() + "\n"
    return None


def basic_auth(tmp, regs, layout):
    line = htpasswd_line(tmp)
    if not line:
        from tap import Skip  # noqa: PLC0415
        raise Skip("no bcrypt (Python crypt or htpasswd) to write an htpasswd file; the bearer test covers credentials")
    d = os.path.join(tmp, "auth")
    os.makedirs(d)
    hp = os.path.join(d, "htpasswd")
    with open(hp, "w") as f:
        f.write(line)
    reg = Registry(d, htpasswd=hp)
    regs.append(reg)
    good = os.path.join(d, "good-credentials")
    bad = os.path.join(d, "bad-credentials")
    with open(good, "w") as f:
        f.write(f"{SECRET_USER}:{SECRET_PASSWORD}\n")
    with open(bad, "w") as f:
        f.write(f"{SECRET_USER}:{SECRET_PASSWORD}-wrong\n")
    cfg_good = write_json(os.path.join(d, "good.json"), {"registries": [
        {"host": reg.host, "insecure_http": True, "credentials_file": good}]})
    cfg_bad = write_json(os.path.join(d, "bad.json"), {"registries": [
        {"host": reg.host, "insecure_http": True, "credentials_file": bad}]})
    cfg_none = write_json(os.path.join(d, "none.json"), {"registries": [{"host": reg.host, "insecure_http": True}]})

    st = push(layout, f"{reg.host}/forkd/img:v1", cfg_good)
    check(st["blobs_sent"] > 0, "nothing sent")
    out = os.path.join(d, "pulled")
    st = pull(f"{reg.host}/forkd/img:v1", cfg_good, out)
    check(st["digest"] == layout_blobs(layout, "v1")[0], "another image")
    for cfg, want in ((cfg_bad, "HTTP 401"), (cfg_none, "HTTP 401")):
        p = pull(f"{reg.host}/forkd/img:v1", cfg, os.path.join(d, "denied"), rc=1)
        check(want in p.stderr, p.stderr)
        no_secret(p.stdout + p.stderr)
        p = push(layout, f"{reg.host}/forkd/other:v1", cfg, rc=1)
        no_secret(p.stdout + p.stderr)
    p = pull(f"{reg.host}/forkd/img:nope", cfg_good, out, rc=1)
    check("HTTP 404" in p.stderr, p.stderr)
    no_secret(p.stdout + p.stderr)
    with open(bad, "w") as f:
        f.write(f"{SECRET_PASSWORD}\n")  # no colon: refused, its content not shown
    p = pull(f"{reg.host}/forkd/img:v1", cfg_bad, out, rc=1)
    check("does not hold one line user:password" in p.stderr, p.stderr)
    no_secret(p.stdout + p.stderr)


def bearer(tmp, regs, layout, src_digest, src_blobs):
    srv = TokenRegistry(layout, "v1")
    regs.append(srv)
    d = os.path.join(tmp, "bearer")
    os.makedirs(d)
    creds = os.path.join(d, "credentials")
    with open(creds, "w") as f:
        f.write(f"{SECRET_USER}:{SECRET_PASSWORD}")
    host = f"127.0.0.1:{srv.server_address[1]}"
    cfg = write_json(os.path.join(d, "c.json"), {"registries": [
        {"host": host, "insecure_http": True, "credentials_file": creds}]})
    out = os.path.join(d, "pulled")
    st = pull(f"{host}/img:v1", cfg, out)
    check(st["digest"] == src_digest, f"picked {st['digest']}, not the linux/amd64 {src_digest}")
    check(st["blobs_fetched"] == len(src_blobs), f"fetched {st['blobs_fetched']}")
    check_layout(out, "v1")
    check(srv.seen_auth_on_direct and not any(srv.seen_auth_on_direct),
          f"the redirect target saw Authorization: {srv.seen_auth_on_direct}")
    p = pull(f"{host}/img:nope", cfg, out, rc=1)
    check("HTTP 404" in p.stderr, p.stderr)
    no_secret(p.stdout + p.stderr)
    check(srv.token not in p.stderr, "the token appears in an error")
    with open(creds, "w") as f:
        f.write(f"{SECRET_USER}:{SECRET_PASSWORD}x")
    p = pull(f"{host}/img:v1", cfg, os.path.join(d, "denied"), rc=1)
    check(f"GET http://{host}/token: HTTP 401" in p.stderr, p.stderr)
    no_secret(p.stdout + p.stderr)


if __name__ == "__main__":
    main()
