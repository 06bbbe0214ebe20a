"""Validation (pure): every well-formed reading passes unchanged, every bad one is
rejected with a reason, and nothing raises whatever the bytes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from functools import cache
from unittest.mock import patch

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.plan import StreamSchema
from ingest.validate import (
    INT_RANGE,
    ClockWindow,
    Validated,
    Validator,
    heartbeat_filter,
    normalize_reading,
    parse_timestamp,
    split_array,
    topic_matches,
)
from tests.examples import examples
from tests.fuzz.payloads import Message, library_streams, messages

NOW = 1_764_000_000_000
DAY = 86_400_000
HOUR = 3_600_000
TOPIC = "lookout/traffic/7/readings"
RFID_TOPIC = "lookout/rfid/dock-2/readings"
#: A year either way: the generated readings spread over 30 days around NOW.
WIDE = ClockWindow(max_future_ms=365 * DAY, max_past_ms=365 * DAY)

ids = st.text(min_size=1, max_size=12)
event_ms = st.integers(NOW - 30 * DAY, NOW + 30 * DAY)
traffic_readings = st.fixed_dictionaries(
    {
        "station": st.integers(*INT_RANGE),
        "lane": st.integers(0, 8),
        "speed": st.floats(0, 120, allow_nan=False),
        "length": st.floats(0, 30, allow_nan=False),
        "ts": event_ms,
        "source": ids,
        "seq": st.integers(0, 2**63 - 1),
    }
)


@pytest.fixture(scope="module")
def validator(sources: list[StreamSchema]) -> Validator:
    return Validator(sources, clock=WIDE)


@given(reading=traffic_readings)
def test_a_well_formed_reading_passes_unchanged(validator: Validator, reading: dict) -> None:
    result = validator.validate(TOPIC, orjson.dumps(reading), NOW)
    assert result.stream == "traffic" and not result.rejections
    assert result.readings == [{**reading, "epoch": ""}]


@given(
    reading=traffic_readings,
    extra=st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1)),
)
def test_undeclared_fields_are_dropped(validator: Validator, reading: dict, extra: dict) -> None:
    extra.pop("epoch", None)  # a field ingest lands (an integer epoch becomes its text)
    result = validator.validate(TOPIC, orjson.dumps({**extra, **reading}), NOW)
    assert result.readings == [{**reading, "epoch": ""}]


@given(
    batch=st.lists(
        st.one_of(
            traffic_readings.map(lambda r: ("good", r)),
            traffic_readings.map(lambda r: ("bad", {**r, "speed": -1.5})),
            traffic_readings.map(lambda r: ("bad", {k: v for k, v in r.items() if k != "ts"})),
            st.integers(-(2**63), 2**63 - 1).map(lambda n: ("bad", n)),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_a_batch_keeps_its_good_readings_in_order(
    validator: Validator, batch: list[tuple[str, object]]
) -> None:
    result = validator.validate(TOPIC, orjson.dumps([item for _, item in batch]), NOW)
    assert result.readings == [{**item, "epoch": ""} for kind, item in batch if kind == "good"]
    bad = [(i, item) for i, (kind, item) in enumerate(batch) if kind == "bad"]
    assert len(result.rejections) == len(bad)
    for (index, item), rejection in zip(bad, result.rejections, strict=True):
        assert rejection.reason.startswith(f"reading #{index} of the batch: ")
        assert orjson.loads(rejection.payload) == item


@settings(max_examples=examples(300))
@given(payload=st.binary(max_size=200), topic=st.sampled_from([TOPIC, RFID_TOPIC, "x/y"]))
def test_arbitrary_bytes_never_raise(validator: Validator, payload: bytes, topic: str) -> None:
    result = validator.validate(topic, payload, NOW)
    for rejection in result.rejections:
        assert rejection.reason and rejection.topic == topic


@given(
    value=st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=8,
    ),
    field=st.sampled_from(["station", "lane", "speed", "length", "ts", "source", "seq"]),
    reading=traffic_readings,
)
def test_any_json_value_in_any_field_is_accepted_or_rejected_by_name(
    validator: Validator, value: object, field: str, reading: dict
) -> None:
    result = validator.validate(TOPIC, orjson.dumps({**reading, field: value}), NOW)
    assert len(result.readings) + len(result.rejections) == 1
    if result.rejections:
        reason = result.rejections[0].reason
        assert f"'{field}'" in reason or "timestamp too far in the" in reason


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"station": "7"}, "field 'station' must be INT, got '7'"),
        ({"station": 2**31}, "field 'station' is out of the INT range (2147483648)"),
        ({"station": 7.5}, "field 'station' must be INT, got 7.5"),
        ({"speed": True}, "field 'speed' must be DOUBLE, got True"),
        ({"speed": None}, "field 'speed' is null"),
        ({"speed": [1.0]}, "field 'speed' is an array; expected a DOUBLE value"),
        ({"length": -0.5}, "field 'length' is negative (-0.5)"),
        ({"seq": 2**63}, "field 'seq' is out of the BIGINT range"),
        ({"ts": "2026-11-24T16:00:00"}, "has no UTC offset"),
        ({"ts": "soon"}, "field 'ts': cannot parse timestamp 'soon' as ISO-8601"),
        (
            {"ts": NOW + 400 * DAY},
            "timestamp too far in the future: 400 days ahead of ingest's clock; "
            "the limit for stream 'traffic' is 365 days",
        ),
        (
            {"ts": NOW - 400 * DAY - 3_600_000},
            "timestamp too far in the past: 400 days 1 h behind ingest's clock; "
            "the limit for stream 'traffic' is 365 days",
        ),
    ],
)
def test_each_wrong_value_gets_its_reason(validator: Validator, change: dict, reason: str) -> None:
    reading = {"station": 7, "lane": 1, "speed": 3.0, "length": 4.0, "ts": NOW, "source": "a"}
    result = validator.validate(TOPIC, orjson.dumps({**reading, "seq": 1, **change}), NOW)
    assert not result.readings
    assert reason in result.rejections[0].reason


def test_integral_floats_and_numeric_ids_are_normalised(validator: Validator) -> None:
    reading = {"station": 7.0, "lane": 1, "speed": 3, "length": 4, "ts": NOW + 0.4}
    result = validator.validate(TOPIC, orjson.dumps({**reading, "source": 12, "seq": 2.0}), NOW)
    assert result.readings == [
        {
            "station": 7,
            "lane": 1,
            "speed": 3.0,
            "length": 4.0,
            "ts": NOW,
            "source": "12",
            "seq": 2,
            "epoch": "",
        }
    ]


@given(moment=st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1)))
def test_iso_and_epoch_ms_agree(moment: datetime) -> None:
    moment = moment.replace(microsecond=moment.microsecond // 1000 * 1000, tzinfo=UTC)
    ms = round(moment.timestamp() * 1000)
    assert parse_timestamp(moment.isoformat()) == ms
    assert parse_timestamp(moment.isoformat().replace("+00:00", "Z")) == ms
    assert parse_timestamp(moment.astimezone(timezone(timedelta(hours=2))).isoformat()) == ms
    assert parse_timestamp(ms) == ms and parse_timestamp(float(ms)) == ms


def test_heartbeats_route_to_their_stream(validator: Validator) -> None:
    beat = orjson.dumps({"source": "dock-2", "ts": "2025-11-24T16:00:00+00:00"})
    result = validator.validate("lookout/rfid/dock-2/heartbeat", beat, NOW)
    assert result.stream == "tag_readings" and not result.readings
    assert result.heartbeats == [{"source": "dock-2", "ts": parse_timestamp("2025-11-24T16:00Z")}]
    empty = validator.validate("lookout/rfid/dock-2/heartbeat", b'{"source": "x"}', NOW)
    assert empty.rejections[0].reason == "heartbeat has no field 'ts'"


@given(
    levels=st.lists(st.text("abc", min_size=1, max_size=3), min_size=1, max_size=5), data=st.data()
)
def test_topic_filters_match_like_mqtt(levels: list[str], data: st.DataObject) -> None:
    topic = "/".join(levels)
    wild = [data.draw(st.sampled_from([level, "+"])) for level in levels]
    assert topic_matches("/".join(wild), topic)
    cut = data.draw(st.integers(0, len(levels) - 1))
    assert topic_matches("/".join([*wild[:cut], "#"]), topic)
    assert not topic_matches("/".join([*wild, "x"]), topic)
    assert not topic_matches("/".join([*wild[:-1], "zzzz"]), topic)


def test_subscriptions_catch_all_without_overlap(validator: Validator) -> None:
    assert validator.subscriptions() == ["lookout/#"]
    outside = Validator([StreamSchema("x", (), "ts", 0, "plant/+/readings")], catch_all="lookout/#")
    assert outside.subscriptions() == ["lookout/#", "plant/+/readings", "plant/+/heartbeat"]
    assert heartbeat_filter("a/+/readings") == "a/+/heartbeat"


def test_replay_may_omit_identity(sources: list[StreamSchema]) -> None:
    traffic = next(s for s in sources if s.name == "traffic")
    reading = {"station": 1, "lane": 1, "speed": 1.0, "length": 1.0, "ts": "2026-01-01T00:00Z"}
    assert normalize_reading(traffic, reading, require_identity=False)["ts"] == parse_timestamp(
        "2026-01-01T00:00:00+00:00"
    )
    with pytest.raises(ValueError, match="missing field 'source'"):
        normalize_reading(traffic, reading)


def _canonical(result: Validated) -> bytes:
    """A result as bytes that tell 3 from 3.0 (dict equality would not)."""
    return orjson.dumps(
        {
            "stream": result.stream,
            "readings": result.readings,
            "heartbeats": result.heartbeats,
            "rejections": [(r.topic, r.reason, r.payload.hex()) for r in result.rejections],
        },
        option=orjson.OPT_SORT_KEYS,
    )


@cache
def library_validator() -> Validator:
    """The validator of the rule library and the every-type stream (built once)."""
    return Validator(library_streams(), max_payload_bytes=2_000, clock=WIDE)


EDGE_VALUES = st.sampled_from(
    [
        -1.5,
        -0.0,
        0,
        3.0,
        2**31,
        -(2**31) - 1,
        2**63,
        2**64 - 1,
        True,
        None,
        "7",
        1e300,
        NOW + 400 * DAY,
        NOW - 400 * DAY,
        "2025-11-24T16:00:00Z",
        [1],
        {"v": 1},
    ]
)


@st.composite
def near_normal_payloads(draw: st.DrawFn) -> bytes:
    """Traffic readings, a few with one field set to an edge value, missing or added."""
    items = draw(st.lists(traffic_readings, min_size=1, max_size=6))
    for item in items:
        if draw(st.booleans()):
            name = draw(st.sampled_from([*item, "extra"]))
            if draw(st.booleans()):
                item[name] = draw(EDGE_VALUES)
            else:
                item.pop(name, None)
    return orjson.dumps(items if len(items) > 1 or draw(st.booleans()) else items[0])


@settings(max_examples=examples(400), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_typed_decoder_agrees_with_the_per_reading_path(data: st.DataObject) -> None:
    """Oracle: with the msgspec fast path switched off, every payload (the fuzz
    generator's good, bad and mixed ones for every column type, and near-normal
    traffic batches) validates to the same readings, values and types, and the same
    rejections."""
    validator = library_validator()
    message = data.draw(
        messages(validator.streams) | near_normal_payloads().map(lambda p: Message(TOPIC, p))
    )
    fast = validator.validate(message.topic, message.payload, NOW)
    with patch("ingest.validate._typed_decoder", return_value=None):
        slow = validator.validate(message.topic, message.payload, NOW)
    assert _canonical(fast) == _canonical(slow)


json_values_no_nan = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


# ---- the clock window ------------------------------------------------------------------

MINUTE = 60_000
GOOD = {"station": 7, "lane": 1, "speed": 3.0, "length": 4.0, "source": "a", "seq": 1}


def test_a_clock_years_ahead_is_quarantined_with_how_far_and_the_limit(
    sources: list[StreamSchema],
) -> None:
    """One reading dated nine years ahead used to be accepted (the limit was ten years
    either way) and then made every later reading of its stream late. By default a
    timestamp may be five minutes ahead of ingest's clock."""
    default = Validator(sources)
    ahead = default.validate(TOPIC, orjson.dumps({**GOOD, "ts": NOW + 9 * 365 * DAY}), NOW)
    assert not ahead.readings
    assert ahead.rejections[0].reason == (
        "timestamp too far in the future: 3285 days ahead of ingest's clock; "
        "the limit for stream 'traffic' is 5 min"
    )
    just_in = default.validate(TOPIC, orjson.dumps({**GOOD, "ts": NOW + 5 * MINUTE}), NOW)
    assert just_in.readings and not just_in.rejections
    just_out = default.validate(TOPIC, orjson.dumps({**GOOD, "ts": NOW + 5 * MINUTE + 1}), NOW)
    assert just_out.rejections[0].reason.startswith("timestamp too far in the future: 5 min ")
    old = default.validate(TOPIC, orjson.dumps({**GOOD, "ts": NOW - 3000 * DAY}), NOW)
    assert old.readings, "the past stays generous: ten years by default"


