"""Time formats and episode specs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulators.common import EpisodeSpec, format_ts, parse_episodes, parse_start, parse_ts
from simulators.disorder import DisorderModel


@given(st.integers(min_value=0, max_value=4_102_444_800_000))
def test_ts_round_trip(ms: int) -> None:
    iso = format_ts(ms, "iso")
    assert isinstance(iso, str) and iso.endswith("+00:00")
    assert parse_ts(iso) == ms
    assert format_ts(ms, "ms") == ms == parse_ts(ms)


def test_parse_start() -> None:
    assert parse_start(None, 5) == 5
    assert parse_start("1767225600000", 0) == 1_767_225_600_000
    assert parse_start("2026-01-01T00:00:00", 0) == 1_767_225_600_000
    assert parse_start("2026-01-01T01:00:00+01:00", 0) == 1_767_225_600_000


def test_parse_episodes() -> None:
    assert parse_episodes("3,7@600+900,5:2@1.5", 300) == [
        EpisodeSpec(3, None, 0, 300_000),
        EpisodeSpec(7, None, 600_000, 900_000),
        EpisodeSpec(5, 2, 1500, 300_000),
    ]
    assert parse_episodes(None, 0) == []
    forever = parse_episodes("1@10", 0)[0]
    assert not forever.covers(9_999) and forever.covers(10_000) and forever.covers(10**12)
    for bad in ("x", "3@", "3+5", "3@1+"):
        with pytest.raises(ValueError):
            parse_episodes(bad, 0)


@pytest.mark.parametrize("text", ["bounded", "bounded:0", "blocks:-1", "none:1", "random"])
def test_bad_disorder_models(text: str) -> None:
    with pytest.raises(ValueError):
        DisorderModel.parse(text)
