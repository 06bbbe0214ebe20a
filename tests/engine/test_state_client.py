"""`engine.spark.state_client`: the state server's rows read as plain tuples, against
PySpark's own unpickling of the same bytes (laid out as Spark's Pyrolite pickler writes
a row: the row maker's global, the schema from its JSON, the values); and a listing's
requests and answers, against a scripted server."""

from __future__ import annotations

import json
import pickle
import struct
from io import BytesIO
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.serializers import CPickleSerializer
from pyspark.sql import types as T
from pyspark.sql.streaming.proto import StateMessage_pb2 as proto
from pyspark.sql.streaming.stateful_processor_api_client import StatefulProcessorApiClient

from engine.spark import state_client
from engine.spark.processor import STATE_KEY, STATE_VALUE
from engine.spark.state_client import (
    RowReader,
    get_pipelined,
    iterate,
    keys,
    plain_row,
    plain_schema,
    row_bytes,
)

SPARK_ROWS = Path(__file__).parent / "data" / "state_server_rows.json"
"""Keys and values as Spark 4.2's state server sent them (a listing of the engine's map
state), with its memo opcodes between the parts."""


def _opcodes(value: object) -> bytes:
    """``value`` pickled, without the protocol header and the stop."""
    return pickle.dumps(value, 2)[2:-1]


def pyrolite_row(schema: T.StructType, values: tuple) -> bytes:
    """A row as the state server pickles it."""
    return (
        b"\x80\x02"
        + b"cpyspark.sql.types\n_create_row_inbound_converter\n"
        + b"cpyspark.sql.types\n_parse_datatype_json_string\n"
        + _opcodes(schema.json())
        + b"\x85R"  # TUPLE1 REDUCE: the schema
        + b"\x85R"  # TUPLE1 REDUCE: the row maker
        + b"("  # MARK
        + b"".join(_opcodes(v) for v in values)
        + b"tR."  # TUPLE REDUCE STOP: the row
    )


texts = st.text(max_size=40)


@given(texts, texts, texts, st.integers(-(2**63), 2**63 - 1))
def test_a_key_reads_as_pyspark_reads_it(kind: str, name: str, key: str, number: int) -> None:
    data = pyrolite_row(STATE_KEY, (kind, name, key, number))
    assert plain_row(data) == tuple(pickle.loads(data)) == (kind, name, key, number)


@given(st.binary(max_size=3_000))
def test_a_value_reads_as_pyspark_reads_it(value: bytes) -> None:
    data = pyrolite_row(STATE_VALUE, (value,))
    assert plain_row(data) == tuple(pickle.loads(data)) == (value,)


def test_the_row_reader_reads_spark_s_own_rows_as_pyspark_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [bytes.fromhex(h) for h in json.loads(SPARK_ROWS.read_text())["rows"]]
    expected = [tuple(pickle.loads(data)) for data in rows * 2]
    assert [plain_row(data) for data in rows * 2] == expected

    def general_way(data: bytes) -> tuple:
        raise AssertionError("Spark's rows are read the fast way")

    monkeypatch.setattr(state_client, "plain_row", general_way)
    read = RowReader()
    # The header kept from the first row of each schema, and the rows again.
    assert [read(data) for data in rows * 2] == expected


@given(st.lists(st.tuples(texts, texts, texts, st.integers(-(2**63), 2**63 - 1)), max_size=5),
       st.lists(st.binary(max_size=600), max_size=5), st.randoms())  # fmt: skip
def test_the_row_reader_reads_any_mix_of_rows_as_plain_row_does(
    entries: list[tuple], values: list[bytes], order: object
) -> None:
    spark_rows = [bytes.fromhex(h) for h in json.loads(SPARK_ROWS.read_text())["rows"]]
    rows = [pyrolite_row(STATE_KEY, e) for e in entries] + [
        pyrolite_row(STATE_VALUE, (v,)) for v in values
    ]
    rows += spark_rows
    order.shuffle(rows)  # type: ignore[attr-defined]
    read = RowReader()
    assert [read(data) for data in rows] == [plain_row(data) for data in rows]


def test_a_row_laid_out_otherwise_is_read_the_general_way() -> None:
    data = pyrolite_row(STATE_KEY, ("cstate", "r", "[1]", 0))
    odd = data.replace(b"tR.", b"tRq\x09\x94.")  # an ending the reader does not know
    read = RowReader()
    assert read(data) == read(odd) == ("cstate", "r", "[1]", 0)


@given(
    texts, texts, texts, st.integers(-(2**63), 2**63 - 1), st.booleans(), st.binary(max_size=600)
)
def test_rows_are_serialised_as_pyspark_s_client_serialises_them(
    kind: str, name: str, key: str, number: int, numpy_number: bool, value: bytes
) -> None:
    client: Any = SimpleNamespace(pickleSer=CPickleSerializer())  # what the method uses
    pyspark = StatefulProcessorApiClient._serialize_to_bytes
    entry = (kind, name, key, np.int64(number) if numpy_number else number)
    assert row_bytes(entry) == pyspark(client, STATE_KEY, entry)
    assert row_bytes((value,)) == pyspark(client, STATE_VALUE, (value,))
    assert pickle.loads(row_bytes(entry)) == (kind, name, key, number)


