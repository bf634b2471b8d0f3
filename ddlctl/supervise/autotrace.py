"""``--trace auto`` (``profile``'s default): while the job runs, when a task's steps stand out,
ask it for a short TensorFlow Profiler capture, and a typical peer for one beside it
(:class:`ddlctl.task.trace.AutoCapture` takes the request, through the host agent).

What stands out, from each task's *pace* (its host agent's step frames: the median seconds a
step over its last 16 records, and the median seconds until its gradients were ready, ``sync``,
where its records say; :meth:`ddlctl.host.stepfollow.StepFile.pace`):

* a *straggler*: a task whose steps take at least :data:`STRAGGLER_RATIO` x a typical peer's
  (compared by sync time where every task records one: in lockstep every step takes the same
  wall time, and the straggler is who is ready last; under ps, the workers' steps as the chief
  records them, each by the worker that ran it);
* a *regression*: a task whose steps take more than :data:`REGRESSION_RATIO` x its own pace at the
  start of the run (the fastest it kept in its first :data:`BASELINE_S` once warmed up), seen at
  two looks in a row;
* a task *near a hang*: no progress for :data:`NEAR_HANG` of its hang threshold (and
  :data:`NEAR_MIN_S` at least): captured at once for :data:`NOW_SECONDS` (it may record no step
  again; less when its threshold comes sooner: the capture ends before the hang is called), beside
  the peer that progressed last; the report's hang section shows it if it hung.

A task and what it is compared with need :data:`WARMUP` timed records first (compilation and the
first batches are no pace). At most one capture every ``every_s`` seconds (default
:data:`EVERY_S`), and a task is not captured twice for one reason: a
persistent straggler costs one capture. Each capture is said once, with why, and kept in
``outcome.json`` (``auto_traces``) for the report.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ddlctl.supervise.hangs.watch import HangWatch
from ddlctl.supervise.job import Job

#: A task is a straggler when its steps take this many times a typical peer's.
STRAGGLER_RATIO = 1.3
#: ... and at least this much longer (seconds a step): tiny steps jitter by large ratios.
MIN_GAP_S = 0.005
#: A task has regressed when its steps take more than this many times its early pace.
REGRESSION_RATIO = 1.5
#: Timed records before a pace counts, and the first seconds whose fastest pace is the baseline.
WARMUP = 12
BASELINE_S = 120.0
#: Steps an auto capture covers, and the most seconds it runs (it stops at a step boundary past it).
CAPTURE_STEPS = 10
CAPTURE_SECONDS = 30.0
#: A task near a hang: this share of its hang threshold without progress, and this long at least;
#: captured for this long.
NEAR_HANG = 0.5
NEAR_MIN_S = 3.0
NOW_SECONDS = 5.0
#: The least seconds between two auto captures.
EVERY_S = 600.0
#: How far ahead of the tasks' progress a capture is asked to start (seconds of their steps): the
#: request reaches every task first (its host agent writes it, the task looks twice a second), so
#: tasks that run together capture the same steps.
LEAD_S = 2.0


@dataclass(frozen=True)
class Pace:
    """A task's recent steps: median seconds a step, median sync seconds (None: not recorded), records timed."""

    step_s: float
    sync_s: float | None
    seen: int


@dataclass(frozen=True)
class Finding:
    """Something that stands out: ``task`` against ``peer`` (None: no peer to capture beside it)."""

    reason: str  # "straggler" | "regression"
    task: str
    peer: str | None
    why: str
    ratio: float = 0.0
    left_s: float = 0.0  # (near a hang: the seconds before it is called hung)


def straggler(paces: Mapping[str, Pace]) -> Finding | None:
    """The slowest task of a role (``worker``: its peers do the same work; a pipeline's stages do
    not) when its steps take :data:`STRAGGLER_RATIO` x a typical peer's (the median of the others),
    by sync time when every task records one; None otherwise."""
    roles: dict[str, dict[str, Pace]] = {}
    for name, pace in paces.items():
        if pace.seen >= WARMUP:
            roles.setdefault(name.partition(":")[0], {})[name] = pace
    found = [f for f in map(_straggler, roles.values()) if f is not None]
    return max(found, key=lambda f: f.ratio) if found else None


