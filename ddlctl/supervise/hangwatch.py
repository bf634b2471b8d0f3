"""Hang detection from step counts alone: no training task recorded a step for too long.

Fed with each task's number of step records (the host agents report them); armed when every task
is up (or by the first step), re-armed after every restart. Under ps this is the only way a hung worker is
ever noticed (TensorFlow reports nothing); under MWMS TensorFlow's heartbeat usually fires first.
"""

from __future__ import annotations

from collections.abc import Iterable


class HangWatch:
    """Tracks when each task last made progress; ``hung(now)`` once nobody has for ``timeout_s``."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.counts: dict[str, int] = {}
        self.last_progress: dict[str, float] = {}
        self.armed_at: float | None = None

    def update(self, task: str, count: int, now: float) -> None:
        """``task`` has written ``count`` step records so far."""
        if count > self.counts.get(task, 0):
            self.last_progress[task] = now
            if self.armed_at is None:
                self.armed_at = now
        self.counts[task] = count

    def arm(self, now: float) -> None:
        """Start the clock now if no step has started it (every task is up: steps should follow)."""
        if self.armed_at is None:
            self.armed_at = now

    def rearm(self, now: float) -> None:
        """After a restart or a handled hang: the clock starts again (if it had started)."""
        if self.armed_at is not None:
            self.armed_at = now
            for task in self.last_progress:
                self.last_progress[task] = max(self.last_progress[task], now)

    def latest(self) -> float | None:
        times = list(self.last_progress.values())
        if self.armed_at is not None:
            times.append(self.armed_at)
        return max(times) if times else None

    def hung(self, now: float) -> bool:
        latest = self.latest()
        return bool(self.timeout_s) and latest is not None and now - latest > self.timeout_s

    def stalled_first(self, tasks: Iterable[str]) -> list[str]:
        """``tasks`` ordered by when they last stepped (earliest first; never: first of all)."""
        return sorted(tasks, key=lambda t: self.last_progress.get(t, float("-inf")))
