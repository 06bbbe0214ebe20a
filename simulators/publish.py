"""Where the messages go: MQTT (paced, batched, acknowledged), a JSON-lines file, or replay.

The pacing maps arrival time (event-time ms) to the wall clock: a message arriving at
``a`` is sent at ``wall0 + (a - start) / speedup``; ``speedup`` 0 sends as fast as
possible. Readings for one topic are batched up to ``batch`` per message (a JSON array;
a single reading goes as an object); a partial batch goes out whenever the publisher
is ahead of schedule, so batching never adds latency. Heartbeats and malformed payloads
are single messages, sent after the buffered readings. The readings of a chunk due
together are written to JSON in one go (:meth:`simulators.rows.Writer.render`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import IO, Any

import numpy as np
import orjson
import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from lookout.mqtt_auth import Login
from simulators.common import format_ts, parse_ts
from simulators.disorder import Item, Message
from simulators.rows import Chunk
from simulators.truth import Truth


class FileSink:
    """Writes readings as JSON lines in arrival order (malformed payloads as raw lines).

    Heartbeats are not written: the file is the readings a replay consumes, and its end
    is the final heartbeat.
    """

    def __init__(self, path: str) -> None:
        self._fh: IO[bytes] = open(path, "wb")  # noqa: SIM115
        self.readings = 0
        self.messages = 0
        self.inflight = 0

    def send(self, kind: str, topic: str, payload: dict | bytes) -> None:
        """Write one message (heartbeats are dropped)."""
        if kind == "heartbeat":
            return
        if kind == "reading":
            self.readings += 1
            self._fh.write(orjson.dumps(payload) + b"\n")
        else:
            data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
            self._fh.write(data.replace(b"\n", b" ") + b"\n")
        self.messages += 1

    def send_rows(self, chunk: Chunk, i: int, j: int) -> None:
        """Write the readings ``i:j`` of ``chunk``."""
        self._fh.write((chunk.writer.render(chunk.rows[i:j]) + "\n").encode())
        self.readings += j - i
        self.messages += j - i

    def flush(self) -> None:
        """Nothing is buffered beyond the file object's own buffer."""

    def wait(self, seconds: float, stop: threading.Event | None = None) -> None:
        """Sleep (a file needs no servicing), or until `stop` is set."""
        if stop is None:
            time.sleep(seconds)
        else:
            stop.wait(seconds)

    def close(self) -> None:
        """Close the file."""
        self._fh.close()


