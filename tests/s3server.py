"""A real S3 server for tests: moto's, on a loopback port.

By default it is `ThreadedMotoServer`, a thread of the test process; moto keeps buckets
per process, not per server, so each test gets a bucket of its own and a stopped server
comes back with them. `own_process` runs `python -m moto.server` instead: needed where
the test process itself calls delta-rs functions that hold the GIL while they wait for
the server (`DeltaTable.history`), which would wait forever on a server in a thread.
The tests read what was written with boto3, not with Lookout's code.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import boto3
from moto.server import ThreadedMotoServer

from lookout.config import S3Config
from tests.waiting import wait_for

ACCESS_KEY = "test-key"
SECRET = "s3cr3t-never-logged"


@dataclass
class S3Server:
    """moto's S3 server on a loopback port; `stop()` and `start()` keep its buckets."""

    port: int
    bucket: str
    own_process: bool = False
    server: ThreadedMotoServer | subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def settings(self) -> S3Config:
        """The `[s3]` section that reaches this server."""
        return S3Config(endpoint=self.endpoint, access_key=ACCESS_KEY, secret_key=SECRET)

    def env(self) -> dict[str, str]:
        """The same settings as `LOOKOUT_S3_*` environment variables."""
        return {
            f"LOOKOUT_S3_{key.upper()}": str(value) for key, value in vars(self.settings()).items()
        }

    def url(self, prefix: str) -> str:
        """`s3://<bucket>/<prefix>`."""
        return f"s3://{self.bucket}/{prefix}"

    def start(self) -> None:
        if not self.own_process:
            self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
            self.server.start()
            return
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.server = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for(self._listening, 30, f"moto's S3 server on port {self.port}")

    def _listening(self) -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if isinstance(self.server, subprocess.Popen):
            self.server.terminate()
            self.server.wait(timeout=30)
        elif self.server is not None:
            self.server.stop()
        self.server = None

    def client(self) -> Any:
        """A boto3 client: the independent reader of what was written."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )

    def keys(self, prefix: str) -> list[str]:
        """Every object key under `prefix`, sorted."""
        pages = (
            self.client()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=self.bucket, Prefix=prefix)
        )
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def objects(self, prefix: str) -> dict[str, bytes]:
        """Every object under `prefix`, by key."""
        client = self.client()
        return {
            key: client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            for key in self.keys(prefix)
        }
