"""The wakeup schedule against a brute-force model: a dict of each key's wakeup, the
due keys found by scanning it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.core.wakeups import WakeupSchedule

keys = st.integers(0, 30)
times = st.one_of(st.none(), st.integers(-5, 50))
steps = st.lists(
    st.one_of(
        st.tuples(st.just("set"), keys, times),
        st.tuples(st.just("discard"), keys, st.none()),
        st.tuples(st.just("due"), st.none(), st.integers(-5, 50)),
        st.tuples(st.just("load"), st.lists(st.tuples(keys, times), max_size=8), st.none()),
    ),
    max_size=200,
)


@given(steps, st.sampled_from([0, 2, 10]))
def test_the_schedule_wakes_the_keys_a_model_does(ops: list[tuple], bits: int) -> None:
    """Buckets of 1, 4 and 1,024 time units: keys share them, some due in part."""
    schedule: WakeupSchedule[int] = WakeupSchedule(bits)
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
            schedule.load(arg)
            model.update({k: w for k, w in arg if w is not None})
        else:
            due = schedule.due(value)
            assert len(due) == len(set(due))
            assert set(due) == {k for k, w in model.items() if w <= value}
            model = {k: w for k, w in model.items() if w > value}
        assert len(schedule) == len(model)
        assert all(schedule.get(k) == w for k, w in model.items())


def test_stale_places_do_not_pile_up() -> None:
    """A key rescheduled at every reading keeps one live place, and the buckets hold
    within a quarter more places than live keys (plus a little)."""
    schedule: WakeupSchedule[int] = WakeupSchedule()
    for reading in range(100_000):
        schedule.set(reading % 1000, 1_000_000 + reading)
    assert len(schedule) == 1000
    assert schedule._places <= 1000 + 250 + 64
    assert sum(map(len, schedule._buckets.values())) == schedule._places
    assert sorted(schedule.due(2_000_000)) == list(range(1000))
