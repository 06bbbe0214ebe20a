"""How many examples a property test draws: its full count under Hypothesis's default
(and `ci`) profile, proportionally fewer under the fast lane's `dev` profile
(`tests/conftest.py`), so one knob scales every test's own count."""

from __future__ import annotations

from hypothesis import settings

DEFAULT_EXAMPLES = 100  # max_examples of Hypothesis's default and ci profiles


def examples(full: int) -> int:
    """``full`` examples, or the active profile's share of them (at least 10)."""
    return max(min(full, 10), full * settings().max_examples // DEFAULT_EXAMPLES)