def test_heartbeats_have_the_same_window(sources: list[StreamSchema]) -> None:
    default = Validator(sources)
    beat = {"source": "a", "ts": NOW + 9 * 365 * DAY}
    result = default.validate("lookout/traffic/7/heartbeat", orjson.dumps(beat), NOW)
    assert not result.heartbeats
    assert result.rejections[0].reason.startswith("timestamp too far in the future: 3285 days")
    soon = default.validate("lookout/traffic/7/heartbeat", orjson.dumps({**beat, "ts": NOW}), NOW)
    assert soon.heartbeats


def test_a_stream_may_have_its_own_window(sources: list[StreamSchema]) -> None:
    own = Validator(
        sources, stream_clocks={"traffic": ClockWindow(max_future_ms=HOUR, max_past_ms=DAY)}
    )
    half_hour = {**GOOD, "ts": NOW + 30 * MINUTE}
    assert own.validate(TOPIC, orjson.dumps(half_hour), NOW).readings
    too_old = own.validate(TOPIC, orjson.dumps({**GOOD, "ts": NOW - 2 * DAY}), NOW)
    assert too_old.rejections[0].reason == (
        "timestamp too far in the past: 2 days behind ingest's clock; "
        "the limit for stream 'traffic' is 1 days"
    )
    tag = {"tagid": "t", "tagtype": "item", "door": "1", "ts": NOW + 30 * MINUTE}
    other = own.validate(RFID_TOPIC, orjson.dumps({**tag, "source": "d", "seq": 1}), NOW)
    assert other.rejections[0].reason.endswith("the limit for stream 'tag_readings' is 5 min")


