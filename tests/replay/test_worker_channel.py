"""The socket channel replay's worker processes are fed over: a message comes out as it
went in, its Arrow buffers carried out of band, however they were sliced and chunked."""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.runners import SinkRows
from lookout.replay_workers import Channel
from tests.examples import examples


def _table(n: int) -> pa.Table:
    return pa.table(
        {
            "station": pa.array(np.arange(n, dtype=np.int32)),
            "speed": pa.array(np.linspace(0.0, 1.0, n)),
            "name": pa.array([None if i % 7 == 0 else f"s{i}" for i in range(n)]),
        }
    )


@settings(max_examples=examples(30), deadline=None)
@given(st.integers(0, 3000), st.integers(0, 3000), st.integers(1, 4))
def test_a_message_comes_out_as_it_went_in(size, start, chunks) -> None:
    table = pa.concat_tables([_table(size)] * chunks).slice(start)
    message = ("feed", {"traffic": table}, [SinkRows(2, "out", table)], {"traffic": 17})
    ours, theirs = Channel.pair()
    # A message larger than the sockets' buffers needs a reader while it is written.
    received: list[object] = []
    reader = threading.Thread(target=lambda: received.append(theirs.recv()))
    reader.start()
    ours.send(message)
    reader.join()
    kind, shares, rows, marks = received[0]  # type: ignore[misc]
    assert kind == "feed" and marks == {"traffic": 17}
    assert shares["traffic"].equals(table)
    assert rows[0].stage == 2 and rows[0].sink == "out" and rows[0].table.equals(table)


def test_a_closed_end_reads_as_the_end() -> None:
    ours, theirs = Channel.pair()
    ours.close()
    with pytest.raises(EOFError):
        theirs.recv()


def test_a_message_crosses_a_fork() -> None:
    ours, theirs = Channel.pair()
    pid = os.fork()
    if pid == 0:  # the child echoes one message back and leaves
        try:
            theirs.send(theirs.recv())
        finally:
            os._exit(0)
    table = _table(200_000)
    ours.send({"t": table})
    assert ours.recv()["t"].equals(table)
    os.waitpid(pid, 0)
