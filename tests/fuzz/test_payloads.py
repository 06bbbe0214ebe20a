"""Fuzz ingest's validation and the landing split with bad payloads.

Properties (see `tests/fuzz/payloads.py`): `Validator.validate` never raises; each
message yields readings, heartbeats and rejections covering every element; a rejection
keeps the raw bytes and has a reason; accepted readings come back through the real
`LandingWriter` and the engine's sequencing on time, late or as duplicates, never lost.
The long run is `benchmarks/fuzz_input.py`.
"""

from __future__ import annotations

import json
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.validate import Validator
from tests.examples import examples
from tests.fuzz.payloads import (
    NOW_MS,
    Message,
    check_landing,
    check_message,
    library_streams,
    messages,
    readings,
    topic_for,
)

FUZZ = settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))


@cache
def validator() -> Validator:
    """The validator ingest builds (`build_ingester`) for the library and the every-type
    stream, with a small payload limit so that oversized messages occur too."""
    return Validator(library_streams(), max_payload_bytes=2_000)


@FUZZ
@given(st.data())
def test_validate_accounts_for_every_element(data: st.DataObject) -> None:
    """One message: never raises; every element accepted or rejected with a reason."""
    v = validator()
    message = data.draw(messages(v.streams))
    check_message(v, message, v.validate(message.topic, message.payload, NOW_MS))


@settings(FUZZ, max_examples=examples(100))
@given(st.data())
def test_landing_round_trip_loses_nothing(data: st.DataObject) -> None:
    """A run of messages landed and split: every reading, heartbeat and rejection is back."""
    v = validator()
    batch = data.draw(st.lists(messages(v.streams), min_size=1, max_size=12))
    results = [(m, v.validate(m.topic, m.payload, NOW_MS)) for m in batch]
    for message, result in results:
        check_message(v, message, result)
    check_landing(v, results)


@settings(FUZZ, max_examples=examples(100))
@given(st.data())
def test_well_formed_readings_are_accepted(data: st.DataObject) -> None:
    """The generator's intact readings are accepted (the fuzzer is not only rejecting)."""
    v = validator()
    stream = data.draw(st.sampled_from(list(v.streams)))
    items = [
        item
        for item, intact in data.draw(st.lists(readings(stream), min_size=1, max_size=5))
        if intact
    ]
    if not items:
        return
    result = v.validate(topic_for(stream, "s1"), json.dumps(items).encode(), NOW_MS)
    assert not result.rejections, result.rejections
    assert len(result.readings) == len(items)
    # A run id is kept as text, an integer one with every digit.
    assert [r["epoch"] for r in result.readings] == [str(i.get("epoch", "")) for i in items]


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff\xfe{\x00}\x00",
        b'{"station": NaN}',
        b"[" * 10_000 + b"]" * 10_000,
        b'[{"station": 1}, 7, null, [], {}, "x"]',
        b'{"ts": "0001-01-01T00:00:00+01:00"}',
        b'[{"ts": 18446744073709551615, "source": "a", "seq": 1}]',
    ],
)
def test_nasty_payloads(payload: bytes) -> None:
    """A few hand-picked nasties on the traffic topic and the every-type topic."""
    v = validator()
    for stream in v.streams:
        message = Message(topic_for(stream, "s1"), payload)
        result = v.validate(message.topic, message.payload, NOW_MS)
        check_message(v, message, result)
        check_landing(v, [(message, result)])