# ---- epochs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("epoch", "landed"),
    [
        ("1764000000000-3f9a", "1764000000000-3f9a"),
        (1764000000000, "1764000000000"),
        (123456789012345678901234567890, "123456789012345678901234567890"),
        ("", ""),
    ],
)
def test_an_epoch_is_landed_as_text(validator: Validator, epoch: object, landed: str) -> None:
    """A source's run id is text; an integer one keeps every digit, however long."""
    payload = f'{{"station": 7, "lane": 1, "speed": 3.0, "length": 4.0, "ts": {NOW}, '
    payload += f'"source": "a", "seq": 1, "epoch": {json.dumps(epoch)}}}'
    for body in (payload, f"[{payload}, {payload}]"):
        result = validator.validate(TOPIC, body.encode(), NOW)
        assert [r["epoch"] for r in result.readings] == [landed] * (2 if "[" in body else 1)


def test_a_reading_without_an_epoch_lands_with_the_empty_text(validator: Validator) -> None:
    result = validator.validate(TOPIC, orjson.dumps({**GOOD, "ts": NOW}), NOW)
    assert result.readings[0]["epoch"] == ""


@pytest.mark.parametrize(
    ("epoch", "reason"),
    [
        ("e" * 257, "field 'epoch' is 257 characters; the limit is 256"),
        ({"boot": 1}, "field 'epoch' is an object; expected a STRING value"),
        (None, "field 'epoch' is null"),
        (True, "field 'epoch' must be STRING, got True"),
    ],
)
def test_a_bad_epoch_is_rejected_by_name(validator: Validator, epoch: object, reason: str) -> None:
    result = validator.validate(TOPIC, orjson.dumps({**GOOD, "ts": NOW, "epoch": epoch}), NOW)
    assert not result.readings and result.rejections[0].reason == reason


