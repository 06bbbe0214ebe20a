"""Integer results of rule expressions: BIGINT's range, shared by the row and columnar
forms."""

from __future__ import annotations

from typing import Any

BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1


def bigint_or_null(value: Any) -> Any:
    """An integer result beyond BIGINT's 64 bits is NULL, as division by zero is: a
    rule's arithmetic never crashes the job, nor wraps around to a wrong number."""
    if isinstance(value, int) and not BIGINT_MIN <= value <= BIGINT_MAX:
        return None
    return value
