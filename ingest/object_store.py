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
The filesystem and credentials are `[s3]`'s (`lookout.storage`), shared with the engine
and the dashboard; they never reach a log: `ObjectStore` shows only its URL.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyarrow import fs as pafs

from lookout.config import S3Config
from lookout.storage import bucket_path, s3_filesystem


@dataclass(frozen=True)
class ObjectStore:
    """A bucket and key prefix to land into, and the filesystem that reaches them."""

    url: str
    base: str  # "bucket/prefix": pyarrow's name for the folder
    filesystem: pafs.FileSystem = field(repr=False)

    @classmethod
    def from_url(cls, url: str, s3: S3Config) -> ObjectStore:
        """The store for `s3://bucket/prefix`, reached as `[s3]` configures."""
        try:
            base = bucket_path(url)
        except ValueError:
            raise ValueError(f"landing URL {url!r} is not s3://bucket/prefix") from None
        return cls(url.rstrip("/"), base, s3_filesystem(s3))

    def put(self, key: str, data: bytes) -> str:
        """Write `data` as the object `key` under the prefix in one PUT; its full name.

        Returns only once the store accepted the whole object; raises OSError otherwise.
        """
        name = f"{self.base}/{key}"
        with self.filesystem.open_output_stream(name) as out:
            out.write(data)
        return name