class MqttSink:
    """Publishes to an MQTT broker with QoS ``qos``, at most ``max_inflight`` unacknowledged,
    logged in as ``login`` (None: anonymously).

    The network loop runs in the caller's thread (no paho thread): a busy generator would
    otherwise starve the loop thread of the GIL and PUBACKs would trickle in (5k/s).
    ``close`` waits for every PUBACK (QoS 1) so that a finished run has lost nothing.
    """

    def __init__(
        self,
        host: str,
        port: int,
        qos: int = 1,
        batch: int = 1,
        client_id: str | None = None,
        max_inflight: int = 100,
        login: Login | None = None,
    ) -> None:
        self.qos = qos
        self.batch = max(1, batch)
        self.max_inflight = max_inflight
        self.readings = 0
        self.messages = 0
        self._acked = 0
        self._connected = False
        # Readings not yet sent by topic: their JSON joined by commas, and how many.
        self._buf: dict[str, tuple[str, int]] = {}
        cid = client_id or f"lookout-sim-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid)
        if login is not None:
            self._client.username_pw_set(login.username, login.password)
        # The window is bounded here (`_publish`); paho's own bound costs a scan of every
        # message in flight at each PUBACK.
        self._client.max_inflight_messages_set(0)
        self._client.on_publish = self._on_publish
        self._client.on_connect = self._on_connect
        self._client.connect(host, port, keepalive=30)
        deadline = time.monotonic() + 10
        while not self._connected:
            if time.monotonic() > deadline:
                self._client.disconnect()
                raise ConnectionError(f"no CONNACK from {host}:{port}")
            self._client.loop(timeout=0.1)

    @property
    def inflight(self) -> int:
        """Messages published but not yet acknowledged."""
        return self.messages - self._acked if self.qos else 0

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:
            raise ConnectionError(f"broker refused the connection: {reason_code}")
        self._connected = True

    def _on_publish(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties,
    ) -> None:
        self._acked += 1

    def _serve(self, timeout: float, until: float | None = None) -> None:
        """One round of the network loop; reconnect if the broker went away (a restart),
        trying until the monotonic time `until` (None: for as long as it takes).

        paho's manual `loop` does not reconnect by itself. On reconnect paho sends the
        unacknowledged QoS 1 messages again (DUP), so nothing published is lost; a copy
        the broker already had is a duplicate, which ingest removes by (source, seq).
        """
        if self._client.loop(timeout=timeout) == mqtt.MQTT_ERR_SUCCESS:
            return
        delay = 0.2
        while until is None or time.monotonic() < until:
            time.sleep(delay)
            try:
                if self._client.reconnect() == mqtt.MQTT_ERR_SUCCESS:
                    print("simulate: reconnected to the broker", file=sys.stderr, flush=True)
                    return
            except OSError:
                pass
            delay = min(delay * 2, 5.0)

    def _publish(self, topic: str, data: bytes) -> None:
        # Bound the in-flight window: paho would otherwise queue without limit.
        while self.qos and self.messages - self._acked >= self.max_inflight:
            self._serve(0.05)
        self._client.publish(topic, data, qos=self.qos)
        self.messages += 1  # once published: `close` waits for this many PUBACKs

    def wait(self, seconds: float, stop: threading.Event | None = None) -> None:
        """Idle for ``seconds`` (or until `stop` is set) while serving the network
        (PUBACKs, keep-alive)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0 and not (stop and stop.is_set()):
            self._serve(min(left, 0.1))

    def _flush_topic(self, topic: str) -> None:
        held = self._buf.pop(topic, None)
        if held:
            self._publish(topic, _message(*held))

    def send(self, kind: str, topic: str, payload: dict | bytes) -> None:
        """Queue a reading for its topic's batch, or publish a heartbeat/malformed payload."""
        if kind == "reading":
            self.readings += 1
            text = orjson.dumps(payload).decode()
            held, n = self._buf.get(topic, ("", 0))
            self._buf[topic] = (f"{held},{text}" if n else text, n + 1)
            if n + 1 >= self.batch:
                self._flush_topic(topic)
            return
        # Heartbeats promise no older readings: everything buffered must go first.
        self.flush()
        self._publish(topic, payload if isinstance(payload, bytes) else orjson.dumps(payload))

    def send_rows(self, chunk: Chunk, i: int, j: int) -> None:
        """Queue the readings ``i:j`` of ``chunk`` for their topics' batches; publish each
        batch filled, in the order they fill (as reading by reading would).

        The rows are written topic by topic in one go, each batch's readings joined by
        commas and batches apart by newlines.
        """
        rows = chunk.rows[i:j]
        n = len(rows)
        self.readings += n
        order = np.argsort(rows["topic"], kind="stable")
        by_topic = rows["topic"][order]
        cuts = np.flatnonzero(by_topic[1:] != by_topic[:-1]) + 1
        positions = order.tolist()
        seps = [","] * n
        # Each piece of a batch: (position it filled at, None for the partial batch left,
        # topic, the readings held before it and how many, the batch's readings in all).
        pieces: list[tuple[int | None, str, str, int]] = []
        names, size = chunk.writer.names, self.batch
        for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, n].tolist(), strict=True):
            topic = names[int(by_topic[a])]
            held, count = self._buf.pop(topic, ("", 0))
            k = a
            while k < b:
                end = min(b, k + size - count)
                seps[end - 1] = "\n"
                total = count + end - k
                filled = positions[end - 1] if total == size else None
                pieces.append((filled, topic, held, total))
                k, held, count = end, "", 0
        texts = chunk.writer.render(rows[order], seps).split("\n")
        full = []
        for (filled, topic, held, total), text in zip(pieces, texts, strict=True):
            if held:
                text = f"{held},{text}"
            if filled is None:
                self._buf[topic] = (text, total)
            else:
                full.append((filled, topic, text, total))
        full.sort(key=itemgetter(0))
        for _, topic, text, count in full:
            self._publish(topic, _message(text, count))

    def flush(self) -> None:
        """Publish every partial batch."""
        for topic in list(self._buf):
            self._flush_topic(topic)

    def close(self, timeout: float = 60.0) -> None:
        """Flush, wait (at most `timeout` s, reconnecting meanwhile) for all
        acknowledgements, disconnect; say how many never came."""
        self.flush()
        deadline = time.monotonic() + timeout
        while self.qos and self._acked < self.messages and time.monotonic() < deadline:
            self._serve(0.1, until=deadline)
        if self.inflight:
            print(
                f"simulate: {self.inflight} messages not acknowledged after {timeout:.0f} s "
                "(the broker is unreachable): they may not have arrived",
                file=sys.stderr,
                flush=True,
            )
        self._client.disconnect()


