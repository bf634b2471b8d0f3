"""Where a job's time went, by cause (pure): productive steps, start-up, compilation, restart
downtime, hangs, steps redone, checkpoint saves, evaluation, the end and the rest, adding up to the
job's wall time.

Every second of the job's window (ddlctl's start to its end) is counted once, in this order of
precedence: what the lead task's (the ps chief's, mwms worker 0's) first step took beyond its usual
step is *compile* (tracing, graph building); a kept step of the lead is *productive*; a step that a
restart made the job redo is *redone*; a hang, from the last progress of the task found hung to its
being found, is *stalled* (a save or an evaluation waiting for it too); a checkpoint save or
evaluation the lead reported (:func:`ddlctl.phase`) is *checkpoint* / *eval*; a fault until the
restarted task steps (or listens) again is *restart*; before the first step is *start-up*; after
the lead's last step is *ending* (the program's end, stopping the other tasks); a short pause
between two of its steps is *between steps* (the loop's own: under ps, dispatching the next block);
the rest is *other*. Two figures lie inside productive time: *degraded* (after a task was lost
and not replaced) and *straggler wait* (synchronous jobs: the lead waiting at the all-reduce for
the last worker to arrive).

One accounting for both ends: the report counts a finished run's step records with it, and the
controller counts a running job's progress reports with it (:mod:`ddlctl.supervise.accounting`:
the live view and the Prometheus metrics).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

Interval = tuple[float, float]

#: The exclusive causes, in the order they claim time, with their labels for people.
CAUSES: tuple[tuple[str, str], ...] = (
    ("compile", "compile"), ("productive", "productive"), ("redone", "redone"), ("stalled", "stalled (hang)"),
    ("checkpoint", "checkpoints"), ("eval", "evaluation"), ("restart", "restarts"), ("startup", "start-up"),
    ("ending", "ending"), ("between", "between steps"), ("other", "other"))


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time (empty ones dropped)."""
    out: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def minus(intervals: Sequence[Interval], taken: Sequence[Interval]) -> list[Interval]:
    """``intervals`` without the time in ``taken`` (both sorted and disjoint, from :func:`union`)."""
    out = []
    for start, end in intervals:
        for t_start, t_end in taken:
            if t_end <= start or t_start >= end:
                continue
            if t_start > start:
                out.append((start, t_start))
            start = max(start, t_end)
            if start >= end:
                break
        if start < end:
            out.append((start, end))
    return out


def length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def clip(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    return [(max(a, window[0]), min(b, window[1])) for a, b in intervals if b > window[0] and a < window[1]]


@dataclass(frozen=True)
class TimeByCause:
    """Seconds of the job's wall time by cause (the exclusive ones add up to ``wall_s``)."""

    wall_s: float
    productive_s: float
    redone_s: float
    checkpoint_s: float
    eval_s: float
    restart_s: float
    startup_s: float
    other_s: float
    degraded_s: float  # inside productive_s
    straggler_wait_s: float | None  # inside productive_s; None: not a synchronous job
    compile_s: float = 0.0
    stalled_s: float = 0.0
    ending_s: float = 0.0
    between_s: float = 0.0

    def to_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}

    def line(self) -> str:
        """``productive 72% · start-up 10% · restarts 8% · ...`` (causes under 0.5% left out)."""
        parts = [f"{label} {getattr(self, key + '_s') / self.wall_s:.0%}" for key, label in CAUSES
                 if self.wall_s > 0 and getattr(self, key + "_s") / self.wall_s >= 0.005]
        inside = []
        if self.degraded_s > 0 and self.wall_s > 0:
            inside.append(f"degraded {self.degraded_s / self.wall_s:.0%}")
        if self.straggler_wait_s and self.wall_s > 0:
            inside.append(f"waiting for stragglers {self.straggler_wait_s / self.wall_s:.0%}")
        return " · ".join(parts) + (f" (of the productive time: {', '.join(inside)})" if inside else "")


