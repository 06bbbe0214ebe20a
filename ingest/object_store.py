"""Landing into object storage: S3 and S3-compatible servers (MinIO, Ceph, moto, ...).

On an object store there is no rename to make a file appear whole; instead each
landing file is written with one PUT of the whole object, which the store makes
visible atomically when the request succeeds (a reader lists either nothing or all of
it). `ObjectStore.put` returns only after the store answered the PUT with success, so
an acknowledgement that follows it is as safe as one after a local fsync + rename. A
failed PUT raises OSError, as a failing disk does, and ingest retries without
acknowledging. Nothing half-written is ever visible, so there are no orphans to clean.

The filesystem is `pyarrow.fs.S3FileSystem` with `allow_delayed_open`, which sends a
file smaller than its part size (10 MB) as a single PutObject on close (a larger one as
a multipart upload, which also appears only when completed).
Credentials: `[ingest] s3_access_key` / `s3_secret_key` (or `LOOKOUT_INGEST_S3_*`), else
AWS's usual chain (AWS_ACCESS_KEY_ID, profiles, instance roles). They never reach a log:
`ObjectStore` shows only its URL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pyarrow import fs as pafs

from lookout.config import IngestConfig

#: URL schemes ingest lands into through S3 (s3a:// is how Spark's hadoop-aws names it).
S3_SCHEMES = ("s3", "s3a")

#: Seconds before a PUT to an unreachable store fails (and ingest retries).
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 30.0


def is_object_store(location: str) -> bool:
    """True when `location` is an object-store URL rather than a local path."""
    return urlsplit(location).scheme in S3_SCHEMES


@dataclass(frozen=True)
class ObjectStore:
    """A bucket and key prefix to land into, and the filesystem that reaches them."""

    url: str
    base: str  # "bucket/prefix": pyarrow's name for the folder
    filesystem: pafs.FileSystem = field(repr=False)

    @classmethod
    def from_url(cls, url: str, config: IngestConfig) -> ObjectStore:
        """The store for `s3://bucket/prefix`, reached as `[ingest]` configures."""
        parts = urlsplit(url)
        if parts.scheme not in S3_SCHEMES or not parts.netloc:
            raise ValueError(f"landing URL {url!r} is not s3://bucket/prefix")
        options: dict[str, object] = {
            "region": config.s3_region,
            "allow_delayed_open": True,  # small files: one PutObject on close
            "connect_timeout": CONNECT_TIMEOUT_S,
            "request_timeout": REQUEST_TIMEOUT_S,
        }
        if config.s3_endpoint:
            endpoint = urlsplit(config.s3_endpoint)
            if endpoint.scheme not in ("http", "https") or not endpoint.netloc:
                raise ValueError(f"s3_endpoint {config.s3_endpoint!r} is not http(s)://host:port")
            options.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme)
        if config.s3_access_key:
            options.update(access_key=config.s3_access_key, secret_key=config.s3_secret_key)
        base = f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/")
        return cls(url.rstrip("/"), base, pafs.S3FileSystem(**options))

    def put(self, key: str, data: bytes) -> str:
        """Write `data` as the object `key` under the prefix in one PUT; its full name.

        Returns only once the store accepted the whole object; raises OSError otherwise.
        """
        name = f"{self.base}/{key}"
        with self.filesystem.open_output_stream(name) as out:
            out.write(data)
        return name