def _message(readings: str, count: int) -> bytes:
    """One message of ``count`` readings (their JSON joined by commas): an array, or an
    object when there is one."""
    return (readings if count == 1 else f"[{readings}]").encode()


class Progress:
    """Prints counts and the achieved rate to stderr about once a second."""

    def __init__(self, label: str, truth: Truth | None, quiet: bool = False) -> None:
        self.label = label
        self.truth = truth
        self.quiet = quiet
        self.t0 = time.monotonic()
        self._last = self.t0
        self._last_n = 0

    def tick(self, sink: FileSink | MqttSink, event_ms: int, final: bool = False) -> None:
        """Report if a second has passed (or always when ``final``)."""
        now = time.monotonic()
        if self.quiet or (not final and now - self._last < 1.0):
            return
        n = sink.readings
        rate = (n - self._last_n) / max(now - self._last, 1e-9)
        if final:
            rate = n / max(now - self.t0, 1e-9)
        faults = ""
        if self.truth is not None:
            c = self.truth.counts
            faults = f" late {c['late']} dup {c['duplicate']} malformed {c['malformed']}"
        print(
            f"{self.label}: {n} readings in {sink.messages} msgs, "
            f"{'average' if final else 'now'} {rate:,.0f} readings/s, in-flight {sink.inflight},"
            f"{faults} event time {format_ts(event_ms, 'iso')}",
            file=sys.stderr,
            flush=True,
        )
        self._last, self._last_n = now, n


# Pacing sleeps only when the next reading is due more than this far ahead; readings due
# sooner join the current batches, so a reading may be sent up to 50 ms early. Flushing
# at every millisecond of pacing sent ~6 readings per message at 20k/s over 40 topics,
# and the client's per-message cost then dominated the simulator's CPU.
LINGER_S = 0.05