def _straggler(ready: Mapping[str, Pace]) -> Finding | None:
    if len(ready) < 2:
        return None
    by_sync = all(p.sync_s is not None for p in ready.values())

    def value(name: str) -> float:
        pace = ready[name]
        return float(pace.sync_s if by_sync and pace.sync_s is not None else pace.step_s)

    ranked = sorted(ready, key=value)
    slow, others = ranked[-1], ranked[:-1]
    typical = others[(len(others) - 1) // 2]
    if value(slow) < STRAGGLER_RATIO * value(typical) or value(slow) - value(typical) < MIN_GAP_S:
        return None
    what = "has its gradients ready" if by_sync else "takes a step"
    ratio = value(slow) / max(value(typical), 1e-9)
    return Finding("straggler", slow, typical,
                   f"{slow} is a straggler: it {what} in {_ms(value(slow))} against {_ms(value(typical))} on "
                   f"{typical} ({ratio:.1f}x, its last steps' median)", ratio)


@dataclass
class Baselines:
    """Each task's early pace: the fastest median it showed in its first :data:`BASELINE_S` after
    warming up; and the tasks slower than :data:`REGRESSION_RATIO` x it at the last look."""

    since: dict[str, float] = field(default_factory=dict)  # task -> when its pace first counted
    fastest: dict[str, float] = field(default_factory=dict)
    slow_looks: dict[str, int] = field(default_factory=dict)
    last_seen: dict[str, int] = field(default_factory=dict)

    def regression(self, paces: Mapping[str, Pace], now: float) -> Finding | None:
        """The task that regressed most (seen slow at two looks in a row, each on new records), with
        the typical peer to capture beside it; None if none."""
        worst: tuple[float, str] | None = None
        for name, pace in paces.items():
            if pace.seen < WARMUP or pace.seen == self.last_seen.get(name):
                continue
            self.last_seen[name] = pace.seen
            since = self.since.setdefault(name, now)
            if now - since <= BASELINE_S or name not in self.fastest:
                self.fastest[name] = min(self.fastest.get(name, math.inf), pace.step_s)
                continue
            ratio = pace.step_s / max(self.fastest[name], 1e-9)
            slow = ratio > REGRESSION_RATIO and pace.step_s - self.fastest[name] >= MIN_GAP_S
            self.slow_looks[name] = self.slow_looks.get(name, 0) + 1 if slow else 0
            if self.slow_looks[name] >= 2 and (worst is None or ratio > worst[0]):
                worst = (ratio, name)
        if worst is None:
            return None
        ratio, name = worst
        others = sorted((p.step_s, n) for n, p in paces.items() if n != name and p.seen >= WARMUP)
        peer = others[(len(others) - 1) // 2][1] if others else None
        return Finding("regression", name, peer,
                       f"{name}'s steps slowed down: {_ms(paces[name].step_s)} a step against "
                       f"{_ms(self.fastest[name])} early in the run ({ratio:.1f}x)", ratio)


def near_hang(watch: HangWatch, now: float, tasks: Sequence[str]) -> Finding | None:
    """The task of ``tasks`` longest without progress past :data:`NEAR_HANG` of its hang threshold
    (not past it: then it is a hang), beside the one that progressed last; None if none."""
    near = []
    for task in tasks:
        if task not in watch.stepped or task in watch.finished or task not in watch.last_progress:
            continue
        idle, (limit, _) = now - watch.last_progress[task], watch.threshold(task)
        if max(NEAR_MIN_S, NEAR_HANG * limit) <= idle < limit:
            near.append((idle / limit, idle, limit, task))
    if not near:
        return None
    share, idle, limit, task = max(near)
    others = sorted((now - watch.last_progress[t], t) for t in tasks if t != task and t in watch.last_progress)
    return Finding("near-hang", task, others[0][1] if others else None,
                   f"{task} has made no progress for {idle:.0f}s (it is called hung at {limit:.0f}s)", share,
                   limit - idle)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.1f} ms"


class AutoTrace:
    """The live side of ``--trace auto``: fed the tasks' paces each tick, asks for captures.

    ``paces``: recording task -> who ran its steps -> pace (a ps chief records its workers'
    steps: the capture of a worker is then asked of the chief, which traces every server).
    ``ask(task, request)`` sends a request; ``say`` tells the user."""

    def __init__(self, ask: Callable[[str, dict], None], say: Callable[[str], None],
                 every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic,
                 watch: HangWatch | None = None) -> None:
        self.ask, self.say, self.every_s, self.clock, self.watch = ask, say, every_s, clock, watch
        self.baselines = Baselines()
        self.last_at: float | None = None
        self.done: set[tuple[str, str]] = set()  # (reason, task) captured
        self.events: list[dict] = []  # outcome.json's auto_traces
        self.next_id = 1
        self.looked = float("-inf")
        self.off = False  # (a profiler crash turned it off)

    @classmethod
    def for_job(cls, job: Job, watch: HangWatch) -> AutoTrace | None:
        """The job's (None: ``--trace auto`` was not asked); ``watch``: its hang watch."""
        if not job.plan.request.trace_auto:
            return None

        def ask(name: str, request: dict) -> None:
            task = job.tasks.get(name)
            session = job.sessions.get(task.host) if task is not None else None
            if session is not None:
                session.request_trace(name, request)

        return cls(ask, job.notify, clock=job.clock, watch=watch)

    def look(self, now: float, job: Job) -> None:
        """A look at the running tasks' paces, at most once a second (they change once a second)."""
        if now - self.looked < 1.0 or self.off:
            return
        self.looked = now
        if job.untraced:  # TensorFlow's profiler crashed a task it captured: never again in this job
            self.off = True
            self.say("trace auto: off for the rest of the job (TensorFlow's profiler crashed a task it captured)")
            return
        sessions = job.sessions.values()
        alive = [name for name, task in job.tasks.items() if task.alive and not task.is_agent]
        self.tick({name: runs for session in sessions for name, runs in session.paces().items() if name in alive},
                  {name: figures[0] for session in sessions for name, figures in session.progress().items()},
                  near_hang(self.watch, now, alive) if self.watch is not None and self.watch.enabled else None)

    def tick(self, paces: Mapping[str, Mapping[str, tuple[float, float | None, int]]],
             reached: Mapping[str, int] | None = None, near: Finding | None = None) -> Finding | None:
        """Look at the paces (``reached``: each task's highest step; ``near``: a task near a hang);
        the finding acted on, if any."""
        now = self.clock()
        recorder = {ran_by: task for task, runs in paces.items() for ran_by in runs}
        flat = {ran_by: Pace(*pace) for runs in paces.values() for ran_by, pace in runs.items()}
        found = [f for f in (near, straggler(flat), self.baselines.regression(flat, now)) if f is not None]
        if self.last_at is not None and now - self.last_at < self.every_s:
            return None
        for finding in found:
            if (finding.reason, finding.task) in self.done:
                continue
            self.done.add((finding.reason, finding.task))
            self.last_at = now
            session = f"auto-{self.next_id}"
            captured = [finding.task, *([finding.peer] if finding.peer else [])]
            asked = sorted({recorder.get(name, name) for name in captured})
            request = {"id": self.next_id, "steps": CAPTURE_STEPS, "seconds": CAPTURE_SECONDS, "why": finding.why}
            known = [(reached or {}).get(task) for task in asked]
            if finding.reason == "near-hang":  # (it may record no step again: now, for some seconds)
                request.update(now=True, seconds=round(min(NOW_SECONDS, max(0.5, 0.6 * finding.left_s)), 1))
                del request["steps"]
            elif asked and all(isinstance(n, int) for n in known):  # the same steps in every task asked
                fastest = min(flat[name].step_s for name in captured if name in flat)
                request["from"] = max(known) + min(10_000, math.ceil(LEAD_S / max(fastest, 1e-4))) + 1  # type: ignore[type-var]
            self.next_id += 1
            for task in asked:
                self.ask(task, request)
            self.events.append({"time": time.time(), "session": session, "reason": finding.reason,
                                "task": finding.task, "peer": finding.peer, "asked": asked, "why": finding.why})
            beside = f" and {finding.peer}" if finding.peer else ""
            via = f" (through {', '.join(asked)})" if asked != sorted(captured) else ""
            span = f"{request['seconds']:g} s" if finding.reason == "near-hang" else f"{CAPTURE_STEPS} steps"
            self.say(f"trace auto: {finding.why}: capturing {span} of {finding.task}{beside}{via}")
            return finding
        return None
