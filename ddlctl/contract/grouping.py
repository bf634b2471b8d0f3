"""Diagnosis lines that say the same of many hosts or tasks, as one line (pure)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_NAME = re.compile(r"^(.*):(\d+)$")


def figure_range(values: Sequence[float], unit: str = "%") -> str:
    """``[90.2, 97.4, 93]`` -> ``90-97%``; one value (or all equal when rounded) -> ``90%``."""
    low, high = round(min(values)), round(max(values))
    return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"


def named(things: Sequence[str], noun: str) -> str:
    """``["a"]`` -> ``a``; ``["a", "b"]`` -> ``2 hosts (a, b)`` (``noun``: "hosts", "tasks"...)."""
    return things[0] if len(things) == 1 else f"{len(things)} {noun} ({', '.join(things)})"


def task_range(names: Iterable[str]) -> str:
    """``worker:0, worker:1, worker:2, worker:5, chief:0`` -> ``chief:0,worker:0-2,5``: roles in
    name order, indices as runs of consecutive numbers."""
    by_role: dict[str, set[int]] = {}
    others: list[str] = []
    for name in names:
        match = _NAME.match(name)
        if match:
            by_role.setdefault(match.group(1), set()).add(int(match.group(2)))
        else:
            others.append(name)
    parts = []
    for role in sorted(by_role):
        runs: list[str] = []
        indices = sorted(by_role[role])
        start = previous = indices[0]
        for index in [*indices[1:], None]:
            if index is not None and index == previous + 1:
                previous = index
                continue
            runs.append(str(start) if start == previous else f"{start}-{previous}")
            if index is not None:
                start = previous = index
        parts.append(f"{role}:{','.join(runs)}")
    return ",".join([*parts, *sorted(set(others))])


def hosts_label(hosts: Iterable[str]) -> str:
    """The host part of a merged line's prefix: the host when all share one, else ``N hosts``."""
    distinct = sorted(set(hosts))
    return distinct[0] if len(distinct) == 1 else f"{len(distinct)} hosts"