def emit(
    items: Iterable[Item],
    sink: FileSink | MqttSink,
    speedup: float,
    start_ms: int,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Send ``items`` (chunks of readings and single messages) to ``sink`` paced by
    arrival time; return the readings sent.

    ``speedup`` 0 means as fast as possible. Setting ``stop`` (or Ctrl-C) stops cleanly:
    what was sent is flushed and acknowledged.
    """
    wall0 = time.monotonic()
    event_ms = start_ms

    def pace(arrival: int) -> None:
        wait = wall0 + (arrival - start_ms) / 1000 / speedup - time.monotonic()
        if wait > LINGER_S:
            sink.flush()
            sink.wait(wait, stop)  # returns early once `stop` is set

    try:
        for item in items:
            if not isinstance(item, Chunk):
                arrival, kind, topic, payload = item
                if speedup > 0:
                    pace(arrival)
                if stop is not None and stop.is_set():
                    break
                event_ms = arrival
                sink.send(kind, topic, payload)
                if progress is not None:
                    progress.tick(sink, event_ms)
                continue
            arrivals = np.ascontiguousarray(item.rows["arrival"])
            i, n = 0, len(item)
            while i < n:
                j = n
                if speedup > 0:
                    pace(int(arrivals[i]))
                    # Everything due within LINGER_S goes now.
                    due = start_ms + (time.monotonic() - wall0 + LINGER_S) * 1000 * speedup
                    j = max(i + 1, int(np.searchsorted(arrivals, due, side="right")))
                if stop is not None and stop.is_set():
                    break
                sink.send_rows(item, i, j)
                event_ms = int(arrivals[j - 1])
                if progress is not None:
                    progress.tick(sink, event_ms)
                i = j
            if stop is not None and stop.is_set():
                break
    except KeyboardInterrupt:
        pass
    finally:
        sink.close()
        if progress is not None:
            progress.tick(sink, event_ms, final=True)
    return sink.readings


def _topic_of(reading: dict) -> str | None:
    if "station" in reading:
        return f"lookout/traffic/{reading['station']}/readings"
    if "door" in reading:
        return f"lookout/rfid/{reading['door']}/readings"
    if "vid" in reading:
        return f"lookout/positions/{reading.get('xway', 0)}/readings"
    return None


def replay_messages(
    lines: Iterable[bytes],
    default_topic: str,
    heartbeat_lag_ms: int | None = None,
    heartbeat_ms: int = 1000,
) -> Iterator[Message]:
    """Messages to republish a recorded JSON-lines file, timed by its readings' ``ts``.

    A reading's arrival is the running maximum of ``ts`` (so a disordered file keeps its
    order and its pace); lines that are not readings go, as they are, to the topic of the
    reading before them (``default_topic`` at the start). With ``heartbeat_lag_ms``,
    every ``heartbeat_ms`` of that clock each source seen so far gets a heartbeat
    promising ``clock - lag`` (the lag must cover the file's disorder and skew), and a
    final one promising the file's end.
    """
    topic = default_topic
    clock: int | None = None
    next_hb: int | None = None
    kinds: dict[str, str] = {}

    def heartbeats(h: int, promise: int) -> Iterator[Message]:
        for src in sorted(kinds):
            hb_topic = f"lookout/{kinds[src]}/{src}/heartbeat"
            yield h, "heartbeat", hb_topic, {"source": src, "ts": promise}

    for raw in lines:
        line = raw.rstrip(b"\r\n")
        if not line:
            continue
        try:
            obj = orjson.loads(line)
            t = parse_ts(obj["ts"])
            new_topic = _topic_of(obj)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            obj, t, new_topic = None, None, None
        if obj is None or new_topic is None or t is None:
            yield (clock or 0), "malformed", topic, line
            continue
        topic = new_topic
        clock = t if clock is None else max(clock, t)
        if heartbeat_lag_ms is not None:
            if next_hb is None:
                next_hb = (clock // heartbeat_ms + 1) * heartbeat_ms
            while clock >= next_hb:
                yield from heartbeats(next_hb, next_hb - heartbeat_lag_ms)
                next_hb += heartbeat_ms
            kinds.setdefault(str(obj.get("source")), topic.split("/")[1])
        yield clock, "reading", topic, obj
    if heartbeat_lag_ms is not None and clock is not None:
        yield from heartbeats(clock, clock)


def first_ts(path: str) -> int:
    """The ``ts`` of the first parseable reading of a recorded file (its replay start)."""
    with open(path, "rb") as fh:
        for line in fh:
            try:
                return parse_ts(orjson.loads(line)["ts"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
    return 0
