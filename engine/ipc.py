"""Arrow tables as bytes (the IPC stream format): how a batch's columns cross Spark's
rows between the landing source, the stateful step and the driver, with no Python object
per value on either side."""

from __future__ import annotations

import pyarrow as pa


def ipc_bytes(data: pa.RecordBatch | pa.Table) -> bytes:
    """`data` as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write(data)
    return sink.getvalue().to_pybytes()


def read_ipc(payload: bytes) -> pa.Table:
    """The table an :func:`ipc_bytes` payload holds."""
    return pa.ipc.open_stream(payload).read_all()
