"""Percentiles and means as the report states them (pure)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """``p``-th percentile (0-100) of already sorted values, linear interpolation."""
    n = len(sorted_values)
    if n == 0:
        return None
    rank = (n - 1) * p / 100.0
    low = math.floor(rank)
    high = min(low + 1, n - 1)
    return float(sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low))


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean (None: no values); a numpy array's own, in C."""
    if not len(values):
        return None
    return float(values.mean()) if hasattr(values, "mean") else sum(values) / len(values)


def median_of(values: Iterable[float]) -> float | None:
    return percentile(sorted(values), 50)
