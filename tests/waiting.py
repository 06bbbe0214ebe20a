"""Waiting in tests for something that happens in another thread or process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol


class Failing(Protocol):
    """Anything that can say it died (e.g. the engine's streaming queries)."""

    def failed(self) -> str | None: ...


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    every: float = 0.1,
    engine: Failing | None = None,
) -> Any:
    """Poll until `predicate()` is truthy and return its value; fail the test with `what`
    after `timeout` seconds, or at once with the error of `engine` if it died."""
    deadline = time.monotonic() + timeout
    while True:
        if engine is not None and (error := engine.failed()):
            raise AssertionError(f"{error} (while waiting for {what})")
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)
