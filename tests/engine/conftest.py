"""Fixtures of the engine's tests."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Thaw the test process after a test: the engine's workers freeze what a batch
    leaves alive (`engine.python_gc`), which a test process should not keep."""
    yield
    gc.unfreeze()
    gc.collect()
