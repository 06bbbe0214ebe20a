"""`lookout replay --workers N`: each worker of a split evaluation
(`engine.core.partitions`) in its own process, fed over a socket pair.

A worker process is forked once the rules are loaded and before any reading is (so it
starts at once, with the plan, and holds no input); Arrow's thread pools are safe
across a fork. It runs Python's collector as the engine's workers do
(`engine.python_gc`), takes each batch's share of the admitted readings as Arrow
tables, sends back the rows it emitted so far when asked to drain them (a replay
writing its outputs as they become final) and everything else it produced when told
to end. The parent judges the next batch while the workers evaluate this one.

Messages are pickled with their Arrow buffers out of band (:class:`Channel`): a buffer
is written from where it lies and read into one new buffer that the table then wraps,
not copied into and out of pickle's byte stream on each side.
"""

from __future__ import annotations

import multiprocessing
import pickle
import socket
import struct
import traceback
from collections.abc import Mapping
from typing import Any

from engine.core.output_order import unsourced
from engine.core.partitions import PartitionWorker, Produced, Shares
from engine.core.plan import Plan
from engine.core.runners import SinkRows
from engine.python_gc import collector_paused, freeze_batch_survivors, freeze_worker_heap
from lookout.replay_outputs import rendered


class WorkerFailed(RuntimeError):
    """A worker process stopped or raised; the message holds its traceback."""


class WorkerProcess:
    """A :class:`~engine.core.partitions.PartitionWorker` of ``plan`` running ``groups``
    (index: stages), in a forked process; with ``render``, the rows it emitted come back
    as their JSON lines (`lookout.replay_outputs.rendered`), made there."""

    def __init__(
        self, plan: Plan, groups: Mapping[int, frozenset[int]], render: bool = False
    ) -> None:
        context = multiprocessing.get_context("fork")
        self._conn, theirs = Channel.pair()
        args = (theirs, plan, dict(groups), render)
        self._process = context.Process(target=_serve, args=args, daemon=True)
        self._process.start()
        theirs.close()

    def feed(self, shares: Shares, watermarks: Mapping[str, int]) -> None:
        """Send a batch's share (the worker evaluates it while the caller goes on)."""
        self._send(("feed", shares, dict(watermarks)))

    def end(self, ends: Mapping[str, int] | None) -> None:
        """Send the final advance (the worker ends while the caller goes on)."""
        self._send(("end", None if ends is None else dict(ends)))

    def drain(self) -> list[SinkRows]:
        """Wait for the rows the worker emitted since the last drain."""
        self._send(("drain",))
        drained: list[SinkRows] = self._reply()
        return drained

    def produced(self) -> Produced:
        """Wait for everything the worker produced but the rows drained."""
        produced: Produced = self._reply()
        return produced

    def _reply(self) -> Any:
        try:
            reply = self._conn.recv()
        except (EOFError, OSError):
            raise WorkerFailed(self._stopped()) from None
        if isinstance(reply, str):
            raise WorkerFailed(f"a replay worker failed:\n{reply}")
        return reply

    def close(self) -> None:
        """Stop the process (at once if it is still working)."""
        self._conn.close()
        if self._process.is_alive():
            self._process.terminate()
        self._process.join()

    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            self._conn.send(message)
        except OSError:
            raise WorkerFailed(self._stopped()) from None

    def _stopped(self) -> str:
        self._process.join(timeout=5)
        return f"a replay worker stopped (exit code {self._process.exitcode})"


class Channel:
    """One end of a socket pair carrying pickled messages, their buffers out of band."""

    BUFFER_BYTES = 4 << 20
    """Each socket's send and receive buffer: fewer, larger writes and reads."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    @classmethod
    def pair(cls) -> tuple[Channel, Channel]:
        """Two connected ends."""
        ends = socket.socketpair()
        for end in ends:
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, cls.BUFFER_BYTES)
            end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, cls.BUFFER_BYTES)
        return cls(ends[0]), cls(ends[1])

    def send(self, message: Any) -> None:
        """Send ``message``: its pickle, then each buffer pickle left out of it."""
        buffers: list[pickle.PickleBuffer] = []
        head = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
        parts = [memoryview(head), *(b.raw() for b in buffers)]
        sizes = [len(parts), *(p.nbytes for p in parts)]
        self._sock.sendall(struct.pack(f"<{len(sizes)}q", *sizes))
        for part in parts:
            self._sock.sendall(part)

    def recv(self) -> Any:
        """The next message; EOFError once the other end is closed."""
        (count,) = struct.unpack("<q", self._exactly(8))
        sizes = struct.unpack(f"<{count}q", self._exactly(8 * count))
        head, *buffers = (self._exactly(size) for size in sizes)
        return pickle.loads(head, buffers=buffers)

    def _exactly(self, size: int) -> bytearray:
        data = bytearray(size)
        view, got = memoryview(data), 0
        while got < size:
            read = self._sock.recv_into(view[got:], size - got)
            if not read:
                raise EOFError("the other end closed")
            got += read
        return data

    def close(self) -> None:
        """Close this end."""
        self._sock.close()


def _serve(conn: Channel, plan: Plan, groups: dict[int, frozenset[int]], render: bool) -> None:
    """A worker process's loop: feed batches (and send the rows emitted so far when told
    to drain) until told to end, then send the result or, after an error, its traceback
    as text."""
    failed: str | None = None
    worker = None
    try:
        worker = PartitionWorker(plan, groups)
    except Exception:  # reported at the end
        failed = traceback.format_exc()
    freeze_worker_heap()
    with collector_paused():
        while True:
            kind, *args = conn.recv()
            if kind == "drain":
                reply: list[SinkRows] | str | None = failed
                if worker is not None and failed is None:
                    try:
                        reply = _drained(worker, plan if render else None)
                    except Exception:  # reported now and at the end
                        reply = failed = traceback.format_exc()
                conn.send(reply)
                continue
            if kind == "end":
                if worker is None or failed is not None:
                    conn.send(failed)
                else:
                    conn.send(_ended(worker, args[0], plan if render else None))
                return
            if worker is not None and failed is None:
                try:
                    worker.feed(*args)
                except Exception:  # reported at the end
                    failed = traceback.format_exc()
                freeze_batch_survivors()


def _drained(worker: PartitionWorker, render: Plan | None) -> list[SinkRows]:
    """The rows the worker emitted since the last drain, as JSON lines of ``render``'s
    streams (if given)."""
    emitted = worker.drain()
    if render is not None:
        return [rendered(item, render) for item in emitted]
    # Without the string column output order leaves behind anyway: a third less to send.
    return [unsourced(item) for item in emitted]


def _ended(
    worker: PartitionWorker, ends: Mapping[str, int] | None, render: Plan | None
) -> Produced | str:
    """The worker's result, its rows rendered as JSON lines of ``render``'s streams (if
    given), or the traceback of what went wrong."""
    try:
        worker.end(ends)
        result = worker.produced()
        if render is not None:
            result.emitted = [rendered(item, render) for item in result.emitted]
        return result
    except Exception:  # reported to the parent
        return traceback.format_exc()