def test_replay_inputs_need_no_epoch(sources: list[StreamSchema]) -> None:
    traffic = next(s for s in sources if s.name == "traffic")
    reading = {"station": 1, "lane": 1, "speed": 1.0, "length": 1.0, "ts": NOW}
    assert "epoch" not in normalize_reading(traffic, reading, require_identity=False)
    with_epoch = normalize_reading(traffic, {**reading, "epoch": 5}, require_identity=False)
    assert with_epoch["epoch"] == "5"


# ---- sizes -----------------------------------------------------------------------------


def test_text_fields_have_a_length_limit(sources: list[StreamSchema]) -> None:
    validator = Validator(sources, max_string_chars=10)
    tag = {"tagtype": "item", "door": "1", "ts": NOW, "source": "d", "seq": 1}
    rfid = "lookout/rfid/2/readings"
    fits = validator.validate(rfid, orjson.dumps({**tag, "tagid": "t" * 10}), NOW)
    assert fits.readings
    long = validator.validate(rfid, orjson.dumps({**tag, "tagid": "t" * 11}), NOW)
    assert long.rejections[0].reason == "field 'tagid' is 11 characters; the limit is 10"
    source = validator.validate(
        RFID_TOPIC, orjson.dumps({**tag, "tagid": "t", "source": "s" * 11}), NOW
    )
    assert source.rejections[0].reason == "field 'source' is 11 characters; the limit is 10"
    beat = {"source": "s" * 11, "ts": NOW}
    heartbeat = validator.validate("lookout/rfid/1/heartbeat", orjson.dumps(beat), NOW)
    assert heartbeat.rejections[0].reason == "field 'source' is 11 characters; the limit is 10"
    topic = "lookout/rfid/" + "d" * 2000 + "/readings"
    long_topic = validator.validate(topic, orjson.dumps({**tag, "tagid": "t"}), NOW)
    assert long_topic.rejections[0].reason == "topic is 2022 characters; the limit is 1024"


