"""The wakeup schedule against a brute-force model: a dict of each key's wakeup, the
due keys found by scanning it and ordered by (time, text)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.core.wakeups import WakeupSchedule

keys = st.integers(0, 30)
times = st.one_of(st.none(), st.integers(0, 50))
steps = st.lists(
    st.one_of(
        st.tuples(st.just("set"), keys, times),
        st.tuples(st.just("discard"), keys, st.none()),
        st.tuples(st.just("due"), st.none(), st.integers(0, 50)),
        st.tuples(st.just("load"), st.lists(st.tuples(keys, times), max_size=8), st.none()),
    ),
    max_size=200,
)


def text(key: int) -> str:
    return f"k{key}"  # "k10" sorts before "k9": the text orders ties, not the key


@given(steps)
def test_the_schedule_wakes_the_keys_a_model_does(ops: list[tuple]) -> None:
    schedule: WakeupSchedule[int] = WakeupSchedule(text)
    model: dict[int, int] = {}
    for op, arg, value in ops:
        if op == "set":
            schedule.set(arg, value)
            if value is None:
                model.pop(arg, None)
            else:
                model[arg] = value
        elif op == "discard":
            schedule.discard(arg)
            model.pop(arg, None)
        elif op == "load":
            schedule.load([(k, text(k), w) for k, w in arg])
            model.update({k: w for k, w in arg if w is not None})
        else:
            due = sorted((w, text(k)) for k, w in model.items() if w <= value)
            assert [(model[k], text(k)) for k in schedule.due(value)] == due
            model = {k: w for k, w in model.items() if w > value}
        assert len(schedule) == len(model)
        assert all(schedule.get(k) == w for k, w in model.items())


def test_stale_entries_do_not_pile_up() -> None:
    """A key rescheduled at every reading keeps one live entry, and the heap stays
    within a quarter above the live keys (plus a little)."""
    schedule: WakeupSchedule[int] = WakeupSchedule(text)
    for reading in range(100_000):
        schedule.set(reading % 1000, 1_000_000 + reading)
    assert len(schedule) == 1000
    assert len(schedule._heap) <= 1000 + 250 + 64
    assert schedule.due(2_000_000) == list(range(1000))