def test_only_schemas_without_conversion_are_plain() -> None:
    assert plain_schema(STATE_KEY) and plain_schema(STATE_VALUE)
    stamped = T.StructType([T.StructField("ts", T.TimestampType())])
    assert not plain_schema(stamped)


class _Server:
    """PySpark's client as `state_client` uses it, the state server's answers scripted:
    each answer (status, pairs, more) is read once, every request is kept."""

    def __init__(self, answers: list[tuple[int, list, bool]]) -> None:
        self.answers = answers
        self.sockfile = BytesIO()
        self.requests: list[proto.StateRequest] = []

    def _receive_proto_message_with_map_pairs(self) -> tuple[int, str, list, bool]:
        self._take_requests()
        status, found, more = self.answers.pop(0)
        return status, "", found, more

    _receive_proto_message_with_map_keys_values = _receive_proto_message_with_map_pairs

    def _take_requests(self) -> None:
        data, self.sockfile = self.sockfile.getvalue(), BytesIO()
        while data:
            version, size = struct.unpack(">ii", data[:8])
            assert version == 0
            self.requests.append(proto.StateRequest.FromString(data[8 : 8 + size]))
            data = data[8 + size :]


def _state(server: _Server) -> SimpleNamespace:
    client = SimpleNamespace(_stateful_processor_api_client=server)
    return SimpleNamespace(_mapStateClient=client, _stateName="entries")


def _pair(n: int) -> SimpleNamespace:
    key = pyrolite_row(STATE_KEY, ("cstate", "rule", f"[{n}]", 0))
    return SimpleNamespace(key=key, value=pyrolite_row(STATE_VALUE, (b"v%d" % n,)))


def test_a_listing_fetches_batches_under_one_iterator_until_the_server_says_no_more() -> None:
    server = _Server([(0, [_pair(0), _pair(1)], True), (0, [_pair(2)], False)])
    listed = list(iterate(_state(server)))  # type: ignore[arg-type]
    assert listed == [(("cstate", "rule", f"[{n}]", 0), (b"v%d" % n,)) for n in range(3)]
    calls = [r.stateVariableRequest.mapStateCall for r in server.requests]
    assert len(calls) == 2 and len({c.iterator.iteratorId for c in calls}) == 1
    assert all(c.stateName == "entries" for c in calls)


def test_a_status_other_than_0_ends_a_listing() -> None:
    server = _Server([(0, [_pair(0)], True), (1, [], False)])
    assert [key[2] for key, _ in iterate(_state(server))] == ["[0]"]  # type: ignore[arg-type]
    keys_server = _Server([(0, [_pair(5).key], False)])
    assert list(keys(_state(keys_server))) == [("cstate", "rule", "[5]", 0)]  # type: ignore[arg-type]
    assert keys_server.requests[0].stateVariableRequest.mapStateCall.HasField("keys")


class _Reads(_Server):
    """The scripted server for reads of single keys: each answer (status, value bytes)."""

    def __init__(self, answers: list[tuple[int, bytes]]) -> None:
        super().__init__([])
        self.values = answers
        self.sent_before_first_answer: int | None = None

    def _receive_proto_message(self) -> tuple[int, str, bytes]:
        self._take_requests()
        if self.sent_before_first_answer is None:
            self.sent_before_first_answer = len(self.requests)
        status, data = self.values.pop(0)
        return status, "no such state" if status else "", data


def _reading(server: _Reads) -> SimpleNamespace:
    client = SimpleNamespace(_stateful_processor_api_client=server, user_key_schema=STATE_KEY)
    return SimpleNamespace(_mapStateClient=client, _stateName="entries")


def test_reads_of_many_keys_are_sent_before_any_answer_is_read() -> None:
    wanted = [("rest", "rule", f"[{n}]", 0) for n in range(3)]
    server = _Reads(
        [(0, pyrolite_row(STATE_VALUE, (b"a",))), (0, b""), (0, pyrolite_row(STATE_VALUE, (b"c",)))]
    )
    assert get_pipelined(_reading(server), wanted) == [b"a", None, b"c"]  # type: ignore[arg-type]
    assert server.sent_before_first_answer == 3
    calls = [r.stateVariableRequest.mapStateCall for r in server.requests]
    assert [c.getValue.userKey for c in calls] == [row_bytes(k) for k in wanted]
    failing = _Reads([(0, b""), (1, b"")])
    with pytest.raises(RuntimeError, match=r"failed reading \('rest', 'rule', '\[1\]', 0\)"):
        get_pipelined(_reading(failing), wanted[:2])  # type: ignore[arg-type]