def test_a_reason_quotes_a_bounded_piece_of_the_value(validator: Validator) -> None:
    """A reason is stored with every rejection: it never repeats a huge value whole."""
    for bad in ("n" * 100_000, 10**4000, "2026-" + "1" * 100_000):
        for field in ("station", "ts"):
            body = json.dumps({**GOOD, "ts": NOW, field: bad}).encode()
            (rejection,) = validator.validate(TOPIC, body, NOW).rejections
            assert len(rejection.reason) < 200, rejection.reason


# ---- decoding --------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [300, 5000])
def test_an_item_nested_too_deep_is_rejected_alone(validator: Validator, depth: int) -> None:
    """Before: the 300-deep item made the whole batch one rejection (writing the item
    back as JSON raised), and a deeper one made the whole batch "not JSON"."""
    deep = b"[" * depth + b"]" * depth
    good = [orjson.dumps({**GOOD, "ts": NOW, "seq": seq}) for seq in (1, 2)]
    for element in (deep, b'{"station": ' + deep + b"}"):
        payload = b"[" + good[0] + b", " + element + b" ,\n" + good[1] + b"]"
        result = validator.validate(TOPIC, payload, NOW)
        assert [r["seq"] for r in result.readings] == [1, 2]
        (rejection,) = result.rejections
        assert rejection.reason.startswith("reading #1 of the batch: ")
        assert rejection.payload == element


def test_one_unreadable_element_does_not_take_its_batch(validator: Validator) -> None:
    good = [orjson.dumps({**GOOD, "ts": NOW, "seq": seq}) for seq in (1, 2)]
    for element, reason in [
        (b'{"station": NaN}', "not JSON: invalid character"),
        (b'{"source": "\xff"}', "not UTF-8 (byte 12)"),
        (b"", "not JSON: input data was truncated"),
    ]:
        payload = b"[" + good[0] + b"," + element + b"," + good[1] + b"]"
        result = validator.validate(TOPIC, payload, NOW)
        assert [r["seq"] for r in result.readings] == [1, 2]
        (rejection,) = result.rejections
        assert rejection.reason.startswith(f"reading #1 of the batch: {reason}")
        assert rejection.payload == element


def test_a_big_integer_for_a_text_field_keeps_every_digit(validator: Validator) -> None:
    """orjson read a 30-digit id as a float: the source became '1.2345678901234568e+29'."""
    big = 123456789012345678901234567890
    body = json.dumps([{**GOOD, "ts": NOW, "source": big}, {**GOOD, "ts": NOW}]).encode()
    result = validator.validate(TOPIC, body, NOW)
    assert [r["source"] for r in result.readings] == [str(big), "a"]
    huge = validator.validate(
        TOPIC, json.dumps({**GOOD, "ts": NOW, "speed": 10**400}).encode(), NOW
    )
    assert huge.rejections[0].reason == "field 'speed' is out of the DOUBLE range"


@given(st.lists(json_values_no_nan, max_size=6), st.sampled_from([None, 1, "\t"]))
def test_split_array_returns_each_element_as_written(values: list, indent: object) -> None:
    text = json.dumps(values, indent=indent).encode()
    elements = split_array(text)
    assert elements is not None
    assert [json.loads(e) for e in elements if e] == values
    assert split_array(text[:-1]) is None
