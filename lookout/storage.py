"""Where the lakehouse and the landing live: a local folder or an `s3://bucket/prefix`,
and how each library reaches it, from the one `[s3]` section.

- pyarrow's filesystem (`filesystem`, `put_whole`, `read_whole`, `list_names`): health
  records, the checkpoint layout marker, ingest's landing objects;
- delta-rs (`delta_options`): every table read and write;
- Spark reads the same URLs through Hadoop's S3A (`engine/spark/session.py`).

Credentials come from `[s3]` (or `LOOKOUT_S3_*`), else AWS's usual chain; they never
reach a log (`S3Config` hides the secret from its repr, and no function here logs).
"""

from __future__ import annotations

import contextlib
import os
from urllib.parse import urlsplit

from pyarrow import fs as pafs

from lookout.config import Config, S3Config

#: URL schemes of S3 locations (s3a:// is how Hadoop's S3A connector names them).
S3_SCHEMES = ("s3", "s3a")

#: `[s3]` as shipped: AWS itself, its credential chain (and all a local location needs).
DEFAULT_S3 = S3Config()

#: Seconds before a request to an unreachable store fails (and the caller retries).
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 30.0


def is_object_store(location: str) -> bool:
    """True when `location` is an object-store URL rather than a local path."""
    return urlsplit(location).scheme in S3_SCHEMES


def uses_object_store(config: Config) -> bool:
    """True when the lakehouse or the landing is on S3."""
    return is_object_store(config.lakehouse) or is_object_store(config.landing)


def s3_endpoint(s3: S3Config) -> tuple[str, str] | None:
    """(scheme, host:port) of `[s3] endpoint`, None when empty (AWS itself)."""
    if not s3.endpoint:
        return None
    endpoint = urlsplit(s3.endpoint)
    if endpoint.scheme not in ("http", "https") or not endpoint.netloc:
        raise ValueError(f"[s3] endpoint {s3.endpoint!r} is not http(s)://host:port")
    return endpoint.scheme, endpoint.netloc


def s3_filesystem(s3: S3Config) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem reached as `[s3]` says; a file smaller than its part size
    (10 MB) is sent as one PutObject on close (`allow_delayed_open`), so it appears whole."""
    options: dict[str, object] = {
        "region": s3.region,
        "allow_delayed_open": True,
        "connect_timeout": CONNECT_TIMEOUT_S,
        "request_timeout": REQUEST_TIMEOUT_S,
    }
    endpoint = s3_endpoint(s3)
    if endpoint is not None:
        options.update(scheme=endpoint[0], endpoint_override=endpoint[1])
    if s3.access_key:
        options.update(access_key=s3.access_key, secret_key=s3.secret_key)
    return pafs.S3FileSystem(**options)


def bucket_path(url: str) -> str:
    """`bucket/prefix` of `s3://bucket/prefix` (pyarrow's name for it)."""
    parts = urlsplit(url)
    if parts.scheme not in S3_SCHEMES or not parts.netloc:
        raise ValueError(f"{url!r} is not s3://bucket/prefix")
    return f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/")


def filesystem(location: str, s3: S3Config) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding `location` (a local path or an S3 URL) and its path there."""
    if is_object_store(location):
        return s3_filesystem(s3), bucket_path(location)
    if "://" in location:  # file://, hdfs://, ...: pyarrow's own resolution
        return pafs.FileSystem.from_uri(location)
    return pafs.LocalFileSystem(), os.path.abspath(location)


def put_whole(location: str, data: bytes, s3: S3Config) -> None:
    """Replace the file or object at `location` so that a reader sees the old or the new
    content, never part of it: on S3 one PUT; locally a temporary file renamed over it."""
    fs, path = filesystem(location, s3)
    if isinstance(fs, pafs.S3FileSystem):
        with fs.open_output_stream(path) as out:
            out.write(data)
        return
    folder, name = os.path.split(path)
    fs.create_dir(folder, recursive=True)
    tmp = os.path.join(folder, f".{name}.tmp")
    try:
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fs.move(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):  # a full or read-only disk: leave no half file
            fs.delete_file(tmp)
        raise


def read_whole(location: str, s3: S3Config) -> bytes | None:
    """The content of the file or object at `location`, None when there is none."""
    fs, path = filesystem(location, s3)
    try:
        with fs.open_input_stream(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def list_names(folder: str, s3: S3Config) -> list[str]:
    """Names of the entries directly in `folder` (empty when it does not exist)."""
    fs, path = filesystem(folder, s3)
    listing = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(info.base_name for info in listing)


def exists(location: str, s3: S3Config) -> bool:
    """True when a file or object is at `location`."""
    fs, path = filesystem(location, s3)
    return fs.get_file_info(path).type == pafs.FileType.File


def delta_options(location: str, s3: S3Config) -> dict[str, str] | None:
    """delta-rs's storage options for a table at `location` (None for a local path).

    Commits: delta-rs 1.x writes each commit file with a conditional PUT (If-None-Match),
    so two writers racing for one version cannot overwrite each other; AWS S3 (since
    2024), MinIO and moto honour it. Its DynamoDB locking provider is gone, and
    `AWS_S3_ALLOW_UNSAFE_RENAME` changes nothing, so an S3-compatible server without
    conditional writes cannot hold the lakehouse. Named here rather than left to the
    default, so a change of default cannot quietly make commits unsafe.
    """
    if not is_object_store(location):
        return None
    options = {"AWS_REGION": s3.region, "conditional_put": "etag"}
    endpoint = s3_endpoint(s3)
    if endpoint is not None:
        options["AWS_ENDPOINT_URL"] = s3.endpoint
        options["AWS_ALLOW_HTTP"] = str(endpoint[0] == "http").lower()
    if s3.access_key:
        options.update(AWS_ACCESS_KEY_ID=s3.access_key, AWS_SECRET_ACCESS_KEY=s3.secret_key)
    return options


def lakehouse_options(config: Config) -> dict[str, str] | None:
    """delta-rs's storage options for the lakehouse's tables (None when it is local)."""
    return delta_options(config.lakehouse, config.s3)
