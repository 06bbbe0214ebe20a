"""Arrow tables as bytes (the IPC stream format): how a batch's columns cross Spark's
rows between the landing source, the stateful step and the driver, with no Python object
per value on either side."""

from __future__ import annotations

import pyarrow as pa


def ipc_bytes(data: pa.RecordBatch | pa.Table, compression: str | None = None) -> bytes:
    """`data` as an Arrow IPC stream, its buffers compressed with `compression` (Arrow's
    codec name: "zstd", "lz4") or not."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, data.schema, options=options) as writer:
        writer.write(data)
    return sink.getvalue().to_pybytes()


def read_ipc(payload: bytes) -> pa.Table:
    """The table an :func:`ipc_bytes` payload holds."""
    return pa.ipc.open_stream(payload).read_all()
