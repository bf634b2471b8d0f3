"""What faults cost: restarts with their downtime and lost steps, goodput, and the report's lines for
the job's other events (pure functions).

Inputs are the run directory's own records: ``outcome.json``'s ``restarts`` (fault time, task,
cause, when the replacement was started and, for servers, listening again) and the step files.
A step record is *redone* when a later record of the same task has the same step number (the
program resumed from a checkpoint taken before it): those are the steps a fault cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ddlctl.contract.faults import Action
from ddlctl.contract.hostclock import CLOCK_SAID_S, SYNCHRONISE, how_far
from ddlctl.supervise.hangs.preparing import Work
from ddlctl.supervise.join_watch import alone


@dataclass(frozen=True)
class RestartSummary:
    """One fault and what it cost."""

    time: float
    task: str
    host: str | None
    cause: str
    exit_code: int | None
    signal: str | None
    action: str
    scope: str
    tasks: tuple[str, ...]
    detail: str
    downtime_s: float | None  # fault -> the restarted task or group stepping (or listening) again
    steps_lost: int | None  # steps redone after resuming (lead task)


def redone_mask(steps: Sequence[int]) -> list[bool]:
    """For each record, whether a later record repeats its step number (work thrown away)."""
    seen: set[int] = set()
    mask = [False] * len(steps)
    for i in range(len(steps) - 1, -1, -1):
        if steps[i] in seen:
            mask[i] = True
        else:
            seen.add(steps[i])
    return mask


def productive_time(starts_us: Sequence[int], durations: Sequence[float], redone: Sequence[bool]) -> float:
    """Seconds covered by the records that were kept (union of their intervals, overlaps once)."""
    intervals = [(s / 1e6, s / 1e6 + d) for s, d, r in zip(starts_us, durations, redone, strict=True) if not r]
    if any(intervals[i][0] < intervals[i - 1][0] for i in range(1, len(intervals))):
        intervals.sort()
    total, current_start, current_end = 0.0, None, None
    for start, end in intervals:
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start  # type: ignore[operator]
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start  # type: ignore[operator]
    return total


def goodput(starts_us: Sequence[int], durations: Sequence[float], redone: Sequence[bool]) -> float | None:
    """Productive step time over the training window (first step's start to last step's end)."""
    if not starts_us:
        return None
    first = min(starts_us) / 1e6
    last = max(s / 1e6 + d for s, d in zip(starts_us, durations, strict=True))
    return None if last <= first else productive_time(starts_us, durations, redone) / (last - first)


def first_start_after(starts_us: Sequence[int], when: float) -> float | None:
    """Start (epoch seconds) of the first record that starts at or after ``when``."""
    after = [s / 1e6 for s in starts_us if s / 1e6 >= when]
    return min(after) if after else None


def event_lines(outcome: dict, degraded: Sequence[dict], hosts_lost: Sequence[dict], membership: Sequence[dict],
                run_end: float | None, strategy: str = "mwms") -> list[str]:
    """The report's lines for what happened to the job besides restarts: hosts whose clocks were
    off, ddlctl's own pauses, a task lost and not replaced, a host's connection lost, workers
    leaving and rejoining (``run_end``: when the last step ended)."""
    lines = []
    for host, offset in sorted((outcome.get("clock_offsets") or {}).items()):
        if isinstance(offset, (int, float)) and abs(offset) >= CLOCK_SAID_S:
            whose = "ddlctl's"
            lines.append(f"the clock of {host} is {how_far(offset, whose)}: its step times and samples are put on "
                         f"ddlctl's clock here; {SYNCHRONISE}")
    unjoined = [str(name) for name in outcome.get("unjoined") or []]
    if unjoined:
        lines.append(alone(strategy, unjoined))
    for event in outcome.get("preparing") or []:
        began = outcome.get("started_at")
        when = f" {event['time'] - began:.0f}s after the start" if began and event.get("time") else ""
        before = "listening on its port" if event.get("before") == "listening" else "its first step"
        for task in event.get("tasks") or []:
            cpu, io = task.get("cpu"), task.get("io_bytes_s")
            work = Work(str(task.get("task")), str(task.get("where")), None if cpu is None else float(cpu),
                        None if io is None else float(io))
            lines.append(f"{work.task} was at work before {before}{when} ({work.describe()}): preparing, waited "
                         "for, not judged hung")
    for pause in outcome.get("paused", []):
        began = outcome.get("started_at")
        when = f" from {pause['time'] - began:.0f}s after the start" if began and pause.get("time") else ""
        lines.append(f"ddlctl itself did not run for {pause.get('seconds', 0):.0f}s{when} (stopped or suspended): "
                     "its hosts' and tasks' silence then was not held against them")
    for event in degraded:
        since = event.get("since") or event.get("time")
        how_long = f" for the last {run_end - since:.1f}s of training" if run_end and since and run_end > since else ""
        lines.append(f"ran degraded{how_long}: {event.get('task')} was lost ({event.get('detail')}) and not replaced")
    for lost in hosts_lost:
        lines.append(f"connection to {lost.get('host')} lost: {lost.get('reason')}")
    for change in membership:
        workers = list(change.get("workers", []))
        if change.get("cause") == "grow":
            lines.append(f"{', '.join(change.get('joined', []))} rejoined ({change.get('why')}): trained on with "
                         f"{len(workers)} worker(s) from the checkpoint written just before")
        else:
            lines.append(f"{', '.join(change.get('left', []))} left the job ({change.get('why')}): trained on with "
                         f"{len(workers)} worker(s) ({', '.join(workers)}) from the latest checkpoint, the same "
                         f"global batch")
    return lines


def summarize_restarts(events: Sequence[dict], lead_steps: Sequence[int], lead_starts_us: Sequence[int],
                       stepping: dict[str, Sequence[int]]) -> tuple[RestartSummary, ...]:
    """Each restart event with its downtime and lost steps. ``lead_*``: the step records of the task
    that drives training (ps chief, mwms worker 0): a fault's lost steps are its records that were
    redone, between the previous fault and this one; ``stepping``: task -> record starts, for tasks
    that record steps (downtime ends at a restarted task's first step, or when a restarted server
    listens again)."""
    out = []
    ordered = sorted(events, key=lambda e: e.get("time", 0.0))
    redone = redone_mask(lead_steps)
    previous = float("-inf")
    for event in ordered:
        fault_at = float(event.get("time", 0.0))
        restarted = event.get("restarted_at")
        back = None
        if event.get("action") == Action.RESTART and restarted is not None:
            own = [first_start_after(stepping[t], restarted) for t in event.get("tasks", []) if t in stepping]
            own = [t for t in own if t is not None]
            back = min(own) if own else event.get("listening_at")
        lost = sum(1 for t, r in zip(lead_starts_us, redone, strict=True) if r and previous <= t / 1e6 < fault_at) \
            if lead_steps else None
        previous = fault_at
        out.append(RestartSummary(
            time=fault_at, task=str(event.get("task")), host=event.get("host"), cause=str(event.get("cause")),
            exit_code=event.get("exit_code"), signal=event.get("signal"), action=str(event.get("action")),
            scope=str(event.get("scope") or ""), tasks=tuple(event.get("tasks", ())),
            detail=str(event.get("detail", "")),
            downtime_s=None if back is None else max(0.0, back - fault_at), steps_lost=lost))
    return tuple(out)
