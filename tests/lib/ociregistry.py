# SPDX-License-Identifier: LGPL-2.1-or-later
"""Debian's docker-registry started by a test on loopback, its storage in a
directory of the test's. $FORKD_DOCKER_REGISTRY names the binary where it is not on
PATH (the test host gets a copy in the build directory: tests/meson.build)."""
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



def binary():
    """The docker-registry to start, or None when there is none."""
    path = os.environ.get("FORKD_DOCKER_REGISTRY")
    if path and os.access(path, os.X_OK):
        return path
    return shutil.which("docker-registry")


class Registry:
    """docker-registry on 127.0.0.1, its storage under dir."""

    def __init__(self, dir, htpasswd=None):
        self.dir = dir
        self.port = free_port()
        self.root = os.path.join(dir, "storage")
        auth = ""
        if htpasswd:
            auth = f"auth:\n  htpasswd:\n    realm: forkd-test\n    path: {htpasswd}\n"
        conf = (f"version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {self.root}\n"
                f"  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{self.port}\n{auth}")
        self.conf = os.path.join(dir, "registry.yml")
        with open(self.conf, "w") as f:
            f.write(conf)
        self.log = open(os.path.join(dir, "registry.log"), "w")
        self.proc = subprocess.Popen([binary(), "serve", self.conf], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/", timeout=2)
                break
            except urllib.error.HTTPError:
                break  # 401 of an auth registry: it is up
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("docker-registry did not start: " + open(self.log.name).read())
                time.sleep(0.1)
        self.host = f"127.0.0.1:{self.port}"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.log.close()

    def blob_data(self, digest):
        return os.path.join(self.root, "docker/registry/v2/blobs/sha256", digest[7:9], digest[7:], "data")

    def blob_path(self, digest):
        return self.blob_data(digest)

    def blob_gets(self):
        """Blob downloads so far, by the access log."""
        self.log.flush()
        with open(self.log.name) as f:
            return sum(1 for line in f if "GET /v2/" in line and "/blobs/sha256:" in line)
