"""Hang detection from progress alone: each training task is watched on its own.

A task's progress is its step records (the host agents count them); under ps a worker's is the
closures the chief credits to it (its step records say which worker ran each block). A task that
made progress is hung once it makes none for its threshold, whatever its peers do; a job in which
no task has made any progress since the cluster came up is hung after the startup threshold.

Thresholds (:meth:`HangWatch.threshold`):

* before a task's first step (after a start or a restart) the startup timeout applies (or
  ``--hang-timeout`` if longer): importing TensorFlow and tracing take their time under load;
* ``--hang-timeout S`` fixes every threshold after that at S seconds (0: no watch at all);
* by default a task is hung after ``max(10 x p99 of its intervals between progress, 60 s)`` once
  it has :data:`WARM` such intervals; before that, after ``max(10 x its longest interval, 60 s)``
  (a task that stepped a few times and stopped is named within the floor too).

Progress also counts the lines of the task's ``phases.jsonl``: a phase begun or ended
(``ddlctl.phase``) and beats (:func:`ddlctl.task.steps.beat`: a batch of a Keras evaluation, a ps
closure done), so a long evaluation that goes on is no hang; a task inside a phase its program
declared (begun, not ended: a checkpoint save) gets :data:`OPEN_PHASE_S` at least, unless its
process is found stopped or blocked in the kernel once past its usual threshold
(:meth:`HangWatch.held_in_phase`; a save to a dead network filesystem).

A task past its declared last step is done stepping: what it does then (saving, evaluating) is
no hang. It is only *lingering* (:meth:`HangWatch.lingering`) once its threshold has passed since
its last step without it exiting, and again after each further threshold: then its stacks say
whether its program has ended and it is stuck in its exit.

The intervals are measured where the supervisor sees progress (the agents report about once a
second), so they include checkpoints, evaluations and a slow host, which is what a threshold must
allow for.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

#: A task in a phase its program declared (``ddlctl.phase("checkpoint")``, begun and not ended) is
#: hung only after this long without progress (or its usual threshold, if longer): a checkpoint
#: save or an evaluation may take minutes without a step.
OPEN_PHASE_S = 1800.0
FLOOR_S = 60.0
#: The rule before a task's first step, with the option that sets it (a program that prepares its
#: data for minutes before its first step needs a longer one).
STARTUP_RULE = "before the first step: the startup timeout (--startup-timeout)"
FACTOR = 10.0
WARM = 5
KEEP = 256


def p99(values: Iterable[float]) -> float:
    """The 99th percentile (nearest rank) of ``values`` (not empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


@dataclass(frozen=True)
class Overdue:
    """What the watch found: ``tasks`` past their thresholds (empty: no task ever made progress)."""

    tasks: tuple[str, ...]
    idle_s: float  # how long the first of them (or the job) has made no progress
    threshold_s: float
    rule: str  # which threshold applied, for people

    def describe(self) -> str:
        who = ", ".join(self.tasks) if self.tasks else "no task"
        return f"{who}: no progress for {self.idle_s:.0f}s (threshold {self.threshold_s:.0f}s: {self.rule})"


class HangWatch:
    """Tracks when each task last made progress and how long its usual intervals are."""

    def __init__(self, timeout_s: float | None, startup_s: float = 180.0) -> None:
        self.timeout_s = timeout_s  # None: adaptive; 0: off
        self.startup_s = startup_s or FLOOR_S
        self.counts: dict[str, int] = {}
        self.last_progress: dict[str, float] = {}  # the last progress, or the (re)start of the watch
        self.stepped: set[str] = set()  # progressed since the watch last (re)started on it
        self.gaps: dict[str, deque[float]] = {}
        self.finished: set[str] = set()  # done stepping (its declared total reached)
        self.looked_at: dict[str, float] = {}  # a finished task's stacks were last read then
        self.armed_at: float | None = None
        self.phases: dict[str, str] = {}  # task -> the phase its program said it began and has not ended

    def in_phase(self, task: str, phase: str | None) -> None:
        """``task``'s program is in ``phase`` now (None: in none)."""
        if phase:
            self.phases[task] = phase
        else:
            self.phases.pop(task, None)

    @property
    def enabled(self) -> bool:
        return self.timeout_s is None or self.timeout_s > 0

    def update(self, task: str, count: int, now: float) -> None:
        """``task`` has made ``count`` units of progress so far."""
        if count > self.counts.get(task, 0):
            if task in self.stepped:
                self.gaps.setdefault(task, deque(maxlen=KEEP)).append(now - self.last_progress[task])
            self.stepped.add(task)
            self.last_progress[task] = now
            if self.armed_at is None:
                self.armed_at = now
        self.counts[task] = max(count, self.counts.get(task, 0))

    def finish(self, task: str) -> None:
        """``task`` reached its declared last step: what it does now (saving, evaluating) is not a hang."""
        self.finished.add(task)

    def lingering(self, now: float, watched: Iterable[str]) -> list[str]:
        """The finished tasks of ``watched`` (still running) whose threshold has passed since their
        last step, or since they were last looked at (:meth:`looked`)."""
        if not self.enabled:
            return []
        return [t for t in watched if t in self.finished and t in self.last_progress
                and now - max(self.last_progress[t], self.looked_at.get(t, float("-inf"))) > self.threshold(t)[0]]

    def looked(self, task: str, now: float) -> None:
        """``task``'s stacks were read now and it is still at work: look again after its threshold."""
        self.looked_at[task] = now

    def arm(self, now: float) -> None:
        """Start the clock now if no progress has started it (every task is up: steps should follow)."""
        if self.armed_at is None:
            self.armed_at = now

    def rearm(self, now: float, restarted: Iterable[str] = ()) -> None:
        """After a restart or a handled hang: every clock starts again (if it had started); the
        ``restarted`` tasks are back before their first step (the startup threshold applies)."""
        if self.armed_at is None:
            return
        self.armed_at = now
        for task in self.last_progress:
            self.last_progress[task] = max(self.last_progress[task], now)
        for task in restarted:
            self.stepped.discard(task)
            self.finished.discard(task)
            self.looked_at.pop(task, None)

    def held_in_phase(self, now: float, watched: Iterable[str]) -> list[tuple[str, str, float, float]]:
        """(task, phase, seconds without progress, its threshold outside the phase) of the tasks of
        ``watched`` in a declared phase for longer than they would be allowed outside it: a phase
        gets :data:`OPEN_PHASE_S`, but one whose process is stopped or blocked is worth a look now."""
        if not self.enabled:
            return []
        held = []
        for task in watched:
            phase = self.phases.get(task)
            if phase and task in self.last_progress and task not in self.finished:
                limit = self._threshold(task)[0]
                if limit < OPEN_PHASE_S and now - self.last_progress[task] > limit:
                    held.append((task, phase, now - self.last_progress[task], limit))
        return held

    def threshold(self, task: str | None) -> tuple[float, str]:
        """(seconds, which rule) for ``task`` (None: the job before any progress); a task in a
        declared phase gets :data:`OPEN_PHASE_S` at least."""
        limit, rule = self._threshold(task)
        phase = self.phases.get(task) if task is not None else None
        if phase and limit < OPEN_PHASE_S:
            return OPEN_PHASE_S, f"in its {phase} phase: {OPEN_PHASE_S / 60:g} min allowed"
        return limit, rule

    def _threshold(self, task: str | None) -> tuple[float, str]:
        if task is None or task not in self.stepped:
            return max(self.startup_s, self.timeout_s or 0.0), STARTUP_RULE
        if self.timeout_s:
            return self.timeout_s, f"--hang-timeout {self.timeout_s:g}s"
        gaps = self.gaps.get(task, ())
        if len(gaps) < WARM:
            longest = max(gaps, default=0.0)
            if FACTOR * longest > FLOOR_S:
                return FACTOR * longest, f"{FACTOR:g} x its longest step interval yet, {longest:.1f}s (not warm)"
            return FLOOR_S, f"the {FLOOR_S:g}s floor (not warm yet: {len(gaps)} of {WARM} step intervals)"
        typical = p99(gaps)
        if FACTOR * typical > FLOOR_S:
            return FACTOR * typical, f"{FACTOR:g} x its p99 step interval of {typical:.1f}s"
        return FLOOR_S, f"the {FLOOR_S:g}s floor (10 x its p99 step interval of {typical:.1f}s is less)"

    def overdue(self, now: float, watched: Iterable[str]) -> Overdue | None:
        """The tasks of ``watched`` (running training tasks) past their thresholds, if any."""
        if not self.enabled or self.armed_at is None:
            return None
        watched = list(watched)
        late: list[tuple[float, str, float, str]] = []
        for task in watched:
            if task not in self.last_progress or task in self.finished:
                continue
            limit, rule = self.threshold(task)
            idle = now - self.last_progress[task]
            if idle > limit:
                late.append((idle, task, limit, rule))
        if late:
            late.sort(reverse=True)
            idle, _, limit, rule = late[0]
            return Overdue(tuple(t for _, t, _, _ in late), idle, limit, rule)
        if any(t in self.last_progress for t in watched):
            return None
        limit, rule = self.threshold(None)
        idle = now - self.armed_at
        return Overdue((), idle, limit, rule) if idle > limit else None