def usual_step(steps: Sequence[Interval]) -> float:
    """The median length of ``steps`` (some)."""
    durations = sorted(b - a for a, b in steps)
    return durations[len(durations) // 2]


def first_step_excess(kept: Sequence[Interval]) -> list[Interval]:
    """The start of the lead's first kept step beyond its median step (tracing and building the
    graph: compilation), as an interval; none with fewer than 3 steps to judge by."""
    if len(kept) < 3:
        return []
    usual = usual_step(kept)
    start, end = kept[0]
    return [(start, end - usual)] if end - start > usual else []


#: A pause between two of the lead's steps longer than this many usual steps (and than a second) is
#: not the loop's own (dispatching the next step, logging): it stays *other*.
BETWEEN_MAX_STEPS = 10


def short_gaps(steps: Sequence[Interval]) -> list[Interval]:
    """The pauses between consecutive steps of the lead (``steps`` in order) no longer than
    :data:`BETWEEN_MAX_STEPS` usual steps or a second: the loop's own time between steps (under ps,
    the coordinator dispatching the next block of closures)."""
    if len(steps) < 2:
        return []
    ordered = sorted(steps)
    bound = max(1.0, BETWEEN_MAX_STEPS * usual_step(ordered))
    gaps, reached = [], ordered[0][1]
    for start, end in ordered[1:]:
        if reached < start <= reached + bound:
            gaps.append((reached, start))
        reached = max(reached, end)
    return gaps


def hang_records(hangs: Iterable[Mapping]) -> list[tuple[float, float]]:
    """(found, idle seconds) of each hang the supervisor handled (``outcome.json``'s ``hangs``;
    the kind "exit", a program stuck in its exit, is no stall)."""
    return [(float(h["time"]), float(h["idle_s"])) for h in hangs if h.get("kind", "hang") == "hang"
            and isinstance(h.get("time"), (int, float)) and isinstance(h.get("idle_s"), (int, float))]


def loss_times(degraded: Iterable[Mapping]) -> list[float]:
    """When each loss left unreplaced happened (``outcome.json``'s ``degraded``: ``since``, in
    records older than it ``time``)."""
    return [float(at) for d in degraded if isinstance(at := d.get("since") or d.get("time"), (int, float))]


def stall_of(found: float, idle_s: float, lead_steps: Sequence[Interval]) -> Interval:
    """A hang's stall: from the hung task's last progress, or from the lead's last step before it
    if that ended earlier (the lead waited for the hung task before it stopped itself: a stage of
    a pipeline), to the hang being found."""
    before = [end for _, end in lead_steps if end <= found]
    return (min(found - idle_s, max(before)) if before else found - idle_s), found


def time_by_cause(window: Interval, kept: Sequence[Interval], redone: Sequence[Interval],
                  phases: dict[str, Sequence[Interval]], restarts: Sequence[Interval],
                  degraded_since: Sequence[float], straggler_wait_s: float | None,
                  stalls: Sequence[Interval] = (), steps: bool = True, ended: bool = True) -> TimeByCause:
    """The job's ``window`` (start, end; epoch seconds) split by cause. ``kept``/``redone``: the lead
    task's step intervals (in order); ``phases``: "checkpoint"/"eval" intervals the lead reported;
    ``restarts``: (fault, back) per restart; ``degraded_since``: when each unreplaced loss
    happened; ``stalls``: (last progress, found) per hang. ``steps``: ``kept`` are single steps (so a
    first one longer than the rest is compilation); not so for stretches of several. ``ended``: the
    window ends with the job (after the lead's last step is its *ending*); not so while it runs."""
    claimed: list[Interval] = []
    found: dict[str, float] = {}

    def claim(key: str, intervals: Iterable[Interval]) -> list[Interval]:
        nonlocal claimed
        mine = minus(union(clip(intervals, window)), claimed)
        claimed = union([*claimed, *mine])
        found[key] = length(mine)
        return mine

    claim("compile", first_step_excess(kept) if steps else [])
    productive = claim("productive", kept)
    claim("redone", redone)
    claim("stalled", stalls)  # (a save or an evaluation that waits for the hung task is the hang's)
    claim("checkpoint", phases.get("checkpoint", ()))
    claim("eval", phases.get("eval", ()))
    claim("restart", restarts)
    first = min((a for a, _ in [*kept, *redone]), default=window[1])
    claim("startup", [(window[0], first)])
    last = max((b for _, b in [*kept, *redone]), default=window[1])
    claim("ending", [(last, window[1])] if ended else [])
    claim("between", short_gaps([*kept, *redone]))
    wall = window[1] - window[0]
    other = max(0.0, wall - sum(found.values()))
    degraded = length(clip(productive, (min(degraded_since), window[1]))) if degraded_since else 0.0
    return TimeByCause(wall_s=wall, productive_s=found["productive"], redone_s=found["redone"],
                       checkpoint_s=found["checkpoint"], eval_s=found["eval"], restart_s=found["restart"],
                       startup_s=found["startup"], other_s=other, degraded_s=degraded,
                       straggler_wait_s=straggler_wait_s, compile_s=found["compile"], stalled_s=found["stalled"],
                       ending_s=found["ending"], between_s=found["between"])


def straggler_wait(lead: dict[int, float], arrivals: Sequence[dict[int, float]]) -> float:
    """Seconds the lead waited at the all-reduce for the last worker: per step number, the latest
    arrival (step start + ``sync_s``) of any worker minus the lead's own (steps all recorded)."""
    total = 0.0
    for step, own in lead.items():
        others = [a[step] for a in arrivals if step in a]
        if len(others) == len(arrivals) and others:
            total += max(0.0, max(others) - own)
    return total
